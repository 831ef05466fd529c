"""`Case`: the files of one fuzz input and the command to run on them.

Owns the case value (relative path -> bytes, a key ending in `/` a directory; the command kind; a note
of how it was made), the unmodified base case (`tests/fixtures/fuzz/base` with the demo policy, or
another shipped one), which files of a case are its policies, the command line for a case
(`argv_for`), and writing a case's files into a directory (`write_case`).

A case is data: this module must not draw, run or judge anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.fuzzing.layout import (
    BASE_DIR,
    DEMO_POLICY,
    POLICY_FILE,
    POLICY_SEEDS,
    ROOT,
    SNAPSHOT_DIR,
    ArgvKind,
)

# --------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True, repr=False)
class Case:
    """One input: relative path -> content (a path ending in `/` is a directory), and the command."""

    files: Mapping[str, bytes]
    argv_kind: ArgvKind
    note: str = ""

    def __repr__(self) -> str:  # hypothesis prints drawn cases: sizes, not 150 KB of bytes
        sizes = ", ".join(f"{name}={len(data)}B" for name, data in sorted(self.files.items()))
        return f"Case({self.argv_kind!r}, note={self.note!r}, files=[{sizes}])"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # hypothesis' pretty printer
        printer.text(repr(self))

    def with_file(self, name: str, data: bytes, note: str) -> Case:
        return Case({**self.files, name: data}, self.argv_kind, _join_note(self.note, note))

    def without(self, names: Sequence[str], note: str) -> Case:
        files = {k: v for k, v in self.files.items() if k not in names}
        return Case(files, self.argv_kind, _join_note(self.note, note))

    def replace_files(self, files: Mapping[str, bytes], note: str) -> Case:
        return Case(dict(files), self.argv_kind, _join_note(self.note, note))

    def with_argv(self, argv_kind: ArgvKind) -> Case:
        return Case(self.files, argv_kind, self.note)

    def snapshot_files(self) -> list[str]:
        return sorted(k for k in self.files if k.startswith(SNAPSHOT_DIR + "/") and not k.endswith("/"))

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.files.values())


def _join_note(note: str, more: str) -> str:
    joined = f"{note}; {more}" if note and more else note or more
    return joined if len(joined) <= 600 else joined[:597] + "..."


def _load_base() -> dict[str, bytes]:
    return {f"{SNAPSHOT_DIR}/{p.name}": p.read_bytes() for p in sorted(BASE_DIR.iterdir()) if p.is_file()}


BASE_FILES: Mapping[str, bytes] = _load_base()
POLICY_TEXTS: Mapping[str, bytes] = {p.relative_to(ROOT).as_posix(): p.read_bytes() for p in POLICY_SEEDS}


def base_case(argv_kind: ArgvKind = "once", *, policy: bytes | None = None) -> Case:
    """The unmodified base snapshot with the demo policy (or `policy`)."""
    files = dict(BASE_FILES)
    files[POLICY_FILE] = DEMO_POLICY.read_bytes() if policy is None else policy
    return Case(files, argv_kind)


def policy_paths(files: Mapping[str, bytes]) -> list[str]:
    """The policies of a case: top-level `*.yaml` / `*.yml` files, or one inside the snapshot directory."""
    top = sorted(k for k in files if "/" not in k and k.endswith((".yaml", ".yml")))
    if top:
        return top
    inside = f"{SNAPSHOT_DIR}/{POLICY_FILE}"
    return [inside] if inside in files else []


def argv_for(files: Mapping[str, bytes], argv_kind: ArgvKind) -> list[str]:
    """The command line for a case, relative to the case directory."""
    policies = policy_paths(files)
    if argv_kind == "validate":
        return ["validate", *(policies or [POLICY_FILE])]
    argv = ["once", "--snapshot", SNAPSHOT_DIR]
    if policies:
        argv += ["--policy", POLICY_FILE if POLICY_FILE in policies else policies[0]]
    if argv_kind == "once-json":
        argv += ["--output", "json"]
    elif argv_kind == "once-markdown":
        argv += ["--output", "markdown"]
    return argv


def write_case(root: Path, files: Mapping[str, bytes]) -> None:
    """Write a case's files under `root` (created); directories are keys ending in `/`."""
    root.mkdir(parents=True, exist_ok=True)
    for name in sorted(files):
        parts = Path(name.rstrip("/")).parts
        if not parts or name.startswith("/") or ".." in parts:
            raise ValueError(f"case path outside the case: {name!r}")
        target = root.joinpath(*parts)
        # Entries that contradict each other (`snapshot` both a file and a directory): the first wins.
        if any(parent.is_file() for parent in target.parents if parent != root and root in parent.parents):
            continue
        if target.exists() and target.is_dir() != name.endswith("/"):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith("/"):
            target.mkdir(exist_ok=True)
        else:
            target.write_bytes(files[name])
