"""The wall clock: the one place the project reads it.

A cycle reads it once (its `now`, from which everything downstream takes the time), the Lease its
timestamps, a webhook delivery its signature's timestamp, `rebalancer snapshot` its default instant.
Durations, readiness and leadership use the monotonic clock, passed around as a callable so tests can
drive it. It must not do anything else.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["utcnow"]


def utcnow() -> datetime:
    """The wall clock, in UTC."""
    return datetime.now(UTC)
