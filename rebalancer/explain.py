"""`rebalancer explain`: every strategy's and the planner's verdict on one node or one pod, from a report.

Owns the reading of a finished CycleReport for one subject: for each strategy the policy runs, in
policy order, what it proposed about the subject and the planner's verdict on it (approved, or refused
by which guard), what it left alone and why (the strategies' `NotChosen` records), that it was skipped,
or that it said nothing about it; then the findings that name it. A pod is also explained through its
node (a node-level verdict, such as "not a candidate", is why none of its pods moved with a drain).

It is presentation over a report: it never plans, evicts, reads the clock or does I/O; the command
(`cli.cmd_explain`) runs the cycle, dry, and prints what this returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rebalancer.cycle_report import CycleReport, ReportedDecision
from rebalancer.model import Finding, NotChosen

__all__ = ["Subject", "explain_lines", "parse_subject"]

PLANNER = "planner"


@dataclass(frozen=True, slots=True)
class Subject:
    """A node (`namespace` None) or a pod, and for a pod the node it runs on when known."""

    name: str
    namespace: str | None = None
    node: str | None = None

    @property
    def is_pod(self) -> bool:
        return self.namespace is not None

    def __str__(self) -> str:
        return f"pod {self.namespace}/{self.name}" if self.is_pod else f"node {self.name}"


def parse_subject(text: str) -> Subject:
    """`NODE` or `NAMESPACE/POD`; ValueError naming what is wrong otherwise."""
    parts = text.split("/")
    if len(parts) == 1 and parts[0]:
        return Subject(parts[0])
    if len(parts) == 2 and all(parts):
        return Subject(parts[1], namespace=parts[0])
    raise ValueError(f"{text!r}: expected NODE or NAMESPACE/POD, e.g. gpu-a-3 or ml/train-0")


def _rows_about(report: CycleReport, subject: Subject) -> list[ReportedDecision]:
    if subject.is_pod:
        return [r for r in report.decisions if (r.namespace, r.pod) == (subject.namespace, subject.name)]
    return [r for r in report.decisions if subject.name in (r.node, r.target_node)]


def _records_about(report: CycleReport, subject: Subject) -> list[NotChosen]:
    if subject.is_pod:
        return [
            r
            for r in report.not_chosen
            if (r.namespace, r.pod) == (subject.namespace, subject.name)
            or (r.pod is None and subject.node is not None and r.node == subject.node)
        ]
    return [r for r in report.not_chosen if r.node == subject.name]


def _findings_about(report: CycleReport, subject: Subject) -> list[Finding]:
    if subject.is_pod:
        return [f for f in report.findings if (f.namespace, f.pod) == (subject.namespace, subject.name)]
    return [f for f in report.findings if f.node == subject.name]


def _row_lines(row: ReportedDecision, subject: Subject) -> list[str]:
    """What the strategy proposed about the subject (one row), then the planner's verdict on it."""
    pod = f"{row.namespace}/{row.pod}"
    if not subject.is_pod and row.node != subject.name:
        what = f"proposed moving {pod} from {row.node or '-'} onto it"
    else:
        verb = "evicting" if row.action in ("evict", "skip") else row.action
        target = f" to {row.target_node}" if row.target_node else ""
        group = f" [{row.group}]" if row.group else ""
        what = f"proposed {verb} {pod}{target}{group}"
    if row.action == "skip":
        verdict = f"{PLANNER}: refused by {row.blocked_by} guard: {row.reason}"
    else:
        done = f" ({row.outcome})" if row.outcome else ""
        verdict = f"{PLANNER}: approved{done}: {row.reason}"
    return [f"{row.strategy}: {what}", f"  {verdict}"]


def explain_lines(report: CycleReport, subject: Subject, strategies: Sequence[str]) -> list[str]:
    """The explanation, one verdict per line, every strategy of `strategies` (policy order) named."""
    head = f"{subject}"
    if subject.is_pod and subject.node:
        head += f" on node {subject.node}"
    where = ", ".join(
        x for x in (report.source, f"policy {report.policy_name}" if report.policy_name else "") if x
    )
    out = [
        f"{head} ({report.mode} cycle at {report.now:%Y-%m-%dT%H:%M:%SZ}" + (f", {where})" if where else ")")
    ]
    rows = _rows_about(report, subject)
    records = _records_about(report, subject)
    skipped = {s.strategy: s.reason for s in report.skipped_strategies}
    for name in _ordered(strategies, (r.strategy for r in rows), (r.strategy for r in records)):
        said = False
        if name in skipped:
            out.append(f"{name}: skipped: {skipped[name]}")
            said = True
        for row in (r for r in rows if r.strategy == name):
            out += _row_lines(row, subject)
            said = True
        for record in (r for r in records if r.strategy == name):
            about = "" if record.subject == f"node {subject.name}" else f"{record.subject}: "
            if subject.is_pod and record.pod is None:
                about = f"its node {record.node}: "
            out.append(f"{name}: {about}{record.reason}")
            said = True
        if not said:
            out.append(f"{name}: no verdict: nothing about this {'pod' if subject.is_pod else 'node'}")
    if not rows:
        out.append(f"{PLANNER}: nothing to judge: no strategy proposed anything about it")
    findings = _findings_about(report, subject)
    if findings:
        out.append("findings:")
        out += [f"  [{f.kind}] {f.detail}" for f in findings]
    return out


def _ordered(first: Sequence[str], *more: Iterable[str]) -> list[str]:
    """`first`, then any other name in `more` not in it, each once."""
    names = list(dict.fromkeys(first))
    for group in more:
        names += [n for n in group if n not in names]
    return list(dict.fromkeys(names))
