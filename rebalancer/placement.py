"""Scheduling simulation: can a pod run on a node, and where would a packed scheduler put it.

Owns `ClusterState`, a mutable what-if copy of free capacity per node built from a Snapshot, with
reservations carried across every placement of a cycle: the feasibility rules (resources, per-device
GPU shares, taints, unschedulable and cordoned nodes, node selector, required node affinity) and the
MostAllocated score of the packed scheduler profile. It must not do I/O or read the clock, and it never
changes the Snapshot it was built from. Label and taint matching semantics live in `selectors`.

Model:

- Scalar resources: every key of `pod.requests` must fit in the node's allocatable minus what is
  accounted on it (cpu in millicores, memory in bytes, extended resources in their own unit). Each pod
  also takes one of `allocatable["pods"]` when the node declares it.
- GPU devices: a node has D devices of 1000 milli-GPU each, D = max(allocatable `nvidia.com/gpu`,
  label `nvidia.com/gpu.count`). `pod.gpu` (count, milli_per_device) needs `count` distinct devices with
  at least `milli_per_device` free each; the devices with the least free milli that still fit are
  taken (best fit), so whole-GPU pods take entirely free devices and shares pack together. A pod
  without `pod.gpu` but with a `nvidia.com/gpu` request needs that many whole devices.
- A pod is accounted on at most one node. `fits`, `score` and `best_node` judge a pod as a newcomer:
  capacity it already holds is not free for itself. `place` and `place_all` move a pod that is already
  accounted: what it held is released first (and taken back if the move fails).
- Running pods get devices deterministically when the state is built: whole-GPU pods first, then
  shares by best fit, largest first. A snapshot that overcommits a node shows negative free capacity.
- MostAllocated (`scoring`) over GPU milli of all devices, cpu, memory and each `nvidia.com/mig-*`
  resource the pod requests. `best_node` takes the highest score, then the higher preferred node
  affinity weight, then the first node name. Device arithmetic is `gpu_devices`'.

Speed: copies are copy-on-write per node, so a what-if `copy()` costs one dictionary copy and only the
nodes it changes are duplicated; states built from one snapshot share its accounting, done once.
`best_node` ranks the nodes as built once per kind of pod (same constraints and requests), shares that
ranking with every copy, and per call re-examines only the nodes the state has changed since. A
ClusterState is not safe to use from several threads at once.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from rebalancer.gpu_devices import best_fit_devices, devices_for_existing, gpu_device_count, has_devices
from rebalancer.model import (
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    MILLI_PER_GPU,
    Node,
    NodeSelectorTerm,
    Pod,
    PreferredTerm,
    Snapshot,
    Taint,
    Toleration,
)
from rebalancer.scoring import CPU_WEIGHT, GPU_WEIGHT, MEMORY_WEIGHT, MIG_WEIGHT, most_allocated
from rebalancer.selectors import (
    format_taint,
    node_selector_matches,
    preferred_affinity_score,
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


@dataclass(frozen=True, slots=True)
class FitResult:
    """Whether a pod fits a node; when not, `reason` names the first rule that failed."""

    ok: bool
    reason: str = ""


FITS = FitResult(ok=True)


# --------------------------------------------------------------------------- per-pod and per-node data


class _Demand(NamedTuple):
    """What one pod takes from a node, resolved once from the pod."""

    # Positive scalar requests, `nvidia.com/gpu` first (the likeliest to fail), without `pods`.
    requests: tuple[tuple[str, int], ...]
    gpu_count: int
    gpu_milli: int  # per device
    cpu: int
    memory: int
    mig: tuple[tuple[str, int], ...]  # the nvidia.com/mig-* part of `requests`, for scoring

    @property
    def gpu_total_milli(self) -> int:
        return self.gpu_count * self.gpu_milli


# Requests `_Demand.requests` does not list among the rest: the GPU goes first, the pod slot is implied.
_COUNTED_APART = frozenset({GPU_RESOURCE, PODS_RESOURCE})


def _demand_of(pod: Pod) -> _Demand:
    requests = pod.requests
    whole = requests.get(GPU_RESOURCE, 0)
    if pod.gpu.count > 0:
        gpu_count, gpu_milli = pod.gpu.count, pod.gpu.milli_per_device
    elif whole > 0:
        gpu_count, gpu_milli = whole, MILLI_PER_GPU
    else:
        gpu_count, gpu_milli = 0, 0
    scalar = [(GPU_RESOURCE, whole)] if whole > 0 else []
    mig: list[tuple[str, int]] = []
    for name, amount in requests.items():
        if amount > 0 and name not in _COUNTED_APART:
            scalar.append((name, amount))
            if name.startswith(MIG_RESOURCE_PREFIX):
                mig.append((name, amount))
    return _Demand(
        tuple(scalar),
        gpu_count,
        gpu_milli,
        requests.get(CPU_RESOURCE, 0),
        requests.get(MEMORY_RESOURCE, 0),
        tuple(mig),
    )


class _Holding(NamedTuple):
    """What one accounted pod holds on its node: its demand and the GPU devices it was given."""

    demand: _Demand
    devices: tuple[int, ...]


# The pod fields the static rules (unschedulable, taints, node selector, affinity) read, plus the
# resources it needs at all: pods with equal keys have the same statically feasible nodes.
_StaticKey = tuple[
    tuple[Toleration, ...],
    tuple[tuple[str, str], ...],
    tuple[NodeSelectorTerm, ...],
    tuple[str, ...],
    int,
]


def _static_key(pod: Pod, demand: _Demand) -> _StaticKey:
    selector = tuple(sorted(pod.node_selector.items())) if pod.node_selector else ()
    resources = tuple(name for name, _ in demand.requests)
    return (pod.tolerations, selector, pod.required_affinity, resources, demand.gpu_count)


def _static_misfit(pod: Pod, node: Node) -> str | None:
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


class _NodeState:
    """Free capacity of one node. Shared between ClusterState copies until one of them writes."""

    __slots__ = ("devices", "free", "holdings", "node")

    def __init__(
        self, node: Node, free: dict[str, int], devices: list[int], holdings: dict[PodKey, _Holding]
    ) -> None:
        self.node = node
        self.free = free  # allocatable minus accounted, per resource
        self.devices = devices  # free milli-GPU per device
        self.holdings = holdings

    def clone(self) -> _NodeState:
        return _NodeState(self.node, dict(self.free), list(self.devices), dict(self.holdings))

    def take(self, key: PodKey, holding: _Holding) -> None:
        free = self.free
        for name, amount in holding.demand.requests:
            free[name] = free.get(name, 0) - amount
        if PODS_RESOURCE in free:
            free[PODS_RESOURCE] -= 1
        milli = holding.demand.gpu_milli
        for index in holding.devices:
            self.devices[index] -= milli
        self.holdings[key] = holding

    def give_back(self, key: PodKey) -> _Holding:
        holding = self.holdings.pop(key)
        free = self.free
        for name, amount in holding.demand.requests:
            free[name] += amount
        if PODS_RESOURCE in free:
            free[PODS_RESOURCE] += 1
        milli = holding.demand.gpu_milli
        for index in holding.devices:
            self.devices[index] += milli
        return holding


def _existing_order(item: tuple[_Demand, Pod]) -> tuple[bool, int, int, str, str]:
    """Whole-GPU pods first, then shares from the largest down (best fit decreasing), then by name."""
    demand, pod = item
    return (demand.gpu_milli < MILLI_PER_GPU, -demand.gpu_milli, -demand.gpu_count, pod.namespace, pod.name)


def _has_room(demand: _Demand, state: _NodeState) -> bool:
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


def _shortfall(demand: _Demand, state: _NodeState) -> str | None:
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


def _could_ever_hold(demand: _Demand, state: _NodeState) -> bool:
    """Whether the node, even empty, has every resource the pod needs and enough GPU devices."""
    allocatable = state.node.allocatable
    return len(state.devices) >= demand.gpu_count and all(
        allocatable.get(resource, 0) > 0 for resource, _ in demand.requests
    )


def _score(demand: _Demand, state: _NodeState) -> float:
    """MostAllocated (`scoring`) over the node's GPU milli, cpu, memory and the pod's MIG resources."""
    parts: list[tuple[int, float, float]] = []
    devices = state.devices
    if devices:
        capacity = len(devices) * MILLI_PER_GPU
        parts.append((GPU_WEIGHT, capacity - sum(devices) + demand.gpu_total_milli, capacity))
    allocatable = state.node.allocatable
    free = state.free
    cpu = allocatable.get(CPU_RESOURCE, 0)
    if cpu > 0:
        parts.append((CPU_WEIGHT, cpu - free[CPU_RESOURCE] + demand.cpu, cpu))
    memory = allocatable.get(MEMORY_RESOURCE, 0)
    if memory > 0:
        parts.append((MEMORY_WEIGHT, memory - free[MEMORY_RESOURCE] + demand.memory, memory))
    for resource, amount in demand.mig:
        total = allocatable.get(resource, 0)
        if total > 0:
            parts.append((MIG_WEIGHT, total - free[resource] + amount, total))
    return most_allocated(parts)


# How good a feasible node is for a pod, as a sort key: smaller is better (higher score, then higher
# preferred affinity weight, then the first name).
_Rank = tuple[float, int, str]
_RankingKey = tuple[_StaticKey, tuple[PreferredTerm, ...], _Demand]


def _rank(demand: _Demand, pod: Pod, name: str, state: _NodeState) -> _Rank | None:
    """The node's rank for a pod that its static rules admit, or None when what is free is too little."""
    if not _has_room(demand, state):
        return None
    preference = preferred_affinity_score(pod, state.node) if pod.preferred_affinity else 0
    return (-_score(demand, state), -preference, name)


# --------------------------------------------------------------------------- the cluster


class _Built:
    """What every copy of one ClusterState shares: the nodes as built and what is derived from them.

    The node states here are never written: a ClusterState clones a node before its first change.
    """

    __slots__ = ("home", "nodes", "rankings", "static_candidates")

    def __init__(self, nodes: Mapping[str, _NodeState], home: Mapping[PodKey, str]) -> None:
        self.nodes = nodes
        self.home = home  # the node each pod was accounted on when built
        # Nodes whose labels, taints and allocatable admit a kind of pod (cordons aside).
        self.static_candidates: dict[_StaticKey, frozenset[str]] = {}
        # The names of every node a kind of pod fits on as built, best first.
        self.rankings: dict[_RankingKey, tuple[str, ...]] = {}


def _build(snapshot: Snapshot) -> _Built:
    """Every active pod accounted against its node, as the snapshot shows them."""
    nodes: dict[str, _NodeState] = {}
    home: dict[PodKey, str] = {}
    pods_by_node = snapshot.pods_by_node
    for name, node in snapshot.nodes.items():
        state = _NodeState(node, dict(node.allocatable), [MILLI_PER_GPU] * gpu_device_count(node), {})
        nodes[name] = state
        gpu_pods: list[tuple[_Demand, Pod]] = []
        for pod in pods_by_node.get(name, ()):
            demand = _demand_of(pod)
            if demand.gpu_count:
                gpu_pods.append((demand, pod))
            else:
                key = (pod.namespace, pod.name)
                state.take(key, _Holding(demand, ()))
                home[key] = name
        gpu_pods.sort(key=_existing_order)
        for demand, pod in gpu_pods:
            key = (pod.namespace, pod.name)
            devices = devices_for_existing(state.devices, demand.gpu_count, demand.gpu_milli)
            state.take(key, _Holding(demand, devices))
            home[key] = name
    return _Built(nodes, home)


class _LastBuilt:
    """The `_Built` of the snapshot that states were last built from, held only as long as it lives."""

    __slots__ = ("_entry",)

    def __init__(self) -> None:
        self._entry: tuple[weakref.ref[Snapshot], _Built] | None = None

    def get(self, snapshot: Snapshot) -> _Built:
        entry = self._entry
        if entry is not None and entry[0]() is snapshot:
            return entry[1]
        built = _build(snapshot)
        self._entry = (weakref.ref(snapshot, self._forget), built)
        return built

    def _forget(self, ref: weakref.ref[Snapshot]) -> None:
        entry = self._entry
        if entry is not None and entry[0] is ref:
            self._entry = None


_LAST_BUILT = _LastBuilt()


class ClusterState:
    """Free capacity of every node, with reservations made during a cycle. Build with `from_snapshot`.

    Node-level inspection (`free`, `gpu_free_milli`, `score`) raises KeyError for an unknown node;
    `fits` and `place` treat it as a node nothing fits on.

    `best_node` is incremental: it takes the best node of the shared ranking (see `_Built`) that this
    state has not changed, cordoned or excluded, and compares it with the nodes this state changed.
    """

    def __init__(
        self,
        built: _Built,
        nodes: dict[str, _NodeState],
        moves: dict[PodKey, str | None],
        cordoned: set[str],
        changed: set[str],
    ) -> None:
        self._built = built
        self._nodes = nodes
        self._moves = moves  # only the differences from built.home: new node, or None once removed
        self._cordoned = cordoned
        self._changed = changed  # nodes whose state is no longer the one built
        self._owned: set[str] = set()  # changed nodes no other copy shares, so writable in place

    # ----------------------------------------------------------------------- construction

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> ClusterState:
        """Account every active pod against its node. Pods on nodes the snapshot lacks are ignored.

        The accounting is done once per snapshot and shared by every state built from it (each strategy
        and the planner of a cycle build one): it is never written, see `_Built`.
        """
        built = _LAST_BUILT.get(snapshot)
        return cls(built, dict(built.nodes), moves={}, cordoned=set(), changed=set())

    def copy(self) -> ClusterState:
        """An independent what-if copy: changes to either never show in the other."""
        # Both sides now share every node state, so each must duplicate a node before writing it.
        self._owned = set()
        return self._fork()

    def _fork(self) -> ClusterState:
        return ClusterState(
            self._built, dict(self._nodes), dict(self._moves), set(self._cordoned), set(self._changed)
        )

    def _adopt(self, trial: ClusterState) -> None:
        """Take over the state of a fork of this state that was never copied itself."""
        self._nodes = trial._nodes
        self._moves = trial._moves
        self._changed = trial._changed
        self._owned |= trial._owned

    def _writable(self, node: str) -> _NodeState:
        state = self._nodes[node]
        if node not in self._owned:
            state = state.clone()
            self._nodes[node] = state
            self._owned.add(node)
            self._changed.add(node)
        return state

    # ----------------------------------------------------------------------- queries

    def node_of(self, pod_key: PodKey) -> str | None:
        """The node a pod is accounted on (where it runs, or where it was placed), or None."""
        if pod_key in self._moves:
            return self._moves[pod_key]
        return self._built.home.get(pod_key)

    def free(self, node: str) -> Mapping[str, int]:
        """Allocatable minus accounted, per resource (including `pods` when the node declares it)."""
        return dict(self._nodes[node].free)

    def gpu_free_milli(self, node: str) -> tuple[int, ...]:
        """Free milli-GPU of each device of the node, in device order."""
        return tuple(self._nodes[node].devices)

    def is_cordoned(self, node: str) -> bool:
        return node in self._cordoned

    def fits(self, pod: Pod, node: str) -> FitResult:
        """Whether the pod, as a newcomer, can be placed on the node now; the first failing rule if not."""
        state = self._nodes.get(node)
        if state is None:
            return FitResult(ok=False, reason=f"node {node} not found")
        reason = self._misfit(_demand_of(pod), pod, node, state)
        return FITS if reason is None else FitResult(ok=False, reason=reason)

    def score(self, pod: Pod, node: str) -> float:
        """MostAllocated score (0..1, higher = fuller once the pod is added), whether or not it fits."""
        return _score(_demand_of(pod), self._nodes[node])

    def best_node(self, pod: Pod, *, exclude: Collection[str] = ()) -> str | None:
        """The feasible node a packed scheduler would pick: highest score, then the higher preferred
        node affinity weight, then the first name in sorted order. None when no node fits.
        """
        return self._best_node(_demand_of(pod), pod, frozenset(exclude))

    def _best_node(self, demand: _Demand, pod: Pod, excluded: frozenset[str]) -> str | None:
        static_key = _static_key(pod, demand)
        candidates = self._static_candidates(static_key, pod, demand)
        changed = self._changed
        cordoned = self._cordoned
        nodes = self._nodes
        best: _Rank | None = None
        for name in self._ranking(static_key, candidates, pod, demand):
            if name not in changed and name not in cordoned and name not in excluded:
                best = _rank(demand, pod, name, nodes[name])  # unchanged since ranked, so it still fits
                break
        for name in changed:
            if name in candidates and name not in cordoned and name not in excluded:
                fresh = _rank(demand, pod, name, nodes[name])
                if fresh is not None and (best is None or fresh < best):
                    best = fresh
        return None if best is None else best[2]

    def _static_candidates(self, key: _StaticKey, pod: Pod, demand: _Demand) -> frozenset[str]:
        """Nodes whose labels, taints and allocatable admit the pod, whatever is free (cached)."""
        candidates = self._built.static_candidates.get(key)
        if candidates is None:
            candidates = frozenset(
                name
                for name, state in self._built.nodes.items()
                if _could_ever_hold(demand, state) and _static_misfit(pod, state.node) is None
            )
            self._built.static_candidates[key] = candidates
        return candidates

    def _ranking(
        self, static_key: _StaticKey, candidates: frozenset[str], pod: Pod, demand: _Demand
    ) -> tuple[str, ...]:
        """Every node the pod fits on as built, best first (cached per kind of pod)."""
        key = (static_key, pod.preferred_affinity, demand)
        ranking = self._built.rankings.get(key)
        if ranking is None:
            nodes = self._built.nodes
            ranks = [_rank(demand, pod, name, nodes[name]) for name in candidates]
            ranking = tuple(rank[2] for rank in sorted(rank for rank in ranks if rank is not None))
            self._built.rankings[key] = ranking
        return ranking

    def _misfit(self, demand: _Demand, pod: Pod, name: str, state: _NodeState) -> str | None:
        """Why the pod cannot go on the node now, or None: cordon, then static rules, then capacity."""
        if name in self._cordoned:
            return "node is cordoned for draining"
        return _static_misfit(pod, state.node) or _shortfall(demand, state)

    # ----------------------------------------------------------------------- changes

    def cordon(self, node: str) -> None:
        """No further placements onto the node (it is being drained); what it holds stays accounted."""
        self._cordoned.add(node)

    def place(self, pod: Pod, node: str) -> None:
        """Reserve the pod on the node, moving it there if it is accounted elsewhere.

        Raises ValueError, changing nothing, when it does not fit.
        """
        previous = self._release(pod.key)
        demand = _demand_of(pod)
        state = self._nodes.get(node)
        reason = f"node {node} not found" if state is None else self._misfit(demand, pod, node, state)
        if reason is not None:
            if previous is not None:
                self._take(pod.key, *previous)
            raise ValueError(f"cannot place {pod.ref} on {node}: {reason}")
        self._reserve(pod.key, node, demand)

    def remove(self, pod: Pod) -> None:
        """Free what the pod holds on the node it is accounted on; nothing when it is not accounted."""
        self._release(pod.key)

    def place_all(self, pods: Sequence[Pod], *, exclude: Collection[str] = ()) -> dict[PodKey, str] | None:
        """Place every pod, all or nothing, each on its best node; the pods' current holdings are
        released first (as when a whole group is evicted). Largest GPU request first, then larger cpu.

        Returns pod key -> node, or None with the state left exactly as it was.
        """
        trial = self._fork()
        targets = trial._place_group(pods, frozenset(exclude))
        if targets is not None:
            self._adopt(trial)
        return targets

    def _place_group(self, pods: Iterable[Pod], excluded: frozenset[str]) -> dict[PodKey, str] | None:
        demands = [(_demand_of(pod), pod) for pod in pods]
        if len({pod.key for _, pod in demands}) != len(demands):
            raise ValueError("place_all: a pod is listed more than once")
        for _, pod in demands:
            self._release(pod.key)
        demands.sort(key=lambda item: (-item[0].gpu_total_milli, -item[0].cpu, item[1].key))
        targets: dict[PodKey, str] = {}
        for demand, pod in demands:
            node = self._best_node(demand, pod, excluded)
            if node is None:
                return None
            self._reserve(pod.key, node, demand)
            targets[pod.key] = node
        return targets

    def _reserve(self, key: PodKey, node: str, demand: _Demand) -> None:
        """Account a pod that fits on the node, on its best-fit devices."""
        state = self._writable(node)
        devices: tuple[int, ...] = ()
        if demand.gpu_count:
            chosen = best_fit_devices(state.devices, demand.gpu_count, demand.gpu_milli)
            if chosen is None:  # the fit check has seen these devices: this is a bug, not a misfit
                raise AssertionError(f"no devices on {node} for {key} after a successful fit")
            devices = chosen
        self._take(key, node, _Holding(demand, devices))

    def _take(self, key: PodKey, node: str, holding: _Holding) -> None:
        self._writable(node).take(key, holding)
        self._locate(key, node)

    def _release(self, key: PodKey) -> tuple[str, _Holding] | None:
        node = self.node_of(key)
        if node is None:
            return None
        holding = self._writable(node).give_back(key)
        self._locate(key, None)
        return node, holding

    def _locate(self, key: PodKey, node: str | None) -> None:
        if self._built.home.get(key) == node:
            self._moves.pop(key, None)
        else:
            self._moves[key] = node
