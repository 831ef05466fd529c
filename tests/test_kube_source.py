"""The live cluster source against the fake API server: lists, pagination, parsing, findings, config."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from rebalancer.history import Workload
from rebalancer.kubeapi import KubeConfigError, load_api_client
from rebalancer.model import NO_TELEMETRY, Finding, GpuRequest, OwnerRef, Pod, Telemetry
from rebalancer.policy import LoadedPolicy, parse_policy
from rebalancer.sources.kube import ACTIVE_PODS, UNREAD_CONTROLLERS, KubeSource, KubeSourceError
from rebalancer.sources.kube_lists import ClusterObjects
from rebalancer.telemetry.series import Sample, Series
from rebalancer.telemetry.windows import aggregate
from rebalancer.workloads import resolve
from tests.builders import NOW, gpu_sample, telemetry
from tests.fake_apiserver import FakeApiServer, controller_json, node_json, pdb_json, pod_json

LOADED: LoadedPolicy = parse_policy({})


def _source(api_client: client.ApiClient, **kwargs: Any) -> KubeSource:
    kwargs.setdefault("sleep", lambda seconds: None)
    return KubeSource(api_client, LOADED, **kwargs)


def _owner(kind: str, api_version: str, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": "o", "uid": "o-uid", "controller": controller}


def _cluster(api: FakeApiServer) -> None:
    api.add(node_json("gpu-1"))
    api.add(node_json("gpu-2", gpus=4, model="NVIDIA-H100-80GB-HBM3"))
    api.add(node_json("cpu-1", gpus=0, model=None))
    api.add(pod_json("train-0", "gpu-1", gpus=2, labels={"app": "train", "volcano.sh/job-name": "big"}))
    api.add(pod_json("train-1", "gpu-2", gpus=2, labels={"app": "train", "volcano.sh/job-name": "big"}))
    api.add(pod_json("web", "cpu-1", gpus=0, namespace="web"))
    api.add(pod_json("done", "gpu-1", phase="Succeeded"))
    api.add(pod_json("crashed", "gpu-2", phase="Failed"))
    api.add(pod_json("waiting", None, phase="Pending"))
    api.add(pdb_json("train-pdb", {"app": "train"}, 1))
    api.add(pdb_json("web-pdb", {"app": "web"}, 0, namespace="web"))


def test_snapshot_from_the_cluster(api: FakeApiServer, api_client: client.ApiClient) -> None:
    _cluster(api)
    snap = _source(api_client).snapshot(NOW)

    assert snap.now == NOW
    assert sorted(snap.nodes) == ["cpu-1", "gpu-1", "gpu-2"]
    assert snap.nodes["gpu-2"].gpu_count == 4
    assert snap.nodes["gpu-2"].gpu_model == "NVIDIA-H100-80GB-HBM3"
    assert snap.gpu_total == 12
    assert sorted(p.ref for p in snap.pods) == ["ml/train-0", "ml/train-1", "ml/waiting", "web/web"]
    train = snap.pods_by_key[("ml", "train-0")]
    assert train.uid == "uid-ml-train-0"
    assert train.node_name == "gpu-1"
    assert train.gpu == GpuRequest(count=2)
    assert train.gang == "ml/big"
    assert train.owner == OwnerRef(kind="ReplicaSet", name="trainer-abc", api_version="apps/v1")
    assert snap.gangs["ml/big"] == (train, snap.pods_by_key[("ml", "train-1")])
    assert {(p.namespace, p.name, p.disruptions_allowed) for p in snap.pdbs} == {
        ("ml", "train-pdb", 1),
        ("web", "web-pdb", 0),
    }
    assert snap.telemetry is NO_TELEMETRY
    assert snap.findings == ()

    # Three lists, raw JSON, finished pods filtered by the API server, no writes; then the ReplicaSets
    # the GPU pods name (none is there: their workloads stay unresolved).
    assert [r.path for r in api.requests] == [
        "/api/v1/nodes",
        "/api/v1/pods",
        "/apis/policy/v1/poddisruptionbudgets",
        "/apis/apps/v1/replicasets",
    ]
    assert snap.controllers == {}
    assert api.requests[1].param("fieldSelector") == ACTIVE_PODS
    assert all(r.param("limit") == "500" for r in api.requests)
    assert api.writes() == []


def test_pagination_with_small_pages(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(node_json("gpu-1"))
    for index in range(7):
        api.add(pod_json(f"p{index}", "gpu-1"))
    snap = _source(api_client, page_size=3).snapshot(NOW)
    assert sorted(p.name for p in snap.pods) == [f"p{i}" for i in range(7)]
    pod_requests = api.requests_to("/api/v1/pods")
    assert [r.param("limit") for r in pod_requests] == ["3", "3", "3"]
    assert pod_requests[0].param("continue") is None
    assert all(r.param("continue") for r in pod_requests[1:])
    assert all(r.param("fieldSelector") == ACTIVE_PODS for r in pod_requests)


def test_an_expired_continue_token_restarts_the_list(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("gpu-1"))
    for index in range(5):
        api.add(pod_json(f"p{index}", "gpu-1"))
    api.inject("/api/v1/pods", status=410, skip=1)  # the second page: token expired
    snap = _source(api_client, page_size=2).snapshot(NOW)
    assert sorted(p.name for p in snap.pods) == [f"p{i}" for i in range(5)]
    pages = api.requests_to("/api/v1/pods")
    assert [r.param("continue") is None for r in pages] == [True, False, True, False, False]


def test_owner_resolution(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(node_json("n"))
    controllers = {
        "rs": ("ReplicaSet", "apps/v1"),
        "sts": ("StatefulSet", "apps/v1"),
        "job": ("Job", "batch/v1"),
        "jobset": ("JobSet", "jobset.x-k8s.io/v1alpha2"),
        "custom": ("RayCluster", "ray.io/v1"),
        "ds": ("DaemonSet", "apps/v1"),
    }
    for name, (kind, version) in controllers.items():
        api.add(pod_json(name, "n", owner_kind=kind, owner_api_version=version))
    api.add(pod_json("bare", "n", owner_kind=None))
    not_controller = pod_json("owned-not-controlled", "n", owner_kind=None)
    not_controller["metadata"]["ownerReferences"] = [_owner("ConfigMap", "v1", controller=False)]
    api.add(not_controller)
    snap = _source(api_client).snapshot(NOW)
    owners = {p.name: p.owner for p in snap.pods}
    for name, (kind, version) in controllers.items():
        assert owners[name] == OwnerRef(kind=kind, name="trainer-abc", api_version=version)
    assert owners["bare"] is None
    assert owners["owned-not-controlled"] is None
    assert snap.pods_by_key[("ml", "ds")].is_daemonset


def test_restricted_namespaces(api: FakeApiServer, api_client: client.ApiClient) -> None:
    _cluster(api)
    snap = _source(api_client, namespaces=["web"]).snapshot(NOW)
    assert [p.ref for p in snap.pods] == ["web/web"]
    assert [p.name for p in snap.pdbs] == ["web-pdb"]
    assert [r.path for r in api.requests] == [
        "/api/v1/nodes",
        "/api/v1/namespaces/web/pods",
        "/apis/policy/v1/namespaces/web/poddisruptionbudgets",
    ]
    (finding,) = snap.findings
    assert finding.kind == "partial-cluster-view"
    assert "overstated" in finding.detail


def test_restricted_namespaces_take_gpu_series_of_other_namespaces_as_labelled(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    # Listing only `web`, the view lacks ml/train-0: its busy GPU is held by that pod, not leaked. A
    # series naming a pod of a listed namespace that is not there is still attributed to none.
    _cluster(api)
    times = [NOW.timestamp() - age for age in range(0, 1800, 60)]

    def series(metric: str, value: float, namespace: str, pod: str) -> Series:
        labels = {"Hostname": "gpu-1", "UUID": f"GPU-{pod}", "namespace": namespace, "pod": pod}
        return Series(metric, labels, tuple(Sample(value, t) for t in times))

    history = [
        series(metric, value, namespace, pod)
        for namespace, pod in (("ml", "train-0"), ("web", "gone-0"))
        for metric, value in (("DCGM_FI_DEV_GPU_UTIL", 80.0), ("DCGM_FI_DEV_FB_USED", 60000.0))
    ]
    cfg = LOADED.policy.telemetry
    assert cfg is not None

    def provider(now: datetime, pods: Mapping[tuple[str, str], Pod]) -> tuple[Telemetry, tuple[Finding, ...]]:
        return aggregate(history, cfg, [1800], now, pods)

    snap = _source(api_client, namespaces=["web"], telemetry=provider).snapshot(NOW)
    window = snap.telemetry.window(1800)
    assert window is not None
    assert sorted((row.uuid, row.pod_key) for row in window.gpus) == [
        ("GPU-gone-0", None),
        ("GPU-train-0", ("ml", "train-0")),
    ]


def test_pod_on_an_unlisted_node_is_a_finding(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(node_json("gpu-1"))
    api.add(pod_json("ok", "gpu-1"))
    api.add(pod_json("orphan", "gone-node"))
    snap = _source(api_client).snapshot(NOW)
    assert [p.name for p in snap.pods] == ["ok"]
    (finding,) = snap.findings
    assert (finding.kind, finding.node, finding.pod) == ("unknown-node", "gone-node", "orphan")


def test_telemetry_object_or_callable(api: FakeApiServer, api_client: client.ApiClient) -> None:
    _cluster(api)
    fixed = telemetry([gpu_sample("gpu-1", "GPU-1")])
    assert _source(api_client).snapshot(NOW, fixed).telemetry is fixed
    assert _source(api_client, telemetry=fixed).snapshot(NOW).telemetry is fixed

    seen: list[tuple[datetime, list[str]]] = []

    def provider(now: datetime, pods: Mapping[tuple[str, str], Pod]) -> tuple[Telemetry, list[Finding]]:
        seen.append((now, sorted(f"{ns}/{name}" for ns, name in pods)))
        return fixed, [Finding(kind="bad-telemetry", detail="x")]

    snap = _source(api_client).snapshot(NOW, provider)
    assert seen == [(NOW, ["ml/train-0", "ml/train-1", "ml/waiting", "web/web"])]
    assert snap.telemetry is fixed
    assert [f.kind for f in snap.findings] == ["bad-telemetry"]

    def broken(now: datetime, pods: Mapping[tuple[str, str], Pod]) -> Telemetry:
        raise ConnectionError("prometheus unreachable")

    failed = _source(api_client).snapshot(NOW, broken).telemetry
    assert not failed.available
    assert failed.problem == "telemetry source failed: ConnectionError: prometheus unreachable"


def test_telemetry_for_unknown_nodes_is_reported(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(node_json("gpu-1"))
    snap = _source(api_client).snapshot(NOW, telemetry([gpu_sample("ghost", "GPU-9")]))
    assert [f.node for f in snap.findings] == ["ghost"]


def test_transient_errors_are_retried(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(node_json("gpu-1"))
    api.inject("/api/v1/nodes", status=503, times=2)
    api.inject("/api/v1/pods", drop=True, times=1)
    sleeps: list[float] = []
    snap = _source(api_client, sleep=sleeps.append).snapshot(NOW)
    assert list(snap.nodes) == ["gpu-1"]
    assert len(api.requests_to("/api/v1/nodes")) == 3
    assert sleeps == [0.5, 1.0]
    # urllib3 itself retries an idempotent GET whose connection dropped.
    assert [r.fault for r in api.requests_to("/api/v1/pods")] == ["drop", None]


def test_persistent_errors_raise(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.inject("/api/v1/nodes", status=500, times=None, message="etcd is down")
    with pytest.raises(KubeSourceError) as caught:
        _source(api_client, retries=2).snapshot(NOW)
    assert caught.value.problems == ("cannot list nodes: HTTP 500 Internal Server Error: etcd is down",)
    assert len(api.requests) == 3

    api.clear_faults()
    api.inject("/api/v1/nodes", status=403, times=None, message='nodes is forbidden: User "x" cannot list')
    with pytest.raises(KubeSourceError, match="HTTP 403 Forbidden: nodes is forbidden"):
        _source(api_client).snapshot(NOW)
    assert len(api.requests) == 4  # a 403 is not retried


def test_timeouts_raise_after_retries(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.inject("/api/v1/nodes", delay=0.5, times=None)
    with pytest.raises(
        KubeSourceError, match=r"cannot list nodes: timed out \(.*Read timed out.*\) \(after 2 attempts\)"
    ):
        _source(api_client, retries=1, request_timeout=0.1).snapshot(NOW)


def test_malformed_objects_raise(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(node_json("gpu-1"))
    bad = pod_json("bad", "gpu-1")
    bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    api.add(bad)
    with pytest.raises(KubeSourceError) as caught:
        _source(api_client).snapshot(NOW)
    assert caught.value.problems == (
        'Pod ml/bad: spec.containers[0].resources.requests.cpu: invalid quantity "lots"',
    )


def test_a_field_of_the_wrong_type_names_that_object_alone(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    """A page is decoded typed; one msgspec refuses is read item by item, so the page's other objects
    are still read and each bad one is named on its own, as the model's checks name it."""
    api.add(node_json("gpu-1"))
    for name in ("a", "b", "c", "d"):
        api.add(pod_json(name, "gpu-1"))
    wrong = pod_json("e", "gpu-1")
    wrong["spec"]["priority"] = "high"
    api.add(wrong)
    labelled = pod_json("f", "gpu-1")
    labelled["metadata"]["labels"] = {"app": 7}
    api.add(labelled)
    with pytest.raises(KubeSourceError) as caught:
        _source(api_client, page_size=3).snapshot(NOW)
    assert caught.value.problems == (
        "Pod ml/e: spec.priority: expected an integer, got the string 'high'",
        "Pod ml/f: metadata.labels.app: expected a string, got the number 7",
    )
    api.remove("Pod", "e", "ml")
    api.remove("Pod", "f", "ml")
    assert [p.name for p in _source(api_client, page_size=3).snapshot(NOW).pods] == ["a", "b", "c", "d"]


def _kubeconfig(path: Path, url: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "fake", "cluster": {"server": url}},
            {"name": "nowhere", "cluster": {"server": "http://127.0.0.1:9"}},
        ],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [
            {"name": "good", "context": {"cluster": "fake", "user": "u"}},
            {"name": "bad", "context": {"cluster": "nowhere", "user": "u"}},
        ],
        "current-context": "bad",
    }
    file = path / "kubeconfig"
    file.write_text(yaml.safe_dump(doc))
    return file


def test_kubeconfig_and_context(api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    api.add(node_json("gpu-1"))
    file = _kubeconfig(tmp_path, api.url)
    source = KubeSource.from_kubeconfig(LOADED, kubeconfig=str(file), context="good")
    assert list(source.snapshot(NOW).nodes) == ["gpu-1"]

    with pytest.raises(KubeConfigError, match="context 'missing'"):
        load_api_client(str(file), "missing")
    with pytest.raises(KubeConfigError, match="cannot read kubeconfig"):
        load_api_client(str(tmp_path / "absent"))


def test_in_cluster_config_is_used_inside_a_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.config import incluster_config

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    with pytest.raises(KubeConfigError, match="cannot load in-cluster Kubernetes config"):
        load_api_client()  # no service account token mounted
    token.write_text("sa-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    with load_api_client() as api_client:
        assert api_client.configuration.host == "https://10.0.0.1:443"


# --------------------------------------------------------------------------- controllers


def _gpu_pod(
    name: str, owner: tuple[str, str] | None, *, namespace: str = "ml", gpus: int = 1
) -> dict[str, Any]:
    kind, owner_name = owner or (None, "")
    version = {"ReplicaSet": "apps/v1", "StatefulSet": "apps/v1", "Job": "batch/v1", "DaemonSet": "apps/v1"}
    return pod_json(
        name,
        "gpu-1",
        namespace=namespace,
        gpus=gpus,
        owner_kind=kind,
        owner_name=owner_name,
        owner_api_version=version.get(kind or "", "apps/v1"),
    )


def _workloads_cluster(api: FakeApiServer) -> None:
    """GPU pods behind every kind of workload, and objects no GPU pod needs."""
    api.add(node_json("gpu-1", gpus=16))
    # Deployment -> ReplicaSet; KServe InferenceService -> Deployment -> ReplicaSet.
    api.add(controller_json("Deployment", "serve", replicas=2))
    api.add(controller_json("ReplicaSet", "serve-5f", owner=("Deployment", "serve"), replicas=2))
    api.add(_gpu_pod("serve-5f-a", ("ReplicaSet", "serve-5f")))
    api.add(_gpu_pod("serve-5f-b", ("ReplicaSet", "serve-5f")))
    api.add(controller_json("InferenceService", "llm"))
    api.add(controller_json("Deployment", "llm-predictor", owner=("InferenceService", "llm")))
    api.add(controller_json("ReplicaSet", "llm-predictor-7c", owner=("Deployment", "llm-predictor")))
    api.add(_gpu_pod("llm-predictor-7c-x", ("ReplicaSet", "llm-predictor-7c")))
    # Kubeflow Notebook -> StatefulSet.
    api.add(controller_json("Notebook", "alice", namespace="notebooks"))
    api.add(controller_json("StatefulSet", "alice", namespace="notebooks", owner=("Notebook", "alice")))
    api.add(_gpu_pod("alice-0", ("StatefulSet", "alice"), namespace="notebooks"))
    # LeaderWorkerSet -> leader StatefulSet -> leader pod -> worker StatefulSet -> worker pod.
    api.add(controller_json("LeaderWorkerSet", "lws", replicas=1))
    api.add(controller_json("StatefulSet", "lws", owner=("LeaderWorkerSet", "lws")))
    api.add(_gpu_pod("lws-0", ("StatefulSet", "lws")))
    api.add(controller_json("StatefulSet", "lws-0", owner=("Pod", "lws-0")))
    api.add(_gpu_pod("lws-0-1", ("StatefulSet", "lws-0")))
    # JobSet -> Job; CronJob -> Job (a CronJob is never read: the Job is the workload).
    api.add(controller_json("JobSet", "train", suspend=False))
    api.add(controller_json("Job", "train-workers-0", owner=("JobSet", "train")))
    api.add(_gpu_pod("train-workers-0-0", ("Job", "train-workers-0")))
    api.add(controller_json("CronJob", "nightly"))
    api.add(controller_json("Job", "nightly-1", owner=("CronJob", "nightly"), suspend=True))
    api.add(_gpu_pod("nightly-1-q", ("Job", "nightly-1")))
    # Not needed: a CPU pod's ReplicaSet, a Deployment no pod runs, a DaemonSet's and a bare GPU pod.
    api.add(controller_json("ReplicaSet", "web-1"))
    api.add(_gpu_pod("web-1-z", ("ReplicaSet", "web-1"), gpus=0))
    api.add(controller_json("Deployment", "idle"))
    api.add(_gpu_pod("dcgm-abc", ("DaemonSet", "dcgm")))
    api.add(_gpu_pod("scratch", None))


def _controller_lists(api: FakeApiServer) -> list[str]:
    return [r.path for r in api.requests if r.path.startswith("/apis/") and "policy" not in r.path]


def test_the_gpu_pods_controllers_are_read_kind_by_kind(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _workloads_cluster(api)
    snap = _source(api_client).snapshot(NOW)

    assert sorted(snap.controllers) == sorted(
        [
            ("ml", "ReplicaSet", "serve-5f"),
            ("ml", "Deployment", "serve"),
            ("ml", "ReplicaSet", "llm-predictor-7c"),
            ("ml", "Deployment", "llm-predictor"),
            ("ml", "InferenceService", "llm"),
            ("notebooks", "StatefulSet", "alice"),
            ("notebooks", "Notebook", "alice"),
            ("ml", "StatefulSet", "lws"),
            ("ml", "StatefulSet", "lws-0"),
            ("ml", "LeaderWorkerSet", "lws"),
            ("ml", "Job", "train-workers-0"),
            ("ml", "JobSet", "train"),
            ("ml", "Job", "nightly-1"),
        ]
    )
    # One list per kind, round by round: the pods' controllers, then theirs, then theirs.
    assert _controller_lists(api) == [
        "/apis/apps/v1/replicasets",
        "/apis/apps/v1/statefulsets",
        "/apis/batch/v1/jobs",
        "/apis/apps/v1/deployments",
        "/apis/jobset.x-k8s.io/v1alpha2/jobsets",
        "/apis/leaderworkerset.x-k8s.io/v1/leaderworkersets",
        "/apis/kubeflow.org/v1/notebooks",
        "/apis/serving.kserve.io/v1beta1/inferenceservices",
    ]
    assert all(r.param("limit") == "500" for r in api.requests)
    assert api.writes() == []
    assert snap.findings == ()

    serve = snap.controllers[("ml", "Deployment", "serve")]
    assert (serve.api_version, serve.uid, serve.replicas, serve.suspended) == (
        "apps/v1",
        "uid-owner-serve",
        2,
        None,
    )
    assert snap.controllers[("ml", "Job", "nightly-1")].suspended is True
    assert snap.controllers[("ml", "LeaderWorkerSet", "lws")].api_version == "leaderworkerset.x-k8s.io/v1"
    got = resolve(snap)
    assert {
        key: (r.key.kind, r.key.name, r.reclaim) for key, r in got.items() if r.controller is not None
    } == {
        ("ml", "serve-5f-a"): ("Deployment", "serve", "scale"),
        ("ml", "serve-5f-b"): ("Deployment", "serve", "scale"),
        ("ml", "llm-predictor-7c-x"): ("InferenceService", "llm", None),
        ("notebooks", "alice-0"): ("Notebook", "alice", "stop"),
        ("ml", "lws-0"): ("LeaderWorkerSet", "lws", "scale"),
        ("ml", "lws-0-1"): ("LeaderWorkerSet", "lws", "scale"),
        ("ml", "train-workers-0-0"): ("JobSet", "train", "suspend"),
        ("ml", "nightly-1-q"): ("Job", "nightly-1", "suspend"),
    }
    assert got[("ml", "nightly-1-q")].parent == OwnerRef("CronJob", "nightly", "batch/v1")


def test_controllers_are_paged_and_listed_only_in_the_given_namespaces(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _workloads_cluster(api)
    for index in range(4):
        api.add(controller_json("ReplicaSet", f"spare-{index}"))
    snap = _source(api_client, namespaces=["ml"], page_size=3).snapshot(NOW)
    assert ("notebooks", "StatefulSet", "alice") not in snap.controllers
    assert ("ml", "InferenceService", "llm") in snap.controllers
    lists = _controller_lists(api)
    assert lists[:3] == ["/apis/apps/v1/namespaces/ml/replicasets"] * 3  # 8 ReplicaSets, 3 a page
    assert sorted(set(lists)) == sorted(
        f"/apis/{path}"
        for path in (
            "apps/v1/namespaces/ml/replicasets",
            "apps/v1/namespaces/ml/statefulsets",
            "batch/v1/namespaces/ml/jobs",
            "apps/v1/namespaces/ml/deployments",
            "jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets",
            "leaderworkerset.x-k8s.io/v1/namespaces/ml/leaderworkersets",
            "serving.kserve.io/v1beta1/namespaces/ml/inferenceservices",
        )
    )
    pages = api.requests_to("/apis/apps/v1/namespaces/ml/replicasets")
    assert [r.param("continue") is None for r in pages] == [True, False, False]


def test_a_custom_kind_not_installed_is_a_finding_not_a_failure() -> None:
    with FakeApiServer(
        missing_kinds={"notebooks.kubeflow.org", "leaderworkersets.leaderworkerset.x-k8s.io"}
    ) as api:
        api.add(node_json("gpu-1"))
        api.add(controller_json("StatefulSet", "alice", namespace="notebooks", owner=("Notebook", "alice")))
        api.add(controller_json("StatefulSet", "bob", namespace="notebooks", owner=("Notebook", "bob")))
        api.add(_gpu_pod("alice-0", ("StatefulSet", "alice"), namespace="notebooks"))
        api.add(_gpu_pod("bob-0", ("StatefulSet", "bob"), namespace="notebooks"))
        with api.api_client() as own_client:
            snap = _source(own_client).snapshot(NOW)
        lists = _controller_lists(api)
    (finding,) = snap.findings
    assert finding.kind == UNREAD_CONTROLLERS
    assert finding.detail == (
        "Notebook objects (notebooks.kubeflow.org/v1) not read: the API server does not serve "
        "notebooks.kubeflow.org/v1 (is its CustomResourceDefinition installed?): HTTP 404 Not Found: the "
        "server could not find the requested resource; needed by 2 objects (StatefulSet notebooks/alice, "
        "StatefulSet notebooks/bob), whose workloads stay unresolved (reported, never acted on)"
    )
    # No pod needs a LeaderWorkerSet: that kind is never asked for, and nothing is said of it.
    assert lists == ["/apis/apps/v1/statefulsets", "/apis/kubeflow.org/v1/notebooks"]
    assert sorted(snap.controllers) == [
        ("notebooks", "StatefulSet", "alice"),
        ("notebooks", "StatefulSet", "bob"),
    ]
    alice = resolve(snap)[("notebooks", "alice-0")]
    assert alice.key == Workload("notebooks", "Notebook", "alice")
    assert alice.controller is None and alice.reclaim is None


def test_a_forbidden_kind_is_a_finding_naming_the_permission(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _workloads_cluster(api)
    api.forbid("list", "jobsets", "", group="jobset.x-k8s.io")
    api.forbid("list", "inferenceservices", "ml", group="serving.kserve.io")
    snap = _source(api_client).snapshot(NOW)
    (finding,) = snap.findings
    assert finding.kind == UNREAD_CONTROLLERS
    assert finding.detail.startswith(
        "JobSet objects (jobsets.jobset.x-k8s.io/v1alpha2) not read: no permission: grant verb `list` on "
        "resource `jobsets` in API group `jobset.x-k8s.io` (cluster-wide): HTTP 403 Forbidden: "
        'jobsets.jobset.x-k8s.io is forbidden: User "system:serviceaccount:gpu-rebalancer:gpu-rebalancer" '
        'cannot list resource "jobsets" in API group "jobset.x-k8s.io" at the cluster scope; '
        "needed by 1 object (Job ml/train-workers-0)"
    )
    assert len(api.requests_to("/apis/jobset.x-k8s.io/*")) == 1  # a refusal is not retried
    assert ("ml", "Job", "train-workers-0") in snap.controllers
    assert ("ml", "JobSet", "train") not in snap.controllers
    assert resolve(snap)[("ml", "train-workers-0-0")].reclaim is None

    # Restricted to namespaces, it lists there (where JobSets may be listed) and a refusal names the
    # namespace.
    restricted = _source(api_client, namespaces=["ml"]).snapshot(NOW)
    by_kind = {
        f.detail.split(" ", 1)[0]: f.detail for f in restricted.findings if f.kind == UNREAD_CONTROLLERS
    }
    assert sorted(by_kind) == ["InferenceService"]
    assert ("ml", "JobSet", "train") in restricted.controllers
    assert (
        "in API group `serving.kserve.io` (in namespace ml): HTTP 403 Forbidden"
        in by_kind["InferenceService"]
    )


def test_controller_lists_retry_transient_errors_and_fail_on_persistent_ones(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _workloads_cluster(api)
    api.inject("/apis/apps/v1/deployments", status=503)
    snap = _source(api_client).snapshot(NOW)
    assert ("ml", "Deployment", "serve") in snap.controllers
    assert [r.fault for r in api.requests_to("/apis/apps/v1/deployments")] == ["status=503", None]

    api.inject("/apis/batch/v1/jobs", status=500, times=None, message="etcd is down")
    with pytest.raises(KubeSourceError) as caught:
        _source(api_client, retries=1).snapshot(NOW)
    assert caught.value.problems == ("cannot list jobs.batch: HTTP 500 Internal Server Error: etcd is down",)


def test_a_malformed_controller_the_walk_needs_raises(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _workloads_cluster(api)
    unneeded = controller_json("ReplicaSet", "broken-but-unused")
    unneeded["spec"]["replicas"] = "many"
    api.add(unneeded)
    assert _source(api_client).snapshot(NOW).controllers  # what no GPU pod needs is never translated
    needed = controller_json("Deployment", "serve")
    needed["metadata"]["annotations"] = {"rebalancer.gpu/idle-since": 5}
    api.add(needed)
    with pytest.raises(KubeSourceError) as caught:
        _source(api_client).snapshot(NOW)
    assert caught.value.problems == (
        "Deployment ml/serve: metadata.annotations.rebalancer.gpu/idle-since: expected a string, "
        "got the number 5",
    )


def test_list_controllers_gives_the_objects_for_a_snapshot_directory(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _workloads_cluster(api)
    source = _source(api_client)
    objects, findings = source.list_controllers(source.list_pods())
    assert findings == []
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] == "Deployment") == [
        ("Deployment", "llm-predictor"),
        ("Deployment", "serve"),
    ]
    assert all(o["apiVersion"] for o in objects)  # items of typed Lists get theirs back
    assert len(objects) == len(source.snapshot(NOW).controllers)


class _CollectorWatch(KubeSource):
    """Records whether the cyclic collector runs while the cluster is listed."""

    collector_ran: list[bool]

    def list_cluster(self, loaded: LoadedPolicy) -> ClusterObjects:
        self.collector_ran.append(gc.isenabled())
        return super().list_cluster(loaded)


def test_the_collector_is_paused_across_the_whole_snapshot(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Lists, model and the telemetry queries all run with the collector paused; it runs again after."""
    _cluster(api)
    during_telemetry: list[bool] = []

    def provider(now: datetime, pods: Mapping[tuple[str, str], Pod]) -> Telemetry:
        during_telemetry.append(gc.isenabled())
        return NO_TELEMETRY

    source = _CollectorWatch(api_client, LOADED, telemetry=provider, sleep=lambda seconds: None)
    source.collector_ran = []
    assert gc.isenabled()
    source.snapshot(NOW)
    assert (source.collector_ran, during_telemetry) == ([False], [False])
    assert gc.isenabled()


def test_the_collector_runs_again_after_a_failed_snapshot(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.inject("/api/v1/nodes", status=403, times=None, message="nodes is forbidden")
    source = _CollectorWatch(api_client, LOADED, sleep=lambda seconds: None)
    source.collector_ran = []
    with pytest.raises(KubeSourceError):
        source.snapshot(NOW)
    assert source.collector_ran == [False]
    assert gc.isenabled()
