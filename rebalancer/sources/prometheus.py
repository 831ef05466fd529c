"""Live DCGM telemetry from Prometheus: a fixed set of PromQL queries -> Telemetry, and raw history dumps.

Owns talking to Prometheus (its HTTP API through requests, `prometheus_http`: prometheus-api-client's
`custom_query` drops the answer's `warnings` and cannot bound the time a whole answer takes):

- `PrometheusTelemetrySource.telemetry(now, pods)`: the same `Telemetry` (one GpuTelemetry per node, GPU
  UUID, MIG instance and pod, per window) that `telemetry.windows.aggregate` computes from a snapshot
  directory, but from aggregates Prometheus evaluates at `now` (`time=`): the queries of
  `prometheus_plan.query_plan` (one per metric and aggregate for the whole cluster, aggregated by the
  labels attribution reads, never per node or pod), then, only when some label sets have samples in a
  window but none within the lookback, the one `prometheus_plan.late_query` for their newest samples
  (`prometheus_plan` says why freshness is asked that way). Each answer's label sets are decoded and
  identified once (`prometheus_labels.LabelSets`, kept across the daemon's reads), and the rows are
  read by `prometheus_rows.Rows`, which goes through the same path from series to rows as a snapshot
  (`telemetry.windows.Grouping` and `row`), so MIG instances and time-sliced GPUs land on the same
  rows as in a snapshot;
- connection settings, through `sources.prometheus_http`: bearer token from a file or an env var (never
  the pod's own service-account token unless `allow_service_account_token`), CA bundle / TLS
  verification, a total timeout per request and a deadline for the whole read, bounded retries;
- plausibility of the utilisation answers (`telemetry.sanity`): a label set whose count, sum and
  maximum cannot be true (more samples than its series can hold at the scrape interval, a mean above
  100 % or above the maximum, a negative or non-finite value, one of the three missing) makes its GPU's
  telemetry unusable: a `bad-telemetry` finding, and no row for that GPU in any window;
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

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import closing, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import requests

from rebalancer.model import Finding, Pod, Telemetry
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
from rebalancer.sources.prometheus_labels import LabelSets
from rebalancer.sources.prometheus_plan import LATE_LABEL, Query, late_query, query_plan
from rebalancer.sources.prometheus_rows import Rows
from rebalancer.sources.prometheus_steps import idle_steps_query, steps_of
from rebalancer.sources.prometheus_usage import usage_of, usage_query
from rebalancer.telemetry.exposition import Sample, Series
from rebalancer.telemetry.identity import resolve_preset
from rebalancer.telemetry.windows import LOOKBACK_SECONDS, epoch_ms
from rebalancer.usage import LabelKey, MetricUsage, SeriesUsage, series_usage, usage_metrics
from rebalancer.waste import SeriesSteps

__all__ = [
    "RETRY_STATUSES",
    "PrometheusError",
    "PrometheusTelemetrySource",
    "Query",
    "query_plan",
]

UNAVAILABLE: Final = "telemetry-unavailable"


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


def _vector(result: object, expr: str) -> dict[LabelKey, float]:
    """An instant vector given as plain JSON values (`waste`'s and `advise`'s answers)."""
    if not isinstance(result, list):
        raise PrometheusError(f"{expr}: expected an instant vector, got {type(result).__name__}")
    vector: dict[LabelKey, float] = {}
    for item in result:
        if not isinstance(item, Mapping) or "value" not in item:
            raise PrometheusError(f"{expr}: expected an instant vector, got {str(result)[:200]}")
        vector[_labels(item)] = _point(item["value"])[1]
    return vector


def _time_param(moment: datetime) -> str:
    ms = epoch_ms(moment)
    return f"{ms // 1000}.{ms % 1000:03d}"


# --------------------------------------------------------------------------- the source


class PrometheusTelemetrySource:
    """GPU telemetry for the policy's windows from one Prometheus, evaluated at a given `now`.

    `prometheus` overrides `cfg.prometheus` (the CLI's `--prometheus-url`); `environ` is where
    `bearer_token_env` is looked up (the process environment by default). The pod's own service-account
    token (`service_account_token`, the kubelet's mount by default) is never sent unless
    `allow_service_account_token` (the daemon's `--allow-service-account-token`). `clock` times the
    deadline (a monotonic timer). `label_sets` is where the answers' label sets are decoded and
    identified (`prometheus_labels`): the daemon hands every cycle's source the same one; by default the
    source keeps its own.
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
        label_sets: LabelSets | None = None,
    ) -> None:
        self._cfg = resolve_preset(cfg)
        self._label_sets = label_sets if label_sets is not None else LabelSets()
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
            return self._run(now, pods)
        except PrometheusError as exc:
            return self._unavailable(f"Prometheus at {self._where()}: {exc}")
        except Exception as exc:  # the telemetry edge must never take a cycle down
            return self._unavailable(f"Prometheus at {self._where()}: {type(exc).__name__}: {exc}")

    def _unavailable(self, problem: str) -> tuple[Telemetry, tuple[Finding, ...]]:
        problem = redact(problem)
        finding = Finding(kind=UNAVAILABLE, detail=f"{problem}; telemetry-dependent strategies skip")
        return Telemetry(available=False, problem=problem), (finding,)

    def _run(
        self, now: datetime, pods: Mapping[tuple[str, str], Pod] | None
    ) -> tuple[Telemetry, tuple[Finding, ...]]:
        cfg, at = self._cfg, _time_param(now)
        labels = self._label_sets
        labels.begin(cfg.labels)
        with self._connect() as client, closing(labels):
            answers = {q: labels.vector(client.query_vector(q.expr, at)) for q in self._plan}
            rows = Rows(
                cfg,
                self._windows,
                answers,
                labels.keys,
                now_ms=epoch_ms(now),
                pods=pods,
                where=self._where(),
                identity_of=labels.identity,
            )
            metric_names = ", ".join(rows.by_metric)
            if not any(rows.by_metric.values()):
                return self._unavailable(
                    f"Prometheus at {self._where()} has no samples of {metric_names} in the last "
                    f"{format_duration(max((*self._windows, LOOKBACK_SECONDS)))} before {now.isoformat()}"
                )
            if not rows.identified:
                telemetry, unavailable = self._unavailable(rows.grouping.no_identity_problem(metric_names))
                return telemetry, (*unavailable, *rows.grouping.unusable_findings())
            late = rows.late_uuids()
            if late:
                expr = late_query(cfg, self._windows, late)
                for sample in client.query_vector(expr, at):
                    key = labels.keys[labels.id(sample.metric)]
                    metric = dict(key).get(LATE_LABEL)
                    if metric is not None:
                        own = labels.id_of(tuple(kv for kv in key if kv[0] != LATE_LABEL))
                        rows.add_late(metric, own, sample.value[1])
        telemetry, findings = rows.build()
        return telemetry, tuple(findings)

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
