"""deploy/rbac.yaml grants exactly the API calls gpu-rebalancer makes; checkpoint requests need
deploy/checkpoint-rbac.example.yaml in the pod's namespace, and telling or reclaiming idle workloads
deploy/reclaim-rbac.example.yaml in theirs.

Every component that talks to the API server runs against the recording fake API server of
tests/fake_apiserver.py the way the daemon runs it: leader election on the Lease, a live daemon cycle
(cluster snapshot with the workloads behind its GPU pods, whose controllers of every kind the source
reads are listed: ReplicaSets, Deployments, StatefulSets, Jobs, JobSets, LeaderWorkerSets, Notebooks,
InferenceServices; its nodes, pods and PDBs from the watch cache `rebalancer run` keeps, listed then
watched; gpu-consolidation draining a node: drain mark, evictions, Events), the start-up
cleanup of stale drain marks, checkpoint-before-evict (a pod annotation, in a namespace that applied the
template, and refused with 403 in one that did not), a PodDisruptionBudget read after its 429, the
actuator's memory in the state ConfigMap the Deployment names (read, created, patched), the idle-GPU
reclaim's writes (telling, reclaiming and restoring a workload of each kind, and lifting a busy one's
idle mark, in the namespace that applied the reclaim template), and giving the Lease up. Each request
the fake saw is turned into the (verb, resource, subresource) the API server authorizes (GET: get / list
/ watch, POST: create, PUT: update, PATCH: patch, DELETE: delete / deletecollection) and checked against
the ClusterRole and Roles bound to the service account, each template's Role bound in the namespace that
applied it; then every verb granted on every resource must have been used.

The end-to-end tests of the other modules (every test module that uses the fake API server) are also
run once more with a recorder on the client: each call made from project code (not from a test's own
set-up or checks) must be of a kind the roles grant, so a new API call in any code path a test covers
fails here until deploy/rbac.yaml grants it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client

from rebalancer.actuator import ClusterActuator
from rebalancer.daemon.lease import DEFAULT_LEASE_NAME, LeaseElector
from rebalancer.daemon.loop import Clock, Daemon, DaemonSinks, Leadership, LiveEdge
from rebalancer.daemon.wiring import build_state_store, kube_snapshot_source
from rebalancer.guards import CHECKPOINT_RBAC_TEMPLATE
from rebalancer.guards import EVICTION_REQUESTED_AT_ANNOTATION as EVICTION_REQUESTED_AT
from rebalancer.model import Decision, Pod, Proposal, Snapshot, WorkloadAction
from rebalancer.node_marks import DRAINING_TAINT_KEY
from rebalancer.policy import EvictionConfig, parse_policy
from rebalancer.reclaim import WorkloadWriter
from rebalancer.sinks.events import KubeEventsSink
from rebalancer.sources.kube import KubeSource
from rebalancer.sources.kube_cache import KubeCache
from rebalancer.workloads import KINDS, RECLAIM_RBAC_TEMPLATE, result_of
from tests.builders import NOW, replace
from tests.fake_apiserver import (
    FakeApiServer,
    RecordedRequest,
    controller_json,
    node_json,
    pdb_json,
    pod_json,
)
from tests.test_deploy import NAMESPACE, ROOT, _run_parser, container, find, load_documents

SERVICE_ACCOUNT = "gpu-rebalancer"
# Where the exercise's pods run: the team applied the checkpoint template there.
TEAM = "ml"
# A namespace whose pod asks to checkpoint but that has not applied the template.
UNGRANTED = "research"
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

_CORE = re.compile(
    r"^/api/(?P<version>[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)
_GROUP = re.compile(
    r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)


@dataclass(frozen=True, order=True)
class Access:
    """One request as the API server's authorizer sees it."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str | None = None
    name: str | None = None

    @property
    def what(self) -> str:
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        group = f".{self.group}" if self.group else ""
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.verb} {resource}{group}{where}"


def access_of(request: RecordedRequest) -> Access:
    """Map an HTTP request to the authorizer's attributes, as the API server's request info resolver does."""
    match = _CORE.match(request.path) or _GROUP.match(request.path)
    assert match is not None, f"not a resource request: {request.method} {request.path}"
    parts = match.groupdict()
    name, method = parts["name"], request.method
    if method == "GET":
        verb = "get" if name else ("watch" if request.param("watch") in ("true", "1") else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]
    return Access(
        verb=verb,
        group=parts.get("group") or "",
        resource=parts["resource"],
        subresource=parts["sub"] or "",
        namespace=parts["ns"],
        name=name,
    )


# --------------------------------------------------------------------------- what is granted


@dataclass(frozen=True)
class Grant:
    """One rule of a role, with where it applies (None: every namespace and cluster-scoped objects)."""

    role: str
    index: int
    rule: dict[str, Any]
    namespace: str | None

    def allows(self, access: Access) -> bool:
        if self.namespace is not None and access.namespace != self.namespace:
            return False
        rule = self.rule
        resource = f"{access.resource}/{access.subresource}" if access.subresource else access.resource
        if access.group not in rule["apiGroups"] or resource not in rule["resources"]:
            return False
        if access.verb not in rule["verbs"]:
            return False
        names = rule.get("resourceNames")
        return not names or access.name in names

    def pairs(self) -> Iterator[tuple[str, str, str | None]]:
        """(verb, resource, resource name) this rule grants."""
        for resource in self.rule["resources"]:
            for verb in self.rule["verbs"]:
                for name in self.rule.get("resourceNames") or [None]:
                    yield verb, resource, name


def applied_template(template: str, namespace: str) -> list[dict[str, Any]]:
    """A template (the checkpoint or the reclaim RBAC) as `kubectl -n <namespace> apply -f` creates it."""
    docs = load_documents(ROOT / template)
    for doc in docs:
        assert "namespace" not in doc["metadata"], "the template is applied with -n: it names no namespace"
        doc["metadata"]["namespace"] = namespace
    return docs


def grants(
    service_account: str = SERVICE_ACCOUNT,
    *,
    checkpoints: Iterable[str] = (TEAM,),
    reclaims: Iterable[str] = (TEAM,),
) -> list[Grant]:
    """Every rule bound to the service account: deploy/rbac.yaml, the checkpoint template applied in
    each namespace of `checkpoints` and the reclaim template in each of `reclaims`."""
    from tests.test_deploy import DEPLOY

    docs = load_documents(DEPLOY / "rbac.yaml")
    for namespace in checkpoints:
        docs += applied_template(CHECKPOINT_RBAC_TEMPLATE, namespace)
    for namespace in reclaims:
        docs += applied_template(RECLAIM_RBAC_TEMPLATE, namespace)
    subject = {"kind": "ServiceAccount", "name": service_account, "namespace": NAMESPACE}
    roles = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")): d for d in docs}
    found: list[Grant] = []
    for binding in docs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding") or subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace")
        role = roles[(ref["kind"], ref["name"], namespace if ref["kind"] == "Role" else None)]
        scope = None if binding["kind"] == "ClusterRoleBinding" else namespace
        found += [Grant(ref["name"], i, rule, scope) for i, rule in enumerate(role["rules"])]
    return found


# --------------------------------------------------------------------------- what the code does


class _NoSleep:
    def __call__(self, seconds: float) -> None:
        pass


def _cluster(api: FakeApiServer) -> None:
    """a-1 holds four 1-GPU pods (half full): consolidation drains it onto a-2 and a-3."""
    for name in ("a-1", "a-2", "a-3"):
        api.add(node_json(name))
    for index in range(4):
        api.add(pod_json(f"x{index}", "a-1"))
    api.add(pod_json("busy-2", "a-2", gpus=5))
    api.add(pod_json("busy-3", "a-3", gpus=5, labels={"app": "guarded"}))
    api.add(pod_json("ckpt", "a-3", annotations={"rebalancer.gpu/checkpoint": "true"}))
    api.add(
        pod_json(
            "eval", "a-2", gpus=0, namespace=UNGRANTED, annotations={"rebalancer.gpu/checkpoint": "true"}
        )
    )
    api.forbid("patch", "pods", UNGRANTED)  # as the API server does: no Role there grants it
    # A full node of GPU pods behind every kind of workload the snapshot resolves (never drained, never
    # a destination): each kind of controller is listed.
    api.add(node_json("w-1"))
    workloads = [
        ("Notebook", "alice", None),
        ("StatefulSet", "alice", ("Notebook", "alice")),
        ("LeaderWorkerSet", "lws", None),
        ("StatefulSet", "lws", ("LeaderWorkerSet", "lws")),
        ("StatefulSet", "lws-0", ("Pod", "lws-0")),
        ("JobSet", "train", None),
        ("Job", "train-workers-0", ("JobSet", "train")),
        ("InferenceService", "llm", None),
        ("Deployment", "llm-predictor", ("InferenceService", "llm")),
        ("ReplicaSet", "llm-predictor-7c", ("Deployment", "llm-predictor")),
    ]
    workloads += [("Deployment", "serve", None), ("ReplicaSet", "batch-5f", None)]
    for kind, name, owner in workloads:
        api.add(controller_json(kind, name, namespace=TEAM, owner=owner))
    for name, gpus, kind, owner_name, version in (
        ("alice-0", 1, "StatefulSet", "alice", "apps/v1"),
        ("lws-0", 1, "StatefulSet", "lws", "apps/v1"),
        ("lws-0-1", 1, "StatefulSet", "lws-0", "apps/v1"),
        ("train-workers-0-0", 2, "Job", "train-workers-0", "batch/v1"),
        ("llm-predictor-7c-x", 3, "ReplicaSet", "llm-predictor-7c", "apps/v1"),
    ):
        api.add(
            pod_json(
                name,
                "w-1",
                namespace=TEAM,
                gpus=gpus,
                owner_kind=kind,
                owner_name=owner_name,
                owner_api_version=version,
            )
        )
    # A node still marked by an earlier run that is gone: cleaned at start-up.
    api.add(node_json("old", taints=[{"key": DRAINING_TAINT_KEY, "value": "c0", "effect": "NoSchedule"}]))


def _pod_plan(snapshot: Snapshot, name: str, namespace: str = TEAM) -> Decision:
    pod = snapshot.pods_by_key[(namespace, name)]
    proposal = Proposal(
        strategy="idle-gpu", kind="pod", pods=(pod,), reason="GPU idle for 2h", node=pod.node_name
    )
    return Decision(proposal=proposal, approved=True)


def live_args() -> argparse.Namespace:
    """The Deployment's arguments once it goes live (`--no-dry-run` in place of `--dry-run`)."""
    args = container(find("Deployment", "gpu-rebalancer"))["args"]
    return _run_parser().parse_args([("--no-dry-run" if a == "--dry-run" else a) for a in args])


def exercise(api: FakeApiServer, api_client: client.ApiClient) -> list[RecordedRequest]:
    """Everything gpu-rebalancer does to a cluster (daemon, actuator, Events, Lease, its memory); the
    requests seen."""
    _cluster(api)
    deployment = find("Deployment", "gpu-rebalancer")
    assert "--lease-name" not in container(deployment)["args"]
    elector = LeaseElector(api_client, name=DEFAULT_LEASE_NAME, namespace=NAMESPACE, identity="replica-a")
    assert elector.try_acquire_or_renew()  # creates the Lease
    assert elector.try_acquire_or_renew()  # renews it
    # The state store the live Deployment builds, in the pod's namespace (POD_NAMESPACE, as it sets it).
    with pytest.MonkeyPatch.context() as env:
        env.setenv("POD_NAMESPACE", NAMESPACE)
        store = build_state_store(live_args(), api_client)
    assert store is not None
    actuator = ClusterActuator.from_config(api_client, EvictionConfig(), sleep=_NoSleep(), state_store=store)
    assert [change.node for change in actuator.cleanup_orphans()] == ["old"]
    events = KubeEventsSink(api_client)
    cache = KubeCache(api_client)  # as `rebalancer run` builds its source
    daemon = Daemon(
        CONSOLIDATE,
        kube_snapshot_source(api_client, cluster=cache.read),
        dry_run=False,
        live=LiveEdge(actuator, memory=actuator.memory),
        leadership=Leadership(elector),
        sinks=DaemonSinks(extra=(events,), notifiers=lambda _notify, _count: ()),
        clock=Clock(wall=lambda: NOW),
    )
    report = daemon.run_cycle(raise_errors=True)
    assert report is not None and report.mode == "live"
    assert not [f for f in report.findings if f.kind == "unread-controllers"]  # every kind was listed
    assert {row.outcome for row in report.decisions if row.strategy == "gpu-consolidation"} == {"evicted"}
    assert report.freed_nodes == ("a-1",)

    # Checkpoint-before-evict asks first (a pod annotation; refused where the template is not applied);
    # a PDB created after the snapshot refuses an eviction and is read by name.
    snapshot = KubeSource(api_client, CONSOLIDATE).snapshot(NOW)
    api.add(pdb_json("late", {"app": "guarded"}, 0))
    actuator.begin_cycle(snapshot, "c2")
    assert [o.result for o in actuator.evict(_pod_plan(snapshot, "busy-3"))] == ["blocked-by-pdb"]
    waiting = [
        replace(_pod_plan(snapshot, name, namespace), approved=False, blocked_by="checkpoint-pending")
        for namespace, name in ((TEAM, "ckpt"), (UNGRANTED, "eval"))
    ]
    assert [f.namespace for f in actuator.end_cycle(waiting, completed=True)] == [UNGRANTED]
    assert EVICTION_REQUESTED_AT in (api.pod(TEAM, "ckpt") or {})["metadata"]["annotations"]
    assert EVICTION_REQUESTED_AT not in (api.pod(UNGRANTED, "eval") or {})["metadata"]["annotations"]
    _reclaim_every_kind(api_client)
    daemon.shutdown()  # gives the Lease up
    _until_watched(api, ("/api/v1/nodes", "/api/v1/pods", "/apis/policy/v1/poddisruptionbudgets"))
    cache.stop()
    return api.requests


def _until_watched(api: FakeApiServer, paths: Iterable[str], timeout: float = 10.0) -> None:
    """Wait for the cache's watch threads to have made their first watch of each path."""
    deadline = time.monotonic() + timeout
    waiting = set(paths)
    while waiting and time.monotonic() < deadline:
        waiting -= {r.path for r in api.requests if r.param("watch") in ("true", "1")}
        time.sleep(0.05)
    assert not waiting, f"never watched: {sorted(waiting)}"


# Each kind a reclaim changes, and how: the workloads of `_cluster` (the writer acts on the object it is
# given, whoever owns it), plus a plain Deployment and ReplicaSet.
_RECLAIMED = (
    ("Deployment", "serve", "scale"),
    ("ReplicaSet", "batch-5f", "scale"),
    ("StatefulSet", "lws", "scale"),
    ("LeaderWorkerSet", "lws", "scale"),
    ("Job", "train-workers-0", "suspend"),
    ("JobSet", "train", "suspend"),
    ("Notebook", "alice", "stop"),
)


def _reclaim_every_kind(api_client: client.ApiClient) -> None:
    """Tell, reclaim and restore one workload of each kind; a busy one cleared; what restore lists."""
    writer = WorkloadWriter(api_client, sleep=_NoSleep())

    def carry_out(action: WorkloadAction) -> None:
        pod = Pod(namespace=TEAM, name=f"{action.workload[2]}-0")
        proposal = Proposal(strategy="idle-gpu", kind="workload", pods=(pod,), reason="idle", action=action)
        [outcome] = writer.apply(Decision(proposal=proposal, approved=True), NOW)
        assert outcome.result == result_of(action, dry_run=False), outcome.detail

    for kind, name, how in _RECLAIMED:
        told = WorkloadAction(verb="notify", workload=(TEAM, kind, name), controller=None)
        carry_out(told)
        carry_out(replace(told, verb="reclaim", how=how))
    busy = WorkloadAction(verb="notify", workload=(TEAM, "Deployment", "llm-predictor"), controller=None)
    carry_out(busy)
    carry_out(replace(busy, verb="clear"))
    reclaimed = writer.reclaimed(TEAM)
    assert reclaimed == tuple(sorted((TEAM, kind, name) for kind, name, _ in _RECLAIMED))
    for namespace, kind, name in reclaimed:
        done = writer.restore(namespace, kind, name)
        assert done.ok, done.detail


@pytest.fixture(scope="module")
def seen() -> list[Access]:
    with FakeApiServer() as api, api.api_client() as api_client:
        accesses = [access_of(request) for request in exercise(api, api_client)]
    # Finalize the clients now: CPython 3.11.7 can raise a spurious SystemError ("AST constructor
    # recursion depth mismatch") when a finalizer runs during a later ast.parse (an import that pytest
    # rewrites), which garbage from these clients otherwise may.
    gc.collect()
    return accesses


# --------------------------------------------------------------------------- the checks


def test_every_request_the_code_makes_is_granted(seen: list[Access]) -> None:
    rules = grants()
    denied = sorted({access.what for access in seen if not any(rule.allows(access) for rule in rules)})
    # Only the checkpoint request in the namespace without the template, which the API server refuses.
    assert denied == [f"patch pods in {UNGRANTED}"], f"forbidden in a cluster: {denied}"


def test_nothing_granted_goes_unused(seen: list[Access]) -> None:
    unused = []
    for rule in grants():
        for verb, resource, name in rule.pairs():
            used = any(
                rule.allows(access)
                and access.verb == verb
                and "/".join(filter(None, (access.resource, access.subresource))) == resource
                and (name is None or access.name == name)
                for access in seen
            )
            if not used:
                unused.append(f"{rule.role}: {verb} {resource}" + (f" ({name})" if name else ""))
    assert not unused, f"granted but never used: {unused}"


def test_the_exercise_covers_what_the_daemon_does(seen: list[Access]) -> None:
    verbs = {(a.verb, a.resource, a.subresource) for a in seen}
    assert {
        ("list", "nodes", ""),
        ("list", "pods", ""),
        ("list", "poddisruptionbudgets", ""),
        ("watch", "nodes", ""),
        ("watch", "pods", ""),
        ("watch", "poddisruptionbudgets", ""),
        ("create", "pods", "eviction"),
        ("patch", "nodes", ""),
        ("patch", "pods", ""),
        ("create", "events", ""),
        ("create", "leases", ""),
        ("update", "leases", ""),
        ("get", "configmaps", ""),
        ("create", "configmaps", ""),
        ("patch", "configmaps", ""),
        ("list", "replicasets", ""),
        ("list", "deployments", ""),
        ("list", "statefulsets", ""),
        ("list", "jobs", ""),
        ("list", "jobsets", ""),
        ("list", "leaderworkersets", ""),
        ("list", "notebooks", ""),
        ("list", "inferenceservices", ""),
        ("patch", "deployments", ""),
        ("patch", "deployments", "scale"),
        ("patch", "statefulsets", "scale"),
        ("patch", "leaderworkersets", "scale"),
        ("patch", "jobs", ""),
        ("patch", "jobsets", ""),
        ("patch", "notebooks", ""),
    } <= verbs


def test_the_lease_is_the_one_the_deployment_elects_on(seen: list[Access]) -> None:
    leases = {(a.namespace, a.name) for a in seen if a.resource == "leases" and a.name}
    assert leases == {(NAMESPACE, DEFAULT_LEASE_NAME)}
    env = {e["name"]: e for e in container(find("Deployment", "gpu-rebalancer"))["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    lease_rules = [g for g in grants() if "leases" in g.rule["resources"]]
    assert lease_rules and all(g.namespace == NAMESPACE for g in lease_rules), "Leases only in its namespace"


def test_the_state_configmap_is_the_one_the_deployment_names(seen: list[Access]) -> None:
    name = live_args().state_configmap
    assert live_args().state_file is None
    configmaps = [a for a in seen if a.resource == "configmaps"]
    assert {(a.namespace, a.name) for a in configmaps if a.name} == {(NAMESPACE, name)}
    assert {(a.verb, a.namespace) for a in configmaps if not a.name} == {("create", NAMESPACE)}
    rules = [g for g in grants() if "configmaps" in g.rule["resources"]]
    assert rules and all(g.namespace == NAMESPACE for g in rules), "ConfigMaps only in its namespace"
    # By name, except `create` (which the API server cannot limit to a name).
    for grant in rules:
        for verb, _, granted_name in grant.pairs():
            assert granted_name == name or verb == "create", f"{verb} configmaps not limited to {name}"
    other = Access("get", "", "configmaps", namespace=NAMESPACE, name="gpu-rebalancer-policy")
    assert not any(g.allows(other) for g in grants()), "resourceNames limit the state ConfigMap"


def _flatten(rules: Iterable[Grant]) -> Iterator[tuple[str, str, str]]:
    for rule in rules:
        for group in rule.rule["apiGroups"]:
            for verb, resource, _ in rule.pairs():
                yield group, resource, verb


def test_the_roles_are_least_privilege() -> None:
    flat = set(_flatten(grants()))
    assert not any("*" in part for triple in flat for part in triple), "no wildcards"
    resources = {resource for _, resource, _ in flat}
    assert "secrets" not in resources
    # ConfigMaps: only its own state ConfigMap (by name) in its namespace, and `create` there.
    configmaps = [g for g in grants() if "configmaps" in g.rule["resources"]]
    assert all(g.namespace == NAMESPACE and g.rule["resources"] == ["configmaps"] for g in configmaps)
    assert {(verb, name) for g in configmaps for verb, _, name in g.pairs()} == {
        ("create", None),
        ("get", live_args().state_configmap),
        ("patch", live_args().state_configmap),
    }
    assert not {verb for _, resource, verb in flat if resource == "pods"} & {"delete", "deletecollection"}
    # Cluster-wide writes: node taints, evictions, Events. Nothing else: no pod patch (it could change
    # any workload's image), which only the checkpoint template grants, in the namespace applying it.
    cluster_writes = {
        (resource, verb)
        for rule in grants()
        if rule.namespace is None
        for _, resource, verb in _flatten([rule])
        if verb not in ("get", "list", "watch")
    }
    assert cluster_writes == {
        ("nodes", "patch"),
        ("pods/eviction", "create"),
        ("events", "create"),
    }


def test_checkpoint_requests_are_granted_only_where_the_template_is_applied() -> None:
    def patch_pod(namespace: str) -> Access:
        return Access("patch", "", "pods", namespace=namespace, name="train")

    assert not any(g.allows(patch_pod(TEAM)) for g in grants(checkpoints=()))
    assert [g.role for g in grants() if g.allows(patch_pod(TEAM))] == ["gpu-rebalancer-checkpoint"]
    assert not any(g.allows(patch_pod(UNGRANTED)) for g in grants())
    # The template grants that one verb on pods, nothing else, in its namespace only.
    template = [g for g in grants(checkpoints=("team-a",)) if g.namespace == "team-a"]
    assert [(g.rule["apiGroups"], g.rule["resources"], g.rule["verbs"]) for g in template] == [
        ([""], ["pods"], ["patch"])
    ]


def test_workload_writes_are_granted_only_where_the_reclaim_template_is_applied() -> None:
    def patch(namespace: str, resource: str = "deployments", sub: str = "") -> Access:
        return Access("patch", "apps", resource, sub, namespace=namespace, name="serve")

    assert not any(g.allows(patch(TEAM)) for g in grants(reclaims=()))
    assert [g.role for g in grants() if g.allows(patch(TEAM, sub="scale"))] == ["gpu-rebalancer-reclaim"]
    assert not any(g.allows(patch(UNGRANTED)) for g in grants())
    template = [g for g in grants(checkpoints=(), reclaims=("team-a",)) if g.namespace == "team-a"]
    assert {verb for g in template for verb, _, _ in g.pairs()} == {"get", "patch"}
    granted = {(group, resource) for g in template for group, resource, _ in _flatten([g])}
    assert granted == {
        *((kind.group, kind.resource) for kind in KINDS.values() if kind.reclaim is not None),
        *((kind.group, f"{kind.resource}/scale") for kind in KINDS.values() if kind.reclaim == "scale"),
    }


def test_the_fake_refuses_as_the_api_server_does() -> None:
    """What the 403 the actuator meets looks like: a Status with reason Forbidden and its details, the
    authorizer's message naming the user, verb, resource, API group and namespace."""
    with FakeApiServer() as api, api.api_client() as api_client:
        api.add(pod_json("eval", "a-1", namespace=UNGRANTED))
        api.forbid("patch", "pods", UNGRANTED)
        core = client.CoreV1Api(api_client)
        with pytest.raises(client.ApiException) as refused:
            core.patch_namespaced_pod("eval", UNGRANTED, {"metadata": {"annotations": {"a": "b"}}})
        assert refused.value.status == 403
        assert json.loads(refused.value.body or "") == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'pods "eval" is forbidden: User "system:serviceaccount:gpu-rebalancer:gpu-rebalancer" '
            f'cannot patch resource "pods" in API group "" in the namespace "{UNGRANTED}"',
            "reason": "Forbidden",
            "details": {"name": "eval", "kind": "pods"},
            "code": 403,
        }
        core.read_namespaced_pod("eval", UNGRANTED)  # only that verb is refused
        api.permit("patch", "pods", UNGRANTED)
        core.patch_namespaced_pod("eval", UNGRANTED, {"metadata": {"annotations": {"a": "b"}}})
        assert (api.pod(UNGRANTED, "eval") or {})["metadata"]["annotations"] == {"a": "b"}
    gc.collect()


def test_the_http_mapping_is_the_api_servers() -> None:
    def request(method: str, path: str, **query: str) -> RecordedRequest:
        return RecordedRequest(method, path, {k: (v,) for k, v in query.items()}, None, "")

    assert access_of(request("GET", "/api/v1/nodes")) == Access("list", "", "nodes")
    assert access_of(request("GET", "/api/v1/pods", watch="true")) == Access("watch", "", "pods")
    assert access_of(request("GET", "/api/v1/nodes/a-1")) == Access("get", "", "nodes", name="a-1")
    assert access_of(request("POST", "/api/v1/namespaces/ml/pods/x/eviction")) == Access(
        "create", "", "pods", "eviction", "ml", "x"
    )
    assert access_of(request("PUT", "/apis/coordination.k8s.io/v1/namespaces/n/leases/l")) == Access(
        "update", "coordination.k8s.io", "leases", namespace="n", name="l"
    )
    assert access_of(request("DELETE", "/api/v1/namespaces/ml/pods")).verb == "deletecollection"
    assert access_of(request("PATCH", "/apis/apps/v1/namespaces/ml/deployments/serve/scale")) == Access(
        "patch", "apps", "deployments", "scale", "ml", "serve"
    )
    assert access_of(request("GET", "/apis/apps/v1/namespaces/ml/statefulsets/nb/scale")) == Access(
        "get", "apps", "statefulsets", "scale", "ml", "nb"
    )
    assert access_of(request("GET", "/apis/kubeflow.org/v1/notebooks")) == Access(
        "list", "kubeflow.org", "notebooks"
    )
    scale = Access("patch", "apps", "deployments", "scale", "ml", "serve")
    assert scale.what == "patch deployments/scale.apps in ml"
    lease_get = Access("get", "coordination.k8s.io", "leases", namespace=NAMESPACE, name="someone-else")
    assert not any(g.allows(lease_get) for g in grants()), "resourceNames limit the Lease"


# --------------------------------------------------------------------------- the other end-to-end tests

# A pytest plugin for a child pytest: records every request of the kubernetes client with who made it
# (the innermost frame of the repository on the stack: project code, or a test's own call).
RECORDER = """
import json, os, sys
from pathlib import Path
import kubernetes.client.rest as rest

_ROOT = Path.cwd().resolve()
_CODE = tuple(str(_ROOT / name) + os.sep for name in ("rebalancer", "strategies"))
_TESTS = str(_ROOT / "tests") + os.sep
_real = rest.RESTClientObject.request


def _request(self, method, url, *args, **kwargs):
    frame, owner = sys._getframe(1), "library"
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_CODE):
            owner = "code"
            break
        if name.startswith(_TESTS):
            owner = "test"
            break
        frame = frame.f_back
    with open(os.environ["RBAC_RECORD"], "a", encoding="utf-8") as out:
        out.write(json.dumps({"owner": owner, "method": method, "url": url}) + "\\n")
    return _real(self, method, url, *args, **kwargs)


rest.RESTClientObject.request = _request
"""


def end_to_end_modules() -> list[Path]:
    """The test modules that drive project code against the fake API server (not its own tests)."""
    return sorted(
        path
        for path in (ROOT / "tests").glob("test_*.py")
        if "fake_apiserver" in path.read_text(encoding="utf-8")
        and path.name != "test_fake_apiserver.py"
        and not path.name.startswith("test_rbac")
    )


def test_every_call_made_in_the_end_to_end_tests_is_granted(tmp_path: Path) -> None:
    modules = end_to_end_modules()
    assert any(m.name == "test_evictor.py" for m in modules)
    (tmp_path / "rbac_recorder.py").write_text(RECORDER, encoding="utf-8")
    record = tmp_path / "requests.jsonl"
    env = {
        **os.environ,
        "RBAC_RECORD": str(record),
        "PYTHONPATH": os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH")))),
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "rbac_recorder"]
    done = subprocess.run(
        [*command, *map(str, modules)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    # Their own failures are reported by their own runs; here only the calls matter.
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    by_code = []
    for line in record.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if entry["owner"] == "test":
            continue
        url = urlsplit(entry["url"])
        query = {k: tuple(v) for k, v in parse_qs(url.query).items()}
        by_code.append(access_of(RecordedRequest(entry["method"], url.path, query, None, "")))
    assert len(by_code) > 100, "the end-to-end tests made (almost) no API call"
    # The tests choose their own namespaces and Lease names: compare kinds of calls, not objects.
    granted = {
        (group, resource, verb)
        for rule in grants()
        for group in rule.rule["apiGroups"]
        for verb, resource, _ in rule.pairs()
    }
    denied = sorted(
        {
            a.what.split(" in ")[0]
            for a in by_code
            if (a.group, "/".join(filter(None, (a.resource, a.subresource))), a.verb) not in granted
        }
    )
    assert not denied, f"project code calls what deploy/rbac.yaml does not grant: {denied}"
