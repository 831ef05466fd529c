"""What the notification sinks (Slack, webhooks) share: filters, secrets, HTTP delivery, async dispatch.

Owns:

- `skip_reason()`: the policy filters of one sink (`include_dry_run`, `only_when_evicted`,
  `finding_kinds`): a report with neither evictions (would-be evictions in dry-run) nor findings of the
  selected kinds is never sent, so a quiet cluster does not page anyone every five minutes;
- `read_secret()`: a secret from the env var or the file the policy names, read at every delivery and
  never logged (a rotated Secret mounted as a file is picked up at the kubelet's next sync; one given
  as an environment variable, as the shipped Deployment's `envFrom` does, only when the pod restarts:
  Kubernetes sets those at container start);
- `HttpPoster`: one POST with `requests` and a urllib3 `Retry`: bounded retries with exponential
  backoff on connection errors and 429 / 5xx answers, never after a read timeout (the receiver may
  have the message already), a connect and a read timeout on every attempt, no redirects. A 429 or
  503 with `Retry-After` (Slack's rate limit answers so) is retried once that time has passed, not
  sooner (which only earns more 429s), when it is at most `retry_after_max` (20 s); a longer one fails
  the delivery at once, so a delivery waits at most `retries` times that bound on its sink's worker,
  never in a cycle, and a shutdown, which waits for deliveries only up to its notify timeout, is not
  held by one (`Notifier.close`);
- `configured_sinks()`: each sink of the policy's `notify:` with its name (`slack[0]`, `webhook[1]`:
  its kind and place) and its configuration, its policy section, which is what identifies a sink;
- `Notifier`: the `Sink` the daemon hands to the cycle. `publish()` applies the filters and the
  per-sink rate limit (`min_interval`) and puts the report on a bounded queue; one worker thread per
  sink delivers it. A full queue drops the report (counted), so a failing or hung receiver never fails
  or delays a cycle. Dry-run digests (`digest: hourly | daily`): dry-run reports are not sent one by
  one but the latest one is sent, with the number of cycles it sums up, once per period. The digest
  is kept in process: `close()` (the daemon's shutdown, a reload that replaces the sink, the
  end of `rebalancer once`) sends the pending one, so a restart loses no cycles and a one-shot `once`
  (the CronJob) sends its dry-run report, as a digest of one cycle, when it ends. A digest that sums up
  a whole period needs the daemon.

It must not decide anything about the cluster, and error texts never carry a URL (a Slack webhook URL
is a secret): deliveries are described by the sink's name only.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Protocol, Self, TypeVar

import requests
import structlog
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import ConnectionPool
from urllib3.exceptions import InvalidHeader, MaxRetryError, ResponseError
from urllib3.response import BaseHTTPResponse
from urllib3.util.retry import Retry

from rebalancer.cycle_report import CycleReport
from rebalancer.model import Finding
from rebalancer.policy import NotifyConfig, SinkFilters

__all__ = [
    "DIGEST_PERIODS",
    "RETRY_STATUSES",
    "Delivery",
    "HttpPoster",
    "NotificationSink",
    "Notifier",
    "SinkError",
    "configured_sinks",
    "read_secret",
    "selected_findings",
    "skip_reason",
]

RETRY_STATUSES = (429, 500, 502, 503, 504)
DIGEST_PERIODS = {"hourly": 3600.0, "daily": 86400.0}

log = structlog.get_logger("rebalancer.sinks")


class SinkError(Exception):
    """A delivery that did not happen; the message is safe to log (no URL, no secret)."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One report to deliver. `digest_cycles` > 0 when it stands for that many dry-run cycles."""

    report: CycleReport
    digest_cycles: int = 0
    digest_period: str | None = None


class NotificationSink(Protocol):
    """A destination: its filters and how to deliver one report. `send` may block (it runs on a worker).

    `name` is settable: a sink kept through a reload takes the name of its new place.
    """

    name: str

    @property
    def filters(self) -> SinkFilters: ...

    def send(self, delivery: Delivery) -> None: ...


def configured_sinks(notify: NotifyConfig) -> list[tuple[str, SinkFilters]]:
    """The sinks of `notify:` in the order their notifiers are built: Slack's, then the webhooks', each
    with its name (its kind and place in its list) and its configuration (its policy section: two sinks
    with equal sections, kind included, are the same sink)."""
    return [
        *((f"slack[{index}]", slack) for index, slack in enumerate(notify.slack)),
        *((f"webhook[{index}]", hook) for index, hook in enumerate(notify.webhooks)),
    ]


# --------------------------------------------------------------------------- filters


def selected_findings(report: CycleReport, kinds: tuple[str, ...] | None) -> tuple[Finding, ...]:
    """The findings a sink reports: all of them, or only those of `kinds`."""
    if kinds is None:
        return report.findings
    wanted = set(kinds)
    return tuple(f for f in report.findings if f.kind in wanted)


def skip_reason(
    report: CycleReport,
    *,
    include_dry_run: bool,
    only_when_evicted: bool,
    finding_kinds: tuple[str, ...] | None,
) -> str | None:
    """Why a sink does not send this report, or None when it does."""
    if report.mode == "dry-run" and not include_dry_run:
        return "dry-run report"
    evicted = report.summary.evictions > 0
    if only_when_evicted and not evicted:
        return "nothing evicted"
    if not evicted and not selected_findings(report, finding_kinds):
        return "nothing to report"
    return None


# --------------------------------------------------------------------------- secrets


def read_secret(
    what: str, *, env: str | None, file: str | None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The secret from `env` or `file` (env first), stripped; None when neither is configured.

    Raises SinkError when one is configured but missing or empty: a sink never delivers without a
    secret it was told to use.
    """
    if env:
        value = (environ if environ is not None else os.environ).get(env, "").strip()
        if value:
            return value
        if not file:
            raise SinkError(f"{what}: env var {env} is not set or empty")
    if file:
        try:
            value = Path(file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise SinkError(f"{what}: cannot read {file}: {getattr(exc, 'strerror', None) or exc}") from None
        if not value:
            raise SinkError(f"{what}: {file} is empty")
        return value
    return None


# --------------------------------------------------------------------------- HTTP


def _describe(exc: requests.RequestException) -> str:
    """A transport error without its message (which would carry the URL)."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return "connection timed out"
    if isinstance(exc, requests.exceptions.ReadTimeout | requests.exceptions.Timeout):
        return "no answer within the read timeout"
    if isinstance(exc, requests.exceptions.SSLError):
        return "TLS error"
    if isinstance(exc, requests.exceptions.ConnectionError):
        return "connection failed"
    return type(exc).__name__


class _BoundedRetryAfter(Retry):
    """urllib3's Retry, waiting for a retried answer's `Retry-After` only up to `retry_after_limit` s.

    urllib3 sleeps whatever a retried answer's Retry-After asks (its own `retry_after_max`, from 2.6.3,
    only clamps the wait, and then asks sooner than told; `backoff_max` bounds the exponential backoff,
    not this). Here an answer asking for longer ends the retries: urllib3 hands that answer back
    (`raise_on_status=False`) and the delivery fails with it. An unreadable Retry-After counts as none
    (the backoff applies). A 413 is not retried for its Retry-After, as urllib3 would.
    """

    RETRY_AFTER_STATUS_CODES = frozenset({429, 503})
    retry_after_limit: float = 20.0

    def new(self, **kw: Any) -> Self:
        renewed = super().new(**kw)
        renewed.retry_after_limit = self.retry_after_limit
        return renewed

    def get_retry_after(self, response: BaseHTTPResponse) -> float | None:
        try:
            return super().get_retry_after(response)
        except InvalidHeader:
            return None

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> Self:
        if response is not None and error is None:
            wait = self.get_retry_after(response)
            if wait is not None and wait > self.retry_after_limit:
                limit = self.retry_after_limit
                reason = ResponseError(f"Retry-After {wait:.0f} s is longer than {limit:g} s")
                raise MaxRetryError(_pool, url or "", reason)  # type: ignore[arg-type]
        return super().increment(method, url, response, error, _pool, _stacktrace)


def _retry_after(response: requests.Response) -> str:
    """` (Retry-After N s)` when the answer asked for a wait (its seconds, never a date), else ``."""
    value = response.headers.get("Retry-After", "").strip()
    return f" (Retry-After {int(value)} s)" if value.isdigit() else ""


class HttpPoster:
    """POSTs bodies with bounded retries; one instance (one connection pool) per sink.

    A retried answer's Retry-After is waited for when at most `retry_after_max` seconds; a longer one
    ends the retries (the delivery fails, saying how long the receiver asked to wait).
    """

    def __init__(
        self,
        *,
        timeout: tuple[float, float] = (5.0, 10.0),
        retries: int = 3,
        backoff: float = 0.5,
        backoff_max: float = 8.0,
        retry_after_max: float = 20.0,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must not be negative")
        if retry_after_max < 0:
            raise ValueError("retry_after_max must not be negative")
        self.timeout = timeout
        retry = _BoundedRetryAfter(
            total=retries,
            connect=retries,
            read=0,
            status=retries,
            other=0,
            redirect=0,
            backoff_factor=backoff,
            backoff_max=backoff_max,
            status_forcelist=RETRY_STATUSES,
            allowed_methods=frozenset({"POST"}),
            raise_on_status=False,
            respect_retry_after_header=True,
        )
        retry.retry_after_limit = retry_after_max
        self._session = requests.Session()
        adapter = HTTPAdapter(max_retries=retry)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        self._lock = threading.Lock()

    def post(self, what: str, url: str, body: bytes, headers: Mapping[str, str]) -> None:
        """Deliver or raise SinkError (after the retries) naming `what`, never the URL."""
        with self._lock:  # a Session is not documented as thread-safe
            try:
                response = self._session.post(
                    url, data=body, headers=dict(headers), timeout=self.timeout, allow_redirects=False
                )
            except requests.RequestException as exc:
                raise SinkError(f"{what}: {_describe(exc)}") from None
            try:
                if not 200 <= response.status_code < 300:
                    status = f"HTTP {response.status_code} {response.reason or ''}".rstrip()
                    raise SinkError(f"{what}: {status}{_retry_after(response)}")
            finally:
                response.close()

    def close(self) -> None:
        self._session.close()


# --------------------------------------------------------------------------- async dispatch

_STOP = object()


ConfigT = TypeVar("ConfigT", bound=SinkFilters)


class HttpSink(Generic[ConfigT]):
    """What every HTTP notification sink holds: its policy section (filters included), name and poster."""

    default_name = "http"

    def __init__(
        self,
        config: ConfigT,
        *,
        name: str | None = None,
        poster: HttpPoster | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.filters: SinkFilters = config
        self.name = name or self.default_name
        self._poster = poster if poster is not None else HttpPoster()
        self._environ = environ


class Notifier:
    """A sink on a worker thread: `publish()` filters, rate-limits and enqueues; it never blocks.

    `on_result(sink_name, result)` is told every outcome: `sent`, `failed`, `filtered`,
    `rate-limited`, `dropped` (queue full), `digested` (kept for the next digest).
    """

    def __init__(
        self,
        sink: NotificationSink,
        *,
        queue_size: int = 8,
        clock: Callable[[], float] = time.monotonic,
        on_result: Callable[[str, str], None] | None = None,
    ) -> None:
        self.sink = sink
        self.name = sink.name
        self._clock = clock
        self._on_result = on_result
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max(1, queue_size))
        self._last_accepted: float | None = None
        self._digest_started: float | None = None
        self._digest_cycles = 0
        self._digest_report: CycleReport | None = None  # the latest report of the pending digest
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=f"notify-{self.name}", daemon=True)
        self._thread.start()

    # ---- the cycle's side

    def publish(self, report: CycleReport) -> None:
        sink = self.sink
        with self._lock:
            if self._closed:
                return
            filters = sink.filters
            if filters.digest is not None and report.mode == "dry-run":
                self._digest(report)
                return
            reason = skip_reason(
                report,
                include_dry_run=filters.include_dry_run,
                only_when_evicted=filters.only_when_evicted,
                finding_kinds=filters.finding_kinds,
            )
            if reason is not None:
                self._result("filtered")
                return
            self._offer(Delivery(report))

    def _digest(self, report: CycleReport) -> None:
        """Dry-run under a digest schedule: remember the report, send the latest one once per period."""
        now = self._clock()
        if self._digest_started is None:
            self._digest_started = now
        self._digest_cycles += 1
        self._digest_report = report
        period = DIGEST_PERIODS[self.sink.filters.digest or "daily"]
        if now - self._digest_started < period:
            self._result("digested")
            return
        self._digest_started = now
        self._send_digest()

    def _send_digest(self) -> None:
        """Offer the pending digest (the latest report, the cycles it sums up), if any; start a new one."""
        report, cycles = self._digest_report, self._digest_cycles
        self._digest_report, self._digest_cycles = None, 0
        if report is None or not cycles:
            return
        delivery = Delivery(report, digest_cycles=cycles, digest_period=self.sink.filters.digest)
        self._offer(delivery, rate_limited=False)

    def _offer(self, delivery: Delivery, *, rate_limited: bool = True) -> None:
        now = self._clock()
        interval = float(self.sink.filters.min_interval)
        last = self._last_accepted
        if rate_limited and interval > 0 and last is not None and now - last < interval:
            self._result("rate-limited")
            return
        try:
            self._queue.put_nowait(delivery)
        except queue.Full:
            log.warning("notification dropped: queue full", sink=self.name)
            self._result("dropped")
            return
        self._last_accepted = now

    # ---- the worker's side

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                assert isinstance(item, Delivery)
                self._deliver(item)
            finally:
                self._queue.task_done()

    def _deliver(self, delivery: Delivery) -> None:
        try:
            self.sink.send(delivery)
        except SinkError as exc:
            log.warning("notification failed", sink=self.name, error=str(exc))
            self._result("failed")
        except Exception as exc:  # a sink bug must not kill its worker
            log.error("notification failed", sink=self.name, error=f"{type(exc).__name__}: {exc}")
            self._result("failed")
        else:
            log.info("notification sent", sink=self.name, report_now=delivery.report.now.isoformat())
            self._result("sent")

    def _result(self, result: str) -> None:
        if self._on_result is not None:
            self._on_result(self.name, result)

    # ---- lifecycle

    def rename(self, name: str) -> None:
        """Go on under `name` (a reload moved the sink in its list): outcomes and errors say the new one."""
        self.name = self.sink.name = name
        self._thread.name = f"notify-{name}"

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for queued deliveries; True when the queue drained."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return self._queue.unfinished_tasks == 0

    def close(self, timeout: float = 0.0) -> None:
        """Stop accepting reports; queue the pending digest, deliver what is queued within `timeout`,
        then let the worker go.

        A delivery still hung after `timeout` is abandoned with its (daemon) worker thread; with no
        `timeout` (a reload) the worker goes on delivering what is queued, then stops.
        """
        with self._lock:
            if not self._closed:
                self._send_digest()
            self._closed = True
        drained = self.flush(timeout)
        with suppress(queue.Full):
            self._queue.put_nowait(_STOP)
        if drained:
            self._thread.join(timeout=1.0)
