"""`rebalancer advise`'s PromQL: every series' long-window usage (steps, peak, p95), one query per metric.

Owns the expression (`usage_query`) and the reading of its answers (`usage_of`); the requests are
`PrometheusTelemetrySource.usage`'s, through the source's one HTTP client. The rules are
`rebalancer.usage`'s, which computes the same figures from raw samples: per step `(t - step, t]` (a
range one millisecond short of the step, as in `prometheus_steps`) the largest sample of each series
(`max_over_time`: NaN only when every sample is), series differing only in labels the advisor does not
read made one (`max by`); a step is good when its value is a number, not negative and not a DCGM blank
(the comparisons drop NaN too); over the period, `count_over_time` of every step and of the good ones,
`max_over_time` and `quantile_over_time(0.95)` of the good ones, told apart by a label. Pure: no I/O, no
clock.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

from rebalancer.period import Period
from rebalancer.policy import MetricConfig, TelemetryConfig
from rebalancer.sources.prometheus_http import PrometheusError
from rebalancer.telemetry.identity import DCGM_BLANKS, DCGM_INT64_BLANK, format_labels
from rebalancer.usage import P95, LabelKey, MetricUsage, usage_labels

__all__ = ["USAGE_LABEL", "usage_of", "usage_query"]

# The label `usage_query` adds to tell its four answers apart.
USAGE_LABEL = "rebalancer_usage"
_STATS = ("all", "steps", "peak", "p95")


def usage_query(cfg: TelemetryConfig, metric: MetricConfig, window: Period) -> str:
    """The one PromQL expression of one metric's usage, to evaluate at `window.end`."""
    labels = ", ".join(usage_labels(cfg))
    per_step = f"max by ({labels}) (max_over_time({metric.name}[{window.step * 1000 - 1}ms]))"
    not_blank = "".join(f" != {blank!r}" for blank in sorted(DCGM_BLANKS))
    good = f"{per_step} >= 0 < {DCGM_INT64_BLANK!r}{not_blank}"
    steps = f"[{window.seconds * 1000 - 1}ms:{window.step}s]"
    answers = {
        "all": f"count_over_time(({per_step}){steps})",
        "steps": f"count_over_time(({good}){steps})",
        "peak": f"max_over_time(({good}){steps})",
        "p95": f"quantile_over_time({P95!r}, ({good}){steps})",
    }
    return " or ".join(
        f'label_replace({expr}, "{USAGE_LABEL}", "{stat}", "", "")' for stat, expr in answers.items()
    )


def _count(raw: float, expr: str) -> int:
    if not math.isfinite(raw) or raw < 0 or raw != int(raw):
        raise PrometheusError(f"{expr}: a step count of {raw!r} is not a count")
    return int(raw)


def usage_of(
    vector: Mapping[LabelKey, float], metric: MetricConfig, expr: str
) -> dict[LabelKey, MetricUsage]:
    """`usage_query`'s answer: the usage of each series (by its labels), in the model's unit."""
    found: dict[LabelKey, dict[str, float]] = defaultdict(dict)
    for key, value in vector.items():
        stat = dict(key).get(USAGE_LABEL)
        if stat not in _STATS:
            raise PrometheusError(f"{expr}: a series without its {USAGE_LABEL} label: {format_labels(key)}")
        found[tuple((k, v) for k, v in key if k != USAGE_LABEL)][stat] = value
    usages: dict[LabelKey, MetricUsage] = {}
    for key, stats in sorted(found.items()):
        every = _count(stats.get("all", 0), expr)
        good = _count(stats.get("steps", 0), expr)
        if good > every or (good > 0) != ("peak" in stats and "p95" in stats):
            raise PrometheusError(f"{expr}: an incomplete answer for {format_labels(key)}: {stats}")
        usages[key] = MetricUsage(
            steps=good,
            bad_steps=every - good,
            peak=stats["peak"] * metric.scale if good else None,
            p95=stats["p95"] * metric.scale if good else None,
        )
    return usages
