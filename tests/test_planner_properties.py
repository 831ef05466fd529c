"""Planner invariants over random clusters and random proposals (hypothesis).

Whatever the strategies propose, in whatever order, the approved decisions never spend more than a
PDB allows, never split a gang, never exceed a limit, approve proposals whole, and never predict a
destination that would overcommit a node's GPUs or land on a node being drained.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rebalancer.guards import pod_refusal
from rebalancer.model import Decision, LabelSelector, Pdb, Pod, Proposal, ProposalKind, Snapshot
from rebalancer.planner import plan
from rebalancer.policy import LimitsConfig, Policy
from tests.builders import node, pod, snapshot

NAMESPACES = ("a", "b")
APPS = ("x", "y", "z")


@dataclass(frozen=True)
class Case:
    snap: Snapshot
    proposals: tuple[Proposal, ...]
    policy: Policy


def covers(pdb: Pdb, p: Pod) -> bool:
    """Independent re-statement of PDB selection for the plain match_labels selectors generated here."""
    return p.namespace == pdb.namespace and all(
        p.labels.get(k) == v for k, v in pdb.selector.match_labels.items()
    )


@st.composite
def cases(draw: st.DrawFn) -> Case:
    node_count = draw(st.integers(1, 5))
    gpu_counts = [draw(st.sampled_from((0, 2, 4, 8))) for _ in range(node_count)]
    nodes = [
        node(
            f"n{i}",
            gpus=gpus,
            unschedulable=draw(st.booleans()) and draw(st.booleans()),
            annotations={"karpenter.sh/do-not-disrupt": "true"} if draw(st.integers(0, 9)) == 0 else {},
        )
        for i, gpus in enumerate(gpu_counts)
    ]
    free = dict(enumerate(gpu_counts))
    pods: list[Pod] = []
    for i in range(draw(st.integers(0, 16))):
        where = draw(st.integers(0, node_count - 1))
        gpus = min(draw(st.integers(0, 2)), free[where])
        free[where] -= gpus
        pods.append(
            pod(
                f"p{i}",
                f"n{where}",
                namespace=draw(st.sampled_from(NAMESPACES)),
                gpus=gpus,
                cpu_milli=1000,
                labels={"app": draw(st.sampled_from(APPS))},
                gang=draw(st.sampled_from((None, None, "g1", "g2"))),
                annotations={"rebalancer.gpu/evict": "false"} if draw(st.integers(0, 11)) == 0 else {},
                age=timedelta(minutes=1) if draw(st.integers(0, 11)) == 0 else timedelta(days=1),
            )
        )
    pdbs = [
        Pdb(
            namespace=draw(st.sampled_from(NAMESPACES)),
            name=f"pdb{i}",
            selector=LabelSelector(match_labels=draw(st.sampled_from(({}, *({"app": app} for app in APPS))))),
            disruptions_allowed=draw(st.integers(-1, 3)),
        )
        for i in range(draw(st.integers(0, 3)))
    ]
    snap = snapshot(nodes, pods, pdbs)

    proposals: list[Proposal] = []
    node_names = [n.name for n in nodes]
    for i in range(draw(st.integers(0, 8)) if pods else 0):
        kind: ProposalKind = draw(st.sampled_from(("pod", "gang", "node")))
        drained: str | None = None
        if kind == "node":
            drained = draw(st.sampled_from(node_names))
            chosen = list(snap.pods_on(drained))
            drop_one: bool = draw(st.integers(0, 3)) == 0
            if chosen and drop_one:
                chosen.pop(draw(st.integers(0, len(chosen) - 1)))
        elif kind == "gang" and snap.gangs:
            members = list(snap.gangs[draw(st.sampled_from(sorted(snap.gangs)))])
            if draw(st.integers(0, 3)) == 0:
                members.pop(draw(st.integers(0, len(members) - 1)))
            chosen = members
        else:
            chosen = draw(st.lists(st.sampled_from(pods), min_size=1, max_size=3))
        targets: Mapping[tuple[str, str], str] = {
            p.key: draw(st.sampled_from(node_names)) for p in chosen if draw(st.integers(0, 3)) == 0
        }
        proposals.append(
            Proposal(
                strategy=f"s{i % 2}",
                kind=kind,
                pods=tuple(chosen),
                reason="random",
                node=drained,
                targets=targets,
            )
        )

    limits = LimitsConfig(
        max_per_node=draw(st.one_of(st.none(), st.integers(1, 4))),
        max_per_namespace=draw(st.one_of(st.none(), st.integers(1, 5))),
        max_per_cycle=draw(st.one_of(st.none(), st.integers(1, 8))),
    )
    return Case(snap, tuple(proposals), Policy(limits=limits))


def approved_pods(decisions: tuple[Decision, ...]) -> list[Pod]:
    by_key = {p.key: p for d in decisions for p in d.proposal.pods}
    return [by_key[key] for d in decisions if d.approved for key in d.targets]


PROPERTY_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@PROPERTY_SETTINGS
@given(cases())
def test_one_decision_per_proposal_each_approved_whole(case: Case) -> None:
    decisions = plan(case.proposals, case.snap, case.policy)
    assert [d.proposal for d in decisions] == list(case.proposals)
    seen: set[tuple[str, str]] = set()
    for decision in decisions:
        wanted = {p.key for p in decision.proposal.pods} - seen
        if decision.approved:
            assert decision.blocked_by is None
            assert set(decision.targets) == wanted
            if decision.proposal.pods:
                assert wanted, "an approved proposal evicts something new"
            seen |= wanted
        else:
            assert decision.blocked_by is not None
            assert decision.reason
            assert decision.targets == {}
            if decision.blocked_pod is not None:
                assert decision.blocked_pod in {p.key for p in decision.proposal.pods}


@PROPERTY_SETTINGS
@given(cases())
def test_pdbs_limits_and_gangs_are_never_exceeded(case: Case) -> None:
    decisions = plan(case.proposals, case.snap, case.policy)
    evicted = approved_pods(decisions)
    keys = [p.key for p in evicted]
    assert len(keys) == len(set(keys)), "no pod is evicted twice"

    for budget in case.snap.pdbs:
        spent = sum(1 for p in evicted if covers(budget, p))
        assert spent <= max(0, budget.disruptions_allowed), budget

    moved = set(keys)
    for gang, members in case.snap.gangs.items():
        inside = {m.key for m in members} & moved
        assert not inside or inside == {m.key for m in members}, gang

    limits = case.policy.limits
    if limits.max_per_cycle is not None:
        assert len(evicted) <= limits.max_per_cycle
    if limits.max_per_namespace is not None:
        assert max(Counter(p.namespace for p in evicted).values(), default=0) <= limits.max_per_namespace
    if limits.max_per_node is not None:
        assert max(Counter(p.node_name for p in evicted).values(), default=0) <= limits.max_per_node

    for p in evicted:
        assert pod_refusal(p, case.snap, case.policy.guards) is None


@PROPERTY_SETTINGS
@given(cases())
def test_predicted_destinations_respect_capacity_and_drains(case: Case) -> None:
    decisions = plan(case.proposals, case.snap, case.policy)
    evicted = {p.key: p for p in approved_pods(decisions)}
    drained = {d.proposal.node for d in decisions if d.approved and d.proposal.kind == "node"}
    used: Counter[str] = Counter()
    for p in case.snap.pods:
        if p.key not in evicted and p.node_name is not None:
            used[p.node_name] += p.gpu.count
    for decision in decisions:
        for key, target in decision.targets.items():
            assert target in case.snap.nodes
            assert target not in drained, "nothing lands on a node being drained"
            assert not case.snap.nodes[target].unschedulable
            used[target] += evicted[key].gpu.count
    for name, gpus in used.items():
        assert gpus <= case.snap.nodes[name].gpu_count, name
