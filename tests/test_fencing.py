"""Writes are fenced: by the leader lease before every write, by the state ConfigMap's resourceVersion
and leader term, by the cycle's and the shutdown's deadlines; an eviction whose answer was lost is
recognised when it went through.

The partial partition is real HTTP: the leader's Lease requests go to a dead address while its
evictions still reach the fake API server, and a standby elects on the same Lease.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from rebalancer.actuator import ClusterActuator
from rebalancer.daemon.lease import LeaseElector
from rebalancer.daemon.loop import CUT_SHORT, Clock, Daemon, DaemonSinks, Deadlines, Leadership, LiveEdge
from rebalancer.daemon.wiring import kube_snapshot_source, lease_fence
from rebalancer.fence import MIN_WRITE_SECONDS, UNFENCED, FenceLost, WriteFence, clip_timeout
from rebalancer.guards import CHECKPOINT_ANNOTATION, CHECKPOINT_PENDING
from rebalancer.history import DisruptionHistory, EvictionRecord, Workload
from rebalancer.kube_evictor import READ_BACK_SECONDS, KubeEvictor
from rebalancer.policy import EvictionConfig, parse_policy
from rebalancer.state import TERM_ANNOTATION, ActuatorState, ConfigMapStateStore
from tests.builders import NOW, replace
from tests.fake_apiserver import FakeApiServer, node_json, pod_json
from tests.test_actuator import Sleeps, _node_plan, _plan, _snapshot

LEASE_NS = "gpu-rebalancer"
EVICTIONS = "/api/v1/namespaces/*/pods/*/eviction"
DURATION, DEADLINE, RETRY, MARGIN = 1.0, 0.6, 0.05, 0.1
LOST_LEASE = "not attempted: this replica no longer holds the leader lease with time to spare"


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _elector(api_client: client.ApiClient, identity: str, **kwargs: Any) -> LeaseElector:
    return LeaseElector(
        api_client,
        name="gpu-rebalancer",
        namespace=LEASE_NS,
        identity=identity,
        lease_duration=DURATION,
        renew_deadline=DEADLINE,
        retry_period=RETRY,
        **kwargs,
    )


def _when_evicted(api: FakeApiServer) -> list[float]:
    """The monotonic times at which the fake API server accepted each eviction, from now on."""
    accepted: list[float] = []
    original = api._evict

    def evict(*args: Any, **kwargs: Any) -> Any:
        answer = original(*args, **kwargs)
        accepted.append(time.monotonic())
        return answer

    api._evict = evict  # type: ignore[method-assign]
    return accepted


# --------------------------------------------------------------------------- the fence itself


def test_a_fence_grants_what_the_lease_and_the_deadline_leave_and_closes_with_their_reason() -> None:
    clock = FakeMonotonic()
    lease_left = [5.0]
    fence = WriteFence(lambda: lease_left[0], monotonic=clock)
    assert fence.check() == 5.0
    fence.set_deadline(clock.now + 2.0, "the cycle deadline passed")
    assert fence.check() == 5.0  # a write may start: it keeps what the lease leaves
    clock.now += 1.9
    with pytest.raises(FenceLost, match="the cycle deadline passed"):
        fence.check()
    fence.set_deadline(None)
    lease_left[0] = MIN_WRITE_SECONDS / 2
    with pytest.raises(FenceLost, match="no longer holds the leader lease"):
        fence.check()
    fence.tighten_deadline(clock.now + 10, "later")
    fence.tighten_deadline(clock.now + 20, "even later")  # an earlier deadline stays
    lease_left[0] = 100.0
    clock.now += 10
    with pytest.raises(FenceLost, match="later"):
        fence.check()
    assert UNFENCED.check() == math.inf


def test_request_timeouts_are_clipped_to_the_time_the_fence_grants() -> None:
    assert clip_timeout((5.0, 30.0), math.inf) == (5.0, 30.0)
    assert clip_timeout((5.0, 30.0), 3.5) == 3.5  # one total timeout: connect and answer together
    assert clip_timeout((5.0, 30.0), 100.0) == 35.0
    assert clip_timeout(10.0, 4.0) == 4.0


def test_the_lease_time_left_runs_from_when_the_renewal_was_sent(api: FakeApiServer) -> None:
    clock = FakeMonotonic()
    with api.api_client() as api_client:
        elector = _elector(api_client, "replica-1", monotonic=clock)
        assert elector.lease_left() == 0.0 and elector.term is None
        assert elector.try_acquire_or_renew()
        assert elector.lease_left(MARGIN) == pytest.approx(DEADLINE - MARGIN)
        clock.now += 0.3
        assert elector.lease_left(MARGIN) == pytest.approx(DEADLINE - MARGIN - 0.3)
        assert elector.holds(MARGIN)
        clock.now += DEADLINE
        assert elector.lease_left(MARGIN) < 0 and not elector.holds(MARGIN)


def test_every_new_holder_gets_a_larger_term_even_after_a_release(api: FakeApiServer) -> None:
    """client-go raises leaseTransitions whenever the writer was not the holder, a released lease too."""
    with api.api_client() as one_client, api.api_client() as two_client:
        one, two = _elector(one_client, "replica-1"), _elector(two_client, "replica-2")
        assert one.try_acquire_or_renew() and one.term == 0
        assert one.try_acquire_or_renew() and one.term == 0  # a renewal is the same term
        assert one.release()
        assert two.try_acquire_or_renew() and two.term == 1
        lease = api.get("Lease", "gpu-rebalancer", LEASE_NS, "coordination.k8s.io/v1")
        assert lease is not None and lease["spec"]["leaseTransitions"] == 1


# --------------------------------------------------------------------------- the partial partition


@pytest.mark.usefixtures("frozen_heap")
def test_a_partitioned_leader_stops_mid_drain_before_the_standby_can_lead(api: FakeApiServer) -> None:
    """The leader's Lease requests fail while its evictions still go through: it stops writing, even in
    the middle of a node drain, before the standby can take the Lease, and the rest is not attempted."""
    api.add(node_json("a-1"))
    api.add(node_json("a-2", gpus=16))
    for index in range(8):
        api.add(pod_json(f"x{index}", "a-1"))
    api.inject(EVICTIONS, delay=0.15, times=None)  # each eviction takes 0.15 s: the drain, 1.2 s
    with (
        api.api_client() as lease_client,
        api.api_client() as work_client,
        api.api_client() as standby_client,
    ):
        leader = _elector(lease_client, "replica-1").start()
        try:
            assert leader.wait_first_round(2) and leader.holds()
            standby = _elector(standby_client, "replica-2").start()
            actuator = ClusterActuator.from_config(
                work_client, EvictionConfig(), sleep=Sleeps(), fence=lease_fence(Leadership(leader, MARGIN))
            )
            snapshot = _snapshot(work_client)
            decision = _node_plan(snapshot, "a-1")
            accepted = _when_evicted(api)
            took_over: list[float] = []
            watching = threading.Event()

            def watch() -> None:
                while not watching.is_set() and not took_over:
                    if standby.holds():
                        took_over.append(time.monotonic())
                    time.sleep(0.002)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            time.sleep(2 * RETRY)  # the standby has seen the leader's renewals
            lease_client.configuration.host = "http://127.0.0.1:9"  # the partition: only the Lease
            actuator.begin_cycle(snapshot, "c1")
            outcomes = actuator.evict(decision)
            actuator.end_cycle([decision], completed=True)
            watcher.join(timeout=3)
            watching.set()
        finally:
            leader.stop(release=False)
            standby.stop(release=False)
    evicted = [o for o in outcomes if o.result == "evicted"]
    assert 0 < len(evicted) < 8, outcomes
    assert all(o.detail.startswith(LOST_LEASE) for o in outcomes if o.result != "evicted"), outcomes
    assert took_over, "the standby never took over"
    assert max(accepted) < took_over[0]  # no eviction of the ex-leader landed after the takeover
    assert len(accepted) == len(evicted)


# --------------------------------------------------------------------------- the state ConfigMap


def _record(pod: str) -> EvictionRecord:
    return EvictionRecord(Workload("ml", "ReplicaSet", "trainer-abc"), pod, NOW)


def _state(*pods: str) -> ActuatorState:
    return ActuatorState(history=DisruptionHistory(evictions=tuple(_record(p) for p in pods)))


def _stored_state(api: FakeApiServer) -> ActuatorState | None:
    with api.api_client() as api_client:
        return ConfigMapStateStore(api_client, namespace=LEASE_NS).load()


def _term_store(api_client: client.ApiClient, term: int, fence: Any = UNFENCED) -> ConfigMapStateStore:
    return ConfigMapStateStore(api_client, namespace=LEASE_NS, sleep=Sleeps(), term=lambda: term, fence=fence)


def test_an_ex_leaders_save_is_refused_never_overwriting_the_new_leaders_state(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    old, new = _term_store(api_client, 1), _term_store(api_client, 2)
    assert old.save(_state("p0")) == _state("p0")
    assert old.load() == new.load() == _state("p0")
    assert new.save(_state("p0", "p1")) is not None
    assert old.save(_state("p0", "late")) is None  # refused: term 2 wrote since term 1 read
    assert old.superseded
    assert old.save(_state("p0", "later")) is None  # and every save after, until it loads again
    assert _stored_state(api) == _state("p0", "p1")
    stored = api.get("ConfigMap", "gpu-rebalancer-state", LEASE_NS)
    assert stored is not None and stored["metadata"]["annotations"][TERM_ANNOTATION] == "2"


def test_a_late_write_of_an_earlier_leader_is_merged_so_no_eviction_is_forgotten(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    old, new = _term_store(api_client, 1), _term_store(api_client, 2)
    old.save(_state("p0"))
    assert new.load() == _state("p0")
    assert old.load() == _state("p0")
    old.save(_state("p0", "old-1"))  # the earlier leader's last write lands after the takeover read
    saved = new.save(_state("p0", "new-1"))
    assert saved is not None
    assert {r.pod for r in saved.history.evictions} == {"p0", "old-1", "new-1"}
    assert _stored_state(api) == saved


def test_a_configmap_deleted_under_the_store_is_created_again(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    store = _term_store(api_client, 1)
    store.save(_state("p0"))
    api.remove("ConfigMap", "gpu-rebalancer-state", LEASE_NS)
    assert store.save(_state("p0", "p1")) == _state("p0", "p1")
    assert _stored_state(api) == _state("p0", "p1")


def test_an_actuator_whose_memory_a_later_leader_wrote_stops_writing(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    for name in ("train", "other"):
        api.add(pod_json(name, "a-1"))
    old = _term_store(api_client, 1)
    actuator = ClusterActuator.from_config(api_client, EvictionConfig(), state_store=old, sleep=Sleeps())
    snapshot = _snapshot(api_client)
    actuator.begin_cycle(snapshot, "c1")
    _term_store(api_client, 2).save(_state("theirs"))  # a later leader took over meanwhile
    (first,) = actuator.evict(_plan(snapshot, "train"))  # its save is refused: the store is theirs
    (second,) = actuator.evict(_plan(snapshot, "other"))
    findings = actuator.end_cycle([], completed=True)
    assert first.result == "evicted"
    assert (second.result, second.detail) == (
        "error",
        "not attempted: the state ConfigMap was written by a later leader: this replica stopped writing",
    )
    assert api.pod("ml", "other") is not None
    assert [f.kind for f in findings] == ["state-superseded"]
    assert _stored_state(api) == _state("theirs")


def test_checkpoint_requests_ask_the_fence_too(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(node_json("a-1"))
    api.add(pod_json("train", "a-1", annotations={CHECKPOINT_ANNOTATION: "true"}))
    lease_left = [5.0]
    actuator = ClusterActuator.from_config(
        api_client, EvictionConfig(), sleep=Sleeps(), fence=WriteFence(lambda: lease_left[0])
    )
    snapshot = _snapshot(api_client)
    waiting = replace(_plan(snapshot, "train"), approved=False, blocked_by=CHECKPOINT_PENDING)
    actuator.begin_cycle(snapshot, "c1")
    lease_left[0] = 0.0  # the lease is gone before the cycle ends
    api.clear_requests()
    actuator.end_cycle([waiting], completed=True)
    assert not [r for r in api.writes() if "/pods/" in r.path]


def test_a_closed_fence_saves_nothing(api: FakeApiServer, api_client: client.ApiClient) -> None:
    lease_left = [5.0]
    store = _term_store(api_client, 1, fence=WriteFence(lambda: lease_left[0]))
    assert store.save(_state("p0")) is not None
    lease_left[0] = 0.0
    api.clear_requests()
    assert store.save(_state("p0", "p1")) is None
    assert not api.writes()
    assert _stored_state(api) == _state("p0")


# --------------------------------------------------------------------------- answers that were lost


def test_an_eviction_whose_answer_was_lost_but_went_through_is_evicted_not_gone(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The first attempt times out while the API server evicts; the retry's 404 means it went through,
    so the circuit breaker must watch it (an `evicted` outcome), not forget it (`gone`)."""
    api.add(node_json("a-1"))
    api.add(pod_json("train", "a-1"))
    api.inject(EVICTIONS, delay=0.4, times=1)
    evictor = KubeEvictor(
        api_client, retries=1, request_timeout=0.15, backoff=lambda _attempt: 0.6, sleep=time.sleep
    )
    snapshot = _snapshot(api_client)
    (outcome,) = evictor.evict(_plan(snapshot, "train"))
    assert outcome.result == "evicted"
    assert outcome.detail.startswith(
        "the eviction request got no final answer but went through: pod no longer"
    )
    assert api.pod("ml", "train") is None


def test_an_eviction_that_never_got_an_answer_is_read_back(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    api.add(pod_json("train", "a-1"))
    api.inject(EVICTIONS, lose_answer=True, times=1)  # evicted, and the connection dropped
    evictor = KubeEvictor(api_client, retries=0, sleep=Sleeps())
    (outcome,) = evictor.evict(_plan(_snapshot(api_client), "train"))
    assert (outcome.result, outcome.detail) == (
        "evicted",
        "the eviction request got no final answer but went through: the pod no longer exists",
    )


def test_an_eviction_whose_answer_was_lost_while_the_pod_terminates_is_evicted() -> None:
    """Live, an evicted pod on a node lingers, terminating, until its kubelet stops it: the retry after
    the lost answer skips the budgets and deletes it again (201), and a read-back finds it terminating."""
    with FakeApiServer(kubelet="manual") as api, api.api_client() as api_client:
        api.add(node_json("a-1"))
        for name in ("retried", "read-back"):
            api.add(pod_json(name, "a-1"))
        snapshot = _snapshot(api_client)
        api.inject(EVICTIONS.replace("*/eviction", "retried/eviction"), delay=0.4, times=1)
        retrying = KubeEvictor(
            api_client, retries=1, request_timeout=0.15, backoff=lambda _attempt: 0.6, sleep=time.sleep
        )
        (retried,) = retrying.evict(_plan(snapshot, "retried"))
        api.inject(EVICTIONS, lose_answer=True, times=1)
        (read_back,) = KubeEvictor(api_client, retries=0, sleep=Sleeps()).evict(_plan(snapshot, "read-back"))
        assert [(o.pod, o.result, o.detail) for o in (retried, read_back)] == [
            ("retried", "evicted", ""),
            (
                "read-back",
                "evicted",
                "the eviction request got no final answer but went through: the pod is terminating",
            ),
        ]
        assert api.finish_terminating() == [("ml", "read-back"), ("ml", "retried")]


@pytest.mark.parametrize("status", [500, 503, 504])
def test_an_eviction_carried_out_behind_a_5xx_answer_is_evicted_not_gone(
    api: FakeApiServer, api_client: client.ApiClient, status: int
) -> None:
    """The API server evicts, then a gateway answers 5xx; the retry's 404 means the first went through."""
    api.add(node_json("a-1"))
    api.add(pod_json("train", "a-1"))
    api.inject(EVICTIONS, status=status, lose_answer=True, times=1)
    evictor = KubeEvictor(api_client, retries=1, sleep=Sleeps())
    (outcome,) = evictor.evict(_plan(_snapshot(api_client), "train"))
    assert outcome.result == "evicted", outcome
    assert outcome.detail.startswith("the eviction request got no final answer but went through")


def test_the_read_back_after_a_lost_answer_is_bounded(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    api.add(pod_json("train", "a-1"))
    api.inject(EVICTIONS, drop=True, times=1)  # not carried out: the pod is still there
    api.inject("/api/v1/namespaces/ml/pods", delay=30, times=1)  # and the read-back stalls
    evictor = KubeEvictor(api_client, retries=0, request_timeout=(1.0, 60.0), sleep=Sleeps())
    started = time.monotonic()
    (outcome,) = evictor.evict(_plan(_snapshot(api_client), "train"))
    assert time.monotonic() - started < READ_BACK_SECONDS + 2
    assert outcome.result == "error"


# --------------------------------------------------------------------------- deadlines


def _drain_daemon(
    api: FakeApiServer, api_client: client.ApiClient, clock: FakeMonotonic, deadlines: Deadlines
) -> tuple[Daemon, ClusterActuator]:
    policy = parse_policy(
        {
            "dry_run": False,
            "strategies": [
                {
                    "name": "gpu-consolidation",
                    "args": {"max_utilization_percent": None, "max_allocated_percent": 60},
                }
            ],
            "limits": {"max_per_namespace": None},
            "telemetry": None,
        }
    )
    fence = WriteFence(monotonic=clock)
    actuator = ClusterActuator.from_config(api_client, policy.policy.eviction, sleep=Sleeps(), fence=fence)
    daemon = Daemon(
        policy,
        kube_snapshot_source(api_client),
        live=LiveEdge(actuator, memory=actuator.memory, fence=fence),
        sinks=DaemonSinks(),
        clock=Clock(wall=lambda: NOW, monotonic=clock),
        deadlines=deadlines,
    )
    return daemon, actuator


def eight_pod_drain(api: FakeApiServer) -> None:
    """a-1 holds eight 1-GPU pods (50 %); a-2 (10/16) and a-3 (12/16) have room for them."""
    for name in ("a-1", "a-2", "a-3"):
        api.add(node_json(name, gpus=16))
    for index in range(8):
        api.add(pod_json(f"x{index}", "a-1"))
    api.add(pod_json("busy-2", "a-2", gpus=10))
    api.add(pod_json("busy-3", "a-3", gpus=12))


def _on_each_eviction(api: FakeApiServer, hook: Callable[[int], None]) -> None:
    original = api._evict
    count = [0]

    def evict(*args: Any, **kwargs: Any) -> Any:
        answer = original(*args, **kwargs)
        count[0] += 1
        hook(count[0])
        return answer

    api._evict = evict  # type: ignore[method-assign]


def _results(report: Any) -> list[str | None]:
    return [row.outcome for row in report.decisions if row.action == "evict"]


def _cut_short(report: Any) -> list[str]:
    return [f.detail for f in report.findings if f.kind == CUT_SHORT]


def test_a_cycle_stops_writing_at_its_deadline_and_says_so(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Interval 5m, deadline 80 % of it (240 s); each eviction takes 70 s: the fourth starts with 30 s
    left, the fifth would start past the deadline."""
    eight_pod_drain(api)
    clock = FakeMonotonic()
    daemon, _ = _drain_daemon(api, api_client, clock, Deadlines(cycle_share=0.8))

    def slow(_count: int) -> None:
        clock.now += 70

    _on_each_eviction(api, slow)
    report = daemon.run_cycle(raise_errors=True)
    assert report is not None
    assert _results(report) == ["evicted"] * 4 + ["error"] * 4
    assert _cut_short(report) == [
        "evictions stopped: the cycle deadline passed (4m of the 5m interval); "
        "4 pods of approved plans not attempted"
    ]
    assert len(api.objects("Pod")) == 4 + 2
    # The abandoned drain's mark is lifted all the same: a deadline bounds new work, not the undoing.
    node = api.node("a-1")
    assert node is not None and not node["spec"].get("taints")


def test_a_stop_gives_the_drain_in_flight_the_shutdown_deadline_and_no_more(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    """SIGTERM after the second eviction of an eight-pod drain (each 10 s): the drain goes on until the
    shutdown deadline (25 s later), the evictions starting at 20, 30 and 40 s; the rest is not attempted."""
    eight_pod_drain(api)
    clock = FakeMonotonic()
    daemon, _ = _drain_daemon(api, api_client, clock, Deadlines(shutdown=25))

    def hook(count: int) -> None:
        clock.now += 10
        if count == 2:
            daemon.request_stop()

    _on_each_eviction(api, hook)
    report = daemon.run_cycle(raise_errors=True)
    assert report is not None
    assert _results(report) == ["evicted"] * 5 + ["error"] * 3
    assert _cut_short(report) == [
        "evictions stopped: shutting down: the shutdown deadline passed (25s); "
        "3 pods of approved plans not attempted"
    ]
