"""The Kubernetes Events sink against the fake API server: what it posts, what it never posts, its bounds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from rebalancer.actuator import ClusterActuator
from rebalancer.cycle import Sink, run_cycle
from rebalancer.cycle_report import CycleReport, ReportedDecision, Summary
from rebalancer.evictor import DryRunEvictor
from rebalancer.policy import EvictionConfig, parse_policy
from rebalancer.sinks.events import EventsSinkError, KubeEventsSink, event_reason
from rebalancer.sources.kube import KubeSource
from tests.builders import NOW
from tests.fake_apiserver import FakeApiServer, add_consolidation_cluster, pdb_json

EVENTS = "/api/v1/namespaces/*/events"
CONSOLIDATE = parse_policy(
    {
        "strategies": [
            {
                "name": "gpu-consolidation",
                "args": {"max_utilization_percent": None, "max_allocated_percent": 60},
            }
        ],
        "telemetry": None,
    }
)


def _live_cycle(
    api_client: client.ApiClient, sink: KubeEventsSink, after_snapshot: Callable[[], object] = lambda: None
) -> CycleReport:
    snap = KubeSource(api_client, CONSOLIDATE).snapshot(NOW)
    after_snapshot()
    actuator = ClusterActuator.from_config(api_client, EvictionConfig(), sleep=lambda _: None)
    errors: list[tuple[Sink, Exception]] = []
    report = run_cycle(
        snap,
        CONSOLIDATE,
        actuator,
        [sink],
        memory=actuator.memory,
        on_sink_error=lambda s, e: errors.append((s, e)),
    )
    assert errors == []
    return report


def _row(pod: str, outcome: Any, node: str = "a-1") -> ReportedDecision:
    return ReportedDecision(
        strategy="idle-gpu",
        namespace="ml",
        pod=pod,
        node=node,
        action="evict",
        outcome=outcome,
        reason="GPU idle for 2h",
        blocked_by=None,
        group=None,
        target_node=None,
    )


def _report(*rows: ReportedDecision, freed: tuple[str, ...] = ()) -> CycleReport:
    summary = Summary(
        nodes=1,
        gpus=8,
        pods=len(rows),
        proposals=len(rows),
        evictions=0,
        blocked=0,
        nodes_freed=len(freed),
        gpus_freed=0,
        estimated_savings_per_hour=None,
    )
    return CycleReport(mode="live", now=NOW, summary=summary, decisions=rows, freed_nodes=freed)


def test_reasons_are_the_strategy_in_camel_case() -> None:
    assert event_reason("gpu-consolidation") == "GpuRebalancerGpuConsolidation"
    assert event_reason("idle-gpu") == "GpuRebalancerIdleGpu"
    assert event_reason("topology-spread") == "GpuRebalancerTopologySpread"
    assert event_reason("gpu-affinity") == "GpuRebalancerGpuAffinity"


def test_an_event_per_evicted_pod_and_one_for_the_drained_node(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    add_consolidation_cluster(api)
    report = _live_cycle(api_client, KubeEventsSink(api_client))
    evicted = {r.pod: r for r in report.decisions if r.outcome == "evicted"}
    assert set(evicted) == {f"x{i}" for i in range(4)}

    events = api.objects("Event")
    pod_events = {e["involvedObject"]["name"]: e for e in events if e["involvedObject"]["kind"] == "Pod"}
    assert set(pod_events) == set(evicted)
    for name, event in pod_events.items():
        assert event["metadata"]["namespace"] == "ml"
        assert event["involvedObject"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": "ml",
            "name": name,
            "uid": f"uid-ml-{name}",
        }
        assert event["reason"] == "GpuRebalancerGpuConsolidation"
        assert event["message"] == evicted[name].reason
        assert event["type"] == "Normal"
        assert event["source"] == {"component": "gpu-rebalancer"}
        assert event["reportingComponent"] == "gpu-rebalancer"
        assert event["count"] == 1
        assert event["firstTimestamp"].startswith("2026-11-29T12:00:00")

    (node_event,) = [e for e in events if e["involvedObject"]["kind"] == "Node"]
    assert node_event["metadata"]["namespace"] == "default"
    assert node_event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "a-1", "uid": "a-1"}
    assert node_event["reason"] == "GpuRebalancerGpuConsolidation"
    assert node_event["message"] == f"node drained by gpu-rebalancer: {evicted['x0'].reason}"
    assert len({e["metadata"]["name"] for e in events}) == 5
    assert len(api.requests_to(EVENTS, "POST")) == 5


def test_a_dry_run_posts_nothing(api: FakeApiServer, api_client: client.ApiClient) -> None:
    add_consolidation_cluster(api)
    sink = KubeEventsSink(api_client)
    snap = KubeSource(api_client, CONSOLIDATE).snapshot(NOW)
    api.clear_requests()
    report = run_cycle(snap, CONSOLIDATE, DryRunEvictor(), [sink])
    assert {r.outcome for r in report.decisions} == {"would-evict"}
    assert report.freed_nodes == ("a-1",)
    assert api.requests == []


def test_only_evicted_rows_get_events(api: FakeApiServer, api_client: client.ApiClient) -> None:
    add_consolidation_cluster(api)
    # The budget of x2 is spent between the snapshot and the evictions: the node plan stops part-way.
    report = _live_cycle(
        api_client, KubeEventsSink(api_client), lambda: api.add(pdb_json("x2-pdb", {"app": "x2"}, 0))
    )
    outcomes = {r.pod: r.outcome for r in report.decisions}
    assert outcomes["x2"] == "blocked-by-pdb"
    assert report.freed_nodes == ()
    named = sorted(e["involvedObject"]["name"] for e in api.objects("Event"))
    assert named == sorted(p for p, o in outcomes.items() if o == "evicted")  # and no node Event
    assert len(named) == 2 and "error" in outcomes.values()
    sink = KubeEventsSink(api_client)
    api.clear_requests()
    sink.publish(_report(_row("a", "would-evict"), _row("b", "checkpoint-pending"), _row("c", "gone")))
    assert api.requests == []


def test_a_row_without_a_uid_leaves_it_out(api: FakeApiServer, api_client: client.ApiClient) -> None:
    KubeEventsSink(api_client, component="my-rebalancer", instance="pod-7").publish(
        _report(_row("a", "evicted"))
    )
    (event,) = api.objects("Event")
    assert "uid" not in event["involvedObject"]
    assert event["reason"] == "GpuRebalancerIdleGpu"
    assert (event["source"], event["reportingInstance"]) == ({"component": "my-rebalancer"}, "pod-7")


def test_requests_are_bounded(api: FakeApiServer, api_client: client.ApiClient) -> None:
    rows = [_row(f"p{i}", "evicted") for i in range(5)]

    api.inject(EVENTS, status=500, times=None)
    with pytest.raises(EventsSinkError, match=r"^5 of 5 Events not created: Event on Pod p0: HTTP 500"):
        KubeEventsSink(api_client).publish(_report(*rows))
    assert len(api.requests) == 1  # the API server is in trouble: no more requests this report

    api.clear_faults()
    api.clear_requests()
    api.inject(EVENTS, status=403, times=1)
    with pytest.raises(EventsSinkError, match=r"^1 of 5 Events not created: Event on Pod p0: HTTP 403"):
        KubeEventsSink(api_client).publish(_report(*rows))
    assert len(api.requests) == 5  # one forbidden Event does not stop the others

    api.clear_requests()
    KubeEventsSink(api_client, max_events=2).publish(_report(*rows))
    assert len(api.requests) == 2
    with pytest.raises(ValueError, match="max_events"):
        KubeEventsSink(api_client, max_events=0)


def test_a_failing_sink_does_not_fail_the_cycle(api: FakeApiServer, api_client: client.ApiClient) -> None:
    add_consolidation_cluster(api)
    api.inject(EVENTS, drop=True, times=None)
    snap = KubeSource(api_client, CONSOLIDATE).snapshot(NOW)
    actuator = ClusterActuator.from_config(api_client, EvictionConfig(), sleep=lambda _: None)
    errors: list[Exception] = []
    report = run_cycle(
        snap, CONSOLIDATE, actuator, [KubeEventsSink(api_client)], on_sink_error=lambda _, e: errors.append(e)
    )
    assert report.summary.evictions == 4
    (error,) = errors
    assert isinstance(error, EventsSinkError)
    assert str(error).startswith("5 of 5 Events not created: Event on Pod x0: connection dropped")


def test_credentials_quoted_by_a_reason_never_reach_an_event(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    leaky = "telemetry at http://bob:hunter2@prometheus.example:9090 says idle; " + "x" * 1010
    evicted = _row("a", "evicted")
    row = ReportedDecision(**{**{f: getattr(evicted, f) for f in evicted.__slots__}, "reason": leaky})
    KubeEventsSink(api_client).publish(_report(row, freed=("a-1",)))
    messages = [e["message"] for e in api.objects("Event")]
    assert len(messages) == 2  # the pod's and the drained node's
    for message in messages:
        assert "hunter2" not in message and "bob" not in message
        assert "http://***@prometheus.example:9090" in message and len(message) <= 1024
