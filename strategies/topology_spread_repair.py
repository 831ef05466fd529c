"""Skew repair of `topology-spread`: the fewest evictions that bring each spread constraint within maxSkew.

Owns the groups and the moves. Active pods that carry an identical constraint (same namespace,
topologyKey, maxSkew, whenUnsatisfiable, minDomains and labelSelector) and the same nodeSelector /
required node affinity form one group, counted as `topology_spread_domains` says. While skew > maxSkew,
one pod at a time moves from the most-loaded domain to the least-loaded one that accepts it: the
scheduler's own filter must let the replacement in (for DoNotSchedule, count + 1 - min <= maxSkew once
the pod has left), and placement must find a node of that domain with room, the pod's other
DoNotSchedule constraints respected there.

Moving one pod at a time from a most-loaded domain to a least-loaded one reaches a distribution
within maxSkew with the fewest evictions: it only ever takes pods out of the domains above the final
water level and puts them into the domains below it, so no pod moves twice and no domain both gives
and takes (the tests check the count against exhaustive search). Moves that end up not lowering the
skew (the repair stalls: no room, too-young pods, the eviction limit) are dropped, so no eviction is
proposed for nothing, and a hint says which constraints stay violated. Every member of a group
that is not moved gets a `NotChosen` record for the group's constraint: within maxSkew (before or
after the other moves), on a node in no domain of it, too young, in a domain with too few pods to
give one, past the eviction limit, or no less-loaded domain can take it; so does a pod whose only
constraints are ScheduleAnyway ones left alone without `include_soft`. Pods younger than
`min_pod_age` are never moved; among the movable pods of a domain the strategy prefers those no
static guard refuses, then the fewest GPUs (a gang counts whole), then the newest. Only pods that
carry the constraint themselves are moved: the scheduler would not re-spread the others. A repaired
pod may go, should an earlier proposal of the cycle fill its predicted target, only into the domain
the repair chose, on a node its other DoNotSchedule constraints allowed; the rest of its gang anywhere.

This module must stay pure: no I/O, no clock (`snapshot.now` is the time). It must not pack gangs
(gang compaction does) nor apply the planner's guards beyond preferring pods they would not refuse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rebalancer.model import (
    DestinationRule,
    LabelSelector,
    NodeSelectorTerm,
    NotChosen,
    Pod,
    Proposal,
    Snapshot,
    TopologySpreadConstraint,
)
from rebalancer.placement import ClusterState
from rebalancer.policy import format_duration
from rebalancer.wording import plural
from strategies.topology_spread_domains import HARD, NAME, Run, global_min, old_enough, skew_of

__all__ = ["HOSTNAME_KEY", "SOFT", "repair_group", "spread_groups"]

SOFT = "ScheduleAnyway"
HOSTNAME_KEY = "kubernetes.io/hostname"

PodKey = tuple[str, str]

_DOMAIN_WORDS = {
    "topology.kubernetes.io/zone": "zone",
    "failure-domain.beta.kubernetes.io/zone": "zone",
    "topology.kubernetes.io/region": "region",
    "failure-domain.beta.kubernetes.io/region": "region",
    HOSTNAME_KEY: "node",
}


# --------------------------------------------------------------------------- grouping and wording


SelectorKey = tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str, tuple[str, ...]], ...]]


def _selector_key(selector: LabelSelector) -> SelectorKey:
    return (
        tuple(sorted(selector.match_labels.items())),
        tuple(sorted((r.key, r.operator, tuple(sorted(r.values))) for r in selector.match_expressions)),
    )


def _affinity_key(terms: Sequence[NodeSelectorTerm]) -> str:
    """A stable, hashable, orderable rendering of required node affinity terms."""
    return repr(tuple(terms))


@dataclass(frozen=True, slots=True, order=True)
class _GroupKey:
    """Pods with an identical constraint and identical node eligibility are repaired together."""

    soft: bool
    namespace: str
    topology_key: str
    max_skew: int
    min_domains: int
    selector: SelectorKey
    node_selector: tuple[tuple[str, str], ...]
    affinity: str


def _group_key(pod: Pod, constraint: TopologySpreadConstraint) -> _GroupKey:
    return _GroupKey(
        soft=constraint.when_unsatisfiable != HARD,
        namespace=pod.namespace,
        topology_key=constraint.topology_key,
        max_skew=constraint.max_skew,
        min_domains=constraint.min_domains or 0,
        selector=_selector_key(constraint.label_selector),
        node_selector=tuple(sorted(pod.node_selector.items())),
        affinity=_affinity_key(pod.required_affinity),
    )


def _describe_selector(selector: LabelSelector) -> str:
    parts = [f"{k}={v}" for k, v in sorted(selector.match_labels.items())]
    for r in selector.match_expressions:
        if r.operator == "Exists":
            parts.append(r.key)
        elif r.operator == "DoesNotExist":
            parts.append(f"!{r.key}")
        else:
            parts.append(f"{r.key} {r.operator.lower()} ({','.join(r.values)})")
    return ",".join(parts) if parts else "any labels"


def _domain_label(topology_key: str, domain: str, *, with_word: bool) -> str:
    """`zone us-east-1a` (or `us-east-1a`), `node gpu-a-1`, `example.com/rack=r1` for other keys."""
    word = _DOMAIN_WORDS.get(topology_key)
    if word is None:
        return f"{topology_key}={domain}"
    return f"{word} {domain}" if with_word else domain


# --------------------------------------------------------------------------- skew repair


@dataclass(frozen=True, slots=True)
class _Group:
    key: _GroupKey
    constraint: TopologySpreadConstraint
    members: tuple[Pod, ...]  # the active pods that carry the constraint

    @property
    def view(self) -> Pod:
        """A member whose nodeSelector and affinity stand for the whole group's (they are identical)."""
        return self.members[0]


@dataclass(frozen=True, slots=True)
class _Move:
    proposal: Proposal
    placed: Mapping[PodKey, str]
    state: ClusterState  # the run's cluster once this move (and every earlier one) is reserved
    skew_before: int
    skew_after: int


def _wanted(constraint: TopologySpreadConstraint, include_soft: bool) -> bool:
    if constraint.when_unsatisfiable == HARD:
        return True
    return include_soft and constraint.when_unsatisfiable == SOFT


_SOFT_LEFT = "only ScheduleAnyway spread constraints, which are not repaired (include_soft: false)"


def _record(pod: Pod, code: str, reason: str) -> NotChosen:
    return NotChosen(NAME, pod.node_name, code, reason, namespace=pod.namespace, pod=pod.name)


def spread_groups(snapshot: Snapshot, include_soft: bool) -> tuple[list[_Group], list[NotChosen]]:
    """The groups of active pods to repair (ScheduleAnyway constraints too with `include_soft`), and
    the records of the placed pods whose every constraint is a ScheduleAnyway one left alone."""
    found: dict[_GroupKey, tuple[TopologySpreadConstraint, list[Pod]]] = {}
    soft_only: list[NotChosen] = []
    for pod in snapshot.pods:
        if not pod.topology_spread or not pod.is_active or pod.terminating:  # most pods have no constraint
            continue
        seen: set[_GroupKey] = set()
        for constraint in pod.topology_spread:
            if not _wanted(constraint, include_soft):
                continue
            key = _group_key(pod, constraint)
            if key not in seen:
                seen.add(key)
                found.setdefault(key, (constraint, []))[1].append(pod)
        if not seen and pod.node_name is not None:
            soft_only.append(_record(pod, "soft-constraint", _SOFT_LEFT))
    # Hard constraints first, then by namespace and key: a stable, reproducible order.
    groups = [
        _Group(key=key, constraint=constraint, members=tuple(members))
        for key, (constraint, members) in sorted(found.items())
    ]
    return groups, soft_only


def _own_constraint(pod: Pod, key: _GroupKey) -> TopologySpreadConstraint | None:
    return next((c for c in pod.topology_spread if _group_key(pod, c) == key), None)


def _preference(run: Run, pod: Pod) -> tuple[bool, float, int, float, str]:
    """Unrefused (by the static guards or the history) first, then fewest GPUs (a gang counts whole),
    fewest pods, newest, name."""
    moving = run.gang_of(pod)
    refused = any(run.ctx.refusal(p) is not None for p in moving)
    refused = refused or run.ctx.first_held_back(moving) is not None
    created = pod.created.timestamp() if pod.created is not None else 0.0
    return (refused, sum(p.gpu.gpus for p in moving), len(moving), -created, pod.ref)


def _movable(run: Run, group: _Group, pods: Iterable[Pod]) -> list[Pod]:
    members = {p.key for p in group.members}
    out: list[Pod] = []
    for pod in pods:
        if pod.key not in members:
            continue
        moving = run.gang_of(pod)
        if any(p.key in run.moved or not old_enough(p, run.snapshot, run.min_age) for p in moving):
            continue
        out.append(pod)
    return sorted(out, key=lambda p: _preference(run, p))


def _place_into(
    run: Run,
    state: ClusterState,
    pod: Pod,
    own: TopologySpreadConstraint | None,
    domain_nodes: Sequence[str],
) -> tuple[ClusterState, dict[PodKey, str], frozenset[str]] | None:
    """Place the pod inside one domain (and the rest of its gang anywhere): the new state, the targets
    and the domain's nodes the pod's other DoNotSchedule constraints allow."""
    allowed = run.hard_filter(pod, own, domain_nodes)
    if not allowed:
        return None
    exclude = run.node_names - allowed
    moving = run.gang_of(pod)
    if len(moving) == 1 and state.best_node(pod, exclude=exclude) is None:
        return None  # cheap refusal before copying the cluster (the pod's own node is excluded)
    sim = state.copy()
    for member in moving:
        sim.remove(member)
    target = sim.best_node(pod, exclude=exclude)
    if target is None:
        return None
    sim.place(pod, target)
    placed = {pod.key: target}
    # The rest of a gang is re-created too: predict each member back where it is when it still fits.
    for member in sorted((m for m in moving if m.key != pod.key), key=lambda m: (-m.gpu.gpus, m.ref)):
        where = run.location[member.key]
        if not sim.fits(member, where).ok:
            elsewhere = sim.best_node(member)
            if elsewhere is None:
                return None
            where = elsewhere
        sim.place(member, where)
        placed[member.key] = where
    return sim, placed, allowed


@dataclass(frozen=True, slots=True)
class _Step:
    pod: Pod
    source: str
    target: str
    state: ClusterState
    placed: dict[PodKey, str]
    allowed: frozenset[str]  # the target domain's nodes the pod's other hard constraints admit
    domain_nodes: int  # how many nodes the target domain has


def _next_step(
    run: Run,
    group: _Group,
    state: ClusterState,
    by_domain: Mapping[str, list[Pod]],
    domain_nodes: Mapping[str, Sequence[str]],
) -> _Step | None:
    """The best single move: from the most-loaded domain possible to the least-loaded that takes it."""
    key = group.key
    counts = {d: len(pods) for d, pods in by_domain.items()}
    sources = sorted(counts, key=lambda d: (-counts[d], d))
    targets = sorted(counts, key=lambda d: (counts[d], d))
    for source in sources:
        candidates = _movable(run, group, by_domain[source])
        if not candidates:
            continue
        after = dict(counts)
        after[source] -= 1
        minimum = global_min(after, key.min_domains)
        for target in targets:
            if counts[target] > counts[source] - 2:
                break  # not a move that evens the spread out (and no later target is)
            if not key.soft and after[target] + 1 - minimum > key.max_skew:
                continue  # the scheduler would not let the replacement in there
            for pod in candidates:
                placed = _place_into(run, state, pod, _own_constraint(pod, key), domain_nodes[target])
                if placed is not None:
                    sim, where, allowed = placed
                    return _Step(pod, source, target, sim, where, allowed, len(domain_nodes[target]))
    return None


def _plan_group(run: Run, group: _Group) -> tuple[list[_Move], bool]:
    """Plan up to the eviction limit for one group, on copies: the run itself is left unchanged. True
    with the moves when the limit stopped the plan (a further move was found)."""
    key = group.key
    selector = group.constraint.label_selector
    eligible = run.eligible_nodes(group.view, key.topology_key)
    # What this plan changes in the run, to undo it (cheaper than copying the run's maps).
    previous: dict[PodKey, str | None] = {}
    newly_moved: set[PodKey] = set()
    state = run.state
    moves: list[_Move] = []
    evictions = 0
    limited = False
    try:
        by_domain = run.counted(key.namespace, selector, eligible, without=None)
        counts = {d: len(p) for d, p in by_domain.items()}
        skew = skew_of(counts, key.min_domains)
        while skew > key.max_skew:
            step = _next_step(run, group, state, by_domain, eligible.nodes_in)
            if step is None:
                break
            if evictions + len(step.placed) > run.args.max_evictions_per_constraint:
                limited = True
                break
            evictions += len(step.placed)
            proposal = _skew_proposal(run, group, step, counts, skew)
            for moved_key, node in step.placed.items():
                previous.setdefault(moved_key, run.location.get(moved_key))
                if moved_key not in run.moved:
                    newly_moved.add(moved_key)
                run.location[moved_key] = node
                run.moved.add(moved_key)
            state = step.state
            by_domain = run.counted(key.namespace, selector, eligible, without=None)
            counts = {d: len(p) for d, p in by_domain.items()}
            before, skew = skew, skew_of(counts, key.min_domains)
            moves.append(_Move(proposal, step.placed, state, before, skew))
    finally:
        for moved_key, was in previous.items():
            if was is None:
                del run.location[moved_key]
            else:
                run.location[moved_key] = was
        run.moved -= newly_moved
    return moves, limited


def _skew_proposal(run: Run, group: _Group, step: _Step, counts: Mapping[str, int], skew: int) -> Proposal:
    key = group.key
    node = step.placed[step.pod.key]
    why = f"skew {skew} > maxSkew {key.max_skew}"
    if key.min_domains and len(counts) < key.min_domains:
        why += f", only {len(counts)} of minDomains {key.min_domains} domains"
    if key.soft:
        why += ", ScheduleAnyway"
    where = (
        ""
        if key.topology_key == HOSTNAME_KEY
        else f" in {_domain_label(key.topology_key, step.target, with_word=False)}"
    )
    reason = (
        f"{_domain_label(key.topology_key, step.source, with_word=True)} has "
        f"{plural(counts[step.source], 'pod')} of {_describe_selector(group.constraint.label_selector)}, "
        f"{_domain_label(key.topology_key, step.target, with_word=False)} has {counts[step.target]} "
        f"({why}); moving to {node}{where}"
    )
    moving = run.gang_of(step.pod)
    # The moved pod must land in the chosen domain; the rest of a gang was predicted anywhere.
    destinations: dict[PodKey, tuple[DestinationRule, ...]] = {pod.key: () for pod in moving}
    destinations[step.pod.key] = (_domain_rule(key.topology_key, step),)
    gang = len(moving) > 1
    if gang:
        reason += (
            f"; {step.pod.ref} belongs to gang {step.pod.gang}, whose {plural(len(moving), 'pod')} move whole"
        )
    return Proposal(
        strategy=NAME,
        kind="gang" if gang else "pod",
        pods=moving,
        reason=reason,
        group=step.pod.gang if gang else None,
        targets=dict(step.placed),
        destinations=destinations,
    )


def _domain_rule(topology_key: str, step: _Step) -> DestinationRule:
    """The moved pod lands in the domain the repair chose, on a node its other hard constraints allow."""
    if topology_key == HOSTNAME_KEY:
        where = f"in domain {HOSTNAME_KEY}={step.target}"
    else:
        where = f"in {_domain_label(topology_key, step.target, with_word=True)}"
    if len(step.allowed) < step.domain_nodes:
        where += " that its other DoNotSchedule spread constraints allow"
    return DestinationRule(where, step.allowed)


def repair_group(run: Run, group: _Group) -> str | None:
    """Commit the useful moves of one group and record why each other member stays; a hint for the
    operator when skew stays too high."""
    moves, limited = _plan_group(run, group)
    kept: list[_Move] = []
    if moves:
        # Keep the shortest prefix reaching the lowest skew: later moves would be evictions for nothing.
        best = min(range(len(moves)), key=lambda i: (moves[i].skew_after, i))
        if moves[best].skew_after < moves[0].skew_before:
            kept = moves[: best + 1]
            for move in kept:
                run.proposals.append(move.proposal)
                for moved_key, node in move.placed.items():
                    run.location[moved_key] = node
                    run.moved.add(moved_key)
            run.state = kept[-1].state
    key = group.key
    eligible = run.eligible_nodes(group.view, key.topology_key)
    by_domain = run.counted(key.namespace, group.constraint.label_selector, eligible, without=None)
    counts = {d: len(p) for d, p in by_domain.items()}
    skew = skew_of(counts, key.min_domains)
    spread = ", ".join(f"{d}: {n}" for d, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    _record_members(
        run, group, _Left(counts, skew, spread, len(kept), limited, moves[0].skew_before if moves else skew)
    )
    if skew <= key.max_skew:
        return None
    return (
        f"pods of {_describe_selector(group.constraint.label_selector)} in namespace {key.namespace} keep "
        f"skew {skew} > maxSkew {key.max_skew} over {key.topology_key} ({spread or 'no eligible domain'}) "
        "after this cycle's proposals: no further move helps (pods too young, no room in the less-loaded "
        "domains, the scheduler's spread filter, or the eviction limit per constraint)"
    )


@dataclass(frozen=True, slots=True)
class _Left:
    """A group once its moves are committed: what its members' records say."""

    counts: Mapping[str, int]  # domain -> matching pods predicted there
    skew: int
    spread: str  # `us-east-1a: 3, us-east-1b: 1`
    kept: int  # the moves committed for it
    limited: bool  # the eviction limit per constraint stopped its plan
    skew_before: int


def _record_members(run: Run, group: _Group, left: _Left) -> None:
    """A record for every member not moved: why it stays, for this group's constraint."""
    key = group.key
    within = left.skew <= key.max_skew
    constraint = (
        f"spread constraint of {_describe_selector(group.constraint.label_selector)} over "
        f"{key.topology_key} (maxSkew {key.max_skew}{', ScheduleAnyway' if key.soft else ''})"
    )
    state = f"skew {left.skew} ({left.spread or 'no eligible domain'})"
    if within and left.kept:
        shared = (
            "skew-repaired",
            f"{constraint}: skew {left.skew_before} falls to {left.skew} <= maxSkew {key.max_skew} with "
            f"{plural(left.kept, 'other move')} proposed for it; it stays",
        )
    elif within:
        shared = (
            "within-max-skew",
            f"{constraint}: skew {left.skew} <= maxSkew {key.max_skew} ({left.spread})",
        )
    elif left.limited:
        shared = (
            "eviction-limit",
            f"{constraint}: {state} > maxSkew; max_evictions_per_constraint "
            f"{run.args.max_evictions_per_constraint} reached",
        )
    else:
        shared = (
            "no-domain-can-take",
            f"{constraint}: {state} > maxSkew; no less-loaded domain can take it now (no room, the "
            "scheduler's spread filter or its other DoNotSchedule constraints), or moving it would not "
            "lower the skew",
        )
    eligible = run.eligible_nodes(group.view, key.topology_key)
    minimum = global_min(left.counts, key.min_domains)
    young = f"younger than min_pod_age {format_duration(run.args.min_pod_age)} (or of unknown age)"
    for pod in group.members:
        where = run.location.get(pod.key)
        if where is None or pod.key in run.moved:
            continue  # not placed (not looked at), or proposed (here, for another constraint, in a gang)
        domain = eligible.domain_of.get(where)
        if domain is None:
            node = run.snapshot.nodes.get(where)
            why = (
                f"node {where} has no label {key.topology_key}"
                if node is None or key.topology_key not in node.labels
                else f"node {where} is not one its nodeSelector / required affinity allows"
            )
            run.left.append(_record(pod, "no-domain", f"{constraint}: {why}: it is in no domain of it"))
            continue
        if within:
            run.left.append(_record(pod, *shared))
            continue
        gang = run.gang_of(pod)
        too_young = [p for p in gang if not old_enough(p, run.snapshot, run.min_age)]
        if too_young:
            whose = "it is" if too_young[0].key == pod.key else f"its gang's {too_young[0].ref} is"
            run.left.append(_record(pod, "too-young", f"{constraint}: {state} > maxSkew; {whose} {young}"))
        elif left.counts[domain] - minimum <= 1:
            run.left.append(
                _record(
                    pod,
                    "in-least-loaded-domain",
                    f"{constraint}: {state} > maxSkew; "
                    f"{_domain_label(key.topology_key, domain, with_word=True)} has "
                    f"{plural(left.counts[domain], 'pod')}, too few to give one",
                )
            )
        else:
            run.left.append(_record(pod, *shared))
