"""The fake API server's watches, for tests only, served as kube-apiserver's watch cache serves them.

`Watches` is the part of `FakeApiServer` that answers `?watch=1`: `watch` checks the path and the
authorizer before any byte is sent, then `_watch_events` yields the changes after the resourceVersion
asked (or ADDED for every current object first), each judged by the label and field selectors on the
object before and after the change (an object that stops matching is DELETED, one that starts matching
ADDED), BOOKMARKs (when asked for) after 0.5 s of quiet, a 410 ERROR event for a compacted
resourceVersion, and ends after `timeoutSeconds`. `drop_watches` cuts every open stream without its last
chunk; `compact` forgets the history, as an etcd compaction.

This module must only read the objects: a watch changes none of them, and hears of exactly the changes
`FakeApiCore._emit` recorded, in their order (`compact` only forgets them).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator, Mapping

from tests.fake_api_core import FakeApiCore
from tests.fake_api_errors import NOT_FOUND_RESOURCE, ApiError, WatchDropped
from tests.fake_api_http import last
from tests.fake_api_kinds import BY_PATH, CORE_PATH, GROUP_PATH, JsonObj, Kind
from tests.fake_api_selectors import Requirement, field_value, parse_field_selector, parse_label_selector


class Watches(FakeApiCore):
    """`?watch=1` requests and what tests do to open watches (drop them, compact the history)."""

    def drop_watches(self) -> None:
        """End every open watch stream without its last chunk, as a restarting API server or a proxy
        dropping the connection does; new watches are served as before."""
        with self._lock:
            self._watch_epoch += 1
            self._changed.notify_all()

    def compact(self) -> None:
        """Forget the watch history up to now (as an etcd compaction): watches from an older
        resourceVersion answer 410 Gone and the client must list again."""
        with self._lock:
            self._history.clear()
            self._compacted_rv = self._last_rv

    def watch(self, path: str, query: Mapping[str, tuple[str, ...]]) -> Iterator[JsonObj]:
        """The events of a `?watch=1` request, as kube-apiserver's watch cache serves them: changes
        after `resourceVersion` (or, with none or "0", ADDED for every current object first), a 410
        ERROR event when that version is compacted, BOOKMARK events (with allowWatchBookmarks) carrying
        the latest resourceVersion, and the end of the stream after `timeoutSeconds`. Raises ApiError
        (before any byte is sent) for an unknown resource or a refused watch."""
        with self._lock:
            arrived = self._watch_epoch_seen.pop(threading.get_ident(), None)
        match = CORE_PATH.match(path) or GROUP_PATH.match(path)
        if match is None:
            raise ApiError(404, NOT_FOUND_RESOURCE)
        parts = match.groupdict()
        kind = BY_PATH.get((parts.get("group") or "", parts["version"], parts["resource"]))
        if kind is None or parts["name"] is not None or kind.qualified in self._missing:
            raise ApiError(404, NOT_FOUND_RESOURCE)
        ns = parts["ns"]
        with self._lock:
            self._authorize("watch", kind, ns, None, None)
        labels = parse_label_selector(last(query, "labelSelector") or "")
        fields = parse_field_selector(last(query, "fieldSelector") or "", kind)
        bookmarks = last(query, "allowWatchBookmarks") in ("true", "1")
        timeout = float(last(query, "timeoutSeconds") or 1800)
        return self._watch_events(
            kind,
            ns=ns,
            since=last(query, "resourceVersion") or "",
            labels=labels,
            fields=fields,
            bookmarks=bookmarks,
            timeout=timeout,
            arrived=arrived,
        )

    def _watch_events(
        self,
        kind: Kind,
        *,
        ns: str | None,
        since: str,
        labels: tuple[Requirement, ...],
        fields: list[tuple[tuple[str, ...], bool, str]],
        bookmarks: bool,
        timeout: float,
        arrived: int | None = None,
    ) -> Iterator[JsonObj]:
        def wanted(obj: JsonObj) -> bool:
            meta = obj["metadata"]
            if ns is not None and meta.get("namespace") != ns:
                return False
            if not all(r.matches(meta.get("labels") or {}) for r in labels):
                return False
            return all((field_value(obj, p) == v) == eq for p, eq, v in fields)

        deadline = time.monotonic() + timeout
        with self._lock:
            epoch = self._watch_epoch if arrived is None else arrived
            if since in ("", "0"):
                position = self._last_rv
                initial = [copy.deepcopy(o) for o in self._store(kind).values() if wanted(o)]
            else:
                position = int(since)
                initial = []
                if position < self._compacted_rv:
                    yield {
                        "type": "ERROR",
                        "object": ApiError(
                            410,
                            f"too old resource version: {position} ({self._compacted_rv})",
                            reason="Expired",
                        ).status(),
                    }
                    return
        for obj in initial:
            yield {"type": "ADDED", "object": obj}
        last_bookmark = time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                if self._watch_epoch != epoch:
                    raise WatchDropped
                events = [
                    (rv, t, o, prev)
                    for rv, g, r, t, o, prev in self._history
                    if rv > position and g == kind.group and r == kind.resource
                ]
                if not events:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._changed.wait(min(left, 0.2))
                    latest = self._last_rv
                else:
                    latest = position
            for rv, t, o, prev in events:
                position = rv
                # cacheWatcher.convertToWatchEvent: the selectors judge the object after the change (none
                # after a deletion) and before it; the watcher hears of the change as its view sees it.
                now_matches = t != "DELETED" and wanted(o)
                before = o if t == "DELETED" else prev
                matched = before is not None and wanted(before)
                if now_matches:
                    yield {"type": "MODIFIED" if matched else "ADDED", "object": copy.deepcopy(o)}
                elif matched and before is not None:
                    gone = copy.deepcopy(before)
                    gone["metadata"]["resourceVersion"] = str(rv)
                    yield {"type": "DELETED", "object": gone}
            if bookmarks and not events and latest > position and time.monotonic() - last_bookmark >= 0.5:
                position = latest
                last_bookmark = time.monotonic()
                yield {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": kind.kind,
                        "apiVersion": kind.api_version,
                        "metadata": {"resourceVersion": str(latest)},
                    },
                }
