"""One rebalancing cycle, the only orchestration: strategies -> planner -> evictor -> report -> sinks.

Owns the order in which the pieces run and the assembly of the CycleReport. `run_cycle` is what every
mode runs (`once` on a snapshot or live, the daemon, the trace replay, the benchmarks): the evictor's
frame opens, the memory of earlier cycles judges where the replacements of its awaited evictions landed
(`history_landings.judge_landings`, into the report) and gives the history to plan with, every approved
decision is evicted (and recorded in the memory as it ends), the frame closes, the report goes to every
sink.
`evaluate` is its strategies-and-planner half (collecting, beside the proposals, what each
strategy left alone and why) and `propose` the strategies alone, public so that a
benchmark times each phase by calling it, never by patching. The strategies are told what the history
the planner judges with holds back this cycle (`strategy_context`), so that such moves take none of
their turns; the planner still refuses them, by its own guards.

It takes an already built Snapshot (the clock was read when the snapshot was made), so it never reads
the clock itself, and it never talks to the cluster or Prometheus directly: the evictor, the memory and
the sinks it is given are the edges. Dry-run is the choice of a DryRunEvictor, not a flag here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Literal, Protocol

from rebalancer import rfc3339
from rebalancer.cycle_report import CycleReport, NodeFacts, ReportedDecision, Summary, WorkloadNotice
from rebalancer.evictor import Evictor
from rebalancer.gcpause import collector_paused
from rebalancer.gpu_map import gpu_map
from rebalancer.guards import CIRCUIT_OPEN as CIRCUIT_OPEN_FINDING
from rebalancer.guards import first_refusal, pod_refusal
from rebalancer.history import NO_HISTORY, DisruptionHistory, EvictionRecord, Memory
from rebalancer.history_circuit import open_circuits
from rebalancer.history_landings import Landings, judge_landings
from rebalancer.model import (
    Decision,
    Finding,
    Mode,
    NotChosen,
    Outcome,
    Proposal,
    SkippedStrategy,
    Snapshot,
    StrategyResult,
)
from rebalancer.planner import history_refusal, plan
from rebalancer.policy import LoadedPolicy, Policy
from rebalancer.registry import StrategyContext, get_strategy
from rebalancer.wording import plural
from rebalancer.workloads import RESULTS, notice


class Sink(Protocol):
    def publish(self, report: CycleReport) -> None: ...


class CycleMemory(Protocol):
    """What earlier cycles disrupted: the history a cycle plans with, and each decision's outcomes."""

    @property
    def history(self) -> DisruptionHistory:
        """What it knows now."""
        ...

    def begin(
        self, snapshot: Snapshot, policy: Policy, judged: Collection[EvictionRecord] | None = None
    ) -> DisruptionHistory:
        """The history to plan with on `snapshot` (`judged`: the landings already judged on it)."""
        ...

    def record(self, decision: Decision, outcomes: Sequence[Outcome], now: datetime) -> None: ...


def cycle_id_for(now: datetime) -> str:
    """A cycle id that is a valid label / taint value and says when: `20261129T120000Z`."""
    return now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


@dataclass(frozen=True)
class Evaluation:
    """What strategies and planner concluded about one snapshot, before anything was evicted."""

    snapshot: Snapshot
    decisions: tuple[Decision, ...]
    findings: tuple[Finding, ...]
    skipped: tuple[SkippedStrategy, ...]
    hints: tuple[str, ...]
    not_chosen: tuple[NotChosen, ...] = ()


def strategy_context(
    snapshot: Snapshot, loaded: LoadedPolicy, history: DisruptionHistory = NO_HISTORY
) -> StrategyContext:
    """What the strategies may consult: the static pod guards, what `history` holds back this cycle
    (when it holds any disruption), and prices."""
    prices = loaded.policy.prices
    cfg = loaded.policy.guards
    held = history.workloads or history.disruptions
    judged = partial(history_refusal, history=history, now=snapshot.now, cfg=cfg) if held else None
    return StrategyContext(
        refusal=partial(pod_refusal, snapshot=snapshot, cfg=cfg),
        refusals=partial(first_refusal, snapshot=snapshot, cfg=cfg),
        history_refusal=judged,
        gpu_prices=prices.per_gpu_hour,
        default_gpu_price=prices.default_per_gpu_hour,
    )


@dataclass(frozen=True)
class Proposed:
    """What the enabled strategies proposed and found about one snapshot, before the planner judged it."""

    proposals: tuple[Proposal, ...]
    findings: tuple[Finding, ...]
    skipped: tuple[SkippedStrategy, ...]
    hints: tuple[str, ...]
    not_chosen: tuple[NotChosen, ...] = ()


def propose(snapshot: Snapshot, loaded: LoadedPolicy, history: DisruptionHistory = NO_HISTORY) -> Proposed:
    """Run every enabled strategy in policy order: the strategies half of `evaluate`, told what
    `history` holds back."""
    ctx = strategy_context(snapshot, loaded, history)
    proposals: list[Proposal] = []
    findings: list[Finding] = []
    skipped: list[SkippedStrategy] = []
    hints: list[str] = []
    left: list[NotChosen] = []
    for configured in loaded.strategies:
        spec = get_strategy(configured.name)
        if spec is None:  # validated at load; kept for a registry changed underneath us
            skipped.append(SkippedStrategy(configured.name, "strategy is not installed"))
            continue
        if configured.args.needs_telemetry() and not snapshot.telemetry.available:
            problem = snapshot.telemetry.problem or "telemetry unavailable"
            skipped.append(SkippedStrategy(configured.name, f"needs GPU telemetry: {problem}"))
            continue
        result: StrategyResult = spec.run(snapshot, configured.args, ctx)
        if result.skipped is not None:
            skipped.append(SkippedStrategy(configured.name, result.skipped))
        # Within a strategy, higher priority first; strategies keep the policy's order.
        proposals.extend(sorted(result.proposals, key=lambda p: -p.priority))
        findings.extend(result.findings)
        hints.extend(result.hints)
        left.extend(result.not_chosen)
    return Proposed(tuple(proposals), tuple(findings), tuple(skipped), tuple(hints), tuple(left))


def evaluate(
    snapshot: Snapshot, loaded: LoadedPolicy, *, history: DisruptionHistory | None = None
) -> Evaluation:
    """Run every enabled strategy in policy order, then let the planner judge all proposals together."""
    with collector_paused():
        history = history or NO_HISTORY
        proposed = propose(snapshot, loaded, history)
        decisions = plan(proposed.proposals, snapshot, loaded.policy, history=history)
        circuits = _circuit_findings(snapshot, history, loaded.policy)
        return Evaluation(
            snapshot=snapshot,
            decisions=decisions,
            findings=(*snapshot.findings, *proposed.findings, *circuits),
            skipped=proposed.skipped,
            hints=proposed.hints,
            not_chosen=proposed.not_chosen,
        )


def _circuit_findings(snapshot: Snapshot, history: DisruptionHistory, policy: Policy) -> list[Finding]:
    return [
        Finding(
            kind=CIRCUIT_OPEN_FINDING,
            namespace=trip.workload.namespace,
            detail=(
                f"{trip.detail}: {plural(trip.pending, 'pod')} of {trip.workload.kind} {trip.workload.name} "
                f"evicted at {rfc3339.format_utc(trip.evicted_at)} are not scheduled; no eviction until they "
                "are placed or the circuit is reset"
            ),
        )
        for trip in open_circuits(snapshot, history, policy.eviction.reschedule_timeout)
    ]


def execute(
    evaluation: Evaluation, evictor: Evictor, memory: CycleMemory | None = None
) -> dict[tuple[str, str], Outcome]:
    """Hand every approved decision to the evictor, in planning order; the memory records each."""
    outcomes: dict[tuple[str, str], Outcome] = {}
    now = evaluation.snapshot.now
    for decision in evaluation.decisions:
        if decision.approved:
            done = evictor.evict(decision)
            if memory is not None:
                memory.record(decision, done, now)
            for outcome in done:
                outcomes[(outcome.namespace, outcome.pod)] = outcome
    return outcomes


_DONE = frozenset({"evicted", "would-evict"})
# Outcomes of workload actions that happened (or would): what owners are told of.
_NOTICED = frozenset(result for pair in RESULTS.values() for result in pair)
# A workload's GPUs given back (or that would be): scaled to 0, suspended, stopped, a bare pod evicted.
_RECLAIMED = frozenset(
    {"scaled", "would-scale", "suspended", "would-suspend", "stopped", "would-stop", *_DONE}
)


def _rows(decisions: Iterable[Decision], outcomes: dict[tuple[str, str], Outcome]) -> list[ReportedDecision]:
    rows: list[ReportedDecision] = []
    for decision in decisions:
        proposal = decision.proposal
        group = proposal.group or (_drain_group(proposal.node) if proposal.kind == "node" else None)
        for pod in proposal.pods:
            outcome = outcomes.get(pod.key) if decision.approved else None
            if not decision.approved and decision.blocked_pod not in (None, pod.key):
                # The refusal is about another pod of the same proposal: say so, not as if it were its own.
                whose = "drain" if proposal.kind == "node" else proposal.kind
                reason = (
                    f"not evicted: its {whose}'s refusal, not this pod's: {decision.reason} "
                    f"(wanted: {proposal.reason})"
                )
            elif not decision.approved:
                reason = f"{decision.reason} (wanted: {proposal.reason})"
            else:  # an approved decision's own reason says where the planner re-placed pods
                reason = f"{proposal.reason}; {decision.reason}" if decision.reason else proposal.reason
            if outcome is not None and outcome.detail and outcome.result not in _DONE:
                reason = f"{reason}; {outcome.result}: {outcome.detail}"
            rows.append(
                ReportedDecision(
                    strategy=proposal.strategy,
                    namespace=pod.namespace,
                    pod=pod.name,
                    node=pod.node_name,
                    action=_action(decision),
                    outcome=outcome.result if outcome is not None else None,
                    reason=reason,
                    blocked_by=decision.blocked_by,
                    group=group or pod.gang,
                    target_node=(decision.targets or proposal.targets).get(pod.key),
                    uid=pod.uid,
                    workload=proposal.action.ref if proposal.action is not None else None,
                )
            )
    return rows


def _drain_group(node: str | None) -> str | None:
    """The group id tying the rows of one node drain together: `drain/<node>`."""
    return f"drain/{node}" if node is not None else None


def _action(decision: Decision) -> Literal["evict", "skip", "notify", "reclaim", "clear"]:
    if not decision.approved:
        return "skip"
    action = decision.proposal.action
    return action.verb if action is not None else "evict"


def assemble_report(
    mode: Mode,
    evaluation: Evaluation,
    outcomes: dict[tuple[str, str], Outcome],
    loaded: LoadedPolicy,
    extra_findings: Sequence[Finding] = (),
    *,
    landings: Landings | None = None,
) -> CycleReport:
    snapshot = evaluation.snapshot
    landings = landings or Landings()
    rows = _rows(evaluation.decisions, outcomes)
    freed: list[str] = []
    for decision in evaluation.decisions:
        proposal = decision.proposal
        if decision.approved and all(
            (o := outcomes.get(p.key)) is not None and o.result in _DONE for p in proposal.pods
        ):
            freed.extend(n for n in proposal.nodes_freed if n in snapshot.nodes)
    gpus_freed = sum(snapshot.nodes[n].gpu_count for n in freed)
    reclaimed = [
        action
        for decision in evaluation.decisions
        if decision.approved
        and (action := decision.proposal.action) is not None
        and action.verb == "reclaim"
        and any(
            (o := outcomes.get(p.key)) is not None and o.result in _RECLAIMED for p in decision.proposal.pods
        )
    ]
    prices = loaded.policy.prices
    savings: float | None = None
    if prices.per_gpu_hour or prices.default_per_gpu_hour is not None:
        ctx = strategy_context(snapshot, loaded)
        savings = round(
            sum(
                snapshot.nodes[n].gpu_count * (ctx.price_per_gpu_hour(snapshot.nodes[n].gpu_model) or 0.0)
                for n in freed
            ),
            2,
        )
    summary = Summary(
        nodes=len(snapshot.nodes),
        gpus=snapshot.gpu_total,
        pods=sum(map(len, snapshot.pods_by_node.values())),  # the active pods: those bound to a node
        proposals=len(evaluation.decisions),
        evictions=sum(1 for r in rows if r.outcome in _DONE),
        blocked=sum(1 for r in rows if r.action == "skip" or r.outcome == "blocked-by-pdb"),
        blocked_by=dict(
            sorted(
                Counter(
                    r.blocked_by or r.outcome or "unknown"
                    for r in rows
                    if r.action == "skip" or r.outcome == "blocked-by-pdb"
                ).items()
            )
        ),
        nodes_freed=len(freed),
        gpus_freed=gpus_freed,
        estimated_savings_per_hour=savings,
        reclaims=len(reclaimed),
        gpus_reclaimed=round(sum(action.gpus for action in reclaimed), 3),
    )
    findings = tuple(_with_vram(f, snapshot) for f in (*evaluation.findings, *extra_findings))
    named = {*freed, *(f.node for f in findings if f.node is not None)}
    return CycleReport(
        mode=mode,
        now=snapshot.now,
        summary=summary,
        decisions=tuple(rows),
        findings=findings,
        skipped_strategies=evaluation.skipped,
        hints=evaluation.hints,
        freed_nodes=tuple(freed),
        proposals_by_strategy=dict(Counter(d.proposal.strategy for d in evaluation.decisions)),
        nodes={
            name: NodeFacts(gpu_model=node.gpu_model, gpus=node.gpu_count)
            for name in sorted(named)
            if (node := snapshot.nodes.get(name)) is not None
        },
        predictions=landings.checks,
        predictions_awaiting=landings.awaiting,
        notices=_notices(evaluation.decisions, outcomes, snapshot.now),
        not_chosen=evaluation.not_chosen,
        source=snapshot.source,
        policy_name=loaded.name,
        policy_digest=loaded.digest,
        gpu_nodes=gpu_map(snapshot, findings),
    )


def _notices(
    decisions: Iterable[Decision], outcomes: dict[tuple[str, str], Outcome], now: datetime
) -> tuple[WorkloadNotice, ...]:
    """One notice per workload action that was carried out (or would be, in a dry run)."""
    found: list[WorkloadNotice] = []
    for decision in decisions:
        action = decision.proposal.action
        if not decision.approved or action is None or not decision.proposal.pods:
            continue
        outcome = outcomes.get(decision.proposal.pods[0].key)
        if outcome is None or outcome.result not in _NOTICED:
            continue
        uid = action.controller.uid if action.controller is not None else ""
        found.append(notice(action, outcome.result, now, uid))
    return tuple(found)


def _with_vram(finding: Finding, snapshot: Snapshot) -> Finding:
    """A leaked-vram finding with the framebuffer it is about (the newest sample, every row of that GPU
    and pod), so the metrics need no snapshot."""
    if finding.kind != "leaked-vram" or finding.fb_used_mib is not None or not snapshot.telemetry.available:
        return finding
    for window in snapshot.telemetry.windows.values():
        rows = [
            row
            for row in window.by_node.get(finding.node or "", ())
            if (row.uuid, row.pod_namespace, row.pod_name) == (finding.gpu, finding.namespace, finding.pod)
        ]
        if rows:
            return replace(finding, fb_used_mib=sum(row.fb_used_mib or 0.0 for row in rows))
    return finding


def run_cycle(
    snapshot: Snapshot,
    loaded: LoadedPolicy,
    evictor: Evictor,
    sinks: Sequence[Sink] = (),
    *,
    memory: CycleMemory | None = None,
    cycle_id: str | None = None,
    on_sink_error: Callable[[Sink, Exception], None] | None = None,
) -> CycleReport:
    """One cycle on `snapshot`: plan with `memory`'s history (none given: a memory of this cycle only),
    evict within the evictor's frame, assemble the report and publish it to every sink.

    The frame always closes, `completed=False` when the cycle failed half-way (the exception then goes
    on). A failing sink never fails the cycle: its error goes to `on_sink_error` (the daemon logs it).
    """
    memory = memory if memory is not None else Memory()
    # The frame first: a live evictor taking a new leadership term loads the memory it then plans with.
    evictor.begin_cycle(snapshot, cycle_id or cycle_id_for(snapshot.now))
    # Judged on the history before `begin`, which drops what is judged here.
    landings = judge_landings(snapshot, memory.history, loaded.policy.eviction.reschedule_timeout)
    history = memory.begin(snapshot, loaded.policy, landings.judged)
    evaluation: Evaluation | None = None
    completed = False
    try:
        evaluation = evaluate(snapshot, loaded, history=history)
        outcomes = execute(evaluation, evictor, memory)
        completed = True
    finally:
        extra = evictor.end_cycle(evaluation.decisions if evaluation is not None else (), completed=completed)
    report = assemble_report(evictor.mode, evaluation, outcomes, loaded, extra, landings=landings)
    for sink in sinks:
        try:
            sink.publish(report)
        except Exception as exc:  # a sink is an edge: isolate it from the cycle
            if on_sink_error is not None:
                on_sink_error(sink, exc)
    return report
