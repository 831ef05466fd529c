"""Raw Kubernetes JSON -> model: quantities, effective requests, GPU use, scheduling fields, errors."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import pytest

from rebalancer.model import (
    Controller,
    GpuRequest,
    LabelRequirement,
    LabelSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    OwnerRef,
    PreferredTerm,
    Taint,
    Toleration,
    Volume,
)
from rebalancer.policy import GangConfig, GpuSharingConfig, SharedGpuResource
from rebalancer.sources.kube_objects import (
    MATCH_NOTHING,
    controller_from_json,
    node_from_json,
    pdb_from_json,
)
from rebalancer.sources.kube_pods import pod_from_json
from rebalancer.sources.object_fields import ObjectError

GIB = 1024**3
GANGS = GangConfig()
SHARING = GpuSharingConfig()

NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "gpu-a-1",
        "creationTimestamp": "2026-10-01T08:00:00Z",
        "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "topology.kubernetes.io/zone": "z1"},
        "annotations": {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "false"},
    },
    "spec": {
        "taints": [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "dedicated", "effect": "PreferNoSchedule"},
        ],
        "unschedulable": True,
    },
    "status": {
        "capacity": {"cpu": "96", "memory": "1056Gi", "nvidia.com/gpu": "8"},
        "allocatable": {
            "cpu": "95500m",
            "memory": "1031194636Ki",
            "ephemeral-storage": "100Gi",
            "hugepages-2Mi": "0",
            "nvidia.com/gpu": "8",
            "nvidia.com/mig-1g.10gb": "7",
            "pods": "110",
        },
        "conditions": [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": "True"},
        ],
    },
}


def _pod(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train-0", "namespace": "ml", "uid": "u-1"},
        "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Running"},
    }
    body["spec"].update(spec)
    return body


# --------------------------------------------------------------------------- nodes


def test_node_fields_and_quantities() -> None:
    node = node_from_json(NODE)
    assert node.name == "gpu-a-1"
    assert node.allocatable == {
        "cpu": 95_500,
        "memory": 1031194636 * 1024,
        "ephemeral-storage": 100 * GIB,
        "hugepages-2Mi": 0,
        "nvidia.com/gpu": 8,
        "nvidia.com/mig-1g.10gb": 7,
        "pods": 110,
    }
    assert node.gpu_model == "NVIDIA-A100-SXM4-80GB"
    assert node.annotations == {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "false"}
    assert node.taints == (
        Taint("nvidia.com/gpu", "present", "NoSchedule"),
        Taint("dedicated", "", "PreferNoSchedule"),
    )
    assert node.unschedulable is True
    assert node.ready is True
    assert node.created == datetime(2026, 10, 1, 8, 0, tzinfo=UTC)


def test_node_without_allocatable_uses_capacity_and_rounds_cpu_up() -> None:
    obj = copy.deepcopy(NODE)
    del obj["status"]["allocatable"]
    obj["status"]["capacity"]["cpu"] = "0.0001"
    assert node_from_json(obj).allocatable == {"cpu": 1, "memory": 1056 * GIB, "nvidia.com/gpu": 8}


@pytest.mark.parametrize(
    ("conditions", "ready"),
    [
        ([{"type": "Ready", "status": "False"}], False),
        ([{"type": "Ready", "status": "Unknown"}], False),
        ([], False),  # no Ready condition reported yet: not ready
        ([{"type": "Ready", "status": "True"}], True),
    ],
)
def test_node_ready_condition(conditions: list[dict[str, str]], ready: bool) -> None:
    obj = copy.deepcopy(NODE)
    obj["status"]["conditions"] = conditions
    assert node_from_json(obj).ready is ready


def test_node_bad_quantity_names_field() -> None:
    obj = copy.deepcopy(NODE)
    obj["status"]["allocatable"]["memory"] = "lots"
    with pytest.raises(ObjectError) as info:
        node_from_json(obj)
    assert str(info.value) == 'Node gpu-a-1: status.allocatable.memory: invalid quantity "lots"'
    assert info.value.field_path == "status.allocatable.memory"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o["metadata"].pop("name"), "Node <unnamed>: metadata.name: required field is missing"),
        (
            lambda o: o["metadata"].update(labels={"a": 1}),
            "Node gpu-a-1: metadata.labels.a: expected a string, got the number 1",
        ),
        (lambda o: o["spec"].update(taints={}), "Node gpu-a-1: spec.taints: expected a list, got an object"),
        (
            lambda o: o["spec"]["taints"].append({"key": "x"}),
            "Node gpu-a-1: spec.taints[2].effect: required field is missing",
        ),
        (
            lambda o: o["metadata"].update(creationTimestamp="yesterday"),
            "Node gpu-a-1: metadata.creationTimestamp: invalid timestamp 'yesterday' (expected RFC 3339, "
            "e.g. 2026-11-29T12:00:00Z)",
        ),
        (
            lambda o: o["status"]["allocatable"].update(cpu="NaN"),
            'Node gpu-a-1: status.allocatable.cpu: invalid quantity "NaN"',
        ),
        (
            lambda o: o["status"]["allocatable"].update(cpu="-2"),
            'Node gpu-a-1: status.allocatable.cpu: quantity "-2" is negative',
        ),
        (
            lambda o: o["status"]["allocatable"].update(cpu=True),
            "Node gpu-a-1: status.allocatable.cpu: expected a quantity such as 500m, 2 or 4Gi, got a boolean",
        ),
    ],
)
def test_node_malformed(mutate: Any, message: str) -> None:
    obj = copy.deepcopy(NODE)
    mutate(obj)
    with pytest.raises(ObjectError) as info:
        node_from_json(obj)
    assert str(info.value) == message


def test_timestamp_without_timezone_is_an_error() -> None:
    obj = copy.deepcopy(NODE)
    obj["metadata"]["creationTimestamp"] = "2026-10-01T08:00:00"
    with pytest.raises(ObjectError, match="has no timezone"):
        node_from_json(obj)


# --------------------------------------------------------------------------- pods

FULL_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "train-0",
        "namespace": "ml",
        "uid": "5f1d",
        "creationTimestamp": "2026-11-28T10:00:00Z",
        "labels": {"app": "train", "volcano.sh/job-name": "job-a", "rev": "7"},
        "annotations": {"scheduling.k8s.io/group-name": "ignored-because-label-wins"},
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "not-controller"},
            {"apiVersion": "batch/v1", "kind": "Job", "name": "job-a", "controller": True},
        ],
    },
    "spec": {
        "nodeName": "gpu-a-1",
        "schedulerName": "gpu-packed-scheduler",
        "priority": 1000,
        "priorityClassName": "batch-high",
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40000"]}
                            ]
                        },
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-b-1"]}]},
                    ]
                },
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 50,
                        "preference": {
                            "matchExpressions": [
                                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}
                            ]
                        },
                    }
                ],
            }
        },
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute", "tolerationSeconds": 300},
        ],
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {
                    "matchLabels": {"app": "train"},
                    "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["web"]}],
                },
                "matchLabelKeys": ["rev", "not-on-pod"],
                "minDomains": 2,
            }
        ],
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "host", "hostPath": {"path": "/var/lib/x"}},
        ],
        "initContainers": [
            {"name": "fetch", "resources": {"requests": {"cpu": "6", "memory": "2Gi"}}},
            {
                "name": "proxy",
                "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}},
            },
        ],
        "containers": [
            {
                "name": "trainer",
                "resources": {
                    "requests": {"cpu": "4", "memory": "16Gi"},
                    "limits": {"nvidia.com/gpu": "2", "memory": "16Gi"},
                },
            },
            {"name": "logger", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
        ],
        "overhead": {"cpu": "250m", "memory": "120Mi"},
    },
    "status": {"phase": "Running", "qosClass": "Burstable", "startTime": "2026-11-28T10:01:00Z"},
}


def test_full_pod() -> None:
    pod = pod_from_json(FULL_POD, gangs=GANGS, sharing=SHARING)
    assert pod.key == ("ml", "train-0")
    assert pod.uid == "5f1d"
    assert pod.node_name == "gpu-a-1"
    assert (pod.phase, pod.scheduler_name, pod.priority, pod.priority_class_name, pod.qos_class) == (
        "Running",
        "gpu-packed-scheduler",
        1000,
        "batch-high",
        "Burstable",
    )
    # cpu: containers 4 + 0.1, sidecar 0.5 -> 4.6; init peak: fetch 6 alone (no sidecar before it) -> 6;
    # max 6 + overhead 0.25. memory: 16Gi + 64Mi + 256Mi vs 2Gi -> 16Gi + 320Mi, + 120Mi overhead.
    assert pod.requests == {
        "cpu": 6250,
        "memory": 16 * GIB + 440 * 1024**2,
        "nvidia.com/gpu": 2,  # from the limit: requests default to limits
    }
    assert pod.gpu == GpuRequest(count=2, milli_per_device=1000)
    assert pod.owner == OwnerRef(kind="Job", name="job-a", api_version="batch/v1", controller=True)
    assert pod.gang == "ml/job-a"
    assert pod.volumes == (
        Volume("shm", "emptyDir", "Memory"),
        Volume("scratch", "emptyDir", ""),
        Volume("data", "persistentVolumeClaim"),
        Volume("host", "hostPath"),
    )
    assert pod.node_selector == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert pod.required_affinity == (
        NodeSelectorTerm(
            match_expressions=(NodeSelectorRequirement("nvidia.com/gpu.memory", "Gt", ("40000",)),)
        ),
        NodeSelectorTerm(match_fields=(NodeSelectorRequirement("metadata.name", "In", ("gpu-b-1",)),)),
    )
    assert pod.preferred_affinity == (
        PreferredTerm(
            50,
            NodeSelectorTerm(
                match_expressions=(NodeSelectorRequirement("topology.kubernetes.io/zone", "In", ("z1",)),)
            ),
        ),
    )
    assert pod.tolerations == (
        Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"),
        Toleration("node.kubernetes.io/not-ready", "Equal", "", "NoExecute"),
    )
    (spread,) = pod.topology_spread
    assert (spread.max_skew, spread.topology_key, spread.when_unsatisfiable, spread.min_domains) == (
        1,
        "kubernetes.io/hostname",
        "ScheduleAnyway",
        2,
    )
    assert spread.label_selector == LabelSelector(
        match_labels={"app": "train", "rev": "7"},
        match_expressions=(LabelRequirement("tier", "NotIn", ("web",)),),
    )
    assert pod.created == datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
    assert pod.started == datetime(2026, 11, 28, 10, 1, tzinfo=UTC)
    assert pod.uses_gpu


def _frozen(value: Any) -> Any:
    """The same JSON with every object a read-only mapping that is not a dict."""
    if isinstance(value, dict):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_frozen(v) for v in value]
    return value


def test_objects_that_are_mappings_but_not_dicts_give_the_same_pod() -> None:
    # The field reader tests for dict first; any other Mapping must still be read, not refused.
    assert pod_from_json(_frozen(FULL_POD), gangs=GANGS, sharing=SHARING) == pod_from_json(
        FULL_POD, gangs=GANGS, sharing=SHARING
    )


def test_sidecar_counts_during_later_init_containers() -> None:
    pod = pod_from_json(
        _pod(
            initContainers=[
                {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                {"name": "init", "resources": {"requests": {"cpu": "3"}}},
            ],
            containers=[{"name": "main", "resources": {"requests": {"cpu": "2"}}}],
        ),
        gangs=GANGS,
        sharing=SHARING,
    )
    # regular: 2 + sidecar 1 = 3; init phase: sidecar 1 + init 3 = 4 -> 4 cpus.
    assert pod.requests == {"cpu": 4000}


def test_init_container_max_beats_sum() -> None:
    pod = pod_from_json(
        _pod(
            initContainers=[
                {"name": "a", "resources": {"requests": {"memory": "8Gi"}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/gpu": 1}}},
            ],
            containers=[
                {"name": "x", "resources": {"requests": {"memory": "3Gi"}}},
                {"name": "y", "resources": {"requests": {"memory": "2Gi"}}},
            ],
        ),
        gangs=GANGS,
        sharing=SHARING,
    )
    assert pod.requests == {"memory": 8 * GIB, "nvidia.com/gpu": 1}
    assert pod.gpu == GpuRequest(1, 1000)


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({"nvidia.com/gpu.shared": "2"}, GpuRequest(1, 500)),
        ({"nvidia.com/gpu.shared": "8"}, GpuRequest(1, 1000)),  # capped at one device
        ({"gpu-rebalancer.io/gpu-milli": "460"}, GpuRequest(1, 460)),
        ({"nvidia.com/mig-1g.10gb": "1"}, GpuRequest()),
        ({}, GpuRequest()),
    ],
)
def test_gpu_shares(resources: dict[str, str], expected: GpuRequest) -> None:
    obj = _pod(containers=[{"name": "m", "resources": {"limits": resources}}])
    pod = pod_from_json(obj, gangs=GANGS, sharing=SHARING)
    assert pod.gpu == expected
    assert pod.uses_gpu is bool(resources)


def test_time_sliced_nvidia_gpu_configured_as_share() -> None:
    sharing = GpuSharingConfig(resources={"nvidia.com/gpu": SharedGpuResource(milli_per_unit=250)})
    obj = _pod(containers=[{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1"}}}])
    assert pod_from_json(obj, gangs=GANGS, sharing=sharing).gpu == GpuRequest(1, 250)


def test_pod_defaults_and_derived_qos() -> None:
    obj = _pod(
        containers=[
            {"name": "m", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}},
        ]
    )
    del obj["status"]
    pod = pod_from_json(obj, gangs=GANGS, sharing=SHARING)
    assert pod.phase == "Pending"
    assert pod.qos_class == "Guaranteed"
    assert pod.scheduler_name == "default-scheduler"
    assert pod.owner is None
    assert pod.gang is None
    assert pod.node_name is None
    assert pod.requests == {"cpu": 2000, "memory": GIB}

    best_effort = _pod(containers=[{"name": "m"}])
    del best_effort["status"]
    assert pod_from_json(best_effort, gangs=GANGS, sharing=SHARING).qos_class == "BestEffort"
    burstable = _pod()
    del burstable["status"]
    assert pod_from_json(burstable, gangs=GANGS, sharing=SHARING).qos_class == "Burstable"


def test_gang_from_annotation_and_custom_keys() -> None:
    obj = _pod()
    obj["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "g1"}
    obj["metadata"]["labels"] = {"volcano.sh/job-name": ""}  # empty values do not name a gang
    assert pod_from_json(obj, gangs=GANGS, sharing=SHARING).gang == "ml/g1"
    custom = GangConfig(keys=("example.com/gang",))
    assert pod_from_json(obj, gangs=custom, sharing=SHARING).gang is None


def test_pod_bad_quantity_message() -> None:
    obj = _pod(containers=[{"name": "main", "resources": {"requests": {"cpu": "abc"}}}])
    with pytest.raises(ObjectError) as info:
        pod_from_json(obj, gangs=GANGS, sharing=SHARING)
    assert (
        str(info.value) == 'Pod ml/train-0: spec.containers[0].resources.requests.cpu: invalid quantity "abc"'
    )
    assert (info.value.kind, info.value.name) == ("Pod", "ml/train-0")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"containers": "x"}, "spec.containers: expected a list, got the string 'x'"),
        ({"containers": [3]}, "spec.containers[0]: expected an object, got the number 3"),
        ({"priority": "high"}, "spec.priority: expected an integer, got the string 'high'"),
        (
            {"topologySpreadConstraints": [{"topologyKey": "zone"}]},
            "spec.topologySpreadConstraints[0].maxSkew: required field is missing",
        ),
        (
            {"tolerations": [{"key": 5}]},
            "spec.tolerations[0].key: expected a string, got the number 5",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"preference": {}}]}
                }
            },
            "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight: "
            "required field is missing",
        ),
        (
            {"overhead": {"memory": "1Zi"}},
            'spec.overhead.memory: invalid quantity "1Zi"',
        ),
    ],
)
def test_pod_malformed(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ObjectError) as info:
        pod_from_json(_pod(**spec), gangs=GANGS, sharing=SHARING)
    assert str(info.value) == f"Pod ml/train-0: {message}"


def test_not_an_object() -> None:
    with pytest.raises(ObjectError, match="expected an object, got a list"):
        pod_from_json([], gangs=GANGS, sharing=SHARING)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- PDBs


def test_pdb() -> None:
    pdb = pdb_from_json(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "train"}}},
            "status": {"disruptionsAllowed": 1, "currentHealthy": 3},
        }
    )
    assert pdb.key == ("ml", "train")
    assert pdb.selector == LabelSelector(match_labels={"app": "train"})
    assert pdb.disruptions_allowed == 1


def test_pdb_without_status_allows_nothing_and_selectors() -> None:
    base = {"kind": "PodDisruptionBudget", "metadata": {"name": "p", "namespace": "ml"}}
    no_status = pdb_from_json({**base, "spec": {"selector": {}}})
    assert no_status.disruptions_allowed == 0
    assert no_status.selector == LabelSelector()  # empty selector: every pod of the namespace
    null_selector = pdb_from_json({**base, "spec": {}})
    assert null_selector.selector == MATCH_NOTHING  # policy/v1: a null selector matches no pods
    with pytest.raises(
        ObjectError, match=r"PodDisruptionBudget ml/p: status.disruptionsAllowed: expected an integer"
    ):
        pdb_from_json({**base, "spec": {}, "status": {"disruptionsAllowed": "1"}})


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Bogus"}]}]
                        }
                    }
                }
            },
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
            "nodeSelectorTerms[0].matchExpressions[0].operator",
        ),
        (
            {
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}}
                ]
            },
            "spec.topologySpreadConstraints[0].labelSelector.matchExpressions[0].operator",
        ),
    ],
)
def test_an_unknown_selector_operator_is_refused_as_the_api_server_does(
    spec: dict[str, Any], path: str
) -> None:
    """It used to be taken, and the pod then silently matched no node."""
    with pytest.raises(ObjectError) as info:
        pod_from_json(_pod(**spec), gangs=GANGS, sharing=SHARING)
    assert info.value.field_path == path
    assert "is not an operator" in info.value.message


# --------------------------------------------------------------------------- controllers


def _controller(kind: str, api_version: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": "serve-5f",
            "namespace": "ml",
            "uid": "u-rs",
            "resourceVersion": "8812",
            "labels": {"app": "serve"},
            "annotations": {"rebalancer.gpu/idle-since": "2026-11-29T07:00:00Z"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "not-it", "uid": "u-cm"},
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": "serve",
                    "uid": "u-d",
                    "controller": True,
                },
            ],
        },
        "spec": spec,
    }


def test_a_controller_with_its_own_controller() -> None:
    got = controller_from_json(_controller("ReplicaSet", "apps/v1", replicas=3))
    assert got == Controller(
        namespace="ml",
        kind="ReplicaSet",
        name="serve-5f",
        api_version="apps/v1",
        uid="u-rs",
        resource_version="8812",
        labels={"app": "serve"},
        annotations={"rebalancer.gpu/idle-since": "2026-11-29T07:00:00Z"},
        owner=OwnerRef(kind="Deployment", name="serve", api_version="apps/v1"),
        replicas=3,
        suspended=None,
    )
    assert got.key == ("ml", "ReplicaSet", "serve-5f")


@pytest.mark.parametrize(
    ("kind", "api_version", "spec", "replicas", "suspended"),
    [
        ("Deployment", "apps/v1", {}, 1, None),  # the API server defaults an absent spec.replicas to 1
        ("StatefulSet", "apps/v1", {"replicas": 0}, 0, None),
        ("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", {"replicas": 2}, 2, None),
        ("Job", "batch/v1", {}, None, False),
        ("Job", "batch/v1", {"suspend": True}, None, True),
        ("JobSet", "jobset.x-k8s.io/v1alpha2", {"suspend": False}, None, False),
        ("Notebook", "kubeflow.org/v1", {"replicas": 4}, None, None),
        ("InferenceService", "serving.kserve.io/v1beta1", {}, None, None),
        ("CronJob", "batch/v1", {"suspend": True}, None, None),
        ("RayCluster", "ray.io/v1", {"suspend": True}, None, None),
    ],
)
def test_replicas_and_suspension_by_kind(
    kind: str, api_version: str, spec: dict[str, Any], replicas: int | None, suspended: bool | None
) -> None:
    got = controller_from_json(_controller(kind, api_version, **spec))
    assert (got.kind, got.api_version, got.replicas, got.suspended) == (
        kind,
        api_version,
        replicas,
        suspended,
    )


def test_a_controller_without_owner_or_apiversion() -> None:
    body = _controller("StatefulSet", "apps/v1")
    del body["apiVersion"]  # an item of a typed List (StatefulSetList) carries no TypeMeta
    body["metadata"]["ownerReferences"] = []
    got = controller_from_json(body)
    assert got.api_version == "apps/v1" and got.owner is None
    del body["metadata"]["namespace"]
    assert controller_from_json({**body, "kind": "RayCluster"}).api_version == ""
    assert controller_from_json(body).namespace == "default"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda o: o["spec"].update(replicas="3"),
            "ReplicaSet ml/serve-5f: spec.replicas: expected an integer, got the string '3'",
        ),
        (
            lambda o: o["spec"].update(replicas=-1),
            'ReplicaSet ml/serve-5f: spec.replicas: "-1" is not a number of replicas '
            "(a whole number, 0 or more)",
        ),
        (
            lambda o: o["metadata"]["annotations"].update(x=1),
            "ReplicaSet ml/serve-5f: metadata.annotations.x: expected a string, got the number 1",
        ),
        (
            lambda o: o["metadata"]["ownerReferences"][1].update(controller="yes"),
            "ReplicaSet ml/serve-5f: metadata.ownerReferences[1].controller: "
            "expected true or false, got the string 'yes'",
        ),
        (
            lambda o: o["metadata"].pop("name"),
            "ReplicaSet ml/<unnamed>: metadata.name: required field is missing",
        ),
        (lambda o: o.pop("kind"), "Controller ml/serve-5f: kind: required field is missing"),
        (lambda o: o.update(kind=7), "Controller ml/serve-5f: kind: expected a string"),
    ],
)
def test_a_malformed_controller_names_the_field(mutate: Any, message: str) -> None:
    body = _controller("ReplicaSet", "apps/v1", replicas=3)
    mutate(body)
    with pytest.raises(ObjectError) as info:
        controller_from_json(body)
    assert str(info.value) == message


def test_a_job_with_a_bad_suspend_is_refused() -> None:
    with pytest.raises(ObjectError, match=r"Job ml/serve-5f: spec.suspend: expected true or false"):
        controller_from_json(_controller("Job", "batch/v1", suspend="true"))


def test_a_quantity_seen_valid_for_one_resource_is_still_checked_for_another() -> None:
    """Quantities that passed are remembered by resource and spelling; another resource, or the same
    number spelt as a string, goes through every check again."""
    cpu = _pod(containers=[{"name": "main", "resources": {"requests": {"cpu": "1.5"}}}])
    assert pod_from_json(cpu, gangs=GangConfig(), sharing=GpuSharingConfig()).requests["cpu"] == 1500
    gpu = _pod(containers=[{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1.5"}}}])
    for _ in range(2):  # refused every time, never remembered
        with pytest.raises(ObjectError, match="must be an integer"):
            pod_from_json(gpu, gangs=GangConfig(), sharing=GpuSharingConfig())
    spelt = _pod(containers=[{"name": "main", "resources": {"requests": {"cpu": 2, "memory": "2"}}}])
    requests = pod_from_json(spelt, gangs=GangConfig(), sharing=GpuSharingConfig()).requests
    assert (requests["cpu"], requests["memory"]) == (2000, 2)
