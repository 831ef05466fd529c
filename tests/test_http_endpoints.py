"""The daemon's HTTP servers: bounded threads and connections, idle timeouts, /report's own address."""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from rebalancer.cycle_report import CycleReport, GpuCell, NodeGpus, Summary
from rebalancer.daemon.args import DEFAULT_LISTEN, DEFAULT_REPORT_LISTEN, add_run_arguments
from rebalancer.daemon.http import REPORT_HTML_PATH, REPORT_PATH, STATUS_PATHS, ServerLimits, StatusServer
from rebalancer.daemon.loop import DaemonError
from rebalancer.daemon.wiring import start_status_servers
from rebalancer.model import Finding
from rebalancer.sinks.metrics import DaemonMetrics
from tests.builders import NOW

LEAKY = "http://bob:hunter2@prometheus.example:9090"


class FakeDaemon:
    """What the endpoints read of a daemon."""

    def __init__(self, report: CycleReport | None = None) -> None:
        self.metrics = DaemonMetrics()
        self.last_report = report

    def readiness(self) -> tuple[bool, str]:
        return True, "ok"


def report_quoting(text: str) -> CycleReport:
    summary = Summary(
        nodes=1,
        gpus=8,
        pods=0,
        proposals=0,
        evictions=0,
        blocked=0,
        nodes_freed=0,
        gpus_freed=0,
        estimated_savings_per_hour=None,
    )
    finding = Finding("telemetry-unavailable", detail=f"Prometheus at {text}: connection refused")
    # The GPU map too is report text: a label value quoting the URL is redacted like a finding.
    gpus = (NodeGpus("a-1", f"model from {text}", None, (GpuCell("0", "free"),)),)
    return CycleReport(mode="dry-run", now=NOW, summary=summary, findings=(finding,), gpu_nodes=gpus)


def get(url: str, method: str = "GET") -> tuple[int, str, str]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def servers() -> Iterator[list[StatusServer]]:
    made: list[StatusServer] = []
    yield made
    for server in made:
        server.stop()


def test_400_idle_connections_hold_no_threads_and_healthz_still_answers(servers: list[StatusServer]) -> None:
    before = threading.active_count()
    limits = ServerLimits()
    server = StatusServer(FakeDaemon(), "127.0.0.1", 0, limits=limits).start()
    servers.append(server)
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(400)]
    try:
        assert get(f"http://127.0.0.1:{server.port}/healthz")[:1] == (200,)
        # The request threads and the one serving thread, whatever the number of connections.
        assert threading.active_count() - before <= limits.threads + 1
    finally:
        for sock in idle:
            sock.close()


def test_an_idle_connection_is_closed_after_the_idle_timeout(servers: list[StatusServer]) -> None:
    server = StatusServer(FakeDaemon(), "127.0.0.1", 0, limits=ServerLimits(idle_timeout=1)).start()
    servers.append(server)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as silent:
        started = time.monotonic()
        assert silent.recv(1) == b""  # closed by the server, not by the 10 s client timeout
        assert 0.9 <= time.monotonic() - started < 6.0

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as kept:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"ok\n"):
            answer += kept.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert kept.recv(1) == b""  # a kept-alive connection too, once it has been idle that long
        assert time.monotonic() - started < 6.0


def test_report_can_have_its_own_address_and_can_be_off(servers: list[StatusServer]) -> None:
    daemon = FakeDaemon(report_quoting("nothing secret"))
    status_port, report_port = free_port(), free_port()
    servers.extend(start_status_servers(daemon, ("127.0.0.1", status_port), ("127.0.0.1", report_port)))
    status, report = (f"http://127.0.0.1:{port}" for port in (status_port, report_port))
    for path in STATUS_PATHS:
        assert get(status + path)[0] == 200, path
        assert get(report + path)[0] == 404, path
    code, _, body = get(status + REPORT_PATH)
    assert code == 404 and body == "not found: try /metrics, /healthz, /readyz\n"
    code, content_type, body = get(report + REPORT_PATH)
    assert (code, content_type) == (200, "application/json") and json.loads(body)["mode"] == "dry-run"
    # The page of the same report is served beside it, and only there.
    assert get(status + REPORT_HTML_PATH)[0] == 404
    code, content_type, body = get(report + REPORT_HTML_PATH)
    assert (code, content_type) == (200, "text/html; charset=utf-8") and "dry-run report" in body

    for server in servers:
        server.stop()
    servers.clear()
    servers.extend(start_status_servers(daemon, ("127.0.0.1", status_port), None))
    assert len(servers) == 1 and get(status + REPORT_PATH)[0] == 404
    assert get(status + REPORT_HTML_PATH)[0] == 404

    servers[0].stop()
    servers.clear()
    servers.extend(start_status_servers(daemon, ("127.0.0.1", status_port), ("127.0.0.1", status_port)))
    assert len(servers) == 1 and get(status + REPORT_PATH)[0] == 200 and get(status + "/metrics")[0] == 200


def test_an_address_in_use_names_its_flag_and_leaves_nothing_listening(servers: list[StatusServer]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = int(taken.getsockname()[1])
        status_port = free_port()
        with pytest.raises(DaemonError, match=rf"--report-listen: cannot listen on 127\.0\.0\.1:{busy}"):
            start_status_servers(FakeDaemon(), ("127.0.0.1", status_port), ("127.0.0.1", busy))
    with socket.socket() as again:
        again.bind(("127.0.0.1", status_port))  # the first server was closed again


def test_report_is_redacted_and_only_get_is_served(servers: list[StatusServer]) -> None:
    server = StatusServer(FakeDaemon(report_quoting(LEAKY)), "127.0.0.1", 0).start()
    servers.append(server)
    base = f"http://127.0.0.1:{server.port}"
    code, _, body = get(base + REPORT_PATH)
    assert code == 200 and "hunter2" not in body and "bob" not in body
    assert "http://***@prometheus.example:9090" in json.loads(body)["findings"][0]["detail"]
    assert json.loads(body)["gpu_nodes"][0]["gpu_model"] == "model from http://***@prometheus.example:9090"
    assert get(base + REPORT_PATH, "POST")[0] == 405
    code, _, page = get(base + REPORT_HTML_PATH)
    assert code == 200 and "hunter2" not in page and "bob" not in page
    assert "http://***@prometheus.example:9090" in page
    assert get(base + REPORT_HTML_PATH, "POST")[0] == 405
    assert get(base + "/metrics", "DELETE")[0] == 405
    assert get(base + "/healthz", "HEAD")[0] == 200


def test_the_report_page_forbids_framing_and_outside_content(servers: list[StatusServer]) -> None:
    server = StatusServer(FakeDaemon(report_quoting("nothing secret")), "127.0.0.1", 0).start()
    servers.append(server)
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{REPORT_HTML_PATH}", timeout=5) as response:
        policy = response.headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Cache-Control"] == "no-store"


def test_the_report_page_waits_for_a_first_cycle(servers: list[StatusServer]) -> None:
    server = StatusServer(FakeDaemon(None), "127.0.0.1", 0).start()
    servers.append(server)
    code, content_type, body = get(f"http://127.0.0.1:{server.port}{REPORT_HTML_PATH}")
    assert (code, content_type, body) == (404, "text/plain; charset=utf-8", "no cycle has completed yet\n")


def test_stop_is_idempotent_and_frees_the_port() -> None:
    server = StatusServer(FakeDaemon(), "127.0.0.1", 0).start()
    port = server.port
    server.stop()
    server.stop()
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))
    StatusServer(FakeDaemon(), "127.0.0.1", 0).stop()  # never started


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return parser.parse_args(argv)


def test_report_listen_flag() -> None:
    defaults = parse()
    assert (defaults.listen, defaults.report_listen) == (DEFAULT_LISTEN, DEFAULT_REPORT_LISTEN)
    assert DEFAULT_REPORT_LISTEN[0] == "127.0.0.1"  # /report names pods: loopback unless told otherwise
    assert parse("--report-listen", "off").report_listen is None
    assert parse("--report-listen", "[::1]:9000").report_listen == ("::1", 9000)
    assert parse("--report-listen", ":9000").report_listen == ("0.0.0.0", 9000)
    assert defaults.allow_service_account_token is False
    assert parse("--allow-service-account-token").allow_service_account_token is True


# A superscript two is a digit to str.isdigit that int() refuses; full-width digits int() reads.
@pytest.mark.parametrize("address", ["9000", "host:", ":65536", ":\u00b2", ":\uff19\uff10\uff10\uff10"])
def test_a_listen_address_that_is_not_host_port_is_refused_by_name(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse("--listen", address)
    assert f"argument --listen: expected HOST:PORT or :PORT, got {address!r}" in capsys.readouterr().err


def test_a_bad_report_listen_value_is_refused_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse("--report-listen", "nowhere")
    assert exited.value.code == 2
    assert "--report-listen" in capsys.readouterr().err
