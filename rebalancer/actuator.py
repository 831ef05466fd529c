"""The live evictor: drain marks, checkpoint requests and the daemon's memory, around a KubeEvictor.

`ClusterActuator` implements the Evictor protocol with its cycle frame, so `cycle.run_cycle` drives it
as it drives the dry-run evictor. It refuses nothing itself: every refusal (the circuit breaker, a pod
still checkpointing) is a guard of the planner, which plans with the history this actuator keeps.

- Node drain marks. Before the first eviction of a whole-node plan (`proposal.kind == "node"`) the node
  gets the taint `<drain_taint_key>=<cycle_id>:<drain_taint_effect>` and, in the same write, the
  annotation `rebalancer.gpu/draining-since: <RFC 3339>` (kept when the node is already marked), so
  evicted pods do not land back. If the plan fails part-way (any outcome other than `evicted` / `gone`)
  the mark is removed at once (drain abandoned). Drains in progress live on the node itself, so they
  survive restarts: at every `begin_cycle`, a marked node still there with pods other than DaemonSet or
  mirror pods `drain_timeout` after draining-since, still there (even empty: the autoscaler did not take
  it) after twice that, or with no readable draining-since, is unmarked; a node gone from the snapshot
  needs nothing. At the first cycle of a leadership term (after `new_term()`: the daemon calls it at
  start and whenever it loses the lease) the stored memory is taken, every node whose mark no owned
  drain explains is unmarked, and so is every marked node still running pods (its drain was
  interrupted: `drain-interrupted`; an empty one keeps its mark for the autoscaler). A marked node some
  of whose evicted pods keep the circuit open (their replacements Pending) is unmarked, so they can
  come back to it. Removing a mark asks only the lease, never a deadline.
- Checkpoint requests (docs/checkpoint-protocol.md), by its `checkpoints.CheckpointRequester`: at the
  end of a cycle it asks the pods the planner holds (`checkpoint-pending`) and withdraws the requests no
  plan wanted; the namespaces that refused go into the history (`checkpoint_refused`, replaced every
  cycle) for the planner to say so.
- The memory. `memory` is the `cycle.CycleMemory` a live run plans with: the `history.DisruptionHistory`
  (cooldowns, the disruption budget, the evictions the circuit breaker watches, failed drains) and the
  drains this process owns, kept by a `state.StateStore`, saved as each pod is evicted and as each
  decision ends, so a crash loses no eviction. When the store says a later leader wrote it, the
  actuator writes nothing more this term (`state-superseded` finding; the next term reloads).
- Fencing. Every write (marks, evictions, checkpoint requests) asks the write fence first
  (rebalancer.fence), and clips its timeout to it.

It must not plan or re-judge decisions (the planner did), read the clock (every time is the snapshot's
`now`), write Events (sinks/events.py does), touch taints and annotations other than its own keys, or
write any object but nodes (its mark), pods (its annotations, evictions) and its own state ConfigMap;
an idle workload's own object is written only by the workload actions its KubeEvictor hands to
rebalancer.reclaim, under the same fence.
A dry run never evicts through it: a daemon's dry-run cycles go through `DrainMarkKeeper`, which only
lifts the marks its live cycles left when they expire (a one-shot dry run writes nothing at all).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Final

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer import rfc3339
from rebalancer.checkpoints import CheckpointRequester
from rebalancer.evictor import DryRunEvictor
from rebalancer.fence import UNFENCED, Fence, RequestTimeout, WriteFence
from rebalancer.finding_kinds import FindingKind
from rebalancer.guards import (
    CHECKPOINT_PENDING,
)
from rebalancer.history import DisruptionHistory, EvictionRecord, Workload
from rebalancer.history_circuit import open_circuits
from rebalancer.kube_evictor import REQUESTER, KubeEvictor
from rebalancer.kubeapi import (
    Backoff,
)
from rebalancer.model import (
    NOT_ATTEMPTED,
    Decision,
    Finding,
    Mode,
    Node,
    Outcome,
    OutcomeResult,
    Pod,
    Snapshot,
)
from rebalancer.node_marks import KubeTainter, NodeTainter, TaintChange
from rebalancer.policy import EvictionConfig, Policy
from rebalancer.state import ActuatorState, DrainRecord, StateStore
from rebalancer.wording import plural

__all__ = [
    "DRAINING_SINCE_ANNOTATION",
    "DRAIN_INTERRUPTED",
    "DRAIN_TIMEOUT",
    "STATE_SUPERSEDED",
    "ClusterActuator",
    "DrainMarkKeeper",
]

DRAINING_SINCE_ANNOTATION = "rebalancer.gpu/draining-since"
# Finding kinds.
DRAIN_TIMEOUT: Final = "drain-timeout"
DRAIN_INTERRUPTED: Final = "drain-interrupted"
STATE_SUPERSEDED: Final = "state-superseded"

_DRAINED: frozenset[OutcomeResult] = frozenset({"evicted", "gone"})
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")

log = logging.getLogger(__name__)

# Why a pod's annotations could not be patched.


def _minutes(span: timedelta) -> int:
    return int(span.total_seconds() // 60)


class _StoredMemory:
    """The actuator's `cycle.CycleMemory`: its history, saved as it changes."""

    def __init__(self, actuator: ClusterActuator) -> None:
        self._actuator = actuator

    @property
    def history(self) -> DisruptionHistory:
        return self._actuator.history

    def begin(
        self, snapshot: Snapshot, policy: Policy, judged: Collection[EvictionRecord] | None = None
    ) -> DisruptionHistory:
        actuator = self._actuator
        history = actuator.history.for_cycle(snapshot, policy, judged)
        actuator.remember(history)
        return history

    def record(self, decision: Decision, outcomes: Sequence[Outcome], now: datetime) -> None:
        actuator = self._actuator
        history = actuator.history.recorded(decision, outcomes, now)
        if history is not actuator.history:
            actuator.remember(history)


class ClusterActuator:
    """The live Evictor: drain marks and checkpoint requests around a KubeEvictor, and the memory."""

    mode: Mode = "live"

    def __init__(
        self,
        evictor: KubeEvictor,
        tainter: NodeTainter,
        api_client: client.ApiClient,
        cfg: EvictionConfig,
        *,
        state_store: StateStore | None = None,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        request_timeout: RequestTimeout = (5.0, 30.0),
        fence: Fence = UNFENCED,
    ) -> None:
        key = getattr(tainter, "key", cfg.drain_taint_key)
        if key != cfg.drain_taint_key:
            raise ValueError(f"the tainter marks {key!r} but the policy says {cfg.drain_taint_key!r}")
        if evictor.mode != "live":
            raise ValueError("the actuator writes: a server-side dry run is a KubeEvictor on its own")
        self._evictor = evictor
        evictor.on_evicted = self._evicted_one
        self._tainter = tainter
        self._core = client.CoreV1Api(api_client)
        self._cfg = cfg
        self._stored_key: str | None = None  # the drain taint key of the stored state
        self._store = state_store
        self._backoff = backoff
        self._sleep = sleep
        self._timeout = request_timeout
        self._checkpoints = CheckpointRequester(
            api_client, cfg, fence=fence, backoff=backoff, sleep=sleep, request_timeout=request_timeout
        )
        # Why this actuator stopped writing for the rest of its term (its memory belongs to a later
        # leader); cleared when a new term reloads the memory.
        self._halted: str | None = None

        state = (state_store.load() if state_store is not None else None) or ActuatorState()
        self._history = state.history
        self._drains: dict[str, DrainRecord] = dict(state.drains)
        self._new_term = False
        self._drain_notes: list[Finding] = []
        # Nodes whose mark must go (an abandoned drain whose untaint failed): retried every cycle.
        self._release: set[str] = set()

        self._snapshot: Snapshot | None = None
        self._cycle_id = ""
        # Nodes carrying our mark at the start of this cycle, with the drain's start.
        self._marked: dict[str, datetime] = {}

    @classmethod
    def from_config(
        cls,
        api_client: client.ApiClient,
        cfg: EvictionConfig,
        *,
        state_store: StateStore | None = None,
        requested_by: str = REQUESTER,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        request_timeout: RequestTimeout = (5.0, 30.0),
        fence: Fence = UNFENCED,
    ) -> ClusterActuator:
        """The actuator the policy's `eviction:` section describes: a KubeEvictor and a KubeTainter,
        every write of either asking `fence` first."""
        evictor = KubeEvictor(
            api_client,
            grace_period_seconds=cfg.grace_period_seconds,
            retries=cfg.retries,
            backoff=backoff,
            sleep=sleep,
            request_timeout=request_timeout,
            requested_by=requested_by,
            fence=fence,
        )
        tainter = KubeTainter(
            api_client,
            key=cfg.drain_taint_key,
            effect=cfg.drain_taint_effect,
            retries=cfg.retries,
            backoff=backoff,
            sleep=sleep,
            request_timeout=request_timeout,
            fence=fence,
            unmark_fence=fence.lease_only() if isinstance(fence, WriteFence) else fence,
        )
        return cls(
            evictor,
            tainter,
            api_client,
            cfg,
            state_store=state_store,
            backoff=backoff,
            sleep=sleep,
            request_timeout=request_timeout,
            fence=fence,
        )

    # ---- the memory

    @property
    def history(self) -> DisruptionHistory:
        return self._history

    @property
    def memory(self) -> _StoredMemory:
        """What a live run plans with (`run_cycle(..., memory=actuator.memory)`)."""
        return _StoredMemory(self)

    @property
    def state(self) -> ActuatorState:
        return ActuatorState(
            history=self._history, drains=dict(self._drains), drain_taint_key=self._cfg.drain_taint_key
        )

    def remember(self, history: DisruptionHistory) -> None:
        """Take `history` as the memory, saved at once."""
        self._history = history
        self._save()

    def findings(self) -> tuple[Finding, ...]:
        """The notes of the last cycle: `drain-timeout` per node unmarked, failed checkpoint requests."""
        return tuple(self._drain_notes)

    def reset_circuit(self, snapshot: Snapshot) -> tuple[Workload, ...]:
        """Operator reset: forget the evictions that keep the circuit open on `snapshot`; their workloads."""
        trips = open_circuits(snapshot, self._history, self._cfg.reschedule_timeout)
        reset = tuple(trip.workload for trip in trips)
        if reset:
            log.warning(
                "circuit breaker reset by the operator (was open for %s)", ", ".join(w.ref for w in reset)
            )
            kept = tuple(r for r in self._history.evictions if r.workload not in reset)
            self.remember(replace(self._history, evictions=kept))
        return reset

    # ---- lifecycle

    def new_term(self) -> None:
        """This replica leads again (or for the first time): the next cycle takes the stored memory,
        which another replica may have changed, and cleans marks no owned drain explains."""
        self._new_term = True

    def load_state(self) -> bool:
        """Take the store's memory in place of this one's; True when the store had a state. Without a
        readable one the memory is kept, so an unreadable store never closes an open circuit."""
        state = self._store.load() if self._store is not None else None
        if state is None:
            return False
        self._history = state.history
        self._drains = dict(state.drains)
        self._stored_key = state.drain_taint_key
        return True

    def cleanup_orphans(self) -> tuple[TaintChange, ...]:
        """Unmark every node whose mark no drain of this process (or of its stored state) owns."""
        try:
            marks = self._tainter.tainted()
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            # Not fatal: every mark still expires by its draining-since at the next begin_cycle.
            log.warning("cannot list nodes marked draining: %s", exc)
            return ()
        changes: list[TaintChange] = []
        for node, value in sorted(marks.items()):
            owned = self._drains.get(node)
            if owned is not None and owned.cycle_id == value:
                continue
            changes.append(self._untaint(node, f"left over from an earlier run (mark {value!r})"))
        self._save()
        return tuple(changes)

    def begin_cycle(self, snapshot: Snapshot, cycle_id: str) -> None:
        """Start a cycle on `snapshot`: a new term's memory and orphans, PDB memory, expired drain marks."""
        if not _LABEL_VALUE.match(cycle_id):
            raise ValueError(f"cycle id {cycle_id!r} is not a valid taint value (letters, digits, -_., 63)")
        self._snapshot = snapshot
        self._cycle_id = cycle_id
        self._evictor.begin_cycle(snapshot, cycle_id)
        self.tend_marks(snapshot)

    def tend_marks(self, snapshot: Snapshot) -> tuple[Finding, ...]:
        """A cycle in dry run: the marks live cycles left are kept right as `begin_cycle` keeps them (a
        new term's memory, orphan and interrupted marks; expired and stuck drains; failed unmarks
        retried), and the memory saved; no mark is set, no pod evicted, no checkpoint asked. The notes
        of the marks it lifted. `begin_cycle` starts every live cycle with it."""
        self._drain_notes.clear()
        # Marks lifted before the drain-mark review: the snapshot still shows them, read before.
        lifted = self._start_term(snapshot) if self._new_term else set()
        self._marked = {}
        self._expire_drains(snapshot, lifted)
        self._save()
        return self.findings()

    def _start_term(self, snapshot: Snapshot) -> set[str]:
        """This replica's first cycle of a term: the stored memory, and the marks no owned drain explains
        or whose drain a restart interrupted lifted; the nodes unmarked."""
        self._new_term = False  # first: a term change signalled meanwhile must not be lost
        self._halted = None
        self._stored_key = None
        self.load_state()
        self._lift_former_keys()
        lifted: set[str] = set()
        for change in self.cleanup_orphans():
            log.info("orphan drain mark removed from %s: %s", change.node, change.detail or "ok")
            if change.ok:
                lifted.add(change.node)
        return lifted | self._lift_interrupted(snapshot, lifted)

    def _lift_former_keys(self) -> None:
        """After `eviction.drain_taint_key` changed: lift the marks under the key the stored state says
        this rebalancer marked with, which nothing would ever remove otherwise, and drop their drains
        (this term marks under the new key). Only a recorded key: a mark under any other key may be
        another installation's."""
        key, former = self._cfg.drain_taint_key, self._stored_key
        if former is None or former == key:
            return
        tainter = self._tainter.with_key(former)
        try:
            marked = tainter.tainted()
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            log.warning("cannot list nodes marked under the former key %s: %s", former, exc)
            return
        self._drains.clear()
        why = f"marked under {former}, no longer eviction.drain_taint_key ({key})"
        for node in sorted(marked):
            change = tainter.untaint(node, remove_annotations=(DRAINING_SINCE_ANNOTATION,))
            self._note_lift(change, DRAIN_INTERRUPTED, why)

    def evict(self, decision: Decision) -> tuple[Outcome, ...]:
        if not decision.approved:
            raise ValueError(
                f"refused decision handed to an evictor ({decision.proposal.strategy}: {decision.blocked_by})"
            )
        if self._snapshot is None:
            raise RuntimeError("ClusterActuator.evict() called outside begin_cycle() / end_cycle()")
        pods = decision.pods_in_order
        if self._halted is not None:
            return tuple(
                Outcome(p.namespace, p.name, "error", f"{NOT_ATTEMPTED}{self._halted}") for p in pods
            )
        node = decision.proposal.node if decision.proposal.kind == "node" else None
        if node is not None:
            change = self._mark(node)
            if not change.ok:
                detail = (  # a closed fence says why itself; anything else is this node's failure
                    change.detail
                    if change.detail.startswith(NOT_ATTEMPTED)
                    else f"{NOT_ATTEMPTED}cannot mark node {node} draining ({change.detail})"
                )
                return tuple(Outcome(p.namespace, p.name, "error", detail) for p in pods)
        outcomes = self._evictor.evict(decision)
        if node is not None and any(o.result not in _DRAINED for o in outcomes):
            outcomes = self._abandon(node, outcomes)
        return outcomes

    def _evicted_one(self, decision: Decision, outcome: Outcome) -> None:
        """Each pod as it is evicted goes into the memory, saved at once, so a crash in the middle of a
        drain loses none of its evictions (the circuit breaker watches them, the cooldown and disruption
        budget count them). The whole decision is recorded again as it ends (a node drained, a failed
        drain), which adds nothing twice."""
        if self._snapshot is None:
            return
        pod = next(p for p in decision.proposal.pods if p.key == (outcome.namespace, outcome.pod))
        alone = replace(decision.proposal, kind="pod", pods=(pod,), node=None, nodes_freed=())
        history = self._history.recorded(replace(decision, proposal=alone), (outcome,), self._snapshot.now)
        if history is not self._history:
            self.remember(history)

    def end_cycle(self, decisions: Sequence[Decision], *, completed: bool) -> tuple[Finding, ...]:
        """Finish the cycle: retry failed unmarks, ask the checkpoints the planner waits for, withdraw
        expired requests no plan wanted (only when the cycle `completed`: one that failed half-way saw
        only some of its plans), save; the cycle's notes."""
        snapshot = self._snapshot
        if snapshot is not None:
            for node in sorted(self._release):
                self._untaint(node, "drain abandoned")
            waiting = [d for d in decisions if d.blocked_by == CHECKPOINT_PENDING]
            notes, refused = self._checkpoints.request(waiting, snapshot.now)
            self._drain_notes.extend(notes)
            # What the planner says next cycle of the pods it holds: replaced, each cycle asks again.
            # Not saved (the state store keeps no refusals), so no write of its own.
            if refused != self._history.checkpoint_refused:
                self._history = replace(self._history, checkpoint_refused=refused)
            if completed:
                wanted = {p.key for d in decisions if d.approved or d in waiting for p in d.proposal.pods}
                self._checkpoints.withdraw(snapshot, wanted)
        self._save()
        self._snapshot = None
        return self.findings()

    # ---- drain marks

    def _busy(self, snapshot: Snapshot, node: str) -> list[Pod]:
        """The pods that keep a drained node from being done: not DaemonSet, mirror or leaving."""
        return [p for p in snapshot.pods_on(node) if not (p.is_daemonset or p.is_mirror or p.terminating)]

    def _lift_interrupted(self, snapshot: Snapshot, lifted: set[str]) -> set[str]:
        """At a new term: unmark every node whose drain this process did not finish (a restart or another
        leader interrupted it) and that still runs pods. Its plan is gone with the process that made it;
        if the node is still worth draining, this term plans it again and marks it anew. A marked node
        already empty keeps its mark: that drain is done, the autoscaler's to take."""
        key = self._cfg.drain_taint_key
        done: set[str] = set()
        for node in snapshot.nodes.values():
            if node.name in lifted or not any(t.key == key for t in node.taints):
                continue
            busy = self._busy(snapshot, node.name)
            if not busy:
                continue
            pods = plural(len(busy), "pod")
            why = f"drain interrupted (restart or leader change) with {pods} still on the node"
            change = self._lift(node.name, DRAIN_INTERRUPTED, why)
            if change.ok:
                done.add(node.name)
        return done

    def _expire_drains(self, snapshot: Snapshot, lifted: set[str]) -> None:
        key = self._cfg.drain_taint_key
        for name in [n for n in self._drains if n not in snapshot.nodes]:
            log.info("node %s is gone: its drain is complete", name)
            del self._drains[name]
        stuck = self._pending_from(snapshot)
        for node in snapshot.nodes.values():
            if node.name in lifted:
                continue
            mark = next((t for t in node.taints if t.key == key), None)
            if node.name in self._release:
                self._untaint(node.name, "drain abandoned")
                continue
            if mark is None:
                self._drains.pop(node.name, None)
                if DRAINING_SINCE_ANNOTATION in node.annotations:  # the mark was removed by someone else
                    self._untaint(node.name, "draining-since without a mark")
                continue
            since = rfc3339.parse_or_none(node.annotations.get(DRAINING_SINCE_ANNOTATION))
            owned = self._drains.get(node.name)
            if since is None and owned is not None and owned.cycle_id == mark.value:
                since = owned.since
            expired = self._expired(node, since, snapshot)
            why = expired or stuck.get(node.name)
            if why is None:
                assert since is not None
                self._marked[node.name] = since
                continue
            self._lift(node.name, DRAIN_TIMEOUT if expired else DRAIN_INTERRUPTED, why)

    def _pending_from(self, snapshot: Snapshot) -> dict[str, str]:
        """The nodes pods were evicted from whose workload keeps the circuit open (its new pods Pending),
        with why: their marks go, so the pods can come back to them."""
        trips = {t.workload: t for t in open_circuits(snapshot, self._history, self._cfg.reschedule_timeout)}
        stuck: dict[str, str] = {}
        for record in self._history.evictions:
            trip = trips.get(record.workload)
            if trip is not None and record.node is not None and record.node not in stuck:
                stuck[record.node] = f"{trip.detail}: lifted so its pods can come back"
        return stuck

    def _expired(self, node: Node, since: datetime | None, snapshot: Snapshot) -> str | None:
        if since is None:
            return "no readable draining-since annotation"
        age = snapshot.now - since
        limit = timedelta(seconds=self._cfg.drain_timeout)
        busy = self._busy(snapshot, node.name)
        if busy and age >= limit:
            return f"{len(busy)} pod(s) still on the node {_minutes(age)}m after the drain began"
        if age >= 2 * limit:
            return f"the node is still there {_minutes(age)}m after the drain began"
        return None

    def _mark(self, node: str) -> TaintChange:
        assert self._snapshot is not None
        now = self._snapshot.now
        since = self._marked.get(node)
        notes = {} if since is not None else {DRAINING_SINCE_ANNOTATION: rfc3339.format_utc(now)}
        change = self._tainter.taint(node, self._cycle_id, annotations=notes)
        if change.ok:
            self._drains[node] = DrainRecord(self._cycle_id, since or now)
            self._marked[node] = since or now
            self._save()
            log.info("node %s marked draining (cycle %s)", node, self._cycle_id)
        else:
            log.warning("cannot mark node %s draining: %s", node, change.detail)
        return change

    def _lift(self, node: str, kind: FindingKind, why: str) -> TaintChange:
        """Unmark `node` for `why`, noted as a finding of `kind` (saying so when the write failed)."""
        change = self._untaint(node, why)
        self._note_lift(change, kind, why)
        return change

    def _note_lift(self, change: TaintChange, kind: FindingKind, why: str) -> None:
        failed = "" if change.ok else f"; removing it failed ({change.detail})"
        detail = f"drain mark removed: {why}{failed}"
        self._drain_notes.append(Finding(kind=kind, node=change.node, detail=detail))

    def _untaint(self, node: str, why: str) -> TaintChange:
        change = self._tainter.untaint(node, remove_annotations=(DRAINING_SINCE_ANNOTATION,))
        if change.ok:
            self._release.discard(node)
            self._drains.pop(node, None)
            self._marked.pop(node, None)
            if change.changed:
                log.info("drain mark removed from node %s: %s", node, why)
        else:
            self._release.add(node)
            log.warning("cannot remove the drain mark from node %s (%s): %s", node, why, change.detail)
        return change

    def _abandon(self, node: str, outcomes: Sequence[Outcome]) -> tuple[Outcome, ...]:
        change = self._untaint(node, "drain abandoned")
        if change.ok:
            note = f"drain of {node} abandoned, its mark removed"
        else:
            note = (
                f"drain of {node} abandoned; removing its mark failed ({change.detail}), retried next cycle"
            )
        out = list(outcomes)
        first = next(i for i, o in enumerate(out) if o.result not in _DRAINED)
        stop = out[first]
        out[first] = replace(stop, detail=f"{stop.detail}; {note}" if stop.detail else note)
        return tuple(out)

    # ---- state

    def _save(self) -> None:
        if self._store is None:
            return
        state = self.state
        try:
            stored = self._store.save(state)
        except (OSError, ValueError) as exc:
            log.error("cannot save the actuator state: %s", exc)
            return
        if getattr(self._store, "superseded", False) and self._halted is None:
            # A later leader's memory is in the store: nothing more this term, reload at the next one.
            self._halted = "the state ConfigMap was written by a later leader: this replica stopped writing"
            self._new_term = True
            log.error("evictions stopped: %s", self._halted)
            self._drain_notes.append(Finding(kind=STATE_SUPERSEDED, detail=self._halted))
        if stored is not None and stored != state:  # another writer's memory merged in: ours now
            self._history = stored.history
            self._drains = dict(stored.drains)


class DrainMarkKeeper(DryRunEvictor):
    """The dry run of a daemon whose live cycles may have marked nodes (the policy turned `dry_run: true`,
    or a restart with `--dry-run`): it evicts nothing and marks nothing (every approved pod
    `would-evict`), but its cycles keep the marks the live ones left right, as they would (`tend_marks`:
    expired drains, orphan and interrupted marks lifted), so a paused rebalancer never leaves a node
    NoSchedule. Lifting a mark only gives a node back to the scheduler."""

    def __init__(self, actuator: ClusterActuator) -> None:
        self._actuator = actuator
        self._notes: tuple[Finding, ...] = ()

    def begin_cycle(self, snapshot: Snapshot, cycle_id: str) -> None:
        self._notes = self._actuator.tend_marks(snapshot)

    def end_cycle(self, decisions: Sequence[Decision], *, completed: bool) -> tuple[Finding, ...]:
        return self._notes
