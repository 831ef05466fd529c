"""The live telemetry source against a real Prometheus, backfilled with promtool.

- equivalence: one DCGM history read from a snapshot directory and from Prometheus gives the same
  GpuTelemetry rows (MIG instances, time-sliced GPUs, exported_* and relabelled node labels, stale and
  late series, a deleted pod's quiet series in the group of its GPU's fresh one, samples after `now`)
  and the same idle-gpu decisions, at several `now`s and windows;
- realistic series: the Alibaba GenAI duty-cycle trace as DCGM_FI_DEV_GPU_UTIL for its 143 containers;
  idle-gpu flags exactly the containers the raw CSV says stayed below the threshold;
- faults a real server can produce: stopped mid-run, NaN samples, missing labels, deleted pods;
- the query count does not depend on the size of the cluster;
- `rebalancer snapshot` captures history that replays to the same aggregates.
"""

from __future__ import annotations

import json
import random
import re
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import yaml

from rebalancer.cli import main
from rebalancer.model import Finding, Pod, Snapshot, StrategyResult, Telemetry
from rebalancer.policy import (
    ConfiguredStrategy,
    LoadedPolicy,
    PrometheusConfig,
    TelemetryConfig,
    load_policy,
    parse_policy,
)
from rebalancer.registry import StrategyArgs, StrategyContext
from rebalancer.sources import prometheus_plan
from rebalancer.sources.files import load_snapshot_dir
from rebalancer.sources.kube import KubeSource
from rebalancer.sources.prometheus import PrometheusTelemetrySource
from rebalancer.sources.prometheus_http import PrometheusHttp
from rebalancer.workloads import IDLE_SINCE, resolve
from strategies.idle_gpu import IdleGpuArgs, idle_gpu
from tests.builders import NOW, replace
from tests.fake_apiserver import FakeApiServer, controller_json
from tests.genai_trace import read_genai_trace
from tests.test_prometheus_source import NEAR_MISSES, ODD_UUIDS

if TYPE_CHECKING:
    from tests.prometheus_server import PrometheusServer, ServerFactory

pytest_plugins = ["tests.prometheus_server"]
pytestmark = pytest.mark.prometheus

STEP = 30
WINDOWS = frozenset({120, 300, 1800, 3600})
IDLE = IdleGpuArgs(namespaces=("ml",))
# Far from NOW, so the fault data never shows up in the equivalence windows.
FAULT_NOW = NOW - timedelta(days=30)


class WindowArgs(StrategyArgs):
    """Asks the sources for every window the equivalence test compares."""

    def telemetry_windows(self) -> frozenset[int]:
        return WINDOWS


def loaded_policy(prometheus_url: str | None = None) -> LoadedPolicy:
    telemetry: dict[str, Any] = (
        {"prometheus": {"url": prometheus_url, "retries": 1}} if prometheus_url else {}
    )
    base = parse_policy(
        {"strategies": [{"name": "idle-gpu", "args": {"namespaces": ["ml"]}}], "telemetry": telemetry}
    )
    return LoadedPolicy(
        policy=base.policy,
        strategies=(*base.strategies, ConfiguredStrategy(name="windows", args=WindowArgs())),
        source="<test>",
    )


def live_source(server: PrometheusServer, windows: frozenset[int] = WINDOWS) -> PrometheusTelemetrySource:
    cfg = TelemetryConfig(prometheus=PrometheusConfig(url=server.url, retries=1))
    return PrometheusTelemetrySource(cfg, windows)


# --------------------------------------------------------------------------- a DCGM history


@dataclass(frozen=True)
class Gpu:
    """One series group of the history: labels, a utilisation pattern, and when it reports."""

    labels: Mapping[str, str]
    util: Callable[[random.Random], float]
    fb_used: float
    start: int = 7200  # seconds before NOW of the first sample
    stop: int = -600  # seconds before NOW of the last sample (negative: after NOW)
    jitter_ms: int = 0
    fb_total: float = 81559.0


def exporter_labels(node: str, index: int, uuid_: str, model: str, *, legacy: bool) -> dict[str, str]:
    return {
        "gpu": str(index),
        "UUID": uuid_,
        "device": f"nvidia{index}",
        "modelName": model,
        ("Hostname" if legacy else "hostname"): node,
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }


def exported(pod: str, namespace: str = "ml") -> dict[str, str]:
    """A ServiceMonitor without honorLabels: the exporter's own pod/namespace plus exported_*."""
    return {
        "pod": "nvidia-dcgm-exporter-7xk2p",
        "namespace": "gpu-operator",
        "container": "nvidia-dcgm-exporter",
        "exported_pod": pod,
        "exported_namespace": namespace if pod else "",
        "exported_container": "main" if pod else "",
    }


def busy(rng: random.Random) -> float:
    return float(rng.randint(55, 98))


def idle(rng: random.Random) -> float:
    return float(rng.choice((0, 0, 0, 1, 2)))


A100, T4, L4 = "NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA L4"
MIG_UUID = "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"
NEW_UUID = "GPU-eeeeeeee-0000-4000-8000-000000000000"


def history() -> list[Gpu]:
    a = [f"GPU-aaaaaaaa-0000-4000-8000-00000000000{i}" for i in range(3)]
    b = [f"GPU-bbbbbbbb-0000-4000-8000-00000000000{i}" for i in range(4)]

    def on_a(index: int, pod: str) -> dict[str, str]:  # exporter < 4.6, ServiceMonitor without honorLabels
        return {**exporter_labels("gpu-a", index, a[index], A100, legacy=True), **exported(pod)}

    def on_b(index: int, pod: str) -> dict[str, str]:  # exporter >= 4.6, honorLabels: pod labels as they are
        labels = exporter_labels("gpu-b", index, b[index], T4, legacy=False)
        return {**labels, "namespace": "ml", "pod": pod, "container": "main"}

    mig = {**exporter_labels("gpu-a", 3, MIG_UUID, A100, legacy=True), "GPU_I_PROFILE": "3g.40gb"}
    relabelled = {"gpu": "0", "UUID": "GPU-cccccccc-0000-4000-8000-000000000000", "modelName": L4}
    t4 = 15360.0
    return [
        Gpu(on_a(0, "train-0"), busy, 61234, jitter_ms=137),
        Gpu(on_a(1, "idle-0"), idle, 20480, jitter_ms=905),
        # VRAM held with no pod attached: leaked.
        Gpu(on_a(2, ""), lambda _r: 0.0, 30000),
        # ... by a pod deleted 10 minutes ago: its series (quiet beyond the lookback) and the GPU's own
        # are one group, whose newest sample and framebuffer are the GPU's fresh ones.
        Gpu(on_a(2, "old-0"), busy, 25000, stop=600, jitter_ms=250),
        # MIG: two instances of one A100, each its own pod.
        Gpu({**mig, "GPU_I_ID": "1", **exported("mig-busy")}, busy, 30001, jitter_ms=1),
        Gpu({**mig, "GPU_I_ID": "2", **exported("mig-idle")}, idle, 9000, jitter_ms=2),
        # Time slicing: one T4, two pods; the exporter repeats the device's series for each pod.
        Gpu(on_b(0, "share-0"), idle, 3000, jitter_ms=400, fb_total=t4),
        Gpu(on_b(0, "share-1"), idle, 3000, jitter_ms=400, fb_total=t4),
        # Started 4 minutes ago: too few samples to judge.
        Gpu(on_b(1, "late-0"), idle, 900, start=240, fb_total=t4),
        # A deleted pod: its series stopped 12 minutes ago.
        Gpu(on_b(2, "gone-0"), idle, 4000, stop=720, fb_total=t4),
        # A pod whose exporter went quiet 8 minutes ago.
        Gpu(on_b(3, "stalled-0"), idle, 4000, stop=480, fb_total=t4),
        # The node name only from scrape relabelling (kubernetes_node), no Hostname label at all.
        Gpu(
            {**relabelled, "kubernetes_node": "gpu-c", "namespace": "serve", "pod": "infer-0"},
            idle,
            2000,
            jitter_ms=999,
            fb_total=23034,
        ),
        # A pod created after the view's pod list: its GPU was free until a minute ago, and the
        # exporter now names the new pod, which the view does not have. Held, not leaked.
        Gpu(exporter_labels("gpu-d", 0, NEW_UUID, A100, legacy=False), lambda _r: 0.0, 0, stop=60),
        Gpu(
            {**exporter_labels("gpu-d", 0, NEW_UUID, A100, legacy=False), "namespace": "ml", "pod": "new-0"},
            busy,
            30000,
            start=45,
        ),
        # Unusable: no GPU UUID, and no node label.
        Gpu({"gpu": "7", "Hostname": "gpu-a"}, idle, 1),
        Gpu({"gpu": "0", "UUID": "GPU-dddddddd-0000-4000-8000-000000000000"}, idle, 1),
    ]


def openmetrics(gpus: list[Gpu], now: datetime, *, nan_every: int = 0) -> str:
    """The history as OpenMetrics: util, FB used and free per series, timestamps in seconds."""
    families: dict[str, list[str]] = defaultdict(list)
    base = now.timestamp()
    for number, gpu in enumerate(gpus):
        rng = random.Random(number)
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(gpu.labels.items()))
        first, last = base - gpu.start, base - gpu.stop
        index = 0
        while (at := first + index * STEP + gpu.jitter_ms / 1000) <= last:
            util = gpu.util(rng)
            if nan_every and index % nan_every == nan_every - 1:
                util = float("nan")
            used = gpu.fb_used + rng.randint(0, 3)
            stamp = f"{at:.3f}"
            families["DCGM_FI_DEV_GPU_UTIL"].append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util!r} {stamp}")
            families["DCGM_FI_DEV_FB_USED"].append(f"DCGM_FI_DEV_FB_USED{{{labels}}} {used!r} {stamp}")
            free = gpu.fb_total - used
            families["DCGM_FI_DEV_FB_FREE"].append(f"DCGM_FI_DEV_FB_FREE{{{labels}}} {free!r} {stamp}")
            index += 1
    lines: list[str] = []
    for metric, samples in families.items():
        lines += [f"# TYPE {metric} gauge", *samples]
    return "\n".join([*lines, "# EOF"]) + "\n"


def node_json(name: str, model: str, gpus: int = 4, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    allocatable = {
        "cpu": "64",
        "memory": "256Gi",
        "pods": "110",
        "nvidia.com/gpu": str(gpus),
        **(extra or {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": model.replace(" ", "-")}},
        "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod_json(
    name: str, node: str, *, namespace: str = "ml", resource: str = "nvidia.com/gpu"
) -> dict[str, Any]:
    started = (NOW - timedelta(days=1)).isoformat().replace("+00:00", "Z")
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": f"{name}-rs",
        "uid": "x",
        "controller": True,
    }
    container = {"name": "main", "resources": {"limits": {resource: "1"}}} if resource else {"name": "main"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "creationTimestamp": started,
            "ownerReferences": [owner],
        },
        "spec": {"nodeName": node, "containers": [container]},
        "status": {"phase": "Running", "startTime": started},
    }


def cluster_objects() -> list[dict[str, Any]]:
    return [
        node_json("gpu-a", A100, extra={"nvidia.com/mig-3g.40gb": "2"}),
        node_json("gpu-b", T4, extra={"nvidia.com/gpu.shared": "4"}),
        node_json("gpu-c", L4, gpus=1),
        node_json("gpu-d", A100, gpus=1),
        pod_json("train-0", "gpu-a"),
        pod_json("idle-0", "gpu-a"),
        pod_json("mig-busy", "gpu-a", resource="nvidia.com/mig-3g.40gb"),
        pod_json("mig-idle", "gpu-a", resource="nvidia.com/mig-3g.40gb"),
        pod_json("share-0", "gpu-b", resource="nvidia.com/gpu.shared"),
        pod_json("share-1", "gpu-b", resource="nvidia.com/gpu.shared"),
        pod_json("late-0", "gpu-b"),
        pod_json("stalled-0", "gpu-b"),
        pod_json("infer-0", "gpu-c", namespace="serve"),
        # The exporter's own pod holds no GPU and must never be blamed for one.
        pod_json("nvidia-dcgm-exporter-7xk2p", "gpu-a", namespace="gpu-operator", resource=""),
    ]


def write_snapshot(directory: Path, om: str, now: datetime) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cluster.json").write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster_objects()})
    )
    (directory / "dcgm.om").write_text(om)
    (directory / "snapshot.yaml").write_text(f"now: {now.isoformat()}\n")
    return directory


# --------------------------------------------------------------------------- comparing


def assert_same_telemetry(expected: Telemetry, actual: Telemetry) -> None:
    assert expected.available, expected.problem
    assert actual.available, actual.problem
    assert sorted(actual.windows) == sorted(expected.windows)
    for window, want in expected.windows.items():
        got = actual.windows[window]
        keys = [(r.device_key, r.pod_key) for r in want.gpus]
        assert [(r.device_key, r.pod_key) for r in got.gpus] == keys, f"rows of the {window}s window"
        for a, b in zip(want.gpus, got.gpus, strict=True):
            for f in msgspec.structs.fields(a):
                va, vb = getattr(a, f.name), getattr(b, f.name)
                if isinstance(va, float) and isinstance(vb, float):
                    assert vb == pytest.approx(va, rel=1e-12, abs=1e-9), (window, a.device_key, f.name)
                else:
                    assert vb == va, (window, a.device_key, a.pod_key, f.name)


def decisions(result: StrategyResult) -> tuple[list[Any], list[Finding]]:
    proposals = [(p.kind, tuple(pod.key for pod in p.pods), p.reason) for p in result.proposals]
    return sorted(proposals), sorted(result.findings, key=repr)


@pytest.fixture(scope="module")
def dcgm_server(prometheus_server: PrometheusServer) -> PrometheusServer:
    """The session's Prometheus with the equivalence history and the fault history backfilled."""
    prometheus_server.backfill(openmetrics(history(), NOW))
    labels = exporter_labels("gpu-f", 0, "GPU-ffffffff-0000-4000-8000-000000000000", A100, legacy=True)
    nan_gpu = Gpu({**labels, **exported("nan-0")}, idle, 100)
    prometheus_server.backfill(openmetrics([nan_gpu], FAULT_NOW, nan_every=7))
    return prometheus_server


# --------------------------------------------------------------------------- equivalence


# NOW, an instant between samples, and one that falls exactly on samples of train-0 (whose 30m window then
# starts exactly on another of its samples: both ends of a range are inclusive).
NOWS = [
    NOW,
    NOW - timedelta(minutes=7, seconds=13, milliseconds=500),
    NOW - timedelta(minutes=45) + timedelta(milliseconds=137),
]


@pytest.mark.parametrize("now", NOWS, ids=["now", "between-samples", "on-a-sample"])
def test_snapshot_file_and_live_prometheus_agree(
    dcgm_server: PrometheusServer, tmp_path: Path, now: datetime
) -> None:
    loaded = loaded_policy()
    from_file = load_snapshot_dir(write_snapshot(tmp_path, openmetrics(history(), NOW), now), loaded)
    pods = {p.key: p for p in from_file.pods}
    telemetry, findings = live_source(dcgm_server).telemetry(now, pods)

    assert_same_telemetry(from_file.telemetry, telemetry)
    # The same unusable series are reported by both.
    unusable = sorted(f.detail.split(" label ")[0] for f in findings if f.kind == "unusable-telemetry")
    assert unusable == sorted(
        f.detail.split(" label ")[0] for f in from_file.findings if f.kind == "unusable-telemetry"
    )
    assert len(unusable) == 3 * 2  # per metric: one series without a UUID, one without a node

    live = replace(from_file, telemetry=telemetry)
    ctx = StrategyContext()
    assert decisions(idle_gpu(live, IDLE, ctx)) == decisions(idle_gpu(from_file, IDLE, ctx))


def test_a_fleet_of_quiet_exporters_is_looked_up_cluster_wide_to_the_same_rows(
    dcgm_server: PrometheusServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past LATE_SELECT_LIMIT quiet GPUs the late query selects every series, stepping by the lookback:
    the same rows (exact for series without a staleness marker, as a backfill has none)."""
    monkeypatch.setattr(prometheus_plan, "LATE_SELECT_LIMIT", 0)
    loaded = loaded_policy()
    from_file = load_snapshot_dir(write_snapshot(tmp_path, openmetrics(history(), NOW), NOW), loaded)
    telemetry, _ = live_source(dcgm_server).telemetry(NOW, {p.key: p for p in from_file.pods})
    assert_same_telemetry(from_file.telemetry, telemetry)


def test_decisions_at_now_are_the_expected_ones(dcgm_server: PrometheusServer, tmp_path: Path) -> None:
    snapshot = load_snapshot_dir(write_snapshot(tmp_path, openmetrics(history(), NOW), NOW), loaded_policy())
    telemetry, findings = live_source(dcgm_server).telemetry(NOW, {p.key: p for p in snapshot.pods})
    result = idle_gpu(replace(snapshot, telemetry=telemetry), IDLE, StrategyContext())

    evicted = sorted(pod.name for p in result.proposals for pod in p.pods)
    # A MIG pod is judged by its own instance's series: mig-idle is idle, mig-busy is not.
    assert evicted == ["idle-0", "mig-idle", "share-0", "share-1"]
    by_kind: dict[str, set[str | None]] = defaultdict(set)
    for finding in result.findings:
        by_kind[finding.kind].add(finding.pod)
    assert by_kind["idle-gpu"] == {
        "idle-0",
        "mig-idle",
        "share-0",
        "share-1",
        "infer-0",
    }  # infer-0: report only
    assert by_kind["stale-telemetry"] == {"late-0", "stalled-0"}
    assert by_kind["leaked-vram"] == {None}
    (leak,) = [f for f in result.findings if f.kind == "leaked-vram"]
    assert leak.gpu == "GPU-aaaaaaaa-0000-4000-8000-000000000002"

    # The deleted pod's series: attributed to nobody, reported by the source as stale.
    window = telemetry.window(1800)
    assert window is not None
    assert all(row.pod_name != "gone-0" for row in window.gpus)
    (gone,) = [f for f in findings if f.kind == "stale-telemetry"]
    assert (gone.pod, gone.gpu) == ("gone-0", "GPU-bbbbbbbb-0000-4000-8000-000000000002")
    assert "no longer exists" in gone.detail
    # MIG instances and time-sliced pods each get their own row on the right device.
    rows = {row.pod_name: row for row in window.gpus}
    assert (rows["mig-idle"].uuid, rows["mig-idle"].mig_instance, rows["mig-idle"].mig_profile) == (
        MIG_UUID,
        "2",
        "3g.40gb",
    )
    assert rows["share-0"].uuid == rows["share-1"].uuid == "GPU-bbbbbbbb-0000-4000-8000-000000000000"
    assert rows["infer-0"].node == "gpu-c"
    assert rows["train-0"].pod_namespace == "ml"  # exported_pod, never the exporter's own pod label
    # new-0, started since the pod list: its GPU's row has no pod, and says a pod holds its memory.
    (new,) = [row for row in window.gpus if row.uuid == NEW_UUID]
    assert (new.pod_key, new.fb_used_by_unseen_pod) == (None, True)
    assert new.fb_used_mib is not None and new.fb_used_mib >= 30000


def test_nan_samples_never_make_a_gpu_idle(dcgm_server: PrometheusServer) -> None:
    pod = Pod(namespace="ml", name="nan-0", node_name="gpu-f")
    pod = replace(pod, gpu=replace(pod.gpu, count=1), started=FAULT_NOW - timedelta(days=1))
    telemetry, findings = live_source(dcgm_server).telemetry(FAULT_NOW, {pod.key: pod})
    window = telemetry.window(1800)
    assert window is not None
    # A NaN sample makes sum_over_time NaN: an impossible answer, so the GPU has no telemetry at all.
    assert window.gpus == ()
    (bad,) = findings
    assert bad.kind == "bad-telemetry"
    assert (bad.node, bad.pod) == ("gpu-f", "nan-0")
    assert "sum nan is NaN" in bad.detail and "over 2m" in bad.detail  # the first window it showed in
    snapshot = Snapshot(now=FAULT_NOW, nodes={}, pods=(pod,), telemetry=telemetry)
    result = idle_gpu(snapshot, IDLE, StrategyContext())
    assert result.proposals == ()
    assert [f.kind for f in result.findings] == ["stale-telemetry"]


def has_late_series(samples: Mapping[str, list[tuple[float, float]]], now: datetime, window: int) -> bool:
    """Whether a series has samples in the window but none within the 5m lookback."""
    at = now.timestamp()
    return any(
        any(at - window <= t < at - 300 for t, _ in rows) and not any(at - 300 <= t <= at for t, _ in rows)
        for rows in samples.values()
    )


def test_query_count_does_not_grow_with_the_cluster(dcgm_server: PrometheusServer, genai: GenAi) -> None:
    source = live_source(dcgm_server, frozenset({1800}))
    counts = []
    for now in (NOW, genai.now):
        before = dcgm_server.query_requests()
        telemetry, _ = source.telemetry(now)
        counts.append(dcgm_server.query_requests() - before)
        assert telemetry.available
    small, large = (telemetry_rows(source, now) for now in (NOW, genai.now))
    assert small < 20
    assert large >= 100
    # The plan, and one more query when some series went quiet within the window (NOW: gone-0 and
    # stalled-0), however many GPUs there are.
    late = has_late_series(genai.samples, genai.now, 1800)
    assert counts == [len(source.plan) + 1, len(source.plan) + late]


def test_only_the_gpus_of_late_series_are_looked_up_beyond_the_lookback(
    dcgm_server: PrometheusServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    snapshot = load_snapshot_dir(write_snapshot(tmp_path, openmetrics(history(), NOW), NOW), loaded_policy())
    pods = {p.key: p for p in snapshot.pods}
    asked: list[str] = []
    real_query = PrometheusHttp.query_vector

    def record(http: PrometheusHttp, expr: str, time_param: str) -> object:
        asked.append(expr)
        return real_query(http, expr, time_param)

    monkeypatch.setattr(PrometheusHttp, "query_vector", record)
    source = live_source(dcgm_server)
    telemetry, _ = source.telemetry(NOW, pods)
    assert telemetry.available
    assert asked[: len(source.plan)] == [q.expr for q in source.plan]
    (late,) = asked[len(source.plan) :]
    # gone-0 (12 minutes quiet) and stalled-0 (8 minutes): every other group was heard from within 5m,
    # old-0's too (deleted 10 minutes ago, its GPU's own series is fresh).
    assert set(re.findall(r"GPU-[0-9a-f-]+", late.replace("\\", ""))) == {
        "GPU-bbbbbbbb-0000-4000-8000-000000000002",
        "GPU-bbbbbbbb-0000-4000-8000-000000000003",
    }
    window = telemetry.window(1800)
    assert window is not None
    newest = {row.pod_name: row.newest_sample for row in window.gpus}
    assert newest["stalled-0"] is not None
    assert NOW - newest["stalled-0"] < timedelta(minutes=8, seconds=STEP)
    assert NOW - newest["stalled-0"] >= timedelta(minutes=8)

    # Windows within the lookback need nothing beyond the plan.
    asked.clear()
    short = live_source(dcgm_server, frozenset({120, 300}))
    telemetry, _ = short.telemetry(NOW, pods)
    assert telemetry.available
    assert asked == [q.expr for q in short.plan]


def test_a_real_prometheus_reads_the_late_query_s_uuid_regex_as_exactly_its_uuids(
    prometheus_server: PrometheusServer,
) -> None:
    """The UUID selector `late_query` writes, read by Prometheus itself: a series labelled with each odd
    UUID (a newline, quotes, backslashes, control characters, regex metacharacters) is matched, and
    none of the near misses is. The series are made by label_replace (their values written as JSON
    strings, which PromQL reads alike), the match by label_replace with the selector's string, anchored
    as a matcher's."""
    expr = prometheus_plan.late_query(TelemetryConfig(), [3600], {"UUID": set(ODD_UUIDS)})
    (regex,) = set(re.findall(r'UUID=~("(?:[^"\\]|\\.)*")', expr, flags=re.DOTALL))
    for value in (*ODD_UUIDS, *NEAR_MISSES):
        labelled = f'label_replace(vector(1), "UUID", {json.dumps(value, ensure_ascii=False)}, "", "")'
        (sample,) = prometheus_server.query(
            f'label_replace({labelled}, "hit", "yes", "UUID", {regex})', NOW.timestamp()
        )
        assert sample["metric"].get("UUID", "") == value
        assert (sample["metric"].get("hit") == "yes") == (value in ODD_UUIDS), value


def telemetry_rows(source: PrometheusTelemetrySource, now: datetime) -> int:
    telemetry, _ = source.telemetry(now)
    window = telemetry.window(1800)
    return len(window.gpus) if window is not None else 0


# --------------------------------------------------------------------------- faults with a real server


def test_prometheus_stopped_mid_run(
    prometheus_factory: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = prometheus_factory()
    server.backfill(openmetrics(history()[:2], NOW))
    server.start()
    source = live_source(server)
    telemetry, findings = source.telemetry(NOW)
    assert telemetry.available and findings == ()

    asked: list[str] = []
    real_query = PrometheusHttp.query_vector

    def stop_after_three(http: PrometheusHttp, expr: str, time_param: str) -> object:
        asked.append(expr)
        if len(asked) == 3:
            server.stop()
        return real_query(http, expr, time_param)

    monkeypatch.setattr(PrometheusHttp, "query_vector", stop_after_three)
    telemetry, findings = source.telemetry(NOW)
    assert not telemetry.available
    assert len(asked) == 3  # the third query finds the server gone; nothing after it is asked
    assert [f.kind for f in findings] == ["telemetry-unavailable"]
    assert telemetry.problem is not None and "cannot connect" in telemetry.problem


# --------------------------------------------------------------------------- the GenAI trace


@dataclass(frozen=True)
class GenAi:
    now: datetime
    samples: Mapping[str, list[tuple[float, float]]]  # pod name -> (timestamp, value)
    pods: tuple[Pod, ...]


def genai_name(index: int) -> str:
    return f"genai-{index:03d}"


@pytest.fixture(scope="module")
def genai(dcgm_server: PrometheusServer, tmp_path_factory: pytest.TempPathFactory) -> GenAi:
    by_ip = read_genai_trace(tmp_path_factory.mktemp("genai"))

    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    samples: dict[str, list[tuple[float, float]]] = {}
    pods: list[Pod] = []
    for index, ip in enumerate(sorted(by_ip)):
        name, node = genai_name(index), f"genai-node-{index // 8:02d}"
        gpu = f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, ip)}"
        labels = (
            f'UUID="{gpu}",container="worker",gpu="{index % 8}",hostname="{node}",'
            f'namespace="genai",pod="{name}"'
        )
        samples[name] = sorted(by_ip[ip])
        lines += [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {value!r} {stamp:.3f}" for stamp, value in samples[name]]
        pod = Pod(namespace="genai", name=name, node_name=node)
        pods.append(replace(pod, gpu=replace(pod.gpu, count=1)))
    dcgm_server.backfill("\n".join([*lines, "# EOF"]) + "\n")

    stamps = sorted({stamp for rows in samples.values() for stamp, _ in rows})
    now = datetime.fromtimestamp(stamps[int(len(stamps) * 0.6)], tz=NOW.tzinfo)
    started = now - timedelta(days=1)
    return GenAi(now=now, samples=samples, pods=tuple(replace(p, started=started) for p in pods))


def test_genai_trace_idle_containers_are_exactly_those_below_threshold(
    dcgm_server: PrometheusServer, genai: GenAi
) -> None:
    args = IdleGpuArgs(namespaces=("genai",))
    lo, hi = genai.now.timestamp() - args.window, genai.now.timestamp()
    expected: set[str] = set()
    judged = 0
    for name, rows in genai.samples.items():
        values = [value for stamp, value in rows if lo <= stamp <= hi]
        newest = max((stamp for stamp, _ in rows if stamp <= hi), default=None)
        fresh = newest is not None and hi - newest <= args.max_telemetry_age
        if len(values) >= args.min_samples and fresh:
            judged += 1
            average = sum(values) / len(values)
            assert abs(average - args.max_utilization_percent) > 1e-6  # no knife-edge case
            if average < args.max_utilization_percent:
                expected.add(name)
    assert 0 < len(expected) < judged  # the trace has both idle and busy containers at this instant

    source = live_source(dcgm_server, args.telemetry_windows())
    telemetry, findings = source.telemetry(genai.now, {p.key: p for p in genai.pods})
    assert telemetry.available, telemetry.problem
    assert not [f for f in findings if f.kind != "stale-telemetry"]
    snapshot = Snapshot(now=genai.now, nodes={}, pods=genai.pods, telemetry=telemetry)
    result = idle_gpu(snapshot, args, StrategyContext())

    flagged = {f.pod for f in result.findings if f.kind == "idle-gpu"}
    assert flagged == expected
    assert {pod.name for p in result.proposals for pod in p.pods} == expected
    # Every other container was either busy or not judged, and said so.
    stale = {f.pod for f in result.findings if f.kind == "stale-telemetry"}
    assert len(stale) == len(genai.pods) - judged


# --------------------------------------------------------------------------- rebalancer snapshot


def kubeconfig(path: Path, server: FakeApiServer) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
                "users": [{"name": "tester", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
                "current-context": "fake",
            }
        )
    )
    return path


@pytest.fixture
def fake_cluster() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for obj in cluster_objects():
            server.add(obj)
        yield server


def test_snapshot_command_replays_to_the_same_telemetry(
    dcgm_server: PrometheusServer,
    fake_cluster: FakeApiServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"strategies": [{"name": "idle-gpu", "args": {"window": "1h"}}]}))
    out = tmp_path / "snap"
    now = NOW - timedelta(minutes=3, milliseconds=250)
    # idle-0's workload: its ReplicaSet's Deployment, with the state a reclaim keeps on it.
    fake_cluster.add(controller_json("Deployment", "idle", annotations={IDLE_SINCE: "2026-11-29T07:00:00Z"}))
    fake_cluster.add(controller_json("ReplicaSet", "idle-0-rs", owner=("Deployment", "idle")))
    fake_cluster.add(controller_json("Deployment", "unrelated"))
    code = main(
        [
            "snapshot", "--out", str(out), "--window", "30m", "--policy", str(policy),
            "--prometheus-url", dcgm_server.url, "--now", now.isoformat(),
            "--kubeconfig", str(kubeconfig(tmp_path / "kubeconfig", fake_cluster)),
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert sorted(p.name for p in out.iterdir()) == [
        "nodes.json",
        "pdbs.json",
        "pods.json",
        "snapshot.yaml",
        "telemetry-windows.json",
        "telemetry.om",
        "workloads.json",
    ]
    assert (out / "telemetry.om").read_text().endswith("# EOF\n")
    workloads = json.loads((out / "workloads.json").read_text())
    assert (workloads["apiVersion"], workloads["kind"]) == ("v1", "List")
    assert sorted((o["kind"], o["metadata"]["name"]) for o in workloads["items"]) == [
        ("Deployment", "idle"),
        ("ReplicaSet", "idle-0-rs"),
    ]

    loaded = loaded_policy()
    replayed = load_snapshot_dir(out, loaded)
    assert replayed.now == now
    assert {p.name for p in replayed.pods} == {
        o["metadata"]["name"] for o in cluster_objects() if o["kind"] == "Pod"
    }
    telemetry, _ = live_source(dcgm_server).telemetry(now, {p.key: p for p in replayed.pods})
    # The snapshot holds the policy's 1h of history, so every window up to 1h replays exactly.
    assert_same_telemetry(telemetry, replayed.telemetry)
    # ... and the same workloads as the live source reads.
    with fake_cluster.api_client() as api_client:
        live = KubeSource(api_client, loaded).snapshot(now)
    assert replayed.controllers == live.controllers
    assert len(replayed.controllers) == 2
    idle = resolve(replayed)[("ml", "idle-0")]
    assert idle.controller is not None and idle.controller.annotations == {IDLE_SINCE: "2026-11-29T07:00:00Z"}

    # ... and with the policy it was taken with, the rows it carries are those of its raw history.
    from_rows = load_snapshot_dir(out, load_policy(policy))
    (out / "telemetry-windows.json").rename(tmp_path / "rows.json")
    from_raw = load_snapshot_dir(out, load_policy(policy))
    (tmp_path / "rows.json").rename(out / "telemetry-windows.json")
    assert "telemetry-aggregates-unused" not in {f.kind for f in from_rows.findings}
    assert (from_rows.telemetry, from_rows.findings) == (from_raw.telemetry, from_raw.findings)
    assert from_rows.telemetry.window(3600) is not None

    # ... and `rebalancer once --snapshot` replays it.
    assert main(["once", "--snapshot", str(out), "--policy", str(policy), "--output", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    idle_pods = {f["pod"] for f in report["findings"] if f["kind"] == "idle-gpu"}
    assert {"idle-0", "mig-idle", "share-0", "share-1", "infer-0"} <= idle_pods


def test_snapshot_warns_of_the_workloads_it_cannot_read(
    dcgm_server: PrometheusServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeApiServer(missing_kinds={"notebooks.kubeflow.org"}) as cluster:
        for obj in cluster_objects():
            cluster.add(obj)
        cluster.add(controller_json("StatefulSet", "infer-0-rs", namespace="serve", owner=("Notebook", "nb")))
        infer = cluster.get("Pod", "infer-0", "serve")
        assert infer is not None
        infer["metadata"]["ownerReferences"][0].update(kind="StatefulSet", name="infer-0-rs")
        cluster.add(infer)
        out = tmp_path / "snap"
        code = main(
            [
                "snapshot", "--out", str(out), "--prometheus-url", dcgm_server.url, "--now", NOW.isoformat(),
                "--kubeconfig", str(kubeconfig(tmp_path / "kubeconfig", cluster)),
            ]
        )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    (warning,) = [line for line in captured.err.splitlines() if "workloads stay unresolved" in line]
    assert warning.startswith(
        "rebalancer: warning: Notebook objects (notebooks.kubeflow.org/v1) not read: the API server does not "
        "serve notebooks.kubeflow.org/v1"
    )
    workloads = json.loads((out / "workloads.json").read_text())
    assert [(o["kind"], o["metadata"]["name"]) for o in workloads["items"]] == [("StatefulSet", "infer-0-rs")]


def test_the_kube_source_takes_the_prometheus_source_as_its_telemetry(
    dcgm_server: PrometheusServer, fake_cluster: FakeApiServer
) -> None:
    kube = KubeSource(fake_cluster.api_client(), loaded_policy(), telemetry=live_source(dcgm_server))
    snapshot = kube.snapshot(NOW)
    assert snapshot.telemetry.available
    assert [f.pod for f in snapshot.findings if f.kind == "stale-telemetry"] == ["gone-0"]
    result = idle_gpu(snapshot, IDLE, StrategyContext())
    proposed = sorted(pod.name for p in result.proposals for pod in p.pods)
    assert proposed == ["idle-0", "mig-idle", "share-0", "share-1"]


def test_snapshot_without_a_cluster_writes_telemetry_and_warns(
    dcgm_server: PrometheusServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    out = tmp_path / "snap"
    code = main(
        ["snapshot", "--out", str(out), "--prometheus-url", dcgm_server.url, "--now", NOW.isoformat()]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "cluster objects not captured" in captured.err
    assert sorted(p.name for p in out.iterdir()) == [
        "snapshot.yaml",
        "telemetry-windows.json",
        "telemetry.om",
    ]


def test_snapshot_with_prometheus_down_fails_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x"
    url = "http://127.0.0.1:9"
    code = main(
        ["snapshot", "--out", str(out), "--prometheus-url", url, "--telemetry-only", "--now", NOW.isoformat()]
    )
    assert code == 1
    assert "cannot connect" in capsys.readouterr().err
    assert not out.exists()


def test_snapshot_without_dcgm_series_writes_no_aggregates_and_warns(
    dcgm_server: PrometheusServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    names = {role: {"name": f"NO_SUCH_{role.upper()}"} for role in ("utilization", "fb_used", "fb_free")}
    policy.write_text(yaml.safe_dump({"telemetry": names}))
    out = tmp_path / "snap"
    code = main(
        [
            "snapshot", "--out", str(out), "--policy", str(policy), "--prometheus-url", dcgm_server.url,
            "--telemetry-only", "--now", NOW.isoformat(),
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "rebalancer: warning: telemetry aggregates not written: " in captured.err
    assert "no DCGM series" in captured.err
    assert sorted(p.name for p in out.iterdir()) == ["snapshot.yaml", "telemetry.om"]
