"""The daemon's loop: a cycle every `interval`, each one `cycle.run_cycle`, stopping cleanly.

Owns running over time:

- the schedule: an apscheduler 3.x interval job (`interval` from the policy, first cycle at start,
  `max_instances=1`, `coalesce=True`, jitter); a tick that finds the previous cycle still running is
  skipped and counted;
- one cycle (`Daemon.run_cycle`): re-check the policy file, check leadership (a standby only counts the
  tick and clears its last cycle's per-cycle gauges: the leader's describe the cluster), read the wall
  clock once (`now`), build the Snapshot (the injected `SnapshotSource`), then `run_cycle` with the dry-run
  evictor or the live one (behind a `GatedEvictor`) and the memory of earlier cycles, and publish the
  report to the log sink, the extra sinks (Events) and the notifiers; count it in the metrics and keep
  it for `/report`. The cyclic garbage collector is paused for the whole cycle (`rebalancer.gcpause`),
  as the one-shot commands run without it: a cycle at 5,000 nodes allocates millions of objects that
  are not garbage before it ends, and each full collection walks them and the watch cache's objects
  (seconds of CPU a cycle, bench/README.md); what a cycle leaves behind is collected between cycles;
- stopping writes: the GatedEvictor checks *between* decisions the stop flag (SIGTERM / SIGINT),
  leadership (`holds(leader_margin)`) and the live edge's write fence; the fence (rebalancer.fence) is
  also asked by the evictor before *every* write, so a replica that cannot renew stops writing, even
  mid-drain, before another can lead. The loop gives the fence the cycle's deadline (`Deadlines`: a
  share of the interval) and, once a stop is requested, the shutdown's (a decision in flight gets that
  long to finish). A cycle cut short says so: a `cycle-cut-short` finding with the reason and the
  number of approved plans not attempted.

Its collaborators are composed by `daemon.wiring`: the policy (a `PolicyWatcher` or a fixed one), the
snapshot source, the `LiveEdge` (live evictor, memory, hooks), the `Leadership`, the `DaemonSinks` and
the `Clock`. It must not contain rebalancing logic, nor build clients: it only runs what it is given.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

import structlog
from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MAX_INSTANCES,
    JobExecutionEvent,
)
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from rebalancer.cycle import CycleMemory, Sink, run_cycle
from rebalancer.cycle_report import CycleReport
from rebalancer.daemon.clock import utcnow
from rebalancer.daemon.lease import LeaseElector
from rebalancer.daemon.reload import PolicyWatcher, ReloadResult
from rebalancer.errors import Problems
from rebalancer.evictor import DryRunEvictor, Evictor
from rebalancer.fence import FenceLost, WriteFence
from rebalancer.gcpause import collector_paused
from rebalancer.history import Memory
from rebalancer.model import NOT_ATTEMPTED, Decision, Finding, Mode, Outcome, Snapshot
from rebalancer.policy import LoadedPolicy, NotifyConfig, SinkFilters, format_duration
from rebalancer.sinks.log import LogSink
from rebalancer.sinks.metrics import DaemonMetrics
from rebalancer.sinks.notify import Notifier, configured_sinks
from rebalancer.wording import plural

__all__ = [
    "CUT_SHORT",
    "JOB_ID",
    "Clock",
    "Daemon",
    "DaemonError",
    "DaemonSinks",
    "Deadlines",
    "GatedEvictor",
    "Leadership",
    "LiveEdge",
    "NotifierFactory",
    "SnapshotSource",
]

JOB_ID = "rebalancing-cycle"
# Finding kind: a cycle whose evictions stopped before every approved plan was attempted.
CUT_SHORT: Final = "cycle-cut-short"
READY_INTERVALS = 3

SnapshotSource = Callable[[datetime, LoadedPolicy], Snapshot]
"""Builds the cycle's Snapshot for `now` under the running policy (live: the cluster + Prometheus)."""

NotifierFactory = Callable[[NotifyConfig, Callable[[str, str], None]], Sequence[Notifier]]

log = structlog.get_logger("rebalancer.daemon")


class DaemonError(Problems):
    """The daemon cannot start or a live cycle cannot run; one line per problem."""


# --------------------------------------------------------------------------- collaborators


@dataclass
class LiveEdge:
    """What a live cycle uses: the evictor, the memory it plans with, and what to tell about changes.

    `memory` None keeps the history in process. `on_policy_change(old, new)` hears of every reload and
    says which policy runs: `new`, or `new` with what the edge cannot change while it runs kept from
    `old` (a reload error). `on_lost_leadership()` hears of every term's end.
    """

    evictor: Evictor
    memory: CycleMemory | None = None
    on_policy_change: Callable[[LoadedPolicy, LoadedPolicy], LoadedPolicy] | None = None
    on_lost_leadership: Callable[[], None] | None = None
    # What a dry-run cycle evicts with (None: `DryRunEvictor`, which makes no request at all).
    dry_run_evictor: Evictor | None = None
    # The fence the evictor's writes ask (rebalancer.fence): the loop gives it the cycle's deadline and,
    # once a stop is requested, the shutdown's.
    fence: WriteFence | None = None


@dataclass
class Leadership:
    """Only the replica holding `elector`'s lease runs cycles; decisions stop when it no longer holds it
    with `margin` seconds to spare."""

    elector: LeaseElector
    margin: float = 2.0


def _no_notifiers(_notify: NotifyConfig, _on_result: Callable[[str, str], None]) -> Sequence[Notifier]:
    return ()


@dataclass
class DaemonSinks:
    """Where reports go: the metrics, the notifiers and extra sinks.

    `notifiers` builds one Notifier per sink of the `notify:` it is given (`build_notifiers`); a reload
    that changes `notify:` asks it only for the new or changed sinks."""

    metrics: DaemonMetrics = field(default_factory=DaemonMetrics)
    notifiers: NotifierFactory = _no_notifiers
    extra: Sequence[Sink] = ()


@dataclass
class Clock:
    """The wall clock (read once per cycle), the monotonic clock and the loop's jitter (None: 10 %)."""

    wall: Callable[[], datetime] = utcnow
    monotonic: Callable[[], float] = time.monotonic
    jitter: float | None = None


@dataclass(frozen=True)
class Deadlines:
    """How long writes may go on: a cycle's within `cycle_share` of the interval (a cycle never runs
    into the next one), and after a stop is requested `shutdown` seconds (so the decision in flight,
    the state save and the lease release fit in the pod's termination grace period)."""

    cycle_share: float = 0.8
    shutdown: float = 30.0

    def cycle(self, interval: int) -> float:
        return max(1.0, interval * self.cycle_share)


# --------------------------------------------------------------------------- stop flag for evictions


class GatedEvictor:
    """Hands whole decisions to `inner` while `gate()` says nothing; after its first objection, none.

    `gate` returns why evictions must stop (shutdown, leadership, a closed write fence) or None. It is
    checked between decisions; within one, the inner evictor's own fence stops a gang or node drain
    part-way (a shutdown lets the decision in flight go on until the shutdown deadline). Decisions after
    the stop get `error` outcomes saying they were not attempted, so the report tells exactly what
    happened, and `end_cycle` adds a `cycle-cut-short` finding counting them. The cycle frame is the
    inner evictor's.
    """

    def __init__(self, inner: Evictor, gate: Callable[[], str | None]) -> None:
        self._inner = inner
        self._gate = gate
        self.mode: Mode = inner.mode
        self.stopped: str | None = None
        self.not_attempted = 0

    def begin_cycle(self, snapshot: Snapshot, cycle_id: str) -> None:
        self._inner.begin_cycle(snapshot, cycle_id)

    def evict(self, decision: Decision) -> tuple[Outcome, ...]:
        if self.stopped is None:
            self.stopped = self._gate()
            if self.stopped is not None:
                log.warning("evictions stopped for this cycle", reason=self.stopped)
        if self.stopped is not None:
            self.not_attempted += len(decision.proposal.pods)
            detail = f"{NOT_ATTEMPTED}{self.stopped}"
            return tuple(Outcome(p.namespace, p.name, "error", detail) for p in decision.pods_in_order)
        outcomes = self._inner.evict(decision)
        if any(o.result == "error" for o in outcomes):  # a write fence may have closed mid-decision
            self.stopped = self._gate()
            if self.stopped is not None:
                cut = f"{NOT_ATTEMPTED}{self.stopped}"
                self.not_attempted += sum(1 for o in outcomes if o.detail.startswith(cut))
        return outcomes

    def end_cycle(self, decisions: Sequence[Decision], *, completed: bool) -> tuple[Finding, ...]:
        findings = self._inner.end_cycle(decisions, completed=completed)
        if self.stopped is None or not self.not_attempted:
            return findings
        detail = (
            f"evictions stopped: {self.stopped}; {plural(self.not_attempted, 'pod')} of approved plans "
            "not attempted"
        )
        return (*findings, Finding(kind=CUT_SHORT, detail=detail))


def _take(notifiers: list[Notifier], config: SinkFilters) -> Notifier | None:
    """Remove from `notifiers` and return the first one whose sink has the configuration `config`."""
    for notifier in notifiers:
        if notifier.sink.filters == config:
            notifiers.remove(notifier)
            return notifier
    return None


# --------------------------------------------------------------------------- the daemon


class Daemon:
    """The loop around cycles. `run_cycle()` runs one now; `start()` schedules them; `shutdown()` stops.

    `dry_run` None follows the running policy's `dry_run`; a live cycle needs `live` (without it, it
    fails). A dry-run cycle plans with a copy of the live memory's history and evicts with the live edge's
    `dry_run_evictor` (the actuator's `DrainMarkKeeper`: it writes only the lifting of expired drain
    marks), else with `DryRunEvictor`, which writes nothing.
    """

    def __init__(
        self,
        policy: PolicyWatcher | LoadedPolicy,
        source: SnapshotSource,
        *,
        live: LiveEdge | None = None,
        dry_run: bool | None = None,
        leadership: Leadership | None = None,
        sinks: DaemonSinks | None = None,
        clock: Clock | None = None,
        deadlines: Deadlines | None = None,
    ) -> None:
        self._watcher = policy if isinstance(policy, PolicyWatcher) else None
        self._loaded = policy.current if isinstance(policy, PolicyWatcher) else policy
        self._policy_unreadable = False  # the file could not be read at the last check (counted once)
        self._runs_file = True  # the running policy is the file's as it is (not with a section kept)
        self._source = source
        self._live = live
        self._memory: CycleMemory = (live.memory if live is not None else None) or Memory()
        self._dry_run = dry_run
        self._leadership = leadership
        self._sinks = sinks or DaemonSinks()
        self._clock = clock or Clock()
        self._deadlines = deadlines or Deadlines()
        self._stop_deadline: float | None = None
        self.metrics = self._sinks.metrics
        self._log_sink = LogSink()
        self._notifiers: Sequence[Notifier] = self._sinks.notifiers(
            self._loaded.policy.notify, self.metrics.notification
        )
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
        self.metrics.leader.set(0 if leadership is not None else 1)

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
        age = self._clock.monotonic() - self._last_ok
        if age > limit:
            return False, f"last successful cycle {age:.0f}s ago (more than {READY_INTERVALS} intervals)"
        return True, "standby: another replica holds the lease" if self._standby else "ok"

    def lost_leadership(self) -> None:
        """Leadership changed to another replica: the live edge starts a new term when it leads again."""
        if self._live is not None and self._live.on_lost_leadership is not None:
            self._live.on_lost_leadership()

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
            with collector_paused():
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
            # As an invalid change for the metrics (a renamed ConfigMap key must alert too): one error
            # each time the file goes missing, the policy not valid while it stays so.
            log.warning("policy file unreadable: keeping the running policy", problems=list(result.problems))
            if not self._policy_unreadable:
                self._policy_unreadable = True
                self.metrics.policy_reload_errors.inc()
            self.metrics.policy_valid.set(0)
            return
        self._policy_unreadable = False
        if result.status == "invalid":
            log.error(
                "policy change rejected: keeping the running policy",
                source=str(self._watcher.path),
                problems=list(result.problems),
            )
            self.metrics.policy_reload_errors.inc()
        if result.status == "reloaded":
            self._apply(result)
        # Valid: the file holds the policy that runs, not one rejected, nor one run in part.
        self.metrics.policy_valid.set(1 if self._watcher.valid and self._runs_file else 0)

    def _apply(self, result: ReloadResult) -> None:
        """A valid changed policy file: run it (what the live edge cannot change while it runs kept)."""
        assert self._watcher is not None
        old_loaded = self._loaded
        self._loaded = self._watcher.current
        self._runs_file = True
        if self._live is not None and self._live.on_policy_change is not None:
            self._loaded = self._live.on_policy_change(old_loaded, self._loaded)
            if self._loaded is not self._watcher.current:
                self._runs_file = False
                self.metrics.policy_reload_errors.inc()
        policy = self._loaded.policy
        log.info(
            "policy reloaded",
            source=str(self._watcher.path),
            interval=format_duration(policy.interval),
            dry_run=policy.dry_run,
            strategies=[s.name for s in self._loaded.strategies],
        )
        if policy.notify != old_loaded.policy.notify:
            self._renew_notifiers(policy.notify)
        if result.interval_changed and self._scheduler is not None:
            self._scheduler.reschedule_job(JOB_ID, trigger=self._trigger(policy.interval))
            log.info("cycle rescheduled", interval=format_duration(policy.interval))

    def _renew_notifiers(self, notify: NotifyConfig) -> None:
        """`notify:` changed: the running notifier of every sink whose configuration is unchanged goes on
        (its rate limit and pending digest with it), wherever the sink moved in its list, under the name
        of its new place; those of sinks removed or changed are closed (sending their pending digest); the
        factory builds only the new ones."""
        configured = configured_sinks(notify)
        running = list(self._notifiers)
        kept = [_take(running, config) for _name, config in configured]
        for notifier in running:
            notifier.close()
        slack = len(notify.slack)
        new = notify.model_copy(
            update={
                "slack": tuple(c for c, k in zip(notify.slack, kept[:slack], strict=True) if k is None),
                "webhooks": tuple(c for c, k in zip(notify.webhooks, kept[slack:], strict=True) if k is None),
            }
        )
        built = list(self._sinks.notifiers(new, self.metrics.notification))
        renewed: list[Notifier] = []
        for (name, config), same in zip(configured, kept, strict=True):
            chosen = same if same is not None else _take(built, config)
            if chosen is not None:
                chosen.rename(name)
                renewed.append(chosen)
        for notifier in built:  # not asked for
            notifier.close()
        self._notifiers = renewed

    def _gate(self) -> str | None:
        fence = self._live.fence if self._live is not None else None
        if fence is not None:
            try:
                fence.check()
            except FenceLost as lost:
                return lost.reason
        if self._stopping.is_set():
            return "shutting down"
        leadership = self._leadership
        if leadership is not None and not leadership.elector.holds(leadership.margin):
            return "this replica no longer holds the leader lease with time to spare"
        return None

    def _set_cycle_deadline(self, started: float) -> None:
        fence = self._live.fence if self._live is not None else None
        if fence is None:
            return
        interval = self._loaded.policy.interval
        budget = self._deadlines.cycle(interval)
        fence.set_deadline(
            started + budget,
            f"the cycle deadline passed ({format_duration(round(budget))} of the "
            f"{format_duration(interval)} interval)",
        )
        self._apply_stop_deadline(fence)  # a stop requested before (or while) this ran keeps its own

    def _apply_stop_deadline(self, fence: WriteFence) -> None:
        if self._stop_deadline is not None:
            allowed = format_duration(round(self._deadlines.shutdown))
            fence.tighten_deadline(
                self._stop_deadline, f"shutting down: the shutdown deadline passed ({allowed})"
            )

    def _evictor_and_memory(self) -> tuple[GatedEvictor, CycleMemory]:
        if not self.dry_run():
            if self._live is None:
                raise DaemonError(["live cycle without a cluster evictor (run with --dry-run)"])
            return GatedEvictor(self._live.evictor, self._gate), self._memory
        # A dry run plans with what the live memory knows, and changes nothing of it.
        dry = self._live.dry_run_evictor if self._live is not None else None
        return GatedEvictor(dry or DryRunEvictor(), self._gate), Memory(self._memory.history)

    def _cycle(self, raise_errors: bool) -> CycleReport | None:
        try:
            self._reload()
        except Exception:  # a reload problem must not stop the loop: the running policy stays
            log.exception("policy reload failed: keeping the running policy")
        loaded = self._loaded
        leadership = self._leadership
        if leadership is not None:
            leading = leadership.elector.holds(leadership.margin)
            self.metrics.leader.set(1 if leading else 0)
            if not leading:
                self._standby = True
                self._last_ok = self._clock.monotonic()
                self.metrics.clear_cycle_state()  # the leader's gauges describe the cluster now
                self._not_run("standby")
                log.info("standby: another replica holds the lease", identity=leadership.elector.identity)
                return None
        self._standby = False
        now = self._clock.wall()
        cycle_id = f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
        with structlog.contextvars.bound_contextvars(cycle_id=cycle_id):
            started = self._clock.monotonic()
            self._set_cycle_deadline(started)
            log.info("cycle started", now=now.isoformat(), dry_run=self.dry_run(), policy=loaded.source)
            try:
                snapshot = self._source(now, loaded)
                evictor, memory = self._evictor_and_memory()
                report = run_cycle(snapshot, loaded, evictor, memory=memory, cycle_id=cycle_id)
            except Exception as exc:
                duration = self._clock.monotonic() - started
                self.metrics.cycle_failed(duration)
                self.counts["error"] += 1
                if isinstance(exc, Problems):
                    log.error(
                        "cycle failed", problems=list(exc.problems), duration_seconds=round(duration, 3)
                    )
                else:
                    log.exception("cycle failed", duration_seconds=round(duration, 3))
                if raise_errors:
                    raise
                return None
            duration = self._clock.monotonic() - started
            self.metrics.cycle_took(duration)
            self.metrics.publish(report)
            self._last_report = report
            self._last_ok = self._clock.monotonic()
            self.counts["success"] += 1
            self._publish(report)
            log.info("cycle finished", duration_seconds=round(duration, 3), stopped=evictor.stopped)
            return report

    def _publish(self, report: CycleReport) -> None:
        for sink in (self._log_sink, *self._sinks.extra, *self._notifiers):
            try:
                sink.publish(report)
            except Exception as exc:  # a sink is an edge: it never fails the cycle
                name = getattr(sink, "name", type(sink).__name__)
                log.error("sink failed", sink=name, error=f"{type(exc).__name__}: {exc}")

    # ---- the loop

    def _trigger(self, interval: int) -> IntervalTrigger:
        jitter = self._clock.jitter if self._clock.jitter is not None else min(interval * 0.1, 30.0)
        start = self._clock.wall() + timedelta(seconds=interval)
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
            next_run_time=self._clock.wall(),
        )
        scheduler.start()
        self._scheduler = scheduler
        return self

    def wakeup(self) -> None:
        """Make the scheduler look at the clock again (tests move a frozen clock)."""
        if self._scheduler is not None:
            self._scheduler.wakeup()

    def request_stop(self) -> None:
        """Stop after the decision in flight, which gets `Deadlines.shutdown` seconds more to write
        (safe from a signal handler)."""
        self._stopping.set()
        fence = self._live.fence if self._live is not None else None
        if fence is not None and self._stop_deadline is None:
            self._stop_deadline = self._clock.monotonic() + self._deadlines.shutdown
            self._apply_stop_deadline(fence)

    def shutdown(self, *, notify_timeout: float = 5.0, release_lease: bool = True) -> None:
        """Stop: no new decision, wait for the running cycle (its writes end by the shutdown deadline),
        release the lease, flush notifications."""
        self.request_stop()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        if self._leadership is not None:
            self._leadership.elector.stop(release=release_lease)
            self.metrics.leader.set(0)
        deadline = time.monotonic() + notify_timeout
        for notifier in self._notifiers:
            notifier.close(max(0.0, deadline - time.monotonic()))
