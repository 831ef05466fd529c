"""The cycle flow: what a cycle makes of a snapshot, Proposal -> Decision -> Outcome.

`Proposal` (a strategy's wish, with the `DestinationRule`s it assumed and, for a workload, its
`WorkloadAction`), `Decision` (the planner's verdict), `Outcome` (what the evictor did to one pod),
`StrategyResult` (with its `NotChosen` records) and `SkippedStrategy`, and the Literal aliases they
and the report use; all collected in a CycleReport (`rebalancer.cycle_report`). This module owns
what was wished, decided and done, never the doing: it must not do I/O, read the clock, parse
Kubernetes JSON or know about any client library.

Frozen dataclasses, except `NotChosen`, which a cycle holds by the ten thousand: a frozen msgspec
Struct (`rebalancer.model.cluster` says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import msgspec

from rebalancer.model.cluster import Controller, Pod
from rebalancer.model.snapshot import Finding

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
