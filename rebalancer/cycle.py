"""One rebalancing cycle, the only orchestration: strategies -> planner -> evictor -> report -> sinks.

Owns the order in which the pieces run and the assembly of the CycleReport. It takes an already built
Snapshot (the clock was read when the snapshot was made), so it never reads the clock itself, and it
never talks to the cluster or Prometheus directly: the evictor and sinks it is given are the edges.
Dry-run is the choice of a DryRunEvictor, not a flag here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from rebalancer.evictor import Evictor
from rebalancer.gcpause import collector_paused
from rebalancer.guards import pod_refusal
from rebalancer.model import (
    CycleReport,
    Decision,
    Finding,
    Mode,
    Outcome,
    Pod,
    Proposal,
    ReportedDecision,
    SkippedStrategy,
    Snapshot,
    StrategyResult,
    Summary,
)
from rebalancer.planner import DisruptionHistory, plan
from rebalancer.policy import LoadedPolicy
from rebalancer.registry import Refusal, StrategyContext, get_strategy


class Sink(Protocol):
    def publish(self, report: CycleReport) -> None: ...


@dataclass(frozen=True)
class Evaluation:
    """What strategies and planner concluded about one snapshot, before anything was evicted."""

    snapshot: Snapshot
    decisions: tuple[Decision, ...]
    findings: tuple[Finding, ...]
    skipped: tuple[SkippedStrategy, ...]
    hints: tuple[str, ...]


def strategy_context(snapshot: Snapshot, loaded: LoadedPolicy) -> StrategyContext:
    guards = loaded.policy.guards

    def refusal(pod: Pod) -> Refusal | None:
        return pod_refusal(pod, snapshot, guards)

    prices = loaded.policy.prices
    return StrategyContext(
        refusal=refusal,
        gpu_prices=prices.per_gpu_hour,
        default_gpu_price=prices.default_per_gpu_hour,
    )


def evaluate(
    snapshot: Snapshot, loaded: LoadedPolicy, *, history: DisruptionHistory | None = None
) -> Evaluation:
    """Run every enabled strategy in policy order, then let the planner judge all proposals together."""
    with collector_paused():
        return _evaluate(snapshot, loaded, history)


def _evaluate(snapshot: Snapshot, loaded: LoadedPolicy, history: DisruptionHistory | None) -> Evaluation:
    ctx = strategy_context(snapshot, loaded)
    proposals: list[Proposal] = []
    findings: list[Finding] = list(snapshot.findings)
    skipped: list[SkippedStrategy] = []
    hints: list[str] = []
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
    decisions = plan(proposals, snapshot, loaded.policy, history=history or DisruptionHistory())
    return Evaluation(
        snapshot=snapshot,
        decisions=decisions,
        findings=tuple(findings),
        skipped=tuple(skipped),
        hints=tuple(hints),
    )


def execute(evaluation: Evaluation, evictor: Evictor) -> dict[tuple[str, str], Outcome]:
    """Hand every approved decision to the evictor, in planning order."""
    outcomes: dict[tuple[str, str], Outcome] = {}
    for decision in evaluation.decisions:
        if decision.approved:
            for outcome in evictor.evict(decision):
                outcomes[(outcome.namespace, outcome.pod)] = outcome
    return outcomes


_DONE = frozenset({"evicted", "would-evict"})


def _rows(decisions: Iterable[Decision], outcomes: dict[tuple[str, str], Outcome]) -> list[ReportedDecision]:
    rows: list[ReportedDecision] = []
    for decision in decisions:
        proposal = decision.proposal
        for pod in proposal.pods:
            outcome = outcomes.get(pod.key) if decision.approved else None
            reason = (
                proposal.reason if decision.approved else f"{decision.reason} (wanted: {proposal.reason})"
            )
            if outcome is not None and outcome.detail and outcome.result not in _DONE:
                reason = f"{reason}; {outcome.result}: {outcome.detail}"
            rows.append(
                ReportedDecision(
                    strategy=proposal.strategy,
                    namespace=pod.namespace,
                    pod=pod.name,
                    node=pod.node_name,
                    action="evict" if decision.approved else "skip",
                    outcome=outcome.result if outcome is not None else None,
                    reason=reason,
                    blocked_by=decision.blocked_by,
                    group=proposal.group or pod.gang,
                    target_node=(decision.targets or proposal.targets).get(pod.key),
                )
            )
    return rows


def assemble_report(
    mode: Mode,
    evaluation: Evaluation,
    outcomes: dict[tuple[str, str], Outcome],
    loaded: LoadedPolicy,
) -> CycleReport:
    snapshot = evaluation.snapshot
    rows = _rows(evaluation.decisions, outcomes)
    freed: list[str] = []
    for decision in evaluation.decisions:
        proposal = decision.proposal
        if decision.approved and all(
            (o := outcomes.get(p.key)) is not None and o.result in _DONE for p in proposal.pods
        ):
            freed.extend(n for n in proposal.nodes_freed if n in snapshot.nodes)
    gpus_freed = sum(snapshot.nodes[n].gpu_count for n in freed)
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
        pods=sum(1 for p in snapshot.pods if p.is_active),
        proposals=len(evaluation.decisions),
        evictions=sum(1 for r in rows if r.outcome in _DONE),
        blocked=sum(1 for r in rows if r.action == "skip" or r.outcome == "blocked-by-pdb"),
        nodes_freed=len(freed),
        gpus_freed=gpus_freed,
        estimated_savings_per_hour=savings,
    )
    return CycleReport(
        mode=mode,
        now=snapshot.now,
        summary=summary,
        decisions=tuple(rows),
        findings=evaluation.findings,
        skipped_strategies=evaluation.skipped,
        hints=evaluation.hints,
        freed_nodes=tuple(freed),
    )


def run_cycle(
    snapshot: Snapshot,
    loaded: LoadedPolicy,
    evictor: Evictor,
    sinks: Sequence[Sink] = (),
    *,
    history: DisruptionHistory | None = None,
    on_sink_error: Callable[[Sink, Exception], None] | None = None,
) -> CycleReport:
    """Evaluate, evict through `evictor`, assemble the report and publish it to every sink.

    A failing sink never fails the cycle: its error goes to `on_sink_error` (the daemon logs it).
    """
    evaluation = evaluate(snapshot, loaded, history=history)
    outcomes = execute(evaluation, evictor)
    report = assemble_report(evictor.mode, evaluation, outcomes, loaded)
    for sink in sinks:
        try:
            sink.publish(report)
        except Exception as exc:  # a sink is an edge: isolate it from the cycle
            if on_sink_error is not None:
                on_sink_error(sink, exc)
    return report
