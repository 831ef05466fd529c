"""Frozen domain types: the nouns that flow one way through a cycle.

Snapshot -> Proposal -> Decision -> Outcome, all collected in a CycleReport (`rebalancer.cycle_report`).

This module owns the shape of the data and small derived views over it (indexes, GPU accounting
helpers). It must not do I/O, read the clock, parse Kubernetes JSON or know about any client
library: sources build these objects, everything else only reads them.

Frozen dataclasses, except the types a snapshot or a cycle holds by the ten thousand (`Pod` and the
parts most pods have of their own, `GpuTelemetry`, `NotChosen`), which are frozen msgspec Structs:
built in C, ten times as fast as a frozen dataclass, whose every field is set through
`object.__setattr__` (3.6 us for a `Pod`). Both compare and hash by value; a changed copy of a Struct
is `msgspec.structs.replace`'s.

Units: CPU in millicores, memory and storage in bytes, every other resource in its own integral
unit (GPUs, MIG instances, shared-GPU slices). Telemetry: utilisation in percent (0-100),
framebuffer in MiB, whatever the exporter's own units were.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Literal

import msgspec

from rebalancer.finding_kinds import FindingKind

if TYPE_CHECKING:
    from rebalancer.usage import UsageHistory

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
MILLI_PER_GPU = 1000

# `checkpoint-pending` (added with the live actuator): the pod, or its plan, waits for a checkpoint
# before eviction (see docs/checkpoint-protocol.md); nothing was evicted.
# A workload's own object changed instead of a pod evicted (`WorkloadAction`), by verb: the owner told
# (`notify`), its GPUs reclaimed (`scale` to 0, `suspend`, `stop`), its idle mark lifted (`clear`).
OutcomeResult = Literal[
    "would-evict",
    "evicted",
    "blocked-by-pdb",
    "gone",
    "error",
    "checkpoint-pending",
    "would-notify",
    "notified",
    "would-scale",
    "scaled",
    "would-suspend",
    "suspended",
    "would-stop",
    "stopped",
    "would-clear",
    "cleared",
]
# `workload`: a change to the workload's own object (`Proposal.action`), not an eviction.
ProposalKind = Literal["pod", "gang", "node", "workload"]
# How a reclaim frees a workload's GPUs: the `scale` subresource to 0 replicas, `spec.suspend: true`,
# Kubeflow's stop annotation, or (a bare pod, which nothing re-creates) an eviction.
ReclaimHow = Literal["scale", "suspend", "stop", "evict"]
# What a workload proposal does: tell the owner, reclaim the GPUs, or lift the idle mark.
WorkloadVerb = Literal["notify", "reclaim", "clear"]
Mode = Literal["dry-run", "live"]
# Where an evicted pod's replacement landed, against the planner's prediction: on the predicted node, on a
# node tied with it when the planner decided (kube-scheduler picks among those at random), elsewhere, or
# still not placed `reschedule_timeout` after the eviction.
PredictionResult = Literal["as-predicted", "equivalent", "elsewhere", "pending"]
PREDICTION_RESULTS: tuple[PredictionResult, ...] = ("as-predicted", "equivalent", "elsewhere", "pending")


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


# --------------------------------------------------------------------------- telemetry


class GpuTelemetry(msgspec.Struct, frozen=True):
    """Aggregates of one DCGM series group (a GPU or MIG instance, and its pod) over a window.

    Values follow PromQL: `util_avg_percent` is avg_over_time, `fb_used_mib` the last sample at or before
    `now` (within the lookback), `fb_used_max_mib` max_over_time. None means no sample in the window.
    `fb_used_by_unseen_pod`: that last framebuffer sample came from a series naming a pod the cluster
    view does not have (created after the pod list, or deleted just before it), so the row carries no
    pod, but the exporter says a pod holds the GPU: its memory is never read as held by no pod.

    A frozen msgspec Struct (see the module's docstring): 0.1 us to build one instead of 1.6 us, and a
    snapshot of 5,000 nodes holds 84,486 of them.
    """

    node: str
    uuid: str
    gpu_index: str = ""
    model_name: str = ""
    mig_profile: str | None = None
    mig_instance: str | None = None
    pod_namespace: str | None = None
    pod_name: str | None = None
    util_avg_percent: float | None = None
    util_max_percent: float | None = None
    util_samples: int = 0
    fb_used_mib: float | None = None
    fb_used_max_mib: float | None = None
    fb_free_mib: float | None = None
    fb_used_by_unseen_pod: bool = False
    newest_sample: datetime | None = None

    @property
    def pod_key(self) -> tuple[str, str] | None:
        if self.pod_namespace and self.pod_name:
            return (self.pod_namespace, self.pod_name)
        return None

    @property
    def device_key(self) -> tuple[str, str, str | None]:
        return (self.node, self.uuid, self.mig_instance)


@dataclass(frozen=True)
class TelemetryWindow:
    """All series aggregated over one window length, evaluated at the snapshot's `now`."""

    window_seconds: int
    gpus: tuple[GpuTelemetry, ...] = ()

    @cached_property
    def by_pod(self) -> Mapping[tuple[str, str], tuple[GpuTelemetry, ...]]:
        grouped: dict[tuple[str, str], list[GpuTelemetry]] = defaultdict(list)
        for gpu in self.gpus:
            if (key := gpu.pod_key) is not None:
                grouped[key].append(gpu)
        return {k: tuple(v) for k, v in grouped.items()}

    @cached_property
    def by_node(self) -> Mapping[str, tuple[GpuTelemetry, ...]]:
        grouped: dict[str, list[GpuTelemetry]] = defaultdict(list)
        for gpu in self.gpus:
            grouped[gpu.node].append(gpu)
        return {k: tuple(v) for k, v in grouped.items()}


@dataclass(frozen=True)
class Telemetry:
    """Per-GPU telemetry for every window the policy asks for.

    `available` is False when the source could not be read (Prometheus down, no files): strategies that
    need telemetry skip, and `problem` says why. Missing data is never read as idle.
    """

    available: bool
    windows: Mapping[int, TelemetryWindow] = field(default_factory=dict)
    problem: str | None = None

    def window(self, seconds: int) -> TelemetryWindow | None:
        return self.windows.get(seconds) if self.available else None


NO_TELEMETRY = Telemetry(available=False, problem="no telemetry source configured")


@dataclass(frozen=True, slots=True)
class Finding:
    """Something worth an operator's attention that is not an eviction (leaked VRAM, stale telemetry...)."""

    kind: FindingKind
    node: str | None = None
    gpu: str | None = None
    namespace: str | None = None
    pod: str | None = None
    detail: str = ""
    # leaked-vram: the framebuffer in use on that GPU (and pod), MiB, as the telemetry's newest sample.
    fb_used_mib: float | None = None
    # idle-gpu: the workload (`namespace/Kind/name`) and the GPU-equivalents it holds idle.
    workload: str | None = None
    gpus: float | None = None
    # gpu-rightsizing: what the recommended change saves an hour, at the policy's prices.
    saving_per_hour: float | None = None

    @classmethod
    def about(cls, kind: FindingKind, pod: Pod, detail: str) -> Finding:
        """A finding about a pod, on its node."""
        return cls(kind=kind, node=pod.node_name, namespace=pod.namespace, pod=pod.name, detail=detail)


# --------------------------------------------------------------------------- snapshot


@dataclass(frozen=True)
class Snapshot:
    """An immutable picture of one instant. `now` is the only clock a cycle reads."""

    now: datetime
    nodes: Mapping[str, Node]
    pods: tuple[Pod, ...]
    pdbs: tuple[Pdb, ...] = ()
    telemetry: Telemetry = NO_TELEMETRY
    # Problems the source met while building the snapshot (pods on unknown nodes, bad samples...).
    findings: tuple[Finding, ...] = ()
    # The controllers of GPU pods and their own controllers, by (namespace, kind, name): what
    # `rebalancer.workloads` resolves a pod's workload with. Empty when the source read none.
    controllers: Mapping[tuple[str, str, str], Controller] = field(default_factory=dict)
    # Where the picture was taken, for the report (`snapshot DIR`, `live cluster (context ...)`): never
    # a credential.
    source: str = ""
    # GPU usage over a long window (peak, p95 per series), read only when a strategy asks for it
    # (`StrategyArgs.usage_period`); None when not read.
    usage: UsageHistory | None = None

    @classmethod
    def node_by_node(
        cls, now: datetime, nodes: Mapping[str, Node], pods_on: Mapping[str, tuple[Pod, ...]]
    ) -> Snapshot:
        """A snapshot of `nodes` whose pods are those of `pods_on`, node by node in the order of
        `nodes`, each active and bound to the node it is listed under (ValueError otherwise). Its
        `pods_by_node` holds those very tuples, so a source that keeps its objects across cycles hands
        the same tuple for a node whose pods did not change."""
        grouped: dict[str, tuple[Pod, ...]] = {}
        for name in nodes:
            held = pods_on.get(name, ())
            if not held:
                continue
            for pod in held:
                if pod.node_name != name or pod.phase in _FINISHED:
                    raise ValueError(f"pod {pod.ref} is listed on node {name} but is not active there")
            grouped[name] = held
        if len(grouped) != sum(1 for held in pods_on.values() if held):
            raise ValueError("pods are listed on nodes the snapshot does not have")
        snapshot = cls(now=now, nodes=nodes, pods=tuple(pod for held in grouped.values() for pod in held))
        snapshot.__dict__["pods_by_node"] = grouped  # what the cached property would work out
        return snapshot

    @cached_property
    def pods_by_node(self) -> Mapping[str, tuple[Pod, ...]]:
        grouped: dict[str, list[Pod]] = defaultdict(list)
        for pod in self.pods:
            node = pod.node_name
            if node is not None and pod.phase not in _FINISHED:  # `Pod.is_active`, inline
                grouped[node].append(pod)
        return {k: tuple(v) for k, v in grouped.items()}

    @cached_property
    def pods_by_key(self) -> Mapping[tuple[str, str], Pod]:
        return {p.key: p for p in self.pods}

    @cached_property
    def gangs(self) -> Mapping[str, tuple[Pod, ...]]:
        """Active pods grouped by gang id (namespace-qualified by the source); terminating members are
        already leaving and do not count."""
        grouped: dict[str, list[Pod]] = defaultdict(list)
        for pod in self.pods:
            if pod.gang is not None and pod.is_active and not pod.terminating:
                grouped[pod.gang].append(pod)
        return {k: tuple(v) for k, v in grouped.items()}

    @property
    def gpu_total(self) -> int:
        return sum(n.gpu_count for n in self.nodes.values())

    def pods_on(self, node: str) -> tuple[Pod, ...]:
        return self.pods_by_node.get(node, ())


# --------------------------------------------------------------------------- cycle flow


@dataclass(frozen=True, slots=True)
class DestinationRule:
    """One condition a strategy assumed of the node a pod lands on: the node is one of `nodes`, or, with
    `outside`, none of them. `text` completes "no node ... can take it" for operators ("in zone b",
    "with at least 8 GPUs (no smaller nodes)", "other than node gpu-a-1, which it leaves")."""

    text: str
    nodes: frozenset[str]
    outside: bool = False


@dataclass(frozen=True, slots=True)
class WorkloadAction:
    """What a `workload` proposal changes on the workload's own object (`rebalancer.workloads`).

    `workload` is (namespace, kind, name); `controller` the object as the snapshot read it (None for a
    bare pod, which is evicted). `gpus` are the GPU-equivalents its pods hold, `idle_since` when it was
    first found idle, `grace_until` when a reclaim may follow a notification, `cost_per_hour` their
    price (None: unknown).
    """

    verb: WorkloadVerb
    workload: tuple[str, str, str]
    controller: Controller | None
    how: ReclaimHow | None = None
    gpus: float = 0.0
    idle_since: datetime | None = None
    grace_until: datetime | None = None
    cost_per_hour: float | None = None

    @property
    def ref(self) -> str:
        namespace, kind, name = self.workload
        return f"{namespace}/{kind}/{name}"


@dataclass(frozen=True, slots=True)
class Proposal:
    """A strategy's wish: move these pods (one pod, a whole gang, or a whole node's pods), all or none.

    `targets` maps each pod key to the node a packed scheduler is predicted to place it on, when the
    strategy simulated it. `node` is the node being drained for a whole-node proposal.
    `destinations` carries, per pod, the rules its strategy assumed of any destination: when the
    predicted target can no longer take the pod (an earlier proposal of the cycle used the room), the
    planner may re-place it on a node meeting every one of them. A pod without an entry goes to its
    predicted target or nowhere.
    """

    strategy: str
    kind: ProposalKind
    pods: tuple[Pod, ...]
    reason: str
    priority: float = 0.0
    node: str | None = None
    group: str | None = None
    targets: Mapping[tuple[str, str], str] = field(default_factory=dict)
    nodes_freed: tuple[str, ...] = ()
    destinations: Mapping[tuple[str, str], tuple[DestinationRule, ...]] = field(default_factory=dict)
    # For `kind == "workload"`: the change to make instead of evicting `pods` (its pods, all of them).
    action: WorkloadAction | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The planner's verdict on a whole proposal: approved, or refused by one named guard."""

    proposal: Proposal
    approved: bool
    blocked_by: str | None = None
    reason: str = ""
    # The pod the refusal is about, when one pod sank the whole proposal.
    blocked_pod: tuple[str, str] | None = None
    targets: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # Per pod of `targets`, the nodes tied with its target when the planner placed it (the target among
    # them): the packed scheduler may pick any of them. A pod without an entry: its target alone.
    tied: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    # The pods in the order the planner placed them (room made on other nodes first, then largest GPU
    # request first): the order to evict them in. kube-scheduler queues pods of equal priority first
    # in, first out, so the replacements are scheduled in the order the prediction assumed. Empty: the
    # proposal's order.
    order: tuple[tuple[str, str], ...] = ()

    @property
    def pods_in_order(self) -> tuple[Pod, ...]:
        """The proposal's pods in `order`; any it does not list follow in the proposal's order."""
        if not self.order:
            return self.proposal.pods
        rank = {key: position for position, key in enumerate(self.order)}
        last = len(rank)
        return tuple(sorted(self.proposal.pods, key=lambda pod: rank.get(pod.key, last)))


# How the detail of an Outcome that was never tried begins ("not attempted: <why>").
NOT_ATTEMPTED = "not attempted: "


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the evictor did to one pod."""

    namespace: str
    pod: str
    result: OutcomeResult
    detail: str = ""


@dataclass(frozen=True, slots=True)
class SkippedStrategy:
    strategy: str
    reason: str


class NotChosen(msgspec.Struct, frozen=True):
    """Why a strategy did not act on a node or a pod it looked at: the strategy says so, the cycle
    collects it into the report (`rebalancer explain` shows it), nothing prints it.

    `code` is stable (a reason's kind, for counting: `allocated-above-threshold`, `gpu-busy`, ...);
    `reason` is the sentence for a person. `namespace`/`pod` are None for a node-level record.
    """

    strategy: str
    node: str | None
    code: str
    reason: str
    namespace: str | None = None
    pod: str | None = None

    @property
    def subject(self) -> str:
        """`ns/pod`, else `node NAME`."""
        if self.pod is not None:
            return f"{self.namespace}/{self.pod}"
        return f"node {self.node}"


@dataclass(frozen=True, slots=True)
class StrategyResult:
    """Everything one strategy has to say about one snapshot."""

    proposals: tuple[Proposal, ...] = ()
    findings: tuple[Finding, ...] = ()
    skipped: str | None = None
    hints: tuple[str, ...] = ()
    # What it looked at and left alone, each with why.
    not_chosen: tuple[NotChosen, ...] = ()
