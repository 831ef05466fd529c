"""`snapshot.yaml`, the file that says which instant a snapshot shows: `now` with wrong types, invalid
or far dates, no timezone, YAML tags and anchors, and odd document shapes (keys given twice, nested,
several documents, no `now` at all).

Owns `mutate_snapshot_yaml` and its pools. This module must not change any other file of a case.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from tests.fuzzing.case import Case
from tests.fuzzing.layout import SNAPSHOT_DIR

NOW_VALUES = (
    "2026-02-30T00:00:00Z",
    "2026-11-29T12:00:00",
    "2026-11-29 12:00:00",
    "2026-11-29 12:00:00 +01:00",
    "99999-01-01T00:00:00Z",
    "9999-12-31T23:59:59-10:00",
    "9999-12-31T23:59:59Z",
    "9999-12-31T23:59:59.999999+00:00",
    "0001-01-01T00:00:00+10:00",
    "0001-01-01T00:00:00Z",
    "1970-01-01T00:00:00Z",
    "1969-12-31T23:59:59Z",
    "2030-01-01T00:00:00Z",
    "2026-11-29T12:10:00Z",
    "2026-11-29",
    "2026-13-01T00:00:00Z",
    "2026-11-29T24:00:00Z",
    "2026-11-29T12:00:60Z",
    "2026-11-29T12:00:00+99:00",
    "2026-11-29t12:00:00z",
    "2026-11-29T12:00:00.1234567890123Z",
    "1e400",
    "12",
    "-1",
    "1795953600",
    "true",
    "null",
    "~",
    "[]",
    "{}",
    "[2026-11-29T12:00:00Z]",
    "{at: 2026-11-29T12:00:00Z}",
    "!!timestamp 2026-02-30",
    "!!timestamp 2026-11-29",
    "!!binary AAAA",
    "!!str 2026-11-29T12:00:00Z",
    "!!float 2026",
    "!!int now",
    "&a 2026-11-29T12:00:00Z",
    "*undefined",
    '"2026-11-29T12:00:00Z"',
    "'2026-02-30T00:00:00Z'",
    "'\uff12\uff10\uff12\uff16-11-29T12:00:00Z'",
    "'2026-11-29T12:00:00+24:00'",
    '"\\ud800"',
    "'" + "9" * 5000 + "'",
    "9" * 5000,
    "2026-11-29T12:00:00Z " + "x" * 3000,
)
NOW_SHAPES = (
    "now: {value}\n",
    "now: {value}\n",
    "now: {value}\n",
    "# The instant this snapshot shows.\nnow: {value}\n",
    "now: {value}\nnow: 2026-11-29T12:00:00Z\n",
    "now: 2026-11-29T12:00:00Z\nnow: {value}\n",
    "- now: {value}\n",
    "then: {value}\n",
    "now:\n  nested: {value}\n",
    "now: {value}\n---\nnow: {value}\n",
    "now: {value}\n...\ngarbage: [\n",
    "{{now: {value}}}\n",
    "now: {value} # a comment\n",
    "\ufeffnow: {value}\n",
    "now: {value}\nextra: {value}\n",
    "{value}\n",
    "",
    "# only a comment\n",
    "---\n",
    "now:\n",
    "now: &t {value}\nagain: *t\n",
)


@st.composite
def mutate_snapshot_yaml(draw: st.DrawFn, case: Case) -> Case:
    """`snapshot.yaml`: wrong types, invalid or far dates, no timezone, odd document shapes."""
    name = f"{SNAPSHOT_DIR}/snapshot.yaml"
    value = draw(st.sampled_from(NOW_VALUES) | st.text(max_size=30).map(json.dumps), label="now")
    shape = draw(st.sampled_from(NOW_SHAPES), label="shape")
    text = shape.format(value=value)
    note = f"snapshot.yaml {text[:70]!r}"
    return case.with_file(name, text.encode("utf-8", "surrogatepass"), note)
