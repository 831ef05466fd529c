"""`rebalancer advise` on the demo cluster's own history: the README's example, its inputs and errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rebalancer.cli import EXIT_BAD_INPUT, EXIT_OK, main
from tests.builders import write_snapshot_dir

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo-cluster"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["advise", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_demo_history_yields_recommendations(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--snapshot", str(DEMO), "--since", "2h", "--step", "1m", "-o", "json")
    assert code == EXIT_OK, err
    report = json.loads(out)
    saving = [w for w in report["workloads"] if w["monthly_saving"] > 0]
    assert saving, "the demo's history must yield at least one recommendation"
    # The reranker holds an H100 for 18.75 GiB at p95 11 %: an L4 (24 GiB, 0.4) takes it, 6.90 - 1.15 an hour.
    reranker = next(w for w in report["workloads"] if w["workload"] == "ml-platform/Deployment/reranker")
    assert (reranker["recommendation"], reranker["target"]) == ("cheaper-model", "NVIDIA-L4")
    assert reranker["monthly_saving"] == pytest.approx((6.90 - 1.15) * 730)
    # The gang-scheduled pre-training job is never advised.
    pretrain = next(w for w in report["workloads"] if w["workload"] == "training/Job/llm-pretrain-7b")
    assert pretrain["recommendation"] == "not-advised"


def test_the_readme_example_is_what_the_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Right-sizing advice", 1)[1].split("\n## ", 1)[0]
    command = next(line for line in section.splitlines() if "--snapshot examples/demo-cluster" in line)
    argv = command.split("#", 1)[0].split()
    assert argv[:2] == ["rebalancer", "advise"]
    shown = section.split("the first lines:", 1)[1].split("```", 2)[1].lstrip("\n")
    code, out, err = run(capsys, *(str(ROOT / a) if a.startswith("examples/") else a for a in argv[2:]))
    assert code == EXIT_OK, err
    out = out.replace(str(ROOT) + "/", "")
    for part in shown.split("...\n"):
        assert part in out


def test_thin_history_is_low_confidence_never_a_saving(capsys: pytest.CaptureFixture[str]) -> None:
    # Two hours in 5-minute steps are 24 steps, fewer than the 100 needed.
    code, out, err = run(capsys, "--snapshot", str(DEMO), "--since", "2h", "-o", "json")
    assert code == EXIT_OK, err
    workloads = json.loads(out)["workloads"]
    assert workloads and all(w["recommendation"] == "low-confidence" for w in workloads)
    assert all(w["monthly_saving"] == 0 and "24 samples" in w["reason"] for w in workloads)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--since", "7m", "--step", "5m"],
            "advise: --since / --step: the period (7m) is not a whole number",
        ),
        (["--step", "5s"], "advise: --step 5s is shorter than telemetry.scrape_interval"),
        (["--until", "yesterday"], "advise: --until:"),
        (["--prometheus-url", "ftp://x"], "advise: --prometheus-url: expected an http(s):// URL"),
    ],
)
def test_bad_flags_are_input_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "--snapshot", str(DEMO), *argv)
    assert code == EXIT_BAD_INPUT
    assert out == ""
    assert message in err
    assert "Traceback" not in err


def test_without_any_history_it_says_where_to_find_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--kubeconfig", "/nonexistent")
    assert code == EXIT_BAD_INPUT
    assert "advise: no history: pass --prometheus-url URL" in err


def test_a_policy_s_rightsizing_arguments_are_used(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("strategies:\n  - name: gpu-rightsizing\n    args: {min_samples: 121}\n")
    code, out, err = run(
        capsys,
        "--snapshot",
        str(DEMO),
        "--since",
        "2h",
        "--step",
        "1m",
        "--policy",
        str(policy),
        "-o",
        "json",
    )
    assert code == EXIT_OK, err
    workloads = json.loads(out)["workloads"]
    assert all(w["recommendation"] == "low-confidence" for w in workloads)  # 120 steps < 121


def test_a_preset_s_metric_names_are_the_ones_looked_for(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With `preset: nv-gpu` the history holds `nv_gpu_*` series, not DCGM's: they are found and read."""
    now = datetime(2026, 11, 29, 12, tzinfo=UTC)
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p-0", "namespace": "ml", "uid": "u"},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Running"},
    }
    labels = 'kubernetes_node="n1",gpu_uuid="GPU-1",gpu="0",pod="p-0",namespace="ml",container="main"'
    end = now.timestamp()
    lines = ["# TYPE nv_gpu_utilization gauge"]
    lines += [f"nv_gpu_utilization{{{labels}}} 0.1 {end - 60 * (120 - i) + 53:.0f}" for i in range(120)]
    lines += ["# TYPE nv_gpu_memory_used_bytes gauge"]
    stamps = [end - 60 * (120 - i) + 53 for i in range(120)]
    lines += [f"nv_gpu_memory_used_bytes{{{labels}}} {8 * 2**30} {stamp:.0f}" for stamp in stamps]
    directory = write_snapshot_dir(tmp_path / "snap", [node, pod], now, "\n".join([*lines, "# EOF"]) + "\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text("telemetry:\n  preset: nv-gpu\n")
    argv = [
        "--snapshot",
        str(directory),
        "--since",
        "2h",
        "--step",
        "1m",
        "--policy",
        str(policy),
        "-o",
        "json",
    ]
    code, out, err = run(capsys, *argv)
    assert code == EXIT_OK, err
    (workload,) = json.loads(out)["workloads"]
    assert workload["evidence"]["samples"] == 120
    assert workload["evidence"]["peak_memory_gib"] == 8.0
    assert workload["evidence"]["p95_compute_percent"] == 10.0
