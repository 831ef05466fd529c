"""The log sink: a CycleReport as structured log lines (structlog), and the daemon's logging setup.

Owns what an operator reads in `kubectl logs`: one line per decision (pod, node, verdict, guard,
target, reason) and one summary line per cycle, plus `configure_logging()`, which renders every log
line, structlog's and the standard library's (the evictor logs through `logging`), as JSON (in a
cluster) or as readable console lines (on a TTY), with the context bound by the daemon (`cycle_id`).

It must not decide or filter anything, and it never raises into the cycle. Secrets never reach it: it
only sees reports.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from typing import IO, Any, Literal

import structlog

from rebalancer.model import CycleReport
from rebalancer.report import to_dict

__all__ = ["LogFormat", "LogSink", "configure_logging"]

LogFormat = Literal["auto", "json", "console"]


class LogSink:
    """Publishes a report as log lines: `decision` per pod row, then `cycle report`."""

    name = "log"

    def __init__(self, logger: Any = None) -> None:
        self._log = logger if logger is not None else structlog.get_logger("rebalancer.cycle")

    def publish(self, report: CycleReport) -> None:
        doc = to_dict(report)  # the fields of the JSON report, so logs and `--output json` agree
        for row in doc["decisions"]:
            self._log.info("decision", **row)
        self._log.info(
            "cycle report",
            mode=report.mode,
            now=report.now.isoformat(),
            **doc["summary"],
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
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
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
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
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
