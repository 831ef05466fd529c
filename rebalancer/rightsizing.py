"""The right-sizing judgement of one workload: long-window GPU evidence + catalogue -> a recommendation.

Owns what the advisor recommends and why, for a workload (all its replicas) given its evidence:

- thin or bad data first: a problem with the evidence's telemetry (GPUs without series, bad steps),
  fewer samples than `min_samples`, or a GPU model the catalogue does not know, is `low-confidence` and
  never read as fitting anything;
- multi-GPU replicas that are gang-scheduled or NVLink-heavy (p95 NVLink traffic, transmit plus
  receive, at least `nvlink_heavy_bytes_per_second`) are `not-advised`: splitting or moving them
  changes their communication, which the framebuffer and utilisation figures do not show;
- GPUs of a multi-GPU replica idle the whole window: `fewer-gpus`;
- otherwise the memory the workload needs is its peak framebuffer used plus `headroom` (default 20 %),
  and the compute it needs is its p95 utilisation of its current model. The cheapest of: a cheaper model
  present in the cluster (`available`) with that memory and at least that throughput (catalogue relative
  throughput), or a MIG profile of its own model with that memory and at least that share of compute
  slices. Nothing cheaper fits: `keep`.

Confidence: `high` when compute was measured by the profiling metrics (graphics engine activity),
`medium` when only by `DCGM_FI_DEV_GPU_UTIL` (busy while any kernel runs: it overstates the need, so the
advice errs towards keeping), or for a multi-GPU replica whose NVLink traffic was not measured; `low`
for `low-confidence`. Each reason for less than `high` is a note on the recommendation.

Prices are the policy's (`prices.per_gpu_hour`), never the catalogue's: a model without one is never
offered, and a workload on one is `low-confidence` (its saving cannot be known); a MIG instance costs
its compute slices' share of its GPU's price. The saving is per month (730 hours) over all replicas;
the change is a YAML patch of the workload's pod template built with the yaml library (GPU requests set
as the limits; none, with a note, when the telemetry names no container). It must stay
pure: no I/O, no clock, no query; callers bring the evidence (`rebalancer.usage`) and render the result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import yaml

from rebalancer.gpu_catalogue import DEFAULT_CATALOGUE, GpuModel, model_of
from rebalancer.model import GPU_PRODUCT_LABEL

# The hourly price of one GPU of a `nvidia.com/gpu.product` value, None when unknown: the policy's
# `prices` (`StrategyContext.price_per_gpu_hour`), the one home of prices.
PriceOf = Callable[[str | None], float | None]

__all__ = [
    "DEFAULT_HEADROOM",
    "DEFAULT_MIN_SAMPLES",
    "DEFAULT_NVLINK_HEAVY_BYTES_PER_SECOND",
    "HOURS_PER_MONTH",
    "Evidence",
    "PriceOf",
    "Recommendation",
    "advise",
]

HOURS_PER_MONTH = 730
DEFAULT_HEADROOM = 0.20
DEFAULT_MIN_SAMPLES = 100
# NVLink traffic (transmit + receive, p95) from which a multi-GPU replica depends on NVLink: 1 GB/s, a
# thirtieth of one PCIe 4.0 x16 link and under 1 % of an A100's NVLink bandwidth, is more than the
# incidental traffic of replicas that do not talk to each other.
DEFAULT_NVLINK_HEAVY_BYTES_PER_SECOND = 1e9

Kind = Literal["cheaper-model", "mig-profile", "fewer-gpus", "keep", "not-advised", "low-confidence"]
Confidence = Literal["high", "medium", "low"]


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the window showed of one workload (all replicas): framebuffer used (GiB), p95 compute
    (percent of its current GPU: graphics engine activity when `profiled`, else utilisation), samples,
    shape, per GPU of a replica whether it was idle all window, NVLink traffic (None: not measured), the
    other profiling figures for the reader, and the problems of its telemetry (never read as fitting)."""

    namespace: str
    workload: str
    container: str
    product: str
    replicas: int
    gpus_per_replica: int
    peak_memory_gib: float
    p95_memory_gib: float
    p95_utilization_percent: float
    samples: int
    idle_all_window: tuple[bool, ...] = ()
    gang: bool = False
    nvlink_bytes_per_second: float | None = None
    profiled: bool = False
    p95_sm_percent: float | None = None
    p95_tensor_percent: float | None = None
    p95_dram_percent: float | None = None
    problems: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The advice for one workload: what, why, the monthly saving, the patch (empty when no change), how
    sure it is and why not more."""

    kind: Kind
    reason: str
    monthly_saving: float = 0.0
    target: str | None = None
    patch: str = ""
    confidence: Confidence = "high"
    notes: tuple[str, ...] = ()


def _container_patch(spec: dict[str, object]) -> str:
    """A strategic-merge patch of the pod template: `spec` merged in, with the container's resources."""
    return yaml.safe_dump({"spec": {"template": {"spec": spec}}}, sort_keys=False)


def _resources(evidence: Evidence, amounts: dict[str, object]) -> str:
    """The patch setting the container's GPU resources, requests as limits (a GPU's request may not
    differ from its limit), or no patch when the series named no container: a patch naming none would
    add a container rather than change one."""
    if not evidence.container:
        return ""
    resources = {"limits": amounts, "requests": dict(amounts)}
    return _container_patch({"containers": [{"name": evidence.container, "resources": resources}]})


def advise(
    evidence: Evidence,
    available: frozenset[str],
    price_of: PriceOf,
    *,
    catalogue: tuple[GpuModel, ...] = DEFAULT_CATALOGUE,
    headroom: float = DEFAULT_HEADROOM,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    nvlink_heavy_bytes_per_second: float = DEFAULT_NVLINK_HEAVY_BYTES_PER_SECOND,
) -> Recommendation:
    """The recommendation for one workload; `available` are the `nvidia.com/gpu.product` values it could
    be moved to (present in the cluster or listed in the policy), `price_of` the policy's hourly price
    of one GPU of a model (None: unknown; a model without a price is never offered)."""
    found = _advise(
        evidence,
        available,
        price_of,
        catalogue=catalogue,
        headroom=headroom,
        min_samples=min_samples,
        nvlink_heavy_bytes_per_second=nvlink_heavy_bytes_per_second,
    )
    if found.kind == "low-confidence":
        return replace(found, confidence="low")
    notes: list[str] = []
    if found.kind in ("fewer-gpus", "mig-profile") and not found.patch:
        notes.append("the telemetry names no container: change the GPU container's resources by hand")
    if not evidence.profiled:
        notes.append(
            "no profiling metrics (DCGM_FI_PROF_GR_ENGINE_ACTIVE): compute judged by DCGM_FI_DEV_GPU_UTIL, "
            "which counts a GPU busy while any kernel runs"
        )
    if evidence.gpus_per_replica > 1 and evidence.nvlink_bytes_per_second is None:
        notes.append(
            "NVLink traffic not measured (no DCGM_FI_PROF_NVLINK_* series): "
            "check the replica's GPUs do not talk"
        )
    return replace(found, confidence="medium" if notes else "high", notes=tuple(notes))


def _advise(
    evidence: Evidence,
    available: frozenset[str],
    price_of: PriceOf,
    *,
    catalogue: tuple[GpuModel, ...],
    headroom: float,
    min_samples: int,
    nvlink_heavy_bytes_per_second: float,
) -> Recommendation:
    if evidence.problems:
        return Recommendation("low-confidence", "; ".join(evidence.problems))
    if evidence.samples < min_samples:
        return Recommendation(
            "low-confidence", f"{evidence.samples} samples in the window, fewer than the {min_samples} needed"
        )
    current = model_of(evidence.product, catalogue)
    if current is None:
        return Recommendation("low-confidence", f"GPU model {evidence.product!r} is not in the catalogue")
    current_price = price_of(current.product)
    if current_price is None:
        return Recommendation(
            "low-confidence", f"no price for {current.product}: set prices.per_gpu_hour to know the saving"
        )
    nvlink = evidence.nvlink_bytes_per_second
    nvlink_heavy = nvlink is not None and nvlink >= nvlink_heavy_bytes_per_second
    if evidence.gpus_per_replica > 1 and (evidence.gang or nvlink_heavy):
        why = "gang-scheduled" if evidence.gang else f"NVLink-heavy (p95 {(nvlink or 0) / 1e9:.3g} GB/s)"
        return Recommendation(
            "not-advised",
            f"{evidence.gpus_per_replica} GPUs a replica, {why}: resizing would change how they talk",
        )
    gpu_hours = evidence.replicas * HOURS_PER_MONTH
    idle = sum(evidence.idle_all_window)
    if evidence.gpus_per_replica > 1 and 0 < idle < evidence.gpus_per_replica:
        keep = evidence.gpus_per_replica - idle
        return Recommendation(
            "fewer-gpus",
            f"{idle} of {evidence.gpus_per_replica} GPUs a replica idle all window",
            idle * current_price * gpu_hours,
            f"{keep} GPUs",
            _resources(evidence, {"nvidia.com/gpu": keep}),
        )
    need_gib = evidence.peak_memory_gib * (1 + headroom)
    need_share = evidence.p95_utilization_percent / 100
    work = need_share * current.relative_throughput
    price = current_price * evidence.gpus_per_replica
    options: list[Recommendation] = []
    for model in catalogue:
        model_price = price_of(model.product)
        if model_price is None:
            continue
        cost = model_price * evidence.gpus_per_replica
        if (
            model.product in available
            and model.product != current.product
            and cost < price
            and model.memory_gib >= need_gib
            and model.relative_throughput >= work
        ):
            options.append(
                Recommendation(
                    "cheaper-model",
                    f"peak {evidence.peak_memory_gib:g} GiB + {headroom:.0%} fits {model.memory_gib:g} GiB; "
                    f"p95 utilisation {evidence.p95_utilization_percent:g} % is {work:.2g} of an A100's "
                    f"throughput, within its {model.relative_throughput:g}",
                    (price - cost) * gpu_hours,
                    model.product,
                    _container_patch({"nodeSelector": {GPU_PRODUCT_LABEL: model.product}}),
                )
            )
    if evidence.gpus_per_replica == 1:
        for profile in current.mig_profiles:
            share = profile.slices / current.compute_slices
            if profile.memory_gib >= need_gib and share >= need_share and share < 1:
                options.append(
                    Recommendation(
                        "mig-profile",
                        f"peak {evidence.peak_memory_gib:g} GiB + {headroom:.0%} "
                        f"fits {profile.memory_gib:g} GiB; "
                        f"p95 utilisation {evidence.p95_utilization_percent:g} % fits "
                        f"{profile.slices}/{current.compute_slices} of the GPU",
                        current_price * (1 - share) * gpu_hours,
                        profile.name,
                        _resources(evidence, {"nvidia.com/gpu": None, profile.resource: 1}),
                    )
                )
                break  # profiles are smallest first: the first that fits is the cheapest
    if not options:
        return Recommendation(
            "keep",
            f"peak {evidence.peak_memory_gib:g} GiB + {headroom:.0%} and p95 utilisation "
            f"{evidence.p95_utilization_percent:g} % fit nothing cheaper",
        )
    return max(options, key=lambda option: option.monthly_saving)
