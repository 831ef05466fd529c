"""The fake API server's watch (`?watch=1`), as kube-apiserver's watch cache serves it: events after a
list's resourceVersion, DELETED at the deletion's own version, bookmarks, 410 Gone after compaction,
and the stream ending after timeoutSeconds."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import requests

from tests.fake_apiserver import FakeApiServer


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def _watch(fake: FakeApiServer, query: str) -> list[dict[str, Any]]:
    with requests.get(f"{fake.url}/api/v1/nodes?watch=1&{query}", stream=True, timeout=10) as r:
        assert r.status_code == 200
        return [json.loads(line) for line in r.iter_lines() if line]


def test_watch_from_list_rv_sees_only_later_changes_in_order() -> None:
    with FakeApiServer() as fake:
        fake.add(_node("a"))
        rv = requests.get(f"{fake.url}/api/v1/nodes", timeout=5).json()["metadata"]["resourceVersion"]
        fake.add(_node("b"))
        fake.remove("Node", "a")
        events = _watch(fake, f"resourceVersion={rv}&timeoutSeconds=1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "b"),
        ("DELETED", "a"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert int(rv) < versions[0] < versions[1]


def test_watch_without_rv_starts_with_current_objects() -> None:
    with FakeApiServer() as fake:
        fake.add(_node("a"))
        events = _watch(fake, "timeoutSeconds=1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a")]


def test_compacted_rv_answers_410_error_event() -> None:
    with FakeApiServer() as fake:
        fake.add(_node("a"))
        rv = requests.get(f"{fake.url}/api/v1/nodes", timeout=5).json()["metadata"]["resourceVersion"]
        fake.add(_node("b"))
        fake.compact()
        events = _watch(fake, f"resourceVersion={rv}&timeoutSeconds=5")
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410
    assert "too old resource version" in events[0]["object"]["message"]


def test_bookmarks_advance_rv_and_timeout_ends_stream() -> None:
    with FakeApiServer() as fake:
        fake.add(_node("a"))
        rv = requests.get(f"{fake.url}/api/v1/nodes", timeout=5).json()["metadata"]["resourceVersion"]
        fake.add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"}})
        started = time.monotonic()
        events = _watch(fake, f"resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=2")
        elapsed = time.monotonic() - started
    assert [e["type"] for e in events] == ["BOOKMARK"]
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) > int(rv)
    assert elapsed < 6


def _pod(name: str, phase: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "status": {"phase": phase},
    }


def test_field_selector_is_judged_before_and_after_each_change() -> None:
    """As the cacher's convertToWatchEvent: a pod leaving `status.phase!=Succeeded` is DELETED (its
    last matching state, at the change's resourceVersion), one entering it ADDED."""
    with FakeApiServer() as fake:
        fake.add(_pod("a", "Running"))
        fake.add(_pod("b", "Succeeded"))
        rv = requests.get(f"{fake.url}/api/v1/pods", timeout=5).json()["metadata"]["resourceVersion"]
        finished = fake.add(_pod("a", "Succeeded"))
        fake.add(_pod("b", "Running"))  # restarted under the same name: it matches again
        fake.add(_pod("c", "Succeeded"))  # never matched: never heard of
        with requests.get(
            f"{fake.url}/api/v1/pods?watch=1&resourceVersion={rv}&timeoutSeconds=1"
            "&fieldSelector=status.phase%21%3DSucceeded",
            stream=True,
            timeout=10,
        ) as r:
            events = [json.loads(line) for line in r.iter_lines() if line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("DELETED", "a"),
        ("ADDED", "b"),
    ]
    gone = events[0]["object"]
    assert gone["status"]["phase"] == "Running"  # the state the watcher last saw
    assert gone["metadata"]["resourceVersion"] == finished["metadata"]["resourceVersion"]


def test_drop_watches_cuts_open_streams_without_their_last_chunk() -> None:
    with FakeApiServer() as fake:
        fake.add(_node("a"))
        rv = requests.get(f"{fake.url}/api/v1/nodes", timeout=5).json()["metadata"]["resourceVersion"]
        with requests.get(
            f"{fake.url}/api/v1/nodes?watch=1&resourceVersion={rv}&timeoutSeconds=30", stream=True, timeout=10
        ) as r:
            fake.add(_node("b"))
            lines = r.iter_lines()
            first = json.loads(next(line for line in lines if line))
            started = time.monotonic()
            fake.drop_watches()
            with pytest.raises(requests.exceptions.ChunkedEncodingError):
                for _ in lines:
                    pass
        assert time.monotonic() - started < 5
        assert first["type"] == "ADDED"
        events = _watch(fake, f"resourceVersion={rv}&timeoutSeconds=1")  # a new watch is served
    assert [e["object"]["metadata"]["name"] for e in events] == ["b"]


def test_a_fault_can_hit_only_watches() -> None:
    with FakeApiServer() as fake:
        fake.add(_node("a"))
        fake.inject("/api/v1/nodes", status=503, times=None, watch=True)
        assert requests.get(f"{fake.url}/api/v1/nodes", timeout=5).status_code == 200
        watched = requests.get(f"{fake.url}/api/v1/nodes?watch=1&timeoutSeconds=1", timeout=5)
        assert watched.status_code == 503
        assert watched.json()["code"] == 503
