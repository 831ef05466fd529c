"""The one history of disruptions: what earlier cycles did, as the planner's guards need it.

Owns `DisruptionHistory` and the one rule that updates it, used alike by the daemon (live cycles, kept
across restarts by the state store) and the trace replay:

- `nodes`: when each node was last drained (the `cooldown` guard);
- `workloads`: when each workload (namespace, controller kind and name) last had a pod evicted (the
  `cooldown` guard), and `disruptions`: the time of every cycle that did (`disruption-budget`);
- `evictions`: every pod evicted, with its workload (a bare pod is its own) and when, watched by the
  circuit breaker (`circuit-open`, `rebalancer.history_circuit`): when `reschedule_timeout` after an
  eviction pods of that workload created since are still unscheduled, every eviction stops until they
  are placed;
- `awaiting`: every pod evicted with a predicted destination (the decision's target and the nodes tied
  with it), until its workload's replacement is placed and the landing judgement
  (`rebalancer.history_landings`) says whether it landed as predicted, on an equivalent (tied) node or
  elsewhere, or, none placed `reschedule_timeout` after the eviction, that it is still pending;
- `failed_drains`: per node, when its last drain failed and how many failed in a row (the
  `drain-backoff` guard waits 1, 2, 4... intervals, at most an hour, before the next; a drain that
  completes clears it);
- `checkpoint_refused`: the namespaces where the last cycle's checkpoint requests were refused (403:
  the namespace has not granted them), with when (the `checkpoint-pending` guard says so instead of
  "asked now"). The actuator replaces it as each cycle ends; it is not saved, since every cycle that
  wants such a pod asks again and learns it anew.

`recorded` adds one decision's outcomes (only pods that were really `evicted` count: a dry run changes
nothing), `pruned` drops what no guard can refuse with any more, `settled` drops the evictions whose
workloads are placed again and the landings judged (`for_cycle`: both, what a cycle plans with).
`unplaced`, `by_workload` and `replacements` find the pods that replace evicted ones, for `settled` and
for the two modules that read the history: `rebalancer.history_circuit` (`open_circuits`: which
workloads keep the circuit open) and `rebalancer.history_landings` (`judge_landings`: which awaited
landings are in, and how they went). Both import this module, so `settled` imports `judge_landings`
only when its caller has not judged the landings. It also reads and writes the history as JSON for the
state store. It must do no I/O and read no clock. It keeps one thing between calls (`_OLDEST`): the
oldest disruption time of the last `disruptions` mapping `pruned` looked at, and that mapping (held, so
its identity stays its own), so that a cycle in which nothing expires looks at no workload. A history's
mappings are never changed once made (a new history gets new ones), so the time kept is that of the
mapping it is found with, and every answer is what it would be without it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from rebalancer import rfc3339
from rebalancer.model import NOT_ATTEMPTED, Decision, Outcome, Pod, Snapshot
from rebalancer.policy import Policy
from rebalancer.scoring import Prediction

__all__ = [
    "CLOCK_SKEW",
    "NO_HISTORY",
    "DisruptionHistory",
    "EvictionRecord",
    "Memory",
    "Workload",
    "WorkloadKey",
    "by_workload",
    "replacements",
    "unplaced",
    "workload_key",
]

# A replacement pod is created after the eviction; this much difference between the API server's clock
# (creationTimestamp) and the rebalancer's (snapshot.now) is allowed when telling it from an older pod.
CLOCK_SKEW = timedelta(minutes=1)


class Workload(NamedTuple):
    """What re-creates a pod: its controller (kind, name) in its namespace."""

    namespace: str
    kind: str
    name: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @staticmethod
    def of(pod: Pod) -> Workload:
        """The pod's controller, or the pod itself when it has none."""
        if pod.owner is None:
            return Workload(pod.namespace, "Pod", pod.name)
        return Workload(pod.namespace, pod.owner.kind, pod.owner.name)


WorkloadKey = tuple[str, str, str]


def workload_key(pod: Pod) -> Workload | None:
    """The cooldown key of the workload a pod belongs to; None for a pod without an owner."""
    if pod.owner is None:
        return None
    return Workload(pod.namespace, pod.owner.kind, pod.owner.name)


@dataclass(frozen=True, slots=True)
class EvictionRecord:
    """A pod evicted, and when (the cycle's `now`), and from which node (None: not recorded); awaiting
    its landing, also by which strategy and where it was predicted to land."""

    workload: Workload
    pod: str
    evicted_at: datetime
    node: str | None = None
    strategy: str | None = None
    predicted: Prediction | None = None


@dataclass(frozen=True, slots=True)
class FailedDrain:
    """A node whose drain failed `count` times in a row, the last at `last` (the `drain-backoff` guard)."""

    last: datetime
    count: int


# The most nodes tied with a prediction that an awaited eviction keeps.
MAX_TIED_KEPT = 32

# How long a failed drain is remembered, and the longest the `drain-backoff` guard waits.
FAILED_DRAIN_MEMORY = timedelta(hours=24)
MAX_DRAIN_BACKOFF = timedelta(hours=1)


def drain_backoff(failed: FailedDrain, interval: int) -> timedelta:
    """How long after its last failure a node's drain waits: the interval, doubled with every failure in
    a row after the first (1, 2, 4... intervals), at most MAX_DRAIN_BACKOFF."""
    doublings = min(failed.count - 1, 16)
    return min(timedelta(seconds=interval * 2**doublings), MAX_DRAIN_BACKOFF)


def _drain_failed(outcomes: Sequence[Outcome]) -> bool:
    """A node plan failed on its own account: an API answer refused or failed a pod or the node's mark
    (not a plan cut short by this replica, whose pods are only `not attempted`)."""
    return any(
        o.result in ("error", "blocked-by-pdb")
        and (not o.detail.startswith(NOT_ATTEMPTED) or o.detail.startswith(f"{NOT_ATTEMPTED}cannot mark"))
        for o in outcomes
    )


class _Oldest:
    """The oldest disruption time of the last disruptions mapping asked about (mappings of a history are
    never changed: a new history gets a new mapping), so that a cycle in which nothing expires looks at
    no workload."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: tuple[Mapping[WorkloadKey, tuple[datetime, ...]], datetime | None] | None = None


_OLDEST = _Oldest()


def _oldest_disruption(disruptions: Mapping[WorkloadKey, tuple[datetime, ...]]) -> datetime | None:
    last = _OLDEST.last
    if last is not None and last[0] is disruptions:
        return last[1]
    oldest = min((times[0] for times in disruptions.values()), default=None)
    _OLDEST.last = (disruptions, oldest)
    return oldest


@dataclass(frozen=True, slots=True)
class DisruptionHistory:
    """What earlier cycles disrupted (see the module docstring)."""

    nodes: Mapping[str, datetime] = field(default_factory=dict)
    workloads: Mapping[WorkloadKey, datetime] = field(default_factory=dict)
    disruptions: Mapping[WorkloadKey, tuple[datetime, ...]] = field(default_factory=dict)
    evictions: tuple[EvictionRecord, ...] = ()
    checkpoint_refused: Mapping[str, datetime] = field(default_factory=dict)
    failed_drains: Mapping[str, FailedDrain] = field(default_factory=dict)
    awaiting: tuple[EvictionRecord, ...] = ()

    def recorded(self, decision: Decision, outcomes: Sequence[Outcome], now: datetime) -> DisruptionHistory:
        """The history after `decision` ended in `outcomes` at `now`: each evicted pod disrupts its
        workload (once per cycle) and is watched; a node plan whose pods were all evicted drained its
        node (and the nodes it frees); one that failed counts a failed drain of its node."""
        history = self._with_drain_result(decision, outcomes, now)
        evicted = {(o.namespace, o.pod) for o in outcomes if o.result == "evicted"}
        if not evicted:
            return history
        return history._with_evictions(decision, evicted, now)

    def _with_drain_result(
        self, decision: Decision, outcomes: Sequence[Outcome], now: datetime
    ) -> DisruptionHistory:
        node = decision.proposal.node if decision.proposal.kind == "node" else None
        if node is None or not outcomes:
            return self
        failed = dict(self.failed_drains)
        if _drain_failed(outcomes):
            before = failed.get(node)
            failed[node] = FailedDrain(now, before.count + 1 if before is not None else 1)
        elif all(o.result in ("evicted", "gone") for o in outcomes):
            failed.pop(node, None)
        else:
            return self
        return replace(self, failed_drains=failed) if failed != self.failed_drains else self

    def _with_evictions(
        self, decision: Decision, evicted: set[tuple[str, str]], now: datetime
    ) -> DisruptionHistory:
        workloads = dict(self.workloads)
        disruptions = dict(self.disruptions)
        records = list(self.evictions)
        awaiting = list(self.awaiting)
        targets = decision.targets or decision.proposal.targets
        for pod in decision.proposal.pods:
            if pod.key not in evicted:
                continue
            record = EvictionRecord(Workload.of(pod), pod.name, now, pod.node_name)
            if record not in records:  # recorded as it happened, then with its whole decision
                records.append(record)
            target = targets.get(pod.key)
            if target is not None:
                # Bounded, so the state ConfigMap stays small with many alike empty nodes: a landing on
                # a tied node past the first MAX_TIED_KEPT (by name) is judged `elsewhere`.
                others = sorted(decision.tied.get(pod.key, frozenset()) - {target})[:MAX_TIED_KEPT]
                tied = frozenset({target, *others})
                watched = replace(
                    record, strategy=decision.proposal.strategy, predicted=Prediction(target, tied)
                )
                if watched not in awaiting:
                    awaiting.append(watched)
            key = workload_key(pod)
            if key is None:
                continue
            if workloads.get(key) != now:  # one disruption per cycle
                disruptions[key] = (*disruptions.get(key, ()), now)
            workloads[key] = now
        nodes = dict(self.nodes)
        proposal = decision.proposal
        if proposal.kind == "node" and all(p.key in evicted for p in proposal.pods):
            for name in dict.fromkeys((*((proposal.node,) if proposal.node else ()), *proposal.nodes_freed)):
                nodes[name] = now
        return replace(
            self,
            nodes=nodes,
            workloads=workloads,
            disruptions=disruptions,
            evictions=tuple(records),
            awaiting=tuple(awaiting),
        )

    def pruned(self, now: datetime, policy: Policy) -> DisruptionHistory:
        """Without what no guard can refuse with any more: drains and disruptions older than the
        cooldown, disruption times outside the budget's window (all of them without a budget)."""
        guards = policy.guards
        keep = timedelta(seconds=max(guards.cooldown, 0))
        window = timedelta(seconds=guards.disruption_window if guards.max_disruptions_per_workload else 0)
        nodes = {n: t for n, t in self.nodes.items() if now - t < keep}
        workloads = {k: t for k, t in self.workloads.items() if now - t < keep}
        # Times are in order: most workloads keep all of theirs, and their tuple as it is. A time t is
        # kept when now - t < window, that is when t > now - window (one subtraction for all of them),
        # and when every workload's oldest time is, the mapping is kept as it is.
        try:
            since: datetime | None = now - window
        except OverflowError:  # before the earliest datetime: every time is within the window
            since = None
        oldest = _oldest_disruption(self.disruptions)
        if since is None or oldest is None or oldest > since:
            disruptions = self.disruptions
        else:  # only the workloads some time of which expires change, in place in a copy
            disruptions = dict(self.disruptions)
            left: datetime | None = None
            for key, times in self.disruptions.items():
                if times[0] > since:
                    left = times[0] if left is None or times[0] < left else left
                elif kept := tuple(t for t in times if now - t < window):
                    disruptions[key] = kept
                    left = kept[0] if left is None or kept[0] < left else left
                else:
                    del disruptions[key]
            _OLDEST.last = (disruptions, left)
        failed = {n: f for n, f in self.failed_drains.items() if now - f.last < FAILED_DRAIN_MEMORY}
        return replace(self, nodes=nodes, workloads=workloads, disruptions=disruptions, failed_drains=failed)

    def for_cycle(
        self, snapshot: Snapshot, policy: Policy, judged: Collection[EvictionRecord] | None = None
    ) -> DisruptionHistory:
        """The history a cycle on `snapshot` plans with: pruned, then settled (`judged`: the landings
        the caller already judged on this snapshot, see `settled`)."""
        return self.pruned(snapshot.now, policy).settled(snapshot, policy.eviction.reschedule_timeout, judged)

    def settled(
        self, snapshot: Snapshot, reschedule_timeout: int, judged: Collection[EvictionRecord] | None = None
    ) -> DisruptionHistory:
        """Without the evictions the circuit breaker no longer needs: those of a workload whose pods are
        placed `reschedule_timeout` after its oldest watched eviction (younger ones stay watched); and
        without the awaited landings `judge_landings` judges on this snapshot (`judged`, when the caller
        judged them already)."""
        history = self
        if self.awaiting:
            if judged is None:
                # Imported here, not at the top: rebalancer.history_landings imports this module.
                from rebalancer.history_landings import judge_landings  # noqa: PLC0415

                judged = judge_landings(snapshot, self, reschedule_timeout).judged
            if judged:
                history = replace(self, awaiting=tuple(r for r in self.awaiting if r not in judged))
        return history._settled_evictions(snapshot, reschedule_timeout)

    def _settled_evictions(self, snapshot: Snapshot, reschedule_timeout: int) -> DisruptionHistory:
        if not self.evictions:  # nothing watched: no pod to look at
            return self
        timeout = timedelta(seconds=reschedule_timeout)
        waiting = unplaced(snapshot)
        kept: list[EvictionRecord] = []
        for workload, records in by_workload(self.evictions).items():
            oldest = min(r.evicted_at for r in records)
            if snapshot.now - oldest < timeout or replacements(waiting.get(workload, ()), oldest):
                kept.extend(records)
            else:
                kept.extend(r for r in records if snapshot.now - r.evicted_at < timeout)
        if len(kept) == len(self.evictions):
            return self
        return replace(self, evictions=tuple(kept))

    def merged_with(self, other: DisruptionHistory) -> DisruptionHistory:
        """Both memories in one (a stored state another writer changed since this one was read): every
        eviction and disruption of either, the later cooldown start of each node and workload. Merging
        only ever adds what some replica did, so it can only make the guards more careful (an awaited
        landing one of them judged already may be judged, and counted, once more)."""
        if other == self:
            return self
        nodes = {**other.nodes, **{n: max(t, other.nodes.get(n, t)) for n, t in self.nodes.items()}}
        workloads = {
            **other.workloads,
            **{k: max(t, other.workloads.get(k, t)) for k, t in self.workloads.items()},
        }
        disruptions = {
            key: tuple(sorted({*self.disruptions.get(key, ()), *other.disruptions.get(key, ())}))
            for key in {*self.disruptions, *other.disruptions}
        }
        evictions = tuple(dict.fromkeys((*self.evictions, *other.evictions)))
        awaiting = tuple(dict.fromkeys((*self.awaiting, *other.awaiting)))
        failed = {**other.failed_drains}
        for node, mine in self.failed_drains.items():
            theirs = failed.get(node)
            failed[node] = mine if theirs is None or mine.last >= theirs.last else theirs
        return replace(
            self,
            nodes=nodes,
            workloads=workloads,
            disruptions=disruptions,
            evictions=evictions,
            failed_drains=failed,
            awaiting=awaiting,
        )

    # ---- JSON, for the state store

    def to_json(self) -> dict[str, Any]:
        return {
            "evictions": [
                {
                    "namespace": r.workload.namespace,
                    "kind": r.workload.kind,
                    "name": r.workload.name,
                    "pod": r.pod,
                    "evictedAt": rfc3339.format_utc(r.evicted_at),
                    **({"node": r.node} if r.node is not None else {}),
                }
                for r in self.evictions
            ],
            "awaitingLanding": [_awaiting_to_json(r) for r in self.awaiting],
            "failedDrains": {
                node: {"last": rfc3339.format_utc(f.last), "count": f.count}
                for node, f in sorted(self.failed_drains.items())
            },
            "drained": {node: rfc3339.format_utc(t) for node, t in sorted(self.nodes.items())},
            "disrupted": [
                {
                    "namespace": key[0],
                    "kind": key[1],
                    "name": key[2],
                    "last": rfc3339.format_utc(self.workloads[key]) if key in self.workloads else None,
                    "times": [rfc3339.format_utc(t) for t in self.disruptions.get(key, ())],
                }
                for key in sorted(set(self.workloads) | set(self.disruptions))
            ],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DisruptionHistory:
        """Raises ValueError on anything it cannot read (a version 1 state has only `evictions`)."""
        try:
            evictions = tuple(
                EvictionRecord(
                    Workload(str(item["namespace"]), str(item["kind"]), str(item["name"])),
                    str(item["pod"]),
                    rfc3339.parse(str(item["evictedAt"])),
                    str(item["node"]) if item.get("node") is not None else None,
                )
                for item in doc.get("evictions") or ()
            )
            awaiting = tuple(_awaiting_from_json(item) for item in doc.get("awaitingLanding") or ())
            failed = {
                str(node): FailedDrain(rfc3339.parse(str(item["last"])), int(item["count"]))
                for node, item in (doc.get("failedDrains") or {}).items()
            }
            nodes = {str(node): rfc3339.parse(str(at)) for node, at in (doc.get("drained") or {}).items()}
            workloads: dict[WorkloadKey, datetime] = {}
            disruptions: dict[WorkloadKey, tuple[datetime, ...]] = {}
            for item in doc.get("disrupted") or ():
                key = Workload(str(item["namespace"]), str(item["kind"]), str(item["name"]))
                if item.get("last") is not None:
                    workloads[key] = rfc3339.parse(str(item["last"]))
                times = tuple(rfc3339.parse(str(t)) for t in item.get("times") or ())
                if times:
                    disruptions[key] = times
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"unreadable disruption history: {exc!r}") from None
        return cls(nodes, workloads, disruptions, evictions, failed_drains=failed, awaiting=awaiting)


def _awaiting_to_json(record: EvictionRecord) -> dict[str, Any]:
    predicted = record.predicted
    return {
        "namespace": record.workload.namespace,
        "kind": record.workload.kind,
        "name": record.workload.name,
        "pod": record.pod,
        "evictedAt": rfc3339.format_utc(record.evicted_at),
        **({"node": record.node} if record.node is not None else {}),
        "strategy": record.strategy,
        "predicted": predicted.chosen if predicted is not None else None,
        "tied": sorted(predicted.tied) if predicted is not None else [],
    }


def _awaiting_from_json(item: Mapping[str, Any]) -> EvictionRecord:
    chosen = str(item["predicted"])
    return EvictionRecord(
        Workload(str(item["namespace"]), str(item["kind"]), str(item["name"])),
        str(item["pod"]),
        rfc3339.parse(str(item["evictedAt"])),
        str(item["node"]) if item.get("node") is not None else None,
        strategy=str(item["strategy"]),
        predicted=Prediction(chosen, frozenset({chosen, *(str(n) for n in item.get("tied") or ())})),
    )


NO_HISTORY = DisruptionHistory()


# --------------------------------------------------------------------------- the replacements of evicted pods


def unplaced(snapshot: Snapshot) -> dict[Workload, list[Pod]]:
    """The snapshot's unscheduled pods (Pending, on no node), by workload."""
    found: dict[Workload, list[Pod]] = defaultdict(list)
    if sum(map(len, snapshot.pods_by_node.values())) == len(snapshot.pods):  # every pod is bound
        return found
    for pod in snapshot.pods:
        if pod.phase == "Pending" and pod.node_name is None:
            found[Workload.of(pod)].append(pod)
    return found


def by_workload(records: Iterable[EvictionRecord]) -> dict[Workload, list[EvictionRecord]]:
    """The records grouped by their workload, each group in the order given."""
    grouped: dict[Workload, list[EvictionRecord]] = defaultdict(list)
    for record in records:
        grouped[record.workload].append(record)
    return grouped


def replacements(pods: Iterable[Pod], evicted_at: datetime) -> list[Pod]:
    """The pods created since the eviction (or of unknown age): the replacements it waits for."""
    return [p for p in pods if p.created is None or p.created >= evicted_at - CLOCK_SKEW]


# --------------------------------------------------------------------------- memory


class Memory:
    """The history a run keeps in process, cycle after cycle (the trace replay; a daemon without a state
    store). The state store's memory (rebalancer.actuator) keeps the same history, saved as it changes."""

    def __init__(self, history: DisruptionHistory = NO_HISTORY) -> None:
        self.history = history

    def begin(
        self, snapshot: Snapshot, policy: Policy, judged: Collection[EvictionRecord] | None = None
    ) -> DisruptionHistory:
        """The history a cycle on `snapshot` plans with (`DisruptionHistory.for_cycle`)."""
        self.history = self.history.for_cycle(snapshot, policy, judged)
        return self.history

    def record(self, decision: Decision, outcomes: Sequence[Outcome], now: datetime) -> None:
        self.history = self.history.recorded(decision, outcomes, now)
