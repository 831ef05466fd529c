"""The three patches of the fake API server, for tests only, applied as kube-apiserver applies them.

`merge_patch` is RFC 7386 JSON merge patch; `strategic_merge_patch` is Kubernetes strategic merge patch
for the built-in fields the fake serves (lists merged by their key where the API declares one, other
lists replaced whole, `$patch` and `$deleteFromPrimitiveList` honoured, `$setElementOrder` and
`$retainKeys` passed over); `json_patch` is RFC 6902 JSON patch, a failing operation a 422.
`apply_patch` picks one by the request's media type, refusing with a 415 what the resource does not take
(a CRD's resources and their subresources take no strategic merge patch).

This module must only compute the patched document: whether it may be stored (its name, uid,
resourceVersion, an admission policy) is the server's business, not this module's.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.fake_api_errors import ApiError
from tests.fake_api_kinds import JsonObj, Kind

_PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json")
_STRATEGIC = "application/strategic-merge-patch+json"

# Lists that strategic merge patch merges by a key (everything else, e.g. node taints and tolerations,
# is atomic and replaced whole, as `+listType=atomic` fields are in the real API).
_MERGE_KEYS = {
    "ownerReferences": "uid",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "conditions": "type",
    "addresses": "type",
    "hostAliases": "ip",
}
_MERGED_PRIMITIVE_LISTS = {"finalizers", "podCIDRs"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes strategic merge patch, for the built-in fields this fake serves."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in _MERGE_KEYS:
            result[key] = _merge_keyed_list(result.get(key) or [], value, _MERGE_KEYS[key])
        elif isinstance(value, list) and key in _MERGED_PRIMITIVE_LISTS:
            existing = list(result.get(key) or [])
            result[key] = existing + [v for v in value if v not in existing]
        else:
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def _merge_keyed_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    result = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise ApiError(400, f"map: {item!r} does not contain declared merge key: {merge_key}")
        index = next((i for i, e in enumerate(result) if e.get(merge_key) == item[merge_key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(copy.deepcopy(item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise ApiError(422, f"doc is missing path: /{'/'.join(parts)}")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test); a failing op is a 422."""
    if not isinstance(operations, list):
        raise ApiError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for op in operations:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        if kind == "test":
            if _resolve(doc, parts) != op.get("value"):
                raise ApiError(422, f"testing value /{'/'.join(parts)} failed: test failed")
            continue
        if kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = copy.deepcopy(_resolve(doc, source))
            if kind == "move":
                doc = _remove(doc, source)
            doc = _add(doc, parts, value, replace=False)
        elif kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")), replace=False)
        elif kind == "replace":
            _resolve(doc, parts)
            doc = _add(doc, parts, copy.deepcopy(op.get("value")), replace=True)
        elif kind == "remove":
            doc = _remove(doc, parts)
        else:
            raise ApiError(400, f"Unexpected kind: {kind}")
    return doc


def _add(doc: Any, parts: list[str], value: Any, *, replace: bool) -> Any:
    if not parts:
        return value
    parent = _resolve(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise ApiError(422, f"add operation does not apply: index {last} out of bounds")
    else:
        raise ApiError(422, f"doc is missing path: /{'/'.join(parts)}")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    _resolve(doc, parts)
    parent = _resolve(doc, parts[:-1])
    if isinstance(parent, dict):
        del parent[parts[-1]]
    else:
        del parent[int(parts[-1])]
    return doc


def apply_patch(kind: Kind, current: JsonObj, body: Any, ctype: str) -> Any:
    """The patched document; a media type the resource does not take is a 415 (a CRD's resources and
    their subresources take no strategic merge patch)."""
    media = ctype.split(";", maxsplit=1)[0].strip().lower()
    if media == "application/json-patch+json":
        return json_patch(current, body)
    if media == "application/merge-patch+json":
        return merge_patch(current, body)
    if media == _STRATEGIC and not kind.custom:
        return strategic_merge_patch(current, body)
    accepted = (*_PATCH_TYPES, "application/apply-patch+yaml") if kind.custom else (*_PATCH_TYPES, _STRATEGIC)
    raise ApiError(
        415,
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted),
    )
