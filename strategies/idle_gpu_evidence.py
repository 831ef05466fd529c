"""`idle-gpu`'s arguments and evidence: whether one pod's GPUs stayed idle over the window.

Owns `IdleGpuArgs` (with the per-namespace / per-selector action rules), the per-pod verdict (every GPU
series attributed to the pod averaged below `max_utilization_percent` over `window`, with fresh and
sufficient samples, and the pod older than `min_pod_age`), the wording of that evidence, and why a
pod whose GPUs are not idle is not chosen (`not_idle`). Missing,
stale or thin telemetry is never read as idle: the verdict then carries the problems instead.

This module must stay pure: no I/O, no clock (`now` is given). It judges pods only: what an idle
workload leads to is `idle_gpu_reclaim`'s, the strategy's entry point `idle_gpu`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import ClassVar, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rebalancer.guards import policy_selector
from rebalancer.model import Finding, GpuTelemetry, NotChosen, Pod, TelemetryWindow
from rebalancer.policy import Count, Duration, LabelSelectorConfig, Percent, format_duration
from rebalancer.registry import StrategyArgs
from rebalancer.selectors import label_selector_matches

NAME = "idle-gpu"

# What an idle workload leads to: a finding (`report`); also the owner told (`notify`); then, after the
# grace period, its GPUs freed the way its kind allows (`reclaim`); or its idle pods evicted for their
# controller to re-create (`restart`, e.g. a stuck process holding VRAM).
IdleActionName = Literal["report", "notify", "reclaim", "restart"]
DEFAULT_GRACE = 4 * 3600


class IdleAction(BaseModel):
    """One rule: idle workloads in `namespaces` (empty: any) whose pods match `selector` (none: any)
    get `action`. The first rule that matches wins; a workload no rule matches is only reported."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    action: IdleActionName
    """What an idle workload this rule matches leads to: report, notify, reclaim or restart."""
    namespaces: tuple[str, ...] = ()
    """The namespaces the rule applies to (none: every namespace)."""
    selector: LabelSelectorConfig | None = None
    """A label selector on the pods the rule applies to (none: every pod)."""
    grace: Duration = Field(default=DEFAULT_GRACE, ge=0)
    """reclaim: how long after the owner was told (`rebalancer.gpu/idle-since`) the GPUs are reclaimed."""

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        if self.namespaces and namespace not in self.namespaces:
            return False
        return self.selector is None or label_selector_matches(policy_selector(self.selector), labels)


REPORT = IdleAction(action="report")


class IdleGpuArgs(StrategyArgs):
    """Arguments of `idle-gpu`. Durations accept `30s`, `5m`, `1h30m` or seconds."""

    requires_telemetry: ClassVar[bool] = True

    max_utilization_percent: Percent = 5.0
    """A pod is idle when every GPU it holds averaged strictly below this utilisation over `window`."""
    window: Duration = Field(default=1800, gt=0)
    """The telemetry window a GPU's utilisation is averaged over."""
    min_pod_age: Duration = 3600
    """Pods younger than this (since start, else creation; unknown counts as young) are left alone."""
    min_samples: Count = Field(default=10, ge=1)
    """Fewer utilisation samples than this in the window is not enough evidence to call a GPU idle."""
    max_telemetry_age: Duration = Field(default=300, gt=0)
    """A series whose newest sample is older than this (relative to the snapshot's now) is stale."""
    actions: tuple[IdleAction, ...] = ()
    """What idle workloads lead to, per namespace or pod label selector; none: every one is reported."""
    namespaces: tuple[str, ...] = ()
    """The older spelling of one `restart` rule for these namespaces (their idle pods are evicted)."""
    leaked_vram_mib: float = Field(default=1024.0, ge=0, allow_inf_nan=False)
    """Framebuffer use (MiB) above which an unattributed or compute-free GPU counts as leaked VRAM."""

    @model_validator(mode="after")
    def _one_spelling(self) -> IdleGpuArgs:
        if self.namespaces and self.actions:
            raise ValueError(
                "`namespaces` is the older spelling of an `actions` rule `{action: restart, namespaces: "
                "[...]}`: give `actions` only"
            )
        return self

    def telemetry_windows(self) -> frozenset[int]:
        return frozenset({self.window})

    def rule_for(self, namespace: str, labels: Mapping[str, str]) -> IdleAction:
        """The first action rule matching a pod of the workload; `report` when none does."""
        if self.namespaces:
            return (
                IdleAction(action="restart", namespaces=self.namespaces)
                if namespace in self.namespaces
                else REPORT
            )
        return next((rule for rule in self.actions if rule.matches(namespace, labels)), REPORT)


# A frozen msgspec Struct, one per GPU pod of every cycle: built in C
# (`rebalancer.model.cluster` says why).
class Verdict(msgspec.Struct, frozen=True):
    """How one pod's GPUs look over the window."""

    pod: Pod
    rows: tuple[GpuTelemetry, ...]
    stale: tuple[str, ...]  # problems that make the evidence unusable; empty when usable
    idle: bool  # usable evidence and every GPU below the threshold
    old_enough: bool

    @property
    def evictable_idle(self) -> bool:
        return not self.stale and self.idle and self.old_enough

    @property
    def busy(self) -> bool:
        """Usable evidence that the pod computed: not idle, and not for want of data."""
        return not self.stale and not self.idle


def fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f}".removesuffix(".0")


def pct(value: float | None) -> str:
    return f"{fmt(value)}%"


def _age(now: datetime, then: datetime) -> str:
    seconds = max(0, int((now - then).total_seconds()))
    return format_duration(seconds)


def device_label(row: GpuTelemetry) -> str:
    if row.mig_instance is not None:
        profile = f" {row.mig_profile}" if row.mig_profile else ""
        return f"{row.uuid} (MIG {row.mig_instance}{profile})"
    return row.uuid


def _row_problems(row: GpuTelemetry, args: IdleGpuArgs, now: datetime) -> list[str]:
    problems: list[str] = []
    if row.newest_sample is None:
        problems.append(f"{device_label(row)}: no sample in the last {format_duration(args.window)}")
        return problems
    if now - row.newest_sample > timedelta(seconds=args.max_telemetry_age):
        problems.append(
            f"{device_label(row)}: newest sample is {_age(now, row.newest_sample)} old "
            f"(max {format_duration(args.max_telemetry_age)})"
        )
    if row.util_samples < args.min_samples or row.util_avg_percent is None:
        problems.append(
            f"{device_label(row)}: {row.util_samples} utilisation samples in {format_duration(args.window)} "
            f"(need {args.min_samples})"
        )
    return problems


def _pod_start(pod: Pod) -> datetime | None:
    return pod.started or pod.created


def judge(pod: Pod, window: TelemetryWindow, args: IdleGpuArgs, now: datetime) -> Verdict:
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
    return Verdict(
        pod=pod, rows=rows, stale=tuple(problems), idle=idle and not problems, old_enough=old_enough
    )


def not_idle(verdict: Verdict, args: IdleGpuArgs) -> NotChosen | None:
    """Why the pod's GPUs are not judged idle (None when they are): unusable evidence, a busy GPU
    (the busiest one named), or a pod too young to judge."""
    pod = verdict.pod

    def record(code: str, reason: str) -> NotChosen:
        return NotChosen(NAME, pod.node_name, code, reason, namespace=pod.namespace, pod=pod.name)

    if verdict.stale:
        return record("telemetry-unusable", f"not judged: {'; '.join(verdict.stale)}")
    if not verdict.idle:
        busiest = max(verdict.rows, key=lambda row: row.util_avg_percent or 0.0)
        return record(
            "gpu-busy",
            f"GPU {device_label(busiest)} busy (avg {pct(busiest.util_avg_percent)} over "
            f"{format_duration(args.window)} >= threshold {pct(args.max_utilization_percent)})",
        )
    if not verdict.old_enough:
        return record("too-young", f"idle but younger than min_pod_age {format_duration(args.min_pod_age)}")
    return None


def idle_text(rows: Sequence[GpuTelemetry], args: IdleGpuArgs) -> str:
    """`GPU idle: avg 0.8% over 30m (threshold 5%) on GPU-1, avg 1.2% on GPU-2`."""
    first, *rest = rows
    head = (
        f"GPU idle: avg {pct(first.util_avg_percent)} over {format_duration(args.window)} "
        f"(threshold {pct(args.max_utilization_percent)}) on {device_label(first)}"
    )
    tail = [f"avg {pct(row.util_avg_percent)} on {device_label(row)}" for row in rest]
    return ", ".join([head, *tail])


def stale_finding(verdict: Verdict) -> Finding:
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
