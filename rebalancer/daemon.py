"""`rebalancer run`: the in-cluster service around cycle.py, and `rebalancer once` against a live cluster.

Owns everything that is about running over time rather than about one cycle:

- the loop: an apscheduler 3.x interval job (`interval` from the policy, first cycle at start,
  `max_instances=1`, `coalesce=True`, jitter); a tick that finds the previous cycle still running is
  skipped and counted;
- one cycle (`Daemon.run_cycle`): re-check the policy file, check leadership, read the wall clock once
  (`now`), build the Snapshot (an injected `SnapshotSource`; live: KubeSource + Prometheus telemetry),
  evaluate, hand the approved decisions to the evictor (DryRunEvictor, or the live one: in `run` the
  ClusterActuator of rebalancer.actuator around a KubeEvictor, in `once` a plain KubeEvictor) through a
  `GatedEvictor`, assemble the report, count it in the metrics, keep it for `/report`, publish it to the
  log sink, the Events sink (`run`, live cycles) and the notifiers, and remember what was disrupted for
  the cooldown guard;
- graceful shutdown: SIGTERM / SIGINT set a stop flag that the GatedEvictor checks *between* decisions
  only, so a gang or a node drain in flight completes and nothing after it starts; the process then
  releases its Lease and exits 0;
- leader election (`LeaseElector`): a coordination.k8s.io/v1 Lease with client-go semantics (a
  follower takes over only after it has seen the same record unchanged for a whole lease duration of
  its own monotonic clock). A leader counts itself leader only until `renew_deadline` after the moment
  it *sent* its last successful renewal, and the GatedEvictor additionally wants `leader_margin`
  seconds left before each decision, so a replica that loses or cannot renew the lease stops evicting
  at least `lease_duration - renew_deadline + leader_margin` seconds before another can take over;
- the HTTP endpoint (`StatusServer`): `/metrics` (private registry), `/healthz`, `/readyz` (a cycle,
  or a standby check, succeeded within three intervals), `/report` (the last report as JSON);
- the actuator's memory across restarts and leader changes (`build_state_store`): unless the run is
  forced dry (`--dry-run`), the ClusterActuator keeps it in the ConfigMap `--state-configmap` of the
  Lease's namespace (or the file `--state-file`), and a leader takes the stored memory at the start of
  each term, so an open circuit stays open;
- policy hot reload (`PolicyWatcher`): the mounted file's content hash is compared every cycle (a
  ConfigMap update is an atomic symlink swap); a valid change is used from that cycle on, a new
  `interval` reschedules the job; an invalid one keeps the running policy, logs every field-level
  problem once and sets `policy_valid 0` / `policy_reload_errors_total`.

Why not `kubernetes.leaderelection`: its state (who leads, since when) is internal, it learns about a
failed renewal only after `renew_deadline` and stamps renewals after the answer instead of before the
request, it can neither be stopped nor release the lease, its Config calls `sys.exit` and forbids
sub-second periods, and its LeaseLock uses the global client configuration.

This is the only module that reads the wall clock (`datetime.now`, once per cycle and for the Lease's
timestamps); durations, readiness and leadership use the monotonic clock. It must not contain
rebalancing logic: strategies, guards, planner and report stay in their modules.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, Literal, Protocol, cast
from urllib.parse import urlsplit

import structlog
import urllib3
from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MAX_INSTANCES,
    JobExecutionEvent,
)
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer.actuator import (
    STATE_CONFIGMAP,
    ClusterActuator,
    ConfigMapStateStore,
    FileStateStore,
    StateStore,
)
from rebalancer.cycle import Sink, assemble_report, evaluate, execute
from rebalancer.errors import InputError, Problems
from rebalancer.evictor import REQUESTER, DryRunEvictor, Evictor, KubeEvictor, read_or_none, release_unread
from rebalancer.kubeapi import load_api_client
from rebalancer.model import CycleReport, Decision, Finding, Outcome, Snapshot
from rebalancer.planner import DisruptionHistory, WorkloadKey, workload_key
from rebalancer.policy import (
    LoadedPolicy,
    NotifyConfig,
    PolicyError,
    PrometheusConfig,
    default_policy,
    format_duration,
    loads_policy,
    parse_duration,
)
from rebalancer.report import to_dict
from rebalancer.sinks.events import KubeEventsSink
from rebalancer.sinks.log import LogSink, configure_logging
from rebalancer.sinks.metrics import DaemonMetrics
from rebalancer.sinks.notify import HttpPoster, Notifier
from rebalancer.sinks.slack import SlackSink
from rebalancer.sinks.webhook import WebhookSink
from rebalancer.sources.kube import KubeSource, KubeSourceError
from rebalancer.sources.prometheus import PrometheusTelemetrySource
from rebalancer.wording import quoted

__all__ = [
    "JOB_ID",
    "Daemon",
    "DaemonError",
    "GatedEvictor",
    "LeaseElector",
    "PolicyWatcher",
    "ReloadResult",
    "SnapshotSource",
    "StatusServer",
    "add_live_once_arguments",
    "add_run_arguments",
    "build_notifiers",
    "build_state_store",
    "kube_snapshot_source",
    "run_command",
    "run_live_once",
    "updated_history",
]

JOB_ID = "rebalancing-cycle"
READY_INTERVALS = 3
DEFAULT_LEASE_NAME = "gpu-rebalancer"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

SnapshotSource = Callable[[datetime, LoadedPolicy], Snapshot]
"""Builds the cycle's Snapshot for `now` under the running policy (live: the cluster + Prometheus)."""

log = structlog.get_logger("rebalancer.daemon")


def utcnow() -> datetime:
    """The wall clock, in UTC: the one place the project reads it (the CLI's live commands use it too)."""
    return datetime.now(UTC)


class DaemonError(Problems):
    """The daemon cannot start or a live cycle cannot run; one line per problem."""


# --------------------------------------------------------------------------- policy hot reload

ReloadStatus = Literal["unchanged", "reloaded", "invalid", "still-invalid", "unreadable"]


@dataclass(frozen=True)
class ReloadResult:
    status: ReloadStatus
    problems: tuple[str, ...] = ()
    previous_interval: int | None = None

    @property
    def interval_changed(self) -> bool:
        return self.previous_interval is not None


class PolicyWatcher:
    """The running policy and the file it came from; `check()` re-reads the file by content hash.

    Raises PolicyError at construction when the file is not a valid policy (the daemon does not start).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        raw = self._read()
        self._loaded = self._parse(raw)
        self._digest = hashlib.sha256(raw).hexdigest()
        self._bad_digest: str | None = None

    @property
    def current(self) -> LoadedPolicy:
        return self._loaded

    @property
    def valid(self) -> bool:
        """False while the file holds a change that failed validation."""
        return self._bad_digest is None

    def _read(self) -> bytes:
        try:
            return self.path.read_bytes()
        except OSError as exc:
            raise PolicyError([f"{self.path}: cannot read policy: {exc.strerror or exc}"]) from None

    def _parse(self, raw: bytes) -> LoadedPolicy:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise PolicyError([f"{self.path}:{line}: not UTF-8 text ({exc.reason})"]) from None
        return loads_policy(text, str(self.path))

    def check(self) -> ReloadResult:
        """Compare the file with the running policy; adopt it when it changed and is valid."""
        try:
            raw = self._read()
        except PolicyError as exc:
            return ReloadResult("unreadable", exc.problems)
        digest = hashlib.sha256(raw).hexdigest()
        if digest == self._digest:
            self._bad_digest = None  # changed back to the running policy
            return ReloadResult("unchanged")
        if digest == self._bad_digest:
            return ReloadResult("still-invalid")
        try:
            loaded = self._parse(raw)
        except PolicyError as exc:
            self._bad_digest = digest
            return ReloadResult("invalid", exc.problems)
        previous = self._loaded.policy.interval
        self._loaded, self._digest, self._bad_digest = loaded, digest, None
        changed = previous if loaded.policy.interval != previous else None
        return ReloadResult("reloaded", previous_interval=changed)


# --------------------------------------------------------------------------- leader election


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Leader election on a coordination.k8s.io/v1 Lease, client-go style, with an honest `holds()`.

    `lease_duration > renew_deadline > retry_period > 0` (seconds, floats allowed; the Lease stores the
    duration rounded up to whole seconds). The background thread tries to acquire or renew every
    `retry_period`; `holds(margin)` is True only while less than `renew_deadline - margin` seconds have
    passed since the last successful acquire / renew request was *sent*.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        name: str = DEFAULT_LEASE_NAME,
        namespace: str = "default",
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utcnow,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError("leader election needs lease_duration > renew_deadline > retry_period > 0")
        self._api = client.CoordinationV1Api(api_client)
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._mono = monotonic
        self._wall = wall
        self._on_change = on_change
        self._timeout = max(0.1, min(renew_deadline / 2, 5.0))
        self._lock = threading.Lock()
        self._renewed_at: float | None = None
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._leading = False
        self._stop = threading.Event()
        self._first_round = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- state

    def holds(self, margin: float = 0.0) -> bool:
        """Leader now, with at least `margin` seconds left before the renew deadline."""
        with self._lock:
            renewed = self._renewed_at
        return renewed is not None and self._mono() - renewed < self.renew_deadline - margin

    def _lose(self) -> None:
        with self._lock:
            self._renewed_at = None

    def _announce(self) -> None:
        leading = self.holds()
        if leading != self._leading:
            self._leading = leading
            if leading:
                log.info("became leader", lease=f"{self.namespace}/{self.name}", identity=self.identity)
            else:
                log.warning("lost leadership", lease=f"{self.namespace}/{self.name}", identity=self.identity)
            if self._on_change is not None:
                self._on_change(leading)

    # ---- one round

    def _get(self) -> dict[str, Any] | None:
        raw = read_or_none(
            lambda: self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self._timeout
            )
        )
        if raw is None:
            return None
        lease = json.loads(raw)
        if not isinstance(lease, dict):
            raise ValueError("the Lease is not a JSON object")
        return lease

    def _spec(self, previous: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        spec = dict(previous)
        holder = spec.get("holderIdentity") or ""
        stamp = _micro_time(now)
        if holder != self.identity:
            spec["acquireTime"] = stamp
            if holder:
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = max(1, math.ceil(self.lease_duration))
        spec["renewTime"] = stamp
        return spec

    def _body(self, spec: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> Any:
        """A Lease as JSON; `meta` (the one read) carries the resourceVersion the write is guarded by."""
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if meta is not None:
            metadata["resourceVersion"] = meta.get("resourceVersion")
            if meta.get("labels"):
                metadata["labels"] = meta["labels"]
            if meta.get("annotations"):
                metadata["annotations"] = meta["annotations"]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def _replace(self, spec: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        response = cast(
            "urllib3.BaseHTTPResponse",
            self._api.replace_namespaced_lease(
                self.name,
                self.namespace,
                self._body(spec, meta),
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
        )
        release_unread(response)

    def try_acquire_or_renew(self) -> bool:
        """One election round; True when this replica holds the lease afterwards."""
        sent = self._mono()
        try:
            lease = self._get()
            if lease is None:
                spec = {**self._spec({}, self._wall()), "leaseTransitions": 0}
                created = cast(
                    "urllib3.BaseHTTPResponse",
                    self._api.create_namespaced_lease(
                        self.namespace,
                        self._body(spec),
                        _preload_content=False,
                        _request_timeout=self._timeout,
                    ),
                )
                release_unread(created)
            else:
                spec = lease.get("spec") or {}
                holder = spec.get("holderIdentity") or ""
                meta = lease.get("metadata") or {}
                record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
                if record != self._observed:
                    self._observed, self._observed_at = record, self._mono()
                if holder and holder != self.identity:
                    self._lose()
                    duration = max(self.lease_duration, float(spec.get("leaseDurationSeconds") or 0))
                    if self._observed_at + duration > self._mono():
                        return False
                self._replace(self._spec(spec, self._wall()), meta)
        except ApiException as exc:
            if exc.status == 409:  # someone else wrote the Lease first: theirs now
                self._lose()
            log.debug("lease round failed", status=exc.status, reason=exc.reason)
            return False
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            log.debug("lease round failed", error=f"{type(exc).__name__}: {exc}")
            return False
        with self._lock:
            self._renewed_at = sent
        return True

    def release(self) -> bool:
        """Give the lease up (empty holder) so a standby takes over at once; True when it was ours."""
        was_leader = self.holds()
        self._lose()
        if not was_leader:
            return False
        try:
            lease = self._get()
            spec = dict((lease or {}).get("spec") or {})
            if lease is None or spec.get("holderIdentity") != self.identity:
                return False
            spec.update(holderIdentity=None, leaseDurationSeconds=1, renewTime=_micro_time(self._wall()))
            self._replace(spec, lease.get("metadata") or {})
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            log.warning("could not release the lease", error=f"{type(exc).__name__}: {exc}")
            return False
        log.info("released the lease", lease=f"{self.namespace}/{self.name}")
        return True

    # ---- lifecycle

    def start(self) -> LeaseElector:
        self._thread = threading.Thread(target=self._run, name="lease-elector", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception as exc:  # keep electing whatever one round did
                log.error("lease round crashed", error=f"{type(exc).__name__}: {exc}")
            self._first_round.set()
            self._announce()
            # Followers poll with jitter (as client-go does) so standbys do not move in lockstep.
            delay = self.retry_period if self.holds() else self.retry_period * random.uniform(1.0, 1.2)
            self._stop.wait(delay)

    def wait_first_round(self, timeout: float) -> bool:
        """Wait until the first election round is done (so a start-up cycle knows who leads)."""
        return self._first_round.wait(timeout)

    def stop(self, *, release: bool = True) -> None:
        """Stop electing; `release=False` leaves the lease to expire (as a crashed process would)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._timeout * 2 + self.retry_period)
        if release:
            self.release()
        else:
            self._lose()
        self._announce()


# --------------------------------------------------------------------------- stop flag for evictions


class GatedEvictor:
    """Hands whole decisions to `inner` while `gate()` says nothing; after its first objection, none.

    `gate` returns why evictions must stop (shutdown, leadership) or None. It is checked only between
    decisions: a gang or a node drain already handed over always completes. Decisions after the stop
    get `error` outcomes saying they were not attempted, so the report tells exactly what happened.
    """

    def __init__(self, inner: Evictor, gate: Callable[[], str | None]) -> None:
        self._inner = inner
        self._gate = gate
        self.mode = inner.mode
        self.stopped: str | None = None

    def evict(self, decision: Decision) -> tuple[Outcome, ...]:
        if self.stopped is None:
            self.stopped = self._gate()
            if self.stopped is not None:
                log.warning("evictions stopped for this cycle", reason=self.stopped)
        if self.stopped is not None:
            detail = f"not attempted: {self.stopped}"
            return tuple(Outcome(p.namespace, p.name, "error", detail) for p in decision.proposal.pods)
        return self._inner.evict(decision)


# --------------------------------------------------------------------------- cooldown memory


def updated_history(
    history: DisruptionHistory,
    snapshot: Snapshot,
    report: CycleReport,
    *,
    keep: timedelta,
    keep_disruptions: timedelta = timedelta(0),
) -> DisruptionHistory:
    """History plus this live cycle's evicted workloads and freed nodes: last disruptions older than
    `keep` (the cooldown) and disruption times older than `keep_disruptions` (the budget's window) go."""
    now = snapshot.now
    nodes = {n: t for n, t in history.nodes.items() if now - t < keep}
    workloads = {k: t for k, t in history.workloads.items() if now - t < keep}
    evicted: set[WorkloadKey] = set()
    if report.mode == "live":
        for row in report.decisions:
            if row.outcome == "evicted":
                pod = snapshot.pods_by_key.get((row.namespace, row.pod))
                key = workload_key(pod) if pod is not None else None
                if key is not None:
                    workloads[key] = now
                    evicted.add(key)
        for node in report.freed_nodes:
            nodes[node] = now
    disruptions: dict[WorkloadKey, tuple[datetime, ...]] = {}
    for key in set(history.disruptions) | evicted:
        times = tuple(t for t in history.disruptions.get(key, ()) if now - t < keep_disruptions)
        times += (now,) if key in evicted else ()
        if times and keep_disruptions > timedelta(0):
            disruptions[key] = times
    return DisruptionHistory(nodes=nodes, workloads=workloads, disruptions=disruptions)


# --------------------------------------------------------------------------- notifiers


def build_notifiers(
    notify: NotifyConfig,
    *,
    on_result: Callable[[str, str], None] | None = None,
    environ: Mapping[str, str] | None = None,
    poster_factory: Callable[[], HttpPoster] = HttpPoster,
    clock: Callable[[], float] = time.monotonic,
) -> list[Notifier]:
    """One Notifier (worker thread, bounded queue) per configured Slack / webhook sink."""
    notifiers: list[Notifier] = []
    for index, slack in enumerate(notify.slack):
        sink = SlackSink(slack, name=f"slack[{index}]", poster=poster_factory(), environ=environ)
        notifiers.append(Notifier(sink, clock=clock, on_result=on_result))
    for index, hook in enumerate(notify.webhooks):
        webhook = WebhookSink(hook, name=f"webhook[{index}]", poster=poster_factory(), environ=environ)
        if not webhook.signed:
            log.warning("webhook has no signing secret: deliveries are unsigned", sink=webhook.name)
        notifiers.append(Notifier(webhook, clock=clock, on_result=on_result))
    return notifiers


NotifierFactory = Callable[[NotifyConfig, Callable[[str, str], None]], Sequence[Notifier]]


class EndCycle(Protocol):
    """Called after a live cycle's last decision; `completed` is False when the cycle failed half-way."""

    def __call__(self, *, completed: bool = True) -> None: ...


def _default_notifiers(notify: NotifyConfig, on_result: Callable[[str, str], None]) -> Sequence[Notifier]:
    return build_notifiers(notify, on_result=on_result)


# --------------------------------------------------------------------------- the daemon


class Daemon:
    """The loop around cycles. `run_cycle()` runs one now; `start()` schedules them; `shutdown()` stops.

    `dry_run` None follows the running policy's `dry_run`; `live_evictor` is used for live cycles (a
    live cycle without one fails), with `begin_live_cycle(snapshot, cycle_id)` called before its first
    decision, `end_live_cycle(completed=...)` after its last and `live_findings()` added to its report
    (a ClusterActuator's hooks). `on_policy_change(old, new)` is told about every reload.
    With an `elector`, only the replica that holds the lease runs cycles, and decisions stop as soon
    as it no longer holds it with `leader_margin` seconds to spare.
    """

    def __init__(
        self,
        policy: PolicyWatcher | LoadedPolicy,
        source: SnapshotSource,
        *,
        live_evictor: Evictor | None = None,
        begin_live_cycle: Callable[[Snapshot, str], None] | None = None,
        end_live_cycle: EndCycle | None = None,
        live_findings: Callable[[], Sequence[Finding]] | None = None,
        on_policy_change: Callable[[LoadedPolicy, LoadedPolicy], None] | None = None,
        dry_run: bool | None = None,
        elector: LeaseElector | None = None,
        leader_margin: float = 2.0,
        metrics: DaemonMetrics | None = None,
        notifiers: NotifierFactory = _default_notifiers,
        extra_sinks: Sequence[Sink] = (),
        clock: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        jitter: float | None = None,
    ) -> None:
        self._watcher = policy if isinstance(policy, PolicyWatcher) else None
        self._loaded = policy.current if isinstance(policy, PolicyWatcher) else policy
        self._source = source
        self._live_evictor = live_evictor
        self._begin_live = begin_live_cycle
        self._end_live = end_live_cycle
        self._live_findings = live_findings
        self._on_policy_change = on_policy_change
        self._dry_run = dry_run
        self._elector = elector
        self._margin = leader_margin
        self.metrics = metrics if metrics is not None else DaemonMetrics()
        self._notifier_factory = notifiers
        self._extra_sinks = tuple(extra_sinks)
        self._clock = clock
        self._mono = monotonic
        self._jitter = jitter
        self._log_sink = LogSink()
        self._notifiers: Sequence[Notifier] = notifiers(self._loaded.policy.notify, self.metrics.notification)
        self._history = DisruptionHistory()
        self._last_report: CycleReport | None = None
        self._last_ok: float | None = None
        self._standby = False
        self._cycle_lock = threading.Lock()
        self._stopping = threading.Event()
        self._scheduler: BackgroundScheduler | None = None
        # Ticks by result (success, error, standby, skipped), for tests and logs.
        self.counts: Counter[str] = Counter()
        # Scheduler jobs that have returned: until then apscheduler counts the job as running and
        # skips a tick that comes due (max_instances=1).
        self.jobs_finished = 0
        self.metrics.leader.set(0 if elector is not None else 1)

    # ---- state

    @property
    def policy(self) -> LoadedPolicy:
        return self._loaded

    @property
    def last_report(self) -> CycleReport | None:
        return self._last_report

    @property
    def stopping(self) -> threading.Event:
        return self._stopping

    @property
    def scheduler(self) -> BackgroundScheduler | None:
        return self._scheduler

    def dry_run(self) -> bool:
        return self._dry_run if self._dry_run is not None else self._loaded.policy.dry_run

    def readiness(self) -> tuple[bool, str]:
        """Ready when a cycle (or, on a standby, a leadership check) succeeded within three intervals."""
        if self._stopping.is_set():
            return False, "shutting down"
        if self._last_ok is None:
            return False, "no cycle has completed yet"
        limit = READY_INTERVALS * self._loaded.policy.interval
        age = self._mono() - self._last_ok
        if age > limit:
            return False, f"last successful cycle {age:.0f}s ago (more than {READY_INTERVALS} intervals)"
        return True, "standby: another replica holds the lease" if self._standby else "ok"

    # ---- one cycle

    def run_cycle(self, *, raise_errors: bool = False) -> CycleReport | None:
        """Run one cycle now (unless one is running or the daemon is stopping); its report, if any.

        A failed cycle is logged and counted; with `raise_errors` its exception is raised afterwards.
        """
        if self._stopping.is_set():
            return None
        if not self._cycle_lock.acquire(blocking=False):
            self._not_run("skipped")
            return None
        try:
            return self._cycle(raise_errors)
        finally:
            self._cycle_lock.release()

    def _not_run(self, result: str) -> None:
        self.counts[result] += 1
        self.metrics.cycle_not_run(result)

    def _reload(self) -> None:
        if self._watcher is None:
            return
        result = self._watcher.check()
        if result.status == "unreadable":
            log.warning("policy file unreadable: keeping the running policy", problems=list(result.problems))
            return
        if result.status == "invalid":
            log.error(
                "policy change rejected: keeping the running policy",
                source=str(self._watcher.path),
                problems=list(result.problems),
            )
            self.metrics.policy_reload_errors.inc()
        self.metrics.policy_valid.set(1 if self._watcher.valid else 0)
        if result.status != "reloaded":
            return
        old_loaded = self._loaded
        old_notify = old_loaded.policy.notify
        self._loaded = self._watcher.current
        policy = self._loaded.policy
        log.info(
            "policy reloaded",
            source=str(self._watcher.path),
            interval=format_duration(policy.interval),
            dry_run=policy.dry_run,
            strategies=[s.name for s in self._loaded.strategies],
        )
        if policy.notify != old_notify:
            for notifier in self._notifiers:
                notifier.close()
            self._notifiers = self._notifier_factory(policy.notify, self.metrics.notification)
        if self._on_policy_change is not None:
            self._on_policy_change(old_loaded, self._loaded)
        if result.interval_changed and self._scheduler is not None:
            self._scheduler.reschedule_job(JOB_ID, trigger=self._trigger(policy.interval))
            log.info("cycle rescheduled", interval=format_duration(policy.interval))

    def _gate(self) -> str | None:
        if self._stopping.is_set():
            return "shutting down"
        if self._elector is not None and not self._elector.holds(self._margin):
            return "this replica no longer holds the leader lease with time to spare"
        return None

    def _cycle(self, raise_errors: bool) -> CycleReport | None:
        try:
            self._reload()
        except Exception:  # a reload problem must not stop the loop: the running policy stays
            log.exception("policy reload failed: keeping the running policy")
        loaded = self._loaded
        if self._elector is not None:
            leading = self._elector.holds(self._margin)
            self.metrics.leader.set(1 if leading else 0)
            if not leading:
                self._standby = True
                self._last_ok = self._mono()
                self._not_run("standby")
                log.info("standby: another replica holds the lease", identity=self._elector.identity)
                return None
        self._standby = False
        now = self._clock()
        cycle_id = f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
        with structlog.contextvars.bound_contextvars(cycle_id=cycle_id):
            started = self._mono()
            log.info("cycle started", now=now.isoformat(), dry_run=self.dry_run(), policy=loaded.source)
            try:
                snapshot = self._source(now, loaded)
                live = not self.dry_run()
                inner = self._live_evictor if live else DryRunEvictor()
                if inner is None:
                    raise DaemonError(["live cycle without a cluster evictor (run with --dry-run)"])
                if live and self._begin_live is not None:
                    self._begin_live(snapshot, cycle_id)
                evictor = GatedEvictor(inner, self._gate)
                completed = False
                try:
                    evaluation = evaluate(snapshot, loaded, history=self._history)
                    outcomes = execute(evaluation, evictor)
                    completed = True
                finally:
                    if live and self._end_live is not None:
                        self._end_live(completed=completed)
                report = assemble_report(evictor.mode, evaluation, outcomes, loaded)
                if live and self._live_findings is not None:
                    extra = tuple(self._live_findings())
                    report = dataclasses.replace(report, findings=report.findings + extra)
            except Exception as exc:
                duration = self._mono() - started
                self.metrics.cycle_failed(duration)
                self.counts["error"] += 1
                if isinstance(exc, KubeSourceError | DaemonError):
                    log.error(
                        "cycle failed", problems=list(exc.problems), duration_seconds=round(duration, 3)
                    )
                else:
                    log.exception("cycle failed", duration_seconds=round(duration, 3))
                if raise_errors:
                    raise
                return None
            duration = self._mono() - started
            proposals = Counter(d.proposal.strategy for d in evaluation.decisions)
            guarded = loaded.policy.guards
            self._history = updated_history(
                self._history,
                snapshot,
                report,
                keep=timedelta(seconds=max(guarded.cooldown, 0)),
                keep_disruptions=timedelta(
                    seconds=guarded.disruption_window if guarded.max_disruptions_per_workload else 0
                ),
            )
            self.metrics.observe_cycle(report, snapshot, proposals=proposals, duration=duration)
            self._last_report = report
            self._last_ok = self._mono()
            self.counts["success"] += 1
            self._publish(report)
            log.info("cycle finished", duration_seconds=round(duration, 3), stopped=evictor.stopped)
            return report

    def _publish(self, report: CycleReport) -> None:
        for sink in (self._log_sink, *self._extra_sinks, *self._notifiers):
            try:
                sink.publish(report)
            except Exception as exc:  # a sink is an edge: it never fails the cycle
                name = getattr(sink, "name", type(sink).__name__)
                log.error("sink failed", sink=name, error=f"{type(exc).__name__}: {exc}")

    # ---- the loop

    def _trigger(self, interval: int) -> IntervalTrigger:
        jitter = self._jitter if self._jitter is not None else min(interval * 0.1, 30.0)
        start = self._clock() + timedelta(seconds=interval)
        return IntervalTrigger(seconds=interval, start_date=start, timezone=UTC, jitter=jitter or None)

    def _on_max_instances(self, event: JobExecutionEvent) -> None:
        if event.job_id == JOB_ID:
            self._not_run("skipped")
            log.warning("cycle skipped: the previous one is still running")

    def _on_job_finished(self, event: JobExecutionEvent) -> None:
        if event.job_id == JOB_ID:
            self.jobs_finished += 1

    def start(self) -> Daemon:
        """Schedule cycles every policy interval, the first one now."""
        scheduler = BackgroundScheduler(
            timezone=UTC,
            executors={"default": ThreadPoolExecutor(max_workers=1)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        scheduler.add_listener(self._on_max_instances, EVENT_JOB_MAX_INSTANCES)
        scheduler.add_listener(self._on_job_finished, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
        scheduler.add_job(
            self.run_cycle,
            trigger=self._trigger(self._loaded.policy.interval),
            id=JOB_ID,
            name="rebalancing cycle",
            next_run_time=self._clock(),
        )
        scheduler.start()
        self._scheduler = scheduler
        return self

    def wakeup(self) -> None:
        """Make the scheduler look at the clock again (tests move a frozen clock)."""
        if self._scheduler is not None:
            self._scheduler.wakeup()

    def request_stop(self) -> None:
        """Stop after the decision in flight (safe from a signal handler)."""
        self._stopping.set()

    def shutdown(self, *, notify_timeout: float = 5.0, release_lease: bool = True) -> None:
        """Stop: no new decision, wait for the running cycle, release the lease, flush notifications."""
        self._stopping.set()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        if self._elector is not None:
            self._elector.stop(release=release_lease)
            self.metrics.leader.set(0)
        deadline = time.monotonic() + notify_timeout
        for notifier in self._notifiers:
            notifier.close(max(0.0, deadline - time.monotonic()))


# --------------------------------------------------------------------------- HTTP


class _Handler(BaseHTTPRequestHandler):
    daemon_ref: Daemon
    server_version = "gpu-rebalancer"

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        daemon = self.daemon_ref
        if path == "/metrics":
            body, content_type = daemon.metrics.exposition(self.headers.get("Accept"))
            self._send(200, body, content_type)
        elif path == "/healthz":
            self._send(200, b"ok\n")
        elif path == "/readyz":
            ready, why = daemon.readiness()
            self._send(200 if ready else 503, f"{why}\n".encode())
        elif path == "/report":
            report = daemon.last_report
            if report is None:
                self._send(404, b'{"error": "no cycle has completed yet"}\n', "application/json")
            else:
                self._send(200, json.dumps(to_dict(report), indent=2).encode() + b"\n", "application/json")
        else:
            self._send(404, b"not found: try /metrics, /healthz, /readyz or /report\n")

    def _send(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client went away

    def log_message(self, format: str, *args: Any) -> None:
        return


class StatusServer:
    """`/metrics`, `/healthz`, `/readyz`, `/report` of one daemon, on one port (0: any free one)."""

    def __init__(self, daemon: Daemon, host: str = "0.0.0.0", port: int = 8080) -> None:
        handler = type("_DaemonHandler", (_Handler,), {"daemon_ref": daemon})
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> StatusServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="http", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


# --------------------------------------------------------------------------- live wiring


def _prometheus(loaded: LoadedPolicy, url: str | None) -> PrometheusConfig | None:
    """The policy's Prometheus connection, with its URL replaced by `url` when given."""
    cfg = loaded.policy.telemetry
    conn = cfg.prometheus if cfg is not None else None
    if url is None:
        return conn
    base = conn.model_dump() if conn is not None else {}
    return PrometheusConfig.model_validate({**base, "url": url})


def kube_snapshot_source(
    api_client: client.ApiClient,
    *,
    prometheus_url: str | None = None,
    namespaces: Sequence[str] | None = None,
) -> SnapshotSource:
    """Snapshots of the live cluster, with Prometheus telemetry when the running policy asks for it.

    `prometheus_url` (the CLI's --prometheus-url) replaces `telemetry.prometheus.url`, keeping the rest
    of the policy's connection settings. Telemetry needs `telemetry` in the policy and a strategy with a
    telemetry window.
    """

    def source(now: datetime, loaded: LoadedPolicy) -> Snapshot:
        telemetry = None
        cfg = loaded.policy.telemetry
        windows = loaded.telemetry_windows()
        conn = _prometheus(loaded, prometheus_url)
        if cfg is not None and windows and conn is not None:
            telemetry = PrometheusTelemetrySource(cfg, windows, prometheus=conn)
        kube = KubeSource(api_client, loaded, namespaces=namespaces, telemetry=telemetry)
        return kube.snapshot(now)

    return source


def _default_namespace() -> str:
    env = os.environ.get("POD_NAMESPACE")
    if env:
        return env
    with contextlib.suppress(OSError):
        text = SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip()
        if text:
            return text
    return "default"


def _default_identity() -> str:
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


def _seconds(text: str) -> float:
    try:
        return float(parse_duration(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT or :PORT, got {text!r}")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def _add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="report only (--dry-run) or evict (--no-dry-run); default: the policy's dry_run",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster, then ~/.kube)")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")
    parser.add_argument(
        "--prometheus-url", metavar="URL", help="Prometheus for GPU telemetry (overrides the policy's)"
    )
    parser.add_argument(
        "--namespace",
        dest="namespaces",
        action="append",
        metavar="NS",
        help="only list pods of this namespace (repeatable; free capacity may then be overstated)",
    )
    parser.add_argument("--log-format", choices=("auto", "json", "console"), default="auto")


def add_live_once_arguments(parser: argparse.ArgumentParser) -> None:
    """The options `rebalancer once` needs without --snapshot (one live cycle, e.g. as a CronJob)."""
    _add_cluster_arguments(parser)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `rebalancer run`."""
    parser.add_argument(
        "--policy", metavar="FILE", help="policy file, re-read every cycle (default: built-in)"
    )
    _add_cluster_arguments(parser)
    parser.add_argument(
        "--listen", type=_listen, default=("0.0.0.0", 8080), metavar="HOST:PORT", help="HTTP (default :8080)"
    )
    parser.add_argument("--jitter", type=_seconds, default=None, help="random delay per cycle (default 10%%)")
    election = parser.add_argument_group("leader election (coordination.k8s.io/v1 Lease)")
    election.add_argument("--no-leader-election", dest="leader_election", action="store_false")
    election.add_argument("--lease-name", default=DEFAULT_LEASE_NAME)
    election.add_argument("--lease-namespace", default=None, help="default: the pod's namespace")
    election.add_argument(
        "--identity", default=None, help="default: $POD_NAME or the hostname, plus a suffix"
    )
    election.add_argument("--lease-duration", type=_seconds, default=15.0, metavar="DURATION")
    election.add_argument("--renew-deadline", type=_seconds, default=10.0, metavar="DURATION")
    election.add_argument("--retry-period", type=_seconds, default=2.0, metavar="DURATION")
    election.add_argument(
        "--leader-margin",
        type=_seconds,
        default=2.0,
        metavar="DURATION",
        help="time left before the renew deadline that a decision needs to start (default 2s)",
    )
    memory = parser.add_argument_group(
        "actuator memory (circuit breaker, owned drains), kept across restarts and leader changes"
    )
    where = memory.add_mutually_exclusive_group()
    where.add_argument(
        "--state-configmap",
        default=STATE_CONFIGMAP,
        metavar="NAME",
        help=f"a ConfigMap in the Lease's namespace (default {STATE_CONFIGMAP}; unused with --dry-run)",
    )
    where.add_argument(
        "--state-file", metavar="PATH", default=None, help="a JSON file instead (e.g. on a persistent volume)"
    )


def _prometheus_url(args: argparse.Namespace) -> str | None:
    url: str | None = args.prometheus_url
    if url is not None and not url.startswith(("http://", "https://")):
        raise InputError([f"--prometheus-url: expected an http(s):// URL, got {quoted(url)}"])
    return url


def _api_client(args: argparse.Namespace) -> client.ApiClient:
    """The cluster's client; a kubeconfig to fix raises kubeapi.KubeConfigError (bad input)."""
    return load_api_client(args.kubeconfig, args.context)


def build_state_store(args: argparse.Namespace, api_client: client.ApiClient) -> StateStore | None:
    """Where `rebalancer run` keeps the actuator's memory: None when the run is forced dry (`--dry-run`
    writes nothing), else the file `--state-file` or the ConfigMap `--state-configmap` in the Lease's
    namespace (`--lease-namespace`, default the pod's). Builds the store only: no request is made."""
    if args.dry_run is True:
        return None
    if args.state_file is not None:
        return FileStateStore(args.state_file)
    namespace = args.lease_namespace or _default_namespace()
    return ConfigMapStateStore(api_client, namespace=namespace, name=args.state_configmap)


def run_live_once(args: argparse.Namespace, loaded: LoadedPolicy) -> CycleReport:
    """One live cycle (snapshot of the cluster, evictions unless dry-run), notifications flushed.

    Raises DaemonError when the cluster cannot be read.
    """
    # The report goes to stdout; stderr gets only warnings and errors (no decision lines twice).
    configure_logging(args.log_format, level=logging.WARNING)
    api_client = _api_client(args)
    source = kube_snapshot_source(
        api_client, prometheus_url=_prometheus_url(args), namespaces=args.namespaces
    )
    evictor = KubeEvictor(api_client)
    daemon = Daemon(
        loaded,
        source,
        live_evictor=evictor,
        begin_live_cycle=lambda snapshot, _cycle_id: evictor.begin_cycle(snapshot.pdbs),
        dry_run=args.dry_run,
    )
    try:
        report = daemon.run_cycle(raise_errors=True)
    except (KubeSourceError, DaemonError) as exc:
        raise DaemonError(exc.problems) from None
    finally:
        daemon.shutdown(notify_timeout=30.0)
    if report is None:  # pragma: no cover - a fresh daemon neither overlaps nor stops
        raise DaemonError(["the cycle did not run"])
    return report


class _LiveEdge:
    """What `rebalancer run` puts around live evictions: the ClusterActuator and the Events sink.

    The actuator (drain marks, checkpoint-before-evict, circuit breaker) is built once from the policy's
    `eviction:` section (a change there needs a restart: the actuator's memory must not be lost), with
    `state_store` keeping that memory across restarts. Before the first live cycle of every leadership
    term, by the leader only, the actuator takes the stored memory (another replica may have led since)
    and then cleans orphan drain marks.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        loaded: LoadedPolicy,
        identity: str,
        *,
        state_store: StateStore | None = None,
    ) -> None:
        self.actuator = ClusterActuator.from_config(
            api_client,
            loaded.policy.eviction,
            state_store=state_store,
            requested_by=f"{REQUESTER}/{identity}",
        )
        self.events = KubeEventsSink(api_client)
        self._cleaned = False

    def lost_leadership(self) -> None:
        self._cleaned = False

    def begin_cycle(self, snapshot: Snapshot, cycle_id: str) -> None:
        if not self._cleaned:
            self.actuator.load_state()
            for change in self.actuator.cleanup_orphans():
                log.info("orphan drain mark removed", node=change.node, ok=change.ok, detail=change.detail)
            self._cleaned = True
        self.actuator.begin_cycle(snapshot, cycle_id)
        self.events.begin_cycle(snapshot)

    def policy_changed(self, old: LoadedPolicy, new: LoadedPolicy) -> None:
        if old.policy.eviction != new.policy.eviction:
            log.warning("policy `eviction:` changed: restart the daemon to apply it (kept the running one)")


def run_command(args: argparse.Namespace) -> int:
    """`rebalancer run`: serve until SIGTERM / SIGINT, then exit 0 after the decision in flight."""
    policy: PolicyWatcher | LoadedPolicy = PolicyWatcher(args.policy) if args.policy else default_policy()
    configure_logging(args.log_format)
    api_client = _api_client(args)
    identity = args.identity or _default_identity()
    metrics = DaemonMetrics()
    live = _LiveEdge(
        api_client,
        policy.current if isinstance(policy, PolicyWatcher) else policy,
        identity,
        state_store=build_state_store(args, api_client),
    )

    def on_leadership(leading: bool) -> None:
        metrics.leader.set(1 if leading else 0)
        if not leading:
            live.lost_leadership()

    elector: LeaseElector | None = None
    if args.leader_election:
        try:
            elector = LeaseElector(
                api_client,
                name=args.lease_name,
                namespace=args.lease_namespace or _default_namespace(),
                identity=identity,
                lease_duration=args.lease_duration,
                renew_deadline=args.renew_deadline,
                retry_period=args.retry_period,
                on_change=on_leadership,
            )
        except ValueError as exc:
            raise InputError([str(exc)]) from None
        if args.leader_margin >= args.renew_deadline:
            raise InputError(["--leader-margin must be shorter than --renew-deadline"])
    daemon = Daemon(
        policy,
        kube_snapshot_source(api_client, prometheus_url=_prometheus_url(args), namespaces=args.namespaces),
        live_evictor=live.actuator,
        begin_live_cycle=live.begin_cycle,
        end_live_cycle=live.actuator.end_cycle,
        live_findings=live.actuator.findings,
        on_policy_change=live.policy_changed,
        extra_sinks=(live.events,),
        dry_run=args.dry_run,
        elector=elector,
        leader_margin=args.leader_margin,
        metrics=metrics,
        jitter=args.jitter,
    )
    host, port = args.listen
    try:
        server = StatusServer(daemon, host, port).start()
    except OSError as exc:
        raise DaemonError([f"cannot listen on {host}:{port}: {exc.strerror or exc}"]) from None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stop requested", signal=signal.Signals(signum).name)
        daemon.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    loaded = daemon.policy
    log.info(
        "daemon started",
        listen=f"{host}:{server.port}",
        policy=loaded.source,
        interval=format_duration(loaded.policy.interval),
        dry_run=daemon.dry_run(),
        leader_election=elector is not None,
        identity=identity,
    )
    if elector is not None:
        elector.start().wait_first_round(args.renew_deadline)
    daemon.start()
    while not daemon.stopping.wait(0.5):
        pass
    daemon.shutdown()
    server.stop()
    log.info("daemon stopped")
    return 0
