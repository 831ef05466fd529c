"""`rebalancer run` as a real process (SIGTERM -> exit 0, lease released) and `rebalancer once` live."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from rebalancer.cli import main
from tests.fake_apiserver import FakeApiServer, node_json, pod_json

ROOT = Path(__file__).resolve().parents[1]
POLICY = {
    "dry_run": True,
    "interval": "10s",
    "strategies": [{"name": "gpu-consolidation", "args": {"max_utilization_percent": None}}],
    "telemetry": None,
}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for name in ("a-1", "a-2"):
            server.add(node_json(name))
        server.add(pod_json("lonely", "a-1"))
        for i in range(4):
            server.add(pod_json(f"busy-{i}", "a-2"))
        yield server


def kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def policy(path: Path, **changes: Any) -> Path:
    path.write_text(json.dumps({**POLICY, **changes}), encoding="utf-8")
    return path


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def test_run_serves_then_exits_0_on_sigterm_releasing_the_lease(api: FakeApiServer, tmp_path: Path) -> None:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "rebalancer.cli",
        "run",
        "--kubeconfig",
        str(kubeconfig(tmp_path / "kubeconfig", api.url)),
        "--policy",
        str(policy(tmp_path / "policy.yaml")),
        "--listen",
        f"127.0.0.1:{port}",
        "--log-format",
        "json",
        "--lease-namespace",
        "gpu-rebalancer",
        "--identity",
        "replica-a",
        "--lease-duration",
        "3s",
        "--renew-deadline",
        "2s",
        "--retry-period",
        "1s",
        "--leader-margin",
        "0s",
    ]
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 15
        while get(f"http://127.0.0.1:{port}/readyz")[0] != 200:
            assert process.poll() is None, process.communicate()[1].decode()[-3000:]
            assert time.monotonic() < deadline, "the daemon did not become ready"
            time.sleep(0.05)
        status, body = get(f"http://127.0.0.1:{port}/report")
        assert status == 200 and json.loads(body)["mode"] == "dry-run"
        assert "gpu_rebalancer_leader 1.0" in get(f"http://127.0.0.1:{port}/metrics")[1]
        lease = api.get("Lease", "gpu-rebalancer", "gpu-rebalancer", "coordination.k8s.io/v1")
        assert lease is not None and lease["spec"]["holderIdentity"] == "replica-a"

        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr.decode()[-3000:]
    events = [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert "daemon started" in names and "stop requested" in names and names[-1] == "daemon stopped"
    decisions = [e for e in events if e["event"] == "decision"]
    assert decisions and all(e["cycle_id"] for e in decisions)
    lease = api.get("Lease", "gpu-rebalancer", "gpu-rebalancer", "coordination.k8s.io/v1")
    assert lease is not None and not lease["spec"].get("holderIdentity")  # released for the standby
    assert not api.requests_to("/api/v1/namespaces/*/pods/*/eviction")  # dry-run


@pytest.fixture
def quiet_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In-process CLI runs log to stderr as the command does, without re-configuring stdlib logging."""

    def to_stderr(*_args: object, **_kwargs: object) -> None:
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

    monkeypatch.setattr("rebalancer.daemon.configure_logging", to_stderr)
    yield
    structlog.reset_defaults()


@pytest.mark.usefixtures("quiet_logging")
def test_once_without_snapshot_runs_one_dry_run_cycle_on_the_cluster(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", api.url)
    args = ["once", "--kubeconfig", str(config), "--policy", str(policy(tmp_path / "p.yaml"))]
    code = main([*args, "--output", "json"])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)
    assert report["mode"] == "dry-run"
    assert [(d["pod"], d["outcome"]) for d in report["decisions"]] == [("lonely", "would-evict")]
    assert api.writes() == []


@pytest.mark.usefixtures("quiet_logging")
def test_once_no_dry_run_evicts(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", api.url)
    args = ["once", "--kubeconfig", str(config), "--policy", str(policy(tmp_path / "p.yaml"))]
    code = main([*args, "--no-dry-run", "--output", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["mode"] == "live"
    assert [(d["pod"], d["outcome"]) for d in report["decisions"]] == [("lonely", "evicted")]
    assert api.pod("ml", "lonely") is None
    assert [r.path for r in api.writes()] == ["/api/v1/namespaces/ml/pods/lonely/eviction"]


@pytest.mark.usefixtures("quiet_logging")
def test_once_against_an_unreachable_cluster_exits_1_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    code = main(["once", "--kubeconfig", str(config), "--policy", str(policy(tmp_path / "p.yaml"))])
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines()[-1].startswith("rebalancer: error: cannot list nodes: ")
    assert "Traceback" not in err


@pytest.mark.usefixtures("quiet_logging")
def test_run_with_an_invalid_policy_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("interval: 1s\n")
    assert main(["run", "--policy", str(bad), "--no-leader-election"]) == 2
    assert "interval must be at least 10s" in capsys.readouterr().err
