"""Node drain marks: the taint that keeps a drained node's evicted pods from landing back on it.

Owns writing it: `KubeTainter` adds or removes the `rebalancer.gpu/draining=<value>:NoSchedule` (or
PreferNoSchedule) taint, touching no other taint (read, edit this key, JSON patch guarded by the
resourceVersion; node annotations the caller names change in the same write), and lists the nodes that
carry it so a start-up can clean marks no plan owns; `DryRunTainter` makes no request. Adding a mark asks
the write `fence` first; removing one asks `unmark_fence` (the lease only: a deadline must not leave a
mark behind). When to mark and unmark is the caller's decision (rebalancer.actuator).

It must not touch any other taint or annotation, or decide anything.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer.fence import UNFENCED, Fence, FenceLost, RequestTimeout, clip_timeout
from rebalancer.kubeapi import (
    Backoff,
    describe_answer,
    exponential_backoff,
    is_transient,
    read_json,
    with_retries,
)
from rebalancer.model import NOT_ATTEMPTED

__all__ = ["DRAINING_TAINT_KEY", "DryRunTainter", "KubeTainter", "NodeTainter", "TaintChange"]

DRAINING_TAINT_KEY = "rebalancer.gpu/draining"


@dataclass(frozen=True, slots=True)
class TaintChange:
    """What marking or unmarking one node did. `changed` is False when nothing needed writing."""

    node: str
    ok: bool
    changed: bool = False
    detail: str = ""


class NodeTainter(Protocol):
    """Marks nodes being drained so evicted pods do not land back, and removes the mark again.

    `annotations` (set) and `remove_annotations` are node annotations changed in the same write as the
    taint, so a mark and what it records about the drain never part.
    """

    def taint(
        self, node: str, value: str, *, annotations: Mapping[str, str] | None = None
    ) -> TaintChange: ...

    def untaint(self, node: str, *, remove_annotations: Iterable[str] = ()) -> TaintChange: ...

    def tainted(self) -> Mapping[str, str]: ...

    def with_key(self, key: str) -> NodeTainter:
        """The same tainter for marks under `key` (a former `drain_taint_key`)."""
        ...


class DryRunTainter:
    """Marks nothing and makes no request; reports every change as done."""

    def taint(self, node: str, value: str, *, annotations: Mapping[str, str] | None = None) -> TaintChange:
        return TaintChange(node, ok=True, detail="dry-run: not tainted")

    def untaint(self, node: str, *, remove_annotations: Iterable[str] = ()) -> TaintChange:
        return TaintChange(node, ok=True, detail="dry-run: not untainted")

    def tainted(self) -> Mapping[str, str]:
        return {}

    def with_key(self, key: str) -> DryRunTainter:
        return self


class KubeTainter:
    """Adds / removes the `key=<value>:<effect>` taint with a JSON patch guarded by the resourceVersion.

    Other taints are never touched: each change reads the node, edits only this key in the list (and the
    named annotations, in the same patch), and writes it back with a `test` on
    `metadata.resourceVersion`, re-reading when another writer got in between (409 / 422). Transient
    failures are retried like evictions.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        key: str = DRAINING_TAINT_KEY,
        effect: str = "NoSchedule",
        retries: int = 3,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        request_timeout: RequestTimeout = (5.0, 30.0),
        fence: Fence = UNFENCED,
        unmark_fence: Fence | None = None,
    ) -> None:
        if effect not in ("NoSchedule", "PreferNoSchedule"):
            raise ValueError(f"draining taint effect must be NoSchedule or PreferNoSchedule, got {effect!r}")
        self._core = client.CoreV1Api(api_client)
        self.key = key
        self.effect = effect
        self._retries = retries
        self._backoff = backoff or exponential_backoff()
        self._sleep = sleep
        self._timeout = request_timeout
        self.fence = fence
        # Removing a mark asks only this (by default `fence`): a deadline must not leave a mark behind.
        self.unmark_fence = unmark_fence or fence

    def with_key(self, key: str) -> KubeTainter:
        """This tainter for marks under `key`: the same settings and fences."""
        other = copy.copy(self)
        other.key = key
        return other

    def taint(self, node: str, value: str, *, annotations: Mapping[str, str] | None = None) -> TaintChange:
        """Add (or take over) the mark; `annotations` are set on the node in the same write."""
        wanted = {"key": self.key, "value": value, "effect": self.effect}

        def edit(taints: list[Mapping[str, Any]]) -> list[Mapping[str, Any]] | None:
            if any(dict(t) == wanted for t in taints):
                return None
            return [t for t in taints if t.get("key") != self.key] + [wanted]

        return self._change(node, edit, self.fence, missing_ok=False, annotations=dict(annotations or {}))

    def untaint(self, node: str, *, remove_annotations: Iterable[str] = ()) -> TaintChange:
        """Remove the mark; `remove_annotations` go in the same write (even when the taint is gone)."""

        def edit(taints: list[Mapping[str, Any]]) -> list[Mapping[str, Any]] | None:
            kept = [t for t in taints if t.get("key") != self.key]
            return kept if len(kept) != len(taints) else None

        return self._change(
            node, edit, self.unmark_fence, missing_ok=True, annotations=dict.fromkeys(remove_annotations)
        )

    def tainted(self) -> Mapping[str, str]:
        """Every node carrying this taint key, with the taint's value (which plan put it there)."""
        out: dict[str, str] = {}
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {
                "limit": 500,
                "_preload_content": False,
                "_request_timeout": self._timeout,
            }
            if token:
                kwargs["_continue"] = token
            page = read_json(cast("urllib3.BaseHTTPResponse", self._core.list_node(**kwargs)))
            for item in page.get("items") or ():
                for taint in (item.get("spec") or {}).get("taints") or ():
                    if taint.get("key") == self.key:
                        out[item["metadata"]["name"]] = str(taint.get("value", ""))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return out

    def _change(
        self,
        node: str,
        edit: Callable[[list[Mapping[str, Any]]], list[Mapping[str, Any]] | None],
        fence: Fence,
        *,
        missing_ok: bool,
        annotations: Mapping[str, str | None] | None = None,
    ) -> TaintChange:
        def attempt() -> TaintChange:
            current = read_json(
                cast(
                    "urllib3.BaseHTTPResponse",
                    self._core.read_node(node, _preload_content=False, _request_timeout=self._timeout),
                )
            )
            spec = current.get("spec") or {}
            taints = list(spec.get("taints") or ())
            new = edit(taints)
            old_notes = dict(current["metadata"].get("annotations") or {})
            notes = dict(old_notes)
            for name, note in (annotations or {}).items():
                if note is None:
                    notes.pop(name, None)
                else:
                    notes[name] = note
            if new is None and notes == old_notes:
                return TaintChange(node, ok=True)
            version = current["metadata"]["resourceVersion"]
            ops: list[dict[str, Any]] = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": version}
            ]
            if new is not None:
                # `add` replaces an existing member; a node without any spec gets one.
                write: dict[str, Any] = {"op": "add", "path": "/spec/taints", "value": new}
                if not spec:
                    write = {"op": "add", "path": "/spec", "value": {"taints": new}}
                ops.append(write)
            if notes != old_notes:
                ops.append({"op": "add", "path": "/metadata/annotations", "value": notes})
            timeout = clip_timeout(self._timeout, fence.check())
            response = cast(
                "urllib3.BaseHTTPResponse",
                self._core.patch_node(node, ops, _preload_content=False, _request_timeout=timeout),
            )
            read_json(response)
            return TaintChange(node, ok=True, changed=True)

        try:
            return with_retries(
                attempt, retries=self._retries, backoff=self._backoff, sleep=self._sleep, retry_if=_retry_mark
            )
        except FenceLost as lost:
            return TaintChange(node, ok=False, detail=f"{NOT_ATTEMPTED}{lost.reason}")
        except ApiException as exc:
            if exc.status == 404:
                return TaintChange(node, ok=missing_ok, detail="node no longer exists")
            if not _retry_mark(exc):
                return TaintChange(node, ok=False, detail=describe_answer(exc))
            return TaintChange(
                node, ok=False, detail=f"{describe_answer(exc)} (after {self._retries + 1} attempts)"
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return TaintChange(
                node, ok=False, detail=f"{describe_answer(exc)} (after {self._retries + 1} attempts)"
            )


def _retry_mark(exc: BaseException) -> bool:
    """A node edit is tried again on a conflict too (409, or 422 from the resourceVersion test): the node
    changed between the read and the write, and the next attempt reads it again."""
    return is_transient(exc) or (isinstance(exc, ApiException) and exc.status in (409, 422))
