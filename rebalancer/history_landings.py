"""The landing judgement: where the replacements of awaited evictions landed, against each prediction.

Owns `Landings` and `judge_landings`, which read the awaited evictions of a `DisruptionHistory`
(`rebalancer.history`, which keeps them and drops those judged in `settled`) on a snapshot: a
replacement is a placed pod of the evicted pod's workload created since the eviction, matched to one
eviction, and each awaited eviction is judged `as-predicted`, `equivalent` (on a tied node), `elsewhere`
or, none placed `reschedule_timeout` after it, `pending`. The cycle puts the judgement into its report.
Like the history, it must do no I/O, read no clock and change no history: it only says what it sees.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from rebalancer.cycle_report import PredictionCheck
from rebalancer.history import DisruptionHistory, EvictionRecord, Workload, by_workload, replacements
from rebalancer.model import Pod, PredictionResult, Snapshot
from rebalancer.scoring import Prediction

__all__ = ["Landings", "judge_landings"]


@dataclass(frozen=True, slots=True)
class Landings:
    """The awaited landings judged on one snapshot (`checks`, from the `judged` records), and how many
    records still await theirs."""

    checks: tuple[PredictionCheck, ...] = ()
    judged: frozenset[EvictionRecord] = frozenset()
    awaiting: int = 0


def judge_landings(snapshot: Snapshot, history: DisruptionHistory, reschedule_timeout: int) -> Landings:
    """Where the replacements of the awaited evictions landed, against each prediction.

    A replacement is a pod of the evicted pod's workload created since the eviction (`history.CLOCK_SKEW`
    allowed; of unknown age too), placed on a node and not terminating; each is matched to one eviction,
    those on the predicted node first, then those on a tied node. A workload's awaited evictions are
    judged together once each has a replacement placed (`as-predicted`, `equivalent`: on a tied node,
    `elsewhere`); until then each waits, at most `reschedule_timeout` after its eviction (then judged
    on its match, or `pending` without one)."""
    if not history.awaiting:
        return Landings()
    timeout = timedelta(seconds=reschedule_timeout)
    placed = _placed(snapshot, {r.workload for r in history.awaiting})
    checks: list[PredictionCheck] = []
    judged: set[EvictionRecord] = set()
    for workload, records in sorted(by_workload(history.awaiting).items()):
        records.sort(key=lambda r: (r.evicted_at, r.pod))
        matched = _match(records, placed.get(workload, []))
        complete = len(matched) == len(records)
        for record in records:
            if not complete and snapshot.now - record.evicted_at < timeout:
                continue
            judged.add(record)
            if record.predicted is not None:
                checks.append(_check(record, record.predicted, matched.get(record)))
    return Landings(tuple(checks), frozenset(judged), len(history.awaiting) - len(judged))


def _placed(snapshot: Snapshot, workloads: set[Workload]) -> dict[Workload, list[Pod]]:
    """The placed pods of these workloads, oldest first (unknown age last)."""
    found: dict[Workload, list[Pod]] = defaultdict(list)
    names = {w.name for w in workloads}  # a cheap test first: most pods are of no such workload
    for pod in snapshot.pods:
        if (pod.name if pod.owner is None else pod.owner.name) not in names:
            continue
        if pod.is_active and not pod.terminating and (workload := Workload.of(pod)) in workloads:
            found[workload].append(pod)
    for pods in found.values():
        pods.sort(key=lambda p: (p.created is None, p.created or snapshot.now, p.name))
    return found


def _match(records: Sequence[EvictionRecord], pods: Sequence[Pod]) -> dict[EvictionRecord, Pod]:
    """One replacement per eviction: on its predicted node first, then on a tied node, then anywhere."""
    free = list(pods)
    matched: dict[EvictionRecord, Pod] = {}
    passes: tuple[Callable[[Prediction, str], bool], ...] = (
        lambda predicted, node: node == predicted.chosen,
        lambda predicted, node: predicted.accepts(node),
        lambda predicted, node: True,
    )
    for lands in passes:
        for record in records:
            if record in matched or record.predicted is None:
                continue
            for pod in replacements(free, record.evicted_at):
                if pod.node_name is not None and lands(record.predicted, pod.node_name):
                    matched[record] = pod
                    free.remove(pod)
                    break
    return matched


def _check(record: EvictionRecord, predicted: Prediction, pod: Pod | None) -> PredictionCheck:
    result: PredictionResult
    if pod is None or pod.node_name is None:
        result = "pending"
    elif pod.node_name == predicted.chosen:
        result = "as-predicted"
    elif predicted.accepts(pod.node_name):
        result = "equivalent"
    else:
        result = "elsewhere"
    return PredictionCheck(
        strategy=record.strategy or "unknown",
        namespace=record.workload.namespace,
        pod=record.pod,
        predicted=predicted.chosen,
        result=result,
        landed=pod.node_name if pod is not None else None,
        replacement=pod.name if pod is not None else None,
    )
