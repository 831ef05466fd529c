"""Whole expositions for the differential test of the exposition reader (tests/test_exposition_reader.py,
bench/fuzz_reader.py): `exposition_texts` draws one from scratch, tame or wild, and
`mutated_expositions` one of the base snapshot's after `mutate_exposition`, each with whether it is
meant as OpenMetrics.

Owns the pools of what both parsers accept and of what one of them refuses or reads its own way. This
module must not make cases nor run the command line: it yields texts, which the reader and
prometheus_client read and the tests compare.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from tests.fuzzing.case import base_case
from tests.fuzzing.expositions import mutate_exposition

# ---- whole expositions, for the differential test of the exposition reader (tests/test_exposition_reader.py)
# Each pool in two parts: what both parsers accept (however tricky), and what one of them refuses or reads
# in its own way. A drawn exposition is tame (only the first parts: mostly read by the fast reading, so
# its tricky-but-valid content is compared) or wild (both parts, then lines changed).

# Label values as written between the quotes: the escapes the formats define and some they do not, and
# characters that end a label set, a sample or a line elsewhere.
LABEL_VALUES_WRITTEN = (
    "",
    "0",
    "GPU-35f046dd-269a-9346-2194-6a98ff4a4f2b",
    "NVIDIA H100 80GB HBM3",
    "a b",
    "}",
    "{",
    ",",
    "=",
    '\\"',
    "\\\\",
    "\\n",
    "\\x",
    '\\\\\\"',
    "#",
    " # ",
    "} 1 2",
    "\t",
    "ü",
    "\u2028",
    "\r",
)
ODD_LABEL_VALUES_WRITTEN = ('"', "a\\", '",b="')
EXPOSITION_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "a", "a_total", "_total", "a:b", "_")
ODD_EXPOSITION_METRICS = ("a_created", "a_bucket", "1a", "ä")
EXPOSITION_LABELS = ("gpu", "UUID", "Hostname", "pod", "le", "quantile", "_", "a1")
ODD_EXPOSITION_LABELS = ("__name__", "__x", "a:b", "1a")
EXPOSITION_VALUES = (
    "1",
    "0",
    "-0",
    "+1",
    "1.5",
    "-0.0",
    "42.0",
    "1e3",
    "1E-3",
    ".5",
    "5.",
    "NaN",
    "+Inf",
    "-Inf",
    "Inf",
    "1e400",
    "123456789012345678901234567890",
)
ODD_EXPOSITION_VALUES = ("nan", "inf", "1_0", "0x10", "9" * 400, "\u0661", "", " 1")
EXPOSITION_TYPES = ("gauge", "gauge", "counter", "untyped", "unknown")
ODD_EXPOSITION_TYPES = ("histogram", "summary", "info", "stateset", "bogus", "")
LINE_NOISE = ('"', "\\", "{", "}", ",", "=", " ", "\t", "#", "\n", "\r", "x", "1", ".")


def _timestamp_text(draw: st.DrawFn, seconds: int, openmetrics: bool, wild: bool) -> str:
    """A timestamp for `seconds` in the format's unit, with a fraction or not; when wild, sometimes in the
    other unit or malformed."""
    kinds = (
        ("unit", "unit", "unit")
        + (("fraction",) if openmetrics or wild else ())
        + (("other-unit", "odd") if wild else ())
    )
    kind = draw(st.sampled_from(kinds))
    if kind == "unit":
        return str(seconds) if openmetrics else str(seconds * 1000)
    if kind == "fraction":
        digits = draw(st.sampled_from(("5", "123", "123456789", "1234567891234", "000")))
        return f"{seconds}.{digits}" if openmetrics else f"{seconds * 1000}.{digits}"
    if kind == "other-unit":
        return str(seconds * 1000) if openmetrics else str(seconds)
    return draw(
        st.sampled_from(("-1", "1e9", "NaN", "+Inf", f"{seconds}.", f".{seconds}", "9" * 25, "0", "1_0"))
    )


def _label_text(draw: st.DrawFn, pairs: Sequence[tuple[str, str]], wild: bool) -> str:
    """A label set as written: the pairs in some order; when wild, sometimes spaced or with a stray comma."""
    order = draw(st.permutations(list(pairs))) if len(pairs) > 1 else list(pairs)
    text = ",".join(f'{name}="{value}"' for name, value in order)
    style = (
        draw(st.sampled_from(("plain", "plain", "spaced", "trailing-comma", "leading-comma"))) if wild else ""
    )
    if style == "spaced":
        text = ", ".join(f'{name} = "{value}"' for name, value in order)
    elif style == "trailing-comma":
        text += ","
    elif style == "leading-comma":
        text = "," + text
    return "{" + text + "}" if text or draw(st.booleans()) else ""


@st.composite
def exposition_texts(draw: st.DrawFn) -> tuple[str, bool]:
    """An exposition from scratch and whether it is meant as OpenMetrics: families with or without
    metadata, series whose label sets are spelled in different orders, tricky label values and numbers,
    timestamps mostly in order; when wild, also what one of the parsers refuses or reads its own way,
    `# EOF` missing, and a few characters or lines changed."""
    openmetrics = draw(st.booleans())
    wild = draw(st.sampled_from((False, False, True)), label="wild")

    def pick(plain: Sequence[str], odd: Sequence[str]) -> str:
        return draw(st.sampled_from(tuple(plain) + (tuple(odd) if wild else ())))

    start = 1_795_953_000
    lines: list[str] = []
    metrics = draw(
        st.lists(
            st.sampled_from(EXPOSITION_METRICS + (ODD_EXPOSITION_METRICS if wild else ())),
            min_size=1,
            max_size=4,
            unique=not wild,  # one family of a name twice is refused by both parsers
        )
    )
    types = EXPOSITION_TYPES if not openmetrics else ("gauge", "gauge", "gauge", "unknown", "counter")
    for metric in metrics:
        if draw(st.integers(0, 3)):
            if draw(st.booleans()):
                # "" gives `# HELP name ` (a trailing space), None `# HELP name` (no text at all)
                help_texts = ("GPU utilization (in %).", "", "a \\ b \\n c", 'quoted "x')
                help_text = draw(st.sampled_from(help_texts + ((None,) if wild or not openmetrics else ())))
                lines.append(f"# HELP {metric}" if help_text is None else f"# HELP {metric} {help_text}")
            if draw(st.integers(0, 4)):
                lines.append(f"# TYPE {metric} {pick(types, ODD_EXPOSITION_TYPES + EXPOSITION_TYPES)}")
            if wild and draw(st.integers(0, 9)) == 0:
                lines.append(f"# UNIT {metric} {draw(st.sampled_from(('bytes', metric.rpartition('_')[2])))}")
        suffix = pick(("",), ("", "", "_total", "_count", "_bucket", "_created", "_info"))
        for _ in range(draw(st.integers(1, 4))):
            names = draw(
                st.lists(
                    st.sampled_from(EXPOSITION_LABELS + (ODD_EXPOSITION_LABELS if wild else ())),
                    max_size=4,
                    unique=not wild,
                )
            )
            pairs = [(name, pick(LABEL_VALUES_WRITTEN, ODD_LABEL_VALUES_WRITTEN)) for name in names]
            timed = draw(st.integers(0, 4)) != 0
            seconds = start
            # Two samples of a series without timestamps is one instant twice, refused by both parsers.
            for _ in range(draw(st.integers(1, 4)) if timed or wild else 1):
                seconds += draw(st.sampled_from((60,) * (9 if wild else 30) + (0, -60)))
                parts = [
                    f"{metric}{suffix}{_label_text(draw, pairs, wild)}",
                    pick(EXPOSITION_VALUES, ODD_EXPOSITION_VALUES),
                ]
                if timed or (wild and draw(st.integers(0, 9)) == 0):
                    parts.append(_timestamp_text(draw, seconds, openmetrics, wild))
                if wild and draw(st.integers(0, 19)) == 0:
                    parts.append('# {trace_id="abc"} 1.0')
                lines.append(" ".join(parts))
        if draw(st.integers(0, 9)) == 0:
            extra: tuple[str, ...] = ("# a comment", "#") if not openmetrics else ()
            extra += ("", "# TYPE", "  ", "# HELP") if wild else ()
            if extra:
                lines.append(draw(st.sampled_from(extra)))
    if openmetrics and (not wild or draw(st.integers(0, 9))):
        lines.append("# EOF")
    for _ in range(draw(st.integers(0, 2)) if wild else 0):
        at = draw(st.integers(0, max(len(lines) - 1, 0)))
        line = lines[at] if lines else ""
        how = draw(st.sampled_from(("insert", "delete", "duplicate", "swap", "crlf", "tab", "strip-eof")))
        if how == "insert":
            where = draw(st.integers(0, len(line)))
            lines[at : at + 1] = [line[:where] + draw(st.sampled_from(LINE_NOISE)) + line[where:]]
        elif how == "delete" and line:
            where = draw(st.integers(0, len(line) - 1))
            lines[at : at + 1] = [line[:where] + line[where + 1 :]]
        elif how == "duplicate":
            lines.insert(at, line)
        elif how == "swap" and at + 1 < len(lines):
            lines[at], lines[at + 1] = lines[at + 1], lines[at]
        elif how == "crlf":
            lines = [one + "\r" for one in lines]
        elif how == "tab":
            lines[at : at + 1] = [line.replace(" ", "\t", 1)]
        elif how == "strip-eof":
            lines = [one for one in lines if one != "# EOF"]
    text = "\n".join(lines)
    return (text + "\n" if not wild or draw(st.integers(0, 9)) else text), openmetrics


@st.composite
def mutated_expositions(draw: st.DrawFn) -> tuple[str, bool]:
    """One of the base snapshot's expositions after `mutate_exposition`, and whether it is OpenMetrics
    (as the snapshot source decides: `.om`, or a `# EOF` line)."""
    case = draw(mutate_exposition(base_case()))
    names = [name for name in case.snapshot_files() if name.endswith((".om", ".prom"))]
    name = draw(st.sampled_from(names))
    text = case.files[name].decode("utf-8", errors="replace")
    openmetrics = name.endswith(".om") or any(line.strip() == "# EOF" for line in text.splitlines())
    return text, openmetrics
