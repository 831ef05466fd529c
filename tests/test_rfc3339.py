"""RFC 3339 timestamps: the fast path for UTC gives what the field-by-field reading gives."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer import rfc3339


@settings(max_examples=500, derandomize=True, database=None)
@given(
    moment=st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
    digits=st.integers(min_value=0, max_value=9),
    extra=st.text(alphabet="0123456789", min_size=9, max_size=9),
)
def test_utc_timestamps_read_as_their_fields_say(moment: datetime, digits: int, extra: str) -> None:
    fraction = (f"{moment.microsecond:06d}" + extra)[:digits]
    stamp = f"{moment.year:04d}-{moment:%m-%dT%H:%M:%S}"
    text = stamp + (f".{fraction}" if digits else "") + "Z"
    match = rfc3339._RFC3339.fullmatch(text)
    assert match is not None
    parsed = rfc3339.parse(text)
    expected = rfc3339._from_fields(text, match)
    assert (parsed, parsed.tzinfo, parsed.microsecond) == (expected, UTC, expected.microsecond)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2026-02-30T00:00:00Z", "invalid timestamp '2026-02-30T00:00:00Z': day is out of range for month"),
        ("2026-11-29T24:00:00Z", "invalid timestamp '2026-11-29T24:00:00Z': hour must be in 0..23"),
        (
            "2026-11-29T12:00:00+24:00",
            "invalid timestamp '2026-11-29T12:00:00+24:00': timezone offset out of range",
        ),
        ("2026-11-29T12:00:00", "'2026-11-29T12:00:00' has no timezone (add Z or an offset such as +01:00)"),
    ],
)
def test_an_impossible_timestamp_is_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        rfc3339.parse(text)
    assert str(info.value) == message
