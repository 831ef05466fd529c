"""The circuit breaker: which workloads keep every eviction stopped.

Owns `Trip` and `open_circuits`, which read the evictions a `DisruptionHistory` (`rebalancer.history`)
watches on a snapshot: when `reschedule_timeout` after a workload's oldest watched eviction pods of it
created since are still unscheduled, that workload trips the circuit: the planner's `circuit-open` guard
refuses every plan until they are placed or an operator resets the circuit (the cycle reports each trip
as a finding, the actuator lifts the drain marks of the nodes its pods were evicted from). Which
evictions stay watched is the history's (`settled`); this module only says what the watched ones mean.
Like the history, it must do no I/O, read no clock and change no history.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from rebalancer.history import DisruptionHistory, Workload, by_workload, replacements, unplaced
from rebalancer.model import Snapshot

__all__ = ["Trip", "open_circuits"]


@dataclass(frozen=True, slots=True)
class Trip:
    """A workload that keeps the circuit open: pods of it created since its eviction are unscheduled."""

    workload: Workload
    evicted_at: datetime
    pending: int
    minutes: int

    @property
    def detail(self) -> str:
        return f"circuit open: {self.workload.ref} still Pending {self.minutes}m after eviction"


def open_circuits(
    snapshot: Snapshot, history: DisruptionHistory, reschedule_timeout: int
) -> tuple[Trip, ...]:
    """The workloads whose pods evicted `reschedule_timeout` or more ago are not placed again."""
    if not history.evictions:
        return ()
    timeout = timedelta(seconds=reschedule_timeout)
    waiting = unplaced(snapshot)
    trips: list[Trip] = []
    for workload, records in sorted(by_workload(history.evictions).items()):
        oldest = min(r.evicted_at for r in records)
        age = snapshot.now - oldest
        if age < timeout:
            continue
        pending = replacements(waiting.get(workload, ()), oldest)
        if pending:
            trips.append(Trip(workload, oldest, len(pending), int(age.total_seconds() // 60)))
    return tuple(trips)
