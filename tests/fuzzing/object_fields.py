"""Semantic edits of kubectl objects: the fields of Pods, Nodes and PodDisruptionBudgets the rebalancer
reads (requests and limits, overhead, init containers, node name, spread constraints, affinity,
tolerations, priority, owners, labels and annotations, allocatable, taints, conditions, PDB budgets and
selectors), set to values that parse but are extreme, contradictory or of the wrong type.

Owns the pools of such values, finding the objects in a document, a List or a list of YAML documents,
and `semantic_edit`. This module must not read or write a file of a case: tests/fuzzing/objects.py picks
the file, decodes it and writes it back.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from tests.fuzzing.edits import _path_text, _show
from tests.fuzzing.layout import Json, JsonPath
from tests.fuzzing.values import QUANTITIES, TIMESTAMPS, _Raw

# --------------------------------------------------------------------------- semantic edits

RESOURCES = (
    "cpu",
    "memory",
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-1g.10gb",
    "nvidia.com/mig-3g.40gb",
    "gpu-rebalancer.io/gpu-milli",
    "ephemeral-storage",
    "pods",
    "hugepages-2Mi",
)
RESOURCE_VALUES: tuple[Json, ...] = (
    *QUANTITIES,
    "0",
    "1",
    "4",
    "8",
    "1000",
    "3",
    0,
    1,
    4,
    -1,
    1.5,
    None,
    [],
    {},
)
SELECTORS: tuple[Json, ...] = (
    None,
    {},
    {"matchLabels": {}},
    {"matchLabels": {"app.kubernetes.io/name": "llm-serve"}},
    {"matchLabels": {"app.kubernetes.io/name": None}},
    {"matchLabels": ["app.kubernetes.io/name"]},
    {"matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In", "values": []}]},
    {"matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "Exists", "values": ["x"]}]},
    {"matchExpressions": [{"key": "a", "operator": "Bogus"}]},
    {"matchExpressions": [{"key": "", "operator": "DoesNotExist"}]},
    {"matchExpressions": [{"operator": "In", "values": ["x"]}]},
    {"matchExpressions": {}},
    {"matchExpressions": [None]},
    "app=llm-serve",
)
SPREAD_VALUES: tuple[Json, ...] = (0, -1, 1, 2, 2**63, "1", None, 1.5, 10**30, True)
NODE_TERMS: tuple[Json, ...] = (
    [],
    [{}],
    [{"matchExpressions": []}],
    [{"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["abc"]}]}],
    [{"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["1e400"]}]}],
    [{"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Lt", "values": ["9" * 400]}]}],
    [{"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["1", "2"]}]}],
    [{"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": []}]}],
    [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": []}]}],
    [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": None}]}],
    [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "Bogus", "values": ["x"]}]}],
    [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "Exists", "values": ["x"]}]}],
    [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["l4-b-1"]}]}],
    [{"matchFields": [{"key": "metadata.uid", "operator": "Gt", "values": ["1"]}]}],
    [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": []}]}],
    [{"matchExpressions": [{"key": 5, "operator": "In", "values": [5]}]}],
    [None],
    {"matchExpressions": []},
)
PREFERRED_TERMS: tuple[Json, ...] = (
    [{"weight": 0, "preference": {"matchExpressions": []}}],
    [{"weight": -1, "preference": {}}],
    [
        {
            "weight": 101,
            "preference": {
                "matchExpressions": [
                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}
                ]
            },
        }
    ],
    [
        {
            "weight": 2**63,
            "preference": {
                "matchExpressions": [
                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
                ]
            },
        }
    ],
    [{"weight": "x"}],
    [{"preference": None}],
    [{}],
)
TOLERATIONS: tuple[Json, ...] = (
    [{"operator": "Exists"}],
    [{"key": "nvidia.com/gpu", "operator": "Equal"}],
    [{"key": "nvidia.com/gpu", "operator": "Bogus", "effect": "NoSchedule"}],
    [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "Bogus"}],
    [{"key": "nvidia.com/gpu", "operator": "Exists", "tolerationSeconds": -1}],
    [{"key": "nvidia.com/gpu", "operator": "Exists", "tolerationSeconds": 2**64}],
    [{"key": "nvidia.com/gpu", "operator": "Exists", "value": "x"}],
    [{"effect": "NoExecute"}],
    [None],
    {},
)
OWNERS: tuple[Json, ...] = (
    [],
    [{"kind": "DaemonSet", "name": "x", "controller": True, "apiVersion": "apps/v1"}],
    [
        {"kind": "ReplicaSet", "name": "a", "controller": True},
        {"kind": "Job", "name": "b", "controller": True},
    ],
    [{"kind": "ReplicaSet", "name": "a", "controller": "true"}],
    [{"kind": "Node", "name": "l4-a-1", "controller": True}],
    [{"kind": "", "name": "", "controller": True}],
    [{"controller": True}],
    [None],
)
TAINTS: tuple[Json, ...] = (
    [],
    [{"key": "rebalancer.gpu/draining", "effect": "NoSchedule", "value": "x"}],
    [{"key": "nvidia.com/gpu", "effect": "NoExecute"}],
    [{"key": "x", "effect": "Bogus"}],
    [{"effect": "NoSchedule"}],
    [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}],
    [None],
)
VOLUMES: tuple[Json, ...] = (
    [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1e400"}}],
    [{"name": "scratch", "emptyDir": {}}],
    [{"name": "scratch", "emptyDir": None}],
    [{"name": "h", "hostPath": None}],
    [{"name": "h", "hostPath": {"path": "/"}}],
    [{"name": "v"}],
    [{}],
    [{"name": "e", "ephemeral": {"volumeClaimTemplate": {}}}],
)
INIT_CONTAINERS: tuple[Json, ...] = (
    [{"name": "init", "resources": {"requests": {"nvidia.com/gpu": "8", "cpu": "1e400"}}}],
    [{"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
    [{"name": "sidecar", "restartPolicy": 5, "resources": {"requests": {"cpu": "-1"}}}],
    [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
    [{"name": "init", "resources": None}],
    [{}],
)
GPU_LABELS = (
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.replicas",
    "nvidia.com/mig.config",
    "topology.kubernetes.io/zone",
    "kubernetes.io/hostname",
    "node.kubernetes.io/instance-type",
)
LABEL_VALUES_OBJ: tuple[Json, ...] = (
    *QUANTITIES[:12],
    "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-L4",
    "us-east-1a",
    "us-east-1b",
    "us-east-1c",
    "a100-a-2",
    "",
    None,
    5,
)
ANNOTATIONS = (
    "rebalancer.gpu/evict",
    "rebalancer.gpu/checkpoint",
    "cluster-autoscaler.kubernetes.io/safe-to-evict",
    "karpenter.sh/do-not-disrupt",
    "cluster-autoscaler.kubernetes.io/scale-down-disabled",
    "kubernetes.io/config.mirror",
    "scheduling.x-k8s.io/pod-group",
)
FLAGS: tuple[Json, ...] = ("true", "false", "True", "yes", "", True, None, 1, "x" * 3000)
PDB_NUMBERS: tuple[Json, ...] = (
    0,
    -1,
    1,
    4,
    "150%",
    "-10%",
    "abc",
    "1e400%",
    "50%",
    "0%",
    "100%",
    2**63,
    None,
    1.5,
    "",
    "%",
)


def _object_kind(obj: Mapping[str, Any], list_kind: str | None) -> str | None:
    kind = obj.get("kind")
    if isinstance(kind, str) and kind in ("Pod", "Node", "PodDisruptionBudget"):
        return kind
    if list_kind and list_kind.endswith("List") and list_kind != "List":
        return list_kind.removesuffix("List")
    return None


def _objects_of(doc: Json) -> list[tuple[dict[str, Any], str]]:
    """The Pod, Node and PDB mappings in a document, a List, or a list of YAML documents."""
    found: list[tuple[dict[str, Any], str]] = []
    stack: list[tuple[Json, str | None]] = [(doc, None)]
    while stack:
        value, list_kind = stack.pop()
        if isinstance(value, list):
            stack.extend((item, list_kind) for item in reversed(value))
        elif isinstance(value, dict):
            items = value.get("items")
            own = value.get("kind")
            if isinstance(items, list) and isinstance(own, str) and own.endswith("List"):
                stack.extend((item, own) for item in reversed(items))
                continue
            kind = _object_kind(value, list_kind)
            if kind is not None:
                found.append((value, kind))
    return found


def _set(obj: dict[str, Any], path: JsonPath, value: Json) -> None:
    """Set `obj[path]`, creating mappings (and one-item lists for index 0) on the way."""
    node: Any = obj
    for part, following in itertools.pairwise(path):
        fresh: Json = [{}] if isinstance(following, int) else {}
        if isinstance(part, int):
            if not isinstance(node, list):
                return
            while len(node) <= part:
                node.append(copy.deepcopy(fresh[0]) if isinstance(fresh, list) else {})
            if not isinstance(node[part], dict | list):
                node[part] = fresh
            node = node[part]
        else:
            if not isinstance(node, dict):
                return
            if not isinstance(node.get(part), dict | list):
                node[part] = fresh
            node = node[part]
    last = path[-1]
    if isinstance(last, int) and isinstance(node, list):
        while len(node) <= last:
            node.append(None)
        node[last] = value
    elif isinstance(last, str) and isinstance(node, dict):
        node[last] = value


@st.composite
def semantic_edit(draw: st.DrawFn, doc: Json, raw: _Raw) -> tuple[Json, str]:
    """An edit of a field the rebalancer reads (requests, allocatable, spread, affinity, PDB budgets...),
    with values that parse but are extreme, contradictory or of the wrong type."""
    objects = _objects_of(doc)
    if not objects:
        return doc, "no object to edit"
    obj, kind = objects[draw(st.integers(0, len(objects) - 1), label="object")]
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    field: JsonPath
    value: Json
    if kind == "Pod":
        which = draw(st.integers(0, 17), label="pod-field")
        if which <= 3:
            section = "requests" if which <= 2 else "limits"
            field = ("spec", "containers", 0, "resources", section, draw(st.sampled_from(RESOURCES)))
            value = draw(st.sampled_from(RESOURCE_VALUES))
        elif which == 4:
            field = ("spec", "overhead", draw(st.sampled_from(RESOURCES)))
            value = draw(st.sampled_from(RESOURCE_VALUES))
        elif which == 5:
            field, value = ("spec", "initContainers"), draw(st.sampled_from(INIT_CONTAINERS))
        elif which == 6:
            field = ("spec", "nodeName")
            value = draw(st.sampled_from(("", "ghost-node", None, 5, "a100-a-2", "l4-b-1", "h100-b-1")))
        elif which == 7:
            constraint = {
                "maxSkew": draw(st.sampled_from(SPREAD_VALUES)),
                "topologyKey": draw(
                    st.sampled_from(
                        ("topology.kubernetes.io/zone", "kubernetes.io/hostname", "", "missing/label", None)
                    )
                ),
                "whenUnsatisfiable": draw(st.sampled_from(("DoNotSchedule", "ScheduleAnyway", "", "x"))),
                "labelSelector": draw(st.sampled_from(SELECTORS)),
            }
            if draw(st.booleans()):
                constraint["minDomains"] = draw(st.sampled_from(SPREAD_VALUES))
            if draw(st.booleans()):
                constraint["matchLabelKeys"] = draw(st.sampled_from((["pod-template-hash"], [], None, [5])))
            field, value = ("spec", "topologySpreadConstraints"), [constraint]
        elif which == 8:
            field = (
                "spec",
                "affinity",
                "nodeAffinity",
                "requiredDuringSchedulingIgnoredDuringExecution",
                "nodeSelectorTerms",
            )
            value = draw(st.sampled_from(NODE_TERMS))
        elif which == 9:
            field = ("spec", "affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution")
            value = draw(st.sampled_from(PREFERRED_TERMS))
        elif which == 10:
            field, value = ("spec", "tolerations"), draw(st.sampled_from(TOLERATIONS))
        elif which == 11:
            field = (
                "spec",
                draw(st.sampled_from(("priority", "priorityClassName", "schedulerName", "nodeSelector"))),
            )
            value = draw(
                st.sampled_from(
                    (
                        2**31,
                        -(2**31),
                        2**63,
                        "system-node-critical",
                        "gpu-packed-scheduler",
                        "",
                        None,
                        {},
                        {"a": None},
                    )
                )
            )
        elif which == 12:
            field = ("metadata", draw(st.sampled_from(("creationTimestamp", "deletionTimestamp"))))
            value = draw(st.sampled_from(TIMESTAMPS))
        elif which == 13:
            field = ("status", draw(st.sampled_from(("phase", "startTime", "qosClass"))))
            value = draw(
                st.sampled_from(("Pending", "Succeeded", "Failed", "Unknown", "", 5, None, *TIMESTAMPS[:6]))
            )
        elif which == 14:
            field, value = ("metadata", "ownerReferences"), draw(st.sampled_from(OWNERS))
        elif which == 15:
            field = (
                "metadata",
                draw(st.sampled_from(("labels", "annotations"))),
                draw(st.sampled_from(ANNOTATIONS)),
            )
            value = draw(st.sampled_from((*FLAGS, "llm-finetune", "llm-serve")))
        elif which == 16:
            field, value = ("spec", "volumes"), draw(st.sampled_from(VOLUMES))
        else:
            field = ("metadata", draw(st.sampled_from(("name", "namespace"))))
            value = draw(
                st.sampled_from(
                    ("", "llm-serve-hlntxhwkcg-59dbk", "inference", "kube-system", "x" * 300, None, 5)
                )
            )
    elif kind == "Node":
        which = draw(st.integers(0, 7), label="node-field")
        if which <= 2:
            field = ("status", "allocatable" if which <= 1 else "capacity", draw(st.sampled_from(RESOURCES)))
            value = draw(st.sampled_from(RESOURCE_VALUES))
        elif which == 3:
            field = ("metadata", "labels", draw(st.sampled_from(GPU_LABELS)))
            value = draw(st.sampled_from(LABEL_VALUES_OBJ))
        elif which == 4:
            field, value = ("spec", "taints"), draw(st.sampled_from(TAINTS))
        elif which == 5:
            field = ("spec", "unschedulable")
            value = draw(st.sampled_from((True, "true", 1, None)))
        elif which == 6:
            field = ("status", "conditions")
            value = draw(
                st.sampled_from(
                    (
                        [],
                        [{"type": "Ready", "status": "False"}],
                        [{"type": "Ready", "status": True}],
                        [{"type": "Ready"}],
                        [None],
                    )
                )
            )
        else:
            field = ("metadata", draw(st.sampled_from(("creationTimestamp", "annotations"))))
            value = (
                draw(st.sampled_from(TIMESTAMPS))
                if field[1] == "creationTimestamp"
                else {draw(st.sampled_from(ANNOTATIONS)): draw(st.sampled_from(FLAGS))}
            )
    else:
        which = draw(st.integers(0, 3), label="pdb-field")
        if which <= 1:
            field = ("spec", draw(st.sampled_from(("minAvailable", "maxUnavailable"))))
            value = draw(st.sampled_from(PDB_NUMBERS))
        elif which == 2:
            field, value = ("spec", "selector"), draw(st.sampled_from(SELECTORS))
        else:
            field = (
                "status",
                draw(
                    st.sampled_from(
                        ("disruptionsAllowed", "currentHealthy", "desiredHealthy", "expectedPods")
                    )
                ),
            )
            value = draw(st.sampled_from(PDB_NUMBERS))
    value = copy.deepcopy(value)
    _set(obj, field, value)
    return doc, f"{kind} {name}: {_path_text(field)} = {_show(value, raw)}"
