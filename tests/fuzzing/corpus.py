"""The corpus of failing cases: `save_case` writes one under `tests/fuzz_corpus/<hash>/` (its files and a
`case.json` with the command, the note, the signature and the violations), `load_corpus` reads every
saved case back.

Owns the on-disk form of a saved case only: this module must not run or reduce a case, nor decide
what is a failure (the caller passes the violations it found; tests/test_fuzz.py replays the corpus).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.fuzzing.case import Case, argv_for, write_case
from tests.fuzzing.contract import _cut, signature
from tests.fuzzing.layout import ARGV_KINDS, CASE_FILE, CORPUS_DIR

# --------------------------------------------------------------------------- the corpus


@dataclasses.dataclass(frozen=True)
class CorpusEntry:
    name: str  # the directory under tests/fuzz_corpus
    case: Case
    recorded: Mapping[str, Any]  # the case.json it was saved with


def case_hash(case: Case) -> str:
    digest = hashlib.sha256(case.argv_kind.encode())
    for name in sorted(case.files):
        digest.update(b"\0" + name.encode() + b"\0" + case.files[name])
    return digest.hexdigest()[:12]


def save_case(case: Case, found: Sequence[str], directory: Path = CORPUS_DIR) -> Path:
    """Write `case` as `<directory>/<hash>/` (its files and a case.json) and return that directory."""
    target = directory / case_hash(case)
    files = {k: v for k, v in case.files.items() if not k.endswith("/")}
    if CASE_FILE in files:
        raise ValueError(f"a case may not hold a top-level {CASE_FILE}")
    write_case(target, files)
    record = {
        "argv_kind": case.argv_kind,
        "command": "rebalancer " + " ".join(argv_for(case.files, case.argv_kind)),
        "note": case.note,
        "signature": signature(found),
        "violations": [_cut(v, 500) for v in found],
        # Directories git would not keep: recreated on load.
        "directories": sorted(k for k in case.files if k.endswith("/")),
    }
    (target / CASE_FILE).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return target


def load_case(path: Path) -> CorpusEntry:
    record = json.loads((path / CASE_FILE).read_text(encoding="utf-8"))
    files: dict[str, bytes] = {}
    for file in sorted(path.rglob("*")):
        relative = file.relative_to(path).as_posix()
        if relative == CASE_FILE:
            continue
        if file.is_file():
            files[relative] = file.read_bytes()
        elif file.is_dir() and not any(file.iterdir()):
            files[relative + "/"] = b""
    for directory in record.get("directories", ()):
        if not any(k.startswith(directory) for k in files):
            files[directory] = b""
    argv_kind = record["argv_kind"]
    if argv_kind not in ARGV_KINDS:
        raise ValueError(f"{path}: unknown argv_kind {argv_kind!r}")
    return CorpusEntry(path.name, Case(files, argv_kind, record.get("note", "")), record)


def load_corpus(directory: Path = CORPUS_DIR) -> list[CorpusEntry]:
    """Every case saved under `directory`, in name order."""
    if not directory.is_dir():
        return []
    return [load_case(p) for p in sorted(directory.iterdir()) if (p / CASE_FILE).is_file()]
