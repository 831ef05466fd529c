"""`rebalancer run` as a real process (SIGTERM -> exit 0, lease released, the actuator's memory in its
ConfigMap, nothing written in dry-run) and `rebalancer once` live."""

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
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog

from rebalancer.cli import build_parser, main
from rebalancer.daemon.loop import Clock, Daemon, DaemonError, DaemonSinks
from rebalancer.daemon.wiring import build_state_store, kube_snapshot_source, live_edge
from rebalancer.policy import parse_policy
from rebalancer.state import STATE_CONFIGMAP, STATE_KEY, ActuatorState, ConfigMapStateStore, FileStateStore
from tests.builders import NOW
from tests.fake_apiserver import FakeApiServer, node_json, pod_json
from tests.http_receiver import HttpReceiver, http_receiver

__all__ = ["http_receiver"]

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


STATE_NS = "gpu-rebalancer"


@dataclass
class Served:
    """A `rebalancer run` process serving on `port`; `stderr` (its logs) once it has exited."""

    port: int
    stderr: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_run(
    api: FakeApiServer, tmp_path: Path, policy_file: Path, *options: str
) -> subprocess.Popen[bytes]:
    """`rebalancer run` as a process against the fake with `policy_file`, JSON logs, the Lease and state in
    STATE_NS, out of any pod's environment; `options` add or set the rest."""
    command = [
        sys.executable,
        "-m",
        "rebalancer.cli",
        "run",
        "--kubeconfig",
        str(kubeconfig(tmp_path / "kubeconfig", api.url)),
        "--policy",
        str(policy_file),
        "--log-format",
        "json",
        "--lease-namespace",
        STATE_NS,
        *options,
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "POD_NAMESPACE")}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@contextmanager
def serving(api: FakeApiServer, tmp_path: Path, *options: str) -> Iterator[Served]:
    """`rebalancer run` as a process against the fake, ready (a first cycle done); stopped with SIGTERM,
    which must end it with exit code 0."""
    served = Served(free_port())
    address = f"127.0.0.1:{served.port}"
    # /report on the same server, so the tests read it where they read the rest.
    listen = ("--listen", address, "--report-listen", address)
    process = start_run(api, tmp_path, policy(tmp_path / "policy.yaml"), *listen, *options)
    try:
        deadline = time.monotonic() + 15
        while get(f"{served.url}/readyz")[0] != 200:
            assert process.poll() is None, process.communicate()[1].decode()[-3000:]
            assert time.monotonic() < deadline, "the daemon did not become ready"
            time.sleep(0.05)
        yield served
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
        served.stderr = stderr.decode()
        assert process.returncode == 0, served.stderr[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


# Leader election in seconds, not the default 15s Lease: a process test takes over or stops quickly.
FAST_ELECTION = (
    "--lease-duration",
    "3s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "1s",
    "--leader-margin",
    "0s",
)


def test_run_serves_then_exits_0_on_sigterm_releasing_the_lease(api: FakeApiServer, tmp_path: Path) -> None:
    with serving(api, tmp_path, "--identity", "replica-a", *FAST_ELECTION) as served:
        status, body = get(f"{served.url}/report")
        assert status == 200 and json.loads(body)["mode"] == "dry-run"
        assert "gpu_rebalancer_leader 1.0" in get(f"{served.url}/metrics")[1]
        lease = api.get("Lease", "gpu-rebalancer", "gpu-rebalancer", "coordination.k8s.io/v1")
        assert lease is not None and lease["spec"]["holderIdentity"] == "replica-a"
        # Its snapshots come from the watch cache: each kind listed once, then watched.
        deadline = time.monotonic() + 10
        while {path for path, watch in _reads(api) if watch} != set(CACHED):
            assert time.monotonic() < deadline, f"not watched: {_reads(api)}"
            time.sleep(0.05)
        # ... which its metrics describe, kind by kind.
        metrics = get(f"{served.url}/metrics")[1]
        for kind in ("Node", "Pod", "PodDisruptionBudget"):
            assert f'gpu_rebalancer_cluster_cache_age_seconds{{kind="{kind}"}}' in metrics
            assert f'gpu_rebalancer_cluster_cache_relists_total{{kind="{kind}",reason="gone"}} 0.0' in metrics
        # ... with the bound of that very cache (the default's) in the help.
        assert "Stale past the cache's bound (180 s)." in metrics
    reads = _reads(api)
    events = [json.loads(line) for line in served.stderr.splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    # Plus, at the start of each term it leads a cycle in, the nodes its drain marks are looked for on
    # (even in dry run: marks a live run left still expire). One term, unless a loaded machine made it
    # lose the Lease for a moment and take it again.
    orphans = reads.count(("/api/v1/nodes", False)) - 1
    assert 1 <= orphans <= names.count("became leader")
    cached = sorted((path, watch) for path in CACHED for watch in (False, True))
    assert sorted(reads) == sorted([*cached, *[("/api/v1/nodes", False)] * orphans])
    assert "daemon started" in names and "stop requested" in names and names[-1] == "daemon stopped"
    decisions = [e for e in events if e["event"] == "decision"]
    assert decisions and all(e["cycle_id"] for e in decisions)
    lease = api.get("Lease", "gpu-rebalancer", "gpu-rebalancer", "coordination.k8s.io/v1")
    assert lease is not None and not lease["spec"].get("holderIdentity")  # released for the standby
    assert not api.requests_to("/api/v1/namespaces/*/pods/*/eviction")  # dry-run


# What `rebalancer run` keeps in its watch cache.
CACHED = ("/api/v1/nodes", "/api/v1/pods", "/apis/policy/v1/poddisruptionbudgets")


def _reads(api: FakeApiServer) -> list[tuple[str, bool]]:
    """(path, is a watch) of each read of a cached kind, in order."""
    return [(r.path, r.param("watch") in ("true", "1")) for r in api.requests if r.path in CACHED]


@pytest.fixture
def quiet_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In-process CLI runs log to stderr as the command does, without re-configuring stdlib logging."""

    def to_stderr(*_args: object, **_kwargs: object) -> None:
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

    monkeypatch.setattr("rebalancer.daemon.wiring.configure_logging", to_stderr)
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
    assert sorted(_reads(api)) == sorted((path, False) for path in CACHED)  # listed once, never watched


@pytest.mark.usefixtures("quiet_logging")
def test_once_sends_its_dry_run_report_to_a_digest_sink_when_it_ends(
    api: FakeApiServer, tmp_path: Path, http_receiver: HttpReceiver, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CronJob runs one `once` a process: a `digest: daily` sink gets each run's report, as a digest
    of one cycle (a digest period needs the daemon)."""
    config = kubeconfig(tmp_path / "kubeconfig", api.url)
    notify = {"webhooks": [{"url": http_receiver.url + "/hook", "digest": "daily"}]}
    args = ["once", "--kubeconfig", str(config), "--policy", str(policy(tmp_path / "p.yaml", notify=notify))]
    assert main([*args, "--dry-run", "--output", "json"]) == 0
    capsys.readouterr()
    [request] = http_receiver.requests
    body = request.json()
    assert body["digest"] == {"period": "daily", "cycles": 1}
    assert body["mode"] == "dry-run"
    assert [(d["pod"], d["outcome"]) for d in body["decisions"]] == [("lonely", "would-evict")]


@pytest.mark.usefixtures("quiet_logging")
def test_once_no_dry_run_evicts(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", STATE_NS)
    config = kubeconfig(tmp_path / "kubeconfig", api.url)
    args = ["once", "--kubeconfig", str(config), "--policy", str(policy(tmp_path / "p.yaml"))]
    code = main([*args, "--no-dry-run", "--output", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["mode"] == "live"
    assert [(d["pod"], d["outcome"]) for d in report["decisions"]] == [("lonely", "evicted")]
    assert api.pod("ml", "lonely") is None
    # What `run` writes around an eviction: the drain mark, the memory, the Events.
    assert {(r.method, r.path) for r in api.writes()} == {
        ("PATCH", "/api/v1/nodes/a-1"),
        ("POST", "/api/v1/namespaces/ml/pods/lonely/eviction"),
        ("POST", f"/api/v1/namespaces/{STATE_NS}/configmaps"),
        ("PATCH", f"/api/v1/namespaces/{STATE_NS}/configmaps/{STATE_CONFIGMAP}"),
        ("POST", "/api/v1/namespaces/ml/events"),
        ("POST", "/api/v1/namespaces/default/events"),
    }


@pytest.mark.usefixtures("quiet_logging")
def test_once_no_dry_run_takes_the_policy_s_eviction_section(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Server-side dry run: the API server checks the eviction and persists nothing, as `run` does.
    config = kubeconfig(tmp_path / "kubeconfig", api.url)
    live = policy(tmp_path / "p.yaml", dry_run=False, eviction={"server_dry_run": True})
    code = main(["once", "--kubeconfig", str(config), "--policy", str(live), "--output", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["mode"] == "dry-run"
    assert [(d["pod"], d["outcome"]) for d in report["decisions"]] == [("lonely", "would-evict")]
    assert api.pod("ml", "lonely") is not None
    (eviction,) = [r for r in api.writes() if r.path.endswith("/eviction")]
    assert eviction.param("dryRun") == "All"

    # A grace period the policy sets goes with the eviction.
    graced = policy(tmp_path / "g.yaml", eviction={"grace_period_seconds": 7})
    main(["once", "--kubeconfig", str(config), "--policy", str(graced), "--no-dry-run", "--output", "json"])
    capsys.readouterr()
    (eviction,) = [r for r in api.writes() if r.path.endswith("/eviction") and r.param("dryRun") is None]
    assert eviction.body["deleteOptions"]["gracePeriodSeconds"] == 7


@pytest.mark.usefixtures("quiet_logging")
def test_live_once_runs_keep_the_daemon_s_memory_and_drain_marks(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the CronJob does every 15 minutes: each run must see what the last one did, as the daemon's
    # cycles do (cooldown, disruption budget, circuit breaker), and mark the node it drains.
    monkeypatch.setenv("POD_NAMESPACE", STATE_NS)
    config = kubeconfig(tmp_path / "kubeconfig", api.url)
    args = ["once", "--kubeconfig", str(config), "--policy", str(policy(tmp_path / "p.yaml"))]
    assert main([*args, "--no-dry-run", "--output", "json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert [(d["pod"], d["outcome"]) for d in first["decisions"]] == [("lonely", "evicted")]
    node = api.node("a-1")
    assert node is not None and [t["key"] for t in node["spec"].get("taints", [])] == [
        "rebalancer.gpu/draining"
    ]
    stored = api.get("ConfigMap", STATE_CONFIGMAP, STATE_NS)
    assert stored is not None
    assert [e["pod"] for e in json.loads(stored["data"][STATE_KEY])["evictions"]] == ["lonely"]

    # The ReplicaSet's replacement, back on a-1 (its mark lifted meanwhile): the workload is cooling down.
    api.add(node_json("a-1"))
    api.add(pod_json("lonely-2", "a-1"))
    assert main([*args, "--no-dry-run", "--output", "json"]) == 0
    second = json.loads(capsys.readouterr().out)
    refused = {(d["pod"], d["blocked_by"]) for d in second["decisions"] if d["outcome"] is None}
    assert ("lonely-2", "cooldown") in refused
    assert all(d["outcome"] is None for d in second["decisions"])  # a-2's drain: the same workload
    assert api.pod("ml", "lonely-2") is not None


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


# --------------------------------------------------------------------------- the actuator's memory

CONFIGMAPS = "/api/v1/namespaces/*/configmaps*"


def test_run_builds_the_state_store_its_options_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "rebalancer-ns")
    parser = build_parser()
    with FakeApiServer() as api, api.api_client() as api_client:
        default = build_state_store(parser.parse_args(["run"]), api_client)
        assert isinstance(default, ConfigMapStateStore)
        assert (default.namespace, default.name, default.key) == ("rebalancer-ns", STATE_CONFIGMAP, STATE_KEY)
        named = build_state_store(
            parser.parse_args(
                ["run", "--no-dry-run", "--state-configmap", "memory", "--lease-namespace", "ops"]
            ),
            api_client,
        )
        assert isinstance(named, ConfigMapStateStore) and named.ref == "ops/memory"
        in_file = build_state_store(
            parser.parse_args(["run", "--state-file", str(tmp_path / "state.json")]), api_client
        )
        assert isinstance(in_file, FileStateStore) and in_file.path == tmp_path / "state.json"
        # A forced dry run keeps no memory: nothing to write.
        assert (
            build_state_store(parser.parse_args(["run", "--dry-run", "--state-configmap", "x"]), api_client)
            is None
        )
        assert api.requests == []  # building a store makes no request
    with pytest.raises(SystemExit) as exited:
        main(["run", "--state-configmap", "x", "--state-file", "y"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_live_daemon_keeps_its_memory_in_the_state_configmap(api: FakeApiServer, tmp_path: Path) -> None:
    with serving(api, tmp_path, "--no-dry-run", "--state-configmap", "rebalancer-memory") as served:
        report = json.loads(get(f"{served.url}/report")[1])
        evicted = [d["pod"] for d in report["decisions"] if d["outcome"] == "evicted"]
        assert report["mode"] == "live" and evicted
        stored = api.get("ConfigMap", "rebalancer-memory", STATE_NS)
        assert stored is not None
        memory = json.loads(stored["data"][STATE_KEY])
        assert sorted(e["pod"] for e in memory["evictions"]) == sorted(evicted)
    assert [c["metadata"]["name"] for c in api.objects("ConfigMap")] == ["rebalancer-memory"]
    paths = {r.path for r in api.requests_to(CONFIGMAPS)}
    assert paths == {
        f"/api/v1/namespaces/{STATE_NS}/configmaps",
        f"/api/v1/namespaces/{STATE_NS}/configmaps/rebalancer-memory",
    }


def test_a_dry_run_daemon_writes_nothing_not_even_its_memory(api: FakeApiServer, tmp_path: Path) -> None:
    with serving(api, tmp_path, "--dry-run", "--state-configmap", "rebalancer-memory") as served:
        report = json.loads(get(f"{served.url}/report")[1])
        assert report["mode"] == "dry-run"
        assert any(d["outcome"] == "would-evict" for d in report["decisions"])
    assert api.requests_to(CONFIGMAPS) == []
    # Only its leader Lease (acquired, renewed, released): no eviction, mark, annotation, Event or state.
    writes = {(r.method, r.path.rsplit("/", 1)[0]) for r in api.writes()}
    assert writes <= {
        ("POST", f"/apis/coordination.k8s.io/v1/namespaces/{STATE_NS}"),
        ("PUT", f"/apis/coordination.k8s.io/v1/namespaces/{STATE_NS}/leases"),
    }
    assert api.objects("ConfigMap") == []


LIVE = parse_policy({**POLICY, "dry_run": False})


def test_a_new_leader_keeps_the_circuit_its_predecessor_opened(api: FakeApiServer) -> None:
    args = build_parser().parse_args(
        ["run", "--state-configmap", "rebalancer-memory", "--lease-namespace", STATE_NS]
    )
    clock = [NOW]

    def replica(stack: ExitStack, identity: str, *, remember: bool = True) -> Daemon:
        """What `rebalancer run` builds around live evictions, for one replica."""
        api_client = stack.enter_context(api.api_client())
        store = build_state_store(args, api_client) if remember else None
        edge, sinks = live_edge(api_client, LIVE, identity, state_store=store)
        return Daemon(
            LIVE,
            kube_snapshot_source(api_client),
            dry_run=args.dry_run,
            live=edge,
            sinks=DaemonSinks(extra=sinks, notifiers=lambda _notify, _count: ()),
            clock=Clock(wall=lambda: clock[0]),
        )

    with ExitStack() as stack:
        standby = replica(stack, "replica-b")  # started with the leader: nothing stored yet
        forgetful = replica(stack, "replica-c", remember=False)
        first = replica(stack, "replica-a").run_cycle(raise_errors=True)
        assert first is not None
        assert [d.pod for d in first.decisions if d.outcome == "evicted"] == ["lonely"]
        # Its ReplicaSet re-creates it; no node takes it.
        pending = pod_json("lonely-2", None, phase="Pending")
        pending["metadata"]["creationTimestamp"] = "2026-11-29T12:01:00Z"
        api.add(pending)

        clock[0] = NOW + timedelta(minutes=20)
        evictions = len(api.requests_to("/api/v1/namespaces/*/pods/*/eviction"))
        report = standby.run_cycle(raise_errors=True)
        assert report is not None
        assert [f.kind for f in report.findings if f.kind == "circuit-open"] == ["circuit-open"]
        assert all(d.outcome != "evicted" for d in report.decisions)
        assert len(api.requests_to("/api/v1/namespaces/*/pods/*/eviction")) == evictions
        # Without the stored memory, the same takeover would not know the circuit is open.
        blind = forgetful.run_cycle(raise_errors=True)
        assert blind is not None and not [f for f in blind.findings if f.kind == "circuit-open"]
    stored = api.get("ConfigMap", "rebalancer-memory", STATE_NS)
    assert stored is not None
    memory = ActuatorState.from_json(json.loads(stored["data"][STATE_KEY]))
    assert [r.pod for r in memory.history.evictions] == ["lonely"]


@pytest.mark.parametrize("allowed", [False, True])
def test_allow_service_account_token_reaches_the_prometheus_source(
    monkeypatch: pytest.MonkeyPatch, allowed: bool
) -> None:
    built: list[dict[str, Any]] = []

    class Recorded:
        def __init__(self, *_args: object, **kwargs: Any) -> None:
            built.append(kwargs)

    class NoCluster:
        def __init__(self, *_args: object, **_kwargs: object) -> None:
            pass

        def snapshot(self, now: object) -> str:
            return "snapshot"

    monkeypatch.setattr("rebalancer.daemon.wiring.PrometheusTelemetrySource", Recorded)
    monkeypatch.setattr("rebalancer.daemon.wiring.KubeSource", NoCluster)
    flags = ["run", "--prometheus-url", "http://127.0.0.1:9090"]
    args = build_parser().parse_args([*flags, "--allow-service-account-token"] if allowed else flags)
    source = kube_snapshot_source(
        object(),  # type: ignore[arg-type]
        prometheus_url=args.prometheus_url,
        allow_service_account_token=args.allow_service_account_token,
    )
    taken: object = source(NOW, parse_policy({}))  # NoCluster's string, not a Snapshot
    assert taken == "snapshot"
    [kwargs] = built
    assert kwargs["allow_service_account_token"] is allowed
    assert kwargs["prometheus"].url == "http://127.0.0.1:9090"


@pytest.mark.usefixtures("quiet_logging")
def test_once_hands_allow_service_account_token_to_its_source(
    api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[object] = []

    def recording(*_args: object, **kwargs: object) -> object:
        seen.append(kwargs.get("allow_service_account_token"))

        def source(*_a: object) -> object:
            raise DaemonError(["no cluster in this test"])

        return source

    monkeypatch.setattr("rebalancer.daemon.wiring.kube_snapshot_source", recording)
    config = str(kubeconfig(tmp_path / "kubeconfig", api.url))
    assert main(["once", "--kubeconfig", config]) == 1
    assert main(["once", "--kubeconfig", config, "--allow-service-account-token"]) == 1
    assert seen == [False, True]


def test_every_command_that_reads_prometheus_takes_allow_service_account_token() -> None:
    for command in (["run"], ["once"], ["snapshot", "--out", "dir"]):
        assert build_parser().parse_args(command).allow_service_account_token is False
        assert (
            build_parser().parse_args([*command, "--allow-service-account-token"]).allow_service_account_token
        )


@pytest.mark.usefixtures("quiet_logging")
def test_explain_live_reads_the_cluster_as_once_does_and_never_writes(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", api.url)
    evicting = policy(tmp_path / "p.yaml", dry_run=False)  # explain is dry whatever the policy says
    base = ["--kubeconfig", str(config), "--context", "fake", "--policy", str(evicting)]
    assert main(["explain", "a-1", *base]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("node a-1 (dry-run cycle at ")
    assert out[0].endswith(", live cluster (context fake), policy p.yaml)")
    assert out[1] == "gpu-consolidation: proposed evicting ml/lonely to a-2 [drain/a-1]"
    assert out[2].startswith("  planner: approved (would-evict): node a-1: 1/8 GPUs allocated")
    assert main(["explain", "ml/busy-0", *base]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "gpu-consolidation: its node a-2: not drained: it receives pods of a node drained this cycle",
        "planner: nothing to judge: no strategy proposed anything about it",
    ]
    assert api.writes() == []
    assert main(["explain", "a-1", *base, "--no-dry-run"]) == 2
    assert "explain: --no-dry-run: explain never evicts" in capsys.readouterr().err


@pytest.mark.usefixtures("quiet_logging")
def test_a_reloaded_eviction_section_is_not_half_applied(api: FakeApiServer, tmp_path: Path) -> None:
    # The actuator is built from `eviction:` at start; a reload changing it keeps the whole running
    # section (the planner's reschedule timeout included), runs the rest, says so, and counts it.
    from rebalancer.daemon.reload import PolicyWatcher
    from tests.test_daemon import sample

    path = tmp_path / "policy.yaml"
    live = {**POLICY, "dry_run": False}
    path.write_text(json.dumps(live))
    watcher = PolicyWatcher(path)
    edge, extra = live_edge(api.api_client(), watcher.current, "me")
    daemon = Daemon(
        watcher,
        kube_snapshot_source(api.api_client()),
        live=edge,
        sinks=DaemonSinks(extra=extra),
        clock=Clock(wall=lambda: NOW),
    )
    started = watcher.current.policy.eviction
    changed = {"server_dry_run": True, "reschedule_timeout": "20m"}
    path.write_text(json.dumps({**live, "eviction": changed, "limits": {"max_per_cycle": 7}}))
    report = daemon.run_cycle()
    assert report is not None
    running = daemon.policy.policy
    assert running.eviction == started  # all of it, not the planner's part only
    assert running.limits.max_per_cycle == 7  # the rest of the change runs
    assert report.policy_digest == daemon.policy.digest != watcher.current.digest
    assert sample(daemon, "gpu_rebalancer_policy_reload_errors_total") == 1
    assert sample(daemon, "gpu_rebalancer_policy_valid") == 0  # the file is not what runs
    daemon.run_cycle()
    assert sample(daemon, "gpu_rebalancer_policy_valid") == 0  # ... for as long as it is so
    path.write_text(json.dumps({**live, "limits": {"max_per_cycle": 7}}))  # eviction: as it runs
    daemon.run_cycle()
    assert sample(daemon, "gpu_rebalancer_policy_valid") == 1
    assert sample(daemon, "gpu_rebalancer_policy_reload_errors_total") == 1
    # Evicted as the running section says (for real), not as the file now says (server dry run).
    (eviction,) = api.requests_to("/api/v1/namespaces/*/pods/*/eviction", "POST")
    assert eviction.param("dryRun") is None and api.pod("ml", "lonely") is None
