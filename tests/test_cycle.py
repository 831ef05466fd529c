"""The orchestration: strategies in policy order, one planner, evictor outcomes, report assembly, sinks."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta

import pytest

from rebalancer.cycle import assemble_report, evaluate, execute, propose, run_cycle
from rebalancer.cycle_report import CycleReport
from rebalancer.evictor import DryRunEvictor, UnframedEvictor
from rebalancer.history import DisruptionHistory, Workload
from rebalancer.model import Decision, Mode, Outcome, OwnerRef, Snapshot
from rebalancer.policy import LoadedPolicy, parse_policy
from rebalancer.report import render, to_dict
from tests.builders import A100, H100, NOW, gpu_sample, node, pdb, pod, snapshot, telemetry

AFFINITY_TO_H100 = {"nvidia.com/gpu.product": H100}


def policy(doc: Mapping[str, object]) -> LoadedPolicy:
    return parse_policy(doc)


def consolidation_cluster() -> Snapshot:
    """Node a-1 holds one 1-GPU pod; a-2 is half full and can take it; h-1 is full."""
    nodes = [node("a-1"), node("a-2"), node("h-1", model=H100)]
    pods = [
        pod("lonely", "a-1"),
        *(pod(f"busy-{i}", "a-2") for i in range(4)),
        pod("h-full", "h-1", gpus=8),
    ]
    return snapshot(nodes, pods)


CONSOLIDATE_BY_ALLOCATION = {
    "strategies": [{"name": "gpu-consolidation", "args": {"max_utilization_percent": None}}],
    "telemetry": None,
    "prices": {"per_gpu_hour": {A100: 2.5}},
}


def test_a_freed_node_is_reported_with_gpus_and_savings() -> None:
    report = run_cycle(consolidation_cluster(), policy(CONSOLIDATE_BY_ALLOCATION), DryRunEvictor())

    assert report.mode == "dry-run"
    assert report.freed_nodes == ("a-1",)
    assert report.summary.nodes_freed == 1
    assert report.summary.gpus_freed == 8
    assert report.summary.estimated_savings_per_hour == pytest.approx(8 * 2.5)
    [row] = report.decisions
    assert (row.pod, row.node, row.action, row.outcome, row.target_node) == (
        "lonely",
        "a-1",
        "evict",
        "would-evict",
        "a-2",
    )


def test_savings_are_null_without_prices() -> None:
    doc: dict[str, object] = {
        **CONSOLIDATE_BY_ALLOCATION,
        "prices": {"per_gpu_hour": {}, "default_per_gpu_hour": None},
    }
    report = run_cycle(consolidation_cluster(), policy(doc), DryRunEvictor())
    assert report.summary.nodes_freed == 1
    assert report.summary.estimated_savings_per_hour is None


def test_a_refused_proposal_reports_every_pod_as_skipped_with_its_guard() -> None:
    nodes = [node("a-1"), node("a-2")]
    protected = pod("lonely", "a-1", labels={"app": "serving"})
    cluster = snapshot(
        nodes,
        [protected, pod("other", "a-1"), *(pod(f"busy-{i}", "a-2") for i in range(4))],
        pdbs=[pdb("serving", {"app": "serving"}, allowed=0)],
    )
    report = run_cycle(cluster, policy(CONSOLIDATE_BY_ALLOCATION), DryRunEvictor())

    assert {r.pod for r in report.decisions} == {"lonely", "other"}
    assert all(r.action == "skip" and r.blocked_by == "pdb" and r.outcome is None for r in report.decisions)
    assert report.summary.blocked == 2
    assert report.summary.evictions == 0
    assert report.summary.nodes_freed == 0


def test_strategies_that_need_telemetry_are_skipped_when_it_is_unavailable() -> None:
    loaded = policy({"strategies": [{"name": "idle-gpu", "args": {"namespaces": ["ml"]}}]})
    report = run_cycle(consolidation_cluster(), loaded, DryRunEvictor())

    [skipped] = report.skipped_strategies
    assert skipped.strategy == "idle-gpu"
    assert "telemetry" in skipped.reason
    assert report.decisions == ()


def idle_pod_on_a_consolidation_candidate() -> tuple[Snapshot, LoadedPolicy]:
    """a-1 holds one idle pod (every GPU of a-1 observed, all at 0 %); a-2 has room for it."""
    idle = pod("idle", "a-1", age=timedelta(days=2))
    observed = [
        gpu_sample("a-1", "GPU-a1-0", pod=idle, util=0.0),
        *(gpu_sample("a-1", f"GPU-a1-{i}", util=0.0, fb_used_mib=0.0) for i in range(1, 8)),
    ]
    cluster = snapshot(
        [node("a-1"), node("a-2")],
        [idle, *(pod(f"busy-{i}", "a-2") for i in range(4))],
        telemetry=telemetry(observed, 1800, 3600),
    )
    loaded = policy(
        {
            "strategies": [
                {"name": "idle-gpu", "args": {"namespaces": ["ml"], "window": "30m"}},
                {"name": "gpu-consolidation", "args": {"window": "1h"}},
            ]
        }
    )
    return cluster, loaded


def test_a_leaked_vram_finding_carries_the_framebuffer_of_its_gpus_rows() -> None:
    """The metrics read leaked bytes from the finding: every row of that GPU and pod (two series of one
    GPU with no pod here), in the first window that has any; other GPUs' rows do not count."""
    rows = [
        gpu_sample("a-1", "GPU-leak", util=0.0, fb_used_mib=20480.0),
        gpu_sample("a-1", "GPU-leak", util=0.0, fb_used_mib=1024.0),
        gpu_sample("a-1", "GPU-other", util=0.0, fb_used_mib=4096.0),
        *(gpu_sample("a-2", f"GPU-a2-{i}", util=0.0, fb_used_mib=0.0) for i in range(8)),
    ]
    cluster = snapshot([node("a-1"), node("a-2")], [], telemetry=telemetry(rows, 1800))
    loaded = policy({"strategies": [{"name": "idle-gpu", "args": {"window": "30m"}}]})
    report = run_cycle(cluster, loaded, DryRunEvictor())
    leaked = {f.gpu: f.fb_used_mib for f in report.findings if f.kind == "leaked-vram"}
    assert leaked == {"GPU-leak": 20480.0 + 1024.0, "GPU-other": 4096.0}


def test_strategies_run_in_policy_order_and_share_one_ledger() -> None:
    """An idle pod on a consolidation candidate is evicted once, by the first strategy in the policy."""
    cluster, loaded = idle_pod_on_a_consolidation_candidate()
    report = run_cycle(cluster, loaded, DryRunEvictor())

    evicted = [r for r in report.decisions if r.action == "evict"]
    assert [(r.strategy, r.pod) for r in evicted] == [("idle-gpu", "idle")]
    duplicate = [r for r in report.decisions if r.strategy == "gpu-consolidation"]
    assert [(r.pod, r.blocked_by) for r in duplicate] == [("idle", "duplicate")]


def test_propose_is_the_strategies_half_that_evaluate_plans_from() -> None:
    """What `propose` returns, in its order, is exactly what the planner judges in `evaluate`."""
    cluster, loaded = idle_pod_on_a_consolidation_candidate()
    proposed = propose(cluster, loaded)
    evaluation = evaluate(cluster, loaded)

    assert [p.strategy for p in proposed.proposals] == ["idle-gpu", "gpu-consolidation"]
    assert [d.proposal for d in evaluation.decisions] == list(proposed.proposals)
    assert set(proposed.findings) <= set(evaluation.findings)


def held_back_by_history(drains: int = 2) -> tuple[Snapshot, LoadedPolicy, DisruptionHistory]:
    """Three under-used nodes and a full one, `drains` a cycle: the cheapest (one pod) holds a workload
    in its cooldown, the next (two pods) one out of its disruption budget; the third (three pods) may go."""
    nodes = [node("a-1"), node("a-2"), node("a-3"), node("full")]
    owners = {name: OwnerRef(kind="StatefulSet", name=name) for name in ("cooling", "spent", "free")}
    pods = [
        pod("cooling-0", "a-1", owner=owners["cooling"]),
        *(pod(f"spent-{i}", "a-2", owner=owners["spent"]) for i in range(2)),
        *(pod(f"free-{i}", "a-3", owner=owners["free"]) for i in range(3)),
        *(pod(f"full-{i}", "full") for i in range(6)),
    ]
    doc = {
        "strategies": [
            {
                "name": "gpu-consolidation",
                "args": {"max_utilization_percent": None, "max_nodes_per_cycle": drains},
            }
        ],
        "guards": {"max_disruptions_per_workload": 2},
        "telemetry": None,
    }
    history = DisruptionHistory(
        workloads={Workload("ml", "StatefulSet", "cooling"): NOW - timedelta(minutes=10)},
        disruptions={
            Workload("ml", "StatefulSet", "spent"): (NOW - timedelta(days=2), NOW - timedelta(hours=5))
        },
    )
    return snapshot(nodes, pods), policy(doc), history


def test_drains_the_history_holds_back_are_refused_by_the_planner_without_spending_the_cycle_s_turn() -> None:
    cluster, loaded, history = held_back_by_history()
    evaluation = evaluate(cluster, loaded, history=history)

    # The next candidate is drained; the two held back are still proposed, after it, and refused by
    # the planner's own guards, so that reports, logs and blocked_total count them.
    decided = [(d.proposal.node, d.approved, d.blocked_by) for d in evaluation.decisions]
    assert decided == [("a-3", True, None), ("a-1", False, "cooldown"), ("a-2", False, "disruption-budget")]
    reasons = {d.proposal.node: d.reason for d in evaluation.decisions}
    assert "StatefulSet ml/cooling was disrupted 10m ago" in reasons["a-1"]
    assert "StatefulSet ml/spent was disrupted 2 times" in reasons["a-2"]
    # Without the history the two cheapest nodes are the ones drained, as before.
    assert [d.proposal.node for d in evaluate(cluster, loaded).decisions] == ["a-1", "a-2"]


def test_at_most_max_nodes_per_cycle_held_back_drains_are_proposed_the_rest_are_recorded() -> None:
    cluster, loaded, history = held_back_by_history(drains=1)
    cooling = Workload("ml", "StatefulSet", "free")
    more = DisruptionHistory(
        workloads={**history.workloads, cooling: NOW - timedelta(minutes=1)}, disruptions=history.disruptions
    )
    evaluation = evaluate(cluster, loaded, history=more)

    assert [(d.proposal.node, d.blocked_by) for d in evaluation.decisions] == [("a-1", "cooldown")]
    held = {r.node: r.reason for r in evaluation.not_chosen if r.code == "held-back"}
    assert set(held) == {"a-2", "a-3"}
    assert "disruption-budget" in held["a-2"] and "ml/spent-0 is held back" in held["a-2"]
    assert "cooldown" in held["a-3"]


class FailingSink:
    def publish(self, report: CycleReport) -> None:
        raise RuntimeError("receiver down")


class RecordingSink:
    def __init__(self) -> None:
        self.reports: list[CycleReport] = []

    def publish(self, report: CycleReport) -> None:
        self.reports.append(report)


def test_a_failing_sink_does_not_fail_the_cycle_or_starve_other_sinks() -> None:
    errors: list[str] = []
    recorder = RecordingSink()
    report = run_cycle(
        consolidation_cluster(),
        policy(CONSOLIDATE_BY_ALLOCATION),
        DryRunEvictor(),
        [FailingSink(), recorder],
        on_sink_error=lambda sink, exc: errors.append(f"{type(sink).__name__}: {exc}"),
    )
    assert recorder.reports == [report]
    assert errors == ["FailingSink: receiver down"]


class PartialEvictor(UnframedEvictor):
    """Evicts the first pod of a decision, then reports the PDB said no."""

    mode: Mode = "live"

    def evict(self, decision: Decision) -> tuple[Outcome, ...]:
        first, *rest = decision.proposal.pods
        return (
            Outcome(first.namespace, first.name, "evicted"),
            *(Outcome(p.namespace, p.name, "blocked-by-pdb", "disruption budget exhausted") for p in rest),
        )


def test_a_node_is_freed_only_when_every_pod_left_it() -> None:
    cluster = snapshot(
        [node("a-1"), node("a-2")],
        [pod("one", "a-1"), pod("two", "a-1"), *(pod(f"busy-{i}", "a-2") for i in range(4))],
    )
    loaded = policy(CONSOLIDATE_BY_ALLOCATION)
    evaluation = evaluate(cluster, loaded)
    outcomes = execute(evaluation, PartialEvictor())
    report = assemble_report("live", evaluation, outcomes, loaded)

    assert report.summary.nodes_freed == 0
    assert report.summary.evictions == 1
    assert report.summary.blocked == 1
    blocked = next(r for r in report.decisions if r.outcome == "blocked-by-pdb")
    assert "disruption budget exhausted" in blocked.reason


def test_json_report_has_the_contract_keys() -> None:
    report = run_cycle(consolidation_cluster(), policy(CONSOLIDATE_BY_ALLOCATION), DryRunEvictor())
    data = json.loads(render(report, "json"))

    assert data["mode"] == "dry-run"
    assert data["now"] == NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert set(data["summary"]) == {
        "nodes",
        "gpus",
        "pods",
        "proposals",
        "evictions",
        "blocked",
        "nodes_freed",
        "gpus_freed",
        "estimated_savings_per_hour",
        # additions since DESIGN §7: idle workloads reclaimed
        "reclaims",
        "gpus_reclaimed",
        "blocked_by",  # an addition: `blocked` per guard, as the text report shows it
    }
    assert set(data["decisions"][0]) == {
        "strategy",
        "namespace",
        "pod",
        "node",
        "action",
        "outcome",
        "reason",
        "blocked_by",
        "group",
        "target_node",
        "workload",  # an addition: the workload a workload action changes
    }
    assert {"findings", "skipped_strategies"} <= set(data)
    assert to_dict(report) == data


def test_text_and_markdown_reports_give_a_reason_for_every_decision() -> None:
    report = run_cycle(consolidation_cluster(), policy(CONSOLIDATE_BY_ALLOCATION), DryRunEvictor())
    text = render(report, "text")
    markdown = render(report, "markdown")
    for row in report.decisions:
        assert row.reason in text
        assert f"{row.namespace}/{row.pod}" in markdown
    assert "nodes freed: 1 (a-1)" in text
    assert "$20.00/h" in text
