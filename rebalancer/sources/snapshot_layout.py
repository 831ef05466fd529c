"""Which files of a snapshot directory are read, as what, and how they are opened.

Owns the directory walk of DESIGN §4: every file under the directory, subdirectories included (so the
layout of `kubectl cluster-info dump --all-namespaces --output-directory=DIR` is a snapshot), hidden
files and directories skipped, symbolic links to directories not followed. A file is known by its name
without a trailing `.gz` (read through gzip): `.json` / `.yaml` / `.yml` hold objects, `.prom` / `.om`
expositions, the top-level `snapshot.yaml` the instant and the top-level `telemetry-windows.json` the
telemetry aggregates (rebalancer.sources.telemetry_aggregates). Everything else is listed as not read.

Opening a file turns every way it cannot be read (missing, a broken gzip stream, text that is not UTF-8,
more than `MAX_TEXT_BYTES` once decompressed) into one message naming it. It must not parse anything.
"""

from __future__ import annotations

import gzip
import io
import mmap
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

__all__ = [
    "GZIP_SUFFIX",
    "MAX_TEXT_BYTES",
    "SnapshotFile",
    "UnreadableFile",
    "read_problem",
    "walk",
]

GZIP_SUFFIX = ".gz"
# Whole-file reads stop here: a gzip bomb must not take the machine's memory.
MAX_TEXT_BYTES = 4 * 1024**3
_CHUNK = 16 * 1024 * 1024


class UnreadableFile(Exception):
    """A file that cannot be read; the message names it and says why."""


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    """One file of a snapshot directory."""

    path: Path
    relative: str  # to the snapshot directory, with `/`
    inner_name: str  # the file name without `.gz`
    gzipped: bool

    @property
    def suffix(self) -> str:
        """The lower-case suffix of the inner name (`.json` for `pods.json.gz`)."""
        return Path(self.inner_name).suffix.lower()

    @property
    def size_hint(self) -> int:
        """Bytes of text the file holds, roughly (compressed kubectl JSON is about a tenth)."""
        size = self.path.stat().st_size
        return size * 10 if self.gzipped else size

    def open_bytes(self) -> IO[bytes]:
        if self.gzipped:
            return cast("IO[bytes]", gzip.open(self.path, "rb"))
        return self.path.open("rb")

    def open_text(self) -> IO[str]:
        return io.TextIOWrapper(self.open_bytes(), encoding="utf-8")

    def read_text(self) -> str:
        """The whole text; UnreadableFile when it cannot be read, decompressed or decoded."""
        data = self._read_bytes()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UnreadableFile(read_problem(self.path, exc)) from None

    @contextmanager
    def mapped(self) -> Iterator[bytes | mmap.mmap]:
        """The file's bytes without copying them when it is not gzipped (a memory map: pages of a file of
        hundreds of MB stay the page cache's); UnreadableFile when it cannot be read or decompressed."""
        if self.gzipped:
            yield self._read_bytes()
            return
        try:
            with self.path.open("rb") as handle:
                if os.fstat(handle.fileno()).st_size == 0:
                    yield b""
                    return
                with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    yield mapped
        except OSError as exc:
            raise UnreadableFile(read_problem(self.path, exc)) from None

    def _read_bytes(self) -> bytes:
        try:
            with self.open_bytes() as handle:
                chunks: list[bytes] = []
                size = 0
                while chunk := handle.read(_CHUNK):
                    size += len(chunk)
                    if size > MAX_TEXT_BYTES:
                        limit = MAX_TEXT_BYTES // 1024**3
                        raise UnreadableFile(f"{self.path}: more than {limit} GiB of text (decompressed)")
                    chunks.append(chunk)
            return b"".join(chunks)
        except (OSError, EOFError, zlib.error) as exc:
            raise UnreadableFile(read_problem(self.path, exc)) from None


def read_problem(path: Path, exc: BaseException) -> str:
    """One line for an error met while reading `path` (directly or through gzip)."""
    if isinstance(exc, gzip.BadGzipFile):
        return f"{path}: not a gzip file"
    if isinstance(exc, EOFError):
        return f"{path}: truncated gzip file"
    if isinstance(exc, zlib.error):
        return f"{path}: corrupt gzip data ({exc})"
    if isinstance(exc, UnicodeDecodeError):
        return f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
    if isinstance(exc, OSError):
        return f"{path}: cannot read: {exc.strerror or exc}"
    return f"{path}: cannot read: {exc}"


def walk(root: Path, problems: list[str]) -> Iterator[SnapshotFile]:
    """Every file under `root` in a stable order (sorted, a directory's files before its subdirectories),
    hidden ones skipped; a subdirectory that cannot be listed, or a name that is no regular file (a
    broken link, a pipe), is a problem. Raises OSError when `root`
    itself cannot be listed."""
    errors: list[OSError] = []
    for directory, subdirectories, names in os.walk(root, onerror=errors.append):
        _report(root, errors, problems)
        subdirectories[:] = sorted(d for d in subdirectories if not d.startswith("."))
        here = Path(directory)
        for name in sorted(names):
            if name.startswith("."):
                continue
            path = here / name
            if not path.is_file():
                problems.append(
                    f"{path}: not a regular file (a broken link, a pipe or a device): cannot be read"
                )
                continue
            gzipped = name.lower().endswith(GZIP_SUFFIX)
            inner = name[: -len(GZIP_SUFFIX)] if gzipped else name
            yield SnapshotFile(path, path.relative_to(root).as_posix(), inner, gzipped)
    _report(root, errors, problems)


def _report(root: Path, errors: list[OSError], problems: list[str]) -> None:
    for error in errors:
        where = Path(error.filename) if error.filename else root
        if where == root:
            raise error
        problems.append(f"{where}: cannot read directory: {error.strerror or error}")
    errors.clear()
