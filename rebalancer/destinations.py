"""Where a proposal's pods land: the simulation behind the planner's `no-fit` guard.

Owns `land()`: on a copy of the cycle's simulated cluster, the proposal's pods are removed, a drained
node is cordoned, and each pod, in `landing_order` (in a drain, pods on other nodes, the room made on
peers, first; then largest GPU request first, the order the strategies place a group in), goes to its
predicted target. That order is also the order the pods are evicted in (`Decision.order`), since
kube-scheduler queues replacements of equal priority first in, first out. Just before placing each
pod it notes the nodes tied with where the pod goes (`Landed.tied`: kube-scheduler picks among equal
top scores at random), so where the replacement lands can be judged.

In a node drain (its targets are the packed scheduler's plain choice, not a choice the scheduler makes
under constraints placement does not model, such as topology spread or gang packing), a pod with
destination rules (`Proposal.destinations`) whose target still has room but is no longer the packed
scheduler's choice (the strategy assumed other nodes of the cycle drained that are not, or earlier
pods of the cycle changed the scores) goes where the scheduler puts it, one of the top-scored nodes,
when its rules admit one; else the proposal misfits, naming the scheduler's choice and the rule it
breaks, since the scheduler does not know the rules. A pod whose target can no longer take it (an
earlier approved proposal of the cycle used the room), and every pod without a target, then goes, in
the same order, to the packed scheduler's best node (`placement.ClusterState.best_node`) among the
nodes that meet every rule its strategy carried on the proposal, never the drained node. A pod with a
target but no rules is not re-placed: its strategy said nothing about where else it may go. When no
node remains, the misfit names the pod and the rule that left no node.

This module must stay pure: no I/O, no clock, and it never mutates the Snapshot, the proposal or the
state it is given (it works on a copy). Guards, budgets and the order of proposals are the planner's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rebalancer.model import GPU_RESOURCE, MILLI_PER_GPU, DestinationRule, Pod, Proposal, Snapshot
from rebalancer.placement import ClusterState

PodKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Landed:
    """The simulation with every pod of the proposal placed, and where each one goes."""

    state: ClusterState
    targets: dict[PodKey, str]
    # One line per pod sent elsewhere than its predicted target, for the decision's reason.
    replaced: tuple[str, ...] = ()
    # The pods in the order they were placed (`landing_order`, re-placed pods last): the eviction order.
    order: tuple[PodKey, ...] = ()
    # Per pod, the nodes tied with where it went as the packed scheduler saw the simulation just before
    # placing it (the target alone when it was not a top-scored node): kube-scheduler may pick any.
    tied: dict[PodKey, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Misfit:
    """The pod that cannot land anywhere the proposal allows, and why."""

    pod: Pod
    reason: str


def placement_order(pod: Pod) -> tuple[int, int, str, str]:
    """Largest GPU request first, then larger cpu, then by key: the order of `ClusterState.place_all`."""
    if pod.gpu.count > 0:
        gpu_milli = pod.gpu.count * pod.gpu.milli_per_device
    else:
        gpu_milli = pod.requests.get(GPU_RESOURCE, 0) * MILLI_PER_GPU
    return (-gpu_milli, -pod.requests.get("cpu", 0), pod.namespace, pod.name)


def landing_order(pods: Sequence[Pod], drained: str | None) -> list[Pod]:
    """The order `land` places a proposal's pods in, and so the order they are evicted in: in a drain,
    the pods on other nodes first (room made on peers, gang members elsewhere), so the room exists
    before the drained node's pods need it; within each part, `placement_order`."""
    return sorted(
        pods, key=lambda pod: (drained is not None and pod.node_name == drained, placement_order(pod))
    )


def land(
    proposal: Proposal, pods: Sequence[Pod], snapshot: Snapshot, state: ClusterState, drained: str | None
) -> Landed | Misfit:
    """Place `pods` (the proposal's pods still to approve) on a copy of `state`, as the module says."""
    sim = state.copy()
    for pod in pods:
        sim.remove(pod)
    if drained is not None and drained in snapshot.nodes:
        sim.cordon(drained)
    placed: dict[PodKey, str] = {}
    tied: dict[PodKey, frozenset[str]] = {}
    missed: dict[PodKey, tuple[str, str]] = {}  # pod -> its predicted target and why it cannot go there
    replaced: list[str] = []

    def put(pod: Pod, node: str) -> None:
        prediction = sim.best_nodes(pod)
        accepted = prediction is not None and prediction.accepts(node)
        tied[pod.key] = prediction.tied if prediction is not None and accepted else frozenset({node})
        sim.place(pod, node)
        placed[pod.key] = node

    anywhere = _excluded((), snapshot, drained)
    ordered = landing_order(pods, drained)
    for pod in ordered:
        target = proposal.targets.get(pod.key)
        if target is None:
            continue
        if target not in snapshot.nodes:
            return Misfit(pod, f"its predicted target node {target} is not in the snapshot")
        if target == drained:
            return Misfit(pod, f"its predicted target node {target} is the node being drained")
        fit = sim.fits(pod, target)
        assumed = proposal.destinations.get(pod.key)
        if fit.ok and assumed is not None and drained is not None:
            choice = sim.best_nodes(pod, exclude=anywhere)
            if choice is not None and not choice.accepts(target):
                # The packed scheduler prefers other nodes now (the strategy assumed nodes of this
                # cycle drained that are not): the pod lands on one of them, if its rules admit one.
                admitted = choice.tied - _excluded(assumed, snapshot, drained)
                if not admitted:
                    return Misfit(pod, _preferred(choice.chosen, target, assumed, choice.tied, snapshot))
                preferred = min(admitted)
                put(pod, preferred)
                replaced.append(
                    f"{pod.ref} re-placed on {preferred}: the packed scheduler prefers it to its predicted "
                    f"target node {target}"
                )
                continue
        if fit.ok:
            put(pod, target)
        elif pod.key in proposal.destinations:
            missed[pod.key] = (target, fit.reason)
        else:
            return Misfit(pod, f"its predicted target node {target} cannot take it: {fit.reason}")
    for pod in (pod for pod in ordered if pod.key not in placed):
        rules = proposal.destinations.get(pod.key, ())
        best = sim.best_node(pod, exclude=_excluded(rules, snapshot, drained))
        miss = missed.get(pod.key)
        if best is None:
            return Misfit(pod, _nowhere(sim, pod, rules, snapshot=snapshot, drained=drained, miss=miss))
        put(pod, best)
        if miss is not None:
            replaced.append(
                f"{pod.ref} re-placed on {best}: its predicted target node {miss[0]} cannot take it any "
                f"more ({miss[1]})"
            )
    return Landed(sim, {pod.key: placed[pod.key] for pod in pods}, tuple(replaced), tuple(placed), tied)


def _excluded(rules: Sequence[DestinationRule], snapshot: Snapshot, drained: str | None) -> set[str]:
    """The nodes the pod may not go to: the drained node and every node some rule does not admit."""
    excluded = {drained} if drained is not None else set()
    for rule in rules:
        if rule.outside:
            excluded |= rule.nodes
        else:
            excluded.update(name for name in snapshot.nodes if name not in rule.nodes)
    return excluded


def _preferred(
    chosen: str, target: str, rules: Sequence[DestinationRule], tied: frozenset[str], snapshot: Snapshot
) -> str:
    """Why a pod that fits its predicted target still cannot land as the proposal assumed: the packed
    scheduler prefers `tied`, and the first rule (in order) that admits none of them."""
    failed = next(
        (rule for index, rule in enumerate(rules) if tied <= _excluded(rules[: index + 1], snapshot, None)),
        rules[-1] if rules else None,
    )
    text = f"the packed scheduler would put it on node {chosen}, not on its predicted target node {target}"
    return text if failed is None else f"{text}, and that node is not one {failed.text}"


def _nowhere(
    sim: ClusterState,
    pod: Pod,
    rules: Sequence[DestinationRule],
    *,
    snapshot: Snapshot,
    drained: str | None,
    miss: tuple[str, str] | None,
) -> str:
    """Why no node takes the pod: the rules in order up to the first one that leaves no node with room
    (none at all when no node but the drained one has room)."""
    named: Sequence[DestinationRule] = ()
    if sim.best_node(pod, exclude=_excluded((), snapshot, drained)) is not None:
        for index in range(len(rules)):
            if sim.best_node(pod, exclude=_excluded(rules[: index + 1], snapshot, drained)) is None:
                named = rules[: index + 1]
                break
    words = [rule.text for rule in named]
    if drained is not None:
        words.append(f"other than the drained node {drained}")
    where = " ".join(words) or "in the cluster"
    text = f"no node {where} can take it"
    if miss is None:
        return text
    return f"its predicted target node {miss[0]} cannot take it ({miss[1]}), and {text}"
