"""The PromQL of a live telemetry read: the fixed plan, and the one follow-up query for late series.

Owns the expressions and nothing else: `sources.prometheus` asks them and reads the answers,
`sources.prometheus_http` sends them. Pure: no I/O, no clock.

Every expression aggregates `by` the labels the policy's mapping reads (`identity_labels`: the node,
UUID, pod, namespace, GPU index, model and MIG candidates), so an answer carries what attribution needs
and nothing else (no `instance`, `job`, `pci_bus_id`, driver version...), and series that differ only
in labels the mapping does not read (a second scrape job, a second container on a time-sliced GPU) are
one label set. The plan (`query_plan`), one query per metric and aggregate, fixed by the policy's
metrics and windows, never by the cluster:

- `max by (L) (timestamp(M))` for each metric: the newest sample within the lookback (5m) before
  `now`, exactly (the one function that gives a sample's own timestamp);
- `max by (L) (last_over_time(M[R]))` for the framebuffer metrics, R the widest window (at least the
  lookback): the value of that newest sample (the instant fb used / free, when its timestamp is within
  the lookback), and whether a label set has any sample in the windows;
- per window W: `sum by` of `sum_over_time` and of `count_over_time`, and `max by` of `max_over_time`
  of utilisation (the mean is sum / count, exact for DCGM's integer percentages, where
  `avg_over_time`'s running mean drifts in the last digits); `max by` of `max_over_time` of fb used;
- `count by (L) (count_over_time(util[R]))`: how many series each label set holds, so that the
  per-series bound on a sample count (`telemetry.sanity`) still holds for a label set of several.

Freshness. A row's `newest_sample` is its newest sample in the window, as a snapshot directory computes
it. Prometheus 2.x has no function giving the timestamp of a window's newest sample: `timestamp()` of a
vector selector sees back only as far as the lookback, so a subquery stepping through the window by the
lookback (`max_over_time(timestamp(M)[W:5m])`, what this read asked before) finds older samples, but
Prometheus evaluates `timestamp()` afresh for every series at every step: 4-6 s for each metric and
window at 40,000 GPUs, up to the request timeout. A series with a sample within the lookback needs no
more than `timestamp()` at `now`: nothing older can be its newest. Only label sets with samples in a
window and none within the lookback (deleted pods, a stalled exporter: a few, not the cluster) need
more, and `late_query` asks for exactly those, in one query: the same subquery over only their GPUs'
series (selected by UUID), stepping by `telemetry.scrape_interval` rather than the lookback, so that a
series ended by a staleness marker (a pod deleted) still shows its last sample (a coarser step misses
samples between its last step and the marker). Past `LATE_SELECT_LIMIT` late GPUs (an exporter fleet
gone quiet) it selects every series and steps by the lookback instead, the old cost once per metric.
Stale or missing telemetry stays what it was: a row without a fresh sample is never made fresher
than its samples say.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from rebalancer.policy import LabelMapping, TelemetryConfig
from rebalancer.telemetry.identity import resolve_preset
from rebalancer.telemetry.windows import LOOKBACK_SECONDS

__all__ = [
    "LATE_LABEL",
    "LATE_SELECT_LIMIT",
    "Aggregate",
    "Query",
    "identity_labels",
    "late_query",
    "query_plan",
]

Aggregate = Literal["ts", "last", "count", "sum", "max", "series"]

# The label `late_query` adds to say which metric a series' newest timestamp is of.
LATE_LABEL = "rebalancer_metric"
# Up to this many late GPUs, `late_query` selects their series by UUID and steps by the scrape interval.
LATE_SELECT_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL expression of the plan: `aggregate` of `metric` over `window` seconds (None: at `now`)."""

    metric: str
    aggregate: Aggregate
    window: int | None
    expr: str


def identity_labels(mapping: LabelMapping) -> tuple[str, ...]:
    """Every label name the mapping reads, sorted: what the plan's answers are aggregated by."""
    names = (
        *mapping.node,
        *mapping.uuid,
        *mapping.pod,
        *mapping.namespace,
        *mapping.gpu_index,
        *mapping.model_name,
        *mapping.mig_profile,
        *mapping.mig_instance,
    )
    return tuple(sorted(set(names)))


def _by(cfg: TelemetryConfig) -> str:
    return f"by ({', '.join(identity_labels(cfg.labels))})"


def query_plan(cfg: TelemetryConfig, windows: Iterable[int]) -> tuple[Query, ...]:
    """Every query of a telemetry read but `late_query`: fixed by the metrics and windows, never by the
    cluster."""
    cfg = resolve_preset(cfg)
    util, used, free = cfg.utilization.name, cfg.fb_used.name, cfg.fb_free.name
    ordered = sorted({int(w) for w in windows})
    reach = max((*ordered, LOOKBACK_SECONDS))
    by = _by(cfg)
    plan: dict[str, Query] = {}

    def add(metric: str, aggregate: Aggregate, window: int | None, expr: str) -> None:
        plan.setdefault(expr, Query(metric=metric, aggregate=aggregate, window=window, expr=expr))

    for metric in dict.fromkeys((used, free, util)):
        add(metric, "ts", None, f"max {by} (timestamp({metric}))")
    for metric in dict.fromkeys((used, free)):
        add(metric, "last", reach, f"max {by} (last_over_time({metric}[{reach}s]))")
    for window in ordered:
        add(util, "count", window, f"sum {by} (count_over_time({util}[{window}s]))")
        add(util, "sum", window, f"sum {by} (sum_over_time({util}[{window}s]))")
        add(util, "max", window, f"max {by} (max_over_time({util}[{window}s]))")
        add(used, "max", window, f"max {by} (max_over_time({used}[{window}s]))")
    add(util, "series", reach, f"count {by} (count_over_time({util}[{reach}s]))")
    return tuple(plan.values())


# A double-quoted PromQL string: Prometheus' lexer (promql/parser/lex.go) ends it at an unescaped quote,
# refuses a raw newline (an unterminated string), and reads Go's escapes (\a \b \f \n \r \t \v \\ \",
# octal, \x, \u, \U); anything else stands for itself. So the backslash, the quote and the newline are
# escaped, and, to keep queries printable, every other control character.
_PROMQL_STRING = str.maketrans(
    {
        "\\": "\\\\",
        '"': '\\"',
        "\n": "\\n",
        "\r": "\\r",
        "\t": "\\t",
        **{chr(c): f"\\x{c:02x}" for c in (*range(0x20), 0x7F) if chr(c) not in "\n\r\t"},
    }
)


def _promql_string(text: str) -> str:
    return '"' + text.translate(_PROMQL_STRING) + '"'


def _regex_of(values: Iterable[str]) -> str:
    """A PromQL string holding an RE2 alternation that matches exactly these values (as a matcher
    anchors it: the whole label value). `re.escape` puts a backslash before every metacharacter and
    some other characters (space, `-`, control characters), each of which Go's regexp (RE2 syntax)
    reads as the character itself."""
    return _promql_string("|".join(re.escape(v) for v in sorted(set(values))))


def late_query(cfg: TelemetryConfig, windows: Iterable[int], uuids: Mapping[str, Collection[str]]) -> str:
    """The newest sample timestamp of every series of the given GPUs in the widest window, per metric.

    `uuids` maps a UUID label name to the values to select by it (the label sets `sources.prometheus`
    found late). Each part is `max by (L) (max_over_time(timestamp(M{uuid=~"..."})[R:step]))`, told
    apart by `LATE_LABEL` (the metric's name), to evaluate at `now` like the plan. Past
    `LATE_SELECT_LIMIT` GPUs (an exporter fleet gone quiet) the parts select every series and step by
    the lookback: what this read asked before, once per metric instead of per metric and window, and
    still exact but for a series ended by a staleness marker, which may show a sample up to one step
    older than its last (older: never fresher than it is). A UUID label given no values selects
    nothing; ValueError when no label has any (the caller sends no query then).
    """
    selected = {label: values for label, values in uuids.items() if values}
    if not selected:
        raise ValueError("late_query: no UUID to look up (the caller asks nothing then)")
    cfg = resolve_preset(cfg)
    reach = max((*{int(w) for w in windows}, LOOKBACK_SECONDS))
    few = sum(len(values) for values in selected.values()) <= LATE_SELECT_LIMIT
    step = max(1, min(cfg.scrape_interval, LOOKBACK_SECONDS)) if few else LOOKBACK_SECONDS
    by = _by(cfg)
    parts: list[str] = []
    for metric in dict.fromkeys((cfg.utilization.name, cfg.fb_used.name, cfg.fb_free.name)):
        selectors = (
            [f"{metric}{{{label}=~{_regex_of(values)}}}" for label, values in sorted(selected.items())]
            if few
            else [metric]
        )
        for selector in selectors:
            newest = f"max {by} (max_over_time(timestamp({selector})[{reach}s:{step}s]))"
            parts.append(f'label_replace({newest}, "{LATE_LABEL}", "{metric}", "", "")')
    return " or ".join(parts)
