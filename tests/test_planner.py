"""The planner: guards with budgets spent across a cycle, whole-or-nothing decisions, reservations."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import pytest

from rebalancer.history import DisruptionHistory
from rebalancer.model import (
    Decision,
    DestinationRule,
    LabelRequirement,
    LabelSelector,
    OwnerRef,
    Pdb,
    Pod,
    Proposal,
    ProposalKind,
    Snapshot,
)
from rebalancer.planner import Ledger, history_refusal, plan
from rebalancer.policy import GuardsConfig, LimitsConfig, Policy
from tests.builders import NOW, node, pdb, pod, snapshot

POLICY = Policy()
NO_LIMITS = Policy(limits=LimitsConfig(max_per_cycle=None))


def proposal(
    *pods: Pod,
    kind: ProposalKind = "pod",
    node_name: str | None = None,
    targets: Mapping[tuple[str, str], str] | None = None,
    group: str | None = None,
    destinations: Mapping[tuple[str, str], tuple[DestinationRule, ...]] | None = None,
) -> Proposal:
    return Proposal(
        strategy="test",
        kind=kind,
        pods=pods,
        reason="because",
        node=node_name,
        group=group,
        targets=dict(targets or {}),
        destinations=dict(destinations or {}),
    )


def drain(snap: Snapshot, name: str) -> Proposal:
    return Proposal(strategy="test", kind="node", pods=snap.pods_on(name), reason="drain", node=name)


def approved_keys(decisions: tuple[Decision, ...]) -> set[tuple[str, str]]:
    return {key for d in decisions if d.approved for key in d.targets}


def roomy_cluster(*pods: Pod, pdbs: tuple[Pdb, ...] = ()) -> Snapshot:
    """Pods on gpu-a-1 and gpu-a-2 (8 GPUs each), plus an empty 8-GPU gpu-b-1 to move to."""
    return snapshot([node("gpu-a-1"), node("gpu-a-2"), node("gpu-b-1")], pods, pdbs)


# --------------------------------------------------------------------------- basics


def test_one_decision_per_proposal_in_the_given_order() -> None:
    pods = [pod(f"p{i}", "gpu-a-1") for i in range(3)]
    snap = roomy_cluster(*pods)
    proposals = [proposal(p) for p in reversed(pods)]
    decisions = plan(proposals, snap, POLICY)
    assert [d.proposal for d in decisions] == proposals
    assert all(d.approved for d in decisions)
    assert all(d.blocked_by is None and d.blocked_pod is None for d in decisions)


def test_empty_input_plans_nothing() -> None:
    assert plan([], roomy_cluster(), POLICY) == ()


def test_approved_decision_predicts_a_node_for_every_pod() -> None:
    p = pod("p0", "gpu-a-1", gpus=2)
    decision = plan([proposal(p)], roomy_cluster(p), POLICY)[0]
    assert decision.approved
    assert set(decision.targets) == {p.key}
    assert decision.targets[p.key] in {"gpu-a-1", "gpu-a-2", "gpu-b-1"}


# --------------------------------------------------------------------------- static guards in the planner


def test_node_proposal_with_one_opted_out_pod_is_refused_whole() -> None:
    ok = [pod(f"ok-{i}", "gpu-a-1") for i in range(3)]
    stay = pod("stay", "gpu-a-1", annotations={"rebalancer.gpu/evict": "false"})
    snap = roomy_cluster(*ok[:2], stay, ok[2])
    decision = plan([drain(snap, "gpu-a-1")], snap, POLICY)[0]
    assert not decision.approved
    assert decision.blocked_by == "opt-out"
    assert decision.blocked_pod == ("ml", "stay")
    assert decision.reason == 'ml/stay: pod has annotation rebalancer.gpu/evict: "false"'
    assert decision.targets == {}


def test_refused_proposal_spends_no_budget() -> None:
    policy = Policy(limits=LimitsConfig(max_per_cycle=2))
    a, b = pod("a", "gpu-a-1"), pod("b", "gpu-a-1")
    young = pod("young", "gpu-a-1", age=timedelta(minutes=1))
    snap = roomy_cluster(a, b, young)
    decisions = plan([proposal(young, a), proposal(a), proposal(b)], snap, policy)
    assert [d.approved for d in decisions] == [False, True, True]
    assert decisions[0].blocked_by == "min-pod-age"
    assert decisions[0].blocked_pod == young.key


def test_node_opt_out_refuses_a_drain() -> None:
    n = node("gpu-a-1", annotations={"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"})
    p = pod("p", "gpu-a-1")
    snap = snapshot([n, node("gpu-b-1")], [p])
    decision = plan([drain(snap, "gpu-a-1")], snap, POLICY)[0]
    assert decision.blocked_by == "opt-out"
    assert decision.blocked_pod is None
    assert (
        "node gpu-a-1 has annotation cluster-autoscaler.kubernetes.io/scale-down-disabled" in decision.reason
    )


def test_node_opt_out_does_not_apply_to_single_pod_proposals() -> None:
    n = node("gpu-a-1", annotations={"karpenter.sh/do-not-disrupt": "true"})
    p = pod("p", "gpu-a-1")
    snap = snapshot([n, node("gpu-b-1")], [p])
    assert plan([proposal(p)], snap, POLICY)[0].approved


def test_planner_uses_the_policy_guards_config() -> None:
    bare = pod("bare", "gpu-a-1", owner=None)
    snap = roomy_cluster(bare)
    assert plan([proposal(bare)], snap, POLICY)[0].blocked_by == "bare-pod"
    allowing = Policy(guards=GuardsConfig(evict_bare_pods=True))
    assert plan([proposal(bare)], snap, allowing)[0].approved


# --------------------------------------------------------------------------- duplicate


def test_pod_already_approved_is_refused_as_duplicate() -> None:
    p = pod("p", "gpu-a-1")
    snap = roomy_cluster(p)
    first, second = plan([proposal(p), proposal(p)], snap, POLICY)
    assert first.approved
    assert not second.approved
    assert second.blocked_by == "duplicate"
    assert "ml/p" in second.reason


def test_overlapping_proposal_keeps_only_new_pods_and_counts_them_once() -> None:
    a, b = pod("a", "gpu-a-1"), pod("b", "gpu-a-1")
    snap = roomy_cluster(a, b)
    policy = Policy(limits=LimitsConfig(max_per_cycle=2))
    first, second = plan([proposal(a, targets={a.key: "gpu-b-1"}), drain(snap, "gpu-a-1")], snap, policy)
    assert first.approved and second.approved
    assert set(second.targets) == {b.key}
    assert "gpu-a-1" not in second.targets.values()


def test_pod_listed_twice_in_one_proposal_counts_once() -> None:
    p = pod("p", "gpu-a-1")
    snap = roomy_cluster(p, pdbs=(pdb("one", {"app": "p"}, 1),))
    decision = plan([proposal(p, p)], snap, POLICY)[0]
    assert decision.approved
    assert set(decision.targets) == {p.key}


# --------------------------------------------------------------------------- gang


def test_gang_proposal_missing_a_member_is_refused() -> None:
    members = [pod(f"w{i}", "gpu-a-1", gang="ml/job") for i in range(3)]
    snap = roomy_cluster(*members)
    decision = plan([proposal(*members[:2], kind="gang", group="ml/job")], snap, POLICY)[0]
    assert not decision.approved
    assert decision.blocked_by == "gang"
    assert decision.blocked_pod == ("ml", "w0")
    assert "ml/w2" in decision.reason
    assert "gang ml/job" in decision.reason


def test_single_pod_of_a_gang_is_refused() -> None:
    members = [pod(f"w{i}", "gpu-a-1", gang="ml/job") for i in range(2)]
    snap = roomy_cluster(*members)
    assert plan([proposal(members[0])], snap, POLICY)[0].blocked_by == "gang"


def test_whole_gang_is_approved_and_finished_members_do_not_count() -> None:
    members = [pod(f"w{i}", "gpu-a-1", gang="ml/job") for i in range(3)]
    done = pod("w-done", "gpu-a-1", gang="ml/job", phase="Succeeded")
    snap = roomy_cluster(*members, done)
    decision = plan([proposal(*members, kind="gang", group="ml/job")], snap, POLICY)[0]
    assert decision.approved
    assert set(decision.targets) == {m.key for m in members}


def test_gang_members_spread_over_a_drain_and_an_earlier_approval() -> None:
    w0, w1 = pod("w0", "gpu-a-1", gang="ml/job"), pod("w1", "gpu-a-2", gang="ml/job")
    snap = roomy_cluster(w0, w1)
    gang_first = plan([proposal(w0, w1, kind="gang"), drain(snap, "gpu-a-1")], snap, POLICY)
    assert [d.blocked_by for d in gang_first] == [None, "duplicate"]
    drain_first = plan([drain(snap, "gpu-a-1")], snap, POLICY)[0]
    assert drain_first.blocked_by == "gang"


# --------------------------------------------------------------------------- limits


def test_cycle_limit() -> None:
    pods = [pod(f"p{i}", "gpu-a-1") for i in range(3)]
    snap = roomy_cluster(*pods)
    policy = Policy(limits=LimitsConfig(max_per_cycle=2))
    decisions = plan([proposal(p) for p in pods], snap, policy)
    assert [d.approved for d in decisions] == [True, True, False]
    assert decisions[2].blocked_by == "limit-cycle"
    assert decisions[2].blocked_pod == pods[2].key
    assert "limit of 2 evictions per cycle" in decisions[2].reason


def test_cycle_limit_counts_the_proposal_on_top_of_approved() -> None:
    pods = [pod(f"p{i}", "gpu-a-1") for i in range(4)]
    snap = roomy_cluster(*pods)
    policy = Policy(limits=LimitsConfig(max_per_cycle=3))
    decisions = plan([proposal(pods[0], pods[1]), proposal(pods[2], pods[3])], snap, policy)
    assert [d.approved for d in decisions] == [True, False]
    assert decisions[1].blocked_pod == pods[3].key
    assert "(2 approved, this proposal adds 2)" in decisions[1].reason


def test_namespace_limit() -> None:
    ml = [pod(f"ml{i}", "gpu-a-1") for i in range(2)]
    other = pod("cv0", "gpu-a-1", namespace="vision")
    snap = roomy_cluster(*ml, other)
    policy = Policy(limits=LimitsConfig(max_per_namespace=1, max_per_cycle=None))
    decisions = plan([proposal(ml[0]), proposal(ml[1]), proposal(other)], snap, policy)
    assert [d.blocked_by for d in decisions] == [None, "limit-namespace", None]
    assert "per namespace is reached for namespace ml" in decisions[1].reason


def test_node_limit_counts_evictions_per_source_node() -> None:
    a = [pod(f"a{i}", "gpu-a-1") for i in range(3)]
    b = pod("b0", "gpu-a-2")
    snap = roomy_cluster(*a, b)
    policy = Policy(limits=LimitsConfig(max_per_node=2, max_per_cycle=None))
    decisions = plan([proposal(a[0]), proposal(a[1]), proposal(a[2]), proposal(b)], snap, policy)
    assert [d.blocked_by for d in decisions] == [None, None, "limit-node", None]
    assert "for node gpu-a-1" in decisions[2].reason


def test_node_limit_refuses_draining_a_node_with_too_many_pods() -> None:
    pods = [pod(f"a{i}", "gpu-a-1") for i in range(3)]
    snap = roomy_cluster(*pods)
    policy = Policy(limits=LimitsConfig(max_per_node=2))
    decision = plan([drain(snap, "gpu-a-1")], snap, policy)[0]
    assert decision.blocked_by == "limit-node"
    assert decision.blocked_pod == pods[2].key


def test_unlimited_limits() -> None:
    pods = [pod(f"p{i}", "gpu-a-1") for i in range(8)]
    snap = roomy_cluster(*pods)
    unlimited = Policy(limits=LimitsConfig(max_per_node=None, max_per_namespace=None, max_per_cycle=None))
    assert all(d.approved for d in plan([proposal(p) for p in pods], snap, unlimited))


# --------------------------------------------------------------------------- cooldown


def test_workload_recently_disrupted_is_in_cooldown() -> None:
    p = pod("p", "gpu-a-1", owner=OwnerRef(kind="StatefulSet", name="trainer"))
    snap = roomy_cluster(p)
    recent = DisruptionHistory(workloads={("ml", "StatefulSet", "trainer"): NOW - timedelta(minutes=10)})
    decision = plan([proposal(p)], snap, POLICY, history=recent)[0]
    assert decision.blocked_by == "cooldown"
    assert decision.blocked_pod == p.key
    assert "StatefulSet ml/trainer was disrupted 10m ago, within the cooldown of 30m" in decision.reason


def test_cooldown_expires() -> None:
    p = pod("p", "gpu-a-1", owner=OwnerRef(kind="StatefulSet", name="trainer"))
    snap = roomy_cluster(p)
    old = DisruptionHistory(workloads={("ml", "StatefulSet", "trainer"): NOW - timedelta(minutes=30)})
    assert plan([proposal(p)], snap, POLICY, history=old)[0].approved
    other = DisruptionHistory(workloads={("ml", "StatefulSet", "other"): NOW})
    assert plan([proposal(p)], snap, POLICY, history=other)[0].approved


def test_recently_drained_node_is_in_cooldown() -> None:
    p = pod("p", "gpu-a-1")
    snap = roomy_cluster(p)
    history = DisruptionHistory(nodes={"gpu-a-1": NOW - timedelta(minutes=5)})
    decision = plan([drain(snap, "gpu-a-1")], snap, POLICY, history=history)[0]
    assert decision.blocked_by == "cooldown"
    assert decision.reason == "node gpu-a-1 was drained 5m ago, within the cooldown of 30m"
    # The node's history only matters to drains, not to a single pod's move.
    assert plan([proposal(p)], snap, POLICY, history=history)[0].approved


def test_zero_cooldown_disables_the_guard() -> None:
    p = pod("p", "gpu-a-1")
    snap = roomy_cluster(p)
    history = DisruptionHistory(nodes={"gpu-a-1": NOW}, workloads={("ml", "ReplicaSet", "trainer-abc"): NOW})
    policy = Policy(guards=GuardsConfig(cooldown=0))
    assert plan([drain(snap, "gpu-a-1")], snap, policy, history=history)[0].approved


@pytest.mark.parametrize(
    ("history", "guard"),
    [
        (
            DisruptionHistory(workloads={("ml", "StatefulSet", "trainer"): NOW - timedelta(minutes=10)}),
            "cooldown",
        ),
        (DisruptionHistory(disruptions={("ml", "StatefulSet", "trainer"): (NOW,) * 3}), "disruption-budget"),
        (DisruptionHistory(workloads={("ml", "StatefulSet", "other"): NOW}), None),
    ],
)
def test_history_refusal_is_what_the_planner_refuses_a_pod_for(
    history: DisruptionHistory, guard: str | None
) -> None:
    # What the strategies are told of one pod is the planner's own verdict on it, reason and all.
    p = pod("p", "gpu-a-1", owner=OwnerRef(kind="StatefulSet", name="trainer"))
    policy = Policy(guards=GuardsConfig(max_disruptions_per_workload=3))
    decision = plan([proposal(p)], roomy_cluster(p), policy, history=history)[0]
    refusal = history_refusal(p, history, NOW, policy.guards)
    assert decision.blocked_by == guard
    assert (refusal.guard if refusal is not None else None) == guard
    if refusal is not None:
        assert refusal.reason in decision.reason
    # A pod without a controller has no workload: nothing in the history refuses it.
    bare = pod("bare", "gpu-a-1", owner=None)
    assert history_refusal(bare, history, NOW, policy.guards) is None


def test_a_workload_disrupted_too_often_in_the_window_is_refused() -> None:
    p = pod("p", "gpu-a-1", owner=OwnerRef(kind="StatefulSet", name="trainer"))
    snap = roomy_cluster(p)
    key = ("ml", "StatefulSet", "trainer")
    hours = (2, 9, 20)
    three = DisruptionHistory(disruptions={key: tuple(NOW - timedelta(hours=h) for h in hours)})
    budget = Policy(guards=GuardsConfig(max_disruptions_per_workload=3, disruption_window=86400))
    decision = plan([proposal(p)], snap, budget, history=three)[0]
    assert decision.blocked_by == "disruption-budget"
    assert decision.blocked_pod == p.key
    assert decision.reason == (
        "ml/p: workload StatefulSet ml/trainer was disrupted 3 times in the last 1d "
        "(max_disruptions_per_workload: 3)"
    )
    # One of them older than the window (24h): two left, under the budget.
    older = DisruptionHistory(disruptions={key: (NOW - timedelta(hours=25), *three.disruptions[key][1:])})
    assert plan([proposal(p)], snap, budget, history=older)[0].approved
    # Another workload's disruptions do not count; no budget lifts the limit.
    other = DisruptionHistory(disruptions={("ml", "StatefulSet", "other"): three.disruptions[key]})
    assert plan([proposal(p)], snap, budget, history=other)[0].approved
    unlimited = Policy(guards=GuardsConfig(max_disruptions_per_workload=None))
    assert plan([proposal(p)], snap, unlimited, history=three)[0].approved
    # The default: 3 within a week, so the one 25h ago still counts.
    assert (POLICY.guards.max_disruptions_per_workload, POLICY.guards.disruption_window) == (3, 7 * 86400)
    assert plan([proposal(p)], snap, POLICY, history=older)[0].blocked_by == "disruption-budget"


# --------------------------------------------------------------------------- pdb


def test_two_proposals_together_exceeding_a_pdb() -> None:
    pods = [pod(f"train-{i}", "gpu-a-1", labels={"app": "train"}) for i in range(4)]
    snap = roomy_cluster(*pods, pdbs=(pdb("train-pdb", {"app": "train"}, 1),))
    first, second = plan([proposal(pods[0]), proposal(pods[3])], snap, POLICY)
    assert first.approved
    assert not second.approved
    assert second.blocked_by == "pdb"
    assert second.blocked_pod == ("ml", "train-3")
    assert second.reason == "ml/train-3: PDB ml/train-pdb allows 0 more disruptions"


def test_one_proposal_needing_more_than_the_budget_names_the_first_pod_over_it() -> None:
    pods = [pod(f"train-{i}", "gpu-a-1", labels={"app": "train"}) for i in range(3)]
    snap = roomy_cluster(*pods, pdbs=(pdb("train-pdb", {"app": "train"}, 2),))
    decision = plan([drain(snap, "gpu-a-1")], snap, POLICY)[0]
    assert decision.blocked_by == "pdb"
    assert decision.blocked_pod == ("ml", "train-2")
    assert decision.reason == "ml/train-2: PDB ml/train-pdb allows 2 more disruptions, this proposal needs 3"
    # The refusal spent nothing: two single moves still fit the budget.
    decisions = plan([drain(snap, "gpu-a-1"), proposal(pods[0]), proposal(pods[1])], snap, POLICY)
    assert [d.approved for d in decisions] == [False, True, True]


def test_pdb_budget_is_shared_by_every_strategy_of_the_cycle() -> None:
    pods = [pod(f"s{i}", "gpu-a-1", labels={"app": "serve"}) for i in range(3)]
    snap = roomy_cluster(*pods, pdbs=(pdb("serve", {"app": "serve"}, 2),))
    proposals = [Proposal(strategy="idle-gpu", kind="pod", pods=(p,), reason="idle") for p in pods]
    assert [d.approved for d in plan(proposals, snap, POLICY)] == [True, True, False]


def test_pdbs_of_other_namespaces_or_other_labels_do_not_apply() -> None:
    p = pod("p", "gpu-a-1", labels={"app": "train"})
    pdbs = (
        pdb("elsewhere", {"app": "train"}, 0, namespace="vision"),
        pdb("other-app", {"app": "serve"}, 0),
    )
    assert plan([proposal(p)], roomy_cluster(p, pdbs=pdbs), POLICY)[0].approved


def test_empty_pdb_selector_covers_the_whole_namespace() -> None:
    p = pod("p", "gpu-a-1")
    everything = Pdb(namespace="ml", name="all", selector=LabelSelector(), disruptions_allowed=0)
    decision = plan([proposal(p)], roomy_cluster(p, pdbs=(everything,)), POLICY)[0]
    assert decision.reason == "ml/p: PDB ml/all allows 0 more disruptions"


def test_pdb_match_expressions() -> None:
    gpu = pod("gpu", "gpu-a-1", labels={"tier": "gpu"})
    cpu = pod("cpu", "gpu-a-1", labels={"tier": "cpu"})
    selector = LabelSelector(match_expressions=(LabelRequirement("tier", "In", ("gpu",)),))
    budget = Pdb(namespace="ml", name="gpu-tier", selector=selector, disruptions_allowed=0)
    decisions = plan([proposal(gpu), proposal(cpu)], roomy_cluster(gpu, cpu, pdbs=(budget,)), POLICY)
    assert [d.blocked_by for d in decisions] == ["pdb", None]


def test_pod_under_two_pdbs_is_refused() -> None:
    p = pod("p", "gpu-a-1", labels={"app": "train", "team": "a"})
    pdbs = (pdb("by-app", {"app": "train"}, 5), pdb("by-team", {"team": "a"}, 5))
    decision = plan([proposal(p)], roomy_cluster(p, pdbs=pdbs), POLICY)[0]
    assert decision.blocked_by == "pdb"
    assert "more than one PodDisruptionBudget selects it (ml/by-app, ml/by-team)" in decision.reason


def test_negative_disruptions_allowed_counts_as_zero() -> None:
    p = pod("p", "gpu-a-1")
    snap = roomy_cluster(p, pdbs=(pdb("broken", {"app": "p"}, -2),))
    decision = plan([proposal(p)], snap, POLICY)[0]
    assert decision.reason == "ml/p: PDB ml/broken allows 0 more disruptions"


def test_ledger_starts_from_disruptions_allowed() -> None:
    snap = roomy_cluster(pdbs=(pdb("a", {"app": "a"}, 3), pdb("b", {"app": "b"}, 0, namespace="x")))
    ledger = Ledger.start(snap)
    assert ledger.pdb_remaining == {("ml", "a"): 3, ("x", "b"): 0}
    assert ledger.cycle == 0
    assert not ledger.approved


# --------------------------------------------------------------------------- no-fit and reservations


def one_free_gpu_cluster(movers: int) -> tuple[Snapshot, list[Pod]]:
    """Pods on a cordoned node; the only free GPU of the cluster is one on gpu-b-1."""
    pods = [pod(f"m{i}", "gpu-old") for i in range(movers)]
    filler = pod("filler", "gpu-b-1", gpus=7)
    nodes = [node("gpu-old", unschedulable=True), node("gpu-b-1")]
    return snapshot(nodes, [*pods, filler]), pods


def test_reservations_carry_across_proposals() -> None:
    snap, pods = one_free_gpu_cluster(3)
    decisions = plan([proposal(p) for p in pods], snap, NO_LIMITS)
    assert [d.approved for d in decisions] == [True, False, False]
    assert decisions[0].targets == {pods[0].key: "gpu-b-1"}
    for refused, p in zip(decisions[1:], pods[1:], strict=True):
        assert refused.blocked_by == "no-fit"
        assert refused.blocked_pod == p.key
        assert refused.reason.startswith(f"{p.ref}: ")


def test_no_fit_is_all_or_nothing() -> None:
    snap, pods = one_free_gpu_cluster(2)
    decisions = plan([proposal(*pods, kind="gang"), proposal(pods[1])], snap, NO_LIMITS)
    # The two-pod proposal cannot fit whole, so it reserves nothing and the single move still fits.
    assert [d.blocked_by for d in decisions] == ["no-fit", None]


def test_drained_node_is_not_a_destination_and_stays_cordoned() -> None:
    a = [pod(f"a{i}", "gpu-a-1") for i in range(2)]
    b = pod("b0", "gpu-a-2", gpus=8)
    snap = snapshot([node("gpu-a-1"), node("gpu-a-2"), node("gpu-c-1", gpus=2)], [*a, b])
    first, second = plan([drain(snap, "gpu-a-1"), proposal(b)], snap, NO_LIMITS)
    assert first.approved
    assert set(first.targets.values()) == {"gpu-c-1"}
    # b needs 8 GPUs: gpu-a-1 is empty now but cordoned, gpu-a-2 is its own node.
    assert second.approved
    assert second.targets == {b.key: "gpu-a-2"}


def test_drain_without_room_elsewhere_is_refused() -> None:
    a = [pod(f"a{i}", "gpu-a-1", gpus=4) for i in range(2)]
    snap = snapshot([node("gpu-a-1"), node("gpu-b-1", gpus=4)], a)
    decision = plan([drain(snap, "gpu-a-1")], snap, NO_LIMITS)[0]
    assert decision.blocked_by == "no-fit"
    assert "other than the drained node gpu-a-1" in decision.reason


def test_targets_are_honoured() -> None:
    p = pod("p", "gpu-a-1", gpus=2)
    snap = roomy_cluster(p)
    decision = plan([proposal(p, targets={p.key: "gpu-a-2"})], snap, POLICY)[0]
    assert decision.approved
    assert decision.targets == {p.key: "gpu-a-2"}


def test_target_without_room_is_refused_even_if_another_node_has_room() -> None:
    p = pod("p", "gpu-a-1", gpus=2)
    full = pod("full", "gpu-a-2", gpus=8)
    snap = roomy_cluster(p, full)
    decision = plan([proposal(p, targets={p.key: "gpu-a-2"})], snap, POLICY)[0]
    assert decision.blocked_by == "no-fit"
    assert decision.reason.startswith("ml/p: its predicted target node gpu-a-2 cannot take it")


def test_targets_reserve_capacity_for_later_proposals() -> None:
    p, q = pod("p", "gpu-a-1", gpus=6), pod("q", "gpu-a-1", gpus=6)
    snap = roomy_cluster(p, q)
    decisions = plan(
        [proposal(p, targets={p.key: "gpu-b-1"}), proposal(q, targets={q.key: "gpu-b-1"})], snap, POLICY
    )
    assert [d.blocked_by for d in decisions] == [None, "no-fit"]


@pytest.mark.parametrize(
    ("target", "expected"), [("nowhere", "is not in the snapshot"), ("gpu-a-1", "is the node being drained")]
)
def test_impossible_targets_are_refused(target: str, expected: str) -> None:
    p = pod("p", "gpu-a-1")
    snap = roomy_cluster(p)
    drain_it = Proposal(
        strategy="test", kind="node", pods=(p,), reason="drain", node="gpu-a-1", targets={p.key: target}
    )
    decision = plan([drain_it], snap, POLICY)[0]
    assert decision.blocked_by == "no-fit"
    assert expected in decision.reason


def test_empty_node_drain_is_approved_and_cordons_the_node() -> None:
    p = pod("p", "gpu-a-1", gpus=8)
    snap = snapshot([node("gpu-a-1"), node("gpu-empty")], [p])
    decisions = plan([drain(snap, "gpu-empty"), proposal(p)], snap, POLICY)
    assert decisions[0].approved
    assert decisions[0].targets == {}
    # gpu-empty is now being drained: p can only go back where it is.
    assert decisions[1].targets == {p.key: "gpu-a-1"}


def test_node_already_chosen_as_destination_cannot_be_drained() -> None:
    p = pod("p", "gpu-a-1")
    q = pod("q", "gpu-b-1")
    snap = snapshot([node("gpu-a-1", unschedulable=True), node("gpu-b-1")], [p, q])
    first, second = plan([proposal(p), drain(snap, "gpu-b-1")], snap, POLICY)
    assert first.targets == {p.key: "gpu-b-1"}
    assert second.blocked_by == "no-fit"
    assert second.reason == (
        "node gpu-b-1 is the predicted destination of 1 pod moved earlier this cycle, so it cannot be drained"
    )


# --------------------------------------------------------------------------- re-placement by rules


def only(text: str, *nodes: str) -> DestinationRule:
    return DestinationRule(text, frozenset(nodes))


def full_target_cluster() -> tuple[Snapshot, Pod]:
    """p (2 GPUs) on gpu-a-1 wants gpu-a-2, which is full; gpu-b-1 (6 of 8 used) is the packed
    scheduler's next choice, gpu-c-1 (empty) the one after."""
    p = pod("p", "gpu-a-1", gpus=2)
    pods = [p, pod("full", "gpu-a-2", gpus=8), pod("b", "gpu-b-1", gpus=6)]
    return snapshot([node("gpu-a-1"), node("gpu-a-2"), node("gpu-b-1"), node("gpu-c-1")], pods), p


def test_a_pod_whose_target_is_full_goes_to_the_next_best_node_its_rules_allow() -> None:
    snap, p = full_target_cluster()
    anywhere = proposal(p, targets={p.key: "gpu-a-2"}, destinations={p.key: ()})
    not_b = proposal(p, targets={p.key: "gpu-a-2"}, destinations={p.key: (only("in pool c", "gpu-c-1"),)})

    [to_b] = plan([anywhere], snap, POLICY)
    [to_c] = plan([not_b], snap, POLICY)

    assert to_b.targets == {p.key: "gpu-b-1"}
    assert to_b.reason.startswith(
        "ml/p re-placed on gpu-b-1: its predicted target node gpu-a-2 cannot take it"
    )
    assert to_c.targets == {p.key: "gpu-c-1"}


def test_a_refusal_names_the_rules_up_to_the_first_that_leaves_no_node() -> None:
    snap, p = full_target_cluster()
    rules = (
        DestinationRule("other than node gpu-c-1", frozenset({"gpu-c-1"}), outside=True),
        only("in pool a", "gpu-a-1", "gpu-a-2"),
        only("in pool z"),
    )
    drain_it = Proposal(
        strategy="test",
        kind="node",
        pods=(p,),
        reason="drain",
        node="gpu-a-1",
        targets={p.key: "gpu-a-2"},
        destinations={p.key: rules},
    )

    [decision] = plan([drain_it], snap, POLICY)

    assert decision.blocked_by == "no-fit"
    assert decision.reason.startswith("ml/p: its predicted target node gpu-a-2 cannot take it (")
    # gpu-b-1 meets the first rule; the second leaves only the drained node and the full one.
    assert decision.reason.endswith(
        "), and no node other than node gpu-c-1 in pool a other than the drained node gpu-a-1 can take it"
    )


def test_a_refusal_with_no_room_anywhere_names_no_rule() -> None:
    p = pod("p", "gpu-a-1", gpus=4)
    snap = snapshot([node("gpu-a-1", unschedulable=True), node("gpu-b-1")], [p, pod("f", "gpu-b-1", gpus=6)])
    [decision] = plan(
        [proposal(p, targets={p.key: "gpu-b-1"}, destinations={p.key: (only("in pool b", "gpu-b-1"),)})],
        snap,
        POLICY,
    )
    assert decision.blocked_by == "no-fit"
    assert decision.reason.endswith("), and no node in the cluster can take it")


def test_pods_that_keep_their_targets_are_placed_before_re_placed_ones() -> None:
    """q's target still has room: it keeps it, though p, re-placed, would have preferred that node."""
    p, q = pod("p", "gpu-a-1", gpus=2), pod("q", "gpu-a-1", gpus=2)
    pods = [p, q, pod("full", "gpu-a-2", gpus=8), pod("b", "gpu-b-1", gpus=6)]
    nodes = [node("gpu-a-1", unschedulable=True), node("gpu-a-2"), node("gpu-b-1"), node("gpu-c-1")]
    snap = snapshot(nodes, pods)
    both = proposal(
        p,
        q,
        kind="gang",
        targets={p.key: "gpu-a-2", q.key: "gpu-b-1"},
        destinations={p.key: (), q.key: ()},
    )

    [decision] = plan([both], snap, POLICY)

    assert decision.targets == {p.key: "gpu-c-1", q.key: "gpu-b-1"}


def test_a_pod_without_a_target_lands_only_where_its_rules_allow() -> None:
    snap, p = full_target_cluster()
    [decision] = plan([proposal(p, destinations={p.key: (only("in pool c", "gpu-c-1"),)})], snap, POLICY)
    assert decision.targets == {p.key: "gpu-c-1"}


# --------------------------------------------------------------------------- checkpoint-pending


CHECKPOINT = {"rebalancer.gpu/checkpoint": "true"}


def test_a_pod_whose_namespace_refused_the_request_is_held_and_the_reason_says_how_to_grant() -> None:
    refused_at = NOW - timedelta(minutes=30)
    history = DisruptionHistory(checkpoint_refused={"ml": refused_at})
    train = pod("train", "gpu-a-1", annotations=CHECKPOINT)
    other = pod("train", "gpu-a-1", namespace="research", annotations=CHECKPOINT)
    snap = roomy_cluster(train, other)
    held, asked = plan([proposal(train), proposal(other)], snap, NO_LIMITS, history=history)
    # Long after checkpoint_timeout from the refusal: no request was made, so nothing times out.
    assert (held.blocked_by, held.blocked_pod) == ("checkpoint-pending", ("ml", "train"))
    assert held.reason == (
        "ml/train: cannot ask: namespace ml has not granted checkpoint requests (refused at "
        "2026-11-29T11:30:00Z); held until it does, asked again every cycle "
        "(kubectl -n ml apply -f deploy/checkpoint-rbac.example.yaml)"
    )
    # Another namespace is asked as usual.
    assert asked.blocked_by == "checkpoint-pending"
    assert "asked now" in asked.reason


def test_a_request_made_before_its_namespace_refused_runs_out_as_usual() -> None:
    """The timeout runs from a request that was made: a refusal since changes nothing about it."""
    history = DisruptionHistory(checkpoint_refused={"ml": NOW})

    def asked(minutes_ago: int) -> Pod:
        at = (NOW - timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return pod("train", "gpu-a-1", annotations={**CHECKPOINT, "rebalancer.gpu/eviction-requested-at": at})

    waiting = asked(3)
    [held] = plan([proposal(waiting)], roomy_cluster(waiting), NO_LIMITS, history=history)
    assert held.reason == (
        "ml/train: checkpoint requested at 2026-11-29T11:57:00Z; waiting for rebalancer.gpu/checkpoint-done "
        "until 2026-11-29T12:07:00Z"
    )
    timed_out = asked(10)
    [approved] = plan([proposal(timed_out)], roomy_cluster(timed_out), NO_LIMITS, history=history)
    assert approved.approved
