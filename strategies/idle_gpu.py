"""The `idle-gpu` strategy: give back GPUs that workloads hold but do not use, and report leaked VRAM.

Owns the strategy's entry point: GPU-holding pods are judged (`idle_gpu_evidence`), grouped by the
workload a person manages (`rebalancer.workloads`), and each workload whose every GPU stayed idle
(one idle replica of a busy service is not an idle workload) goes to its policy rule:
`report` / `notify` / `reclaim` (`idle_gpu_reclaim`: a finding, the owner told, then its GPUs freed
the way its kind allows), or `restart`: its idle pods evicted for their controller to re-create (e.g.
a stuck process holding VRAM), a gang only when every GPU-holding member is idle.
Missing, stale or thin telemetry is never read as idle: it yields a `stale-telemetry` finding instead.
Framebuffer in use with no pod attached (not even one the view does not have yet), or held by a pod
that computed nothing for the whole window, yields a `leaked-vram` finding and never an action.

This module must stay pure: no I/O, no clock (it reads `snapshot.now`), no cluster or Prometheus
clients. It must not apply safety guards (PDBs, opt-out annotations, limits): the planner does, so
that refusals are reported with the guard that made them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from rebalancer.history import Workload
from rebalancer.model import (
    Finding,
    GpuTelemetry,
    NotChosen,
    Pod,
    Proposal,
    Snapshot,
    StrategyResult,
    TelemetryWindow,
)
from rebalancer.policy import format_duration
from rebalancer.registry import StrategyContext, strategy
from rebalancer.wording import plural
from rebalancer.workloads import resolve
from strategies.idle_gpu_evidence import (
    NAME,
    IdleAction,
    IdleGpuArgs,
    Verdict,
    device_label,
    fmt,
    idle_text,
    judge,
    not_idle,
    pct,
    stale_finding,
)
from strategies.idle_gpu_reclaim import Judged, Lifecycle

__all__ = ["NAME", "IdleAction", "IdleGpuArgs", "idle_gpu"]


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
    threshold = fmt(args.leaked_vram_mib)
    for (node, uuid), rows in by_gpu.items():
        attributed = any(row.pod_key is not None for row in rows)
        for row in rows:
            if (
                not _fresh(row, args, now)
                or row.fb_used_mib is None
                or row.fb_used_mib <= args.leaked_vram_mib
            ):
                continue
            used = fmt(row.fb_used_mib)
            if row.pod_key is None:
                # The exporter names a pod the view does not have (one created since the pod list):
                # held by a pod, not by nobody.
                if attributed or row.fb_used_by_unseen_pod:
                    continue
                yield Finding(
                    kind="leaked-vram",
                    node=node,
                    gpu=uuid,
                    detail=(
                        f"{used} MiB framebuffer used on {device_label(row)} with no pod attached "
                        f"(threshold {threshold} MiB, utilisation avg {pct(row.util_avg_percent)} "
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
                        f"({row.util_samples} samples, threshold {threshold} MiB) on {device_label(row)}"
                    ),
                )


def _restart(
    pods: Sequence[Pod],
    snapshot: Snapshot,
    verdicts: Mapping[tuple[str, str], Verdict],
    args: IdleGpuArgs,
    gangs_done: set[str],
) -> list[Proposal]:
    """`restart`: each idle pod evicted on its own, a gang whole when every GPU member is idle."""
    proposals: list[Proposal] = []
    for pod in pods:
        verdict = verdicts[pod.key]
        if not verdict.evictable_idle:
            continue
        if pod.gang is None:
            proposals.append(
                Proposal(
                    strategy=NAME,
                    kind="pod",
                    pods=(pod,),
                    reason=idle_text(verdict.rows, args),
                    priority=pod.gpu.gpus,
                    node=pod.node_name,
                )
            )
        elif pod.gang not in gangs_done:
            members = snapshot.gangs.get(pod.gang, (pod,))
            if all(verdicts[m.key].evictable_idle for m in members if m.uses_gpu and m.key in verdicts):
                gangs_done.add(pod.gang)
                proposals.append(_gang_proposal(pod.gang, members, verdicts, args))
    return proposals


def _gang_proposal(
    gang: str, members: Sequence[Pod], verdicts: Mapping[tuple[str, str], Verdict], args: IdleGpuArgs
) -> Proposal:
    rows = [row for m in members if m.uses_gpu for row in verdicts[m.key].rows]
    worst = max((row.util_avg_percent or 0.0) for row in rows)
    holders = sum(1 for m in members if m.uses_gpu)
    reason = (
        f"GPU idle: all {holders} GPU members of gang {gang} below "
        f"{pct(args.max_utilization_percent)} over {format_duration(args.window)} "
        f"(highest avg {pct(worst)} across {len(rows)} GPUs)"
    )
    return Proposal(
        strategy=NAME,
        kind="gang",
        pods=tuple(members),
        reason=reason,
        priority=sum(m.gpu.gpus for m in members),
        group=gang,
    )


def _gangs_idle(
    pods: Sequence[Pod], snapshot: Snapshot, verdicts: Mapping[tuple[str, str], Verdict]
) -> str | None:
    """Why the workload is not idle as a gang: a GPU member of one of its gangs, in another workload
    or not, computes or has no usable evidence."""
    for gang in sorted({pod.gang for pod in pods if pod.gang is not None}):
        members = [m for m in snapshot.gangs.get(gang, ()) if m.uses_gpu]
        idle = [m for m in members if (v := verdicts.get(m.key)) is not None and v.evictable_idle]
        if len(idle) < len(members):
            return f"gang {gang}: {len(idle)} of {len(members)} GPU members idle, a gang moves whole"
    return None


@strategy(NAME, IdleGpuArgs, "Reclaim GPUs that workloads hold but do not use; report leaked VRAM")
def idle_gpu(snapshot: Snapshot, args: IdleGpuArgs, ctx: StrategyContext) -> StrategyResult:
    window = snapshot.telemetry.window(args.window)
    if window is None:
        problem = snapshot.telemetry.problem or f"no {format_duration(args.window)} window in the snapshot"
        return StrategyResult(skipped=f"telemetry unavailable: {problem}")

    now = snapshot.now
    resolved = resolve(snapshot)
    # Every active pod by workload, and the GPU pods' verdicts, in one pass. A terminating pod gives its
    # GPUs back on its own: neither judged nor proposed.
    verdicts: dict[tuple[str, str], Verdict] = {}
    by_workload: dict[Workload, list[Pod]] = defaultdict(list)
    members: dict[Workload, list[Pod]] = defaultdict(list)
    for pod in snapshot.pods:
        if not pod.is_active or pod.terminating:
            continue
        pod_key = pod.key
        of = resolved[pod_key].key
        members[of].append(pod)
        if pod.uses_gpu:
            verdicts[pod_key] = judge(pod, window, args, now)
            by_workload[of].append(pod)

    judged = Judged(snapshot, window, args, ctx, verdicts)
    findings: list[Finding] = [stale_finding(v) for v in verdicts.values() if v.stale]
    proposals: list[Proposal] = []
    gangs_done: set[str] = set()
    for key, pods in by_workload.items():
        workload = resolved[pods[0].key]
        rule = args.rule_for(key.namespace, pods[0].labels)
        if rule.action == "restart":
            for pod in pods:
                if verdicts[pod.key].evictable_idle:
                    apart = _gangs_idle((pod,), snapshot, verdicts)
                    findings.extend(_pod_findings(verdicts[pod.key], args, apart or ""))
            proposals.extend(_restart(pods, snapshot, verdicts, args, gangs_done))
            continue
        proposal, finding = _workload(Lifecycle(workload, pods, members[key], judged), rule)
        proposals.extend([proposal] if proposal is not None else [])
        findings.extend([finding] if finding is not None else [])

    findings.extend(_leaked_vram(window, args, now))
    left = [why for verdict in verdicts.values() if (why := not_idle(verdict, args)) is not None]
    proposed = {pod.key for proposal in proposals for pod in proposal.pods}
    left.extend(
        why for why in _busy_siblings(by_workload, verdicts) if (why.namespace, why.pod) not in proposed
    )
    return StrategyResult(proposals=tuple(proposals), findings=tuple(findings), not_chosen=tuple(left))


def _busy_siblings(
    by_workload: Mapping[Workload, Sequence[Pod]],
    verdicts: Mapping[tuple[str, str], Verdict],
) -> Iterable[NotChosen]:
    """Idle pods of a workload some other GPU pod of which is not idle: the workload is not idle."""
    for key, pods in by_workload.items():
        others = [p for p in pods if not verdicts[p.key].evictable_idle]
        if not others:
            continue
        for pod in pods:
            if verdicts[pod.key].evictable_idle:
                yield NotChosen(
                    NAME,
                    pod.node_name,
                    "workload-busy",
                    f"idle, but {plural(len(others), 'other GPU pod')} of {key.kind} {key.name} "
                    "is not: the workload is not idle",
                    namespace=pod.namespace,
                    pod=pod.name,
                )


def _workload(lifecycle: Lifecycle, rule: IdleAction) -> tuple[Proposal | None, Finding | None]:
    """One workload under a `report` / `notify` / `reclaim` rule."""
    verdicts = lifecycle.verdicts
    if not all(verdicts[pod.key].evictable_idle for pod in lifecycle.holders):
        return lifecycle.busy_again(), None
    apart = _gangs_idle(lifecycle.holders, lifecycle.snapshot, verdicts)
    if apart is not None:
        return None, lifecycle.report(f"report only: {apart}")
    return lifecycle.idle(rule)


def _pod_findings(verdict: Verdict, args: IdleGpuArgs, note: str) -> Iterable[Finding]:
    """`restart`: one finding per idle GPU of the pod, with `note` when it is not moved."""
    pod = verdict.pod
    for row in verdict.rows:
        detail = (
            f"GPU idle: avg {pct(row.util_avg_percent)}, max {pct(row.util_max_percent)} "
            f"over {format_duration(args.window)} (threshold {pct(args.max_utilization_percent)}, "
            f"{row.util_samples} samples), {fmt(row.fb_used_mib)} MiB framebuffer used"
        )
        yield Finding(
            kind="idle-gpu",
            node=row.node or pod.node_name,
            gpu=row.uuid,
            namespace=pod.namespace,
            pod=pod.name,
            detail=f"{detail}; {note}" if note else detail,
        )
