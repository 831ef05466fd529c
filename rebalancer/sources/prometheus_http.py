"""Asking Prometheus one instant query, within a deadline, with the credentials the policy names.

Owns the HTTP side of the live telemetry source (`sources.prometheus` owns what is asked and what the
answers mean):

- `Deadline`: the budget of one telemetry read (`telemetry.prometheus.deadline`), on a monotonic
  timer; every request's timeout is the smaller of `telemetry.prometheus.timeout` and what is left,
  and a retry's backoff that would end past it is not slept;
- `PrometheusHttp.query`: `GET /api/v1/query` through requests, retried on no answer, a timeout, 429
  and 5xx (`kubeapi.with_retries`, the one retry rule, with short backoffs); the body is streamed and
  each socket read waits at most until the request's own end, so a server that trickles its answer
  cannot stretch a request past its timeout or the deadline (one read returns as soon as any bytes
  arrive). The status line and headers are read by requests with the request's timeout per read;
  a server trickling those byte by byte is bounded only per read;
- the answer's envelope (Prometheus HTTP API), decoded with msgspec: `status` must be `success`;
  `warnings`, an `infos` entry that says partial, or `isPartial: true` (Thanos / VictoriaMetrics style
  partial responses) make the answer unusable: part of the data is missing, and one partial query
  corrupts the joins of the others. `query` gives `data.result` as plain JSON values; `query_vector`
  an instant vector as typed samples, each series' labels left as the raw JSON of its `metric` object
  (the caller decodes each distinct label set once, however many answers repeat it);
- a query longer than `POST_ABOVE` characters is sent as a form-encoded POST, as the API allows, so
  that no proxy refuses a long URL; answers are asked for uncompressed (`Accept-Encoding: identity`);
- `bearer_headers`: the bearer token from `bearer_token_file` (read on every call, so rotated tokens
  work) or `bearer_token_env`, refusing to send the pod's own service-account token (the file, or a
  token equal to its content) unless the daemon runs with `--allow-service-account-token`: whoever
  edits the policy must not be able to ship the rebalancer's cluster credentials to any URL.

Every message it raises (`PrometheusError`) is redacted (`rebalancer.redaction`). It must not parse
series or judge telemetry, and it reads no wall clock: only the monotonic timer of the deadline.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec
import requests
import urllib3

from rebalancer.kubeapi import exponential_backoff, with_retries
from rebalancer.policy import PrometheusConfig, format_duration
from rebalancer.redaction import redact, redact_url

__all__ = [
    "RETRY_STATUSES",
    "SERVICE_ACCOUNT_TOKEN",
    "Deadline",
    "DeadlinePassed",
    "PrometheusError",
    "PrometheusHttp",
    "VectorSample",
    "bearer_headers",
]

# Statuses worth another try: throttling, and the server / gateway / overload family.
RETRY_STATUSES = (429, 500, 502, 503, 504)
RETRY_BACKOFF_SECONDS = 0.25
RETRY_BACKOFF_MAX_SECONDS = 2.0
# Where the kubelet mounts a pod's service-account token.
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
ALLOW_FLAG = "--allow-service-account-token"
_CHUNK = 1024 * 1024
# Queries longer than this (characters of PromQL) go in a POST body rather than the URL.
POST_ABOVE = 4000


class VectorSample(msgspec.Struct, gc=False):
    """One series of an instant vector: its labels as raw JSON, and `[time, value]`."""

    metric: msgspec.Raw
    value: tuple[float, float]


class _TextSample(msgspec.Struct, gc=False):
    metric: msgspec.Raw
    value: tuple[float, str]


_Sample = TypeVar("_Sample", VectorSample, _TextSample)


class _VectorData(msgspec.Struct, Generic[_Sample], gc=False):
    """An answer's `data`: an instant vector's samples, their values as numbers or as text."""

    resultType: str = ""
    result: list[_Sample] = []


# Sample values are strings ("0.5", "NaN", "+Inf"): the first decoder reads them as numbers directly
# (lax mode), but for "+Inf", which Python's float() reads and it does not; the second one keeps them
# as text, for answers holding a "+Inf".
_VECTOR = msgspec.json.Decoder(_VectorData[VectorSample], strict=False)
_TEXT_VECTOR = msgspec.json.Decoder(_VectorData[_TextSample])


class _Envelope(msgspec.Struct):
    status: Any = None
    data: msgspec.Raw = msgspec.Raw()
    error: Any = None
    warnings: Any = None
    infos: Any = None
    isPartial: Any = None


class PrometheusError(Exception):
    """Prometheus could not answer a query (connection, timeout, HTTP error, malformed or partial answer)."""


class DeadlinePassed(PrometheusError):
    """The telemetry read's deadline passed before Prometheus answered everything."""


class Deadline:
    """`seconds` from now on a monotonic timer (`clock`, injectable for tests)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._end = clock() + seconds

    def remaining(self) -> float:
        return self._end - self._clock()

    def now(self) -> float:
        return self._clock()

    def passed(self, what: str) -> DeadlinePassed:
        return DeadlinePassed(
            f"gave up {what}: the {format_duration(math.ceil(self.seconds))} deadline of the cycle's "
            "telemetry read passed (telemetry.prometheus.deadline)"
        )


class _Status(Exception):
    """A non-200 answer, kept apart so the retry rule can look at its status."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}" if detail else f"HTTP {status}")
        self.status = status


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, _Status):
        return exc.status in RETRY_STATUSES
    if isinstance(exc, requests.exceptions.SSLError):
        return False  # an untrusted certificate stays untrusted
    return isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout)


def _describe(exc: BaseException) -> str:
    """A failed request as an operator would say it, credentials masked."""
    if isinstance(exc, requests.exceptions.Timeout):
        return "timed out"
    if isinstance(exc, requests.exceptions.ConnectionError):
        cause = exc.args[0] if exc.args else exc
        reason = getattr(cause, "reason", None)
        if reason is not None:
            cause = reason
        if "timed out" in str(cause).lower():
            return "timed out"
        return redact(f"cannot connect ({cause})")[:300]
    if isinstance(exc, _Status):
        return redact(str(exc))[:300]
    return redact(f"{type(exc).__name__}: {exc}")[:300]


def _seconds_param(seconds: float) -> str:
    """A Prometheus duration: `3s`, or milliseconds when not a whole second."""
    ms = max(1, math.floor(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _error_detail(body: bytes) -> str:
    """The `error` of a Prometheus error envelope, else the start of the body."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        kind = parsed.get("errorType")
        return f"{kind}: {parsed['error']}" if isinstance(kind, str) and kind else parsed["error"]
    return body[:200].decode("utf-8", errors="replace").strip()


def _partial(envelope: _Envelope) -> str | None:
    """Why an answer is partial (warnings, an info that says partial, isPartial), or None."""
    warnings = envelope.warnings
    if warnings:
        shown = "; ".join(str(w) for w in warnings[:3]) if isinstance(warnings, list) else str(warnings)
        return f"warnings: {shown}"
    infos = envelope.infos
    if isinstance(infos, list):
        partial = [str(i) for i in infos if "partial" in str(i).lower()]
        if partial:
            return f"infos: {'; '.join(partial[:3])}"
    if envelope.isPartial is True:
        return "isPartial: true"
    return None


class PrometheusHttp:
    """One telemetry read's connection to Prometheus: a session, its headers and its deadline."""

    def __init__(
        self,
        conn: PrometheusConfig,
        headers: Mapping[str, str],
        deadline: Deadline,
        session: requests.Session,
    ) -> None:
        self._conn = conn
        # Uncompressed: an answer of 40,000 GPUs is some 9 MB, and gzip would cost Prometheus and this
        # process more CPU (30 ms here per answer) than the bytes cost on a cluster network.
        self._headers = {"Accept-Encoding": "identity", **headers}
        self._deadline = deadline
        self._session = session
        self._base = conn.url.rstrip("/")
        self.where = redact_url(conn.url)

    def query(self, expr: str, time_param: str) -> object:
        """`data.result` of the instant query `expr` at `time_param`. Raises PrometheusError."""
        data = self._data(expr, self._fetch(expr, time_param))
        try:
            parsed = msgspec.json.decode(data)
        except msgspec.DecodeError as exc:
            raise PrometheusError(
                redact(f"query {expr!r} failed: invalid response ({type(exc).__name__}: {exc})")[:300]
            ) from None
        if not isinstance(parsed, dict) or "result" not in parsed:
            raise PrometheusError(f"query {expr!r}: invalid response (no data.result)")
        return parsed["result"]

    def query_vector(self, expr: str, time_param: str) -> list[VectorSample]:
        """The instant vector `expr` answers at `time_param`. Raises PrometheusError, also when the
        answer is not an instant vector."""
        data = self._data(expr, self._fetch(expr, time_param))
        vector: _VectorData[VectorSample] | None
        try:
            vector = _VECTOR.decode(data)
        except msgspec.DecodeError:
            vector = _text_vector(data, expr)
        if vector is None or vector.resultType != "vector":
            try:
                got = msgspec.json.decode(data)
            except msgspec.DecodeError:
                got = None
            if not isinstance(got, dict) or "result" not in got:
                raise PrometheusError(f"query {expr!r}: invalid response (no data.result)")
            kind = got.get("resultType")
            shown = repr(kind) if isinstance(kind, str) else str(got["result"])[:200]
            raise PrometheusError(f"{expr}: expected an instant vector, got {shown}")
        return vector.result

    def _fetch(self, expr: str, time_param: str) -> bytes:
        """The body of the answer to `expr`, with the retry rule. Raises PrometheusError."""
        conn = self._conn

        def sleep(seconds: float) -> None:
            if seconds >= self._deadline.remaining():
                raise self._deadline.passed(f"retrying {expr!r}")
            time.sleep(seconds)

        try:
            body = with_retries(
                lambda: self._attempt(expr, time_param),
                retries=conn.retries,
                backoff=exponential_backoff(RETRY_BACKOFF_SECONDS, RETRY_BACKOFF_MAX_SECONDS),
                sleep=sleep,
                retry_if=_transient,
            )
        except PrometheusError:
            raise
        except (requests.exceptions.RequestException, _Status, OSError) as exc:
            if isinstance(exc, requests.exceptions.Timeout) and self._deadline.remaining() <= 0:
                raise self._deadline.passed(f"waiting for {expr!r}") from None
            raise PrometheusError(f"query {expr!r} failed: {_describe(exc)}") from None
        return body

    def _attempt(self, expr: str, time_param: str) -> bytes:
        remaining = self._deadline.remaining()
        if remaining <= 0:
            raise self._deadline.passed(f"before asking {expr!r}")
        timeout = min(float(max(self._conn.timeout, 1)), remaining)
        end = self._deadline.now() + timeout
        params = {"query": expr, "time": time_param, "timeout": _seconds_param(timeout)}
        long = len(expr) > POST_ABOVE
        with self._session.request(
            "POST" if long else "GET",
            f"{self._base}/api/v1/query",
            params=None if long else params,
            data=params if long else None,
            headers=self._headers,
            timeout=timeout,
            stream=True,
            allow_redirects=False,
            # Explicitly: requests lets REQUESTS_CA_BUNDLE override the session's CA setting.
            verify=self._session.verify,
        ) as response:
            body = self._read(response, end)
            if response.status_code != 200:
                raise _Status(response.status_code, _error_detail(body))
            return body

    def _read(self, response: requests.Response, end: float) -> bytes:
        """The whole body, each socket read waiting at most until `end`."""
        raw = response.raw
        chunks: list[bytes] = []
        while True:
            left = end - self._deadline.now()
            if left <= 0:
                raise requests.exceptions.ReadTimeout("the answer did not arrive in time")
            sock = getattr(getattr(raw, "connection", None), "sock", None)
            if isinstance(sock, socket.socket):
                sock.settimeout(left)
            try:
                chunk = raw.read1(_CHUNK, decode_content=True)
            except (TimeoutError, urllib3.exceptions.ReadTimeoutError):
                raise requests.exceptions.ReadTimeout("the answer did not arrive in time") from None
            except (urllib3.exceptions.HTTPError, OSError) as exc:  # a dropped connection, a bad encoding
                raise requests.exceptions.ConnectionError(exc) from None
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    def _data(self, expr: str, body: bytes) -> bytes:
        """The raw `data` of a successful, complete answer. Raises PrometheusError."""
        try:
            envelope = msgspec.json.decode(body, type=_Envelope)
        except msgspec.ValidationError:
            raise PrometheusError(f"query {expr!r}: invalid response (not a JSON object)") from None
        except msgspec.DecodeError as exc:
            raise PrometheusError(
                redact(f"query {expr!r} failed: invalid response ({type(exc).__name__}: {exc})")[:300]
            ) from None
        if envelope.status != "success":
            detail = envelope.error or envelope.status
            raise PrometheusError(redact(f"query {expr!r} failed: Prometheus answered {detail!r}")[:300])
        partial = _partial(envelope)
        if partial is not None:
            raise PrometheusError(
                redact(
                    f"query {expr!r} got a partial answer ({partial}); the whole cycle's telemetry is "
                    "unusable, as one partial query corrupts the joins of the others"
                )[:500]
            )
        data = bytes(envelope.data)
        if not data:
            raise PrometheusError(f"query {expr!r}: invalid response (no data.result)")
        return data


def _text_vector(data: bytes, expr: str) -> _VectorData[VectorSample] | None:
    """An instant vector whose values the lax decoder refused (a "+Inf"), read with float(); None when
    `data` is no instant vector at all."""
    try:
        text = _TEXT_VECTOR.decode(data)
    except msgspec.DecodeError:
        return None
    samples = []
    for sample in text.result:
        try:
            value = float(sample.value[1])
        except ValueError:
            raise PrometheusError(f"{expr}: malformed sample value {sample.value[1]!r}") from None
        samples.append(VectorSample(sample.metric, (sample.value[0], value)))
    return _VectorData(text.resultType, samples)


# --------------------------------------------------------------------------- credentials


def _same_file(configured: str, account: Path) -> bool:
    mine = Path(configured)
    try:
        if mine.resolve() == account.resolve():
            return True
        return mine.exists() and account.exists() and os.path.samefile(mine, account)
    except (OSError, RuntimeError):
        return False


def _service_account_token(account: Path) -> str | None:
    try:
        return account.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def bearer_headers(
    conn: PrometheusConfig,
    environ: Mapping[str, str],
    *,
    allow_service_account_token: bool,
    service_account_token: Path,
) -> dict[str, str]:
    """The Authorization header the policy asks for (none without a token setting). Raises PrometheusError."""
    how = f"start the daemon with {ALLOW_FLAG} (the Deployment's args) to send it anyway"
    token: str | None = None
    setting = ""
    if conn.bearer_token_file:
        setting = "telemetry.prometheus.bearer_token_file"
        if not allow_service_account_token and _same_file(conn.bearer_token_file, service_account_token):
            raise PrometheusError(
                f"{setting} {conn.bearer_token_file} is the pod's own service-account token; it is not "
                f"sent to Prometheus: {how}"
            )
        try:
            token = Path(conn.bearer_token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise PrometheusError(
                f"cannot read bearer token file {conn.bearer_token_file}: "
                f"{getattr(exc, 'strerror', None) or exc}"
            ) from None
        if not token:
            raise PrometheusError(f"bearer token file {conn.bearer_token_file} is empty")
    elif conn.bearer_token_env:
        setting = f"telemetry.prometheus.bearer_token_env ({conn.bearer_token_env})"
        token = environ.get(conn.bearer_token_env, "").strip()
        if not token:
            raise PrometheusError(f"bearer token env var {conn.bearer_token_env} is not set or empty")
    if not token:
        return {}
    if not allow_service_account_token and token == _service_account_token(service_account_token):
        raise PrometheusError(
            f"{setting} holds the pod's own service-account token ({service_account_token}); it is not "
            f"sent to Prometheus: {how}"
        )
    return {"Authorization": f"Bearer {token}"}
