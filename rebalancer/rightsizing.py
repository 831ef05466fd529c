"""The right-sizing judgement of one workload: long-window GPU evidence + catalogue -> a recommendation.

Owns what the advisor recommends and why, for a workload (all its replicas) given its evidence:

- thin data first: fewer samples than `min_samples`, or a GPU model the catalogue does not know, is
  `low-confidence` and never read as fitting anything;
- multi-GPU replicas that are gang-scheduled or NVLink-heavy are `not-advised`: splitting or moving them
  changes their communication, which the framebuffer and utilisation figures do not show;
- GPUs of a multi-GPU replica idle the whole window: `fewer-gpus`;
- otherwise the memory the workload needs is its peak framebuffer used plus `headroom` (default 20 %),
  and the compute it needs is its p95 utilisation of its current model. The cheapest of: a cheaper model
  present in the cluster (`available`) with that memory and at least that throughput (catalogue relative
  throughput), or a MIG profile of its own model with that memory and at least that share of compute
  slices. Nothing cheaper fits: `keep`.

The saving is per month (730 hours) over all replicas; the change is a YAML patch of the workload's pod
template built with the yaml library. It must stay pure: no I/O, no clock, no query; callers bring the
evidence (the telemetry edge aggregates it) and render the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import yaml

from rebalancer.gpu_catalogue import DEFAULT_CATALOGUE, GpuModel, model_of
from rebalancer.model import GPU_PRODUCT_LABEL

__all__ = [
    "DEFAULT_HEADROOM",
    "DEFAULT_MIN_SAMPLES",
    "HOURS_PER_MONTH",
    "Evidence",
    "Recommendation",
    "advise",
]

HOURS_PER_MONTH = 730
DEFAULT_HEADROOM = 0.20
DEFAULT_MIN_SAMPLES = 100

Kind = Literal["cheaper-model", "mig-profile", "fewer-gpus", "keep", "not-advised", "low-confidence"]


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the window showed of one workload (all replicas): framebuffer used (GiB), p95 utilisation
    (percent of its current GPU), samples, shape, and per GPU of a replica whether it was idle all window."""

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
    nvlink_heavy: bool = False


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The advice for one workload: what, why, the monthly saving and the patch (empty when no change)."""

    kind: Kind
    reason: str
    monthly_saving: float = 0.0
    target: str | None = None
    patch: str = ""


def _container_patch(spec: dict[str, object]) -> str:
    """A strategic-merge patch of the pod template: `spec` merged in, with the container's resources."""
    return yaml.safe_dump({"spec": {"template": {"spec": spec}}}, sort_keys=False)


def _resources(evidence: Evidence, limits: dict[str, object]) -> dict[str, object]:
    return {"containers": [{"name": evidence.container, "resources": {"limits": limits}}]}


def advise(
    evidence: Evidence,
    available: frozenset[str],
    catalogue: tuple[GpuModel, ...] = DEFAULT_CATALOGUE,
    headroom: float = DEFAULT_HEADROOM,
    min_samples: int = DEFAULT_MIN_SAMPLES,
) -> Recommendation:
    """The recommendation for one workload; `available` are the `nvidia.com/gpu.product` values it could
    be moved to (present in the cluster or listed in the policy)."""
    if evidence.samples < min_samples:
        return Recommendation(
            "low-confidence", f"{evidence.samples} samples in the window, fewer than the {min_samples} needed"
        )
    current = model_of(evidence.product, catalogue)
    if current is None:
        return Recommendation("low-confidence", f"GPU model {evidence.product!r} is not in the catalogue")
    if evidence.gpus_per_replica > 1 and (evidence.gang or evidence.nvlink_heavy):
        why = "gang-scheduled" if evidence.gang else "NVLink-heavy"
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
            idle * current.price_per_hour * gpu_hours,
            f"{keep} GPUs",
            _container_patch(_resources(evidence, {"nvidia.com/gpu": keep})),
        )
    need_gib = evidence.peak_memory_gib * (1 + headroom)
    need_share = evidence.p95_utilization_percent / 100
    work = need_share * current.relative_throughput
    price = current.price_per_hour * evidence.gpus_per_replica
    options: list[Recommendation] = []
    for model in catalogue:
        cost = model.price_per_hour * evidence.gpus_per_replica
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
                    f"p95 utilisation {evidence.p95_utilization_percent:g} % fits its throughput",
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
                        (current.price_per_hour - current.mig_price(profile)) * gpu_hours,
                        profile.name,
                        _container_patch(_resources(evidence, {"nvidia.com/gpu": None, profile.resource: 1})),
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
