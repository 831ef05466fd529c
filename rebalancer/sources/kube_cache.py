"""The daemon's live cache of nodes, pods and PDBs: list once, then watch, as real controllers do.

Owns keeping the objects a snapshot needs current between cycles, and saying when they may not be:

- one `Reflector` per list call of `kube_lists.cluster_calls` (nodes; active pods, with the same field
  selector and namespace scoping as the per-cycle lists; PDBs), each on its own thread: a list (pages
  decoded into the model as they arrive, `kube_lists.KindStore`: no raw page is kept), then a watch from
  the list's resourceVersion with `allowWatchBookmarks=true`, ADDED / MODIFIED / DELETED applied as they
  arrive (decoded the same way: each event's object kept as its JSON until the store decodes it into its
  kind's Struct), the resourceVersion of every event and bookmark kept for the next watch;
- `KubeCache.read(loaded)`: the `kube.ClusterReader` the daemon's KubeSource builds each snapshot from.
  The first read lists every kind in the caller's thread (the initial sync) and starts the watches;
- `KubeCache.status()`: per list call, for the daemon's metrics, how long ago the API server was last
  heard from about it (a list, a watch served, an event or bookmark, a stream ending on time: the age
  that makes it stale) and how many times it was listed again since the first sync, by why
  (`RELIST_REASONS`: `gone`, a watch answered 410 Gone; `watch-failed`, a watch the API server did not
  serve or ended with an error; `stale`, the reading cycle found it stale; `policy`, pods translated
  under a changed policy); a relist counts once its list succeeded.

Never a decision on stale data: a kind is stale when its watch is broken (the last watch request
failed, until one succeeds), or nothing has been heard from the API server for it (an answer, an event,
a bookmark, a stream ending on time) within `stale_after` (default 180 s). A stale kind is listed again
synchronously, in the reading cycle, before the snapshot is built, and the snapshot carries a
`stale-cluster-cache` finding naming the kind, why and for how long; if that list fails too, the read
raises `KubeSourceError` and the cycle fails, as a failed list does without the cache: nothing is decided.
Why 180 s: the API server's watch cache bookmarks each watcher about once a minute (the cacher's
bookmark frequency), and every watch here asks the server to end it within 2/3 of the bound (below),
so a healthy stream is heard from well within it even from a server that sends no bookmarks, and a
connection that went silent past its own deadline (plus 1/6 of the bound) is dropped and made again.
A policy reload that changes how pods translate (gangs, GPU sharing) lists pods again the same way.

Modelled on client-go's tools/cache/reflector.go; where it differs, on purpose:
- every list is a consistent read (no resourceVersion, paged), never `resourceVersion=0` from the
  watch cache (which may be older than what a previous cycle saw);
- a watch timeout random in [1/3, 2/3) of `stale_after` (60-120 s by default) where client-go takes
  [5, 10) minutes: a watch from a recent resourceVersion costs the server little, and the bound on
  silence is what lets a cycle trust the cache;
- as client-go: after a failed watch (a refused connection or 429: watch again; any other error
  answer, ERROR event or unreadable event: list again) the reflector backs off first
  (`kubeapi.exponential_backoff(0.8, 30)`, client-go's 800 ms to 30 s); 410 Gone ("too old resource
  version", as an HTTP answer or an ERROR event) lists again at once, from a consistent read; a stream
  that drops mid-way is watched again from the last resourceVersion at once. Differs: the kind stays
  stale (broken) until a watch is served again, even when a list in between succeeded, since a list
  alone is not kept current;
- no resync period, no informer handlers or indexers: the store is the snapshot's objects only.

It must not read the wall clock (only `time.monotonic`, for ages), write to the cluster or decide
anything. Controllers are not cached: the KubeSource lists the kinds the GPU pods' walk needs each cycle.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import msgspec
import structlog
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from rebalancer.kubeapi import Backoff, describe_error, exponential_backoff
from rebalancer.model import Finding
from rebalancer.policy import LoadedPolicy
from rebalancer.sources import kube_types
from rebalancer.sources.kube_lists import (
    ClusterObjects,
    Decoding,
    KindStore,
    KubeSourceError,
    ListCall,
    Lister,
    assemble,
    cluster_calls,
    decoding_of,
    head_of,
)

__all__ = [
    "DEFAULT_STALE_AFTER",
    "RELIST_REASONS",
    "STALE_CLUSTER_CACHE",
    "KubeCache",
    "ListStatus",
    "Reflector",
    "RelistReason",
]

# The finding of a snapshot whose cache of a kind was stale and listed again before it was built.
STALE_CLUSTER_CACHE: Final = "stale-cluster-cache"
# Seconds without word from the API server after which a kind's cache is not trusted (see above).
DEFAULT_STALE_AFTER = 180.0
# client-go's reflector backoff: 800 ms doubling up to 30 s.
DEFAULT_BACKOFF: Backoff = exponential_backoff(0.8, 30.0)
# A stream that ends this soon without an event is not a healthy watch: back off before the next one.
_SHORT_WATCH = 1.0

log = structlog.get_logger("rebalancer.kube_cache")

JsonObj = Mapping[str, Any]
_Ended = Literal["ended", "dropped", "expired", "superseded", "stopped"]
RelistReason = Literal["gone", "watch-failed", "stale", "policy"]
RELIST_REASONS: tuple[RelistReason, ...] = ("gone", "watch-failed", "stale", "policy")


@dataclass(frozen=True)
class ListStatus:
    """One list call's cache as the metrics show it: its kind, how long since the API server was last
    heard from about it (None before its first list) and its relists since the first sync, by reason."""

    kind: str
    what: str
    age_seconds: float | None
    relists: Mapping[str, int]


class _WatchFailed(Exception):
    """A watch request the API server did not serve, or a stream that ended with an error event.
    `relist`: whether the reflector lists again before its next watch (client-go's rule: not after a
    refused connection or a 429, which say the server is busy or away, not that the watch is wrong)."""

    def __init__(self, why: str, *, relist: bool = True) -> None:
        super().__init__(why)
        self.relist = relist


def _retriable(exc: BaseException) -> bool:
    """client-go's isWatchErrorRetriable: a refused connection or 429 Too Many Requests."""
    if isinstance(exc, ApiException):
        return bool(exc.status == 429)
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        return isinstance(exc.__context__, ConnectionRefusedError) or "Connection refused" in str(exc)
    return isinstance(exc, ConnectionRefusedError)


class Reflector:
    """One list call's objects, listed then watched (see the module docstring). Thread-safe: `run` on
    its own thread, `relist` / `staleness` / `store` from the reading cycle."""

    def __init__(
        self,
        call: ListCall,
        lister: Lister,
        decoding: Decoding,
        *,
        stale_after: float = DEFAULT_STALE_AFTER,
        connect_timeout: float = 5.0,
        backoff: Backoff = DEFAULT_BACKOFF,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.call = call
        self._lister = lister
        self._stale_after = stale_after
        self._connect_timeout = connect_timeout
        self._backoff = backoff
        self._monotonic = monotonic
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._list_lock = threading.Lock()
        self._store = KindStore(call.kind, decoding)
        self._rv = ""
        self._generation = 0  # moved on by every list: a watch of an older one stops applying events
        self._synced = False
        self._heard = 0.0  # monotonic time of the last word from the API server
        self._broken: str | None = None  # why the last watch request failed, until one succeeds
        self._broken_since = 0.0
        self._response: urllib3.BaseHTTPResponse | None = None
        self._relists: dict[RelistReason, int] = dict.fromkeys(RELIST_REASONS, 0)

    # ---- what the reading cycle asks

    @property
    def decoding(self) -> Decoding:
        with self._lock:
            return self._store.decoding

    @property
    def resource_version(self) -> str:
        """The resourceVersion the next watch starts from (the last list's, event's or bookmark's)."""
        with self._lock:
            return self._rv

    def staleness(self) -> str | None:
        """Why this kind's objects must not be trusted now, or None."""
        now = self._monotonic()
        with self._lock:
            if not self._synced:
                return "never listed"
            if self._broken is not None:
                return f"watch broken for {now - self._broken_since:.0f}s: {self._broken}"
            age = now - self._heard
            if age > self._stale_after:
                return (
                    f"nothing heard from the API server for {age:.0f}s (more than {self._stale_after:.0f}s)"
                )
            return None

    def status(self) -> ListStatus:
        """How long since the API server was last heard from about this call, and its relists."""
        now = self._monotonic()
        with self._lock:
            age = now - self._heard if self._synced else None
            relists: dict[str, int] = dict(self._relists.items())
            return ListStatus(self.call.kind, self.call.what, age, relists)

    def store(self) -> KindStore:
        """A copy of the decoded objects as they are now."""
        with self._lock:
            copy = KindStore(self._store.kind, self._store.decoding)
            copy.objects = dict(self._store.objects)
            copy.problems = dict(self._store.problems)
            return copy

    def relist(
        self,
        decoding: Decoding | None = None,
        *,
        unless_listed_since: int | None = None,
        reason: RelistReason | None = None,
    ) -> None:
        """List now, in the caller's thread, and watch on from the new list (a watch of the old one stops
        applying events). `unless_listed_since`: skip when another list completed since that
        generation. `reason`: why a synced cache is listed again (counted once the list succeeded;
        None: the first sync). Raises KubeSourceError when the list fails; the objects held stay as
        they were."""
        with self._list_lock:
            with self._lock:
                if unless_listed_since is not None and self._generation != unless_listed_since:
                    return
                fresh = KindStore(self.call.kind, decoding or self._store.decoding)
            rv = self._lister.fill(self.call, fresh)
            with self._lock:
                self._store = fresh
                self._rv = rv
                self._generation += 1
                self._synced = True
                self._heard = self._monotonic()
                if reason is not None:
                    self._relists[reason] += 1

    # ---- the watch thread

    def run(self, stop: threading.Event) -> None:
        """Watch until `stop` is set: again after each stream ends; a list after 410 Gone and, after a
        backoff, after a failed watch (only a backoff when the connection was refused or throttled)."""
        failures = 0
        relist: RelistReason | None = None
        while not stop.is_set():
            with self._lock:
                rv, generation = self._rv, self._generation
            if relist is not None:
                try:
                    self.relist(unless_listed_since=generation, reason=relist)
                except KubeSourceError as exc:
                    self._mark_broken("; ".join(exc.problems))
                    stop.wait(self._backoff(failures))
                    failures += 1
                    continue
                relist = None
                continue
            started = self._monotonic()
            try:
                ended, events = self._watch(rv, generation, stop)
            except _WatchFailed as failed:
                self._mark_broken(str(failed))
                relist = "watch-failed" if failed.relist else None
                stop.wait(self._backoff(failures))
                failures += 1
                continue
            if ended == "expired":
                log.info("watch expired: listing again", what=self.call.what, resource_version=rv)
                relist = "gone"
                continue
            if ended in ("ended", "dropped") and not events and self._monotonic() - started < _SHORT_WATCH:
                stop.wait(self._backoff(failures))
                failures += 1
                continue
            failures = 0

    def close(self) -> None:
        """Cut the open watch stream, if any (its thread then sees the stop)."""
        with self._lock:
            response = self._response
        if response is not None:
            response.shutdown()

    def _mark_broken(self, why: str) -> None:
        with self._lock:
            if self._broken is None:
                self._broken_since = self._monotonic()
                log.warning("watch broken", what=self.call.what, error=why)
            self._broken = why

    def _watch_timeout(self) -> int:
        low = self._stale_after / 3
        return max(1, int(low + self._rng.random() * low))

    def _watch(self, rv: str, generation: int, stop: threading.Event) -> tuple[_Ended, int]:
        """One watch request and its stream: how it ended and how many events it carried."""
        seconds = self._watch_timeout()
        call = self.call
        kwargs: dict[str, Any] = dict(
            call.params,
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            _preload_content=False,
            _request_timeout=(self._connect_timeout, seconds + max(1.0, self._stale_after / 6)),
        )
        try:
            response = cast("urllib3.BaseHTTPResponse", call.call(*call.args, **kwargs))
        except ApiException as exc:
            if exc.status == 410:
                return "expired", 0
            raise _WatchFailed(describe_error(exc), relist=not _retriable(exc)) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _WatchFailed(describe_error(exc), relist=not _retriable(exc)) from None
        with self._lock:
            self._response = response
            self._heard = self._monotonic()
            self._broken = None
        events = 0
        if stop.is_set():
            # `close()` ran while this request was being made, before the stream was published: it had
            # nothing to cut, so stop here rather than block reading a stream nobody will end.
            with self._lock:
                self._response = None
            response.release_conn()
            return "stopped", events
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if stop.is_set():
                    return "stopped", events
                if not line:
                    continue
                ended = self._apply(line, generation)
                if ended is not None:
                    return ended, events
                events += 1
        except (urllib3.exceptions.HTTPError, OSError):
            return ("stopped" if stop.is_set() else "dropped"), events
        finally:
            with self._lock:
                self._response = None
            response.release_conn()
        with self._lock:
            self._heard = self._monotonic()
        return "ended", events

    def _apply(self, line: str, generation: int) -> _Ended | None:
        """Apply one event line to the store; how the stream ends when it must. The event's object is
        kept as its JSON: its key and resourceVersion are read alone, and the store decodes it into its
        kind's Struct."""
        try:
            event = _EVENTS.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise _WatchFailed(f"the API sent an invalid watch event: {exc}") from None
        kind, obj = event.type_, event.object_
        if bytes(memoryview(obj)[:1]) != b"{":
            raise _WatchFailed(f"the API sent a watch event without an object ({kind!r})")
        if kind == "ERROR":
            status = kube_types.decode_any(obj)
            if status.get("code") == 410:
                return "expired"
            raise _WatchFailed(f"HTTP {status.get('code')}: {status.get('message') or status.get('reason')}")
        _key, rv = head_of(obj)
        with self._lock:
            if self._generation != generation:
                return "superseded"
            self._heard = self._monotonic()
            if kind in ("ADDED", "MODIFIED"):
                self._store.put(obj)
            elif kind == "DELETED":
                self._store.delete(obj)
            elif kind != "BOOKMARK":
                raise _WatchFailed(f"the API sent a watch event of unknown type {kind!r}")
            if rv is not None:
                self._rv = rv
        return None


class _WatchEvent(msgspec.Struct):
    """A watch event: its type, and its object's JSON (decoded by kind when applied)."""

    type_: Any = msgspec.field(default=None, name="type")
    object_: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw, name="object")


_EVENTS = msgspec.json.Decoder(_WatchEvent)


class KubeCache:
    """Nodes, pods and PDBs kept current by one Reflector (and thread) per list call, for the daemon's
    life; `read` is a `kube.ClusterReader`. `stop()` ends the watches."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        namespaces: list[str] | tuple[str, ...] | None = None,
        stale_after: float = DEFAULT_STALE_AFTER,
        lister: Lister | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if stale_after <= 0:
            raise ValueError("stale_after must be positive")
        scoped = tuple(dict.fromkeys(namespaces)) if namespaces is not None else None
        self._calls = cluster_calls(api_client, scoped)
        self._lister = lister or Lister()
        self._stale_after = stale_after
        self._backoff = backoff
        self._monotonic = monotonic
        self._reflectors: list[Reflector] | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()

    @property
    def reflectors(self) -> tuple[Reflector, ...]:
        return tuple(self._reflectors or ())

    @property
    def stale_after(self) -> float:
        """Seconds without word from the API server after which a kind is stale."""
        return self._stale_after

    def read(self, loaded: LoadedPolicy) -> ClusterObjects:
        """The cached objects, every stale kind listed again first (with a finding); the first read
        lists every kind and starts the watches. Raises KubeSourceError when a needed list fails."""
        decoding = decoding_of(loaded)
        with self._lock:
            if self._stop.is_set():
                raise KubeSourceError(["the cluster cache is stopped"])
            if self._reflectors is None:
                self._reflectors = self._start(decoding)
            findings: list[Finding] = []
            for reflector in self._reflectors:
                if reflector.call.kind == "Pod" and reflector.decoding != decoding:
                    reflector.relist(decoding, reason="policy")  # pods translated under the new policy
                    continue
                why = reflector.staleness()
                if why is None:
                    continue
                what = reflector.call.what
                try:
                    reflector.relist(reason="stale")
                except KubeSourceError as exc:
                    raise KubeSourceError(
                        [f"{what}: the watch cache is stale ({why}) and listing again failed", *exc.problems]
                    ) from None
                log.warning("stale cluster cache listed again", what=what, why=why)
                findings.append(
                    Finding(
                        kind=STALE_CLUSTER_CACHE,
                        namespace=reflector.call.args[0] if reflector.call.args else None,
                        detail=(
                            f"{what}: the watch cache was stale ({why}); listed again before this snapshot, "
                            "which is built from that list"
                        ),
                    )
                )
            return assemble([reflector.store() for reflector in self._reflectors], findings)

    def status(self) -> tuple[ListStatus, ...]:
        """Each list call's age and relists (nothing before the first read)."""
        return tuple(reflector.status() for reflector in self.reflectors)

    def _start(self, decoding: Decoding) -> list[Reflector]:
        reflectors = [
            Reflector(
                call,
                self._lister,
                decoding,
                stale_after=self._stale_after,
                backoff=self._backoff,
                monotonic=self._monotonic,
            )
            for call in self._calls
        ]
        for reflector in reflectors:
            reflector.relist()
        for reflector in reflectors:
            thread = threading.Thread(
                target=reflector.run, args=(self._stop,), name=f"watch {reflector.call.what}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return reflectors

    def stop(self, timeout: float = 5.0) -> None:
        """End every watch and wait (up to `timeout` seconds in all) for their threads."""
        self._stop.set()
        for reflector in self.reflectors:
            reflector.close()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
