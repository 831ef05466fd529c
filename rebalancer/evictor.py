"""Evictors carry out approved decisions, one Outcome per pod in the decision's order: the protocol,
and the evictor that makes no request.

Owns the `Evictor` protocol every evictor implements (framed by `begin_cycle` / `end_cycle`), the
`UnframedEvictor` base, and `DryRunEvictor`: no I/O at all; every pod `would-evict` (a workload action's
pods `would-notify`, `would-scale`...). Dry-run is this choice of evictor.

The evictor that talks to the Eviction API is rebalancer.kube_evictor's `KubeEvictor`. This module must
not import the Kubernetes client (or anything that does): a snapshot evaluated offline, a simulation
and `--help` use only what is here, and start without it. It must not plan either: no choosing,
ordering or re-checking of guards and budgets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rebalancer.model import (
    NOT_ATTEMPTED,
    Decision,
    Finding,
    Mode,
    Outcome,
    OutcomeResult,
    Pod,
    Snapshot,
)
from rebalancer.workloads import result_of

__all__ = [
    "DryRunEvictor",
    "Evictor",
    "UnframedEvictor",
    "approved_pods",
    "not_attempted",
]


class Evictor(Protocol):
    """Carries out approved decisions, framed by the cycle they belong to.

    `begin_cycle(snapshot, cycle_id)` before the first decision; `evict(decision)`: one Outcome per pod
    of the decision, in order; `end_cycle(decisions, completed=...)` after the last, with every decision
    of the cycle (refused ones included) and whether the cycle got through all of them: the findings
    of the evictor's own (drain marks removed...). The dry-run evictor's frame does nothing.
    """

    mode: Mode

    def begin_cycle(self, snapshot: Snapshot, cycle_id: str) -> None: ...

    def evict(self, decision: Decision) -> tuple[Outcome, ...]: ...

    def end_cycle(self, decisions: Sequence[Decision], *, completed: bool) -> tuple[Finding, ...]: ...


class UnframedEvictor:
    """A base for evictors with nothing to do at the start and the end of a cycle."""

    def begin_cycle(self, snapshot: Snapshot, cycle_id: str) -> None:
        return None

    def end_cycle(self, decisions: Sequence[Decision], *, completed: bool) -> tuple[Finding, ...]:
        return ()


def not_attempted(after: Pod, result: OutcomeResult) -> str:
    return f"{NOT_ATTEMPTED}plan stopped after {after.ref} {result}"


def approved_pods(decision: Decision) -> tuple[Pod, ...]:
    if not decision.approved:
        raise ValueError(
            f"refused decision handed to an evictor ({decision.proposal.strategy}: {decision.blocked_by})"
        )
    return decision.pods_in_order


class DryRunEvictor(UnframedEvictor):
    """Evicts nothing and makes no request: every pod of an approved decision `would-evict`."""

    mode: Mode = "dry-run"

    def evict(self, decision: Decision) -> tuple[Outcome, ...]:
        pods = approved_pods(decision)
        action = decision.proposal.action
        result = result_of(action, dry_run=True) if action is not None else "would-evict"
        return tuple(Outcome(p.namespace, p.name, result) for p in pods)
