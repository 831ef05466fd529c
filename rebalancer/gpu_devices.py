"""Which GPU devices of a node a pod takes: per-device free milli-GPU, packed by best fit.

Owns the device arithmetic shared by the placement simulation and the trace replay: a node's devices
are a list of free milli-GPU (1000 a device); a pod needs `count` distinct devices with `milli` free
each. Also what share of its GPU a MIG instance is (`mig_share`), for idle GPU-hours and their cost,
and for gpu-consolidation's GPU-equivalents. It must stay pure.
"""

from __future__ import annotations

import re

from rebalancer.model import MILLI_PER_GPU, Node
from rebalancer.selectors import parse_int

__all__ = [
    "GPU_COUNT_LABEL",
    "best_fit_devices",
    "devices_for_existing",
    "gpu_device_count",
    "has_devices",
    "mig_share",
]

# GPU feature discovery's label for the physical devices of a node.
GPU_COUNT_LABEL = "nvidia.com/gpu.count"


# Compute slices of a MIG-capable GPU, by a part of its model name (NVIDIA's MIG user guide: A30 has
# 4, A100, H100, H200 and B200 have 7). A profile `<N>g.<memory>` holds N of them.
_MIG_SLICES = (("A30", 4), ("A100", 7), ("H100", 7), ("H200", 7), ("B200", 7))
_MIG_PROFILE = re.compile(r"^(\d+)g\.", re.ASCII)


def mig_share(profile: str, model: str, *, slices_if_unknown: int | None = None) -> float | None:
    """The share of its GPU a MIG instance of `profile` (`3g.40gb`) is on `model`; None when the profile
    does not say, or the model does not and no `slices_if_unknown` is given."""
    found = _MIG_PROFILE.match(profile)
    slices = next((count for part, count in _MIG_SLICES if part in model), slices_if_unknown)
    if found is None or slices is None:
        return None
    return min(int(found.group(1)), slices) / slices


def gpu_device_count(node: Node) -> int:
    """Physical GPU devices of a node: allocatable `nvidia.com/gpu`, or the GPU count label if larger."""
    labelled = node.labels.get(GPU_COUNT_LABEL)
    count = parse_int(labelled) if labelled is not None else None
    return max(node.gpu_count, count or 0, 0)


def has_devices(devices: list[int], count: int, milli: int) -> bool:
    """Whether `count` distinct devices each have at least `milli` free."""
    if milli == MILLI_PER_GPU:
        return devices.count(MILLI_PER_GPU) >= count
    found = 0
    for free in devices:
        if free >= milli:
            found += 1
            if found >= count:
                return True
    return False


def best_fit_devices(devices: list[int], count: int, milli: int) -> tuple[int, ...] | None:
    """The `count` devices with the least free milli that still hold `milli` (lowest index on ties)."""
    if milli == MILLI_PER_GPU and count == 1:  # a whole device: the first entirely free one
        return (devices.index(MILLI_PER_GPU),) if MILLI_PER_GPU in devices else None
    if count == 1:
        chosen = -1
        for index, free in enumerate(devices):
            if free >= milli and (chosen < 0 or free < devices[chosen]):
                chosen = index
        return (chosen,) if chosen >= 0 else None
    candidates = sorted((free, index) for index, free in enumerate(devices) if free >= milli)
    if len(candidates) < count:
        return None
    return tuple(sorted(index for _, index in candidates[:count]))


def devices_for_existing(devices: list[int], count: int, milli: int) -> tuple[int, ...]:
    """Devices for a pod already running: best fit, or, when the snapshot itself overcommits the node,
    the devices with the most free milli, so the overcommit shows as negative free instead of vanishing.
    """
    chosen = best_fit_devices(devices, count, milli)
    if chosen is not None:
        return chosen
    most_free_first = sorted(range(len(devices)), key=lambda index: (-devices[index], index))
    return tuple(sorted(most_free_first[:count]))
