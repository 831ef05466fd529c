"""Node sizes in `gpu-consolidation`: where a drain's pods may land by GPUs per node, and room on peers.

Node sizes (GPUs per node) matter where GPU models are mixed: pods that may run on any model fill the
small nodes of a scarce model first (MostAllocated prefers the node that is fullest after placement),
and the pods that can run nowhere else then need new small nodes. Two options keep the moves monotone
in size: with `move_to_smaller_nodes: false` no drain puts a pod on a node with fewer GPUs than the
one it leaves, and with `drain_onto_larger_nodes: true` a node at or above `max_allocated_percent`
is still drained when part of its pods go to nodes with more GPUs and the rest fill no more GPUs on
nodes of its own size than it leaves free. A pod moved that way only ever climbs in size, and such a
drain takes no more free room on nodes of its size than it gives up, so it does not ping-pong the way
a higher `max_allocated_percent` does (nodes drained onto peers, then needed again). When the pods
bound to its size would take more than that, `peer_pods_to_make_room: N` lets the same proposal lift
up to N pods of its peers (same GPU model and size) onto larger nodes to make the room: the node
frees, its bound pods take the peers' room, and pods that may run anywhere climb out of the scarce
pool. Those pods come first in the proposal, so the room exists before the drain's pods need it.

Owns those size rules (`size_rules_allow`), judged on where the packed scheduler would put the pods
(they never steer it), the room-making (`with_room_made`), and the rules any other destination of a
drain's pods must meet should an earlier proposal of the cycle fill the predicted one
(`destination_rules`: the size rules pod by pod, and no node the drain frees). Also the `Run` the
candidates of one run share.

This module must stay pure: no I/O, no clock, no cluster or Prometheus clients. It must not choose
which candidate to drain nor emit findings (the entry module does).
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import TYPE_CHECKING

from rebalancer.memo import MISSING, ObjectMemo
from rebalancer.model import DestinationRule, Node, Pod, Snapshot
from rebalancer.placement import ClusterState
from rebalancer.registry import StrategyContext
from rebalancer.selectors import node_selector_matches, required_affinity_matches, untolerated_taints
from strategies.gpu_consolidation_accounting import format_gpus, largest_first, node_capacity_gpus, pod_gpus
from strategies.gpu_consolidation_candidates import Candidate

if TYPE_CHECKING:
    from strategies.gpu_consolidation import GpuConsolidationArgs

__all__ = [
    "Landing",
    "Run",
    "Sizes",
    "destination_rules",
    "landing_of",
    "may_drain_upward",
    "size_rules_allow",
    "sizes_of",
    "with_room_made",
]

PodKey = tuple[str, str]

# Float sums of GPU shares and MIG slices are compared with this slack.
_EPSILON = 1e-9


class Sizes:
    """GPUs per node (GPU-equivalents, as candidates count them), and which pods could ever run on a
    node larger than a given size, answered per kind of constraints (pods with equal required affinity,
    nodeSelector and tolerations get the same answer). Depends on the snapshot's nodes alone:
    `sizes_of` hands the same Sizes to the next snapshot when its nodes are the same objects, and a
    Sizes made after another one (`previous`) takes over what it found, judging again only what the
    new and changed nodes could change."""

    def __init__(self, nodes: Mapping[str, Node], previous: Sizes | None = None) -> None:
        self._nodes = nodes
        self._generation = next(_GENERATIONS)
        self._of: dict[str, float] = {}
        # Per kind of pod and size: a node admitting it (None: none does).
        self._larger: dict[tuple[_Constraints, float], str | None] = {}
        self._by_size: dict[tuple[float, bool], frozenset[str]] = {}
        self._larger_nodes: dict[float, tuple[tuple[str, Node], ...]] = {}
        # Since `previous`: the nodes new or changed (`fresh`), and those changed or gone (`gone`).
        self._previous = previous
        self._fresh: frozenset[str] = frozenset()
        self._gone: frozenset[str] = frozenset()
        if previous is not None:
            before = previous._nodes
            self._fresh = frozenset(name for name, node in nodes.items() if before.get(name) is not node)
            self._gone = self._fresh | (before.keys() - nodes.keys())
            previous._previous = None  # what it took over is its own now: let the one before it go

    @property
    def generation(self) -> int:
        """Tells this Sizes from every other one made in the process."""
        return self._generation

    def of(self, node: str) -> float:
        size = self._of.get(node)
        if size is None:
            previous = self._previous
            if previous is not None and node in self._nodes and node not in self._fresh:
                size = previous._of.get(node)
            if size is None:
                size = node_capacity_gpus(self._nodes[node])
            self._of[node] = size
        return size

    def at_least(self, size: float) -> frozenset[str]:
        """The nodes with at least `size` GPUs (cached)."""
        return self._nodes_by_size(size, larger_only=False)

    def more_than(self, size: float) -> frozenset[str]:
        """The nodes with more than `size` GPUs (cached)."""
        return self._nodes_by_size(size, larger_only=True)

    def _nodes_by_size(self, size: float, *, larger_only: bool) -> frozenset[str]:
        key = (size, larger_only)
        nodes = self._by_size.get(key)
        if nodes is None:
            low = size + _EPSILON if larger_only else size - _EPSILON
            nodes = frozenset(name for name in self._nodes if self.of(name) > low)
            self._by_size[key] = nodes
        return nodes

    def _larger_than(self, name: str, node: Node, size: float) -> bool:
        return node.is_gpu_node and not node.unschedulable and self.of(name) > size

    def _schedulable_larger(self, size: float) -> tuple[tuple[str, Node], ...]:
        """The schedulable GPU nodes with more GPUs than `size` (cached)."""
        nodes = self._larger_nodes.get(size)
        if nodes is None:
            nodes = tuple(
                (name, node) for name, node in self._nodes.items() if self._larger_than(name, node, size)
            )
            self._larger_nodes[size] = nodes
        return nodes

    def could_go_larger(self, pod: Pod, size: float) -> bool:
        """Whether a schedulable node with more GPUs than `size` admits the pod by its labels, affinity
        and taints (what is free aside). A necessary condition for a placement there, nothing more."""
        return self._could_go_larger(_CLASS(pod), pod, size)

    def _could_go_larger(self, kind: _Constraints, pod: Pod, size: float) -> bool:
        """`could_go_larger` for a pod of that kind (every pod of a kind gets the same answer)."""
        key = (kind, size)
        witness = self._larger.get(key, MISSING)
        if witness is MISSING:
            witness = self._witness(pod, key, size)
            self._larger[key] = witness
        return witness is not None

    def _witness(self, pod: Pod, key: tuple[_Constraints, float], size: float) -> str | None:
        """A node that admits pods of the kind of `pod`: the previous Sizes' when that node did not
        change, none when it found none and no node that is new or changed admits them, else any."""
        previous = self._previous
        before = previous._larger.get(key, MISSING) if previous is not None else MISSING
        if before is None:
            nodes = self._nodes
            fresh = (
                (name, nodes[name]) for name in self._fresh if self._larger_than(name, nodes[name], size)
            )
            return _admitting(pod, fresh)
        if isinstance(before, str) and before not in self._gone:
            return before
        return _admitting(pod, self._schedulable_larger(size))


def _admitting(pod: Pod, nodes: Iterable[tuple[str, Node]]) -> str | None:
    """The first of `nodes` whose labels, affinity and taints admit the pod, or None."""
    for name, node in nodes:
        if (
            required_affinity_matches(pod, node)
            and node_selector_matches(pod, node)
            and not untolerated_taints(pod, node)
        ):
            return name
    return None


class _Constraints:
    """Stands for one set of pod constraints that `could_go_larger` reads (required node affinity,
    nodeSelector, tolerations): pods with equal ones share it, for as long as any of them lives."""

    __slots__ = ("__weakref__",)


_KINDS: weakref.WeakValueDictionary[tuple[object, ...], _Constraints] = weakref.WeakValueDictionary()


def _constraints_of(pod: Pod) -> _Constraints:
    key = (pod.required_affinity, tuple(sorted(pod.node_selector.items())), pod.tolerations)
    kind = _KINDS.get(key)
    if kind is None:
        kind = _Constraints()
        _KINDS[key] = kind
    return kind


_GENERATIONS = count()
# Per pod object: its kind of constraints.
_CLASS: ObjectMemo[Pod, _Constraints] = ObjectMemo(_constraints_of)


def _kinds(candidate: Candidate) -> tuple[tuple[_Constraints, Pod], ...]:
    """One pod of each kind of constraints among the candidate's pods, in their order."""
    first: dict[_Constraints, Pod] = {}
    for pod in candidate.pods:
        first.setdefault(_CLASS(pod), pod)
    return tuple(first.items())


# Per Candidate object: one pod of each kind among its pods.
_KINDS_OF: ObjectMemo[Candidate, tuple[tuple[_Constraints, Pod], ...]] = ObjectMemo(_kinds)


class _LastSizes:
    """The Sizes handed out last, for the next snapshot (the same one when its nodes are the same)."""

    __slots__ = ("sizes",)

    def __init__(self) -> None:
        self.sizes: Sizes | None = None


_LAST_SIZES = _LastSizes()


def sizes_of(snapshot: Snapshot) -> Sizes:
    """The Sizes of the snapshot's nodes: the last one handed out when its nodes are the same objects,
    else one made from it."""
    last = _LAST_SIZES.sizes
    nodes = snapshot.nodes
    if last is not None and len(last._nodes) == len(nodes):
        before = last._nodes
        if all(before.get(name) is node for name, node in nodes.items()):
            return last
    sizes = Sizes(nodes, last)
    _LAST_SIZES.sizes = sizes
    return sizes


@dataclass(frozen=True, slots=True)
class Run:
    """What one run of the strategy shares between its candidates."""

    snapshot: Snapshot
    args: GpuConsolidationArgs
    ctx: StrategyContext
    sizes: Sizes
    moved: set[PodKey] = field(default_factory=set)  # pods already in a proposal of this run
    done: set[str] = field(default_factory=set)  # nodes freed in this run
    # Per (GPU model, size): `_peers`.
    peers: dict[tuple[str | None, float], tuple[tuple[str, tuple[Pod, ...]], ...]] = field(
        default_factory=dict
    )


def may_drain_upward(candidate: Candidate, sizes: Sizes, args: GpuConsolidationArgs) -> bool:
    """Cheap necessary condition for a node at or above the threshold: some pod could go to a larger
    node, and the pods that cannot fit in the GPUs the node leaves free (unless room may be made on
    its peers). Kept per Candidate object while the Sizes and the arguments are the same."""
    kept = _UPWARD.get(candidate)
    if kept is not MISSING and kept[0] == sizes.generation and kept[1] is args:
        return kept[2]
    upward = _may_drain_upward(candidate, sizes, args)
    _UPWARD.put(candidate, (sizes.generation, args, upward))
    return upward


_UPWARD: ObjectMemo[Candidate, tuple[int, GpuConsolidationArgs, bool]] = ObjectMemo()


def _may_drain_upward(candidate: Candidate, sizes: Sizes, args: GpuConsolidationArgs) -> bool:
    if args.peer_pods_to_make_room > 0:  # room may be made: any pod that could go larger will do
        size = candidate.capacity
        return any(sizes._could_go_larger(kind, pod, size) for kind, pod in _KINDS_OF(candidate))
    free = candidate.capacity - candidate.allocated
    stuck = 0.0
    lifts = False
    for pod in candidate.pods:
        if sizes.could_go_larger(pod, candidate.capacity):
            lifts = True
        else:
            stuck += pod_gpus(pod, candidate.node.gpu_model)
    return lifts and (args.peer_pods_to_make_room > 0 or stuck <= free + _EPSILON)


@dataclass(frozen=True, slots=True)
class Landing:
    """Where a drain's pods land, by the size of their destination against the drained node's."""

    lifted: float = 0.0  # GPUs onto nodes with more GPUs
    same: float = 0.0  # GPUs onto nodes of the same size
    lifts: bool = False  # some pod goes to a node with more GPUs
    smaller: bool = False  # some pod goes to a node with fewer GPUs


def landing_of(candidate: Candidate, targets: Mapping[PodKey, str], sizes: Sizes) -> Landing:
    model = candidate.node.gpu_model
    lifted = same = 0.0
    lifts = smaller = False
    for pod in candidate.pods:
        size = sizes.of(targets[pod.key])
        if size > candidate.capacity:
            lifted += pod_gpus(pod, model)
            lifts = True
        elif size < candidate.capacity:
            smaller = True
        else:
            same += pod_gpus(pod, model)
    return Landing(lifted=lifted, same=same, lifts=lifts, smaller=smaller)


def size_rules_allow(
    candidate: Candidate, landing: Landing, args: GpuConsolidationArgs, room_made: float = 0.0
) -> bool:
    """The size rules: no pod onto a smaller node (when not allowed, and never from a node at or above
    the threshold); for a node at or above the threshold, also some pod onto a larger node, and no more
    GPUs onto nodes of its own size than it leaves free plus the room made there on its peers."""
    if landing.smaller and (candidate.needs_larger or not args.move_to_smaller_nodes):
        return False
    if not candidate.needs_larger:
        return True
    free = candidate.capacity - candidate.allocated + room_made
    return landing.lifts and landing.same <= free + _EPSILON


def destination_rules(
    candidate: Candidate,
    targets: Mapping[PodKey, str],
    makers: Sequence[Pod],
    freed: Sequence[str],
    run: Run,
) -> dict[PodKey, tuple[DestinationRule, ...]]:
    """What this drain assumed of each pod's destination, should its predicted target fill up first:
    not another node it frees, and the size rules (`size_rules_allow`) pod by pod: a pod lifted onto
    a larger node (a room maker, or a pod of a node at or above the threshold) stays on a larger node,
    and no pod goes to a smaller node where smaller nodes are ruled out."""
    common: list[DestinationRule] = []
    if len(freed) > 1:
        others = f"{'node' if len(freed) == 2 else 'nodes'} {', '.join(freed[1:])}"
        common.append(
            DestinationRule(f"other than {others}, freed with it", frozenset(freed[1:]), outside=True)
        )
    size, sizes = candidate.capacity, run.sizes

    def larger() -> DestinationRule:
        return DestinationRule(
            f"with more than {format_gpus(size)} GPUs (moved up a size)", sizes.more_than(size)
        )

    def no_smaller() -> DestinationRule:
        return DestinationRule(
            f"with at least {format_gpus(size)} GPUs (no smaller nodes)", sizes.at_least(size)
        )

    rules: dict[PodKey, tuple[DestinationRule, ...]] = {}
    for pod in makers:
        rules[pod.key] = (*common, larger())
    for pod in candidate.pods:
        if candidate.needs_larger and sizes.of(targets[pod.key]) > size + _EPSILON:
            rules[pod.key] = (*common, larger())
        elif candidate.needs_larger or not run.args.move_to_smaller_nodes:
            rules[pod.key] = (*common, no_smaller())
        else:
            rules[pod.key] = tuple(common)
    return rules


def _peers(run: Run, model: str | None, size: float) -> tuple[tuple[str, tuple[Pod, ...]], ...]:
    """The schedulable nodes of the GPU model and size, in snapshot order, each with its pods that could
    ever make room: placed by a packed scheduler, no DaemonSet or static pod, in no gang, holding GPUs
    (the same for every candidate of the run: cached)."""
    found = run.peers.get((model, size))
    if found is None:
        packed = set(run.args.packed_schedulers)
        found = tuple(
            (
                name,
                tuple(
                    pod
                    for pod in run.snapshot.pods_on(name)
                    if not pod.is_daemonset
                    and not pod.is_mirror
                    and pod.gang is None
                    and pod.scheduler_name in packed
                    and pod_gpus(pod, model) > 0
                ),
            )
            for name, node in run.snapshot.nodes.items()
            if not node.unschedulable and node.gpu_model == model and run.sizes.of(name) == size
        )
        run.peers[(model, size)] = found
    return found


def _room_makers(candidate: Candidate, run: Run) -> list[Pod]:
    """Pods of the candidate's peers (schedulable nodes of its GPU model and size) that could run on a
    larger node and may be moved: placed by a packed scheduler, evictable and not held back by the
    history this cycle, in no gang, not yet moving."""
    size = candidate.capacity
    makers: list[Pod] = []
    for name, pods in _peers(run, candidate.node.gpu_model, size):
        if name == candidate.name or name in run.done:
            continue
        makers.extend(
            pod
            for pod in pods
            if pod.key not in run.moved
            and run.sizes.could_go_larger(pod, size)
            and run.ctx.refusal(pod) is None
            and run.ctx.first_held_back((pod,)) is None  # a held-back maker would sink the drain
        )
    return makers


def _fewest_covering(pods: Sequence[Pod], needed: float, model: str | None) -> list[Pod]:
    """Few pods holding at least `needed` GPUs (counted on GPU `model`): the smallest single pod that
    does, else the largest pods first; empty when all of them together hold less."""
    singles = [pod for pod in pods if pod_gpus(pod, model) >= needed - _EPSILON]
    if singles:
        return [min(singles, key=lambda p: (pod_gpus(p, model), p.key))]
    chosen: list[Pod] = []
    held = 0.0
    for pod in largest_first(pods, model):
        chosen.append(pod)
        held += pod_gpus(pod, model)
        if held >= needed - _EPSILON:
            return chosen
    return []


def with_room_made(
    candidate: Candidate, shortfall: float, state: ClusterState, exclude: Collection[str], run: Run
) -> tuple[ClusterState, list[Pod], dict[PodKey, str], Landing] | None:
    """The drain of a node at or above the threshold whose pods bound to its size lack `shortfall`
    GPUs of room on its peers, together with peer pods that the packed scheduler puts on larger nodes,
    enough of them to make that room; None when no such set of pods does it."""
    if shortfall <= _EPSILON:
        return None
    model = candidate.node.gpu_model  # the makers run on its peers: nodes of its model
    makers = _fewest_covering(_room_makers(candidate, run), shortfall, model)
    if not makers or len(makers) > run.args.peer_pods_to_make_room:
        return None
    trial = state.copy()
    targets = trial.place_all([*makers, *candidate.pods], exclude=exclude)
    if targets is None or any(run.sizes.of(targets[pod.key]) <= candidate.capacity for pod in makers):
        return None
    landing = landing_of(candidate, targets, run.sizes)
    room = sum(pod_gpus(pod, model) for pod in makers)
    if not size_rules_allow(candidate, landing, run.args, room_made=room):
        return None
    return trial, makers, targets, landing
