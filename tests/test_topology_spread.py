"""Tests for the `topology-spread` strategy: minimal skew repair and gang compaction."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rebalancer.model import (
    LabelRequirement,
    LabelSelector,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    Proposal,
    Snapshot,
    Taint,
    Toleration,
    TopologySpreadConstraint,
)
from rebalancer.registry import Refusal, StrategyContext, get_strategy
from strategies.topology_spread import TopologySpreadArgs, topology_spread
from tests.builders import H100, node, pod, snapshot

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
TRAINER = {"app": "trainer"}


def spread(
    key: str = ZONE,
    max_skew: int = 1,
    *,
    soft: bool = False,
    min_domains: int | None = None,
    match: Mapping[str, str] = TRAINER,
) -> TopologySpreadConstraint:
    return TopologySpreadConstraint(
        max_skew=max_skew,
        topology_key=key,
        when_unsatisfiable="ScheduleAnyway" if soft else "DoNotSchedule",
        label_selector=LabelSelector(match_labels=dict(match)),
        min_domains=min_domains,
    )


def trainers(
    node_name: str,
    count: int,
    constraints: Sequence[TopologySpreadConstraint],
    *,
    prefix: str | None = None,
    labels: Mapping[str, str] = TRAINER,
    **kwargs: Any,
) -> list[Pod]:
    """`count` pods on the node carrying the constraints, named `<prefix>-<i>`."""
    prefix = prefix or f"t-{node_name}"
    return [
        pod(f"{prefix}-{i}", node_name, labels=labels, topology_spread=constraints, **kwargs)
        for i in range(count)
    ]


def zone_nodes(*zones: str, gpus: int = 32) -> list[Node]:
    return [node(f"gpu-{z[-1]}-1", zone=z, gpus=gpus) for z in zones]


def run(snap: Snapshot, ctx: StrategyContext | None = None, **args: object) -> tuple[Proposal, ...]:
    result = topology_spread(snap, TopologySpreadArgs.model_validate(args), ctx or StrategyContext())
    assert result.skipped is None
    return result.proposals


def moved_to(proposals: Iterable[Proposal]) -> dict[str, str]:
    """Pod name -> predicted target node, over every proposal."""
    return {key[1]: target for p in proposals for key, target in p.targets.items()}


def domain_counts(
    snap: Snapshot, proposals: Iterable[Proposal], key: str, labels: Mapping[str, str] = TRAINER
) -> Counter[str]:
    """Matching pods per domain once the proposals are applied by their predicted targets."""
    targets = moved_to(proposals)
    counts: Counter[str] = Counter()
    for p in snap.pods:
        if p.node_name is None or any(p.labels.get(k) != v for k, v in labels.items()):
            continue
        where = snap.nodes[targets.get(p.name, p.node_name)]
        counts[where.labels[key]] += 1
    return counts


def minimal_evictions(counts: Sequence[int], max_skew: int) -> int:
    """Exhaustive reference: the fewest pods to move so that max - min <= max_skew."""
    total = sum(counts)
    best: int | None = None
    for final in itertools.product(range(total + 1), repeat=len(counts)):
        if sum(final) != total or max(final) - min(final) > max_skew:
            continue
        moves = sum(max(0, c - f) for c, f in zip(counts, final, strict=True))
        best = moves if best is None else min(best, moves)
    assert best is not None
    return best


def cluster_with_counts(counts: Sequence[int], max_skew: int) -> Snapshot:
    """One roomy node per zone, `counts[i]` 1-GPU trainers in zone i."""
    zones = [f"us-east-1{chr(ord('a') + i)}" for i in range(len(counts))]
    nodes = [node(f"gpu-{i}", zone=z, gpus=64, cpu_milli=400_000) for i, z in enumerate(zones)]
    pods: list[Pod] = []
    for i, count in enumerate(counts):
        pods += trainers(f"gpu-{i}", count, [spread(max_skew=max_skew)], cpu_milli=100)
    return snapshot(nodes, pods)


# --------------------------------------------------------------------------- minimal repair


def test_skew_3_with_max_skew_1_is_repaired_with_the_minimal_number_of_evictions() -> None:
    counts = [4, 1]  # skew 3
    snap = cluster_with_counts(counts, max_skew=1)
    proposals = run(snap)
    expected = minimal_evictions(counts, 1)
    assert expected == 1
    assert len(proposals) == expected
    after = domain_counts(snap, proposals, ZONE)
    assert max(after.values()) - min(after.values()) <= 1


@pytest.mark.parametrize(
    ("counts", "max_skew"),
    [
        ([4, 1], 1),
        ([4, 1, 1], 1),
        ([5, 2, 1], 1),
        ([6, 0, 0], 1),
        ([3, 3, 0], 1),
        ([7, 1, 1, 1], 1),
        ([9, 0, 3], 2),
        ([8, 8, 0, 0], 1),
    ],
)
def test_repair_uses_exactly_the_fewest_evictions(counts: list[int], max_skew: int) -> None:
    snap = cluster_with_counts(counts, max_skew)
    proposals = run(snap, max_evictions_per_constraint=100)
    assert len(proposals) == minimal_evictions(counts, max_skew)
    after = domain_counts(snap, proposals, ZONE)
    final = [after.get(snap.nodes[f"gpu-{i}"].labels[ZONE], 0) for i in range(len(counts))]
    assert max(final) - min(final) <= max_skew
    assert all(p.kind == "pod" and len(p.pods) == 1 for p in proposals)


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(min_value=0, max_value=6), min_size=2, max_size=4),
    max_skew=st.integers(min_value=1, max_value=3),
)
def test_greedy_repair_is_optimal_for_any_counts(counts: list[int], max_skew: int) -> None:
    snap = cluster_with_counts(counts, max_skew)
    proposals = run(snap, max_evictions_per_constraint=100)
    assert len(proposals) == minimal_evictions(counts, max_skew)
    after = domain_counts(snap, proposals, ZONE)
    final = [after.get(snap.nodes[f"gpu-{i}"].labels[ZONE], 0) for i in range(len(counts))]
    assert max(final) - min(final) <= max_skew


def test_within_max_skew_proposes_nothing() -> None:
    assert run(cluster_with_counts([3, 2, 2], 1)) == ()


def test_reason_names_domains_counts_skew_and_target() -> None:
    nodes = [*zone_nodes("us-east-1a", "us-east-1b"), node("gpu-c-2", zone="us-east-1c", gpus=32)]
    pods = (
        trainers("gpu-a-1", 4, [spread()])
        + trainers("gpu-b-1", 3, [spread()])
        + trainers("gpu-c-2", 1, [spread()])
    )
    proposals = run(snapshot(nodes, pods))
    assert len(proposals) == 1
    assert proposals[0].reason == (
        "zone us-east-1a has 4 pods of app=trainer, us-east-1c has 1 (skew 3 > maxSkew 1); "
        "moving to gpu-c-2 in us-east-1c"
    )
    assert proposals[0].strategy == "topology-spread"
    assert proposals[0].targets == {proposals[0].pods[0].key: "gpu-c-2"}


def test_moves_are_ordered_by_priority_in_planning_order() -> None:
    proposals = run(cluster_with_counts([6, 0, 0], 1))
    assert len(proposals) == 4
    priorities = [p.priority for p in proposals]
    assert priorities == sorted(priorities, reverse=True)
    assert len(set(priorities)) == len(priorities)


def test_max_evictions_per_constraint_caps_the_repair() -> None:
    snap = cluster_with_counts([6, 0], 1)
    assert len(run(snap)) == 3
    assert len(run(snap, max_evictions_per_constraint=2)) == 2


def test_moves_that_do_not_lower_the_skew_are_not_proposed() -> None:
    snap = cluster_with_counts([3, 3, 0, 0], 1)
    # The first move (3,3,0,0 -> 2,3,1,0) leaves the skew at 3; only the second lowers it.
    assert run(snap, max_evictions_per_constraint=1) == ()
    assert len(run(snap, max_evictions_per_constraint=2)) == 2


def test_a_capped_repair_keeps_only_the_moves_that_lower_the_skew() -> None:
    snap = cluster_with_counts([4, 4, 0, 0], 1)
    assert len(run(snap)) == minimal_evictions([4, 4, 0, 0], 1) == 4
    # Skews after each move: 4, 2, 2, 0. With room for three, the third would be for nothing.
    assert len(run(snap, max_evictions_per_constraint=3)) == 2


# --------------------------------------------------------------------------- domains


def test_hostname_topology_key() -> None:
    nodes = [node("gpu-1"), node("gpu-2"), node("gpu-3")]
    pods = trainers("gpu-1", 3, [spread(HOST)])
    proposals = run(snapshot(nodes, pods))
    assert len(proposals) == minimal_evictions([3, 0, 0], 1) == 2
    assert sorted(moved_to(proposals).values()) == ["gpu-2", "gpu-3"]
    assert proposals[0].reason.startswith("node gpu-1 has 3 pods of app=trainer, gpu-2 has 0 (skew 3")
    assert proposals[0].reason.endswith("moving to gpu-2")


def test_empty_eligible_domain_counts_as_zero_and_receives_pods() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b", "us-east-1c")
    pods = trainers("gpu-a-1", 3, [spread()]) + trainers("gpu-b-1", 3, [spread()])
    proposals = run(snapshot(nodes, pods))
    assert len(proposals) == minimal_evictions([3, 3, 0], 1) == 2
    assert set(moved_to(proposals).values()) == {"gpu-c-1"}


def test_nodes_without_the_topology_key_are_no_domain() -> None:
    nodes = [*zone_nodes("us-east-1a", "us-east-1b"), node("gpu-nozone", zone=None)]
    pods = trainers("gpu-a-1", 2, [spread()]) + trainers("gpu-b-1", 2, [spread()])
    assert run(snapshot(nodes, pods)) == ()


def test_min_domains_counts_missing_domains_as_zero() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    pods = trainers("gpu-a-1", 3, [spread(max_skew=2, min_domains=3)]) + trainers(
        "gpu-b-1", 1, [spread(max_skew=2, min_domains=3)]
    )
    # Two domains of the three required: the global minimum is 0, so the skew is 3 > 2.
    proposals = run(snapshot(nodes, pods))
    assert len(proposals) == 1
    assert moved_to(proposals) == {proposals[0].pods[0].name: "gpu-b-1"}
    assert "only 2 of minDomains 3 domains" in proposals[0].reason
    # Without minDomains the same placement has skew 2, within bounds.
    plain = trainers("gpu-a-1", 3, [spread(max_skew=2)]) + trainers("gpu-b-1", 1, [spread(max_skew=2)])
    assert run(snapshot(nodes, plain)) == ()


def test_min_domains_move_the_scheduler_would_refuse_is_not_proposed() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    constraint = spread(max_skew=1, min_domains=3)
    pods = trainers("gpu-a-1", 3, [constraint]) + trainers("gpu-b-1", 1, [constraint])
    # Skew 3, but a replacement in us-east-1b would make 2 - 0 > maxSkew 1: it would stay Pending.
    assert run(snapshot(nodes, pods)) == ()


def test_node_affinity_restricts_eligible_domains() -> None:
    pool = {"pool": "train"}
    nodes = [
        node("gpu-a-1", zone="us-east-1a", labels=pool),
        node("gpu-b-1", zone="us-east-1b", labels=pool),
        node("gpu-c-1", zone="us-east-1c", labels={"pool": "other"}),
    ]
    pods = trainers("gpu-a-1", 3, [spread()], node_selector=pool) + trainers(
        "gpu-b-1", 1, [spread()], node_selector=pool
    )
    # us-east-1c is not a domain for these pods: 3 vs 1 needs one move, into us-east-1b.
    proposals = run(snapshot(nodes, pods))
    assert len(proposals) == 1
    assert list(moved_to(proposals).values()) == ["gpu-b-1"]

    # The same cluster without the selector sees the empty zone: one move, into us-east-1c.
    free = trainers("gpu-a-1", 3, [spread()]) + trainers("gpu-b-1", 1, [spread()])
    assert list(moved_to(run(snapshot(nodes, free))).values()) == ["gpu-c-1"]


def test_required_node_affinity_restricts_eligible_domains() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b", "us-east-1c")
    not_c = NodeSelectorTerm(match_expressions=(NodeSelectorRequirement(ZONE, "NotIn", ("us-east-1c",)),))
    pods = trainers("gpu-a-1", 3, [spread()], required_affinity=[not_c]) + trainers(
        "gpu-b-1", 1, [spread()], required_affinity=[not_c]
    )
    proposals = run(snapshot(nodes, pods))
    assert list(moved_to(proposals).values()) == ["gpu-b-1"]


def test_pods_on_ineligible_nodes_are_not_counted() -> None:
    pool = {"pool": "train"}
    nodes = [
        node("gpu-a-1", zone="us-east-1a", labels=pool),
        node("gpu-a-2", zone="us-east-1a", labels={"pool": "other"}),
        node("gpu-b-1", zone="us-east-1b", labels=pool),
    ]
    # A trainer without the selector sits on gpu-a-2: not counted for the selector's view of zone a.
    pods = [
        *trainers("gpu-a-1", 2, [spread()], node_selector=pool),
        *trainers("gpu-b-1", 1, [spread()], node_selector=pool),
        pod("stray", "gpu-a-2", labels=TRAINER),
    ]
    assert run(snapshot(nodes, pods)) == ()


# --------------------------------------------------------------------------- placement


def test_target_domain_full_means_no_proposal() -> None:
    nodes = [node("gpu-a-1", zone="us-east-1a"), node("gpu-b-1", zone="us-east-1b", gpus=4)]
    blockers = [pod(f"other-{i}", "gpu-b-1", labels={"app": "other"}) for i in range(4)]
    pods = trainers("gpu-a-1", 3, [spread()]) + blockers
    snap = snapshot(nodes, pods)
    result = topology_spread(snap, TopologySpreadArgs(), StrategyContext())
    assert result.proposals == ()
    # The operator hears why the violation stays.
    assert len(result.hints) == 1
    assert "app=trainer in namespace ml keep skew 3 > maxSkew 1" in result.hints[0]
    assert "us-east-1a: 3, us-east-1b: 0" in result.hints[0]


def test_a_full_repair_leaves_no_hint() -> None:
    result = topology_spread(cluster_with_counts([4, 1], 1), TopologySpreadArgs(), StrategyContext())
    assert len(result.proposals) == 1
    assert result.hints == ()


def test_target_is_a_node_of_the_target_domain_with_room() -> None:
    nodes = [
        node("gpu-a-1", zone="us-east-1a"),
        node("gpu-b-1", zone="us-east-1b", gpus=2),
        node("gpu-b-2", zone="us-east-1b", gpus=8),
        node("gpu-c-1", zone="us-east-1c", gpus=8),
    ]
    blockers = [pod(f"other-{i}", "gpu-b-1", labels={"app": "other"}) for i in range(2)]
    pods = trainers("gpu-a-1", 3, [spread()]) + trainers("gpu-c-1", 1, [spread()]) + blockers
    proposals = run(snapshot(nodes, pods))
    assert len(proposals) == 1
    assert list(moved_to(proposals).values()) == ["gpu-b-2"]


def test_only_pods_that_fit_the_target_domain_move() -> None:
    nodes = [
        node("gpu-a-1", zone="us-east-1a"),
        node("gpu-b-1", zone="us-east-1b", taints=[Taint("dedicated", "train")]),
    ]
    tolerate = [Toleration(key="dedicated", operator="Equal", value="train")]
    pods = [
        # The newest (the preferred candidate) does not tolerate the target domain's taint.
        pod("newest", "gpu-a-1", labels=TRAINER, topology_spread=[spread()], age=timedelta(hours=1)),
        pod("older", "gpu-a-1", labels=TRAINER, topology_spread=[spread()], tolerations=tolerate),
        pod("oldest", "gpu-a-1", labels=TRAINER, topology_spread=[spread()], age=timedelta(days=3)),
    ]
    proposals = run(snapshot(nodes, pods))
    assert moved_to(proposals) == {"older": "gpu-b-1"}


def test_reservations_are_carried_across_moves() -> None:
    # Zone b has room for exactly one 1-GPU pod: two moves may not both count on it.
    nodes = [
        node("gpu-a-1", zone="us-east-1a"),
        node("gpu-b-1", zone="us-east-1b", gpus=1),
        node("gpu-c-1", zone="us-east-1c", gpus=1),
    ]
    pods = trainers("gpu-a-1", 5, [spread()])
    proposals = run(snapshot(nodes, pods))
    assert sorted(moved_to(proposals).values()) == ["gpu-b-1", "gpu-c-1"]


# --------------------------------------------------------------------------- which constraints


def test_soft_constraints_only_with_include_soft() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    pods = trainers("gpu-a-1", 4, [spread(soft=True)])
    snap = snapshot(nodes, pods)
    assert run(snap) == ()
    proposals = run(snap, include_soft=True)
    assert len(proposals) == minimal_evictions([4, 0], 1) == 2
    assert all("ScheduleAnyway" in p.reason for p in proposals)


def test_pods_not_matching_the_selector_do_not_count() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    others = [pod(f"other-{i}", "gpu-b-1", labels={"app": "other"}) for i in range(3)]
    pods = trainers("gpu-a-1", 3, [spread()]) + others
    proposals = run(snapshot(nodes, pods))
    assert len(proposals) == minimal_evictions([3, 0], 1) == 1
    assert all(p.pods[0].labels == TRAINER for p in proposals)


def test_selector_with_match_expressions() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    selector = LabelSelector(match_expressions=(LabelRequirement("app", "In", ("trainer", "eval")),))
    constraint = TopologySpreadConstraint(1, ZONE, "DoNotSchedule", selector)
    pods = [
        *trainers("gpu-a-1", 2, [constraint]),
        *trainers("gpu-a-1", 2, [constraint], prefix="eval", labels={"app": "eval"}),
        *trainers("gpu-b-1", 1, [constraint]),
    ]
    proposals = run(snapshot(nodes, pods))
    assert len(proposals) == minimal_evictions([4, 1], 1)
    assert "app in (trainer,eval)" in proposals[0].reason


def test_pods_without_the_constraint_are_counted_but_not_moved() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    # Two plain trainers (no constraint) and two constrained ones in zone a: 4 vs 0 needs two moves,
    # and only the constrained pods may be moved.
    pods = trainers("gpu-a-1", 2, [spread()]) + [
        pod(f"plain-{i}", "gpu-a-1", labels=TRAINER, age=timedelta(minutes=30)) for i in range(2)
    ]
    proposals = run(snapshot(nodes, pods))
    assert sorted(moved_to(proposals)) == ["t-gpu-a-1-0", "t-gpu-a-1-1"]


def test_other_namespaces_do_not_count() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    pods = trainers("gpu-a-1", 2, [spread()]) + [
        pod(f"far-{i}", "gpu-b-1", namespace="team-b", labels=TRAINER) for i in range(2)
    ]
    assert len(run(snapshot(nodes, pods))) == minimal_evictions([2, 0], 1)


def test_multiple_constraints_on_the_same_pods_are_all_respected() -> None:
    nodes = [
        node("gpu-a-1", zone="us-east-1a"),
        node("gpu-a-2", zone="us-east-1a"),
        node("gpu-b-1", zone="us-east-1b"),
        node("gpu-b-2", zone="us-east-1b"),
    ]
    both = [spread(ZONE), spread(HOST)]
    pods = trainers("gpu-a-1", 2, both) + trainers("gpu-a-2", 2, both)
    snap = snapshot(nodes, pods)
    proposals = run(snap)
    # Zone: 4 vs 0 needs 2 moves; hostname: 2,2,0,0 also needs 2; the same two moves fix both, and
    # the hostname constraint keeps the packed scheduler from stacking both on one zone-b node.
    assert len(proposals) == 2
    assert sorted(moved_to(proposals).values()) == ["gpu-b-1", "gpu-b-2"]
    zones = domain_counts(snap, proposals, ZONE)
    hosts = domain_counts(snap, proposals, HOST)
    assert max(zones.values()) - min(zones.values()) <= 1
    assert sorted(hosts.values()) == [1, 1, 1, 1]


def test_other_hard_constraints_filter_the_target_node() -> None:
    nodes = [node(f"gpu-a-{i}", zone="us-east-1a") for i in range(1, 5)] + [
        node("gpu-b-1", zone="us-east-1b"),
        node("gpu-b-2", zone="us-east-1b"),
    ]
    both = [spread(ZONE), spread(HOST)]
    # One trainer per zone-a node: the hostname constraint holds, the zone one (4 vs 0) does not.
    pods = [p for i in range(1, 5) for p in trainers(f"gpu-a-{i}", 1, both)]
    snap = snapshot(nodes, pods)
    proposals = run(snap)
    assert len(proposals) == 2
    # The packed scheduler alone would stack both on gpu-b-1; the hostname constraint forbids it.
    assert sorted(moved_to(proposals).values()) == ["gpu-b-1", "gpu-b-2"]
    hosts = domain_counts(snap, proposals, HOST)
    assert max(hosts.values()) <= 1


def test_independent_constraints_are_repaired_independently() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b", "us-east-1c")
    web = {"app": "web"}
    pods = [
        *trainers("gpu-a-1", 4, [spread()]),
        *trainers("gpu-b-1", 5, [spread(match=web)], prefix="web", labels=web),
    ]
    proposals = run(snapshot(nodes, pods))
    trainer_moves = [p for p in proposals if p.pods[0].labels == TRAINER]
    web_moves = [p for p in proposals if p.pods[0].labels == web]
    assert len(trainer_moves) == minimal_evictions([4, 0, 0], 1)
    assert len(web_moves) == minimal_evictions([5, 0, 0], 1)


# --------------------------------------------------------------------------- candidate choice


def test_too_young_pods_are_not_moved() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    young = trainers("gpu-a-1", 3, [spread()], age=timedelta(minutes=5))
    snap = snapshot(nodes, young)
    assert run(snap) == ()
    assert len(run(snap, min_pod_age="1m")) == 1


def test_young_pods_are_skipped_for_older_ones() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    pods = [
        pod("young", "gpu-a-1", labels=TRAINER, topology_spread=[spread()], age=timedelta(minutes=5)),
        pod("mid", "gpu-a-1", labels=TRAINER, topology_spread=[spread()], age=timedelta(hours=2)),
        pod("old", "gpu-a-1", labels=TRAINER, topology_spread=[spread()], age=timedelta(days=2)),
    ]
    assert moved_to(run(snapshot(nodes, pods))) == {"mid": "gpu-b-1"}


def test_prefers_fewest_gpus_then_newest() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    pods = [
        pod("big-new", "gpu-a-1", gpus=4, labels=TRAINER, topology_spread=[spread()], age=timedelta(hours=1)),
        pod("small-old", "gpu-a-1", labels=TRAINER, topology_spread=[spread()], age=timedelta(days=3)),
        pod("small-new", "gpu-a-1", labels=TRAINER, topology_spread=[spread()], age=timedelta(hours=2)),
    ]
    assert moved_to(run(snapshot(nodes, pods))) == {"small-new": "gpu-b-1"}


def test_prefers_pods_no_guard_refuses_but_does_not_filter_them() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    pods = [
        pod("opted-out", "gpu-a-1", labels=TRAINER, topology_spread=[spread()], age=timedelta(hours=1)),
        pod("movable", "gpu-a-1", labels=TRAINER, topology_spread=[spread()], age=timedelta(days=2)),
        pod("also-old", "gpu-a-1", labels=TRAINER, topology_spread=[spread()], age=timedelta(days=3)),
    ]
    snap = snapshot(nodes, pods)

    def refuse_opted_out(p: Pod) -> Refusal | None:
        return Refusal("opt-out", "annotated") if p.name == "opted-out" else None

    assert moved_to(run(snap, StrategyContext(refusal=refuse_opted_out))) == {"movable": "gpu-b-1"}

    def refuse_all(_p: Pod) -> Refusal | None:
        return Refusal("opt-out", "annotated")

    # Everything refused: still proposed (the planner refuses and reports), newest first.
    assert moved_to(run(snap, StrategyContext(refusal=refuse_all))) == {"opted-out": "gpu-b-1"}
    # A pod the history holds back this cycle (its workload cooling down) is passed over alike.
    cooling = StrategyContext(history_refusal=refuse_opted_out)
    assert moved_to(run(snap, cooling)) == {"movable": "gpu-b-1"}


def test_gang_member_violating_skew_moves_its_whole_gang() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    pods = [
        *trainers("gpu-a-1", 2, [spread()], gang="ml/job-1", prefix="job"),
        pod("solo", "gpu-a-1", gpus=4, labels=TRAINER, topology_spread=[spread()]),
    ]
    # The gang costs 2 GPUs, the solo pod 4: the gang is cheaper and moves whole.
    proposals = run(snapshot(nodes, pods))
    assert len(proposals) == 1
    proposal = proposals[0]
    assert proposal.kind == "gang"
    assert proposal.group == "ml/job-1"
    assert {p.name for p in proposal.pods} == {"job-0", "job-1"}
    assert set(proposal.targets) == {p.key for p in proposal.pods}
    assert "gang ml/job-1" in proposal.reason


# --------------------------------------------------------------------------- gang compaction


def spread_gang(nodes_and_counts: Mapping[str, int], gang: str = "ml/job-1", gpus: int = 1) -> list[Pod]:
    pods: list[Pod] = []
    index = 0
    for node_name, count in nodes_and_counts.items():
        for _ in range(count):
            pods.append(pod(f"worker-{index}", node_name, gpus=gpus, gang=gang, labels={"job": "1"}))
            index += 1
    return pods


def test_compact_gangs_off_proposes_nothing() -> None:
    nodes = [node("gpu-1"), node("gpu-2"), node("gpu-3")]
    snap = snapshot(nodes, spread_gang({"gpu-1": 2, "gpu-2": 1, "gpu-3": 1}))
    assert run(snap) == ()


def test_compact_gangs_packs_the_whole_gang_onto_fewer_nodes() -> None:
    nodes = [node("gpu-1"), node("gpu-2"), node("gpu-3")]
    members = spread_gang({"gpu-1": 2, "gpu-2": 1, "gpu-3": 1})
    snap = snapshot(nodes, members)
    proposals = run(snap, compact_gangs=True)
    assert len(proposals) == 1
    proposal = proposals[0]
    assert proposal.kind == "gang"
    assert proposal.group == "ml/job-1"
    # Every active member is in the proposal (the planner's gang guard), each with a target.
    assert {p.key for p in proposal.pods} == {p.key for p in members}
    assert set(proposal.targets.values()) == {"gpu-1"}
    assert "spans 3 nodes" in proposal.reason
    assert "fits on 1 node" in proposal.reason


def test_compaction_respects_capacity_and_gpu_model() -> None:
    # Each A100 node has 4 GPUs taken by others: the 8-GPU gang cannot share one; an empty H100 could,
    # but it is another model.
    nodes = [node("gpu-1"), node("gpu-2"), node("h100-1", model=H100)]
    others = [pod(f"other-{n}", n, gpus=4, labels={"app": "other"}) for n in ("gpu-1", "gpu-2")]
    snap = snapshot(nodes, spread_gang({"gpu-1": 1, "gpu-2": 1}, gpus=4) + others)
    assert run(snap, compact_gangs=True) == ()


def test_compaction_only_when_it_reduces_the_node_count() -> None:
    nodes = [node("gpu-1", gpus=4), node("gpu-2", gpus=4), node("gpu-3", gpus=4)]
    # 12 GPUs on three 4-GPU nodes: no fewer nodes can hold it.
    snap = snapshot(nodes, spread_gang({"gpu-1": 4, "gpu-2": 4, "gpu-3": 4}))
    assert run(snap, compact_gangs=True) == ()


def test_compaction_moves_stragglers_to_fewer_nodes_preferring_current_hosts() -> None:
    nodes = [node("gpu-1", gpus=4), node("gpu-2", gpus=4), node("gpu-3", gpus=4), node("gpu-4", gpus=4)]
    # 6 GPUs over three nodes; two nodes suffice, and gpu-1 (3 members) keeps its pods.
    snap = snapshot(nodes, spread_gang({"gpu-1": 3, "gpu-2": 2, "gpu-3": 1}))
    proposals = run(snap, compact_gangs=True)
    assert len(proposals) == 1
    targets = Counter(proposals[0].targets.values())
    assert len(targets) == 2
    assert targets["gpu-1"] == 4


def test_young_gangs_are_not_compacted() -> None:
    nodes = [node("gpu-1"), node("gpu-2")]
    members = [pod(f"w-{i}", f"gpu-{i + 1}", gang="ml/job-2", age=timedelta(minutes=1)) for i in range(2)]
    assert run(snapshot(nodes, members), compact_gangs=True) == ()


def test_gang_on_one_node_is_left_alone() -> None:
    nodes = [node("gpu-1"), node("gpu-2")]
    assert run(snapshot(nodes, spread_gang({"gpu-1": 3})), compact_gangs=True) == ()


# --------------------------------------------------------------------------- args and registry


def test_args_defaults_and_validation() -> None:
    args = TopologySpreadArgs()
    assert args.include_soft is False
    assert args.compact_gangs is False
    assert args.min_pod_age == 600
    assert args.max_evictions_per_constraint == 10
    assert TopologySpreadArgs.model_validate({"min_pod_age": "1h30m"}).min_pod_age == 5400
    with pytest.raises(ValidationError):
        TopologySpreadArgs.model_validate({"max_evictions_per_constraint": 0})
    with pytest.raises(ValidationError):
        TopologySpreadArgs.model_validate({"maxSkew": 1})


def test_registered_under_its_name() -> None:
    spec = get_strategy("topology-spread")
    assert spec is not None
    assert spec.args_model is TopologySpreadArgs
    result = spec.run(cluster_with_counts([4, 1], 1), TopologySpreadArgs(), StrategyContext())
    assert len(result.proposals) == 1


def test_snapshot_is_not_mutated_and_runs_are_deterministic() -> None:
    snap = cluster_with_counts([5, 1, 0], 1)
    before = (dict(snap.nodes), snap.pods)
    first = run(snap)
    assert run(snap) == first
    assert (dict(snap.nodes), snap.pods) == before


# --------------------------------------------------------------------------- with the planner


def test_planner_approves_skew_moves_and_whole_gang_compaction_as_proposed() -> None:
    from rebalancer.planner import plan
    from rebalancer.policy import LimitsConfig, Policy

    nodes = [*zone_nodes("us-east-1a", "us-east-1b"), node("gpu-1"), node("gpu-2"), node("gpu-3")]
    pods = trainers("gpu-a-1", 4, [spread()]) + spread_gang({"gpu-1": 2, "gpu-2": 1, "gpu-3": 1})
    snap = snapshot(nodes, pods)
    proposals = run(snap, compact_gangs=True)
    assert [p.kind for p in proposals] == ["pod", "pod", "gang"]
    ordered = sorted(proposals, key=lambda p: -p.priority)
    no_limits = LimitsConfig(max_per_cycle=None, max_per_namespace=None, max_per_node=None)
    decisions = plan(ordered, snap, Policy(limits=no_limits))
    assert [d.blocked_by for d in decisions] == [None, None, None]
    assert all(d.approved for d in decisions)
    for decision in decisions:
        assert dict(decision.targets) == dict(decision.proposal.targets)


# --------------------------------------------------------------------------- destination rules


def test_a_repaired_pod_may_be_re_placed_only_in_the_domain_the_repair_chose() -> None:
    nodes = [node("a-1", zone="a"), node("b-1", zone="b"), node("b-2", zone="b")]
    snap = snapshot(nodes, trainers("a-1", 3, [spread()]))
    [proposal] = topology_spread(snap, TopologySpreadArgs(), StrategyContext()).proposals
    [moved] = proposal.pods
    [rule] = proposal.destinations[moved.key]
    assert (rule.nodes, rule.outside) == (frozenset({"b-1", "b-2"}), False)
    assert rule.text == "in zone b"
