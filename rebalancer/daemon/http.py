"""The daemon's HTTP endpoints: `/metrics`, `/healthz`, `/readyz`, `/report`, `/report.html`, by waitress.

`/metrics` is the private registry's exposition (prometheus_client's WSGI app: Prometheus text or
OpenMetrics as the scraper asks, gzip when it accepts it), `/healthz` says the process answers,
`/readyz` the loop's readiness (a cycle, or a standby check, succeeded within three intervals),
`/report` the last report as JSON, every string in it redacted (`redaction.redact`), `/report.html` the
same report as one self-contained page (`report_html`, which redacts too). One `StatusServer` serves the
paths it is given on one address: the daemon runs one for `/metrics`, `/healthz`, `/readyz` and, unless
told otherwise, a second one for both reports on a loopback address.

Every server is bounded (`ServerLimits`): a fixed pool of request threads, at most `connection_limit`
open connections (more wait in the listen backlog), and a connection idle for `idle_timeout` seconds is
closed, so idle or slow clients hold neither threads nor sockets for ever. Only GET (and HEAD, except
on `/metrics`) is served. It must not change the daemon: it only reads it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, make_wsgi_app
from waitress import wasyncore  # type: ignore[import-untyped]
from waitress.adjustments import Adjustments  # type: ignore[import-untyped]
from waitress.server import TcpWSGIServer  # type: ignore[import-untyped]
from waitress.task import ThreadedTaskDispatcher  # type: ignore[import-untyped]

from rebalancer.cycle_report import CycleReport
from rebalancer.redaction import redact_tree
from rebalancer.report import to_dict
from rebalancer.report_html import render_html

__all__ = [
    "ALL_PATHS",
    "REPORT_HTML_PATH",
    "REPORT_PATH",
    "REPORT_PATHS",
    "STATUS_PATHS",
    "ServerLimits",
    "Status",
    "StatusServer",
]

REPORT_PATH = "/report"
REPORT_HTML_PATH = "/report.html"
# Both name pods, nodes and workloads: they are served together, behind the same exposure rules.
REPORT_PATHS = (REPORT_PATH, REPORT_HTML_PATH)
STATUS_PATHS = ("/metrics", "/healthz", "/readyz")
ALL_PATHS = (*STATUS_PATHS, *REPORT_PATHS)

_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"
_HTML = "text/html; charset=utf-8"

StartResponse = Callable[..., Any]
Environ = dict[str, Any]


class _Metrics(Protocol):
    @property
    def registry(self) -> CollectorRegistry: ...


class Status(Protocol):
    """What the endpoints show of a daemon."""

    @property
    def metrics(self) -> _Metrics: ...

    @property
    def last_report(self) -> CycleReport | None: ...

    def readiness(self) -> tuple[bool, str]: ...


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one server may hold at once; whole seconds (waitress counts them so)."""

    # Request threads, started once: the endpoints answer from memory, in milliseconds.
    threads: int = 4
    # Open connections at once (the listening socket counts as two); more wait in the listen backlog.
    connection_limit: int = 512
    # A connection with no request in flight for this long is closed (checked every second).
    idle_timeout: int = 30

    def __post_init__(self) -> None:
        if self.threads < 1 or self.connection_limit < 4 or self.idle_timeout < 1:
            raise ValueError("threads >= 1, connection_limit >= 4 and idle_timeout >= 1 second")


def _answer(
    start_response: StartResponse, status: str, body: bytes, content_type: str = _TEXT, **extra: str
) -> list[bytes]:
    headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
    headers.extend((name.replace("_", "-"), value) for name, value in extra.items())
    start_response(status, headers)
    return [body]


class _Endpoints:
    """The WSGI application of one server: the paths it serves, read from the daemon."""

    def __init__(self, daemon: Status, paths: Collection[str]) -> None:
        self._daemon = daemon
        self._paths = tuple(path for path in ALL_PATHS if path in paths)
        self._metrics = make_wsgi_app(daemon.metrics.registry)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        method = environ.get("REQUEST_METHOD", "GET")
        if path not in self._paths:
            listed = ", ".join(self._paths)
            return _answer(start_response, "404 Not Found", f"not found: try {listed}\n".encode())
        if method not in ("GET", "HEAD") or (path == "/metrics" and method != "GET"):
            allow = "GET" if path == "/metrics" else "GET, HEAD"
            return _answer(
                start_response, "405 Method Not Allowed", f"{path}: use {allow}\n".encode(), Allow=allow
            )
        daemon = self._daemon
        if path == "/metrics":
            return self._metrics(environ, start_response)  # type: ignore[no-any-return]
        if path == "/healthz":
            return _answer(start_response, "200 OK", b"ok\n")
        if path == "/readyz":
            ready, why = daemon.readiness()
            status = "200 OK" if ready else "503 Service Unavailable"
            return _answer(start_response, status, f"{why}\n".encode())
        report = daemon.last_report
        if report is None and path == REPORT_HTML_PATH:
            return _answer(start_response, "404 Not Found", b"no cycle has completed yet\n")
        if report is None:
            return _answer(
                start_response, "404 Not Found", b'{"error": "no cycle has completed yet"}\n', _JSON
            )
        if path == REPORT_HTML_PATH:
            # A page of the cluster's names: never framed by another site, never cached on the way.
            return _answer(
                start_response,
                "200 OK",
                render_html(report).encode(),
                _HTML,
                Content_Security_Policy="default-src 'none'; style-src 'unsafe-inline'; "
                "script-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'",
                X_Content_Type_Options="nosniff",
                Cache_Control="no-store",
            )
        body = json.dumps(redact_tree(to_dict(report)), indent=2).encode() + b"\n"
        return _answer(start_response, "200 OK", body, _JSON)


class StatusServer:
    """`paths` (default all five) of one daemon on one address (port 0: any free one), within `limits`.

    `start()` serves on a thread of its own; `stop()` closes every connection and the request threads.
    """

    def __init__(
        self,
        daemon: Status,
        host: str,
        port: int,
        *,
        paths: Collection[str] = ALL_PATHS,
        limits: ServerLimits | None = None,
    ) -> None:
        unknown = set(paths) - set(ALL_PATHS)
        if unknown or not paths:
            raise ValueError(f"paths must be some of {', '.join(ALL_PATHS)}")
        self.limits = limits or ServerLimits()
        adjustments = Adjustments(
            host=host,
            port=port,
            threads=self.limits.threads,
            connection_limit=self.limits.connection_limit,
            channel_timeout=self.limits.idle_timeout,
            cleanup_interval=1,
            # poll(2): select(2) fails on descriptors above 1023, which a busy process may well hand out.
            asyncore_use_poll=True,
            ident="gpu-rebalancer",
            expose_tracebacks=False,
        )
        self._map: dict[int, Any] = {}
        self._dispatcher = ThreadedTaskDispatcher()
        self._lock = threading.Lock()
        self._closed = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self._server = TcpWSGIServer(
                _Endpoints(daemon, paths), map=self._map, dispatcher=self._dispatcher, adj=adjustments
            )
        except OSError:
            self._close_all()
            raise

    @property
    def host(self) -> str:
        return str(self._server.effective_host)

    @property
    def port(self) -> int:
        return int(self._server.effective_port)

    @property
    def address(self) -> str:
        host = self.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def start(self) -> StatusServer:
        self._dispatcher.set_thread_count(self.limits.threads)
        self._thread = threading.Thread(target=self._serve, name=f"http-{self.port}", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        try:
            while not self._stopping.is_set():
                wasyncore.loop(timeout=1.0, map=self._map, use_poll=True, count=1)
        finally:
            self._close_all()

    def _close_all(self) -> None:
        """Close the listening socket and every connection: on the serving thread, or before it runs."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for channel in list(self._map.values()):
                channel.close()  # the listening socket, its wake-up pipe, the connections
        self._dispatcher.shutdown(timeout=2)

    def stop(self) -> None:
        """Stop serving: close every connection, end the request threads. Idempotent."""
        self._stopping.set()
        if self._thread is None:
            self._close_all()
            return
        with self._lock:
            if not self._closed:
                self._server.pull_trigger()  # wake the poll so the serving thread sees the flag
        self._thread.join(timeout=5.0)
