"""Durations as people write them: `30s`, `5m`, `1h30m`, `7d`, or a bare number of seconds.

Owns reading (`parse_duration`) and writing (`format_duration`) them, for the policy's fields and every
command's flags. Standard library only, so a command line can read its flags without loading the policy
models. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import re

from rebalancer.wording import quoted

__all__ = ["MAX_DURATION_SECONDS", "format_duration", "parse_duration"]

# Past this no setting means anything, and datetime arithmetic overflows a little further on.
MAX_DURATION_SECONDS = 3650 * 86400
# ASCII digits only (re.ASCII), as Go's time.ParseDuration and Prometheus read them: `\d` alone also
# takes other scripts' digits ("\uff11h", a full-width one), which float() reads as an hour.
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", re.ASCII)
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: object) -> int:
    """Seconds from `90`, `"90s"`, `"5m"`, `"1h30m"`, `"1d"` (Prometheus / Go style). Rejects the rest."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 30s, 5m or 1h, got {quoted(value)}")
    if isinstance(value, int) and value > MAX_DURATION_SECONDS:
        seconds = math.inf  # float() of a huge integer overflows
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError("empty duration")
        if text.startswith("-"):
            raise ValueError(f"duration must be non-negative, got {quoted(value)}")
        pos = 0
        seconds = 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if pos != len(text):
            raise ValueError(
                f"invalid duration {quoted(value)}: use a number with a unit, e.g. 30s, 5m, 1h30m"
            )
    else:
        raise ValueError(f"expected a duration such as 30s, 5m or 1h, got {type(value).__name__}")
    if seconds > MAX_DURATION_SECONDS:  # infinity included
        raise ValueError(
            f"duration {quoted(value)} is longer than {format_duration(MAX_DURATION_SECONDS)} (ten years)"
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"duration must be a finite, non-negative time, got {quoted(value)}")
    return round(seconds)


def format_duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
