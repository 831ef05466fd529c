"""Kubernetes objects (as `kubectl get -o json` prints them, as the API lists them) -> domain model objects.

Owns the translation of Nodes, Pods and PodDisruptionBudgets, decoded into `kube_types`' Structs, into
`rebalancer.model` types: resource quantities (CPU in millicores, everything else in whole units,
rounded up as Kubernetes does), effective pod requests (the scheduler's formula, including init and
sidecar containers and pod overhead), GPU use (whole devices or a share of one), node affinity,
tolerations, spread constraints and gang membership; and of controller objects (ReplicaSet, Deployment,
StatefulSet, Job, JobSet, LeaderWorkerSet, Notebook, InferenceService, any other kind) into
`Controller`: identity, labels and annotations, its own controller, and the replicas or suspension a
reclaim changes. Its entry points take an object's JSON bytes (`model_from_bytes`: decoded straight into
its Struct, and read untyped only when msgspec refuses it, to name the problem), a Struct (`model_of`,
`pod_model`...) or a decoded mapping (`pod_from_json`...: a YAML document, a caller's dict). The
snapshot-directory source, the live lists and the watch cache all go through it, so they agree exactly.
Translations that depend only on a hashable part of a pod (its resources, tolerations, node affinity,
owner) are remembered once they passed their checks, and equal ones share one model object.

It must not do I/O, read the clock or build kubernetes client model objects (too slow for large
clusters): Structs or plain dicts in, frozen model objects out. JSON types are `kube_types`' to check,
the rest (required fields, quantities, operators, timestamps) `object_fields`'; anything malformed
raises `ObjectError`, naming the object and the field path; it never guesses a value that could make
an eviction look safe.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from decimal import Decimal
from typing import Any, TypeVar

import msgspec

from rebalancer.model import (
    GPU_RESOURCE,
    MILLI_PER_GPU,
    Controller,
    Finding,
    GpuRequest,
    LabelRequirement,
    LabelSelector,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    OwnerRef,
    Pdb,
    Pod,
    PreferredTerm,
    Taint,
    Toleration,
    TopologySpreadConstraint,
    Volume,
)
from rebalancer.policy import GangConfig, GpuSharingConfig
from rebalancer.sources import kube_types as kt
from rebalancer.sources.object_fields import (
    CPU_RESOURCE,
    GPU_COUNT_LABEL,
    MAX_GPU_DEVICES,
    FieldReader,
    ObjectError,
    checked_units,
    join_path,
    quote_value,
    resource_list,
    type_name,
)
from rebalancer.wording import quoted
from rebalancer.workloads import KINDS

MEMORY_RESOURCE = "memory"

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
    "pod_from_json",
    "pod_model",
    "split_unbound",
]

# Controller kinds whose `spec.replicas` a reclaim scales (the API defaults an absent one to 1), and
# those whose `spec.suspend` it sets (absent: not suspended).
REPLICATED_KINDS = frozenset({"ReplicaSet", "Deployment", "StatefulSet", "LeaderWorkerSet"})
SUSPENDABLE_KINDS = frozenset({"Job", "JobSet"})


# --------------------------------------------------------------------------- remembered translations

# Translations that depend only on a hashable part of the object (equal tolerations, affinities, owner
# references, container resources), remembered once they passed every check: pods of one template (or
# the daemons of one node) repeat them thousands of times, and then share one model object. A failure is
# never kept (it is reported with its object each time); a table that holds `_KEPT` entries starts over.
_KEPT = 16384
_T = TypeVar("_T")
_K = TypeVar("_K")


def _remembered(table: dict[_K, _T], key: _K, make: Callable[[], _T]) -> _T:
    value = table.get(key)
    if value is None:
        value = make()
        if len(table) >= _KEPT:
            table.clear()
        table[key] = value
    return value


# --------------------------------------------------------------------------- selectors and scheduling

# The API server's validation of node selector requirements (label selectors have no Gt / Lt).
_NODE_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
_LABEL_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


def _label_selector(reader: FieldReader, value: kt.LabelSelector, path: str) -> LabelSelector:
    expressions: list[LabelRequirement] = []
    for index, expr in enumerate(value.match_expressions or ()):
        where = f"{join_path(path, 'matchExpressions')}[{index}]"
        operator = expr.operator
        if not operator:
            raise reader.error(join_path(where, "operator"), "required field is missing")
        if operator not in _LABEL_SELECTOR_OPERATORS:
            raise reader.error(
                join_path(where, "operator"),
                f"{quoted(operator)} is not an operator (In, NotIn, Exists, DoesNotExist)",
            )
        expressions.append(LabelRequirement(expr.key or "", operator, expr.values or ()))
    return LabelSelector(match_labels=value.match_labels or {}, match_expressions=tuple(expressions))


def _node_requirements(
    reader: FieldReader, requirements: tuple[kt.Requirement, ...] | None, path: str
) -> tuple[NodeSelectorRequirement, ...]:
    out: list[NodeSelectorRequirement] = []
    for index, expr in enumerate(requirements or ()):
        where = f"{path}[{index}]"
        operator = expr.operator
        if not operator:
            raise reader.error(join_path(where, "operator"), "required field is missing")
        if operator not in _NODE_SELECTOR_OPERATORS:
            raise reader.error(
                join_path(where, "operator"),
                f"{quoted(operator)} is not an operator (In, NotIn, Exists, DoesNotExist, Gt, Lt)",
            )
        out.append(NodeSelectorRequirement(key=expr.key or "", operator=operator, values=expr.values or ()))
    return tuple(out)


def _node_selector_term(reader: FieldReader, term: kt.NodeSelectorTerm | None, path: str) -> NodeSelectorTerm:
    if term is None:
        return NodeSelectorTerm()
    return NodeSelectorTerm(
        match_expressions=_node_requirements(reader, term.match_expressions, f"{path}.matchExpressions"),
        match_fields=_node_requirements(reader, term.match_fields, f"{path}.matchFields"),
    )


_Affinities = tuple[tuple[NodeSelectorTerm, ...], tuple[PreferredTerm, ...]]
_AFFINITIES: dict[kt.Affinity, _Affinities] = {}
_NO_AFFINITY: _Affinities = ((), ())


def _node_affinity(reader: FieldReader, affinity: kt.Affinity | None) -> _Affinities:
    if affinity is None or affinity.node_affinity is None:
        return _NO_AFFINITY
    return _remembered(_AFFINITIES, affinity, lambda: _read_node_affinity(reader, affinity.node_affinity))


def _read_node_affinity(reader: FieldReader, affinity: kt.NodeAffinity | None) -> _Affinities:
    path = "spec.affinity.nodeAffinity"
    if affinity is None:
        return _NO_AFFINITY
    required = affinity.required_during_scheduling_ignored_during_execution
    terms_path = f"{path}.requiredDuringSchedulingIgnoredDuringExecution"
    required_terms = tuple(
        _node_selector_term(reader, term, f"{terms_path}.nodeSelectorTerms[{index}]")
        for index, term in enumerate((required.node_selector_terms if required else None) or ())
    )
    preferred: list[PreferredTerm] = []
    preferred_path = f"{path}.preferredDuringSchedulingIgnoredDuringExecution"
    for index, entry in enumerate(affinity.preferred_during_scheduling_ignored_during_execution or ()):
        where = f"{preferred_path}[{index}]"
        if entry.weight is None:
            raise reader.error(join_path(where, "weight"), "required field is missing")
        term = _node_selector_term(reader, entry.preference, f"{where}.preference")
        preferred.append(PreferredTerm(weight=entry.weight, term=term))
    return required_terms, tuple(preferred)


_TOLERATIONS: dict[tuple[kt.Toleration, ...], tuple[Toleration, ...]] = {}


def _tolerations(tolerations: tuple[kt.Toleration, ...] | None) -> tuple[Toleration, ...]:
    if not tolerations:
        return ()
    return _remembered(
        _TOLERATIONS,
        tolerations,
        lambda: tuple(
            Toleration(
                key=entry.key or "",
                operator=entry.operator or "Equal",
                value=entry.value or "",
                effect=entry.effect or "",
            )
            for entry in tolerations
        ),
    )


def _spread_constraints(
    reader: FieldReader,
    constraints: tuple[kt.TopologySpreadConstraint, ...] | None,
    labels: Mapping[str, str],
) -> tuple[TopologySpreadConstraint, ...]:
    out: list[TopologySpreadConstraint] = []
    for index, entry in enumerate(constraints or ()):
        where = f"spec.topologySpreadConstraints[{index}]"
        if entry.max_skew is None:
            raise reader.error(join_path(where, "maxSkew"), "required field is missing")
        selector = _label_selector(reader, entry.label_selector or _NO_SELECTOR, f"{where}.labelSelector")
        # matchLabelKeys: the pod's own values for these keys are ANDed into the selector (as the
        # scheduler does); keys the pod does not carry are ignored.
        extra = {k: labels[k] for k in entry.match_label_keys or () if k in labels}
        if extra:
            selector = LabelSelector(
                match_labels={**selector.match_labels, **extra}, match_expressions=selector.match_expressions
            )
        out.append(
            TopologySpreadConstraint(
                max_skew=entry.max_skew,
                topology_key=entry.topology_key or "",
                when_unsatisfiable=(
                    entry.when_unsatisfiable if entry.when_unsatisfiable is not None else "DoNotSchedule"
                ),
                label_selector=selector,
                min_domains=entry.min_domains,
            )
        )
    return tuple(out)


_NO_SELECTOR = kt.LabelSelector()
_NO_META = kt.ObjectMeta()


# --------------------------------------------------------------------------- nodes


def node_from_json(obj: Mapping[str, Any]) -> Node:
    """A v1 Node mapping -> Node (see `node_model`)."""
    return node_model(kt.convert(kt.NodeObject, obj, "Node", namespaced=False))


def node_model(obj: kt.NodeObject) -> Node:
    """A v1 Node -> Node. Allocatable falls back to capacity; no Ready=True condition means not ready."""
    meta = obj.metadata or _NO_META
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
        count.isascii() and count.isdigit() and len(count) <= 5 and int(count) <= MAX_GPU_DEVICES
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


# --------------------------------------------------------------------------- pods


class _ContainerResources:
    __slots__ = ("limits", "requests", "restart_policy")

    def __init__(
        self, requests: dict[str, Decimal], limits: dict[str, Decimal], restart_policy: str | None
    ) -> None:
        self.limits = limits
        # API defaulting: a resource with a limit but no request requests its limit.
        self.requests = {**limits, **requests}
        self.restart_policy = restart_policy


def _containers(
    reader: FieldReader, containers: tuple[kt.Container, ...] | None, key: str
) -> list[_ContainerResources]:
    out: list[_ContainerResources] = []
    for index, container in enumerate(containers or ()):
        resources = container.resources
        rpath = f"spec.{key}[{index}].resources"
        out.append(
            _ContainerResources(
                requests=resource_list(
                    reader, resources.requests if resources else None, f"{rpath}.requests"
                ),
                limits=resource_list(reader, resources.limits if resources else None, f"{rpath}.limits"),
                restart_policy=container.restart_policy,
            )
        )
    return out


def _add(into: dict[str, Decimal], amounts: Mapping[str, Decimal]) -> None:
    for name, amount in amounts.items():
        into[name] = into.get(name, Decimal(0)) + amount


def _max_into(into: dict[str, Decimal], amounts: Mapping[str, Decimal]) -> None:
    for name, amount in amounts.items():
        if amount > into.get(name, Decimal(0)):
            into[name] = amount


def _effective_requests(
    containers: Iterable[_ContainerResources],
    init_containers: Iterable[_ContainerResources],
    overhead: Mapping[str, Decimal],
) -> dict[str, Decimal]:
    """The scheduler's pod request (k8s.io/component-helpers resource.PodRequests).

    Sum of the app containers plus restartable (sidecar) init containers, against the largest
    one-shot init container together with the sidecars started before it; plus pod overhead.
    """
    total: dict[str, Decimal] = {}
    for res in containers:
        _add(total, res.requests)
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for res in init_containers:
        if res.restart_policy == "Always":
            _add(total, res.requests)
            _add(sidecars, res.requests)
            _max_into(init_peak, sidecars)
        else:
            during = dict(sidecars)
            _add(during, res.requests)
            _max_into(init_peak, during)
    _max_into(total, init_peak)
    _add(total, overhead)
    return total


def _qos_class(all_containers: Iterable[_ContainerResources]) -> str:
    """v1 QoS class from CPU and memory requests and limits (used when status.qosClass is absent)."""
    compute = (CPU_RESOURCE, MEMORY_RESOURCE)
    any_set = False
    guaranteed = True
    for res in all_containers:
        for name in compute:
            request, limit = res.requests.get(name), res.limits.get(name)
            if (request is not None and request > 0) or (limit is not None and limit > 0):
                any_set = True
            if limit is None or request != limit:
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


# A pod's resources, as the key of what they translate to: each container's requests, limits and restart
# policy, and the overhead. Quantities are strings or numbers (never booleans, which kube_types refuses),
# so equal keys are equal quantities; an int and the float equal to it check alike.
_ResourceKey = tuple[object, ...]
_Resources = tuple[dict[str, int], str]
_RESOURCES: dict[_ResourceKey, _Resources] = {}


def _container_key(container: kt.Container) -> tuple[object, ...]:
    resources = container.resources
    if resources is None:
        return (None, None, container.restart_policy)
    requests, limits = resources.requests, resources.limits
    return (
        tuple(requests.items()) if requests else None,
        tuple(limits.items()) if limits else None,
        container.restart_policy,
    )


def _pod_resources(reader: FieldReader, spec: kt.PodSpec) -> _Resources:
    """The pod's effective requests in model units, and its QoS class from its containers."""
    key = (
        tuple(_container_key(c) for c in spec.containers or ()),
        tuple(_container_key(c) for c in spec.init_containers or ()),
        tuple(spec.overhead.items()) if spec.overhead else None,
    )
    return _remembered(_RESOURCES, key, lambda: _read_pod_resources(reader, spec))


def _read_pod_resources(reader: FieldReader, spec: kt.PodSpec) -> _Resources:
    containers = _containers(reader, spec.containers, "containers")
    init_containers = _containers(reader, spec.init_containers, "initContainers")
    overhead = resource_list(reader, spec.overhead, "spec.overhead")
    requests = checked_units(
        reader, _effective_requests(containers, init_containers, overhead), "the pod's total request"
    )
    return requests, _qos_class((*containers, *init_containers))


def _gpu_request(requests: Mapping[str, int], sharing: GpuSharingConfig) -> GpuRequest:
    """Whole GPUs from nvidia.com/gpu, else the first configured share resource (a share of one device)."""
    if GPU_RESOURCE not in sharing.resources:
        whole = requests.get(GPU_RESOURCE, 0)
        if whole > 0:
            return GpuRequest(count=whole, milli_per_device=MILLI_PER_GPU)
    for name, resource in sharing.resources.items():
        units = requests.get(name, 0)
        if units > 0:
            return GpuRequest(count=1, milli_per_device=min(units * resource.milli_per_unit, MILLI_PER_GPU))
    return _NO_GPU


_NO_GPU = GpuRequest()


def _gang(
    namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str], gangs: GangConfig
) -> str | None:
    keys = gangs.keys
    for source in (labels, annotations):
        if source:
            for key in keys:
                value = source.get(key)
                if value:
                    return f"{namespace}/{value}"
    return None


def _volumes(reader: FieldReader, volumes: tuple[dict[str, Any], ...] | None) -> tuple[Volume, ...]:
    """Each volume's name and kind (its first field other than `name`), and an emptyDir's medium."""
    out: list[Volume] = []
    for index, entry in enumerate(volumes or ()):
        kind = ""
        for key in entry:
            if key != "name":
                kind = key
                break
        medium = ""
        if kind == "emptyDir":
            where = f"spec.volumes[{index}].emptyDir"
            medium = reader.string(reader.mapping(entry["emptyDir"], where).get("medium"), f"{where}.medium")
        name = entry.get("name")
        if type(name) is not str:
            name = reader.string(name, f"spec.volumes[{index}].name")
        out.append(Volume(name=name, kind=kind, medium=medium))
    return tuple(out)


_OWNERS: dict[tuple[kt.OwnerReference, ...], OwnerRef | None] = {}


def _owner(references: tuple[kt.OwnerReference, ...] | None) -> OwnerRef | None:
    """The controller ownerReference, the only one the model keeps."""
    if not references:
        return None
    found = _OWNERS.get(references, _NOT_KNOWN)
    if found is not _NOT_KNOWN:
        return found  # type: ignore[return-value]
    owner = next(
        (
            OwnerRef(
                kind=ref.kind or "", name=ref.name or "", api_version=ref.api_version or "", controller=True
            )
            for ref in references
            if ref.controller
        ),
        None,
    )
    if len(_OWNERS) >= _KEPT:
        _OWNERS.clear()
    _OWNERS[references] = owner
    return owner


_NOT_KNOWN = object()


def pod_from_json(obj: Mapping[str, Any], *, gangs: GangConfig, sharing: GpuSharingConfig) -> Pod:
    """A v1 Pod mapping -> Pod (see `pod_model`)."""
    return pod_model(kt.convert(kt.PodObject, obj, "Pod"), gangs=gangs, sharing=sharing)


def pod_model(obj: kt.PodObject, *, gangs: GangConfig, sharing: GpuSharingConfig) -> Pod:
    """A v1 Pod -> Pod, with the scheduler's effective requests and the pod's GPU use.

    A pod without status is `Pending` (what the API server sets on create). The owner is the controller
    ownerReference only. The gang id is `<namespace>/<value>` of the first gang key found in the
    labels, then in the annotations.
    """
    meta = obj.metadata or _NO_META
    reader = FieldReader("Pod", kt.object_name("Pod", meta, namespaced=True))
    namespace, _, name = reader.name.partition("/")
    spec = obj.spec or _NO_POD_SPEC
    status = obj.status or _NO_POD_STATUS
    labels = meta.labels or {}
    annotations = meta.annotations or {}
    requests, derived_qos = _pod_resources(reader, spec)
    required, preferred = _node_affinity(reader, spec.affinity)
    return Pod(
        namespace=namespace,
        name=name,
        uid=meta.uid or "",
        node_name=spec.node_name or None,
        phase=status.phase or "Pending",
        scheduler_name=spec.scheduler_name or "default-scheduler",
        priority=spec.priority or 0,
        priority_class_name=spec.priority_class_name or "",
        qos_class=status.qos_class or derived_qos,
        labels=labels,
        annotations=annotations,
        owner=_owner(meta.owner_references),
        requests=requests,
        gpu=_gpu_request(requests, sharing),
        volumes=_volumes(reader, spec.volumes),
        node_selector=spec.node_selector or {},
        required_affinity=required,
        preferred_affinity=preferred,
        tolerations=_tolerations(spec.tolerations),
        topology_spread=_spread_constraints(reader, spec.topology_spread_constraints, labels),
        gang=_gang(namespace, labels, annotations, gangs),
        created=reader.timestamp(meta.creation_timestamp, "metadata.creationTimestamp"),
        started=reader.timestamp(status.start_time, "status.startTime"),
        deleting_since=reader.timestamp(meta.deletion_timestamp, "metadata.deletionTimestamp"),
    )


_NO_POD_SPEC = kt.PodSpec()
_NO_POD_STATUS = kt.PodStatus()


# --------------------------------------------------------------------------- PDBs


def pdb_from_json(obj: Mapping[str, Any]) -> Pdb:
    """A policy/v1 PodDisruptionBudget mapping -> Pdb (see `pdb_model`)."""
    return pdb_model(kt.convert(kt.PdbObject, obj, "PodDisruptionBudget"))


def pdb_model(obj: kt.PdbObject) -> Pdb:
    """A policy/v1 PodDisruptionBudget -> Pdb.

    `disruptions_allowed` is status.disruptionsAllowed; without a status it is 0 (the safe value). A null
    selector matches no pods (policy/v1), an empty one every pod of the namespace.
    """
    meta = obj.metadata or _NO_META
    reader = FieldReader("PodDisruptionBudget", kt.object_name("PodDisruptionBudget", meta, namespaced=True))
    namespace, _, name = reader.name.partition("/")
    selector_obj = obj.spec.selector if obj.spec is not None else None
    selector = (
        MATCH_NOTHING if selector_obj is None else _label_selector(reader, selector_obj, "spec.selector")
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
    meta = obj.metadata or _NO_META
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
        owner=_owner(meta.owner_references),
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
