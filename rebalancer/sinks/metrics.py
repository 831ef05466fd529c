"""Prometheus metrics of the daemon (DESIGN §8), on a private CollectorRegistry.

Owns the metric names, help texts and labels, which are a contract for dashboards and alerts (change
them additively only), and the translation of one finished cycle's CycleReport (`publish`, as every
sink: the report says what it needs, the per-strategy proposals and the GPU models of the nodes it
names) into counter increments and per-cycle gauges; the daemon adds the cycles it did not finish:

- counters: `gpu_rebalancer_evictions_total{strategy,result,mode}` (one per pod outcome),
  `proposals_total{strategy}` (one per proposal), `blocked_total{strategy,guard}` (one per pod the
  planner refused, labelled with the guard), `cycles_total{result}` (`success`, `error`, `standby`: not
  the leader, `skipped`: the previous cycle was still running), `policy_reload_errors_total`,
  `notifications_total{sink,result}`, `predictions_total{strategy,result}` (one per evicted pod whose
  replacement's landing the cycle judged: `as-predicted`, `equivalent`: on a node tied with the
  predicted one, `elsewhere`, `pending`: none placed `reschedule_timeout` after the eviction),
  `workload_actions_total{strategy,action,result,mode}` (one per idle workload told, reclaimed or
  cleared; its pods' rows are not evictions), `idle_gpu_seconds_total{namespace}` (the GPUs of
  `idle-gpu` findings times the time since the previous cycle, when that was at most an hour ago: the
  running figure of idle GPU-hours by team);
- `cycle_duration_seconds` (histogram), `last_success_timestamp_seconds`, `policy_valid`, `leader`,
  `build_info{version,python}`;
- per-cycle state, replaced whole at the end of every successful cycle so that a scrape never sees
  half of two cycles, and cleared (`clear_cycle_state`) while the replica is a standby, since the
  leader's describe the cluster: `nodes_freeable{gpu_model}`, `idle_gpus{gpu_model}` (distinct GPU UUIDs of
  per-GPU `idle-gpu` findings, and the GPUs of each idle workload's), `leaked_vram_bytes{node}`,
  `estimated_savings_per_hour` (absent when the policy has no prices),
  `rightsizing_savings_per_hour{namespace}` (what the gpu-rightsizing findings' changes would save an
  hour, at the policy's prices, by the workload's namespace), `findings{kind}` (the cycle's findings of
  every kind `finding_kinds` lists, 0 for those it did not report: `telemetry-unavailable` says that it
  read no GPU telemetry, whatever the exporter's metric names);
- the daemon's watch cache of nodes, pods and PDBs, read at scrape time from what `watch_cache` was
  given (`KubeCache.status`): `cluster_cache_age_seconds{kind}` (seconds since the API server was last
  heard from about the kind: a list, a watch, an event or bookmark; the oldest of its lists when the
  daemon watches several namespaces; past the cache's bound, `watch_cache`'s `stale_after` and the
  metric's help say which, the kind is stale) and
  `cluster_cache_relists_total{kind,reason}` (lists made again after the first sync: `gone` after a
  410, `watch-failed`, `stale`, `policy`). No samples before the first sync, nor on a standby.

It must not use the process-global registry, label anything by pod name, or read the wall clock (the
daemon passes the timestamps). It never fails a cycle: it only counts.
"""

from __future__ import annotations

import platform
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from rebalancer import __version__
from rebalancer.cycle_report import CycleReport
from rebalancer.finding_kinds import FINDING_KINDS

__all__ = [
    "CYCLE_GAUGES",
    "CYCLE_RESULTS",
    "PREFIX",
    "CacheStatus",
    "CycleState",
    "DaemonMetrics",
    "cycle_state",
]

PREFIX = "gpu_rebalancer_"
RIGHTSIZING = "gpu-rightsizing"
CYCLE_RESULTS = ("success", "error", "standby", "skipped")
UNKNOWN_MODEL = "unknown"
MIB = 1024 * 1024
# Idle GPU-seconds are counted between two cycles at most this far apart.
MAX_IDLE_GAP_SECONDS = 3600
IDLE_GPU = "idle-gpu"
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(frozen=True)
class CycleState:
    """The gauges that describe the last successful cycle, as one unit."""

    nodes_freeable: Mapping[str, int] = field(default_factory=dict)
    gpus_freeable: Mapping[str, int] = field(default_factory=dict)
    idle_gpus: Mapping[str, float] = field(default_factory=dict)
    leaked_vram_bytes: Mapping[str, float] = field(default_factory=dict)
    estimated_savings_per_hour: float | None = None
    circuit_open: bool = False
    rightsizing_savings_per_hour: Mapping[str, float] = field(default_factory=dict)
    # Findings by kind, every kind said (empty: no cycle, no samples).
    findings: Mapping[str, int] = field(default_factory=dict)


def cycle_state(report: CycleReport) -> CycleState:
    """The per-cycle gauges of a report (GPU models and sizes from what it says of its nodes)."""
    facts = report.nodes

    def model(name: str | None) -> str:
        found = facts.get(name) if name is not None else None
        return found.gpu_model or UNKNOWN_MODEL if found is not None else UNKNOWN_MODEL

    freed = tuple(dict.fromkeys(report.freed_nodes))
    freeable = Tally(model(name) for name in freed)
    gpus_freeable: Tally[str] = Tally()
    for name in freed:
        gpus_freeable[model(name)] += facts[name].gpus if name in facts else 0

    idle: dict[str, set[str]] = {}
    idle_gpus: dict[str, float] = {}
    for finding in report.findings:
        if finding.kind != "idle-gpu":
            continue
        if finding.gpus is not None:  # one finding per workload, with every GPU it holds
            idle_gpus[model(finding.node)] = idle_gpus.get(model(finding.node), 0.0) + finding.gpus
        elif finding.gpu:
            idle.setdefault(model(finding.node), set()).add(finding.gpu)
    for name, uuids in idle.items():
        idle_gpus[name] = idle_gpus.get(name, 0.0) + len(uuids)

    leaked: dict[str, float] = {}
    seen: set[tuple[str | None, str | None, str | None, str | None]] = set()
    for finding in report.findings:
        if finding.kind != "leaked-vram" or not finding.node:
            continue
        key = (finding.node, finding.gpu, finding.namespace, finding.pod)
        if key in seen:
            continue
        seen.add(key)
        leaked[finding.node] = leaked.get(finding.node, 0.0) + (finding.fb_used_mib or 0.0) * MIB

    rightsizing: dict[str, float] = {}
    for finding in report.findings:
        if finding.kind == RIGHTSIZING and finding.namespace and finding.saving_per_hour is not None:
            rightsizing[finding.namespace] = rightsizing.get(finding.namespace, 0.0) + finding.saving_per_hour

    found: dict[str, int] = dict.fromkeys(FINDING_KINDS, 0)
    for finding in report.findings:
        found[finding.kind] += 1

    return CycleState(
        nodes_freeable=dict(freeable),
        gpus_freeable=dict(gpus_freeable),
        idle_gpus=idle_gpus,
        leaked_vram_bytes=leaked,
        estimated_savings_per_hour=report.summary.estimated_savings_per_hour,
        circuit_open=any(finding.kind == "circuit-open" for finding in report.findings),
        rightsizing_savings_per_hour=rightsizing,
        findings=found,
    )


def idle_gpus_by_namespace(report: CycleReport) -> dict[str, float]:
    """GPU-equivalents idle-gpu found idle, by namespace: a workload finding's `gpus`, else one per
    distinct GPU of the per-GPU findings."""
    found: dict[str, float] = {}
    seen: set[tuple[str, str | None, str | None]] = set()
    for finding in report.findings:
        if finding.kind != "idle-gpu" or finding.namespace is None:
            continue
        if finding.gpus is not None:
            found[finding.namespace] = found.get(finding.namespace, 0.0) + finding.gpus
        elif (key := (finding.namespace, finding.node, finding.gpu)) not in seen:
            seen.add(key)
            found[finding.namespace] = found.get(finding.namespace, 0.0) + 1.0
    return found


def _gauge(name: str, documentation: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}{name}", documentation, labels=labels)


class _CycleStateCollector(Collector):
    """Exposes the last CycleState; swapped atomically, so a scrape sees one cycle's values."""

    def __init__(self) -> None:
        self._state = CycleState()
        self._lock = threading.Lock()

    def set(self, state: CycleState) -> None:
        with self._lock:
            self._state = state

    def _families(self, state: CycleState | None) -> Iterator[Metric]:
        by_model = ["gpu_model"]
        freed = "the nodes the last cycle freed (live) or would free (dry-run), by GPU model"
        freeable = _gauge("nodes_freeable", f"GPU nodes: {freed}.", by_model)
        gpus_freeable = _gauge("gpus_freeable", f"GPUs on {freed}.", by_model)
        circuit = _gauge(
            "circuit_open", "1 while the safety valve stops evictions (evicted pods stayed Pending)."
        )
        idle = _gauge(
            "idle_gpus", "Distinct GPUs found idle (idle-gpu findings) in the last cycle.", by_model
        )
        leaked = _gauge(
            "leaked_vram_bytes", "GPU framebuffer held by no pod or by an idle one (leaked-vram).", ["node"]
        )
        savings = _gauge(
            "estimated_savings_per_hour", f"Hourly price of the GPUs on {freed}, from policy prices."
        )
        rightsizing = _gauge(
            "rightsizing_savings_per_hour",
            "What the changes gpu-rightsizing recommends would save an hour, at policy prices, by namespace.",
            ["namespace"],
        )
        findings = _gauge(
            "findings",
            "Findings of the last cycle by kind, 0 for a kind it did not report (telemetry-unavailable: "
            "no GPU telemetry could be read).",
            ["kind"],
        )
        if state is not None:
            for model, count in sorted(state.nodes_freeable.items()):
                freeable.add_metric([model], count)
            for model, count in sorted(state.gpus_freeable.items()):
                gpus_freeable.add_metric([model], count)
            circuit.add_metric([], 1 if state.circuit_open else 0)
            for model, gpus in sorted(state.idle_gpus.items()):
                idle.add_metric([model], gpus)
            for node, size in sorted(state.leaked_vram_bytes.items()):
                leaked.add_metric([node], size)
            if state.estimated_savings_per_hour is not None:
                savings.add_metric([], state.estimated_savings_per_hour)
            for namespace, saving in sorted(state.rightsizing_savings_per_hour.items()):
                rightsizing.add_metric([namespace], saving)
            for kind, count in sorted(state.findings.items()):
                findings.add_metric([kind], count)
        yield freeable
        yield gpus_freeable
        yield circuit
        yield idle
        yield leaked
        if state is None or state.estimated_savings_per_hour is not None:
            yield savings
        yield rightsizing
        yield findings

    def describe(self) -> Iterable[Metric]:
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            state = self._state
        return list(self._families(state))


# The names of the per-cycle gauges: what a standby clears, and what dashboards and alerts read from the
# leader only.
CYCLE_GAUGES: tuple[str, ...] = tuple(family.name for family in _CycleStateCollector().describe())


class CacheStatus(Protocol):
    """One list of the watch cache, as `sources.kube_cache.ListStatus` says it."""

    @property
    def kind(self) -> str: ...
    @property
    def age_seconds(self) -> float | None: ...
    @property
    def relists(self) -> Mapping[str, int]: ...


class _CacheCollector(Collector):
    """The watch cache's age and relists per kind, read from its status at scrape time."""

    def __init__(self) -> None:
        self.status: Callable[[], Iterable[CacheStatus]] | None = None
        self.stale_after: float | None = None  # the cache's bound, said in the help when known

    def _families(self, lists: Iterable[CacheStatus]) -> Iterator[Metric]:
        bound = f" ({self.stale_after:g} s)" if self.stale_after is not None else ""
        age = _gauge(
            "cluster_cache_age_seconds",
            "Seconds since the API server was last heard from about the kind in the watch cache (a list, "
            f"watch, event or bookmark); the oldest of its lists. Stale past the cache's bound{bound}.",
            ["kind"],
        )
        relists = CounterMetricFamily(
            f"{PREFIX}cluster_cache_relists",
            "Lists of a kind made again after the watch cache's first sync, by reason (gone: 410 Gone, "
            "watch-failed, stale, policy: pods translated under a changed policy).",
            labels=["kind", "reason"],
        )
        oldest: dict[str, float] = {}
        counts: dict[tuple[str, str], int] = {}
        for one in lists:
            if one.age_seconds is not None:
                oldest[one.kind] = max(oldest.get(one.kind, 0.0), one.age_seconds)
            for reason, count in one.relists.items():
                counts[(one.kind, reason)] = counts.get((one.kind, reason), 0) + count
        for kind, seconds in sorted(oldest.items()):
            age.add_metric([kind], seconds)
        for (kind, reason), count in sorted(counts.items()):
            relists.add_metric([kind, reason], count)
        yield age
        yield relists

    def describe(self) -> Iterable[Metric]:
        return list(self._families(()))

    def collect(self) -> Iterable[Metric]:
        status = self.status
        return list(self._families(status() if status is not None else ()))


class DaemonMetrics:
    """Every metric of the daemon, registered on its own registry (`registry`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.evictions = Counter(
            f"{PREFIX}evictions",
            "Pod outcomes of approved decisions (result: would-evict, evicted, blocked-by-pdb, gone, error).",
            ["strategy", "result", "mode"],
            registry=reg,
        )
        self.proposals = Counter(
            f"{PREFIX}proposals", "Proposals made by strategies.", ["strategy"], registry=reg
        )
        self.blocked = Counter(
            f"{PREFIX}blocked",
            "Pods of proposals the planner refused, by the guard that refused them.",
            ["strategy", "guard"],
            registry=reg,
        )
        self.cycle_duration = Histogram(
            f"{PREFIX}cycle_duration_seconds",
            "Wall time of one cycle: snapshot, strategies, planner, evictions, report.",
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.cycles = Counter(
            f"{PREFIX}cycles",
            "Cycles by result: success, error, standby (not the leader), skipped (previous still running).",
            ["result"],
            registry=reg,
        )
        self.last_success = Gauge(
            f"{PREFIX}last_success_timestamp_seconds",
            "Unix time of the snapshot of the last successful cycle.",
            registry=reg,
        )
        self.build_info = Gauge(
            f"{PREFIX}build_info", "Version of the running daemon.", ["version", "python"], registry=reg
        )
        self.policy_reload_errors = Counter(
            f"{PREFIX}policy_reload_errors",
            "Changed policy files that failed validation or could not be read (the running policy was kept).",
            registry=reg,
        )
        self.policy_valid = Gauge(
            f"{PREFIX}policy_valid",
            "1 when the policy file on disk is the running policy, 0 while it holds an invalid change, "
            "cannot be read, or changes what needs a restart (eviction:).",
            registry=reg,
        )
        self.leader = Gauge(
            f"{PREFIX}leader",
            "1 while this replica holds the leader Lease (or runs without leader election).",
            registry=reg,
        )
        self.notifications = Counter(
            f"{PREFIX}notifications",
            "Notification deliveries by sink and result (sent, failed, filtered, rate-limited, dropped).",
            ["sink", "result"],
            registry=reg,
        )
        self.predictions = Counter(
            f"{PREFIX}predictions",
            "Evicted pods whose replacement landed as predicted, on an equivalent (tied) node, elsewhere, "
            "or is still pending reschedule_timeout after the eviction.",
            ["strategy", "result"],
            registry=reg,
        )
        self.idle_gpu_seconds = Counter(
            f"{PREFIX}idle_gpu_seconds",
            "GPU-seconds held idle by workloads (idle-gpu findings), by the workload's namespace "
            "(scraped as exported_namespace unless the scrape honours labels). Counted between "
            f"consecutive cycles at most {MAX_IDLE_GAP_SECONDS // 60} minutes apart.",
            ["namespace"],
            registry=reg,
        )
        self.workload_actions = Counter(
            f"{PREFIX}workload_actions",
            "Idle workloads told (notify), reclaimed (reclaim) or cleared (clear), by result "
            "(notified, scaled, suspended, stopped, cleared, evicted, their would- forms in a dry run, "
            "gone, error).",
            ["strategy", "action", "result", "mode"],
            registry=reg,
        )
        self._state = _CycleStateCollector()
        reg.register(self._state)
        self._cache = _CacheCollector()
        reg.register(self._cache)
        self._last_now: datetime | None = None

        self.build_info.labels(version=__version__, python=platform.python_version()).set(1)
        self.policy_valid.set(1)
        for result in CYCLE_RESULTS:
            self.cycles.labels(result=result)

    def watch_cache(
        self, status: Callable[[], Iterable[CacheStatus]], *, stale_after: float | None = None
    ) -> None:
        """Export the watch cache whose lists `status` describes (`KubeCache.status`), read at scrape time;
        `stale_after`, its bound on a kind's age (`KubeCache.stale_after`), is said in the help."""
        self._cache.status = status
        self._cache.stale_after = stale_after

    # ---- one cycle

    def publish(self, report: CycleReport) -> None:
        """Count a successful cycle's report: proposals, outcomes, refusals, judged landings, the
        per-cycle gauges and the time of its snapshot as the last success."""
        for strategy, count in report.proposals_by_strategy.items():
            self.proposals.labels(strategy=strategy).inc(count)
        for row in report.decisions:
            if row.outcome is not None and row.workload is None:
                self.evictions.labels(strategy=row.strategy, result=row.outcome, mode=report.mode).inc()
            if row.action == "skip":
                self.blocked.labels(strategy=row.strategy, guard=row.blocked_by or "unknown").inc()
        for check in report.predictions:
            self.predictions.labels(strategy=check.strategy, result=check.result).inc()
        for notice in report.notices:
            self.workload_actions.labels(
                strategy=IDLE_GPU, action=notice.verb, result=notice.result, mode=report.mode
            ).inc()
        self._count_idle(report)
        self._state.set(cycle_state(report))
        self.cycles.labels(result="success").inc()
        self.last_success.set(report.now.timestamp())

    def clear_cycle_state(self) -> None:
        """This replica is not the leader: its last cycle no longer describes the cluster, so the
        per-cycle gauges go back to those of a replica that has run no cycle (counters and the last
        success stay), and its next cycle counts no idle GPU-seconds for the time it did not look."""
        self._state.set(CycleState())
        self._last_now = None

    def _count_idle(self, report: CycleReport) -> None:
        """The GPUs idle at this cycle, held idle since the previous one: a gap longer than
        MAX_IDLE_GAP_SECONDS (the daemon was down) counts nothing, since nobody looked, and so does the
        first cycle after a time as standby (`clear_cycle_state`), since the leader counted it."""
        last, self._last_now = self._last_now, report.now
        if last is None:
            return
        elapsed = (report.now - last).total_seconds()
        if not 0 < elapsed <= MAX_IDLE_GAP_SECONDS:
            return
        for namespace, gpus in idle_gpus_by_namespace(report).items():
            self.idle_gpu_seconds.labels(namespace=namespace).inc(gpus * elapsed)

    def cycle_took(self, duration: float) -> None:
        """The wall time of a cycle, successful or not."""
        self.cycle_duration.observe(duration)

    def cycle_failed(self, duration: float) -> None:
        self.cycle_took(duration)
        self.cycles.labels(result="error").inc()

    def cycle_not_run(self, result: str) -> None:
        """A tick that ran no cycle: `standby` (not the leader) or `skipped` (overlap)."""
        self.cycles.labels(result=result).inc()

    def notification(self, sink: str, result: str) -> None:
        self.notifications.labels(sink=sink, result=result).inc()

    # ---- exposition

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The registry in the format the scraper asked for (Prometheus text or OpenMetrics)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
