"""The `gpu-consolidation` strategy: drain whole, lightly used GPU nodes so the autoscaler can remove them.

Owns the judgement "this GPU node can be emptied now": which nodes are candidates (allocated GPU
fraction, and DCGM utilisation when configured, below thresholds, with fresh telemetry of at least
`min_samples` utilisation samples on every GPU of the node; old enough; not opted out,
cordoned or static-pod pinned), in which order they are worth draining (fewest evictions first, then
the most expensive node), and a simulation, with `rebalancer.placement`, showing that *every* pod of
the node (plus every member of a gang it touches, wherever that member runs) can be re-placed at once
by a packed (MostAllocated) scheduler, with reservations carried across pods and across every node
drained in the same run, and never onto a node being drained. A node is proposed whole or not at
all; the proposal names each pod's predicted destination and the rules any other destination must
meet should an earlier proposal of the cycle fill that one (`_destinations`: the size rules below, and
no node the drain frees).

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

Better than the descheduler's HighNodeUtilization on every point: utilisation as well as requests,
one shared what-if cluster instead of a static picture (two evicted pods never both "fit" the same
free GPU), no half-drained nodes, gangs moved whole, per-device packing of GPU shares and MIG
instances (placement's job: nothing here sums GPUs as a fluid), and only pods a packed scheduler
will re-place are moved.

This module must stay pure: no I/O, no clock (`snapshot.now` is the time), no cluster or Prometheus
clients, no evictions. It consults the static per-pod guards through `StrategyContext.refusal` only to
avoid proposing nodes it could never drain whole; PDBs, budgets and cooldowns are the planner's.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import islice
from typing import Annotated, Self

from pydantic import Field, model_validator

from rebalancer.gpu_devices import gpu_device_count
from rebalancer.guards import node_refusal
from rebalancer.model import (
    MIG_RESOURCE_PREFIX,
    MILLI_PER_GPU,
    DestinationRule,
    Finding,
    GpuTelemetry,
    Node,
    Pod,
    Proposal,
    Snapshot,
    StrategyResult,
    TelemetryWindow,
)
from rebalancer.placement import ClusterState
from rebalancer.policy import Duration, Percent, format_duration
from rebalancer.registry import StrategyArgs, StrategyContext, strategy
from rebalancer.selectors import node_selector_matches, required_affinity_matches, untolerated_taints
from rebalancer.wording import plural

NAME = "gpu-consolidation"
BLOCKED_FINDING = "consolidation-blocked"
STALE_FINDING = "stale-telemetry"
# A MIG profile `<N>g.<memory>` holds N of a GPU's (usually 7) compute slices.
MIG_SLICES_PER_GPU = 7
_MIG_PROFILE = re.compile(r"(\d+)g\.")

PodKey = tuple[str, str]


class GpuConsolidationArgs(StrategyArgs):
    """Arguments of `gpu-consolidation`. Durations accept `30s`, `5m`, `1h30m` or seconds."""

    # A node is a candidate when strictly less than this share of its GPU capacity is allocated
    # (shares count in milli-GPU, MIG instances by their compute slices).
    max_allocated_percent: Percent = 50.0
    # ... and its GPUs averaged strictly below this utilisation over `window`; null = allocation alone.
    max_utilization_percent: Percent | None = 30.0
    window: Annotated[Duration, Field(gt=0)] = 3600
    # Nodes younger than this (unknown creation time counts as young) are left to settle.
    min_node_age: Duration = 3600
    max_nodes_per_cycle: int = Field(default=3, ge=1)
    # Only pods placed by one of these scheduler profiles are moved: a spreading scheduler would
    # spread them out again.
    packed_schedulers: tuple[str, ...] = Field(default=("gpu-packed-scheduler",), min_length=1)
    # A GPU series whose newest sample is older than this (relative to the snapshot's now) is stale.
    max_telemetry_age: Annotated[Duration, Field(gt=0)] = 300
    # Fewer utilisation samples than this in the window, on any GPU of the node, is not enough evidence
    # to call the node under-used (as idle-gpu's min_samples).
    min_samples: int = Field(default=10, ge=1)
    # false: a drained node's pods never go to nodes with fewer GPUs than it (small GPU shapes, often
    # a scarce model, stay free for the pods that can run nowhere else).
    move_to_smaller_nodes: bool = False
    # true: a node at or above `max_allocated_percent` is drained too when the packed scheduler puts
    # part of its pods on nodes with more GPUs, none on smaller nodes, and the rest fill no more GPUs
    # on nodes of its own size than the node leaves free (the utilisation threshold still applies).
    drain_onto_larger_nodes: bool = True
    # With drain_onto_larger_nodes: when the pods of such a node that must stay on its size lack room
    # on its peers (same GPU model and size), the same proposal may also move up to this many peer
    # pods that the packed scheduler puts on nodes with more GPUs, to make that room (0: never).
    peer_pods_to_make_room: int = Field(default=1, ge=0)

    @model_validator(mode="after")
    def _room_needs_upward_drains(self) -> GpuConsolidationArgs:
        if self.peer_pods_to_make_room and not self.drain_onto_larger_nodes:
            raise ValueError("peer_pods_to_make_room needs drain_onto_larger_nodes: true")
        return self

    def telemetry_windows(self) -> frozenset[int]:
        return frozenset({self.window}) if self.max_utilization_percent is not None else frozenset()

    def needs_telemetry(self) -> bool:
        return self.max_utilization_percent is not None

    def without_telemetry(self) -> tuple[Self, str | None]:
        """Allocation alone: the utilisation threshold is treated as met, so the run drains at most what
        the live daemon would drain when every candidate's GPUs are below the threshold."""
        if self.max_utilization_percent is None:
            return self, None
        threshold = _pct(self.max_utilization_percent)
        return self.model_copy(update={"max_utilization_percent": None}), (
            f"max_utilization_percent {threshold} treated as met: nodes judged on allocated GPUs alone "
            f"(live, a node is drained only when its GPUs also average below {threshold})"
        )


# --------------------------------------------------------------------------- GPU accounting


def _mig_gpus(resource: str) -> float:
    """GPU-equivalents of one instance of a MIG resource (`nvidia.com/mig-3g.40gb` -> 3/7)."""
    match = _MIG_PROFILE.match(resource.removeprefix(MIG_RESOURCE_PREFIX))
    slices = int(match.group(1)) if match else 1
    return min(slices, MIG_SLICES_PER_GPU) / MIG_SLICES_PER_GPU


def _node_capacity_gpus(node: Node) -> float:
    """GPU-equivalents of a node: its devices (as placement counts them), or, on a MIG node, its
    whole GPUs plus its MIG instances by slices."""
    mig = node.mig_resources
    if not mig:
        return float(gpu_device_count(node))
    return node.gpu_count + sum(count * _mig_gpus(res) for res, count in mig.items())


def _pod_gpus(pod: Pod) -> float:
    """GPU-equivalents a pod holds: whole GPUs and shares from `pod.gpu`, MIG instances by slices."""
    mig = sum(
        count * _mig_gpus(res) for res, count in pod.requests.items() if res.startswith(MIG_RESOURCE_PREFIX)
    )
    if mig:
        return mig
    return pod.gpu.count * pod.gpu.milli_per_device / MILLI_PER_GPU


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _pct(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".") + "%"


# --------------------------------------------------------------------------- telemetry


def _device_util(rows: Sequence[GpuTelemetry]) -> dict[tuple[str, str | None], float]:
    """Average utilisation per device (GPU or MIG instance), weighting each series by its samples."""
    totals: dict[tuple[str, str | None], float] = defaultdict(float)
    weights: dict[tuple[str, str | None], float] = defaultdict(float)
    for row in rows:
        if row.util_avg_percent is None:
            continue
        weight = float(max(row.util_samples, 1))
        totals[(row.uuid, row.mig_instance)] += row.util_avg_percent * weight
        weights[(row.uuid, row.mig_instance)] += weight
    return {key: totals[key] / weights[key] for key in totals}


def _node_utilisation(
    node: Node, window: TelemetryWindow, args: GpuConsolidationArgs, snapshot: Snapshot
) -> float | Finding:
    """The node's average GPU utilisation over the window, or a stale-telemetry finding."""
    rows = window.by_node.get(node.name, ())
    span = format_duration(args.window)

    def stale(detail: str, gpu: str | None = None) -> Finding:
        return Finding(kind=STALE_FINDING, node=node.name, gpu=gpu, detail=f"{NAME}: {detail}")

    if not rows:
        return stale(f"no GPU telemetry for the node in the {span} window; not consolidated")
    max_age = timedelta(seconds=args.max_telemetry_age)
    for row in rows:
        if row.newest_sample is None or row.util_avg_percent is None:
            return stale(f"GPU {row.uuid} has no utilisation sample in the {span} window", row.uuid)
        age = snapshot.now - row.newest_sample
        if age > max_age:
            old = format_duration(max(0, int(age.total_seconds())))
            return stale(
                f"GPU {row.uuid}: newest sample is {old} old (max {format_duration(args.max_telemetry_age)})",
                row.uuid,
            )
        if row.util_samples < args.min_samples:
            return stale(
                f"GPU {row.uuid}: {row.util_samples} utilisation samples in the {span} window "
                f"(need {args.min_samples}); not consolidated",
                row.uuid,
            )
    per_device = _device_util(rows)
    devices = gpu_device_count(node)
    if not node.mig_resources and devices:
        covered = len({uuid for uuid, _ in per_device})
        if covered < devices:
            return stale(f"telemetry covers {covered} of the node's {devices} GPUs")
    return sum(per_device.values()) / len(per_device)


# --------------------------------------------------------------------------- candidates


@dataclass(frozen=True, slots=True)
class _Candidate:
    node: Node
    allocated: float  # GPU-equivalents allocated
    capacity: float
    utilisation: float | None
    pods: tuple[Pod, ...]  # everything that would move: the node's pods plus gang members elsewhere
    on_node: frozenset[PodKey]  # the node's own non-DaemonSet pods
    price: float  # hourly price of the whole node, 0 when unknown
    # At or above `max_allocated_percent`: drained only by lifting pods onto nodes with more GPUs.
    needs_larger: bool = False

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def moved_gpus(self) -> float:
        return sum(_pod_gpus(pod) for pod in self.pods)

    def order(self) -> tuple[int, float, float, float, str]:
        """Fewest evictions (pods, then GPUs held) first, then the priciest node, then more GPUs."""
        return (len(self.pods), self.moved_gpus, -self.price, -self.capacity, self.name)


def _node_candidate(
    node: Node,
    snapshot: Snapshot,
    args: GpuConsolidationArgs,
    ctx: StrategyContext,
    *,
    window: TelemetryWindow | None,
    findings: list[Finding],
) -> _Candidate | None:
    """The node as a candidate when it passes the node-level rules (pods are judged later)."""
    if not node.is_gpu_node or node.unschedulable or node_refusal(node) is not None:
        return None
    if node.created is None or snapshot.now - node.created < timedelta(seconds=args.min_node_age):
        return None
    movable = [pod for pod in snapshot.pods_on(node.name) if not pod.is_daemonset]
    if not movable:
        return None  # nothing to move: the node is already free for the autoscaler
    capacity = _node_capacity_gpus(node)
    if capacity <= 0:
        return None
    allocated = sum(_pod_gpus(pod) for pod in snapshot.pods_on(node.name))
    needs_larger = allocated / capacity * 100 >= args.max_allocated_percent
    if needs_larger and not args.drain_onto_larger_nodes:
        return None
    utilisation: float | None = None
    if window is not None and args.max_utilization_percent is not None:
        measured = _node_utilisation(node, window, args, snapshot)
        if isinstance(measured, Finding):
            findings.append(measured)
            return None
        if measured >= args.max_utilization_percent:
            return None
        utilisation = measured
    moving: dict[PodKey, Pod] = {pod.key: pod for pod in movable}
    for pod in movable:
        if pod.gang is not None:
            for member in snapshot.gangs.get(pod.gang, ()):
                moving.setdefault(member.key, member)
    price = ctx.price_per_gpu_hour(node.gpu_model) or 0.0
    return _Candidate(
        node=node,
        allocated=allocated,
        capacity=capacity,
        utilisation=utilisation,
        pods=tuple(sorted(moving.values(), key=lambda p: p.key)),
        on_node=frozenset(pod.key for pod in movable),
        price=capacity * price,
        needs_larger=needs_larger,
    )


def _static_block(candidate: _Candidate, ctx: StrategyContext) -> Finding | None:
    """A finding when some pod to move (a gang member elsewhere included) may never be evicted."""
    for pod in candidate.pods:
        if pod.is_mirror:
            return _blocked(candidate, pod, "is a static pod")
        refusal = ctx.refusal(pod)
        if refusal is not None:
            return _blocked(candidate, pod, f"may not be evicted ({refusal.guard}: {refusal.reason})")
    return None


def _has_mirror_pod(candidate: _Candidate) -> bool:
    return any(pod.is_mirror and pod.key in candidate.on_node for pod in candidate.pods)


def _blocked(candidate: _Candidate, pod: Pod | None, why: str) -> Finding:
    subject = f"{pod.ref} " if pod is not None else ""
    elsewhere = ""
    if pod is not None and pod.key not in candidate.on_node:
        elsewhere = f" (gang {pod.gang} member on {pod.node_name})"
    return Finding(
        kind=BLOCKED_FINDING,
        node=candidate.name,
        namespace=pod.namespace if pod is not None else None,
        pod=pod.name if pod is not None else None,
        detail=f"node {candidate.name} is under-used but {subject}{why}{elsewhere}",
    )


# --------------------------------------------------------------------------- node sizes


class _Sizes:
    """GPUs per node (GPU-equivalents, as candidates count them), and which pods could ever run on a
    node larger than a given size."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self._of: dict[str, float] = {}
        self._larger: dict[tuple[object, ...], bool] = {}
        self._by_size: dict[tuple[float, bool], frozenset[str]] = {}

    def of(self, node: str) -> float:
        size = self._of.get(node)
        if size is None:
            size = _node_capacity_gpus(self._snapshot.nodes[node])
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
            nodes = frozenset(name for name in self._snapshot.nodes if self.of(name) > low)
            self._by_size[key] = nodes
        return nodes

    def could_go_larger(self, pod: Pod, size: float) -> bool:
        """Whether a schedulable node with more GPUs than `size` admits the pod by its labels, affinity
        and taints (what is free aside). A necessary condition for a placement there, nothing more."""
        key = (pod.required_affinity, tuple(sorted(pod.node_selector.items())), pod.tolerations, size)
        known = self._larger.get(key)
        if known is None:
            known = any(
                node.is_gpu_node
                and not node.unschedulable
                and self.of(name) > size
                and required_affinity_matches(pod, node)
                and node_selector_matches(pod, node)
                and not untolerated_taints(pod, node)
                for name, node in self._snapshot.nodes.items()
            )
            self._larger[key] = known
        return known


# Float sums of GPU shares and MIG slices are compared with this slack.
_EPSILON = 1e-9


def _may_drain_upward(candidate: _Candidate, sizes: _Sizes, args: GpuConsolidationArgs) -> bool:
    """Cheap necessary condition for a node at or above the threshold: some pod could go to a larger
    node, and the pods that cannot fit in the GPUs the node leaves free (unless room may be made on
    its peers)."""
    free = candidate.capacity - candidate.allocated
    stuck = 0.0
    lifts = False
    for pod in candidate.pods:
        if sizes.could_go_larger(pod, candidate.capacity):
            lifts = True
        else:
            stuck += _pod_gpus(pod)
    return lifts and (args.peer_pods_to_make_room > 0 or stuck <= free + _EPSILON)


@dataclass(frozen=True, slots=True)
class _Landing:
    """Where a drain's pods land, by the size of their destination against the drained node's."""

    lifted: float = 0.0  # GPUs onto nodes with more GPUs
    same: float = 0.0  # GPUs onto nodes of the same size
    lifts: bool = False  # some pod goes to a node with more GPUs
    smaller: bool = False  # some pod goes to a node with fewer GPUs


def _landing(candidate: _Candidate, targets: Mapping[PodKey, str], sizes: _Sizes) -> _Landing:
    lifted = same = 0.0
    lifts = smaller = False
    for pod in candidate.pods:
        size = sizes.of(targets[pod.key])
        if size > candidate.capacity:
            lifted += _pod_gpus(pod)
            lifts = True
        elif size < candidate.capacity:
            smaller = True
        else:
            same += _pod_gpus(pod)
    return _Landing(lifted=lifted, same=same, lifts=lifts, smaller=smaller)


def _size_rules_allow(
    candidate: _Candidate, landing: _Landing, args: GpuConsolidationArgs, room_made: float = 0.0
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


def _destinations(
    candidate: _Candidate,
    targets: Mapping[PodKey, str],
    makers: Sequence[Pod],
    freed: Sequence[str],
    run: _Run,
) -> dict[PodKey, tuple[DestinationRule, ...]]:
    """What this drain assumed of each pod's destination, should its predicted target fill up first:
    not another node it frees, and the size rules (`_size_rules_allow`) pod by pod: a pod lifted onto
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
        return DestinationRule(f"with more than {_num(size)} GPUs (moved up a size)", sizes.more_than(size))

    def no_smaller() -> DestinationRule:
        return DestinationRule(f"with at least {_num(size)} GPUs (no smaller nodes)", sizes.at_least(size))

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


def _room_makers(candidate: _Candidate, run: _Run) -> list[Pod]:
    """Pods of the candidate's peers (schedulable nodes of its GPU model and size) that could run on a
    larger node and may be moved: placed by a packed scheduler, evictable, in no gang, not yet moving."""
    packed = set(run.args.packed_schedulers)
    makers: list[Pod] = []
    for name, node in run.snapshot.nodes.items():
        if (
            name == candidate.name
            or name in run.done
            or node.unschedulable
            or node.gpu_model != candidate.node.gpu_model
            or run.sizes.of(name) != candidate.capacity
        ):
            continue
        makers.extend(
            pod
            for pod in run.snapshot.pods_on(name)
            if not pod.is_daemonset
            and not pod.is_mirror
            and pod.gang is None
            and pod.scheduler_name in packed
            and pod.key not in run.moved
            and _pod_gpus(pod) > 0
            and run.sizes.could_go_larger(pod, candidate.capacity)
            and run.ctx.refusal(pod) is None
        )
    return makers


def _fewest_covering(pods: Sequence[Pod], needed: float) -> list[Pod]:
    """Few pods holding at least `needed` GPUs: the smallest single pod that does, else the largest
    pods first; empty when all of them together hold less."""
    singles = [pod for pod in pods if _pod_gpus(pod) >= needed - _EPSILON]
    if singles:
        return [min(singles, key=lambda p: (_pod_gpus(p), p.key))]
    chosen: list[Pod] = []
    held = 0.0
    for pod in _largest_first(pods):
        chosen.append(pod)
        held += _pod_gpus(pod)
        if held >= needed - _EPSILON:
            return chosen
    return []


# --------------------------------------------------------------------------- simulation


def _largest_first(pods: Iterable[Pod]) -> list[Pod]:
    return sorted(pods, key=lambda p: (-_pod_gpus(p), p.key))


def _no_fit(candidate: _Candidate, trial: ClusterState, exclude: Collection[str]) -> Finding:
    """Name a pod that cannot be re-placed even alone, else say they cannot all fit at once."""
    for pod in _largest_first(candidate.pods):
        if trial.best_node(pod, exclude=exclude) is None:
            return _blocked(candidate, pod, "cannot be re-placed on any other node")
    return _blocked(
        candidate, None, f"its {plural(len(candidate.pods), 'pod')} cannot all be re-placed at once"
    )


def _reason(
    candidate: _Candidate,
    args: GpuConsolidationArgs,
    targets: Mapping[PodKey, str],
    lifted: float,
    room_makers: Sequence[Pod] = (),
) -> str:
    share = candidate.allocated / candidate.capacity * 100
    text = f"node {candidate.name}: {_num(candidate.allocated)}/{_num(candidate.capacity)} GPUs allocated "
    if candidate.needs_larger:
        text += (
            f"({_pct(share)} >= {_pct(args.max_allocated_percent)}), {_num(lifted)} of them onto nodes "
            "with more GPUs"
        )
    else:
        text += f"({_pct(share)} < {_pct(args.max_allocated_percent)})"
    if candidate.utilisation is not None:
        text += f", avg util {_pct(candidate.utilisation)} over {format_duration(args.window)}"
    elsewhere = len(candidate.pods) - len(candidate.on_node)
    extra = f" (incl. {plural(elsewhere, 'gang member')} on other nodes)" if elsewhere else ""
    destinations = ", ".join(sorted({targets[pod.key] for pod in candidate.pods}))
    text = f"{text}; {plural(len(candidate.pods), 'pod')}{extra} re-placed on {destinations}"
    if room_makers:
        peers = ", ".join(sorted({pod.node_name or "?" for pod in room_makers}))
        lifted_to = ", ".join(sorted({targets[pod.key] for pod in room_makers}))
        text += (
            f"; room made on {peers} by moving {plural(len(room_makers), 'pod')} "
            f"({_num(sum(_pod_gpus(pod) for pod in room_makers))} GPUs) to {lifted_to}"
        )
    return text


def _scheduler_hint(skipped: Mapping[PodKey, Pod], nodes: int, args: GpuConsolidationArgs) -> str:
    schedulers = ", ".join(sorted({pod.scheduler_name for pod in skipped.values()}))
    count = len(skipped)
    verb = "was" if count == 1 else "were"
    return (
        f"{plural(count, 'pod')} on {plural(nodes, 'candidate node')} {verb} placed by a non-packed "
        f"scheduler ({schedulers}); point them at {' or '.join(args.packed_schedulers)} to let them "
        "consolidate"
    )


@strategy(
    NAME,
    GpuConsolidationArgs,
    "Drain whole under-used GPU nodes when every pod can be re-placed at once by the packed scheduler",
)
def gpu_consolidation(snapshot: Snapshot, args: GpuConsolidationArgs, ctx: StrategyContext) -> StrategyResult:
    window: TelemetryWindow | None = None
    if args.max_utilization_percent is not None:
        window = snapshot.telemetry.window(args.window)
        if window is None:
            problem = (
                snapshot.telemetry.problem
                if not snapshot.telemetry.available and snapshot.telemetry.problem
                else f"no {format_duration(args.window)} window in the snapshot"
            )
            return StrategyResult(
                skipped=f"telemetry unavailable: {problem} "
                "(set max_utilization_percent: null to consolidate on allocation alone)"
            )

    findings: list[Finding] = []
    candidates: list[_Candidate] = []
    for name in sorted(snapshot.nodes):
        candidate = _node_candidate(
            snapshot.nodes[name], snapshot, args, ctx, window=window, findings=findings
        )
        if candidate is not None:
            candidates.append(candidate)

    # Pod-level rules: every pod to move must be evictable and placed by a packed scheduler.
    packed = set(args.packed_schedulers)
    non_packed: dict[PodKey, Pod] = {}
    non_packed_nodes = 0
    drainable: list[_Candidate] = []
    for candidate in candidates:
        if _has_mirror_pod(candidate):
            continue  # a static pod pins the node: it can never be freed
        block = _static_block(candidate, ctx)
        if block is not None:
            if not candidate.needs_larger:  # findings and hints are about under-used nodes
                findings.append(block)
            continue
        spreading = [pod for pod in candidate.pods if pod.scheduler_name not in packed]
        if spreading and candidate.needs_larger:
            continue
        if spreading:
            non_packed.update((pod.key, pod) for pod in spreading)
            non_packed_nodes += 1
            continue
        drainable.append(candidate)
    drainable.sort(key=_Candidate.order)

    proposals = _simulate(snapshot, args, ctx, drainable, findings)
    hints = (_scheduler_hint(non_packed, non_packed_nodes, args),) if non_packed else ()
    return StrategyResult(proposals=tuple(proposals), findings=tuple(findings), hints=hints)


@dataclass(frozen=True, slots=True)
class _Run:
    """What one run of the strategy shares between its candidates."""

    snapshot: Snapshot
    args: GpuConsolidationArgs
    ctx: StrategyContext
    sizes: _Sizes
    moved: set[PodKey] = field(default_factory=set)  # pods already in a proposal of this run
    done: set[str] = field(default_factory=set)  # nodes freed in this run


def _simulate(
    snapshot: Snapshot,
    args: GpuConsolidationArgs,
    ctx: StrategyContext,
    drainable: Sequence[_Candidate],
    findings: list[Finding],
) -> list[Proposal]:
    """Greedy in order over one shared what-if cluster; stop at `max_nodes_per_cycle` proposals.

    Nodes drained in this run are cordoned in the simulation. The candidates still to be tried that
    could be drained in this run (as many as the per-cycle cap leaves) are excluded as targets too, as
    long as the node's pods fit elsewhere; otherwise they may receive them, being earlier in the order
    is worth more. A candidate that received pods, or whose pods already move, is no longer drained.
    The size rules (`_size_rules_allow`) judge where the packed scheduler would put the pods; they never
    steer it. When only room on its peers is missing, `_with_room_made` may add peer pods to the drain.
    A node at or above the threshold that fails them is no finding: it is not under-used.
    """
    state = ClusterState.from_snapshot(snapshot)
    proposals: list[Proposal] = []
    run = _Run(snapshot, args, ctx, _Sizes(snapshot))
    moved, done, sizes = run.moved, run.done, run.sizes
    receivers: set[str] = set()  # nodes predicted to receive pods in this run
    # Nodes at or above the threshold that could never be drained are no upcoming drains either.
    drainable = [c for c in drainable if not c.needs_larger or _may_drain_upward(c, sizes, args)]
    by_name = {c.name: c for c in drainable}

    def viable(candidate: _Candidate) -> bool:
        return (
            candidate.name not in receivers
            and candidate.name not in done
            and not any(pod.key in moved for pod in candidate.pods)
        )

    for index, candidate in enumerate(drainable):
        room = args.max_nodes_per_cycle - len(proposals)
        if room <= 0:
            break
        if not viable(candidate):
            continue
        later = (c.name for c in drainable[index + 1 :] if viable(c))
        upcoming = list(islice(later, room - 1))
        exclude = {candidate.name, *upcoming}
        trial = state.copy()
        for pod in candidate.pods:
            trial.remove(pod)
        targets = trial.place_all(candidate.pods, exclude=exclude)
        if targets is None and upcoming:
            # Cheaper to drain this node onto later candidates than to drain neither of them.
            exclude = {candidate.name}
            targets = trial.place_all(candidate.pods, exclude=exclude)
        if targets is None:
            if not candidate.needs_larger:
                findings.append(_no_fit(candidate, trial, {candidate.name}))
            continue
        landing = _landing(candidate, targets, sizes)
        makers: list[Pod] = []
        if not _size_rules_allow(candidate, landing, args):
            made = None
            if (
                args.peer_pods_to_make_room
                and candidate.needs_larger
                and landing.lifts
                and not landing.smaller
            ):
                shortfall = landing.same - (candidate.capacity - candidate.allocated)
                made = _with_room_made(candidate, shortfall, state, exclude, run)
            if made is None:
                # A node at or above the threshold is not under-used: no finding for it.
                if not candidate.needs_larger:
                    findings.append(
                        _blocked(
                            candidate,
                            None,
                            "its pods would land on nodes with fewer GPUs (move_to_smaller_nodes)",
                        )
                    )
                continue
            trial, makers, targets, landing = made
        trial.cordon(candidate.name)
        moving = {pod.key for pod in (*makers, *candidate.pods)}
        landed = set(targets.values())
        freed = [candidate.name]
        # Nodes whose only pods were gang members moved along are freed too.
        for other in sorted({pod.node_name for pod in candidate.pods if pod.node_name is not None}):
            extra = by_name.get(other)
            if (
                extra is not None
                and other not in freed
                and other not in landed
                and extra.on_node <= moving
                and viable(extra)
            ):
                trial.cordon(other)
                freed.append(other)
        state = trial
        moved |= moving
        receivers |= landed
        done.update(freed)
        gangs = {pod.gang for pod in candidate.pods if pod.gang is not None}
        proposals.append(
            Proposal(
                strategy=NAME,
                kind="node",
                pods=(*makers, *candidate.pods),  # room first, then the drain
                reason=_reason(candidate, args, targets, landing.lifted, makers),
                priority=float(args.max_nodes_per_cycle - len(proposals)),
                node=candidate.name,
                group=next(iter(gangs)) if len(gangs) == 1 else None,
                targets=dict(targets),
                nodes_freed=tuple(freed),
                destinations=_destinations(candidate, targets, makers, freed, run),
            )
        )
    return proposals


def _with_room_made(
    candidate: _Candidate, shortfall: float, state: ClusterState, exclude: Collection[str], run: _Run
) -> tuple[ClusterState, list[Pod], dict[PodKey, str], _Landing] | None:
    """The drain of a node at or above the threshold whose pods bound to its size lack `shortfall`
    GPUs of room on its peers, together with peer pods that the packed scheduler puts on larger nodes,
    enough of them to make that room; None when no such set of pods does it."""
    if shortfall <= _EPSILON:
        return None
    makers = _fewest_covering(_room_makers(candidate, run), shortfall)
    if not makers or len(makers) > run.args.peer_pods_to_make_room:
        return None
    trial = state.copy()
    targets = trial.place_all([*makers, *candidate.pods], exclude=exclude)
    if targets is None or any(run.sizes.of(targets[pod.key]) <= candidate.capacity for pod in makers):
        return None
    landing = _landing(candidate, targets, run.sizes)
    room = sum(_pod_gpus(pod) for pod in makers)
    if not _size_rules_allow(candidate, landing, run.args, room_made=room):
        return None
    return trial, makers, targets, landing
