"""Kubernetes objects (as `kubectl get -o json` prints them, as the API lists them) -> domain model objects.

Owns the translation of Nodes, PodDisruptionBudgets and controller objects (ReplicaSet, Deployment,
StatefulSet, Job, JobSet, LeaderWorkerSet, Notebook, InferenceService, any other kind) into
`rebalancer.model` types: a node's allocatable (resource quantities in model units), taints, readiness
and GPU count label; a budget's selector and allowed disruptions; a controller's identity, labels and
annotations, its own controller, and the replicas or suspension a reclaim changes. Pods are
`kube_pods`' to translate, the parts several kinds share (label selectors, owner references) and the
remembered translations `kube_object_parts`'. Its entry points for an object of any kind take its JSON
bytes (`model_from_bytes`: decoded straight into its Struct, and read untyped only when msgspec refuses
it, to name the problem), a Struct (`model_of`) or a decoded mapping (`model_from_json`); each kind's
own take a Struct (`node_model`...) or a decoded mapping (`node_from_json`...). The snapshot-directory
source, the live lists and the watch cache all go through it, so they agree exactly. `split_unbound`
leaves out the pods bound to nodes a source did not see.

It must not do I/O, read the clock or build kubernetes client model objects (too slow for large
clusters): Structs or plain dicts in, frozen model objects out. JSON types are `kube_types`' to check,
the rest (required fields, quantities, operators, timestamps) `object_fields`'; anything malformed
raises `ObjectError`, naming the object and the field path; it never guesses a value that could make
an eviction look safe.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from typing import Any

import msgspec

from rebalancer.digits import is_ascii_digits
from rebalancer.model import (
    Controller,
    Finding,
    LabelRequirement,
    LabelSelector,
    Node,
    Pdb,
    Pod,
    Taint,
)
from rebalancer.policy import GangConfig, GpuSharingConfig
from rebalancer.sources import kube_types as kt
from rebalancer.sources.kube_object_parts import NO_META, controller_owner, label_selector
from rebalancer.sources.kube_pods import pod_from_json, pod_model
from rebalancer.sources.object_fields import (
    GPU_COUNT_LABEL,
    MAX_GPU_DEVICES,
    FieldReader,
    ObjectError,
    checked_units,
    quote_value,
    resource_list,
    type_name,
)
from rebalancer.workloads import KINDS

# policy/v1: "A null selector will match no pods, while an empty ({}) selector will select all pods".
# `In` with no values can never hold, so this selector matches nothing under every matcher.
MATCH_NOTHING = LabelSelector(match_expressions=(LabelRequirement(key="", operator="In", values=()),))

__all__ = [
    "MATCH_NOTHING",
    "REPLICATED_KINDS",
    "SUSPENDABLE_KINDS",
    "Model",
    "controller_from_json",
    "controller_model",
    "model_from_bytes",
    "model_from_json",
    "model_of",
    "node_from_json",
    "node_model",
    "pdb_from_json",
    "pdb_model",
    "split_unbound",
]

# Controller kinds whose `spec.replicas` a reclaim scales (the API defaults an absent one to 1), and
# those whose `spec.suspend` it sets (absent: not suspended).
REPLICATED_KINDS = frozenset({"ReplicaSet", "Deployment", "StatefulSet", "LeaderWorkerSet"})
SUSPENDABLE_KINDS = frozenset({"Job", "JobSet"})


# --------------------------------------------------------------------------- nodes


def node_from_json(obj: Mapping[str, Any]) -> Node:
    """A v1 Node mapping -> Node (see `node_model`)."""
    return node_model(kt.convert(kt.NodeObject, obj, "Node", namespaced=False))


def node_model(obj: kt.NodeObject) -> Node:
    """A v1 Node -> Node. Allocatable falls back to capacity; no Ready=True condition means not ready."""
    meta = obj.metadata or NO_META
    reader = FieldReader("Node", kt.object_name("Node", meta, namespaced=False))
    spec = obj.spec or _NO_NODE_SPEC
    status = obj.status or _NO_NODE_STATUS
    key = "allocatable" if status.allocatable is not None else "capacity"
    amounts = status.allocatable if status.allocatable is not None else status.capacity
    allocatable = checked_units(reader, resource_list(reader, amounts, f"status.{key}"), f"status.{key}")

    taints: list[Taint] = []
    for index, entry in enumerate(spec.taints or ()):
        if not entry.key or not entry.effect:
            missing = "key" if not entry.key else "effect"
            raise reader.error(f"spec.taints[{index}].{missing}", "required field is missing")
        taints.append(Taint(key=entry.key, value=entry.value or "", effect=entry.effect))

    ready = False
    for cond in status.conditions or ():
        if cond.type == "Ready":
            ready = cond.status == "True"

    labels = meta.labels or {}
    count = labels.get(GPU_COUNT_LABEL)
    if count is not None and not (
        is_ascii_digits(count) and len(count) <= 5 and int(count) <= MAX_GPU_DEVICES
    ):
        raise reader.error(
            f"metadata.labels.{GPU_COUNT_LABEL}",
            f"{quote_value(count)} is not a GPU count (a whole number from 0 to {MAX_GPU_DEVICES})",
        )
    return Node(
        name=reader.name,
        labels=labels,
        annotations=meta.annotations or {},
        allocatable=allocatable,
        taints=tuple(taints),
        unschedulable=bool(spec.unschedulable),
        created=reader.timestamp(meta.creation_timestamp, "metadata.creationTimestamp"),
        ready=ready,
    )


_NO_NODE_SPEC = kt.NodeSpec()
_NO_NODE_STATUS = kt.NodeStatus()


# --------------------------------------------------------------------------- PDBs


def pdb_from_json(obj: Mapping[str, Any]) -> Pdb:
    """A policy/v1 PodDisruptionBudget mapping -> Pdb (see `pdb_model`)."""
    return pdb_model(kt.convert(kt.PdbObject, obj, "PodDisruptionBudget"))


def pdb_model(obj: kt.PdbObject) -> Pdb:
    """A policy/v1 PodDisruptionBudget -> Pdb.

    `disruptions_allowed` is status.disruptionsAllowed; without a status it is 0 (the safe value). A null
    selector matches no pods (policy/v1), an empty one every pod of the namespace.
    """
    meta = obj.metadata or NO_META
    reader = FieldReader("PodDisruptionBudget", kt.object_name("PodDisruptionBudget", meta, namespaced=True))
    namespace, _, name = reader.name.partition("/")
    selector_obj = obj.spec.selector if obj.spec is not None else None
    selector = (
        MATCH_NOTHING if selector_obj is None else label_selector(reader, selector_obj, "spec.selector")
    )
    allowed = (obj.status.disruptions_allowed if obj.status is not None else None) or 0
    return Pdb(namespace=namespace, name=name, selector=selector, disruptions_allowed=max(0, allowed))


# --------------------------------------------------------------------------- controllers


def controller_from_json(obj: Mapping[str, Any]) -> Controller:
    """A controller object mapping (any kind: as listed, or from a snapshot file) -> Controller (see
    `controller_model`); its kind is the mapping's `kind`."""
    raw_kind = obj.get("kind") if isinstance(obj, Mapping) else None
    kind = raw_kind if isinstance(raw_kind, str) else ""
    typed = kt.convert(kt.ControllerObject, obj, kind or "Controller")
    if not kind:
        name = kt.object_name("Controller", typed.metadata, namespaced=True)
        raise ObjectError(
            "Controller",
            name,
            "kind",
            "required field is missing" if raw_kind is None else "expected a string",
        )
    return controller_model(kind, typed)


def controller_model(kind: str, obj: kt.ControllerObject) -> Controller:
    """A controller object of `kind` -> Controller.

    `owner` is its controller ownerReference only. `replicas` is `spec.replicas` for the kinds of
    `REPLICATED_KINDS` (absent: 1, as the API server defaults it), `suspended` is `spec.suspend` for
    those of `SUSPENDABLE_KINDS` (absent: False); both are None for other kinds. An object without an
    apiVersion (an item of a typed List) gets its kind's from `workloads.KINDS` when it is one of them.
    """
    meta = obj.metadata or NO_META
    reader = FieldReader(kind, kt.object_name(kind, meta, namespaced=True))
    namespace, _, name = reader.name.partition("/")
    spec = obj.spec or _NO_CONTROLLER_SPEC
    replicas: int | None = None
    if kind in REPLICATED_KINDS:
        replicas = reader.integer(spec.replicas, "spec.replicas", 1)
        if replicas is None or replicas < 0:
            raise reader.error(
                "spec.replicas",
                f"{quote_value(replicas)} is not a number of replicas (a whole number, 0 or more)",
            )
    known = KINDS.get(kind)
    return Controller(
        namespace=namespace,
        kind=kind,
        name=name,
        api_version=obj.api_version or (known.api_version if known is not None else ""),
        uid=meta.uid or "",
        resource_version=meta.resource_version or "",
        labels=meta.labels or {},
        annotations=meta.annotations or {},
        owner=controller_owner(meta.owner_references),
        replicas=replicas,
        suspended=reader.boolean(spec.suspend, "spec.suspend") if kind in SUSPENDABLE_KINDS else None,
    )


_NO_CONTROLLER_SPEC = kt.ControllerSpec()


# --------------------------------------------------------------------------- any kind

Model = Node | Pod | Pdb | Controller


def model_of(obj: kt.KubeObject, *, gangs: GangConfig, sharing: GpuSharingConfig) -> Model:
    """The model object of a decoded object of any kind the model reads (`kube_types.decode_item`)."""
    if isinstance(obj, kt.PodObject):
        return pod_model(obj, gangs=gangs, sharing=sharing)
    if isinstance(obj, kt.NodeObject):
        return node_model(obj)
    if isinstance(obj, kt.PdbObject):
        return pdb_model(obj)
    return controller_model(kt.kind_of(obj), obj)


def model_from_json(
    kind: str, obj: Mapping[str, Any], *, gangs: GangConfig, sharing: GpuSharingConfig
) -> Model:
    """The model object of a decoded mapping of `kind` (its own `kind` field is not read)."""
    if kind == "Pod":
        return pod_from_json(obj, gangs=gangs, sharing=sharing)
    if kind == "Node":
        return node_from_json(obj)
    if kind == "PodDisruptionBudget":
        return pdb_from_json(obj)
    if isinstance(obj, Mapping) and obj.get("kind") != kind:
        obj = {**obj, "kind": kind}
    return controller_from_json(obj)


def model_from_bytes(
    kind: str, data: bytes | msgspec.Raw | str, *, gangs: GangConfig, sharing: GpuSharingConfig
) -> Model:
    """One object of `kind` from its JSON (an API list's item, a watch event's object): decoded straight
    into its Struct; one that msgspec refuses is read untyped, to be named as the model's checks name
    it. Raises ObjectError, or msgspec's DecodeError for invalid JSON."""
    try:
        return model_of(kt.decode_item(data, kind), gangs=gangs, sharing=sharing)
    except msgspec.ValidationError:
        pass
    try:
        obj = kt.decode_any(data)
    except msgspec.ValidationError as exc:  # a number past what Python converts
        raise ObjectError(kind, "<unnamed>", "", f"cannot be read: {exc}") from None
    if not isinstance(obj, Mapping):
        raise ObjectError(kind, "<unnamed>", "", f"expected an object, got {type_name(obj)}")
    return model_from_json(kind, obj, gangs=gangs, sharing=sharing)


def split_unbound(
    pods: Iterable[Pod], nodes: Container[str], *, missing_from: str
) -> tuple[list[Pod], list[Finding]]:
    """Pods on known nodes (or none yet), and an `unknown-node` finding for each pod on an unknown one.

    A pod bound to a node the source did not see cannot be judged (its node's capacity and labels are
    unknown), so it is left out; `missing_from` says where the node is missing ("the snapshot").
    """
    kept: list[Pod] = []
    findings: list[Finding] = []
    for pod in pods:
        if pod.node_name is not None and pod.node_name not in nodes:
            where = f"pod {pod.ref} is bound to node {pod.node_name}, which is not in {missing_from}"
            findings.append(Finding.about("unknown-node", pod, f"{where}; ignored"))
            continue
        kept.append(pod)
    return kept, findings
