"""The `gpu-affinity` strategy: move pods off nodes their node affinity no longer allows.

Owns the judgement "this pod sits on a node its required node affinity or nodeSelector rejects now
(a relabelled GPU model, a changed pool label), and an allowed node can take it". Each candidate is
re-placed in a placement simulation (`rebalancer.placement.ClusterState`) shared by the whole run, so
reservations carry across this strategy's own proposals and two pods are never both sent to the same
last free GPU. Each proposal carries what its destination must be, should an earlier proposal of the
cycle fill the predicted one: not a node the pod leaves, and for a preferred move a node matching a
preferred term (the pod's required affinity the placement enforces anyway). A gang moves whole,
only when every member can be placed together. A violating pod no allowed node can take yields an
`affinity-violation` finding instead of a proposal. With
`preferred: true` it also moves pods whose node matches none of their preferred node affinity terms
to a preferred node with room now; required violations always rank (and reserve) first. Every active
pod it looks at and does not propose gets a `NotChosen` record saying why (no rule to check, its node
matches, too young, no allowed node or no room, its gang cannot move together, a gang not moved for
a preference).

This module must stay pure: no I/O, no clock (it reads `snapshot.now`), no cluster clients. It must
not apply safety guards (PDBs, opt-out annotations, limits): the planner does, and re-checks the
predicted targets against its own ledger (re-placing a pod under those rules when its target is full).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import chain
from typing import Final

from rebalancer.memo import MISSING, NodeMemo, ObjectMemo, same_objects
from rebalancer.model import (
    DestinationRule,
    Finding,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    NotChosen,
    Pod,
    Proposal,
    Snapshot,
    StrategyResult,
)
from rebalancer.placement import ClusterState
from rebalancer.policy import Duration, format_duration
from rebalancer.registry import StrategyArgs, StrategyContext, strategy
from rebalancer.selectors import (
    node_selector_matches,
    preferred_affinity_score,
    required_affinity_matches,
)

NAME = "gpu-affinity"
FINDING_KIND: Final = "affinity-violation"
# The reasons (`NotChosen.reason`) shared by many pods: one string each, not one per pod.
_NO_RULE = "no nodeSelector or required node affinity to check"
_NO_RULE_PREFERRED_OFF = (
    "no nodeSelector or required node affinity to check (preferred terms are checked with preferred: true)"
)
_SATISFIED = "its node matches its nodeSelector and required node affinity"
# Required violations outrank every preferred move, whatever the GPUs or weights involved.
REQUIRED_PRIORITY = 1000.0
PREFERRED_PRIORITY_CAP = 999.0


class GpuAffinityArgs(StrategyArgs):
    """Arguments of `gpu-affinity`. Durations accept `30s`, `5m`, `1h30m` or seconds."""

    preferred: bool = False
    """Also move pods whose node matches none of their preferred node affinity terms, when a node that
    matches a preferred term has room now."""
    min_pod_age: Duration = 600
    """Pods younger than this (since start, else creation; unknown counts as young) are left alone."""


@dataclass(frozen=True, slots=True)
class _Violation:
    pod: Pod
    node: Node
    what: str  # "nodeSelector a=b (node has c)" / "required affinity k In [v]"


# --------------------------------------------------------------------------- descriptions


def _requirement_text(requirement: NodeSelectorRequirement) -> str:
    if requirement.operator in ("In", "NotIn"):
        return f"{requirement.key} {requirement.operator} [{', '.join(requirement.values)}]"
    if requirement.operator in ("Exists", "DoesNotExist"):
        return f"{requirement.key} {requirement.operator}"
    return f"{requirement.key} {requirement.operator} {' '.join(requirement.values)}".rstrip()


def _term_text(term: NodeSelectorTerm) -> str:
    parts = [_requirement_text(r) for r in term.match_expressions]
    parts += [_requirement_text(r) for r in term.match_fields]
    return " and ".join(parts) if parts else "(empty term)"


def _terms_text(terms: Sequence[NodeSelectorTerm]) -> str:
    texts = [_term_text(term) for term in terms]
    if len(texts) == 1:
        return texts[0]
    return " or ".join(f"({text})" for text in texts)


def _node_text(node: Node) -> str:
    return f"node {node.name} ({node.gpu_model})" if node.gpu_model else f"node {node.name}"


def _violation(pod: Pod, node: Node) -> _Violation | None:
    problems: list[str] = []
    if not node_selector_matches(pod, node):
        pairs = [
            f"{key}={value} (node has {node.labels.get(key, 'no such label')})"
            for key, value in sorted(pod.node_selector.items())
            if node.labels.get(key) != value
        ]
        problems.append(f"nodeSelector {', '.join(pairs)}")
    if not required_affinity_matches(pod, node):
        problems.append(f"required affinity {_terms_text(pod.required_affinity)}")
    if not problems:
        return None
    return _Violation(pod=pod, node=node, what=" and ".join(problems))


def _violation_text(violation: _Violation) -> str:
    return f"{_node_text(violation.node)} no longer matches {violation.what}"


def _allowed_nodes(pod: Pod, snapshot: Snapshot) -> list[str]:
    return [
        name
        for name, node in snapshot.nodes.items()
        if name != pod.node_name and node_selector_matches(pod, node) and required_affinity_matches(pod, node)
    ]


def _no_room(pod: Pod, snapshot: Snapshot) -> tuple[str, str]:
    """The `NotChosen` code and the words for a violating pod no allowed node can take."""
    allowed = _allowed_nodes(pod, snapshot)
    if not allowed:
        return "no-allowed-node", "no other node matches its node affinity"
    count = len(allowed)
    return (
        "no-room",
        f"none of the {count} {'node' if count == 1 else 'nodes'} its affinity allows can take it now",
    )


def _left(pod: Pod, code: str, reason: str) -> NotChosen:
    return NotChosen(NAME, pod.node_name, code, reason, namespace=pod.namespace, pod=pod.name)


# --------------------------------------------------------------------------- helpers


def _leaving(nodes: Sequence[str], why: str) -> DestinationRule:
    """The rule that a pod does not go back to a node it leaves (`why`: what makes it leave)."""
    names = f"{'node' if len(nodes) == 1 else 'nodes'} {', '.join(nodes)}"
    return DestinationRule(f"other than {names}, which {why}", frozenset(nodes), outside=True)


def _old_enough(pod: Pod, snapshot: Snapshot, args: GpuAffinityArgs) -> bool:
    start = pod.started or pod.created
    return start is not None and snapshot.now - start >= timedelta(seconds=args.min_pod_age)


def _placed(snapshot: Snapshot) -> Iterable[tuple[Pod, Node]]:
    """Active pods on a node of the snapshot, with their node."""
    for pod in snapshot.pods:
        if not pod.is_active or pod.node_name is None or pod.terminating:
            continue
        node = snapshot.nodes.get(pod.node_name)
        if node is not None:
            yield pod, node


def _too_young(args: GpuAffinityArgs) -> str:
    return f"younger than min_pod_age {format_duration(args.min_pod_age)} (or of unknown age)"


def _finding(violation: _Violation, detail: str) -> Finding:
    pod = violation.pod
    return Finding(
        kind=FINDING_KIND,
        node=violation.node.name,
        namespace=pod.namespace,
        pod=pod.name,
        detail=f"{_violation_text(violation)}; {detail}",
    )


# --------------------------------------------------------------------------- required


@dataclass
class _Outcome:
    """What the run has concluded so far: proposals, findings, and the pods left alone with why."""

    proposals: list[Proposal] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    left: list[NotChosen] = field(default_factory=list)
    # Pods proposed or already given their record: the last pass leaves them be.
    judged: set[tuple[str, str]] = field(default_factory=set)

    def leave(self, pod: Pod, code: str, reason: str) -> None:
        self.left.append(_left(pod, code, reason))
        self.judged.add(pod.key)


def _single(violation: _Violation, state: ClusterState, snapshot: Snapshot, out: _Outcome) -> None:
    pod = violation.pod
    out.judged.add(pod.key)
    target = state.best_node(pod, exclude={violation.node.name})
    if target is None:
        code, words = _no_room(pod, snapshot)
        out.findings.append(_finding(violation, words))
        out.leave(pod, code, f"{_violation_text(violation)}; {words}")
        return
    state.place(pod, target)
    out.proposals.append(
        Proposal(
            strategy=NAME,
            kind="pod",
            pods=(pod,),
            reason=f"{_violation_text(violation)}; predicted target {target}",
            priority=REQUIRED_PRIORITY + pod.gpu.gpus,
            node=violation.node.name,
            targets={pod.key: target},
            destinations={pod.key: (_leaving((violation.node.name,), "its affinity no longer allows"),)},
        )
    )


def _gang(
    gang: str,
    members: Sequence[Pod],
    violations: Sequence[_Violation],
    state: ClusterState,
    out: _Outcome,
) -> None:
    exclude = {v.node.name for v in violations}
    targets = state.place_all(members, exclude=exclude)
    if targets is None:
        detail = f"its gang {gang} ({len(members)} pods) cannot be re-placed together on allowed nodes"
        out.findings.extend(_finding(v, detail) for v in violations)
        why = {v.pod.key: _violation_text(v) for v in violations}
        violating = ", ".join(v.pod.ref for v in violations)
        for member in members:
            said = why.get(member.key, f"its gang's {violating} violates its affinity")
            out.leave(member, "gang-cannot-move", f"{said}; {detail}")
        return
    out.judged.update(pod.key for pod in members)
    moved = ", ".join(f"{pod.name} -> {targets[pod.key]}" for pod in members)
    why_all = "; ".join(f"{v.pod.name}: {_violation_text(v)}" for v in violations)
    out.proposals.append(
        Proposal(
            strategy=NAME,
            kind="gang",
            pods=tuple(members),
            reason=f"gang {gang}: {why_all}; predicted targets {moved}",
            priority=REQUIRED_PRIORITY + sum(pod.gpu.gpus for pod in members),
            group=gang,
            targets=targets,
            destinations=dict.fromkeys(
                targets, (_leaving(sorted(exclude), f"gang {gang}'s affinity no longer allows"),)
            ),
        )
    )


def _first_look(pod: Pod, node: Node, preferred: bool) -> NotChosen | str | None:
    """What the first pass finds of a pod on its node: what it violates (a required rule), the record
    of a pod left alone (its node matches, or it has no rule), or None for a pod the later passes judge
    (a gang member, a pod with preferred terms under `preferred`). Kept per pod object while its node
    object and `preferred` are the same (`rebalancer.memo`): it depends on nothing else."""
    kept = _FIRST_LOOK.get(pod)
    if kept is not MISSING and kept[0] is node and kept[1] == preferred:
        return kept[2]
    # A pod without a nodeSelector or required affinity matches every node: skip the matching.
    has_rule = bool(pod.node_selector or pod.required_affinity)
    violation = _violation(pod, node) if has_rule else None
    found: NotChosen | str | None
    if violation is not None:
        found = violation.what
    elif pod.gang is not None or (preferred and pod.preferred_affinity):
        found = None
    elif has_rule:
        found = _left(pod, "affinity-satisfied", _SATISFIED)
    else:
        no_rule = _NO_RULE_PREFERRED_OFF if not preferred else _NO_RULE
        found = _left(pod, "no-rule", no_rule if pod.preferred_affinity else _NO_RULE)
    _FIRST_LOOK.put(pod, (node, preferred, found))
    return found


_FIRST_LOOK: ObjectMemo[Pod, tuple[Node, bool, NotChosen | str | None]] = ObjectMemo()


class _NodeLooks:
    """The first looks at the pods of one node (not terminating), in order: when none violates, the
    records of the pods left alone and the pods the later passes judge, per `preferred` (cached)."""

    __slots__ = ("_found", "node", "pods")

    def __init__(self, node: Node, pods: tuple[Pod, ...]) -> None:
        self.node = node
        self.pods = tuple(pod for pod in pods if not pod.terminating)
        self._found: dict[bool, tuple[tuple[NotChosen, ...], tuple[tuple[Pod, Node], ...]] | None] = {}

    def without_violations(
        self, preferred: bool
    ) -> tuple[tuple[NotChosen, ...], tuple[tuple[Pod, Node], ...]] | None:
        """The records and the pods left to later passes; None when some pod violates its rules."""
        if preferred in self._found:
            return self._found[preferred]
        left: list[NotChosen] = []
        rest: list[tuple[Pod, Node]] = []
        found: tuple[tuple[NotChosen, ...], tuple[tuple[Pod, Node], ...]] | None = None
        for pod in self.pods:
            look = _first_look(pod, self.node, preferred)
            if look is None:
                rest.append((pod, self.node))
            elif isinstance(look, NotChosen):
                left.append(look)
            else:
                break
        else:
            found = (tuple(left), tuple(rest))
        self._found[preferred] = found
        return found


# Kept from one snapshot to the next while the node and its pods are the same objects.
_NODE_LOOKS: NodeMemo[_NodeLooks] = NodeMemo(_NodeLooks)


def _grouped_by_node(snapshot: Snapshot) -> bool:
    """Whether the snapshot's pods are those of its nodes, node by node in the nodes' order, all active:
    then looking at them node by node looks at them in their order."""
    by_node = snapshot.pods_by_node
    in_node_order = tuple(chain.from_iterable(by_node.get(name, ()) for name in snapshot.nodes))
    return same_objects(in_node_order, snapshot.pods)


def _required(
    snapshot: Snapshot, args: GpuAffinityArgs, state: ClusterState, out: _Outcome
) -> list[tuple[Pod, Node]]:
    """Proposals, findings and records for required violations, and at once the record of every pod
    that cannot be moved at all (one pass over the pods); the others it returns, for the preferred
    pass and the last one: a gang member (its gang may move) and, with `preferred`, a pod with
    preferred terms."""
    violations: list[_Violation] = []
    rest: list[tuple[Pod, Node]] = []

    def look(pod: Pod, node: Node) -> None:
        found = _first_look(pod, node, args.preferred)
        if found is None:
            rest.append((pod, node))
        elif isinstance(found, NotChosen):
            out.left.append(found)
        else:
            violation = _Violation(pod=pod, node=node, what=found)
            if _old_enough(pod, snapshot, args):
                violations.append(violation)
            else:
                out.leave(pod, "too-young", f"{_violation_text(violation)}; {_too_young(args)}")

    if _grouped_by_node(snapshot):  # node by node: what a node's first looks found is kept with it
        for name in snapshot.nodes:
            looks = _NODE_LOOKS(snapshot, name)
            found = looks.without_violations(args.preferred)
            if found is None:
                for pod in looks.pods:
                    look(pod, looks.node)
            else:
                out.left.extend(found[0])
                rest.extend(found[1])
    else:
        for pod, node in _placed(snapshot):
            look(pod, node)
    by_gang: dict[str, list[_Violation]] = {}
    for v in violations:
        if v.pod.gang is not None:
            by_gang.setdefault(v.pod.gang, []).append(v)

    gangs_done: set[str] = set()
    for v in violations:
        gang = v.pod.gang
        if gang is None:
            _single(v, state, snapshot, out)
            continue
        if gang in gangs_done:
            continue
        gangs_done.add(gang)
        members = snapshot.gangs.get(gang, (v.pod,))
        _gang(gang, members, by_gang[gang], state, out)
    return rest


# --------------------------------------------------------------------------- preferred


def _preferred_target(
    pod: Pod, current: Node, state: ClusterState, snapshot: Snapshot
) -> tuple[str, int] | None:
    """The node matching the heaviest preferred terms that can take the pod now, and that weight.

    Ties go to the fullest node (as a packed scheduler would choose), then to the first name.
    """
    ranked: list[tuple[int, float, str]] = []
    for name, node in snapshot.nodes.items():
        if name == current.name:
            continue
        weight = preferred_affinity_score(pod, node)
        if weight > 0 and state.fits(pod, name).ok:
            ranked.append((-weight, -state.score(pod, name), name))
    if not ranked:
        return None
    weight, _, name = min(ranked)
    return name, -weight


def _preferred(
    snapshot: Snapshot,
    state: ClusterState,
    out: _Outcome,
    args: GpuAffinityArgs,
    pods: list[tuple[Pod, Node]],
) -> None:
    for pod, node in pods:
        if pod.key in out.judged or not pod.preferred_affinity:
            continue
        if pod.gang is not None:
            out.leave(pod, "gang-kept-together", "a gang is not moved for a preferred node affinity")
            continue
        if preferred_affinity_score(pod, node) > 0:
            out.leave(pod, "preferred-satisfied", f"{_node_text(node)} matches a preferred affinity term")
            continue
        if not _old_enough(pod, snapshot, args):
            out.leave(pod, "too-young", f"not on a preferred node; {_too_young(args)}")
            continue
        found = _preferred_target(pod, node, state, snapshot)
        if found is None:
            out.leave(
                pod,
                "no-preferred-room",
                f"{_node_text(node)} matches none of its preferred affinity terms; "
                "no node that matches one can take it now",
            )
            continue
        target, weight = found
        state.place(pod, target)
        out.judged.add(pod.key)
        terms = "; ".join(
            f"weight {p.weight}: {_term_text(p.term)}"
            for p in sorted(pod.preferred_affinity, key=lambda p: -p.weight)
        )
        out.proposals.append(
            Proposal(
                strategy=NAME,
                kind="pod",
                pods=(pod,),
                reason=(
                    f"{_node_text(node)} matches none of the preferred affinity terms ({terms}); "
                    f"preferred node {target} (weight {weight}) has room now; predicted target {target}"
                ),
                priority=min(float(weight), PREFERRED_PRIORITY_CAP),
                node=node.name,
                targets={pod.key: target},
                destinations={pod.key: (_preferred_rule(pod, snapshot),)},
            )
        )


def _preferred_rule(pod: Pod, snapshot: Snapshot) -> DestinationRule:
    """A preferred move lands on a node matching one of the pod's preferred terms, or is pointless."""
    nodes = frozenset(
        name for name, node in snapshot.nodes.items() if preferred_affinity_score(pod, node) > 0
    )
    return DestinationRule("matching one of its preferred node affinity terms", nodes)


def _the_rest(args: GpuAffinityArgs, out: _Outcome, pods: list[tuple[Pod, Node]]) -> None:
    """The pods left of `pods`: nothing to check, or its node matches what it requires."""
    no_rule = _NO_RULE_PREFERRED_OFF if not args.preferred else _NO_RULE
    for pod, _ in pods:
        if pod.key in out.judged:
            continue
        if pod.node_selector or pod.required_affinity:
            out.left.append(_left(pod, "affinity-satisfied", _SATISFIED))
        else:
            reason = no_rule if pod.preferred_affinity else _NO_RULE
            out.left.append(_left(pod, "no-rule", reason))


# --------------------------------------------------------------------------- strategy


@strategy(
    NAME,
    GpuAffinityArgs,
    "Evict pods whose node no longer satisfies their node affinity, when they fit elsewhere",
)
def gpu_affinity(snapshot: Snapshot, args: GpuAffinityArgs, ctx: StrategyContext) -> StrategyResult:
    state = ClusterState.from_snapshot(snapshot)
    out = _Outcome()
    rest = _required(snapshot, args, state, out)
    if args.preferred:
        _preferred(snapshot, state, out, args, rest)
    _the_rest(args, out, rest)
    return StrategyResult(
        proposals=tuple(out.proposals), findings=tuple(out.findings), not_chosen=tuple(out.left)
    )
