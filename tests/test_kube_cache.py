"""The watch cache against the fake API server over real HTTP: initial sync, events applied as they
arrive, bookmarks, 410 Gone and a list again, broken or silent watches turned into a finding and a
fresh list (never a snapshot of stale objects), and the daemon keeping one watch per kind."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from rebalancer.daemon.loop import Clock, Daemon, LiveEdge
from rebalancer.daemon.wiring import kube_snapshot_source
from rebalancer.kube_evictor import KubeEvictor
from rebalancer.policy import LoadedPolicy, parse_policy
from rebalancer.sources.kube import KubeSource
from rebalancer.sources.kube_cache import RELIST_REASONS, STALE_CLUSTER_CACHE, KubeCache, Reflector
from rebalancer.sources.kube_lists import ACTIVE_PODS, KubeSourceError
from tests.builders import NOW
from tests.fake_apiserver import (
    FakeApiServer,
    RecordedRequest,
    add_consolidation_cluster,
    node_json,
    pdb_json,
    pod_json,
)

LOADED: LoadedPolicy = parse_policy({})


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for a watch thread to have done something; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


@pytest.fixture
def cache(api_client: client.ApiClient) -> Iterator[KubeCache]:
    kube_cache = KubeCache(api_client, backoff=lambda attempt: 0.1)
    yield kube_cache
    kube_cache.stop()


def _cluster(api: FakeApiServer) -> str:
    """Two nodes, a running pod and a finished one, a PDB; the resourceVersion the API server is at."""
    api.add(node_json("gpu-1"))
    api.add(node_json("gpu-2"))
    api.add(pod_json("train-0", "gpu-1", gpus=2))
    api.add(pod_json("done", "gpu-1", phase="Succeeded"))
    return str(api.add(pdb_json("train-pdb", {"app": "train"}, 1))["metadata"]["resourceVersion"])


def _reflector(cache: KubeCache, what: str) -> Reflector:
    return next(r for r in cache.reflectors if r.call.what == what)


def _pod_names(cache: KubeCache, what: str = "pods") -> list[str]:
    return sorted(key[1] for key in _reflector(cache, what).store().objects)


def _watches(api: FakeApiServer, path: str) -> list[RecordedRequest]:
    return [r for r in api.requests_to(path, "GET") if r.param("watch") in ("true", "1")]


def _lists(api: FakeApiServer, path: str) -> list[RecordedRequest]:
    return [r for r in api.requests_to(path, "GET") if r.param("watch") is None]


def test_first_read_lists_every_kind_then_watches_from_the_lists_versions(
    api: FakeApiServer, cache: KubeCache
) -> None:
    listed_at = _cluster(api)
    objects = cache.read(LOADED)
    assert sorted(objects.nodes) == ["gpu-1", "gpu-2"]
    assert [p.ref for p in objects.pods] == ["ml/train-0"]  # finished pods filtered by the server
    assert [p.key for p in objects.pdbs] == [("ml", "train-pdb")]
    assert objects.findings == ()
    for path in ("/api/v1/nodes", "/api/v1/pods", "/apis/policy/v1/poddisruptionbudgets"):
        eventually(lambda path=path: len(_watches(api, path)) == 1)  # type: ignore[misc]
        [listed] = _lists(api, path)
        [watch] = _watches(api, path)
        assert listed.param("resourceVersion") is None  # a consistent list, not the watch cache's
        assert watch.param("allowWatchBookmarks") == "true"
        assert watch.param("resourceVersion") == listed_at  # from the list's resourceVersion
        assert 60 <= int(watch.param("timeoutSeconds") or 0) < 120
    pods_watch = _watches(api, "/api/v1/pods")[0]
    assert pods_watch.param("fieldSelector") == ACTIVE_PODS
    assert _lists(api, "/api/v1/pods")[0].param("fieldSelector") == ACTIVE_PODS


def test_added_modified_and_deleted_pods_show_in_the_next_read(api: FakeApiServer, cache: KubeCache) -> None:
    _cluster(api)
    cache.read(LOADED)
    eventually(lambda: len(_watches(api, "/api/v1/pods")) == 1)
    api.add(pod_json("train-1", "gpu-2"))
    api.add(pod_json("train-0", "gpu-1", gpus=4))  # modified: now four GPUs
    eventually(lambda: _pod_names(cache) == ["train-0", "train-1"])
    eventually(lambda: _reflector(cache, "pods").store().objects[("ml", "train-0")].gpu.count == 4)  # type: ignore[union-attr]
    api.remove("Pod", "train-1", "ml")
    api.add(pod_json("train-0", "gpu-1", gpus=4, phase="Succeeded"))  # finished: leaves the selector
    eventually(lambda: _pod_names(cache) == [])
    objects = cache.read(LOADED)
    assert objects.pods == () and objects.findings == ()
    assert len(_lists(api, "/api/v1/pods")) == 1  # all of it from the watch, no list again


def test_bookmarks_advance_the_resource_version_the_next_watch_starts_from(
    api: FakeApiServer, cache: KubeCache
) -> None:
    _cluster(api)
    cache.read(LOADED)
    eventually(lambda: len(_watches(api, "/api/v1/nodes")) == 1)
    nodes = _reflector(cache, "nodes")
    elsewhere = api.add(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "a"}}
    )
    later = elsewhere["metadata"]["resourceVersion"]
    eventually(lambda: nodes.resource_version == later)  # a bookmark: no node changed
    assert sorted(cache.read(LOADED).nodes) == ["gpu-1", "gpu-2"]
    api.drop_watches()
    eventually(lambda: len(_watches(api, "/api/v1/nodes")) == 2)
    assert _watches(api, "/api/v1/nodes")[1].param("resourceVersion") == later
    assert len(_lists(api, "/api/v1/nodes")) == 1


def test_a_dropped_stream_is_watched_again_from_where_it_was(api: FakeApiServer, cache: KubeCache) -> None:
    _cluster(api)
    cache.read(LOADED)
    eventually(lambda: len(_watches(api, "/api/v1/pods")) == 1)
    api.add(pod_json("train-1", "gpu-2"))
    eventually(lambda: "train-1" in _pod_names(cache))
    seen_rv = _reflector(cache, "pods").resource_version
    api.drop_watches()
    eventually(lambda: len(_watches(api, "/api/v1/pods")) == 2)
    assert _watches(api, "/api/v1/pods")[1].param("resourceVersion") == seen_rv
    api.add(pod_json("train-2", "gpu-2"))
    eventually(lambda: "train-2" in _pod_names(cache))
    assert cache.read(LOADED).findings == ()
    assert len(_lists(api, "/api/v1/pods")) == 1


def test_410_gone_lists_again(api: FakeApiServer, cache: KubeCache) -> None:
    """A watch from a compacted resourceVersion gets 410 "too old resource version": the reflector lists
    again (seeing what changed while it could not watch) and watches from the new list. While it is
    throttled (429) it only watches again, from where it was, as client-go does."""
    _cluster(api)
    cache.read(LOADED)
    eventually(lambda: len(_watches(api, "/api/v1/pods")) == 1)
    pods = _reflector(cache, "pods")
    api.inject("/api/v1/pods", status=429, times=None, watch=True)
    api.drop_watches()
    eventually(lambda: pods.staleness() is not None)
    api.add(pod_json("train-1", "gpu-2"))
    api.remove("Pod", "train-0", "ml")
    api.compact()
    eventually(lambda: len(_watches(api, "/api/v1/pods")) >= 4)  # throttled: watched again, not listed
    assert len(_lists(api, "/api/v1/pods")) == 1
    api.clear_faults()
    eventually(lambda: len(_lists(api, "/api/v1/pods")) == 2)
    eventually(lambda: pods.staleness() is None and _pod_names(cache) == ["train-1"])
    assert any(w.fault is None for w in _watches(api, "/api/v1/pods")[2:])
    objects = cache.read(LOADED)
    assert [p.name for p in objects.pods] == ["train-1"] and objects.findings == ()
    assert len(_lists(api, "/api/v1/pods")) == 2  # the reflector's list, none by the read
    # The metrics count that list as a relist after 410 Gone, and the throttled watches as none.
    assert pods.status().relists == {"gone": 1, "watch-failed": 0, "stale": 0, "policy": 0}
    assert _reflector(cache, "nodes").status().relists == dict.fromkeys(RELIST_REASONS, 0)


def test_a_broken_watch_is_a_finding_and_a_fresh_list_before_the_snapshot(
    api: FakeApiServer, cache: KubeCache
) -> None:
    """Every watch answered 503: the reflector lists again between its tries (client-go's rule), but a
    list is not a watch: the kind stays stale, and each read lists it again itself, with a finding."""
    _cluster(api)
    cache.read(LOADED)
    eventually(lambda: len(_watches(api, "/api/v1/pods")) == 1)
    api.inject("/api/v1/pods", status=503, times=None, watch=True, message="etcd leader changed")
    api.drop_watches()
    pods = _reflector(cache, "pods")
    eventually(lambda: pods.staleness() is not None)
    eventually(lambda: len(_lists(api, "/api/v1/pods")) >= 2)  # the reflector's own list after a 503
    api.add(pod_json("train-1", "gpu-2"))
    listed = len(_lists(api, "/api/v1/pods"))
    objects = cache.read(LOADED)
    assert sorted(p.name for p in objects.pods) == ["train-0", "train-1"]
    [finding] = objects.findings
    assert finding.kind == STALE_CLUSTER_CACHE
    assert finding.detail.startswith("pods: the watch cache was stale (watch broken for ")
    assert "HTTP 503" in finding.detail and "etcd leader changed" in finding.detail
    assert "listed again before this snapshot" in finding.detail
    assert len(_lists(api, "/api/v1/pods")) > listed  # the read's own list
    assert pods.staleness() is not None  # still no watch: the next read lists again
    assert [f.kind for f in cache.read(LOADED).findings] == [STALE_CLUSTER_CACHE]
    # The reflector's lists after failed watches, and the two reads' own, each counted by why.
    relists = pods.status().relists
    assert relists["stale"] == 2 and relists["watch-failed"] >= 1
    assert relists["gone"] == relists["policy"] == 0


def test_a_broken_watch_whose_list_fails_too_fails_the_read(api: FakeApiServer, cache: KubeCache) -> None:
    _cluster(api)
    cache.read(LOADED)
    eventually(lambda: len(_watches(api, "/api/v1/pods")) == 1)
    api.inject("/api/v1/pods", status=503, times=None)
    api.drop_watches()
    eventually(lambda: _reflector(cache, "pods").staleness() is not None)
    with pytest.raises(KubeSourceError) as failed:
        cache.read(LOADED)
    first, *rest = failed.value.problems
    assert first.startswith("pods: the watch cache is stale (watch broken for ")
    assert first.endswith("and listing again failed")
    assert rest and rest[0].startswith("cannot list pods: HTTP 503")


def test_a_silent_watch_is_stale_after_the_bound(api: FakeApiServer, api_client: client.ApiClient) -> None:
    """A watch request the server holds without an answer (no headers, no event, no bookmark) leaves
    the kind unheard of: past `stale_after` a read lists it again, with a finding."""
    _cluster(api)
    cache = KubeCache(api_client, stale_after=3.0, backoff=lambda attempt: 0.1)
    try:
        cache.read(LOADED)
        eventually(lambda: len(_watches(api, "/apis/policy/v1/poddisruptionbudgets")) >= 1)
        api.inject("/apis/policy/v1/poddisruptionbudgets", delay=30, times=None, watch=True)
        api.drop_watches()
        pdbs = _reflector(cache, "poddisruptionbudgets")
        eventually(lambda: pdbs.staleness() is not None, timeout=15)
        assert (pdbs.staleness() or "").startswith("nothing heard from the API server for ")
        objects = cache.read(LOADED)
        [finding] = [f for f in objects.findings if f.kind == STALE_CLUSTER_CACHE]
        assert finding.detail.startswith("poddisruptionbudgets: the watch cache was stale (nothing heard")
        assert "(more than 3s)" in finding.detail
        assert [p.key for p in objects.pdbs] == [("ml", "train-pdb")]
    finally:
        api.clear_faults()
        cache.stop()


def test_an_untranslatable_pod_fails_the_read_until_it_is_fixed(api: FakeApiServer, cache: KubeCache) -> None:
    _cluster(api)
    cache.read(LOADED)
    eventually(lambda: len(_watches(api, "/api/v1/pods")) == 1)
    bad = pod_json("bad", "gpu-2", cpu="lots")
    api.add(bad)
    eventually(lambda: bool(_reflector(cache, "pods").store().problems))
    with pytest.raises(KubeSourceError) as failed:
        cache.read(LOADED)
    assert list(failed.value.problems) == [
        'Pod ml/bad: spec.containers[0].resources.requests.cpu: invalid quantity "lots"'
    ]
    api.add(pod_json("bad", "gpu-2", cpu="2"))
    eventually(lambda: not _reflector(cache, "pods").store().problems)
    assert sorted(p.name for p in cache.read(LOADED).pods) == ["bad", "train-0"]


def test_a_policy_that_translates_pods_differently_lists_them_again(
    api: FakeApiServer, cache: KubeCache
) -> None:
    _cluster(api)
    api.add(pod_json("w-0", "gpu-2", labels={"team-job": "big"}))
    assert [p.gang for p in cache.read(LOADED).pods] == [None, None]
    gangs = parse_policy({"gangs": {"keys": ["team-job"]}})
    assert {p.name: p.gang for p in cache.read(gangs).pods} == {"train-0": None, "w-0": "ml/big"}
    assert len(_lists(api, "/api/v1/pods")) == 2
    assert len(_lists(api, "/api/v1/nodes")) == 1
    assert _reflector(cache, "pods").status().relists["policy"] == 1


def test_status_says_how_long_since_each_list_was_heard_from_and_its_relists(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    """What the daemon's metrics export: per list, seconds since the API server last said anything about
    it (the age that makes it stale), on the cache's monotonic clock, and no relist after the first sync."""
    _cluster(api)
    clock = [1000.0]
    cache = KubeCache(api_client, backoff=lambda attempt: 0.1, monotonic=lambda: clock[0])
    try:
        assert cache.status() == ()  # nothing before the first sync
        cache.read(LOADED)
        status = {one.what: one for one in cache.status()}
        assert {what: one.kind for what, one in status.items()} == {
            "nodes": "Node",
            "pods": "Pod",
            "poddisruptionbudgets": "PodDisruptionBudget",
        }
        assert all(one.relists == dict.fromkeys(RELIST_REASONS, 0) for one in status.values())
        eventually(lambda: len(_watches(api, "/api/v1/pods")) == 1)
        pods = _reflector(cache, "pods")

        def grows() -> bool:  # nothing heard while the clock moves: the age follows it
            before = pods.status().age_seconds
            clock[0] += 42
            after = pods.status().age_seconds
            return before is not None and after is not None and after - before == 42

        eventually(grows)
        clock[0] += 200  # past the 180 s bound: the same age makes the kind stale
        age = pods.status().age_seconds
        assert age is not None and age > 200
        assert f"nothing heard from the API server for {age:.0f}s" in (pods.staleness() or "")
        api.add(pod_json("train-1", "gpu-2"))  # an event: heard from just now
        eventually(lambda: pods.status().age_seconds == 0)
    finally:
        cache.stop()


def test_namespaced_caches_watch_each_namespace(api: FakeApiServer, api_client: client.ApiClient) -> None:
    _cluster(api)
    api.add(pod_json("web", "gpu-2", namespace="web", gpus=0))
    api.add(pod_json("other", "gpu-2", namespace="other", gpus=0))
    cache = KubeCache(api_client, namespaces=["ml", "web"], backoff=lambda attempt: 0.1)
    try:
        assert sorted(p.ref for p in cache.read(LOADED).pods) == ["ml/train-0", "web/web"]
        eventually(lambda: len(_watches(api, "/api/v1/namespaces/web/pods")) == 1)
        api.add(pod_json("web-2", "gpu-2", namespace="web", gpus=0))
        api.add(pod_json("other-2", "gpu-2", namespace="other", gpus=0))
        eventually(lambda: "web-2" in _pod_names(cache, "pods in web"))
        assert sorted(p.ref for p in cache.read(LOADED).pods) == ["ml/train-0", "web/web", "web/web-2"]
        assert not _watches(api, "/api/v1/pods")
    finally:
        cache.stop()


def test_a_kube_source_builds_snapshots_from_the_cache(
    api: FakeApiServer, api_client: client.ApiClient, cache: KubeCache
) -> None:
    _cluster(api)
    source = KubeSource(api_client, LOADED, cluster=cache.read)
    first = source.snapshot(NOW)
    api.add(pod_json("train-1", "gpu-2"))
    eventually(lambda: "train-1" in _pod_names(cache))
    second = source.snapshot(NOW)
    assert [p.name for p in first.pods] == ["train-0"]
    assert [p.name for p in second.pods] == ["train-0", "train-1"]
    assert len(_lists(api, "/api/v1/pods")) == 1 and len(_lists(api, "/api/v1/nodes")) == 1


def test_stop_ends_the_watches(api: FakeApiServer, api_client: client.ApiClient) -> None:
    _cluster(api)
    cache = KubeCache(api_client)
    cache.read(LOADED)
    eventually(lambda: len(_watches(api, "/api/v1/pods")) == 1)
    cache.stop(timeout=60)  # generous: a loaded machine is slow, not wrong; what matters is that they end
    assert not any(t.is_alive() for t in cache._threads)
    with pytest.raises(KubeSourceError, match="stopped"):
        cache.read(LOADED)


# --------------------------------------------------------------------------- the daemon

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


def test_the_daemon_keeps_one_watch_per_kind_across_cycles(
    api: FakeApiServer, api_client: client.ApiClient, cache: KubeCache
) -> None:
    add_consolidation_cluster(api)
    daemon = Daemon(
        CONSOLIDATE,
        kube_snapshot_source(api_client, cluster=cache.read),
        dry_run=True,
        clock=Clock(wall=lambda: NOW),
    )
    reports = []
    try:
        reports.append(daemon.run_cycle(raise_errors=True))
        eventually(lambda: all(len(_watches(api, path)) == 1 for path in _KIND_PATHS))
        api.add(pod_json("x4", "a-1"))
        eventually(lambda: "x4" in _pod_names(cache))
        reports.append(daemon.run_cycle(raise_errors=True))
        api.remove("Pod", "x4", "ml")
        eventually(lambda: "x4" not in _pod_names(cache))
        reports.append(daemon.run_cycle(raise_errors=True))
    finally:
        daemon.shutdown()
    assert [r.summary.pods if r is not None else None for r in reports] == [6, 7, 6]
    assert [r.freed_nodes if r is not None else None for r in reports] == [("a-1",), (), ("a-1",)]
    for path in _KIND_PATHS:
        assert len(_lists(api, path)) == 1, path
        assert len(_watches(api, path)) == 1, path
    assert not api.writes()


_KIND_PATHS = ("/api/v1/nodes", "/api/v1/pods", "/apis/policy/v1/poddisruptionbudgets")


def test_a_live_daemon_does_not_act_when_the_cache_is_stale_and_cannot_be_listed(
    api: FakeApiServer, api_client: client.ApiClient, cache: KubeCache
) -> None:
    """The cluster would be consolidated (a-1 drained), but the pods' watch is broken and the pods
    cannot be listed: the cycle fails and nothing is evicted."""
    add_consolidation_cluster(api)
    source = kube_snapshot_source(api_client, cluster=cache.read)
    assert KubeSource(api_client, CONSOLIDATE).snapshot(NOW).pods  # the cluster is readable
    cache.read(CONSOLIDATE)
    eventually(lambda: len(_watches(api, "/api/v1/pods")) == 1)
    api.inject("/api/v1/pods", status=503, times=None)
    api.drop_watches()
    eventually(lambda: _reflector(cache, "pods").staleness() is not None)
    daemon = Daemon(
        CONSOLIDATE,
        source,
        dry_run=False,
        live=LiveEdge(KubeEvictor(api_client)),
        clock=Clock(wall=lambda: NOW),
    )
    try:
        assert daemon.run_cycle() is None
    finally:
        daemon.shutdown()
    assert daemon.counts["error"] == 1
    assert not api.writes()
