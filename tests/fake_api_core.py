"""The fake API server's state and the steps every request shares, for tests only.

`FakeApiCore` is the base of `FakeApiServer` (tests/fake_apiserver.py) and of each part of it that has a
module of its own (the classes it inherits from in tests/fake_api_*.py). Its constructor holds all the
server's state: the objects by kind, the resourceVersion counter, the watch history, the list snapshots
behind `continue` tokens, the request log and the faults, the authorizer's refusals, the admission
denials, the kubelet stand-in's mode and the HTTP server that serves it all. Its methods are the steps
every request shares: finding a kind, its store and an object, stamping a new object, moving the
resourceVersion on, recording a change for watchers (`_emit`) and the authorizer's check.

This module must serve nothing itself (no HTTP, no verb, no helper for tests), and every change to a
stored object goes through `_emit`: a change it does not see is a change every watch misses.
"""

from __future__ import annotations

import copy
import itertools
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from typing import Literal

from tests.fake_api_errors import ApiError, not_found_error
from tests.fake_api_http import Fault, RecordedRequest
from tests.fake_api_kinds import BY_KIND, KINDS, TIME, JsonObj, Kind, default


@dataclass(slots=True)
class ListSnapshot:
    items: list[JsonObj]
    resource_version: str


class FakeApiCore:
    """The state of a fake API server and the steps its requests share; see `FakeApiServer`."""

    def __init__(
        self,
        *,
        clock: Callable[[], datetime] | None = None,
        missing_kinds: Iterable[str] = (),
        kubelet: Literal["prompt", "manual"] = "prompt",
    ) -> None:
        """`missing_kinds`: custom kinds whose CustomResourceDefinition is not installed, by qualified
        resource (`notebooks.kubeflow.org`): every path of theirs answers 404 as for an unknown resource,
        after authorization, as the API server does. `kubelet`: what stands in for the kubelets once a pod
        is deleted gracefully: `prompt` confirms at once (containers that stop on SIGTERM), `manual` leaves
        the pod terminating until `finish_terminating()`."""
        custom = {k.qualified: k for k in KINDS if k.custom}
        unknown = sorted(set(missing_kinds) - set(custom))
        if unknown:
            raise ValueError(
                f"not custom kinds of the fake: {', '.join(unknown)} (known: {', '.join(custom)})"
            )
        self._missing = frozenset(missing_kinds)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._stores: dict[tuple[str, str], dict[tuple[str, str], JsonObj]] = {}
        self._rv = itertools.count(1000)
        self._last_rv = 999
        self._requests: list[RecordedRequest] = []
        self._faults: list[Fault] = []
        # (verb, group, resource[/subresource], namespace) the authorizer refuses, with the user it names.
        self._forbidden: dict[tuple[str, str, str, str], str] = {}
        # (group, resource, namespace) whose updates an admission policy denies: (policy, message, reason).
        self._denials: dict[tuple[str, str, str], tuple[str, str, str]] = {}
        self._snapshots: dict[int, ListSnapshot] = {}
        # Watch history, as the watch cache keeps it: (rv, group, resource, type, object, the object
        # before the change or None), oldest first. A watch from an RV older than `_compacted_rv` answers
        # 410 Gone, as after an etcd compaction.
        self._history: list[tuple[int, str, str, str, JsonObj, JsonObj | None]] = []
        self._compacted_rv = 999
        # Raised by drop_watches(): open watch streams of an older epoch end without their last chunk.
        self._watch_epoch = 0
        self._watch_epoch_seen: dict[int, int] = {}  # handler thread -> the epoch its watch arrived in
        self._changed = threading.Condition(self._lock)
        self._snapshot_ids = itertools.count(1)
        self._clock = clock or (lambda: datetime.now(UTC))
        self._kubelet = kubelet
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def _kind_of(kind: str, api_version: str) -> Kind:
        """The kind of that apiVersion; `v1` (the default of the helpers) also names the one kind of that
        name outside the core group (`get("Deployment", ...)`)."""
        resolved = BY_KIND.get((api_version, kind))
        if resolved is None and api_version == "v1":
            named = [k for k in KINDS if k.kind == kind]
            resolved = named[0] if len(named) == 1 else None
        if resolved is None:
            raise ValueError(f"unsupported kind {api_version}/{kind}")
        return resolved

    def _store(self, kind: Kind) -> dict[tuple[str, str], JsonObj]:
        return self._stores.setdefault((kind.group, kind.resource), {})

    @staticmethod
    def _key(kind: Kind, namespace: str | None, name: str) -> tuple[str, str]:
        return ((namespace or "default") if kind.namespaced else "", name)

    def _next_rv(self) -> str:
        self._last_rv = next(self._rv)
        return str(self._last_rv)

    def _emit(self, kind: Kind, event: str, obj: JsonObj, before: JsonObj | None = None) -> None:
        """Record a change for watchers, with the object `before` a MODIFIED change (selectors are judged
        on both). A DELETED event carries the object at the deletion's own resourceVersion, as etcd3's
        watcher reports it."""
        shown = copy.deepcopy(obj)
        if event == "DELETED":
            shown["metadata"]["resourceVersion"] = self._next_rv()
        prev = copy.deepcopy(before) if before is not None else None
        self._history.append(
            (int(shown["metadata"]["resourceVersion"]), kind.group, kind.resource, event, shown, prev)
        )
        self._changed.notify_all()

    def _fill_new(self, kind: Kind, obj: JsonObj) -> None:
        obj["kind"], obj["apiVersion"] = kind.kind, kind.api_version
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", self._clock().strftime(TIME))
        meta["resourceVersion"] = self._next_rv()
        default(kind, obj)

    def _authorize(self, verb: str, kind: Kind, ns: str | None, name: str | None, sub: str | None) -> None:
        """The authorizer's refusal, worded as the API server words it (k8s.io/apiserver
        responsewriters.Forbidden, apimachinery errors.NewForbidden): the Status names the resource and
        object in `details`, the message the user, verb, resource, API group and namespace."""
        resource = f"{kind.resource}/{sub}" if sub else kind.resource
        user = self._forbidden.get((verb, kind.group, resource, ns or ""))
        if user is None:
            return
        where = f'in the namespace "{ns}"' if ns else "at the cluster scope"
        why = f'User "{user}" cannot {verb} resource "{resource}" in API group "{kind.group}" {where}'
        what = f'{kind.qualified} "{name}"' if name else kind.qualified
        raise ApiError(403, f"{what} is forbidden: {why}", kind=kind, name=name)

    @staticmethod
    def _with_type(kind: Kind, obj: JsonObj) -> JsonObj:
        out = copy.deepcopy(obj)
        out["kind"], out["apiVersion"] = kind.kind, kind.api_version
        return out

    def _existing(self, kind: Kind, ns: str | None, name: str) -> JsonObj:
        found = self._store(kind).get(self._key(kind, ns, name))
        if found is None:
            raise not_found_error(kind, name)
        return found
