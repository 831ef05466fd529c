"""Write fences: whether this process may still write to the cluster, and for how long.

A fence is asked before every write (an eviction POST, a drain mark, a checkpoint request, a state
save) and answers with the seconds the write may take, or raises `FenceLost` saying why none may start.
The writer then clips its request timeout to that answer, so no request of an ex-leader can still be
in flight when another replica may lead.

- `UNFENCED`: always open (one-shot commands, tests, a daemon without leader election);
- `WriteFence`: open while every limit it is given holds: the leader lease (seconds left of it, from
  the elector: what a write may take), and an optional deadline on the monotonic clock (the cycle's,
  the shutdown's) before which a write must *start*. A write started before the deadline keeps its
  own request timeout: cutting it short would leave an eviction that the API server carries out
  unrecorded, since its answer never arrives. So the time past a deadline is at most one request,
  but for the writes that ask only the lease (`lease_only`): lifting this replica's own marks, and the
  record that must follow a reclaim's scale to 0.

It owns no clock reading but the injected monotonic one and no I/O; it decides nothing about what is
written.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = [
    "MIN_WRITE_SECONDS",
    "UNFENCED",
    "Fence",
    "FenceLost",
    "RequestTimeout",
    "WriteFence",
    "clip_timeout",
]

# A write needs at least this long to be worth starting: a request clipped to less would time out.
MIN_WRITE_SECONDS = 0.2

# What every Kubernetes request of the project takes as `_request_timeout`: seconds in total, or
# (connect, read).
RequestTimeout = float | tuple[float, float]


class FenceLost(Exception):
    """No write may start: `reason` says why (the lease, a deadline), for outcomes and logs."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Fence(Protocol):
    def check(self) -> float:
        """Seconds the next write may take (`math.inf`: unbounded); raises FenceLost when none may start."""
        ...


class _Unfenced:
    def check(self) -> float:
        return math.inf


UNFENCED: Fence = _Unfenced()


class WriteFence:
    """Open while the lease has time left (`lease_left()`, seconds; None: no leader election) and the
    deadline set by `set_deadline` has not passed."""

    def __init__(
        self,
        lease_left: Callable[[], float] | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lease_left = lease_left
        self._mono = monotonic
        self._lock = threading.Lock()
        self._deadline: tuple[float, str] | None = None

    def set_deadline(self, at: float | None, why: str = "") -> None:
        """Close the fence at monotonic time `at` (None: no deadline), giving `why` as the reason."""
        with self._lock:
            self._deadline = None if at is None else (at, why)

    def tighten_deadline(self, at: float, why: str) -> None:
        """Like `set_deadline`, unless an earlier deadline is already set."""
        with self._lock:
            if self._deadline is None or at < self._deadline[0]:
                self._deadline = (at, why)

    def lease_only(self) -> Fence:
        """This fence without its deadlines: for writes that undo this replica's own marks or complete
        a change it already made (the record of a reclaim's scale), which must not outlive its
        leadership but must not be left half-done by a deadline either."""
        return WriteFence(self._lease_left, monotonic=self._mono)

    def check(self) -> float:
        left = math.inf
        if self._lease_left is not None:
            lease = self._lease_left()
            if lease < MIN_WRITE_SECONDS:
                raise FenceLost("this replica no longer holds the leader lease with time to spare")
            left = lease
        with self._lock:
            deadline = self._deadline
        if deadline is not None and deadline[0] - self._mono() < MIN_WRITE_SECONDS:
            raise FenceLost(deadline[1])
        return left


def clip_timeout(timeout: RequestTimeout, left: float) -> RequestTimeout:
    """`timeout` for a request that must be over within `left` seconds: unchanged when `left` is
    unbounded, else one total timeout (urllib3's `total`, which the client uses for a number) of at most
    `left`, so neither a slow connect nor a slow answer outlives the fence."""
    if math.isinf(left):
        return timeout
    whole = sum(timeout) if isinstance(timeout, tuple) else timeout
    return min(whole, left)
