"""How the packed scheduler profile scores a node for a pod: kube-scheduler's own integer arithmetic.

Owns the score plugins, weights and resources of the shipped profile (`deploy/`
packed-scheduler-config.yaml: NodeResourcesFit with MostAllocated and NodeAffinity; every other
default score plugin is disabled there) and the score itself, as upstream computes it
(pkg/scheduler/framework/plugins/noderesources: most_allocated.go, resource_allocation.go):

- per resource `requested * 100 / allocatable` in integer (int64) arithmetic, `requested` capped at
  `allocatable`, where `requested` is what the node's pods request plus the new pod's request (the
  profile scores every feasible node: `percentageOfNodesToScore: 100`);
- the node's MostAllocated score is the weighted sum of those divided by the weight sum, integer
  division; a resource the node does not have (allocatable 0) is left out of both;
- an extended resource the pod does not request is left out (upstream "bypasses" it), cpu and memory
  never are;
- cpu and memory count a pod that requests none of them as 100m cpu / 200 MiB
  (`DefaultMilliCPURequest` / `DefaultMemoryRequest` of pkg/scheduler/util), in the score only:
  feasibility uses the real requests. The Pod model carries pod-level totals, so the default applies
  when no container of the pod requests the resource (upstream adds it per container that omits it);
- the plugin scores are weighted and summed, with equal weights: NodeResourcesFit's, and NodeAffinity's
  (the weights of the preferred terms a node matches, the pod's own and the profile's `addedAffinity`,
  normalised to 0..100 against the best of the scored nodes);
- the profile's `addedAffinity` prefers nodes with more GPUs (`ADDED_GPU_COUNT_PREFERENCES`: GPU feature
  discovery's `nvidia.com/gpu.count` above 1, 3 and 7, weights 1, 2 and 4): among the nodes a pod may
  use, the larger shapes fill first and the small ones (often a scarce GPU model) stay free for the
  pods that can run nowhere else, or empty out for the autoscaler;
- among equal top totals kube-scheduler picks at random (`selectHost`): the prediction is a set
  (`Prediction`), reported by its first name.

LeastAllocated, its mirror, serves the replay's spreading scheduler model (not a shipped profile).
Shared by the placement simulation of a cycle (`placement`) and the trace replay's scheduler model
(`simulate.cluster`), so both place pods as the same scheduler would. It must stay pure arithmetic: no
Kubernetes objects, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "ADDED_GPU_COUNT_PREFERENCES",
    "CPU_WEIGHT",
    "DEFAULT_MEMORY_REQUEST",
    "DEFAULT_MILLI_CPU_REQUEST",
    "FIT_PLUGIN_WEIGHT",
    "GPU_WEIGHT",
    "MAX_NODE_SCORE",
    "MEMORY_WEIGHT",
    "MIG_WEIGHT",
    "NODE_AFFINITY_PLUGIN_WEIGHT",
    "PROFILE_RESOURCES",
    "Prediction",
    "affinity_scores",
    "least_allocated",
    "most_allocated",
    "nonzero_cpu_memory",
    "normalised_affinity",
    "resource_score",
    "score_requests",
    "top_nodes",
    "total_score",
]

# framework.MaxNodeScore: every score plugin scores a node 0..100 (integers).
MAX_NODE_SCORE = 100
# pkg/scheduler/util: what the score counts for a container that requests no cpu / no memory.
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024

# The score plugins the profile keeps, with their weights (deploy/packed-scheduler-config.yaml). Equal:
# a node of the preferred size wins unless a smaller one is fuller by more than the preference is worth
# (8 against 4 GPUs per node: 58 points of MostAllocated).
FIT_PLUGIN_WEIGHT = 10
NODE_AFFINITY_PLUGIN_WEIGHT = 10

# NodeAffinity's `addedAffinity` in the profile: preferred terms every pod it schedules gets on top of its
# own, `nvidia.com/gpu.count Gt N` with weight W for each (N, W). A node with 8 or more GPUs matches all
# three (7), 4-7 GPUs two (3), 2-3 GPUs one (1).
ADDED_GPU_COUNT_PREFERENCES: tuple[tuple[int, int], ...] = ((1, 1), (3, 2), (7, 4))

# MostAllocated weights: GPUs (MIG slices, GPU shares) dominate, so pods pack onto the fullest GPU nodes.
GPU_WEIGHT = 10
MIG_WEIGHT = 10
CPU_WEIGHT = 1
MEMORY_WEIGHT = 1

CPU = "cpu"
MEMORY = "memory"
_MIG_PROFILES = (
    "1g.5gb", "1g.10gb", "1g.20gb", "2g.10gb", "2g.20gb", "3g.20gb", "3g.40gb", "4g.20gb", "4g.40gb",
    "7g.40gb", "7g.80gb",
)  # fmt: skip

# NodeResourcesFit's scoringStrategy.resources, in the profile's order: (resource, weight).
PROFILE_RESOURCES: tuple[tuple[str, int], ...] = (
    ("nvidia.com/gpu", GPU_WEIGHT),
    ("nvidia.com/gpu.shared", GPU_WEIGHT),
    ("gpu-rebalancer.io/gpu-milli", GPU_WEIGHT),
    *((f"nvidia.com/mig-{profile}", MIG_WEIGHT) for profile in _MIG_PROFILES),
    (CPU, CPU_WEIGHT),
    (MEMORY, MEMORY_WEIGHT),
)
# Resources scored whether or not the pod requests them; every other one is an extended (scalar)
# resource, left out when the pod does not request it.
_NATIVE = (CPU, MEMORY, "ephemeral-storage")
_PROFILE_WEIGHTS = dict(PROFILE_RESOURCES)


@dataclass(frozen=True, slots=True)
class Prediction:
    """Where the packed scheduler puts a pod: one of `tied`, the feasible nodes with the top score
    (kube-scheduler picks among them at random). `chosen` is the one reported: the first name."""

    chosen: str
    tied: frozenset[str]

    def accepts(self, node: str) -> bool:
        """Whether a pod landing on the node landed as predicted (any tied node will do)."""
        return node in self.tied


def nonzero_cpu_memory(requests: Mapping[str, int]) -> tuple[int, int]:
    """The pod's cpu (millicores) and memory (bytes) as the score counts them: the request, or the
    default when the pod requests none (an explicit 0 stays 0, as upstream's `applyNonMissing`)."""
    return requests.get(CPU, DEFAULT_MILLI_CPU_REQUEST), requests.get(MEMORY, DEFAULT_MEMORY_REQUEST)


def score_requests(
    requests: Mapping[str, int], resources: Iterable[tuple[str, int]] = PROFILE_RESOURCES
) -> tuple[tuple[str, int, int], ...]:
    """`(resource, weight, amount)` of each resource the score counts for the pod: cpu and memory
    always (with the non-zero defaults), an extended resource when requested. The order is not the
    profile's: the integer sum does not depend on it."""
    weights = _PROFILE_WEIGHTS if resources is PROFILE_RESOURCES else dict(resources)
    cpu, memory = nonzero_cpu_memory(requests)
    scored = [
        (name, weights[name], amount)
        for name, amount in requests.items()
        if amount > 0 and name in weights and name not in _NATIVE
    ]
    for name in _NATIVE:
        if name in weights:
            amount = cpu if name == CPU else memory if name == MEMORY else requests.get(name, 0)
            scored.append((name, weights[name], amount))
    return tuple(scored)


def resource_score(requested: int, allocatable: int) -> int:
    """mostRequestedScore: `requested * 100 / allocatable`, integer, `requested` capped at allocatable."""
    if allocatable <= 0:
        return 0
    return min(requested, allocatable) * MAX_NODE_SCORE // allocatable


def most_allocated(resources: Iterable[tuple[int, int, int]]) -> int:
    """The node's MostAllocated score (0..100) over `(weight, requested, allocatable)` per resource;
    a resource with allocatable 0 is left out. 0 when none is left."""
    total = 0
    weights = 0
    for weight, requested, allocatable in resources:
        if allocatable <= 0:
            continue
        # resource_score, inline: this runs for every node a pod is scored on.
        total += min(requested, allocatable) * MAX_NODE_SCORE // allocatable * weight
        weights += weight
    return total // weights if weights else 0


def least_allocated(resources: Iterable[tuple[int, int, int]]) -> int:
    """LeastAllocated (a spreading profile, not the shipped one) over the same triples:
    `(allocatable - requested) * 100 / allocatable` per resource, 0 when overcommitted."""
    total = 0
    weights = 0
    for weight, requested, allocatable in resources:
        if allocatable <= 0:
            continue
        if requested <= allocatable:
            total += (allocatable - requested) * MAX_NODE_SCORE // allocatable * weight
        weights += weight
    return total // weights if weights else 0


def normalised_affinity(raw: int, top: int) -> int:
    """NodeAffinity's score of a node once normalised (`DefaultNormalizeScore`): `100 * raw / top`, `top`
    the highest raw score among the scored nodes; 0 when that is 0."""
    return MAX_NODE_SCORE * raw // top if top > 0 else 0


def affinity_scores(raw: Mapping[str, int]) -> dict[str, int]:
    """NodeAffinity's normalised score per node from the raw sums of matched preferred-term weights."""
    top = max(raw.values(), default=0)
    return {name: normalised_affinity(value, top) for name, value in raw.items()}


def total_score(fit: int, affinity: int) -> int:
    """A node's total: NodeResourcesFit's score and NodeAffinity's normalised one, weighted as the
    profile weighs them."""
    return FIT_PLUGIN_WEIGHT * fit + NODE_AFFINITY_PLUGIN_WEIGHT * affinity


def top_nodes(fit: Mapping[str, int], affinity_raw: Mapping[str, int]) -> frozenset[str]:
    """The nodes with the top total (`total_score`) over the scored (feasible) nodes that `fit` lists."""
    affinity = affinity_scores({name: affinity_raw.get(name, 0) for name in fit})
    totals = {name: total_score(score, affinity[name]) for name, score in fit.items()}
    top = max(totals.values(), default=0)
    return frozenset(name for name, total in totals.items() if total == top)
