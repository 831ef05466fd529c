"""The outcome of one replay, as a value, as JSON-ready keys and as a text table.

Owns `SimulationResult`, the JSON keys of `rebalancer simulate --output json` (the required ones:
`node_hours`, `lower_bound_node_hours`, `ratio`, `gpu_hours_provisioned`, `gpu_hours_used`, `pods`,
`evictions`, `evictions_per_pod`, `max_evictions_per_pod`, `lost_gpu_hours`, `pending_pod_hours`,
`wall_seconds`; everything else is additive context) and the text rendering. It must not run the
replay or read the clock: `wall_seconds` is measured by the caller (the CLI or the benchmark) and set
with `dataclasses.replace`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ResultFormat = Literal["text", "json"]


@dataclass(frozen=True)
class SimulationResult:
    scheduler: str
    rebalancer: str
    replicas: int
    seed: int
    compress: float
    interval_seconds: float
    window_start: float
    window_end: float
    node_hours: float
    lower_bound_node_hours: float
    gpu_hours_provisioned: float
    gpu_hours_used: float
    pods: int
    evictions: int
    max_evictions_per_pod: int
    lost_gpu_hours: float
    pending_pod_hours: float
    rebalancer_cycles: int = 0
    approved_proposals: int = 0
    refused_proposals: Mapping[str, int] = field(default_factory=dict)
    skipped_strategies: Mapping[str, int] = field(default_factory=dict)
    # `on`: the policy's source, and how the replay runs it differently from a live daemon.
    policy: str | None = None
    policy_notes: tuple[str, ...] = ()
    misplaced_evictions: int = 0
    # Of those, the ones that landed on a node the planner found tied with the predicted one.
    equivalent_evictions: int = 0
    nodes_added: int = 0
    nodes_removed: int = 0
    peak_nodes: int = 0
    unplaceable_pods: int = 0
    pending_at_end: int = 0
    gpu_hours_by_model: Mapping[str, float] = field(default_factory=dict)
    node_hours_by_pool: Mapping[str, float] = field(default_factory=dict)
    cost: float | None = None
    wall_seconds: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.lower_bound_node_hours <= 0:
            return None
        return self.node_hours / self.lower_bound_node_hours

    @property
    def evictions_per_pod(self) -> float:
        return self.evictions / self.pods if self.pods else 0.0

    @property
    def window_days(self) -> float:
        return (self.window_end - self.window_start) / 86400


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def result_to_dict(result: SimulationResult) -> dict[str, Any]:
    """The JSON object of `rebalancer simulate --output json`: required keys first, then context."""
    return {
        "node_hours": _round(result.node_hours),
        "lower_bound_node_hours": _round(result.lower_bound_node_hours),
        "ratio": _round(result.ratio, 4),
        "gpu_hours_provisioned": _round(result.gpu_hours_provisioned),
        "gpu_hours_used": _round(result.gpu_hours_used),
        "pods": result.pods,
        "evictions": result.evictions,
        "evictions_per_pod": _round(result.evictions_per_pod, 4),
        "max_evictions_per_pod": result.max_evictions_per_pod,
        "lost_gpu_hours": _round(result.lost_gpu_hours),
        "pending_pod_hours": _round(result.pending_pod_hours),
        "wall_seconds": _round(result.wall_seconds, 2),
        "cost": _round(result.cost, 2),
        "scheduler": result.scheduler,
        "rebalancer": result.rebalancer,
        "replicas": result.replicas,
        "seed": result.seed,
        "compress": result.compress,
        "interval_seconds": result.interval_seconds,
        "window": {
            "start": result.window_start,
            "end": result.window_end,
            "days": _round(result.window_days),
        },
        "rebalancer_cycles": result.rebalancer_cycles,
        "approved_proposals": result.approved_proposals,
        "refused_proposals": dict(sorted(result.refused_proposals.items())),
        "skipped_strategies": dict(sorted(result.skipped_strategies.items())),
        "policy": result.policy,
        "policy_notes": list(result.policy_notes),
        "misplaced_evictions": result.misplaced_evictions,
        "equivalent_evictions": result.equivalent_evictions,
        "nodes_added": result.nodes_added,
        "nodes_removed": result.nodes_removed,
        "peak_nodes": result.peak_nodes,
        "unplaceable_pods": result.unplaceable_pods,
        "pending_at_end": result.pending_at_end,
        "gpu_hours_by_model": {k: _round(v) for k, v in sorted(result.gpu_hours_by_model.items())},
        "node_hours_by_pool": {k: _round(v) for k, v in sorted(result.node_hours_by_pool.items())},
    }


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render_text(result: SimulationResult) -> str:
    """A short aligned report for a terminal."""
    rows: list[tuple[str, object]] = [
        ("scheduler / rebalancer", f"{result.scheduler} / {result.rebalancer}"),
        (
            "load",
            f"{result.replicas} replica(s), seed {result.seed}, compress {_fmt(result.compress)}, "
            f"{_fmt(result.window_days)} days",
        ),
        ("node-hours", result.node_hours),
        ("lower bound node-hours", result.lower_bound_node_hours),
        ("ratio", result.ratio),
        ("GPU-hours provisioned", result.gpu_hours_provisioned),
        ("GPU-hours used", result.gpu_hours_used),
        ("pods", result.pods),
        ("evictions", result.evictions),
        ("evictions per pod", result.evictions_per_pod),
        ("max evictions of one pod", result.max_evictions_per_pod),
        ("lost GPU-hours", result.lost_gpu_hours),
        ("pending pod-hours", result.pending_pod_hours),
        ("rebalancer cycles", result.rebalancer_cycles),
        (
            "nodes added / removed / peak",
            f"{result.nodes_added} / {result.nodes_removed} / {result.peak_nodes}",
        ),
    ]
    if result.policy is not None:
        rows.append(("policy", result.policy))
    rows.extend(("  as replayed", note) for note in result.policy_notes)
    for reason, cycles in sorted(result.skipped_strategies.items()):
        rows.append(("skipped strategy", f"{reason} ({cycles} cycles)"))
    if result.unplaceable_pods:
        rows.append(("pods no node can run (left out)", result.unplaceable_pods))
    if result.cost is not None:
        rows.append(("cost", result.cost))
    if result.wall_seconds is not None:
        rows.append(("wall seconds", result.wall_seconds))
    width = max(len(label) for label, _ in rows)
    return "".join(f"{label:<{width}}  {_fmt(value)}\n" for label, value in rows)


def render(result: SimulationResult, fmt: ResultFormat) -> str:
    if fmt == "json":
        return json.dumps(result_to_dict(result), indent=2) + "\n"
    return render_text(result)
