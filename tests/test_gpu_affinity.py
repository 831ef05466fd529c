"""Behaviour of the `gpu-affinity` strategy: required and preferred node affinity, reservations, gangs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from rebalancer.model import (
    GPU_PRODUCT_LABEL,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    PreferredTerm,
    StrategyResult,
)
from rebalancer.registry import StrategyContext, get_strategy
from strategies.gpu_affinity import GpuAffinityArgs, gpu_affinity
from tests.builders import A100, H100, L4, node, pod, replace, snapshot

CTX = StrategyContext()
PREFERRED = GpuAffinityArgs(preferred=True)


def product_in(*models: str) -> NodeSelectorTerm:
    return NodeSelectorTerm(match_expressions=(NodeSelectorRequirement(GPU_PRODUCT_LABEL, "In", models),))


def wants(
    model: str,
    name: str,
    node_name: str | None,
    *,
    gpus: int = 1,
    gang: str | None = None,
    phase: str = "Running",
    age: timedelta = timedelta(days=1),
) -> Pod:
    """A pod whose required affinity allows only `model`."""
    return pod(
        name, node_name, required_affinity=[product_in(model)], gpus=gpus, gang=gang, phase=phase, age=age
    )


def prefers(p: Pod, *weighted: tuple[int, str]) -> Pod:
    terms = tuple(PreferredTerm(weight=w, term=product_in(model)) for w, model in weighted)
    return replace(p, preferred_affinity=terms)


def fillers(node_name: str, count: int, prefix: str = "busy") -> list[Pod]:
    """Pods that occupy `count` GPUs of a node and do not violate anything."""
    return [pod(f"{prefix}-{node_name}-{i}", node_name, namespace="other") for i in range(count)]


def run(nodes: list[Node], pods: list[Pod], args: GpuAffinityArgs | None = None) -> StrategyResult:
    return gpu_affinity(snapshot(nodes, pods), args or GpuAffinityArgs(), CTX)


def targets(result: StrategyResult) -> dict[str, str]:
    return {key[1]: node for p in result.proposals for key, node in p.targets.items()}


# --------------------------------------------------------------------------- arguments


def test_args_defaults_and_registration() -> None:
    args = GpuAffinityArgs()
    assert args.preferred is False
    assert args.min_pod_age == 600
    assert not args.needs_telemetry()
    assert args.telemetry_windows() == frozenset()
    assert GpuAffinityArgs.model_validate({"min_pod_age": "1h", "preferred": True}).min_pod_age == 3600
    spec = get_strategy("gpu-affinity")
    assert spec is not None
    assert spec.args_model is GpuAffinityArgs
    for bad in ({"min_pod_age": "later"}, {"prefered": True}, {"preferred": "maybe"}):
        with pytest.raises(ValidationError):
            GpuAffinityArgs.model_validate(bad)


# --------------------------------------------------------------------------- required affinity


def test_required_violation_moves_to_an_allowed_node() -> None:
    p = wants(H100, "train", "gpu-a-3")
    result = run([node("gpu-a-3", model=A100), node("gpu-h-1", model=H100)], [p])
    [proposal] = result.proposals
    assert proposal.strategy == "gpu-affinity"
    assert proposal.kind == "pod"
    assert proposal.pods == (p,)
    assert proposal.node == "gpu-a-3"
    assert proposal.targets == {p.key: "gpu-h-1"}
    assert proposal.reason == (
        f"node gpu-a-3 ({A100}) no longer matches required affinity "
        f"{GPU_PRODUCT_LABEL} In [{H100}]; predicted target gpu-h-1"
    )
    assert proposal.priority >= 1000
    assert result.findings == ()


def test_pod_that_still_matches_is_left_alone() -> None:
    p = wants(A100, "train", "gpu-a-3")
    result = run([node("gpu-a-3", model=A100), node("gpu-h-1", model=H100)], [p])
    assert result.proposals == ()
    assert result.findings == ()


def test_target_is_the_packed_choice_among_allowed_nodes() -> None:
    p = wants(H100, "train", "gpu-a-3")
    nodes = [node("gpu-a-3", model=A100), node("gpu-h-1", model=H100), node("gpu-h-2", model=H100)]
    result = run(nodes, [p, *fillers("gpu-h-2", 5)])
    assert targets(result) == {"train": "gpu-h-2"}


def test_no_allowed_node_with_room_is_a_finding_only() -> None:
    p = wants(H100, "train", "gpu-a-3")
    result = run([node("gpu-a-3", model=A100), node("gpu-h-1", model=H100)], [p, *fillers("gpu-h-1", 8)])
    assert result.proposals == ()
    [finding] = result.findings
    assert finding.kind == "affinity-violation"
    assert (finding.node, finding.namespace, finding.pod) == ("gpu-a-3", "ml", "train")
    assert f"no longer matches required affinity {GPU_PRODUCT_LABEL} In [{H100}]" in finding.detail
    assert "none of the 1 node its affinity allows can take it now" in finding.detail


def test_no_allowed_node_at_all_is_a_finding_only() -> None:
    p = wants(H100, "train", "gpu-a-3")
    result = run([node("gpu-a-3", model=A100), node("gpu-l-1", model=L4)], [p])
    assert result.proposals == ()
    [finding] = result.findings
    assert "no other node matches its node affinity" in finding.detail


def test_ored_terms_are_described_and_any_term_is_allowed() -> None:
    exists = NodeSelectorTerm(match_expressions=(NodeSelectorRequirement("pool/train", "Exists"),))
    p = pod("train", "gpu-a-3", required_affinity=[product_in(H100), exists])
    nodes = [node("gpu-a-3", model=A100), node("gpu-l-1", model=L4, labels={"pool/train": "yes"})]
    [proposal] = run(nodes, [p]).proposals
    assert f"({GPU_PRODUCT_LABEL} In [{H100}]) or (pool/train Exists)" in proposal.reason
    assert proposal.targets == {p.key: "gpu-l-1"}


def test_node_selector_violation() -> None:
    p = pod("infer", "gpu-a-1", node_selector={"pool": "inference"})
    nodes = [node("gpu-a-1", labels={"pool": "training"}), node("gpu-a-2", labels={"pool": "inference"})]
    [proposal] = run(nodes, [p]).proposals
    assert proposal.targets == {p.key: "gpu-a-2"}
    assert proposal.reason == (
        f"node gpu-a-1 ({A100}) no longer matches nodeSelector pool=inference (node has training); "
        "predicted target gpu-a-2"
    )


def test_node_selector_label_removed() -> None:
    p = pod("infer", "gpu-a-1", node_selector={"pool": "inference"})
    result = run([node("gpu-a-1")], [p])
    [finding] = result.findings
    assert "nodeSelector pool=inference (node has no such label)" in finding.detail


def test_reservations_carry_across_proposals() -> None:
    first = wants(H100, "first", "gpu-a-1")
    second = wants(H100, "second", "gpu-a-2")
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-h-1", model=H100)]
    result = run(nodes, [first, second, *fillers("gpu-h-1", 7)])
    assert targets(result) == {"first": "gpu-h-1"}
    [finding] = result.findings
    assert finding.pod == "second"
    assert finding.kind == "affinity-violation"


def test_too_young_pods_are_left_alone() -> None:
    p = wants(H100, "train", "gpu-a-3", age=timedelta(minutes=5))
    nodes = [node("gpu-a-3"), node("gpu-h-1", model=H100)]
    result = run(nodes, [p])
    assert result.proposals == ()
    assert result.findings == ()
    assert len(run(nodes, [p], GpuAffinityArgs(min_pod_age=60)).proposals) == 1
    ageless = replace(p, created=None, started=None)
    assert run(nodes, [ageless], GpuAffinityArgs(min_pod_age=0)).proposals == ()


def test_finished_unbound_and_orphaned_pods_are_ignored() -> None:
    done = wants(H100, "done", "gpu-a-3", phase="Succeeded")
    pending = wants(H100, "pending", None)
    orphan = wants(H100, "orphan", "gone-node")
    result = run([node("gpu-a-3"), node("gpu-h-1", model=H100)], [done, pending, orphan])
    assert result.proposals == ()
    assert result.findings == ()


# --------------------------------------------------------------------------- gangs


def test_gang_moves_whole_when_every_member_fits() -> None:
    w0 = wants(H100, "job-w0", "gpu-a-1", gpus=4, gang="ml/job")
    w1 = wants(H100, "job-w1", "gpu-a-1", gpus=4, gang="ml/job")
    nodes = [node("gpu-a-1"), node("gpu-h-1", model=H100), node("gpu-h-2", model=H100)]
    result = run(nodes, [w0, w1, *fillers("gpu-h-2", 4)])
    [proposal] = result.proposals
    assert proposal.kind == "gang"
    assert proposal.group == "ml/job"
    assert {p.key for p in proposal.pods} == {w0.key, w1.key}
    assert set(proposal.targets) == {w0.key, w1.key}
    assert sorted(proposal.targets.values()) == ["gpu-h-1", "gpu-h-2"]
    assert proposal.priority == 1008
    assert proposal.reason.startswith("gang ml/job: ")
    assert "predicted targets" in proposal.reason


def test_gang_that_cannot_move_together_is_findings_only() -> None:
    w0 = wants(H100, "job-w0", "gpu-a-1", gpus=4, gang="ml/job")
    w1 = wants(H100, "job-w1", "gpu-a-1", gpus=4, gang="ml/job")
    nodes = [node("gpu-a-1"), node("gpu-h-1", model=H100)]
    result = run(nodes, [w0, w1, *fillers("gpu-h-1", 2)])
    assert result.proposals == ()
    assert sorted(f.pod or "" for f in result.findings) == ["job-w0", "job-w1"]
    assert all("cannot be re-placed together" in f.detail for f in result.findings)


def test_gang_members_that_still_match_move_with_the_gang() -> None:
    w0 = wants(H100, "job-w0", "gpu-a-1", gpus=4, gang="ml/job")
    w1 = wants(H100, "job-w1", "gpu-h-1", gpus=4, gang="ml/job")
    nodes = [node("gpu-a-1"), node("gpu-h-1", model=H100)]
    [proposal] = run(nodes, [w0, w1]).proposals
    assert proposal.kind == "gang"
    assert proposal.targets == {w0.key: "gpu-h-1", w1.key: "gpu-h-1"}
    assert "job-w1:" not in proposal.reason


# --------------------------------------------------------------------------- preferred affinity


def preferred_setup() -> tuple[list[Node], Pod]:
    nodes = [node("gpu-a-1", model=A100), node("gpu-h-1", model=H100), node("gpu-l-1", model=L4)]
    return nodes, prefers(pod("serve", "gpu-a-1"), (10, L4), (80, H100))


def test_preferred_mode_off_ignores_preferences() -> None:
    nodes, p = preferred_setup()
    result = run(nodes, [p])
    assert result.proposals == ()
    assert result.findings == ()


def test_preferred_mode_moves_to_the_heaviest_preferred_node_with_room() -> None:
    nodes, p = preferred_setup()
    [proposal] = run(nodes, [p], PREFERRED).proposals
    assert proposal.kind == "pod"
    assert proposal.targets == {p.key: "gpu-h-1"}
    assert proposal.priority == 80
    assert "matches none of the preferred affinity terms" in proposal.reason
    assert "preferred node gpu-h-1 (weight 80) has room now" in proposal.reason


def test_preferred_falls_back_to_a_lighter_preference_with_room() -> None:
    nodes, p = preferred_setup()
    [proposal] = run(nodes, [p, *fillers("gpu-h-1", 8)], PREFERRED).proposals
    assert proposal.targets == {p.key: "gpu-l-1"}
    assert proposal.priority == 10


def test_preferred_without_room_does_nothing() -> None:
    nodes, p = preferred_setup()
    result = run(nodes, [p, *fillers("gpu-h-1", 8), *fillers("gpu-l-1", 8)], PREFERRED)
    assert result.proposals == ()
    assert result.findings == ()


def test_pod_on_any_preferred_node_stays() -> None:
    nodes, p = preferred_setup()
    on_l4 = replace(p, node_name="gpu-l-1")
    assert run(nodes, [on_l4], PREFERRED).proposals == ()


def test_required_violations_rank_and_reserve_before_preferences() -> None:
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-h-1", model=H100)]
    soft = prefers(pod("serve", "gpu-a-1"), (100, H100))
    hard = wants(H100, "train", "gpu-a-2")
    result = run(nodes, [soft, hard, *fillers("gpu-h-1", 7)], PREFERRED)
    [proposal] = result.proposals
    assert proposal.pods == (hard,)
    assert proposal.targets == {hard.key: "gpu-h-1"}

    roomy = run(nodes, [soft, hard, *fillers("gpu-h-1", 6)], PREFERRED)
    by_pod = {p.pods[0].name: p for p in roomy.proposals}
    assert set(by_pod) == {"serve", "train"}
    assert by_pod["train"].priority > by_pod["serve"].priority


def test_preferred_mode_does_not_move_gangs() -> None:
    nodes, p = preferred_setup()
    member = replace(p, gang="ml/serve")
    assert run(nodes, [member], PREFERRED).proposals == ()


# --------------------------------------------------------------------------- destination rules


def test_a_move_may_be_re_placed_anywhere_but_the_node_it_leaves() -> None:
    p = wants(H100, "train", "gpu-a-3")
    [proposal] = run([node("gpu-a-3", model=A100), node("gpu-h-1", model=H100)], [p]).proposals
    [rule] = proposal.destinations[p.key]
    assert (rule.nodes, rule.outside) == (frozenset({"gpu-a-3"}), True)
    assert rule.text == "other than node gpu-a-3, which its affinity no longer allows"


def test_a_gang_may_be_re_placed_anywhere_but_the_nodes_it_leaves() -> None:
    w0 = wants(H100, "job-w0", "gpu-a-1", gpus=4, gang="ml/job")
    w1 = wants(H100, "job-w1", "gpu-a-2", gpus=4, gang="ml/job")
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-h-1", model=H100)]
    [proposal] = run(nodes, [w0, w1]).proposals
    assert set(proposal.destinations) == {w0.key, w1.key}
    for rules in proposal.destinations.values():
        [rule] = rules
        assert (rule.nodes, rule.outside) == (frozenset({"gpu-a-1", "gpu-a-2"}), True)


def test_a_preferred_move_may_be_re_placed_only_on_a_preferred_node() -> None:
    nodes, p = preferred_setup()
    [proposal] = run(nodes, [p], PREFERRED).proposals
    [rule] = proposal.destinations[p.key]
    assert (rule.nodes, rule.outside) == (frozenset({"gpu-h-1", "gpu-l-1"}), False)
    assert rule.text == "matching one of its preferred node affinity terms"
