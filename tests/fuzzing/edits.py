"""Structure-aware edits: one change at a random path of a decoded JSON / YAML document (replace,
delete, null, wrap, change the type, duplicate, add an unknown key, nest deep, blow up, rename a key),
and writing the document back as JSON or YAML with the raw fragments in place.

Owns walking a document's paths (`all_paths`, `get_path`) and the writers (`dump_json`, `dump_yaml`).
This module must not pick a file of a case nor know what a field means: the strategies of each input
(kubectl objects, policies) choose the document, and tests/fuzzing/object_fields.py the fields the
rebalancer reads.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence

import yaml
from hypothesis import strategies as st

from tests.fuzzing.layout import Json, JsonPath
from tests.fuzzing.values import DEPTHS, _deep_json_map, _deep_list, _deep_yaml_map, _Raw, nasty_value

# --------------------------------------------------------------------------- structure-aware edits


def all_paths(doc: Json, limit: int = 50_000) -> list[JsonPath]:
    """Every path into `doc` (the root is `()`), depth first."""
    paths: list[JsonPath] = [()]
    stack: list[tuple[JsonPath, Json]] = [((), doc)]
    while stack and len(paths) < limit:
        path, value = stack.pop()
        children: list[tuple[JsonPath, Json]]
        if isinstance(value, dict):
            children = [((*path, k), v) for k, v in value.items() if isinstance(k, str | int)]
        elif isinstance(value, list):
            children = [((*path, i), v) for i, v in enumerate(value)]
        else:
            continue
        for child in reversed(children):
            stack.append(child)
        paths.extend(p for p, _ in children)
    return paths


def get_path(doc: Json, path: JsonPath) -> Json:
    for part in path:
        doc = doc[part]
    return doc


def _path_text(path: JsonPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


EDITS = (
    "replace",
    "replace",
    "replace",
    "delete",
    "delete",
    "null",
    "wrap-list",
    "wrap-map",
    "stringify",
    "duplicate",
    "unknown-key",
    "deep",
    "blow-up",
    "rename-key",
)


@st.composite
def edit_document(draw: st.DrawFn, doc: Json, raw: _Raw, *, extra: Sequence[Json] = ()) -> tuple[Json, str]:
    """One edit at a random path of `doc` (changed in place where possible); (new doc, description)."""
    paths = all_paths(doc)
    # The root rarely: hypothesis favours index 0, and a replaced root hides every other check.
    at_root = len(paths) == 1 or draw(st.integers(0, 19)) == 0
    path = paths[0 if at_root else draw(st.integers(1, len(paths) - 1), label="path")]
    op = draw(st.sampled_from(EDITS), label="edit")
    value = get_path(doc, path)
    parent = get_path(doc, path[:-1]) if path else None
    key = path[-1] if path else None
    where = _path_text(path)

    def put(new: Json) -> Json:
        if parent is None:
            return new
        parent[key] = new
        return doc

    def nasty() -> Json:
        if len(extra) > 0 and draw(st.booleans()):
            return copy.deepcopy(draw(st.sampled_from(list(extra))))
        # Copied: the pools hold shared lists and mappings a later edit could change in place.
        return copy.deepcopy(draw(nasty_value(raw, key, path[:-1])))

    if op == "replace":
        new = nasty()
        return put(new), f"{where} = {_show(new, raw)}"
    if op == "delete":
        if parent is None:
            return None, "(root) deleted"
        del parent[key]
        return doc, f"{where} deleted"
    if op == "null":
        return put(None), f"{where} = null"
    if op == "wrap-list":
        return put([value]), f"{where} wrapped in a list"
    if op == "wrap-map":
        return put({"value": value}), f"{where} wrapped in a mapping"
    if op == "stringify":
        if isinstance(value, str):
            number = int(value) if value.isdecimal() and len(value) < 100 else 0
            new = draw(st.sampled_from((number, len(value), [value], value * 2)))
        else:
            new = json.dumps(value, default=str)[:1000] if not isinstance(value, float) else str(value)
        return put(new), f"{where} = {_show(new, raw)} (type changed)"
    if op == "duplicate":
        if isinstance(parent, list) and isinstance(key, int):
            parent.insert(key, copy.deepcopy(value))
            return doc, f"{where} duplicated"
        if isinstance(value, list) and value:
            value.append(copy.deepcopy(value[0]))
            return doc, f"{where}[0] appended again"
        return put([value, copy.deepcopy(value)]), f"{where} given twice in a list"
    if op == "unknown-key":
        if isinstance(value, dict):
            name = draw(
                st.sampled_from(("unknownField", "", "kind", "items", "x" * 200, "x" * 3000, "ñ", "$ref"))
            )
            value[name] = nasty()
            return doc, f"{where}.{name} added"
        new = nasty()
        return put(new), f"{where} = {_show(new, raw)}"
    if op == "deep":
        depth = draw(st.sampled_from(DEPTHS))
        marker = raw.marker(
            _deep_list(depth) if depth % 2 else _deep_json_map(depth),
            _deep_list(depth) if depth % 2 else _deep_yaml_map(depth),
        )
        return put(marker), f"{where} nested {depth} deep"
    if op == "blow-up":
        times = draw(st.sampled_from((10, 100, 500)))
        if isinstance(value, list) and value:
            times = min(times, max(1, 1_000_000 // _size(value[-1])))  # a megabyte or so
            value.extend(copy.deepcopy(value[-1]) for _ in range(times))
            return doc, f"{where} last item repeated {times} times"
        if isinstance(value, str) and value not in raw.fragments:
            repeat = max(1, min(times * 20, 200_000 // max(len(value), 1)))
            return put(value * repeat), f"{where} repeated {repeat} times"
        times = min(times, max(1, 1_000_000 // _size(value)))
        return put([copy.deepcopy(value) for _ in range(times)]), f"{where} as a list of {times}"
    # rename-key
    if isinstance(parent, dict) and isinstance(key, str):
        new_key = draw(
            st.sampled_from(
                (key.upper(), key + " ", "", key[:-1], f"{key}\u200b", key.capitalize(), (key * 300)[:3000])
            )
        )
        parent[new_key] = parent.pop(key)
        return doc, f"{where} renamed {new_key!r}"
    new = nasty()
    return put(new), f"{where} = {_show(new, raw)}"


def _size(value: Json) -> int:
    """About how many bytes `value` takes once written."""
    try:
        return len(json.dumps(value, default=str)) + 1
    except (ValueError, RecursionError):
        return 1_000_000


def _show(value: Json, raw: _Raw) -> str:
    if isinstance(value, str) and value in raw.fragments:
        text = raw.fragments[value][1]
        return f"<{text[:20]}...{len(text)} chars>" if len(text) > 40 else text
    try:
        shown = json.dumps(value)
    except (TypeError, ValueError):
        shown = repr(value)
    return shown if len(shown) <= 60 else f"{shown[:40]}...({len(shown)} chars)"


def dump_json(doc: Json, raw: _Raw, *, indent: int | None, ascii_only: bool) -> bytes:
    try:
        text = json.dumps(doc, indent=indent, ensure_ascii=ascii_only, default=str)
    except (ValueError, RecursionError):
        text = json.dumps(str(doc)[:1000])
    return raw.substitute(text, as_yaml=False).encode("utf-8", "surrogatepass")


def dump_yaml(docs: Sequence[Json], raw: _Raw, *, flow: bool | None = None) -> bytes:
    try:
        text = yaml.safe_dump_all(
            list(docs),
            sort_keys=False,
            allow_unicode=True,
            default_flow_style=flow,
            explicit_start=len(docs) > 1,
        )
    except (yaml.YAMLError, ValueError, RecursionError, TypeError):
        text = "\n---\n".join(json.dumps(d, default=str) for d in docs)
    return raw.substitute(text, as_yaml=True).encode("utf-8", "surrogatepass")


def _loads_yaml_all(data: bytes) -> list[Json]:
    return list(yaml.load_all(data.decode("utf-8"), Loader=yaml.CSafeLoader))
