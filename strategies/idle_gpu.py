"""The `idle-gpu` strategy: reclaim GPUs that pods hold but do not use, and report leaked VRAM.

Owns the judgement "this pod's GPUs stayed idle long enough to give them back" and the leaked-VRAM
findings. A pod holding GPUs (whole devices, shares or MIG instances) is idle when every GPU series
attributed to it (one per device or MIG instance it holds) averaged below `max_utilization_percent`
over `window`, with fresh and sufficient samples, and the pod is older than `min_pod_age`. Idle pods
always yield an `idle-gpu` finding; they become eviction proposals only in namespaces the policy opts
in, and a gang only moves when every GPU-holding member is idle.
Missing, stale or thin telemetry is never read as idle: it yields a `stale-telemetry` finding instead.
Framebuffer in use with no pod attached, or held by a pod that computed nothing for the whole window,
yields a `leaked-vram` finding and never an eviction.

This module must stay pure: no I/O, no clock (it reads `snapshot.now`), no cluster or Prometheus
clients. It must not apply safety guards (PDBs, opt-out annotations, limits): the planner does, so
that refusals are reported with the guard that made them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import ClassVar

from pydantic import Field

from rebalancer.model import (
    Finding,
    GpuTelemetry,
    Pod,
    Proposal,
    Snapshot,
    StrategyResult,
    TelemetryWindow,
)
from rebalancer.policy import Duration, Percent, format_duration
from rebalancer.registry import StrategyArgs, StrategyContext, strategy

NAME = "idle-gpu"


class IdleGpuArgs(StrategyArgs):
    """Arguments of `idle-gpu`. Durations accept `30s`, `5m`, `1h30m` or seconds."""

    requires_telemetry: ClassVar[bool] = True

    # A pod is idle when every GPU it holds averaged strictly below this utilisation over `window`.
    max_utilization_percent: Percent = 5.0
    window: Duration = Field(default=1800, gt=0)
    # Pods younger than this (since start, else creation; unknown counts as young) are left alone.
    min_pod_age: Duration = 3600
    # Fewer utilisation samples than this in the window is not enough evidence to call a GPU idle.
    min_samples: int = Field(default=10, ge=1)
    # A series whose newest sample is older than this (relative to the snapshot's now) is stale.
    max_telemetry_age: Duration = Field(default=300, gt=0)
    # Namespaces whose idle pods may be evicted; empty means report only.
    namespaces: tuple[str, ...] = ()
    # Framebuffer use (MiB) above which an unattributed or compute-free GPU counts as leaked VRAM.
    leaked_vram_mib: float = Field(default=1024.0, ge=0, allow_inf_nan=False)

    def telemetry_windows(self) -> frozenset[int]:
        return frozenset({self.window})


@dataclass(frozen=True, slots=True)
class _Verdict:
    """How one pod's GPUs look over the window."""

    pod: Pod
    rows: tuple[GpuTelemetry, ...]
    stale: tuple[str, ...]  # problems that make the evidence unusable; empty when usable
    idle: bool  # usable evidence and every GPU below the threshold
    old_enough: bool

    @property
    def evictable_idle(self) -> bool:
        return not self.stale and self.idle and self.old_enough


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f}".removesuffix(".0")


def _pct(value: float | None) -> str:
    return f"{_fmt(value)}%"


def _age(now: datetime, then: datetime) -> str:
    seconds = max(0, int((now - then).total_seconds()))
    return format_duration(seconds)


def _device_label(row: GpuTelemetry) -> str:
    if row.mig_instance is not None:
        profile = f" {row.mig_profile}" if row.mig_profile else ""
        return f"{row.uuid} (MIG {row.mig_instance}{profile})"
    return row.uuid


def _row_problems(row: GpuTelemetry, args: IdleGpuArgs, now: datetime) -> list[str]:
    problems: list[str] = []
    where = _device_label(row)
    if row.newest_sample is None:
        problems.append(f"{where}: no sample in the last {format_duration(args.window)}")
        return problems
    if now - row.newest_sample > timedelta(seconds=args.max_telemetry_age):
        problems.append(
            f"{where}: newest sample is {_age(now, row.newest_sample)} old "
            f"(max {format_duration(args.max_telemetry_age)})"
        )
    if row.util_samples < args.min_samples or row.util_avg_percent is None:
        problems.append(
            f"{where}: {row.util_samples} utilisation samples in {format_duration(args.window)} "
            f"(need {args.min_samples})"
        )
    return problems


def _pod_start(pod: Pod) -> datetime | None:
    return pod.started or pod.created


def _judge(pod: Pod, window: TelemetryWindow, args: IdleGpuArgs, now: datetime) -> _Verdict:
    rows = window.by_pod.get(pod.key, ())
    problems: list[str] = []
    if not rows:
        problems.append(
            f"no GPU telemetry attributed to the pod in the {format_duration(args.window)} window"
        )
    else:
        for row in rows:
            problems.extend(_row_problems(row, args, now))
        devices = {row.device_key for row in rows}
        held = pod.gpu.count + pod.mig_instances
        if len(devices) < held:
            what = "GPUs" if not pod.mig_instances else "GPUs and MIG instances"
            problems.append(f"telemetry covers {len(devices)} of the {held} {what} the pod holds")
    idle = bool(rows) and all(
        row.util_avg_percent is not None and row.util_avg_percent < args.max_utilization_percent
        for row in rows
    )
    start = _pod_start(pod)
    old_enough = start is not None and now - start >= timedelta(seconds=args.min_pod_age)
    return _Verdict(
        pod=pod, rows=rows, stale=tuple(problems), idle=idle and not problems, old_enough=old_enough
    )


def _idle_text(rows: Sequence[GpuTelemetry], args: IdleGpuArgs) -> str:
    """`GPU idle: avg 0.8% over 30m (threshold 5%) on GPU-1, avg 1.2% on GPU-2`."""
    first, *rest = rows
    head = (
        f"GPU idle: avg {_pct(first.util_avg_percent)} over {format_duration(args.window)} "
        f"(threshold {_pct(args.max_utilization_percent)}) on {_device_label(first)}"
    )
    tail = [f"avg {_pct(row.util_avg_percent)} on {_device_label(row)}" for row in rest]
    return ", ".join([head, *tail])


def _stale_finding(verdict: _Verdict) -> Finding:
    pod = verdict.pod
    first = next((row for row in verdict.rows), None)
    return Finding(
        kind="stale-telemetry",
        node=pod.node_name,
        gpu=first.uuid if first is not None else None,
        namespace=pod.namespace,
        pod=pod.name,
        detail="; ".join(verdict.stale) + "; not judged idle",
    )


def _idle_findings(verdict: _Verdict, args: IdleGpuArgs, note: str) -> Iterable[Finding]:
    pod = verdict.pod
    for row in verdict.rows:
        detail = (
            f"GPU idle: avg {_pct(row.util_avg_percent)}, max {_pct(row.util_max_percent)} "
            f"over {format_duration(args.window)} (threshold {_pct(args.max_utilization_percent)}, "
            f"{row.util_samples} samples), {_fmt(row.fb_used_mib)} MiB framebuffer used"
        )
        yield Finding(
            kind="idle-gpu",
            node=row.node or pod.node_name,
            gpu=row.uuid,
            namespace=pod.namespace,
            pod=pod.name,
            detail=f"{detail}; {note}" if note else detail,
        )


def _fresh(row: GpuTelemetry, args: IdleGpuArgs, now: datetime) -> bool:
    return row.newest_sample is not None and now - row.newest_sample <= timedelta(
        seconds=args.max_telemetry_age
    )


def _leaked_vram(window: TelemetryWindow, args: IdleGpuArgs, now: datetime) -> Iterable[Finding]:
    """Framebuffer held by nobody, or by a pod that computed nothing for the whole window."""
    by_gpu: dict[tuple[str, str], list[GpuTelemetry]] = defaultdict(list)
    for row in window.gpus:
        by_gpu[(row.node, row.uuid)].append(row)
    span = format_duration(args.window)
    threshold = _fmt(args.leaked_vram_mib)
    for (node, uuid), rows in by_gpu.items():
        attributed = any(row.pod_key is not None for row in rows)
        for row in rows:
            if (
                not _fresh(row, args, now)
                or row.fb_used_mib is None
                or row.fb_used_mib <= args.leaked_vram_mib
            ):
                continue
            used = _fmt(row.fb_used_mib)
            if row.pod_key is None:
                if attributed:
                    continue
                yield Finding(
                    kind="leaked-vram",
                    node=node,
                    gpu=uuid,
                    detail=(
                        f"{used} MiB framebuffer used on {_device_label(row)} with no pod attached "
                        f"(threshold {threshold} MiB, utilisation avg {_pct(row.util_avg_percent)} "
                        f"over {span})"
                    ),
                )
            elif row.util_max_percent == 0 and row.util_samples >= args.min_samples:
                yield Finding(
                    kind="leaked-vram",
                    node=node,
                    gpu=uuid,
                    namespace=row.pod_namespace,
                    pod=row.pod_name,
                    detail=(
                        f"{used} MiB framebuffer held at 0% utilisation for the whole {span} window "
                        f"({row.util_samples} samples, threshold {threshold} MiB) on {_device_label(row)}"
                    ),
                )


def _gang_note(
    gang: str, members: Sequence[Pod], verdicts: Mapping[tuple[str, str], _Verdict], args: IdleGpuArgs
) -> tuple[bool, str]:
    """Whether the whole gang may move, and why not when it may not."""
    holders = [m for m in members if m.uses_gpu]
    idle = [m for m in holders if verdicts[m.key].evictable_idle]
    if len(idle) < len(holders):
        return False, f"gang {gang}: {len(idle)} of {len(holders)} GPU members idle, a gang moves whole"
    outside = sorted({m.namespace for m in members if m.namespace not in args.namespaces})
    if outside:
        return False, f"report only: namespace {', '.join(outside)} not opted in for evictions"
    return True, ""


@strategy(NAME, IdleGpuArgs, "Evict pods whose GPUs stayed idle; report leaked VRAM and stale telemetry")
def idle_gpu(snapshot: Snapshot, args: IdleGpuArgs, ctx: StrategyContext) -> StrategyResult:
    window = snapshot.telemetry.window(args.window)
    if window is None:
        problem = snapshot.telemetry.problem or f"no {format_duration(args.window)} window in the snapshot"
        return StrategyResult(skipped=f"telemetry unavailable: {problem}")

    now = snapshot.now
    # A terminating pod gives its GPUs back on its own: neither judged nor proposed.
    holders = [p for p in snapshot.pods if p.is_active and p.uses_gpu and not p.terminating]
    verdicts: dict[tuple[str, str], _Verdict] = {p.key: _judge(p, window, args, now) for p in holders}

    findings: list[Finding] = []
    proposals: list[Proposal] = []
    gangs_done: set[str] = set()
    for pod in holders:
        verdict = verdicts[pod.key]
        if verdict.stale:
            findings.append(_stale_finding(verdict))
            continue
        if not verdict.evictable_idle:
            continue
        if pod.gang is not None:
            members = snapshot.gangs.get(pod.gang, (pod,))
            movable, note = _gang_note(pod.gang, members, verdicts, args)
            findings.extend(_idle_findings(verdict, args, note))
            if movable and pod.gang not in gangs_done:
                gangs_done.add(pod.gang)
                proposals.append(_gang_proposal(pod.gang, members, verdicts, args))
            continue
        if pod.namespace not in args.namespaces:
            note = f"report only: namespace {pod.namespace} not opted in for evictions"
            findings.extend(_idle_findings(verdict, args, note))
            continue
        findings.extend(_idle_findings(verdict, args, ""))
        proposals.append(
            Proposal(
                strategy=NAME,
                kind="pod",
                pods=(pod,),
                reason=_idle_text(verdict.rows, args),
                priority=pod.gpu.gpus,
                node=pod.node_name,
            )
        )

    findings.extend(_leaked_vram(window, args, now))
    return StrategyResult(proposals=tuple(proposals), findings=tuple(findings))


def _gang_proposal(
    gang: str, members: Sequence[Pod], verdicts: Mapping[tuple[str, str], _Verdict], args: IdleGpuArgs
) -> Proposal:
    rows = [row for m in members if m.uses_gpu for row in verdicts[m.key].rows]
    worst = max((row.util_avg_percent or 0.0) for row in rows)
    holders = sum(1 for m in members if m.uses_gpu)
    reason = (
        f"GPU idle: all {holders} GPU members of gang {gang} below "
        f"{_pct(args.max_utilization_percent)} over {format_duration(args.window)} "
        f"(highest avg {_pct(worst)} across {len(rows)} GPUs)"
    )
    return Proposal(
        strategy=NAME,
        kind="gang",
        pods=tuple(members),
        reason=reason,
        priority=sum(m.gpu.gpus for m in members),
        group=gang,
    )
