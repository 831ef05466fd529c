"""Whether a utilisation aggregate a Prometheus answered is possible at all, before anything reads it.

Owns the plausibility rules of one series' (count, sum, max) over a window, as `count_over_time`,
`sum_over_time` and `max_over_time` answer them: each finite and not negative (nor a DCGM blank), the
count a whole number of at least 1 and at most what the scrape interval allows
(`max_samples`: window / scrape_interval + `ALIGNMENT_SLACK`), the mean and the maximum within
0-100 % once the metric's scale is applied, and the mean not above the maximum (so the sum is at most
count * 100 % and count * max). A series with one of the three and not the others is a partial
answer, not a reading. The same rules hold for the sums and maximum of several series answered as one
(`series`, as the live source aggregates the series of one label set): the count is then bounded by
that many series' samples. `utilisation_problem` says what is wrong (None: plausible);
`UtilisationRule` is the same for one window, its bound worked out once;
`unusable_gpu_finding` is the `bad-telemetry` finding that names the GPU, metric and window.

The caller treats a GPU with an impossible aggregate as having no telemetry at all: no strategy may
read it as idle or under-used. It must not do I/O, read the clock or know about strategies.
"""

from __future__ import annotations

import math

from rebalancer.model import Finding
from rebalancer.policy import format_duration
from rebalancer.telemetry.identity import SeriesIdentity, bad_telemetry_finding, is_valid_value

__all__ = [
    "ALIGNMENT_SLACK",
    "MAX_PERCENT",
    "UtilisationRule",
    "max_samples",
    "unusable_gpu_finding",
    "utilisation_problem",
]

# Samples a series may hold beyond window / scrape_interval: both ends of the window are inclusive,
# and scrape times drift a little against the window's edges.
ALIGNMENT_SLACK = 2
# The most a utilisation can be, once the metric's scale is applied: above it (or below 0) is bad data.
MAX_PERCENT = 100.0
# Float sums of integer percentages are compared with this relative slack.
_EPSILON = 1e-9


def max_samples(window: int, scrape_interval: int) -> int:
    """The most samples one series can hold in `window` seconds when scraped every `scrape_interval`."""
    return window // max(scrape_interval, 1) + ALIGNMENT_SLACK


def _number(value: float) -> str:
    return f"{value:.6g}"


def utilisation_problem(
    count: float | None,
    total: float | None,
    peak: float | None,
    *,
    window: int,
    scrape_interval: int,
    scale: float,
    series: float = 1,
) -> str | None:
    """What makes one series' utilisation (count, sum, max) over `window` impossible; None when plausible.

    `total` and `peak` are in the exporter's unit; `scale` turns them into percent. `series`: how many
    series the count and sum add up (and the maximum is of), each held to the per-series bound.
    """
    return UtilisationRule(window, scrape_interval, scale).problem(count, total, peak, series)


class UtilisationRule:
    """`utilisation_problem` for one window, scrape interval and scale, its sample bound worked out once:
    what the live source asks of every label set of a window (84,486 at 5,000 nodes)."""

    __slots__ = ("_bound", "_scale", "_scrape_interval")

    def __init__(self, window: int, scrape_interval: int, scale: float) -> None:
        self._bound = max_samples(window, scrape_interval)
        self._scrape_interval = scrape_interval
        self._scale = scale

    def problem(
        self, count: float | None, total: float | None, peak: float | None, series: float = 1
    ) -> str | None:
        """`utilisation_problem(count, total, peak, series=series)` over this rule's window."""
        if count is None or total is None or peak is None:
            given = {"count": count, "sum": total, "max": peak}
            missing = [name for name, value in given.items() if value is None]
            present = [name for name, value in given.items() if value is not None]
            return f"the answer has its {', '.join(present)} but no {', '.join(missing)} (a partial answer)"
        if not (is_valid_value(count) and is_valid_value(total) and is_valid_value(peak)):
            for name, value in (("count", count), ("sum", total), ("max", peak)):
                if not is_valid_value(value):
                    return f"its {name} {_number(value)} is NaN, infinite, negative or a DCGM blank value"
        if count != math.floor(count) or count < 1:
            return f"its count {_number(count)} is not a whole number of samples"
        if series != 1 and (not math.isfinite(series) or series != math.floor(series) or series < 1):
            return f"its series count {_number(series)} is not a whole number of series"
        bound = self._bound
        if count > bound * series:
            held = "a series" if series == 1 else f"{_number(series)} series"
            return (
                f"its count {_number(count)} is more than the {_number(bound * series)} samples {held} "
                f"scraped every {format_duration(self._scrape_interval)} can hold (telemetry.scrape_interval)"
            )
        mean, top = total / count * self._scale, peak * self._scale
        if top > MAX_PERCENT * (1 + _EPSILON):
            return f"its maximum {_number(top)}% is above 100%"
        if mean > MAX_PERCENT * (1 + _EPSILON):
            return f"its mean (sum / count) {_number(mean)}% is above 100%"
        if mean > top * (1 + _EPSILON) + _EPSILON:
            return f"its mean (sum / count) {_number(mean)}% is above its maximum {_number(top)}%"
        return None


def unusable_gpu_finding(
    identity: SeriesIdentity, metric: str, window: int, source: str, what: str
) -> Finding:
    """The `bad-telemetry` finding for a GPU whose telemetry is ignored because of an impossible answer."""
    device = identity.uuid
    if identity.mig_instance is not None:
        device = f"{identity.uuid} MIG {identity.mig_instance}"
    return bad_telemetry_finding(
        identity,
        f"{metric} of GPU {device} on node {identity.node} over {format_duration(window)} from "
        f"{source}: {what}; this GPU's telemetry is ignored this cycle (treated as none)",
    )
