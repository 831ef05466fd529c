"""Workload actions against the API server: tell an idle workload's owner, reclaim its GPUs, undo it.

Owns the writes to a workload's own object (`rebalancer.workloads.KINDS`: where each kind is served)
that the `idle-gpu` strategy's workload proposals ask for, and `rebalancer restore`'s undoing of them:

- `notify`: `rebalancer.gpu/idle-since: <now>` on the workload (kept when already there);
- `reclaim`, by the kind's way: `scale` reads the `scale` subresource, sets `spec.replicas: 0` through
  it and then records the replicas it had (`rebalancer.gpu/scaled-down-from`, with `reclaimed-at`,
  `reclaimed-by`, `reclaim-reason`); `suspend` sets `spec.suspend: true` (Job, JobSet, a Kueue-managed
  Job) and `stop` Kubeflow's `kubeflow-resource-stopped` (Notebook), each in one write with the same
  record; `idle-since` is removed with the record, so a restored workload starts a new idle period.
  The record never goes before the change it records, so a running workload never carries one: a scale
  that cannot be made leaves the workload as it was, idle-since too (the next cycle tries again); a
  retry that finds the workload at 0 after its own scale (the answer lost) only writes the record; a
  record that cannot follow its scale is an `error` saying so, with the `kubectl scale` that undoes it;
- `clear`: `idle-since` removed (the workload computed again);
- `restore`: the reclaim undone from the record (replicas back, `suspend: false`, the stop annotation
  removed) and the record removed; the owner's `snooze-until` is kept.

Every write re-reads the object first and is a JSON patch that tests its resourceVersion, so a change
made meanwhile (a conflict, 409 / 422) is read again and judged again; a reclaim is not attempted when
the owner snoozed it or the idle mark went away since the snapshot. Transient failures are retried a
bounded number of times (`kubeapi.with_retries`; a reclaim by scale's two writes share the attempts,
each reading again); every write asks the write fence first and clips its timeout to it, the record
that follows a scale only the fence's lease (`WriteFence.lease_only`): a deadline must not leave a
scale without the record `restore` undoes it from. One outcome per pod of the decision, all alike.
Server-side dry run (`dryRun=All`) runs the API server's checks and persists nothing.

It must not decide anything (the strategy proposed, the planner approved), read the clock (`now` is
given), or write anything but the annotations named here, `spec.replicas` through `scale` and
`spec.suspend`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer import rfc3339
from rebalancer.digits import is_ascii_digits
from rebalancer.fence import UNFENCED, Fence, FenceLost, RequestTimeout, WriteFence, clip_timeout
from rebalancer.kubeapi import (
    Backoff,
    describe_answer,
    exponential_backoff,
    is_transient,
    read_json,
    with_retries,
)
from rebalancer.model import NOT_ATTEMPTED, Decision, Outcome, OutcomeResult, WorkloadAction
from rebalancer.workloads import (
    IDLE_SINCE,
    KINDS,
    KUBEFLOW_STOPPED,
    RECLAIM_RBAC_TEMPLATE,
    RECLAIM_REASON,
    RECLAIMED_AT,
    RECLAIMED_BY,
    SCALED_DOWN_FROM,
    SNOOZE_UNTIL,
    Kind,
    kubectl_resource,
    result_of,
)

__all__ = ["Restored", "WorkloadWriter"]

log = logging.getLogger(__name__)

_RECORD = (SCALED_DOWN_FROM, RECLAIMED_AT, RECLAIMED_BY, RECLAIM_REASON)
_MAX_REASON_CHARS = 512
_JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True, slots=True)
class Restored:
    """What `restore` did to one workload: ok, and in words."""

    ref: str
    ok: bool
    detail: str


class _Skip(Exception):
    """The write is not made: the object says so (`result`, `detail`)."""

    def __init__(self, result: OutcomeResult, detail: str) -> None:
        super().__init__(detail)
        self.result = result
        self.detail = detail


@dataclass(frozen=True, slots=True)
class _Target:
    """The object a write goes to."""

    kind: Kind
    namespace: str
    name: str

    @property
    def where(self) -> str:
        return f"{self.kind.kind} {self.namespace}/{self.name}"


@dataclass(slots=True)
class _Scaled:
    """A reclaim's scale to 0 across the attempts of its write: the replicas it scales from (0: not sent
    yet) and whether it went through (then only its record may be missing)."""

    replicas: int = 0
    done: bool = False


def _still_due(where: str, notes: Mapping[str, str], now: datetime) -> None:
    """Nothing is reclaimed that the owner snoozed, or whose idle mark went away, since the snapshot."""
    snooze = notes.get(SNOOZE_UNTIL)
    if snooze is not None:
        until = rfc3339.parse_or_none(snooze.strip())
        if until is None or until > now:
            raise _Skip("error", f"{NOT_ATTEMPTED}{where} was snoozed meanwhile ({SNOOZE_UNTIL}: {snooze})")
    if IDLE_SINCE not in notes:
        raise _Skip("error", f"{NOT_ATTEMPTED}the idle mark on {where} was removed meanwhile")


def _retry_write(exc: BaseException) -> bool:
    """Transient failures, and a conflict (409, or 422 from the resourceVersion test): read again."""
    return is_transient(exc) or (isinstance(exc, ApiException) and exc.status in (409, 422))


class WorkloadWriter:
    """Carries out workload decisions and restores, through the generic object API of each kind."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        server_dry_run: bool = False,
        retries: int = 3,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        request_timeout: RequestTimeout = (5.0, 30.0),
        fence: Fence = UNFENCED,
    ) -> None:
        self._api = client.CustomObjectsApi(api_client)
        self._server_dry_run = server_dry_run
        self._retries = retries
        self._backoff = backoff or exponential_backoff()
        self._sleep = sleep
        self._timeout = request_timeout
        self.fence = fence

    # ----------------------------------------------------------------- decisions

    def apply(self, decision: Decision, now: datetime) -> tuple[Outcome, ...]:
        """Carry out an approved workload decision; one outcome per pod, all alike."""
        action = decision.proposal.action
        if action is None or action.how == "evict":
            raise ValueError("WorkloadWriter.apply() takes workload decisions that write the workload")
        namespace, kind_name, name = action.workload
        kind = KINDS.get(kind_name)
        reason = f"{decision.proposal.strategy}: {decision.proposal.reason}"[:_MAX_REASON_CHARS]
        result: OutcomeResult
        if kind is None:
            result, detail = "error", f"no API is known for the kind {kind_name}"
        else:
            result, detail = self._carry_out(action, _Target(kind, namespace, name), reason=reason, now=now)
        log.info("workload %s %s %s", action.ref, result, detail)
        return tuple(Outcome(p.namespace, p.name, result, detail) for p in decision.pods_in_order)

    def _carry_out(
        self, action: WorkloadAction, target: _Target, *, reason: str, now: datetime
    ) -> tuple[OutcomeResult, str]:
        done = result_of(action, dry_run=self._server_dry_run)
        stamp = rfc3339.format_utc(now)
        where = target.where

        scaled = _Scaled()

        def write() -> str:
            current = self._read(target)
            notes = dict((current.get("metadata") or {}).get("annotations") or {})
            if action.verb == "notify":
                if IDLE_SINCE in notes:
                    raise _Skip(done, f"{where} already has {IDLE_SINCE}: {notes[IDLE_SINCE]}")
                notes[IDLE_SINCE] = stamp
                self._patch(target, current, notes)
                return f"{IDLE_SINCE}: {stamp} on {where}"
            if action.verb == "clear":
                if notes.pop(IDLE_SINCE, None) is None:
                    raise _Skip(done, f"{where} has no {IDLE_SINCE} any more")
                self._patch(target, current, notes)
                return f"{IDLE_SINCE} removed from {where}"
            return self._reclaim(action, target, current, notes, reason=reason, now=now, scaled=scaled)

        result, detail = self._attempt(write, done, target.namespace)
        if result == "error" and scaled.done:
            log.warning("%s scaled to 0 replicas from %d without its reclaim record", where, scaled.replicas)
            undo = (
                f"kubectl scale {kubectl_resource(target.kind)} {target.name} -n {target.namespace} "
                f"--replicas={scaled.replicas}"
            )
            detail = (
                f"{where} scaled from {scaled.replicas} to 0 replicas, but its reclaim record was not "
                f"written ({detail}); undo by hand: {undo}"
            )
        return result, detail

    def _reclaim(
        self,
        action: WorkloadAction,
        target: _Target,
        current: Mapping[str, Any],
        notes: dict[str, str],
        *,
        reason: str,
        now: datetime,
        scaled: _Scaled,
    ) -> str:
        where = target.where
        stamp = rfc3339.format_utc(now)
        record = {RECLAIMED_AT: stamp, RECLAIMED_BY: action.how or "", RECLAIM_REASON: reason}
        spec = current.get("spec") or {}
        if action.how == "scale":
            # The scale first, then the record: a running workload never carries a reclaim record, and a
            # scale that fails leaves idle-since for the next cycle. A retry that finds the workload at 0
            # after this reclaim sent its scale (an answer lost, a record not written) only records it.
            scale = self._read(target, scale=True)
            if not (scaled.replicas and _replicas(scale) == 0):
                _still_due(where, notes, now)
                if _replicas(scale) == 0:
                    raise _Skip("gone", f"{where} is already at 0 replicas")
                scaled.replicas = _replicas(scale)
                self._patch_scale(target, current, 0)  # at the version judged: the scale shares it
                current = self._read(target)  # the scale moved the version on
                notes = dict((current.get("metadata") or {}).get("annotations") or {})
            scaled.done = not self._server_dry_run
            notes.pop(IDLE_SINCE, None)
            notes.update({**record, SCALED_DOWN_FROM: str(scaled.replicas)})
            # Only the lease stops it: a deadline must not leave a scale without what restore needs.
            self._patch(target, current, notes, fence=_lease_only(self.fence))
            return f"{where} scaled from {scaled.replicas} to 0 replicas"
        _still_due(where, notes, now)
        notes.pop(IDLE_SINCE)
        notes.update(record)
        if action.how == "suspend":
            if spec.get("suspend") is True:
                raise _Skip("gone", f"{where} is already suspended")
            self._patch(target, current, notes, [_replace_or_add(spec, "suspend", True)])
            return f"{where} suspended (spec.suspend: true)"
        if action.how == "stop":
            if KUBEFLOW_STOPPED in notes:
                raise _Skip("gone", f"{where} is already stopped")
            notes[KUBEFLOW_STOPPED] = stamp
            self._patch(target, current, notes)
            return f"{where} stopped ({KUBEFLOW_STOPPED}: {stamp})"
        raise _Skip("error", f"no reclaim is known for {where}")

    # ----------------------------------------------------------------- restore

    def restore(self, namespace: str, kind_name: str, name: str) -> Restored:
        """Undo a reclaim of the workload from the record on it."""
        ref = f"{namespace}/{kind_name}/{name}"
        kind = KINDS.get(kind_name)
        if kind is None or kind.reclaim is None:
            known = ", ".join(k.kind for k in KINDS.values() if k.reclaim is not None)
            return Restored(ref, False, f"{kind_name} is not a kind a reclaim changes ({known})")
        target = _Target(kind, namespace, name)
        where = target.where
        undone: list[str] = []

        def write() -> str:
            current = self._read(target)
            notes = dict((current.get("metadata") or {}).get("annotations") or {})
            how = notes.get(RECLAIMED_BY)
            if how is None:
                raise _Skip("error", f"{where} was not reclaimed by gpu-rebalancer (no {RECLAIMED_BY})")
            for key in (*_RECORD, IDLE_SINCE):
                notes.pop(key, None)
            if how == "scale" and not undone:
                text = ((current.get("metadata") or {}).get("annotations") or {}).get(SCALED_DOWN_FROM, "")
                if not is_ascii_digits(text):
                    raise _Skip("error", f'{where}: {SCALED_DOWN_FROM} is "{text}", not a number of replicas')
                scale = self._read(target, scale=True)
                if _replicas(scale) == 0:
                    self._patch_scale(target, scale, int(text))
                    undone.append(f"scaled back to {text} replicas")
                else:
                    undone.append("already scaled up again")
                current = self._read(target)  # the scale write changed its version
            ops: list[dict[str, Any]] = []
            if how == "suspend":
                ops.append(_replace_or_add(current.get("spec") or {}, "suspend", False))
                undone.append("resumed (spec.suspend: false)")
            if how == "stop":
                notes.pop(KUBEFLOW_STOPPED, None)
                undone.append(f"started ({KUBEFLOW_STOPPED} removed)")
            self._patch(target, current, notes, ops)
            return f"{where} " + ", ".join(undone) + "; reclaim record removed"

        result, detail = self._attempt(write, "cleared", namespace)
        return Restored(ref, result == "cleared", detail)

    def reclaimed(self, namespace: str | None = None) -> tuple[tuple[str, str, str], ...]:
        """(namespace, kind, name) of every workload carrying a reclaim record: one list per kind."""
        found: list[tuple[str, str, str]] = []
        for kind in KINDS.values():
            if kind.reclaim is None:
                continue
            for item in self._list(kind, namespace):
                meta = item.get("metadata") or {}
                if RECLAIMED_BY in (meta.get("annotations") or {}):
                    found.append((str(meta.get("namespace", "")), kind.kind, str(meta.get("name", ""))))
        return tuple(sorted(found))

    # ----------------------------------------------------------------- requests

    def _attempt(
        self, write: Callable[[], str], done: OutcomeResult, namespace: str | None = None
    ) -> tuple[OutcomeResult, str]:
        try:
            return done, with_retries(
                write, retries=self._retries, backoff=self._backoff, sleep=self._sleep, retry_if=_retry_write
            )
        except _Skip as skip:
            return skip.result, skip.detail
        except FenceLost as lost:
            return "error", f"{NOT_ATTEMPTED}{lost.reason}"
        except ApiException as exc:
            if exc.status == 404:
                return "gone", "the workload no longer exists"
            if exc.status == 403 and namespace is not None:
                grant = f"kubectl -n {namespace} apply -f {RECLAIM_RBAC_TEMPLATE}"
                return "error", f"{describe_answer(exc)}; the namespace grants it with: {grant}"
            return "error", describe_answer(exc)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return "error", f"{describe_answer(exc)} (after {self._retries + 1} attempts)"

    def _read(self, target: _Target, *, scale: bool = False) -> Mapping[str, Any]:
        read = (
            self._api.get_namespaced_custom_object_scale if scale else self._api.get_namespaced_custom_object
        )
        kind = target.kind
        response = read(
            kind.group,
            kind.version,
            target.namespace,
            kind.resource,
            target.name,
            _preload_content=False,
            _request_timeout=self._timeout,
        )
        return read_json(cast("urllib3.BaseHTTPResponse", response))

    def _list(self, kind: Kind, namespace: str | None) -> list[Mapping[str, Any]]:
        items: list[Mapping[str, Any]] = []
        token: str | None = None
        while True:
            try:
                if namespace is None:
                    response = self._api.list_cluster_custom_object(
                        kind.group,
                        kind.version,
                        kind.resource,
                        limit=500,
                        _continue=token,
                        _preload_content=False,
                        _request_timeout=self._timeout,
                    )
                else:
                    response = self._api.list_namespaced_custom_object(
                        kind.group,
                        kind.version,
                        namespace,
                        kind.resource,
                        limit=500,
                        _continue=token,
                        _preload_content=False,
                        _request_timeout=self._timeout,
                    )
            except ApiException as exc:
                if exc.status == 404:  # the kind is not installed in this cluster
                    return items
                raise
            page = read_json(cast("urllib3.BaseHTTPResponse", response))
            items.extend(page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                return items

    def _patch(
        self,
        target: _Target,
        current: Mapping[str, Any],
        notes: Mapping[str, str],
        ops: list[dict[str, Any]] | None = None,
        *,
        fence: Fence | None = None,
    ) -> None:
        """The workload's annotations (and `ops`), if it is still at the version read."""
        self._json_patch(
            target,
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": _version(current)},
                {"op": "add", "path": "/metadata/annotations", "value": dict(notes)},
                *(ops or ()),
            ],
            fence=fence,
        )

    def _patch_scale(self, target: _Target, scale: Mapping[str, Any], replicas: int) -> None:
        """The replicas, through `scale`, if the workload is still at the version read."""
        self._json_patch(
            target,
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": _version(scale)},
                {"op": "replace", "path": "/spec/replicas", "value": replicas},
            ],
            scale=True,
        )

    def _json_patch(
        self, target: _Target, body: list[dict[str, Any]], *, scale: bool = False, fence: Fence | None = None
    ) -> None:
        kind = target.kind
        patch = (
            self._api.patch_namespaced_custom_object_scale
            if scale
            else self._api.patch_namespaced_custom_object
        )
        timeout = clip_timeout(self._timeout, (fence or self.fence).check())
        response = patch(
            kind.group,
            kind.version,
            target.namespace,
            kind.resource,
            target.name,
            body,
            dry_run="All" if self._server_dry_run else None,
            _content_type=_JSON_PATCH,
            _preload_content=False,
            _request_timeout=timeout,
        )
        read_json(cast("urllib3.BaseHTTPResponse", response))


def _lease_only(fence: Fence) -> Fence:
    """The fence without its deadlines (`WriteFence.lease_only`), for the record that completes a scale."""
    return fence.lease_only() if isinstance(fence, WriteFence) else fence


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _replicas(scale: Mapping[str, Any]) -> int:
    return int((scale.get("spec") or {}).get("replicas") or 0)


def _replace_or_add(spec: Mapping[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A JSON patch operation setting `spec.<key>` (`add` replaces a member that is there)."""
    if not spec:
        return {"op": "add", "path": "/spec", "value": {key: value}}
    return {"op": "add", "path": f"/spec/{key}", "value": value}
