"""The one history of disruptions: what earlier cycles did, as the planner's guards need it.

Owns `DisruptionHistory` and the one rule that updates it, used alike by the daemon (live cycles, kept
across restarts by the state store) and the trace replay:

- `nodes`: when each node was last drained (the `cooldown` guard);
- `workloads`: when each workload (namespace, controller kind and name) last had a pod evicted (the
  `cooldown` guard), and `disruptions`: the time of every cycle that did (`disruption-budget`);
- `evictions`: every pod evicted, with its workload (a bare pod is its own) and when, watched by the
  circuit breaker (`circuit-open`): when `reschedule_timeout` after an eviction pods of that workload
  created since are still unscheduled, every eviction stops until they are placed.

`recorded` adds one decision's outcomes (only pods that were really `evicted` count: a dry run changes
nothing), `pruned` drops what no guard can refuse with any more, `settled` drops the evictions whose
workloads are placed again, and `open_circuits` says which workloads keep the circuit open. It also
reads and writes the history as JSON for the state store. It must stay pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from rebalancer import rfc3339
from rebalancer.model import Decision, Outcome, Pod, Snapshot
from rebalancer.policy import Policy

__all__ = [
    "CLOCK_SKEW",
    "NO_HISTORY",
    "DisruptionHistory",
    "EvictionRecord",
    "Memory",
    "Trip",
    "Workload",
    "WorkloadKey",
    "open_circuits",
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
    """A pod evicted, and when (the cycle's `now`)."""

    workload: Workload
    pod: str
    evicted_at: datetime


@dataclass(frozen=True, slots=True)
class DisruptionHistory:
    """What earlier cycles disrupted (see the module docstring)."""

    nodes: Mapping[str, datetime] = field(default_factory=dict)
    workloads: Mapping[WorkloadKey, datetime] = field(default_factory=dict)
    disruptions: Mapping[WorkloadKey, tuple[datetime, ...]] = field(default_factory=dict)
    evictions: tuple[EvictionRecord, ...] = ()

    def recorded(self, decision: Decision, outcomes: Sequence[Outcome], now: datetime) -> DisruptionHistory:
        """The history after `decision` ended in `outcomes` at `now`: each evicted pod disrupts its
        workload (once per cycle) and is watched; a node plan whose pods were all evicted drained its
        node (and the nodes it frees)."""
        evicted = {(o.namespace, o.pod) for o in outcomes if o.result == "evicted"}
        if not evicted:
            return self
        workloads = dict(self.workloads)
        disruptions = dict(self.disruptions)
        records = list(self.evictions)
        for pod in decision.proposal.pods:
            if pod.key not in evicted:
                continue
            records.append(EvictionRecord(Workload.of(pod), pod.name, now))
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
        return DisruptionHistory(nodes, workloads, disruptions, tuple(records))

    def pruned(self, now: datetime, policy: Policy) -> DisruptionHistory:
        """Without what no guard can refuse with any more: drains and disruptions older than the
        cooldown, disruption times outside the budget's window (all of them without a budget)."""
        guards = policy.guards
        keep = timedelta(seconds=max(guards.cooldown, 0))
        window = timedelta(seconds=guards.disruption_window if guards.max_disruptions_per_workload else 0)
        nodes = {n: t for n, t in self.nodes.items() if now - t < keep}
        workloads = {k: t for k, t in self.workloads.items() if now - t < keep}
        disruptions = {
            k: kept
            for k, times in self.disruptions.items()
            if (kept := tuple(t for t in times if now - t < window))
        }
        return DisruptionHistory(nodes, workloads, disruptions, self.evictions)

    def settled(self, snapshot: Snapshot, reschedule_timeout: int) -> DisruptionHistory:
        """Without the evictions the circuit breaker no longer needs: those of a workload whose pods are
        placed `reschedule_timeout` after its oldest watched eviction (younger ones stay watched)."""
        timeout = timedelta(seconds=reschedule_timeout)
        waiting = _unplaced(snapshot)
        kept: list[EvictionRecord] = []
        for workload, records in _by_workload(self.evictions).items():
            oldest = min(r.evicted_at for r in records)
            if snapshot.now - oldest < timeout or _replacements(waiting.get(workload, ()), oldest):
                kept.extend(records)
            else:
                kept.extend(r for r in records if snapshot.now - r.evicted_at < timeout)
        if len(kept) == len(self.evictions):
            return self
        return DisruptionHistory(self.nodes, self.workloads, self.disruptions, tuple(kept))

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
                }
                for r in self.evictions
            ],
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
                )
                for item in doc.get("evictions") or ()
            )
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
        return cls(nodes, workloads, disruptions, evictions)


NO_HISTORY = DisruptionHistory()


# --------------------------------------------------------------------------- the circuit breaker


@dataclass(frozen=True, slots=True)
class Trip:
    """A workload that keeps the circuit open: pods of it created since its eviction are unscheduled."""

    workload: Workload
    evicted_at: datetime
    pending: int
    minutes: int

    @property
    def detail(self) -> str:
        return f"circuit open: {self.workload.ref} still Pending {self.minutes}m after eviction"


def open_circuits(
    snapshot: Snapshot, history: DisruptionHistory, reschedule_timeout: int
) -> tuple[Trip, ...]:
    """The workloads whose pods evicted `reschedule_timeout` or more ago are not placed again."""
    timeout = timedelta(seconds=reschedule_timeout)
    waiting = _unplaced(snapshot)
    trips: list[Trip] = []
    for workload, records in sorted(_by_workload(history.evictions).items()):
        oldest = min(r.evicted_at for r in records)
        age = snapshot.now - oldest
        if age < timeout:
            continue
        pending = _replacements(waiting.get(workload, ()), oldest)
        if pending:
            trips.append(Trip(workload, oldest, len(pending), int(age.total_seconds() // 60)))
    return tuple(trips)


def _unplaced(snapshot: Snapshot) -> dict[Workload, list[Pod]]:
    unplaced: dict[Workload, list[Pod]] = defaultdict(list)
    for pod in snapshot.pods:
        if pod.phase == "Pending" and pod.node_name is None:
            unplaced[Workload.of(pod)].append(pod)
    return unplaced


def _by_workload(records: Iterable[EvictionRecord]) -> dict[Workload, list[EvictionRecord]]:
    grouped: dict[Workload, list[EvictionRecord]] = defaultdict(list)
    for record in records:
        grouped[record.workload].append(record)
    return grouped


def _replacements(pods: Iterable[Pod], evicted_at: datetime) -> list[Pod]:
    """The pods created since the eviction (or of unknown age): the replacements it waits for."""
    return [p for p in pods if p.created is None or p.created >= evicted_at - CLOCK_SKEW]


# --------------------------------------------------------------------------- memory


class Memory:
    """The history a run keeps in process, cycle after cycle (the trace replay; a daemon without a state
    store). The state store's memory (rebalancer.actuator) keeps the same history, saved as it changes."""

    def __init__(self, history: DisruptionHistory = NO_HISTORY) -> None:
        self.history = history

    def begin(self, snapshot: Snapshot, policy: Policy) -> DisruptionHistory:
        """The history a cycle on `snapshot` plans with: pruned and settled."""
        self.history = self.history.pruned(snapshot.now, policy).settled(
            snapshot, policy.eviction.reschedule_timeout
        )
        return self.history

    def record(self, decision: Decision, outcomes: Sequence[Outcome], now: datetime) -> None:
        self.history = self.history.recorded(decision, outcomes, now)
