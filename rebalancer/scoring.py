"""How the packed scheduler profile scores a node for a pod: MostAllocated, as `deploy/` configures it.

Owns the resource weights of the shipped profile (GPUs and MIG slices 10, cpu and memory 1) and the
score itself, shared by the placement simulation of a cycle (`placement`) and the trace replay's
scheduler model (`simulate.cluster`), so both place pods as the same scheduler would. It must stay
pure arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["CPU_WEIGHT", "GPU_WEIGHT", "MEMORY_WEIGHT", "MIG_WEIGHT", "most_allocated"]

# MostAllocated weights: GPUs (and MIG slices) dominate, so pods pack onto the fullest GPU nodes.
GPU_WEIGHT = 10
MIG_WEIGHT = 10
CPU_WEIGHT = 1
MEMORY_WEIGHT = 1


def most_allocated(resources: Iterable[tuple[int, float, float]]) -> float:
    """The weighted mean of (used + requested) / allocatable over `(weight, used + requested,
    allocatable)` per resource, in the order given; resources a node does not have are left out by the
    caller. 0 when there are none."""
    weighted = 0.0
    weights = 0
    for weight, wanted, allocatable in resources:
        weighted += weight * wanted / allocatable
        weights += weight
    return weighted / weights if weights else 0.0
