"""The live actuator against the fake API server: drain marks, checkpoint-before-evict, circuit breaker."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from rebalancer.actuator import (
    CHECKPOINT_ANNOTATION,
    CHECKPOINT_DONE_ANNOTATION,
    CIRCUIT_OPEN,
    DRAIN_TIMEOUT,
    DRAINING_SINCE_ANNOTATION,
    EVICTION_REQUESTED_AT_ANNOTATION,
    STATE_KEY,
    ActuatorState,
    ClusterActuator,
    ConfigMapStateStore,
    DrainRecord,
    EvictionRecord,
    FileStateStore,
    MemoryStateStore,
    Workload,
    cycle_id_for,
    format_time,
    parse_time,
)
from rebalancer.cycle import run_cycle
from rebalancer.evictor import DRAINING_TAINT_KEY, DryRunEvictor, DryRunTainter, KubeEvictor, KubeTainter
from rebalancer.model import Decision, Outcome, Pod, Proposal, ProposalKind, Snapshot
from rebalancer.policy import EvictionConfig, PolicyError, parse_policy
from rebalancer.sinks.events import KubeEventsSink
from rebalancer.sources.files import load_snapshot_dir
from rebalancer.sources.kube import KubeSource
from tests.builders import NOW
from tests.fake_apiserver import (
    FakeApiServer,
    RecordedRequest,
    add_consolidation_cluster,
    node_json,
    pdb_json,
    pod_json,
)

EVICTIONS = "/api/v1/namespaces/*/pods/*/eviction"
CFG = EvictionConfig()
POLICY = parse_policy({"telemetry": None})
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
OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
MINUTE = timedelta(minutes=1)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def api_client(api: FakeApiServer) -> Iterator[client.ApiClient]:
    with api.api_client() as api_client:
        yield api_client


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def _actuator(api_client: client.ApiClient, cfg: EvictionConfig = CFG, **kwargs: Any) -> ClusterActuator:
    kwargs.setdefault("sleep", Sleeps())
    return ClusterActuator.from_config(api_client, cfg, **kwargs)


def _snapshot(api_client: client.ApiClient, now: datetime = NOW) -> Snapshot:
    return KubeSource(api_client, POLICY).snapshot(now)


def _plan(snap: Snapshot, *names: str, kind: ProposalKind = "pod", node: str | None = None) -> Decision:
    pods = tuple(snap.pods_by_key[("ml", name)] for name in names)
    proposal = Proposal(
        strategy="gpu-consolidation" if kind == "node" else "idle-gpu",
        kind=kind,
        pods=pods,
        reason="GPU idle for 2h",
        node=node or pods[0].node_name,
        nodes_freed=(node,) if node else (),
    )
    return Decision(proposal=proposal, approved=True)


def _node_plan(snap: Snapshot, node: str) -> Decision:
    pods = tuple(p for p in snap.pods_on(node) if not p.is_daemonset)
    return _plan(snap, *(p.name for p in pods), kind="node", node=node)


def _mark(value: str) -> dict[str, str]:
    return {"key": DRAINING_TAINT_KEY, "value": value, "effect": "NoSchedule"}


def _node(api: FakeApiServer, name: str) -> dict[str, Any]:
    found = api.node(name)
    assert found is not None
    return found


def _taints(api: FakeApiServer, name: str) -> list[dict[str, str]]:
    taints: list[dict[str, str]] = _node(api, name)["spec"].get("taints", [])
    return taints


def _node_annotations(api: FakeApiServer, name: str) -> dict[str, str]:
    notes: dict[str, str] = _node(api, name)["metadata"].get("annotations", {})
    return notes


def _pod_annotations(api: FakeApiServer, name: str) -> dict[str, str]:
    found = api.pod("ml", name)
    assert found is not None
    notes: dict[str, str] = found["metadata"].get("annotations", {})
    return notes


def _marked_node(
    name: str, value: str, since: datetime | None, *, other: bool = False, **kwargs: Any
) -> dict[str, Any]:
    taints = [OTHER_TAINT] if other else []
    obj = node_json(name, taints=[*taints, _mark(value)], **kwargs)
    if since is not None:
        obj["metadata"]["annotations"] = {DRAINING_SINCE_ANNOTATION: format_time(since)}
    return obj


def _annotate_pod(api: FakeApiServer, name: str, notes: Mapping[str, str]) -> None:
    found = api.pod("ml", name)
    assert found is not None
    found["metadata"].setdefault("annotations", {}).update(notes)
    api.add(found)


def _evicted(api: FakeApiServer) -> list[str]:
    return [r.path.split("/")[-2] for r in api.requests_to(EVICTIONS, "POST")]


def _describe(requests: list[RecordedRequest]) -> list[str]:
    return [f"{r.method} {r.path}" for r in requests]


# --------------------------------------------------------------------------- drain marks


def test_a_node_drain_marks_the_node_before_evicting_and_the_mark_stays(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1", taints=[OTHER_TAINT]))
    for index in range(3):
        api.add(pod_json(f"x{index}", "a-1"))
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    api.clear_requests()

    outcomes = actuator.evict(_node_plan(snap, "a-1"))
    assert outcomes == tuple(Outcome("ml", f"x{i}", "evicted") for i in range(3))
    assert _describe(api.writes()) == [
        "PATCH /api/v1/nodes/a-1",
        "POST /api/v1/namespaces/ml/pods/x0/eviction",
        "POST /api/v1/namespaces/ml/pods/x1/eviction",
        "POST /api/v1/namespaces/ml/pods/x2/eviction",
    ]
    assert _taints(api, "a-1") == [OTHER_TAINT, _mark("c1")]
    assert _node_annotations(api, "a-1") == {DRAINING_SINCE_ANNOTATION: "2026-11-29T12:00:00Z"}
    actuator.end_cycle()
    assert actuator.state.drains == {"a-1": DrainRecord("c1", NOW)}

    # A slow pod is still terminating on the node 20 minutes later: the drain is still in progress.
    api.add(pod_json("x2", "a-1"))
    api.clear_requests()
    actuator.begin_cycle(_snapshot(api_client, NOW + 20 * MINUTE), "c2")
    actuator.end_cycle()
    assert api.writes() == []
    assert _taints(api, "a-1") == [OTHER_TAINT, _mark("c1")]
    assert actuator.findings() == ()

    # Removed by the autoscaler: nothing left to do, nothing written.
    api.remove("Node", "a-1")
    api.remove("Pod", "x2", "ml")
    actuator.begin_cycle(_snapshot(api_client, NOW + 25 * MINUTE), "c3")
    actuator.end_cycle()
    assert api.writes() == []
    assert actuator.state.drains == {}


def test_a_plan_failing_part_way_removes_the_mark_and_the_report_says_what_was_done(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    add_consolidation_cluster(api)
    source = KubeSource(api_client, CONSOLIDATE)
    order = [r.pod for r in run_cycle(source.snapshot(NOW), CONSOLIDATE, DryRunEvictor()).decisions]
    third = order[2]
    api.add(pdb_json("third-pdb", {"app": third}, 1))
    snap = source.snapshot(NOW)
    # Someone else spends the budget between the snapshot and the evictions: the API's 429 decides.
    api.add(pdb_json("third-pdb", {"app": third}, 0))
    actuator = _actuator(api_client)
    actuator.begin_cycle(snap, "c1")
    api.clear_requests()
    report = run_cycle(snap, CONSOLIDATE, actuator)
    actuator.end_cycle()

    rows = {r.pod: r for r in report.decisions}
    assert [rows[name].outcome for name in order] == ["evicted", "evicted", "blocked-by-pdb", "error"]
    assert rows[third].reason.endswith("; drain of a-1 abandoned, its mark removed")
    assert rows[order[3]].reason.endswith(
        f"error: not attempted: plan stopped after ml/{third} blocked-by-pdb"
    )
    assert report.freed_nodes == ()
    assert report.summary.evictions == 2
    assert _describe(api.writes()) == [
        "PATCH /api/v1/nodes/a-1",
        *(f"POST /api/v1/namespaces/ml/pods/{name}/eviction" for name in order[:3]),
        "PATCH /api/v1/nodes/a-1",
    ]
    assert _taints(api, "a-1") == []
    assert _node_annotations(api, "a-1") == {}
    assert actuator.state.drains == {}
    assert sorted(p["metadata"]["name"] for p in api.objects("Pod")) == sorted(
        ["busy-2", "busy-3", third, order[3]]
    )


@pytest.mark.parametrize(
    ("fault", "detail"),
    [
        ({"status": 500}, "HTTP 500: injected fault (after 2 attempts)"),
        ({"delay": 1.0}, "; the eviction may still have happened (after 2 attempts)"),
    ],
    ids=["500s", "timeout"],
)
def test_a_fault_mid_drain_leaves_no_node_marked(
    api: FakeApiServer, api_client: client.ApiClient, fault: dict[str, Any], detail: str
) -> None:
    api.add(node_json("a-1"))
    for index in range(4):
        api.add(pod_json(f"x{index}", "a-1"))
    api.inject("/api/v1/namespaces/ml/pods/x2/eviction", times=None, **fault)
    actuator = _actuator(api_client, EvictionConfig(retries=1), request_timeout=0.2)
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    outcomes = actuator.evict(_node_plan(snap, "a-1"))
    actuator.end_cycle()
    assert [o.result for o in outcomes] == ["evicted", "evicted", "error", "error"]
    assert detail + "; drain of a-1 abandoned, its mark removed" in outcomes[2].detail
    assert outcomes[3].detail == "not attempted: plan stopped after ml/x2 error"
    assert _taints(api, "a-1") == [] and _node_annotations(api, "a-1") == {}
    assert actuator.state.drains == {}


def test_a_node_that_cannot_be_marked_is_not_drained(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    api.add(pod_json("x0", "a-1"))
    api.inject("/api/v1/nodes/a-1", method="PATCH", status=500, times=None)
    actuator = _actuator(api_client, EvictionConfig(retries=0))
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    assert actuator.evict(_node_plan(snap, "a-1")) == (
        Outcome(
            "ml",
            "x0",
            "error",
            "not attempted: cannot mark node a-1 draining (HTTP 500: injected fault (after 1 attempts))",
        ),
    )
    assert _evicted(api) == []


def test_an_unmark_that_fails_is_retried_until_done(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(node_json("a-1"))
    api.add(pod_json("x0", "a-1"))
    api.add(pod_json("x1", "a-1", labels={"app": "db"}))
    api.add(pdb_json("db-pdb", {"app": "db"}, 0))
    actuator = _actuator(api_client, EvictionConfig(retries=0))
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    # The mark goes on; removing it after the 429 fails once.
    api.inject("/api/v1/nodes/a-1", method="PATCH", status=503, skip=1)
    outcomes = actuator.evict(_node_plan(snap, "a-1"))
    assert [o.result for o in outcomes] == ["evicted", "blocked-by-pdb"]
    assert outcomes[1].detail.endswith(
        "drain of a-1 abandoned; removing its mark failed (HTTP 503: injected fault (after 1 attempts)), "
        "retried next cycle"
    )
    assert _taints(api, "a-1") == [_mark("c1")]
    actuator.end_cycle()
    assert _taints(api, "a-1") == []
    assert _node_annotations(api, "a-1") == {}


def test_drain_timeout_unmarks_nodes_that_did_not_empty(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(_marked_node("old-busy", "c0", NOW - 31 * MINUTE, other=True))
    api.add(pod_json("stuck", "old-busy"))
    api.add(_marked_node("old-ds-only", "c0", NOW - 31 * MINUTE))
    api.add(pod_json("dcgm", "old-ds-only", gpus=0, owner_kind="DaemonSet", owner_name="dcgm-exporter"))
    api.add(_marked_node("ancient-empty", "c0", NOW - 61 * MINUTE))
    api.add(_marked_node("young-busy", "c0", NOW - 10 * MINUTE))
    api.add(pod_json("moving", "young-busy"))
    api.add(_marked_node("no-since", "c0", None))
    api.add(node_json("untouched", taints=[OTHER_TAINT]))
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    api.clear_requests()
    actuator.begin_cycle(snap, "c1")

    patched = sorted(r.path.rsplit("/", 1)[-1] for r in api.writes())
    assert patched == ["ancient-empty", "no-since", "old-busy"]
    assert _taints(api, "old-busy") == [OTHER_TAINT]
    assert _node_annotations(api, "old-busy") == {}
    assert _taints(api, "ancient-empty") == [] and _taints(api, "no-since") == []
    assert _taints(api, "old-ds-only") == [_mark("c0")]  # empty: waiting for the autoscaler
    assert _taints(api, "young-busy") == [_mark("c0")]
    assert _taints(api, "untouched") == [OTHER_TAINT]
    assert {(f.kind, f.node, f.detail) for f in actuator.findings()} == {
        (
            DRAIN_TIMEOUT,
            "old-busy",
            "drain mark removed: 1 pod(s) still on the node 31m after the drain began",
        ),
        (
            DRAIN_TIMEOUT,
            "ancient-empty",
            "drain mark removed: the node is still there 61m after the drain began",
        ),
        (DRAIN_TIMEOUT, "no-since", "drain mark removed: no readable draining-since annotation"),
    }


def test_a_node_drained_again_keeps_its_first_draining_since(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(_marked_node("a-1", "c0", NOW - 10 * MINUTE))
    api.add(pod_json("x0", "a-1"))
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    assert actuator.evict(_node_plan(snap, "a-1"))[0].result == "evicted"
    assert _taints(api, "a-1") == [_mark("c1")]
    assert _node_annotations(api, "a-1") == {DRAINING_SINCE_ANNOTATION: format_time(NOW - 10 * MINUTE)}


def test_orphan_marks_are_removed_at_start_up(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(_marked_node("a-1", "earlier-run", NOW - 5 * MINUTE, other=True))
    api.add(_marked_node("a-2", "earlier-run", None))
    api.add(_marked_node("a-3", "c9", NOW - 5 * MINUTE))
    api.add(node_json("a-4", taints=[OTHER_TAINT]))
    # The stored state of this process says it owns the drain of a-3 (made by its cycle c9).
    store = MemoryStateStore(ActuatorState(drains={"a-3": DrainRecord("c9", NOW - 5 * MINUTE)}))
    actuator = _actuator(api_client, state_store=store)

    changes = actuator.cleanup_orphans()
    assert [(c.node, c.ok, c.changed) for c in changes] == [("a-1", True, True), ("a-2", True, True)]
    assert _taints(api, "a-1") == [OTHER_TAINT] and _node_annotations(api, "a-1") == {}
    assert _taints(api, "a-2") == []
    assert _taints(api, "a-3") == [_mark("c9")]
    assert _taints(api, "a-4") == [OTHER_TAINT]
    assert _describe(api.writes()) == ["PATCH /api/v1/nodes/a-1", "PATCH /api/v1/nodes/a-2"]

    # Without any stored state every mark is an orphan.
    _actuator(api_client).cleanup_orphans()
    assert _taints(api, "a-3") == []


# --------------------------------------------------------------------------- checkpoint-before-evict


def test_checkpoint_is_requested_first_and_the_pod_evicted_once_it_is_done(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    # An answer left over from an earlier request must not count for this one.
    api.add(
        pod_json(
            "train", "a-1", annotations={CHECKPOINT_ANNOTATION: "true", CHECKPOINT_DONE_ANNOTATION: "old"}
        )
    )
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    api.clear_requests()
    assert actuator.evict(_plan(snap, "train")) == (
        Outcome(
            "ml",
            "train",
            "checkpoint-pending",
            "checkpoint requested at 2026-11-29T12:00:00Z; eviction after checkpoint-done or at "
            "2026-11-29T12:10:00Z",
        ),
    )
    actuator.end_cycle()
    (patch,) = api.requests
    assert (patch.method, patch.path) == ("PATCH", "/api/v1/namespaces/ml/pods/train")
    assert patch.content_type.startswith("application/merge-patch+json")
    assert patch.body == {
        "metadata": {
            "uid": "uid-ml-train",
            "annotations": {
                EVICTION_REQUESTED_AT_ANNOTATION: "2026-11-29T12:00:00Z",
                CHECKPOINT_DONE_ANNOTATION: None,
            },
        }
    }
    assert _pod_annotations(api, "train") == {
        CHECKPOINT_ANNOTATION: "true",
        EVICTION_REQUESTED_AT_ANNOTATION: "2026-11-29T12:00:00Z",
    }

    # Two minutes on, no answer yet: the plan waits and nothing is written.
    snap = _snapshot(api_client, NOW + 2 * MINUTE)
    api.clear_requests()
    actuator.begin_cycle(snap, "c2")
    (waiting,) = actuator.evict(_plan(snap, "train"))
    actuator.end_cycle()
    assert waiting.result == "checkpoint-pending"
    assert waiting.detail == (
        "checkpoint requested at 2026-11-29T12:00:00Z; waiting for checkpoint-done until 2026-11-29T12:10:00Z"
    )
    assert api.writes() == []

    # The training code saved and answered.
    _annotate_pod(api, "train", {CHECKPOINT_DONE_ANNOTATION: "2026-11-29T12:03:10Z"})
    snap = _snapshot(api_client, NOW + 4 * MINUTE)
    actuator.begin_cycle(snap, "c3")
    assert actuator.evict(_plan(snap, "train")) == (Outcome("ml", "train", "evicted"),)
    assert _evicted(api) == ["train"]


def test_without_an_answer_the_pod_is_evicted_after_checkpoint_timeout(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    api.add(pod_json("train", "a-1", annotations={CHECKPOINT_ANNOTATION: "true"}))
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    assert actuator.evict(_plan(snap, "train"))[0].result == "checkpoint-pending"
    actuator.end_cycle()
    assert _evicted(api) == []

    snap = _snapshot(api_client, NOW + 9 * MINUTE)
    actuator.begin_cycle(snap, "c2")
    assert actuator.evict(_plan(snap, "train"))[0].result == "checkpoint-pending"
    actuator.end_cycle()

    snap = _snapshot(api_client, NOW + 10 * MINUTE)
    actuator.begin_cycle(snap, "c3")
    assert actuator.evict(_plan(snap, "train")) == (Outcome("ml", "train", "evicted"),)
    assert _evicted(api) == ["train"]


def test_a_gang_waits_for_every_checkpointing_member(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    for name in ("w0", "w1"):
        api.add(pod_json(name, "a-1", annotations={CHECKPOINT_ANNOTATION: "true"}))
    api.add(pod_json("w2", "a-1"))
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    api.clear_requests()
    first = actuator.evict(_plan(snap, "w0", "w1", "w2", kind="gang"))
    actuator.end_cycle()
    assert [o.result for o in first] == ["checkpoint-pending"] * 3
    assert first[2].detail == "the plan waits for the checkpoints of ml/w0, ml/w1"
    assert _describe(api.writes()) == [
        "PATCH /api/v1/namespaces/ml/pods/w0",
        "PATCH /api/v1/namespaces/ml/pods/w1",
    ]

    # One member answered, the other not yet: nothing of the gang moves.
    _annotate_pod(api, "w0", {CHECKPOINT_DONE_ANNOTATION: "true"})
    snap = _snapshot(api_client, NOW + 3 * MINUTE)
    api.clear_requests()
    actuator.begin_cycle(snap, "c2")
    second = actuator.evict(_plan(snap, "w0", "w1", "w2", kind="gang"))
    actuator.end_cycle()
    assert [o.result for o in second] == ["checkpoint-pending"] * 3
    assert second[0].detail == "checkpoint done; the plan waits for the checkpoints of ml/w1"
    assert api.writes() == []

    _annotate_pod(api, "w1", {CHECKPOINT_DONE_ANNOTATION: "true"})
    snap = _snapshot(api_client, NOW + 5 * MINUTE)
    actuator.begin_cycle(snap, "c3")
    third = actuator.evict(_plan(snap, "w0", "w1", "w2", kind="gang"))
    assert [o.result for o in third] == ["evicted"] * 3
    assert _evicted(api) == ["w0", "w1", "w2"]


def test_a_node_plan_with_checkpoints_is_not_marked_while_it_waits(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    api.add(pod_json("x0", "a-1", annotations={CHECKPOINT_ANNOTATION: "true"}))
    api.add(pod_json("x1", "a-1"))
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    assert [o.result for o in actuator.evict(_node_plan(snap, "a-1"))] == ["checkpoint-pending"] * 2
    assert _taints(api, "a-1") == []
    actuator.end_cycle()

    _annotate_pod(api, "x0", {CHECKPOINT_DONE_ANNOTATION: "true"})
    snap = _snapshot(api_client, NOW + MINUTE)
    actuator.begin_cycle(snap, "c2")
    assert [o.result for o in actuator.evict(_node_plan(snap, "a-1"))] == ["evicted"] * 2
    assert _taints(api, "a-1") == [_mark("c2")]


def test_a_request_no_cycle_wants_any_more_is_withdrawn_after_its_window(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    api.add(pod_json("train", "a-1", annotations={CHECKPOINT_ANNOTATION: "true"}))
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    actuator.evict(_plan(snap, "train"))
    actuator.end_cycle()
    _annotate_pod(api, "train", {CHECKPOINT_DONE_ANNOTATION: "true"})
    api.clear_requests()

    # A cycle that did not want the pod inside the request's window changes nothing.
    actuator.begin_cycle(_snapshot(api_client, NOW + 5 * MINUTE), "c2")
    actuator.end_cycle()
    # Nor does a cycle that failed half-way.
    actuator.begin_cycle(_snapshot(api_client, NOW + 10 * MINUTE), "c3")
    actuator.end_cycle(completed=False)
    assert api.writes() == []

    # A complete cycle after the window that did not want the pod withdraws the request and its answer.
    actuator.begin_cycle(_snapshot(api_client, NOW + 11 * MINUTE), "c4")
    actuator.end_cycle()
    assert _describe(api.writes()) == ["PATCH /api/v1/namespaces/ml/pods/train"]
    assert _pod_annotations(api, "train") == {CHECKPOINT_ANNOTATION: "true"}


def test_a_checkpoint_request_for_a_vanished_or_replaced_pod_is_gone(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    for name in ("deleted", "replaced"):
        api.add(pod_json(name, "a-1", annotations={CHECKPOINT_ANNOTATION: "true"}))
    api.add(pod_json("other", "a-1"))
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    api.remove("Pod", "deleted", "ml")
    # The API server refuses a patch that would change the uid (a pod re-created under the same name).
    api.inject(
        "/api/v1/namespaces/ml/pods/replaced",
        method="PATCH",
        status=422,
        message='Pod "replaced" is invalid: metadata.uid: Invalid value: "uid-x": field is immutable',
    )
    actuator.begin_cycle(snap, "c1")
    outcomes = actuator.evict(_plan(snap, "deleted", "replaced", "other", kind="gang"))
    assert [(o.result, o.detail) for o in outcomes] == [
        ("gone", "checkpoint request: pod no longer exists (404)"),
        ("gone", "checkpoint request: pod was replaced or changed (422)"),
        ("checkpoint-pending", "the plan waits for the checkpoints of none"),
    ]
    assert _evicted(api) == []


# --------------------------------------------------------------------------- circuit breaker


def _replacement(name: str, created: datetime, owner: str = "trainer-abc") -> dict[str, Any]:
    obj = pod_json(name, None, phase="Pending", owner_name=owner)
    obj["metadata"]["creationTimestamp"] = format_time(created)
    return obj


def _circuit_cluster(api: FakeApiServer) -> None:
    api.add(node_json("a-1"))
    api.add(node_json("a-2"))
    api.add(pod_json("train-0", "a-1"))
    api.add(pod_json("serve-0", "a-2", owner_name="server-xyz"))
    api.add(pod_json("serve-1", "a-2", owner_name="server-xyz"))


def _evict_train(api: FakeApiServer, api_client: client.ApiClient, actuator: ClusterActuator) -> None:
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    assert actuator.evict(_plan(snap, "train-0"))[0].result == "evicted"
    actuator.end_cycle()
    # The ReplicaSet re-creates it; no node takes it.
    api.add(_replacement("train-1", NOW + MINUTE))


def test_the_circuit_opens_when_evicted_pods_stay_pending_and_closes_when_they_are_placed(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _circuit_cluster(api)
    # A pod of the same workload that was Pending before the eviction is not the eviction's doing.
    api.add(_replacement("train-old", NOW - 60 * MINUTE))
    actuator = _actuator(api_client)
    _evict_train(api, api_client, actuator)

    actuator.begin_cycle(_snapshot(api_client, NOW + 14 * MINUTE), "c2")
    assert not actuator.circuit_open
    actuator.end_cycle()

    snap = _snapshot(api_client, NOW + 16 * MINUTE)
    actuator.begin_cycle(snap, "c3")
    assert actuator.circuit_open
    (finding,) = actuator.findings()
    assert (finding.kind, finding.namespace) == (CIRCUIT_OPEN, "ml")
    assert finding.detail.startswith(
        "circuit open: ml/trainer-abc still Pending 16m after eviction: 1 pod(s)"
    )
    api.clear_requests()
    refused = actuator.evict(_plan(snap, "serve-0")) + actuator.evict(_node_plan(snap, "a-2"))
    assert {(o.result, o.detail) for o in refused} == {
        ("error", "circuit open: ml/trainer-abc still Pending 16m after eviction")
    }
    assert api.requests == []
    actuator.end_cycle()

    # Still Pending: still open.
    actuator.begin_cycle(_snapshot(api_client, NOW + 30 * MINUTE), "c4")
    assert actuator.circuit_open
    actuator.end_cycle()

    # Placed: the circuit closes by itself and evictions resume.
    placed = _replacement("train-1", NOW + MINUTE)
    placed["spec"]["nodeName"] = "a-1"
    placed["status"]["phase"] = "Running"
    api.add(placed)
    snap = _snapshot(api_client, NOW + 35 * MINUTE)
    actuator.begin_cycle(snap, "c5")
    assert not actuator.circuit_open and actuator.findings() == ()
    assert actuator.evict(_plan(snap, "serve-0"))[0].result == "evicted"
    assert actuator.state.evictions == (
        EvictionRecord(Workload("ml", "ReplicaSet", "server-xyz"), "serve-0", NOW + 35 * MINUTE),
    )


def test_an_operator_reset_closes_the_circuit(api: FakeApiServer, api_client: client.ApiClient) -> None:
    _circuit_cluster(api)
    actuator = _actuator(api_client)
    _evict_train(api, api_client, actuator)
    actuator.begin_cycle(_snapshot(api_client, NOW + 20 * MINUTE), "c2")
    assert actuator.circuit_open
    actuator.end_cycle()

    assert actuator.reset_circuit() == (Workload("ml", "ReplicaSet", "trainer-abc"),)
    assert not actuator.circuit_open
    snap = _snapshot(api_client, NOW + 25 * MINUTE)
    actuator.begin_cycle(snap, "c3")
    assert not actuator.circuit_open  # the acknowledged eviction does not open it again
    assert actuator.evict(_plan(snap, "serve-0"))[0].result == "evicted"


def test_the_circuit_survives_a_restart_through_the_state_store(
    api: FakeApiServer, api_client: client.ApiClient, tmp_path: Path
) -> None:
    _circuit_cluster(api)
    store = FileStateStore(tmp_path / "state" / "actuator.json")
    _evict_train(api, api_client, _actuator(api_client, state_store=store))
    saved = json.loads(store.path.read_text())
    assert saved["evictions"] == [
        {
            "namespace": "ml",
            "kind": "ReplicaSet",
            "name": "trainer-abc",
            "pod": "train-0",
            "evictedAt": "2026-11-29T12:00:00Z",
        }
    ]

    restarted = _actuator(api_client, state_store=store)
    snap = _snapshot(api_client, NOW + 20 * MINUTE)
    restarted.begin_cycle(snap, "c2")
    assert restarted.circuit_open
    assert restarted.evict(_plan(snap, "serve-0"))[0].result == "error"

    store.path.write_text("{not json")
    assert store.load() is None


STATE_NS = "gpu-rebalancer"
CONFIGMAP = f"/api/v1/namespaces/{STATE_NS}/configmaps/*"


def _store(api_client: client.ApiClient, **kwargs: Any) -> ConfigMapStateStore:
    kwargs.setdefault("sleep", Sleeps())
    return ConfigMapStateStore(api_client, namespace=STATE_NS, name="rebalancer-memory", **kwargs)


def _stored(api: FakeApiServer, name: str = "rebalancer-memory") -> dict[str, Any] | None:
    return api.get("ConfigMap", name, STATE_NS)


def test_the_configmap_store_creates_its_configmap_then_patches_its_key(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    store = _store(api_client)
    assert store.load() is None  # no ConfigMap yet
    assert [(r.method, r.path) for r in api.requests] == [
        ("GET", f"/api/v1/namespaces/{STATE_NS}/configmaps/rebalancer-memory")
    ]
    first = ActuatorState(
        evictions=(EvictionRecord(Workload("ml", "ReplicaSet", "trainer-abc"), "train-0", NOW),),
        drains={"a-1": DrainRecord("c1", NOW - MINUTE)},
    )
    api.clear_requests()
    store.save(first)
    assert [r.method for r in api.writes()] == ["PATCH", "POST"]  # not there: created
    created = _stored(api)
    assert created is not None
    assert set(created["data"]) == {STATE_KEY}
    assert json.loads(created["data"][STATE_KEY]) == first.to_json()
    assert store.load() == first

    # Someone labels it and adds a note: the next save replaces the state and keeps the rest.
    created["metadata"].setdefault("labels", {})["team"] = "ml-platform"
    created["data"]["README"] = "gpu-rebalancer memory"
    api.add(created)
    second = ActuatorState(
        evictions=(
            *first.evictions,
            EvictionRecord(Workload("ml", "Job", "sweep"), "sweep-7", NOW + MINUTE),
        ),
    )
    api.clear_requests()
    store.save(second)
    assert [r.method for r in api.writes()] == ["PATCH"]
    updated = _stored(api)
    assert updated is not None
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]
    assert updated["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    assert updated["metadata"]["labels"]["team"] == "ml-platform"
    assert updated["data"]["README"] == "gpu-rebalancer memory"
    assert json.loads(updated["data"][STATE_KEY]) == second.to_json()
    assert _store(api_client).load() == second  # another replica reads the same memory
    assert api.objects("ConfigMap") == [updated]  # one object, in its namespace


@pytest.mark.parametrize(
    "data",
    [
        {STATE_KEY: "{not json"},
        {STATE_KEY: json.dumps({"evictions": [{"namespace": "ml"}]})},
        {STATE_KEY: json.dumps(["a", "list"])},
        {STATE_KEY: json.dumps({"evictions": [], "drains": {"a-1": {"cycle": "c1", "since": "soon"}}})},
        {"something-else": "{}"},
        None,
    ],
    ids=["not-json", "missing-fields", "not-an-object", "bad-time", "no-key", "no-data"],
)
def test_unreadable_configmap_state_is_read_as_no_state(
    api: FakeApiServer,
    api_client: client.ApiClient,
    caplog: pytest.LogCaptureFixture,
    data: dict[str, str] | None,
) -> None:
    configmap: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "rebalancer-memory", "namespace": STATE_NS},
    }
    if data is not None:
        configmap["data"] = data
    api.add(configmap)
    with caplog.at_level(logging.WARNING, logger="rebalancer.actuator"):
        assert _store(api_client).load() is None
    assert any(f"{STATE_NS}/rebalancer-memory" in r.getMessage() for r in caplog.records)
    # The daemon starts with no memory and its next save writes a readable state over it.
    actuator = _actuator(api_client, state_store=_store(api_client))
    actuator.begin_cycle(Snapshot(now=NOW, nodes={}, pods=()), "c1")
    assert _store(api_client).load() == ActuatorState()


def test_configmap_store_failures_are_retried_then_logged_never_raised(
    api: FakeApiServer, api_client: client.ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    state = ActuatorState(
        evictions=(EvictionRecord(Workload("ml", "ReplicaSet", "trainer-abc"), "train-0", NOW),)
    )
    sleeps = Sleeps()
    store = _store(api_client, retries=2, sleep=sleeps)

    # A transient 500 is retried with backoff.
    api.inject(CONFIGMAP, status=500)
    store.save(state)
    assert store.load() == state
    assert sleeps == [0.5]

    # Failing every time: logged, not raised; the stored state is untouched.
    api.inject(CONFIGMAP, status=500, times=None)
    api.clear_requests()
    sleeps.clear()
    with caplog.at_level(logging.ERROR, logger="rebalancer.actuator"):
        store.save(ActuatorState())
        assert store.load() is None
    assert len(api.requests) == 6 and sleeps == [0.5, 1.0, 0.5, 1.0]
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"cannot save the actuator state in ConfigMap {STATE_NS}/") for m in messages)
    assert any(m.startswith(f"cannot read the actuator state in ConfigMap {STATE_NS}/") for m in messages)
    api.clear_faults()
    assert store.load() == state

    # A refusal (403: RBAC) is not retried; a dropped connection or a timeout is.
    api.inject(CONFIGMAP, status=403, times=None)
    api.clear_requests()
    store.save(ActuatorState())
    assert len(api.requests) == 1
    api.clear_faults()
    api.inject(CONFIGMAP, drop=True)
    store.save(ActuatorState())
    assert store.load() == ActuatorState()
    # A hung API server: every request ends at the store's timeout.
    slow = _store(api_client, retries=0, request_timeout=(1.0, 0.2))
    api.inject(CONFIGMAP, delay=5.0, times=None)
    assert slow.load() is None
    slow.save(state)
    api.clear_faults()
    assert store.load() == ActuatorState()


def test_the_circuit_survives_a_restart_and_a_leader_change_through_the_configmap(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _circuit_cluster(api)
    # The standby replica starts with the leader: nothing stored yet.
    with api.api_client() as standby_client:
        standby = _actuator(standby_client, state_store=_store(standby_client))
        leader = _actuator(api_client, state_store=_store(api_client))
        _evict_train(api, api_client, leader)
        snap = _snapshot(api_client, NOW + 20 * MINUTE)
        leader.begin_cycle(snap, "c2")
        assert leader.circuit_open
        leader.end_cycle()

        # A restart: a new actuator, a new client, the same API server.
        with api.api_client() as restarted_client:
            restarted = _actuator(restarted_client, state_store=_store(restarted_client))
            restarted.begin_cycle(snap, "c3")
            assert restarted.circuit_open
            api.clear_requests()
            refused = restarted.evict(_plan(snap, "serve-0"))
            assert [(o.result, o.detail) for o in refused] == [
                ("error", "circuit open: ml/trainer-abc still Pending 20m after eviction")
            ]
            assert api.requests == []
            restarted.end_cycle()

        # A leader change: the standby takes the stored memory at the start of its term.
        assert standby.state == ActuatorState()
        assert standby.load_state()
        standby.begin_cycle(snap, "c4")
        assert standby.circuit_open
        assert standby.evict(_plan(snap, "serve-1"))[0].result == "error"
        assert _evicted(api) == []  # none since the first replica's
        # The circuit closes only once the pods are placed; that too is remembered.
        placed = _replacement("train-1", NOW + MINUTE)
        placed["spec"]["nodeName"] = "a-1"
        placed["status"]["phase"] = "Running"
        api.add(placed)
        standby.begin_cycle(_snapshot(api_client, NOW + 25 * MINUTE), "c5")
        assert not standby.circuit_open
        standby.end_cycle()
    assert _store(api_client).load() == ActuatorState()
    again = _actuator(api_client, state_store=_store(api_client))
    again.begin_cycle(_snapshot(api_client, NOW + 26 * MINUTE), "c6")
    assert not again.circuit_open


def test_an_unreadable_store_never_closes_an_open_circuit(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _circuit_cluster(api)
    store = _store(api_client, retries=0)
    actuator = _actuator(api_client, state_store=store)
    _evict_train(api, api_client, actuator)
    api.inject(CONFIGMAP, status=500, times=None)
    assert not actuator.load_state()  # a new term, but the store cannot be read: the memory stays
    actuator.begin_cycle(_snapshot(api_client, NOW + 20 * MINUTE), "c2")
    assert actuator.circuit_open


def test_a_dry_run_actuator_saves_no_state(api: FakeApiServer, api_client: client.ApiClient) -> None:
    _busy_state(api)
    stored = ActuatorState(
        evictions=(EvictionRecord(Workload("ml", "ReplicaSet", "trainer-abc"), "gone-0", NOW - MINUTE),)
    )
    _store(api_client).save(stored)
    api.clear_requests()
    for actuator in (
        ClusterActuator(DryRunEvictor(), DryRunTainter(), api_client, CFG, state_store=_store(api_client)),
        _actuator(api_client, EvictionConfig(server_dry_run=True), state_store=_store(api_client)),
    ):
        assert actuator.mode == "dry-run"
        actuator.cleanup_orphans()
        assert actuator.load_state()
        snap = KubeSource(api_client, CONSOLIDATE).snapshot(NOW)
        actuator.begin_cycle(snap, "c1")
        run_cycle(snap, CONSOLIDATE, actuator)
        actuator.end_cycle()
        actuator.reset_circuit()
    assert not [w for w in api.writes() if "/configmaps" in w.path]
    assert _store(api_client).load() == stored


def test_a_settled_eviction_is_forgotten(api: FakeApiServer, api_client: client.ApiClient) -> None:
    _circuit_cluster(api)
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    actuator.evict(_plan(snap, "train-0"))
    actuator.end_cycle()
    actuator.begin_cycle(_snapshot(api_client, NOW + 16 * MINUTE), "c2")
    assert not actuator.circuit_open
    assert actuator.state.evictions == ()


# --------------------------------------------------------------------------- whole cycles, dry runs


def test_a_live_cycle_evicts_exactly_what_the_dry_run_reported(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    add_consolidation_cluster(api)
    source = KubeSource(api_client, CONSOLIDATE)
    dry = run_cycle(source.snapshot(NOW), CONSOLIDATE, DryRunEvictor())
    assert api.writes() == []
    would = {(r.namespace, r.pod) for r in dry.decisions if r.outcome == "would-evict"}
    assert would == {("ml", f"x{i}") for i in range(4)}

    snap = source.snapshot(NOW)
    actuator = _actuator(api_client)
    actuator.begin_cycle(snap, cycle_id_for(snap.now))
    live = run_cycle(snap, CONSOLIDATE, actuator)
    actuator.end_cycle()
    assert live.mode == "live"
    assert {(r.namespace, r.pod) for r in live.decisions if r.outcome == "evicted"} == would
    assert live.freed_nodes == dry.freed_nodes == ("a-1",)
    evictions = [w for w in api.writes() if w.path.endswith("/eviction")]
    assert {(w.path.split("/")[-4], w.path.split("/")[-2]) for w in evictions} == would
    assert _describe([w for w in api.writes() if not w.path.endswith("/eviction")]) == [
        "PATCH /api/v1/nodes/a-1"
    ]
    assert _taints(api, "a-1") == [_mark("20261129T120000Z")]


def _busy_state(api: FakeApiServer) -> None:
    """A cluster where a live actuator would write: an expired mark, a checkpoint pod, an orphan."""
    add_consolidation_cluster(api)
    api.add(_marked_node("old", "c0", NOW - 2 * 60 * MINUTE))
    api.add(pod_json("stuck", "old"))
    api.add(pod_json("ckpt", "a-1", annotations={CHECKPOINT_ANNOTATION: "true"}))
    api.add(pod_json("asked", "a-2", annotations={EVICTION_REQUESTED_AT_ANNOTATION: "2026-11-29T11:00:00Z"}))


def test_dry_run_makes_no_write_request(api: FakeApiServer, api_client: client.ApiClient) -> None:
    _busy_state(api)
    actuator = ClusterActuator(DryRunEvictor(), DryRunTainter(), api_client, CFG)
    assert actuator.mode == "dry-run"
    events = KubeEventsSink(api_client)
    assert actuator.cleanup_orphans() == ()
    snap = KubeSource(api_client, CONSOLIDATE).snapshot(NOW)
    actuator.begin_cycle(snap, "c1")
    events.begin_cycle(snap)
    report = run_cycle(snap, CONSOLIDATE, actuator, [events])
    actuator.end_cycle()
    assert report.mode == "dry-run"
    assert {r.outcome for r in report.decisions if r.action == "evict"} == {"would-evict"}
    assert api.writes() == []


def test_a_snapshot_run_makes_no_request(
    api: FakeApiServer, api_client: client.ApiClient, tmp_path: Path
) -> None:
    _busy_state(api)
    objects = api.objects("Node") + api.objects("Pod")
    (tmp_path / "cluster.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    (tmp_path / "snapshot.yaml").write_text("now: 2026-11-29T12:00:00Z\n")
    snap = load_snapshot_dir(tmp_path, CONSOLIDATE)
    actuator = ClusterActuator(DryRunEvictor(), DryRunTainter(), None, CFG)
    events = KubeEventsSink(api_client)
    actuator.cleanup_orphans()
    actuator.begin_cycle(snap, "c1")
    events.begin_cycle(snap)
    report = run_cycle(snap, CONSOLIDATE, actuator, [events])
    actuator.end_cycle()
    assert any(r.outcome == "would-evict" for r in report.decisions)
    assert api.requests == []


def test_server_side_dry_run_persists_nothing(api: FakeApiServer, api_client: client.ApiClient) -> None:
    _busy_state(api)
    actuator = _actuator(api_client, EvictionConfig(server_dry_run=True))
    assert actuator.mode == "dry-run"
    actuator.cleanup_orphans()
    snap = KubeSource(api_client, CONSOLIDATE).snapshot(NOW)
    actuator.begin_cycle(snap, "c1")
    report = run_cycle(snap, CONSOLIDATE, actuator)
    actuator.end_cycle()
    assert {r.outcome for r in report.decisions if r.action == "evict"} == {"would-evict"}
    assert {(w.method, w.param("dryRun")) for w in api.writes()} == {("POST", "All")}
    assert len(api.objects("Pod")) == 9
    assert _taints(api, "old") == [_mark("c0")]


# --------------------------------------------------------------------------- wiring and settings


def test_the_policy_eviction_section() -> None:
    assert parse_policy({}).policy.eviction == EvictionConfig()
    cfg = parse_policy(
        {
            "eviction": {
                "grace_period_seconds": 120,
                "server_dry_run": True,
                "retries": 1,
                "drain_taint_key": "example.com/draining",
                "drain_taint_effect": "PreferNoSchedule",
                "drain_timeout": "1h",
                "checkpoint_timeout": "20m",
                "reschedule_timeout": "30m",
            }
        }
    ).policy.eviction
    assert (cfg.drain_timeout, cfg.checkpoint_timeout, cfg.reschedule_timeout) == (3600, 1200, 1800)
    assert (CFG.grace_period_seconds, CFG.server_dry_run, CFG.retries) == (None, False, 3)
    assert (CFG.drain_taint_key, CFG.drain_taint_effect) == (DRAINING_TAINT_KEY, "NoSchedule")
    assert (CFG.drain_timeout, CFG.checkpoint_timeout, CFG.reschedule_timeout) == (1800, 600, 900)
    with pytest.raises(PolicyError) as caught:
        parse_policy(
            {"eviction": {"drain_taint_effect": "NoExecute", "drain_timeout": 0, "drain_taint_key": "a b"}}
        )
    problems = "\n".join(caught.value.problems)
    assert "eviction.drain_taint_effect" in problems
    assert "eviction.drain_timeout" in problems
    assert "eviction.drain_taint_key: not a valid taint key" in problems


def test_from_config_builds_evictor_and_tainter_from_the_policy(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    cfg = EvictionConfig(drain_taint_key="example.com/drain", drain_taint_effect="PreferNoSchedule")
    api.add(node_json("a-1"))
    api.add(pod_json("x0", "a-1"))
    actuator = _actuator(api_client, cfg)
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    actuator.evict(_node_plan(snap, "a-1"))
    assert _taints(api, "a-1") == [{"key": "example.com/drain", "value": "c1", "effect": "PreferNoSchedule"}]
    with pytest.raises(ValueError, match="the tainter marks"):
        ClusterActuator(KubeEvictor(api_client), KubeTainter(api_client), api_client, cfg)


def test_misuse_is_refused(api_client: client.ApiClient) -> None:
    actuator = _actuator(api_client)
    snap = Snapshot(now=NOW, nodes={}, pods=(Pod("ml", "a", uid="u", node_name="n"),))
    decision = Decision(
        proposal=Proposal(strategy="idle-gpu", kind="pod", pods=snap.pods, reason="idle"), approved=True
    )
    with pytest.raises(RuntimeError, match="begin_cycle"):
        actuator.evict(decision)
    with pytest.raises(ValueError, match="not a valid taint value"):
        actuator.begin_cycle(snap, "cycle 1")
    actuator.begin_cycle(snap, "c1")
    with pytest.raises(ValueError, match="refused decision"):
        actuator.evict(Decision(proposal=decision.proposal, approved=False, blocked_by="pdb"))


def test_times() -> None:
    assert format_time(NOW) == "2026-11-29T12:00:00Z"
    assert parse_time("2026-11-29T12:00:00Z") == NOW
    assert parse_time("2026-11-29T13:00:00+01:00") == NOW
    assert parse_time("2026-11-29T12:00:00") == NOW
    assert parse_time("yesterday") is None and parse_time(None) is None
    assert cycle_id_for(NOW) == "20261129T120000Z"
    state = ActuatorState(
        evictions=(EvictionRecord(Workload("ml", "Job", "j"), "p", NOW),),
        drains={"a-1": DrainRecord("c1", NOW)},
    )
    assert ActuatorState.from_json(json.loads(json.dumps(state.to_json()))) == state
    with pytest.raises(ValueError):
        ActuatorState.from_json({"evictions": [{"namespace": "ml"}]})
