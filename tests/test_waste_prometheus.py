"""`rebalancer waste` against a real Prometheus, backfilled with three days of GenAI duty-cycle history.

The history: GPU series of pods in three namespaces (whole GPUs of three models, two MIG instances of one
A100, a pod that is no longer in the cluster, a series scraped twice), each day of each series one
container of the Alibaba GenAI trace, plus a GPU no pod holds. The expected GPU-hours are computed here
straight from the samples written, with the rules the command documents (5-minute steps `(t - 5m, t]`
aligned to the epoch, a step with a sample counts in full, idle when its mean is below the threshold),
never by calling the code under test. Also: one query however many pods there are, and a snapshot
directory holding the same history gives the same table without Prometheus.
"""

from __future__ import annotations

import json
import math
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rebalancer.cli import EXIT_OK, main
from tests.builders import write_snapshot_dir
from tests.fake_apiserver import FakeApiServer
from tests.genai_trace import read_genai_trace
from tests.test_prometheus_live import kubeconfig

if TYPE_CHECKING:
    from tests.prometheus_server import PrometheusServer

pytest_plugins = ["tests.prometheus_server"]
pytestmark = pytest.mark.prometheus

# Far from the instants the other tests on the shared server read (2026-11-29, 2026-10-30, 2022).
UNTIL = datetime(2026, 10, 10, tzinfo=UTC)
CROWD_UNTIL = datetime(2026, 9, 20, tzinfo=UTC)
DAY = 86400
STEP = 300
THRESHOLD = 5.0  # the shipped policy's idle-gpu max_utilization_percent
A100, L4, T4 = "NVIDIA A100-SXM4-80GB", "NVIDIA L4", "Tesla T4"
PRICES = {A100: 5.10, L4: 1.15}  # the shipped policy's example prices; no price for the T4
GONE = "(pods no longer in the cluster)"


@dataclass(frozen=True, eq=False)
class Gpu:
    """One GPU series of the history, and what the cluster knows of the pod holding it."""

    node: str
    index: int
    model: str
    days: tuple[int, ...]
    namespace: str | None = None
    pod: str | None = None
    owner: tuple[str, str] | None = None  # the pod's controller (kind, name)
    labels: Mapping[str, str] = field(default_factory=dict)
    mig: tuple[str, str] | None = None  # (GPU_I_PROFILE, GPU_I_ID)
    in_cluster: bool = True
    scraped_twice: bool = False
    # Scraped through a ServiceMonitor without honorLabels: the exporter's own pod in pod / namespace.
    exporter: str | None = None

    @property
    def share(self) -> float:
        return int(self.mig[0].split("g.")[0]) / 7 if self.mig is not None else 1.0

    @property
    def workload(self) -> str:
        assert self.namespace is not None and self.owner is not None
        if not self.in_cluster:
            return f"{self.namespace}/{GONE}"
        return f"{self.namespace}/{self.owner[0]}/{self.owner[1]}"


SEARCH, SCIENCE = {"team": "search"}, {"team": "science"}
HISTORY = (
    # Scraped by two jobs (a second `instance`): its GPU-hours must count once.
    Gpu(
        "a100-1",
        0,
        A100,
        (0, 1, 2),
        "serving",
        "llm-serve-0",
        ("ReplicaSet", "llm-serve-6f7c9"),
        SEARCH,
        scraped_twice=True,
    ),
    Gpu("a100-1", 1, A100, (0, 1, 2), "serving", "llm-serve-1", ("ReplicaSet", "llm-serve-6f7c9"), SEARCH),
    Gpu(
        "a100-2",
        0,
        A100,
        (0, 1, 2),
        "research",
        "notebook-alice-0",
        ("StatefulSet", "notebook-alice"),
        SCIENCE,
    ),
    Gpu("l4-1", 0, L4, (1, 2), "research", "sweep-17-k2x9q", ("Job", "sweep-17"), SCIENCE),
    Gpu("l4-1", 0, L4, (0,), "research", "sweep-16-p8d4w", ("Job", "sweep-16"), SCIENCE, in_cluster=False),
    Gpu("a100-3", 0, A100, (0, 1, 2), "batch", "embed-0", ("ReplicaSet", "embed-5d8b"), mig=("3g.40gb", "1")),
    Gpu("a100-3", 0, A100, (0, 1, 2), "batch", "embed-1", ("ReplicaSet", "embed-5d8b"), mig=("1g.10gb", "2")),
    Gpu("t4-1", 0, T4, (0, 2), "batch", "transcode-0", ("Job", "transcode")),
    # Held by no pod: unallocated, charged to no team.
    Gpu("a100-2", 1, A100, (0, 1, 2)),
    # A node whose exporter is scraped without honorLabels: the pod's GPU, and one no pod holds, which
    # carries the exporter's own pod label only.
    Gpu(
        "a100-4",
        0,
        A100,
        (0, 1, 2),
        "serving",
        "llm-serve-2",
        ("ReplicaSet", "llm-serve-6f7c9"),
        SEARCH,
        exporter="nvidia-dcgm-exporter-x7k2p",
    ),
    Gpu("a100-4", 1, A100, (1, 2), exporter="nvidia-dcgm-exporter-x7k2p"),
)


def gpu_uuid(gpu: Gpu) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{gpu.node}/{gpu.index}')}"


def series_labels(gpu: Gpu, instance: int = 1) -> dict[str, str]:
    labels = {
        "gpu": str(gpu.index),
        "UUID": gpu_uuid(gpu),
        "device": f"nvidia{gpu.index}",
        "modelName": gpu.model,
        "hostname": gpu.node,
        "instance": f"10.0.0.{instance}:9400",
        "job": "dcgm-exporter",
    }
    if gpu.mig is not None:
        labels |= {"GPU_I_PROFILE": gpu.mig[0], "GPU_I_ID": gpu.mig[1]}
    holder: dict[str, str] = {}
    if gpu.pod is not None and gpu.namespace is not None:
        holder = {"container": "main", "namespace": gpu.namespace, "pod": gpu.pod}
    if gpu.exporter is None:
        return labels | holder
    exporter = {"container": "nvidia-dcgm-exporter", "namespace": "gpu-operator", "pod": gpu.exporter}
    return labels | exporter | {f"exported_{k}": v for k, v in holder.items()}


Samples = list[tuple[float, float]]


@dataclass(frozen=True)
class History:
    until: datetime
    samples: Mapping[Gpu, Samples]  # what was written, per series (each once)
    openmetrics: str


def build_history(gpus: tuple[Gpu, ...], trace: Mapping[str, Samples], until: datetime, days: int) -> History:
    """Each day of each GPU: the next container of the trace, shifted to start on that day's midnight."""
    containers = iter(sorted(trace))
    samples: dict[Gpu, Samples] = {}
    for gpu in gpus:
        rows: Samples = []
        for day in gpu.days:
            container = trace[next(containers)]
            base = until.timestamp() - (days - day) * DAY
            rows += [(base + stamp - container[0][0], value) for stamp, value in container]
        samples[gpu] = rows
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for gpu, rows in samples.items():
        for instance in (1, 2) if gpu.scraped_twice else (1,):
            text = ",".join(f'{k}="{v}"' for k, v in sorted(series_labels(gpu, instance).items()))
            lines += [f"DCGM_FI_DEV_GPU_UTIL{{{text}}} {value!r} {stamp:.3f}" for stamp, value in rows]
    return History(until=until, samples=samples, openmetrics="\n".join([*lines, "# EOF"]) + "\n")


# --------------------------------------------------------------------------- the expected table


@dataclass
class Hours:
    idle: float = 0.0
    allocated: float = 0.0
    cost: float | None = 0.0

    def add(self, idle: float, allocated: float, price: float | None, *, charge: float) -> None:
        self.idle += idle
        self.allocated += allocated
        if self.cost is not None and charge > 0:
            self.cost = None if price is None else self.cost + charge * price


def steps_of(rows: Samples, until: datetime, seconds: int) -> tuple[int, int]:
    """(covered, idle) 5-minute steps of one series, straight from its samples."""
    end_ms = round(until.timestamp() * 1000)
    start_ms = end_ms - seconds * 1000
    step_ms = STEP * 1000
    per_step: dict[int, list[float]] = defaultdict(list)
    for stamp, value in rows:
        ms = round(stamp * 1000)
        if start_ms < ms <= end_ms:
            per_step[math.ceil(ms / step_ms)].append(value)
    idle = 0
    for values in per_step.values():
        below = math.fsum(values) / len(values) < THRESHOLD
        # No knife-edge step that a server summing in another order would judge otherwise.
        assert below == (sum(values) / len(values) < THRESHOLD)
        idle += below
    return len(per_step), idle


@dataclass
class Expected:
    groups: dict[str, Hours]
    unattributed: Hours
    unattributed_series: int
    pods: dict[str, set[str]]


def expected(history: History, group_of: Any, seconds: int = 3 * DAY) -> Expected:
    groups: dict[str, Hours] = defaultdict(Hours)
    pods: dict[str, set[str]] = defaultdict(set)
    loose = Hours()
    loose_series = 0
    for gpu, rows in history.samples.items():
        covered, idle = steps_of(rows, history.until, seconds)
        hours = STEP / 3600 * gpu.share
        price = PRICES.get(gpu.model)
        if gpu.pod is None:
            loose.add(idle * hours, covered * hours, price, charge=covered * hours)
            loose_series += 1
            continue
        group = group_of(gpu)
        groups[group].add(idle * hours, covered * hours, price, charge=idle * hours)
        pods[group].add(gpu.pod)
    return Expected(
        groups=dict(groups), unattributed=loose, unattributed_series=loose_series, pods=dict(pods)
    )


def assert_table(report: Mapping[str, Any], want: Expected) -> None:
    got = {row["group"]: row for row in report["groups"]}
    assert sorted(got) == sorted(want.groups)
    for name, hours in want.groups.items():
        row = got[name]
        assert row["idle_gpu_hours"] == pytest.approx(hours.idle, abs=1e-4), name
        assert row["allocated_gpu_hours"] == pytest.approx(hours.allocated, abs=1e-4), name
        assert row["idle_share"] == pytest.approx(hours.idle / hours.allocated, abs=1e-4), name
        if hours.cost is None:
            assert row["cost"] is None, name
        else:
            assert row["cost"] == pytest.approx(hours.cost, abs=0.01), name
        assert row["pods"] == len(want.pods[name]), name
    totals = report["totals"]
    assert totals["idle_gpu_hours"] == pytest.approx(sum(h.idle for h in want.groups.values()), abs=1e-3)
    assert totals["allocated_gpu_hours"] == pytest.approx(
        sum(h.allocated for h in want.groups.values()), abs=1e-3
    )
    loose = report["unattributed"]
    assert loose["series"] == want.unattributed_series
    assert loose["gpu_hours"] == pytest.approx(want.unattributed.allocated, abs=1e-4)
    assert loose["idle_gpu_hours"] == pytest.approx(want.unattributed.idle, abs=1e-4)
    assert loose["cost"] == pytest.approx(want.unattributed.cost, abs=0.01)


# --------------------------------------------------------------------------- the cluster


def pod_json(gpu: Gpu) -> dict[str, Any]:
    assert gpu.pod is not None and gpu.owner is not None
    resource = f"nvidia.com/mig-{gpu.mig[0]}" if gpu.mig is not None else "nvidia.com/gpu"
    started = (UNTIL - timedelta(days=4)).isoformat().replace("+00:00", "Z")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": gpu.pod,
            "namespace": gpu.namespace,
            "uid": f"uid-{gpu.pod}",
            "creationTimestamp": started,
            "labels": dict(gpu.labels),
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
            "containers": [{"name": "main", "resources": {"limits": {resource: "1"}}}],
        },
        "status": {"phase": "Running", "startTime": started},
    }


def node_json(name: str, model: str, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    allocatable = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "2", **(extra or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "-".join(model.split())}},
        "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def cluster_objects() -> list[dict[str, Any]]:
    """The cluster as it is at UNTIL: the gone pod is not in it, nor are the exporter pods of the history
    (replaced since, as pods come and go: their series must not be charged to anyone either way)."""
    nodes = [
        node_json("a100-1", A100),
        node_json("a100-2", A100),
        node_json("a100-3", A100, {"nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-1g.10gb": "1"}),
        node_json("a100-4", A100),
        node_json("l4-1", L4),
        node_json("t4-1", T4),
    ]
    return nodes + [pod_json(gpu) for gpu in HISTORY if gpu.pod is not None and gpu.in_cluster]


def write_snapshot(directory: Path, history: History | None) -> Path:
    """A snapshot directory of the cluster, with the history's samples if given."""
    return write_snapshot_dir(directory, cluster_objects(), UNTIL, history.openmetrics if history else None)


# --------------------------------------------------------------------------- fixtures


@dataclass(frozen=True)
class Backfilled:
    server: PrometheusServer
    history: History
    crowd: History


@pytest.fixture(scope="module")
def backfilled(
    prometheus_server: PrometheusServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backfilled]:
    trace = read_genai_trace(tmp_path_factory.mktemp("genai"))
    history = build_history(HISTORY, trace, UNTIL, 3)
    crowd_gpus = tuple(
        Gpu(f"crowd-{i // 8}", i % 8, A100, (0,), "crowd", f"crowd-{i:03d}", ("Job", f"crowd-{i:03d}"))
        for i in range(120)
    )
    crowd = build_history(crowd_gpus, trace, CROWD_UNTIL, 1)
    prometheus_server.backfill(history.openmetrics)
    prometheus_server.backfill(crowd.openmetrics)
    yield Backfilled(prometheus_server, history, crowd)


def waste(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = main(["waste", *argv, "--output", "json"])
    captured = capsys.readouterr()
    assert code == EXIT_OK, captured.err
    report: dict[str, Any] = json.loads(captured.out)
    return report


def live(backfilled: Backfilled, until: datetime = UNTIL, since: str = "3d") -> tuple[str, ...]:
    return ("--prometheus-url", backfilled.server.url, "--since", since, "--until", until.isoformat())


# --------------------------------------------------------------------------- tests


def test_namespace_totals_match_the_samples_written(
    backfilled: Backfilled, capsys: pytest.CaptureFixture[str]
) -> None:
    before = backfilled.server.query_requests()
    report = waste(capsys, *live(backfilled))
    assert backfilled.server.query_requests() - before == 1

    assert report["period"] == {
        "start": "2026-10-07T00:00:00Z",
        "end": "2026-10-10T00:00:00Z",
        "seconds": 3 * DAY,
    }
    assert (report["step_seconds"], report["threshold_percent"], report["by"]) == (
        STEP,
        THRESHOLD,
        "namespace",
    )
    want = expected(backfilled.history, lambda gpu: gpu.namespace)
    # The data says something: every namespace has idle and busy steps, and the T4 idled (no price).
    assert all(0 < h.idle < h.allocated for h in want.groups.values())
    assert want.groups["batch"].cost is None
    assert_table(report, want)
    assert any("Tesla T4" in note for note in report["notes"])


def test_by_workload_with_a_snapshot_keeps_pods_that_are_gone(
    backfilled: Backfilled, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write_snapshot(tmp_path / "cluster", None)
    report = waste(capsys, *live(backfilled), "--by", "workload", "--snapshot", str(cluster))
    want = expected(backfilled.history, lambda gpu: gpu.workload)
    assert f"research/{GONE}" in want.groups
    assert_table(report, want)
    rows = {row["group"]: row for row in report["groups"]}
    assert [w["workload"] for w in rows[f"research/{GONE}"]["top_workloads"]] == ["research/sweep-16-p8d4w"]
    assert rows["serving/ReplicaSet/llm-serve-6f7c9"]["namespace"] == "serving"


def test_by_workload_from_the_live_cluster_is_the_snapshots_table(
    backfilled: Backfilled, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write_snapshot(tmp_path / "cluster", None)
    from_snapshot = waste(capsys, *live(backfilled), "--by", "workload", "--snapshot", str(cluster))
    with FakeApiServer() as api:
        for obj in cluster_objects():
            api.add(obj)
        config = kubeconfig(tmp_path / "kubeconfig", api)
        from_cluster = waste(capsys, *live(backfilled), "--by", "workload", "--kubeconfig", str(config))
        assert api.requests_to("/api/v1/pods", "GET")  # it did read the cluster
        assert api.writes() == []  # and wrote nothing
    assert from_cluster == from_snapshot


def test_by_label_groups_pods_by_their_team(
    backfilled: Backfilled, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write_snapshot(tmp_path / "cluster", None)
    report = waste(capsys, *live(backfilled), "--by", "label:team", "--snapshot", str(cluster))

    def team(gpu: Gpu) -> str:
        if not gpu.in_cluster:
            return f"{gpu.namespace}/{GONE}"
        return gpu.labels.get("team", "(no team label)")

    want = expected(backfilled.history, team)
    assert set(want.groups) == {"search", "science", "(no team label)", f"research/{GONE}"}
    assert_table(report, want)


def test_the_query_count_does_not_grow_with_the_pods(
    backfilled: Backfilled, capsys: pytest.CaptureFixture[str]
) -> None:
    before = backfilled.server.query_requests()
    report = waste(capsys, *live(backfilled, CROWD_UNTIL, "1d"))
    assert backfilled.server.query_requests() - before == 1
    (crowd,) = report["groups"]
    assert crowd["pods"] == 120
    assert_table(report, expected(backfilled.crowd, lambda gpu: gpu.namespace, DAY))


def test_a_snapshot_directory_gives_the_same_table_without_prometheus(
    backfilled: Backfilled, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    directory = write_snapshot(tmp_path / "snapshot", backfilled.history)
    for by in ("namespace", "workload"):
        from_prometheus = waste(capsys, *live(backfilled), "--by", by, "--snapshot", str(directory))
        # No Prometheus: the history is the directory's, ending at its `now`.
        from_files = waste(capsys, "--since", "3d", "--by", by, "--snapshot", str(directory))
        assert from_files["history"] == f"snapshot {directory}"
        assert from_prometheus["history"] == f"Prometheus at {backfilled.server.url}"
        assert {k: v for k, v in from_files.items() if k != "history"} == {
            k: v for k, v in from_prometheus.items() if k != "history"
        }


# --------------------------------------------------------------------------- impossible samples

IMPOSSIBLE_UNTIL = datetime(2026, 9, 1, tzinfo=UTC)


def impossible_history() -> str:
    """An hour of one sample a minute on one GPU per namespace: `-50` throughout (`negative`), `-Inf`
    throughout (`minus-inf`), steps whose samples average 0 only because one is -100 and one 100
    (`mixed`), and a plausible idle GPU (`idle`)."""
    end = IMPOSSIBLE_UNTIL.timestamp()
    per_namespace: dict[str, list[str]] = {
        "negative": ["-50.0"] * 60,
        "minus-inf": ["-Inf"] * 60,
        "mixed": ["-100.0", "100.0", "0.0", "0.0", "0.0"] * 12,
        "idle": ["1.0"] * 60,
    }
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for index, (namespace, values) in enumerate(per_namespace.items()):
        labels = (
            f'UUID="GPU-impossible-{index}",gpu="0",hostname="odd-{index}",modelName="{A100}",'
            f'namespace="{namespace}",pod="p-{namespace}"'
        )
        # Minute i ends at end - 3600 + 60 (i + 1): five samples in each 5-minute step of the hour.
        lines += [
            f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {value} {end - 3600 + 60 * (i + 1):.3f}"
            for i, value in enumerate(values)
        ]
    return "\n".join([*lines, "# EOF"]) + "\n"


def test_impossible_samples_are_never_idle_from_prometheus_or_a_snapshot(
    prometheus_server: PrometheusServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A negative or -Inf utilisation is bad telemetry, never idle, as `once` and `advise` judge it: the
    step is covered (the GPU was there) and not idle, in both histories."""
    history = impossible_history()
    prometheus_server.backfill(history)
    directory = write_snapshot_dir(tmp_path / "snapshot", [], IMPOSSIBLE_UNTIL, history)
    since = ("--since", "1h", "--until", IMPOSSIBLE_UNTIL.isoformat())
    from_prometheus = waste(capsys, "--prometheus-url", prometheus_server.url, *since)
    from_files = waste(capsys, "--since", "1h", "--snapshot", str(directory))
    for report in (from_prometheus, from_files):
        rows = {row["group"].split("/")[0]: row for row in report["groups"]}
        assert {name: (row["allocated_gpu_hours"], row["idle_gpu_hours"]) for name, row in rows.items()} == {
            "negative": (1.0, 0.0),
            "minus-inf": (1.0, 0.0),
            "mixed": (1.0, 0.0),
            "idle": (1.0, 1.0),
        }
