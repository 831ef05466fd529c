"""The fake API server's HTTP side, for tests only: the request log's entries, faults, the handler.

`RecordedRequest` is one request as the server saw it (method, path, query, parsed body, content type and
the fault it met), what a test asserts on. `Fault` is one injected fault (a status, a delay, a dropped
connection, an answer lost after the request was carried out) for the next matching requests. `Handler`
is the `http.server` handler: it parses a request, has the server record it and pick its fault, applies
the fault, hands the request to `FakeApiServer.handle` (or streams `FakeApiServer.watch` as chunked JSON
lines) and answers JSON, an `ApiError` as its `Status`. `last` is a query parameter's last value, as the
API server reads a repeated one.

This module must only carry requests and answers: it decides no answer itself (that is
`FakeApiServer`'s), and the log and the faults are the server's to keep, under its lock.
"""

from __future__ import annotations

import fnmatch
import json
import socket
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from tests.fake_api_errors import ApiError, WatchDropped
from tests.fake_api_kinds import JsonObj

if TYPE_CHECKING:
    from tests.fake_apiserver import FakeApiServer


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the server saw it. `body` is the parsed JSON (None when there was none)."""

    method: str
    path: str
    query: Mapping[str, tuple[str, ...]]
    body: Any
    content_type: str = ""
    fault: str | None = None

    @property
    def is_write(self) -> bool:
        return self.method not in ("GET", "HEAD")

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None


@dataclass(slots=True)
class Fault:
    """Applies to `times` requests (None: all) matching `pattern` (fnmatch on the path), after `skip`."""

    pattern: str
    method: str | None = None
    status: int | None = None
    message: str = "injected fault"
    delay: float = 0.0
    drop: bool = False
    times: int | None = 1
    skip: int = 0
    lose_answer: bool = False
    watch: bool | None = None

    def matches(self, method: str, path: str, watching: bool = False) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.method is not None and self.method != method:
            return False
        if self.watch is not None and self.watch != watching:
            return False
        return fnmatch.fnmatchcase(path, self.pattern)

    def consume(self) -> bool:
        """Count one matching request; True when the fault applies to it."""
        if self.skip > 0:
            self.skip -= 1
            return False
        if self.times is not None:
            self.times -= 1
        return True

    def describe(self) -> str:
        parts = [f"status={self.status}"] if self.status else []
        if self.delay:
            parts.append(f"delay={self.delay}")
        if self.drop:
            parts.append("drop")
        if self.lose_answer:
            parts.append("lose-answer")
        return " ".join(parts) or "none"


def last(query: Mapping[str, tuple[str, ...]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


class Handler(BaseHTTPRequestHandler):
    """Parses, records and dispatches one HTTP request; always answers JSON."""

    protocol_version = "HTTP/1.1"
    fake: FakeApiServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        split = urlsplit(self.path)
        query = {k: tuple(v) for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        ctype = self.headers.get("Content-Type") or ""
        body: Any = None
        bad_json = False
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                bad_json = True
                body = raw.decode("utf-8", "replace")
        request = RecordedRequest(self.command, split.path, query, body, ctype)
        fault = self.fake._record(request)
        watching = self.command == "GET" and last(query, "watch") in ("true", "1")
        if fault is not None:
            if fault.delay and self.fake._stop.wait(fault.delay):
                self._drop()
                return
            if fault.drop:
                self._drop()
                return
            if fault.status is not None and not fault.lose_answer:
                error = ApiError(fault.status, fault.message)
                self._send(fault.status, error.status())
                return
        if watching:  # after a delay, the watch is served as usual
            self._stream_watch(split.path, query)
            return
        try:
            if bad_json:
                raise ApiError(400, "the body of the request was in an unknown format")
            code, payload = self.fake.handle(self.command, split.path, query, body, ctype)
        except ApiError as error:
            headers = {"Retry-After": str(error.retry_after)} if error.retry_after else {}
            self._send(error.code, error.status(), headers)
            return
        if fault is not None and fault.lose_answer:  # done, but the client never hears of it
            if fault.status is not None:  # or hears a failure (a gateway that timed out, say)
                self._send(fault.status, ApiError(fault.status, fault.message).status())
            else:
                self._drop()
            return
        self._send(code, payload)

    def _stream_watch(self, path: str, query: Mapping[str, tuple[str, ...]]) -> None:
        """A watch: one JSON event a line, chunked, until the events end (timeout, 410, shutdown)."""
        try:
            events = self.fake.watch(path, query)
        except ApiError as error:
            self._send(error.code, error.status())
            return
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in events:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except WatchDropped:
            self._drop()
        except OSError:
            pass
        self.close_connection = True

    def _send(self, code: int, payload: JsonObj, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:  # the client gave up (timeout) and closed its end
            self.close_connection = True

    def _drop(self) -> None:
        self.close_connection = True
        with suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve
