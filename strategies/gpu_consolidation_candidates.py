"""Candidates of `gpu-consolidation`: which GPU nodes could be drained, and in which order to try them.

Owns the node-level rules: a candidate is a schedulable GPU node, not opted out, older than
`min_node_age` (an unknown creation time counts as young), with pods to move, strictly less than
`max_allocated_percent` of its GPU capacity allocated (or at or above it with `drain_onto_larger_nodes`,
then drained only by lifting pods onto larger nodes) and, when `max_utilization_percent` is set, fresh
telemetry averaging strictly below it. What would move is every non-DaemonSet pod of the node plus every
member of a gang one of them belongs to, wherever that member runs. Candidates are tried fewest evictions
first (pods, then GPUs held), then the most expensive node, then the most GPUs. Also owns the static
blocks: a static pod, or a pod the per-pod guards would refuse (`StrategyContext.first_refusal`, asked
about the same tuple of a candidate's pods each time, so that its kept answer serves), means the node
can never be drained whole, which a `consolidation-blocked` finding says. Every GPU node that is
no candidate gets a `NotChosen` record saying which rule left it out.

This module must stay pure: no I/O, no clock (`snapshot.now` is the time), no cluster or Prometheus
clients. It must not simulate placements (the entry module does) nor apply PDBs, budgets or cooldowns
(the planner's).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final, NamedTuple

from rebalancer.guards import node_refusal
from rebalancer.memo import NodeMemo, ObjectMemo
from rebalancer.model import Finding, Node, NotChosen, Pod, Snapshot, TelemetryWindow
from rebalancer.policy import format_duration
from rebalancer.registry import StrategyContext
from strategies.gpu_consolidation_accounting import NAME, format_pct, node_capacity_gpus, pod_gpus
from strategies.gpu_consolidation_telemetry import node_utilisation

if TYPE_CHECKING:
    from strategies.gpu_consolidation import GpuConsolidationArgs

__all__ = [
    "BLOCKED_FINDING",
    "Candidate",
    "blocked",
    "has_mirror_pod",
    "node_candidate",
    "not_chosen",
    "order_of",
    "static_block",
]

BLOCKED_FINDING: Final = "consolidation-blocked"

PodKey = tuple[str, str]


# Weak references let what is derived from a candidate be kept per Candidate object (`rebalancer.memo`):
# a node's candidate is the same object from cycle to cycle while its node and pods are.
@dataclass(frozen=True, slots=True, weakref_slot=True)
class Candidate:
    """A node that passed the node-level rules, and everything its drain would move."""

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
        return sum(pod_gpus(pod, self.node.gpu_model) for pod in self.pods)

    def order(self) -> tuple[int, float, float, float, str]:
        """Fewest evictions (pods, then GPUs held) first, then the priciest node, then more GPUs."""
        return (len(self.pods), self.moved_gpus, -self.price, -self.capacity, self.name)


class _NodeFacts(NamedTuple):
    """What the node-level rules need of a node and its pods alone."""

    gpu: bool  # a GPU node: the only ones looked at
    record: NotChosen | None  # the record of a node that is no candidate whatever the time
    movable: tuple[Pod, ...]  # the non-DaemonSet pods
    capacity: float
    allocated: float  # GPU-equivalents of every pod on the node
    on_node: frozenset[PodKey]
    moving: tuple[Pod, ...]  # the movable pods by key, one per key
    in_gangs: bool  # some movable pod belongs to a gang: its members elsewhere move too
    # The last verdict on a node old enough, judged without telemetry or gangs, with the arguments and
    # the node's price it was judged with and the instant the node became old enough (at most one).
    judged: list[tuple[GpuConsolidationArgs, float, datetime, Candidate | NotChosen]]


def _record(node: Node) -> NotChosen | None:
    """The record of a node that is no candidate whatever the time, in the order the rules run."""
    name = node.name
    if node.unschedulable:
        return not_chosen(name, "cordoned", "not a candidate: the node is cordoned")
    refused = node_refusal(node)
    if refused is not None:
        return not_chosen(name, "opted-out", f"not a candidate: {refused.reason}")
    if node.created is None:
        return not_chosen(name, "too-young", "not a candidate: the node's creation time is unknown")
    return None


def _facts(node: Node, pods: tuple[Pod, ...]) -> _NodeFacts:
    movable = tuple(pod for pod in pods if not pod.is_daemonset)
    by_key = {(pod.namespace, pod.name): pod for pod in movable}  # one pod per key, the last
    return _NodeFacts(
        gpu=node.is_gpu_node,
        record=_record(node),
        movable=movable,
        capacity=node_capacity_gpus(node),
        allocated=sum(pod_gpus(pod, node.gpu_model) for pod in pods),
        on_node=frozenset(by_key),
        moving=tuple(by_key[key] for key in sorted(by_key)),
        in_gangs=any(pod.gang is not None for pod in movable),
        judged=[],
    )


# Kept from one snapshot to the next while the node and its pods are the same objects.
_FACTS: NodeMemo[_NodeFacts] = NodeMemo(_facts)


def not_chosen(node: str, code: str, reason: str) -> NotChosen:
    """The record that `node` is not drained this cycle, and why."""
    return NotChosen(strategy=NAME, node=node, code=code, reason=reason)


def node_candidate(
    node: Node,
    snapshot: Snapshot,
    args: GpuConsolidationArgs,
    ctx: StrategyContext,
    *,
    window: TelemetryWindow | None,
    findings: list[Finding],
) -> Candidate | NotChosen | None:
    """The node as a candidate when it passes the node-level rules (pods are judged later), else why
    not; None for a node without GPUs (not looked at). What depends on the node and its pods alone is
    kept while they are the same objects, and so is the verdict on a node old enough judged without
    telemetry and gangs (it depends on nothing else but the arguments and the node's price)."""
    facts = _FACTS(snapshot, node.name)
    if not facts.gpu:
        return None
    if facts.record is not None:
        return facts.record
    telemetry = window is not None and args.max_utilization_percent is not None
    judged = facts.judged
    if judged and not telemetry:
        kept_args, kept_price, old_from, verdict = judged[0]
        if (
            kept_args is args
            and snapshot.now >= old_from
            and kept_price == (ctx.price_per_gpu_hour(node.gpu_model) or 0.0)
        ):
            return verdict
    name = node.name
    created = node.created
    if created is None:  # `record` said so already; kept for the type checker
        return not_chosen(name, "too-young", "not a candidate: the node's creation time is unknown")
    if snapshot.now - created < timedelta(seconds=args.min_node_age):
        age = format_duration(max(0, int((snapshot.now - created).total_seconds())))
        return not_chosen(
            name,
            "too-young",
            f"not a candidate: the node is {age} old < min_node_age {format_duration(args.min_node_age)}",
        )
    verdict = _judged(node, facts, snapshot, args, ctx, window=window, findings=findings)
    if not telemetry and not facts.in_gangs:
        try:
            old_from = created + timedelta(seconds=args.min_node_age)
        except OverflowError:
            return verdict
        judged[:] = [(args, ctx.price_per_gpu_hour(node.gpu_model) or 0.0, old_from, verdict)]
    return verdict


def _judged(
    node: Node,
    facts: _NodeFacts,
    snapshot: Snapshot,
    args: GpuConsolidationArgs,
    ctx: StrategyContext,
    *,
    window: TelemetryWindow | None,
    findings: list[Finding],
) -> Candidate | NotChosen:
    """The rules that follow the node's age: pods to move, GPU capacity, the allocated share, then the
    utilisation when telemetry is to be read."""
    name = node.name
    movable = facts.movable
    if not movable:
        # Nothing to move: the node is already free for the autoscaler.
        return not_chosen(name, "nothing-to-move", "not a candidate: no pod to move (already free)")
    capacity = facts.capacity
    if capacity <= 0:
        return not_chosen(name, "no-gpu-capacity", "not a candidate: no allocatable GPU")
    allocated = facts.allocated
    share = allocated / capacity * 100
    needs_larger = share >= args.max_allocated_percent
    if needs_larger and not args.drain_onto_larger_nodes:
        return not_chosen(
            name,
            "allocated-above-threshold",
            f"not a candidate: {format_pct(share)} allocated >= threshold "
            f"{format_pct(args.max_allocated_percent)}",
        )
    utilisation: float | None = None
    if window is not None and args.max_utilization_percent is not None:
        measured = node_utilisation(node, window, args, snapshot)
        if isinstance(measured, Finding):
            findings.append(measured)
            return not_chosen(name, "telemetry-unusable", f"not a candidate: {measured.detail}")
        if measured >= args.max_utilization_percent:
            return not_chosen(
                name,
                "gpu-busy",
                f"not a candidate: GPUs average {format_pct(measured)} over "
                f"{format_duration(args.window)} >= threshold {format_pct(args.max_utilization_percent)}",
            )
        utilisation = measured
    pods = facts.moving
    if facts.in_gangs:
        moving: dict[PodKey, Pod] = {pod.key: pod for pod in movable}
        for pod in movable:
            if pod.gang is not None:
                for member in snapshot.gangs.get(pod.gang, ()):
                    moving.setdefault(member.key, member)
        pods = tuple(sorted(moving.values(), key=lambda p: p.key))
    price = ctx.price_per_gpu_hour(node.gpu_model) or 0.0
    return Candidate(
        node=node,
        allocated=allocated,
        capacity=capacity,
        utilisation=utilisation,
        pods=pods,
        on_node=facts.on_node,
        price=capacity * price,
        needs_larger=needs_larger,
    )


def static_block(candidate: Candidate, ctx: StrategyContext) -> Finding | None:
    """A finding when some pod to move (a gang member elsewhere included) may never be evicted."""
    mirror, before = _STATIC_SPLIT(candidate)
    found = ctx.first_refusal(before)
    if found is not None:
        pod, refusal = found
        return blocked(candidate, pod, f"may not be evicted ({refusal.guard}: {refusal.reason})")
    return None if mirror is None else blocked(candidate, candidate.pods[mirror], "is a static pod")


def has_mirror_pod(candidate: Candidate) -> bool:
    """Whether a static pod pins the node itself: it can never be freed (kept per Candidate object)."""
    return _PINNED(candidate)


_PINNED: ObjectMemo[Candidate, bool] = ObjectMemo(
    lambda candidate: any(pod.is_mirror and pod.key in candidate.on_node for pod in candidate.pods)
)


def _static_split(candidate: Candidate) -> tuple[int | None, tuple[Pod, ...]]:
    pods = candidate.pods
    mirror = next((i for i, pod in enumerate(pods) if pod.is_mirror), None)
    return mirror, pods if mirror is None else pods[:mirror]


# Per Candidate object: the position of its first static pod (None: it has none) and its pods before
# that one (all of them when none), the very tuple `static_block` asks the guards about every time (the
# static guards keep their answer per tuple of pods: a fresh slice each time would never be served).
_STATIC_SPLIT: ObjectMemo[Candidate, tuple[int | None, tuple[Pod, ...]]] = ObjectMemo(_static_split)


def order_of(candidate: Candidate) -> tuple[int, float, float, float, str]:
    """`Candidate.order`, kept per Candidate object."""
    return _ORDER(candidate)


_ORDER: ObjectMemo[Candidate, tuple[int, float, float, float, str]] = ObjectMemo(Candidate.order)


def blocked(candidate: Candidate, pod: Pod | None, why: str) -> Finding:
    """The finding that the under-used node cannot be drained because of `pod` (None: of its pods)."""
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
