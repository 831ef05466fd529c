"""The GPU model catalogue the right-sizing advisor compares against: memory, relative speed, MIG profiles.

Owns the shipped defaults for common NVIDIA data-centre models (keyed by their `nvidia.com/gpu.product`
label value) and their MIG profiles. Memory figures are from NVIDIA's datasheets and the MIG user guide;
relative throughput is a rough order (A100-80GB = 1.0) from the datasheets' dense FP16/BF16 Tensor Core
peaks and is marked approximate. Prices are not here: they are the policy's `prices.per_gpu_hour`
(`rebalancer.policy.EXAMPLE_GPU_PRICES` by default), the one home of what a GPU costs. It must stay
pure: data and lookups only, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_CATALOGUE", "GpuModel", "MigProfile", "model_of"]


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile: its name (`1g.10gb`), the extended resource it is requested by, its memory and
    compute slices of the GPU's total."""

    name: str
    memory_gib: float
    slices: int

    @property
    def resource(self) -> str:
        """The resource name under the GPU Operator's `mixed` MIG strategy: `nvidia.com/mig-1g.10gb`."""
        return f"nvidia.com/mig-{self.name}"


@dataclass(frozen=True, slots=True)
class GpuModel:
    """One GPU model: label value, memory, relative throughput, MIG profiles."""

    product: str
    memory_gib: float
    relative_throughput: float
    compute_slices: int = 0
    mig_profiles: tuple[MigProfile, ...] = ()


# MIG profiles: NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles"
# (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/). Only the profiles without media extensions.
_A100_40 = (
    MigProfile("1g.5gb", 5, 1),
    MigProfile("2g.10gb", 10, 2),
    MigProfile("3g.20gb", 20, 3),
    MigProfile("4g.20gb", 20, 4),
    MigProfile("7g.40gb", 40, 7),
)
_A100_80 = (
    MigProfile("1g.10gb", 10, 1),
    MigProfile("2g.20gb", 20, 2),
    MigProfile("3g.40gb", 40, 3),
    MigProfile("4g.40gb", 40, 4),
    MigProfile("7g.80gb", 80, 7),
)
_A30 = (
    MigProfile("1g.6gb", 6, 1),
    MigProfile("2g.12gb", 12, 2),
    MigProfile("4g.24gb", 24, 4),
)
# H100 80GB: the MIG user guide lists the same names as A100-80GB (1g.10gb ... 7g.80gb).
_H100_80 = _A100_80

# Memory: the product datasheets (NVIDIA T4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/tesla-t4/;
# NVIDIA L4 datasheet, https://www.nvidia.com/en-us/data-center/l4/; NVIDIA A10 datasheet,
# https://www.nvidia.com/en-us/data-center/products/a10-gpu/; NVIDIA A30 datasheet,
# https://www.nvidia.com/en-us/data-center/products/a30-gpu/; NVIDIA A100 datasheet,
# https://www.nvidia.com/en-us/data-center/a100/; NVIDIA H100 datasheet,
# https://www.nvidia.com/en-us/data-center/h100/; NVIDIA L40S datasheet,
# https://www.nvidia.com/en-us/data-center/l40s/). The datasheets say GB; the figures are used as GiB,
# which is what the framebuffer metrics report (a few percent generous; the headroom covers it).
# Relative throughput: approximate, from the datasheets' dense FP16 Tensor Core peaks (A100 ~312 TFLOPS
# = 1.0; H100 SXM ~990 ~ 3.2; L40S ~362 ~ 1.2; A30 ~165 ~ 0.5; A10 ~125 ~ 0.4; L4 ~121 ~ 0.4; T4 ~65
# ~ 0.2). Not a benchmark: workloads bound by memory bandwidth differ.
DEFAULT_CATALOGUE: tuple[GpuModel, ...] = (
    GpuModel("Tesla-T4", 16, 0.2),
    GpuModel("NVIDIA-L4", 24, 0.4),
    GpuModel("NVIDIA-A10", 24, 0.4),
    GpuModel("NVIDIA-A30", 24, 0.5, 4, _A30),
    GpuModel("NVIDIA-L40S", 48, 1.2),
    GpuModel("NVIDIA-A100-SXM4-40GB", 40, 1.0, 7, _A100_40),
    GpuModel("NVIDIA-A100-SXM4-80GB", 80, 1.0, 7, _A100_80),
    GpuModel("NVIDIA-H100-80GB-HBM3", 80, 3.2, 7, _H100_80),
)


def model_of(product: str, catalogue: tuple[GpuModel, ...] = DEFAULT_CATALOGUE) -> GpuModel | None:
    """The catalogue entry of a `nvidia.com/gpu.product` value, None when the catalogue lacks it."""
    return next((model for model in catalogue if model.product == product), None)
