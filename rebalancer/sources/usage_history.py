"""The live cycle's long-window GPU usage (`Snapshot.usage`) from Prometheus, read once an hour.

Owns `PrometheusUsage`, which the live source keeps across a daemon's cycles: when a strategy of the
policy reads usage (`LoadedPolicy.usage_period`, today `gpu-rightsizing`), one query per metric
(`PrometheusTelemetrySource.usage`), kept for `refresh` (default 1h) and read again after it, or when the
policy's window, step or telemetry settings (metric names, labels, preset) change. A window of days
moves little in an hour, and these are the heaviest queries the rebalancer sends, so a daemon cycling
every five minutes does not repeat them each cycle. A failed read gives no usage and a
`usage-history-unavailable` finding naming the error (redacted): never the previous copy, never a guess.
A snapshot directory's usage is `snapshot_history.with_directory_usage`.

It must not judge the usage (strategies do) or read the clock (`now` is the snapshot's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from rebalancer.model import Finding, Snapshot
from rebalancer.period import Period, period
from rebalancer.policy import LoadedPolicy, PrometheusConfig, TelemetryConfig
from rebalancer.redaction import redact, redact_url
from rebalancer.sources.prometheus import PrometheusError, PrometheusTelemetrySource
from rebalancer.usage import UsageHistory

__all__ = ["DEFAULT_REFRESH", "UNAVAILABLE", "PrometheusUsage"]

DEFAULT_REFRESH = timedelta(hours=1)
UNAVAILABLE: Final = "usage-history-unavailable"


@dataclass
class _Read:
    at: datetime
    window: Period
    telemetry: TelemetryConfig
    history: UsageHistory


class PrometheusUsage:
    """The live source's usage reader: one read per `refresh`, kept in between."""

    def __init__(
        self,
        prometheus: PrometheusConfig,
        *,
        allow_service_account_token: bool = False,
        refresh: timedelta = DEFAULT_REFRESH,
    ) -> None:
        self._prometheus = prometheus
        self._allow_service_account_token = allow_service_account_token
        self._refresh = refresh
        self._last: _Read | None = None

    @property
    def prometheus(self) -> PrometheusConfig:
        return self._prometheus

    def attach(self, snapshot: Snapshot, loaded: LoadedPolicy) -> Snapshot:
        """`snapshot` with the usage its policy asks for (or a finding saying why there is none)."""
        wanted = loaded.usage_period()
        cfg = loaded.policy.telemetry
        if wanted is None or cfg is None:
            return snapshot
        last = self._last
        if (
            last is not None
            and (last.window.seconds, last.window.step) == wanted
            and last.telemetry == cfg
            and timedelta(0) <= snapshot.now - last.at < self._refresh
        ):
            return dataclasses.replace(snapshot, usage=last.history)
        window = period(snapshot.now, *wanted)
        source = PrometheusTelemetrySource(
            cfg,
            (),
            prometheus=self._prometheus,
            allow_service_account_token=self._allow_service_account_token,
        )
        where = f"Prometheus at {redact_url(self._prometheus.url)}"
        try:
            series = source.usage(window)
        except PrometheusError as exc:
            self._last = None
            finding = Finding(kind=UNAVAILABLE, detail=f"{where}: {redact(str(exc))}")
            return dataclasses.replace(snapshot, findings=(*snapshot.findings, finding))
        history = UsageHistory(period=window, series=tuple(series), source=where)
        self._last = _Read(at=snapshot.now, window=window, telemetry=cfg, history=history)
        return dataclasses.replace(snapshot, usage=history)
