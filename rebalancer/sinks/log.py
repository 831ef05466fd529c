"""The log sink: a CycleReport as structured log lines (structlog), and the daemon's logging setup.

Owns what an operator reads in `kubectl logs`: one line per decision (pod, node, verdict, guard,
target, reason) and one summary line per cycle, plus `configure_logging()`, which renders every log
line, structlog's and the standard library's (the evictor logs through `logging`), as JSON (in a
cluster) or as readable console lines (on a TTY), with the context bound by the daemon (`cycle_id`).

Credentials never reach a log line: `redact_event` (a structlog processor, last before the renderer,
for structlog's lines and the standard library's alike) passes every string of every event through
`redaction.redact`, exceptions included; console lines are redacted once more as rendered text.
`redact_tree()` is the same for a JSON document (the report a sink or `/report` sends).

It must not decide or filter anything, and it never raises into the cycle.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from collections.abc import MutableMapping
from typing import IO, Any, Literal

import structlog

from rebalancer.cycle_report import CycleReport
from rebalancer.redaction import redact, redact_tree
from rebalancer.report import decision_dict, summary_dict

__all__ = ["LogFormat", "LogSink", "configure_logging", "redact_event", "redact_tree"]

LogFormat = Literal["auto", "json", "console"]

# What structlog's stdlib bridge keeps in an event for the renderer: objects, not text to show.
_META_KEYS = frozenset({"exc_info", "_record", "_from_structlog"})


def redact_event(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: every string value of the event redacted (`event` and `exception` too)."""
    for key, value in list(event_dict.items()):
        if key not in _META_KEYS:
            event_dict[key] = redact_tree(value)
    return event_dict


class _RedactedConsole:
    """The console renderer, its output redacted once more (it formats tracebacks itself)."""

    def __init__(self, renderer: structlog.dev.ConsoleRenderer) -> None:
        self._renderer = renderer

    def __call__(self, logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> str:
        return redact(str(self._renderer(logger, method, event_dict)))


class LogSink:
    """Publishes a report as log lines: `decision` per pod row, then `cycle report`."""

    name = "log"

    def __init__(self, logger: Any = None) -> None:
        self._log = logger if logger is not None else structlog.get_logger("rebalancer.cycle")

    def publish(self, report: CycleReport) -> None:
        # The fields of the JSON report, so logs and `--output json` agree; not the whole report (its GPU
        # map alone is 40,000 cells at 5,000 nodes).
        for decision in report.decisions:
            self._log.info("decision", **decision_dict(decision))
        self._log.info(
            "cycle report",
            mode=report.mode,
            now=report.now.isoformat(),
            **summary_dict(report.summary),
            freed_nodes=list(report.freed_nodes),
            findings=dict(sorted(Counter(f.kind for f in report.findings).items())),
            skipped_strategies=[f"{x.strategy}: {x.reason}" for x in report.skipped_strategies],
        )


def configure_logging(
    fmt: LogFormat = "auto", *, stream: IO[str] | None = None, level: int = logging.INFO
) -> None:
    """Route structlog and stdlib logging to `stream` (stderr), as JSON or console lines.

    `auto` picks console on a TTY and JSON otherwise. Context bound with `structlog.contextvars`
    (the daemon's `cycle_id`) appears on every line, stdlib ones included.
    """
    out = stream if stream is not None else sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any
    if use_json:
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = _RedactedConsole(structlog.dev.ConsoleRenderer(colors=out.isatty()))
    structlog.configure(
        processors=[
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,  # tests re-configure; loggers must follow
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, redact_event, renderer],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    # The scheduler logs every job run at INFO; the daemon logs cycles itself.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
