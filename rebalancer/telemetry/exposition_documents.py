"""An exposition's lines cut into documents, and the plain lines of each document read on the way.

Owns `documents`: the lines of a Prometheus text-format or OpenMetrics exposition, read one at a time,
cut into `Document`s of about `samples` sample lines that prometheus_client can parse on their own
(`telemetry.exposition` hands them over), and, while cutting, a fast reading of each document:
`Document.read` holds the samples the document gives when every one of its lines is of a form the reader
knows prometheus_client reads in one way, and None otherwise (then prometheus_client reads it, so
everything unusual keeps the library's semantics, messages and line numbers). What one line, or a piece
of it, reads as is `telemetry.exposition_lines`' (the series text the cut goes by, and the plain forms of
names, label texts, values, timestamps and metadata lines); what spans lines is this module's: the scan,
the families and groups, the memories of series and samples, and the cut.

The forms read (within a line by `telemetry.exposition_lines`, across lines here) are what dcgm-exporter
and `rebalancer snapshot` write, and nothing more:

- a sample `name value [timestamp]` or `name{label="value",...} value [timestamp]`: a legacy metric name,
  legacy label names not starting with `__`, each once, values in double quotes with the escapes `\\\\`,
  `\\"` and `\\n` (any other backslash pair kept as written, as the library keeps it), no spaces but one
  before the value and one before the timestamp; a value the library reads as `int` or `float` (decimal,
  exponent, `NaN`, `Inf`, `+Inf`, `-Inf`; -0 written as an integer is 0.0 as `int("-0")` gives), at most 64
  characters; a timestamp of digits (OpenMetrics: seconds, with an optional fraction read as the library
  reads it into nanoseconds; text format: integer milliseconds), at most 20 digits each side; no exemplar;
- metadata: OpenMetrics `# HELP name text`, `# TYPE name gauge|unknown`, and `# EOF` as the last line;
  text format `# HELP name [text]`, `# TYPE name gauge|untyped|unknown|counter` (a counter's samples get
  the `_total` the library appends), other comments, and blank lines;
- the library's rules on these lines, checked here, or the document is left to the library: families
  (a sample of another name starts an `unknown` family in OpenMetrics, a singleton in text format; one
  family per name in a document, metadata only before a family's samples), OpenMetrics groups (a series'
  samples together, all with or all without timestamps, strictly increasing: the library drops a sample
  at its predecessor's timestamp and refuses an earlier one), and the checks `telemetry.exposition` makes
  on the samples it keeps (timestamps in their format's range, not the same series twice in a row at one
  timestamp).

What a history repeats is read once: a line that continues the previous line's series is matched by
its series text and read from what follows it, a `value timestamp` text gives the same (immutable, shared)
`Sample` every time, a label text the same labels (a GPU's labels come back in every metric family), in
bounded memories that start afresh when full.

`documents` also makes the checks that span documents (the same series twice in a row without a
timestamp, an OpenMetrics series interleaved with others of its family), raising `ExpositionError`.
It must not read a line's pieces itself (`telemetry.exposition_lines` does), do I/O, read the clock,
import prometheus_client or decide what a document means when its reading differs from the library's:
such a document is left to the library.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

from rebalancer.telemetry.exposition_lines import (
    ASCII_SPACE,
    METRIC_NAME,
    OM_META,
    OM_TYPES,
    TEXT_META,
    parse_labels,
    parse_om_stamp,
    parse_text_stamp,
    parse_value,
    remember,
    series_text,
    without_timestamp,
)
from rebalancer.telemetry.series import ExpositionError, Sample

__all__ = [
    "MAX_TIMESTAMP_SECONDS",
    "METADATA_KINDS",
    "MIN_TEXT_TIMESTAMP_SECONDS",
    "Document",
    "Read",
    "SeriesKey",
    "documents",
]

# Prometheus text format timestamps are milliseconds. One that lands before this (March 1973) was
# almost certainly written in seconds; reading it as milliseconds would put the samples in 1970.
MIN_TEXT_TIMESTAMP_SECONDS = 1e8
# OpenMetrics timestamps are seconds: one after the year 3000 was written in milliseconds.
MAX_TIMESTAMP_SECONDS = 32_503_680_000.0

# Families whose samples are independent series, so a document may end between two of them.
_CUTTABLE_TYPES = frozenset({"gauge", "untyped"})
METADATA_KINDS = frozenset({"HELP", "TYPE", "UNIT"})

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]  # metric name, sorted label pairs


# --------------------------------------------------------------------------- documents


@dataclass(slots=True)
class Read:
    """The fast reading of a whole document: what prometheus_client would give for it."""

    families: list[str] = field(default_factory=list)  # family names, in the order the library yields them
    runs: list[tuple[SeriesKey, list[Sample]]] = field(default_factory=list)  # consecutive kept samples


@dataclass(slots=True)
class Document:
    """Part of an exposition that prometheus_client parses on its own."""

    lines: list[str] = field(default_factory=list)
    header: list[int] = field(default_factory=list)  # input line numbers of the repeated metadata lines
    first: int = 1  # input line number of the first line after them
    eof_added: bool = False  # an OpenMetrics `# EOF` added at the end of a cut document
    continues: str | None = None  # the family the previous document was cut in
    read: Read | None = None  # None: prometheus_client reads it

    def line_number(self, index: int | None) -> int | None:
        """The 1-based input line of `lines[index]`; None for a line added by the cut."""
        if index is None:
            return None
        if index < len(self.header):
            return self.header[index]
        if self.eof_added and index == len(self.lines) - 1:
            return None
        return self.first + index - len(self.header)


# --------------------------------------------------------------------------- the scan

_REMEMBERED_LABEL_TEXTS = 1 << 17  # label texts remembered (a GPU's labels, ~250 characters): ~35 MB at most
_NEVER = "\n\n"  # no line starts with it: no series is being continued


class _Scan:
    """The state of one pass over an exposition: the cut, and the fast reading of the current document."""

    def __init__(
        self, *, openmetrics: bool, samples: int, source: str, wanted: Collection[str] | None, fast: bool
    ) -> None:
        self.openmetrics = openmetrics
        self.samples = samples
        self.source = source
        self.wanted = wanted
        self.fast = fast
        # The cut (as the documents were always cut).
        self.family: str | None = None  # the family of the latest metadata lines
        self.header: list[tuple[str, int]] = []
        self.cuttable = False
        self.taken = 0
        self.previous: str | None = None  # the series of the previous sample line
        self.previous_untimed = False
        self.seen: set[str] = set()  # the series of the current family, when it may be cut
        # Remembered texts: values, timestamps, and what follows a series' text in a timestamped sample.
        self.values: dict[str, float] = {}
        self.stamps: dict[str, float] = {}
        self.samples_read: dict[str, tuple[Sample, float]] = {}  # the sample, its timestamp
        # Label texts (between the braces) and metric names read: a GPU's label text comes back in
        # every metric family.
        self.label_texts: dict[str, tuple[tuple[str, str], ...] | None] = {}
        self.metric_names: dict[str, bool] = {}
        self.stamp_of = parse_om_stamp if openmetrics else parse_text_stamp
        self.document = Document()
        self._start_reading()

    # ---- the fast reading of the current document

    def _start_reading(self) -> None:
        self.ok = self.fast
        self.read = Read()
        self.eof = False
        # The family prometheus_client is in: OpenMetrics name None before any; text format "" then.
        self.name: str | None = None if self.openmetrics else ""
        self.type: str | None = None if self.openmetrics else "untyped"
        self.allowed = False  # whether a sample of `name` belongs to the family
        self.has_help = False
        self.has_type = False
        self.has_samples = False
        self.names: set[str] = set()
        self.groups: set[SeriesKey] = set()  # OpenMetrics: the series of the family so far
        # The series being read: its key, whether its samples have timestamps, the latest.
        self.key: SeriesKey | None = None
        self.timed = False
        self.last: float | None = None
        self.kept: list[Sample] | None = None  # the run its samples go to; None when not kept
        # What lets the next line continue that series without the general path.
        self.head = _NEVER  # its `name{labels} `
        self.low, self.high = math.inf, -math.inf

    def _give_up(self) -> None:
        self.ok = False
        self.head = _NEVER
        self.low, self.high = math.inf, -math.inf

    def _new_family(self, name: str, type_: str | None) -> None:
        if self.openmetrics:
            if name in self.names:
                self._give_up()  # the library refuses a name twice in one document
                return
            self.names.add(name)
            self.read.families.append(name)
        self.name, self.type = name, type_
        self.allowed = True
        self.has_help = self.has_type = self.has_samples = False
        self.groups = set()
        self.key = None

    def _metadata(self, line: str) -> None:
        self.head = _NEVER
        self.low, self.high = math.inf, -math.inf
        if not self.ok:
            return
        if self.eof:
            self._give_up()
            return
        if self.openmetrics:
            content = line[:-1] if line.endswith("\n") else line
            if content == "# EOF":
                self.eof = True
                return
            match = OM_META.fullmatch(content)
            if match is None or match.group(1) == "UNIT":
                self._give_up()
                return
            kind, name, rest = match.groups()
            if name == self.name and self.has_samples:
                self._give_up()  # metadata after samples
                return
            if name != self.name:
                self._new_family(name, None)
            if kind == "HELP":
                if self.has_help:
                    self._give_up()
                self.has_help = True
            else:
                if self.has_type or rest not in OM_TYPES:
                    self._give_up()
                self.has_type = True
                self.type = rest
            return
        content = line.strip()
        match = TEXT_META.fullmatch(content)
        if match is None:
            if '"' in content or ASCII_SPACE.split(content, maxsplit=2)[1:2] in (["HELP"], ["TYPE"]):
                self._give_up()  # metadata the text parser reads otherwise, or refuses
            return  # a comment: ignored
        help_name, type_name, type_ = match.groups()
        if help_name is not None:
            if help_name != self.name:
                self._new_family(help_name, "untyped")
            return
        if type_name != self.name:
            self._new_family(type_name, type_)
        elif self.has_samples:
            self._give_up()  # a type given after samples would change how they were read
            return
        if type_ == "counter" and type_name == "_total":
            self._give_up()  # the library's counter family would have an empty name
            return
        self.type = type_

    def _blank(self, line: str) -> None:
        self.head = _NEVER
        self.low, self.high = math.inf, -math.inf
        if self.openmetrics:
            self._give_up()  # OpenMetrics has no blank lines (the library refuses one)

    def _sample(self, line: str, head: str) -> None:
        """Read one sample line the general way, `head` its `series_text` (the document is given up when
        the line is not plain)."""
        self.head = _NEVER
        self.low, self.high = math.inf, -math.inf
        if not self.ok:
            return
        end = len(head)
        if self.eof or end == 0 or line[end : end + 1] != " ":
            self._give_up()
            return
        parsed = self._parse_head(head)
        if parsed is None:
            self._give_up()
            return
        rest = line[end + 1 :]
        read = self.samples_read.get(rest) or self.sample(rest)
        if read is not None:
            sample, stamp = read
        else:
            # Without a timestamp (the rest then ends with the line's newline), or not plain.
            value_text = rest[:-1] if rest.endswith("\n") else rest
            value = self.value(value_text) if " " not in value_text else None
            if value is None:
                self._give_up()
                return
            sample, stamp = Sample(value, None), None
        name, labels = parsed
        # The family the library puts the sample in.
        if self.openmetrics:
            if name != self.name:
                self._new_family(name, "unknown")
        elif name != self.name or not self.allowed:
            self.name, self.type, self.allowed = "", "untyped", False  # a singleton family
            self.key = None
        if not self.ok:
            return
        if self.type == "counter" and self.allowed and not name.endswith("_total"):
            name += "_total"
        key = (name, labels)
        self.has_samples = True
        if key == self.key:
            # The same series again (the same group, in OpenMetrics).
            if (stamp is None) != (not self.timed) or stamp is None or self.last is None:
                self._give_up()
                return
            if stamp == self.last or (self.openmetrics and stamp < self.last):
                self._give_up()
                return
        else:
            if self.openmetrics:
                if key in self.groups:
                    self._give_up()  # the library refuses a group seen before, after another
                    return
                self.groups.add(key)
            self.key, self.timed = key, stamp is not None
            self.kept = None
            if self.wanted is None or name in self.wanted:
                self.kept = []
                self.read.runs.append((key, self.kept))
        if self.kept is not None:
            if stamp is not None and not (self._low() <= stamp <= MAX_TIMESTAMP_SECONDS):
                self._give_up()  # refused by telemetry.exposition: let the library say where
                return
            self.kept.append(sample)
        self.last = stamp
        if stamp is not None:
            self.head = head + " "
            if self.kept is not None:
                self.low, self.high = self._low(), MAX_TIMESTAMP_SECONDS
            else:
                self.low, self.high = -math.inf, math.inf

    def _parse_head(self, head: str) -> tuple[str, tuple[tuple[str, str], ...]] | None:
        """The metric name and sorted label pairs of a series text; None when it is not plain."""
        brace = head.find("{")
        name = head if brace == -1 else head[:brace]
        known = self.metric_names.get(name)
        if known is None:
            known = METRIC_NAME.fullmatch(name) is not None
            remember(self.metric_names, name, known)
        if not known:
            return None
        if brace == -1:
            return name, ()
        if head[-1] != "}":
            return None
        text = head[brace + 1 : -1]
        if text in self.label_texts:
            labels = self.label_texts[text]
        else:
            labels = parse_labels(text)
            remember(self.label_texts, text, labels, _REMEMBERED_LABEL_TEXTS)
        return (name, labels) if labels is not None else None

    def value(self, text: str) -> float | None:
        value = self.values.get(text)
        if value is None:
            value = parse_value(text)
            if value is not None:
                remember(self.values, text, value)
        return value

    def stamp(self, text: str) -> float | None:
        stamp = self.stamps.get(text)
        if stamp is None:
            stamp = self.stamp_of(text)
            if stamp is not None:
                remember(self.stamps, text, stamp)
        return stamp

    def sample(self, rest: str) -> tuple[Sample, float] | None:
        """The sample (and its timestamp) of a line whose series text is followed by ` ` + `rest` (`value
        timestamp`, a newline or not), or None when that is not a value and a timestamp of the forms read
        here. Samples are immutable: one read is shared by every line that writes the same."""
        value_text, _, stamp_text = rest.partition(" ")
        value = self.value(value_text)
        stamp = self.stamp(stamp_text) if value is not None else None
        if value is None or stamp is None:
            return None
        read = (Sample(value, stamp), stamp)
        remember(self.samples_read, rest, read)
        return read

    def _low(self) -> float:
        return -math.inf if self.openmetrics else MIN_TEXT_TIMESTAMP_SECONDS

    def finish_reading(self) -> None:
        """Hand the reading to the document, if the library would read the same."""
        if self.ok and (self.eof or not self.openmetrics):
            self.document.read = self.read

    # ---- the cut

    def cut(self, number: int) -> Document:
        """End the current document before input line `number`; the next one repeats the family's
        metadata lines (and the finished one gets a `# EOF`, in OpenMetrics)."""
        finished = self.document
        if self.openmetrics:
            if self.ok:
                self._metadata("# EOF\n")
            finished.lines.append("# EOF\n")
            finished.eof_added = True
        self.finish_reading()
        self.document = Document(continues=self.family)
        self._start_reading()
        for header_line, header_number in self.header:
            self.document.lines.append(header_line)
            self.document.header.append(header_number)
            self._metadata(header_line)
        self.document.first = number
        self.taken = 0
        return finished


def documents(
    lines: Iterable[str],
    *,
    openmetrics: bool,
    samples: int,
    source: str,
    wanted: Collection[str] | None = None,
    fast: bool = True,
) -> Iterator[Document]:
    """Cut an exposition into documents of about `samples` sample lines, each read on the way when it can be.

    A document ends only inside a gauge (or untyped) family, between two of its series; the next one
    starts again with that family's metadata lines, and an OpenMetrics document gets its `# EOF`. A
    series is never cut, so the parsers' checks on it (timestamps in order, no mixed presence) hold; a
    family seen twice is refused across documents by the caller, and an OpenMetrics series that shows up
    again after others of its family (interleaved groups) here, as the parser would within a document.
    Any line this does not recognise simply stays in the current document, so cutting never changes what
    is parsed. `wanted`: the sample names whose samples the reading keeps (all when None); `fast=False`
    reads nothing, leaving every document to the library.
    """
    scan = _Scan(openmetrics=openmetrics, samples=samples, source=source, wanted=wanted, fast=fast)
    loose = not openmetrics  # the text format allows a series' timestamps in any order
    number = 0
    document = scan.document
    # The hot path: a line continuing the series of the previous line, with a value and a timestamp
    # already seen. Its state lives in locals, loaded again after every line of the general path.
    head, width, last, low, high, kept = scan.head, len(scan.head), -math.inf, scan.low, scan.high, None
    remembered, sample_of = scan.samples_read, scan.sample
    taken = scan.taken
    append = document.lines.append
    for line in lines:
        number += 1
        if line.startswith(head):
            rest = line[width:]
            read = remembered.get(rest) or sample_of(rest)
            if read is not None:
                sample, stamp = read
                if (stamp > last or (loose and stamp != last)) and low <= stamp <= high:
                    if kept is not None:
                        kept.append(sample)
                    last = stamp
                    taken += 1
                    append(line)
                    continue
        # The general path.
        scan.last, scan.taken = last, taken
        finished = _general(scan, line, number)
        if finished is not None:
            yield finished
        document = scan.document
        append = document.lines.append
        head, width, low, high, kept = scan.head, len(scan.head), scan.low, scan.high, scan.kept
        last = scan.last if scan.last is not None else -math.inf
        taken = scan.taken
    scan.finish_reading()
    yield scan.document


def _general(scan: _Scan, line: str, number: int) -> Document | None:
    """One line the general way: the cut's checks and decision, then the fast reading of the line.
    Returns the document the line's series ended, if any."""
    finished: Document | None = None
    if line.startswith("#"):
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[1] in METADATA_KINDS:
            if parts[2] != scan.family:
                scan.family, scan.header, scan.cuttable = parts[2], [], False
                scan.seen = set()
            scan.header.append((line, number))
            if parts[1] == "TYPE":
                scan.cuttable = len(parts) == 4 and parts[3].strip() in _CUTTABLE_TYPES
        scan.previous = None
        scan._metadata(line)
    elif line.strip():
        # Read first (the reading gives the series text and timestamp presence of a plain line), but
        # into the right document: a line that starts a new series may end the current document.
        series = series_text(line)
        untimed = without_timestamp(line, series)
        if series == scan.previous and untimed and scan.previous_untimed:
            # Two values of one series at one instant: undefined in both formats, refused by Prometheus
            # (prometheus_client's OpenMetrics parser silently keeps the first).
            message = f"{series}: the same series is given twice without a timestamp"
            raise ExpositionError(scan.source, message, number)
        scan.previous_untimed = untimed
        if scan.openmetrics and scan.cuttable and series != scan.previous:
            if series in scan.seen:
                message = f"invalid OpenMetrics: Invalid metric grouping: {line.strip()}"
                raise ExpositionError(scan.source, message, number)
            scan.seen.add(series)
        family = scan.family
        if (
            scan.taken >= scan.samples
            and scan.cuttable
            and scan.previous is not None
            and series != scan.previous
            and family is not None
            and (series == family or series.startswith(family + "{"))
        ):
            finished = scan.cut(number)
        scan.taken += 1
        scan.previous = series
        scan._sample(line, series)
    else:
        scan._blank(line)
    scan.document.lines.append(line)
    return finished
