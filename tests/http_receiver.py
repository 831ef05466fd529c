"""A real local HTTP receiver for notification tests (Slack incoming webhooks, generic webhooks).

`HttpReceiver` listens on 127.0.0.1:<free port>, records every request (method, path, headers, raw
body, when it arrived) and answers with the next scripted status (`script([500, 500, 200])`, then 200 for
ever), a status with headers when scripted so (`script([(429, {"Retry-After": "1"}), 200])`). It can
hang: with `hang()` every request waits until `release()` (or the receiver stops), which is how a test
shows that a hung receiver does not delay a cycle. `wait_for(n)` waits (real time, bounded) until n
requests arrived.

This module must stay a test double: no project code imports it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = 0.0  # time.monotonic() when it arrived

    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        lowered = {k.lower(): v for k, v in self.headers.items()}
        return lowered.get(name.lower())


class HttpReceiver:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._statuses: list[int | tuple[int, Mapping[str, str]]] = []
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._released = threading.Event()
        self._released.set()
        self._server: ThreadingHTTPServer | None = None

    # ---- control

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def script(self, statuses: Sequence[int | tuple[int, Mapping[str, str]]]) -> None:
        """Answer the next requests with these statuses (with these headers), then 200."""
        with self._lock:
            self._statuses = list(statuses)

    def hang(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def wait_for(self, count: int, timeout: float = 5.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"expected {count} requests, got {len(self.requests)}")
                self._arrived.wait(left)
            return list(self.requests)

    # ---- serving

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        received = Received(
            handler.command, handler.path, dict(handler.headers.items()), body, time.monotonic()
        )
        with self._arrived:
            self.requests.append(received)
            scripted = self._statuses.pop(0) if self._statuses else 200
            self._arrived.notify_all()
        status, headers = scripted if isinstance(scripted, tuple) else (scripted, {})
        self._released.wait(timeout=30)
        answer = b"ok" if status < 300 else b"error"
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "text/plain")
            handler.send_header("Content-Length", str(len(answer)))
            for name, value in headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(answer)
        except OSError:
            pass  # the client gave up (timeout)

    def start(self) -> HttpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver._handle(self)

            def do_GET(self) -> None:
                receiver._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self._released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@pytest.fixture
def http_receiver() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()
