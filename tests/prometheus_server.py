"""A real Prometheus for tests, plus a tiny misbehaving stand-in: a pytest plugin module.

- `PrometheusServer`: the Debian `prometheus` binary on a free loopback port, with history backfilled by
  `promtool tsdb create-blocks-from openmetrics` (timestamps in seconds, file ends with `# EOF`) before the
  server starts. More history can be added later: the server is stopped, the blocks are written into its
  data directory and it starts again on the same port (Prometheus only picks up new blocks on its own
  after a minute). Retention is 100 years so old backfilled blocks are kept; every backfill is checked to
  be queryable. The server is stopped by its PID.
- `ensure_prometheus()`: the `prometheus` and `promtool` binaries, installed with
  `apt-get install -y prometheus` when missing and running as root; otherwise the test fails saying how
  to install them.
- `StubPrometheus`: a local HTTP server that answers `/api/v1/query` (GET, or the form-encoded POST of
  long queries) however a test says (500, invalid JSON, a NaN, a stall), counting requests.
- fixtures: `prometheus_server` (one per test session, started empty), `prometheus_factory` (more,
  private servers, stopped at the end of the test) and `stub_prometheus` (a factory of started stubs).

Use it with `pytest_plugins = ["tests.prometheus_server"]` (in the root conftest, or in each test module
that needs it) and reach everything through the fixtures; a test module that imports this module at run
time (rather than under TYPE_CHECKING) keeps pytest from rewriting its asserts. This module must stay a
test harness: no project code imports it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.debian_packages import ensure_binaries
from tests.prometheus_answers import vector

CONFIG = "global:\n  scrape_interval: 30s\n"  # no scrape jobs: the TSDB holds only what tests backfill
READY_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ensure_prometheus() -> tuple[str, str]:
    """Paths of `prometheus` and `promtool`, installing the Debian package when they are missing."""
    prometheus, promtool = ensure_binaries("prometheus", ("prometheus", "promtool"), "a real Prometheus")
    return prometheus, promtool


def _last_timestamp(openmetrics: str) -> float | None:
    newest: float | None = None
    for line in openmetrics.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(" ", 2)
        if len(parts) == 3:
            try:
                stamp = float(parts[2])
            except ValueError:
                continue
            newest = stamp if newest is None else max(newest, stamp)
    return newest


class PrometheusServer:
    """One Prometheus process over a data directory it owns, on 127.0.0.1:<free port>."""

    def __init__(self, root: Path, prometheus: str, promtool: str) -> None:
        self.root = root
        self.data = root / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.config = root / "prometheus.yml"
        self.config.write_text(CONFIG, encoding="utf-8")
        self.log = root / "prometheus.log"
        self.prometheus = prometheus
        self.promtool = promtool
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._backfills = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        if self.running:
            return
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    self.prometheus,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.data}",
                    "--storage.tsdb.retention.time=100y",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"prometheus was not ready within {READY_TIMEOUT}s:\n{self._log_tail()}")

    def stop(self) -> None:
        """SIGTERM to our PID, SIGKILL if it has not exited within 10 s."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def backfill(self, openmetrics: str) -> None:
        """Write history into the TSDB (stopping and restarting a running server) and check it is there."""
        if not openmetrics.rstrip().endswith("# EOF"):
            raise ValueError("OpenMetrics input must end with `# EOF`")
        self._backfills += 1
        source = self.root / f"backfill-{self._backfills}.om"
        source.write_text(openmetrics, encoding="utf-8")
        try:
            self.backfill_file(source, newest=_last_timestamp(openmetrics))
        finally:
            source.unlink()

    def backfill_file(self, source: Path, *, newest: float | None = None) -> None:
        """`backfill` from an OpenMetrics file (kept), for histories too large to hold as one string;
        `newest` (a sample's timestamp) is where the restarted server must find samples."""
        was_running = self.running
        self.stop()
        done = subprocess.run(
            [self.promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(self.data)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"promtool failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
        if was_running:
            self.start()
            if newest is not None:
                found = self.query('count({__name__=~".+"})', newest)
                if not found:
                    raise RuntimeError(f"backfilled samples are not queryable at {newest}")

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """An instant query straight over HTTP (not through the code under test)."""
        params = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def query_requests(self) -> int:
        """How many `/api/v1/query` requests the server has handled (from its own /metrics)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return int(total)

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-3000:]
        except OSError:
            return "(no log)"


@pytest.fixture(scope="session")
def prometheus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """A running Prometheus for the whole session, empty until tests `backfill()` it."""
    prometheus, promtool = ensure_prometheus()
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), prometheus, promtool)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------------------- a misbehaving stand-in


Responder = Callable[[dict[str, str]], tuple[int, bytes]]


@dataclass
class StubPrometheus:
    """Answers every `/api/v1/query` with `responder(params)`; `delay` seconds first (a stall).

    `requests` holds each request's query parameters, `methods` its method (GET, POST) and `headers`
    its headers (names lower-cased);
    `tls` serves HTTPS with that server context.
    """

    responder: Responder = field(default=lambda _params: vector([]))
    delay: float = 0.0
    tls: ssl.SSLContext | None = None
    requests: list[dict[str, str]] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> StubPrometheus:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query)))

            def do_POST(self) -> None:  # the API's form-encoded POST, for long queries
                length = int(self.headers.get("Content-Length") or 0)
                self._answer(dict(urllib.parse.parse_qsl(self.rfile.read(length).decode())))

            def _answer(self, query: dict[str, str]) -> None:
                stub.requests.append(query)
                stub.methods.append(self.command)
                stub.headers.append({k.lower(): v for k, v in self.headers.items()})
                if stub.delay:
                    time.sleep(stub.delay)
                status, body = stub.responder(query)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (timeout) before the stall ended

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if self.tls is not None:
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


StubFactory = Callable[..., StubPrometheus]
ServerFactory = Callable[[], PrometheusServer]


@pytest.fixture
def stub_prometheus() -> Iterator[StubFactory]:
    """`stub_prometheus(responder=..., delay=..., tls=...)` -> a started stub, stopped after the test."""
    stubs: list[StubPrometheus] = []

    def make(**kwargs: Any) -> StubPrometheus:
        stub = StubPrometheus(**kwargs).start()
        stubs.append(stub)
        return stub

    try:
        yield make
    finally:
        for stub in stubs:
            stub.stop()


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[ServerFactory]:
    """`prometheus_factory()` -> a private, not yet started server, stopped after the test."""
    prometheus, promtool = ensure_prometheus()
    servers: list[PrometheusServer] = []

    def make() -> PrometheusServer:
        server = PrometheusServer(tmp_path / f"prometheus-{len(servers)}", prometheus, promtool)
        servers.append(server)
        return server

    try:
        yield make
    finally:
        for server in servers:
            server.stop()
