"""Telemetry judgement of `gpu-consolidation`: a node's GPU utilisation, when its telemetry is fit to read.

Owns the rule "this node's DCGM telemetry is fresh and sufficient": in the configured window every GPU
series of the node has a utilisation sample, its newest sample is at most `max_telemetry_age` old
(relative to `snapshot.now`), it holds at least `min_samples` utilisation samples, and the series cover
every GPU of the node (a MIG node is judged by its instances). Otherwise the node gets a
`stale-telemetry` finding and is not consolidated: missing or thin telemetry is never read as under-used.
The utilisation is the average over the node's devices (GPUs or MIG instances), each device's series
weighted by their samples.

This module must stay pure: no I/O, no clock (`snapshot.now` is the time), no Prometheus client. It
must not compare the utilisation with the threshold (the candidate rules do) nor query anything.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from rebalancer.gpu_devices import gpu_device_count
from rebalancer.model import Finding, GpuTelemetry, Node, Snapshot, TelemetryWindow
from rebalancer.policy import format_duration
from strategies.gpu_consolidation_accounting import NAME

if TYPE_CHECKING:
    from strategies.gpu_consolidation import GpuConsolidationArgs

__all__ = ["STALE_FINDING", "node_utilisation"]

STALE_FINDING: Final = "stale-telemetry"


def _device_util(rows: Sequence[GpuTelemetry]) -> dict[tuple[str, str | None], float]:
    """Average utilisation per device (GPU or MIG instance), weighting each series by its samples."""
    totals: dict[tuple[str, str | None], float] = defaultdict(float)
    weights: dict[tuple[str, str | None], float] = defaultdict(float)
    for row in rows:
        if row.util_avg_percent is None:
            continue
        weight = float(max(row.util_samples, 1))
        totals[(row.uuid, row.mig_instance)] += row.util_avg_percent * weight
        weights[(row.uuid, row.mig_instance)] += weight
    return {key: totals[key] / weights[key] for key in totals}


def node_utilisation(
    node: Node, window: TelemetryWindow, args: GpuConsolidationArgs, snapshot: Snapshot
) -> float | Finding:
    """The node's average GPU utilisation over the window, or a stale-telemetry finding."""
    rows = window.by_node.get(node.name, ())
    span = format_duration(args.window)

    def stale(detail: str, gpu: str | None = None) -> Finding:
        return Finding(kind=STALE_FINDING, node=node.name, gpu=gpu, detail=f"{NAME}: {detail}")

    if not rows:
        return stale(f"no GPU telemetry for the node in the {span} window; not consolidated")
    max_age = timedelta(seconds=args.max_telemetry_age)
    for row in rows:
        if row.newest_sample is None or row.util_avg_percent is None:
            return stale(f"GPU {row.uuid} has no utilisation sample in the {span} window", row.uuid)
        age = snapshot.now - row.newest_sample
        if age > max_age:
            old = format_duration(max(0, int(age.total_seconds())))
            return stale(
                f"GPU {row.uuid}: newest sample is {old} old (max {format_duration(args.max_telemetry_age)})",
                row.uuid,
            )
        if row.util_samples < args.min_samples:
            return stale(
                f"GPU {row.uuid}: {row.util_samples} utilisation samples in the {span} window "
                f"(need {args.min_samples}); not consolidated",
                row.uuid,
            )
    per_device = _device_util(rows)
    devices = gpu_device_count(node)
    if not node.mig_resources and devices:
        covered = len({uuid for uuid, _ in per_device})
        if covered < devices:
            return stale(f"telemetry covers {covered} of the node's {devices} GPUs")
    return sum(per_device.values()) / len(per_device)
