"""The Slack sink: a CycleReport as a Block Kit message to a Slack incoming webhook.

Owns the message layout (`build_message`): a header (evictions, nodes freed, mode), summary fields
(mode, evictions, blocked, nodes freed, GPUs freed, estimated savings), the evictions (pod, node,
target, strategy, outcome), the idle workloads told or reclaimed (the owner's message, with the
`kubectl annotate` that snoozes as code), the nodes freed, the top findings (of the kinds the sink
selects) and a button to `dashboard_url`, within Block Kit's limits (header 150 characters, section
text 3000, ten fields), plus a plain-text `text` fallback for notifications. Every string of the
message is redacted (`redaction.redact`): a finding that quotes a URL with credentials shows `***`
in their place.

The webhook URL is a secret: it is read from the env var or file the policy names at every delivery
(`notify.read_secret`), must be `https://` (plain HTTP only to a loopback host, e.g. a local relay),
and it never appears in a log line or an error. Delivery, retries, rate limit
and the worker thread are `notify`'s; this module must not block a cycle or decide anything.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rebalancer.cycle_report import CycleReport, ReportedDecision, WorkloadNotice
from rebalancer.model import Finding
from rebalancer.policy import SlackSinkConfig, plain_http_to_remote_host
from rebalancer.redaction import redact, redact_tree
from rebalancer.sinks.notify import Delivery, HttpSink, SinkError, read_secret, selected_findings
from rebalancer.wording import plural
from rebalancer.workloads import RESULTS

__all__ = ["SlackSink", "build_message"]

HEADER_LIMIT = 150
TEXT_LIMIT = 3000
MAX_EVICTIONS = 10
MAX_FINDINGS = 5
_DONE = ("would-evict", "evicted")
# Workload actions carried out (or that would be): told in their own section, never "not evicted".
_WORKLOAD_DONE = frozenset(result for pair in RESULTS.values() for result in pair)

Block = dict[str, Any]


def _escape(text: str) -> str:
    """Slack mrkdwn control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"${value:,.2f}/h"


def _headline(report: CycleReport, digest: Delivery | None) -> str:
    s = report.summary
    verb = "would evict" if report.mode == "dry-run" else "evicted"
    freed = "would free" if report.mode == "dry-run" else "freed"
    text = f"gpu-rebalancer {verb} {plural(s.evictions, 'pod')}, {freed} {plural(s.nodes_freed, 'node')}"
    if digest is not None and digest.digest_cycles:
        text = (
            f"{digest.digest_period or ''} dry-run digest ({plural(digest.digest_cycles, 'cycle')}): {text}"
        )
    elif report.mode == "dry-run":
        text += " (dry-run)"
    return _clip(text.strip(), HEADER_LIMIT)


def _section(title: str, lines: Sequence[str], more: int) -> Block:
    body = f"*{title}*\n" + "\n".join(lines)
    if more:
        body += f"\n…and {more} more"
    return {"type": "section", "text": {"type": "mrkdwn", "text": _clip(body, TEXT_LIMIT)}}


def _eviction_line(row: ReportedDecision) -> str:
    where = _escape(row.node or "?")
    if row.target_node:
        where += f" → {_escape(row.target_node)}"
    return (
        f"• `{_escape(row.namespace)}/{_escape(row.pod)}` on {where} ({_escape(row.strategy)}: {row.outcome})"
    )


def _notice_line(notice: WorkloadNotice) -> str:
    """The owner's message, the snooze command as code to copy."""
    text = _escape(redact(notice.message))
    if notice.snooze_command:
        text += f" To keep it: `{_escape(notice.snooze_command)}`"
    return _clip(f"• {text}", 600)


def _finding_line(finding: Finding) -> str:
    where = " ".join(
        _escape(x)
        for x in (finding.node, finding.gpu, f"{finding.namespace}/{finding.pod}" if finding.pod else None)
        if x
    )
    # Redacted before it is clipped: a clip must not cut a credential out of reach of the pattern.
    return _clip(f"• *{_escape(finding.kind)}* {where}: {_escape(redact(finding.detail))}", 400)


def build_message(
    report: CycleReport,
    *,
    dashboard_url: str | None = None,
    finding_kinds: tuple[str, ...] | None = None,
    delivery: Delivery | None = None,
) -> dict[str, Any]:
    """The Block Kit payload for one report (or one digest)."""
    s = report.summary
    headline = _headline(report, delivery)
    blocks: list[Block] = [{"type": "header", "text": {"type": "plain_text", "text": headline}}]
    fields = [
        ("Mode", report.mode),
        ("Evictions", str(s.evictions)),
        ("Blocked", str(s.blocked)),
        ("Nodes freed", str(s.nodes_freed)),
        ("GPUs freed", str(s.gpus_freed)),
        ("Est. savings", _money(s.estimated_savings_per_hour)),
        ("Cluster", f"{s.nodes} nodes, {s.gpus} GPUs, {s.pods} pods"),
        ("Snapshot", report.now.strftime("%Y-%m-%d %H:%M UTC")),
    ]
    blocks.append(
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{_escape(v)}"} for k, v in fields]}
    )

    evicted = [row for row in report.decisions if row.outcome in _DONE]
    if evicted:
        lines = [_eviction_line(row) for row in evicted[:MAX_EVICTIONS]]
        title = "Would evict" if report.mode == "dry-run" else "Evicted"
        blocks.append(_section(title, lines, len(evicted) - len(lines)))
    if report.notices:
        lines = [_notice_line(n) for n in report.notices[:MAX_EVICTIONS]]
        blocks.append(_section("Idle workloads", lines, len(report.notices) - len(lines)))
    failed = [
        row
        for row in report.decisions
        if row.outcome is not None and row.outcome not in _DONE and row.outcome not in _WORKLOAD_DONE
    ]
    if failed:
        counts = Counter(row.outcome for row in failed)
        lines = [
            f"• {outcome}: {count}" for outcome, count in sorted(counts.items(), key=lambda kv: str(kv[0]))
        ]
        blocks.append(_section("Not evicted", lines, 0))
    if report.freed_nodes:
        lines = [f"• {_escape(node)}" for node in report.freed_nodes[:MAX_EVICTIONS]]
        title = "Nodes that would be freed" if report.mode == "dry-run" else "Nodes freed"
        blocks.append(_section(title, lines, len(report.freed_nodes) - len(lines)))
    findings = selected_findings(report, finding_kinds)
    if findings:
        kinds = Counter(f.kind for f in findings)
        summary = ", ".join(f"{kind}: {count}" for kind, count in sorted(kinds.items()))
        lines = [_escape(summary), *(_finding_line(f) for f in findings[:MAX_FINDINGS])]
        blocks.append(_section("Top findings", lines, len(findings) - min(len(findings), MAX_FINDINGS)))
    if dashboard_url:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "Open dashboard"},
                        "url": dashboard_url,
                    }
                ],
            }
        )
    fallback = f"{headline}; blocked {s.blocked}; estimated savings {_money(s.estimated_savings_per_hour)}"
    message: dict[str, Any] = redact_tree({"text": fallback, "blocks": blocks})
    return message


class SlackSink(HttpSink[SlackSinkConfig]):
    """Posts Block Kit messages to the incoming webhook whose URL the policy's env var / file holds."""

    default_name = "slack"

    def send(self, delivery: Delivery) -> None:
        cfg = self.config
        url = read_secret(
            f"{self.name} webhook URL",
            env=cfg.webhook_url_env,
            file=cfg.webhook_url_file,
            environ=self._environ,
        )
        if url is None:  # the policy requires one of the two sources; never post without it
            raise SinkError(f"{self.name}: no webhook URL configured")
        if not url.startswith(("https://", "http://")) or plain_http_to_remote_host(url):
            raise SinkError(
                f"{self.name}: the webhook URL (webhook_url_env / webhook_url_file) is not https://: it is "
                "a secret, never sent in clear (plain http:// only to a loopback host)"
            )
        message = build_message(
            delivery.report,
            dashboard_url=cfg.dashboard_url,
            finding_kinds=cfg.finding_kinds,
            delivery=delivery,
        )
        body = json.dumps(message).encode()
        self._poster.post(self.name, url, body, {"Content-Type": "application/json; charset=utf-8"})
