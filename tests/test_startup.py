"""Each command loads only the edges it uses: the offline commands never import the Kubernetes client,
the scheduler or the HTTP clients.

Each command runs in a fresh interpreter (a subprocess), as a user runs it; the wrapper prints the
modules loaded once `main` returns. How fast they start is measured in bench/startup.py, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo-cluster"
# What no offline command may load: the Kubernetes client (and its dependencies of its own), the
# daemon's scheduler, the Prometheus and webhook HTTP clients.
LIVE_ONLY = ("kubernetes", "urllib3", "apscheduler", "prometheus_api_client", "requests", "structlog")

_WRAPPER = """
import json, sys
from rebalancer.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
print("\\n" + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _loaded(*argv: str) -> tuple[int, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *argv], capture_output=True, text=True, cwd=ROOT, check=False
    )
    last = done.stdout.rstrip().rsplit("\n", 1)[-1]
    answer = json.loads(last)
    return answer["code"], set(answer["modules"])


def _live(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in LIVE_ONLY)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("trace")
    nodes = root / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\na,96000,393216,8,G2\nb,104000,524288,2,T4\n")
    pods = root / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time\n"
        "p0,4000,1024,1,1000,T4,LS,Running,0,7200,0\n"
        "p1,4000,1024,2,1000,,LS,Running,0,3600,0\n"
    )
    return nodes, pods


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["once", "--help"],
        ["validate", str(DEMO / "policy.yaml")],
        ["once", "--snapshot", str(DEMO), "--policy", str(DEMO / "policy.yaml")],
        ["waste", "--snapshot", str(DEMO), "--since", "1h"],
        ["advise", "--snapshot", str(DEMO), "--since", "1h"],
        ["strategies"],
    ],
    ids=["help", "once-help", "validate", "once-snapshot", "waste-snapshot", "advise-snapshot", "strategies"],
)
def test_offline_commands_do_not_import_live_clients(argv: list[str]) -> None:
    code, modules = _loaded(*argv)
    assert code == 0
    assert _live(modules) == []


def test_simulate_does_not_import_live_clients(trace: tuple[Path, Path]) -> None:
    nodes, pods = trace
    code, modules = _loaded("simulate", "--nodes", str(nodes), "--pods", str(pods), "--replicas", "1")
    assert code == 0
    assert _live(modules) == []


def test_the_check_sees_a_live_client_when_one_is_loaded() -> None:
    """The wrapper does report what a command loads: `restore` (a live command) loads the client
    before it finds no cluster to talk to."""
    _code, modules = _loaded("restore", "--all-reclaimed", "--kubeconfig", str(ROOT / "no-such-kubeconfig"))
    assert "kubernetes" in _live(modules)


# What the command line needs before a command runs: none of the policy models, the cluster model or
# the simulator. Each command imports those itself.
MODELS = ("pydantic", "rebalancer.policy", "rebalancer.model", "rebalancer.simulate", "rebalancer.waste")


@pytest.mark.parametrize(
    "argv", [["--help"], ["advise", "--help"], ["waste", "--help"], ["simulate", "--help"]]
)
def test_the_help_loads_no_models(argv: list[str]) -> None:
    code, modules = _loaded(*argv)
    assert code == 0
    assert sorted(m for m in modules if m in MODELS or m.startswith(tuple(f"{p}." for p in MODELS))) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["validate", str(DEMO / "policy.yaml")],
        ["once", "--snapshot", str(DEMO), "--policy", str(DEMO / "policy.yaml")],
    ],
    ids=["help", "validate", "once-snapshot"],
)
def test_commands_that_parse_no_exposition_do_not_load_its_parsers_nor_look_up_the_version(
    argv: list[str],
) -> None:
    """prometheus_client's parsers are loaded for the documents the project's exposition reader leaves
    to them, and the version is read from the package metadata when asked for: the demo's telemetry is
    read from its aggregates, so neither is needed (about 60 ms of a command's start)."""
    wrapper = _WRAPPER.replace("sys.stdout.flush()", "sys.stdout.flush(); import rebalancer")
    wrapper = wrapper.replace('"code": code,', '"code": code, "version": "__version__" in vars(rebalancer),')
    done = subprocess.run(
        [sys.executable, "-c", wrapper, *argv], capture_output=True, text=True, cwd=ROOT, check=False
    )
    answer = json.loads(done.stdout.rstrip().rsplit("\n", 1)[-1])
    assert answer["code"] == 0
    assert [m for m in answer["modules"] if m.split(".")[0] == "prometheus_client"] == []
    assert answer["version"] is False
