"""Evictors against the fake API server: result mapping, retries, PDB memory, plans that stop part-way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer.cycle import run_cycle
from rebalancer.evictor import DryRunEvictor, Evictor
from rebalancer.kube_evictor import (
    PDB_EXHAUSTED,
    REASON_ANNOTATION,
    REQUESTED_BY_ANNOTATION,
    KubeEvictor,
)
from rebalancer.kubeapi import exponential_backoff
from rebalancer.model import Decision, Outcome, Pod, Proposal, ProposalKind
from rebalancer.node_marks import DRAINING_TAINT_KEY, DryRunTainter, KubeTainter, NodeTainter, TaintChange
from rebalancer.policy import parse_policy
from rebalancer.sources.kube import KubeSource
from tests.builders import NOW, pdb, pod, replace, snapshot
from tests.fake_apiserver import (
    FakeApiServer,
    RecordedRequest,
    add_consolidation_cluster,
    node_json,
    pdb_json,
    pod_json,
)

EVICTIONS = "/api/v1/namespaces/*/pods/*/eviction"


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def _evictor(api_client: client.ApiClient, **kwargs: Any) -> KubeEvictor:
    kwargs.setdefault("sleep", Sleeps())
    evictor = KubeEvictor(api_client, **kwargs)
    evictor.begin_cycle(snapshot([]), "c1")
    return evictor


def _decision(*pods: Pod, kind: ProposalKind = "pod", strategy: str = "idle-gpu") -> Decision:
    proposal = Proposal(
        strategy=strategy, kind=kind, pods=pods, reason="GPU idle for 2h", node=pods[0].node_name
    )
    return Decision(proposal=proposal, approved=True)


def _add_pods(api: FakeApiServer, *names: str, labels: dict[str, str] | None = None) -> list[Pod]:
    """The same pods in the fake (JSON) and as model objects (builders): names, uids and labels agree."""
    out = []
    for name in names:
        pod_labels = labels if labels is not None else {"app": name}
        api.add(pod_json(name, "gpu-1", labels=pod_labels))
        out.append(pod(name, "gpu-1", labels=pod_labels))
    return out


def _results(outcomes: Sequence[Outcome]) -> list[tuple[str, str, str]]:
    return [(o.pod, o.result, o.detail) for o in outcomes]


def _evictions(api: FakeApiServer) -> list[RecordedRequest]:
    return api.requests_to(EVICTIONS, "POST")


# --------------------------------------------------------------------------- result mapping


def test_evicted_with_uid_precondition_and_annotations(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    (train,) = _add_pods(api, "train")
    evictor = _evictor(api_client, grace_period_seconds=30)
    assert evictor.mode == "live"
    assert evictor.evict(_decision(train)) == (Outcome("ml", "train", "evicted"),)
    assert api.pod("ml", "train") is None

    (request,) = api.requests
    assert (request.method, request.path, request.param("dryRun")) == (
        "POST",
        "/api/v1/namespaces/ml/pods/train/eviction",
        None,
    )
    assert request.body["apiVersion"] == "policy/v1" and request.body["kind"] == "Eviction"
    assert request.body["metadata"]["annotations"] == {
        REQUESTED_BY_ANNOTATION: "gpu-rebalancer",
        REASON_ANNOTATION: "idle-gpu: GPU idle for 2h",
    }
    assert request.body["deleteOptions"] == {
        "preconditions": {"uid": "uid-ml-train"},
        "gracePeriodSeconds": 30,
    }


def test_pods_are_evicted_in_the_order_the_planner_placed_them(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    first, second = _add_pods(api, "a", "b")
    decision = replace(_decision(first, second, kind="node"), order=(second.key, first.key))
    outcomes = _evictor(api_client).evict(decision)
    assert [o.pod for o in outcomes] == ["b", "a"]
    assert [request.path.split("/")[-2] for request in _evictions(api)] == ["b", "a"]


def test_server_dry_run_leaves_pods_in_place(api: FakeApiServer, api_client: client.ApiClient) -> None:
    pods = _add_pods(api, "a", "b", labels={"app": "train"})
    api.add(pdb_json("train-pdb", {"app": "train"}, 1))
    evictor = _evictor(api_client, server_dry_run=True)
    assert evictor.mode == "dry-run"
    outcomes = evictor.evict(_decision(*pods, kind="gang"))
    assert [o.result for o in outcomes] == ["would-evict", "would-evict"]
    assert api.pod("ml", "a") is not None and api.pod("ml", "b") is not None
    budget = api.pdb("ml", "train-pdb")
    assert budget is not None and budget["status"]["disruptionsAllowed"] == 1
    for request in _evictions(api):
        assert request.param("dryRun") == "All"
        assert request.body["deleteOptions"]["dryRun"] == ["All"]


def test_missing_pod_is_gone(api: FakeApiServer, api_client: client.ApiClient) -> None:
    outcomes = _evictor(api_client).evict(_decision(pod("vanished", "gpu-1")))
    assert _results(outcomes) == [
        ("vanished", "gone", 'pod no longer exists (404: pods "vanished" not found)')
    ]
    assert len(api.requests) == 1


def test_recreated_pod_of_the_same_name_is_gone_not_evicted(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.add(pod_json("train", "gpu-1", uid="uid-of-the-new-pod"))
    (outcome,) = _evictor(api_client).evict(_decision(pod("train", "gpu-1")))
    assert outcome.result == "gone"
    assert outcome.detail.startswith("pod was replaced or changed (409: ")
    assert "UID in precondition: uid-ml-train" in outcome.detail
    assert api.pod("ml", "train") is not None


def test_pdb_refusal_is_blocked_without_retry(api: FakeApiServer, api_client: client.ApiClient) -> None:
    (train,) = _add_pods(api, "train", labels={"app": "train"})
    api.add(pdb_json("train-pdb", {"app": "train"}, 0, desired_healthy=4, current_healthy=4))
    sleeps = Sleeps()
    outcomes = _evictor(api_client, sleep=sleeps).evict(_decision(train))
    assert _results(outcomes) == [
        (
            "train",
            "blocked-by-pdb",
            "The disruption budget train-pdb needs 4 healthy pods and has 4 currently",
        )
    ]
    assert len(_evictions(api)) == 1
    assert sleeps == []
    assert api.pod("ml", "train") is not None


def test_a_pod_under_two_pdbs_is_an_error_without_retry(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    # The API server answers such a pod with a 500 it always gives and that changes nothing: no retry
    # (and no read-back that could take the pod's later disappearance for this eviction).
    (train,) = _add_pods(api, "train", labels={"app": "train"})
    api.add(pdb_json("one", {"app": "train"}, 1))
    api.add(pdb_json("two", {"app": "train"}, 1))
    sleeps = Sleeps()
    outcomes = _evictor(api_client, sleep=sleeps).evict(_decision(train))
    assert _results(outcomes) == [
        (
            "train",
            "error",
            "HTTP 500: This pod has more than one PodDisruptionBudget, which the eviction subresource does "
            "not support.",
        )
    ]
    assert (len(_evictions(api)), sleeps) == (1, [])
    assert api.pod("ml", "train") is not None


def test_an_exhausted_pdb_is_not_tried_again_this_cycle(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    first, second = _add_pods(api, "a", "b", labels={"app": "train"})
    (other,) = _add_pods(api, "c", labels={"app": "serve"})
    api.add(pdb_json("train-pdb", {"app": "train"}, 0))
    evictor = _evictor(api_client)

    assert evictor.evict(_decision(first))[0].result == "blocked-by-pdb"
    # The evictor looked the budget up by the name in the 429, to know which pods it covers.
    assert [r.path for r in api.requests_to("/apis/policy/v1/*")] == [
        "/apis/policy/v1/namespaces/ml/poddisruptionbudgets/train-pdb"
    ]
    assert evictor.exhausted_pdbs == (("ml", "train-pdb"),)
    assert _results(evictor.evict(_decision(second))) == [("b", "blocked-by-pdb", PDB_EXHAUSTED)]
    assert evictor.evict(_decision(other))[0].result == "evicted"
    assert len(_evictions(api)) == 2  # a, then c: b was not attempted

    evictor.begin_cycle(snapshot([]), "c2")
    assert evictor.evict(_decision(second))[0].result == "blocked-by-pdb"
    assert len(_evictions(api)) == 3


def test_known_pdbs_save_the_lookup(api: FakeApiServer, api_client: client.ApiClient) -> None:
    first, second = _add_pods(api, "a", "b", labels={"app": "train"})
    api.add(pdb_json("train-pdb", {"app": "train"}, 0))
    evictor = _evictor(api_client)
    evictor.begin_cycle(snapshot([], pdbs=[pdb("train-pdb", {"app": "train"}, 0)]), "c3")
    evictor.evict(_decision(first))
    assert _results(evictor.evict(_decision(second))) == [("b", "blocked-by-pdb", PDB_EXHAUSTED)]
    assert [r.path for r in api.requests] == ["/api/v1/namespaces/ml/pods/a/eviction"]


def test_throttling_429_is_retried(api: FakeApiServer, api_client: client.ApiClient) -> None:
    (train,) = _add_pods(api, "train")
    api.inject(EVICTIONS, status=429, message="Too many requests, please try again later.")
    assert _evictor(api_client).evict(_decision(train))[0].result == "evicted"
    assert len(_evictions(api)) == 2


def test_retries_on_500_then_success(api: FakeApiServer, api_client: client.ApiClient) -> None:
    (train,) = _add_pods(api, "train")
    api.inject(EVICTIONS, status=500, times=2)
    sleeps = Sleeps()
    outcomes = _evictor(api_client, sleep=sleeps, backoff=exponential_backoff(0.25)).evict(_decision(train))
    assert _results(outcomes) == [("train", "evicted", "")]
    assert [r.fault for r in _evictions(api)] == ["status=500", "status=500", None]
    assert sleeps == [0.25, 0.5]


def test_persistent_500_is_an_error(api: FakeApiServer, api_client: client.ApiClient) -> None:
    (train,) = _add_pods(api, "train")
    api.inject(EVICTIONS, status=500, times=None, message="etcdserver: request timed out")
    sleeps = Sleeps()
    outcomes = _evictor(api_client, retries=3, sleep=sleeps).evict(_decision(train))
    assert _results(outcomes) == [
        ("train", "error", "HTTP 500: etcdserver: request timed out (after 4 attempts)")
    ]
    assert len(_evictions(api)) == 4
    assert sleeps == [0.5, 1.0, 2.0]
    assert api.pod("ml", "train") is not None


def test_timeout_is_an_error(api: FakeApiServer, api_client: client.ApiClient) -> None:
    (train,) = _add_pods(api, "train")
    api.inject(EVICTIONS, delay=1.0, times=None)
    (outcome,) = _evictor(api_client, retries=1, request_timeout=0.15).evict(_decision(train))
    assert outcome.result == "error"
    assert outcome.detail.startswith("timed out (")
    assert outcome.detail.endswith("; the eviction may still have happened (after 2 attempts)")
    assert len(_evictions(api)) == 2


def test_dropped_connection_is_an_error(api: FakeApiServer, api_client: client.ApiClient) -> None:
    (train,) = _add_pods(api, "train")
    api.inject(EVICTIONS, drop=True, times=None)
    (outcome,) = _evictor(api_client, retries=2).evict(_decision(train))
    assert outcome.result == "error"
    assert outcome.detail.startswith("connection dropped (")
    assert outcome.detail.endswith("(after 3 attempts)")
    assert len(_evictions(api)) == 3
    assert api.pod("ml", "train") is not None


def test_dropped_connection_then_success(api: FakeApiServer, api_client: client.ApiClient) -> None:
    (train,) = _add_pods(api, "train")
    api.inject(EVICTIONS, drop=True)
    assert _evictor(api_client).evict(_decision(train))[0].result == "evicted"


def test_status_0_is_retried(
    api: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    (train,) = _add_pods(api, "train")
    evictor = _evictor(api_client, retries=1)
    real = client.CoreV1Api.create_namespaced_pod_eviction
    calls: list[str] = []

    def flaky(self: client.CoreV1Api, *args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        if len(calls) == 1:
            raise ApiException(status=0, reason="Unsupported content type: text/html")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(client.CoreV1Api, "create_namespaced_pod_eviction", flaky)
    assert evictor.evict(_decision(train))[0].result == "evicted"
    assert calls == ["train", "train"]

    monkeypatch.setattr(
        client.CoreV1Api,
        "create_namespaced_pod_eviction",
        lambda self, *a, **k: (_ for _ in ()).throw(
            ApiException(status=0, reason="Unsupported content type")
        ),
    )
    (other,) = _add_pods(api, "other")  # still there when read back: the answers were garbage
    (outcome,) = evictor.evict(_decision(other))
    assert _results([outcome]) == [
        ("other", "error", "no valid answer: Unsupported content type (after 2 attempts)")
    ]


def test_forbidden_is_an_error_without_retry(api: FakeApiServer, api_client: client.ApiClient) -> None:
    (train,) = _add_pods(api, "train")
    api.inject(EVICTIONS, status=403, message='pods "train" is forbidden: cannot create pods/eviction')
    (outcome,) = _evictor(api_client).evict(_decision(train))
    assert _results([outcome]) == [
        ("train", "error", 'HTTP 403: pods "train" is forbidden: cannot create pods/eviction')
    ]
    assert len(_evictions(api)) == 1


def test_a_pod_without_uid_is_never_evicted(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(pod_json("train", "gpu-1"))
    (outcome,) = _evictor(api_client).evict(_decision(Pod(namespace="ml", name="train", node_name="gpu-1")))
    assert outcome.result == "error" and "uid" in outcome.detail
    assert api.requests == []


# --------------------------------------------------------------------------- multi-pod plans


def test_node_plan_stops_at_the_third_pod(api: FakeApiServer, api_client: client.ApiClient) -> None:
    p0, p1 = _add_pods(api, "p0", "p1")
    (p2,) = _add_pods(api, "p2", labels={"app": "db"})
    p3, p4 = _add_pods(api, "p3", "p4")
    api.add(pdb_json("db-pdb", {"app": "db"}, 0, desired_healthy=3, current_healthy=3))
    outcomes = _evictor(api_client).evict(
        _decision(p0, p1, p2, p3, p4, kind="node", strategy="gpu-consolidation")
    )
    stop = "not attempted: plan stopped after ml/p2 blocked-by-pdb"
    assert _results(outcomes) == [
        ("p0", "evicted", ""),
        ("p1", "evicted", ""),
        ("p2", "blocked-by-pdb", "The disruption budget db-pdb needs 3 healthy pods and has 3 currently"),
        ("p3", "error", stop),
        ("p4", "error", stop),
    ]
    assert [r.path.split("/")[-2] for r in _evictions(api)] == ["p0", "p1", "p2"]
    assert sorted(p["metadata"]["name"] for p in api.objects("Pod")) == ["p2", "p3", "p4"]


def test_gang_plan_stops_after_an_error(api: FakeApiServer, api_client: client.ApiClient) -> None:
    pods = _add_pods(api, "w0", "w1", "w2")
    api.inject("*/pods/w1/eviction", status=503, times=None)
    outcomes = _evictor(api_client, retries=1).evict(_decision(*pods, kind="gang"))
    assert _results(outcomes) == [
        ("w0", "evicted", ""),
        ("w1", "error", "HTTP 503: injected fault (after 2 attempts)"),
        ("w2", "error", "not attempted: plan stopped after ml/w1 error"),
    ]
    assert api.pod("ml", "w2") is not None


def test_a_gone_pod_does_not_stop_the_plan(api: FakeApiServer, api_client: client.ApiClient) -> None:
    w0, w2 = _add_pods(api, "w0", "w2")
    outcomes = _evictor(api_client).evict(_decision(w0, pod("w1", "gpu-1"), w2, kind="gang"))
    assert [o.result for o in outcomes] == ["evicted", "gone", "evicted"]


def test_a_plan_touching_an_exhausted_pdb_is_not_started(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    (blocked,) = _add_pods(api, "first", labels={"app": "db"})
    p0 = _add_pods(api, "p0")[0]
    p1 = _add_pods(api, "p1", labels={"app": "db"})[0]
    api.add(pdb_json("db-pdb", {"app": "db"}, 0))
    evictor = _evictor(api_client)
    evictor.evict(_decision(blocked))
    api.clear_requests()
    outcomes = evictor.evict(_decision(p0, p1, kind="node"))
    assert _results(outcomes) == [
        ("p0", "error", "not attempted: plan stopped after ml/p1 blocked-by-pdb"),
        ("p1", "blocked-by-pdb", PDB_EXHAUSTED),
    ]
    assert api.requests == []


# --------------------------------------------------------------------------- dry run and contracts


def test_dry_run_evictor_makes_no_request(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(node_json("gpu-1"))
    api.add(pod_json("a", "gpu-1"))
    api.add(pod_json("b", "gpu-1"))
    snap = KubeSource(api_client, parse_policy({})).snapshot(NOW)
    api.clear_requests()
    evictor: Evictor = DryRunEvictor()
    outcomes = evictor.evict(_decision(*snap.pods, kind="node"))
    assert _results(outcomes) == [("a", "would-evict", ""), ("b", "would-evict", "")]
    assert evictor.mode == "dry-run"
    assert api.requests == []
    assert len(api.objects("Pod")) == 2


def test_refused_decisions_are_not_evicted(api_client: client.ApiClient) -> None:
    proposal = Proposal(strategy="idle-gpu", kind="pod", pods=(pod("a", "gpu-1"),), reason="idle")
    refused = Decision(proposal=proposal, approved=False, blocked_by="pdb")
    for evictor in (DryRunEvictor(), _evictor(api_client)):
        with pytest.raises(ValueError, match="refused decision"):
            evictor.evict(refused)


def test_invalid_settings_are_rejected(api_client: client.ApiClient) -> None:
    with pytest.raises(ValueError, match="grace_period_seconds"):
        KubeEvictor(api_client, grace_period_seconds=-1)
    with pytest.raises(ValueError, match="retries"):
        KubeEvictor(api_client, retries=-1)


# --------------------------------------------------------------------------- whole cycles against the fake

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


def test_a_live_cycle_evicts_what_the_dry_run_reported(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    add_consolidation_cluster(api)
    source = KubeSource(api_client, CONSOLIDATE)
    dry = run_cycle(source.snapshot(NOW), CONSOLIDATE, DryRunEvictor())
    assert api.writes() == []
    would = {(r.namespace, r.pod) for r in dry.decisions if r.outcome == "would-evict"}
    assert would == {("ml", f"x{i}") for i in range(4)}
    assert dry.freed_nodes == ("a-1",)

    snap = source.snapshot(NOW)
    evictor = _evictor(api_client)
    evictor.begin_cycle(snap, "c1")
    live = run_cycle(snap, CONSOLIDATE, evictor)
    assert live.mode == "live"
    assert {(r.namespace, r.pod) for r in live.decisions if r.outcome == "evicted"} == would
    assert live.freed_nodes == ("a-1",)
    assert {(w.path.split("/")[-4], w.path.split("/")[-2]) for w in api.writes()} == would
    assert all(w.path.endswith("/eviction") for w in api.writes())
    assert sorted(p["metadata"]["name"] for p in api.objects("Pod")) == ["busy-2", "busy-3"]


def test_a_pdb_refusal_mid_plan_leaves_a_consistent_report(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    add_consolidation_cluster(api)
    source = KubeSource(api_client, CONSOLIDATE)
    order = [r.pod for r in run_cycle(source.snapshot(NOW), CONSOLIDATE, DryRunEvictor()).decisions]
    third = order[2]
    api.add(pdb_json("third-pdb", {"app": third}, 1))
    snap = source.snapshot(NOW)
    # The budget is spent by someone else between the snapshot and the evictions: the API's 429 decides.
    api.add(pdb_json("third-pdb", {"app": third}, 0))
    api.clear_requests()
    evictor = _evictor(api_client)
    evictor.begin_cycle(snap, "c1")
    report = run_cycle(snap, CONSOLIDATE, evictor)

    rows = {r.pod: r for r in report.decisions}
    assert [rows[name].outcome for name in order] == ["evicted", "evicted", "blocked-by-pdb", "error"]
    assert rows[order[3]].reason.endswith(
        f"error: not attempted: plan stopped after ml/{third} blocked-by-pdb"
    )
    assert report.freed_nodes == ()
    assert report.summary.evictions == 2
    assert [w.path.split("/")[-2] for w in api.writes()] == order[:3]
    assert sorted(p["metadata"]["name"] for p in api.objects("Pod")) == sorted(
        ["busy-2", "busy-3", third, order[3]]
    )


# --------------------------------------------------------------------------- node draining marks

OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _taints(api: FakeApiServer, name: str) -> list[dict[str, str]]:
    node = api.node(name)
    assert node is not None
    taints: list[dict[str, str]] = node["spec"].get("taints", [])
    return taints


def test_taint_and_untaint_touch_only_our_key(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(node_json("a-1", taints=[OTHER_TAINT]))
    api.add(node_json("a-2"))
    tainter: NodeTainter = KubeTainter(api_client)
    mark = {"key": DRAINING_TAINT_KEY, "value": "cycle-7", "effect": "NoSchedule"}

    assert tainter.taint("a-1", "cycle-7") == TaintChange("a-1", ok=True, changed=True)
    assert _taints(api, "a-1") == [OTHER_TAINT, mark]
    (patch,) = api.writes()
    assert patch.content_type == "application/json-patch+json"
    assert patch.body[0]["op"] == "test" and patch.body[0]["path"] == "/metadata/resourceVersion"
    assert tainter.taint("a-1", "cycle-7") == TaintChange("a-1", ok=True)  # already there: no write
    assert len(api.writes()) == 1
    tainter.taint("a-1", "cycle-8")  # a newer plan takes the mark over
    assert _taints(api, "a-1") == [OTHER_TAINT, {**mark, "value": "cycle-8"}]

    assert tainter.taint("a-2", "cycle-8").changed
    assert tainter.tainted() == {"a-1": "cycle-8", "a-2": "cycle-8"}

    assert tainter.untaint("a-1") == TaintChange("a-1", ok=True, changed=True)
    assert _taints(api, "a-1") == [OTHER_TAINT]
    assert tainter.untaint("a-1") == TaintChange("a-1", ok=True)
    assert tainter.tainted() == {"a-2": "cycle-8"}


def test_prefer_no_schedule_and_validation(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(node_json("a-1"))
    KubeTainter(api_client, effect="PreferNoSchedule").taint("a-1", "c")
    assert _taints(api, "a-1") == [{"key": DRAINING_TAINT_KEY, "value": "c", "effect": "PreferNoSchedule"}]
    with pytest.raises(ValueError, match="NoSchedule or PreferNoSchedule"):
        KubeTainter(api_client, effect="NoExecute")


def test_a_concurrent_writer_is_not_overwritten(api: FakeApiServer, api_client: client.ApiClient) -> None:
    api.add(node_json("a-1"))
    tainter = KubeTainter(api_client, sleep=Sleeps())
    real_read = client.CoreV1Api.read_node
    reads: list[str] = []

    def read_then_race(self: client.CoreV1Api, name: str, **kwargs: Any) -> Any:
        response = real_read(self, name, **kwargs)
        if not reads:  # someone else taints the node between our read and our write
            current = api.node(name)
            assert current is not None
            current["spec"]["taints"] = [OTHER_TAINT]
            api.add(current)
        reads.append(name)
        return response

    with pytest.MonkeyPatch.context() as patcher:
        patcher.setattr(client.CoreV1Api, "read_node", read_then_race)
        assert tainter.taint("a-1", "c").changed
    assert reads == ["a-1", "a-1"]
    assert _taints(api, "a-1") == [
        OTHER_TAINT,
        {"key": DRAINING_TAINT_KEY, "value": "c", "effect": "NoSchedule"},
    ]


def test_missing_nodes_and_failures(api: FakeApiServer, api_client: client.ApiClient) -> None:
    tainter = KubeTainter(api_client, retries=1, sleep=Sleeps())
    assert tainter.taint("gone", "c") == TaintChange("gone", ok=False, detail="node no longer exists")
    assert tainter.untaint("gone") == TaintChange("gone", ok=True, detail="node no longer exists")
    api.add(node_json("a-1"))
    api.inject("/api/v1/nodes/a-1", status=500, times=None, method="PATCH")
    change = tainter.taint("a-1", "c")
    assert change == TaintChange("a-1", ok=False, detail="HTTP 500: injected fault (after 2 attempts)")
    assert _taints(api, "a-1") == []


def test_dry_run_tainter_makes_no_request(api: FakeApiServer) -> None:
    tainter: NodeTainter = DryRunTainter()
    assert tainter.taint("a-1", "c").ok and tainter.untaint("a-1").ok
    assert tainter.tainted() == {}
    assert api.requests == []
