"""The live actuator: what happens around each eviction on a real cluster, wrapped around a KubeEvictor.

`ClusterActuator` implements the Evictor protocol (`mode`, `evict(decision)`), so `cycle.run_cycle` uses
it unchanged; the daemon calls `cleanup_orphans()` once at start-up, `begin_cycle(snapshot, cycle_id)`
before each cycle's `run_cycle` and `end_cycle()` after it. It owns three safety mechanisms:

- Node drain marks. Before the first eviction of a whole-node plan (`proposal.kind == "node"`) the node
  gets the taint `<drain_taint_key>=<cycle_id>:<drain_taint_effect>` and, in the same write, the
  annotation `rebalancer.gpu/draining-since: <RFC 3339>` (kept when the node is already marked), so
  evicted pods do not land back. If the plan fails part-way (any outcome other than `evicted` / `gone`)
  the mark is removed at once (drain abandoned). Drains in progress live on the node itself, so they
  survive restarts: at every `begin_cycle`, a marked node still there with pods other than DaemonSet or
  mirror pods `drain_timeout` after draining-since, still there (even empty: the autoscaler did not take
  it) after twice that, or with no readable draining-since, is unmarked; a node gone from the snapshot
  needs nothing. `cleanup_orphans()` unmarks every node whose mark no drain of this process owns.
- Checkpoint-before-evict, for pods annotated `rebalancer.gpu/checkpoint: "true"` (docs/
  checkpoint-protocol.md): the first time such a pod is to be evicted it is annotated
  `rebalancer.gpu/eviction-requested-at: <now>` (a merge patch carrying the pod's uid, clearing an old
  `checkpoint-done`) and nothing of its plan is evicted: every pod of the plan comes back
  `checkpoint-pending`. A later cycle evicts the plan once every checkpointing pod in it has set
  `rebalancer.gpu/checkpoint-done` or was asked `checkpoint_timeout` ago; a gang or node plan never
  moves half-checkpointed. A request no cycle wants any more is withdrawn (both annotations removed)
  at the end of the first complete cycle, `checkpoint_timeout` or more after it was made, that did not
  hand its pod to `evict()`; a gap of a cycle or two inside that window changes nothing.
- The circuit breaker. Every pod this process evicted is remembered with its workload (namespace and
  controller kind / name) and the cycle's time. When, `reschedule_timeout` after such an eviction, pods of
  that workload created since are still unscheduled (Pending, no node), the circuit opens: every
  `evict()` answers `error` ("circuit open: <ns>/<workload> still Pending <n>m after eviction") without
  a request, `circuit_open` is True and `findings()` holds a `circuit-open` finding per workload. It
  closes by itself at the first `begin_cycle` where those pods are placed (or gone), or when an operator
  calls `reset_circuit()`.

The memory (evictions watched by the circuit breaker, drains this process owns) survives restarts and
leader changes through a `StateStore`: loaded when the actuator is built and again by `load_state()` (a
new leadership term), saved by `begin_cycle`, `end_cycle`, `cleanup_orphans` and `reset_circuit`. Stores:
`FileStateStore` (a JSON file) and `ConfigMapStateStore` (JSON under one key of a ConfigMap in the
rebalancer's own namespace, what `rebalancer run` uses by default). A store never stops the daemon: an
unreadable state is logged and read as none, a failed save is logged and made again at the next cycle.

In dry-run (a `DryRunEvictor`, or server-side dry-run) the actuator writes nothing of its own: no marks,
no annotations, no saved state, and evictions are the wrapped evictor's (`would-evict`); the circuit
still refuses.

It must not plan or re-judge decisions (the planner did), read the clock (every time is the snapshot's
`now` given to `begin_cycle`), write Events (sinks/events.py does), touch taints and annotations other
than its own keys, or write any object but nodes (its mark), pods (its annotations, evictions) and its
own state ConfigMap.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer.evictor import (
    REQUESTER,
    Backoff,
    DryRunEvictor,
    KubeEvictor,
    KubeTainter,
    NodeTainter,
    TaintChange,
    exponential_backoff,
    read_or_none,
    release_unread,
)
from rebalancer.kubeapi import describe_transport_error, status_message
from rebalancer.model import Decision, Finding, Mode, Node, Outcome, OutcomeResult, Pod, Snapshot
from rebalancer.policy import EvictionConfig

__all__ = [
    "CHECKPOINT_ANNOTATION",
    "CHECKPOINT_DONE_ANNOTATION",
    "CIRCUIT_OPEN",
    "DRAINING_SINCE_ANNOTATION",
    "DRAIN_TIMEOUT",
    "EVICTION_REQUESTED_AT_ANNOTATION",
    "STATE_CONFIGMAP",
    "STATE_KEY",
    "ActuatorState",
    "ClusterActuator",
    "ConfigMapStateStore",
    "DrainRecord",
    "EvictionRecord",
    "FileStateStore",
    "MemoryStateStore",
    "StateStore",
    "Workload",
    "cycle_id_for",
    "format_time",
    "parse_time",
]

CHECKPOINT_ANNOTATION = "rebalancer.gpu/checkpoint"
EVICTION_REQUESTED_AT_ANNOTATION = "rebalancer.gpu/eviction-requested-at"
CHECKPOINT_DONE_ANNOTATION = "rebalancer.gpu/checkpoint-done"
DRAINING_SINCE_ANNOTATION = "rebalancer.gpu/draining-since"
# Where `rebalancer run` keeps the actuator's memory by default: this key of this ConfigMap, in its own
# namespace (deploy/rbac.yaml grants exactly this name).
STATE_CONFIGMAP = "gpu-rebalancer-state"
STATE_KEY = "actuator-state.json"
# Finding kinds.
CIRCUIT_OPEN = "circuit-open"
DRAIN_TIMEOUT = "drain-timeout"
# A replacement pod is created after the eviction; this much difference between the API server's clock
# (creationTimestamp) and the daemon's (snapshot.now) is allowed when telling it from an older pod.
CLOCK_SKEW = timedelta(minutes=1)

_DRAINED: frozenset[OutcomeResult] = frozenset({"evicted", "gone"})
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_MERGE_PATCH = "application/merge-patch+json"

log = logging.getLogger(__name__)

RequestTimeout = float | tuple[float, float]


# --------------------------------------------------------------------------- times


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC, whole seconds: `2026-11-29T12:00:00Z`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 time (a zone-less one is read as UTC); None when absent or unreadable."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def cycle_id_for(now: datetime) -> str:
    """A cycle id that is a valid taint value and says when: `20261129T120000Z`."""
    return now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def _minutes(span: timedelta) -> int:
    return int(span.total_seconds() // 60)


# --------------------------------------------------------------------------- remembered state


@dataclass(frozen=True, slots=True, order=True)
class Workload:
    """What re-creates a pod: its controller (kind, name) in its namespace; a bare pod is its own."""

    namespace: str
    kind: str
    name: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @staticmethod
    def of(pod: Pod) -> Workload:
        if pod.owner is None:
            return Workload(pod.namespace, "Pod", pod.name)
        return Workload(pod.namespace, pod.owner.kind, pod.owner.name)


@dataclass(frozen=True, slots=True)
class EvictionRecord:
    """A pod this process evicted, and when (the cycle's `now`)."""

    workload: Workload
    pod: str
    evicted_at: datetime


@dataclass(frozen=True, slots=True)
class DrainRecord:
    """A node this process marked draining: the mark's value (its cycle id) and when the drain began."""

    cycle_id: str
    since: datetime


@dataclass(frozen=True)
class ActuatorState:
    """What the actuator remembers between cycles, as a StateStore keeps it."""

    evictions: tuple[EvictionRecord, ...] = ()
    drains: Mapping[str, DrainRecord] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "evictions": [
                {
                    "namespace": r.workload.namespace,
                    "kind": r.workload.kind,
                    "name": r.workload.name,
                    "pod": r.pod,
                    "evictedAt": format_time(r.evicted_at),
                }
                for r in self.evictions
            ],
            "drains": {
                node: {"cycle": d.cycle_id, "since": format_time(d.since)}
                for node, d in sorted(self.drains.items())
            },
        }

    @classmethod
    def from_json(cls, data: object) -> ActuatorState:
        """Raises ValueError on anything it cannot read."""
        try:
            doc = cast("Mapping[str, Any]", data)
            evictions = []
            for item in doc.get("evictions") or ():
                at = parse_time(str(item["evictedAt"]))
                if at is None:
                    raise ValueError(f"bad evictedAt {item['evictedAt']!r}")
                workload = Workload(str(item["namespace"]), str(item["kind"]), str(item["name"]))
                evictions.append(EvictionRecord(workload, str(item["pod"]), at))
            drains = {}
            for node, item in (doc.get("drains") or {}).items():
                since = parse_time(str(item["since"]))
                if since is None:
                    raise ValueError(f"bad drain start {item['since']!r}")
                drains[str(node)] = DrainRecord(str(item["cycle"]), since)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"unreadable actuator state: {exc!r}") from None
        return cls(evictions=tuple(evictions), drains=drains)


class StateStore(Protocol):
    """Keeps the actuator's memory (evictions for the circuit breaker, owned drains) across restarts."""

    def load(self) -> ActuatorState | None: ...

    def save(self, state: ActuatorState) -> None: ...


class MemoryStateStore:
    """Keeps the state in this object (tests; a process handing its memory to a new actuator)."""

    def __init__(self, state: ActuatorState | None = None) -> None:
        self.state = state

    def load(self) -> ActuatorState | None:
        return self.state

    def save(self, state: ActuatorState) -> None:
        self.state = state


class FileStateStore:
    """Keeps the state in a JSON file, replaced atomically (e.g. on a volume that outlives the container).

    An unreadable file is logged and read as no state, so a corrupt file never stops the daemon.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self) -> ActuatorState | None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read actuator state %s: %s", self.path, exc)
            return None
        try:
            return ActuatorState.from_json(json.loads(text))
        except ValueError as exc:
            log.warning("ignoring unreadable actuator state %s: %s", self.path, exc)
            return None

    def save(self, state: ActuatorState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(state.to_json(), out, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp)
            raise


class ConfigMapStateStore:
    """Keeps the state as JSON under one key (`STATE_KEY`) of a ConfigMap, in the rebalancer's namespace.

    The ConfigMap outlives pods and is shared by the replicas, so a restart or a new leader finds the
    memory of the last one. `save()` is one JSON merge patch of that key (other keys, labels and
    annotations stay); a missing ConfigMap is created. `load()` reads it: a missing ConfigMap or key is no
    state, unreadable content is logged and read as no state. Transport errors, 429 and 5xx answers are
    retried (`retries`, `backoff`); what still fails is logged, never raised: load reads as no state, and
    the actuator saves again at its next cycle. Every request carries `request_timeout`.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        namespace: str,
        name: str = STATE_CONFIGMAP,
        key: str = STATE_KEY,
        retries: int = 3,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        request_timeout: RequestTimeout = (5.0, 30.0),
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.key = key
        self._core = client.CoreV1Api(api_client)
        self._retries = retries
        self._backoff = backoff or exponential_backoff()
        self._sleep = sleep
        self._timeout = request_timeout

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def load(self) -> ActuatorState | None:
        raw = self._attempt("read", self._read)
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
            data = doc.get("data") if isinstance(doc, dict) else None
            text = data.get(self.key) if isinstance(data, dict) else None
            if text is None:
                log.warning("ConfigMap %s has no key %s: no stored actuator state", self.ref, self.key)
                return None
            return ActuatorState.from_json(json.loads(text))
        except (ValueError, TypeError) as exc:
            log.warning("ignoring unreadable actuator state in ConfigMap %s: %s", self.ref, exc)
            return None

    def save(self, state: ActuatorState) -> None:
        text = json.dumps(state.to_json(), indent=1, sort_keys=True) + "\n"
        self._attempt("save", lambda: self._write(text))

    # ---- requests

    def _read(self) -> bytes | None:
        """The ConfigMap as the API server sent it; None when there is none (404)."""
        return read_or_none(
            lambda: self._core.read_namespaced_config_map(
                self.name, self.namespace, _preload_content=False, _request_timeout=self._timeout
            )
        )

    def _write(self, text: str) -> None:
        try:
            response = cast(
                "urllib3.BaseHTTPResponse",
                self._core.patch_namespaced_config_map(
                    self.name,
                    self.namespace,
                    {"data": {self.key: text}},
                    _content_type=_MERGE_PATCH,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                ),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = client.V1ConfigMap(
                api_version="v1",
                kind="ConfigMap",
                metadata=client.V1ObjectMeta(
                    name=self.name,
                    namespace=self.namespace,
                    labels={
                        "app.kubernetes.io/name": "gpu-rebalancer",
                        "app.kubernetes.io/managed-by": "gpu-rebalancer",
                    },
                ),
                data={self.key: text},
            )
            response = cast(
                "urllib3.BaseHTTPResponse",
                self._core.create_namespaced_config_map(
                    self.namespace, body, _preload_content=False, _request_timeout=self._timeout
                ),
            )
        release_unread(response)

    def _attempt(self, what: str, request: Callable[[], bytes | None]) -> bytes | None:
        """`request()`, retried on transport errors, 429, 5xx (and 409: a create raced another writer's,
        the next attempt patches it); None, logged, when it still fails."""
        attempt = 0
        while True:
            try:
                return request()
            except ApiException as exc:
                status = exc.status or 0
                problem = (
                    f"HTTP {status}: {status_message(exc)}"
                    if status
                    else f"no valid answer: {status_message(exc)}"
                )
                transient = status in (0, 409, 429) or status >= 500
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                problem = describe_transport_error(exc)
                transient = True
            if not transient or attempt >= self._retries:
                log.error(
                    "cannot %s the actuator state in ConfigMap %s: %s (after %d attempts)",
                    what,
                    self.ref,
                    problem,
                    attempt + 1,
                )
                return None
            self._sleep(self._backoff(attempt))
            attempt += 1


# --------------------------------------------------------------------------- the actuator


@dataclass(frozen=True, slots=True)
class _Trip:
    """A workload that keeps the circuit open."""

    workload: Workload
    evicted_at: datetime
    pending: int
    minutes: int

    @property
    def detail(self) -> str:
        return f"circuit open: {self.workload.ref} still Pending {self.minutes}m after eviction"


class ClusterActuator:
    """The live Evictor: drain marks, checkpoint-before-evict and a circuit breaker around a KubeEvictor.

    Per cycle: `begin_cycle(snapshot, cycle_id)`, then `run_cycle(snapshot, loaded, actuator, ...)`, then
    `end_cycle()` (`end_cycle(completed=False)` when the cycle failed). `cleanup_orphans()` once before
    the first cycle; with leader election, by the leader before its first live cycle (a standby replica
    would unmark the leader's drains).
    """

    def __init__(
        self,
        evictor: KubeEvictor | DryRunEvictor,
        tainter: NodeTainter,
        api_client: client.ApiClient | None,
        cfg: EvictionConfig,
        *,
        state_store: StateStore | None = None,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        request_timeout: RequestTimeout = (5.0, 30.0),
    ) -> None:
        key = getattr(tainter, "key", cfg.drain_taint_key)
        if key != cfg.drain_taint_key:
            raise ValueError(f"the tainter marks {key!r} but the policy says {cfg.drain_taint_key!r}")
        self.mode: Mode = evictor.mode
        if self.mode == "live" and api_client is None:
            raise ValueError("a live actuator needs an API client (pod annotations)")
        self._evictor = evictor
        self._tainter = tainter
        self._core = client.CoreV1Api(api_client) if api_client is not None else None
        self._cfg = cfg
        self._store = state_store
        self._backoff = backoff or exponential_backoff()
        self._sleep = sleep
        self._timeout = request_timeout

        state = state_store.load() if state_store is not None else None
        state = state or ActuatorState()
        self._evictions: list[EvictionRecord] = list(state.evictions)
        self._drains: dict[str, DrainRecord] = dict(state.drains)
        self._trips: tuple[_Trip, ...] = ()
        self._drain_notes: list[Finding] = []
        # Nodes whose mark must go (an abandoned drain whose untaint failed): retried every cycle.
        self._release: set[str] = set()

        self._snapshot: Snapshot | None = None
        self._cycle_id = ""
        # Nodes carrying our mark at the start of this cycle, with the drain's start.
        self._marked: dict[str, datetime] = {}
        # Pods handed to evict() this cycle (their checkpoint requests stay).
        self._handled: set[tuple[str, str]] = set()

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
    ) -> ClusterActuator:
        """The actuator the policy's `eviction:` section describes: a KubeEvictor and a KubeTainter."""
        evictor = KubeEvictor(
            api_client,
            grace_period_seconds=cfg.grace_period_seconds,
            server_dry_run=cfg.server_dry_run,
            retries=cfg.retries,
            backoff=backoff,
            sleep=sleep,
            request_timeout=request_timeout,
            requested_by=requested_by,
        )
        tainter = KubeTainter(
            api_client,
            key=cfg.drain_taint_key,
            effect=cfg.drain_taint_effect,
            retries=cfg.retries,
            backoff=backoff,
            sleep=sleep,
            request_timeout=request_timeout,
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
        )

    # ---- what the daemon reads

    @property
    def live(self) -> bool:
        return self.mode == "live"

    @property
    def circuit_open(self) -> bool:
        return bool(self._trips)

    @property
    def state(self) -> ActuatorState:
        return ActuatorState(evictions=tuple(self._evictions), drains=dict(self._drains))

    def findings(self) -> tuple[Finding, ...]:
        """`circuit-open` per workload keeping it open; `drain-timeout` per node unmarked this cycle."""
        circuit = tuple(
            Finding(
                kind=CIRCUIT_OPEN,
                namespace=trip.workload.namespace,
                detail=(
                    f"{trip.detail}: {trip.pending} pod(s) of {trip.workload.kind} {trip.workload.name} "
                    f"evicted at {format_time(trip.evicted_at)} are not scheduled; no eviction until they "
                    "are placed or the circuit is reset"
                ),
            )
            for trip in self._trips
        )
        return (*circuit, *self._drain_notes)

    def reset_circuit(self) -> tuple[Workload, ...]:
        """Operator reset: forget the evictions that opened the circuit, close it; returns their workloads."""
        reset = tuple(trip.workload for trip in self._trips)
        if reset:
            log.warning(
                "circuit breaker reset by the operator (was open for %s)", ", ".join(w.ref for w in reset)
            )
        self._evictions = [r for r in self._evictions if r.workload not in reset]
        self._trips = ()
        self._save()
        return reset

    # ---- lifecycle

    def load_state(self) -> bool:
        """Take the store's memory in place of this one's (a new leadership term: another replica may
        have evicted, drained or settled since this one loaded); True when the store had a state. Without
        a readable one the memory is kept, so an unreadable store never closes an open circuit."""
        state = self._store.load() if self._store is not None else None
        if state is None:
            return False
        self._evictions = list(state.evictions)
        self._drains = dict(state.drains)
        return True

    def cleanup_orphans(self) -> tuple[TaintChange, ...]:
        """Start-up: unmark every node whose mark no drain of this process (or of its stored state) owns."""
        if not self.live:
            return ()
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
            change = self._untaint(node, f"left over from an earlier run (mark {value!r})")
            changes.append(change)
        self._save()
        return tuple(changes)

    def begin_cycle(self, snapshot: Snapshot, cycle_id: str) -> None:
        """Start a cycle on `snapshot`: PDB memory, circuit breaker, expired drain marks."""
        if not _LABEL_VALUE.match(cycle_id):
            raise ValueError(f"cycle id {cycle_id!r} is not a valid taint value (letters, digits, -_., 63)")
        self._snapshot = snapshot
        self._cycle_id = cycle_id
        self._handled.clear()
        self._drain_notes.clear()
        if isinstance(self._evictor, KubeEvictor):
            self._evictor.begin_cycle(snapshot.pdbs)
        self._update_circuit(snapshot)
        self._marked = {}
        if self.live:
            self._expire_drains(snapshot)
        self._save()

    def end_cycle(self, *, completed: bool = True) -> None:
        """Finish the cycle: retry failed unmarks, withdraw expired checkpoint requests no plan wanted this
        cycle (only when the cycle `completed`: one that failed half-way saw only some of its plans), save."""
        snapshot = self._snapshot
        if self.live and snapshot is not None:
            for node in sorted(self._release):
                self._untaint(node, "drain abandoned")
            if completed:
                self._withdraw_checkpoints(snapshot)
        self._save()
        self._snapshot = None

    # ---- the Evictor protocol

    def evict(self, decision: Decision) -> tuple[Outcome, ...]:
        if not decision.approved:
            raise ValueError(
                f"refused decision handed to an evictor ({decision.proposal.strategy}: {decision.blocked_by})"
            )
        if self._snapshot is None:
            raise RuntimeError("ClusterActuator.evict() called outside begin_cycle() / end_cycle()")
        pods = decision.proposal.pods
        self._handled.update(p.key for p in pods)
        if self._trips:
            detail = self._trips[0].detail
            return tuple(Outcome(p.namespace, p.name, "error", detail) for p in pods)
        if not self.live:
            return self._evictor.evict(decision)

        waiting = self._checkpoint_gate(pods)
        if waiting is not None:
            return waiting

        node = decision.proposal.node if decision.proposal.kind == "node" else None
        if node is not None:
            change = self._mark(node)
            if not change.ok:
                detail = f"not attempted: cannot mark node {node} draining ({change.detail})"
                return tuple(Outcome(p.namespace, p.name, "error", detail) for p in pods)

        outcomes = self._evictor.evict(decision)
        now = self._snapshot.now
        by_key = {p.key: p for p in pods}
        for outcome in outcomes:
            pod = by_key.get((outcome.namespace, outcome.pod))
            if outcome.result == "evicted" and pod is not None:
                self._evictions.append(EvictionRecord(Workload.of(pod), pod.name, now))
        if node is not None and any(o.result not in _DRAINED for o in outcomes):
            outcomes = self._abandon(node, outcomes)
        return outcomes

    # ---- circuit breaker

    def _update_circuit(self, snapshot: Snapshot) -> None:
        now = snapshot.now
        timeout = timedelta(seconds=self._cfg.reschedule_timeout)
        unplaced: dict[Workload, list[Pod]] = defaultdict(list)
        for pod in snapshot.pods:
            if pod.phase == "Pending" and pod.node_name is None:
                unplaced[Workload.of(pod)].append(pod)
        by_workload: dict[Workload, list[EvictionRecord]] = defaultdict(list)
        for record in self._evictions:
            by_workload[record.workload].append(record)

        kept: list[EvictionRecord] = []
        trips: list[_Trip] = []
        for workload, records in sorted(by_workload.items()):
            oldest = min(r.evicted_at for r in records)
            waiting = [
                p for p in unplaced.get(workload, ()) if p.created is None or p.created >= oldest - CLOCK_SKEW
            ]
            if now - oldest < timeout:
                kept.extend(records)
            elif waiting:
                trips.append(_Trip(workload, oldest, len(waiting), _minutes(now - oldest)))
                kept.extend(records)
            else:  # placed (or never re-created): settled; younger evictions are still watched
                kept.extend(r for r in records if now - r.evicted_at < timeout)
        was_open = bool(self._trips)
        self._evictions = kept
        self._trips = tuple(trips)
        if self._trips:
            log.error("circuit open: %s", "; ".join(t.detail for t in self._trips))
        elif was_open:
            log.warning("circuit closed: the evicted workloads are placed again")

    # ---- drain marks

    def _expire_drains(self, snapshot: Snapshot) -> None:
        key = self._cfg.drain_taint_key
        for name in [n for n in self._drains if n not in snapshot.nodes]:
            log.info("node %s is gone: its drain is complete", name)
            del self._drains[name]
        for node in snapshot.nodes.values():
            mark = next((t for t in node.taints if t.key == key), None)
            if node.name in self._release:
                self._untaint(node.name, "drain abandoned")
                continue
            if mark is None:
                self._drains.pop(node.name, None)
                if DRAINING_SINCE_ANNOTATION in node.annotations:  # the mark was removed by someone else
                    self._untaint(node.name, "draining-since without a mark")
                continue
            since = parse_time(node.annotations.get(DRAINING_SINCE_ANNOTATION))
            owned = self._drains.get(node.name)
            if since is None and owned is not None and owned.cycle_id == mark.value:
                since = owned.since
            why = self._expired(node, since, snapshot)
            if why is None:
                assert since is not None
                self._marked[node.name] = since
                continue
            change = self._untaint(node.name, why)
            self._drain_notes.append(
                Finding(
                    kind=DRAIN_TIMEOUT,
                    node=node.name,
                    detail=f"drain mark removed: {why}"
                    + ("" if change.ok else f"; removing it failed ({change.detail})"),
                )
            )

    def _expired(self, node: Node, since: datetime | None, snapshot: Snapshot) -> str | None:
        if since is None:
            return "no readable draining-since annotation"
        age = snapshot.now - since
        limit = timedelta(seconds=self._cfg.drain_timeout)
        busy = [p for p in snapshot.pods_on(node.name) if not (p.is_daemonset or p.is_mirror)]
        if busy and age >= limit:
            return f"{len(busy)} pod(s) still on the node {_minutes(age)}m after the drain began"
        if age >= 2 * limit:
            return f"the node is still there {_minutes(age)}m after the drain began"
        return None

    def _mark(self, node: str) -> TaintChange:
        assert self._snapshot is not None
        now = self._snapshot.now
        since = self._marked.get(node)
        notes = {} if since is not None else {DRAINING_SINCE_ANNOTATION: format_time(now)}
        change = self._tainter.taint(node, self._cycle_id, annotations=notes)
        if change.ok:
            self._drains[node] = DrainRecord(self._cycle_id, since or now)
            self._marked[node] = since or now
            log.info("node %s marked draining (cycle %s)", node, self._cycle_id)
        else:
            log.warning("cannot mark node %s draining: %s", node, change.detail)
        return change

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

    # ---- checkpoint-before-evict

    def _checkpoint_gate(self, pods: Sequence[Pod]) -> tuple[Outcome, ...] | None:
        """None when the plan may be evicted now; otherwise the plan's outcomes while it waits."""
        assert self._snapshot is not None
        now = self._snapshot.now
        timeout = timedelta(seconds=self._cfg.checkpoint_timeout)
        checkpointing = [p for p in pods if p.annotations.get(CHECKPOINT_ANNOTATION) == "true"]
        if not checkpointing:
            return None
        ready: dict[tuple[str, str], str] = {}
        waiting: dict[tuple[str, str], str] = {}
        ask: list[Pod] = []
        for pod in checkpointing:
            asked = parse_time(pod.annotations.get(EVICTION_REQUESTED_AT_ANNOTATION))
            if asked is None:
                ask.append(pod)
            elif pod.annotations.get(CHECKPOINT_DONE_ANNOTATION):
                ready[pod.key] = "checkpoint done"
            elif now - asked >= timeout:
                ready[pod.key] = "checkpoint timed out"
            else:
                waiting[pod.key] = (
                    f"checkpoint requested at {format_time(asked)}; waiting for checkpoint-done "
                    f"until {format_time(asked + timeout)}"
                )
        if not ask and not waiting:
            for pod in checkpointing:
                log.info("evicting %s: %s", pod.ref, ready[pod.key])
            return None

        failed: dict[tuple[str, str], Outcome] = {}
        for pod in ask:
            problem = self._patch_annotations(
                pod, {EVICTION_REQUESTED_AT_ANNOTATION: format_time(now), CHECKPOINT_DONE_ANNOTATION: None}
            )
            if problem is None:
                waiting[pod.key] = (
                    f"checkpoint requested at {format_time(now)}; eviction after checkpoint-done or at "
                    f"{format_time(now + timeout)}"
                )
                log.info("checkpoint requested from %s", pod.ref)
            else:
                result, detail = problem
                failed[pod.key] = Outcome(pod.namespace, pod.name, result, f"checkpoint request: {detail}")
        others = ", ".join(p.ref for p in checkpointing if p.key in waiting) or "none"
        outcomes: list[Outcome] = []
        for pod in pods:
            if pod.key in failed:
                outcomes.append(failed[pod.key])
                continue
            if pod.key in waiting:
                detail = waiting[pod.key]
            elif pod.key in ready:
                detail = f"{ready[pod.key]}; the plan waits for the checkpoints of {others}"
            else:
                detail = f"the plan waits for the checkpoints of {others}"
            outcomes.append(Outcome(pod.namespace, pod.name, "checkpoint-pending", detail))
        return tuple(outcomes)

    def _withdraw_checkpoints(self, snapshot: Snapshot) -> None:
        timeout = timedelta(seconds=self._cfg.checkpoint_timeout)
        for pod in snapshot.pods:
            if EVICTION_REQUESTED_AT_ANNOTATION not in pod.annotations or pod.key in self._handled:
                continue
            asked = parse_time(pod.annotations[EVICTION_REQUESTED_AT_ANNOTATION])
            if asked is not None and snapshot.now - asked < timeout:
                continue  # still inside its window: a plan may want the pod again next cycle
            problem = self._patch_annotations(
                pod, {EVICTION_REQUESTED_AT_ANNOTATION: None, CHECKPOINT_DONE_ANNOTATION: None}
            )
            if problem is None:
                log.info("checkpoint request of %s withdrawn: no plan wants it evicted any more", pod.ref)
            elif problem[0] != "gone":
                log.warning("cannot withdraw the checkpoint request of %s: %s", pod.ref, problem[1])

    def _patch_annotations(
        self, pod: Pod, annotations: Mapping[str, str | None]
    ) -> tuple[OutcomeResult, str] | None:
        """Merge-patch the pod's annotations (None removes one). The patch carries the pod's uid: the API
        server refuses to change it (409 / 422 naming the uid), so a re-created pod of the same name is never
        annotated. None when done, else (`gone` | `error`, why)."""
        assert self._core is not None
        if not pod.uid:
            return ("error", "pod has no uid: refusing to patch without a uid precondition")
        body = {"metadata": {"uid": pod.uid, "annotations": dict(annotations)}}
        attempt = 0
        while True:
            try:
                response = cast(
                    "urllib3.BaseHTTPResponse",
                    self._core.patch_namespaced_pod(
                        pod.name,
                        pod.namespace,
                        body,
                        _content_type=_MERGE_PATCH,
                        _preload_content=False,
                        _request_timeout=self._timeout,
                    ),
                )
                with suppress(urllib3.exceptions.HTTPError, OSError):
                    response.drain_conn()
                response.release_conn()
                return None
            except ApiException as exc:
                status = exc.status or 0
                if status == 404:
                    return ("gone", "pod no longer exists (404)")
                if status == 409 or (status == 422 and "uid" in status_message(exc)):
                    return ("gone", f"pod was replaced or changed ({status})")
                if not (status in (0, 429) or status >= 500):
                    return ("error", f"HTTP {status}: {status_message(exc)}")
                problem = (
                    f"HTTP {status}: {status_message(exc)}"
                    if status
                    else f"no valid answer: {status_message(exc)}"
                )
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                problem = describe_transport_error(exc)
            if attempt >= self._cfg.retries:
                return ("error", f"{problem} (after {attempt + 1} attempts)")
            self._sleep(self._backoff(attempt))
            attempt += 1

    # ---- state

    def _save(self) -> None:
        if self._store is None or not self.live:  # a dry run writes nothing, not even its memory
            return
        try:
            self._store.save(self.state)
        except (OSError, ValueError) as exc:
            log.error("cannot save the actuator state: %s", exc)
