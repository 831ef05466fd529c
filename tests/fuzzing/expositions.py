"""DCGM expositions of the snapshot (`.om`, `.prom`) mutated line by line: sample values, timestamps
(scaled, out of order, removed), labels (escapes, duplicates, unclosed sets, bad names), families
repeated, `# TYPE` changed, metadata dropped, `# EOF` removed, moved or added, garbage lines, CRLF,
exemplars, renamed metrics; sometimes `snapshot.yaml` dropped, so that the instant comes from the samples.

Owns `mutate_exposition` and its pools. This module must not build an exposition from scratch
(tests/fuzzing/exposition_texts.py does, for the differential test of the exposition reader).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from hypothesis import strategies as st

from tests.fuzzing.case import Case
from tests.fuzzing.layout import SNAPSHOT_DIR

GARBAGE_LINES = (
    "garbage",
    "{}",
    "metric{",
    'x{a="1"} 1 2 3',
    "# TYPE x bogus",
    "# HELP",
    "#",
    "  ",
    "\t",
    'DCGM_FI_DEV_GPU_UTIL{gpu="0"} abc',
    "DCGM_FI_DEV_GPU_UTIL 1 notatime",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_GPU_UTIL{} 1",
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",gpu="1"} 1',
    "DCGM_FI_DEV_GPU_UTIL{gpu=0} 1",
    '{gpu="0"} 1',
    'DCGM_FI_DEV_GPU_UTIL{"gpu"="0"} 1',
    "# EOF",
    "# UNIT DCGM_FI_DEV_GPU_UTIL percent",
    "# TYPE DCGM_FI_DEV_GPU_UTIL counter",
    'ünïcødé{ä="ö"} 1',
    "\x00",
    "DCGM_FI_DEV_GPU_UTIL 1e400",
    "DCGM_FI_DEV_GPU_UTIL NaN 1795953135",
    'DCGM_FI_DEV_FB_USED{hostname="ghost-node",UUID="GPU-x",gpu="0"} 99999999999 1795953135',
    "DCGM_FI_DEV_GPU_UTIL" + "x" * 3000 + " 1",
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",note="' + "x" * 3000 + '"} 1 1795953135',
)
SAMPLE_VALUES = (
    "NaN",
    "+Inf",
    "-Inf",
    "Nan",
    "nan",
    "inf",
    "1e400",
    "-1e400",
    "-1",
    "1e308",
    "0x10",
    "1_000",
    "9" * 400,
    "",
    "1.5.5",
    "∞",
    "-0",
    "4294967280",
    "140737488355328",
    "9223372036854775792",
    "9" * 3000 + "x",
)
TIMESTAMP_EDITS = (
    "x1000",
    "/1000",
    "negative",
    "1e20",
    "9" * 30,
    "1e400",
    "0",
    "fraction",
    "abc",
    "remove",
    "-1e400",
    "253402300800",
    "NaN",
)
LABEL_VALUES = (
    '\\"',
    "\\\\",
    "\\n",
    "ü",
    "}",
    "\\x",
    '"',
    "",
    ",",
    "=",
    "x" * 100_000,
    "a\\",
    "\t",
)


def _split_sample(line: str) -> tuple[str, list[str]] | None:
    """`name{labels}` and the rest (value, timestamp, exemplar...) of a sample line."""
    if not line or line.startswith("#"):
        return None
    brace = line.rfind("}")
    head_end = brace + 1 if brace != -1 else line.find(" ")
    if head_end <= 0:
        return None
    return line[:head_end], line[head_end:].split()


def _join_sample(series: str, rest: Sequence[str]) -> str:
    return " ".join([series, *rest])


EXPOSITION_OPS = (
    "value",
    "value",
    "timestamp",
    "timestamp",
    "out-of-order",
    "duplicate-line",
    "garbage",
    "garbage",
    "label",
    "label",
    "duplicate-family",
    "type",
    "drop-metadata",
    "eof-remove",
    "eof-middle",
    "eof-add",
    "after-eof",
    "scale-all",
    "strip-timestamps",
    "crlf",
    "exemplar",
    "rename-metric",
    "huge-timestamp-all",
)


@st.composite
def mutate_exposition(draw: st.DrawFn, case: Case) -> Case:
    """DCGM expositions: values, timestamps, labels, families, `# EOF`, garbage lines."""
    names = [n for n in case.snapshot_files() if n.endswith((".om", ".prom"))]
    if not names:
        return case
    name = draw(st.sampled_from(names))
    try:
        lines = case.files[name].decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return case
    samples = [i for i, line in enumerate(lines) if _split_sample(line) is not None]
    notes: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(EXPOSITION_OPS), label="exposition-op")
        index = samples[draw(st.integers(0, len(samples) - 1))] if samples else 0
        parsed = _split_sample(lines[index]) if samples else None
        if op == "value" and parsed:
            series, rest = parsed
            value = draw(st.sampled_from(SAMPLE_VALUES))
            lines[index] = _join_sample(series, [value, *rest[1:]] if value else rest[1:])
            notes.append(f"line {index + 1} value {value[:20]!r}")
        elif op == "timestamp" and parsed:
            series, rest = parsed
            edit = draw(st.sampled_from(TIMESTAMP_EDITS))
            rest = list(rest) + ([] if len(rest) > 1 else ["1795953135"])
            rest[1] = _edit_timestamp(rest[1], edit)
            lines[index] = _join_sample(series, [r for r in rest if r])
            notes.append(f"line {index + 1} timestamp {edit}")
        elif op == "out-of-order" and parsed and index + 1 < len(lines):
            other = _split_sample(lines[index + 1])
            if other and len(parsed[1]) > 1 and len(other[1]) > 1:
                a, b = list(parsed[1]), list(other[1])
                a[1], b[1] = b[1], a[1]
                lines[index], lines[index + 1] = _join_sample(parsed[0], a), _join_sample(other[0], b)
                notes.append(f"lines {index + 1}-{index + 2} out of order")
        elif op == "duplicate-line":
            lines.insert(index, lines[index])
            notes.append(f"line {index + 1} repeated")
        elif op == "garbage":
            garbage = draw(st.sampled_from(GARBAGE_LINES) | st.text(max_size=40))
            at = draw(st.integers(0, len(lines)))
            lines.insert(at, garbage)
            notes.append(f"garbage {garbage[:30]!r} at line {at + 1}")
        elif op == "label" and parsed:
            series, rest = parsed
            value = draw(st.sampled_from(LABEL_VALUES))
            how = draw(st.sampled_from(("value", "add", "duplicate", "empty", "unclosed", "bad-name")))
            lines[index] = _join_sample(_edit_labels(series, how, value), rest)
            notes.append(f"line {index + 1} labels {how} {value[:10]!r}")
        elif op == "duplicate-family":
            first = [line for line in lines if line and line != "# EOF"]
            family = _first_family(first)
            eof = "# EOF" in lines
            body = [line for line in lines if line != "# EOF"]
            lines = body + family + (["# EOF"] if eof else [])
            notes.append("first family repeated")
        elif op == "type":
            kind = draw(
                st.sampled_from(
                    (
                        "counter",
                        "histogram",
                        "summary",
                        "info",
                        "stateset",
                        "gaugehistogram",
                        "unknown",
                        "untyped",
                        "bogus",
                        "",
                    )
                )
            )
            lines = [
                re.sub(r"^(# TYPE \S+) \S+$", rf"\1 {kind}", line, count=1)
                if line.startswith("# TYPE")
                else line
                for line in lines
            ]
            notes.append(f"TYPE {kind!r}")
        elif op == "drop-metadata":
            lines = [line for line in lines if not line.startswith(("# TYPE", "# HELP"))]
            notes.append("no HELP / TYPE")
        elif op == "eof-remove":
            lines = [line for line in lines if line != "# EOF"]
            notes.append("# EOF removed")
        elif op == "eof-middle":
            lines.insert(draw(st.integers(0, len(lines))), "# EOF")
            notes.append("# EOF in the middle")
        elif op == "eof-add":
            lines = [*(line for line in lines if line), "# EOF", ""]
            notes.append("# EOF added")
        elif op == "after-eof":
            lines += ['DCGM_FI_DEV_GPU_UTIL{gpu="9",UUID="GPU-after",hostname="l4-a-1"} 1 1795953135', ""]
            notes.append("sample after # EOF")
        elif op == "scale-all":
            factor = draw(st.sampled_from(("x1000", "/1000")))
            lines = [_edit_line_timestamp(line, factor) for line in lines]
            notes.append(f"every timestamp {factor}")
        elif op == "huge-timestamp-all":
            edit = draw(st.sampled_from(("1e20", "negative", "0", "253402300800", "9" * 30)))
            lines = [_edit_line_timestamp(line, edit) for line in lines]
            notes.append(f"every timestamp {edit}")
        elif op == "strip-timestamps":
            lines = [_edit_line_timestamp(line, "remove") for line in lines]
            notes.append("no timestamps")
        elif op == "crlf":
            lines = [line + "\r" if line else line for line in lines]
            notes.append("CRLF")
        elif op == "exemplar" and parsed:
            series, rest = parsed
            lines[index] = _join_sample(series, [*rest, '# {trace_id="abc"} 1.0 1795953135'])
            notes.append(f"line {index + 1} exemplar")
        elif op == "rename-metric" and parsed:
            series, rest = parsed
            suffix = draw(st.sampled_from(("_total", "_created", "_bucket", "_count", "_info", "x")))
            metric, brace, labels = series.partition("{")
            lines[index] = _join_sample(metric + suffix + brace + labels, rest)
            notes.append(f"line {index + 1} metric {suffix}")
        samples = [i for i, line in enumerate(lines) if _split_sample(line) is not None]
    out = case.with_file(name, "\n".join(lines).encode("utf-8"), f"{name.split('/')[-1]}: {', '.join(notes)}")
    if draw(st.integers(0, 3)) == 0 and f"{SNAPSHOT_DIR}/snapshot.yaml" in out.files:
        out = out.without([f"{SNAPSHOT_DIR}/snapshot.yaml"], "no snapshot.yaml (now from the samples)")
    return out


def _edit_timestamp(text: str, edit: str) -> str:
    try:
        number = float(text)
    except ValueError:
        number = 1795953135.0
    if edit == "x1000":
        return f"{int(number * 1000) if math.isfinite(number) else text}"
    if edit == "/1000":
        return f"{number / 1000:.3f}" if math.isfinite(number) else text
    if edit == "negative":
        return f"-{text.lstrip('-')}"
    if edit == "fraction":
        return f"{text}.5" if "." not in text else text + "5"
    if edit == "remove":
        return ""
    return edit


def _edit_line_timestamp(line: str, edit: str) -> str:
    parsed = _split_sample(line)
    if parsed is None or len(parsed[1]) < 2:
        return line
    series, rest = parsed
    rest = list(rest)
    rest[1] = _edit_timestamp(rest[1], edit)
    return _join_sample(series, [r for r in rest if r])


def _edit_labels(series: str, how: str, value: str) -> str:
    metric, brace, labels = series.partition("{")
    labels = labels.removesuffix("}")
    if how == "value":
        labels = re.sub(r'="[^"]*"', lambda _: f'="{value}"', labels, count=1)
    elif how == "add":
        labels = f'{labels},extra="{value}"' if labels else f'extra="{value}"'
    elif how == "duplicate":
        first = labels.split(",")[0] if labels else 'gpu="0"'
        labels = f"{labels},{first}"
    elif how == "empty":
        labels = ""
    elif how == "unclosed":
        return f"{metric}{{{labels}"
    else:
        labels = f'{labels},1bad-name="{value}"'
    return f"{metric}{{{labels}}}" if brace or labels else metric


def _first_family(lines: Sequence[str]) -> list[str]:
    out: list[str] = []
    name: str | None = None
    for line in lines:
        if line.startswith("# TYPE ") or line.startswith("# HELP "):
            current = line.split()[2] if len(line.split()) > 2 else ""
            if name is not None and current != name and any(not x.startswith("#") for x in out):
                break
            name = current
        out.append(line)
    return out[:400]
