"""Objects as the API server serves them, for tests to load into the fake API server, for tests only.

`node_json`, `pod_json`, `pdb_json` and `controller_json` build a Node, a Pod, a PodDisruptionBudget
(with its status) and a controller (ReplicaSet, Deployment, StatefulSet, Job, CronJob, JobSet,
LeaderWorkerSet, Notebook, InferenceService) as JSON, with defaults a test overrides only where it
matters; uids are derived from names, so a pod's ownerReference and its controller agree.
`add_consolidation_cluster` loads a small cluster whose first node a drain can empty.

This module must only build: what the server does with an object is the server's business, and a
builder never reaches into the server's state (it goes through `FakeApiServer.add`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tests.fake_api_kinds import BY_PATH, KINDS, JsonObj

if TYPE_CHECKING:
    from tests.fake_apiserver import FakeApiServer


def node_json(
    name: str,
    *,
    gpus: int = 8,
    model: str | None = "NVIDIA-A100-SXM4-80GB",
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
    ready: bool = True,
    cpu: str = "96",
    memory: str = "512Gi",
) -> JsonObj:
    """A v1 Node as the API server serves it."""
    all_labels = {"kubernetes.io/hostname": name}
    if model is not None:
        all_labels["nvidia.com/gpu.product"] = model
    all_labels.update(labels or {})
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    spec: JsonObj = {}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels, "creationTimestamp": "2026-10-30T12:00:00Z"},
        "spec": spec,
        "status": {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod_json(
    name: str,
    node: str | None = None,
    *,
    namespace: str = "ml",
    uid: str | None = None,
    gpus: int = 1,
    cpu: str = "4",
    memory: str = "16Gi",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner_kind: str | None = "ReplicaSet",
    owner_name: str = "trainer-abc",
    owner_api_version: str = "apps/v1",
    phase: str = "Running",
    ready: bool = True,
    scheduler_name: str = "gpu-packed-scheduler",
) -> JsonObj:
    """A v1 Pod as the API server serves it (controller ownerReference unless `owner_kind` is None)."""
    requests = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {}
    if gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(gpus)
    meta: JsonObj = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{namespace}-{name}",
        "labels": dict(labels if labels is not None else {"app": name}),
        "creationTimestamp": "2026-11-28T12:00:00Z",
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner_kind is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": owner_api_version,
                "kind": owner_kind,
                "name": owner_name,
                "uid": f"uid-owner-{owner_name}",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    spec: JsonObj = {
        "schedulerName": scheduler_name,
        "containers": [
            {"name": "main", "image": "trainer:1", "resources": {"requests": requests, "limits": limits}}
        ],
    }
    if node is not None:
        spec["nodeName"] = node
    status: JsonObj = {"phase": phase, "qosClass": "Burstable"}
    if node is not None and phase != "Pending":
        status["startTime"] = "2026-11-28T12:00:05Z"
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def pdb_json(
    name: str,
    match_labels: Mapping[str, str] | None,
    allowed: int,
    *,
    namespace: str = "ml",
    desired_healthy: int = 1,
    current_healthy: int | None = None,
) -> JsonObj:
    """A policy/v1 PodDisruptionBudget with its status (`match_labels` None: a null selector)."""
    spec: JsonObj = {"minAvailable": desired_healthy}
    if match_labels is not None:
        spec["selector"] = {"matchLabels": dict(match_labels)}
    healthy = current_healthy if current_healthy is not None else desired_healthy + allowed
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
        "spec": spec,
        "status": {
            "observedGeneration": 1,
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": desired_healthy,
            "expectedPods": healthy,
        },
    }


_CONTROLLER_KINDS = frozenset(
    {
        "ReplicaSet",
        "Deployment",
        "StatefulSet",
        "Job",
        "CronJob",
        "JobSet",
        "LeaderWorkerSet",
        "Notebook",
        "InferenceService",
    }
)


def _template(name: str, labels: Mapping[str, str]) -> JsonObj:
    return {
        "metadata": {"labels": dict(labels)},
        "spec": {
            "containers": [
                {"name": "main", "image": f"{name}:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]
        },
    }


def controller_json(
    kind: str,
    name: str,
    *,
    namespace: str = "ml",
    uid: str | None = None,
    owner: tuple[str, str] | None = None,
    owner_api_version: str | None = None,
    replicas: int | None = None,
    suspend: bool | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> JsonObj:
    """A controller as the API server serves it: ReplicaSet, Deployment, StatefulSet, Job, CronJob, JobSet,
    LeaderWorkerSet, Notebook or InferenceService, with a pod template selecting `app: name`.

    `uid` defaults to the one `pod_json` gives its owner (`uid-owner-<name>`), so a pod and its
    controller agree. `owner` is the (kind, name) of its own controller (a ReplicaSet's Deployment, a
    LeaderWorkerSet worker StatefulSet's leader `Pod`), its apiVersion looked up unless given.
    `replicas` (scalable kinds; the API's default is 1) and `suspend` (Job, JobSet) are left out when
    None."""
    api = {k.kind: k for k in KINDS if k.group} | {"Pod": BY_PATH[("", "v1", "pods")]}
    if kind not in _CONTROLLER_KINDS:
        raise ValueError(f"not a controller kind of the fake: {kind}")
    selector = {"app": name}
    spec: JsonObj
    status: JsonObj = {}
    if kind in ("ReplicaSet", "Deployment", "StatefulSet"):
        spec = {"selector": {"matchLabels": selector}, "template": _template(name, selector)}
        if kind == "StatefulSet":
            spec["serviceName"] = name
        status = {"replicas": 1 if replicas is None else replicas}
    elif kind == "Job":
        job_template = _template(name, selector)
        job_template["spec"]["restartPolicy"] = "Never"
        spec = {"template": job_template}
    elif kind == "CronJob":
        job_template = _template(name, selector)
        job_template["spec"]["restartPolicy"] = "Never"
        spec = {"schedule": "0 2 * * *", "jobTemplate": {"spec": {"template": job_template}}}
    elif kind == "JobSet":
        job_template = _template(name, selector)
        job_template["spec"]["restartPolicy"] = "Never"
        spec = {
            "replicatedJobs": [
                {"name": "workers", "replicas": 1, "template": {"spec": {"template": job_template}}}
            ]
        }
    elif kind == "LeaderWorkerSet":
        spec = {"leaderWorkerTemplate": {"size": 2, "workerTemplate": _template(name, selector)}}
        status = {
            "replicas": 1 if replicas is None else replicas,
            "hpaPodSelector": f"leaderworkerset.sigs.k8s.io/name={name},"
            "leaderworkerset.sigs.k8s.io/worker-index=0",
        }
    elif kind == "Notebook":
        spec = {"template": {"spec": _template(name, selector)["spec"]}}
    else:  # InferenceService
        spec = {
            "predictor": {"model": {"modelFormat": {"name": "huggingface"}, "storageUri": f"pvc://{name}"}}
        }
    if replicas is not None:
        spec["replicas"] = replicas
    if suspend is not None:
        spec["suspend"] = suspend
    meta: JsonObj = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-owner-{name}",
        "labels": dict(labels if labels is not None else selector),
        "creationTimestamp": "2026-11-28T11:59:00Z",
        "generation": 1,
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner is not None:
        owner_kind, owner_name = owner
        version = owner_api_version or (api[owner_kind].api_version if owner_kind in api else None)
        if version is None:
            raise ValueError(f"owner kind {owner_kind} unknown to the fake: give owner_api_version")
        meta["ownerReferences"] = [
            {
                "apiVersion": version,
                "kind": owner_kind,
                "name": owner_name,
                "uid": f"uid-owner-{owner_name}" if owner_kind != "Pod" else f"uid-{namespace}-{owner_name}",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {
        "apiVersion": api[kind].api_version,
        "kind": kind,
        "metadata": meta,
        "spec": spec,
        "status": status,
    }


def add_consolidation_cluster(api: FakeApiServer) -> None:
    """a-1 holds four 1-GPU pods (50 %); a-2 (5/8) and a-3 (6/8) have room for them: a drain of a-1."""
    for name in ("a-1", "a-2", "a-3"):
        api.add(node_json(name))
    for index in range(4):
        api.add(pod_json(f"x{index}", "a-1"))
    api.add(pod_json("busy-2", "a-2", gpus=5))
    api.add(pod_json("busy-3", "a-3", gpus=6))
