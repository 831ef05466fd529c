"""The cycle's report: what every sink publishes, and nothing else.

Owns the frozen types of a finished cycle's report (`CycleReport`: its rows, summary, the facts of
the nodes it names, every GPU node's GPUs, the landings judged, the notices to owners of idle
workloads, what the strategies left alone and why, the snapshot's source and the policy that judged
it). Built by `cycle.assemble_report` (the GPUs by `gpu_map`); rendered by `report` and `report_html`,
published by the sinks. Like `model`, it must not do I/O, read the clock or know about any client
library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, get_args

import msgspec

from rebalancer.model import (
    Finding,
    Mode,
    NotChosen,
    OutcomeResult,
    PredictionResult,
    SkippedStrategy,
    WorkloadVerb,
)

# What one GPU was doing at the snapshot, as the HTML report colours it: `busy` (a pod holds it and
# uses it), `idle` (the pod holding it is an idle-gpu finding), `leaked` (a leaked-vram finding: memory
# in use, no pod), `free` (no pod holds it), `unknown` (a pod holds it but no telemetry says how it is
# used: never shown as idle).
GpuState = Literal["busy", "idle", "leaked", "free", "unknown"]


@dataclass(frozen=True, slots=True)
class ReportedDecision:
    """One row of the report: one pod, its proposal's verdict and what happened to it."""

    strategy: str
    namespace: str
    pod: str
    node: str | None
    # `notify` / `reclaim` / `clear`: an approved workload action (`Proposal.action`), not an eviction.
    action: Literal["evict", "skip", "notify", "reclaim", "clear"]
    outcome: OutcomeResult | None
    reason: str
    blocked_by: str | None
    group: str | None
    target_node: str | None
    uid: str = ""  # the pod's, so an Event on it matches `kubectl describe`
    # `namespace/Kind/name` of the workload a workload action changes; None for evictions.
    workload: str | None = None


@dataclass(frozen=True, slots=True)
class Summary:
    nodes: int
    gpus: int
    pods: int
    proposals: int
    evictions: int
    blocked: int
    nodes_freed: int
    gpus_freed: int
    estimated_savings_per_hour: float | None
    # Idle workloads whose GPUs were given back (or would be, in a dry run), and those GPU-equivalents.
    reclaims: int = 0
    gpus_reclaimed: float = 0.0
    # `blocked` by what refused it: a guard name, or the outcome (`blocked-by-pdb`) of a live refusal.
    blocked_by: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What a report says of a node it names (freed, or in a finding), for sinks that have no snapshot."""

    gpu_model: str | None
    gpus: int


# A frozen msgspec Struct, one per GPU of the report's GPU map (40,000 at 5,000 nodes): built in C
# (`rebalancer.model.cluster` says why).
class GpuCell(msgspec.Struct, frozen=True):
    """One GPU of a node at the snapshot: its state, the pods holding it, its averaged telemetry."""

    index: str  # dcgm-exporter's `gpu` label, or the position on the node when no telemetry names it
    state: GpuState
    pods: tuple[str, ...] = ()  # `namespace/name`
    uuid: str | None = None
    util_avg_percent: float | None = None
    fb_used_mib: float | None = None


class NodeGpus(msgspec.Struct, frozen=True):
    """Every GPU of one GPU node, in index order (`gpu_map.gpu_map`)."""

    node: str
    gpu_model: str | None
    zone: str | None
    gpus: tuple[GpuCell, ...]


@dataclass(frozen=True, slots=True)
class PredictionCheck:
    """An evicted pod's predicted destination checked against where its workload's replacement landed
    (`landed` and `replacement` None while none is placed: `pending`)."""

    strategy: str
    namespace: str
    pod: str
    predicted: str
    result: PredictionResult
    landed: str | None = None
    replacement: str | None = None


@dataclass(frozen=True, slots=True)
class WorkloadNotice:
    """What a workload action did (or would do) to one workload, for its owner: the sinks' message
    (Slack, webhook, the Event on the workload) and the command that snoozes the next step."""

    workload: tuple[str, str, str]  # (namespace, kind, name)
    verb: WorkloadVerb
    result: OutcomeResult
    message: str
    snooze_command: str | None
    uid: str = ""  # the workload's, so the Event on it matches `kubectl describe`
    gpus: float = 0.0
    cost_per_hour: float | None = None
    idle_since: datetime | None = None
    grace_until: datetime | None = None

    @property
    def ref(self) -> str:
        namespace, kind, name = self.workload
        return f"{namespace}/{kind}/{name}"

    @property
    def text(self) -> str:
        """The message with the command to snooze, for sinks that show one string."""
        return f"{self.message} To keep it: {self.snooze_command}" if self.snooze_command else self.message


@dataclass(frozen=True, slots=True)
class CycleReport:
    """Everything a cycle did and found: what every sink publishes (they see nothing else)."""

    mode: Mode
    now: datetime
    summary: Summary
    decisions: tuple[ReportedDecision, ...] = ()
    findings: tuple[Finding, ...] = ()
    skipped_strategies: tuple[SkippedStrategy, ...] = ()
    hints: tuple[str, ...] = ()
    freed_nodes: tuple[str, ...] = ()
    proposals_by_strategy: Mapping[str, int] = field(default_factory=dict)
    nodes: Mapping[str, NodeFacts] = field(default_factory=dict)
    # Evictions of earlier live cycles whose replacement's landing was judged at this cycle's snapshot,
    # and how many evictions still wait for theirs.
    predictions: tuple[PredictionCheck, ...] = ()
    predictions_awaiting: int = 0
    # Idle workloads whose owners were told, or whose GPUs were reclaimed, this cycle.
    notices: tuple[WorkloadNotice, ...] = ()
    # What each strategy looked at and left alone, and why (`rebalancer explain` reads them all; the
    # rendered report counts them).
    not_chosen: tuple[NotChosen, ...] = ()
    # Where the snapshot came from and which policy judged it (name, `sha256:` digest of its values).
    source: str = ""
    policy_name: str = ""
    policy_digest: str = ""
    # Every GPU node's GPUs as the snapshot showed them (the HTML report draws them); a cycle's is a
    # `gpu_map.GpuMap`, drawn when first read.
    gpu_nodes: Sequence[NodeGpus] = ()

    @property
    def acted(self) -> int:
        """Rows that evicted a pod or changed a workload, or (dry run) would have: what `once
        --exit-code` fails a CI job on."""
        return sum(1 for d in self.decisions if d.action != "skip" and d.outcome in _ACTED)


# Outcomes that leave the cluster as it was: refused, gone, failed or waiting. Every other outcome is an
# eviction or a workload change made, or one a dry run would make (a result added later counts as
# acting, the side on which `--exit-code` fails a CI job).
_NOTHING_DONE: frozenset[OutcomeResult] = frozenset({"blocked-by-pdb", "gone", "error", "checkpoint-pending"})
_ACTED: frozenset[OutcomeResult | None] = frozenset(get_args(OutcomeResult)) - _NOTHING_DONE
