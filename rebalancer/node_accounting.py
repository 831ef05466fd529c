"""Per-node accounting for the scheduling simulation: what a pod asks for, what a node holds, and how one
node judges and scores one pod.

Owns `Demand` (a pod's requests, GPU devices and non-zero cpu / memory, computed once per requests
mapping), `Holding` (what a placed pod takes on its node), `NodeState` (a node's free capacity,
devices and accounted pods, cloned copy-on-write by `placement.ClusterState`), the devices a running
pod's annotation says it was given (`assigned_devices`) and the per-node rules: static misfits
(taints, cordons, selectors, required affinity), room, shortfall wording, the score (`scoring`'s
integer MostAllocated) and the raw NodeAffinity score the profile's `addedAffinity` gives a node
(`added_affinity_score`). It must not do I/O, read the clock, or know about more than one
node at a time: choosing among nodes is `placement`'s.
"""

from __future__ import annotations

import functools
import weakref
from typing import NamedTuple

from rebalancer.digits import is_ascii_digits
from rebalancer.gpu_devices import GPU_COUNT_LABEL, has_devices
from rebalancer.memo import MISSING, ObjectMemo, RequestsMemo
from rebalancer.model import (
    GPU_RESOURCE,
    MILLI_PER_GPU,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    PreferredTerm,
    Taint,
    Toleration,
)
from rebalancer.scoring import (
    ADDED_GPU_COUNT_PREFERENCES,
    most_allocated,
    nonzero_cpu_memory,
    score_requests,
)
from rebalancer.selectors import (
    format_taint,
    node_selector_matches,
    node_selector_term_matches,
    required_affinity_matches,
    tolerates,
    untolerated_taints,
)

PodKey = tuple[str, str]

PODS_RESOURCE = "pods"
CPU_RESOURCE = "cpu"
MEMORY_RESOURCE = "memory"
# The taint a cordoned (spec.unschedulable) node carries; tolerating it lets a pod on such a node.
UNSCHEDULABLE_TAINT = Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule")
# The GPU devices a GPU-sharing scheduler assigned to a pod, as the device indices joined by "-"
# ("1", "0-2"): the annotation of Alibaba's GPU-sharing scheduler (and of the FGD simulator of its
# trace), set when the pod is bound to a device.
GPU_INDEX_ANNOTATION = "alibabacloud.com/gpu-index"
# The packed profile's NodeAffinity `addedAffinity` (deploy/packed-scheduler-config.yaml), as terms.
PROFILE_PREFERENCES: tuple[PreferredTerm, ...] = tuple(
    PreferredTerm(
        weight,
        NodeSelectorTerm(match_expressions=(NodeSelectorRequirement(GPU_COUNT_LABEL, "Gt", (str(above),)),)),
    )
    for above, weight in ADDED_GPU_COUNT_PREFERENCES
)


class Demand(NamedTuple):
    """What one pod takes from a node: the same for every pod of its template (`demand_of`)."""

    # Positive scalar requests, `nvidia.com/gpu` first (the likeliest to fail), without `pods`.
    requests: tuple[tuple[str, int], ...]
    gpu_count: int
    gpu_milli: int  # per device
    # cpu and memory as the score counts them on the node (the non-zero defaults), and what it scores
    # for this pod: (resource, weight, amount), see `scoring.score_requests`.
    score_cpu: int
    score_memory: int
    scored: tuple[tuple[str, int, int], ...]

    @property
    def gpu_total_milli(self) -> int:
        return self.gpu_count * self.gpu_milli


# Requests `Demand.requests` does not list among the rest: the GPU goes first, the pod slot is implied.
COUNTED_APART = frozenset({GPU_RESOURCE, PODS_RESOURCE})


def demand_of(pod: Pod) -> Demand:
    """What the pod takes from a node: a function of its requests and GPU request alone, worked out once
    per pod template (`rebalancer.memo.RequestsMemo`)."""
    return _DEMANDS(pod)


def _demand(pod: Pod) -> Demand:
    requests = pod.requests
    whole = requests.get(GPU_RESOURCE, 0)
    if pod.gpu.count > 0:
        gpu_count, gpu_milli = pod.gpu.count, pod.gpu.milli_per_device
    elif whole > 0:
        gpu_count, gpu_milli = whole, MILLI_PER_GPU
    else:
        gpu_count, gpu_milli = 0, 0
    scalar = [(GPU_RESOURCE, whole)] if whole > 0 else []
    for name, amount in requests.items():
        if amount > 0 and name not in COUNTED_APART:
            scalar.append((name, amount))
    score_cpu, score_memory = nonzero_cpu_memory(requests)
    return Demand(tuple(scalar), gpu_count, gpu_milli, score_cpu, score_memory, score_requests(requests))


_DEMANDS: RequestsMemo[Demand] = RequestsMemo(_demand)


class Holding(NamedTuple):
    """What one accounted pod holds on its node: its demand and the GPU devices it was given."""

    demand: Demand
    devices: tuple[int, ...]


# The pod fields the static rules (unschedulable, taints, node selector, affinity) read, plus the
# resources it needs at all: pods with equal fields have the same statically feasible nodes.
StaticFields = tuple[
    tuple[Toleration, ...],
    tuple[tuple[str, str], ...],
    tuple[NodeSelectorTerm, ...],
    tuple[str, ...],
    int,
]


class StaticKey:
    """A kind of pod for the static rules: one object per distinct `StaticFields`, shared by every pod
    with those fields for as long as any of them (or a cache keyed on it) lives, so that the caches keyed
    on it hash and compare an identity instead of the fields (affinity terms hash field by field)."""

    __slots__ = ("__weakref__", "fields")

    def __init__(self, fields: StaticFields) -> None:
        self.fields = fields

    def __repr__(self) -> str:
        return f"StaticKey({self.fields!r})"


_KINDS: weakref.WeakValueDictionary[StaticFields, StaticKey] = weakref.WeakValueDictionary()


def static_key(pod: Pod, demand: Demand) -> StaticKey:
    """The pod's kind for the static rules (kept per pod object and demand)."""
    kept = _STATIC_KEYS.get(pod)
    if kept is not MISSING and kept[0] is demand:
        return kept[1]
    selector = tuple(sorted(pod.node_selector.items())) if pod.node_selector else ()
    resources = tuple(name for name, _ in demand.requests)
    fields = (pod.tolerations, selector, pod.required_affinity, resources, demand.gpu_count)
    key = _KINDS.get(fields)
    if key is None:
        key = StaticKey(fields)
        _KINDS[fields] = key
    _STATIC_KEYS.put(pod, (demand, key))
    return key


_STATIC_KEYS: ObjectMemo[Pod, tuple[Demand, StaticKey]] = ObjectMemo()


def static_misfit(pod: Pod, node: Node) -> str | None:
    """Why the pod may never go on the node whatever is free (unschedulable, taints, labels), or None."""
    if node.unschedulable and not tolerates(pod.tolerations, UNSCHEDULABLE_TAINT):
        return "node is unschedulable"
    if node.taints:
        untolerated = untolerated_taints(pod, node)
        if untolerated:
            return f"untolerated taint {format_taint(untolerated[0])}"
    if pod.node_selector and not node_selector_matches(pod, node):
        return "node(s) didn't match node selector"
    if pod.required_affinity and not required_affinity_matches(pod, node):
        return "node(s) didn't match node affinity"
    return None


class NodeState:
    """Free capacity of one node. Shared between ClusterState copies (and successive builds of the
    accounting) until one of them changes it, which clones it first. `ranks` is the one thing written
    on a shared state: `node_rank`'s cache, which only depends on what the state accounts."""

    __slots__ = ("devices", "free", "holdings", "node", "ranks", "score_cpu", "score_memory")

    def __init__(
        self, node: Node, free: dict[str, int], devices: list[int], holdings: dict[PodKey, Holding]
    ) -> None:
        self.node = node
        self.free = free  # allocatable minus accounted, per resource
        self.devices = devices  # free milli-GPU per device
        self.holdings = holdings
        # cpu and memory of the accounted pods as the score counts them (non-zero defaults included).
        self.score_cpu = 0
        self.score_memory = 0
        # `node_rank` per demand since the last change (None: none kept).
        self.ranks: dict[tuple[Demand, str], Rank | None] | None = None

    def clone(self) -> NodeState:
        twin = NodeState(self.node, dict(self.free), list(self.devices), dict(self.holdings))
        twin.score_cpu, twin.score_memory = self.score_cpu, self.score_memory
        return twin

    def take(self, key: PodKey, holding: Holding) -> None:
        self._count(holding.demand, holding.devices, -1)
        self.holdings[key] = holding

    def give_back(self, key: PodKey) -> Holding:
        holding = self.holdings.pop(key)
        self._count(holding.demand, holding.devices, 1)
        return holding

    def _count(self, demand: Demand, devices: tuple[int, ...], sign: int) -> None:
        """Give back (sign 1) or take (sign -1) what a pod holds."""
        self.ranks = None
        free = self.free
        for name, amount in demand.requests:
            free[name] = free.get(name, 0) + sign * amount
        if PODS_RESOURCE in free:
            free[PODS_RESOURCE] += sign
        milli = sign * demand.gpu_milli
        for index in devices:
            self.devices[index] += milli
        self.score_cpu -= sign * demand.score_cpu
        self.score_memory -= sign * demand.score_memory


def assigned_devices(pod: Pod, demand: Demand, device_count: int) -> tuple[int, ...] | None:
    """The devices the pod's `GPU_INDEX_ANNOTATION` says it holds, in increasing order: None when the
    pod has none, or one that does not name `demand.gpu_count` distinct devices of the node (the caller
    then infers the devices as for a pod without it)."""
    text = pod.annotations.get(GPU_INDEX_ANNOTATION)
    if text is None or not demand.gpu_count:
        return None
    return _devices_named(text, demand.gpu_count, device_count)


@functools.lru_cache(maxsize=4096)
def _devices_named(text: str, gpu_count: int, device_count: int) -> tuple[int, ...] | None:
    """`assigned_devices` of an annotation's text: the pods of a node name a handful of device sets."""
    parts = text.split("-")
    if not all(is_ascii_digits(part) for part in parts):
        return None
    devices = tuple(sorted({int(part) for part in parts}))
    if len(devices) != len(parts) or len(devices) != gpu_count or devices[-1] >= device_count:
        return None
    return devices


def existing_order(item: tuple[Demand, Pod]) -> tuple[bool, int, int, str, str]:
    """Whole-GPU pods first, then shares from the largest down (best fit decreasing), then by name."""
    demand, pod = item
    return (demand.gpu_milli < MILLI_PER_GPU, -demand.gpu_milli, -demand.gpu_count, pod.namespace, pod.name)


def has_room(demand: Demand, state: NodeState) -> bool:
    """Whether what is free on the node now covers the pod: GPU devices (the likeliest to be short, and
    one C-level count for whole GPUs), scalar resources and a pod slot.
    """
    if demand.gpu_count and not has_devices(state.devices, demand.gpu_count, demand.gpu_milli):
        return False
    free = state.free
    for resource, amount in demand.requests:
        if free.get(resource, 0) < amount:
            return False
    return free.get(PODS_RESOURCE, 1) >= 1


def shortfall(demand: Demand, state: NodeState) -> str | None:
    """Why what is free on the node now does not cover the pod (the first missing thing), or None."""
    free = state.free
    for resource, amount in demand.requests:
        if free.get(resource, 0) < amount:
            return f"Insufficient {resource}"
    if free.get(PODS_RESOURCE, 1) < 1:
        return "Too many pods"
    count, milli = demand.gpu_count, demand.gpu_milli
    if not count or has_devices(state.devices, count, milli):
        return None
    if milli == MILLI_PER_GPU:
        return (
            "no entirely free GPU device" if count == 1 else f"fewer than {count} entirely free GPU devices"
        )
    if count == 1:
        return f"no GPU device with {milli} free milli-GPU"
    return f"fewer than {count} GPU devices with {milli} free milli-GPU"


def could_ever_hold(demand: Demand, state: NodeState) -> bool:
    """Whether the node, even empty, has every resource the pod needs and enough GPU devices."""
    allocatable = state.node.allocatable
    return len(state.devices) >= demand.gpu_count and all(
        allocatable.get(resource, 0) > 0 for resource, _ in demand.requests
    )


def node_score(demand: Demand, state: NodeState) -> int:
    """NodeResourcesFit's MostAllocated score (`scoring`) of the node once the pod is added: cpu and
    memory as the score counts them on the node, other resources as accounted."""
    allocatable = state.node.allocatable
    free = state.free
    parts: list[tuple[int, int, int]] = []
    for name, weight, amount in demand.scored:
        total = allocatable.get(name, 0)
        if name == CPU_RESOURCE:
            used = state.score_cpu
        elif name == MEMORY_RESOURCE:
            used = state.score_memory
        else:
            used = total - free.get(name, 0)
        parts.append((weight, used + amount, total))
    return most_allocated(parts)


def added_affinity_score(node: Node) -> int:
    """NodeAffinity's raw score of the node from the profile's `addedAffinity` alone: the weights of
    its preferred terms the node matches (a missing or non-integer GPU count matches none); computed
    once per Node object (`rebalancer.memo`)."""
    return _ADDED_AFFINITY(node)


def _added_affinity(node: Node) -> int:
    return sum(term.weight for term in PROFILE_PREFERENCES if node_selector_term_matches(term.term, node))


_ADDED_AFFINITY: ObjectMemo[Node, int] = ObjectMemo(_added_affinity)


# How good a feasible node is for a pod without preferred node affinity of its own, among the nodes the
# profile's `addedAffinity` scores alike, as a sort key: smaller is better (higher score, then the first
# name). Equal first items are tied.
Rank = tuple[int, str]
# A kind of pod, and the raw `addedAffinity` score of the nodes ranked.
RankingKey = tuple[StaticKey, Demand, int]


def node_rank(demand: Demand, name: str, state: NodeState) -> Rank | None:
    """The node's rank for a pod that its static rules admit, or None when what is free is too little.
    Kept on the node state until it changes (at most `_RANKS_KEPT` demands): a state is ranked for the
    same demand again and again while pods are placed elsewhere, and states as built are shared by
    every copy and the builds after them. Writing it on a shared state is safe: a rank depends only on
    the demand, the name and what the state accounts, which a shared state never changes (a copy
    clones a state before changing it, and a change drops the ranks kept), and states are used from
    one thread at a time (`placement`)."""
    ranks = state.ranks
    key = (demand, name)
    if ranks is None:
        ranks = state.ranks = {}
    elif key in ranks:
        return ranks[key]
    elif len(ranks) >= _RANKS_KEPT:
        ranks.clear()
    rank = (-node_score(demand, state), name) if has_room(demand, state) else None
    ranks[key] = rank
    return rank


_RANKS_KEPT = 64
