"""Lists and writes of objects on the fake API server, for tests only, as kube-apiserver carries them out.

`Verbs` is the part of `FakeApiServer` behind list, create, update and patch. `_list` judges the label
and field selectors and pages (`limit` / `continue` over a consistent snapshot, an expired token the API
server's 410). `_create` takes a name or a generateName (an existing name is a 409 AlreadyExists).
`_update` checks the resourceVersion it is given (a CRD's update must give one) and `_patch` applies
one of the patches of tests/fake_api_patches.py; both keep or refuse the uid and set
`metadata.generation` (`set_generation`: the stored one, moved on by the kind's rule) as the API server
does, before the admission policies `deny_updates` set (`_admit`), and store the object under a new
resourceVersion (`_commit`). A created object of a kind that keeps a generation has generation 1. A dry
run answers what would be stored.

This module must only carry out the verb asked: no controller reacts to a write (no ReplicaSet scaled,
no status recomputed), and a dry run stores nothing.
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from collections.abc import Mapping
from typing import Any

from tests.fake_api_core import FakeApiCore, ListSnapshot
from tests.fake_api_errors import MODIFIED, REASONS, ApiError, conflict_error, invalid_error
from tests.fake_api_http import last
from tests.fake_api_kinds import JsonObj, Kind, default, set_generation
from tests.fake_api_patches import apply_patch
from tests.fake_api_selectors import field_value, parse_field_selector, parse_label_selector

CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter, or use the continue token in this response to retrieve the "
    "remainder of the results. Continuing with the provided token results in an inconsistent list - objects "
    "that were created, modified, or deleted between the time the first chunk was returned and now may "
    "show up in the list."
)


class Verbs(FakeApiCore):
    """List, create, update and patch, of every kind the fake serves."""

    def _list(self, kind: Kind, ns: str | None, query: Mapping[str, tuple[str, ...]]) -> JsonObj:
        token = last(query, "continue")
        limit_text = last(query, "limit")
        try:
            limit = int(limit_text) if limit_text else 0
        except ValueError:
            raise ApiError(400, f"invalid limit {limit_text!r}") from None
        if token:
            snapshot_id, offset = _decode_continue(token)
            snapshot = self._snapshots.get(snapshot_id)
            if snapshot is None:
                raise ApiError(410, CONTINUE_EXPIRED, reason="Expired")
        else:
            labels = parse_label_selector(last(query, "labelSelector") or "")
            fields = parse_field_selector(last(query, "fieldSelector") or "", kind)
            items = []
            for (item_ns, _), obj in sorted(self._store(kind).items()):
                if ns is not None and item_ns != ns:
                    continue
                if not all(r.matches(obj["metadata"].get("labels") or {}) for r in labels):
                    continue
                if not all((field_value(obj, path) == value) == equal for path, equal, value in fields):
                    continue
                items.append(obj)
            offset = 0
            snapshot_id = next(self._snapshot_ids)
            snapshot = ListSnapshot([copy.deepcopy(i) for i in items], str(self._last_rv))
            if limit and len(items) > limit:
                self._snapshots[snapshot_id] = snapshot
        end = offset + limit if limit else len(snapshot.items)
        page = snapshot.items[offset:end]
        metadata: JsonObj = {"resourceVersion": snapshot.resource_version}
        if end < len(snapshot.items):
            metadata["continue"] = _encode_continue(snapshot_id, end)
            if not last(query, "labelSelector") and not last(query, "fieldSelector") and not token:
                metadata["remainingItemCount"] = len(snapshot.items) - end
        else:
            self._snapshots.pop(snapshot_id, None)
        items_out = []
        for item in page:
            out = copy.deepcopy(item)
            if not kind.custom:  # items of a typed List carry no TypeMeta; unstructured ones keep theirs
                out.pop("kind", None)
                out.pop("apiVersion", None)
            items_out.append(out)
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": metadata,
            "items": items_out,
        }

    def _create(self, kind: Kind, ns: str | None, body: Any, dry_run: bool) -> tuple[int, JsonObj]:
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            meta["namespace"] = ns
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(
                    422,
                    f'{kind.kind} "" is invalid: metadata.name: Required value: '
                    "name or generateName is required",
                )
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        key = self._key(kind, ns, meta["name"])
        if key in self._store(kind):
            raise ApiError(
                409,
                f'{kind.qualified} "{meta["name"]}" already exists',
                reason="AlreadyExists",
                kind=kind,
                name=meta["name"],
            )
        meta.pop("resourceVersion", None)
        if kind.generation is not None:  # the strategy's PrepareForCreate
            meta["generation"] = 1
        self._fill_new(kind, obj)
        if not dry_run:
            self._store(kind)[key] = obj
            self._emit(kind, "ADDED", obj)
        return 201, self._with_type(kind, obj)

    def _update(
        self, kind: Kind, ns: str | None, name: str, *, body: Any, dry_run: bool, status: bool = False
    ) -> tuple[int, JsonObj]:
        current = self._existing(kind, ns, name)
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if meta.get("name") != name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        wanted = meta.get("resourceVersion")
        if not wanted and kind.custom:  # a CRD's strategy allows no unconditional update
            raise invalid_error(
                kind.group,
                kind.resource,
                name,
                path="metadata.resourceVersion",
                value="0x0",
                why="must be specified for an update",
            )
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise conflict_error(kind, name, MODIFIED)
        _keep_uid(kind, name, current=current, obj=obj)
        set_generation(current, obj, status=status)
        self._admit(kind, ns, name)
        return self._commit(kind, ns, name, current=current, obj=obj, dry_run=dry_run)

    def _patch(
        self,
        kind: Kind,
        ns: str | None,
        name: str,
        *,
        body: Any,
        ctype: str,
        dry_run: bool,
        status: bool = False,
    ) -> tuple[int, JsonObj]:
        current = self._existing(kind, ns, name)
        patched = apply_patch(kind, current, body, ctype)
        if not isinstance(patched, dict):
            raise ApiError(422, "the patched object is not an object")
        meta = patched.setdefault("metadata", {})
        wanted = meta.get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise conflict_error(kind, name, MODIFIED)
        if meta.get("name") != name or (kind.namespaced and meta.get("namespace") != ns):
            raise ApiError(
                422, f'{kind.kind} "{name}" is invalid: metadata.name: Invalid value: field is immutable'
            )
        _keep_uid(kind, name, current=current, obj=patched)
        set_generation(current, patched, status=status)
        self._admit(kind, ns, name)
        return self._commit(kind, ns, name, current=current, obj=patched, dry_run=dry_run)

    def _admit(self, kind: Kind, ns: str | None, name: str) -> None:
        """A `deny_updates` denial, as k8s.io/apiserver's validating admission policy plugin builds it
        (admission.NewForbidden, then the policy's reason and its code, the message as one cause)."""
        denial = self._denials.get((kind.group, kind.resource, ns or ""))
        if denial is None:
            return
        policy, message, reason = denial
        why = f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: {message}"
        code = next(c for c, r in REASONS.items() if r == reason)
        raise ApiError(
            code,
            f'{kind.qualified} "{name}" is forbidden: {why}',
            reason=reason,
            kind=kind,
            name=name,
            causes=[{"message": why}],
        )

    def _commit(
        self, kind: Kind, ns: str | None, name: str, *, current: JsonObj, obj: JsonObj, dry_run: bool
    ) -> tuple[int, JsonObj]:
        meta = obj["metadata"]
        meta["uid"] = current["metadata"]["uid"]
        meta["creationTimestamp"] = current["metadata"].get("creationTimestamp")
        if kind.namespaced:
            meta["namespace"] = ns
        obj["kind"], obj["apiVersion"] = kind.kind, kind.api_version
        default(kind, obj)
        if not dry_run:
            meta["resourceVersion"] = self._next_rv()
            self._store(kind)[self._key(kind, ns, name)] = obj
            self._emit(kind, "MODIFIED", obj, current)
        return 200, self._with_type(kind, obj)


def _keep_uid(kind: Kind, name: str, *, current: JsonObj, obj: JsonObj) -> None:
    """An update's uid, as rest.BeforeUpdate and ValidateObjectMetaUpdate judge it before admission:
    none given is the stored one; another one is a 422 (metadata.uid is immutable), so a write meant
    for an earlier incarnation of a re-created object never lands on the new one."""
    meta = obj["metadata"]
    uid, stored = meta.get("uid"), current["metadata"]["uid"]
    if not uid:
        meta["uid"] = stored
    elif uid != stored:
        raise invalid_error(
            kind.group, kind.kind, name, path="metadata.uid", value=json.dumps(uid), why="field is immutable"
        )


def _encode_continue(snapshot_id: int, offset: int) -> str:
    raw = json.dumps({"v": "fake/v1", "id": snapshot_id, "start": offset}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, int]:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded))
        return int(data["id"]), int(data["start"])
    except (ValueError, KeyError, TypeError):
        raise ApiError(400, f"continue key is not valid: {token!r}") from None
