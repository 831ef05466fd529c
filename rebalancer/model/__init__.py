"""Frozen domain types: the nouns that flow one way through a cycle.

Snapshot -> Proposal -> Decision -> Outcome, all collected in a CycleReport (`rebalancer.cycle_report`).

The package owns the shape of the data and small derived views over it (indexes, GPU accounting
helpers), a module a concern, each importing only those listed before it:

- `cluster`: what a source reads of the cluster: label selectors, node selector terms, taints,
  tolerations, topology spread constraints, `Node`, `OwnerRef`, `Controller`, `Volume`, `GpuRequest`,
  `Pod`, `Pdb`, the GPU resource names; the resource units, and why the types made by the ten
  thousand are msgspec Structs;
- `telemetry`: per-GPU telemetry over the policy's windows (`GpuTelemetry`, `TelemetryWindow`,
  `Telemetry`, `NO_TELEMETRY`) and its units;
- `snapshot`: `Snapshot`, one instant, with the indexes over it, and `Finding`;
- `flow`: what a cycle hands on: `Proposal` (with `DestinationRule`, `WorkloadAction`), `Decision`,
  `Outcome`, `StrategyResult` (with `NotChosen`), `SkippedStrategy`, and their Literal aliases.

None of them may do I/O, read the clock, parse Kubernetes JSON or know about any client library:
sources build these objects, everything else only reads them. This module re-exports every public
name of the four; import them from here (`from rebalancer.model import Pod`).
"""

from __future__ import annotations

from rebalancer.model.cluster import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    MILLI_PER_GPU,
    Controller,
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
from rebalancer.model.flow import (
    NOT_ATTEMPTED,
    PREDICTION_RESULTS,
    Decision,
    DestinationRule,
    Mode,
    NotChosen,
    Outcome,
    OutcomeResult,
    PredictionResult,
    Proposal,
    ProposalKind,
    ReclaimHow,
    SkippedStrategy,
    StrategyResult,
    WorkloadAction,
    WorkloadVerb,
)
from rebalancer.model.snapshot import (
    Finding,
    Snapshot,
)
from rebalancer.model.telemetry import (
    NO_TELEMETRY,
    GpuTelemetry,
    Telemetry,
    TelemetryWindow,
)

__all__ = [
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "MIG_RESOURCE_PREFIX",
    "MILLI_PER_GPU",
    "NOT_ATTEMPTED",
    "NO_TELEMETRY",
    "PREDICTION_RESULTS",
    "Controller",
    "Decision",
    "DestinationRule",
    "Finding",
    "GpuRequest",
    "GpuTelemetry",
    "LabelRequirement",
    "LabelSelector",
    "Mode",
    "Node",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "NotChosen",
    "Outcome",
    "OutcomeResult",
    "OwnerRef",
    "Pdb",
    "Pod",
    "PredictionResult",
    "PreferredTerm",
    "Proposal",
    "ProposalKind",
    "ReclaimHow",
    "SkippedStrategy",
    "Snapshot",
    "StrategyResult",
    "Taint",
    "Telemetry",
    "TelemetryWindow",
    "Toleration",
    "TopologySpreadConstraint",
    "Volume",
    "WorkloadAction",
    "WorkloadVerb",
]
