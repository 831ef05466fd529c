"""Raw Kubernetes JSON (as `kubectl get -o json` prints it) -> domain model objects.

Owns the translation of Node, Pod and PodDisruptionBudget dicts into `rebalancer.model` types: resource
quantities (CPU in millicores, everything else in whole units, rounded up as Kubernetes does), effective
pod requests (the scheduler's formula, including init and sidecar containers and pod overhead), GPU use
(whole devices or a share of one), node affinity, tolerations, spread constraints and gang membership;
and of controller objects (ReplicaSet, Deployment, StatefulSet, Job, JobSet, LeaderWorkerSet, Notebook,
InferenceService, any other kind) into `Controller`: identity, labels and annotations, its own
controller, and the replicas or suspension a reclaim changes.
Both the snapshot-directory source and the live cluster source call it, so they agree exactly.

It must not do I/O, read the clock or build kubernetes client model objects (too slow for large
clusters): plain dicts in, frozen model objects out. Field access and quantities are `object_fields`';
anything malformed raises its `ObjectError`, naming the object and the field path; it never guesses a
value that could make an eviction look safe.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from decimal import Decimal
from typing import Any

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
from rebalancer.sources.object_fields import (
    CPU_RESOURCE,
    GPU_COUNT_LABEL,
    MAX_GPU_DEVICES,
    FieldReader,
    checked_units,
    join_path,
    quote_value,
    read_metadata,
    resource_list,
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
    "controller_from_json",
    "node_from_json",
    "pdb_from_json",
    "pod_from_json",
    "split_unbound",
]

# Controller kinds whose `spec.replicas` a reclaim scales (the API defaults an absent one to 1), and
# those whose `spec.suspend` it sets (absent: not suspended).
REPLICATED_KINDS = frozenset({"ReplicaSet", "Deployment", "StatefulSet", "LeaderWorkerSet"})
SUSPENDABLE_KINDS = frozenset({"Job", "JobSet"})


# --------------------------------------------------------------------------- selectors and scheduling

# The API server's validation of node selector requirements (label selectors have no Gt / Lt).
_NODE_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
_LABEL_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


def _label_selector(reader: FieldReader, value: Mapping[str, Any], path: str) -> LabelSelector:
    match_labels = reader.string_map(value, "matchLabels", path)
    expressions: list[LabelRequirement] = []
    for index, expr in enumerate(reader.sequence(value, "matchExpressions", path)):
        where = f"{join_path(path, 'matchExpressions')}[{index}]"
        key = reader.string(expr, "key", where)
        operator = reader.string(expr, "operator", where)
        if not operator:
            raise reader.error(join_path(where, "operator"), "required field is missing")
        if operator not in _LABEL_SELECTOR_OPERATORS:
            raise reader.error(
                join_path(where, "operator"),
                f"{quoted(operator)} is not an operator (In, NotIn, Exists, DoesNotExist)",
            )
        expressions.append(LabelRequirement(key, operator, reader.strings(expr, "values", where)))
    return LabelSelector(match_labels=match_labels, match_expressions=tuple(expressions))


def _node_requirements(
    reader: FieldReader, term: Mapping[str, Any], key: str, path: str
) -> tuple[NodeSelectorRequirement, ...]:
    out: list[NodeSelectorRequirement] = []
    for index, expr in enumerate(reader.sequence(term, key, path)):
        where = f"{join_path(path, key)}[{index}]"
        operator = reader.string(expr, "operator", where)
        if not operator:
            raise reader.error(join_path(where, "operator"), "required field is missing")
        if operator not in _NODE_SELECTOR_OPERATORS:
            raise reader.error(
                join_path(where, "operator"),
                f"{quoted(operator)} is not an operator (In, NotIn, Exists, DoesNotExist, Gt, Lt)",
            )
        out.append(
            NodeSelectorRequirement(
                key=reader.string(expr, "key", where),
                operator=operator,
                values=reader.strings(expr, "values", where),
            )
        )
    return tuple(out)


def _node_selector_term(reader: FieldReader, term: Mapping[str, Any], path: str) -> NodeSelectorTerm:
    return NodeSelectorTerm(
        match_expressions=_node_requirements(reader, term, "matchExpressions", path),
        match_fields=_node_requirements(reader, term, "matchFields", path),
    )


def _node_affinity(
    reader: FieldReader, spec: Mapping[str, Any]
) -> tuple[tuple[NodeSelectorTerm, ...], tuple[PreferredTerm, ...]]:
    path = "spec.affinity.nodeAffinity"
    affinity = reader.mapping(reader.mapping(spec, "affinity", "spec"), "nodeAffinity", "spec.affinity")
    required_key = "requiredDuringSchedulingIgnoredDuringExecution"
    required = reader.mapping(affinity, required_key, path)
    terms_path = join_path(path, required_key)
    required_terms = tuple(
        _node_selector_term(reader, term, f"{terms_path}.nodeSelectorTerms[{index}]")
        for index, term in enumerate(reader.sequence(required, "nodeSelectorTerms", terms_path))
    )
    preferred_key = "preferredDuringSchedulingIgnoredDuringExecution"
    preferred: list[PreferredTerm] = []
    for index, entry in enumerate(reader.sequence(affinity, preferred_key, path)):
        where = f"{join_path(path, preferred_key)}[{index}]"
        weight = reader.integer(entry, "weight", where, None)
        if weight is None:
            raise reader.error(join_path(where, "weight"), "required field is missing")
        term = _node_selector_term(reader, reader.mapping(entry, "preference", where), f"{where}.preference")
        preferred.append(PreferredTerm(weight=weight, term=term))
    return required_terms, tuple(preferred)


def _tolerations(reader: FieldReader, spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    out: list[Toleration] = []
    for index, entry in enumerate(reader.sequence(spec, "tolerations", "spec")):
        where = f"spec.tolerations[{index}]"
        out.append(
            Toleration(
                key=reader.string(entry, "key", where),
                operator=reader.string(entry, "operator", where, "Equal") or "Equal",
                value=reader.string(entry, "value", where),
                effect=reader.string(entry, "effect", where),
            )
        )
    return tuple(out)


def _spread_constraints(
    reader: FieldReader, spec: Mapping[str, Any], labels: Mapping[str, str]
) -> tuple[TopologySpreadConstraint, ...]:
    out: list[TopologySpreadConstraint] = []
    for index, entry in enumerate(reader.sequence(spec, "topologySpreadConstraints", "spec")):
        where = f"spec.topologySpreadConstraints[{index}]"
        max_skew = reader.integer(entry, "maxSkew", where, None)
        if max_skew is None:
            raise reader.error(join_path(where, "maxSkew"), "required field is missing")
        selector = _label_selector(
            reader, reader.mapping(entry, "labelSelector", where), f"{where}.labelSelector"
        )
        # matchLabelKeys: the pod's own values for these keys are ANDed into the selector (as the
        # scheduler does); keys the pod does not carry are ignored.
        extra = {k: labels[k] for k in reader.strings(entry, "matchLabelKeys", where) if k in labels}
        if extra:
            selector = LabelSelector(
                match_labels={**selector.match_labels, **extra}, match_expressions=selector.match_expressions
            )
        out.append(
            TopologySpreadConstraint(
                max_skew=max_skew,
                topology_key=reader.string(entry, "topologyKey", where),
                when_unsatisfiable=reader.string(entry, "whenUnsatisfiable", where, "DoNotSchedule"),
                label_selector=selector,
                min_domains=reader.integer(entry, "minDomains", where, None),
            )
        )
    return tuple(out)


# --------------------------------------------------------------------------- nodes


def node_from_json(obj: Mapping[str, Any]) -> Node:
    """A v1 Node dict -> Node. Allocatable falls back to capacity; no Ready=True condition means not ready."""
    reader, meta = read_metadata(obj, "Node", namespaced=False)
    spec = reader.mapping(obj, "spec", "")
    status = reader.mapping(obj, "status", "")
    key = "allocatable" if status.get("allocatable") is not None else "capacity"
    allocatable = checked_units(reader, resource_list(reader, status, key, "status"), f"status.{key}")

    taints: list[Taint] = []
    for index, entry in enumerate(reader.sequence(spec, "taints", "spec")):
        where = f"spec.taints[{index}]"
        taint_key = reader.string(entry, "key", where)
        effect = reader.string(entry, "effect", where)
        if not taint_key or not effect:
            missing = "key" if not taint_key else "effect"
            raise reader.error(join_path(where, missing), "required field is missing")
        taints.append(Taint(key=taint_key, value=reader.string(entry, "value", where), effect=effect))

    ready = False
    for index, cond in enumerate(reader.sequence(status, "conditions", "status")):
        if cond.get("type") == "Ready":
            ready = reader.string(cond, "status", f"status.conditions[{index}]") == "True"

    labels = reader.string_map(meta, "labels", "metadata")
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
        annotations=reader.string_map(meta, "annotations", "metadata"),
        allocatable=allocatable,
        taints=tuple(taints),
        unschedulable=reader.boolean(spec, "unschedulable", "spec"),
        created=reader.timestamp(meta, "creationTimestamp", "metadata"),
        ready=ready,
    )


# --------------------------------------------------------------------------- pods


class _ContainerResources:
    __slots__ = ("limits", "requests")

    def __init__(self, requests: dict[str, Decimal], limits: dict[str, Decimal]) -> None:
        self.limits = limits
        # API defaulting: a resource with a limit but no request requests its limit.
        self.requests = {**limits, **requests}


def _containers(
    reader: FieldReader, spec: Mapping[str, Any], key: str
) -> list[tuple[Mapping[str, Any], _ContainerResources]]:
    out: list[tuple[Mapping[str, Any], _ContainerResources]] = []
    for index, container in enumerate(reader.sequence(spec, key, "spec")):
        where = f"spec.{key}[{index}]"
        resources = reader.mapping(container, "resources", where)
        rpath = f"{where}.resources"
        out.append(
            (
                container,
                _ContainerResources(
                    requests=resource_list(reader, resources, "requests", rpath),
                    limits=resource_list(reader, resources, "limits", rpath),
                ),
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
    reader: FieldReader,
    containers: Iterable[tuple[Mapping[str, Any], _ContainerResources]],
    init_containers: Iterable[tuple[Mapping[str, Any], _ContainerResources]],
    overhead: Mapping[str, Decimal],
) -> dict[str, Decimal]:
    """The scheduler's pod request (k8s.io/component-helpers resource.PodRequests).

    Sum of the app containers plus restartable (sidecar) init containers, against the largest
    one-shot init container together with the sidecars started before it; plus pod overhead.
    """
    total: dict[str, Decimal] = {}
    for _, res in containers:
        _add(total, res.requests)
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for index, (container, res) in enumerate(init_containers):
        policy = reader.string(container, "restartPolicy", f"spec.initContainers[{index}]")
        if policy == "Always":
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
    return GpuRequest()


def _gang(
    namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str], gangs: GangConfig
) -> str | None:
    for source in (labels, annotations):
        for key in gangs.keys:
            value = source.get(key)
            if value:
                return f"{namespace}/{value}"
    return None


def _volumes(reader: FieldReader, spec: Mapping[str, Any]) -> tuple[Volume, ...]:
    out: list[Volume] = []
    for index, entry in enumerate(reader.sequence(spec, "volumes", "spec")):
        where = f"spec.volumes[{index}]"
        kinds = [k for k in entry if k != "name"]
        kind = str(kinds[0]) if kinds else ""
        medium = ""
        if kind == "emptyDir":
            medium = reader.string(reader.mapping(entry, "emptyDir", where), "medium", f"{where}.emptyDir")
        out.append(Volume(name=reader.string(entry, "name", where), kind=kind, medium=medium))
    return tuple(out)


def _owner(reader: FieldReader, meta: Mapping[str, Any]) -> OwnerRef | None:
    for index, ref in enumerate(reader.sequence(meta, "ownerReferences", "metadata")):
        where = f"metadata.ownerReferences[{index}]"
        if reader.boolean(ref, "controller", where):
            return OwnerRef(
                kind=reader.string(ref, "kind", where),
                name=reader.string(ref, "name", where),
                api_version=reader.string(ref, "apiVersion", where),
                controller=True,
            )
    return None


def pod_from_json(obj: Mapping[str, Any], *, gangs: GangConfig, sharing: GpuSharingConfig) -> Pod:
    """A v1 Pod dict -> Pod, with the scheduler's effective requests and the pod's GPU use.

    A pod without status is `Pending` (what the API server sets on create). The owner is the controller
    ownerReference only. The gang id is `<namespace>/<value>` of the first gang key found in the
    labels, then in the annotations.
    """
    reader, meta = read_metadata(obj, "Pod", namespaced=True)
    namespace, _, name = reader.name.partition("/")
    spec = reader.mapping(obj, "spec", "")
    status = reader.mapping(obj, "status", "")
    labels = reader.string_map(meta, "labels", "metadata")
    annotations = reader.string_map(meta, "annotations", "metadata")

    containers = _containers(reader, spec, "containers")
    init_containers = _containers(reader, spec, "initContainers")
    overhead = resource_list(reader, spec, "overhead", "spec")
    requests = checked_units(
        reader, _effective_requests(reader, containers, init_containers, overhead), "the pod's total request"
    )
    required, preferred = _node_affinity(reader, spec)
    qos = reader.string(status, "qosClass", "status") or _qos_class(
        res for _, res in (*containers, *init_containers)
    )

    return Pod(
        namespace=namespace,
        name=name,
        uid=reader.string(meta, "uid", "metadata"),
        node_name=reader.string(spec, "nodeName", "spec") or None,
        phase=reader.string(status, "phase", "status") or "Pending",
        scheduler_name=reader.string(spec, "schedulerName", "spec") or "default-scheduler",
        priority=reader.integer(spec, "priority", "spec", 0) or 0,
        priority_class_name=reader.string(spec, "priorityClassName", "spec"),
        qos_class=qos,
        labels=labels,
        annotations=annotations,
        owner=_owner(reader, meta),
        requests=requests,
        gpu=_gpu_request(requests, sharing),
        volumes=_volumes(reader, spec),
        node_selector=reader.string_map(spec, "nodeSelector", "spec"),
        required_affinity=required,
        preferred_affinity=preferred,
        tolerations=_tolerations(reader, spec),
        topology_spread=_spread_constraints(reader, spec, labels),
        gang=_gang(namespace, labels, annotations, gangs),
        created=reader.timestamp(meta, "creationTimestamp", "metadata"),
        started=reader.timestamp(status, "startTime", "status"),
        deleting_since=reader.timestamp(meta, "deletionTimestamp", "metadata"),
    )


# --------------------------------------------------------------------------- PDBs


def pdb_from_json(obj: Mapping[str, Any]) -> Pdb:
    """A policy/v1 PodDisruptionBudget dict -> Pdb.

    `disruptions_allowed` is status.disruptionsAllowed; without a status it is 0 (the safe value). A null
    selector matches no pods (policy/v1), an empty one every pod of the namespace.
    """
    reader, _meta = read_metadata(obj, "PodDisruptionBudget", namespaced=True)
    namespace, _, name = reader.name.partition("/")
    spec = reader.mapping(obj, "spec", "")
    status = reader.mapping(obj, "status", "")
    raw_selector = spec.get("selector")
    if raw_selector is None:
        selector = MATCH_NOTHING
    else:
        selector = _label_selector(reader, reader.mapping(spec, "selector", "spec"), "spec.selector")
    allowed = reader.integer(status, "disruptionsAllowed", "status", 0) or 0
    return Pdb(namespace=namespace, name=name, selector=selector, disruptions_allowed=max(0, allowed))


# --------------------------------------------------------------------------- controllers


def controller_from_json(obj: Mapping[str, Any]) -> Controller:
    """A controller object dict (any kind: as listed, or from a snapshot file) -> Controller.

    `owner` is its controller ownerReference only. `replicas` is `spec.replicas` for the kinds of
    `REPLICATED_KINDS` (absent: 1, as the API server defaults it), `suspended` is `spec.suspend` for
    those of `SUSPENDABLE_KINDS` (absent: False); both are None for other kinds. An object without an
    apiVersion (an item of a typed List) gets its kind's from `workloads.KINDS` when it is one of them.
    """
    raw_kind = obj.get("kind") if isinstance(obj, Mapping) else None
    kind = raw_kind if isinstance(raw_kind, str) else ""
    reader, meta = read_metadata(obj, kind or "Controller", namespaced=True)
    if not kind:
        raise reader.error("kind", "required field is missing" if raw_kind is None else "expected a string")
    namespace, _, name = reader.name.partition("/")
    spec = reader.mapping(obj, "spec", "")
    replicas: int | None = None
    if kind in REPLICATED_KINDS:
        replicas = reader.integer(spec, "replicas", "spec", 1)
        if replicas is None or replicas < 0:
            raise reader.error(
                "spec.replicas",
                f"{quote_value(replicas)} is not a number of replicas (a whole number, 0 or more)",
            )
    known = KINDS.get(kind)
    api_version = reader.string(obj, "apiVersion", "") or (known.api_version if known is not None else "")
    return Controller(
        namespace=namespace,
        kind=kind,
        name=name,
        api_version=api_version,
        uid=reader.string(meta, "uid", "metadata"),
        resource_version=reader.string(meta, "resourceVersion", "metadata"),
        labels=reader.string_map(meta, "labels", "metadata"),
        annotations=reader.string_map(meta, "annotations", "metadata"),
        owner=_owner(reader, meta),
        replicas=replicas,
        suspended=reader.boolean(spec, "suspend", "spec") if kind in SUSPENDABLE_KINDS else None,
    )


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
