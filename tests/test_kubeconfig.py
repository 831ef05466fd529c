"""Pointing at a cluster: a bad or missing kubeconfig is bad input (exit 2, where and what to do); a
cluster that cannot be reached is exit 1, described as what happened."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rebalancer.cli import main
from tests.test_daemon_cli import kubeconfig, policy, quiet_logging

__all__ = ["quiet_logging"]  # the fixture, shared with the daemon CLI tests


@pytest.fixture
def no_cluster_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A machine with no kubeconfig anywhere and not inside a pod."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    return home


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.usefixtures("quiet_logging")
@pytest.mark.parametrize("command", ["once", "run"])
def test_a_kubeconfig_that_is_not_yaml_is_a_located_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\ngarbage: [\n")
    extra = ["--no-leader-election"] if command == "run" else []
    code, err = run(
        capsys, command, "--kubeconfig", str(config), "--policy", str(policy(tmp_path / "p.yaml")), *extra
    )
    assert code == 2
    assert "Traceback" not in err
    [line] = err.strip().splitlines()
    assert line.startswith(f"rebalancer: error: {config}:")
    assert "not a valid kubeconfig" in line


@pytest.mark.usefixtures("quiet_logging", "no_cluster_config")
def test_no_kubeconfig_anywhere_says_what_was_tried_and_how_to_point_at_a_cluster(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = run(capsys, "once", "--policy", str(policy(tmp_path / "p.yaml")))
    assert code == 2
    assert "Traceback" not in err
    assert "No configuration found" not in err
    message = err.strip()
    assert message.startswith("rebalancer: error: no Kubernetes configuration found: ")
    assert f"{tmp_path / 'home' / '.kube' / 'config'} (does not exist)" in message
    assert "KUBECONFIG (not set)" in message
    assert "in-cluster (KUBERNETES_SERVICE_HOST not set)" in message
    assert "--kubeconfig FILE" in message
    assert "--snapshot DIR" in message


@pytest.mark.usefixtures("quiet_logging", "no_cluster_config")
def test_a_kubeconfig_variable_naming_missing_files_lists_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    code, err = run(capsys, "once", "--policy", str(policy(tmp_path / "p.yaml")))
    assert code == 2
    assert f"KUBECONFIG={tmp_path / 'a'}:{tmp_path / 'b'} (no such file)" in err


@pytest.mark.usefixtures("quiet_logging")
def test_a_missing_kubeconfig_file_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = run(
        capsys, "once", "--kubeconfig", str(tmp_path / "nope"), "--policy", str(policy(tmp_path / "p.yaml"))
    )
    assert code == 2
    assert (
        err.strip()
        == f"rebalancer: error: {tmp_path / 'nope'}: cannot read kubeconfig: No such file or directory"
    )


@pytest.mark.usefixtures("quiet_logging")
def test_an_unknown_context_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    code, err = run(
        capsys,
        "once",
        "--kubeconfig",
        str(config),
        "--context",
        "prod",
        "--policy",
        str(policy(tmp_path / "p.yaml")),
    )
    assert code == 2
    assert f"{config}: context 'prod'" in err
    assert "Traceback" not in err


@pytest.mark.usefixtures("quiet_logging")
def test_a_refused_connection_is_reported_as_refused_not_timed_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    code, err = run(capsys, "once", "--kubeconfig", str(config), "--policy", str(policy(tmp_path / "p.yaml")))
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("rebalancer: error: cannot list nodes: connection refused")
    assert "timed out" not in last
