"""The `gpu-consolidation` strategy: drain whole, lightly used GPU nodes so the autoscaler can remove them.

Owns the judgement "this GPU node can be emptied now" and the search that makes it: the strategy's
arguments, the pod-level rules (every pod to move evictable and placed by a packed scheduler), and a
simulation, with `rebalancer.placement`, showing that *every* pod of a candidate node (plus every
member of a gang it touches, wherever that member runs) can be re-placed at once by a packed
(MostAllocated) scheduler, with reservations carried across pods and across every node drained in the
same run, and never onto a node being drained. A node is proposed whole or not at all; the proposal
names each pod's predicted destination and the rules any other destination must meet should an earlier
proposal of the cycle fill that one. Every GPU node it does not propose gets a `NotChosen` record
naming the rule that left it out (not a candidate, a pod that may not move, no room, the per-cycle
cap...). The parts it composes:

- `gpu_consolidation_accounting`: GPU-equivalents of nodes and pods (shares, MIG instances by slices);
- `gpu_consolidation_telemetry`: fresh and sufficient DCGM telemetry, and a node's utilisation;
- `gpu_consolidation_candidates`: which nodes are candidates (allocated GPU fraction, and utilisation
  when configured, below thresholds; old enough; not opted out, cordoned or static-pod pinned) and in
  which order they are worth draining (fewest evictions first, then the most expensive node);
- `gpu_consolidation_sizes`: the node-size rules (`move_to_smaller_nodes`, `drain_onto_larger_nodes`),
  the room made on peers (`peer_pods_to_make_room`) and each pod's destination rules.

Better than the descheduler's HighNodeUtilization on every point: utilisation as well as requests,
one shared what-if cluster instead of a static picture (two evicted pods never both "fit" the same
free GPU), no half-drained nodes, gangs moved whole, per-device packing of GPU shares and MIG
instances (placement's job: nothing here sums GPUs as a fluid), and only pods a packed scheduler
will re-place are moved.

This module must stay pure: no I/O, no clock (`snapshot.now` is the time), no cluster or Prometheus
clients, no evictions. It consults the static per-pod guards through `StrategyContext.first_refusal`
only to avoid proposing nodes it could never drain whole, and `StrategyContext.first_held_back` to
know which drains the history holds back this cycle (a workload's cooldown or disruption budget): such
a drain takes none of `max_nodes_per_cycle`'s turns and reserves no room, and is still proposed after
the cycle's drains (at most that many of them) for the planner to refuse and count. PDBs, budgets and
cooldowns are the planner's. Its parts must not import it but for the arguments' type (under
TYPE_CHECKING): it imports them all.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from itertools import islice
from typing import Annotated, Self

from pydantic import Field, model_validator

from rebalancer.memo import MISSING, ObjectMemo
from rebalancer.model import Finding, NotChosen, Pod, Proposal, Snapshot, StrategyResult, TelemetryWindow
from rebalancer.placement import ClusterState
from rebalancer.policy import Count, Duration, Percent, format_duration
from rebalancer.registry import Refusal, StrategyArgs, StrategyContext, strategy
from rebalancer.wording import plural
from strategies.gpu_consolidation_accounting import (
    MIG_SLICES_PER_GPU,
    NAME,
    format_gpus,
    format_pct,
    largest_first,
    pod_gpus,
)
from strategies.gpu_consolidation_candidates import (
    BLOCKED_FINDING,
    Candidate,
    blocked,
    has_mirror_pod,
    node_candidate,
    not_chosen,
    order_of,
    static_block,
)
from strategies.gpu_consolidation_sizes import (
    Landing,
    Run,
    destination_rules,
    landing_of,
    may_drain_upward,
    size_rules_allow,
    sizes_of,
    with_room_made,
)
from strategies.gpu_consolidation_telemetry import STALE_FINDING

__all__ = [
    "BLOCKED_FINDING",
    "MIG_SLICES_PER_GPU",
    "NAME",
    "STALE_FINDING",
    "GpuConsolidationArgs",
    "gpu_consolidation",
]

PodKey = tuple[str, str]


class GpuConsolidationArgs(StrategyArgs):
    """Arguments of `gpu-consolidation`. Durations accept `30s`, `5m`, `1h30m` or seconds."""

    max_allocated_percent: Percent = 60.0
    """A node is a candidate when strictly less than this share of its GPU capacity is allocated (shares
    count in milli-GPU, MIG instances by their compute slices). Every pod must still fit elsewhere at
    once, so a node is only drained when the cluster has that room."""
    max_utilization_percent: Percent | None = 30.0
    """... and when its GPUs also average strictly below this utilisation over `window` (null: judged on
    allocation alone)."""
    window: Annotated[Duration, Field(gt=0)] = 3600
    """The telemetry window the node's utilisation is averaged over."""
    min_node_age: Duration = 600
    """Nodes younger than this (unknown creation time counts as young) are left to settle."""
    max_nodes_per_cycle: Count = Field(default=3, ge=1)
    """At most this many node drains proposed per cycle (the cheapest to drain first)."""
    packed_schedulers: tuple[str, ...] = Field(default=("gpu-packed-scheduler",), min_length=1)
    """Only pods placed by one of these scheduler profiles are moved: a spreading scheduler would spread
    them out again."""
    max_telemetry_age: Annotated[Duration, Field(gt=0)] = 300
    """A GPU series whose newest sample is older than this (relative to the snapshot's now) is stale."""
    min_samples: Count = Field(default=10, ge=1)
    """Fewer utilisation samples than this in the window, on any GPU of the node, is not enough evidence to
    call the node under-used (as idle-gpu's min_samples)."""
    move_to_smaller_nodes: bool = False
    """false: a drained node's pods never go to nodes with fewer GPUs than it (small GPU shapes, often a
    scarce model, stay free for the pods that can run nowhere else)."""
    drain_onto_larger_nodes: bool = True
    """true: a node at or above `max_allocated_percent` is drained too when the packed scheduler puts part
    of its pods on nodes with more GPUs, none on smaller nodes, and the rest fill no more GPUs on nodes of
    its own size than the node leaves free (the utilisation threshold still applies)."""
    peer_pods_to_make_room: Count = Field(default=1, ge=0)
    """With drain_onto_larger_nodes: when the pods of such a node that must stay on its size lack room on
    its peers (same GPU model and size), the same proposal may also move up to this many peer pods that the
    packed scheduler puts on nodes with more GPUs, to make that room (0: never)."""

    @model_validator(mode="after")
    def _room_needs_upward_drains(self) -> GpuConsolidationArgs:
        # Only when asked for: turning upward drains off leaves the default room making unused.
        asked = "peer_pods_to_make_room" in self.model_fields_set
        if asked and self.peer_pods_to_make_room and not self.drain_onto_larger_nodes:
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


# --------------------------------------------------------------------------- simulation


_pct = format_pct


def _no_fit(candidate: Candidate, trial: ClusterState, exclude: Collection[str]) -> Finding:
    """Name a pod that cannot be re-placed even alone, else say they cannot all fit at once."""
    for pod in largest_first(candidate.pods, candidate.node.gpu_model):
        if trial.best_node(pod, exclude=exclude) is None:
            return blocked(candidate, pod, "cannot be re-placed on any other node")
    return blocked(
        candidate, None, f"its {plural(len(candidate.pods), 'pod')} cannot all be re-placed at once"
    )


def _reason(
    candidate: Candidate,
    args: GpuConsolidationArgs,
    targets: Mapping[PodKey, str],
    lifted: float,
    room_makers: Sequence[Pod] = (),
) -> str:
    share = candidate.allocated / candidate.capacity * 100
    text = (
        f"node {candidate.name}: {format_gpus(candidate.allocated)}/{format_gpus(candidate.capacity)} "
        "GPUs allocated "
    )
    if candidate.needs_larger:
        text += (
            f"({_pct(share)} >= {_pct(args.max_allocated_percent)}), {format_gpus(lifted)} of them onto "
            "nodes with more GPUs"
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
        model = candidate.node.gpu_model  # room makers run on peers: nodes of the candidate's model
        text += (
            f"; room made on {peers} by moving {plural(len(room_makers), 'pod')} "
            f"({format_gpus(sum(pod_gpus(pod, model) for pod in room_makers))} GPUs) to {lifted_to}"
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
    left: list[NotChosen] = []
    candidates: list[Candidate] = []
    for name in sorted(snapshot.nodes):
        candidate = node_candidate(
            snapshot.nodes[name], snapshot, args, ctx, window=window, findings=findings
        )
        if isinstance(candidate, Candidate):
            candidates.append(candidate)
        elif candidate is not None:
            left.append(candidate)

    # Pod-level rules: every pod to move must be evictable and placed by a packed scheduler.
    packed = set(args.packed_schedulers)
    non_packed: dict[PodKey, Pod] = {}
    non_packed_nodes = 0
    drainable: list[Candidate] = []
    for candidate in candidates:
        if has_mirror_pod(candidate):  # a static pod pins the node: it can never be freed
            left.append(not_chosen(candidate.name, "static-pod", "not drained: a static pod pins the node"))
            continue
        block = static_block(candidate, ctx)
        if block is not None:
            if not candidate.needs_larger:  # findings and hints are about under-used nodes
                findings.append(block)
            left.append(not_chosen(candidate.name, "pod-may-not-move", f"not drained: {block.detail}"))
            continue
        spreading = [pod for pod in candidate.pods if pod.scheduler_name not in packed]
        if spreading:
            schedulers = ", ".join(sorted({pod.scheduler_name for pod in spreading}))
            left.append(
                not_chosen(
                    candidate.name,
                    "non-packed-scheduler",
                    f"not drained: {plural(len(spreading), 'pod')} placed by a non-packed scheduler "
                    f"({schedulers}) would be spread out again",
                )
            )
        if spreading and candidate.needs_larger:
            continue
        if spreading:
            non_packed.update((pod.key, pod) for pod in spreading)
            non_packed_nodes += 1
            continue
        drainable.append(candidate)
    drainable.sort(key=order_of)

    proposals = _simulate(snapshot, args, ctx, drainable, findings, left=left)
    hints = (_scheduler_hint(non_packed, non_packed_nodes, args),) if non_packed else ()
    return StrategyResult(
        proposals=tuple(proposals), findings=tuple(findings), hints=hints, not_chosen=tuple(left)
    )


def _above_threshold(candidate: Candidate, args: GpuConsolidationArgs) -> str:
    """Why a node at or above the threshold is not drained (kept per Candidate object and arguments)."""
    kept = _ABOVE.get(candidate)
    if kept is not MISSING and kept[0] is args:
        return kept[1]
    share = candidate.allocated / candidate.capacity * 100
    text = (
        f"not drained: {_pct(share)} allocated >= threshold {_pct(args.max_allocated_percent)}, and its "
        "pods cannot be lifted onto nodes with more GPUs"
    )
    _ABOVE.put(candidate, (args, text))
    return text


_ABOVE: ObjectMemo[Candidate, tuple[GpuConsolidationArgs, str]] = ObjectMemo()


def _above_threshold_record(candidate: Candidate, args: GpuConsolidationArgs) -> NotChosen:
    """The record of a node at or above the threshold that could never be drained upward (kept per
    Candidate object and arguments)."""
    kept = _ABOVE_RECORDS.get(candidate)
    if kept is not MISSING and kept[0] is args:
        return kept[1]
    record = not_chosen(candidate.name, "allocated-above-threshold", _above_threshold(candidate, args))
    _ABOVE_RECORDS.put(candidate, (args, record))
    return record


_ABOVE_RECORDS: ObjectMemo[Candidate, tuple[GpuConsolidationArgs, NotChosen]] = ObjectMemo()


def _simulate(
    snapshot: Snapshot,
    args: GpuConsolidationArgs,
    ctx: StrategyContext,
    drainable: Sequence[Candidate],
    findings: list[Finding],
    *,
    left: list[NotChosen],
) -> list[Proposal]:
    """Greedy in order over one shared what-if cluster; stop at `max_nodes_per_cycle` proposals.

    Nodes drained in this run are cordoned in the simulation. The candidates still to be tried that
    could be drained in this run (as many as the per-cycle cap leaves) are excluded as targets too, as
    long as the node's pods fit elsewhere; otherwise they may receive them, being earlier in the order
    is worth more. A candidate that received pods, or whose pods already move, is no longer drained.
    The size rules (`size_rules_allow`) judge where the packed scheduler would put the pods; they never
    steer it. When only room on its peers is missing, `with_room_made` may add peer pods to the drain.
    A node at or above the threshold that fails them is no finding: it is not under-used. A drain the
    history holds back is proposed after the others, for the planner to refuse, and counts for nothing.
    """
    state = ClusterState.from_snapshot(snapshot)
    proposals: list[Proposal] = []
    run = Run(snapshot, args, ctx, sizes_of(snapshot))
    moved, done, sizes = run.moved, run.done, run.sizes
    receivers: set[str] = set()  # nodes predicted to receive pods in this run
    # Nodes at or above the threshold that could never be drained are no upcoming drains either.
    upward = [c for c in drainable if not c.needs_larger or may_drain_upward(c, sizes, args)]
    kept = {c.name for c in upward}
    left.extend(_above_threshold_record(c, args) for c in drainable if c.name not in kept)
    drainable = upward
    by_name = {c.name: c for c in drainable}
    # Candidates the history holds back this cycle: proposed for the planner to refuse and count, but
    # they take none of the cycle's drains and are no upcoming drain either.
    held = {c.name: found for c in drainable if (found := ctx.first_held_back(c.pods)) is not None}
    held_proposals: list[Proposal] = []  # kept apart: `proposals` are the cycle's drains

    def viable(candidate: Candidate) -> bool:
        return (
            candidate.name not in receivers
            and candidate.name not in done
            and not any(pod.key in moved for pod in candidate.pods)
        )

    def not_viable(candidate: Candidate) -> NotChosen | None:
        """Why a candidate not drained in this run is not (None: drained, or not yet decided)."""
        if candidate.name in done:
            return None
        if candidate.name in receivers:
            return not_chosen(
                candidate.name, "receives-pods", "not drained: it receives pods of a node drained this cycle"
            )
        return not_chosen(
            candidate.name,
            "pods-already-move",
            "not drained: some of its pods already move with another drain",
        )

    for index, candidate in enumerate(drainable):
        room = args.max_nodes_per_cycle - len(proposals)
        if room <= 0:
            capped = (
                f"not drained: max_nodes_per_cycle {args.max_nodes_per_cycle} reached by nodes cheaper "
                "to drain"
            )
            for rest in drainable[index:]:
                why = not_chosen(rest.name, "cycle-cap", capped) if viable(rest) else not_viable(rest)
                left.extend([why] if why is not None else [])
            break
        if not viable(candidate):
            why = not_viable(candidate)
            left.extend([why] if why is not None else [])
            continue
        later = (c.name for c in drainable[index + 1 :] if viable(c) and c.name not in held)
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
            no_fit = _no_fit(candidate, trial, {candidate.name})
            if not candidate.needs_larger:
                findings.append(no_fit)
            left.append(not_chosen(candidate.name, "cannot-re-place", f"not drained: {no_fit.detail}"))
            continue
        landing = landing_of(candidate, targets, sizes)
        makers: list[Pod] = []
        if not size_rules_allow(candidate, landing, args):
            made = None
            if (
                args.peer_pods_to_make_room
                and candidate.needs_larger
                and landing.lifts
                and not landing.smaller
            ):
                shortfall = landing.same - (candidate.capacity - candidate.allocated)
                made = with_room_made(candidate, shortfall, state, exclude, run)
            if made is None:
                left.append(
                    not_chosen(
                        candidate.name,
                        "size-rules",
                        "not drained: "
                        + (
                            "its pods would land on nodes with fewer GPUs (move_to_smaller_nodes)"
                            if not candidate.needs_larger
                            else _above_threshold(candidate, args).removeprefix("not drained: ")
                        ),
                    )
                )
                # A node at or above the threshold is not under-used: no finding for it.
                if not candidate.needs_larger:
                    findings.append(
                        blocked(
                            candidate,
                            None,
                            "its pods would land on nodes with fewer GPUs (move_to_smaller_nodes)",
                        )
                    )
                continue
            trial, makers, targets, landing = made
        if candidate.name in held:  # the history holds it back: proposed, refused, and not counted
            if len(held_proposals) < args.max_nodes_per_cycle:
                priority = -float(len(held_proposals) + 1)  # after the cycle's drains
                held_proposals.append(
                    _drain(
                        candidate,
                        run,
                        targets=targets,
                        makers=makers,
                        landing=landing,
                        freed=(candidate.name,),
                        priority=priority,
                    )
                )
            else:
                left.append(_held_back(candidate, held[candidate.name]))
            continue
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
        priority = float(args.max_nodes_per_cycle - len(proposals))
        drain = _drain(
            candidate, run, targets=targets, makers=makers, landing=landing, freed=freed, priority=priority
        )
        proposals.append(drain)
    return [*proposals, *held_proposals]


def _drain(
    candidate: Candidate,
    run: Run,
    *,
    targets: Mapping[PodKey, str],
    makers: Sequence[Pod],
    landing: Landing,
    freed: Sequence[str],
    priority: float,
) -> Proposal:
    """The proposal to drain the candidate: the room-making pods first, then its own."""
    gangs = {pod.gang for pod in candidate.pods if pod.gang is not None}
    return Proposal(
        strategy=NAME,
        kind="node",
        pods=(*makers, *candidate.pods),
        reason=_reason(candidate, run.args, targets, landing.lifted, makers),
        priority=priority,
        node=candidate.name,
        group=next(iter(gangs)) if len(gangs) == 1 else None,
        targets=dict(targets),
        nodes_freed=tuple(freed),
        destinations=destination_rules(candidate, targets, makers, freed, run),
    )


def _held_back(candidate: Candidate, refused: tuple[Pod, Refusal]) -> NotChosen:
    """The record of a drain the history holds back beyond the `max_nodes_per_cycle` such drains a cycle
    proposes for the planner to refuse (and count)."""
    pod, refusal = refused
    why = f"not drained: {pod.ref} is held back ({refusal.guard}: {refusal.reason})"
    return not_chosen(candidate.name, "held-back", why)
