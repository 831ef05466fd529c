"""`rebalancer run --no-dry-run` as a real process against the fake API server, killed or stopped in the
middle of a node drain.

- SIGKILL mid-drain: every eviction the API server accepted before the kill (but the one in flight) is
  in the state ConfigMap; the next process reads it, does not disrupt the same workload again within
  its cooldown, and lifts the interrupted drain's mark from the node still running pods;
- SIGTERM mid-drain on a slow API server: the drain goes on for `--shutdown-timeout`, then stops; the
  process saves its memory, releases the Lease and exits 0 well inside the pod's grace period.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rebalancer.node_marks import DRAINING_TAINT_KEY
from rebalancer.state import STATE_CONFIGMAP, STATE_KEY
from tests.fake_apiserver import FakeApiServer
from tests.test_daemon_cli import FAST_ELECTION, STATE_NS, free_port, start_run
from tests.test_fencing import eight_pod_drain

EVICTIONS = "/api/v1/namespaces/*/pods/*/eviction"
LIVE_POLICY = {
    "dry_run": False,
    "interval": "10s",
    "strategies": [
        {
            "name": "gpu-consolidation",
            "args": {"max_utilization_percent": None, "max_allocated_percent": 60},
        }
    ],
    "limits": {"max_per_namespace": None},
    "telemetry": None,
}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        eight_pod_drain(server)
        yield server


def _start(api: FakeApiServer, tmp_path: Path, identity: str, *options: str) -> subprocess.Popen[bytes]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(json.dumps(LIVE_POLICY), encoding="utf-8")
    listen = ("--listen", f"127.0.0.1:{free_port()}", "--report-listen", "off")
    return start_run(api, tmp_path, policy, *listen, "--identity", identity, *FAST_ELECTION, *options)


def _wait(predicate: Callable[[], bool], timeout: float, what: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(
                f"the daemon exited while waiting for {what}: {process.communicate()[1][-3000:]!r}"
            )
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"timed out waiting for {what}: {process.communicate()[1][-3000:]!r}")
        time.sleep(0.02)


def _evicted(api: FakeApiServer) -> set[str]:
    return {f"x{i}" for i in range(8)} - {p["metadata"]["name"] for p in api.objects("Pod")}


def _stored_evictions(api: FakeApiServer) -> set[str]:
    stored = api.get("ConfigMap", STATE_CONFIGMAP, STATE_NS)
    assert stored is not None, "no state ConfigMap"
    return {r["pod"] for r in json.loads(stored["data"][STATE_KEY])["evictions"]}


def _marks(api: FakeApiServer, node: str) -> list[str]:
    found = api.node(node)
    assert found is not None
    return [t["value"] for t in found["spec"].get("taints") or () if t["key"] == DRAINING_TAINT_KEY]


def _events(stderr: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]


def test_a_sigkill_mid_drain_loses_no_eviction_and_the_next_process_respects_the_cooldown(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.inject(EVICTIONS, delay=0.4, times=None)
    first = _start(api, tmp_path, "replica-a")
    try:
        _wait(lambda: len(_evicted(api)) >= 3, 30, "three evictions", first)
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    time.sleep(0.6)  # an eviction in flight at the kill lands on the server all the same
    accepted, stored = _evicted(api), _stored_evictions(api)
    assert stored <= accepted and len(accepted - stored) <= 1, (accepted, stored)
    assert 3 <= len(accepted) < 8
    assert _marks(api, "a-1"), "the killed drain left its mark"

    api.clear_requests()
    second = _start(api, tmp_path, "replica-b")
    try:
        # It waits out the dead leader's Lease, then runs a cycle: the interrupted mark goes.
        _wait(lambda: not _marks(api, "a-1"), 30, "the interrupted drain's mark to be lifted", second)
        time.sleep(1.0)  # the rest of that cycle
        assert not api.requests_to(EVICTIONS, "POST"), "the workload was disrupted again within its cooldown"
        second.send_signal(signal.SIGTERM)
        _, stderr = second.communicate(timeout=30)
    finally:
        if second.poll() is None:
            second.kill()
    assert second.returncode == 0, stderr[-3000:]
    refused = [e for e in _events(stderr) if e.get("event") == "decision" and e.get("blocked_by")]
    assert refused and {e["blocked_by"] for e in refused} == {"cooldown"}
    assert _stored_evictions(api) >= stored


def test_a_sigterm_mid_drain_on_a_slow_api_server_stops_at_the_shutdown_deadline(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """Each eviction takes 1.5 s (an eight-pod drain, 12 s); SIGTERM after the second, with a shutdown
    timeout of 2 s: at most two more start, the process saves, releases the Lease and exits 0."""
    api.inject(EVICTIONS, delay=1.5, times=None)
    process = _start(api, tmp_path, "replica-a", "--shutdown-timeout", "2s")
    try:
        _wait(lambda: len(_evicted(api)) >= 2, 30, "two evictions", process)
        stopped = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        took = time.monotonic() - stopped
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-3000:]
    assert took < 2 + 1.5 + 3, f"the stop took {took:.1f}s"
    time.sleep(1.6)  # what was in flight has landed
    accepted = _evicted(api)
    assert 2 <= len(accepted) <= 4, accepted
    assert _stored_evictions(api) == accepted, stderr.decode()[-4000:]
    lease = api.get("Lease", "gpu-rebalancer", STATE_NS, "coordination.k8s.io/v1")
    assert lease is not None and not lease["spec"].get("holderIdentity")
    cut = [e for e in _events(stderr) if e.get("event") == "decision" and e.get("outcome") == "error"]
    assert cut and all("shutting down" in str(e["reason"]) for e in cut)
