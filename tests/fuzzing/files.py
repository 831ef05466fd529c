"""Byte-level damage to one file of a case, and whole-file changes.

Owns `mutate_bytes` (truncation, invalid UTF-8, NULs, BOMs, UTF-16 and latin-1, bit flips, deleted or
repeated chunks, line ends, random bytes, splices) and `mutate_files` (gzip-compressed copies,
subdirectories, deletions, copies, renames, hidden files, directories where files were, no or an empty
snapshot directory, the policy inside it, odd names, a single file kept). This module must not parse a
file: what is inside it is for the structure-aware strategies.
"""

from __future__ import annotations

import gzip

from hypothesis import strategies as st

from tests.fuzzing.case import Case
from tests.fuzzing.layout import DEMO_POLICY, POLICY_FILE, SNAPSHOT_DIR

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
