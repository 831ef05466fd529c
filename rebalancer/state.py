"""Where a live daemon keeps its memory across restarts and leader changes.

Owns `ActuatorState` (the `history.DisruptionHistory` the planner's guards need, and the node drains
this rebalancer owns) as JSON, and the stores that keep it:

- `MemoryStateStore`: in this object (tests; one process handing its memory to another actuator);
- `FileStateStore`: a JSON file, replaced atomically;
- `ConfigMapStateStore`: JSON under one key of a ConfigMap in the rebalancer's own namespace (what
  `rebalancer run` uses by default), written with one JSON merge patch of that key (a missing ConfigMap
  is created), read and written through `kubeapi.with_retries`.

A store never stops the daemon: an unreadable state is logged and read as none, a failed save is logged
and made again at the next change. Version 1 states (evictions and drains only) are read as they are.
It must not decide anything: what to remember is the actuator's and the history's.
"""

from __future__ import annotations

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
from typing import Any, Protocol, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer import rfc3339
from rebalancer.history import NO_HISTORY, DisruptionHistory
from rebalancer.kubeapi import (
    Backoff,
    describe_answer,
    is_transient,
    read_or_none,
    release_unread,
    with_retries,
)

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
STATE_CONFIGMAP = "gpu-rebalancer-state"
STATE_KEY = "actuator-state.json"
STATE_VERSION = 2
_MERGE_PATCH = "application/merge-patch+json"

log = logging.getLogger(__name__)

RequestTimeout = float | tuple[float, float]


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

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            **self.history.to_json(),
            "drains": {
                node: {"cycle": d.cycle_id, "since": rfc3339.format_utc(d.since)}
                for node, d in sorted(self.drains.items())
            },
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
        return cls(history=DisruptionHistory.from_json(data), drains=drains)


class StateStore(Protocol):
    """Keeps the actuator's memory across restarts and leader changes."""

    def load(self) -> ActuatorState | None: ...

    def save(self, state: ActuatorState) -> None: ...


class MemoryStateStore:
    """Keeps the state in this object (tests; a process handing its memory to a new actuator)."""

    def __init__(self, state: ActuatorState | None = None) -> None:
        self.state = state

    def load(self) -> ActuatorState | None:
        return self.state

    def save(self, state: ActuatorState) -> None:
        self.state = state


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

    def save(self, state: ActuatorState) -> None:
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


def _transient_or_conflict(exc: BaseException) -> bool:
    return is_transient(exc) or (isinstance(exc, ApiException) and exc.status == 409)


class ConfigMapStateStore:
    """Keeps the state as JSON under one key (`STATE_KEY`) of a ConfigMap, in the rebalancer's namespace.

    The ConfigMap outlives pods and is shared by the replicas, so a restart or a new leader finds the
    memory of the last one. `save()` is one JSON merge patch of that key (other keys, labels and
    annotations stay); a missing ConfigMap is created. `load()` reads it: a missing ConfigMap or key is no
    state, unreadable content is logged and read as no state. Transport errors, 429 and 5xx answers are
    retried (`retries`, `backoff`), and a 409 too (a create raced another writer's: the next attempt
    patches); what still fails is logged, never raised. Every request carries `request_timeout`.
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
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.key = key
        self._core = client.CoreV1Api(api_client)
        self._retries = retries
        self._backoff = backoff
        self._sleep = sleep
        self._timeout = request_timeout

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def load(self) -> ActuatorState | None:
        raw = self._attempt("read", self._read)
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
            data = doc.get("data") if isinstance(doc, dict) else None
            text = data.get(self.key) if isinstance(data, dict) else None
            if text is None:
                log.warning("ConfigMap %s has no key %s: no stored actuator state", self.ref, self.key)
                return None
            return ActuatorState.from_json(json.loads(text))
        except (ValueError, TypeError) as exc:
            log.warning("ignoring unreadable actuator state in ConfigMap %s: %s", self.ref, exc)
            return None

    def save(self, state: ActuatorState) -> None:
        text = json.dumps(state.to_json(), indent=1, sort_keys=True) + "\n"
        self._attempt("save", lambda: self._write(text))

    # ---- requests

    def _read(self) -> bytes | None:
        """The ConfigMap as the API server sent it; None when there is none (404)."""
        return read_or_none(
            lambda: self._core.read_namespaced_config_map(
                self.name, self.namespace, _preload_content=False, _request_timeout=self._timeout
            )
        )

    def _write(self, text: str) -> None:
        try:
            response = cast(
                "urllib3.BaseHTTPResponse",
                self._core.patch_namespaced_config_map(
                    self.name,
                    self.namespace,
                    {"data": {self.key: text}},
                    _content_type=_MERGE_PATCH,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                ),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
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
                ),
                data={self.key: text},
            )
            response = cast(
                "urllib3.BaseHTTPResponse",
                self._core.create_namespaced_config_map(
                    self.namespace, body, _preload_content=False, _request_timeout=self._timeout
                ),
            )
        release_unread(response)

    def _attempt(self, what: str, request: Callable[[], bytes | None]) -> bytes | None:
        """`request()` with the retry rule (and 409: a create raced another writer's); None, logged, when
        it still fails."""
        try:
            return with_retries(
                request,
                retries=self._retries,
                backoff=self._backoff,
                sleep=self._sleep,
                retry_if=lambda exc: (
                    is_transient(exc) or (isinstance(exc, ApiException) and exc.status == 409)
                ),
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.error(
                "cannot %s the actuator state in ConfigMap %s: %s", what, self.ref, describe_answer(exc)
            )
            return None
