"""A period of history in whole steps, as Prometheus steps a subquery: what `waste` and `advise` read.

Owns `Period` (`since` seconds ending at a multiple of the step, cut into steps `(t - step, t]` aligned
to the epoch), `period()` and `check_steps()`. Pure: no I/O, no clock (callers give the end).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rebalancer.policy import format_duration
from rebalancer.telemetry.windows import datetime_from_ms, epoch_ms

__all__ = ["Period", "check_steps", "period"]


@dataclass(frozen=True, slots=True)
class Period:
    """`[end - seconds, end]` in steps of `step` seconds; `end` is a multiple of the step."""

    end_ms: int
    seconds: int
    step: int

    @property
    def start_ms(self) -> int:
        return self.end_ms - self.seconds * 1000

    @property
    def start(self) -> datetime:
        return datetime_from_ms(self.start_ms)

    @property
    def end(self) -> datetime:
        return datetime_from_ms(self.end_ms)

    @property
    def steps(self) -> int:
        return self.seconds // self.step

    def step_of(self, ms: int) -> int | None:
        """The end (ms) of the step `(t - step, t]` holding the instant `ms`, or None outside the period."""
        if not self.start_ms < ms <= self.end_ms:
            return None
        step_ms = self.step * 1000
        return -(-ms // step_ms) * step_ms


def check_steps(since: int, step: int) -> None:
    """ValueError unless a period of `since` seconds is a whole number of `step`-second steps."""
    if step <= 0:
        raise ValueError("the step must be at least 1s")
    if since < step:
        raise ValueError(
            f"the period ({format_duration(since)}) is shorter than one step ({format_duration(step)})"
        )
    if since % step:
        raise ValueError(
            f"the period ({format_duration(since)}) is not a whole number of steps ({format_duration(step)})"
        )


def period(until: datetime, since: int, step: int) -> Period:
    """The `since` seconds before `until` (rounded down to a multiple of `step`). ValueError if they do
    not make whole steps (`check_steps`)."""
    check_steps(since, step)
    step_ms = step * 1000
    return Period(end_ms=epoch_ms(until) // step_ms * step_ms, seconds=since, step=step)
