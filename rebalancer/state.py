"""Where a live daemon keeps its memory across restarts and leader changes.

Owns `ActuatorState` (the `history.DisruptionHistory` the planner's guards need, the node drains
this rebalancer owns, and the taint key they were marked with) as JSON, and the stores that keep it:

- `MemoryStateStore`: in this object (tests; one process handing its memory to another actuator);
- `FileStateStore`: a JSON file, replaced atomically;
- `ConfigMapStateStore`: JSON under one key of a ConfigMap in the rebalancer's own namespace (what
  `rebalancer run` uses by default), written with one JSON merge patch of that key guarded by the
  resourceVersion last read and fenced by the leader lease (a missing ConfigMap is created), read and
  written through `kubeapi.with_retries`.

A store never stops the daemon: an unreadable state is logged and read as none, a failed save is logged
and made again at the next change (but a ConfigMap store that found a later leader's state refuses
every save until it loads again: `superseded`, which stops the actuator). Version 1 states (evictions
and drains only) are read as they are.
It must not decide anything: what to remember is the actuator's and the history's.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer import rfc3339
from rebalancer.fence import UNFENCED, Fence, FenceLost, RequestTimeout, clip_timeout
from rebalancer.history import NO_HISTORY, DisruptionHistory
from rebalancer.kubeapi import Backoff, describe_answer, read_json, read_or_none, with_retries

__all__ = [
    "STATE_CONFIGMAP",
    "STATE_KEY",
    "ActuatorState",
    "ConfigMapStateStore",
    "DrainRecord",
    "FileStateStore",
    "MemoryStateStore",
    "StateStore",
]

# Where `rebalancer run` keeps its memory by default: this key of this ConfigMap, in its own namespace
# (deploy/rbac.yaml grants exactly this name).
from rebalancer.daemon.names import STATE_CONFIGMAP

STATE_KEY = "actuator-state.json"
STATE_VERSION = 2
# On the state ConfigMap: the leader term (the Lease's leaseTransitions) of the replica that wrote it.
TERM_ANNOTATION = "rebalancer.gpu/leader-term"
_MERGE_PATCH = "application/merge-patch+json"

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class DrainRecord:
    """A node this rebalancer marked draining: the mark's value (its cycle id) and when the drain began."""

    cycle_id: str
    since: datetime


@dataclass(frozen=True)
class ActuatorState:
    """What a live daemon remembers between cycles, as a StateStore keeps it."""

    history: DisruptionHistory = NO_HISTORY
    drains: Mapping[str, DrainRecord] = field(default_factory=dict)
    # The taint key the drains were marked with (`eviction.drain_taint_key` then); None: not recorded.
    drain_taint_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            **self.history.to_json(),
            "drains": {
                node: {"cycle": d.cycle_id, "since": rfc3339.format_utc(d.since)}
                for node, d in sorted(self.drains.items())
            },
            **({"drain_taint_key": self.drain_taint_key} if self.drain_taint_key else {}),
        }

    @classmethod
    def from_json(cls, data: object) -> ActuatorState:
        """Raises ValueError on anything it cannot read."""
        if not isinstance(data, Mapping):
            raise ValueError(f"unreadable actuator state: expected an object, got {type(data).__name__}")
        try:
            drains = {
                str(node): DrainRecord(str(item["cycle"]), rfc3339.parse(str(item["since"])))
                for node, item in (data.get("drains") or {}).items()
            }
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"unreadable actuator state: {exc!r}") from None
        key = data.get("drain_taint_key")
        return cls(
            history=DisruptionHistory.from_json(data),
            drains=drains,
            drain_taint_key=str(key) if key else None,
        )

    def merged_with(self, other: ActuatorState) -> ActuatorState:
        """This state with what `other` (another writer's) adds: its history, its drains of other nodes."""
        return ActuatorState(
            history=self.history.merged_with(other.history),
            drains={**other.drains, **self.drains},
            drain_taint_key=self.drain_taint_key or other.drain_taint_key,
        )


class StateStore(Protocol):
    """Keeps the actuator's memory across restarts and leader changes."""

    def load(self) -> ActuatorState | None: ...

    def save(self, state: ActuatorState) -> ActuatorState | None:
        """Store `state`; what is stored now (another writer's memory merged in), None when not saved."""
        ...


class MemoryStateStore:
    """Keeps the state in this object (tests; a process handing its memory to a new actuator)."""

    def __init__(self, state: ActuatorState | None = None) -> None:
        self.state = state

    def load(self) -> ActuatorState | None:
        return self.state

    def save(self, state: ActuatorState) -> ActuatorState | None:
        self.state = state
        return state


class FileStateStore:
    """Keeps the state in a JSON file, replaced atomically (e.g. on a volume that outlives the container).

    An unreadable file is logged and read as no state, so a corrupt file never stops the daemon.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self) -> ActuatorState | None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read actuator state %s: %s", self.path, exc)
            return None
        try:
            return ActuatorState.from_json(json.loads(text))
        except ValueError as exc:
            log.warning("ignoring unreadable actuator state %s: %s", self.path, exc)
            return None

    def save(self, state: ActuatorState) -> ActuatorState | None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(state.to_json(), out, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp)
            raise
        return state


class ConfigMapStateStore:
    """Keeps the state as JSON under one key (`STATE_KEY`) of a ConfigMap, in the rebalancer's namespace.

    The ConfigMap outlives pods and is shared by the replicas, so a restart or a new leader finds the
    memory of the last one. Writes are fenced twice:

    - `fence` (the leader lease) is asked before every write, which is clipped to the time it grants:
      a replica that no longer holds the lease writes nothing;
    - every write is a JSON merge patch of that key carrying the `metadata.resourceVersion` last read
      (the API server refuses it with 409 when another writer got in between) and the writer's term
      (the Lease's `leaseTransitions` when it became leader, `term()`) in the annotation
      `rebalancer.gpu/leader-term`. On a 409 the store reads the ConfigMap again: a state written in a
      later term is never overwritten (the save is refused, logged, and the store refuses every save
      until the next `load()`); one written late by an earlier term's leader is merged in (every
      eviction and cooldown of both: `ActuatorState.merged_with`); one of this term (someone edited a
      label, or an earlier answer of this writer was lost) is this writer's own: written again. Each
      goes on the new resourceVersion.

    A missing ConfigMap is created. `load()` reads it: a missing ConfigMap or key is no state,
    unreadable content is logged and read as no state. Transport errors, 429 and 5xx answers are
    retried (`retries`, `backoff`); what still fails is logged, never raised.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        namespace: str,
        name: str = STATE_CONFIGMAP,
        key: str = STATE_KEY,
        retries: int = 3,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        request_timeout: RequestTimeout = (5.0, 30.0),
        fence: Fence = UNFENCED,
        term: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.key = key
        self._core = client.CoreV1Api(api_client)
        self._retries = retries
        self._backoff = backoff
        self._sleep = sleep
        self._timeout = request_timeout
        self.fence = fence
        self._term = term
        self._version: str | None = None  # resourceVersion of the ConfigMap as last read or written
        self._missing = False  # the last read found no ConfigMap
        self.superseded = False

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def load(self) -> ActuatorState | None:
        self.superseded = False
        doc = self._read_doc("read")
        return self._state_of(doc) if doc is not None else None

    def save(self, state: ActuatorState) -> ActuatorState | None:
        if self.superseded:
            log.error("actuator state not saved: ConfigMap %s belongs to a later leader term", self.ref)
            return None
        for _ in range(self._retries + 2):
            try:
                self._attempt("save", functools.partial(self._write, state))
                return state
            except FenceLost as lost:
                log.error("actuator state not saved to ConfigMap %s: %s", self.ref, lost.reason)
                return None
            except _Conflict:
                doc = self._read_doc("re-read")
                if doc is None:
                    if self._missing:
                        continue  # deleted meanwhile: created again on the next attempt
                    return None
                stored_term, mine = _term_of(doc), self._term()
                if stored_term is None or mine is None or stored_term == mine:
                    continue  # this writer's own state (or no election): written again on the new version
                if stored_term > mine:
                    self.superseded = True
                    log.error(
                        "actuator state not saved: ConfigMap %s was written in leader term %d, after this "
                        "replica's term %d",
                        self.ref,
                        stored_term,
                        mine,
                    )
                    return None
                stored = self._state_of(doc)  # a late write of an earlier leader: what it did counts
                if stored is not None:
                    log.warning(
                        "ConfigMap %s was written by an earlier leader (term %d) after this one's term %d "
                        "began: its memory is merged in",
                        self.ref,
                        stored_term,
                        mine,
                    )
                    state = state.merged_with(stored)
            except _NotSaved:
                return None
        log.error("actuator state not saved to ConfigMap %s: it kept changing under this writer", self.ref)
        return None

    # ---- requests

    def _timeout_now(self) -> RequestTimeout:
        return clip_timeout(self._timeout, self.fence.check())

    def _read_doc(self, what: str) -> Mapping[str, Any] | None:
        """The ConfigMap as a JSON object (its resourceVersion remembered); None when there is none or
        it cannot be read."""
        try:
            raw = self._attempt(
                what,
                lambda: read_or_none(
                    lambda: self._core.read_namespaced_config_map(
                        self.name, self.namespace, _preload_content=False, _request_timeout=self._timeout
                    )
                ),
            )
        except (_NotSaved, _Conflict):
            return None
        self._missing = raw is None
        if raw is None:
            self._version = None
            return None
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            log.warning("ignoring unreadable ConfigMap %s: %s", self.ref, exc)
            return None
        if not isinstance(doc, dict):
            return None
        self._version = _version_of(doc)
        return doc

    def _state_of(self, doc: Mapping[str, Any]) -> ActuatorState | None:
        data = doc.get("data")
        text = data.get(self.key) if isinstance(data, dict) else None
        if text is None:
            log.warning("ConfigMap %s has no key %s: no stored actuator state", self.ref, self.key)
            return None
        try:
            return ActuatorState.from_json(json.loads(text))
        except (ValueError, TypeError) as exc:
            log.warning("ignoring unreadable actuator state in ConfigMap %s: %s", self.ref, exc)
            return None

    def _annotations(self) -> dict[str, str]:
        term = self._term()
        return {TERM_ANNOTATION: str(term)} if term is not None else {}

    def _write(self, state: ActuatorState) -> None:
        text = json.dumps(state.to_json(), indent=1, sort_keys=True) + "\n"
        if self._version is None and not self._missing:
            self._read_doc("read")
        if self._version is None:
            self._create(text)
            return
        body = {
            "metadata": {"resourceVersion": self._version, "annotations": self._annotations()},
            "data": {self.key: text},
        }
        try:
            response = cast(
                "urllib3.BaseHTTPResponse",
                self._core.patch_namespaced_config_map(
                    self.name,
                    self.namespace,
                    body,
                    _content_type=_MERGE_PATCH,
                    _preload_content=False,
                    _request_timeout=self._timeout_now(),
                ),
            )
        except ApiException as exc:
            if exc.status == 409:
                raise _Conflict from None
            if exc.status == 404:
                self._version = None
                raise _Conflict from None
            raise
        self._remember_version(response)

    def _create(self, text: str) -> None:
        body = client.V1ConfigMap(
            api_version="v1",
            kind="ConfigMap",
            metadata=client.V1ObjectMeta(
                name=self.name,
                namespace=self.namespace,
                labels={
                    "app.kubernetes.io/name": "gpu-rebalancer",
                    "app.kubernetes.io/managed-by": "gpu-rebalancer",
                },
                annotations=self._annotations() or None,
            ),
            data={self.key: text},
        )
        try:
            response = cast(
                "urllib3.BaseHTTPResponse",
                self._core.create_namespaced_config_map(
                    self.namespace, body, _preload_content=False, _request_timeout=self._timeout_now()
                ),
            )
        except ApiException as exc:
            if exc.status == 409:  # another writer created it first: read theirs, then patch
                self._missing = False
                raise _Conflict from None
            raise
        self._missing = False
        self._remember_version(response)

    def _remember_version(self, response: urllib3.BaseHTTPResponse) -> None:
        self._version = _version_of(read_json(response))

    def _attempt(self, what: str, request: Callable[[], _T]) -> _T:
        """`request()` with the retry rule; a failure that remains is logged and raised as _NotSaved
        (a conflict as _Conflict, a closed fence as FenceLost, for `save` to handle)."""
        try:
            return with_retries(request, retries=self._retries, backoff=self._backoff, sleep=self._sleep)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.error(
                "cannot %s the actuator state in ConfigMap %s: %s", what, self.ref, describe_answer(exc)
            )
            raise _NotSaved from None


class _Conflict(Exception):
    """The ConfigMap changed (or appeared, or went) since this store read it."""


class _NotSaved(Exception):
    """A request failed after its retries (already logged)."""


def _version_of(doc: Mapping[str, Any]) -> str | None:
    return str((doc.get("metadata") or {}).get("resourceVersion") or "") or None


def _term_of(doc: Mapping[str, Any]) -> int | None:
    annotations = (doc.get("metadata") or {}).get("annotations") or {}
    try:
        return int(annotations[TERM_ANNOTATION])
    except (KeyError, TypeError, ValueError):
        return None
