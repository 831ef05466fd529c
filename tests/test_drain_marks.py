"""Drain marks across restarts, take-overs, failures and an open circuit, against the fake API server.

- a node re-marked right after a take-over carries `draining-since` (the orphan clean-up ran first);
- a drain a restart interrupted does not keep its NoSchedule mark on a node still running pods;
- a drain whose first eviction fails backs off across cycles (1, 2, 4... intervals), not every cycle;
- a drained node whose evicted pods stay Pending (circuit open) loses its mark, so they can come back;
- a daemon gone dry-run still lifts the marks its live cycles left when they expire (and sets none);
- after `eviction.drain_taint_key` changes, the marks under the former key are lifted at the next term.
"""

from __future__ import annotations

from datetime import timedelta

from kubernetes import client

from rebalancer.actuator import DRAIN_INTERRUPTED, DRAINING_SINCE_ANNOTATION, ClusterActuator
from rebalancer.guards import DRAIN_BACKOFF
from rebalancer.node_marks import DRAINING_TAINT_KEY
from rebalancer.policy import EvictionConfig
from rebalancer.rfc3339 import format_utc
from rebalancer.state import ActuatorState, DrainRecord, MemoryStateStore
from tests.builders import NOW
from tests.fake_apiserver import FakeApiServer, node_json, pod_json
from tests.test_actuator import (
    EVICTIONS,
    MINUTE,
    RELAXED,
    _actuator,
    _marked_node,
    _node_plan,
    _replacement,
    _run,
    _snapshot,
    _taints,
)

NO_RETRIES = EvictionConfig(retries=0)


def _marked(api: FakeApiServer, node: str) -> list[str]:
    return [t["value"] for t in _taints(api, node) if t["key"] == DRAINING_TAINT_KEY]


def _since(api: FakeApiServer, node: str) -> str | None:
    found = api.node(node)
    assert found is not None
    return (found["metadata"].get("annotations") or {}).get(DRAINING_SINCE_ANNOTATION)


def _drainable(api: FakeApiServer, marked_by: str | None = None) -> None:
    """a-1 holds two 1-GPU pods; a-2 has room for them."""
    if marked_by is None:
        api.add(node_json("a-1"))
    else:
        api.add(_marked_node("a-1", marked_by, NOW - 2 * MINUTE))  # well within drain_timeout
    api.add(node_json("a-2"))
    api.add(pod_json("x0", "a-1"))
    api.add(pod_json("x1", "a-1"))


def test_a_node_marked_again_right_after_a_take_over_carries_draining_since(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The old leader's mark is an orphan to the new one: it is removed, with its draining-since, before
    the new plan marks the node again; the new mark must carry a draining-since of its own."""
    _drainable(api, marked_by="old-leader-cycle")
    api.inject(EVICTIONS, status=500, times=None)  # the drain stops at once: the mark must be right
    actuator = _actuator(api_client, NO_RETRIES)
    actuator.new_term()
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    actuator.evict(_node_plan(snap, "a-1"))
    marks = [r for r in api.writes() if r.method == "PATCH" and r.path.endswith("/nodes/a-1")]
    assert len(marks) == 3  # orphan removed, marked again, abandoned
    written = marks[1].body
    notes = next(op["value"] for op in written if op["path"] == "/metadata/annotations")
    assert notes.get(DRAINING_SINCE_ANNOTATION) == format_utc(NOW)


def test_a_restart_lifts_the_mark_of_an_interrupted_drain_on_a_node_still_running_pods(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _drainable(api, marked_by="c0")
    api.add(_marked_node("a-3", "c0", NOW - 30 * MINUTE))  # drained: empty, the autoscaler's to take
    store = MemoryStateStore(
        ActuatorState(drains={"a-1": DrainRecord("c0", NOW - 2 * MINUTE), "a-3": DrainRecord("c0", NOW)})
    )
    actuator = ClusterActuator.from_config(api_client, RELAXED.policy.eviction, state_store=store)
    actuator.new_term()  # a new process
    actuator.begin_cycle(_snapshot(api_client), "c1")
    findings = actuator.end_cycle([], completed=True)
    assert _marked(api, "a-1") == [] and _since(api, "a-1") is None
    assert _marked(api, "a-3") == ["c0"]
    assert [(f.kind, f.node, f.detail) for f in findings] == [
        (
            DRAIN_INTERRUPTED,
            "a-1",
            "drain mark removed: drain interrupted (restart or leader change) with 2 pods still on the node",
        )
    ]
    assert set(actuator.state.drains) == {"a-3"}


def test_a_drain_whose_first_eviction_fails_backs_off_across_cycles(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Interval 5m: after the first failure the node waits 5m, after the second 10m, and so on; in
    between, the plan is refused `drain-backoff` and nothing is written."""
    _drainable(api)
    api.inject(EVICTIONS, status=500, times=None)
    actuator = _actuator(api_client, NO_RETRIES)
    tried: list[int] = []
    refusals: list[str | None] = []
    for minute in range(0, 40):
        snap = _snapshot(api_client, NOW + minute * MINUTE)
        api.clear_requests()
        decisions, _ = _run(actuator, snap, _node_plan(snap, "a-1"), cycle=f"c{minute}")
        if [r for r in api.writes() if "/eviction" in r.path]:
            tried.append(minute)
        refusals.append(decisions[0].blocked_by)
    assert tried == [0, 5, 15, 35]  # waits of 5, 10, 20 minutes
    assert set(refusals) == {None, DRAIN_BACKOFF}
    snap = _snapshot(api_client, NOW + 36 * MINUTE)
    (decision,), _ = _run(actuator, snap, _node_plan(snap, "a-1"), cycle="c36")
    assert decision.reason == (
        "the drain of node a-1 failed 4 times in a row, the last 1m ago: tried again 40m after it"
    )
    # Once a drain goes through, the memory of failures is gone.
    api.clear_faults()
    snap = _snapshot(api_client, NOW + 80 * MINUTE)
    _run(actuator, snap, _node_plan(snap, "a-1"), cycle="c80")
    assert actuator.history.failed_drains == {}


def test_a_drained_node_whose_evicted_pods_stay_pending_loses_its_mark(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _drainable(api)
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    _, outcomes = _run(actuator, snap, _node_plan(snap, "a-1"), cycle="c1")
    assert {o.result for o in outcomes.values()} == {"evicted"}
    assert _marked(api, "a-1") == ["c1"]  # drained: the mark stays for the autoscaler
    # Their ReplicaSet re-creates them; nothing places them.
    api.add(_replacement("x2", NOW + MINUTE))
    api.add(_replacement("x3", NOW + MINUTE))
    timeout = timedelta(seconds=RELAXED.policy.eviction.reschedule_timeout)
    before = _snapshot(api_client, NOW + timeout - MINUTE)
    _run(actuator, before, cycle="c2")
    assert _marked(api, "a-1") == ["c1"]  # not yet: the circuit is still closed
    actuator.begin_cycle(_snapshot(api_client, NOW + timeout + MINUTE), "c3")
    findings = actuator.end_cycle([], completed=True)
    assert _marked(api, "a-1") == []
    assert [(f.kind, f.node) for f in findings] == [(DRAIN_INTERRUPTED, "a-1")]
    assert findings[0].detail.startswith("drain mark removed: circuit open: ml/trainer-abc still Pending")
    assert findings[0].detail.endswith(": lifted so its pods can come back")


def test_a_daemon_gone_dry_run_still_lifts_the_marks_its_live_cycles_left(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    # The operator pauses the rebalancer (dry_run: true, or a restart with --dry-run) after a drain whose
    # node the autoscaler keeps: its NoSchedule mark must still expire, as the README promises.
    from rebalancer.daemon.loop import Clock, Daemon, DaemonSinks
    from rebalancer.daemon.wiring import kube_snapshot_source, live_edge
    from rebalancer.policy import parse_policy

    api.add(node_json("a-1"))
    api.add(node_json("a-2"))
    api.add(pod_json("lonely", "a-1"))
    for i in range(4):
        api.add(pod_json(f"busy-{i}", "a-2"))
    policy = {
        "interval": "5m",
        "strategies": [{"name": "gpu-consolidation", "args": {"max_utilization_percent": None}}],
        "telemetry": None,
        "eviction": {"drain_timeout": "30m"},
    }
    now = [NOW]
    edge, _ = live_edge(
        api_client, parse_policy({**policy, "dry_run": False}), "me", state_store=MemoryStateStore()
    )
    source = kube_snapshot_source(api_client)

    def daemon(dry_run: bool) -> Daemon:
        loaded = parse_policy({**policy, "dry_run": dry_run})
        return Daemon(loaded, source, live=edge, sinks=DaemonSinks(), clock=Clock(wall=lambda: now[0]))

    daemon(False).run_cycle(raise_errors=True)
    assert _marked(api, "a-1")  # drained: lonely evicted, a-1 empty and marked for the autoscaler

    paused = daemon(True)
    now[0] = NOW + timedelta(minutes=20)  # within twice drain_timeout: the autoscaler's to take
    report = paused.run_cycle(raise_errors=True)
    assert report is not None and report.mode == "dry-run"
    assert _marked(api, "a-1")
    now[0] = NOW + timedelta(hours=1)  # the autoscaler kept the node: the mark goes, dry run or not
    api.add(pod_json("back", "a-1"))
    api.clear_requests()
    report = paused.run_cycle(raise_errors=True)
    assert report is not None
    assert _marked(api, "a-1") == []
    assert [f.kind for f in report.findings if f.node == "a-1"] == ["drain-timeout"]
    # ... and a dry run marks nothing and evicts nothing of its own.
    assert {r.path for r in api.writes()} == {"/api/v1/nodes/a-1"}
    assert not api.requests_to("/api/v1/namespaces/*/pods/*/eviction")


def test_marks_under_a_former_drain_taint_key_are_lifted_at_the_next_term(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    # Drains marked under a custom key, remembered in the state; the operator changes the key and
    # restarts: nothing would ever remove the former key's NoSchedule taints.
    custom = EvictionConfig(drain_taint_key="example.com/draining")
    store = MemoryStateStore()
    api.add(node_json("a-1"))
    api.add(node_json("a-2"))
    api.add(pod_json("x0", "a-1"))
    before = ClusterActuator.from_config(api_client, custom, state_store=store, sleep=lambda _s: None)
    snap = _snapshot(api_client)
    before.begin_cycle(snap, "c0")
    before.evict(_node_plan(snap, "a-1"))
    before.end_cycle([], completed=True)
    assert [t["key"] for t in _taints(api, "a-1")] == ["example.com/draining"]
    assert store.load() is not None and store.load().drain_taint_key == "example.com/draining"  # type: ignore[union-attr]
    # Another installation's mark, under its own key: not this rebalancer's to lift.
    theirs = {"key": "other.example/draining", "value": "c9", "effect": "NoSchedule"}
    api.add(node_json("a-3", taints=[theirs]))

    after = ClusterActuator.from_config(
        api_client, EvictionConfig(), state_store=store, sleep=lambda _s: None
    )
    after.new_term()
    after.begin_cycle(_snapshot(api_client, NOW + MINUTE), "c1")
    notes = after.end_cycle([], completed=True)
    assert _taints(api, "a-1") == [] and _since(api, "a-1") is None
    assert _taints(api, "a-3") == [theirs]
    assert [(f.kind, f.node) for f in notes] == [(DRAIN_INTERRUPTED, "a-1")]
    assert "example.com/draining" in notes[0].detail
    assert store.load().drain_taint_key == DRAINING_TAINT_KEY  # type: ignore[union-attr]
