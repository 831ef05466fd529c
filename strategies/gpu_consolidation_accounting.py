"""GPU accounting of `gpu-consolidation`: how many GPUs a node offers and a pod holds, in GPU-equivalents.

Owns the one way the strategy's parts count GPUs: a node's capacity is its devices as placement counts
them, or, on a MIG node, its whole GPUs plus its MIG instances by compute slices (a profile
`<N>g.<memory>` holds N of its GPU model's slices, `rebalancer.gpu_devices.mig_share`: 4 on an A30, 7 on
an A100 or H100, `MIG_SLICES_PER_GPU` on a model it does not know); a pod holds its whole GPUs and shares
(`pod.gpu`), or its MIG instances by the slices of the GPU model it is counted on (its node's, which is
its peers'). These sums judge thresholds, order candidates and compare node sizes; they never decide
whether a pod fits (that is per-device packing, `rebalancer.placement`'s job). Also owns how a GPU
amount and a percentage are written, and the strategy's name, which every part writes into its
findings and proposals.

This module must stay pure: no I/O, no clock, no cluster or Prometheus clients. It must not judge nodes
or pods (candidates, telemetry, size rules are the other parts'), nor import any of them.
"""

from __future__ import annotations

from collections.abc import Iterable

from rebalancer.gpu_devices import gpu_device_count, mig_share
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
# Compute slices of a GPU whose model `mig_share` does not know (most MIG-capable models have 7).
MIG_SLICES_PER_GPU = 7


def _mig_gpus(resource: str, model: str | None) -> float:
    """GPU-equivalents of one instance of a MIG resource on a GPU `model` (`nvidia.com/mig-3g.40gb` on an
    A100: 3/7; `nvidia.com/mig-2g.12gb` on an A30: 2/4); a profile that names no slices counts one."""
    share = mig_share(
        resource.removeprefix(MIG_RESOURCE_PREFIX), model or "", slices_if_unknown=MIG_SLICES_PER_GPU
    )
    return share if share is not None else 1 / MIG_SLICES_PER_GPU


def node_capacity_gpus(node: Node) -> float:
    """GPU-equivalents of a node: its devices (as placement counts them), or, on a MIG node, its
    whole GPUs plus its MIG instances by slices."""
    mig = node.mig_resources
    if not mig:
        return float(gpu_device_count(node))
    return node.gpu_count + sum(count * _mig_gpus(res, node.gpu_model) for res, count in mig.items())


def pod_gpus(pod: Pod, model: str | None) -> float:
    """GPU-equivalents a pod holds, counted on GPU `model`: whole GPUs and shares from `pod.gpu`, or its
    MIG instances by that model's slices (what it requests is read once per pod template,
    `rebalancer.memo.RequestsMemo`)."""
    whole, mig = _HOLDING(pod)
    if not mig:
        return whole
    return sum(count * _mig_gpus(resource, model) for resource, count in mig)


def _holding(pod: Pod) -> tuple[float, tuple[tuple[str, int], ...]]:
    """The GPUs and shares of `pod.gpu`, and the MIG resources requested with their counts."""
    mig = tuple(
        (res, count) for res, count in pod.requests.items() if res.startswith(MIG_RESOURCE_PREFIX) and count
    )
    return pod.gpu.count * pod.gpu.milli_per_device / MILLI_PER_GPU, mig


_HOLDING: RequestsMemo[tuple[float, tuple[tuple[str, int], ...]]] = RequestsMemo(_holding)


def format_gpus(value: float) -> str:
    """A GPU amount to at most two decimals, without trailing zeros (`2`, `1.5`, `0.43`)."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def format_pct(value: float) -> str:
    """A percentage to at most one decimal, without a trailing zero (`71%`, `12.5%`)."""
    return f"{value:.1f}".rstrip("0").rstrip(".") + "%"


def largest_first(pods: Iterable[Pod], model: str | None) -> list[Pod]:
    """The pods holding the most GPUs (counted on GPU `model`) first, then by key."""
    return sorted(pods, key=lambda p: (-pod_gpus(p, model), p.key))
