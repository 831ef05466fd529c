"""One exposition line, or a piece of it, read from its text alone: the series text and the plain forms.

Owns what the exposition reader (`telemetry.exposition_documents`) reads within one line:

- the cut's reading of any sample line: `series_text`, its `name{labels}` as written (the reader cuts
  by it, `telemetry.exposition` finds a line's family by it), and `without_timestamp`;
- the plain forms (`telemetry.exposition_documents` lists them, with the rules across lines): a legacy
  metric name (`METRIC_NAME`), the sorted pairs of a label text (`parse_labels`), a value
  (`parse_value`), a timestamp of each format (`parse_om_stamp`, `parse_text_stamp`), and the metadata
  lines of each format (`OM_META`, `OM_TYPES`, `TEXT_META`, `ASCII_SPACE`), each read as
  prometheus_client reads it; a text not of these forms reads as None;
- `remember`, the bounded memories of what texts read as (the label names' here, the reader's others),
  which start afresh when full.

It must not hold what spans lines (the scan's families, groups, series and documents are
`telemetry.exposition_documents`'), decide what a document means, do I/O, read the clock or import
prometheus_client.
"""

from __future__ import annotations

import re
from typing import TypeVar

_T = TypeVar("_T")

__all__ = [
    "ASCII_SPACE",
    "METRIC_NAME",
    "OM_META",
    "OM_TYPES",
    "TEXT_META",
    "parse_labels",
    "parse_om_stamp",
    "parse_text_stamp",
    "parse_value",
    "remember",
    "series_text",
    "without_timestamp",
]


# --------------------------------------------------------------------------- the cut's reading


def series_text(line: str) -> str:
    """The `name{labels}` part of a sample line (as written: two spellings of one series differ)."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        return line[: line.rfind("}") + 1]
    return line[:space] if space != -1 else line


def without_timestamp(line: str, series: str) -> bool:
    """Whether a sample line gives only a value (an OpenMetrics exemplar after `#` aside)."""
    rest = line[len(series) :].partition("#")[0].split()
    return len(rest) == 1


# --------------------------------------------------------------------------- the plain forms

_METRIC = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
METRIC_NAME = re.compile(_METRIC)
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_QUOTED = r'"[^"\\]*(?:\\.[^"\\]*)*"'  # a label value: any character but a quote, or a backslash pair
_LABELS = re.compile(rf"[a-zA-Z_][a-zA-Z0-9_]*={_QUOTED}(?:,[a-zA-Z_][a-zA-Z0-9_]*={_QUOTED})*", re.S)
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*(?:\\.[^"\\]*)*)"', re.S)
_ESCAPE = re.compile(r'\\[\\n"]')
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_VALUE = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?Inf|NaN")
_INTEGER = re.compile(r"[-+]?[0-9]+")
_OM_STAMP = re.compile(r"([0-9]{1,20})(?:\.([0-9]{1,20}))?")
_TEXT_STAMP = re.compile(r"[0-9]{1,20}")
OM_META = re.compile(rf"# (HELP|TYPE|UNIT) ({_METRIC}) (.*)", re.S)
TEXT_META = re.compile(
    rf"# (?:HELP ({_METRIC})(?: .*)?|TYPE ({_METRIC}) (gauge|untyped|unknown|counter))", re.S
)
ASCII_SPACE = re.compile(r"[ \t\n\r\x0b\x0c]+")  # string.whitespace, what the text parser splits on
OM_TYPES = frozenset({"gauge", "unknown"})

_REMEMBERED = 1 << 16  # texts remembered, of each kind


def parse_value(text: str) -> float | None:
    """`float(prometheus_client.parser._parse_value(text))` for the values read here, else None."""
    if len(text) > 64 or _VALUE.fullmatch(text) is None:
        return None
    return float(int(text)) if _INTEGER.fullmatch(text) else float(text)


def parse_om_stamp(text: str) -> float | None:
    """`float()` of the OpenMetrics parser's `Timestamp` for a timestamp of digits, else None."""
    match = _OM_STAMP.fullmatch(text[:-1] if text.endswith("\n") else text)
    if match is None:
        return None
    seconds, fraction = match.groups()
    nanoseconds = int(fraction[:9].ljust(9, "0")) if fraction is not None else 0
    return float(int(seconds)) + float(nanoseconds) / 1e9


def parse_text_stamp(text: str) -> float | None:
    """The text parser's timestamp (`int(text) / 1000`, in seconds) for integer milliseconds, else None."""
    digits = text[:-1] if text.endswith("\n") else text
    return int(digits) / 1000 if _TEXT_STAMP.fullmatch(digits) else None


def parse_labels(text: str) -> tuple[tuple[str, str], ...] | None:
    """The sorted label pairs of the text between a series' braces; None unless it is `name="value"`
    pairs joined by commas, each name legacy, not reserved (`__`) and given once."""
    if not text:
        return ()
    pairs = _split_pairs(text) if "\\" not in text else None
    if pairs is None:
        if _LABELS.fullmatch(text) is None:
            return None
        pairs = [(name, _ESCAPE.sub(_unescaped, value)) for name, value in _PAIR.findall(text)]
        if any(name.startswith("__") for name, _ in pairs):
            return None
    if len(dict(pairs)) != len(pairs):
        return None
    return tuple(sorted(pairs))


def _split_pairs(text: str) -> list[tuple[str, str]] | None:
    """`parse_labels`' pairs of a label text without a backslash, by splitting (several times faster
    than the expression), names not reserved; None when splitting does not give them. Without a
    backslash no value holds a quote, so a value ends at the first quote after it opens, followed by `,`
    or the end of the text. Splitting at every `",` also splits where a value starts with a comma, and
    then a piece is not `name="value`: None, and the expression decides."""
    if text[-1] != '"' or text.startswith("__") or '",__' in text:
        return None
    pairs: list[tuple[str, str]] = []
    for piece in text[:-1].split('",'):
        name, equals, value = piece.partition('="')
        if not equals or '"' in value:
            return None
        known = _NAMES.get(name)
        if known is None:
            known = _LABEL_NAME.fullmatch(name) is not None
            remember(_NAMES, name, known)
        if not known:
            return None
        pairs.append((name, value))
    return pairs


_NAMES: dict[str, bool] = {}  # label names: whether legacy


def remember(texts: dict[str, _T], text: str, value: _T, limit: int = _REMEMBERED) -> None:
    """Remember what `text` reads as; a full memory starts afresh, so it follows what the file repeats."""
    if len(texts) >= limit:
        texts.clear()
    texts[text] = value


def _unescaped(match: re.Match[str]) -> str:
    return _ESCAPES[match.group(0)]
