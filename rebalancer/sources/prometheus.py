"""Live DCGM telemetry from Prometheus: a fixed set of PromQL queries -> Telemetry, and raw history dumps.

Owns talking to Prometheus (its HTTP API through requests, `prometheus_http`: prometheus-api-client's
`custom_query` drops the answer's `warnings` and cannot bound the time a whole answer takes):

- `PrometheusTelemetrySource.telemetry(now, pods)`: the same `Telemetry` (one GpuTelemetry per node, GPU
  UUID, MIG instance and pod, per window) that `telemetry.windows.aggregate` computes from a snapshot
  directory, but from aggregates Prometheus evaluates at `now` (`time=`). The query set depends only on
  the policy's metrics and windows, one query per metric per aggregate for the whole cluster, never per
  node or pod
  (`query_plan`): `count_over_time`, `sum_over_time` and `max_over_time` of utilisation per window (the
  mean is sum / count, exact for DCGM's integer percentages and exact across several series of one
  group, where `avg_over_time`'s running mean drifts in the last digits), the newest sample's timestamp
  per window, the last framebuffer used / free (instant) and the framebuffer used maximum per window.
  Results go through the same path from series to rows as a snapshot's (`telemetry.windows.Grouping`
  and `row`), so MIG instances and time-sliced GPUs land on the same rows as in a snapshot;
- connection settings, through `sources.prometheus_http`: bearer token from a file or an env var (never
  the pod's own service-account token unless `allow_service_account_token`), CA bundle / TLS
  verification, a total timeout per request and a deadline for the whole read, bounded retries;
- plausibility of the utilisation answers (`telemetry.sanity`): a series whose count, sum and maximum
  cannot be true (more samples than the scrape interval allows, a mean above 100 % or above the
  maximum, a negative or non-finite value, one of the three missing) makes its GPU's telemetry
  unusable: a `bad-telemetry` finding, and no row for that GPU in any window;
- `PrometheusTelemetrySource.history(now, window)`: the raw samples of the policy's metrics over a window
  (range selectors, so timestamps are the scrapes' own) for `rebalancer snapshot`, which writes them
  with `telemetry.exposition.render_openmetrics`;
- `PrometheusTelemetrySource.idle_steps(period, threshold)`: for `rebalancer waste`, the covered and idle
  steps of every utilisation series over a whole period (`rebalancer.waste` says what they mean), in
  one query however many pods there are (`prometheus_steps.idle_steps_query`, which also reads the
  answer): a subquery stepping through the period
  whose inner ranges are the steps themselves, evaluated by Prometheus, so the answer is two numbers
  per series, not its samples;
- `PrometheusTelemetrySource.usage(period)`: for `rebalancer advise`, every series' steps, peak and p95
  of each metric the advisor reads (`rebalancer.usage`), one query per metric
  (`prometheus_usage.usage_query`), however many pods there are.

Failure policy: a down, slow or erroring Prometheus, an unreadable or refused token, a malformed or
partial answer (`warnings`, `isPartial`), or the deadline passing gives `Telemetry(available=False,
problem=...)` and a `telemetry-unavailable` finding, never a partial answer. Each request gives up after
`timeout` (the whole answer, however slowly it trickles), each query after `retries` more tries, the
whole read after `deadline`, and the first failed query ends the call. A framebuffer aggregate that
is NaN, infinite, negative or a DCGM blank is dropped (a `bad-telemetry` finding): missing data is
never read as idle. Series without a node or UUID label give `unusable-telemetry`, and series of pods
that no longer exist whose newest sample is older than `telemetry.max_age` give `stale-telemetry`.
URLs and error texts in findings and errors are redacted (`rebalancer.redaction`).

It must not read the wall clock (`now` is given; the deadline runs on a monotonic timer), judge pods
(idle or not), or raise out of `telemetry()`.
Assumes the server's default `--query.lookback-delta` of 5m (`telemetry.windows.LOOKBACK_SECONDS`), as
the snapshot aggregation does.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import requests

from rebalancer.model import Finding, Pod, Telemetry, TelemetryWindow
from rebalancer.period import Period
from rebalancer.policy import PrometheusConfig, TelemetryConfig, format_duration
from rebalancer.redaction import redact, redact_url
from rebalancer.sources.prometheus_http import (
    RETRY_STATUSES,
    SERVICE_ACCOUNT_TOKEN,
    Deadline,
    PrometheusError,
    PrometheusHttp,
    bearer_headers,
)
from rebalancer.sources.prometheus_steps import idle_steps_query, steps_of
from rebalancer.sources.prometheus_usage import usage_of, usage_query
from rebalancer.telemetry.exposition import Sample, Series
from rebalancer.telemetry.identity import (
    GroupKey,
    SeriesIdentity,
    bad_telemetry_finding,
    format_labels,
    is_valid_value,
    resolve_preset,
)
from rebalancer.telemetry.sanity import unusable_gpu_finding, utilisation_problem
from rebalancer.telemetry.windows import (
    LOOKBACK_SECONDS,
    Grouping,
    datetime_from_ms,
    epoch_ms,
    row,
    seconds_to_ms,
)
from rebalancer.usage import LabelKey, MetricUsage, SeriesUsage, series_usage, usage_metrics
from rebalancer.waste import SeriesSteps

__all__ = [
    "RETRY_STATUSES",
    "PrometheusError",
    "PrometheusTelemetrySource",
    "Query",
    "query_plan",
]

UNAVAILABLE = "telemetry-unavailable"

Aggregate = Literal["count", "sum", "max", "last", "last_ts", "newest"]
Vector = dict[LabelKey, float]


# --------------------------------------------------------------------------- queries


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL expression of the plan: `aggregate` of `metric` over `window` seconds (None: instant)."""

    metric: str
    aggregate: Aggregate
    window: int | None
    expr: str


def _newest_expr(metric: str, window: int) -> str:
    """Timestamp of the newest sample in `[now - window, now]`, for series with a sample there.

    `timestamp(m)` sees the newest sample within the 5m lookback; for longer windows a subquery stepping
    by the lookback covers the rest of the window, and `and count_over_time` keeps only series that do have
    a sample in the window (the subquery's first step may look up to 5m before it).
    """
    ts = f"timestamp({metric})"
    if window > LOOKBACK_SECONDS:
        ts = f"({ts} or max_over_time({ts}[{window}s:{LOOKBACK_SECONDS}s]))"
    return f"{ts} and count_over_time({metric}[{window}s])"


def query_plan(cfg: TelemetryConfig, windows: Iterable[int]) -> tuple[Query, ...]:
    """Every query one `telemetry()` call issues: fixed by the metrics and windows, never by the cluster."""
    cfg = resolve_preset(cfg)
    util, used, free = cfg.utilization.name, cfg.fb_used.name, cfg.fb_free.name
    plan: dict[str, Query] = {}

    def add(metric: str, aggregate: Aggregate, window: int | None, expr: str) -> None:
        plan.setdefault(expr, Query(metric=metric, aggregate=aggregate, window=window, expr=expr))

    for metric in dict.fromkeys((used, free)):
        add(metric, "last", None, metric)
        add(metric, "last_ts", None, f"timestamp({metric})")
    for window in sorted(set(windows)):
        add(util, "count", window, f"count_over_time({util}[{window}s])")
        add(util, "sum", window, f"sum_over_time({util}[{window}s])")
        add(util, "max", window, f"max_over_time({util}[{window}s])")
        add(used, "max", window, f"max_over_time({used}[{window}s])")
        for metric in dict.fromkeys((util, used, free)):
            add(metric, "newest", window, _newest_expr(metric, window))
    return tuple(plan.values())


# --------------------------------------------------------------------------- parsing answers


def _labels(item: Mapping[str, Any]) -> LabelKey:
    metric = item.get("metric")
    if not isinstance(metric, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metric.items()
    ):
        raise PrometheusError(f"malformed series labels: {metric!r}")
    return tuple(sorted((k, v) for k, v in metric.items() if k != "__name__"))


def _point(raw: object) -> tuple[float, float]:
    """`[timestamp, "value"]` -> (seconds, value)."""
    if not isinstance(raw, list | tuple) or len(raw) != 2:
        raise PrometheusError(f"malformed sample: {raw!r}")
    try:
        return float(raw[0]), float(raw[1])
    except (TypeError, ValueError):
        raise PrometheusError(f"malformed sample: {raw!r}") from None


def _vector(result: object, expr: str) -> Vector:
    if not isinstance(result, list):
        raise PrometheusError(f"{expr}: expected an instant vector, got {type(result).__name__}")
    vector: Vector = {}
    for item in result:
        if not isinstance(item, Mapping) or "value" not in item:
            raise PrometheusError(f"{expr}: expected an instant vector, got {str(result)[:200]}")
        vector[_labels(item)] = _point(item["value"])[1]
    return vector


def _time_param(moment: datetime) -> str:
    ms = epoch_ms(moment)
    return f"{ms // 1000}.{ms % 1000:03d}"


# --------------------------------------------------------------------------- grouping


@dataclass
class _Group:
    """Aggregates of every series of one (node, UUID, MIG instance, pod) group over one window."""

    identity: SeriesIdentity
    util: list[tuple[float, int]] = field(default_factory=list)  # (sum, count) per series
    util_max: float | None = None
    used_max: float | None = None
    used_last: tuple[int, float] | None = None
    free_last: tuple[int, float] | None = None
    newest: int | None = None

    def seen(self, ms: int | None) -> None:
        if ms is not None and (self.newest is None or ms > self.newest):
            self.newest = ms

    def util_avg(self) -> float | None:
        """The mean of every sample of the group, as `telemetry.windows.aggregate` computes it."""
        if not self.util:
            return None
        return math.fsum(total for total, _ in self.util) / sum(count for _, count in self.util)


@dataclass(frozen=True, slots=True)
class _Unusable:
    """The first impossible utilisation answer about a GPU: which series, over which window, and why."""

    identity: SeriesIdentity
    window: int
    problem: str


def _newer(current: tuple[int, float] | None, candidate: tuple[int, float]) -> tuple[int, float]:
    """The newest sample of a group; between series with the same timestamp, the largest value."""
    if current is None or candidate[0] > current[0]:
        return candidate
    if candidate[0] == current[0]:
        return (current[0], max(current[1], candidate[1]))
    return current


def _max(current: float | None, value: float) -> float:
    return value if current is None else max(current, value)


# --------------------------------------------------------------------------- the source


class PrometheusTelemetrySource:
    """GPU telemetry for the policy's windows from one Prometheus, evaluated at a given `now`.

    `prometheus` overrides `cfg.prometheus` (the CLI's `--prometheus-url`); `environ` is where
    `bearer_token_env` is looked up (the process environment by default). The pod's own service-account
    token (`service_account_token`, the kubelet's mount by default) is never sent unless
    `allow_service_account_token` (the daemon's `--allow-service-account-token`). `clock` times the
    deadline (a monotonic timer).
    """

    def __init__(
        self,
        cfg: TelemetryConfig,
        windows: Iterable[int],
        *,
        prometheus: PrometheusConfig | None = None,
        environ: Mapping[str, str] | None = None,
        allow_service_account_token: bool = False,
        service_account_token: Path = SERVICE_ACCOUNT_TOKEN,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._cfg = resolve_preset(cfg)
        self._windows = tuple(sorted({int(w) for w in windows}))
        self._conn = prometheus if prometheus is not None else cfg.prometheus
        self._environ = environ if environ is not None else os.environ
        self._allow_service_account_token = allow_service_account_token
        self._service_account_token = service_account_token
        self._clock = clock
        self._plan = query_plan(self._cfg, self._windows)

    @property
    def plan(self) -> tuple[Query, ...]:
        return self._plan

    @property
    def windows(self) -> tuple[int, ...]:
        return self._windows

    def __call__(
        self, now: datetime, pods: Mapping[tuple[str, str], Pod] | None = None
    ) -> tuple[Telemetry, tuple[Finding, ...]]:
        """`telemetry(now, pods)`, so a source is a `kube.TelemetryProvider` as it is."""
        return self.telemetry(now, pods)

    # ---- connection

    @contextmanager
    def _connect(self) -> Iterator[PrometheusHttp]:
        """One read's connection; its deadline starts now."""
        conn = self._conn
        if conn is None:
            raise PrometheusError("no Prometheus configured (set telemetry.prometheus.url)")
        deadline = Deadline(conn.deadline) if self._clock is None else Deadline(conn.deadline, self._clock)
        headers = bearer_headers(
            conn,
            self._environ,
            allow_service_account_token=self._allow_service_account_token,
            service_account_token=self._service_account_token,
        )
        session = requests.Session()
        session.verify = conn.ca_file if (conn.verify_tls and conn.ca_file) else conn.verify_tls
        try:
            yield PrometheusHttp(conn, headers, deadline, session)
        finally:
            session.close()

    def _where(self) -> str:
        return redact_url(self._conn.url) if self._conn is not None else "Prometheus"

    # ---- telemetry

    def telemetry(
        self, now: datetime, pods: Mapping[tuple[str, str], Pod] | None = None
    ) -> tuple[Telemetry, tuple[Finding, ...]]:
        """Per window, one GpuTelemetry per (node, GPU UUID, MIG instance, pod) group, evaluated at `now`.

        Never raises: anything that keeps the answer from being complete and trustworthy gives
        `Telemetry(available=False)` with a `telemetry-unavailable` finding. `pods` (when given) decides
        which pod labels count, as in the snapshot source.
        """
        try:
            return self._build(self._run(now), now, pods)
        except PrometheusError as exc:
            return self._unavailable(f"Prometheus at {self._where()}: {exc}")
        except Exception as exc:  # the telemetry edge must never take a cycle down
            return self._unavailable(f"Prometheus at {self._where()}: {type(exc).__name__}: {exc}")

    def _unavailable(self, problem: str) -> tuple[Telemetry, tuple[Finding, ...]]:
        problem = redact(problem)
        finding = Finding(kind=UNAVAILABLE, detail=f"{problem}; telemetry-dependent strategies skip")
        return Telemetry(available=False, problem=problem), (finding,)

    def _run(self, now: datetime) -> dict[str, Vector]:
        results: dict[str, Vector] = {}
        with self._connect() as client:
            for query in self._plan:
                results[query.expr] = _vector(client.query(query.expr, _time_param(now)), query.expr)
        return results

    def _build(
        self, results: Mapping[str, Vector], now: datetime, pods: Mapping[tuple[str, str], Pod] | None
    ) -> tuple[Telemetry, tuple[Finding, ...]]:
        cfg = self._cfg
        now_ms = epoch_ms(now)
        by_metric: dict[str, set[LabelKey]] = defaultdict(set)
        for query in self._plan:
            by_metric[query.metric].update(results[query.expr])
        metric_names = ", ".join(by_metric)
        if not any(by_metric.values()):
            return self._unavailable(
                f"Prometheus at {self._where()} has no samples of {metric_names} in the last "
                f"{format_duration(max((*self._windows, LOOKBACK_SECONDS)))} before {now.isoformat()}"
            )

        grouping: Grouping[_Group] = Grouping(cfg, pods, _Group)
        identities: dict[tuple[str, LabelKey], SeriesIdentity] = {}
        for metric, keys in by_metric.items():
            for key in sorted(keys):
                identity = grouping.identify(metric, dict(key))
                if identity is not None:
                    identities[(metric, key)] = identity
        findings = grouping.unusable_findings()
        if not identities:
            telemetry, unavailable = self._unavailable(grouping.no_identity_problem(metric_names))
            return telemetry, (*unavailable, *findings)

        bad: dict[tuple[str, LabelKey], str] = {}
        unusable: dict[tuple[str, str], _Unusable] = {}
        windows: dict[int, TelemetryWindow] = {}
        for window in self._windows:
            ordered = self._window_groups(results, identities, window, pods, bad=bad, unusable=unusable)
            rows = tuple(
                row(
                    group.identity,
                    cfg,
                    util_avg=group.util_avg(),
                    util_max=group.util_max,
                    util_samples=sum(count for _, count in group.util),
                    fb_used=group.used_last[1] if group.used_last is not None else None,
                    fb_used_max=group.used_max,
                    fb_free=group.free_last[1] if group.free_last is not None else None,
                    newest_sample=datetime_from_ms(group.newest),
                )
                for group in ordered
                if group.newest is not None
            )
            windows[window] = TelemetryWindow(window_seconds=window, gpus=rows)
        if unusable:
            # An impossible answer about a GPU discredits all of its telemetry: no row of it anywhere.
            windows = {
                w: replace(tw, gpus=tuple(g for g in tw.gpus if (g.node, g.uuid) not in unusable))
                for w, tw in windows.items()
            }
            findings.extend(
                unusable_gpu_finding(u.identity, cfg.utilization.name, u.window, self._where(), u.problem)
                for _, u in sorted(unusable.items())
            )

        for (metric, key), what in sorted(bad.items()):
            identity = identities[(metric, key)]
            findings.append(
                bad_telemetry_finding(
                    identity,
                    f"{metric}{format_labels(key)} from {self._where()}: {what} is NaN, infinite, "
                    "negative or a DCGM blank value; ignored",
                )
            )
        telemetry = Telemetry(available=True, windows=windows)
        findings.extend(_stale_findings(telemetry, grouping.claimed, pods, now_ms, cfg.max_age))
        return telemetry, tuple(findings)

    def _window_groups(
        self,
        results: Mapping[str, Vector],
        identities: Mapping[tuple[str, LabelKey], SeriesIdentity],
        window: int,
        pods: Mapping[tuple[str, str], Pod] | None,
        *,
        bad: dict[tuple[str, LabelKey], str],
        unusable: dict[tuple[str, str], _Unusable],
    ) -> list[_Group]:
        cfg = self._cfg
        plan = {(q.metric, q.aggregate, q.window): results[q.expr] for q in self._plan}
        grouping: Grouping[_Group] = Grouping(cfg, pods, _Group)

        def group(metric: str, key: LabelKey) -> _Group | None:
            identity = identities.get((metric, key))
            return grouping.group(identity) if identity is not None else None

        def valid(metric: str, key: LabelKey, value: float | None, what: str) -> bool:
            if value is None:
                return False
            if not is_valid_value(value):
                bad.setdefault((metric, key), what)
                return False
            return True

        util, used, free = cfg.utilization.name, cfg.fb_used.name, cfg.fb_free.name
        newest = {m: plan.get((m, "newest", window), {}) for m in (util, used, free)}

        counts = plan.get((util, "count", window), {})
        sums = plan.get((util, "sum", window), {})
        maxes = plan.get((util, "max", window), {})
        for key in sorted({*counts, *sums, *maxes}):
            count, total, peak = counts.get(key), sums.get(key), maxes.get(key)
            problem = utilisation_problem(
                count,
                total,
                peak,
                window=window,
                scrape_interval=cfg.scrape_interval,
                scale=cfg.utilization.scale,
            )
            if problem is not None:
                if (identity := identities.get((util, key))) is not None:
                    unusable.setdefault((identity.node, identity.uuid), _Unusable(identity, window, problem))
                continue
            assert count is not None and total is not None and peak is not None
            if (target := group(util, key)) is None:
                continue
            target.util.append((total, int(count)))
            target.util_max = _max(target.util_max, peak)
            target.seen(seconds_to_ms(newest[util][key]) if key in newest[util] else None)

        for key, peak in plan.get((used, "max", window), {}).items():
            if not valid(used, key, peak, f"its {format_duration(window)} maximum"):
                continue
            if (target := group(used, key)) is None:
                continue
            target.used_max = _max(target.used_max, peak)
            target.seen(seconds_to_ms(newest[used][key]) if key in newest[used] else None)

        if free != used:
            for key, ts in newest[free].items():
                if (target := group(free, key)) is not None:
                    target.seen(seconds_to_ms(ts))

        for metric, role in ((used, "used"), (free, "free")):
            stamps = plan.get((metric, "last_ts", None), {})
            for key, value in plan.get((metric, "last", None), {}).items():
                stamp = stamps.get(key)
                if stamp is None or not valid(metric, key, value, "its newest sample"):
                    continue
                if (target := group(metric, key)) is None:
                    continue
                sample = (seconds_to_ms(stamp), value)
                if role == "used":
                    target.used_last = _newer(target.used_last, sample)
                else:
                    target.free_last = _newer(target.free_last, sample)
                target.seen(sample[0])
        return grouping.ordered()

    # ---- raw history, for `rebalancer snapshot`

    def history(self, now: datetime, window: int) -> list[Series]:
        """Raw samples of the policy's metrics in `[now - window, now]`, with the scrapes' own timestamps.

        One range-selector query per metric (`M[window]` at `now`), all of them within
        `telemetry.prometheus.deadline`. Raises PrometheusError.
        """
        metrics = dict.fromkeys((self._cfg.utilization.name, self._cfg.fb_used.name, self._cfg.fb_free.name))
        series: list[Series] = []
        with self._connect() as client:
            for metric in metrics:
                expr = f"{metric}[{int(window)}s]"
                result = client.query(expr, _time_param(now))
                if not isinstance(result, list):
                    raise PrometheusError(f"{expr}: expected a range vector, got {type(result).__name__}")
                for item in result:
                    if not isinstance(item, Mapping) or not isinstance(item.get("values"), list):
                        raise PrometheusError(f"{expr}: expected a range vector, got {str(result)[:200]}")
                    samples = tuple(Sample(value=v, timestamp=t) for t, v in map(_point, item["values"]))
                    series.append(
                        Series(
                            metric=metric, labels=dict(_labels(item)), samples=samples, source=self._where()
                        )
                    )
        return series

    # ---- idle steps over a period, for `rebalancer waste`

    def idle_steps(self, window: Period, threshold_percent: float) -> list[SeriesSteps]:
        """Covered and idle steps of every utilisation series over `window`: one query
        (`idle_steps_query`) evaluated at its end, within `telemetry.prometheus.deadline`. Raises
        PrometheusError."""
        expr = idle_steps_query(self._cfg, window, threshold_percent)
        with self._connect() as client:
            result = client.query(expr, _time_param(window.end))
        return steps_of(_vector(result, expr), expr)

    def usage(self, window: Period) -> list[SeriesUsage]:
        """Every series' usage over `window` (`rebalancer.usage`): one query per metric the advisor reads
        (`usage_query`), evaluated at its end, all within `telemetry.prometheus.deadline`. A metric the
        exporter does not have answers nothing. Raises PrometheusError."""
        answers: dict[str, dict[LabelKey, MetricUsage]] = {}
        with self._connect() as client:
            for role, metric in usage_metrics(self._cfg).items():
                expr = usage_query(self._cfg, metric, window)
                answers[role] = usage_of(
                    _vector(client.query(expr, _time_param(window.end)), expr), metric, expr
                )
        return series_usage(answers, self._cfg)


def _stale_findings(
    telemetry: Telemetry,
    claimed: Mapping[GroupKey, set[tuple[str, str]]],
    pods: Mapping[tuple[str, str], Pod] | None,
    now_ms: int,
    max_age: int,
) -> list[Finding]:
    """Series no current pod holds whose newest sample is older than `max_age` (deleted pods, mostly)."""
    if not telemetry.windows:
        return []
    widest = telemetry.windows[max(telemetry.windows)]
    findings: list[Finding] = []
    for gpu in widest.gpus:
        if gpu.pod_key is not None or gpu.newest_sample is None:
            continue
        age_ms = now_ms - epoch_ms(gpu.newest_sample)
        if age_ms <= max_age * 1000:
            continue
        gone: list[tuple[str | None, str | None]] = sorted(
            claimed.get((gpu.node, gpu.uuid, gpu.mig_instance, None, None), ())
        )
        for namespace, name in gone or [(None, None)]:
            if name is None:
                whose = "no pod"
            elif pods is not None and (namespace, name) in pods:
                whose = f"pod {namespace}/{name}, which holds no GPU"
            else:
                whose = f"pod {namespace}/{name}, which no longer exists"
            findings.append(
                Finding(
                    kind="stale-telemetry",
                    node=gpu.node,
                    gpu=gpu.uuid,
                    namespace=namespace,
                    pod=name,
                    detail=(
                        f"newest sample of the series of {whose} on this GPU is "
                        f"{format_duration(age_ms // 1000)} old (max {format_duration(max_age)}); ignored"
                    ),
                )
            )
    return findings
