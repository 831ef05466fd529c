"""Long-window GPU usage per series (peak, p95, steps) and the right-sizing evidence of each workload.

Owns what the advisor reads of a period of DCGM history and how it is summed up per workload:

- the metrics (`usage_metrics`): framebuffer used and utilisation (the policy's `telemetry` names and
  scales), and where the exporter has them dcgm-exporter's profiling metrics: graphics engine, SM and
  tensor pipe activity and DRAM activity (ratios 0-1, read as percent), NVLink transmit and receive
  (bytes per second);
- per series and metric (`MetricUsage`), at the period's step resolution: each step `(t - step, t]` is
  the largest sample in it (a step is as busy as its busiest instant, so a brief peak is never averaged
  away); a step whose largest sample is NaN, negative or a DCGM blank is a *bad* step. Over the period:
  the steps with a reading, the bad steps, the peak (largest step) and the p95 (Prometheus'
  `quantile_over_time(0.95)`: linear interpolation between the closest ranks) of the good steps.
  Series that differ only in labels the policy's label mapping does not read are one series (the larger
  step), as in `rebalancer.waste`. `usage_from_samples` computes this from raw samples (a snapshot
  directory's history) with the same rules as `sources.prometheus_usage`'s queries (on Prometheus 2.x,
  whose ranges include both ends; on 3.x a sample exactly 1 ms after a step's start is missed, as in
  `sources.prometheus_steps`);
- per workload (`workload_evidence`): the series of the cluster view's pods that hold whole GPUs, grouped
  by `workloads.resolve`. Its peak memory is the largest peak of any of its GPUs, its p95 figures the
  largest p95 of any GPU (the busiest replica must fit), its samples the fewest steps any of its GPUs
  has of memory, utilisation and the compute figure judged (every replica must be seen). Compute is the
  graphics engine activity where every GPU of the workload has it, else `DCGM_FI_DEV_GPU_UTIL` (which
  counts a GPU busy while any kernel runs, so it overstates the need: the advice is then `medium`
  confidence). A GPU of a replica is idle all period
  when its utilisation never reached the idle-gpu threshold and its framebuffer stayed under 1 GiB; the
  workload can drop as many GPUs a replica as its replica with the fewest idle GPUs. NVLink traffic
  counts as measured only where every GPU has both directions. Telemetry for fewer GPUs than a replica
  holds, any bad step, or replicas on different GPU models is a problem the advice reports as low
  confidence, never as "fits".

Pods that share GPUs or use MIG instances are not judged (they are sized already), nor series of pods
the cluster view no longer holds (their workload is unknown). It must stay pure: no I/O, no clock, no
query; it neither reads Prometheus nor the cluster.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rebalancer.model import GPU_PRODUCT_LABEL, Pod, Snapshot
from rebalancer.period import Period
from rebalancer.policy import MetricConfig, TelemetryConfig
from rebalancer.rightsizing import Evidence
from rebalancer.telemetry.exposition import Series
from rebalancer.telemetry.identity import (
    SeriesIdentity,
    identify,
    is_valid_value,
    resolve_preset,
)
from rebalancer.telemetry.windows import seconds_to_ms
from rebalancer.waste import gpu_product, mapped_labels
from rebalancer.workloads import resolve

__all__ = [
    "CONTAINER_LABELS",
    "P95",
    "PROFILING",
    "LabelKey",
    "MetricUsage",
    "SeriesUsage",
    "UsageHistory",
    "container_of",
    "prometheus_quantile",
    "series_usage",
    "usage_from_samples",
    "usage_labels",
    "usage_metrics",
    "workload_evidence",
]

# Where dcgm-exporter names the container holding a GPU: `exported_container` when the ServiceMonitor
# does not honour the exporter's labels (then `container` is the exporter's own), else `container`.
CONTAINER_LABELS = ("exported_container", "container")

MEMORY, UTILIZATION = "memory", "utilization"
ENGINE, SM, TENSOR, DRAM = "engine", "sm", "tensor", "dram"
NVLINK_TX, NVLINK_RX = "nvlink_tx", "nvlink_rx"

# dcgm-exporter's profiling metrics (etc/default-counters.csv and dcp-metrics-included.csv): ratios of
# time (0-1) for the activity counters, bytes per second for NVLink.
PROFILING: Mapping[str, MetricConfig] = {
    ENGINE: MetricConfig(name="DCGM_FI_PROF_GR_ENGINE_ACTIVE", scale=100),
    SM: MetricConfig(name="DCGM_FI_PROF_SM_ACTIVE", scale=100),
    TENSOR: MetricConfig(name="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", scale=100),
    DRAM: MetricConfig(name="DCGM_FI_PROF_DRAM_ACTIVE", scale=100),
    NVLINK_TX: MetricConfig(name="DCGM_FI_PROF_NVLINK_TX_BYTES"),
    NVLINK_RX: MetricConfig(name="DCGM_FI_PROF_NVLINK_RX_BYTES"),
}

P95 = 0.95
# Framebuffer (MiB) under which a GPU at idle utilisation holds nothing: the CUDA context of an idle
# process is a few hundred MiB; the idle-gpu strategy calls more than 1 GiB on an unused GPU leaked.
IDLE_FB_MIB = 1024.0

# A series' labels, sorted as the usage keeps them.
LabelKey = tuple[tuple[str, str], ...]
MIB_PER_GIB = 1024


def usage_metrics(cfg: TelemetryConfig) -> dict[str, MetricConfig]:
    """Every metric the advisor reads, by role: the policy's framebuffer and utilisation, the profiling."""
    cfg = resolve_preset(cfg)
    return {MEMORY: cfg.fb_used, UTILIZATION: cfg.utilization, **PROFILING}


def usage_labels(cfg: TelemetryConfig) -> tuple[str, ...]:
    """The labels a usage series keeps: the label mapping's, and the container's."""
    return tuple(dict.fromkeys((*mapped_labels(resolve_preset(cfg).labels), *CONTAINER_LABELS)))


@dataclass(frozen=True, slots=True)
class MetricUsage:
    """One metric of one series over the period, in the model's unit (MiB, percent, bytes/s)."""

    steps: int
    bad_steps: int = 0
    peak: float | None = None
    p95: float | None = None


@dataclass(frozen=True, slots=True)
class SeriesUsage:
    """One GPU (or MIG instance) and the pod it is attributed to, with its usage per metric role."""

    identity: SeriesIdentity
    container: str | None
    metrics: Mapping[str, MetricUsage]


@dataclass(frozen=True)
class UsageHistory:
    """The usage of every series over `period`, and where it was read (`Prometheus at URL`)."""

    period: Period
    series: tuple[SeriesUsage, ...]
    source: str
    notes: tuple[str, ...] = field(default=())


def prometheus_quantile(phi: float, values: list[float]) -> float:
    """Prometheus' `quantile` of sorted values (promql/quantile.go): rank phi*(n-1), linear between
    the closest ranks."""
    rank = phi * (len(values) - 1)
    lower = max(0, math.floor(rank))
    upper = min(len(values) - 1, lower + 1)
    weight = rank - math.floor(rank)
    return values[lower] * (1 - weight) + values[upper] * weight


def _step_max(values: list[float]) -> float:
    """The largest of a step's samples as `max_over_time` takes it: NaN only when every sample is NaN."""
    numbers = [v for v in values if not math.isnan(v)]
    return max(numbers) if numbers else math.nan


def usage_from_samples(series: Iterable[Series], cfg: TelemetryConfig, window: Period) -> list[SeriesUsage]:
    """Every series' usage from raw samples, as `sources.prometheus_usage` reads it from Prometheus. One
    series read from several files is one series (one value per timestamp, the last read wins); samples
    without a timestamp are not history and are left out."""
    metrics = usage_metrics(cfg)
    role_of = {metric.name: role for role, metric in metrics.items()}
    names = usage_labels(cfg)
    merged: dict[tuple[str, tuple[tuple[str, str], ...]], dict[int, float]] = defaultdict(dict)
    for one in series:
        if one.metric not in role_of:
            continue
        points = merged[(one.metric, tuple(sorted(one.labels.items())))]
        for sample in one.samples:
            if sample.timestamp is not None:
                points[seconds_to_ms(sample.timestamp)] = sample.value
    # (labels the usage keeps) -> role -> step end -> the step's value (the larger of duplicate series)
    grouped: dict[LabelKey, dict[str, dict[int, float]]] = defaultdict(dict)
    for (metric, labels), points in merged.items():
        found = dict(labels)
        per_step: dict[int, list[float]] = defaultdict(list)
        for ms, value in points.items():
            step = window.step_of(ms)
            if step is not None:
                per_step[step].append(value)
        # As Prometheus keeps them: sorted, and a label with an empty value is no label at all.
        key = tuple(sorted((name, found[name]) for name in names if found.get(name)))
        steps = grouped[key].setdefault(role_of[metric], {})
        for step, values in per_step.items():
            steps[step] = _larger(steps.get(step), _step_max(values))
    answers: dict[str, dict[LabelKey, MetricUsage]] = defaultdict(dict)
    for kept, roles in grouped.items():
        for role, steps in roles.items():
            if steps:
                answers[role][kept] = _usage(list(steps.values()), metrics[role].scale)
    return series_usage(answers, cfg)


def series_usage(
    answers: Mapping[str, Mapping[LabelKey, MetricUsage]], cfg: TelemetryConfig
) -> list[SeriesUsage]:
    """Every series' usage from each role's usages by series labels; series without a node or GPU UUID
    label are left out."""
    mapping = resolve_preset(cfg).labels
    by_key: dict[LabelKey, dict[str, MetricUsage]] = defaultdict(dict)
    for role, usages in answers.items():
        for key, usage in usages.items():
            by_key[key][role] = usage
    series: list[SeriesUsage] = []
    for key, metrics in sorted(by_key.items()):
        labels = dict(key)
        identity = identify(labels, mapping)
        if identity is not None:
            series.append(SeriesUsage(identity=identity, container=container_of(labels), metrics=metrics))
    return series


def _usage(steps: list[float], scale: float) -> MetricUsage:
    good = sorted(v for v in steps if is_valid_value(v))
    return MetricUsage(
        steps=len(good),
        bad_steps=len(steps) - len(good),
        peak=good[-1] * scale if good else None,
        p95=prometheus_quantile(P95, good) * scale if good else None,
    )


def _larger(current: float | None, value: float) -> float:
    """`max by` of two series' step values: NaN loses to a number, as in Prometheus."""
    if current is None or math.isnan(current):
        return value
    return current if math.isnan(value) or current >= value else value


def container_of(labels: Mapping[str, str]) -> str | None:
    for name in CONTAINER_LABELS:
        if name in labels:
            return labels[name] or None
    return None


# --------------------------------------------------------------------------- per workload


def _judged(pod: Pod) -> bool:
    """Whole GPUs, not shares or MIG instances: the pods the advisor can size."""
    return pod.is_active and pod.gpu.count > 0 and not pod.gpu.is_shared and pod.mig_instances == 0


@dataclass
class _Workload:
    namespace: str
    ref: str
    pods: dict[tuple[str, str], Pod] = field(default_factory=dict)
    gpus: dict[tuple[str, str], list[SeriesUsage]] = field(default_factory=lambda: defaultdict(list))


def _largest(values: Iterable[float | None]) -> float | None:
    numbers = [v for v in values if v is not None]
    return max(numbers) if numbers else None


def _p95(series: Iterable[SeriesUsage], role: str) -> float | None:
    return _largest(one.metrics[role].p95 for one in series if role in one.metrics)


def _everywhere(series: list[SeriesUsage], role: str) -> bool:
    return bool(series) and all(one.metrics.get(role, MetricUsage(0)).steps > 0 for one in series)


def workload_evidence(
    history: UsageHistory, cluster: Snapshot, idle_threshold_percent: float
) -> list[Evidence]:
    """The evidence of every workload whose pods hold whole GPUs, with the problems of its telemetry
    (`Evidence.problems`, empty when it is complete): a workload with one is never read as fitting."""
    resolved = resolve(cluster)
    pods = cluster.pods_by_key
    workloads: dict[str, _Workload] = {}
    for pod in cluster.pods:
        if not _judged(pod):
            continue
        ref = resolved[pod.key].ref
        workloads.setdefault(ref, _Workload(pod.namespace, ref)).pods[pod.key] = pod
    for one in history.series:
        key = one.identity.pod_key
        if key is None or key not in pods or not _judged(pods[key]):
            continue
        workloads[resolved[key].ref].gpus[key].append(one)
    return [
        _evidence(ref, workload, cluster, idle_threshold_percent)
        for ref, workload in sorted(workloads.items())
    ]


def _idle_gpus(series: Iterable[SeriesUsage], idle_threshold_percent: float) -> int:
    """GPUs of one pod idle all window: utilisation never reached the threshold, and next to nothing in
    their framebuffer (a GPU holding memory is not one the replica can give back)."""
    count = 0
    for one in series:
        util = one.metrics.get(UTILIZATION, MetricUsage(0)).peak
        memory = one.metrics.get(MEMORY, MetricUsage(0)).peak
        if util is not None and util < idle_threshold_percent and memory is not None and memory < IDLE_FB_MIB:
            count += 1
    return count


def _product(pod: Pod, series: Iterable[SeriesUsage], cluster: Snapshot) -> str:
    """The `nvidia.com/gpu.product` of the pod's node, else its series' DCGM model name in that form."""
    node = cluster.nodes.get(pod.node_name or "")
    product = node.labels.get(GPU_PRODUCT_LABEL) if node is not None else None
    return product or next(
        (gpu_product(one.identity.model_name) for one in series if one.identity.model_name), ""
    )


def _evidence(ref: str, workload: _Workload, cluster: Snapshot, idle_threshold_percent: float) -> Evidence:
    problems: list[str] = []
    series = [one for gpus in workload.gpus.values() for one in gpus]
    per_replica = max(pod.gpu.count for pod in workload.pods.values())
    for key, pod in sorted(workload.pods.items()):
        seen = len({one.identity.uuid for one in workload.gpus.get(key, ())})
        if seen < pod.gpu.count:
            problems.append(f"telemetry for {seen} of the {pod.gpu.count} GPUs of pod {pod.ref}")
    bad = sum(usage.bad_steps for one in series for usage in one.metrics.values())
    if bad:
        problems.append(f"{bad} steps of bad telemetry (NaN, negative or DCGM blank values)")
    profiled = _everywhere(series, ENGINE)
    compute_role = ENGINE if profiled else UTILIZATION
    # The compute figure judged must be as well observed as memory: a profiling metric switched on
    # late in the window counts with its own (few) steps.
    steps = [
        one.metrics[role].steps if role in one.metrics else 0
        for one in series
        for role in dict.fromkeys((MEMORY, UTILIZATION, compute_role))
    ]
    idle = min(
        (_idle_gpus(workload.gpus.get(key, ()), idle_threshold_percent) for key in workload.pods), default=0
    )
    products = {_product(pod, workload.gpus.get(key, ()), cluster) for key, pod in workload.pods.items()}
    if len(products) > 1:
        problems.append(f"replicas on different GPU models ({', '.join(sorted(products))})")
    product = min(products) if products else ""
    nvlink = (
        _largest((one.metrics[NVLINK_TX].p95 or 0) + (one.metrics[NVLINK_RX].p95 or 0) for one in series)
        if _everywhere(series, NVLINK_TX) and _everywhere(series, NVLINK_RX)
        else None
    )
    peak_mib = _largest(one.metrics[MEMORY].peak for one in series if MEMORY in one.metrics)
    p95_mib = _p95(series, MEMORY)
    compute = _p95(series, compute_role)
    return Evidence(
        namespace=workload.namespace,
        workload=ref,
        container=next((one.container for one in series if one.container), ""),
        product=product,
        replicas=len(workload.pods),
        gpus_per_replica=per_replica,
        peak_memory_gib=(peak_mib or 0) / MIB_PER_GIB,
        p95_memory_gib=(p95_mib or 0) / MIB_PER_GIB,
        p95_utilization_percent=compute or 0,
        samples=min(steps) if steps else 0,
        idle_all_window=(False,) * (per_replica - idle) + (True,) * idle,
        gang=any(pod.gang is not None for pod in workload.pods.values()),
        nvlink_bytes_per_second=nvlink,
        profiled=profiled,
        p95_sm_percent=_p95(series, SM),
        p95_tensor_percent=_p95(series, TENSOR),
        p95_dram_percent=_p95(series, DRAM),
        problems=tuple(problems),
        pods=tuple(name for _, name in sorted(workload.pods)),
    )
