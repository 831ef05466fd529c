"""RFC 3339 timestamps, as Kubernetes writes and reads them (Go's `time.RFC3339`).

Owns the one parser of timestamps the rebalancer reads (object metadata, `snapshot.yaml`, `--now`,
its own annotations and state) and the one formatter of those it writes. Parsing is strict where
Python's `datetime.fromisoformat` is lax: a full date and time with `T`, seconds, optional fraction
and a zone (`Z` or `+hh:mm`), nothing else (no week dates, no basic format, no missing zone). It must
stay pure: no clock.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Literal

from rebalancer.wording import quoted

__all__ = ["EXAMPLE", "format_utc", "parse"]

EXAMPLE = "2026-11-29T12:00:00Z"

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:(Z)|([+-])(\d{2}):(\d{2}))"
)

_DATE_ONLY = re.compile(r"\d{4}-\d{2}-\d{2}")
_NO_ZONE = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?")

Precision = Literal["seconds", "milliseconds", "microseconds"]


def parse(text: str) -> datetime:
    """A timezone-aware datetime for an RFC 3339 timestamp; ValueError saying what is wrong otherwise.

    Fractions finer than a microsecond are truncated (Python's resolution).
    """
    match = _RFC3339.fullmatch(text)
    if match is None:
        if _DATE_ONLY.fullmatch(text):
            raise ValueError(f"{quoted(text)} is a date; give a time with a timezone ({EXAMPLE})")
        if _NO_ZONE.fullmatch(text):
            raise ValueError(f"{quoted(text)} has no timezone (add Z or an offset such as +01:00)")
        raise ValueError(f"invalid timestamp {quoted(text)} (expected RFC 3339, e.g. {EXAMPLE})")
    if match.group(8):
        # In UTC, within the grammar: the standard library's C parser reads it to the same instant
        # (fractions truncated to microseconds too), several times faster; an impossible date or time
        # is left to `_from_fields`, which names it.
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            pass
    return _from_fields(text, match)


def _from_fields(text: str, match: re.Match[str]) -> datetime:
    """The datetime of a timestamp within the grammar, from its fields; ValueError naming what is wrong."""
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    if zulu:
        zone = UTC
    else:
        offset = timedelta(hours=int(off_h), minutes=int(off_m))
        if offset >= timedelta(hours=24):
            raise ValueError(f"invalid timestamp {quoted(text)}: timezone offset out of range")
        zone = timezone(-offset if sign == "-" else offset)
    try:
        moment = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int((fraction or "0").ljust(6, "0")[:6]),
            tzinfo=zone,
        )
        moment.astimezone(UTC)  # the first and last days of the calendar overflow with some offsets
    except ValueError as exc:
        raise ValueError(f"invalid timestamp {quoted(text)}: {exc}") from None
    except OverflowError:
        raise ValueError(f"invalid timestamp {quoted(text)}: out of the range of dates") from None
    return moment


def format_utc(moment: datetime, precision: Precision = "seconds") -> str:
    """`2026-11-29T12:00:00Z` (or with `.123` / `.123456`), in UTC."""
    utc = moment.astimezone(UTC)
    if precision == "seconds":
        return utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    return utc.isoformat(timespec=precision).replace("+00:00", "Z")


def parse_or_none(text: str | None) -> datetime | None:
    """`parse(text)`, or None when `text` is empty or not an RFC 3339 time (an annotation someone wrote)."""
    try:
        return parse(text.strip()) if text else None
    except ValueError:
        return None
