"""Leader election on a Lease of the fake API server: two daemons, one acts; takeover; losing the lease.

Short durations (lease 1 s, renew deadline 0.6 s, retry 0.05 s) keep every test to a few seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from rebalancer.daemon.lease import LeaseElector
from rebalancer.daemon.loop import Clock, Daemon, DaemonSinks, Leadership, LiveEdge
from rebalancer.daemon.wiring import kube_snapshot_source
from rebalancer.kube_evictor import REQUESTED_BY_ANNOTATION, KubeEvictor
from rebalancer.policy import NotifyConfig, parse_policy
from rebalancer.sinks.notify import Notifier
from tests.builders import NOW
from tests.fake_apiserver import FakeApiServer, node_json, pod_json

LEASE = "/apis/coordination.k8s.io/v1/namespaces/gpu-rebalancer/leases/*"
EVICTIONS = "/api/v1/namespaces/*/pods/*/eviction"
DURATION, DEADLINE, RETRY, MARGIN = 1.0, 0.6, 0.05, 0.1

POLICY = parse_policy(
    {
        "dry_run": False,
        "strategies": [{"name": "gpu-consolidation", "args": {"max_utilization_percent": None}}],
        "telemetry": None,
    }
)


def no_notifiers(_notify: NotifyConfig, _on_result: Callable[[str, str], None]) -> list[Notifier]:
    return []


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for name in ("a-1", "a-2"):
            server.add(node_json(name))
        for i in range(4):
            server.add(pod_json(f"busy-{i}", "a-2"))
        yield server


class Replica:
    """One daemon process: its own API client, elector, evictor; cycles run by the test."""

    def __init__(self, api: FakeApiServer, identity: str) -> None:
        self.identity = identity
        self.api_client = api.api_client()
        self.elector = LeaseElector(
            self.api_client,
            name="gpu-rebalancer",
            namespace="gpu-rebalancer",
            identity=identity,
            lease_duration=DURATION,
            renew_deadline=DEADLINE,
            retry_period=RETRY,
        )
        evictor = KubeEvictor(self.api_client, requested_by=identity, retries=0)
        self.daemon = Daemon(
            POLICY,
            kube_snapshot_source(self.api_client),
            live=LiveEdge(evictor),
            leadership=Leadership(self.elector, MARGIN),
            sinks=DaemonSinks(notifiers=no_notifiers),
            clock=Clock(wall=lambda: NOW),
        )

    def start(self) -> Replica:
        self.elector.start()
        return self

    def crash(self) -> None:
        """Stop without releasing the lease, as a killed process would."""
        self.daemon.shutdown(notify_timeout=0, release_lease=False)

    def partition(self) -> None:
        """Cut this replica off the API server (its requests now fail to connect)."""
        self.api_client.configuration.host = "http://127.0.0.1:9"


@pytest.fixture
def replicas(api: FakeApiServer) -> Iterator[Callable[[str], Replica]]:
    made: list[Replica] = []

    def make(identity: str) -> Replica:
        replica = Replica(api, identity).start()
        made.append(replica)
        return replica

    yield make
    for replica in made:
        replica.daemon.shutdown(notify_timeout=0, release_lease=False)
        replica.api_client.close()  # type: ignore[no-untyped-call]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until `predicate()` held (polled every 10 ms)."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)
    return time.monotonic() - started


def evicted_by(api: FakeApiServer) -> list[tuple[str, str | None]]:
    """(pod, requested-by) of every eviction the API server accepted."""
    out = []
    for request in api.requests_to(EVICTIONS, "POST"):
        body: dict[str, Any] = request.body or {}
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        out.append((request.path.split("/")[-2], annotations.get(REQUESTED_BY_ANNOTATION)))
    return out


def leader_of(*replicas: Replica) -> Replica:
    wait_for(lambda: sum(r.elector.holds() for r in replicas) == 1, 3, "exactly one leader")
    [leader] = [r for r in replicas if r.elector.holds()]
    return leader


def test_two_replicas_only_the_leader_evicts(api: FakeApiServer, replicas: Callable[[str], Replica]) -> None:
    api.add(pod_json("lonely", "a-1"))
    one, two = replicas("replica-1"), replicas("replica-2")
    leader = leader_of(one, two)
    standby = two if leader is one else one
    for _ in range(3):
        for replica in (one, two):
            replica.daemon.run_cycle()
        assert sum(r.elector.holds() for r in (one, two)) == 1
    assert evicted_by(api) == [("lonely", leader.identity)]
    assert api.pod("ml", "lonely") is None
    assert standby.daemon.counts["standby"] == 3 and standby.daemon.counts["success"] == 0
    assert leader.daemon.counts["success"] == 3
    assert standby.daemon.readiness() == (True, "standby: another replica holds the lease")
    lease = api.get("Lease", "gpu-rebalancer", "gpu-rebalancer", "coordination.k8s.io/v1")
    assert lease is not None and lease["spec"]["holderIdentity"] == leader.identity
    assert lease["spec"]["leaseDurationSeconds"] == 1


def test_when_the_leader_dies_the_other_takes_over_within_the_lease_duration(
    api: FakeApiServer, replicas: Callable[[str], Replica]
) -> None:
    one, two = replicas("replica-1"), replicas("replica-2")
    leader = leader_of(one, two)
    standby = two if leader is one else one
    time.sleep(3 * RETRY)  # the standby has seen a few renewals
    leader.crash()
    took = wait_for(standby.elector.holds, 3, "the standby to take over")
    # Not before the lease could have expired, and within it (plus the standby's poll, load slack).
    assert DURATION - DEADLINE < took < DURATION + 0.5
    api.add(pod_json("lonely", "a-1"))
    report = standby.daemon.run_cycle()
    assert report is not None and report.summary.evictions == 1
    assert evicted_by(api) == [("lonely", standby.identity)]
    lease = api.get("Lease", "gpu-rebalancer", "gpu-rebalancer", "coordination.k8s.io/v1")
    assert lease is not None and lease["spec"]["leaseTransitions"] == 1


def test_a_graceful_stop_releases_the_lease_at_once(
    api: FakeApiServer, replicas: Callable[[str], Replica]
) -> None:
    one, two = replicas("replica-1"), replicas("replica-2")
    leader = leader_of(one, two)
    standby = two if leader is one else one
    time.sleep(3 * RETRY)
    leader.daemon.shutdown(notify_timeout=0)  # release_lease=True
    took = wait_for(standby.elector.holds, 3, "the standby to take over")
    assert took < DURATION / 2


@pytest.mark.usefixtures("frozen_heap")
def test_a_leader_that_cannot_renew_stops_evicting_before_anyone_can_take_over(
    api: FakeApiServer, replicas: Callable[[str], Replica]
) -> None:
    one, two = replicas("replica-1"), replicas("replica-2")
    leader = leader_of(one, two)
    standby = two if leader is one else one
    time.sleep(3 * RETRY)
    marks: dict[str, float] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            now = time.monotonic()
            if "leader stops" not in marks and not leader.elector.holds(MARGIN):
                marks["leader stops"] = now
            if "standby leads" not in marks and standby.elector.holds():
                marks["standby leads"] = now
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    cut = time.monotonic()
    leader.partition()
    try:
        wait_for(lambda: "standby leads" in marks, 3, "the standby to take over")
    finally:
        done.set()
        watcher.join()
    stops, takes = marks["leader stops"] - cut, marks["standby leads"] - cut
    assert stops <= DEADLINE - MARGIN + 0.15  # the last renewal was sent before the cut
    assert takes - stops >= DURATION - DEADLINE  # the safety gap, never less
    # And a cycle on the cut-off leader acts as a standby: it does not even build a snapshot.
    assert leader.daemon.run_cycle() is None
    assert leader.daemon.counts["standby"] == 1


def test_a_replica_that_lost_the_lease_exports_no_gauge_of_its_last_cycle(
    api: FakeApiServer, replicas: Callable[[str], Replica]
) -> None:
    """Both replicas are scraped: the ex-leader's last cycle must not be read as the cluster's state."""
    api.add(pod_json("lonely", "a-1"))
    one, two = replicas("replica-1"), replicas("replica-2")
    leader = leader_of(one, two)
    standby = two if leader is one else one
    assert leader.daemon.run_cycle() is not None
    assert gauges(leader, "gpu_rebalancer_nodes_freeable") == {(("gpu_model", "NVIDIA-A100-SXM4-80GB"),): 1}
    leader.partition()  # still running, no longer renewing
    wait_for(standby.elector.holds, 3, "the standby to take over")
    assert leader.daemon.run_cycle() is None
    assert leader.daemon.counts["standby"] == 1
    assert gauges(leader, "gpu_rebalancer_leader") == {(): 0}
    assert gauges(leader, "gpu_rebalancer_nodes_freeable") == {}
    assert gauges(leader, "gpu_rebalancer_gpus_freeable") == {}
    assert gauges(leader, "gpu_rebalancer_circuit_open") == {(): 0}
    assert gauges(leader, "gpu_rebalancer_cycles_total")[(("result", "success"),)] == 1


def gauges(replica: Replica, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of `name` in the replica's /metrics exposition, by their labels."""
    body, _ = replica.daemon.metrics.exposition()
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == name
    }


def test_the_elector_rejects_unsafe_timings() -> None:
    with pytest.raises(ValueError, match="lease_duration > renew_deadline > retry_period"):
        LeaseElector(client.ApiClient(), identity="x", lease_duration=5, renew_deadline=5, retry_period=1)
