"""The fake API server's watch (`?watch=1`), as kube-apiserver's watch cache serves it: events after a
list's resourceVersion, DELETED at the deletion's own version, bookmarks, 410 Gone after compaction,
and the stream ending after timeoutSeconds."""

from __future__ import annotations

import json
import time
from typing import Any

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
