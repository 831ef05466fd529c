"""`rebalancer advise` against a real Prometheus, backfilled with three days of GPU history.

Five workloads, each recommendation worked out by hand below from how its series were built (the
utilisation is the Alibaba GenAI duty-cycle trace scaled into a known range, the framebuffer a constant
with one known daily peak), never by calling the code under test; the p95 figures the command reports
are checked against this file's own reading of the samples (the busiest sample of each 5-minute step,
Prometheus' linear-interpolation quantile via `statistics.quantiles(method="inclusive")`). Also: one
query per metric however many pods, and a snapshot directory holding the same history gives the same
advice without Prometheus.
"""

from __future__ import annotations

import json
import math
import statistics
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from rebalancer.cli import EXIT_OK, main
from rebalancer.cycle import run_cycle
from rebalancer.daemon.wiring import kube_snapshot_source
from rebalancer.evictor import DryRunEvictor
from rebalancer.model import Snapshot
from rebalancer.policy import LoadedPolicy, loads_policy
from rebalancer.sources.files import load_snapshot_dir
from rebalancer.sources.usage_history import PrometheusUsage
from tests.builders import replace, write_snapshot_dir
from tests.fake_apiserver import FakeApiServer
from tests.genai_trace import read_genai_trace

if TYPE_CHECKING:
    from tests.prometheus_server import PrometheusServer

pytest_plugins = ["tests.prometheus_server"]
pytestmark = pytest.mark.prometheus

# Far from the instants the other tests on the shared server read.
UNTIL = datetime(2026, 8, 20, tzinfo=UTC)
DAY = 86400
SCRAPE = 60
STEP = 300
GIB = 1024  # MiB
A100, L4, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA L4", "NVIDIA H100 80GB HBM3"
PRODUCT = {A100: "NVIDIA-A100-SXM4-80GB", L4: "NVIDIA-L4", H100: "NVIDIA-H100-80GB-HBM3"}
PRICE = {A100: 5.10, L4: 1.15, H100: 6.90}  # the shipped policy's example prices
MONTH = 730


@dataclass(frozen=True)
class Gpu:
    """One GPU of a pod: its utilisation as a fraction of the trace, its framebuffer and daily peak."""

    node: str
    index: int
    model: str
    namespace: str
    pod: str
    owner: tuple[str, str]
    util_scale: float  # utilisation = trace duty cycle x this
    fb_mib: float
    fb_peak_mib: float
    hours: float = 3 * 24  # how far back its history goes
    profiled: bool = False  # also DCGM_FI_PROF_GR_ENGINE_ACTIVE (= utilisation / 100)
    gpus: int = 1  # GPUs its pod requests

    @property
    def uuid(self) -> str:
        return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{self.node}/{self.index}')}"


HISTORY = (
    # 1. Fits a cheaper model present in the cluster: peak 14 GiB + 20 % = 16.8 GiB <= the L4's 24 GiB,
    #    and at most 35 % of an A100 (throughput 1.0) <= the L4's 0.4. Savings: L4 (5.10 - 1.15) x 730 =
    #    2883.50 beats the MIG slices that would also fit (3g.40gb: 5.10 x 4/7 x 730 = 2127.43; 2g.20gb at
    #    most 5.10 x 5/7 x 730 = 2659.29). Profiled: high confidence.
    Gpu(
        "a100-1",
        0,
        A100,
        "serve",
        "embed-7d9f-x1",
        ("ReplicaSet", "embed-7d9f"),
        0.35,
        12 * GIB,
        14 * GIB,
        profiled=True,
    ),
    # 2. Fits a MIG slice of its own model: peak 8 GiB + 20 % = 9.6 GiB <= 10 GiB, and at most 12 % <=
    #    1/7 = 14.3 %: 1g.10gb, saving 5.10 x 6/7 x 730 = 3191.14, more than the L4's 2883.50.
    Gpu("a100-2", 0, A100, "research", "probe-q8", ("Job", "probe"), 0.12, 6 * GIB, 8 * GIB),
    # 3. Needs its GPU: peak 70 GiB + 20 % = 84 GiB is more than any model or slice holds.
    Gpu("a100-3", 0, A100, "train", "big-z2", ("Job", "big"), 1.0, 60 * GIB, 70 * GIB),
    # 4. Thin data: four hours of history are 48 steps, fewer than the 100 needed.
    Gpu("a100-3", 1, A100, "thin", "new-k4", ("Job", "new"), 0.05, 2 * GIB, 3 * GIB, hours=4),
    # 5. Four GPUs a replica, GPUs 2 and 3 at 0 % all window holding only a CUDA context (300 MiB,
    #    400 MiB once a day): two fewer GPUs, 2 x 6.90 x 730 = 10074.00. No NVLink series: medium
    #    confidence, saying so.
    *(
        Gpu(
            "h100-1",
            i,
            H100,
            "multi",
            "four-0",
            ("Job", "four"),
            0.9 if i < 2 else 0.0,
            20 * GIB if i < 2 else 300,
            30 * GIB if i < 2 else 400,
            gpus=4,
        )
        for i in range(4)
    ),
)


def labels(gpu: Gpu) -> dict[str, str]:
    return {
        "gpu": str(gpu.index),
        "UUID": gpu.uuid,
        "device": f"nvidia{gpu.index}",
        "modelName": gpu.model,
        "Hostname": gpu.node,
        "container": "main",
        "namespace": gpu.namespace,
        "pod": gpu.pod,
        "instance": "10.0.0.1:9400",
        "job": "dcgm-exporter",
    }


Samples = list[tuple[float, float]]


@dataclass
class History:
    util: dict[Gpu, Samples] = field(default_factory=dict)
    fb: dict[Gpu, Samples] = field(default_factory=dict)
    openmetrics: str = ""


def build_history(trace: dict[str, Samples]) -> History:
    """Per GPU a sample a minute: utilisation from the trace's values in turn (scaled), framebuffer at
    its constant with one minute a day at its peak."""
    values = [value for container in sorted(trace) for _, value in trace[container]]
    end = UNTIL.timestamp()
    history = History()
    offset = 0
    for gpu in HISTORY:
        count = int(gpu.hours * 3600 // SCRAPE)
        stamps = [end - (count - i) * SCRAPE + 7 for i in range(count)]  # 7 s off the step boundaries
        util = [min(100.0, values[(offset + i) % len(values)]) * gpu.util_scale for i in range(count)]
        offset += count
        history.util[gpu] = list(zip(stamps, util, strict=True))
        history.fb[gpu] = [
            (stamp, gpu.fb_peak_mib if i % (DAY // SCRAPE) == 100 else gpu.fb_mib)
            for i, stamp in enumerate(stamps)
        ]
    lines: list[str] = []
    families = {"DCGM_FI_DEV_GPU_UTIL": history.util, "DCGM_FI_DEV_FB_USED": history.fb}
    for name, series in families.items():
        lines.append(f"# TYPE {name} gauge")
        for gpu, rows in series.items():
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels(gpu).items()))
            lines += [f"{name}{{{text}}} {value!r} {stamp:.3f}" for stamp, value in rows]
    lines.append("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge")
    for gpu, rows in history.util.items():
        if gpu.profiled:
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels(gpu).items()))
            lines += [
                f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{text}}} {value / 100!r} {stamp:.3f}"
                for stamp, value in rows
            ]
    history.openmetrics = "\n".join([*lines, "# EOF"]) + "\n"
    return history


def p95_of(rows: Samples, seconds: int = 3 * DAY) -> tuple[float, int]:
    """(p95 of the busiest sample of each step, steps), straight from the samples."""
    end_ms = round(UNTIL.timestamp() * 1000)
    per_step: dict[int, list[float]] = defaultdict(list)
    for stamp, value in rows:
        ms = round(stamp * 1000)
        if end_ms - seconds * 1000 < ms <= end_ms:
            per_step[math.ceil(ms / (STEP * 1000))].append(value)
    steps = sorted(max(values) for values in per_step.values())
    if len(steps) == 1:
        return steps[0], 1
    return statistics.quantiles(steps, n=20, method="inclusive")[18], len(steps)


# --------------------------------------------------------------------------- the cluster


def node_json(name: str, model: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": PRODUCT[model]}},
        "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod_json(gpu: Gpu) -> dict[str, Any]:
    started = (UNTIL - timedelta(days=4)).isoformat().replace("+00:00", "Z")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": gpu.pod,
            "namespace": gpu.namespace,
            "uid": f"uid-{gpu.pod}",
            "creationTimestamp": started,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": gpu.owner[0],
                    "name": gpu.owner[1],
                    "uid": "x",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": gpu.node,
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpu.gpus)}}}],
        },
        "status": {"phase": "Running", "startTime": started},
    }


def cluster_objects() -> list[dict[str, Any]]:
    nodes = [
        node_json("a100-1", A100, 8),
        node_json("a100-2", A100, 8),
        node_json("a100-3", A100, 8),
        node_json("l4-1", L4, 4),
        node_json("h100-1", H100, 8),
    ]
    pods = {gpu.pod: pod_json(gpu) for gpu in HISTORY}
    return nodes + list(pods.values())


def write_snapshot(directory: Path, history: History | None) -> Path:
    return write_snapshot_dir(directory, cluster_objects(), UNTIL, history.openmetrics if history else None)


@dataclass(frozen=True)
class Backfilled:
    server: PrometheusServer
    history: History


@pytest.fixture(scope="module")
def backfilled(
    prometheus_server: PrometheusServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backfilled]:
    history = build_history(read_genai_trace(tmp_path_factory.mktemp("genai")))
    prometheus_server.backfill(history.openmetrics)
    yield Backfilled(prometheus_server, history)


def advise(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = main(["advise", *argv, "--output", "json"])
    captured = capsys.readouterr()
    assert code == EXIT_OK, captured.err
    report: dict[str, Any] = json.loads(captured.out)
    return report


def live(backfilled: Backfilled) -> tuple[str, ...]:
    return ("--prometheus-url", backfilled.server.url, "--since", "3d", "--until", UNTIL.isoformat())


# --------------------------------------------------------------------------- tests


def test_each_workload_gets_the_advice_worked_out_by_hand(
    backfilled: Backfilled, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write_snapshot(tmp_path / "cluster", None)
    before = backfilled.server.query_requests()
    report = advise(capsys, *live(backfilled), "--snapshot", str(cluster))
    # One query per metric the advisor reads (framebuffer, utilisation, four profiling, two NVLink).
    assert backfilled.server.query_requests() - before == 8

    rows = {row["workload"]: row for row in report["workloads"]}
    assert set(rows) == {
        "serve/ReplicaSet/embed-7d9f",
        "research/Job/probe",
        "train/Job/big",
        "thin/Job/new",
        "multi/Job/four",
    }
    cheaper = rows["serve/ReplicaSet/embed-7d9f"]
    assert (cheaper["recommendation"], cheaper["target"], cheaper["confidence"]) == (
        "cheaper-model",
        "NVIDIA-L4",
        "high",
    )
    assert cheaper["monthly_saving"] == pytest.approx((PRICE[A100] - PRICE[L4]) * MONTH)
    assert yaml.safe_load(cheaper["patch"]) == {
        "spec": {"template": {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}}}}
    }
    mig = rows["research/Job/probe"]
    assert (mig["recommendation"], mig["target"]) == ("mig-profile", "1g.10gb")
    assert mig["monthly_saving"] == pytest.approx(PRICE[A100] * 6 / 7 * MONTH, abs=0.01)
    assert mig["confidence"] == "medium"  # no profiling metrics for it
    resources = yaml.safe_load(mig["patch"])["spec"]["template"]["spec"]["containers"][0]["resources"]
    mig_resources = {"nvidia.com/gpu": None, "nvidia.com/mig-1g.10gb": 1}
    assert resources == {"limits": mig_resources, "requests": mig_resources}
    assert rows["train/Job/big"]["recommendation"] == "keep"
    assert rows["train/Job/big"]["monthly_saving"] == 0
    thin = rows["thin/Job/new"]
    assert (thin["recommendation"], thin["confidence"], thin["monthly_saving"]) == (
        "low-confidence",
        "low",
        0,
    )
    assert thin["evidence"]["samples"] == 48
    four = rows["multi/Job/four"]
    assert (four["recommendation"], four["target"]) == ("fewer-gpus", "2 GPUs")
    assert four["monthly_saving"] == pytest.approx(2 * PRICE[H100] * MONTH)
    assert four["confidence"] == "medium"
    assert any("NVLink traffic not measured" in note for note in four["notes"])
    # Largest saving first, and the total is theirs.
    savings = [row["monthly_saving"] for row in report["workloads"]]
    assert savings == sorted(savings, reverse=True)
    assert report["total_monthly_saving"] == pytest.approx(sum(savings), abs=0.01)


def test_the_figures_are_the_samples_own(
    backfilled: Backfilled, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write_snapshot(tmp_path / "cluster", None)
    rows = {
        row["workload"]: row
        for row in advise(capsys, *live(backfilled), "--snapshot", str(cluster))["workloads"]
    }
    for gpu in HISTORY[:3]:
        evidence = next(row for row in rows.values() if row["namespace"] == gpu.namespace)["evidence"]
        util_p95, steps = p95_of(backfilled.history.util[gpu])
        fb_p95, _ = p95_of(backfilled.history.fb[gpu])
        assert evidence["p95_compute_percent"] == pytest.approx(util_p95, abs=0.05), gpu.pod
        assert evidence["peak_memory_gib"] == pytest.approx(gpu.fb_peak_mib / GIB), gpu.pod
        assert evidence["p95_memory_gib"] == pytest.approx(fb_p95 / GIB, abs=0.005), gpu.pod
        assert evidence["samples"] == steps == 3 * DAY // STEP, gpu.pod
    assert (
        rows["serve/ReplicaSet/embed-7d9f"]["evidence"]["compute_metric"] == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    )
    assert rows["research/Job/probe"]["evidence"]["compute_metric"] == "DCGM_FI_DEV_GPU_UTIL"
    assert rows["multi/Job/four"]["evidence"]["idle_gpus_per_replica"] == 2


def test_a_snapshot_with_the_same_history_gives_the_same_advice(
    backfilled: Backfilled, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write_snapshot(tmp_path / "cluster", None)
    from_prometheus = advise(capsys, *live(backfilled), "--snapshot", str(cluster))
    with_history = write_snapshot(tmp_path / "with-history", backfilled.history)
    from_files = advise(capsys, "--snapshot", str(with_history), "--since", "3d")
    assert from_files["history"] == f"snapshot {with_history}"
    assert from_prometheus["history"] == f"Prometheus at {backfilled.server.url}"
    for report in (from_prometheus, from_files):
        del report["history"]
    assert from_files == from_prometheus


def test_text_and_markdown_show_the_total_and_the_changes(
    backfilled: Backfilled, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with_history = write_snapshot(tmp_path / "with-history", backfilled.history)
    total = (PRICE[A100] - PRICE[L4]) * MONTH + PRICE[A100] * 6 / 7 * MONTH + 2 * PRICE[H100] * MONTH
    for output, marker in (("text", "Total: "), ("markdown", "**Total: ")):
        assert (
            main(["advise", "--snapshot", str(with_history), "--since", "3d", "--output", output]) == EXIT_OK
        )
        out = capsys.readouterr().out
        assert f"{marker}{total:,.2f}" in out
        assert "nvidia.com/mig-1g.10gb: 1" in out
        assert "multi/Job/four" in out


def test_a_prometheus_that_is_down_is_an_error_not_advice(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write_snapshot(tmp_path / "cluster", None)
    code = main(
        ["advise", "--prometheus-url", "http://127.0.0.1:9", "--snapshot", str(cluster), "--output", "json"]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    assert "advise: Prometheus at http://127.0.0.1:9" in captured.err


# --------------------------------------------------------------------------- in a cycle

ADVISING_POLICY = """
telemetry:
  prometheus: {url: "%s"}
strategies:
  - name: gpu-rightsizing
    args: {window: 3d, step: 5m}
"""


def cluster_snapshot(tmp_path: Path, loaded: LoadedPolicy) -> Snapshot:
    return load_snapshot_dir(write_snapshot(tmp_path / "cluster", None), loaded)


def test_the_live_reader_asks_prometheus_once_an_hour(backfilled: Backfilled, tmp_path: Path) -> None:
    loaded = loads_policy(ADVISING_POLICY % backfilled.server.url, "p.yaml")
    snapshot = cluster_snapshot(tmp_path, loaded)
    prometheus = loaded.policy.telemetry.prometheus if loaded.policy.telemetry else None
    assert prometheus is not None
    reader = PrometheusUsage(prometheus)
    before = backfilled.server.query_requests()
    first = reader.attach(snapshot, loaded)
    assert backfilled.server.query_requests() - before == 8
    assert first.usage is not None and len(first.usage.series) == len(HISTORY)
    later = reader.attach(replace(snapshot, now=snapshot.now + timedelta(minutes=59)), loaded)
    assert backfilled.server.query_requests() - before == 8  # kept: no query
    assert later.usage is first.usage
    reader.attach(replace(snapshot, now=snapshot.now + timedelta(hours=1)), loaded)
    assert backfilled.server.query_requests() - before == 16  # an hour on: read again


def test_a_failed_read_is_a_finding_and_no_usage(tmp_path: Path) -> None:
    loaded = loads_policy(ADVISING_POLICY % "http://127.0.0.1:9", "p.yaml")
    snapshot = cluster_snapshot(tmp_path, loaded)
    prometheus = loaded.policy.telemetry.prometheus if loaded.policy.telemetry else None
    assert prometheus is not None
    found = PrometheusUsage(prometheus).attach(snapshot, loaded)
    assert found.usage is None
    (finding,) = [f for f in found.findings if f.kind == "usage-history-unavailable"]
    assert finding.detail.startswith("Prometheus at http://127.0.0.1:9: ")
    report = run_cycle(found, loaded, DryRunEvictor())
    assert [s.strategy for s in report.skipped_strategies] == ["gpu-rightsizing"]


def test_once_on_a_snapshot_reports_the_advice_as_findings(
    backfilled: Backfilled, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("strategies:\n  - name: gpu-rightsizing\n    args: {window: 3d, step: 5m}\n")
    with_history = write_snapshot(tmp_path / "with-history", backfilled.history)
    code = main(["once", "--snapshot", str(with_history), "--policy", str(policy), "--output", "json"])
    captured = capsys.readouterr()
    assert code == EXIT_OK, captured.err
    report = json.loads(captured.out)
    findings = {f["workload"]: f for f in report["findings"] if f["kind"] == "gpu-rightsizing"}
    assert set(findings) == {"serve/ReplicaSet/embed-7d9f", "research/Job/probe", "multi/Job/four"}
    assert "cheaper-model NVIDIA-L4" in findings["serve/ReplicaSet/embed-7d9f"]["detail"]
    assert report["decisions"] == []


def test_the_daemon_source_keeps_one_reader_across_cycles(backfilled: Backfilled) -> None:
    """The live source of `rebalancer run`, over the fake API server: usage read once, kept for the hour."""
    loaded = loads_policy(ADVISING_POLICY % backfilled.server.url, "p.yaml")
    with FakeApiServer() as api, api.api_client() as api_client:
        for obj in cluster_objects():
            api.add(obj)
        source = kube_snapshot_source(api_client)
        before = backfilled.server.query_requests()
        first = source(UNTIL, loaded)
        second = source(UNTIL + timedelta(minutes=5), loaded)
        assert backfilled.server.query_requests() - before == 8
    assert first.usage is not None and second.usage is first.usage
    report = run_cycle(second, loaded, DryRunEvictor())
    workloads = {f.workload for f in report.findings if f.kind == "gpu-rightsizing"}
    assert workloads == {"serve/ReplicaSet/embed-7d9f", "research/Job/probe", "multi/Job/four"}
    assert report.decisions == ()
