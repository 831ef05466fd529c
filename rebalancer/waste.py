"""Idle GPU-hours per team over a period (showback): per-series step counts -> the waste table.

Owns what `rebalancer waste` counts and how it is added up:

- the period (`rebalancer.period`, re-exported here): `since` seconds ending at `until` rounded down to
  a multiple of the step (steps are aligned to the epoch, as Prometheus aligns a subquery's steps), cut
  into steps of `step` seconds, each step `(t - step, t]`;
- the resolution: time is counted in whole steps. For each series (one GPU or MIG instance and the pod
  it is attributed to) a step is *covered* when it holds at least one utilisation sample, and *idle*
  when the mean of those samples is strictly below the idle-gpu strategy's `max_utilization_percent`
  (the strategy's judgement, over one step instead of its window). A covered step counts in full (a
  pod that ran one minute of a five-minute step is charged five minutes); a step without a sample
  counts not at all: a gap in the history (exporter or Prometheus down, pod gone) is neither idle nor
  allocated, never idle. A NaN sample makes its step's mean not below the threshold, and a series'
  step holding a sample below 0 % or above 100 % (-Inf, +Inf, a DCGM blank) is left out of the idle
  judgement (it still covers the step), so bad data is never idle, as `telemetry.sanity` rules for
  the strategies. Series of one GPU and pod that differ only in labels the policy's label
  mapping does not read (a second scrape job, `instance`) count once per step: the largest mean;
- `SeriesSteps`: covered and idle steps of one series, as the Prometheus source's one query answers
  them, or as `steps_from_samples` counts them from raw samples (a snapshot directory's history) with
  the same rules, so both sources give the same table;
- `tally()`: step counts -> `Waste`. GPU-hours are steps x step length x GPU-equivalents: a whole GPU
  is 1; a MIG instance is its compute slices of 7 (`GPU_I_PROFILE` `3g.40gb` -> 3/7) on the 7-slice
  models (A100, H100, H200), else 1 with a note. A time-sliced GPU is charged in full to each pod the
  exporter attributes it to. Series without a pod (unallocated GPUs, leaked VRAM) are charged to no
  team: they are one separate total. So are series naming the exporter's own pod, which a GPU no pod
  holds carries when the ServiceMonitor does not honour the exporter's labels: a pod of the cluster
  view that holds no GPU (as `telemetry.identity.attribute` reads it), or a pod the history itself
  shows as a scrape target (`scrape_targets`). Series without a node or GPU UUID label are left out,
  with a note;
- grouping: by the series' namespace label, by workload (`workloads.resolve` on the cluster view) or
  by a pod label. Pods of the history that the cluster view does not hold are grouped per namespace
  under `(pods no longer in the cluster)`, never dropped;
- cost: idle GPU-hours x the hourly price of the series' GPU model (`modelName`, in the form of the
  `nvidia.com/gpu.product` label prices are keyed by: `gpu_product`). A group with idle GPU-hours of a
  model without a price has no cost (None, and a note): a partial sum would understate it. The total
  not attributed to a pod is costed in full (every hour of it is a GPU nobody holds).

It must stay pure: no I/O, no clock; it neither queries Prometheus nor reads the cluster (callers pass
the step counts and the cluster view) and renders nothing (`waste_report` does).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from rebalancer.gpu_devices import mig_share
from rebalancer.group_by import GroupBy
from rebalancer.model import Pod, Snapshot
from rebalancer.period import Period, check_steps, period
from rebalancer.policy import LabelMapping, TelemetryConfig
from rebalancer.telemetry.exposition import Series
from rebalancer.telemetry.identity import SeriesIdentity, identify, resolve_preset
from rebalancer.telemetry.sanity import MAX_PERCENT
from rebalancer.telemetry.windows import seconds_to_ms
from rebalancer.wording import plural
from rebalancer.workloads import resolve

__all__ = [
    "GONE",
    "GroupBy",
    "GroupWaste",
    "Period",
    "PriceOf",
    "SeriesSteps",
    "Unattributed",
    "Usage",
    "Waste",
    "WorkloadWaste",
    "check_steps",
    "gpu_product",
    "gpu_share",
    "mapped_labels",
    "period",
    "scrape_targets",
    "steps_from_samples",
    "tally",
]

# The group of a namespace's pods that the history names but the cluster view does not hold.
GONE = "(pods no longer in the cluster)"

# The hourly price of one GPU of a `nvidia.com/gpu.product` value (None: the model is unknown).
PriceOf = Callable[[str | None], float | None]


# --------------------------------------------------------------------------- step counts


@dataclass(frozen=True, slots=True)
class SeriesSteps:
    """Steps of the period in which one series had samples (`covered`), and of those, how many averaged
    below the threshold (`idle`). `labels` are the series' labels the policy's label mapping reads."""

    labels: Mapping[str, str]
    covered: int
    idle: int


def mapped_labels(mapping: LabelMapping) -> tuple[str, ...]:
    """Every label name the mapping reads (node, pod, namespace, UUID, index, model, MIG), in order."""
    names = (
        *mapping.node,
        *mapping.pod,
        *mapping.namespace,
        *mapping.uuid,
        *mapping.gpu_index,
        *mapping.model_name,
        *mapping.mig_profile,
        *mapping.mig_instance,
    )
    return tuple(dict.fromkeys(names))


def _larger(current: float | None, mean: float) -> float:
    """PromQL's `max`: NaN only while nothing else is there."""
    if current is None or math.isnan(current) or mean > current:
        return mean
    return current


def steps_from_samples(
    series: Iterable[Series], cfg: TelemetryConfig, window: Period, threshold_percent: float
) -> list[SeriesSteps]:
    """Step counts of the policy's utilisation series from raw samples, as the Prometheus query counts
    them: per step, each series' mean; per group of series with the same mapped labels, the largest
    mean; covered when there is one, idle when it is below the threshold. One series read from several
    files is one series (one value per timestamp, the last read wins), as Prometheus would hold it.
    Samples without a timestamp are not history and are left out."""
    cfg = resolve_preset(cfg)
    names = mapped_labels(cfg.labels)
    threshold = threshold_percent / cfg.utilization.scale
    ceiling = MAX_PERCENT / cfg.utilization.scale
    merged: dict[tuple[tuple[str, str], ...], dict[int, float]] = defaultdict(dict)
    for one in series:
        if one.metric != cfg.utilization.name:
            continue
        points = merged[tuple(sorted(one.labels.items()))]
        for sample in one.samples:
            if sample.timestamp is not None:
                points[seconds_to_ms(sample.timestamp)] = sample.value
    # Per group: every step's largest mean (covered), and the largest of the plausible ones (idle).
    groups: dict[tuple[tuple[str, str], ...], tuple[dict[int, float], dict[int, float]]] = {}
    for labels, points in merged.items():
        found = dict(labels)
        per_step: dict[int, list[float]] = defaultdict(list)
        for ms, value in sorted(points.items()):
            step = window.step_of(ms)
            if step is not None:
                per_step[step].append(value)
        key = tuple((name, found[name]) for name in names if found.get(name))
        means, plausible = groups.setdefault(key, ({}, {}))
        for step, values in per_step.items():
            mean = math.fsum(values) / len(values)
            means[step] = _larger(means.get(step), mean)
            if not any(value < 0 or value > ceiling for value in values):  # NaN compares false
                plausible[step] = _larger(plausible.get(step), mean)
    return [
        SeriesSteps(
            labels=dict(key),
            covered=len(means),
            idle=sum(1 for mean in plausible.values() if mean < threshold),
        )
        for key, (means, plausible) in groups.items()
        if means
    ]


# --------------------------------------------------------------------------- GPUs and prices


def gpu_product(model_name: str) -> str:
    """The `nvidia.com/gpu.product` form of a DCGM `modelName` (GPU feature discovery writes the name with
    dashes for spaces): `NVIDIA A100-SXM4-80GB` -> `NVIDIA-A100-SXM4-80GB`."""
    return "-".join(model_name.split())


def gpu_share(identity: SeriesIdentity) -> tuple[float, str | None]:
    """GPU-equivalents of a series' device, and why it is an approximation (None when it is not)."""
    if identity.mig_instance is None and identity.mig_profile is None:
        return 1.0, None
    share = mig_share(identity.mig_profile or "", identity.model_name)
    if share is not None:
        return share, None
    profile = identity.mig_profile or "no profile label"
    model = identity.model_name or "no model label"
    return 1.0, f"{profile} on {model}"


def scrape_targets(steps: Iterable[SeriesSteps], mapping: LabelMapping) -> set[tuple[str, str]]:
    """(namespace, pod) of the scraped exporter pods, which hold no GPU, as the series show them.

    A ServiceMonitor that does not honour the exporter's labels (the GPU Operator's and the Helm chart's
    default) renames the GPU holder's `pod` / `namespace` to `exported_pod` / `exported_namespace` and
    puts the exporter's own there; a GPU no pod holds then carries only the exporter's. So on a series
    whose pod comes from an earlier label of the mapping, the later pod labels (with the namespace
    labels at the same positions) name a scrape target, and a series attributed to one of those is
    attributed to no pod.
    """
    targets: set[tuple[str, str]] = set()
    for one in steps:
        labels = one.labels
        first = next((i for i, name in enumerate(mapping.pod) if labels.get(name)), None)
        if first is None:
            continue
        for index in range(first + 1, min(len(mapping.pod), len(mapping.namespace))):
            pod, namespace = labels.get(mapping.pod[index]), labels.get(mapping.namespace[index])
            if pod and namespace:
                targets.add((namespace, pod))
    return targets


# --------------------------------------------------------------------------- grouping


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True, slots=True)
class Usage:
    """GPU-hours held by pods and, of those, idle; the idle hours' cost (None: a model without price)."""

    idle_gpu_hours: float
    allocated_gpu_hours: float
    cost: float | None

    @property
    def idle_share(self) -> float | None:
        return self.idle_gpu_hours / self.allocated_gpu_hours if self.allocated_gpu_hours > 0 else None


@dataclass(frozen=True, slots=True)
class WorkloadWaste:
    """One workload (`namespace/Kind/name`), or a pod (`namespace/name`) whose workload is unknown."""

    workload: str
    namespace: str
    pods: int
    usage: Usage


@dataclass(frozen=True, slots=True)
class GroupWaste:
    group: str
    namespace: str | None
    pods: int
    usage: Usage
    top_workloads: tuple[WorkloadWaste, ...]


@dataclass(frozen=True, slots=True)
class Unattributed:
    """GPU time of series attributed to no pod: unallocated GPUs and leaked VRAM, charged to no team."""

    series: int
    gpu_hours: float
    idle_gpu_hours: float
    cost: float | None


@dataclass(frozen=True, slots=True)
class Waste:
    """The table `rebalancer waste` prints, in the order it prints it (most idle GPU-hours first)."""

    period: Period
    threshold_percent: float
    by: GroupBy
    history: str
    groups: tuple[GroupWaste, ...]
    totals: Usage
    unattributed: Unattributed
    top_workloads: tuple[WorkloadWaste, ...]
    notes: tuple[str, ...] = ()


@dataclass
class _Sum:
    idle: float = 0.0
    allocated: float = 0.0
    cost: float = 0.0
    unpriced: bool = False
    pods: set[tuple[str, str]] = field(default_factory=set)

    def add(self, idle: float, allocated: float, price: float | None, pod: tuple[str, str]) -> None:
        self.idle += idle
        self.allocated += allocated
        if price is not None:
            self.cost += idle * price
        elif idle > 0:
            self.unpriced = True
        self.pods.add(pod)

    def usage(self) -> Usage:
        return Usage(self.idle, self.allocated, None if self.unpriced else self.cost)


@dataclass
class _Loose:
    """Series attributed to no pod: every hour of them is a GPU nobody holds, costed in full."""

    series: int = 0
    hours: float = 0.0
    idle: float = 0.0
    cost: float = 0.0
    unpriced: bool = False

    def add(self, idle: float, hours: float, price: float | None) -> None:
        self.series += 1
        self.hours += hours
        self.idle += idle
        if price is not None:
            self.cost += hours * price
        else:
            self.unpriced = True


@dataclass(frozen=True, slots=True)
class _Charge:
    """One series' GPU-hours, charged to a pod, its workload (or the pod) and a group."""

    pod: tuple[str, str]
    holder: str
    group: str
    group_namespace: str | None
    idle: float
    allocated: float
    price: float | None


def _ranked(sums: Mapping[str, _Sum]) -> list[tuple[str, _Sum]]:
    return sorted(sums.items(), key=lambda item: (-item[1].idle, -item[1].allocated, item[0]))


def _workloads(
    sums: Mapping[str, _Sum], namespaces: Mapping[str, str], top: int
) -> tuple[WorkloadWaste, ...]:
    ranked = [(name, s) for name, s in _ranked(sums) if s.idle > 0][:top]
    return tuple(WorkloadWaste(name, namespaces[name], len(s.pods), s.usage()) for name, s in ranked)


def _total(usages: Iterable[Usage]) -> Usage:
    listed = list(usages)
    costs = [u.cost for u in listed]
    return Usage(
        idle_gpu_hours=math.fsum(u.idle_gpu_hours for u in listed),
        allocated_gpu_hours=math.fsum(u.allocated_gpu_hours for u in listed),
        cost=None if any(c is None for c in costs) else math.fsum(c for c in costs if c is not None),
    )


def tally(
    steps: Iterable[SeriesSteps],
    cfg: TelemetryConfig,
    window: Period,
    *,
    threshold_percent: float,
    by: GroupBy,
    price_of: PriceOf,
    cluster: Snapshot | None = None,
    top: int = 5,
    history: str = "",
) -> Waste:
    """The waste table of `steps` over `window`, grouped `by`, priced with `price_of`.

    `cluster` is the cluster view that maps pods to workloads and labels (required for `workload` and
    `label:KEY`); without one, pods are taken as the series name them and top entries are pods.
    """
    if by.needs_cluster and cluster is None:
        raise ValueError(f"grouping by {by} needs a cluster view")
    cfg = resolve_preset(cfg)
    hours_per_step = window.step / 3600
    pods = cluster.pods_by_key if cluster is not None else None
    resolved = resolve(cluster) if cluster is not None else {}

    counted = list(steps)
    targets = scrape_targets(counted, cfg.labels)
    charges: list[_Charge] = []
    loose = _Loose()
    unusable = 0
    approximate: Counter[str] = Counter()
    unpriced: dict[str, float] = defaultdict(float)
    gone: set[tuple[str, str]] = set()
    for one in counted:
        identity = identify(one.labels, cfg.labels)
        if identity is None:
            unusable += 1
            continue
        share, approximation = gpu_share(identity)
        if approximation is not None:
            approximate[approximation] += 1
        idle = one.idle * hours_per_step * share
        allocated = one.covered * hours_per_step * share
        product = gpu_product(identity.model_name) or None
        price = price_of(product)
        key = identity.pod_key
        pod = pods.get(key) if key is not None and pods is not None else None
        if key in targets or (key is not None and pod is not None and not pod.uses_gpu):
            key = None  # the exporter's own pod, or a pod of the cluster holding no GPU (`attribute`)
        if key is None:
            loose.add(idle, allocated, price)
            if price is None:
                unpriced[identity.model_name or "(no model label)"] += allocated
            continue
        if price is None and idle > 0:
            unpriced[identity.model_name or "(no model label)"] += idle
        namespace, name = key
        holder = f"{namespace}/{name}"
        if pod is not None and key in resolved:
            holder = resolved[key].ref
        if pods is not None and pod is None:
            gone.add(key)
        group, group_namespace = _group_of(by, namespace, holder, pod, gone=pods is not None and pod is None)
        charges.append(_Charge(key, holder, group, group_namespace, idle, allocated, price))

    groups: dict[str, _Sum] = defaultdict(_Sum)
    group_namespaces: dict[str, str | None] = {}
    by_group: dict[str, dict[str, _Sum]] = defaultdict(lambda: defaultdict(_Sum))
    holders: dict[str, _Sum] = defaultdict(_Sum)
    holder_namespaces: dict[str, str] = {}
    for charge in charges:
        groups[charge.group].add(charge.idle, charge.allocated, charge.price, charge.pod)
        group_namespaces[charge.group] = charge.group_namespace
        by_group[charge.group][charge.holder].add(charge.idle, charge.allocated, charge.price, charge.pod)
        holders[charge.holder].add(charge.idle, charge.allocated, charge.price, charge.pod)
        holder_namespaces[charge.holder] = charge.pod[0]

    rows = tuple(
        GroupWaste(
            group=name,
            namespace=group_namespaces[name],
            pods=len(s.pods),
            usage=s.usage(),
            top_workloads=_workloads(by_group[name], holder_namespaces, top),
        )
        for name, s in _ranked(groups)
    )
    return Waste(
        period=window,
        threshold_percent=threshold_percent,
        by=by,
        history=history,
        groups=rows,
        totals=_total(row.usage for row in rows),
        unattributed=Unattributed(
            series=loose.series,
            gpu_hours=loose.hours,
            idle_gpu_hours=loose.idle,
            cost=None if loose.unpriced else loose.cost,
        ),
        top_workloads=_workloads(holders, holder_namespaces, top),
        notes=tuple(
            _notes(
                unusable=unusable,
                approximate=approximate,
                unpriced=unpriced,
                gone=gone,
                by=by,
                has_cluster=cluster is not None,
            )
        ),
    )


def _group_of(
    by: GroupBy, namespace: str, holder: str, pod: Pod | None, *, gone: bool
) -> tuple[str, str | None]:
    """The group a pod's GPU-hours go to, and the namespace of that group (None: several)."""
    if by.kind == "namespace":
        return namespace, namespace
    if gone:
        return f"{namespace}/{GONE}", namespace
    if by.kind == "workload":
        return holder, namespace
    value = pod.labels.get(by.label) if pod is not None and by.label is not None else None
    return (value if value else f"(no {by.label} label)"), None


def _hours(value: float) -> str:
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def _notes(
    *,
    unusable: int,
    approximate: Mapping[str, int],
    unpriced: Mapping[str, float],
    gone: set[tuple[str, str]],
    by: GroupBy,
    has_cluster: bool,
) -> list[str]:
    notes: list[str] = []
    for model, hours in sorted(unpriced.items()):
        notes.append(
            f"no price for GPU model {model!r} ({gpu_product(model)}): {_hours(hours)} GPU-hours of it are "
            "not costed, so the cost of the groups holding them is unknown (null); add it to the policy's "
            "prices.per_gpu_hour or to --prices"
        )
    for what, count in sorted(approximate.items()):
        notes.append(f"{count} MIG series ({what}) counted as one GPU each: the share of the GPU is unknown")
    if unusable:
        notes.append(f"{unusable} series without a node or GPU UUID label left out")
    if gone and by.needs_cluster:
        notes.append(
            f"{plural(len(gone), 'pod')} of the history no longer in the cluster: counted per namespace "
            f"under {GONE!r}"
        )
    if not has_cluster:
        notes.append(
            "no cluster view: top entries are pods (namespace/name); pass --snapshot DIR or --kubeconfig "
            "to name their workloads"
        )
    return notes
