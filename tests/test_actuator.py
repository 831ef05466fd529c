"""The live actuator against the fake API server: drain marks, checkpoint-before-evict, circuit breaker."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from rebalancer.actuator import DRAIN_TIMEOUT, DRAINING_SINCE_ANNOTATION, ClusterActuator
from rebalancer.cycle import cycle_id_for, run_cycle
from rebalancer.daemon.wiring import live_edge
from rebalancer.evictor import DryRunEvictor
from rebalancer.guards import (
    CHECKPOINT_ANNOTATION,
    CHECKPOINT_DONE_ANNOTATION,
    CIRCUIT_OPEN,
    EVICTION_REQUESTED_AT_ANNOTATION,
)
from rebalancer.history import DisruptionHistory, EvictionRecord, Workload
from rebalancer.history_circuit import open_circuits
from rebalancer.kube_evictor import KubeEvictor
from rebalancer.model import Decision, Outcome, Pod, Proposal, ProposalKind, Snapshot
from rebalancer.node_marks import DRAINING_TAINT_KEY, KubeTainter
from rebalancer.planner import plan
from rebalancer.policy import EvictionConfig, PolicyError, parse_policy
from rebalancer.rfc3339 import format_utc as format_time
from rebalancer.sinks.events import KubeEventsSink
from rebalancer.sources.files import load_snapshot_dir
from rebalancer.sources.kube import KubeSource
from rebalancer.state import (
    STATE_KEY,
    ActuatorState,
    ConfigMapStateStore,
    DrainRecord,
    FileStateStore,
    MemoryStateStore,
)
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
    actuator.end_cycle((), completed=True)
    assert actuator.state.drains == {"a-1": DrainRecord("c1", NOW)}

    # A slow pod is still terminating on the node 20 minutes later: the drain is still in progress.
    api.add(pod_json("x2", "a-1"))
    api.clear_requests()
    actuator.begin_cycle(_snapshot(api_client, NOW + 20 * MINUTE), "c2")
    actuator.end_cycle((), completed=True)
    assert api.writes() == []
    assert _taints(api, "a-1") == [OTHER_TAINT, _mark("c1")]
    assert actuator.findings() == ()

    # Removed by the autoscaler: nothing left to do, nothing written.
    api.remove("Node", "a-1")
    api.remove("Pod", "x2", "ml")
    actuator.begin_cycle(_snapshot(api_client, NOW + 25 * MINUTE), "c3")
    actuator.end_cycle((), completed=True)
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
    actuator.end_cycle((), completed=True)

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
    actuator.end_cycle((), completed=True)
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
    actuator.end_cycle((), completed=True)
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
# The planner holds a plan whose pod asked to checkpoint first (guard `checkpoint-pending`); the
# actuator asks the pod at the end of the cycle, and withdraws requests no plan wants any more.

RELAXED = parse_policy(
    {
        "telemetry": None,
        "guards": {"min_pod_age": 0, "cooldown": 0},
        "limits": {"max_per_node": None, "max_per_namespace": None, "max_per_cycle": None},
    }
)


def _run(
    actuator: ClusterActuator, snap: Snapshot, *plans: Decision, cycle: str = "c1", completed: bool = True
) -> tuple[tuple[Decision, ...], dict[str, Outcome]]:
    """One cycle of these proposals, as `run_cycle` runs it: the frame opens, the planner judges them with
    the actuator's memory, approved ones are evicted and recorded, the frame closes."""
    actuator.begin_cycle(snap, cycle)
    memory = actuator.memory
    decisions = plan(
        [d.proposal for d in plans], snap, RELAXED.policy, history=memory.begin(snap, RELAXED.policy)
    )
    outcomes: dict[str, Outcome] = {}
    for decision in decisions:
        if decision.approved:
            done = actuator.evict(decision)
            memory.record(decision, done, snap.now)
            outcomes.update((o.pod, o) for o in done)
    actuator.end_cycle(decisions, completed=completed)
    return decisions, outcomes


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
    api.clear_requests()
    [decision], outcomes = _run(actuator, snap, _plan(snap, "train"))
    assert (decision.blocked_by, outcomes) == ("checkpoint-pending", {})
    assert decision.reason == (
        "ml/train: it asks to checkpoint before eviction (rebalancer.gpu/checkpoint); asked now, evicted "
        "after rebalancer.gpu/checkpoint-done or at 2026-11-29T12:10:00Z"
    )
    (patch,) = api.writes()
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
    [waiting], _ = _run(actuator, snap, _plan(snap, "train"), cycle="c2")
    assert waiting.blocked_by == "checkpoint-pending"
    assert waiting.reason == (
        "ml/train: checkpoint requested at 2026-11-29T12:00:00Z; waiting for rebalancer.gpu/checkpoint-done "
        "until 2026-11-29T12:10:00Z"
    )
    assert api.writes() == []

    # The training code saved and answered.
    _annotate_pod(api, "train", {CHECKPOINT_DONE_ANNOTATION: "2026-11-29T12:03:10Z"})
    snap = _snapshot(api_client, NOW + 4 * MINUTE)
    [approved], outcomes = _run(actuator, snap, _plan(snap, "train"), cycle="c3")
    assert approved.approved and outcomes == {"train": Outcome("ml", "train", "evicted")}
    assert _evicted(api) == ["train"]


def test_without_an_answer_the_pod_is_evicted_after_checkpoint_timeout(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    api.add(pod_json("train", "a-1", annotations={CHECKPOINT_ANNOTATION: "true"}))
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    assert _run(actuator, snap, _plan(snap, "train"))[0][0].blocked_by == "checkpoint-pending"
    assert _evicted(api) == []

    snap = _snapshot(api_client, NOW + 9 * MINUTE)
    assert _run(actuator, snap, _plan(snap, "train"), cycle="c2")[0][0].blocked_by == "checkpoint-pending"

    snap = _snapshot(api_client, NOW + 10 * MINUTE)
    _, outcomes = _run(actuator, snap, _plan(snap, "train"), cycle="c3")
    assert outcomes == {"train": Outcome("ml", "train", "evicted")}
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
    api.clear_requests()
    [first], outcomes = _run(actuator, snap, _plan(snap, "w0", "w1", "w2", kind="gang"))
    assert (first.blocked_by, first.blocked_pod, outcomes) == ("checkpoint-pending", ("ml", "w0"), {})
    assert _describe(api.writes()) == [  # every member that asked, in one cycle
        "PATCH /api/v1/namespaces/ml/pods/w0",
        "PATCH /api/v1/namespaces/ml/pods/w1",
    ]

    # One member answered, the other not yet: nothing of the gang moves.
    _annotate_pod(api, "w0", {CHECKPOINT_DONE_ANNOTATION: "true"})
    snap = _snapshot(api_client, NOW + 3 * MINUTE)
    api.clear_requests()
    [second], outcomes = _run(actuator, snap, _plan(snap, "w0", "w1", "w2", kind="gang"), cycle="c2")
    assert (second.blocked_by, second.blocked_pod, outcomes) == ("checkpoint-pending", ("ml", "w1"), {})
    assert api.writes() == []

    _annotate_pod(api, "w1", {CHECKPOINT_DONE_ANNOTATION: "true"})
    snap = _snapshot(api_client, NOW + 5 * MINUTE)
    _, outcomes = _run(actuator, snap, _plan(snap, "w0", "w1", "w2", kind="gang"), cycle="c3")
    assert [o.result for o in outcomes.values()] == ["evicted"] * 3
    assert _evicted(api) == ["w0", "w1", "w2"]


def test_a_node_plan_with_checkpoints_is_not_marked_while_it_waits(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    api.add(node_json("a-2"))
    api.add(pod_json("x0", "a-1", annotations={CHECKPOINT_ANNOTATION: "true"}))
    api.add(pod_json("x1", "a-1"))
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    [waiting], _ = _run(actuator, snap, _node_plan(snap, "a-1"))
    assert waiting.blocked_by == "checkpoint-pending"
    assert _taints(api, "a-1") == []

    _annotate_pod(api, "x0", {CHECKPOINT_DONE_ANNOTATION: "true"})
    snap = _snapshot(api_client, NOW + MINUTE)
    _, outcomes = _run(actuator, snap, _node_plan(snap, "a-1"), cycle="c2")
    assert [o.result for o in outcomes.values()] == ["evicted"] * 2
    assert _taints(api, "a-1") == [_mark("c2")]


def test_a_request_no_cycle_wants_any_more_is_withdrawn_after_its_window(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    api.add(pod_json("train", "a-1", annotations={CHECKPOINT_ANNOTATION: "true"}))
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    _run(actuator, snap, _plan(snap, "train"))
    _annotate_pod(api, "train", {CHECKPOINT_DONE_ANNOTATION: "true"})
    api.clear_requests()

    # A cycle that did not want the pod inside the request's window changes nothing.
    _run(actuator, _snapshot(api_client, NOW + 5 * MINUTE), cycle="c2")
    # Nor does a cycle that failed half-way.
    _run(actuator, _snapshot(api_client, NOW + 10 * MINUTE), cycle="c3", completed=False)
    assert api.writes() == []

    # A complete cycle after the window that did not want the pod withdraws the request and its answer.
    _run(actuator, _snapshot(api_client, NOW + 11 * MINUTE), cycle="c4")
    assert _describe(api.writes()) == ["PATCH /api/v1/namespaces/ml/pods/train"]
    assert _pod_annotations(api, "train") == {CHECKPOINT_ANNOTATION: "true"}


def test_a_checkpoint_request_for_a_vanished_or_replaced_pod_is_dropped_and_a_failed_one_noted(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    for name in ("deleted", "replaced", "refused"):
        api.add(pod_json(name, "a-1", annotations={CHECKPOINT_ANNOTATION: "true"}))
    api.add(pod_json("other", "a-1"))
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    api.remove("Pod", "deleted", "ml")
    # Re-created under the same name: the API server refuses a patch that would change the uid (422).
    api.remove("Pod", "replaced", "ml")
    api.add(pod_json("replaced", "a-1", uid="uid-new", annotations={CHECKPOINT_ANNOTATION: "true"}))
    # An admission policy's denial, even with reason Forbidden (403), is no missing grant: noted per
    # pod and asked again next cycle.
    rule = "gpu-rebalancer may ask for a checkpoint only on a pod annotated rebalancer.gpu/checkpoint"
    api.deny_updates("pods", "ml", policy="gpu-rebalancer-pod-changes", message=rule)
    api.clear_requests()
    [decision], outcomes = _run(
        actuator, snap, _plan(snap, "deleted", "replaced", "refused", "other", kind="gang")
    )
    assert (decision.blocked_by, outcomes) == ("checkpoint-pending", {})
    assert _describe(api.writes()) == [
        "PATCH /api/v1/namespaces/ml/pods/deleted",
        "PATCH /api/v1/namespaces/ml/pods/replaced",
        "PATCH /api/v1/namespaces/ml/pods/refused",
    ]
    assert [(f.kind, f.pod, f.detail) for f in actuator.findings()] == [
        (
            "checkpoint-request",
            "refused",
            'cannot ask ml/refused to checkpoint (error: HTTP 403: pods "refused" is forbidden: '
            "ValidatingAdmissionPolicy 'gpu-rebalancer-pod-changes' with binding "
            f"'gpu-rebalancer-pod-changes' denied request: {rule}); asked again next cycle",
        )
    ]
    # The pod re-created under that name was not asked.
    assert _pod_annotations(api, "replaced") == {CHECKPOINT_ANNOTATION: "true"}
    assert _evicted(api) == []


def test_a_namespace_that_has_not_granted_checkpoint_requests_holds_its_pods_and_says_how_to_grant(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(node_json("a-1"))
    for name in ("train", "tune"):
        api.add(pod_json(name, "a-1", annotations={CHECKPOINT_ANNOTATION: "true"}))
    api.add(pod_json("eval", "a-1", namespace="research", annotations={CHECKPOINT_ANNOTATION: "true"}))
    api.forbid("patch", "pods", "ml")  # no Role in ml lets the rebalancer patch its pods
    actuator = _actuator(api_client)

    def cycle(at: datetime, name: str) -> tuple[Decision, ...]:
        snap = _snapshot(api_client, at)
        plans = [
            _plan(snap, "train", "tune", kind="gang"),
            _plan(snap, "train"),  # the same pod in a second plan: still asked once
        ]
        research = snap.pods_by_key.get(("research", "eval"))
        if research is not None:
            proposal = Proposal("idle-gpu", "pod", (research,), "GPU idle for 2h", node="a-1")
            plans.append(Decision(proposal, approved=True))
        api.clear_requests()
        return _run(actuator, snap, *plans, cycle=name)[0]

    first = cycle(NOW, "c1")
    assert [d.blocked_by for d in first] == ["checkpoint-pending"] * 3
    assert _describe(api.writes()) == [  # one attempt per pod and cycle
        "PATCH /api/v1/namespaces/ml/pods/train",
        "PATCH /api/v1/namespaces/ml/pods/tune",
        "PATCH /api/v1/namespaces/research/pods/eval",
    ]
    assert EVICTION_REQUESTED_AT_ANNOTATION in (api.pod("research", "eval") or {})["metadata"]["annotations"]
    denied = (
        'pods "train" is forbidden: User "system:serviceaccount:gpu-rebalancer:gpu-rebalancer" cannot patch '
        'resource "pods" in API group "" in the namespace "ml"'
    )
    assert [(f.kind, f.namespace, f.pod, f.detail) for f in actuator.findings()] == [
        (
            "checkpoint-request",
            "ml",
            None,
            f"namespace ml has not granted checkpoint requests (HTTP 403: {denied}); its pods that ask to "
            "checkpoint before eviction are held, never evicted unasked (2 pods: ml/train, ml/tune); grant "
            "it with kubectl -n ml apply -f deploy/checkpoint-rbac.example.yaml",
        )
    ]
    assert actuator.history.checkpoint_refused == {"ml": NOW}

    # Past checkpoint_timeout: no request was made, so nothing times out; the reason now says why.
    later = cycle(NOW + 11 * MINUTE, "c2")
    assert [d.blocked_by for d in later[:2]] == ["checkpoint-pending"] * 2
    assert later[0].reason == (
        "ml/train: cannot ask: namespace ml has not granted checkpoint requests (refused at "
        "2026-11-29T12:00:00Z); held until it does, asked again every cycle "
        "(kubectl -n ml apply -f deploy/checkpoint-rbac.example.yaml)"
    )
    assert later[2].approved  # research/eval was asked and timed out as usual
    assert _evicted(api) == ["eval"]
    assert [p for p in _describe(api.writes()) if "PATCH" in p] == [
        "PATCH /api/v1/namespaces/ml/pods/train",
        "PATCH /api/v1/namespaces/ml/pods/tune",
    ]
    assert actuator.history.checkpoint_refused == {"ml": NOW + 11 * MINUTE}

    # The team applied the template: the next cycle asks, the refusal is forgotten, the timeout starts.
    api.permit("patch", "pods", "ml")
    granted = cycle(NOW + 12 * MINUTE, "c3")
    assert granted[0].blocked_by == "checkpoint-pending"
    assert _pod_annotations(api, "train")[EVICTION_REQUESTED_AT_ANNOTATION] == "2026-11-29T12:12:00Z"
    assert actuator.findings() == () and actuator.history.checkpoint_refused == {}
    waiting = cycle(NOW + 13 * MINUTE, "c4")
    assert waiting[0].reason.startswith("ml/train: checkpoint requested at 2026-11-29T12:12:00Z")
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
    assert _run(actuator, snap, _plan(snap, "train-0"))[1]["train-0"].result == "evicted"
    # The ReplicaSet re-creates it; no node takes it.
    api.add(_replacement("train-1", NOW + MINUTE))


def _circuit(actuator: ClusterActuator, snap: Snapshot, cycle: str) -> tuple[str, ...]:
    """The workloads keeping the circuit open at a cycle on `snap` (one with nothing to evict)."""
    _run(actuator, snap, cycle=cycle)
    return tuple(t.detail for t in open_circuits(snap, actuator.history, CFG.reschedule_timeout))


def test_the_circuit_opens_when_evicted_pods_stay_pending_and_closes_when_they_are_placed(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _circuit_cluster(api)
    # A pod of the same workload that was Pending before the eviction is not the eviction's doing.
    api.add(_replacement("train-old", NOW - 60 * MINUTE))
    actuator = _actuator(api_client)
    _evict_train(api, api_client, actuator)
    assert _circuit(actuator, _snapshot(api_client, NOW + 14 * MINUTE), "c2") == ()

    snap = _snapshot(api_client, NOW + 16 * MINUTE)
    api.clear_requests()
    refused, outcomes = _run(actuator, snap, _plan(snap, "serve-0"), _node_plan(snap, "a-2"), cycle="c3")
    assert {(d.blocked_by, d.reason) for d in refused} == {
        (
            "circuit-open",
            "circuit open: ml/trainer-abc still Pending 16m after eviction: no eviction until they are "
            "placed",
        )
    }
    assert outcomes == {}
    assert not [r for r in api.requests if r.method != "GET"]
    # The report says so: a cycle's findings.
    report = run_cycle(snap, CONSOLIDATE, actuator, memory=actuator.memory, cycle_id="c3b")
    (finding,) = [f for f in report.findings if f.kind == CIRCUIT_OPEN]
    assert finding.namespace == "ml"
    assert finding.detail.startswith("circuit open: ml/trainer-abc still Pending 16m after eviction: 1 pod")

    # Still Pending: still open.
    assert _circuit(actuator, _snapshot(api_client, NOW + 30 * MINUTE), "c4") != ()

    # Placed: the circuit closes by itself and evictions resume.
    placed = _replacement("train-1", NOW + MINUTE)
    placed["spec"]["nodeName"] = "a-1"
    placed["status"]["phase"] = "Running"
    api.add(placed)
    snap = _snapshot(api_client, NOW + 35 * MINUTE)
    _, outcomes = _run(actuator, snap, _plan(snap, "serve-0"), cycle="c5")
    assert outcomes["serve-0"].result == "evicted"
    assert actuator.state.history.evictions == (
        EvictionRecord(Workload("ml", "ReplicaSet", "server-xyz"), "serve-0", NOW + 35 * MINUTE, "a-2"),
    )


def test_an_operator_reset_closes_the_circuit(api: FakeApiServer, api_client: client.ApiClient) -> None:
    _circuit_cluster(api)
    actuator = _actuator(api_client)
    _evict_train(api, api_client, actuator)
    snap = _snapshot(api_client, NOW + 20 * MINUTE)
    assert _circuit(actuator, snap, "c2") != ()

    assert actuator.reset_circuit(snap) == (Workload("ml", "ReplicaSet", "trainer-abc"),)
    snap = _snapshot(api_client, NOW + 25 * MINUTE)
    _, outcomes = _run(actuator, snap, _plan(snap, "serve-0"), cycle="c3")
    assert outcomes["serve-0"].result == "evicted"  # the acknowledged eviction does not open it again


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
            "node": "a-1",
            "evictedAt": "2026-11-29T12:00:00Z",
        }
    ]

    restarted = _actuator(api_client, state_store=store)
    snap = _snapshot(api_client, NOW + 20 * MINUTE)
    [refused], _ = _run(restarted, snap, _plan(snap, "serve-0"), cycle="c2")
    assert refused.blocked_by == "circuit-open"

    store.path.write_text("{not json")
    assert store.load() is None


def test_every_eviction_is_saved_as_it_happens(
    api: FakeApiServer, api_client: client.ApiClient, tmp_path: Path
) -> None:
    """A crash after the first decision of a cycle loses nothing the circuit breaker needs."""
    _circuit_cluster(api)
    store = FileStateStore(tmp_path / "actuator.json")
    actuator = _actuator(api_client, state_store=store)
    snap = _snapshot(api_client)
    actuator.begin_cycle(snap, "c1")
    memory = actuator.memory
    history = memory.begin(snap, RELAXED.policy)
    [decision] = plan([_plan(snap, "train-0").proposal], snap, RELAXED.policy, history=history)
    memory.record(decision, actuator.evict(decision), snap.now)
    # No end_cycle: the process dies here.
    stored = store.load()
    assert stored is not None
    assert [r.pod for r in stored.history.evictions] == ["train-0"]
    assert stored.history.workloads == {Workload("ml", "ReplicaSet", "trainer-abc"): NOW}


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
        history=DisruptionHistory(
            evictions=(EvictionRecord(Workload("ml", "ReplicaSet", "trainer-abc"), "train-0", NOW),)
        ),
        drains={"a-1": DrainRecord("c1", NOW - MINUTE)},
    )
    api.clear_requests()
    store.save(first)
    # Not there when it was read: created (never a patch without the resourceVersion it guards).
    assert [r.method for r in api.writes()] == ["POST"]
    created = _stored(api)
    assert created is not None
    assert set(created["data"]) == {STATE_KEY}
    assert json.loads(created["data"][STATE_KEY]) == first.to_json()
    assert store.load() == first

    # Someone labels it and adds a note: the next save replaces the state and keeps the rest.
    created["metadata"].setdefault("labels", {})["team"] = "ml-platform"
    created["data"]["README"] = "gpu-rebalancer memory"
    written = created["metadata"]["resourceVersion"]
    edited = api.add(created)["metadata"]["resourceVersion"]
    second = ActuatorState(
        history=DisruptionHistory(
            evictions=(
                *first.history.evictions,
                EvictionRecord(Workload("ml", "Job", "sweep"), "sweep-7", NOW + MINUTE),
            ),
            workloads={Workload("ml", "Job", "sweep"): NOW + MINUTE},
            disruptions={Workload("ml", "Job", "sweep"): (NOW + MINUTE,)},
        ),
    )
    api.clear_requests()
    store.save(second)
    # The first patch carries the resourceVersion read before the edit: refused (409), read again,
    # patched on the new one.
    assert [r.body["metadata"]["resourceVersion"] for r in api.writes()] == [written, edited]
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
    assert _store(api_client).load() == ActuatorState(drain_taint_key=DRAINING_TAINT_KEY)


def test_configmap_store_failures_are_retried_then_logged_never_raised(
    api: FakeApiServer, api_client: client.ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    state = ActuatorState(
        history=DisruptionHistory(
            evictions=(EvictionRecord(Workload("ml", "ReplicaSet", "trainer-abc"), "train-0", NOW),)
        )
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
        assert _circuit(leader, snap, "c2") != ()

        # A restart: a new actuator, a new client, the same API server.
        with api.api_client() as restarted_client:
            restarted = _actuator(restarted_client, state_store=_store(restarted_client))
            api.clear_requests()
            [refused], _ = _run(restarted, snap, _plan(snap, "serve-0"), cycle="c3")
            assert (refused.blocked_by, refused.reason) == (
                "circuit-open",
                "circuit open: ml/trainer-abc still Pending 20m after eviction: no eviction until they "
                "are placed",
            )
            assert _evicted(api) == []

        # A leader change: the standby takes the stored memory at the start of its term.
        assert standby.state == ActuatorState(drain_taint_key=DRAINING_TAINT_KEY)
        standby.new_term()
        [refused], _ = _run(standby, snap, _plan(snap, "serve-1"), cycle="c4")
        assert refused.blocked_by == "circuit-open"
        assert _evicted(api) == []  # none since the first replica's
        # The circuit closes only once the pods are placed; that too is remembered.
        placed = _replacement("train-1", NOW + MINUTE)
        placed["spec"]["nodeName"] = "a-1"
        placed["status"]["phase"] = "Running"
        api.add(placed)
        assert _circuit(standby, _snapshot(api_client, NOW + 25 * MINUTE), "c5") == ()
    # Nothing of the circuit is left; the workload's one disruption stays, for the disruption budget.
    kept = DisruptionHistory(disruptions={Workload("ml", "ReplicaSet", "trainer-abc"): (NOW,)})
    assert _store(api_client).load() == ActuatorState(history=kept, drain_taint_key=DRAINING_TAINT_KEY)
    again = _actuator(api_client, state_store=_store(api_client))
    assert _circuit(again, _snapshot(api_client, NOW + 26 * MINUTE), "c6") == ()


def test_an_unreadable_store_never_closes_an_open_circuit(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _circuit_cluster(api)
    store = _store(api_client, retries=0)
    actuator = _actuator(api_client, state_store=store)
    _evict_train(api, api_client, actuator)
    api.inject(CONFIGMAP, status=500, times=None)
    actuator.new_term()  # a new term, but the store cannot be read: the memory stays
    assert _circuit(actuator, _snapshot(api_client, NOW + 20 * MINUTE), "c2") != ()


def test_the_actuator_is_live_only_and_a_server_side_dry_run_has_none(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    _busy_state(api)
    stored = ActuatorState(
        history=DisruptionHistory(
            evictions=(EvictionRecord(Workload("ml", "ReplicaSet", "trainer-abc"), "gone-0", NOW - MINUTE),)
        )
    )
    _store(api_client).save(stored)
    with pytest.raises(ValueError, match="server-side dry run"):
        ClusterActuator(
            KubeEvictor(api_client, server_dry_run=True), KubeTainter(api_client), api_client, CFG
        )
    api.clear_requests()
    edge, sinks = live_edge(
        api_client,
        parse_policy({"eviction": {"server_dry_run": True}}),
        "replica-a",
        state_store=_store(api_client),
    )
    assert edge.evictor.mode == "dry-run" and sinks == ()
    snap = KubeSource(api_client, CONSOLIDATE).snapshot(NOW)
    report = run_cycle(snap, CONSOLIDATE, edge.evictor, memory=edge.memory)
    assert {r.outcome for r in report.decisions if r.action == "evict"} == {"would-evict"}
    assert not [w for w in api.writes() if "/configmaps" in w.path or w.method == "PATCH"]
    assert _store(api_client).load() == stored


def test_a_settled_eviction_is_forgotten(api: FakeApiServer, api_client: client.ApiClient) -> None:
    _circuit_cluster(api)
    actuator = _actuator(api_client)
    snap = _snapshot(api_client)
    _run(actuator, snap, _plan(snap, "train-0"))
    assert _circuit(actuator, _snapshot(api_client, NOW + 16 * MINUTE), "c2") == ()
    assert actuator.state.history.evictions == ()


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
    actuator.end_cycle((), completed=True)
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
    events = KubeEventsSink(api_client)
    snap = KubeSource(api_client, CONSOLIDATE).snapshot(NOW)
    api.clear_requests()
    report = run_cycle(snap, CONSOLIDATE, DryRunEvictor(), [events])
    assert report.mode == "dry-run"
    assert {r.outcome for r in report.decisions if r.action == "evict"} == {"would-evict"}
    assert api.requests == []


def test_a_snapshot_run_makes_no_request(
    api: FakeApiServer, api_client: client.ApiClient, tmp_path: Path
) -> None:
    _busy_state(api)
    objects = api.objects("Node") + api.objects("Pod")
    (tmp_path / "cluster.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    (tmp_path / "snapshot.yaml").write_text("now: 2026-11-29T12:00:00Z\n")
    api.clear_requests()
    snap = load_snapshot_dir(tmp_path, CONSOLIDATE)
    report = run_cycle(snap, CONSOLIDATE, DryRunEvictor(), [KubeEventsSink(api_client)])
    assert any(r.outcome == "would-evict" for r in report.decisions)
    assert api.requests == []


def test_server_side_dry_run_persists_nothing(api: FakeApiServer, api_client: client.ApiClient) -> None:
    _busy_state(api)
    edge, _ = live_edge(api_client, parse_policy({"eviction": {"server_dry_run": True}}), "replica-a")
    snap = KubeSource(api_client, CONSOLIDATE).snapshot(NOW)
    api.clear_requests()
    report = run_cycle(snap, CONSOLIDATE, edge.evictor)
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


def test_times_and_the_state_round_trip() -> None:
    assert format_time(NOW) == "2026-11-29T12:00:00Z"
    assert cycle_id_for(NOW) == "20261129T120000Z"
    workload = Workload("ml", "Job", "j")
    state = ActuatorState(
        history=DisruptionHistory(
            nodes={"a-2": NOW},
            workloads={workload: NOW},
            disruptions={workload: (NOW - MINUTE, NOW)},
            evictions=(EvictionRecord(workload, "p", NOW),),
        ),
        drains={"a-1": DrainRecord("c1", NOW)},
        drain_taint_key="example.com/draining",
    )
    assert ActuatorState.from_json(json.loads(json.dumps(state.to_json()))) == state
    with pytest.raises(ValueError):
        ActuatorState.from_json({"evictions": [{"namespace": "ml"}]})
    # A state written before the history was kept (version 1): its evictions and drains.
    v1 = {
        "version": 1,
        "evictions": [
            {"namespace": "ml", "kind": "Job", "name": "j", "pod": "p", "evictedAt": "2026-11-29T12:00:00Z"}
        ],
        "drains": {"a-1": {"cycle": "c1", "since": "2026-11-29T12:00:00Z"}},
    }
    assert ActuatorState.from_json(v1) == ActuatorState(
        history=DisruptionHistory(evictions=(EvictionRecord(workload, "p", NOW),)),
        drains={"a-1": DrainRecord("c1", NOW)},
    )
