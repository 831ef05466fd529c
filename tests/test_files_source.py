"""The snapshot-directory source: objects, metrics, `now`, and every way a directory can be unusable."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rebalancer.history import Workload
from rebalancer.model import Finding, GpuRequest
from rebalancer.policy import ConfiguredStrategy, LoadedPolicy, Policy, parse_policy
from rebalancer.registry import StrategyArgs
from rebalancer.sources import snapshot_objects
from rebalancer.sources.files import NO_POD_OBJECTS, SnapshotError, load_snapshot_dir
from rebalancer.workloads import resolve
from tests.builders import NOW

SAMPLES = Path(__file__).parent / "fixtures" / "snapshots" / "dcgm-samples"
UUID = "GPU-11111111-2222-3333-4444-555555555555"
T0 = int(NOW.timestamp())


class WindowArgs(StrategyArgs):
    window: int = 600

    def telemetry_windows(self) -> frozenset[int]:
        return frozenset({self.window, 60})


def loaded(policy: dict[str, Any] | None = None) -> LoadedPolicy:
    base = parse_policy(policy or {}, "<test>")
    return LoadedPolicy(
        policy=base.policy,
        strategies=(ConfiguredStrategy(name="windows", args=WindowArgs()),),
        source="<test>",
    )


def node(name: str, gpus: int = 8) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
        "status": {
            "allocatable": {"cpu": "96", "memory": "512Gi", "nvidia.com/gpu": str(gpus), "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(name: str, node_name: str | None, gpus: int = 1, namespace: str = "ml") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": spec,
        "status": {"phase": "Running"},
    }


PDB_YAML = """\
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: train
  namespace: ml
spec:
  minAvailable: 1
  selector:
    matchLabels: {app: train-0}
status:
  disruptionsAllowed: 0
"""


def write(directory: Path, name: str, content: str | dict[str, Any]) -> Path:
    path = directory / name
    path.write_text(json.dumps(content, indent=2) if isinstance(content, dict) else content, encoding="utf-8")
    return path


def kube_list(*items: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": list(items)}


def problems_of(directory: Path, policy: LoadedPolicy | None = None) -> tuple[str, ...]:
    with pytest.raises(SnapshotError) as info:
        load_snapshot_dir(directory, policy or loaded())
    return info.value.problems


def kinds(findings: tuple[Finding, ...]) -> list[str]:
    return [f.kind for f in findings]


# --------------------------------------------------------------------------- a good snapshot


def test_kubectl_list_yaml_and_openmetrics(tmp_path: Path) -> None:
    write(
        tmp_path, "cluster.json", kube_list(node("gpu-a-1"), pod("train-0", "gpu-a-1"), pod("pending", None))
    )
    write(tmp_path, "pdb.yaml", PDB_YAML)
    write(
        tmp_path,
        "dcgm.om",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        + "".join(
            f'DCGM_FI_DEV_GPU_UTIL{{Hostname="gpu-a-1",UUID="{UUID}",exported_pod="train-0",'
            f'exported_namespace="ml",pod="dcgm-exporter-1",namespace="gpu-operator"}} {value} {T0 - age}\n'
            for age, value in ((600, 10), (300, 20), (0, 60))
        )
        + "# EOF\n",
    )
    snap = load_snapshot_dir(tmp_path, loaded())
    assert snap.now == NOW  # newest sample: no snapshot.yaml
    assert list(snap.nodes) == ["gpu-a-1"]
    assert {p.name for p in snap.pods} == {"train-0", "pending"}
    assert snap.pods_by_key[("ml", "train-0")].gpu == GpuRequest(1, 1000)
    (pdb,) = snap.pdbs
    assert (pdb.key, pdb.disruptions_allowed) == (("ml", "train"), 0)
    assert snap.findings == ()
    window = snap.telemetry.window(600)
    assert window is not None
    (row,) = window.gpus
    assert row.pod_key == ("ml", "train-0")
    assert (row.util_avg_percent, row.util_samples) == (30.0, 3)
    short = snap.telemetry.window(60)
    assert short is not None
    assert short.gpus[0].util_avg_percent == 60.0


def test_snapshot_yaml_now_and_typed_lists(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T13:00:00+01:00\n")
    nodes = {
        "apiVersion": "v1",
        "kind": "NodeList",
        "items": [{k: v for k, v in node("n1").items() if k != "kind"}],
    }
    write(tmp_path, "nodes.json", nodes)
    write(
        tmp_path,
        "pods.yml",
        "---\n" + json.dumps(pod("a", "n1")) + "\n---\n" + json.dumps(pod("b", "n1")) + "\n",
    )
    snap = load_snapshot_dir(tmp_path, loaded())
    assert snap.now == NOW
    assert snap.now.tzinfo == UTC
    assert set(snap.nodes) == {"n1"}
    assert len(snap.pods) == 2
    assert snap.telemetry.problem is not None
    assert snap.telemetry.problem.startswith("no DCGM series in snapshot")


def test_real_samples_in_a_snapshot(tmp_path: Path) -> None:
    shutil.copy(SAMPLES / "mig-a100.prom", tmp_path / "mig.prom")
    shutil.copy(SAMPLES / "tesla-t4.prom", tmp_path / "t4.prom")
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    write(tmp_path, "nodes.json", kube_list(node("ub20-a100-k8s")))
    snap = load_snapshot_dir(tmp_path, loaded())
    window = snap.telemetry.window(600)
    assert window is not None
    assert sorted(g.node for g in window.gpus) == ["424773df46e0", "ub20-a100-k8s"]
    # The T4 sample's Hostname is a container host name, not a node of this cluster.
    (unknown,) = [f for f in snap.findings if f.kind == "telemetry-unknown-node"]
    assert unknown.node == "424773df46e0"


def test_telemetry_disabled_by_policy(tmp_path: Path) -> None:
    write(tmp_path, "nodes.json", kube_list(node("n1")))
    write(tmp_path, "m.prom", f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n1",UUID="{UUID}"}} 5 {T0 * 1000}\n')
    snap = load_snapshot_dir(tmp_path, loaded({"telemetry": None}))
    assert snap.now == NOW  # timestamps still give `now`
    assert not snap.telemetry.available
    assert snap.telemetry.problem == "telemetry disabled by policy"


def test_no_metric_files(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    snap = load_snapshot_dir(tmp_path, loaded())
    assert not snap.telemetry.available
    assert snap.telemetry.problem == (
        "no DCGM series in snapshot (looked for DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, "
        "DCGM_FI_DEV_FB_FREE: no .prom / .om files)"
    )


def test_unknown_kinds_are_ignored_with_a_finding(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "y"}}
    write(tmp_path, "all.json", kube_list(node("n1"), pod("p", "n1"), cm, cm, svc))
    write(tmp_path, "notes.yaml", "strategies: []\ndry_run: true\n")  # e.g. a policy kept alongside
    snap = load_snapshot_dir(tmp_path, loaded())
    assert kinds(snap.findings) == ["ignored-objects", "ignored-objects"]
    assert snap.findings[0].detail == (
        "ignored 3 objects of kinds the rebalancer does not use: ConfigMap (2), Service (1)"
    )
    assert "notes.yaml" in snap.findings[1].detail


def test_policy_file_in_use_and_hidden_files_are_skipped_silently(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    (tmp_path / "._nodes.json").write_bytes(b"\x00\x05\x16\x07\xff")  # macOS metadata, not UTF-8
    policy_path = write(tmp_path, "policy.yaml", "dry_run: true\n")
    base = loaded()
    snap = load_snapshot_dir(
        tmp_path, LoadedPolicy(policy=Policy(), strategies=base.strategies, source=str(policy_path))
    )
    assert snap.findings == ()


def test_nodes_without_any_pod_object_are_a_partial_view_whose_pod_labels_are_trusted(tmp_path: Path) -> None:
    write(tmp_path, "nodes.json", kube_list(node("n1")))
    write(
        tmp_path,
        "m.om",
        f'DCGM_FI_DEV_FB_USED{{Hostname="n1",UUID="{UUID}",namespace="ml",pod="train-0"}} 9000 {T0}\n# EOF\n',
    )
    snap = load_snapshot_dir(tmp_path, loaded())
    [finding] = snap.findings
    assert (finding.kind, finding.detail) == ("partial-cluster-view", NO_POD_OBJECTS)
    window = snap.telemetry.window(600)
    assert window is not None
    assert [row.pod_key for row in window.gpus] == [("ml", "train-0")]
    # Once the snapshot lists pods, a series naming a pod it does not have is attributed to none.
    write(tmp_path, "pods.json", kube_list(pod("other", "n1")))
    window = load_snapshot_dir(tmp_path, loaded()).telemetry.window(600)
    assert window is not None
    assert [row.pod_key for row in window.gpus] == [None]


def test_pod_on_unknown_node_is_dropped_with_a_finding(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    write(tmp_path, "c.json", kube_list(node("n1"), pod("ok", "n1"), pod("lost", "gone-node")))
    snap = load_snapshot_dir(tmp_path, loaded())
    assert [p.name for p in snap.pods] == ["ok"]
    (finding,) = snap.findings
    assert (finding.kind, finding.node, finding.namespace, finding.pod) == (
        "unknown-node",
        "gone-node",
        "ml",
        "lost",
    )


def test_bad_samples_become_findings(tmp_path: Path) -> None:
    write(tmp_path, "c.json", kube_list(node("n1"), pod("p", "n1")))
    lines = [
        f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n1",UUID="{UUID}"}} {v} {T0 - age}'
        for age, v in ((20, "NaN"), (10, "-3"), (0, "40"))
    ]
    lines.append(f'DCGM_FI_DEV_FB_USED{{UUID="{UUID}"}} 100 {T0}')  # no node label
    write(tmp_path, "m.om", "\n".join(lines) + "\n# EOF\n")
    snap = load_snapshot_dir(tmp_path, loaded())
    assert kinds(snap.findings) == ["bad-telemetry", "unusable-telemetry"]
    assert "dropped 2 of 3 samples" in snap.findings[0].detail
    assert str(tmp_path / "m.om") in snap.findings[0].detail
    window = snap.telemetry.window(600)
    assert window is not None
    assert window.gpus[0].util_avg_percent == 40.0


# --------------------------------------------------------------------------- unusable snapshots


def test_missing_directory(tmp_path: Path) -> None:
    assert problems_of(tmp_path / "nope") == (f"{tmp_path / 'nope'}: snapshot directory does not exist",)
    file = write(tmp_path, "f.json", "{}")
    assert "not a directory" in problems_of(file)[0]


def test_invalid_json_names_file_and_line(tmp_path: Path) -> None:
    write(tmp_path, "nodes.json", '{\n  "kind": "List",\n  "items": [,]\n}\n')
    (problem,) = problems_of(tmp_path)
    assert problem == f"{tmp_path / 'nodes.json'}:3:13: invalid JSON: Expecting value"


@pytest.fixture
def stream_every_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stream every JSON List item by item, as files of hundreds of MB are."""
    monkeypatch.setattr(snapshot_objects, "STREAM_JSON_BYTES", 0)


def test_large_json_lists_are_streamed_to_the_same_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    typed = {
        "apiVersion": "v1",
        "kind": "PodList",
        "items": [{k: v for k, v in pod("b", "n1").items() if k != "kind"}],
    }
    write(tmp_path, "pods.json", typed)
    write(tmp_path, "cluster.json", kube_list(node("n1"), pod("a", "n1", gpus=2), pod("c", None)))
    write(tmp_path, "one.json", pod("d", "n1"))  # not a List: read whole
    whole = load_snapshot_dir(tmp_path, loaded())
    monkeypatch.setattr(snapshot_objects, "STREAM_JSON_BYTES", 0)
    streamed = load_snapshot_dir(tmp_path, loaded())
    assert streamed == whole
    assert {p.name for p in streamed.pods} == {"a", "b", "c", "d"}


def test_streamed_json_problems_name_item_file_and_line(tmp_path: Path, stream_every_json: None) -> None:
    bad = pod("train-0", "n1")
    bad["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "abc"}}
    write(tmp_path, "c.json", kube_list(node("n1"), bad, {"kind": "List", "items": []}))
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    assert problems_of(tmp_path) == (
        f"{tmp_path / 'c.json'} items[1]: Pod ml/train-0: spec.containers[0].resources.requests.cpu: "
        'invalid quantity "abc"',
        f"{tmp_path / 'c.json'} items[2]: nested lists are not supported",
    )
    (tmp_path / "c.json").unlink()
    # Broken after the kind, inside the items: the line and column still come back.
    write(tmp_path, "nodes.json", '{\n  "kind": "List",\n  "items": [{"kind": "Node"}, ]\n}\n')
    (problem,) = problems_of(tmp_path)
    assert problem == f"{tmp_path / 'nodes.json'}:3:31: invalid JSON: trailing comma in array"
    # What only a strict decoder refuses (NaN) is still a problem, named by that decoder, with its place.
    write(tmp_path, "nodes.json", '{"kind": "List", "items": [{"kind": "Node", "x": NaN}]}')
    assert problems_of(tmp_path) == (f"{tmp_path / 'nodes.json'}:1:50: invalid JSON: invalid character",)


def test_an_item_msgspec_cannot_read_is_named_in_a_streamed_list(
    tmp_path: Path, stream_every_json: None
) -> None:
    """Bytes that are not UTF-8 in a field the model reads, a number past what Python converts: each is
    a problem naming the item, and the file's other items are still read (no traceback, the mapping
    closed)."""
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    text = json.dumps(kube_list(node("n1"), pod("a", "n1"), pod("b", "n1"), node("n2")))
    text = text.replace('"app": "a"', '"app": "\udcff"').replace('"110"}', "1" + "0" * 4400 + "}", 1)
    (tmp_path / "c.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    problems = problems_of(tmp_path)
    assert [p.split(": invalid JSON: ")[0] for p in problems] == [
        f"{tmp_path / 'c.json'} items[0]",
        f"{tmp_path / 'c.json'} items[1]",
    ]
    assert "Integer value out of range" in problems[0] and "UTF-8" in problems[1]


def test_a_small_file_msgspec_refuses_is_read_by_the_standard_library(tmp_path: Path) -> None:
    """Below the streaming size, JSON that only the standard library takes (NaN in a field the model does
    not read) is read as before, and what neither takes is named as the standard library names it."""
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    lenient = kube_list(node("n1"), pod("a", "n1"))
    lenient["items"][1]["spec"]["terminationGracePeriodSeconds"] = float("nan")
    write(tmp_path, "c.json", json.dumps(lenient))
    assert {p.name for p in load_snapshot_dir(tmp_path, loaded()).pods} == {"a"}
    (tmp_path / "c.json").write_bytes(json.dumps(kube_list(node("n1"))).encode().replace(b"n1", b"n\xff"))
    (problem,) = problems_of(tmp_path)
    assert problem.startswith(f"{tmp_path / 'c.json'}: not UTF-8 text")


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    write(tmp_path, "pods.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: [unclosed\n  namespace: ml\n")
    (problem,) = problems_of(tmp_path)
    assert problem.startswith(f"{tmp_path / 'pods.yaml'}:5: invalid YAML:")


def test_unparseable_quantity(tmp_path: Path) -> None:
    bad = pod("train-0", "n1")
    bad["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "abc"}}
    write(tmp_path, "c.json", kube_list(node("n1"), bad))
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    (problem,) = problems_of(tmp_path)
    assert problem == (
        f"{tmp_path / 'c.json'} items[1]: Pod ml/train-0: spec.containers[0].resources.requests.cpu: "
        'invalid quantity "abc"'
    )


def test_duplicates_and_every_problem_reported(tmp_path: Path) -> None:
    write(tmp_path, "a.json", kube_list(node("n1"), pod("p", "n1")))
    write(tmp_path, "b.yaml", json.dumps(pod("p", "n1")))
    write(tmp_path, "c.yaml", "- just\n- a list\n")
    write(tmp_path, "d.json", {"apiVersion": "v1", "metadata": {"name": "x"}})
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    problems = problems_of(tmp_path)
    assert problems == (
        f"{tmp_path / 'b.yaml'}: duplicate Pod ml/p (first in {tmp_path / 'a.json'} items[1])",
        f"{tmp_path / 'c.yaml'}: expected a Kubernetes object or List, got list",
        f"{tmp_path / 'd.json'}: Kubernetes object without a kind",
    )


def test_invalid_exposition(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    write(tmp_path, "a.prom", 'DCGM_FI_DEV_GPU_UTIL{Hostname="n1" 5\n')
    write(tmp_path, "b.om", "DCGM_FI_DEV_GPU_UTIL 5 100\n")  # OpenMetrics without # EOF: truncated
    problems = problems_of(tmp_path)
    assert problems[0].startswith(f"{tmp_path / 'a.prom'}:1: invalid Prometheus text format:")
    assert problems[1] == f"{tmp_path / 'b.om'}: invalid OpenMetrics: Missing # EOF at end"


def test_no_now(tmp_path: Path) -> None:
    write(tmp_path, "c.json", kube_list(node("n1")))
    write(tmp_path, "m.prom", f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n1",UUID="{UUID}"}} 5\n')  # no timestamps
    (problem,) = problems_of(tmp_path)
    assert problem.startswith(
        f"{tmp_path}: no `now` for this snapshot: add snapshot.yaml with a line such as"
    )
    assert "include DCGM samples with timestamps" in problem


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("now: 2026-11-29T12:00:00\n", "has no timezone"),
        ("now: '2026-11-29 12:00'\n", "has no timezone"),
        ("now: 2026-11-29\n", "is a date"),
        ("now: soon\n", "invalid timestamp 'soon'"),
        ("now: 5\n", "expected an RFC 3339 timestamp"),
        ("- now\n", "expected a mapping"),
        ("now: [\n", "invalid YAML"),
    ],
)
def test_bad_now(tmp_path: Path, content: str, expected: str) -> None:
    write(tmp_path, "snapshot.yaml", content)
    (problem,) = problems_of(tmp_path)
    assert problem.startswith(str(tmp_path / "snapshot.yaml"))
    assert expected in problem


def test_snapshot_yaml_holds_now_once_and_nothing_else(tmp_path: Path) -> None:
    # `Now:` is no `now`: read as none, the snapshot's instant silently became the newest sample's.
    write(
        tmp_path,
        "snapshot.yaml",
        "Now: 2026-11-29T18:00:00Z\nnow: 2026-11-29T12:00:00Z\nnow: 2026-11-29T13:00:00Z\n",
    )
    where = tmp_path / "snapshot.yaml"
    assert problems_of(tmp_path) == (
        f"{where}:1: Now: unknown key (snapshot.yaml holds only `now`)",
        f"{where}:3: now: duplicate key (also on line 2; only one value may be given)",
    )


def test_a_key_given_twice_in_a_yaml_object_is_a_problem(tmp_path: Path) -> None:
    # YAML keeps the last value: this budget, exhausted as first written, would read as one to spend.
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    write(
        tmp_path,
        "pdb.yaml",
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: train, namespace: ml}\n"
        "spec:\n  minAvailable: 1\n  selector: {matchLabels: {app: train}}\n"
        "status:\n  disruptionsAllowed: 0\n  disruptionsAllowed: 1\n",
    )
    write(tmp_path, "pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: p, name: q}\n")
    assert problems_of(tmp_path) == (
        f"{tmp_path / 'pdb.yaml'}:9: invalid YAML: found duplicate key 'disruptionsAllowed' (also on line 8)",
        f"{tmp_path / 'pod.yaml'}:3: invalid YAML: found duplicate key 'name' (also on line 3)",
    )


def test_a_file_that_cannot_be_read_as_a_file_is_a_problem(tmp_path: Path) -> None:
    # A broken link (or a pipe) was skipped without a word: a snapshot missing its pods file that way
    # read as a cluster without pods.
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    write(tmp_path, "nodes.json", kube_list(node("n1")))
    (tmp_path / "pods.json").symlink_to(tmp_path / "missing.json")
    assert problems_of(tmp_path) == (
        f"{tmp_path / 'pods.json'}: not a regular file (a broken link, a pipe or a device): cannot be read",
    )


def test_now_from_snapshot_yaml_wins_over_samples(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", 'now: "2026-11-29T11:59:00Z"\n')
    write(tmp_path, "c.json", kube_list(node("n1")))
    lines = [
        f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n1",UUID="{UUID}"}} {v} {T0 - age}'
        for age, v in ((120, 10), (0, 90))
    ]
    write(tmp_path, "m.om", "\n".join(lines) + "\n# EOF\n")
    snap = load_snapshot_dir(tmp_path, loaded())
    assert snap.now == NOW - timedelta(minutes=1)
    window = snap.telemetry.window(600)
    assert window is not None
    assert window.gpus[0].util_avg_percent == 10.0  # the later sample is after `now`
    assert window.gpus[0].newest_sample == datetime(2026, 11, 29, 11, 58, tzinfo=UTC)


def test_snapshot_error_message_lists_problems(tmp_path: Path) -> None:
    write(tmp_path, "a.json", "{")
    write(tmp_path, "b.json", "[")
    with pytest.raises(SnapshotError) as info:
        load_snapshot_dir(tmp_path, loaded())
    assert str(info.value) == "\n".join(info.value.problems)
    assert len(info.value.problems) == 2


# --------------------------------------------------------------------------- dates


def test_an_impossible_now_is_a_located_error(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", "# taken at\nnow: 2026-02-30T00:00:00Z\n")
    (problem,) = problems_of(tmp_path)
    assert problem == (
        f"{tmp_path / 'snapshot.yaml'}:2: now: invalid timestamp '2026-02-30T00:00:00Z': "
        "day is out of range for month"
    )


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_an_impossible_creation_timestamp_is_a_located_error(tmp_path: Path, suffix: str) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    bad = pod("train-0", None)
    bad["metadata"]["creationTimestamp"] = "2026-02-30T00:00:00Z"
    text = json.dumps(kube_list(bad)) if suffix == ".json" else yaml_dump(kube_list(bad))
    write(tmp_path, f"pods{suffix}", text)
    (problem,) = problems_of(tmp_path)
    assert problem.startswith(str(tmp_path / f"pods{suffix}"))
    assert problem.endswith(
        "Pod ml/train-0: metadata.creationTimestamp: invalid timestamp '2026-02-30T00:00:00Z': "
        "day is out of range for month"
    )


@pytest.mark.parametrize(
    "text",
    [
        "2026-W48-7T12:00:00Z",
        "20261129T120000Z",
        "2026-11-29T12:00Z",
        "2026-11-29T12:00:00+2400",
        "2026-11-29t12:00:00z",
    ],
)
def test_only_rfc3339_is_a_timestamp(tmp_path: Path, text: str) -> None:
    """Python's fromisoformat takes week dates, the basic format and more; Kubernetes does not."""
    write(tmp_path, "snapshot.yaml", f"now: '{text}'\n")
    (problem,) = problems_of(tmp_path)
    assert f"invalid timestamp {text!r}" in problem


def yaml_dump(data: object) -> str:
    import yaml

    return yaml.safe_dump(data)


# --------------------------------------------------------------------------- layout


def gz(directory: Path, name: str, content: str | dict[str, Any]) -> Path:
    import gzip

    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(content) if isinstance(content, dict) else content
    path.write_bytes(gzip.compress(text.encode("utf-8")))
    return path


def test_files_in_subdirectories_are_read(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    (tmp_path / "cluster" / "ml").mkdir(parents=True)
    (tmp_path / "metrics").mkdir()
    write(tmp_path, "cluster/nodes.json", kube_list(node("n1")))
    write(tmp_path, "cluster/ml/pods.json", kube_list(pod("train-0", "n1")))
    write(tmp_path, "metrics/dcgm.om", f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n1",UUID="{UUID}"}} 5 {T0}\n# EOF\n')
    snap = load_snapshot_dir(tmp_path, loaded())
    assert list(snap.nodes) == ["n1"]
    assert [p.name for p in snap.pods] == ["train-0"]
    assert snap.telemetry.available
    assert snap.findings == ()


def test_a_kubectl_cluster_info_dump_directory_is_a_snapshot(tmp_path: Path) -> None:
    """`kubectl cluster-info dump --all-namespaces --output-directory=DIR` writes nodes.json at the top,
    one directory per namespace with its lists, and one directory per pod with its logs."""
    write(tmp_path, "nodes.json", {"kind": "NodeList", "apiVersion": "v1", "items": [node("n1")]})
    for namespace in ("ml", "kube-system"):
        (tmp_path / namespace).mkdir()
        items = [{k: v for k, v in pod(f"{namespace}-0", "n1", namespace=namespace).items() if k != "kind"}]
        write(tmp_path, f"{namespace}/pods.json", {"kind": "PodList", "apiVersion": "v1", "items": items})
        write(tmp_path, f"{namespace}/events.json", {"kind": "EventList", "apiVersion": "v1", "items": []})
        svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": namespace}}
        write(
            tmp_path,
            f"{namespace}/services.json",
            {"kind": "ServiceList", "apiVersion": "v1", "items": [svc]},
        )
        (tmp_path / namespace / f"{namespace}-0").mkdir()
        write(tmp_path, f"{namespace}/{namespace}-0/logs.txt", "starting\n")
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    snap = load_snapshot_dir(tmp_path, loaded())
    assert {p.key for p in snap.pods} == {("ml", "ml-0"), ("kube-system", "kube-system-0")}
    by_kind = {f.kind: f for f in snap.findings}
    assert "Service (2)" in by_kind["ignored-objects"].detail
    unread = by_kind["unread-files"]
    assert unread.detail == (
        "not read (a snapshot holds .json, .yaml, .yml, .prom and .om files, optionally gzipped): "
        "2 files: kube-system/kube-system-0/logs.txt, ml/ml-0/logs.txt"
    )


def test_unread_files_are_listed_and_long_lists_are_cut(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    write(tmp_path, "c.json", kube_list(node("n1")))
    for index in range(12):
        write(tmp_path, f"notes-{index:02}.txt", "x")
    [unread] = [f for f in load_snapshot_dir(tmp_path, loaded()).findings if f.kind == "unread-files"]
    assert unread.detail.endswith(
        "12 files: notes-00.txt, notes-01.txt, notes-02.txt, notes-03.txt, notes-04.txt and 7 more"
    )


def test_hidden_directories_are_not_read(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    write(tmp_path, "c.json", kube_list(node("n1"), pod("p", "n1")))
    (tmp_path / ".git").mkdir()
    write(tmp_path, ".git/config.json", "{not json")
    assert load_snapshot_dir(tmp_path, loaded()).findings == ()


@pytest.mark.parametrize("stream", [False, True])
def test_gzipped_files_are_read_as_their_inner_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    if stream:
        monkeypatch.setattr(snapshot_objects, "STREAM_JSON_BYTES", 1)
    gz(tmp_path, "snapshot.yaml.gz", "now: 2026-11-29T12:00:00Z\n")
    gz(tmp_path, "nodes.json.gz", kube_list(node("n1")))
    gz(
        tmp_path,
        "pods.yaml.gz",
        "kind: Pod\napiVersion: v1\nmetadata: {name: p, namespace: ml}\nspec: {nodeName: n1}\n",
    )
    gz(tmp_path, "dcgm.om.gz", f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n1",UUID="{UUID}"}} 5 {T0}\n# EOF\n')
    gz(tmp_path, "more.prom.gz", f'DCGM_FI_DEV_FB_USED{{Hostname="n1",UUID="{UUID}"}} 7 {T0 * 1000}\n')
    snap = load_snapshot_dir(tmp_path, loaded())
    assert list(snap.nodes) == ["n1"]
    assert [p.name for p in snap.pods] == ["p"]
    window = snap.telemetry.window(600)
    assert window is not None
    [row] = window.gpus
    assert (row.util_avg_percent, row.fb_used_mib) == (5.0, 7.0)
    assert snap.findings == ()


def test_a_corrupt_gzip_file_is_a_located_error(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    (tmp_path / "nodes.json.gz").write_bytes(b"not gzip at all")
    truncated = gz(tmp_path, "pods.json.gz", kube_list(pod("p", None)))
    truncated.write_bytes(truncated.read_bytes()[:20])
    problems = problems_of(tmp_path)
    assert problems == (
        f"{tmp_path / 'nodes.json.gz'}: not a gzip file",
        f"{tmp_path / 'pods.json.gz'}: truncated gzip file",
    )


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("depth", [5_000, 200_000])
def test_deeply_nested_json_is_a_located_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool, depth: int
) -> None:
    if stream:
        monkeypatch.setattr(snapshot_objects, "STREAM_JSON_BYTES", 1)
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    nested = "[" * depth + "]" * depth
    write(tmp_path, "deep.json", '{"kind": "List", "items": [{"kind": "Pod", "metadata": ' + nested + "}]}")
    problems = problems_of(tmp_path)
    assert len(problems) == 1
    assert problems[0].startswith(str(tmp_path / "deep.json"))


@pytest.mark.parametrize("depth", [150, 5_000])
def test_deeply_nested_yaml_is_a_located_error(tmp_path: Path, depth: int) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    write(tmp_path, "deep.yaml", "kind: Pod\nmetadata: " + "[" * depth + "]" * depth + "\n")
    [problem] = problems_of(tmp_path)
    assert problem.startswith(f"{tmp_path / 'deep.yaml'}:")
    assert "nest" in problem


# --------------------------------------------------------------------------- controllers


def controller(
    kind: str, name: str, owner: tuple[str, str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "resourceVersion": "77"}
    if owner is not None:
        api_version, owner_kind, owner_name = owner
        meta["ownerReferences"] = [
            {
                "apiVersion": api_version,
                "kind": owner_kind,
                "name": owner_name,
                "uid": "u",
                "controller": True,
            }
        ]
    return {"kind": kind, "metadata": meta, "spec": spec}


def owned_pod(name: str, owner: tuple[str, str, str]) -> dict[str, Any]:
    body = pod(name, "n1")
    api_version, kind, owner_name = owner
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": api_version, "kind": kind, "name": owner_name, "uid": "u", "controller": True}
    ]
    return body


def test_controllers_are_read_and_pods_resolve_through_them(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    write(
        tmp_path,
        "cluster.json",
        kube_list(
            node("n1"),
            owned_pod("serve-5f-a", ("apps/v1", "ReplicaSet", "serve-5f")),
            owned_pod("nb-0", ("apps/v1", "StatefulSet", "nb")),
            owned_pod("nightly-1-x", ("batch/v1", "Job", "nightly-1")),
        ),
    )
    # As `kubectl get rs,deploy -A -o json` prints typed lists: items without kind or apiVersion.
    replica_sets = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSetList",
        "items": [
            {
                k: v
                for k, v in controller("ReplicaSet", "serve-5f", ("apps/v1", "Deployment", "serve")).items()
                if k != "kind"
            }
        ],
    }
    write(tmp_path, "replicasets.json", replica_sets)
    write(
        tmp_path,
        "workloads.json",
        kube_list(
            {**controller("Deployment", "serve", replicas=0), "apiVersion": "apps/v1"},
            {
                **controller("StatefulSet", "nb", ("kubeflow.org/v1", "Notebook", "nb")),
                "apiVersion": "apps/v1",
            },
            {**controller("Notebook", "nb"), "apiVersion": "kubeflow.org/v1"},
            {**controller("Job", "nightly-1", ("batch/v1", "CronJob", "nightly")), "apiVersion": "batch/v1"},
            {**controller("CronJob", "nightly"), "apiVersion": "batch/v1"},
        ),
    )
    snap = load_snapshot_dir(tmp_path, loaded())
    assert sorted(snap.controllers) == [
        ("ml", "Deployment", "serve"),
        ("ml", "Job", "nightly-1"),
        ("ml", "Notebook", "nb"),
        ("ml", "ReplicaSet", "serve-5f"),
        ("ml", "StatefulSet", "nb"),
    ]
    replica_set = snap.controllers[("ml", "ReplicaSet", "serve-5f")]
    assert (replica_set.api_version, replica_set.replicas, replica_set.resource_version) == (
        "apps/v1",
        1,
        "77",
    )
    assert snap.controllers[("ml", "Deployment", "serve")].replicas == 0
    assert snap.controllers[("ml", "Job", "nightly-1")].suspended is False
    # A CronJob is not read: the Job it started is the workload.
    assert [f.detail for f in snap.findings] == [
        "ignored 1 objects of kinds the rebalancer does not use: CronJob (1)"
    ]
    got = resolve(snap)
    assert got[("ml", "serve-5f-a")].key == Workload("ml", "Deployment", "serve")
    assert got[("ml", "nb-0")].reclaim == "stop"
    assert got[("ml", "nightly-1-x")].parent is not None


def test_a_duplicate_or_malformed_controller_is_a_problem(tmp_path: Path) -> None:
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    write(tmp_path, "a.json", kube_list(controller("Deployment", "serve")))
    write(
        tmp_path,
        "b.json",
        kube_list(controller("Deployment", "serve"), controller("Job", "j", suspend="yes")),
    )
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert problems_of(tmp_path) == (
        f"{b} items[0]: duplicate Deployment ml/serve (first in {a} items[0])",
        f"{b} items[1]: Job ml/j: spec.suspend: expected true or false, got the string 'yes'",
    )


@pytest.mark.parametrize("stream", [False, True])
def test_items_without_a_list_kind_are_read_as_a_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """A file with `items` but no List kind is not a List: it is read as one document (here, an object
    without a kind), the mapped file released first."""
    if stream:
        monkeypatch.setattr(snapshot_objects, "STREAM_JSON_BYTES", 0)
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    write(tmp_path, "pods.json", {"apiVersion": "v1", "items": [pod("a", None)]})
    assert problems_of(tmp_path) == (f"{tmp_path / 'pods.json'}: Kubernetes object without a kind",)
