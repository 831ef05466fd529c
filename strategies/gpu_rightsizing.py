"""The `gpu-rightsizing` strategy: workloads that would fit a cheaper GPU model, a MIG slice or fewer GPUs.

Report-only: it never proposes an eviction. Owns its arguments (the window and step of the usage history
the sources read for it, the headroom, the evidence needed, the NVLink bound, the models that can be had
beyond those in the cluster, and catalogue entries added to or replacing the built-in ones) and
`advice()`, the one path from a usage history to the recommendations, which `rebalancer advise` also
takes: per workload (`usage.workload_evidence`), the judgement of `rightsizing.advise` against the GPU
models present in the cluster (`nvidia.com/gpu.product` of its nodes) plus `available_models`, priced by
the policy's `prices`.

Each recommendation with a saving is a `gpu-rightsizing` finding (the workload, the change, the monthly
saving and why; `saving_per_hour` for the metric; `rebalancer advise` prints the patches); `keep`,
`not-advised` and `low-confidence` are not-chosen records with that code and the reason. Without a
usage history on the snapshot (no Prometheus, or a snapshot directory without DCGM history) it is
skipped, saying so: it never guesses. It must stay pure: no I/O, no clock, no query.
"""

from __future__ import annotations

from typing import Final, Self

from pydantic import Field, model_validator

from rebalancer.gpu_catalogue import DEFAULT_CATALOGUE, GpuModel, MigProfile
from rebalancer.model import GPU_PRODUCT_LABEL, Finding, NotChosen, Snapshot, StrategyResult
from rebalancer.period import check_steps
from rebalancer.policy import format_duration
from rebalancer.policy.fields import Count, Duration, Percent, StrictModel
from rebalancer.registry import StrategyArgs, StrategyContext, strategy
from rebalancer.rightsizing import (
    DEFAULT_MIN_SAMPLES,
    DEFAULT_NVLINK_HEAVY_BYTES_PER_SECOND,
    HOURS_PER_MONTH,
    Evidence,
    PriceOf,
    Recommendation,
    advise,
)
from rebalancer.usage import UsageHistory, workload_evidence

__all__ = ["NAME", "CatalogueModel", "GpuRightsizingArgs", "advice", "gpu_rightsizing"]

NAME: Final = "gpu-rightsizing"
SAVING_KINDS = frozenset({"cheaper-model", "mig-profile", "fewer-gpus"})


class CatalogueMig(StrictModel):
    name: str = Field(min_length=1, pattern=r"^\d+g\.\d+gb$")
    memory_gib: float = Field(gt=0, allow_inf_nan=False)
    slices: Count = Field(ge=1)


class CatalogueModel(StrictModel):
    """A GPU model for the advisor to compare against; one named as a built-in entry replaces it whole
    (its MIG profiles too: list them again to keep them)."""

    product: str = Field(min_length=1)
    memory_gib: float = Field(gt=0, allow_inf_nan=False)
    relative_throughput: float = Field(gt=0, allow_inf_nan=False)
    compute_slices: Count = Field(default=0, ge=0)
    mig_profiles: tuple[CatalogueMig, ...] = ()

    @model_validator(mode="after")
    def _profiles_fit_the_gpu(self) -> Self:
        if self.mig_profiles and self.compute_slices < 1:
            raise ValueError(
                "mig_profiles need compute_slices: the GPU's number of compute slices (7 on an A100)"
            )
        for profile in self.mig_profiles:
            if profile.slices > self.compute_slices or profile.memory_gib > self.memory_gib:
                raise ValueError(
                    f"MIG profile {profile.name} ({profile.slices} slices, {profile.memory_gib:g} GiB) is "
                    f"more than the GPU has ({self.compute_slices} slices, {self.memory_gib:g} GiB)"
                )
        return self

    def model(self) -> GpuModel:
        """The catalogue entry; its MIG profiles smallest first, as the advisor takes them."""
        profiles = tuple(
            MigProfile(p.name, p.memory_gib, p.slices)
            for p in sorted(self.mig_profiles, key=lambda p: (p.slices, p.memory_gib))
        )
        return GpuModel(
            self.product, self.memory_gib, self.relative_throughput, self.compute_slices, profiles
        )


class GpuRightsizingArgs(StrategyArgs):
    """Arguments of `gpu-rightsizing`. Durations accept `5m`, `7d` or seconds."""

    window: Duration = Field(default=7 * 86400, gt=0)
    """The history the advice stands on (one query per metric over it)."""
    step: Duration = Field(default=300, gt=0)
    """Resolution of the history: each step counts as its busiest sample."""
    headroom_percent: Percent = 20.0
    """Memory kept free above the workload's peak framebuffer use when judging a fit."""
    min_samples: Count = Field(default=DEFAULT_MIN_SAMPLES, ge=1)
    """Fewer good steps than this on any GPU of a workload is too little evidence: low confidence."""
    idle_below_percent: Percent = 5.0
    """A GPU whose utilisation stayed below this every step of the window was idle all window."""
    nvlink_heavy_bytes_per_second: float = Field(default=DEFAULT_NVLINK_HEAVY_BYTES_PER_SECOND, ge=0)
    """p95 NVLink traffic (transmit + receive) from which a multi-GPU replica is not advised."""
    available_models: tuple[str, ...] = ()
    """GPU models (`nvidia.com/gpu.product`) that can be had beyond those the cluster's nodes have."""
    catalogue: tuple[CatalogueModel, ...] = ()
    """GPU models added to the built-in catalogue, or replacing a built-in one of the same product."""

    @model_validator(mode="after")
    def _whole_steps(self) -> Self:
        try:
            check_steps(self.window, self.step)
        except ValueError as exc:
            raise ValueError(f"window / step: {exc}") from None
        return self

    def usage_period(self) -> tuple[int, int] | None:
        return (self.window, self.step)

    def models(self) -> tuple[GpuModel, ...]:
        """The built-in catalogue with this policy's entries added or replacing."""
        own = {entry.product: entry.model() for entry in self.catalogue}
        kept = tuple(model for model in DEFAULT_CATALOGUE if model.product not in own)
        return (*kept, *own.values())


def advice(
    cluster: Snapshot, history: UsageHistory, args: GpuRightsizingArgs, price_of: PriceOf
) -> list[tuple[Evidence, Recommendation]]:
    """Every judged workload's evidence and recommendation, the largest saving first."""
    present = {node.labels.get(GPU_PRODUCT_LABEL, "") for node in cluster.nodes.values()} - {""}
    available = frozenset(present | set(args.available_models))
    catalogue = args.models()
    judged = [
        (
            evidence,
            advise(
                evidence,
                available,
                price_of,
                catalogue=catalogue,
                headroom=args.headroom_percent / 100,
                min_samples=args.min_samples,
                nvlink_heavy_bytes_per_second=args.nvlink_heavy_bytes_per_second,
            ),
        )
        for evidence in workload_evidence(history, cluster, args.idle_below_percent)
    ]
    return sorted(judged, key=lambda pair: (-pair[1].monthly_saving, pair[0].workload))


def _detail(evidence: Evidence, found: Recommendation, window: int) -> str:
    change = f"{found.kind} {found.target}" if found.target else found.kind
    return (
        f"{evidence.workload}: {change}, saving {found.monthly_saving:,.0f} a month "
        f"({evidence.replicas} x {evidence.gpus_per_replica} {evidence.product}, over "
        f"{format_duration(window)}: {found.reason}; {found.confidence} confidence)"
    )


@strategy(
    NAME,
    GpuRightsizingArgs,
    "report-only: workloads that would fit a cheaper GPU model, a MIG slice or fewer GPUs, with the saving",
)
def gpu_rightsizing(snapshot: Snapshot, args: GpuRightsizingArgs, ctx: StrategyContext) -> StrategyResult:
    history = snapshot.usage
    if history is None:
        return StrategyResult(
            skipped=f"no GPU usage history over {format_duration(args.window)} (it reads "
            "telemetry.prometheus, or the DCGM history of a snapshot directory)"
        )
    findings: list[Finding] = []
    left: list[NotChosen] = []
    for evidence, found in advice(snapshot, history, args, ctx.price_per_gpu_hour):
        if found.kind in SAVING_KINDS:
            findings.append(
                Finding(
                    kind=NAME,
                    namespace=evidence.namespace,
                    workload=evidence.workload,
                    gpus=float(evidence.replicas * evidence.gpus_per_replica),
                    detail=_detail(evidence, found, history.period.seconds),
                    saving_per_hour=found.monthly_saving / HOURS_PER_MONTH,
                )
            )
        else:
            left.append(
                NotChosen(
                    strategy=NAME,
                    node=None,
                    code=found.kind,
                    reason=f"{evidence.workload}: {found.reason}",
                    namespace=evidence.namespace,
                    pod=evidence.pods[0] if evidence.pods else None,
                )
            )
    return StrategyResult(findings=tuple(findings), not_chosen=tuple(left))
