"""`minimize`: a delta-debugging reducer that keeps a failing case small while a test on it still holds.

Owns the order of the reductions (whole files, then List items and YAML documents, object fields, long
repetitions, lines) and the run budget. This module must not decide what counts as the same failure:
the caller's `keeps` does (bench/fuzz.py: the same signature).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator

from tests.builders import replace
from tests.fuzzing.case import Case
from tests.fuzzing.edits import all_paths, get_path

# --------------------------------------------------------------------------- minimising


def minimize(case: Case, keeps: Callable[[Case], bool], budget: int = 120) -> Case:
    """A smaller case for which `keeps` still holds (usually: the same signature), within `budget`
    runs: drop whole files, then List items and YAML documents, object fields, long repetitions, lines."""
    runs = 0

    def attempt(candidate: Case) -> bool:
        nonlocal runs
        if runs >= budget or candidate.files == case.files:
            return False
        runs += 1
        return keeps(candidate)

    for name in sorted(case.files, key=lambda n: -len(case.files[n])):
        if name in case.files and len(case.files) > 1:
            candidate = case.without([name], "")
            if attempt(candidate):
                case = replace(candidate, note=case.note)
    for name in sorted(case.files, key=lambda n: -len(case.files[n])):
        if name.endswith("/"):
            continue
        for reducer in (_reduce_items, _reduce_documents, _reduce_fields, _reduce_runs, _reduce_lines):
            for smaller in reducer(case.files[name]):
                if runs >= budget:
                    return case
                candidate = Case({**case.files, name: smaller}, case.argv_kind, case.note)
                if attempt(candidate):
                    case = candidate
                    break
            else:
                continue
            # A reduction held: try the same reducer again on the smaller content.
            for _ in range(20):
                progressed = False
                for smaller in reducer(case.files[name]):
                    if runs >= budget:
                        return case
                    candidate = Case({**case.files, name: smaller}, case.argv_kind, case.note)
                    if attempt(candidate):
                        case, progressed = candidate, True
                        break
                if not progressed:
                    break
    return case


def _chunks(count: int) -> Iterator[tuple[int, int]]:
    """(start, stop) ranges to drop: halves, quarters, ... single elements."""
    size = max(count // 2, 1)
    while size >= 1:
        for start in range(0, count, size):
            yield start, min(start + size, count)
        if size == 1:
            break
        size //= 2


def _reduce_items(data: bytes) -> Iterator[bytes]:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list) or len(doc["items"]) <= 1:
        return
    items = doc["items"]
    for start, stop in _chunks(len(items)):
        kept = items[:start] + items[stop:]
        if kept:
            yield json.dumps({**doc, "items": kept}, indent=1).encode("utf-8", "surrogatepass")


def _reduce_documents(data: bytes) -> Iterator[bytes]:
    text = data.decode("utf-8", "replace")
    if "\n---" not in text:
        return
    parts = re.split(r"(?m)^---\s*$", text)
    if len(parts) <= 1:
        return
    for start, stop in _chunks(len(parts)):
        kept = parts[:start] + parts[stop:]
        if kept:
            yield "---".join(kept).encode("utf-8")


def _reduce_fields(data: bytes) -> Iterator[bytes]:
    """Drop mapping keys of JSON objects, shallowest first (to depth 4 below the List items)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return
    paths = [p for p in all_paths(doc, limit=5000) if p and len(p) <= 5 and isinstance(p[-1], str)]
    for path in sorted(paths, key=len):
        if path in (("kind",), ("apiVersion",)) or path[-1] in ("kind", "apiVersion"):
            continue
        trial = copy.deepcopy(doc)
        try:
            del get_path(trial, path[:-1])[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue
        yield json.dumps(trial, indent=1).encode("utf-8", "surrogatepass")


_RUN = re.compile(rb"(.{1,16}?)\1{31,}", re.DOTALL)


def _reduce_runs(data: bytes) -> Iterator[bytes]:
    """Long repetitions (a value 100,000 characters long, nesting thousands deep) cut to a half, a
    quarter... all at once, so that opening and closing brackets stay matched."""
    if _RUN.search(data) is None:
        return
    for divisor in (2, 4, 8, 16):

        def cut(match: re.Match[bytes], divisor: int = divisor) -> bytes:
            unit = match.group(1)
            return unit * max(len(match.group(0)) // len(unit) // divisor, 32)

        yield _RUN.sub(cut, data)


def _reduce_lines(data: bytes) -> Iterator[bytes]:
    lines = data.split(b"\n")
    if len(lines) <= 1:
        return
    comments = [line for line in lines if not line.lstrip().startswith(b"#") or line.strip() == b"# EOF"]
    if len(comments) < len(lines):
        yield b"\n".join(comments)
    for start, stop in _chunks(len(lines)):
        kept = lines[:start] + lines[stop:]
        yield b"\n".join(kept)
