"""`rebalancer simulate` through the command line: JSON keys, text, and bad input exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rebalancer.cli import main

REQUIRED_KEYS = {
    "node_hours",
    "lower_bound_node_hours",
    "ratio",
    "gpu_hours_provisioned",
    "gpu_hours_used",
    "pods",
    "evictions",
    "evictions_per_pod",
    "max_evictions_per_pod",
    "lost_gpu_hours",
    "pending_pod_hours",
    "wall_seconds",
}


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\na,96000,393216,8,G2\nb,104000,524288,2,T4\n")
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time\n"
        "p0,4000,1024,1,1000,T4,LS,Running,0,7200,0\n"
        "p1,4000,1024,2,1000,,LS,Running,0,3600,0\n"
        "p2,4000,1024,1,500,,BE,Running,0,10800,1800\n"
    )
    return nodes, pods


def test_simulate_prints_every_json_key(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = trace
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--replicas", "3", "--seed", "2"]
    code = main([*argv, "--rebalancer", "on", "--interval", "10m", "--output", "json"])
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload.keys() >= REQUIRED_KEYS
    assert payload["wall_seconds"] >= 0
    assert payload["pods"] == 6  # p1 ends at the window start (3600): 2 pods per copy
    assert payload["replicas"] == 3
    assert payload["interval_seconds"] == 600


def test_simulate_text_output(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = trace
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--scheduler", "spread"]) == 0
    out = capsys.readouterr().out
    assert "lower bound node-hours" in out
    assert "spread / off" in out


def test_simulate_bad_input_exits_2_with_one_line_per_problem(
    trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, _ = trace
    code = main(
        ["simulate", "--nodes", str(nodes), "--pods", str(tmp_path / "missing.csv"), "--replicas", "0"]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rebalancer: error: --replicas must be at least 1, got 0"]
    code = main(["simulate", "--nodes", str(nodes), "--pods", str(tmp_path / "missing.csv")])
    assert code == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["simulate", "--nodes", str(nodes), "--pods", "x", "--interval", "later"]) == 2
    assert "--interval" in capsys.readouterr().err


def test_the_default_policy_is_replayed_on_allocation_and_says_how(
    trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --policy the replay runs the shipped default policy. The trace has no telemetry: the
    consolidation's utilisation threshold is treated as met, idle-gpu cannot judge anything, and the
    report says both, and that dry_run is not honoured."""
    nodes, pods = trace
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--rebalancer", "on"]
    assert main([*argv, "--output", "json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["policy"] == "<default policy>"
    notes = payload["policy_notes"]
    assert notes == [
        "dry_run: true not honoured: the replay acts out every approved eviction",
        "idle-gpu (no telemetry in the trace): not run: it needs GPU telemetry to judge anything",
        "gpu-consolidation (no telemetry in the trace): max_utilization_percent 30% treated as met: "
        "nodes judged on allocated GPUs alone (live, a node is drained only when its GPUs also average "
        "below 30%)",
        "limits.max_per_namespace 5: the trace has no namespaces, every pod is in 'trace', so no "
        "cycle evicts more than 5 pods",
        "guards.max_disruptions_per_workload 3: every trace pod is its own workload (a Job), so the "
        "budget is per pod; live, the replicas of one controller share it",
    ]
    (reason,) = payload["skipped_strategies"]
    assert reason.startswith("idle-gpu: needs GPU telemetry")
    assert main([*argv, "--output", "text"]) == 0
    text = capsys.readouterr().out
    rows = [[cell.strip() for cell in line.split("  ") if cell.strip()] for line in text.splitlines()]
    assert ["policy", "<default policy>"] in rows
    assert ["as replayed", notes[2]] in rows


def test_a_policy_file_is_named_and_only_its_telemetry_thresholds_noted(
    trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "dry_run: false\nstrategies:\n  - name: gpu-consolidation\n"
        "    args: {max_utilization_percent: null}\nlimits: {max_per_namespace: null}\n"
        "guards: {max_disruptions_per_workload: null}\n"
    )
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--rebalancer", "on"]
    assert main([*argv, "--policy", str(policy), "--output", "json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["policy"] == str(policy)
    assert payload["policy_notes"] == []
    assert payload["skipped_strategies"] == {}
