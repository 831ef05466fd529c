"""Policy hot reload: the mounted policy file, re-read by content hash every cycle.

A ConfigMap update is an atomic symlink swap, so the content hash is what tells a change. A valid change
is adopted (and says whether `interval` changed, so the loop reschedules); an invalid one keeps the
running policy and reports its problems once, until the file changes again. It must not act on a
policy: the loop does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rebalancer.policy import LoadedPolicy, PolicyError, loads_policy

__all__ = ["PolicyWatcher", "ReloadResult", "ReloadStatus"]

ReloadStatus = Literal["unchanged", "reloaded", "invalid", "still-invalid", "unreadable"]


@dataclass(frozen=True)
class ReloadResult:
    status: ReloadStatus
    problems: tuple[str, ...] = ()
    previous_interval: int | None = None

    @property
    def interval_changed(self) -> bool:
        return self.previous_interval is not None


class PolicyWatcher:
    """The running policy and the file it came from; `check()` re-reads the file by content hash.

    Raises PolicyError at construction when the file is not a valid policy (the daemon does not start).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        raw = self._read()
        self._loaded = self._parse(raw)
        self._digest = hashlib.sha256(raw).hexdigest()
        self._bad_digest: str | None = None

    @property
    def current(self) -> LoadedPolicy:
        return self._loaded

    @property
    def valid(self) -> bool:
        """False while the file holds a change that failed validation."""
        return self._bad_digest is None

    def _read(self) -> bytes:
        try:
            return self.path.read_bytes()
        except OSError as exc:
            raise PolicyError([f"{self.path}: cannot read policy: {exc.strerror or exc}"]) from None

    def _parse(self, raw: bytes) -> LoadedPolicy:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise PolicyError([f"{self.path}:{line}: not UTF-8 text ({exc.reason})"]) from None
        return loads_policy(text, str(self.path))

    def check(self) -> ReloadResult:
        """Compare the file with the running policy; adopt it when it changed and is valid."""
        try:
            raw = self._read()
        except PolicyError as exc:
            return ReloadResult("unreadable", exc.problems)
        digest = hashlib.sha256(raw).hexdigest()
        if digest == self._digest:
            self._bad_digest = None  # changed back to the running policy
            return ReloadResult("unchanged")
        if digest == self._bad_digest:
            return ReloadResult("still-invalid")
        try:
            loaded = self._parse(raw)
        except PolicyError as exc:
            self._bad_digest = digest
            return ReloadResult("invalid", exc.problems)
        previous = self._loaded.policy.interval
        self._loaded, self._digest, self._bad_digest = loaded, digest, None
        changed = previous if loaded.policy.interval != previous else None
        return ReloadResult("reloaded", previous_interval=changed)
