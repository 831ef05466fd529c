"""Kubernetes Pods (as `kubectl get -o json` prints them, as the API lists them) -> `rebalancer.model.Pod`.

Owns the translation of a Pod, decoded into `kube_types`' Struct (`pod_model`) or a decoded mapping
(`pod_from_json`: a YAML document, a caller's dict): effective requests (the scheduler's formula,
including init and sidecar containers and pod overhead, in model units: CPU in millicores, everything
else in whole units, rounded up as Kubernetes does) and the QoS class they imply, GPU use (whole devices
or a share of one), node affinity, tolerations, spread constraints, volumes and gang membership.
Translations that depend only on a hashable part of a pod (its resources, tolerations, node affinity,
owner) are remembered once they passed their checks (`kube_object_parts`), and equal ones share one model
object. Objects of any kind, and those of the other kinds, are `kube_objects`' to translate.

It must not do I/O, read the clock or build kubernetes client model objects (too slow for large
clusters): Structs or plain dicts in, frozen model objects out. JSON types are `kube_types`' to check,
the rest (required fields, quantities, operators, timestamps) `object_fields`'; anything malformed
raises `ObjectError`, naming the pod and the field path; it never guesses a value that could make
an eviction look safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from rebalancer.model import (
    GPU_RESOURCE,
    MILLI_PER_GPU,
    GpuRequest,
    LabelSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    PreferredTerm,
    Toleration,
    TopologySpreadConstraint,
    Volume,
)
from rebalancer.policy import GangConfig, GpuSharingConfig
from rebalancer.sources import kube_types as kt
from rebalancer.sources.kube_object_parts import NO_META, controller_owner, label_selector, remembered
from rebalancer.sources.object_fields import (
    CPU_RESOURCE,
    FieldReader,
    checked_units,
    join_path,
    resource_list,
)
from rebalancer.wording import quoted

MEMORY_RESOURCE = "memory"

__all__ = ["pod_from_json", "pod_model"]


# --------------------------------------------------------------------------- scheduling constraints

# The API server's validation of node selector requirements (label selectors have no Gt / Lt).
_NODE_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


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
    return remembered(_AFFINITIES, affinity, lambda: _read_node_affinity(reader, affinity.node_affinity))


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
    return remembered(
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
        selector = label_selector(reader, entry.label_selector or _NO_SELECTOR, f"{where}.labelSelector")
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


# --------------------------------------------------------------------------- resources and GPUs


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
    return remembered(_RESOURCES, key, lambda: _read_pod_resources(reader, spec))


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


def _volumes(
    reader: FieldReader, volumes: tuple[dict[str, kt.VolumeField], ...] | None
) -> tuple[Volume, ...]:
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
            source = entry["emptyDir"]
            value = (
                source.medium
                if isinstance(source, kt.VolumeSource)
                else reader.mapping(source, where).get("medium")
            )
            medium = reader.string(value, f"{where}.medium")
        name = entry.get("name")
        if type(name) is not str:
            name = reader.string(name, f"spec.volumes[{index}].name")
        out.append(Volume(name=name, kind=kind, medium=medium))
    return tuple(out)


# --------------------------------------------------------------------------- pods


def pod_from_json(obj: Mapping[str, Any], *, gangs: GangConfig, sharing: GpuSharingConfig) -> Pod:
    """A v1 Pod mapping -> Pod (see `pod_model`)."""
    return pod_model(kt.convert(kt.PodObject, obj, "Pod"), gangs=gangs, sharing=sharing)


def pod_model(obj: kt.PodObject, *, gangs: GangConfig, sharing: GpuSharingConfig) -> Pod:
    """A v1 Pod -> Pod, with the scheduler's effective requests and the pod's GPU use.

    A pod without status is `Pending` (what the API server sets on create). The owner is the controller
    ownerReference only. The gang id is `<namespace>/<value>` of the first gang key found in the
    labels, then in the annotations.
    """
    meta = obj.metadata or NO_META
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
        owner=controller_owner(meta.owner_references),
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
