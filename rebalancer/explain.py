"""`rebalancer explain`: every strategy's and the planner's verdict on one node or one pod, from a report.

Owns the reading of a finished CycleReport for one subject: for each strategy the policy runs, in
policy order, what it proposed about the subject and the planner's verdict on it (approved, or refused
by which guard), what it left alone and why (the strategies' `NotChosen` records), that it was skipped,
or that it said nothing about it; then the findings that name it. A pod is also explained through its
node (a node-level verdict, such as "not a candidate", is why none of its pods moved with a drain).
One `Explanation` holds all of it; it is printed as lines (`explain_lines`) or, kubectl's habit, as
a JSON or YAML document of the same content (`explanation_dict`, `render_explanation`), every string
redacted as the report's are wherever it is shown.

It is presentation over a report: it never plans, evicts, reads the clock or does I/O; the command
(`cli.cmd_explain`) runs the cycle, dry, and prints what this returns.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from rebalancer.cycle_report import CycleReport, ReportedDecision
from rebalancer.model import Finding, NotChosen
from rebalancer.redaction import redact, redact_tree
from rebalancer.report import decision_dict, finding_dict
from rebalancer.rfc3339 import format_utc

__all__ = [
    "ExplainFormat",
    "Explanation",
    "Subject",
    "explain",
    "explain_lines",
    "explanation_dict",
    "parse_subject",
    "render_explanation",
]

PLANNER = "planner"

ExplainFormat = Literal["text", "json", "yaml"]


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


@dataclass(frozen=True, slots=True)
class StrategyVerdict:
    """What one strategy said about the subject: skipped (why), the report's rows about it (each with
    the planner's verdict), and its records of leaving the subject (or, for a pod, its node) alone."""

    strategy: str
    skipped: str | None
    rows: tuple[ReportedDecision, ...]
    not_chosen: tuple[NotChosen, ...]

    @property
    def silent(self) -> bool:
        return self.skipped is None and not self.rows and not self.not_chosen


@dataclass(frozen=True, slots=True)
class Explanation:
    """Every strategy's and the planner's verdict on one subject, and the findings naming it."""

    report: CycleReport
    subject: Subject
    strategies: tuple[StrategyVerdict, ...]
    findings: tuple[Finding, ...]


def explain(report: CycleReport, subject: Subject, strategies: Sequence[str]) -> Explanation:
    """The explanation of `subject`, every strategy of `strategies` (policy order) named, then any
    other strategy the report has something from about it."""
    rows = _rows_about(report, subject)
    records = _records_about(report, subject)
    skipped = {s.strategy: s.reason for s in report.skipped_strategies}
    verdicts = tuple(
        StrategyVerdict(
            strategy=name,
            skipped=skipped.get(name),
            rows=tuple(r for r in rows if r.strategy == name),
            not_chosen=tuple(r for r in records if r.strategy == name),
        )
        for name in _ordered(strategies, (r.strategy for r in rows), (r.strategy for r in records))
    )
    return Explanation(report, subject, verdicts, tuple(_findings_about(report, subject)))


def explain_lines(report: CycleReport, subject: Subject, strategies: Sequence[str]) -> list[str]:
    """The explanation, one verdict per line, every strategy of `strategies` (policy order) named."""
    return _lines(explain(report, subject, strategies))


def _lines(explanation: Explanation) -> list[str]:
    report, subject = explanation.report, explanation.subject
    head = f"{subject}"
    if subject.is_pod and subject.node:
        head += f" on node {subject.node}"
    where = ", ".join(
        x for x in (report.source, f"policy {report.policy_name}" if report.policy_name else "") if x
    )
    out = [
        f"{head} ({report.mode} cycle at {report.now:%Y-%m-%dT%H:%M:%SZ}" + (f", {where})" if where else ")")
    ]
    for verdict in explanation.strategies:
        name = verdict.strategy
        if verdict.skipped is not None:
            out.append(f"{name}: skipped: {verdict.skipped}")
        for row in verdict.rows:
            out += _row_lines(row, subject)
        for record in verdict.not_chosen:
            about = "" if record.subject == f"node {subject.name}" else f"{record.subject}: "
            if subject.is_pod and record.pod is None:
                about = f"its node {record.node}: "
            out.append(f"{name}: {about}{record.reason}")
        if verdict.silent:
            out.append(f"{name}: no verdict: nothing about this {'pod' if subject.is_pod else 'node'}")
    if not any(verdict.rows for verdict in explanation.strategies):
        out.append(f"{PLANNER}: nothing to judge: no strategy proposed anything about it")
    if explanation.findings:
        out.append("findings:")
        out += [f"  [{f.kind}] {f.detail}" for f in explanation.findings]
    return out


def explanation_dict(explanation: Explanation) -> dict[str, Any]:
    """The explanation as a document: the same content as its lines, in the report's own keys.

    `strategies`: one entry per strategy, in the lines' order, with `verdict`, what it amounts to
    (`proposed`, `not-chosen`, `skipped`, `none`), `skipped` (its reason, or null), `proposals` (the
    report's rows about the subject in `decisions` keys, `reason` being the planner's, plus
    `planner`: its `verdict`, `approved` or `refused`, and the `guard` that refused) and
    `not_chosen` (`code`, `reason`, `node`, `namespace`, `pod`: a record whose `pod` is null is
    about a node). Not redacted: `render_explanation` redacts wherever it is shown.
    """
    report, subject = explanation.report, explanation.subject
    return {
        "subject": {
            "kind": "pod" if subject.is_pod else "node",
            "name": subject.name,
            "namespace": subject.namespace,
            "node": subject.node if subject.is_pod else subject.name,
        },
        "mode": report.mode,
        "now": format_utc(report.now),
        "source": report.source or None,
        "policy": {"name": report.policy_name or None, "digest": report.policy_digest or None},
        "strategies": [_verdict_dict(verdict) for verdict in explanation.strategies],
        "findings": [finding_dict(f) for f in explanation.findings],
    }


def _verdict_dict(verdict: StrategyVerdict) -> dict[str, Any]:
    if verdict.rows:
        said = "proposed"
    elif verdict.not_chosen:
        said = "not-chosen"
    elif verdict.skipped is not None:
        said = "skipped"
    else:
        said = "none"
    return {
        "strategy": verdict.strategy,
        "verdict": said,
        "skipped": verdict.skipped,
        "proposals": [
            {
                **decision_dict(row),
                "planner": {
                    "verdict": "refused" if row.action == "skip" else "approved",
                    "guard": row.blocked_by,
                },
            }
            for row in verdict.rows
        ],
        "not_chosen": [
            {"code": r.code, "reason": r.reason, "node": r.node, "namespace": r.namespace, "pod": r.pod}
            for r in verdict.not_chosen
        ],
    }


def render_explanation(
    report: CycleReport, subject: Subject, strategies: Sequence[str], fmt: ExplainFormat
) -> str:
    """The explanation as `fmt` prints it (text lines, or one JSON / YAML document), redacted."""
    explanation = explain(report, subject, strategies)
    if fmt == "text":
        return "".join(f"{redact(line)}\n" for line in _lines(explanation))
    doc = redact_tree(explanation_dict(explanation))
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    text: str = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    return text


def _ordered(first: Sequence[str], *more: Iterable[str]) -> list[str]:
    """`first`, then any other name in `more` not in it, each once."""
    names = list(dict.fromkeys(first))
    for group in more:
        names += [n for n in group if n not in names]
    return list(dict.fromkeys(names))
