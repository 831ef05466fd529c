"""`rebalancer waste`'s PromQL: idle and covered steps of every utilisation series over a period.

Owns the one expression (`idle_steps_query`) and the reading of its answer (`steps_of`); the request
itself is `PrometheusTelemetrySource.idle_steps`'s, through the source's one HTTP client. Pure: no
I/O, no clock.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

from rebalancer.period import Period
from rebalancer.policy import TelemetryConfig
from rebalancer.sources.prometheus_http import PrometheusError
from rebalancer.telemetry.identity import format_labels, resolve_preset
from rebalancer.telemetry.sanity import MAX_PERCENT
from rebalancer.waste import SeriesSteps, mapped_labels

__all__ = ["WASTE_LABEL", "idle_steps_query", "steps_of"]

LabelKey = tuple[tuple[str, str], ...]

# The label `idle_steps_query` adds to tell its two answers apart: `covered` and `idle` steps.
WASTE_LABEL = "rebalancer_waste"


def idle_steps_query(cfg: TelemetryConfig, window: Period, threshold_percent: float) -> str:
    """The one PromQL expression of `idle_steps`, to evaluate at `window.end`.

    Per step `(t - step, t]` (a range one millisecond short of the step: Prometheus 2.x ranges include
    both ends, and a sample on a step boundary belongs to one step only; on 3.x, whose ranges are
    left-open, a sample exactly 1 ms after a boundary is missed), each series' mean is `sum_over_time /
    count_over_time` (exact, where `avg_over_time`'s running mean drifts in the last digits), and
    series differing only in labels the mapping does not read are one (`max by`). The subquery steps
    through the period one millisecond short of it, so its first step ends one step after the start;
    steps are aligned to the epoch, as `window.end` is. `count_over_time` of it counts the steps with a
    sample, `sum_over_time` of `< bool threshold` the idle ones; `label_replace` tells them apart. A
    series' step holding a sample below 0 or above 100 % (`min_over_time` / `max_over_time`, which pass
    over NaN) is left out of the idle judgement (`unless`) and still covers the step: bad data is never
    idle.
    """
    cfg = resolve_preset(cfg)
    metric = cfg.utilization.name
    inner = f"[{window.step * 1000 - 1}ms]"
    mean = f"sum_over_time({metric}{inner}) / count_over_time({metric}{inner})"
    ceiling = MAX_PERCENT / cfg.utilization.scale
    impossible = f"min_over_time({metric}{inner}) < 0 or max_over_time({metric}{inner}) > {ceiling!r}"
    by = f"max by ({', '.join(mapped_labels(cfg.labels))})"
    steps = f"[{window.seconds * 1000 - 1}ms:{window.step}s]"
    threshold = threshold_percent / cfg.utilization.scale
    covered = f"count_over_time(({by} ({mean})){steps})"
    idle = f"sum_over_time(({by} ({mean} unless ({impossible})) < bool {threshold!r}){steps})"
    return (
        f'label_replace({covered}, "{WASTE_LABEL}", "covered", "", "") or '
        f'label_replace({idle}, "{WASTE_LABEL}", "idle", "", "")'
    )


def _step_count(raw: float, expr: str) -> int:
    if not math.isfinite(raw) or raw < 0 or raw != int(raw):
        raise PrometheusError(f"{expr}: a step count of {raw!r} is not a count")
    return int(raw)


def steps_of(vector: Mapping[LabelKey, float], expr: str) -> list[SeriesSteps]:
    """`idle_steps_query`'s answer: one covered and one idle count per series."""
    counts: dict[LabelKey, dict[str, int]] = defaultdict(dict)
    for key, value in vector.items():
        kind = dict(key).get(WASTE_LABEL)
        if kind not in ("covered", "idle"):
            raise PrometheusError(f"{expr}: a series without its {WASTE_LABEL} label: {format_labels(key)}")
        counts[tuple((k, v) for k, v in key if k != WASTE_LABEL)][kind] = _step_count(value, expr)
    steps: list[SeriesSteps] = []
    for key, found in sorted(counts.items()):
        covered, idle = found.get("covered"), found.get("idle", 0)
        if covered is None or idle > covered:
            raise PrometheusError(f"{expr}: {idle} idle of {covered} covered steps for {format_labels(key)}")
        steps.append(SeriesSteps(labels=dict(key), covered=covered, idle=idle))
    return steps
