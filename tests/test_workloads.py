"""Workload resolution: each pod's controller chain walked up to the object a person manages."""

from __future__ import annotations

from rebalancer.history import Workload
from rebalancer.model import OwnerRef
from rebalancer.workloads import resolve, walks_to
from tests.builders import controller, node, pod, snapshot


def _owner(kind: str, name: str) -> OwnerRef:
    return OwnerRef(kind=kind, name=name)


def test_a_replicaset_pod_belongs_to_its_deployment() -> None:
    snap = snapshot(
        [node("n")],
        [pod("serve-abc-1", "n", owner=_owner("ReplicaSet", "serve-abc"))],
        controllers=[
            controller("ReplicaSet", "serve-abc", owner=_owner("Deployment", "serve")),
            controller("Deployment", "serve", replicas=3),
        ],
    )
    got = resolve(snap)[("ml", "serve-abc-1")]
    assert got.key == Workload("ml", "Deployment", "serve")
    assert got.controller is not None and got.controller.replicas == 3
    assert got.reclaim == "scale"
    assert got.ref == "ml/Deployment/serve"


def test_a_cronjob_run_is_its_own_workload_and_names_the_cronjob() -> None:
    snap = snapshot(
        [node("n")],
        [pod("nightly-123-x", "n", owner=_owner("Job", "nightly-123"))],
        controllers=[controller("Job", "nightly-123", owner=_owner("CronJob", "nightly"))],
    )
    got = resolve(snap)[("ml", "nightly-123-x")]
    assert got.key == Workload("ml", "Job", "nightly-123")
    assert got.parent == _owner("CronJob", "nightly")
    assert got.reclaim == "suspend"


def test_jobset_notebook_and_inference_service_are_walked_to() -> None:
    snap = snapshot(
        [node("n")],
        [
            pod("js-0", "n", owner=_owner("Job", "train-workers-0")),
            pod("nb-0", "n", owner=_owner("StatefulSet", "alice")),
            pod("isvc-1", "n", owner=_owner("ReplicaSet", "llm-predictor-5f")),
        ],
        controllers=[
            controller("Job", "train-workers-0", owner=_owner("JobSet", "train")),
            controller("JobSet", "train"),
            controller("StatefulSet", "alice", owner=_owner("Notebook", "alice")),
            controller("Notebook", "alice"),
            controller("ReplicaSet", "llm-predictor-5f", owner=_owner("Deployment", "llm-predictor")),
            controller("Deployment", "llm-predictor", owner=_owner("InferenceService", "llm")),
            controller("InferenceService", "llm"),
        ],
    )
    got = resolve(snap)
    assert got[("ml", "js-0")].key == Workload("ml", "JobSet", "train")
    assert got[("ml", "js-0")].reclaim == "suspend"
    assert got[("ml", "nb-0")].key == Workload("ml", "Notebook", "alice")
    assert got[("ml", "nb-0")].reclaim == "stop"
    assert got[("ml", "isvc-1")].key == Workload("ml", "InferenceService", "llm")
    assert got[("ml", "isvc-1")].reclaim is None


def test_a_leaderworkerset_worker_is_followed_through_its_leader_pod() -> None:
    snap = snapshot(
        [node("n")],
        [
            pod("lws-0", "n", owner=_owner("StatefulSet", "lws")),
            pod("lws-0-1", "n", owner=_owner("StatefulSet", "lws-0")),
        ],
        controllers=[
            controller("StatefulSet", "lws", owner=_owner("LeaderWorkerSet", "lws")),
            controller("StatefulSet", "lws-0", owner=_owner("Pod", "lws-0")),
            controller("LeaderWorkerSet", "lws"),
        ],
    )
    got = resolve(snap)
    assert got[("ml", "lws-0")].key == Workload("ml", "LeaderWorkerSet", "lws")
    assert got[("ml", "lws-0-1")].key == Workload("ml", "LeaderWorkerSet", "lws")


def test_an_unlisted_controller_ends_the_walk_and_cannot_be_reclaimed() -> None:
    snap = snapshot(
        [node("n")],
        [pod("serve-abc-1", "n", owner=_owner("ReplicaSet", "serve-abc"))],
        controllers=[controller("ReplicaSet", "serve-abc", owner=_owner("Deployment", "serve"))],
    )
    got = resolve(snap)[("ml", "serve-abc-1")]
    assert got.key == Workload("ml", "Deployment", "serve")
    assert got.controller is None
    assert got.reclaim is None


def test_a_bare_pod_is_its_own_workload_and_is_evicted() -> None:
    snap = snapshot([node("n")], [pod("scratch", "n", owner=None)])
    got = resolve(snap)[("ml", "scratch")]
    assert got.key == Workload("ml", "Pod", "scratch")
    assert got.bare and got.reclaim == "evict"


def test_an_unknown_controller_kind_is_the_workload_with_no_reclaim() -> None:
    snap = snapshot(
        [node("n")],
        [pod("ray-head", "n", owner=_owner("RayCluster", "ray"))],
        controllers=[controller("RayCluster", "ray")],
    )
    got = resolve(snap)[("ml", "ray-head")]
    assert got.key == Workload("ml", "RayCluster", "ray")
    assert got.reclaim is None


def test_an_ownership_loop_ends() -> None:
    snap = snapshot(
        [node("n")],
        [pod("p", "n", owner=_owner("ReplicaSet", "a"))],
        controllers=[
            controller("ReplicaSet", "a", owner=_owner("Deployment", "b")),
            controller("Deployment", "b", owner=_owner("InferenceService", "c")),
            controller("InferenceService", "c"),
        ],
    )
    assert resolve(snap)[("ml", "p")].key == Workload("ml", "InferenceService", "c")


def test_walks_to_is_one_step_of_the_walk() -> None:
    leader = pod("lws-0", "n", owner=_owner("StatefulSet", "lws"))
    pods = {leader.key: leader}
    worker_set = controller("StatefulSet", "lws-0", owner=_owner("Pod", "lws-0"))
    assert walks_to(worker_set, pods) == Workload("ml", "StatefulSet", "lws")
    assert walks_to(worker_set, {}) is None  # the leader pod is not in the snapshot
    replica_set = controller("ReplicaSet", "serve-abc", owner=_owner("Deployment", "serve"))
    assert walks_to(replica_set, pods) == Workload("ml", "Deployment", "serve")
    cron_run = controller("Job", "nightly-1", owner=_owner("CronJob", "nightly"))
    assert walks_to(cron_run, pods) is None  # the Job stays the workload
    assert walks_to(controller("Deployment", "serve"), pods) is None
