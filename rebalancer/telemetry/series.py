"""What reading an exposition yields: `Series` of `Sample`s, or an `ExpositionError` naming file and line.

Owns these three types, shared by the exposition reader (`telemetry.exposition`, which re-exports them,
and `telemetry.exposition_documents`) and by everything that consumes series (the sources, `windows`,
`usage`, `waste`). It must not parse, do I/O or know what the series mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rebalancer.wording import clip

__all__ = ["ExpositionError", "Sample", "Series"]


@dataclass(frozen=True, slots=True)
class Sample:
    value: float
    # Seconds since the epoch; None when the exposition gave no timestamp (read as taken at `now`).
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class Series:
    """One time series (metric name + full label set) as read from one exposition."""

    metric: str
    labels: Mapping[str, str]
    samples: tuple[Sample, ...]
    source: str = ""


class ExpositionError(ValueError):
    """An exposition that cannot be read: one prometheus_client's parsers refuse, or one the project's
    own reader finds wrong (`telemetry.exposition_documents`: a series repeated, or interleaved with
    others of its family) or `telemetry.exposition` refuses (a timestamp out of its format's range,
    the same series twice at one instant). The message names the source (and line)."""

    def __init__(self, source: str, message: str, line: int | None = None) -> None:
        self.source = source
        self.line = line
        self.message = clip(message, 300)  # parser messages quote whole lines of the input
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {self.message}")
