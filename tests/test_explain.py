"""Why a strategy did not act ("not chosen" records), the report's compact section of them, node-drain
groups, and `rebalancer explain` on builders and on the demo cluster."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from rebalancer.cli import main
from rebalancer.cycle import run_cycle, strategy_context
from rebalancer.cycle_report import CycleReport
from rebalancer.evictor import DryRunEvictor
from rebalancer.explain import ExplainFormat, Subject, explain_lines, parse_subject, render_explanation
from rebalancer.model import Finding, Node, NotChosen, Pod, SkippedStrategy, Snapshot
from rebalancer.policy import parse_policy
from rebalancer.report import render
from strategies.gpu_consolidation import GpuConsolidationArgs, gpu_consolidation
from strategies.idle_gpu import IdleGpuArgs, idle_gpu
from tests.builders import L4, gpu_sample, node, pdb, pod, replace, snapshot, telemetry

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo-cluster"

ALLOCATION_ONLY = GpuConsolidationArgs(
    max_utilization_percent=None,
    max_allocated_percent=50,
    move_to_smaller_nodes=True,
    drain_onto_larger_nodes=False,
    peer_pods_to_make_room=0,
)
BY_ALLOCATION = {
    "strategies": [
        {
            "name": "gpu-consolidation",
            "args": {
                "max_utilization_percent": None,
                "max_allocated_percent": 50,
                "drain_onto_larger_nodes": False,
            },
        }
    ],
    "telemetry": None,
}


def busy(node_name: str, count: int, prefix: str = "busy") -> list[Pod]:
    return [pod(f"{prefix}-{node_name}-{i}", node_name) for i in range(count)]


def consolidation_not_chosen(
    nodes: Iterable[Node], pods: Iterable[Pod], args: GpuConsolidationArgs = ALLOCATION_ONLY, **kw: object
) -> dict[str, NotChosen]:
    snap = snapshot(nodes, pods, **kw)  # type: ignore[arg-type]
    loaded = parse_policy({"telemetry": None})
    result = gpu_consolidation(snap, args, strategy_context(snap, loaded))
    records = {r.node: r for r in result.not_chosen if r.node is not None}
    proposed = {p.node for p in result.proposals}
    assert not proposed & set(records), "a node is either proposed or not chosen, never both"
    assert all(r.strategy == "gpu-consolidation" and r.pod is None for r in records.values())
    return records


# --------------------------------------------------------------------------- gpu-consolidation reasons


def test_every_gpu_node_not_drained_says_which_rule_left_it_out() -> None:
    nodes = [
        node("drained"),
        node("full"),
        node("cordoned", unschedulable=True),
        node("opted-out", annotations={"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}),
        node("young", age=timedelta(minutes=5)),
        node("empty"),
        node("no-gpu", gpus=0, model=None),
    ]
    pods = [
        pod("lone", "drained"),
        *busy("full", 6),
        pod("c", "cordoned"),
        pod("o", "opted-out"),
        pod("y", "young"),
    ]
    records = consolidation_not_chosen(nodes, pods)
    assert {name: r.code for name, r in records.items()} == {
        "full": "allocated-above-threshold",
        "cordoned": "cordoned",
        "opted-out": "opted-out",
        "young": "too-young",
        "empty": "nothing-to-move",
    }
    assert records["full"].reason == "not a candidate: 75% allocated >= threshold 50%"
    assert records["young"].reason == "not a candidate: the node is 5m old < min_node_age 10m"
    assert records["opted-out"].reason == (
        "not a candidate: node opted-out has annotation "
        'cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"'
    )
    assert records["cordoned"].reason == "not a candidate: the node is cordoned"
    assert "no-gpu" not in records  # a node without GPUs is not looked at


def test_a_node_of_unknown_age_is_too_young() -> None:
    unknown = replace(node("unknown"), created=None)
    records = consolidation_not_chosen([unknown, node("sink")], [pod("p", "unknown")])
    assert records["unknown"].reason == "not a candidate: the node's creation time is unknown"


def test_pod_rules_left_out_nodes_say_which_pod_and_why() -> None:
    nodes = [node("static"), node("guarded"), node("spread"), node("big-target")]
    pods = [
        pod("mirror", "static", annotations={"kubernetes.io/config.mirror": "x"}),
        pod("keep", "guarded", annotations={"rebalancer.gpu/evict": "false"}),
        pod("spread-me", "spread", scheduler_name="default-scheduler"),
        *busy("big-target", 6),
    ]
    records = consolidation_not_chosen(nodes, pods)
    assert records["static"].code == "static-pod"
    assert records["guarded"].code == "pod-may-not-move"
    assert "ml/keep" in records["guarded"].reason and "opt-out" in records["guarded"].reason
    assert records["spread"].code == "non-packed-scheduler"
    assert records["spread"].reason == (
        "not drained: 1 pod placed by a non-packed scheduler (default-scheduler) would be spread out again"
    )


def test_a_node_whose_pods_fit_nowhere_or_only_on_smaller_nodes_is_not_drained() -> None:
    nodes = [node("a-1"), node("a-2"), node("small", gpus=2, model=L4)]
    pods = [pod("lone", "a-1"), *busy("a-2", 8), *busy("small", 1)]
    keep_small_free = ALLOCATION_ONLY.model_copy(update={"move_to_smaller_nodes": False})
    records = consolidation_not_chosen(nodes, pods, keep_small_free)
    assert records["a-1"].code == "size-rules"
    assert records["a-1"].reason == (
        "not drained: its pods would land on nodes with fewer GPUs (move_to_smaller_nodes)"
    )

    nowhere = [pod("lone", "a-1", gpus=3), *busy("a-2", 8), *busy("small", 2)]
    records = consolidation_not_chosen(nodes, nowhere)
    assert records["a-1"].code == "cannot-re-place"
    assert "ml/lone cannot be re-placed on any other node" in records["a-1"].reason


def test_nodes_past_the_per_cycle_cap_or_receiving_pods_say_so() -> None:
    # n-0 is drained onto n-1 (the fuller node a packed scheduler prefers); the cap stops n-2.
    nodes = [node("n-0"), node("n-1"), node("n-2"), node("sink")]
    pods = [pod("p-0", "n-0"), pod("p-1", "n-1"), pod("p-1b", "n-1"), pod("p-2", "n-2"), pod("p-2b", "n-2")]
    capped = ALLOCATION_ONLY.model_copy(update={"max_nodes_per_cycle": 1})
    records = consolidation_not_chosen(nodes, pods, capped)
    assert {name: r.code for name, r in records.items()} == {
        "n-1": "receives-pods",
        "n-2": "cycle-cap",
        "sink": "nothing-to-move",
    }
    assert records["n-2"].reason == ("not drained: max_nodes_per_cycle 1 reached by nodes cheaper to drain")


def test_busy_and_unmeasured_nodes_are_not_candidates() -> None:
    nodes = [node("busy-node"), node("blind"), node("sink")]
    pods = [pod("hot", "busy-node"), pod("unseen", "blind"), *busy("sink", 4)]
    rows = [gpu_sample("busy-node", f"GPU-{i}", pod=pods[0] if i == 0 else None, util=71.0) for i in range(8)]
    with_util = ALLOCATION_ONLY.model_copy(update={"max_utilization_percent": 30.0})
    records = consolidation_not_chosen(nodes, pods, with_util, telemetry=telemetry(rows, 3600))
    assert records["busy-node"].code == "gpu-busy"
    assert records["busy-node"].reason == "not a candidate: GPUs average 71% over 1h >= threshold 30%"
    assert records["blind"].code == "telemetry-unusable"
    assert "no GPU telemetry for the node" in records["blind"].reason


# --------------------------------------------------------------------------- idle-gpu reasons


def test_idle_gpu_names_the_busy_gpu_and_the_unmeasured_pod() -> None:
    hot, cold, unseen = pod("hot", "a-1"), pod("cold", "a-1", owner=None), pod("unseen", "a-1")
    rows = [
        gpu_sample("a-1", "GPU-hot", pod=hot, util=64.0),
        gpu_sample("a-1", "GPU-cold", pod=cold, util=0.5),
    ]
    snap = snapshot([node("a-1")], [hot, cold, unseen], telemetry=telemetry(rows, 1800))
    result = idle_gpu(snap, IdleGpuArgs(), strategy_context(snap, parse_policy({})))
    records = {r.pod: r for r in result.not_chosen}
    assert records["hot"].code == "gpu-busy"
    assert records["hot"].reason == "GPU GPU-hot busy (avg 64% over 30m >= threshold 5%)"
    assert records["unseen"].code == "telemetry-unusable"
    assert "cold" not in records  # idle: it is acted on (a finding), not left alone


# --------------------------------------------------------------------------- the cycle and the report


def drain_cluster(allowed: int = 1) -> Snapshot:
    """Node a-1 holds two pods, one guarded by a PDB allowing `allowed` disruptions; a-2 has room for
    both; a-3 is full."""
    nodes = [node("a-1"), node("a-2"), node("a-3")]
    pods = [
        pod("guarded", "a-1", labels={"app": "guarded"}),
        pod("free", "a-1", labels={"app": "free"}),
        *busy("a-2", 4),
        *busy("a-3", 7),
        pod("untouched", "a-3", labels={"app": "untouched"}),
    ]
    return snapshot(nodes, pods, [pdb("guarded", {"app": "guarded"}, allowed)])


def cycle(snap: Snapshot) -> CycleReport:
    return run_cycle(snap, parse_policy(BY_ALLOCATION), DryRunEvictor())


def test_a_node_drain_ties_its_rows_with_a_group_id() -> None:
    report = cycle(drain_cluster())
    assert {r.pod: r.group for r in report.decisions} == {"guarded": "drain/a-1", "free": "drain/a-1"}


def test_the_other_rows_of_a_blocked_drain_say_the_refusal_is_their_drains() -> None:
    report = cycle(drain_cluster(allowed=0))
    rows = {r.pod: r for r in report.decisions}
    assert {r.blocked_by for r in rows.values()} == {"pdb"}
    assert rows["guarded"].reason.startswith("ml/guarded: PDB ml/guarded allows 0 more disruptions")
    assert rows["free"].reason.startswith(
        "not evicted: its drain's refusal, not this pod's: ml/guarded: PDB ml/guarded allows 0"
    )
    assert report.summary.blocked_by == {"pdb": 2}
    assert json.loads(render(report, "json"))["summary"]["blocked_by"] == {"pdb": 2}


def test_the_report_counts_what_each_strategy_left_alone() -> None:
    report = cycle(drain_cluster())
    codes = sorted((r.node, r.code) for r in report.not_chosen)
    assert codes == [("a-2", "allocated-above-threshold"), ("a-3", "allocated-above-threshold")]
    data = json.loads(render(report, "json"))
    assert data["not_chosen"] == {
        "gpu-consolidation": {"count": 2, "top_reasons": [{"code": "allocated-above-threshold", "count": 2}]}
    }
    line = "gpu-consolidation: 2 left alone (allocated-above-threshold: 2)"
    assert f"  {line}" in render(report, "text").splitlines()
    assert f"- {line}" in render(report, "markdown").splitlines()


# --------------------------------------------------------------------------- explain


def explain(report: CycleReport, subject: Subject) -> list[str]:
    return explain_lines(report, subject, ["gpu-consolidation"])


def test_explain_a_drained_node() -> None:
    report = cycle(drain_cluster())
    free, guarded = sorted(report.decisions, key=lambda r: r.pod)
    assert sorted(explain(report, Subject("a-1"))[1:]) == sorted(
        [
            "gpu-consolidation: proposed evicting ml/free to a-2 [drain/a-1]",
            f"  planner: approved (would-evict): {free.reason}",
            "gpu-consolidation: proposed evicting ml/guarded to a-2 [drain/a-1]",
            f"  planner: approved (would-evict): {guarded.reason}",
        ]
    )
    assert free.reason.startswith("node a-1: 2/8 GPUs allocated (25% < 50%); 2 pods re-placed on a-2")


def test_explain_a_node_not_drained_and_the_one_receiving_pods() -> None:
    report = cycle(drain_cluster())
    assert explain(report, Subject("a-3"))[1:] == [
        "gpu-consolidation: not a candidate: 100% allocated >= threshold 50%",
        "planner: nothing to judge: no strategy proposed anything about it",
    ]
    lines = explain(report, Subject("a-2"))
    assert "gpu-consolidation: proposed moving ml/guarded from a-1 onto it" in lines
    assert "gpu-consolidation: not a candidate: 50% allocated >= threshold 50%" in lines


def test_explain_a_blocked_pod() -> None:
    report = cycle(drain_cluster(allowed=0))
    lines = explain(report, Subject("free", namespace="ml", node="a-1"))
    assert lines[0].startswith("pod ml/free on node a-1 (dry-run cycle at 2026-11-29T12:00:00Z")
    assert lines[1] == "gpu-consolidation: proposed evicting ml/free to a-2 [drain/a-1]"
    assert lines[2].startswith(
        "  planner: refused by pdb guard: not evicted: its drain's refusal, not this pod's: ml/guarded"
    )
    assert len(lines) == 3


def test_explain_a_pod_no_strategy_touched() -> None:
    report = cycle(drain_cluster())
    lines = explain_lines(
        report, Subject("untouched", namespace="ml", node="a-3"), ["gpu-consolidation", "gpu-affinity"]
    )
    assert lines[1:] == [
        "gpu-consolidation: its node a-3: not a candidate: 100% allocated >= threshold 50%",
        "gpu-affinity: no verdict: nothing about this pod",
        "planner: nothing to judge: no strategy proposed anything about it",
    ]


@pytest.mark.parametrize(
    ("text", "subject"),
    [("gpu-a-3", Subject("gpu-a-3")), ("ml/train-0", Subject("train-0", namespace="ml"))],
)
def test_explain_subjects(text: str, subject: Subject) -> None:
    assert parse_subject(text) == subject


@pytest.mark.parametrize("text", ["", "a/b/c", "/pod", "ns/"])
def test_explain_refuses_a_subject_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match="expected NODE or NAMESPACE/POD"):
        parse_subject(text)


DEMO_ARGS = ["--snapshot", str(DEMO), "--policy", str(DEMO / "policy.yaml")]


def test_explain_on_the_demo_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    # h100-b-2's drain is refused by a PDB on its first pod; h100-a-1 is busy; alice's notebook is idle.
    assert main(["explain", "research/ablation-lr-3e-4-2jlj5", *DEMO_ARGS]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("pod research/ablation-lr-3e-4-2jlj5 on node h100-b-2")
    refused = next(line for line in out if "planner:" in line)
    assert refused.startswith("  planner: refused by pdb guard: not evicted: its drain's refusal")
    assert any(line.startswith("idle-gpu: research/ablation-lr-3e-4-2jlj5: GPU ") for line in out)
    # Its node matches what it requires; it carries no spread constraint topology-spread looks at.
    assert (
        "gpu-affinity: research/ablation-lr-3e-4-2jlj5: its node matches its nodeSelector and "
        in "\n".join(out)
    )
    assert "topology-spread: no verdict: nothing about this pod" in out

    assert main(["explain", "h100-a-1", *DEMO_ARGS]) == 0
    out = capsys.readouterr().out.splitlines()
    (consolidation,) = [line for line in out if line.startswith("gpu-consolidation:")]
    assert consolidation.startswith("gpu-consolidation: not a candidate: GPUs average ")
    assert consolidation.endswith("over 1h >= threshold 30%")


def test_explain_names_a_missing_node_or_pod(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "nope", *DEMO_ARGS]) == 2
    assert capsys.readouterr().err == f"rebalancer: error: explain: node nope is not in the snapshot {DEMO}\n"
    assert main(["explain", "ml/nope", *DEMO_ARGS]) == 2
    assert "pod ml/nope is not in the snapshot" in capsys.readouterr().err
    assert main(["explain", "nope", "--snapshot", str(DEMO), "--context", "x"]) == 2
    assert "explain --snapshot: --context" in capsys.readouterr().err


def test_explain_never_evicts_even_when_the_policy_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = tmp_path / "policy.yaml"
    live.write_text((DEMO / "policy.yaml").read_text().replace("dry_run: true", "dry_run: false"))
    assert main(["explain", "h100-b-1", "--snapshot", str(DEMO), "--policy", str(live)]) == 0
    out = capsys.readouterr().out
    assert "(dry-run cycle at" in out.splitlines()[0]
    assert "(evicted)" not in out


# --------------------------------------------------------------------------- explain -o json / yaml


def explained_doc(report: CycleReport, subject: Subject, fmt: ExplainFormat = "json") -> dict[str, Any]:
    text = render_explanation(report, subject, ["gpu-consolidation", "gpu-affinity"], fmt)
    doc: dict[str, Any] = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    return doc


def by_strategy(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["strategy"]: entry for entry in doc["strategies"]}


def test_explain_json_of_a_drained_node_lists_its_rows_with_the_planners_verdict() -> None:
    report = cycle(drain_cluster())
    doc = explained_doc(report, Subject("a-1"))
    assert doc["subject"] == {"kind": "node", "name": "a-1", "namespace": None, "node": "a-1"}
    assert (doc["mode"], doc["now"]) == ("dry-run", "2026-11-29T12:00:00Z")
    consolidation = by_strategy(doc)["gpu-consolidation"]
    assert consolidation["verdict"] == "proposed" and consolidation["not_chosen"] == []
    rows = sorted(consolidation["proposals"], key=lambda r: r["pod"])
    assert [(r["pod"], r["target_node"], r["group"], r["outcome"]) for r in rows] == [
        ("free", "a-2", "drain/a-1", "would-evict"),
        ("guarded", "a-2", "drain/a-1", "would-evict"),
    ]
    assert all(r["planner"] == {"verdict": "approved", "guard": None} for r in rows)
    # The rows are the report's own, key for key.
    decisions = json.loads(render(report, "json"))["decisions"]
    assert sorted(({k: v for k, v in r.items() if k != "planner"} for r in rows), key=str) == sorted(
        decisions, key=str
    )
    # Named though it said nothing (this cycle's policy does not run it), as the lines name it.
    assert by_strategy(doc)["gpu-affinity"]["verdict"] == "none"


def test_explain_json_of_a_node_not_drained_and_of_a_blocked_pod() -> None:
    doc = explained_doc(cycle(drain_cluster()), Subject("a-3"))
    [record] = by_strategy(doc)["gpu-consolidation"]["not_chosen"]
    assert record == {
        "code": "allocated-above-threshold",
        "reason": "not a candidate: 100% allocated >= threshold 50%",
        "node": "a-3",
        "namespace": None,
        "pod": None,
    }
    doc = explained_doc(cycle(drain_cluster(allowed=0)), Subject("free", namespace="ml", node="a-1"))
    assert doc["subject"] == {"kind": "pod", "name": "free", "namespace": "ml", "node": "a-1"}
    [row] = by_strategy(doc)["gpu-consolidation"]["proposals"]
    assert row["planner"] == {"verdict": "refused", "guard": "pdb"}
    assert row["reason"].startswith("not evicted: its drain's refusal, not this pod's: ml/guarded")


def test_explain_yaml_is_the_json_document_and_names_skipped_and_silent_strategies() -> None:
    report = replace(
        cycle(drain_cluster()), skipped_strategies=(SkippedStrategy("gpu-affinity", "needs GPU telemetry"),)
    )
    subject = Subject("untouched", namespace="ml", node="a-3")
    doc = explained_doc(report, subject, "yaml")
    assert doc == explained_doc(report, subject, "json")
    assert by_strategy(doc)["gpu-affinity"]["verdict"] == "skipped"
    assert by_strategy(doc)["gpu-affinity"]["skipped"] == "needs GPU telemetry"
    # Its node's verdict, as the lines say it: a node-level record.
    [record] = by_strategy(doc)["gpu-consolidation"]["not_chosen"]
    assert (record["node"], record["pod"], record["code"]) == ("a-3", None, "allocated-above-threshold")
    assert doc["findings"] == []
    bare = replace(report, skipped_strategies=(), not_chosen=())
    assert by_strategy(explained_doc(bare, subject))["gpu-affinity"] == {
        "strategy": "gpu-affinity",
        "verdict": "none",
        "skipped": None,
        "proposals": [],
        "not_chosen": [],
    }


def test_explain_output_json_on_the_demo_cluster_redacts_and_names_the_findings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "a100-a-3", *DEMO_ARGS, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == f"snapshot {DEMO}" and doc["policy"]["name"] == "policy.yaml"
    assert [entry["strategy"] for entry in doc["strategies"]] == [
        "gpu-affinity",
        "idle-gpu",
        "topology-spread",
        "gpu-consolidation",
    ]
    # alice's notebook there is idle: a finding names the node, and idle-gpu proposes its reclaim.
    assert {f["kind"] for f in doc["findings"]} >= {"idle-gpu"}
    assert all(f["node"] == "a100-a-3" for f in doc["findings"])
    assert by_strategy(doc)["idle-gpu"]["verdict"] == "proposed"
    assert main(["explain", "a100-a-3", *DEMO_ARGS, "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == doc
    leaky = Finding(
        kind="telemetry-unavailable", node="a-3", detail="GET https://bob:hunter2@prom/api failed"
    )
    report = replace(cycle(drain_cluster()), findings=(leaky,))
    for fmt in ("text", "json", "yaml"):
        shown = render_explanation(report, Subject("a-3"), ["gpu-consolidation"], fmt)
        assert "hunter2" not in shown and "https://***@prom/api" in shown
