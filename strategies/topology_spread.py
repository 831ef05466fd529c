"""`topology-spread`: repair topologySpreadConstraints skew and, opt-in, compact gangs onto fewer nodes.

Skew repair. Active pods that carry an identical constraint (same namespace, topologyKey, maxSkew,
whenUnsatisfiable, minDomains and labelSelector) and the same nodeSelector / required node affinity
form one group. The group's eligible domains are the values of topologyKey on the nodes its pods
could be scheduled to (nodeAffinityPolicy Honor; a node without the key is no domain), empty
domains included. A domain's count is the number of active pods of the namespace that match the
selector and sit on an eligible node of that domain. Skew is max - min, where min is 0 while fewer
domains than minDomains exist. While skew > maxSkew, one pod at a time moves from the most-loaded
domain to the least-loaded one that accepts it: the scheduler's own filter must let the replacement
in (for DoNotSchedule, count + 1 - min <= maxSkew once the pod has left), and placement must find a
node of that domain with room, the pod's other DoNotSchedule constraints respected there.

Moving one pod at a time from a most-loaded domain to a least-loaded one reaches a distribution
within maxSkew with the fewest evictions: it only ever takes pods out of the domains above the final
water level and puts them into the domains below it, so no pod moves twice and no domain both gives
and takes (the tests check the count against exhaustive search). Moves that end up not lowering the
skew (the repair stalls: no room, too-young pods, the eviction limit) are dropped, so no eviction is
proposed for nothing, and a hint says which constraints stay violated. Pods younger than
`min_pod_age` are never moved; among the movable pods of a domain the strategy prefers those no
static guard refuses, then the fewest GPUs (a gang counts whole), then the newest. Only pods that
carry the constraint themselves are moved: the scheduler would not re-spread the others.

Gang compaction (`compact_gangs`). A gang spread over more nodes than needed is proposed whole, every
active member listed, with targets that pack it onto fewer nodes of the GPU models it uses now,
preferring the nodes that already host most members. Evicting only the stragglers would restart the
job anyway, and the planner's `gang` guard refuses a proposal that lacks an active member.

One `ClusterState` serves the whole run, so every proposal's reservations are seen by the next, and
moves planned for one constraint are seen by the next constraint's counts. Should an earlier proposal
of the cycle (another strategy's) fill a predicted target, each proposal says where else its pods may
go: a repaired pod only into the domain the repair chose, on a node its other DoNotSchedule
constraints allowed; the rest of its gang anywhere; a compacted gang only onto the nodes it is packed
onto. The strategy is pure: no
I/O and no clock (`snapshot.now` is the time).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta

from pydantic import Field

from rebalancer.model import (
    DestinationRule,
    LabelSelector,
    Node,
    NodeSelectorTerm,
    Pod,
    Proposal,
    Snapshot,
    StrategyResult,
    TopologySpreadConstraint,
)
from rebalancer.placement import ClusterState
from rebalancer.policy import Duration
from rebalancer.registry import StrategyArgs, StrategyContext, strategy
from rebalancer.selectors import label_selector_matches, node_selector_matches, required_affinity_matches
from rebalancer.wording import plural

NAME = "topology-spread"
HARD = "DoNotSchedule"
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


class TopologySpreadArgs(StrategyArgs):
    """Arguments of `topology-spread`."""

    # Also repair `whenUnsatisfiable: ScheduleAnyway` constraints.
    include_soft: bool = False
    # Propose packing multi-pod gangs onto fewer nodes of the GPU models they use.
    compact_gangs: bool = False
    # Pods younger than this are never moved.
    min_pod_age: Duration = 600
    # Evictions (pods, a gang counting all its members) one constraint may cost per cycle.
    max_evictions_per_constraint: int = Field(default=10, ge=1)


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


# --------------------------------------------------------------------------- shared helpers


def _old_enough(pod: Pod, snapshot: Snapshot, min_age: timedelta) -> bool:
    # An unknown creation time counts as too young, as the planner's min-pod-age guard reads it.
    return pod.created is not None and snapshot.now - pod.created >= min_age


def _global_min(counts: Mapping[str, int], min_domains: int) -> int:
    """The scheduler's global minimum: 0 while fewer eligible domains than minDomains exist."""
    if not counts or len(counts) < min_domains:
        return 0
    return min(counts.values())


def _skew(counts: Mapping[str, int], min_domains: int) -> int:
    return max(counts.values(), default=0) - _global_min(counts, min_domains)


# (topology key, nodeSelector, required node affinity): what decides a pod's eligible nodes.
_EligibleKey = tuple[str, tuple[tuple[str, str], ...], tuple[NodeSelectorTerm, ...]]


@dataclass(frozen=True, slots=True)
class _Eligible:
    """The nodes carrying a topology key that a pod's nodeSelector / affinity allow, by domain."""

    domain_of: Mapping[str, str]  # node -> domain
    nodes_in: Mapping[str, tuple[str, ...]]  # domain -> its nodes by name, domains in node order


@dataclass
class _Run:
    """What one run of the strategy reads, and what it carries from one proposal to the next."""

    snapshot: Snapshot
    args: TopologySpreadArgs
    ctx: StrategyContext
    state: ClusterState
    # Where each active pod is predicted to be once the moves proposed so far have happened.
    location: dict[PodKey, str] = field(default_factory=dict)
    moved: set[PodKey] = field(default_factory=set)
    proposals: list[Proposal] = field(default_factory=list)
    pods_by_namespace: dict[str, list[Pod]] = field(default_factory=dict)
    # Per namespace, the active pods carrying each label (key, value), in snapshot order: a selector's
    # matchLabels narrow `counted` down to a few pods instead of the whole namespace.
    pods_by_label: dict[str, dict[tuple[str, str], list[Pod]]] = field(default_factory=dict)
    # eligible_nodes per (topology key, nodeSelector, required affinity): every pod of a group, and
    # most groups, share one.
    eligible_cache: dict[_EligibleKey, _Eligible] = field(default_factory=dict)

    def __post_init__(self) -> None:
        grouped: dict[str, list[Pod]] = defaultdict(list)
        by_label: dict[str, dict[tuple[str, str], list[Pod]]] = defaultdict(lambda: defaultdict(list))
        for pod in self.snapshot.pods:
            # A terminating pod is leaving its domain: neither counted nor moved (as upstream's
            # descheduler and kube-scheduler's PodTopologySpread both skip it).
            if pod.is_active and pod.node_name is not None and not pod.terminating:
                grouped[pod.namespace].append(pod)
                self.location[pod.key] = pod.node_name
                index = by_label[pod.namespace]
                for label in pod.labels.items():
                    index[label].append(pod)
        self.pods_by_namespace = dict(grouped)
        self.pods_by_label = {namespace: dict(index) for namespace, index in by_label.items()}

    @property
    def min_age(self) -> timedelta:
        return timedelta(seconds=self.args.min_pod_age)

    def gang_of(self, pod: Pod) -> tuple[Pod, ...]:
        """The pods that evicting `pod` disrupts: its whole active gang, or the pod alone."""
        if pod.gang is None:
            return (pod,)
        members = self.snapshot.gangs.get(pod.gang, ())
        return members if len(members) > 1 else (pod,)

    def eligible_nodes(self, pod: Pod, topology_key: str) -> _Eligible:
        """The nodes carrying the key that the pod's nodeSelector / affinity allow, and their domains."""
        key = (topology_key, tuple(sorted(pod.node_selector.items())), pod.required_affinity)
        eligible = self.eligible_cache.get(key)
        if eligible is None:
            domain_of: dict[str, str] = {}
            for name, node in self.snapshot.nodes.items():
                domain = node.labels.get(topology_key)
                if domain is not None and _affinity_allows(pod, node):
                    domain_of[name] = domain
            nodes_in: dict[str, list[str]] = {domain: [] for domain in domain_of.values()}
            for name, domain in sorted(domain_of.items()):
                nodes_in[domain].append(name)
            eligible = _Eligible(domain_of, {domain: tuple(names) for domain, names in nodes_in.items()})
            self.eligible_cache[key] = eligible
        return eligible

    def counted(
        self, namespace: str, selector: LabelSelector, eligible: _Eligible, *, without: PodKey | None
    ) -> dict[str, list[Pod]]:
        """Domain -> the matching pods predicted in it; every eligible domain appears, empty or not."""
        by_domain: dict[str, list[Pod]] = {domain: [] for domain in eligible.nodes_in}
        domain_of = eligible.domain_of
        for pod in self._selector_candidates(namespace, selector):
            if pod.key == without:
                continue
            domain = domain_of.get(self.location[pod.key])
            if domain is not None and label_selector_matches(selector, pod.labels):
                by_domain[domain].append(pod)
        return by_domain

    def _selector_candidates(self, namespace: str, selector: LabelSelector) -> Sequence[Pod]:
        """The namespace's active pods that can match the selector: those carrying its rarest matchLabels
        pair (every pod of the namespace when it has no matchLabels), in snapshot order."""
        if not selector.match_labels:
            return self.pods_by_namespace.get(namespace, ())
        index = self.pods_by_label.get(namespace, {})
        return min((index.get(label, ()) for label in selector.match_labels.items()), key=len)

    def hard_filter(self, pod: Pod, skip: TopologySpreadConstraint | None) -> Callable[[str], bool]:
        """The scheduler's PodTopologySpread filter for the pod's DoNotSchedule constraints but `skip`."""
        checks: list[tuple[Mapping[str, str], Mapping[str, int], int]] = []
        for constraint in pod.topology_spread:
            if constraint.when_unsatisfiable != HARD or constraint is skip:
                continue
            eligible = self.eligible_nodes(pod, constraint.topology_key)
            by_domain = self.counted(pod.namespace, constraint.label_selector, eligible, without=pod.key)
            counts = {d: len(p) for d, p in by_domain.items()}
            self_match = 1 if label_selector_matches(constraint.label_selector, pod.labels) else 0
            room = constraint.max_skew + _global_min(counts, constraint.min_domains or 0) - self_match
            checks.append((eligible.domain_of, counts, room))

        def allows(node_name: str) -> bool:
            for eligible, counts, room in checks:
                domain = eligible.get(node_name)
                if domain is None or counts[domain] > room:
                    return False
            return True

        return allows


def _affinity_allows(pod: Pod, node: Node) -> bool:
    """nodeAffinityPolicy Honor: the node matches the pod's nodeSelector and required node affinity."""
    return node_selector_matches(pod, node) and required_affinity_matches(pod, node)


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


def _groups(snapshot: Snapshot, include_soft: bool) -> list[_Group]:
    found: dict[_GroupKey, tuple[TopologySpreadConstraint, list[Pod]]] = {}
    for pod in snapshot.pods:
        if not pod.is_active or pod.terminating:
            continue
        seen: set[_GroupKey] = set()
        for constraint in pod.topology_spread:
            if not _wanted(constraint, include_soft):
                continue
            key = _group_key(pod, constraint)
            if key not in seen:
                seen.add(key)
                found.setdefault(key, (constraint, []))[1].append(pod)
    # Hard constraints first, then by namespace and key: a stable, reproducible order.
    return [
        _Group(key=key, constraint=constraint, members=tuple(members))
        for key, (constraint, members) in sorted(found.items())
    ]


def _own_constraint(pod: Pod, key: _GroupKey) -> TopologySpreadConstraint | None:
    return next((c for c in pod.topology_spread if _group_key(pod, c) == key), None)


def _preference(run: _Run, pod: Pod) -> tuple[bool, float, int, float, str]:
    """Unrefused first, then fewest GPUs (a gang counts whole), fewest pods, newest, name."""
    moving = run.gang_of(pod)
    refused = any(run.ctx.refusal(p) is not None for p in moving)
    created = pod.created.timestamp() if pod.created is not None else 0.0
    return (refused, sum(p.gpu.gpus for p in moving), len(moving), -created, pod.ref)


def _movable(run: _Run, group: _Group, pods: Iterable[Pod]) -> list[Pod]:
    members = {p.key for p in group.members}
    out: list[Pod] = []
    for pod in pods:
        if pod.key not in members:
            continue
        moving = run.gang_of(pod)
        if any(p.key in run.moved or not _old_enough(p, run.snapshot, run.min_age) for p in moving):
            continue
        out.append(pod)
    return sorted(out, key=lambda p: _preference(run, p))


def _place_into(
    run: _Run,
    state: ClusterState,
    pod: Pod,
    own: TopologySpreadConstraint | None,
    domain_nodes: Sequence[str],
) -> tuple[ClusterState, dict[PodKey, str], frozenset[str]] | None:
    """Place the pod inside one domain (and the rest of its gang anywhere): the new state, the targets
    and the domain's nodes the pod's other DoNotSchedule constraints allow."""
    allows = run.hard_filter(pod, skip=own)
    allowed = frozenset(name for name in domain_nodes if allows(name))
    if not allowed:
        return None
    exclude = [name for name in run.snapshot.nodes if name not in allowed]
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
    run: _Run,
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
        minimum = _global_min(after, key.min_domains)
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


def _plan_group(run: _Run, group: _Group) -> list[_Move]:
    """Plan up to the eviction limit for one group, on copies: the run itself is left unchanged."""
    key = group.key
    selector = group.constraint.label_selector
    eligible = run.eligible_nodes(group.view, key.topology_key)
    # What this plan changes in the run, to undo it (cheaper than copying the run's maps).
    previous: dict[PodKey, str | None] = {}
    newly_moved: set[PodKey] = set()
    state = run.state
    moves: list[_Move] = []
    evictions = 0
    try:
        by_domain = run.counted(key.namespace, selector, eligible, without=None)
        counts = {d: len(p) for d, p in by_domain.items()}
        skew = _skew(counts, key.min_domains)
        while skew > key.max_skew:
            step = _next_step(run, group, state, by_domain, eligible.nodes_in)
            if step is None or evictions + len(step.placed) > run.args.max_evictions_per_constraint:
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
            before, skew = skew, _skew(counts, key.min_domains)
            moves.append(_Move(proposal, step.placed, state, before, skew))
    finally:
        for moved_key, was in previous.items():
            if was is None:
                del run.location[moved_key]
            else:
                run.location[moved_key] = was
        run.moved -= newly_moved
    return moves


def _skew_proposal(run: _Run, group: _Group, step: _Step, counts: Mapping[str, int], skew: int) -> Proposal:
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


def _repair(run: _Run, group: _Group) -> str | None:
    """Commit the useful moves of one group; a hint for the operator when skew stays too high."""
    moves = _plan_group(run, group)
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
    return _leftover_hint(run, group)


def _leftover_hint(run: _Run, group: _Group) -> str | None:
    key = group.key
    eligible = run.eligible_nodes(group.view, key.topology_key)
    by_domain = run.counted(key.namespace, group.constraint.label_selector, eligible, without=None)
    counts = {d: len(p) for d, p in by_domain.items()}
    skew = _skew(counts, key.min_domains)
    if skew <= key.max_skew:
        return None
    spread = ", ".join(f"{d}: {n}" for d, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    return (
        f"pods of {_describe_selector(group.constraint.label_selector)} in namespace {key.namespace} keep "
        f"skew {skew} > maxSkew {key.max_skew} over {key.topology_key} ({spread or 'no eligible domain'}) "
        "after this cycle's proposals: no further move helps (pods too young, no room in the less-loaded "
        "domains, the scheduler's spread filter, or the eviction limit per constraint)"
    )


# --------------------------------------------------------------------------- gang compaction


def _pack(
    sim: ClusterState,
    members: Sequence[Pod],
    candidates: Sequence[str],
    current: Mapping[str, int],
    limit: int,
) -> tuple[ClusterState, dict[PodKey, str], list[str]] | None:
    """Pack the members onto at most `limit` nodes: greedily the node taking the most of them next."""
    remaining = sorted(members, key=lambda m: (-m.gpu.gpus, m.ref))
    placed: dict[PodKey, str] = {}
    used: list[str] = []
    while remaining:
        if len(used) >= limit:
            return None
        best: tuple[tuple[int, int, str], str, ClusterState, list[Pod]] | None = None
        for name in candidates:
            if name in used or not any(sim.fits(m, name).ok for m in remaining):
                continue
            trial = sim.copy()
            taken: list[Pod] = []
            for member in remaining:
                if trial.fits(member, name).ok:
                    trial.place(member, name)
                    taken.append(member)
            # Most members first, then the node already hosting most of them, then by name.
            rank = (-len(taken), -current.get(name, 0), name)
            if best is None or rank < best[0]:
                best = (rank, name, trial, taken)
        if best is None:
            return None
        _, name, sim, taken = best
        used.append(name)
        placed.update((m.key, name) for m in taken)
        taken_keys = {m.key for m in taken}
        remaining = [m for m in remaining if m.key not in taken_keys]
    return sim, placed, used


def _compact(run: _Run, gang: str, members: tuple[Pod, ...]) -> None:
    snapshot = run.snapshot
    if len(members) < 2 or any(m.key in run.moved for m in members):
        return
    if any(not _old_enough(m, snapshot, run.min_age) for m in members):
        return
    # Members that ask to be spread out (DoNotSchedule) are not packed together.
    if any(c.when_unsatisfiable == HARD for m in members for c in m.topology_spread):
        return
    current: dict[str, int] = defaultdict(int)
    for member in members:
        current[run.location[member.key]] += 1
    if len(current) < 2:
        return
    models = {snapshot.nodes[n].gpu_model for n in current if n in snapshot.nodes}
    candidates = sorted(name for name, node in snapshot.nodes.items() if node.gpu_model in models)
    sim = run.state.copy()
    for member in members:
        sim.remove(member)
    packed = _pack(sim, members, candidates, current, len(current) - 1)
    if packed is None:
        return
    sim, placed, used = packed
    gpus = sum(m.gpu.gpus for m in members)
    model = ", ".join(sorted(m for m in models if m)) or "nodes without a GPU model"
    reason = (
        f"gang {gang} ({plural(len(members), 'pod')}, {gpus:g} GPUs) spans "
        f"{plural(len(current), 'node')} ({', '.join(sorted(current))}) but fits on "
        f"{plural(len(used), 'node')} of {model} ({', '.join(used)}); moving the whole gang"
    )
    packed_onto = DestinationRule(
        f"among the nodes gang {gang} is packed onto ({', '.join(used)})", frozenset(used)
    )
    run.proposals.append(
        Proposal(
            strategy=NAME,
            kind="gang",
            pods=members,
            reason=reason,
            group=gang,
            targets=placed,
            destinations=dict.fromkeys(placed, (packed_onto,)),
        )
    )
    run.state = sim
    for moved_key, name in placed.items():
        run.location[moved_key] = name
        run.moved.add(moved_key)


# --------------------------------------------------------------------------- entry point


@strategy(
    NAME,
    TopologySpreadArgs,
    "evict the fewest pods that bring topologySpreadConstraints back within maxSkew; optionally pack "
    "gangs onto fewer nodes",
)
def topology_spread(snapshot: Snapshot, args: TopologySpreadArgs, ctx: StrategyContext) -> StrategyResult:
    run = _Run(snapshot=snapshot, args=args, ctx=ctx, state=ClusterState.from_snapshot(snapshot))
    hints = [hint for group in _groups(snapshot, args.include_soft) if (hint := _repair(run, group))]
    if args.compact_gangs:
        for gang, members in sorted(snapshot.gangs.items()):
            _compact(run, gang, members)
    # Later moves were planned on top of earlier ones: priorities keep that order in the planner.
    total = len(run.proposals)
    proposals = tuple(replace(p, priority=float(total - index)) for index, p in enumerate(run.proposals))
    return StrategyResult(proposals=proposals, hints=tuple(hints))
