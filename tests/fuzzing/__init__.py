"""Fuzzing the command line's input contract.

The contract (README, "Commands"): for every input, `rebalancer once --snapshot DIR [--policy FILE]`
and `rebalancer validate POLICY...` exit 0, or exit 2 with one line per problem on stderr, each of
the form `rebalancer: error: <where>: <what>` where <where> names the file (and the line or field
where known). Never a traceback, never exit 1 for a problem in a file, always in bounded time and
memory.

This module holds everything the fuzz tests (tests/test_fuzz.py) and the long runner (bench/fuzz.py)
share:

- `Case`: the files of one input (a snapshot directory `snapshot/`, policies next to it) and the
  command to run on them;
- hypothesis strategies that mutate the real inputs of `tests/fixtures/fuzz/base` (a small cut of
  examples/demo-cluster) and the shipped policies: structure-aware (parse the JSON / YAML, change one
  path, write it back) and byte-level, kubectl objects and Lists, DCGM expositions, `snapshot.yaml`,
  policies, and whole files (compressed, moved, renamed, deleted);
- `run_case`: runs the command on a case in a forked child under an address-space limit and a time
  limit, and collects its exit status, output and resource use;
- `violations`: what in a result breaks the contract, and `signature`, a short key that groups the
  results of one bug;
- `minimize`: a delta-debugging reducer that keeps a failing case small while its signature holds;
- the corpus: `save_case` writes a failing case under `tests/fuzz_corpus/<hash>/` (its files plus a
  `case.json`), `load_corpus` reads every saved case back.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections.abc import Sequence
from typing import Literal

import yaml
from hypothesis import strategies as st

from tests.builders import replace
from tests.fuzzing.case import BASE_FILES, POLICY_TEXTS, Case, base_case
from tests.fuzzing.contract import VIOLATION_ORDER, _cut, describe, signature, violations
from tests.fuzzing.corpus import CorpusEntry, load_corpus, save_case
from tests.fuzzing.edits import dump_yaml, edit_document
from tests.fuzzing.layout import (
    ARGV_KINDS,
    CHILD_CRASH,
    DEFAULT_TIMEOUT,
    DEMO_POLICY,
    GIB,
    POLICY_FILE,
    SNAPSHOT_DIR,
    STRATEGY_NAMES,
    ArgvKind,
    Json,
)
from tests.fuzzing.objects import mutate_objects_json, mutate_objects_yaml
from tests.fuzzing.reducer import minimize
from tests.fuzzing.runner import run, run_case, warm_up
from tests.fuzzing.values import (
    DEPTHS,
    DURATIONS,
    POLICY_VALUES,
    YAML_SCALARS,
    _deep_list,
    _deep_yaml_map,
    _Raw,
)

# The names bench/ and the tests use as `fuzzing.X` (bench/fuzz.py also borrows `_cut`).
__all__ = [
    "BASE_FILES",
    "CHILD_CRASH",
    "DEFAULT_TIMEOUT",
    "GIB",
    "KINDS",
    "POLICY_TEXTS",
    "STRATEGY_NAMES",
    "VIOLATION_ORDER",
    "Case",
    "CorpusEntry",
    "Kind",
    "_cut",
    "base_case",
    "cases",
    "describe",
    "exposition_texts",
    "load_corpus",
    "minimize",
    "mutated_expositions",
    "run",
    "run_case",
    "save_case",
    "signature",
    "violations",
    "warm_up",
]

Kind = Literal[
    "objects-json", "objects-yaml", "bytes", "files", "exposition", "snapshot-yaml", "policy", "mixed"
]
KINDS: tuple[Kind, ...] = (
    "objects-json",
    "objects-yaml",
    "bytes",
    "files",
    "exposition",
    "snapshot-yaml",
    "policy",
    "mixed",
)


# --------------------------------------------------------------------------- strategies per input kind


@st.composite
def snapshot_argv(draw: st.DrawFn) -> ArgvKind:
    return draw(st.sampled_from(("once", "once", "once", "once-json", "once-markdown")))


@st.composite
def snapshot_base(draw: st.DrawFn) -> Case:
    """The base snapshot, run with the demo policy, another shipped policy or the built-in default."""
    argv_kind = draw(snapshot_argv())
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return base_case(argv_kind).without([POLICY_FILE], "built-in default policy")
    if choice == 1:
        name = draw(st.sampled_from(sorted(POLICY_TEXTS)))
        case = base_case(argv_kind, policy=POLICY_TEXTS[name])
        return replace(case, note=f"policy {name}")
    return base_case(argv_kind)


INVALID_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x80", b"\xe2\x82")


@st.composite
def mutate_bytes(draw: st.DrawFn, case: Case, name: str | None = None) -> Case:
    """Byte-level damage to one file: truncation, invalid UTF-8, NULs, BOMs, other encodings, splices."""
    names = sorted(k for k in case.files if not k.endswith("/"))
    if not names:
        return case
    name = name or draw(st.sampled_from(names))
    data = case.files[name]
    op = draw(
        st.sampled_from(
            (
                "truncate",
                "truncate",
                "empty",
                "invalid-utf8",
                "invalid-utf8",
                "nul",
                "bom",
                "utf16",
                "flip",
                "delete-chunk",
                "duplicate-chunk",
                "crlf",
                "random",
                "splice",
                "latin1",
                "cr-only",
            )
        ),
        label="byte-op",
    )
    at = draw(st.integers(0, max(len(data), 0)), label="offset")
    if op == "truncate":
        new, note = data[:at], f"truncated at byte {at}"
    elif op == "empty":
        new, note = b"", "emptied"
    elif op == "invalid-utf8":
        bad = draw(st.sampled_from(INVALID_UTF8))
        new, note = data[:at] + bad + data[at:], f"invalid UTF-8 {bad!r} at byte {at}"
    elif op == "nul":
        new, note = data[:at] + b"\x00" + data[at:], f"NUL at byte {at}"
    elif op == "bom":
        bom = draw(st.sampled_from((b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")))
        new, note = bom + data, f"BOM {bom!r}"
    elif op == "utf16":
        new, note = data.decode("utf-8", "replace").encode("utf-16"), "re-encoded as UTF-16"
    elif op == "latin1":
        new, note = (
            data.decode("utf-8", "replace").replace("\ufffd", "?").encode("latin-1", "replace"),
            "latin-1",
        )
        new = new + "é".encode("latin-1")
    elif op == "flip":
        if not data:
            new, note = b"\x01", "one byte"
        else:
            index = min(at, len(data) - 1)
            bit = 1 << draw(st.integers(0, 7))
            new = data[:index] + bytes([data[index] ^ bit]) + data[index + 1 :]
            note = f"bit {bit} flipped at byte {index}"
    elif op == "delete-chunk":
        size = draw(st.integers(1, 4096))
        new, note = data[:at] + data[at + size :], f"{size} bytes deleted at {at}"
    elif op == "duplicate-chunk":
        size = draw(st.integers(1, 4096))
        new, note = (
            data[: at + size] + data[at : at + size] + data[at + size :],
            f"{size} bytes repeated at {at}",
        )
    elif op == "crlf":
        new, note = data.replace(b"\n", b"\r\n"), "CRLF line ends"
    elif op == "cr-only":
        new, note = data.replace(b"\n", b"\r"), "CR line ends"
    elif op == "random":
        new = draw(st.binary(max_size=300))
        note = f"replaced by {len(new)} random bytes"
    else:
        other = draw(st.sampled_from(names))
        cut = draw(st.integers(0, len(case.files[other])))
        new, note = data[:at] + case.files[other][cut:], f"spliced with {other.split('/')[-1]} at {at}"
    return case.with_file(name, new, f"{name.split('/')[-1]}: {note}")


@st.composite
def mutate_files(draw: st.DrawFn, case: Case) -> Case:
    """Whole-file changes: compressed copies, subdirectories, renames, deletions, odd entries."""
    snap = case.snapshot_files()
    op = draw(
        st.sampled_from(
            (
                "gzip",
                "gzip",
                "gzip-unrenamed",
                "subdir",
                "delete",
                "delete",
                "copy",
                "rename",
                "rename",
                "hidden",
                "dir-named-like-file",
                "empty-dir",
                "no-dir",
                "dir-is-file",
                "policy-inside",
                "odd-name",
                "only",
            )
        ),
        label="file-op",
    )
    if not snap and op not in ("no-dir", "dir-is-file", "empty-dir"):
        op = "empty-dir"
    if op in ("gzip", "gzip-unrenamed"):
        name = draw(st.sampled_from(snap))
        packed = gzip.compress(case.files[name], mtime=0)
        if op == "gzip":
            target = name + ".gz"
            keep = draw(st.booleans())
            out = case.with_file(target, packed, f"{name.split('/')[-1]} gzip-compressed as .gz")
            return out if keep else out.without([name], "original removed")
        return case.with_file(name, packed, f"{name.split('/')[-1]} gzip-compressed in place")
    if op == "subdir":
        name = draw(st.sampled_from(snap))
        sub = draw(st.sampled_from(("sub", "2026-11-29", ".hidden", "nested/deeper")))
        moved = f"{SNAPSHOT_DIR}/{sub}/{name.split('/', 1)[1]}"
        return case.without([name], "").with_file(
            moved, case.files[name], f"{name.split('/')[-1]} moved to {sub}/"
        )
    if op == "delete":
        names = draw(st.lists(st.sampled_from(snap), min_size=1, max_size=3, unique=True))
        return case.without(names, f"deleted {', '.join(n.split('/')[-1] for n in names)}")
    if op == "copy":
        name = draw(st.sampled_from(snap))
        stem, dot, suffix = name.rpartition(".")
        copy_name = f"{stem}-copy{dot}{suffix}" if dot else name + "-copy"
        return case.with_file(copy_name, case.files[name], f"{name.split('/')[-1]} copied")
    if op == "rename":
        name = draw(st.sampled_from(snap))
        # A name with no dot (an earlier rename dropped it) is all stem.
        stem = name.rpartition(".")[0] if "." in name.rsplit("/", 1)[-1] else name
        new_suffix = draw(
            st.sampled_from(("json", "yaml", "yml", "prom", "om", "JSON", "Yaml", "OM", "txt", ""))
        )
        target = f"{stem}.{new_suffix}" if new_suffix else stem
        if target == name:
            return case
        return case.without([name], "").with_file(
            target, case.files[name], f"{name.split('/')[-1]} renamed .{new_suffix}"
        )
    if op == "hidden":
        name = draw(st.sampled_from(snap))
        hidden = f"{SNAPSHOT_DIR}/.{name.split('/', 1)[1]}"
        return case.without([name], "").with_file(hidden, case.files[name], f"{name.split('/')[-1]} hidden")
    if op == "dir-named-like-file":
        name = draw(st.sampled_from((*snap, f"{SNAPSHOT_DIR}/x.json", f"{SNAPSHOT_DIR}/snapshot.yaml")))
        files = {k: v for k, v in case.files.items() if k != name}
        files[name + "/"] = b""
        return case.replace_files(files, f"{name.split('/')[-1]} is a directory")
    if op == "empty-dir":
        files = {k: v for k, v in case.files.items() if not _in_snapshot(k)}
        files[SNAPSHOT_DIR + "/"] = b""
        return case.replace_files(files, "empty snapshot directory")
    if op == "no-dir":
        files = {k: v for k, v in case.files.items() if not _in_snapshot(k)}
        return case.replace_files(files, "no snapshot directory")
    if op == "dir-is-file":
        files = {k: v for k, v in case.files.items() if not _in_snapshot(k)}
        files[SNAPSHOT_DIR] = case.files.get(f"{SNAPSHOT_DIR}/pods.json", b"{}")
        return case.replace_files(files, "snapshot is a file")
    if op == "policy-inside":
        policy = case.files.get(POLICY_FILE, DEMO_POLICY.read_bytes())
        files = {k: v for k, v in case.files.items() if k != POLICY_FILE}
        files[f"{SNAPSHOT_DIR}/{POLICY_FILE}"] = policy
        return case.replace_files(files, "policy inside the snapshot directory")
    if op == "odd-name":
        name = draw(st.sampled_from(snap))
        base = name.rsplit("/", 1)[-1]
        suffix = "." + base.rpartition(".")[2] if "." in base else ""
        odd = draw(
            st.sampled_from(("pöds ü", "with space", "x" * 200, "-leading-dash", "a:b", "1", "--policy"))
        )
        target = f"{SNAPSHOT_DIR}/{odd}{suffix}"
        return case.without([name], "").with_file(
            target, case.files[name], f"{name.split('/')[-1]} renamed {odd!r}"
        )
    # only: a single file of the snapshot kept
    name = draw(st.sampled_from(snap))
    kept = {k: v for k, v in case.files.items() if not k.startswith(SNAPSHOT_DIR + "/") or k == name}
    return case.replace_files(kept, f"only {name.split('/')[-1]} kept")


def _in_snapshot(name: str) -> bool:
    return name == SNAPSHOT_DIR or name.startswith(SNAPSHOT_DIR + "/")


GARBAGE_LINES = (
    "garbage",
    "{}",
    "metric{",
    'x{a="1"} 1 2 3',
    "# TYPE x bogus",
    "# HELP",
    "#",
    "  ",
    "\t",
    'DCGM_FI_DEV_GPU_UTIL{gpu="0"} abc',
    "DCGM_FI_DEV_GPU_UTIL 1 notatime",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_GPU_UTIL{} 1",
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",gpu="1"} 1',
    "DCGM_FI_DEV_GPU_UTIL{gpu=0} 1",
    '{gpu="0"} 1',
    'DCGM_FI_DEV_GPU_UTIL{"gpu"="0"} 1',
    "# EOF",
    "# UNIT DCGM_FI_DEV_GPU_UTIL percent",
    "# TYPE DCGM_FI_DEV_GPU_UTIL counter",
    'ünïcødé{ä="ö"} 1',
    "\x00",
    "DCGM_FI_DEV_GPU_UTIL 1e400",
    "DCGM_FI_DEV_GPU_UTIL NaN 1795953135",
    'DCGM_FI_DEV_FB_USED{hostname="ghost-node",UUID="GPU-x",gpu="0"} 99999999999 1795953135',
    "DCGM_FI_DEV_GPU_UTIL" + "x" * 3000 + " 1",
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",note="' + "x" * 3000 + '"} 1 1795953135',
)
SAMPLE_VALUES = (
    "NaN",
    "+Inf",
    "-Inf",
    "Nan",
    "nan",
    "inf",
    "1e400",
    "-1e400",
    "-1",
    "1e308",
    "0x10",
    "1_000",
    "9" * 400,
    "",
    "1.5.5",
    "∞",
    "-0",
    "4294967280",
    "140737488355328",
    "9223372036854775792",
    "9" * 3000 + "x",
)
TIMESTAMP_EDITS = (
    "x1000",
    "/1000",
    "negative",
    "1e20",
    "9" * 30,
    "1e400",
    "0",
    "fraction",
    "abc",
    "remove",
    "-1e400",
    "253402300800",
    "NaN",
)
LABEL_VALUES = (
    '\\"',
    "\\\\",
    "\\n",
    "ü",
    "}",
    "\\x",
    '"',
    "",
    ",",
    "=",
    "x" * 100_000,
    "a\\",
    "\t",
)


def _split_sample(line: str) -> tuple[str, list[str]] | None:
    """`name{labels}` and the rest (value, timestamp, exemplar...) of a sample line."""
    if not line or line.startswith("#"):
        return None
    brace = line.rfind("}")
    head_end = brace + 1 if brace != -1 else line.find(" ")
    if head_end <= 0:
        return None
    return line[:head_end], line[head_end:].split()


def _join_sample(series: str, rest: Sequence[str]) -> str:
    return " ".join([series, *rest])


EXPOSITION_OPS = (
    "value",
    "value",
    "timestamp",
    "timestamp",
    "out-of-order",
    "duplicate-line",
    "garbage",
    "garbage",
    "label",
    "label",
    "duplicate-family",
    "type",
    "drop-metadata",
    "eof-remove",
    "eof-middle",
    "eof-add",
    "after-eof",
    "scale-all",
    "strip-timestamps",
    "crlf",
    "exemplar",
    "rename-metric",
    "huge-timestamp-all",
)


@st.composite
def mutate_exposition(draw: st.DrawFn, case: Case) -> Case:
    """DCGM expositions: values, timestamps, labels, families, `# EOF`, garbage lines."""
    names = [n for n in case.snapshot_files() if n.endswith((".om", ".prom"))]
    if not names:
        return case
    name = draw(st.sampled_from(names))
    try:
        lines = case.files[name].decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return case
    samples = [i for i, line in enumerate(lines) if _split_sample(line) is not None]
    notes: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(EXPOSITION_OPS), label="exposition-op")
        index = samples[draw(st.integers(0, len(samples) - 1))] if samples else 0
        parsed = _split_sample(lines[index]) if samples else None
        if op == "value" and parsed:
            series, rest = parsed
            value = draw(st.sampled_from(SAMPLE_VALUES))
            lines[index] = _join_sample(series, [value, *rest[1:]] if value else rest[1:])
            notes.append(f"line {index + 1} value {value[:20]!r}")
        elif op == "timestamp" and parsed:
            series, rest = parsed
            edit = draw(st.sampled_from(TIMESTAMP_EDITS))
            rest = list(rest) + ([] if len(rest) > 1 else ["1795953135"])
            rest[1] = _edit_timestamp(rest[1], edit)
            lines[index] = _join_sample(series, [r for r in rest if r])
            notes.append(f"line {index + 1} timestamp {edit}")
        elif op == "out-of-order" and parsed and index + 1 < len(lines):
            other = _split_sample(lines[index + 1])
            if other and len(parsed[1]) > 1 and len(other[1]) > 1:
                a, b = list(parsed[1]), list(other[1])
                a[1], b[1] = b[1], a[1]
                lines[index], lines[index + 1] = _join_sample(parsed[0], a), _join_sample(other[0], b)
                notes.append(f"lines {index + 1}-{index + 2} out of order")
        elif op == "duplicate-line":
            lines.insert(index, lines[index])
            notes.append(f"line {index + 1} repeated")
        elif op == "garbage":
            garbage = draw(st.sampled_from(GARBAGE_LINES) | st.text(max_size=40))
            at = draw(st.integers(0, len(lines)))
            lines.insert(at, garbage)
            notes.append(f"garbage {garbage[:30]!r} at line {at + 1}")
        elif op == "label" and parsed:
            series, rest = parsed
            value = draw(st.sampled_from(LABEL_VALUES))
            how = draw(st.sampled_from(("value", "add", "duplicate", "empty", "unclosed", "bad-name")))
            lines[index] = _join_sample(_edit_labels(series, how, value), rest)
            notes.append(f"line {index + 1} labels {how} {value[:10]!r}")
        elif op == "duplicate-family":
            first = [line for line in lines if line and line != "# EOF"]
            family = _first_family(first)
            eof = "# EOF" in lines
            body = [line for line in lines if line != "# EOF"]
            lines = body + family + (["# EOF"] if eof else [])
            notes.append("first family repeated")
        elif op == "type":
            kind = draw(
                st.sampled_from(
                    (
                        "counter",
                        "histogram",
                        "summary",
                        "info",
                        "stateset",
                        "gaugehistogram",
                        "unknown",
                        "untyped",
                        "bogus",
                        "",
                    )
                )
            )
            lines = [
                re.sub(r"^(# TYPE \S+) \S+$", rf"\1 {kind}", line, count=1)
                if line.startswith("# TYPE")
                else line
                for line in lines
            ]
            notes.append(f"TYPE {kind!r}")
        elif op == "drop-metadata":
            lines = [line for line in lines if not line.startswith(("# TYPE", "# HELP"))]
            notes.append("no HELP / TYPE")
        elif op == "eof-remove":
            lines = [line for line in lines if line != "# EOF"]
            notes.append("# EOF removed")
        elif op == "eof-middle":
            lines.insert(draw(st.integers(0, len(lines))), "# EOF")
            notes.append("# EOF in the middle")
        elif op == "eof-add":
            lines = [*(line for line in lines if line), "# EOF", ""]
            notes.append("# EOF added")
        elif op == "after-eof":
            lines += ['DCGM_FI_DEV_GPU_UTIL{gpu="9",UUID="GPU-after",hostname="l4-a-1"} 1 1795953135', ""]
            notes.append("sample after # EOF")
        elif op == "scale-all":
            factor = draw(st.sampled_from(("x1000", "/1000")))
            lines = [_edit_line_timestamp(line, factor) for line in lines]
            notes.append(f"every timestamp {factor}")
        elif op == "huge-timestamp-all":
            edit = draw(st.sampled_from(("1e20", "negative", "0", "253402300800", "9" * 30)))
            lines = [_edit_line_timestamp(line, edit) for line in lines]
            notes.append(f"every timestamp {edit}")
        elif op == "strip-timestamps":
            lines = [_edit_line_timestamp(line, "remove") for line in lines]
            notes.append("no timestamps")
        elif op == "crlf":
            lines = [line + "\r" if line else line for line in lines]
            notes.append("CRLF")
        elif op == "exemplar" and parsed:
            series, rest = parsed
            lines[index] = _join_sample(series, [*rest, '# {trace_id="abc"} 1.0 1795953135'])
            notes.append(f"line {index + 1} exemplar")
        elif op == "rename-metric" and parsed:
            series, rest = parsed
            suffix = draw(st.sampled_from(("_total", "_created", "_bucket", "_count", "_info", "x")))
            metric, brace, labels = series.partition("{")
            lines[index] = _join_sample(metric + suffix + brace + labels, rest)
            notes.append(f"line {index + 1} metric {suffix}")
        samples = [i for i, line in enumerate(lines) if _split_sample(line) is not None]
    out = case.with_file(name, "\n".join(lines).encode("utf-8"), f"{name.split('/')[-1]}: {', '.join(notes)}")
    if draw(st.integers(0, 3)) == 0 and f"{SNAPSHOT_DIR}/snapshot.yaml" in out.files:
        out = out.without([f"{SNAPSHOT_DIR}/snapshot.yaml"], "no snapshot.yaml (now from the samples)")
    return out


def _edit_timestamp(text: str, edit: str) -> str:
    try:
        number = float(text)
    except ValueError:
        number = 1795953135.0
    if edit == "x1000":
        return f"{int(number * 1000) if math.isfinite(number) else text}"
    if edit == "/1000":
        return f"{number / 1000:.3f}" if math.isfinite(number) else text
    if edit == "negative":
        return f"-{text.lstrip('-')}"
    if edit == "fraction":
        return f"{text}.5" if "." not in text else text + "5"
    if edit == "remove":
        return ""
    return edit


def _edit_line_timestamp(line: str, edit: str) -> str:
    parsed = _split_sample(line)
    if parsed is None or len(parsed[1]) < 2:
        return line
    series, rest = parsed
    rest = list(rest)
    rest[1] = _edit_timestamp(rest[1], edit)
    return _join_sample(series, [r for r in rest if r])


def _edit_labels(series: str, how: str, value: str) -> str:
    metric, brace, labels = series.partition("{")
    labels = labels.removesuffix("}")
    if how == "value":
        labels = re.sub(r'="[^"]*"', lambda _: f'="{value}"', labels, count=1)
    elif how == "add":
        labels = f'{labels},extra="{value}"' if labels else f'extra="{value}"'
    elif how == "duplicate":
        first = labels.split(",")[0] if labels else 'gpu="0"'
        labels = f"{labels},{first}"
    elif how == "empty":
        labels = ""
    elif how == "unclosed":
        return f"{metric}{{{labels}"
    else:
        labels = f'{labels},1bad-name="{value}"'
    return f"{metric}{{{labels}}}" if brace or labels else metric


def _first_family(lines: Sequence[str]) -> list[str]:
    out: list[str] = []
    name: str | None = None
    for line in lines:
        if line.startswith("# TYPE ") or line.startswith("# HELP "):
            current = line.split()[2] if len(line.split()) > 2 else ""
            if name is not None and current != name and any(not x.startswith("#") for x in out):
                break
            name = current
        out.append(line)
    return out[:400]


# ---- whole expositions, for the differential test of the exposition reader (tests/test_exposition_reader.py)
# Each pool in two parts: what both parsers accept (however tricky), and what one of them refuses or reads
# in its own way. A drawn exposition is tame (only the first parts: mostly read by the fast reading, so
# its tricky-but-valid content is compared) or wild (both parts, then lines changed).

# Label values as written between the quotes: the escapes the formats define and some they do not, and
# characters that end a label set, a sample or a line elsewhere.
LABEL_VALUES_WRITTEN = (
    "",
    "0",
    "GPU-35f046dd-269a-9346-2194-6a98ff4a4f2b",
    "NVIDIA H100 80GB HBM3",
    "a b",
    "}",
    "{",
    ",",
    "=",
    '\\"',
    "\\\\",
    "\\n",
    "\\x",
    '\\\\\\"',
    "#",
    " # ",
    "} 1 2",
    "\t",
    "ü",
    "\u2028",
    "\r",
)
ODD_LABEL_VALUES_WRITTEN = ('"', "a\\", '",b="')
EXPOSITION_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "a", "a_total", "_total", "a:b", "_")
ODD_EXPOSITION_METRICS = ("a_created", "a_bucket", "1a", "ä")
EXPOSITION_LABELS = ("gpu", "UUID", "Hostname", "pod", "le", "quantile", "_", "a1")
ODD_EXPOSITION_LABELS = ("__name__", "__x", "a:b", "1a")
EXPOSITION_VALUES = (
    "1",
    "0",
    "-0",
    "+1",
    "1.5",
    "-0.0",
    "42.0",
    "1e3",
    "1E-3",
    ".5",
    "5.",
    "NaN",
    "+Inf",
    "-Inf",
    "Inf",
    "1e400",
    "123456789012345678901234567890",
)
ODD_EXPOSITION_VALUES = ("nan", "inf", "1_0", "0x10", "9" * 400, "\u0661", "", " 1")
EXPOSITION_TYPES = ("gauge", "gauge", "counter", "untyped", "unknown")
ODD_EXPOSITION_TYPES = ("histogram", "summary", "info", "stateset", "bogus", "")
LINE_NOISE = ('"', "\\", "{", "}", ",", "=", " ", "\t", "#", "\n", "\r", "x", "1", ".")


def _timestamp_text(draw: st.DrawFn, seconds: int, openmetrics: bool, wild: bool) -> str:
    """A timestamp for `seconds` in the format's unit, with a fraction or not; when wild, sometimes in the
    other unit or malformed."""
    kinds = (
        ("unit", "unit", "unit")
        + (("fraction",) if openmetrics or wild else ())
        + (("other-unit", "odd") if wild else ())
    )
    kind = draw(st.sampled_from(kinds))
    if kind == "unit":
        return str(seconds) if openmetrics else str(seconds * 1000)
    if kind == "fraction":
        digits = draw(st.sampled_from(("5", "123", "123456789", "1234567891234", "000")))
        return f"{seconds}.{digits}" if openmetrics else f"{seconds * 1000}.{digits}"
    if kind == "other-unit":
        return str(seconds * 1000) if openmetrics else str(seconds)
    return draw(
        st.sampled_from(("-1", "1e9", "NaN", "+Inf", f"{seconds}.", f".{seconds}", "9" * 25, "0", "1_0"))
    )


def _label_text(draw: st.DrawFn, pairs: Sequence[tuple[str, str]], wild: bool) -> str:
    """A label set as written: the pairs in some order; when wild, sometimes spaced or with a stray comma."""
    order = draw(st.permutations(list(pairs))) if len(pairs) > 1 else list(pairs)
    text = ",".join(f'{name}="{value}"' for name, value in order)
    style = (
        draw(st.sampled_from(("plain", "plain", "spaced", "trailing-comma", "leading-comma"))) if wild else ""
    )
    if style == "spaced":
        text = ", ".join(f'{name} = "{value}"' for name, value in order)
    elif style == "trailing-comma":
        text += ","
    elif style == "leading-comma":
        text = "," + text
    return "{" + text + "}" if text or draw(st.booleans()) else ""


@st.composite
def exposition_texts(draw: st.DrawFn) -> tuple[str, bool]:
    """An exposition from scratch and whether it is meant as OpenMetrics: families with or without
    metadata, series whose label sets are spelled in different orders, tricky label values and numbers,
    timestamps mostly in order; when wild, also what one of the parsers refuses or reads its own way,
    `# EOF` missing, and a few characters or lines changed."""
    openmetrics = draw(st.booleans())
    wild = draw(st.sampled_from((False, False, True)), label="wild")

    def pick(plain: Sequence[str], odd: Sequence[str]) -> str:
        return draw(st.sampled_from(tuple(plain) + (tuple(odd) if wild else ())))

    start = 1_795_953_000
    lines: list[str] = []
    metrics = draw(
        st.lists(
            st.sampled_from(EXPOSITION_METRICS + (ODD_EXPOSITION_METRICS if wild else ())),
            min_size=1,
            max_size=4,
            unique=not wild,  # one family of a name twice is refused by both parsers
        )
    )
    types = EXPOSITION_TYPES if not openmetrics else ("gauge", "gauge", "gauge", "unknown", "counter")
    for metric in metrics:
        if draw(st.integers(0, 3)):
            if draw(st.booleans()):
                # "" gives `# HELP name ` (a trailing space), None `# HELP name` (no text at all)
                help_texts = ("GPU utilization (in %).", "", "a \\ b \\n c", 'quoted "x')
                help_text = draw(st.sampled_from(help_texts + ((None,) if wild or not openmetrics else ())))
                lines.append(f"# HELP {metric}" if help_text is None else f"# HELP {metric} {help_text}")
            if draw(st.integers(0, 4)):
                lines.append(f"# TYPE {metric} {pick(types, ODD_EXPOSITION_TYPES + EXPOSITION_TYPES)}")
            if wild and draw(st.integers(0, 9)) == 0:
                lines.append(f"# UNIT {metric} {draw(st.sampled_from(('bytes', metric.rpartition('_')[2])))}")
        suffix = pick(("",), ("", "", "_total", "_count", "_bucket", "_created", "_info"))
        for _ in range(draw(st.integers(1, 4))):
            names = draw(
                st.lists(
                    st.sampled_from(EXPOSITION_LABELS + (ODD_EXPOSITION_LABELS if wild else ())),
                    max_size=4,
                    unique=not wild,
                )
            )
            pairs = [(name, pick(LABEL_VALUES_WRITTEN, ODD_LABEL_VALUES_WRITTEN)) for name in names]
            timed = draw(st.integers(0, 4)) != 0
            seconds = start
            # Two samples of a series without timestamps is one instant twice, refused by both parsers.
            for _ in range(draw(st.integers(1, 4)) if timed or wild else 1):
                seconds += draw(st.sampled_from((60,) * (9 if wild else 30) + (0, -60)))
                parts = [
                    f"{metric}{suffix}{_label_text(draw, pairs, wild)}",
                    pick(EXPOSITION_VALUES, ODD_EXPOSITION_VALUES),
                ]
                if timed or (wild and draw(st.integers(0, 9)) == 0):
                    parts.append(_timestamp_text(draw, seconds, openmetrics, wild))
                if wild and draw(st.integers(0, 19)) == 0:
                    parts.append('# {trace_id="abc"} 1.0')
                lines.append(" ".join(parts))
        if draw(st.integers(0, 9)) == 0:
            extra: tuple[str, ...] = ("# a comment", "#") if not openmetrics else ()
            extra += ("", "# TYPE", "  ", "# HELP") if wild else ()
            if extra:
                lines.append(draw(st.sampled_from(extra)))
    if openmetrics and (not wild or draw(st.integers(0, 9))):
        lines.append("# EOF")
    for _ in range(draw(st.integers(0, 2)) if wild else 0):
        at = draw(st.integers(0, max(len(lines) - 1, 0)))
        line = lines[at] if lines else ""
        how = draw(st.sampled_from(("insert", "delete", "duplicate", "swap", "crlf", "tab", "strip-eof")))
        if how == "insert":
            where = draw(st.integers(0, len(line)))
            lines[at : at + 1] = [line[:where] + draw(st.sampled_from(LINE_NOISE)) + line[where:]]
        elif how == "delete" and line:
            where = draw(st.integers(0, len(line) - 1))
            lines[at : at + 1] = [line[:where] + line[where + 1 :]]
        elif how == "duplicate":
            lines.insert(at, line)
        elif how == "swap" and at + 1 < len(lines):
            lines[at], lines[at + 1] = lines[at + 1], lines[at]
        elif how == "crlf":
            lines = [one + "\r" for one in lines]
        elif how == "tab":
            lines[at : at + 1] = [line.replace(" ", "\t", 1)]
        elif how == "strip-eof":
            lines = [one for one in lines if one != "# EOF"]
    text = "\n".join(lines)
    return (text + "\n" if not wild or draw(st.integers(0, 9)) else text), openmetrics


@st.composite
def mutated_expositions(draw: st.DrawFn) -> tuple[str, bool]:
    """One of the base snapshot's expositions after `mutate_exposition`, and whether it is OpenMetrics
    (as the snapshot source decides: `.om`, or a `# EOF` line)."""
    case = draw(mutate_exposition(base_case()))
    names = [name for name in case.snapshot_files() if name.endswith((".om", ".prom"))]
    name = draw(st.sampled_from(names))
    text = case.files[name].decode("utf-8", errors="replace")
    openmetrics = name.endswith(".om") or any(line.strip() == "# EOF" for line in text.splitlines())
    return text, openmetrics


NOW_VALUES = (
    "2026-02-30T00:00:00Z",
    "2026-11-29T12:00:00",
    "2026-11-29 12:00:00",
    "2026-11-29 12:00:00 +01:00",
    "99999-01-01T00:00:00Z",
    "9999-12-31T23:59:59-10:00",
    "9999-12-31T23:59:59Z",
    "9999-12-31T23:59:59.999999+00:00",
    "0001-01-01T00:00:00+10:00",
    "0001-01-01T00:00:00Z",
    "1970-01-01T00:00:00Z",
    "1969-12-31T23:59:59Z",
    "2030-01-01T00:00:00Z",
    "2026-11-29T12:10:00Z",
    "2026-11-29",
    "2026-13-01T00:00:00Z",
    "2026-11-29T24:00:00Z",
    "2026-11-29T12:00:60Z",
    "2026-11-29T12:00:00+99:00",
    "2026-11-29t12:00:00z",
    "2026-11-29T12:00:00.1234567890123Z",
    "1e400",
    "12",
    "-1",
    "1795953600",
    "true",
    "null",
    "~",
    "[]",
    "{}",
    "[2026-11-29T12:00:00Z]",
    "{at: 2026-11-29T12:00:00Z}",
    "!!timestamp 2026-02-30",
    "!!timestamp 2026-11-29",
    "!!binary AAAA",
    "!!str 2026-11-29T12:00:00Z",
    "!!float 2026",
    "!!int now",
    "&a 2026-11-29T12:00:00Z",
    "*undefined",
    '"2026-11-29T12:00:00Z"',
    "'2026-02-30T00:00:00Z'",
    "'\uff12\uff10\uff12\uff16-11-29T12:00:00Z'",
    "'2026-11-29T12:00:00+24:00'",
    '"\\ud800"',
    "'" + "9" * 5000 + "'",
    "9" * 5000,
    "2026-11-29T12:00:00Z " + "x" * 3000,
)
NOW_SHAPES = (
    "now: {value}\n",
    "now: {value}\n",
    "now: {value}\n",
    "# The instant this snapshot shows.\nnow: {value}\n",
    "now: {value}\nnow: 2026-11-29T12:00:00Z\n",
    "now: 2026-11-29T12:00:00Z\nnow: {value}\n",
    "- now: {value}\n",
    "then: {value}\n",
    "now:\n  nested: {value}\n",
    "now: {value}\n---\nnow: {value}\n",
    "now: {value}\n...\ngarbage: [\n",
    "{{now: {value}}}\n",
    "now: {value} # a comment\n",
    "\ufeffnow: {value}\n",
    "now: {value}\nextra: {value}\n",
    "{value}\n",
    "",
    "# only a comment\n",
    "---\n",
    "now:\n",
    "now: &t {value}\nagain: *t\n",
)


@st.composite
def mutate_snapshot_yaml(draw: st.DrawFn, case: Case) -> Case:
    """`snapshot.yaml`: wrong types, invalid or far dates, no timezone, odd document shapes."""
    name = f"{SNAPSHOT_DIR}/snapshot.yaml"
    value = draw(st.sampled_from(NOW_VALUES) | st.text(max_size=30).map(json.dumps), label="now")
    shape = draw(st.sampled_from(NOW_SHAPES), label="shape")
    text = shape.format(value=value)
    note = f"snapshot.yaml {text[:70]!r}"
    return case.with_file(name, text.encode("utf-8", "surrogatepass"), note)


BILLION_LAUGHS = 'lol: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"l{i}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)
POLICY_TEXT_OPS = (
    "edit-line",
    "edit-line",
    "edit-line",
    "duplicate-key",
    "duplicate-key",
    "alias",
    "bomb",
    "deep",
    "recursive-alias",
    "whole-file",
    "tabs",
    "merge-key",
    "insert-line",
)
WHOLE_POLICIES = (
    "",
    "# just a comment\n",
    "[]\n",
    "null\n",
    "- a\n",
    "42\n",
    "---\n---\n",
    "dry_run: true\n---\ndry_run: false\n",
    "strategies:\n",
    "strategies: [{name: idle-gpu, enabled: maybe}]\n",
    "strategies: [{name: idle-gpu}, {name: idle-gpu}]\n",
    "strategies: [{name: gpu-consolidation, args: {window: 99999999999w, min_node_age: 99999999999w}}]\n",
    (
        "strategies: [{name: idle-gpu, args: {window: 99999999999w, min_pod_age: 99999999999w, "
        "max_telemetry_age: 99999999999w}}]\n"
    ),
    "guards: {min_pod_age: 99999999999w, cooldown: 99999999999w, disruption_window: 99999999999w}\n",
    "interval: 99999999999w\n",
    "telemetry: {max_age: 99999999999w}\n",
    "eviction: {drain_timeout: 99999999999w, checkpoint_timeout: 99999999999w}\n",
    "telemetry: null\n",
    "telemetry: {utilization: {name: DCGM_FI_DEV_FB_USED}, fb_used: {name: DCGM_FI_DEV_GPU_UTIL}}\n",
    "telemetry: {utilization: {name: DCGM_FI_DEV_GPU_UTIL, scale: 1e-300}}\n",
    "telemetry: {utilization: {name: DCGM_FI_DEV_GPU_UTIL, scale: 1e300}}\n",
    "telemetry: {labels: {node: [], pod: [], uuid: []}}\n",
    "gpu_sharing: {resources: {nvidia.com/gpu: {milli_per_unit: 1}}}\n",
    "gpu_sharing: {resources: {cpu: {milli_per_unit: 1000}, memory: {milli_per_unit: 1}}}\n",
    "gangs: {keys: [app.kubernetes.io/name, '', pod-template-hash]}\n",
    "limits: {max_per_node: 99999999999999999999, max_per_cycle: 1}\n",
    "guards: {priority_threshold: -99999999999999999999}\n",
    "prices: {per_gpu_hour: {NVIDIA-L4: 1e308}, default_per_gpu_hour: 1e308}\n",
    "guards: {namespaces: {include: [a], exclude: [a]}}\n",
    "guards: {label_selector: {match_expressions: [{key: a, operator: In}]}}\n",
    "strategies: [{name: topology-spread, args: {max_evictions_per_constraint: 99999999999999999999}}]\n",
    (
        "strategies: [{name: gpu-consolidation, args: {max_nodes_per_cycle: 99999999999999999999, "
        "peer_pods_to_make_room: 99999999999999999999, drain_onto_larger_nodes: true}}]\n"
    ),
    (
        "strategies: [{name: gpu-consolidation, args: {max_allocated_percent: 100, "
        "max_utilization_percent: 100, min_node_age: 0, packed_schedulers: [default-scheduler, "
        "gpu-packed-scheduler, scheduler-plugins-scheduler], move_to_smaller_nodes: true, "
        "drain_onto_larger_nodes: true, peer_pods_to_make_room: 5}}]\n"
    ),
    (
        "strategies: [{name: idle-gpu, args: {namespaces: [notebooks, inference, research, training, "
        "ml-platform], min_pod_age: 0, max_utilization_percent: 100, min_samples: 1}}]\n"
    ),
    (
        "strategies: [{name: topology-spread, args: {include_soft: true, compact_gangs: true, "
        "min_pod_age: 0}}]\n"
    ),
    "strategies: [{name: gpu-affinity, args: {preferred: true, min_pod_age: 0}}]\n",
    "\t- tab\n",
    "a: &a [*a]\n",
    "\ufeffdry_run: true\n",
    "%YAML 1.1\n---\ndry_run: true\n",
    "%YAML 9.9\n---\ndry_run: true\n",
    "!!python/object/apply:os.system ['true']\n",
    "dry_run: !!binary AAAA\n",
    "? [a, b]\n: c\n",
    "{[a]: 1}\n",
    "dry_run: true\n" * 3,
)


@st.composite
def mutate_policy(draw: st.DrawFn, case: Case) -> Case:
    """Policies: structure-aware edits of the shipped ones, and text-level YAML tricks."""
    seed_name = draw(st.sampled_from(sorted(POLICY_TEXTS)))
    text = POLICY_TEXTS[seed_name].decode("utf-8")
    notes = [f"from {seed_name}"]
    if draw(st.booleans()):
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            doc = {}
        raw = _Raw()
        extra: list[Json] = [*POLICY_VALUES, *DURATIONS]
        for _ in range(draw(st.integers(1, 3))):
            doc, note = draw(edit_document(doc, raw, extra=extra))
            notes.append(note)
        data = dump_yaml([doc], raw, flow=draw(st.sampled_from((None, False, True))))
    else:
        lines = text.split("\n")
        for _ in range(draw(st.integers(1, 2))):
            op = draw(st.sampled_from(POLICY_TEXT_OPS), label="policy-op")
            lines, note = _policy_text_op(draw, op, lines)
            notes.append(note)
        data = "\n".join(lines).encode("utf-8", "surrogatepass")
    case = case.with_file(POLICY_FILE, data, ", ".join(notes))
    if draw(st.integers(0, 4)) == 0:
        second = draw(st.sampled_from(sorted(POLICY_TEXTS)))
        case = case.with_file("policy-2.yaml", POLICY_TEXTS[second], f"and {second} as policy-2.yaml")
    return case


_KEY_LINE = re.compile(r"^(?P<indent>\s*(?:- )?)(?P<key>[A-Za-z_][\w.-]*):(?P<value>.*)$")


def _policy_text_op(draw: st.DrawFn, op: str, lines: list[str]) -> tuple[list[str], str]:
    keyed = [i for i, line in enumerate(lines) if _KEY_LINE.match(line) and not line.lstrip().startswith("#")]
    if op in ("edit-line", "duplicate-key", "alias", "merge-key", "insert-line") and keyed:
        index = keyed[draw(st.integers(0, len(keyed) - 1))]
        match = _KEY_LINE.match(lines[index])
        assert match is not None
        indent, key, value = match["indent"], match["key"], match["value"]
        if op == "edit-line":
            new = draw(st.sampled_from(YAML_SCALARS + DURATIONS), label="yaml-value")
            lines[index] = f"{indent}{key}: {new}"
            return lines, f"line {index + 1} {key}: {new[:30]}"
        if op == "duplicate-key":
            plain = indent.replace("- ", "  ")
            lines.insert(index + 1, f"{plain}{key}:{value}")
            return lines, f"line {index + 1} {key} given twice"
        if op == "alias":
            lines[index] = f"{indent}{key}: &shared{value}"
            target = keyed[draw(st.integers(0, len(keyed) - 1))]
            tm = _KEY_LINE.match(lines[target])
            assert tm is not None
            if target != index:
                lines[target] = f"{tm['indent']}{tm['key']}: *shared"
            return lines, f"line {index + 1} anchored, line {target + 1} its alias"
        if op == "merge-key":
            lines.insert(index + 1, f"{indent.replace('- ', '  ')}<<: {{{key}: 1}}")
            return lines, f"merge key after line {index + 1}"
        # insert-line
        new_key = draw(
            st.sampled_from(("unknown", "dry_run", "strategies", "args", "name", "enabled", "x" * 300))
        )
        lines.insert(
            index + 1, f"{indent.replace('- ', '  ')}{new_key}: {draw(st.sampled_from(YAML_SCALARS))}"
        )
        return lines, f"{new_key} inserted after line {index + 1}"
    if op == "bomb":
        where = draw(st.sampled_from(("top", "args", "namespaces")))
        if where == "top":
            return [*BILLION_LAUGHS.splitlines(), *lines], "billion laughs (top level)"
        if where == "args":
            bomb = [
                *BILLION_LAUGHS.splitlines(),
                "strategies:",
                "  - name: idle-gpu",
                "    args: {namespaces: *i}",
            ]
            return bomb, "billion laughs in strategy args"
        bomb = [*BILLION_LAUGHS.splitlines(), "guards:", "  namespaces:", "    include: *i"]
        return bomb, "billion laughs in guards.namespaces.include"
    if op == "deep":
        depth = draw(st.sampled_from(DEPTHS))
        where = draw(st.sampled_from(("args", "top")))
        deep = _deep_list(depth) if draw(st.booleans()) else _deep_yaml_map(depth)
        if where == "top":
            return [*lines, f"deep: {deep}"], f"nested {depth} deep (top level)"
        return [
            f"strategies: [{{name: idle-gpu, args: {{namespaces: {deep}}}}}]"
        ], f"strategy args nested {depth} deep"
    if op == "recursive-alias":
        form = draw(
            st.sampled_from(
                (
                    "a: &a [*a]",
                    "strategies: &s [{name: idle-gpu, args: {x: *s}}]",
                    "guards: &g {namespaces: *g}",
                )
            )
        )
        return [form], f"recursive alias {form!r}"
    if op == "tabs":
        return [line.replace("  ", "\t", 1) for line in lines], "tabs for indentation"
    whole = draw(st.sampled_from(WHOLE_POLICIES), label="policy")
    return whole.split("\n"), f"policy {whole[:60]!r}"


def _apply(draw: st.DrawFn, kind: Kind, case: Case) -> Case:
    if kind == "objects-json":
        return draw(mutate_objects_json(case))
    if kind == "objects-yaml":
        return draw(mutate_objects_yaml(case))
    if kind == "bytes":
        return draw(mutate_bytes(case))
    if kind == "files":
        return draw(mutate_files(case))
    if kind == "exposition":
        return draw(mutate_exposition(case))
    if kind == "snapshot-yaml":
        return draw(mutate_snapshot_yaml(case))
    if kind == "policy":
        return draw(mutate_policy(case))
    raise ValueError(f"not a single input kind: {kind}")


POLICY_ARGV: tuple[ArgvKind, ...] = ("validate", "validate", "once", "once-json")
SINGLE_KINDS: tuple[Kind, ...] = tuple(k for k in KINDS if k != "mixed")


@st.composite
def cases(draw: st.DrawFn, kind: Kind) -> Case:
    """A case of `kind`: the base input with mutations of that kind (`mixed`: of two or three kinds)."""
    if kind == "policy":
        argv_kind = draw(st.sampled_from(POLICY_ARGV))
        return draw(mutate_policy(base_case(argv_kind)))
    case = draw(snapshot_base())
    if kind == "mixed":
        kinds = draw(st.lists(st.sampled_from(SINGLE_KINDS), min_size=2, max_size=3))
        for one in kinds:
            case = _apply(draw, one, case)
        if "policy" in kinds:
            case = case.with_argv(draw(st.sampled_from(ARGV_KINDS)))
        return case
    if kind == "bytes" and draw(st.integers(0, 3)) == 0:
        return draw(mutate_bytes(case, POLICY_FILE if POLICY_FILE in case.files else None))
    return _apply(draw, kind, case)
