"""tools/clustergen, the cluster generator behind the demo cluster and the scale benchmark.

The demo's byte-for-byte regeneration is tests/test_policy.py's; here: the benchmark's population at a
small size is deterministic and loads, the streaming writers write what the one-shot forms would, the
controllers' naming and the device plugin's hand-out behave as documented, and the controller objects
carry the names and uids their pods' ownerReferences give.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tools import clustergen
from tools.clustergen import Ids, NodeSpec, Workload

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != ".params.json"}


def test_the_scale_population_is_deterministic_and_loads(
    scale_population: ModuleType, tmp_path: Path
) -> None:
    first = scale_population.generate(tmp_path / "one", 30, 7, 180, 1800)
    second = scale_population.generate(tmp_path / "two", 30, 7, 180, 1800)
    assert _files(first.path) == _files(second.path)
    assert sorted(_files(first.path)) == ["dcgm.om", "nodes.json", "pdbs.json", "pods.json", "snapshot.yaml"]
    assert (first.nodes, first.gpus, first.samples % 11) == (30, 240, 0)  # 11 samples a series
    assert first.pods > 30 * 5 and first.pdbs > 0

    done = subprocess.run(
        [sys.executable, "-m", "rebalancer.cli", "once", "--snapshot", str(first.path), "--output", "json"],
        capture_output=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    summary = json.loads(done.stdout)["summary"]
    assert (summary["nodes"], summary["pods"]) == (first.nodes, first.pods)


def test_the_offline_scale_benchmark_loads_nothing_of_the_live_path() -> None:
    """bench/scale.py without --live, with bench/scale_population.py it imports (what bench/startup.py and
    bench/kube_cache.py import them for), loads neither bench/scale_live.py nor what only the live path
    needs: the kubernetes client, the daemon, the test suite's Prometheus."""
    live_only = ("bench.scale_live", "kubernetes", "rebalancer.daemon.loop", "tests.prometheus_server")
    probe = f"import sys; import bench.scale; print([m for m in {live_only!r} if m in sys.modules])"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_another_seed_is_another_cluster(scale_population: ModuleType) -> None:
    one, other = scale_population.population(30, 1), scale_population.population(30, 2)
    assert [p.name for p in one.pods] != [p.name for p in other.pods]


@pytest.mark.parametrize("count", [0, 1, 3])
def test_write_list_writes_what_json_dumps_writes(tmp_path: Path, count: int) -> None:
    items: list[dict[str, Any]] = [
        {"kind": "Pod", "metadata": {"name": f"p{i}", "labels": {"b": "1", "a": [1, {"z": None}]}}, "n": i}
        for i in range(count)
    ]
    path = tmp_path / "list.json"
    assert clustergen.write_list(path, iter(items)) == count
    document = {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}
    assert path.read_text(encoding="utf-8") == json.dumps(document, indent=4, sort_keys=True) + "\n"


def _node(name: str, replicas: int = 1) -> NodeSpec:
    return NodeSpec(name, clustergen.H100, "us-east-1a", timedelta(days=3), f"10.0.0.{len(name)}", replicas)


class _Colliding(Ids):
    """Ids whose first draw of every name suffix is the same: each name must come from a retry."""

    def suffix(self, length: int, *parts: object) -> str:
        return "x" * length if "retry" not in parts else super().suffix(length, *parts)


def test_a_taken_generated_name_is_drawn_again_as_a_controller_would() -> None:
    nodes = {n.name: n for n in (_node("n1"), _node("n2"), _node("n3"))}
    ds = Workload("ops", "DaemonSet", "agent", tuple(nodes), image="agent:1", cpu="10m", memory="16Mi")
    taken: set[tuple[str, str]] = set()
    pods = clustergen.pods_of(ds, nodes, _Colliding("test"), taken)
    names = [p.name for p in pods]
    assert names[0] == "agent-xxxxx" and len(set(names)) == 3
    assert taken == {("ops", name) for name in names}
    clustergen.check(list(nodes.values()), pods)


def test_time_sliced_pods_pack_onto_the_fullest_gpu_with_room() -> None:
    node = _node("shared", replicas=4)
    nodes = {node.name: node}

    def replicas(name: str, count: int, units: int) -> Workload:
        return Workload(
            "ml", "Deployment", name, (node.name,) * count, image="i:1", cpu="1", memory="1Gi",
            gpus=units, shared=True,
        )  # fmt: skip

    ids = Ids("test")
    pods = [
        p
        for w in (replicas("half", 3, 2), replicas("quarter", 2, 1))
        for p in clustergen.pods_of(w, nodes, ids)
    ]
    clustergen.check([node], pods)
    devices = clustergen.gpus([node], pods, ids)
    held = [[p.workload.name for p in gpu.holders] for gpu in devices]
    assert held[:3] == [["half", "half"], ["half", "quarter", "quarter"], []]
    assert len(devices[1].labels()) == 3  # one series per (GPU, pod)


def test_controllers_carry_the_names_and_uids_their_pods_name() -> None:
    nodes = {n.name: n for n in (_node("n1"), _node("n2"))}
    ids = Ids("test")
    workloads = [
        Workload(
            "ml", "Deployment", "serve", ("n1", "n2"), image="s:1", cpu="1", memory="1Gi", gpus=1,
            controller_annotations={"team": "a"},
        ),
        Workload("ml", "StatefulSet", "nb", ("n1",), image="j:1", cpu="1", memory="1Gi", gpus=1),
        Workload("ml", "IndexedJob", "train", ("n1", "n2"), image="t:1", cpu="1", memory="1Gi", gpus=2),
        Workload("ml", "Job", "eval", ("n2",), image="e:1", cpu="1", memory="1Gi"),
        Workload("ops", "DaemonSet", "agent", ("n1", "n2"), image="a:1", cpu="10m", memory="16Mi"),
    ]  # fmt: skip
    taken: set[tuple[str, str]] = set()
    pods = [
        clustergen.pod_json(p, "10.0.0.9", ids, NOW)
        for w in workloads
        for p in clustergen.pods_of(w, nodes, ids, taken)
    ]
    objects = clustergen.all_controllers(workloads, ids, NOW)
    by_ref = {(o["metadata"]["namespace"], o["kind"], o["metadata"]["name"]): o for o in objects}
    assert sorted(kind for _, kind, _ in by_ref) == ["Deployment", "Job", "Job", "ReplicaSet", "StatefulSet"]
    for pod in pods:
        (owner,) = pod["metadata"]["ownerReferences"]
        if owner["kind"] == "DaemonSet":
            continue  # not written: the rebalancer does not read DaemonSets
        controller = by_ref[(pod["metadata"]["namespace"], owner["kind"], owner["name"])]
        assert controller["metadata"]["uid"] == owner["uid"]
        assert controller["apiVersion"] == owner["apiVersion"]
        selector = controller["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items()
        assert controller["metadata"]["creationTimestamp"] < pod["metadata"]["creationTimestamp"]
    (replica_set,) = [o for o in objects if o["kind"] == "ReplicaSet"]
    (ref,) = replica_set["metadata"]["ownerReferences"]
    deployment = by_ref[("ml", "Deployment", "serve")]
    assert (ref["kind"], ref["name"], ref["uid"]) == ("Deployment", "serve", deployment["metadata"]["uid"])
    assert deployment["spec"]["replicas"] == replica_set["spec"]["replicas"] == 2
    assert deployment["metadata"]["annotations"]["team"] == "a"
    assert "team" not in replica_set["metadata"]["annotations"]
    train = by_ref[("ml", "Job", "train")]["spec"]
    assert (train["completionMode"], train["completions"], train["suspend"]) == ("Indexed", 2, False)
    assert train["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert list(by_ref) == sorted(by_ref)  # kubectl's order: namespace, kind, name
