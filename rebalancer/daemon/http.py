"""The daemon's HTTP endpoints: `/metrics`, `/healthz`, `/readyz`, `/report`.

`/metrics` is the private registry's exposition, `/readyz` the loop's readiness (a cycle, or a standby
check, succeeded within three intervals), `/report` the last report as JSON. It must not change the
daemon: it only reads it.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

from rebalancer.model import CycleReport
from rebalancer.report import to_dict

__all__ = ["Status", "StatusServer"]


class _Metrics(Protocol):
    def exposition(self, accept: str | None = None) -> tuple[bytes, str]: ...


class Status(Protocol):
    """What the endpoints show of a daemon."""

    @property
    def metrics(self) -> _Metrics: ...

    @property
    def last_report(self) -> CycleReport | None: ...

    def readiness(self) -> tuple[bool, str]: ...


class _Handler(BaseHTTPRequestHandler):
    daemon_ref: Status
    server_version = "gpu-rebalancer"

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        daemon = self.daemon_ref
        if path == "/metrics":
            body, content_type = daemon.metrics.exposition(self.headers.get("Accept"))
            self._send(200, body, content_type)
        elif path == "/healthz":
            self._send(200, b"ok\n")
        elif path == "/readyz":
            ready, why = daemon.readiness()
            self._send(200 if ready else 503, f"{why}\n".encode())
        elif path == "/report":
            report = daemon.last_report
            if report is None:
                self._send(404, b'{"error": "no cycle has completed yet"}\n', "application/json")
            else:
                self._send(200, json.dumps(to_dict(report), indent=2).encode() + b"\n", "application/json")
        else:
            self._send(404, b"not found: try /metrics, /healthz, /readyz or /report\n")

    def _send(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client went away

    def log_message(self, format: str, *args: Any) -> None:
        return


class StatusServer:
    """`/metrics`, `/healthz`, `/readyz`, `/report` of one daemon, on one port (0: any free one)."""

    def __init__(self, daemon: Status, host: str = "0.0.0.0", port: int = 8080) -> None:
        handler = type("_DaemonHandler", (_Handler,), {"daemon_ref": daemon})
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> StatusServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="http", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
