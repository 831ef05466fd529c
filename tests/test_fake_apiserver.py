"""The fake API server behaves like kube-apiserver for what the project uses, through the real client."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol, cast

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.fake_apiserver import (
    CONTINUE_EXPIRED,
    EVICTION_REFUSED,
    MULTIPLE_PDBS,
    FakeApiServer,
    controller_json,
    json_patch,
    merge_patch,
    node_json,
    parse_label_selector,
    pdb_json,
    pod_json,
    selector_string,
    strategic_merge_patch,
)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def core(api: FakeApiServer) -> Iterator[client.CoreV1Api]:
    with api.api_client() as api_client:
        yield client.CoreV1Api(api_client)


def _raw(response: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(response.data)
    return data


def _names(listing: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in listing["items"]]


def _body(error: ApiException) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(error.body or "{}")
    return data


def _custom(answer: object) -> dict[str, Any]:
    """What a CustomObjectsApi call answered (typed `object` by the client): the JSON object."""
    assert isinstance(answer, dict)
    return answer


class _HasMetadata(Protocol):
    @property
    def metadata(self) -> client.V1ObjectMeta | None: ...


def _meta(obj: _HasMetadata) -> client.V1ObjectMeta:
    """A client model's metadata, which every object the server answers has."""
    assert obj.metadata is not None
    return obj.metadata


def _eviction(
    name: str, namespace: str = "ml", uid: str | None = None, dry_run: bool = False
) -> client.V1Eviction:
    options = client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=uid) if uid is not None else None,
        dry_run=["All"] if dry_run else None,
    )
    return client.V1Eviction(
        api_version="policy/v1",
        kind="Eviction",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        delete_options=options,
    )


def _evict(
    core: client.CoreV1Api,
    name: str,
    *,
    uid: str | None = None,
    dry_run: str | None = None,
    options_dry_run: bool = False,
    timeout: float | None = None,
) -> urllib3.BaseHTTPResponse:
    """POST an eviction in namespace ml; the raw response (non-2xx raises ApiException)."""
    body = _eviction(name, uid=uid, dry_run=options_dry_run)
    response = core.create_namespaced_pod_eviction(
        name, "ml", body, dry_run=dry_run, _preload_content=False, _request_timeout=timeout
    )
    raw = cast("urllib3.BaseHTTPResponse", response)
    assert raw.data is not None  # read the whole answer before the connection goes back to the pool
    return raw


# --------------------------------------------------------------------------- list


def test_list_pods_with_field_and_label_selectors(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(pod_json("a", "n1", labels={"app": "train", "tier": "gpu"}))
    api.add(pod_json("b", "n2", labels={"app": "train"}))
    api.add(pod_json("c", "n1", labels={"app": "serve"}, phase="Succeeded"))
    api.add(pod_json("d", "n1", namespace="other", labels={"app": "train"}))
    api.add(pod_json("e", None, labels={"app": "train"}, phase="Pending"))

    on_n1 = _raw(core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1", _preload_content=False))
    assert _names(on_n1) == ["a", "c", "d"]

    live = core.list_pod_for_all_namespaces(
        field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False
    )
    assert _names(_raw(live)) == ["a", "b", "e", "d"]  # sorted by namespace, then name

    unbound = _raw(core.list_pod_for_all_namespaces(field_selector="spec.nodeName=", _preload_content=False))
    assert _names(unbound) == ["e"]

    in_ml = _raw(core.list_namespaced_pod("ml", label_selector="app in (train),tier", _preload_content=False))
    assert _names(in_ml) == ["a"]
    not_train = _raw(core.list_namespaced_pod("ml", label_selector="app!=train", _preload_content=False))
    assert _names(not_train) == ["c"]
    by_name = core.list_namespaced_pod("ml", field_selector="metadata.name==b", _preload_content=False)
    assert _names(_raw(by_name)) == ["b"]
    assert _raw(by_name)["kind"] == "PodList"
    assert "kind" not in _raw(by_name)["items"][0]  # items of a typed List carry no TypeMeta


def test_list_through_client_models(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(node_json("n1", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]))
    (node,) = core.list_node().items
    assert node.metadata is not None and node.metadata.name == "n1"
    assert node.spec is not None and node.spec.taints is not None
    assert node.spec.taints[0].key == "k"


def test_unknown_field_selector_is_a_bad_request(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        core.list_pod_for_all_namespaces(field_selector="spec.bogus=1")
    assert caught.value.status == 400
    assert "not a known field selector" in _body(caught.value)["message"]


def test_pagination_with_limit_and_continue(api: FakeApiServer, core: client.CoreV1Api) -> None:
    for index in range(7):
        api.add(pod_json(f"p{index}", "n1"))
    seen: list[str] = []
    token: str | None = None
    pages = 0
    while True:
        kwargs: dict[str, Any] = {"limit": 3, "_preload_content": False}
        if token:
            kwargs["_continue"] = token
        page = _raw(core.list_pod_for_all_namespaces(**kwargs))
        pages += 1
        seen += _names(page)
        token = page["metadata"].get("continue")
        if not token:
            break
    assert seen == [f"p{i}" for i in range(7)]
    assert pages == 3
    limits = [r.param("limit") for r in api.requests_to("/api/v1/pods")]
    assert limits == ["3", "3", "3"]


def test_pages_are_a_consistent_snapshot_and_expire_with_410(
    api: FakeApiServer, core: client.CoreV1Api
) -> None:
    for index in range(4):
        api.add(pod_json(f"p{index}", "n1"))
    first = _raw(core.list_pod_for_all_namespaces(limit=2, _preload_content=False))
    assert first["metadata"]["remainingItemCount"] == 2
    api.remove("Pod", "p3", "ml")  # a change after the first page does not show in the later pages
    second = _raw(
        core.list_pod_for_all_namespaces(_continue=first["metadata"]["continue"], _preload_content=False)
    )
    assert _names(second) == ["p2", "p3"]

    again = _raw(core.list_pod_for_all_namespaces(limit=1, _preload_content=False))
    api.expire_continue_tokens()
    with pytest.raises(ApiException) as caught:
        core.list_pod_for_all_namespaces(_continue=again["metadata"]["continue"])
    assert caught.value.status == 410
    assert _body(caught.value)["message"] == CONTINUE_EXPIRED
    assert _body(caught.value)["reason"] == "Expired"


def test_list_pdbs_and_get_404(api: FakeApiServer) -> None:
    api.add(pdb_json("budget", {"app": "a"}, 1))
    with api.api_client() as api_client:
        policy = client.PolicyV1Api(api_client)
        listing = _raw(policy.list_pod_disruption_budget_for_all_namespaces(_preload_content=False))
        assert listing["kind"] == "PodDisruptionBudgetList"
        assert _names(listing) == ["budget"]
        with pytest.raises(ApiException) as caught:
            policy.read_namespaced_pod_disruption_budget("missing", "ml")
    assert caught.value.status == 404
    assert _body(caught.value)["message"] == 'poddisruptionbudgets.policy "missing" not found'
    assert caught.value.headers is not None
    assert caught.value.headers["Content-Type"] == "application/json"


def test_label_selector_parser() -> None:
    reqs = parse_label_selector("a=b, c notin (x, y),!d,e,f!=g,h==i")
    labels = {"a": "b", "c": "z", "e": "", "f": "h", "h": "i"}
    assert all(r.matches(labels) for r in reqs)
    assert not all(r.matches({**labels, "d": "1"}) for r in reqs)
    assert [r.op for r in reqs] == ["=", "notin", "!exists", "exists", "!=", "="]


# --------------------------------------------------------------------------- patch


def test_strategic_merge_patch_replaces_taints_and_merges_annotations(
    api: FakeApiServer, core: client.CoreV1Api
) -> None:
    api.add(node_json("n1", taints=[{"key": "old", "effect": "NoSchedule"}]))
    taints = [
        {"key": "old", "effect": "NoSchedule"},
        {"key": "rebalancer.gpu/draining", "value": "c1", "effect": "NoSchedule"},
    ]
    core.patch_node("n1", {"spec": {"taints": taints}})
    assert api.writes()[-1].content_type == "application/strategic-merge-patch+json"
    node = api.node("n1")
    assert node is not None and node["spec"]["taints"] == taints

    core.patch_node("n1", {"spec": {"taints": [{"key": "old", "effect": "NoSchedule"}]}})
    node = api.node("n1")
    assert node is not None and node["spec"]["taints"] == [{"key": "old", "effect": "NoSchedule"}]

    api.add(pod_json("p", "n1", annotations={"keep": "1", "drop": "2"}))
    core.patch_namespaced_pod("p", "ml", {"metadata": {"annotations": {"new": "3", "drop": None}}})
    pod = api.pod("ml", "p")
    assert pod is not None and pod["metadata"]["annotations"] == {"keep": "1", "new": "3"}


def test_merge_and_json_patch(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(node_json("n1"))
    before = api.node("n1")
    assert before is not None
    core.patch_node("n1", {"metadata": {"labels": {"x": "y"}}}, _content_type="application/merge-patch+json")
    assert api.writes()[-1].content_type == "application/merge-patch+json"
    node = api.node("n1")
    assert node is not None and node["metadata"]["labels"]["x"] == "y"
    assert int(node["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])

    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]},
        {"op": "add", "path": "/spec/taints", "value": [{"key": "t", "effect": "NoSchedule"}]},
    ]
    core.patch_node("n1", ops)
    assert api.writes()[-1].content_type == "application/json-patch+json"
    patched = api.node("n1")
    assert patched is not None and patched["spec"]["taints"] == [{"key": "t", "effect": "NoSchedule"}]

    with pytest.raises(ApiException) as caught:
        core.patch_node("n1", ops)  # the resourceVersion moved on: the test op fails
    assert caught.value.status == 422


def test_patch_with_stale_resource_version_conflicts(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(node_json("n1"))
    with pytest.raises(ApiException) as caught:
        core.patch_node("n1", {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}})
    assert caught.value.status == 409


def test_an_update_may_not_change_the_uid_but_may_leave_it_out(
    api: FakeApiServer, core: client.CoreV1Api
) -> None:
    # rest.BeforeUpdate fills a missing uid from the stored object; ValidateObjectMetaUpdate refuses a
    # different one (metadata.uid is immutable), whether it comes in a patch or a PUT.
    api.add(pod_json("p", "n1", uid="uid-old"))
    patch = {"metadata": {"uid": "uid-new", "annotations": {"asked": "yes"}}}
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("p", "ml", patch, _content_type="application/merge-patch+json")
    assert caught.value.status == 422
    body = _body(caught.value)
    assert body["message"] == 'Pod "p" is invalid: metadata.uid: Invalid value: "uid-new": field is immutable'
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "uid-new": field is immutable',
            "field": "metadata.uid",
        }
    ]
    pod = api.pod("ml", "p")
    assert pod is not None and "asked" not in (pod["metadata"].get("annotations") or {})

    replaced = copy.deepcopy(pod)
    replaced["metadata"]["uid"] = "uid-new"
    with pytest.raises(ApiException) as caught:
        core.replace_namespaced_pod("p", "ml", client.V1Pod.model_validate(replaced))
    assert caught.value.status == 422

    unnamed = copy.deepcopy(pod)
    del unnamed["metadata"]["uid"]
    unnamed["metadata"]["labels"] = {"kept": "uid"}
    core.replace_namespaced_pod("p", "ml", client.V1Pod.model_validate(unnamed))
    core.patch_namespaced_pod("p", "ml", {"metadata": {"uid": "uid-old", "annotations": {"asked": "yes"}}})
    stored = api.pod("ml", "p")
    assert stored is not None
    assert (stored["metadata"]["uid"], stored["metadata"]["labels"], stored["metadata"]["annotations"]) == (
        "uid-old",
        {"kept": "uid"},
        {"asked": "yes"},
    )


def test_strategic_merge_patch_directives() -> None:
    current = {
        "metadata": {"finalizers": ["a"]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    patch = {
        "metadata": {"finalizers": ["b"]},
        "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "X", "status": "True"}]},
    }
    merged = strategic_merge_patch(current, patch)
    assert merged["metadata"]["finalizers"] == ["a", "b"]
    assert merged["status"]["conditions"] == [
        {"type": "Ready", "status": "False"},
        {"type": "X", "status": "True"},
    ]
    deleted = strategic_merge_patch(merged, {"status": {"conditions": [{"type": "X", "$patch": "delete"}]}})
    assert deleted["status"]["conditions"] == [{"type": "Ready", "status": "False"}]
    assert json_patch({"a": [1, 2]}, [{"op": "remove", "path": "/a/0"}]) == {"a": [2]}


# --------------------------------------------------------------------------- events and leases


def test_events_core_and_events_k8s_io(api: FakeApiServer, core: client.CoreV1Api) -> None:
    regarding = client.V1ObjectReference(kind="Pod", name="p", namespace="ml")
    core.create_namespaced_event(
        "ml",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name="p."),
            involved_object=regarding,
            reason="GpuRebalancerIdleGpu",
            message="idle",
            type="Normal",
        ),
    )
    with api.api_client() as api_client:
        client.EventsV1Api(api_client).create_namespaced_event(
            "ml",
            client.EventsV1Event(
                metadata=client.V1ObjectMeta(name="e2"),
                event_time=datetime(2026, 11, 29, 12, tzinfo=UTC),
                reporting_controller="gpu-rebalancer",
                reporting_instance="r-1",
                action="Evict",
                reason="GpuRebalancerIdleGpu",
                regarding=regarding,
                type="Normal",
            ),
        )
    reasons = sorted((e["apiVersion"], e["reason"]) for e in api.events())
    assert reasons == [("events.k8s.io/v1", "GpuRebalancerIdleGpu"), ("v1", "GpuRebalancerIdleGpu")]
    found = core.list_namespaced_event("ml", field_selector="involvedObject.name=p")
    assert len(found.items) == 1


def test_lease_get_create_update_patch(api: FakeApiServer) -> None:
    with api.api_client() as api_client:
        leases = client.CoordinationV1Api(api_client)
        with pytest.raises(ApiException) as missing:
            leases.read_namespaced_lease("rebalancer", "kube-system")
        assert missing.value.status == 404
        created = leases.create_namespaced_lease(
            "kube-system",
            client.V1Lease(
                metadata=client.V1ObjectMeta(name="rebalancer"),
                spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15),
            ),
        )
        with pytest.raises(ApiException) as exists:
            leases.create_namespaced_lease(
                "kube-system", client.V1Lease(metadata=client.V1ObjectMeta(name="rebalancer"))
            )
        assert exists.value.status == 409
        assert _body(exists.value)["reason"] == "AlreadyExists"

        current = leases.read_namespaced_lease("rebalancer", "kube-system")
        assert current.spec is not None and created.metadata is not None
        current.spec.holder_identity = "b"
        leases.replace_namespaced_lease("rebalancer", "kube-system", current)
        stale = client.V1Lease(
            metadata=client.V1ObjectMeta(
                name="rebalancer", resource_version=created.metadata.resource_version
            ),
            spec=client.V1LeaseSpec(holder_identity="c"),
        )
        with pytest.raises(ApiException) as conflict:
            leases.replace_namespaced_lease("rebalancer", "kube-system", stale)
        assert conflict.value.status == 409
        leases.patch_namespaced_lease("rebalancer", "kube-system", {"spec": {"leaseTransitions": 1}})
    lease = api.get("Lease", "rebalancer", "kube-system")
    assert lease is not None
    assert lease["spec"] == {"holderIdentity": "b", "leaseDurationSeconds": 15, "leaseTransitions": 1}


# --------------------------------------------------------------------------- eviction


def test_eviction_without_pdb_deletes_the_pod(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(pod_json("p", "n1"))
    response = _evict(core, "p")
    assert response.status == 201
    assert _raw(response)["status"] == "Success"
    assert api.pod("ml", "p") is None


NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _pod_events(api: FakeApiServer, since: str) -> list[tuple[str, str | None, list[str]]]:
    """The pod watch events after `since`: (type, deletionTimestamp, condition types)."""
    events = api.watch(
        "/api/v1/pods", {"watch": ("1",), "resourceVersion": (since,), "timeoutSeconds": ("0.3",)}
    )
    return [
        (
            e["type"],
            e["object"]["metadata"].get("deletionTimestamp"),
            [c["type"] for c in (e["object"].get("status") or {}).get("conditions") or ()],
        )
        for e in events
        if e["type"] != "BOOKMARK"
    ]


def _termination(pod: dict[str, Any]) -> tuple[str, int]:
    """When a terminating pod's grace period ends, and how long it is."""
    return pod["metadata"]["deletionTimestamp"], pod["metadata"]["deletionGracePeriodSeconds"]


def test_an_evicted_pod_is_marked_disrupted_and_terminates_gracefully() -> None:
    # addConditionAndDeletePod: the DisruptionTarget condition, then a graceful delete (the pod's
    # terminationGracePeriodSeconds); the pod stays, terminating, until its kubelet confirms.
    with FakeApiServer(clock=lambda: NOW, kubelet="manual") as api, api.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        pod = pod_json("p", "n1")
        pod["spec"]["terminationGracePeriodSeconds"] = 45
        since = api.add(pod)["metadata"]["resourceVersion"]
        assert _evict(core, "p").status == 201
        stored = api.pod("ml", "p")
        assert stored is not None
        assert _termination(stored) == ("2026-03-01T12:00:45Z", 45)
        [condition] = [c for c in stored["status"]["conditions"] if c["type"] == "DisruptionTarget"]
        assert condition == {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
            "lastTransitionTime": "2026-03-01T12:00:00Z",
        }
        assert _pod_events(api, since) == [
            ("MODIFIED", None, ["Ready", "DisruptionTarget"]),
            ("MODIFIED", "2026-03-01T12:00:45Z", ["Ready", "DisruptionTarget"]),
        ]
        # Evicting it again skips the budgets (it is terminating) and changes nothing.
        rv = stored["metadata"]["resourceVersion"]
        assert _evict(core, "p").status == 201
        again = api.pod("ml", "p")
        assert again is not None and again["metadata"]["resourceVersion"] == rv
        assert api.finish_terminating() == [("ml", "p")]
        assert api.pod("ml", "p") is None


def test_a_prompt_kubelet_ends_a_terminating_pod_at_once() -> None:
    with FakeApiServer(clock=lambda: NOW) as api, api.api_client() as api_client:
        since = api.add(pod_json("p", "n1"))["metadata"]["resourceVersion"]
        _evict(client.CoreV1Api(api_client), "p")
        assert api.pod("ml", "p") is None
        assert _pod_events(api, since) == [
            ("MODIFIED", None, ["Ready", "DisruptionTarget"]),
            ("MODIFIED", "2026-03-01T12:00:30Z", ["Ready", "DisruptionTarget"]),
            ("DELETED", "2026-03-01T12:00:30Z", ["Ready", "DisruptionTarget"]),
        ]


def test_which_deletes_are_graceful() -> None:
    # podStrategy.CheckGracefulDelete and rest.BeforeDelete: the grace period asked, else the pod's
    # (30 s by default); none for a pod on no node or one that has ended; a later delete may only
    # shorten it, and one of 0 ends it at once.
    with FakeApiServer(clock=lambda: NOW, kubelet="manual") as api, api.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        api.add(pod_json("bound", "n1"))
        api.add(pod_json("unbound", None, phase="Pending"))
        api.add(pod_json("done", "n1", phase="Succeeded"))
        api.add(pod_json("now", "n1"))
        for name in ("bound", "unbound", "done"):
            core.delete_namespaced_pod(name, "ml")
        core.delete_namespaced_pod("now", "ml", grace_period_seconds=0)
        assert [p["metadata"]["name"] for p in api.objects("Pod")] == ["bound"]
        terminating = api.pod("ml", "bound")
        assert terminating is not None
        assert _termination(terminating) == ("2026-03-01T12:00:30Z", 30)
        # A delete is no eviction: no DisruptionTarget condition.
        assert [c["type"] for c in terminating["status"]["conditions"]] == ["Ready"]

        core.delete_namespaced_pod("bound", "ml", grace_period_seconds=10)
        shorter = api.pod("ml", "bound")
        assert shorter is not None
        assert _termination(shorter) == ("2026-03-01T12:00:10Z", 10)
        core.delete_namespaced_pod("bound", "ml", grace_period_seconds=20)
        kept = api.pod("ml", "bound")
        assert (
            kept is not None and kept["metadata"]["resourceVersion"] == shorter["metadata"]["resourceVersion"]
        )
        core.delete_namespaced_pod("bound", "ml", grace_period_seconds=0)
        assert api.objects("Pod") == []


def test_eviction_of_a_missing_pod_is_404(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        _evict(core, "gone")
    assert caught.value.status == 404
    assert _body(caught.value)["message"] == 'pods "gone" not found'


def test_eviction_uid_precondition_is_409(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(pod_json("p", "n1", uid="new-uid"))
    with pytest.raises(ApiException) as caught:
        _evict(core, "p", uid="old-uid")
    assert caught.value.status == 409
    assert "UID in precondition: old-uid, UID in object meta: new-uid" in _body(caught.value)["message"]
    assert api.pod("ml", "p") is not None
    _evict(core, "p", uid="new-uid")
    assert api.pod("ml", "p") is None


def test_eviction_spends_the_pdb_before_the_uid_precondition_fails(
    api: FakeApiServer, core: client.CoreV1Api
) -> None:
    # EvictionREST.Create decrements the budget (checkAndDecrement) before it deletes; the uid
    # precondition is checked by that delete, so a re-created pod's 409 comes after the budget is spent.
    api.add(pdb_json("train-pdb", {"app": "train"}, 1, desired_healthy=2))
    api.add(pod_json("p", "n1", uid="uid-new", labels={"app": "train"}))
    with pytest.raises(ApiException) as caught:
        _evict(core, "p", uid="uid-old")
    assert caught.value.status == 409
    pdb = api.pdb("ml", "train-pdb")
    assert pdb is not None and pdb["status"]["disruptionsAllowed"] == 0
    assert "p" in pdb["status"]["disruptedPods"]
    assert api.pod("ml", "p") is not None


def test_a_not_ready_pods_failed_uid_precondition_is_a_429_to_retry(
    api: FakeApiServer, core: client.CoreV1Api
) -> None:
    # A not-ready pod the budget can spare is deleted with a resourceVersion precondition; its conflict
    # is answered with createTooManyRequestsError, the budget "still being processed" (Retry-After 10).
    api.add(pdb_json("train-pdb", {"app": "train"}, 0, desired_healthy=1, current_healthy=1))
    api.add(pod_json("p", "n1", uid="uid-new", labels={"app": "train"}, ready=False))
    with pytest.raises(ApiException) as caught:
        _evict(core, "p", uid="uid-old")
    assert caught.value.status == 429
    assert caught.value.headers is not None
    assert caught.value.headers["Retry-After"] == "10"
    assert _body(caught.value)["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget train-pdb is still being processed by the server.",
        }
    ]
    assert api.pod("ml", "p") is not None


def test_eviction_spends_the_pdb_then_429(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(pdb_json("train-pdb", {"app": "train"}, 1, desired_healthy=2))
    api.add(pod_json("a", "n1", labels={"app": "train"}))
    api.add(pod_json("b", "n1", labels={"app": "train"}))
    _evict(core, "a")
    pdb = api.pdb("ml", "train-pdb")
    assert pdb is not None and pdb["status"]["disruptionsAllowed"] == 0
    assert "a" in pdb["status"]["disruptedPods"]

    with pytest.raises(ApiException) as caught:
        _evict(core, "b")
    assert caught.value.status == 429
    body = _body(caught.value)
    assert body["message"] == EVICTION_REFUSED
    assert body["reason"] == "TooManyRequests"
    assert body["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget train-pdb needs 2 healthy pods and has 3 currently",
        }
    ]
    assert api.pod("ml", "b") is not None


def test_eviction_with_two_matching_pdbs_is_500(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(pdb_json("one", {"app": "train"}, 5))
    api.add(pdb_json("two", {}, 5))
    api.add(pdb_json("elsewhere", {"app": "train"}, 0, namespace="other"))
    api.add(pod_json("p", "n1", labels={"app": "train"}))
    with pytest.raises(ApiException) as caught:
        _evict(core, "p")
    assert caught.value.status == 500
    assert _body(caught.value)["message"] == MULTIPLE_PDBS


def test_pending_and_unready_pods_skip_the_budget(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(pdb_json("pdb", {"app": "train"}, 0, desired_healthy=1, current_healthy=1))
    api.add(pod_json("pending", None, labels={"app": "train"}, phase="Pending"))
    api.add(pod_json("unready", "n1", labels={"app": "train"}, ready=False))
    _evict(core, "pending")
    _evict(core, "unready")
    assert api.objects("Pod") == []
    pdb = api.pdb("ml", "pdb")
    assert pdb is not None and pdb["status"]["disruptionsAllowed"] == 0


def test_dry_run_eviction_changes_nothing(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(pdb_json("pdb", {"app": "train"}, 1))
    api.add(pod_json("p", "n1", labels={"app": "train"}))
    api.add(pod_json("q", "n1", labels={"app": "train"}))
    response = _evict(core, "p", dry_run="All")
    assert response.status == 201
    _evict(core, "q", options_dry_run=True)
    assert api.pod("ml", "p") is not None and api.pod("ml", "q") is not None
    pdb = api.pdb("ml", "pdb")
    assert pdb is not None and pdb["status"]["disruptionsAllowed"] == 1

    api.add(pdb_json("pdb", {"app": "train"}, 0))
    with pytest.raises(ApiException) as caught:  # a dry run still runs the PDB check
        _evict(core, "p", dry_run="All")
    assert caught.value.status == 429


def test_dry_run_patch_and_delete_change_nothing(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(node_json("n1"))
    api.add(pod_json("p", "n1"))
    core.patch_node("n1", {"spec": {"unschedulable": True}}, dry_run="All")
    core.delete_namespaced_pod("p", "ml", dry_run="All")
    node = api.node("n1")
    assert node is not None and "unschedulable" not in node["spec"]
    assert api.pod("ml", "p") is not None


# --------------------------------------------------------------------------- request log and faults


def test_requests_are_recorded(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(pod_json("p", "n1"))
    core.list_namespaced_pod("ml", label_selector="app=p")
    _evict(core, "p", uid="uid-ml-p")
    first, second = api.requests
    assert (first.method, first.path, first.param("labelSelector"), first.is_write) == (
        "GET",
        "/api/v1/namespaces/ml/pods",
        "app=p",
        False,
    )
    assert second.method == "POST" and second.path == "/api/v1/namespaces/ml/pods/p/eviction"
    assert second.body["deleteOptions"]["preconditions"]["uid"] == "uid-ml-p"
    assert api.writes() == [second]
    api.clear_requests()
    assert api.requests == []


def test_injected_status_applies_to_the_next_n_requests(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(node_json("n1"))
    api.inject("/api/v1/nodes*", status=503, times=2)
    for _ in range(2):
        with pytest.raises(ApiException) as caught:
            core.list_node()
        assert caught.value.status == 503
        assert _body(caught.value)["reason"] == "ServiceUnavailable"
    assert len(core.list_node().items) == 1
    assert [r.fault for r in api.requests] == ["status=503", "status=503", None]


def test_injected_delay_times_out_the_client(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(pod_json("p", "n1"))
    api.inject("*/eviction", delay=1.0, method="POST")
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        _evict(core, "p", timeout=0.2)
    # The delayed request is then served: the fake is a server, not a transaction log.


def test_injected_drop_closes_the_connection(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.add(pod_json("p", "n1"))
    api.inject("*/eviction", drop=True)
    with pytest.raises(urllib3.exceptions.ProtocolError):
        _evict(core, "p")
    assert api.pod("ml", "p") is not None
    _evict(core, "p")
    assert api.pod("ml", "p") is None


def test_every_answer_is_json(api: FakeApiServer) -> None:
    http = urllib3.PoolManager()
    for path in ("/api/v1/nodes", "/nope", "/api/v1/namespaces/ml/widgets", "/version"):
        response = http.request("GET", api.url + path)
        assert response.headers["Content-Type"] == "application/json"
        json.loads(response.data)
    bad = http.request("POST", api.url + "/api/v1/namespaces/ml/pods", body=b"{not json")
    assert bad.status == 400
    assert bad.headers["Content-Type"] == "application/json"


# --------------------------------------------------------------------------- controllers and custom kinds


def test_controller_kinds_are_listed_read_created_and_deleted(api: FakeApiServer) -> None:
    api.add(controller_json("Deployment", "serve", replicas=2))
    api.add(controller_json("ReplicaSet", "serve-5f", owner=("Deployment", "serve")))
    api.add(controller_json("StatefulSet", "nb", namespace="notebooks"))
    api.add(controller_json("CronJob", "nightly"))
    with api.api_client() as api_client:
        apps, batch = client.AppsV1Api(api_client), client.BatchV1Api(api_client)
        listing = _raw(apps.list_deployment_for_all_namespaces(_preload_content=False))
        assert (listing["kind"], listing["apiVersion"], _names(listing)) == (
            "DeploymentList",
            "apps/v1",
            ["serve"],
        )
        assert "kind" not in listing["items"][0]
        (rs,) = apps.list_namespaced_replica_set("ml").items
        owners = _meta(rs).owner_references
        assert owners is not None and owners[0].kind == "Deployment"
        assert [_meta(s).name for s in apps.list_stateful_set_for_all_namespaces().items] == ["nb"]
        assert apps.list_namespaced_stateful_set("ml").items == []
        assert apps.read_namespaced_deployment("serve", "ml").spec.replicas == 2
        job = client.V1Job(
            metadata=client.V1ObjectMeta(name="nightly-1", namespace="ml"),
            spec=client.V1JobSpec(
                suspend=False,
                template=client.V1PodTemplateSpec(
                    spec=client.V1PodSpec(
                        containers=[client.V1Container(name="main", image="x")], restart_policy="Never"
                    )
                ),
            ),
        )
        batch.create_namespaced_job("ml", job)
        assert [_meta(j).name for j in batch.list_job_for_all_namespaces().items] == ["nightly-1"]
        assert batch.read_namespaced_cron_job("nightly", "ml").spec.schedule == "0 2 * * *"
        batch.delete_namespaced_job("nightly-1", "ml")
        with pytest.raises(ApiException) as caught:
            batch.read_namespaced_job("nightly-1", "ml")
    assert caught.value.status == 404
    assert _body(caught.value)["message"] == 'jobs.batch "nightly-1" not found'
    assert api.get("Deployment", "serve", "ml") is not None  # the helpers find a kind by its name


def test_a_job_is_suspended_by_a_patch(api: FakeApiServer) -> None:
    stored = api.add(controller_json("Job", "train", suspend=False))
    with api.api_client() as api_client:
        batch = client.BatchV1Api(api_client)
        batch.patch_namespaced_job("train", "ml", {"spec": {"suspend": True}})
        assert api.writes()[-1].content_type == "application/strategic-merge-patch+json"
        stale = {
            "metadata": {"resourceVersion": stored["metadata"]["resourceVersion"]},
            "spec": {"suspend": False},
        }
        with pytest.raises(ApiException) as caught:
            batch.patch_namespaced_job("train", "ml", stale)
    assert caught.value.status == 409
    assert _body(caught.value)["message"] == (
        'Operation cannot be fulfilled on jobs.batch "train": the object has been modified; please apply '
        "your changes to the latest version and try again"
    )
    job = api.get("Job", "train", "ml", "batch/v1")
    assert job is not None and job["spec"]["suspend"] is True
    assert int(job["metadata"]["resourceVersion"]) > int(stored["metadata"]["resourceVersion"])
    assert job["spec"]["template"] == stored["spec"]["template"]


def test_custom_kinds_are_served_as_custom_resources(api: FakeApiServer) -> None:
    api.add(controller_json("Notebook", "alice"))
    api.add(controller_json("JobSet", "train", suspend=False))
    api.add(controller_json("InferenceService", "llm", namespace="serving"))
    with api.api_client() as api_client:
        custom = client.CustomObjectsApi(api_client)
        listing = _custom(custom.list_namespaced_custom_object("kubeflow.org", "v1", "ml", "notebooks"))
        assert listing["kind"] == "NotebookList" and listing["apiVersion"] == "kubeflow.org/v1"
        # Unstructured list items keep their apiVersion and kind (typed Lists' do not).
        assert [(i["apiVersion"], i["kind"]) for i in listing["items"]] == [("kubeflow.org/v1", "Notebook")]
        every = _custom(
            custom.list_cluster_custom_object("serving.kserve.io", "v1beta1", "inferenceservices")
        )
        assert [i["metadata"]["namespace"] for i in every["items"]] == ["serving"]

        stop = {"metadata": {"annotations": {"kubeflow-resource-stopped": "2026-11-29T12:00:00Z"}}}
        custom.patch_namespaced_custom_object("kubeflow.org", "v1", "ml", "notebooks", "alice", stop)
        assert api.writes()[-1].content_type == "application/merge-patch+json"
        with pytest.raises(ApiException) as strategic:
            custom.patch_namespaced_custom_object(
                "kubeflow.org", "v1", "ml", "notebooks", "alice", stop,
                _content_type="application/strategic-merge-patch+json",
            )  # fmt: skip
        suspend = [{"op": "replace", "path": "/spec/suspend", "value": True}]
        custom.patch_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "ml", "jobsets", "train", suspend,
            _content_type="application/json-patch+json",
        )  # fmt: skip

        current = _custom(
            custom.get_namespaced_custom_object("kubeflow.org", "v1", "ml", "notebooks", "alice")
        )
        unversioned = copy.deepcopy(current)
        del unversioned["metadata"]["resourceVersion"]
        with pytest.raises(ApiException) as unconditional:
            custom.replace_namespaced_custom_object(
                "kubeflow.org", "v1", "ml", "notebooks", "alice", unversioned
            )
        custom.replace_namespaced_custom_object("kubeflow.org", "v1", "ml", "notebooks", "alice", current)
        custom.delete_namespaced_custom_object(
            "serving.kserve.io", "v1beta1", "serving", "inferenceservices", "llm"
        )
    assert strategic.value.status == 415
    assert _body(strategic.value)["message"] == (
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    )
    assert unconditional.value.status == 422
    assert _body(unconditional.value)["message"] == (
        'notebooks.kubeflow.org "alice" is invalid: metadata.resourceVersion: Invalid value: 0x0: '
        "must be specified for an update"
    )
    notebook = api.get("Notebook", "alice", "ml")
    assert notebook is not None
    assert notebook["metadata"]["annotations"] == {"kubeflow-resource-stopped": "2026-11-29T12:00:00Z"}
    jobset = api.get("JobSet", "train", "ml")
    assert jobset is not None and jobset["spec"]["suspend"] is True
    assert api.objects("InferenceService", "serving.kserve.io/v1beta1") == []


# --------------------------------------------------------------------------- the scale subresource


def test_a_deployments_scale_is_read_and_patched(api: FakeApiServer) -> None:
    stored = api.add(controller_json("Deployment", "serve", replicas=3))
    with api.api_client() as api_client:
        apps = client.AppsV1Api(api_client)
        raw = _raw(apps.read_namespaced_deployment_scale("serve", "ml", _preload_content=False))
        assert raw == {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": "serve",
                "namespace": "ml",
                "uid": "uid-owner-serve",
                "resourceVersion": stored["metadata"]["resourceVersion"],
                "creationTimestamp": "2026-11-28T11:59:00Z",
            },
            "spec": {"replicas": 3},
            "status": {"replicas": 3, "selector": "app=serve"},
        }
        scaled = apps.patch_namespaced_deployment_scale("serve", "ml", {"spec": {"replicas": 0}})
        assert api.writes()[-1].path == "/apis/apps/v1/namespaces/ml/deployments/serve/scale"
        assert api.writes()[-1].content_type == "application/strategic-merge-patch+json"
        after_smp = api.get("Deployment", "serve", "ml")
        apps.patch_namespaced_deployment_scale(
            "serve", "ml", {"spec": {"replicas": 1}}, _content_type="application/merge-patch+json"
        )
        apps.patch_namespaced_deployment_scale(
            "serve", "ml", [{"op": "replace", "path": "/spec/replicas", "value": 2}]
        )
        assert api.writes()[-1].content_type == "application/json-patch+json"
    assert after_smp is not None and after_smp["spec"]["replicas"] == 0
    assert scaled.spec is not None and scaled.metadata is not None
    assert (
        scaled.spec.replicas == 0
        and scaled.metadata.resource_version == after_smp["metadata"]["resourceVersion"]
    )
    assert int(after_smp["metadata"]["resourceVersion"]) > int(stored["metadata"]["resourceVersion"])
    final = api.get("Deployment", "serve", "ml")
    assert final is not None and final["spec"]["replicas"] == 2
    # Only spec.replicas changed: the rest of the object, status included, is what it was.
    assert {**final, "metadata": {}, "spec": {**final["spec"], "replicas": 3}} == {**stored, "metadata": {}}
    # So is its metadata, but what the registry moves on: the resourceVersion, and the generation once
    # for each of the three changes of the replicas (through the Deployment's strategy).
    assert final["metadata"]["generation"] == stored["metadata"]["generation"] + 3
    assert {k: v for k, v in final["metadata"].items() if k not in ("resourceVersion", "generation")} == {
        k: v for k, v in stored["metadata"].items() if k not in ("resourceVersion", "generation")
    }


def test_a_stale_scale_conflicts_and_an_unversioned_one_replaces(api: FakeApiServer) -> None:
    stored = api.add(controller_json("StatefulSet", "nb", replicas=1))
    first = stored["metadata"]["resourceVersion"]

    def scale(replicas: int, resource_version: str | None) -> client.V1Scale:
        return client.V1Scale(
            metadata=client.V1ObjectMeta(name="nb", namespace="ml", resource_version=resource_version),
            spec=client.V1ScaleSpec(replicas=replicas),
        )

    with api.api_client() as api_client:
        apps = client.AppsV1Api(api_client)
        done = apps.replace_namespaced_stateful_set_scale("nb", "ml", scale(0, first))
        assert done.metadata is not None and done.spec is not None
        second = done.metadata.resource_version
        assert second != first and done.spec.replicas == 0
        with pytest.raises(ApiException) as stale:
            apps.replace_namespaced_stateful_set_scale("nb", "ml", scale(1, first))
        with pytest.raises(ApiException) as stale_patch:
            apps.patch_namespaced_stateful_set_scale(
                "nb", "ml", {"metadata": {"resourceVersion": first}, "spec": {"replicas": 1}}
            )
        assert (api.get("StatefulSet", "nb", "ml") or {})["spec"]["replicas"] == 0
        # No resourceVersion: the registry replaces whatever is there (deployments, statefulsets and
        # replicasets allow unconditional updates).
        unconditional = apps.replace_namespaced_stateful_set_scale("nb", "ml", scale(4, None))
        assert unconditional.spec is not None and unconditional.metadata is not None
        assert unconditional.spec.replicas == 4 and unconditional.metadata.resource_version != second
    for caught in (stale, stale_patch):
        assert caught.value.status == 409
        body = _body(caught.value)
        assert body["reason"] == "Conflict"
        assert body["message"] == (
            'Operation cannot be fulfilled on statefulsets.apps "nb": the object has been modified; please '
            "apply your changes to the latest version and try again"
        )
        assert body["details"] == {"name": "nb", "group": "apps", "kind": "statefulsets"}
    assert (api.get("StatefulSet", "nb", "ml") or {})["spec"]["replicas"] == 4


def test_the_scale_of_a_missing_parent_is_404(api: FakeApiServer) -> None:
    api.add(controller_json("Job", "train"))
    with api.api_client() as api_client:
        apps = client.AppsV1Api(api_client)
        calls: list[Callable[[], object]] = [
            lambda: apps.read_namespaced_deployment_scale("gone", "ml"),
            lambda: apps.patch_namespaced_deployment_scale("gone", "ml", {"spec": {"replicas": 0}}),
            lambda: apps.replace_namespaced_stateful_set_scale(
                "gone",
                "ml",
                client.V1Scale(
                    metadata=client.V1ObjectMeta(name="gone"), spec=client.V1ScaleSpec(replicas=0)
                ),
            ),
            lambda: apps.patch_namespaced_replica_set_scale("gone", "ml", {"spec": {"replicas": 0}}),
        ]
        errors = []
        for call in calls:
            with pytest.raises(ApiException) as caught:
                call()
            errors.append(caught.value)
        http = urllib3.PoolManager()
        no_scale = http.request("GET", api.url + "/apis/batch/v1/namespaces/ml/jobs/train/scale")
    assert [e.status for e in errors] == [404, 404, 404, 404]
    assert [_body(e)["message"] for e in errors] == [
        'deployments.apps "gone" not found',
        'deployments.apps "gone" not found',
        'statefulsets.apps "gone" not found',
        'replicasets.apps "gone" not found',
    ]
    assert _body(errors[0])["details"] == {"name": "gone", "group": "apps", "kind": "deployments"}
    assert no_scale.status == 404  # a Job has no scale subresource


def test_negative_replicas_are_invalid(api: FakeApiServer) -> None:
    api.add(controller_json("ReplicaSet", "serve-5f", replicas=2))
    api.add(controller_json("LeaderWorkerSet", "lws", replicas=2))
    with api.api_client() as api_client:
        apps, custom = client.AppsV1Api(api_client), client.CustomObjectsApi(api_client)
        with pytest.raises(ApiException) as builtin:
            apps.patch_namespaced_replica_set_scale("serve-5f", "ml", {"spec": {"replicas": -1}})
        with pytest.raises(ApiException) as crd:
            custom.patch_namespaced_custom_object_scale(
                "leaderworkerset.x-k8s.io", "v1", "ml", "leaderworkersets", "lws", {"spec": {"replicas": -1}}
            )
    assert builtin.value.status == 422
    assert _body(builtin.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Scale.autoscaling "serve-5f" is invalid: spec.replicas: Invalid value: -1: '
        "must be greater than or equal to 0",
        "reason": "Invalid",
        "details": {
            "name": "serve-5f",
            "group": "autoscaling",
            "kind": "Scale",
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "message": "Invalid value: -1: must be greater than or equal to 0",
                    "field": "spec.replicas",
                }
            ],
        },
        "code": 422,
    }
    assert crd.value.status == 422
    assert _body(crd.value)["message"] == (
        'LeaderWorkerSet.leaderworkerset.x-k8s.io "lws" is invalid: .spec.replicas: Invalid value: -1: '
        "should be a non-negative integer"
    )
    assert [o["spec"]["replicas"] for o in api.objects("ReplicaSet", "apps/v1")] == [2]
    assert api.writes()[-1].path.endswith("/leaderworkersets/lws/scale")


def test_a_leaderworkersets_scale_is_its_crds(api: FakeApiServer) -> None:
    api.add(controller_json("LeaderWorkerSet", "lws"))  # spec.replicas defaulted to 1
    with api.api_client() as api_client:
        custom = client.CustomObjectsApi(api_client)
        args = ("leaderworkerset.x-k8s.io", "v1", "ml", "leaderworkersets", "lws")
        scale = _custom(custom.get_namespaced_custom_object_scale(*args))
        custom.patch_namespaced_custom_object_scale(*args, {"spec": {"replicas": 0}})
        assert api.writes()[-1].content_type == "application/merge-patch+json"
        with pytest.raises(ApiException) as strategic:
            custom.patch_namespaced_custom_object_scale(
                *args, {"spec": {"replicas": 1}}, _content_type="application/strategic-merge-patch+json"
            )
    assert scale["spec"] == {"replicas": 1}
    assert scale["status"] == {
        "replicas": 1,
        "selector": "leaderworkerset.sigs.k8s.io/name=lws,leaderworkerset.sigs.k8s.io/worker-index=0",
    }
    assert strategic.value.status == 415
    assert (api.get("LeaderWorkerSet", "lws", "ml") or {})["spec"]["replicas"] == 0


def test_a_dry_run_scale_changes_nothing(api: FakeApiServer) -> None:
    stored = api.add(controller_json("Deployment", "serve", replicas=3))
    with api.api_client() as api_client:
        answer = client.AppsV1Api(api_client).patch_namespaced_deployment_scale(
            "serve", "ml", {"spec": {"replicas": 0}}, dry_run="All"
        )
    assert answer.spec is not None
    assert answer.spec.replicas == 0
    assert api.get("Deployment", "serve", "ml") == stored


def test_selector_strings_are_apimachinerys() -> None:
    assert selector_string(None) == "" and selector_string({}) == ""
    selector = {
        "matchLabels": {"tier": "gpu", "app": "serve"},
        "matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["b", "a"]},
            {"key": "canary", "operator": "DoesNotExist"},
            {"key": "env", "operator": "NotIn", "values": ["dev"]},
            {"key": "team", "operator": "Exists"},
        ],
    }
    assert selector_string(selector) == "app=serve,!canary,env notin (dev),team,tier=gpu,zone in (a,b)"


# --------------------------------------------------------------------------- metadata.generation


def _send(api: FakeApiServer, method: str, path: str, body: object) -> dict[str, Any]:
    """A request as any client sends it (a PATCH is a JSON merge patch); the object answered."""
    ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
    response = urllib3.PoolManager().request(
        method, api.url + path, body=json.dumps(body).encode(), headers={"Content-Type": ctype}
    )
    assert response.status in (200, 201), response.data
    answer: dict[str, Any] = json.loads(response.data)
    return answer


def _generation(obj: dict[str, Any] | None) -> int | None:
    assert obj is not None
    generation: int | None = obj["metadata"].get("generation")
    return generation


def _pod_at_generation_1() -> dict[str, Any]:
    pod = pod_json("p", "n1")
    pod["metadata"]["generation"] = 1  # as PrepareForCreate leaves a pod (pod_json's have none)
    return pod


_APPS = "/apis/apps/v1/namespaces/ml"
_BATCH = "/apis/batch/v1/namespaces/ml"
_IDLE = {"metadata": {"annotations": {"rebalancer.gpu/idle-since": "2026-11-29T12:00:00Z"}}}
_LABEL = {"metadata": {"labels": {"team": "vision"}}}
_SUSPEND = {"spec": {"suspend": True}}
_IMAGE = {"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "new:2"}]}}}}

# (what is stored, where it is patched, the merge patch, the generation after): each kind's
# PrepareForUpdate, the stored generation being 1.
GENERATION_CASES: dict[str, tuple[dict[str, Any], str, dict[str, Any], int | None]] = {
    # apps/deployment: "annotation updates bump the generation", and spec updates
    "Deployment annotations": (controller_json("Deployment", "w"), f"{_APPS}/deployments/w", _IDLE, 2),
    "Deployment spec": (controller_json("Deployment", "w"), f"{_APPS}/deployments/w", _IMAGE, 2),
    "Deployment labels": (controller_json("Deployment", "w"), f"{_APPS}/deployments/w", _LABEL, 1),
    # the spec only
    "StatefulSet annotations": (controller_json("StatefulSet", "w"), f"{_APPS}/statefulsets/w", _IDLE, 1),
    "StatefulSet spec": (controller_json("StatefulSet", "w"), f"{_APPS}/statefulsets/w", _IMAGE, 2),
    "ReplicaSet annotations": (controller_json("ReplicaSet", "w"), f"{_APPS}/replicasets/w", _IDLE, 1),
    "ReplicaSet spec": (
        controller_json("ReplicaSet", "w"),
        f"{_APPS}/replicasets/w",
        {"spec": {"minReadySeconds": 10}},
        2,
    ),
    "Job annotations": (controller_json("Job", "w", suspend=False), f"{_BATCH}/jobs/w", _IDLE, 1),
    "Job suspend": (controller_json("Job", "w", suspend=False), f"{_BATCH}/jobs/w", _SUSPEND, 2),
    "CronJob labels": (controller_json("CronJob", "w"), f"{_BATCH}/cronjobs/w", _LABEL, 1),
    "CronJob suspend": (controller_json("CronJob", "w"), f"{_BATCH}/cronjobs/w", _SUSPEND, 2),
    "PodDisruptionBudget annotations": (
        pdb_json("b", {"app": "w"}, 1),
        "/apis/policy/v1/namespaces/ml/poddisruptionbudgets/b",
        _IDLE,
        1,
    ),
    "PodDisruptionBudget spec": (
        pdb_json("b", {"app": "w"}, 1),
        "/apis/policy/v1/namespaces/ml/poddisruptionbudgets/b",
        {"spec": {"minAvailable": 2}},
        2,
    ),
    "Pod annotations": (_pod_at_generation_1(), "/api/v1/namespaces/ml/pods/p", _IDLE, 1),
    "Pod spec": (
        _pod_at_generation_1(),
        "/api/v1/namespaces/ml/pods/p",
        {"spec": {"activeDeadlineSeconds": 60}},
        2,
    ),
    # custom resources: anything but metadata
    "JobSet annotations": (
        controller_json("JobSet", "w", suspend=False),
        "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/w",
        _IDLE,
        1,
    ),
    "JobSet suspend": (
        controller_json("JobSet", "w", suspend=False),
        "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/w",
        _SUSPEND,
        2,
    ),
    "LeaderWorkerSet annotations": (
        controller_json("LeaderWorkerSet", "w"),
        "/apis/leaderworkerset.x-k8s.io/v1/namespaces/ml/leaderworkersets/w",
        _IDLE,
        1,
    ),
    "LeaderWorkerSet spec": (
        controller_json("LeaderWorkerSet", "w"),
        "/apis/leaderworkerset.x-k8s.io/v1/namespaces/ml/leaderworkersets/w",
        {"spec": {"leaderWorkerTemplate": {"size": 4}}},
        2,
    ),
    "Notebook stopped": (
        controller_json("Notebook", "w"),
        "/apis/kubeflow.org/v1/namespaces/ml/notebooks/w",
        {"metadata": {"annotations": {"kubeflow-resource-stopped": "2026-11-29T12:00:00Z"}}},
        1,
    ),
    "Notebook spec": (
        controller_json("Notebook", "w"),
        "/apis/kubeflow.org/v1/namespaces/ml/notebooks/w",
        {"spec": {"template": {"spec": {"nodeName": "gpu-2"}}}},
        2,
    ),
    "InferenceService spec": (
        controller_json("InferenceService", "w"),
        "/apis/serving.kserve.io/v1beta1/namespaces/ml/inferenceservices/w",
        {"spec": {"predictor": {"minReplicas": 0}}},
        2,
    ),
    # no generation at all
    "Node spec": (node_json("n1"), "/api/v1/nodes/n1", {"spec": {"unschedulable": True}}, None),
}


@pytest.mark.parametrize(
    ("stored", "path", "patch", "generation"), GENERATION_CASES.values(), ids=GENERATION_CASES.keys()
)
def test_a_write_moves_the_generation_on_as_the_kinds_strategy_does(
    api: FakeApiServer, stored: dict[str, Any], path: str, patch: dict[str, Any], generation: int | None
) -> None:
    before = api.add(stored)
    answer = _send(api, "PATCH", path, patch)
    after = api.get(
        before["kind"], before["metadata"]["name"], before["metadata"].get("namespace"), before["apiVersion"]
    )
    assert after is not None and after != before, "the patch changed nothing: the case tests nothing"
    assert _generation(answer) == _generation(after) == generation


def test_no_request_sets_the_generation(api: FakeApiServer) -> None:
    api.add(controller_json("Deployment", "w"))
    api.add(node_json("n1"))
    deployment = f"{_APPS}/deployments/w"
    assert _generation(_send(api, "PATCH", deployment, {"metadata": {"generation": 7}})) == 1
    assert (
        _generation(_send(api, "PATCH", deployment, merge_patch(_IDLE, {"metadata": {"generation": 7}}))) == 2
    )
    current = api.get("Deployment", "w", "ml")
    assert current is not None
    current["metadata"]["generation"] = 9
    assert _generation(_send(api, "PUT", deployment, current)) == 2
    assert _generation(_send(api, "PATCH", "/api/v1/nodes/n1", {"metadata": {"generation": 3}})) is None
    # A write to `status` never moves it (the status strategies keep the stored spec).
    assert _generation(_send(api, "PATCH", f"{deployment}/status", {"status": {"replicas": 5}})) == 2
    # A dry run answers the generation the write would get, and stores nothing.
    assert _generation(_send(api, "PATCH", f"{deployment}?dryRun=All", _IMAGE)) == 3
    assert _generation(api.get("Deployment", "w", "ml")) == 2


def test_a_created_object_has_generation_1(api: FakeApiServer) -> None:
    job = controller_json("Job", "train")
    job["metadata"]["generation"] = 5
    assert _generation(_send(api, "POST", f"{_BATCH}/jobs", job)) == 1
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}}
    assert _generation(_send(api, "POST", "/api/v1/namespaces/ml/configmaps", config)) is None


def test_a_scale_write_moves_the_generation_on_when_the_replicas_change(api: FakeApiServer) -> None:
    api.add(controller_json("Deployment", "w", replicas=2))
    api.add(controller_json("LeaderWorkerSet", "w", replicas=2))
    lws = "/apis/leaderworkerset.x-k8s.io/v1/namespaces/ml/leaderworkersets/w"
    for kind, path in (("Deployment", f"{_APPS}/deployments/w"), ("LeaderWorkerSet", lws)):
        _send(api, "PATCH", f"{path}/scale", {"spec": {"replicas": 0}})
        scaled = api.get(kind, "w", "ml")
        _send(api, "PATCH", f"{path}/scale", {"spec": {"replicas": 0}})  # the same replicas: no change
        assert _generation(scaled) == _generation(api.get(kind, "w", "ml")) == 2


# --------------------------------------------------------------------------- custom kinds not installed


def test_a_missing_custom_kind_answers_404_on_every_path() -> None:
    with FakeApiServer(missing_kinds={"notebooks.kubeflow.org"}) as api, api.api_client() as api_client:
        api.add(controller_json("JobSet", "train"))
        with pytest.raises(ValueError, match="not installed"):
            api.add(controller_json("Notebook", "alice"))
        custom = client.CustomObjectsApi(api_client)
        group = ("kubeflow.org", "v1")
        calls: list[Callable[[], object]] = [
            lambda: custom.list_cluster_custom_object(*group, "notebooks"),
            lambda: custom.list_namespaced_custom_object(*group, "ml", "notebooks"),
            lambda: custom.get_namespaced_custom_object(*group, "ml", "notebooks", "alice"),
            lambda: custom.patch_namespaced_custom_object(
                *group, "ml", "notebooks", "alice", {"metadata": {}}
            ),
            lambda: custom.create_namespaced_custom_object(
                *group, "ml", "notebooks", controller_json("Notebook", "a")
            ),
            lambda: custom.delete_namespaced_custom_object(*group, "ml", "notebooks", "alice"),
        ]
        bodies = []
        for call in calls:
            with pytest.raises(ApiException) as caught:
                call()
            assert caught.value.status == 404
            bodies.append(_body(caught.value))
        # The authorizer answers first, whether or not the resource exists.
        api.forbid("list", "notebooks", "", group="kubeflow.org")
        with pytest.raises(ApiException) as forbidden:
            custom.list_cluster_custom_object(*group, "notebooks")
        jobsets = _custom(custom.list_cluster_custom_object("jobset.x-k8s.io", "v1alpha2", "jobsets"))
        assert len(jobsets["items"]) == 1
    assert all(b["message"] == "the server could not find the requested resource" for b in bodies)
    assert all(b["reason"] == "NotFound" for b in bodies)
    assert forbidden.value.status == 403
    with pytest.raises(ValueError, match="not custom kinds"):
        FakeApiServer(missing_kinds={"deployments.apps"})
