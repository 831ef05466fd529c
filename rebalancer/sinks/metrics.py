"""Prometheus metrics of the daemon (DESIGN §8), on a private CollectorRegistry.

Owns the metric names, help texts and labels, which are a contract for dashboards and alerts (change
them additively only), and the translation of one finished cycle (its CycleReport, the Snapshot it was
built from, the proposals per strategy) into counter increments and per-cycle gauges:

- counters: `gpu_rebalancer_evictions_total{strategy,result,mode}` (one per pod outcome),
  `proposals_total{strategy}` (one per proposal), `blocked_total{strategy,guard}` (one per pod the
  planner refused, labelled with the guard), `cycles_total{result}` (`success`, `error`, `standby`: not
  the leader, `skipped`: the previous cycle was still running), `policy_reload_errors_total`,
  `notifications_total{sink,result}`;
- `cycle_duration_seconds` (histogram), `last_success_timestamp_seconds`, `policy_valid`, `leader`,
  `build_info{version,python}`;
- per-cycle state, replaced whole at the end of every successful cycle so that a scrape never sees
  half of two cycles: `nodes_freeable{gpu_model}`, `idle_gpus{gpu_model}` (distinct GPU UUIDs of
  `idle-gpu` findings), `leaked_vram_bytes{node}`, `estimated_savings_per_hour` (absent when the policy
  has no prices).

It must not use the process-global registry, label anything by pod name, or read the wall clock (the
daemon passes the timestamps). It never fails a cycle: it only counts.
"""

from __future__ import annotations

import platform
import threading
from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from rebalancer import __version__
from rebalancer.model import CycleReport, Finding, Snapshot

__all__ = [
    "CYCLE_RESULTS",
    "PREFIX",
    "CycleState",
    "DaemonMetrics",
    "cycle_state",
]

PREFIX = "gpu_rebalancer_"
CYCLE_RESULTS = ("success", "error", "standby", "skipped")
UNKNOWN_MODEL = "unknown"
MIB = 1024 * 1024
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(frozen=True)
class CycleState:
    """The gauges that describe the last successful cycle, as one unit."""

    nodes_freeable: Mapping[str, int] = field(default_factory=dict)
    gpus_freeable: Mapping[str, int] = field(default_factory=dict)
    idle_gpus: Mapping[str, int] = field(default_factory=dict)
    leaked_vram_bytes: Mapping[str, float] = field(default_factory=dict)
    estimated_savings_per_hour: float | None = None
    circuit_open: bool = False


def _fb_used_mib(snapshot: Snapshot, finding: Finding) -> float:
    """Framebuffer a leaked-vram finding is about, from the snapshot's telemetry (last sample, in MiB).

    The value does not depend on the window (it is the newest sample), so the first window that knows
    the GPU answers; every MIG instance / row of that GPU and pod counts.
    """
    for window in snapshot.telemetry.windows.values() if snapshot.telemetry.available else ():
        rows = [
            row
            for row in window.gpus
            if row.node == finding.node
            and row.uuid == finding.gpu
            and row.pod_namespace == finding.namespace
            and row.pod_name == finding.pod
        ]
        if rows:
            return sum(row.fb_used_mib or 0.0 for row in rows)
    return 0.0


def cycle_state(report: CycleReport, snapshot: Snapshot | None) -> CycleState:
    """The per-cycle gauges of a report; GPU models and VRAM sizes come from the snapshot when given."""
    models: dict[str, str] = {}
    gpus: dict[str, int] = {}
    if snapshot is not None:
        models = {name: node.gpu_model or UNKNOWN_MODEL for name, node in snapshot.nodes.items()}
        gpus = {name: node.gpu_count for name, node in snapshot.nodes.items()}

    freed = tuple(dict.fromkeys(report.freed_nodes))
    freeable = Tally(models.get(name, UNKNOWN_MODEL) for name in freed)
    gpus_freeable: Tally[str] = Tally()
    for name in freed:
        gpus_freeable[models.get(name, UNKNOWN_MODEL)] += gpus.get(name, 0)

    idle: dict[str, set[str]] = {}
    for finding in report.findings:
        if finding.kind == "idle-gpu" and finding.gpu:
            model = models.get(finding.node or "", UNKNOWN_MODEL)
            idle.setdefault(model, set()).add(finding.gpu)

    leaked: dict[str, float] = {}
    seen: set[tuple[str | None, str | None, str | None, str | None]] = set()
    for finding in report.findings:
        if finding.kind != "leaked-vram" or not finding.node:
            continue
        key = (finding.node, finding.gpu, finding.namespace, finding.pod)
        if key in seen:
            continue
        seen.add(key)
        used = _fb_used_mib(snapshot, finding) if snapshot is not None else 0.0
        leaked[finding.node] = leaked.get(finding.node, 0.0) + used * MIB

    return CycleState(
        nodes_freeable=dict(freeable),
        gpus_freeable=dict(gpus_freeable),
        idle_gpus={model: len(uuids) for model, uuids in idle.items()},
        leaked_vram_bytes=leaked,
        estimated_savings_per_hour=report.summary.estimated_savings_per_hour,
        circuit_open=any(finding.kind == "circuit-open" for finding in report.findings),
    )


class _CycleStateCollector(Collector):
    """Exposes the last CycleState; swapped atomically, so a scrape sees one cycle's values."""

    def __init__(self) -> None:
        self._state = CycleState()
        self._lock = threading.Lock()

    def set(self, state: CycleState) -> None:
        with self._lock:
            self._state = state

    def _families(self, state: CycleState | None) -> Iterator[Metric]:
        freeable = GaugeMetricFamily(
            f"{PREFIX}nodes_freeable",
            "GPU nodes the last cycle freed (live) or would free (dry-run), by GPU model.",
            labels=["gpu_model"],
        )
        gpus_freeable = GaugeMetricFamily(
            f"{PREFIX}gpus_freeable",
            "GPUs on the nodes the last cycle freed (live) or would free (dry-run), by GPU model.",
            labels=["gpu_model"],
        )
        circuit = GaugeMetricFamily(
            f"{PREFIX}circuit_open",
            "1 while the safety valve stops evictions (evicted pods stayed Pending), else 0.",
        )
        idle = GaugeMetricFamily(
            f"{PREFIX}idle_gpus",
            "Distinct GPUs found idle (idle-gpu findings) in the last cycle, by GPU model.",
            labels=["gpu_model"],
        )
        leaked = GaugeMetricFamily(
            f"{PREFIX}leaked_vram_bytes",
            "GPU framebuffer held by no pod, or by a pod that computed nothing (leaked-vram), by node.",
            labels=["node"],
        )
        savings = GaugeMetricFamily(
            f"{PREFIX}estimated_savings_per_hour",
            "Hourly price of the GPUs on the nodes the last cycle freed (or would free), from policy prices.",
        )
        if state is not None:
            for model, count in sorted(state.nodes_freeable.items()):
                freeable.add_metric([model], count)
            for model, count in sorted(state.gpus_freeable.items()):
                gpus_freeable.add_metric([model], count)
            circuit.add_metric([], 1 if state.circuit_open else 0)
            for model, count in sorted(state.idle_gpus.items()):
                idle.add_metric([model], count)
            for node, size in sorted(state.leaked_vram_bytes.items()):
                leaked.add_metric([node], size)
            if state.estimated_savings_per_hour is not None:
                savings.add_metric([], state.estimated_savings_per_hour)
        yield freeable
        yield gpus_freeable
        yield circuit
        yield idle
        yield leaked
        if state is None or state.estimated_savings_per_hour is not None:
            yield savings

    def describe(self) -> Iterable[Metric]:
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            state = self._state
        return list(self._families(state))


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
            "Changed policy files that failed validation (the running policy was kept).",
            registry=reg,
        )
        self.policy_valid = Gauge(
            f"{PREFIX}policy_valid",
            "1 when the policy file on disk is the running policy, 0 while it holds an invalid change.",
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
        self._state = _CycleStateCollector()
        reg.register(self._state)

        self.build_info.labels(version=__version__, python=platform.python_version()).set(1)
        self.policy_valid.set(1)
        for result in CYCLE_RESULTS:
            self.cycles.labels(result=result)

    # ---- one cycle

    def observe_cycle(
        self,
        report: CycleReport,
        snapshot: Snapshot | None,
        *,
        proposals: Mapping[str, int],
        duration: float,
        finished_at: datetime | None = None,
    ) -> None:
        """Count a successful cycle; `finished_at` (default: the snapshot's `now`) sets last success."""
        for strategy, count in proposals.items():
            self.proposals.labels(strategy=strategy).inc(count)
        for row in report.decisions:
            if row.outcome is not None:
                self.evictions.labels(strategy=row.strategy, result=row.outcome, mode=report.mode).inc()
            if row.action == "skip":
                self.blocked.labels(strategy=row.strategy, guard=row.blocked_by or "unknown").inc()
        self._state.set(cycle_state(report, snapshot))
        self.cycle_duration.observe(duration)
        self.cycles.labels(result="success").inc()
        self.last_success.set((finished_at or report.now).timestamp())

    def cycle_failed(self, duration: float) -> None:
        self.cycle_duration.observe(duration)
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
