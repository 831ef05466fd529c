"""GPU accounting of `gpu-consolidation`: how many GPUs a node offers and a pod holds, in GPU-equivalents.

Owns the one way the strategy's parts count GPUs: a node's capacity is its devices as placement counts
them, or, on a MIG node, its whole GPUs plus its MIG instances by compute slices (a profile `<N>g.<memory>`
holds N of a GPU's `MIG_SLICES_PER_GPU`); a pod holds its whole GPUs and shares (`pod.gpu`), or its MIG
instances by slices. These sums judge thresholds, order candidates and compare node sizes; they never
decide whether a pod fits (that is per-device packing, `rebalancer.placement`'s job). Also owns how a GPU
amount and a percentage are written, and the strategy's name, which every part writes into its
findings and proposals.

This module must stay pure: no I/O, no clock, no cluster or Prometheus clients. It must not judge nodes
or pods (candidates, telemetry, size rules are the other parts'), nor import any of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rebalancer.gpu_devices import gpu_device_count
from rebalancer.memo import RequestsMemo
from rebalancer.model import MIG_RESOURCE_PREFIX, MILLI_PER_GPU, Node, Pod

__all__ = [
    "MIG_SLICES_PER_GPU",
    "NAME",
    "format_gpus",
    "format_pct",
    "largest_first",
    "node_capacity_gpus",
    "pod_gpus",
]

NAME = "gpu-consolidation"
# A MIG profile `<N>g.<memory>` holds N of a GPU's (usually 7) compute slices.
MIG_SLICES_PER_GPU = 7
_MIG_PROFILE = re.compile(r"(\d+)g\.")


def _mig_gpus(resource: str) -> float:
    """GPU-equivalents of one instance of a MIG resource (`nvidia.com/mig-3g.40gb` -> 3/7)."""
    match = _MIG_PROFILE.match(resource.removeprefix(MIG_RESOURCE_PREFIX))
    slices = int(match.group(1)) if match else 1
    return min(slices, MIG_SLICES_PER_GPU) / MIG_SLICES_PER_GPU


def node_capacity_gpus(node: Node) -> float:
    """GPU-equivalents of a node: its devices (as placement counts them), or, on a MIG node, its
    whole GPUs plus its MIG instances by slices."""
    mig = node.mig_resources
    if not mig:
        return float(gpu_device_count(node))
    return node.gpu_count + sum(count * _mig_gpus(res) for res, count in mig.items())


def pod_gpus(pod: Pod) -> float:
    """GPU-equivalents a pod holds: whole GPUs and shares from `pod.gpu`, MIG instances by slices
    (worked out once per pod template, `rebalancer.memo.RequestsMemo`)."""
    return _POD_GPUS(pod)


def _pod_gpus(pod: Pod) -> float:
    mig = sum(
        count * _mig_gpus(res) for res, count in pod.requests.items() if res.startswith(MIG_RESOURCE_PREFIX)
    )
    if mig:
        return mig
    return pod.gpu.count * pod.gpu.milli_per_device / MILLI_PER_GPU


_POD_GPUS: RequestsMemo[float] = RequestsMemo(_pod_gpus)


def format_gpus(value: float) -> str:
    """A GPU amount to at most two decimals, without trailing zeros (`2`, `1.5`, `0.43`)."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def format_pct(value: float) -> str:
    """A percentage to at most one decimal, without a trailing zero (`71%`, `12.5%`)."""
    return f"{value:.1f}".rstrip("0").rstrip(".") + "%"


def largest_first(pods: Iterable[Pod]) -> list[Pod]:
    """The pods holding the most GPUs first, then by key."""
    return sorted(pods, key=lambda p: (-pod_gpus(p), p.key))
