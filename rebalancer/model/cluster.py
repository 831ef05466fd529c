"""Cluster objects: what a source reads of the cluster's nodes, pods and PDBs, as frozen values.

Label selectors, node selector terms, taints, tolerations and topology spread constraints; `Node`,
`OwnerRef`, `Controller`, `Volume`, `GpuRequest`, `Pod` and `Pdb`; the names of the GPU resources and
of the GPU product label. This module owns their shape and the small views derived from one object
(a node's GPU count, whether a pod is active); what is derived over many belongs with the
`Snapshot`. It must not do I/O, read the clock, parse Kubernetes JSON or know about any client
library: sources build these objects, everything else only reads them.

Frozen dataclasses, except the types a snapshot or a cycle holds by the ten thousand (`Pod` and the
parts most pods have of their own, here; `GpuTelemetry` and `NotChosen`, elsewhere in the package),
which are frozen msgspec Structs: built in C, ten times as fast as a frozen dataclass, whose every
field is set through `object.__setattr__` (3.6 us for a `Pod`). Both compare and hash by value; a
changed copy of a Struct is `msgspec.structs.replace`'s.

Units: CPU in millicores, memory and storage in bytes, every other resource in its own integral
unit (GPUs, MIG instances, shared-GPU slices).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

import msgspec

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
MILLI_PER_GPU = 1000


# --------------------------------------------------------------------------- selectors


class LabelRequirement(msgspec.Struct, frozen=True):
    """One `matchExpressions` entry of a label selector (In, NotIn, Exists, DoesNotExist)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


class LabelSelector(msgspec.Struct, frozen=True):
    """A metav1.LabelSelector. An empty selector matches everything (as for PDBs in policy/v1)."""

    match_labels: Mapping[str, str] = msgspec.field(default_factory=dict)
    match_expressions: tuple[LabelRequirement, ...] = ()


NodeSelectorRequirement = LabelRequirement
"""One node affinity requirement (In, NotIn, Exists, DoesNotExist, Gt, Lt) on a label or field: the
same shape as a label selector's, with two more operators."""


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """Requirements ANDed together; terms of a NodeSelector are ORed."""

    match_expressions: tuple[NodeSelectorRequirement, ...] = ()
    match_fields: tuple[NodeSelectorRequirement, ...] = ()


@dataclass(frozen=True, slots=True)
class PreferredTerm:
    weight: int
    term: NodeSelectorTerm


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""  # empty key with operator Exists tolerates everything
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty tolerates every effect


class TopologySpreadConstraint(msgspec.Struct, frozen=True):
    max_skew: int
    topology_key: str
    when_unsatisfiable: str  # DoNotSchedule | ScheduleAnyway
    label_selector: LabelSelector
    min_domains: int | None = None


# --------------------------------------------------------------------------- cluster objects


# Weak references let `rebalancer.memo` keep what is derived from a node exactly as long as it lives.
@dataclass(frozen=True, slots=True, weakref_slot=True)
class Node:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, int] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    created: datetime | None = None
    ready: bool = True

    @property
    def gpu_model(self) -> str | None:
        return self.labels.get(GPU_PRODUCT_LABEL)

    @property
    def gpu_count(self) -> int:
        """Whole physical GPUs the device plugin advertises."""
        return self.allocatable.get(GPU_RESOURCE, 0)

    @property
    def mig_resources(self) -> Mapping[str, int]:
        return {k: v for k, v in self.allocatable.items() if k.startswith(MIG_RESOURCE_PREFIX)}

    @property
    def is_gpu_node(self) -> bool:
        return self.gpu_count > 0 or bool(self.mig_resources)


class OwnerRef(msgspec.Struct, frozen=True):
    kind: str
    name: str
    api_version: str = ""
    controller: bool = True


@dataclass(frozen=True, slots=True)
class Controller:
    """A controller object the source read (ReplicaSet, Deployment, StatefulSet, Job, JobSet, Notebook...):
    what re-creates pods, and where a reclaim's state lives (its annotations).

    `owner` is its own controller (a ReplicaSet's Deployment), `replicas` its `spec.replicas` for kinds
    that scale (None otherwise), `suspended` its `spec.suspend` for kinds that suspend (None otherwise).
    """

    namespace: str
    kind: str
    name: str
    api_version: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owner: OwnerRef | None = None
    replicas: int | None = None
    suspended: bool | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """(namespace, kind, name): the same shape as `history.Workload`."""
        return (self.namespace, self.kind, self.name)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


class Volume(msgspec.Struct, frozen=True):
    name: str
    kind: str  # emptyDir | hostPath | persistentVolumeClaim | configMap | secret | projected | ...
    medium: str = ""  # emptyDir medium ("Memory" for /dev/shm style volumes)


class GpuRequest(msgspec.Struct, frozen=True):
    """How a pod uses GPUs, in per-device terms.

    `count` devices, each needing `milli_per_device` thousandths of a device: a whole-GPU pod asking for
    two GPUs is (2, 1000); a pod holding a 460/1000 share of one GPU is (1, 460). Shares are packed per
    device, never as a fluid sum over the node.
    """

    count: int = 0
    milli_per_device: int = MILLI_PER_GPU

    @property
    def gpus(self) -> float:
        """GPU-equivalents held (2.0 for two whole GPUs, 0.46 for a 460-milli share)."""
        return self.count * self.milli_per_device / MILLI_PER_GPU

    @property
    def is_shared(self) -> bool:
        return self.count > 0 and self.milli_per_device < MILLI_PER_GPU


# The phases of a pod that no longer holds its node's resources.
_FINISHED = ("Succeeded", "Failed")


# Weak references let `rebalancer.memo` keep what is derived from a pod exactly as long as it lives.
class Pod(msgspec.Struct, frozen=True, weakref=True):
    namespace: str
    name: str
    uid: str = ""
    node_name: str | None = None
    phase: str = "Running"
    scheduler_name: str = "default-scheduler"
    priority: int = 0
    priority_class_name: str = ""
    qos_class: str = "BestEffort"
    labels: Mapping[str, str] = msgspec.field(default_factory=dict)
    annotations: Mapping[str, str] = msgspec.field(default_factory=dict)
    owner: OwnerRef | None = None
    requests: Mapping[str, int] = msgspec.field(default_factory=dict)
    gpu: GpuRequest = GpuRequest()
    volumes: tuple[Volume, ...] = ()
    node_selector: Mapping[str, str] = msgspec.field(default_factory=dict)
    required_affinity: tuple[NodeSelectorTerm, ...] = ()
    preferred_affinity: tuple[PreferredTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    topology_spread: tuple[TopologySpreadConstraint, ...] = ()
    gang: str | None = None
    created: datetime | None = None
    started: datetime | None = None
    # metadata.deletionTimestamp: the pod is terminating. It still holds its node's resources until it
    # is gone (the scheduler counts it), but it is never moved and never counted in spread or gangs.
    deleting_since: datetime | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def is_mirror(self) -> bool:
        return "kubernetes.io/config.mirror" in self.annotations

    @property
    def is_daemonset(self) -> bool:
        return self.owner is not None and self.owner.kind == "DaemonSet"

    @property
    def is_active(self) -> bool:
        """Bound and not finished: the pod occupies resources on its node."""
        return self.node_name is not None and self.phase not in _FINISHED

    @property
    def terminating(self) -> bool:
        """Being deleted (`metadata.deletionTimestamp` set), as upstream's `IsPodTerminating`."""
        return self.deleting_since is not None

    @property
    def mig_instances(self) -> int:
        """MIG instances the pod requests (`nvidia.com/mig-*` resources), whatever their profile."""
        return sum(v for k, v in self.requests.items() if k.startswith(MIG_RESOURCE_PREFIX) and v > 0)

    @property
    def uses_gpu(self) -> bool:
        """Whether the pod requests any GPU: whole devices, a share, or a MIG instance."""
        return self.gpu.count > 0 or self.mig_instances > 0


@dataclass(frozen=True, slots=True)
class Pdb:
    namespace: str
    name: str
    selector: LabelSelector
    disruptions_allowed: int

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)
