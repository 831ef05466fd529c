"""DCGM exporter expositions: Prometheus text format and OpenMetrics, read and written.

Owns turning exposition text into `Series` (metric name, labels, samples) and back:

- `parse_exposition` / `parse_exposition_lines`: the lines read one at a time and cut into documents of
  bounded size (a large cluster's history is millions of samples, `telemetry.exposition_documents`). A
  document of only the plain lines dcgm-exporter and `rebalancer snapshot` write is read on the way, as
  prometheus_client would read it (tests/test_exposition_reader.py holds the two readings equal, on every
  exposition of the tests and on fuzzed ones); any other document goes through prometheus_client's
  parsers, so whatever is unusual keeps the library's semantics. A malformed exposition raises
  `ExpositionError` naming the line at fault;
- timestamps follow each format's definition: milliseconds in the Prometheus text format (the parser
  divides them by 1000), seconds in OpenMetrics; one outside 1973..3000 in its format's unit is refused
  with a hint, as are NaN / infinite timestamps and the same series given twice at one instant;
- `render_openmetrics`: series with timestamped samples as one OpenMetrics exposition (what
  `rebalancer snapshot` writes).

`Series`, `Sample` and `ExpositionError` are `telemetry.series'`, re-exported here. It must not do I/O
(callers pass text or lines), read the clock, or know what the series mean: identity is
`telemetry.identity`'s, aggregation `telemetry.windows'`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Literal, TextIO, cast

from rebalancer.telemetry.exposition_documents import (
    MAX_TIMESTAMP_SECONDS,
    METADATA_KINDS,
    MIN_TEXT_TIMESTAMP_SECONDS,
    Document,
    Read,
    SeriesKey,
    documents,
)
from rebalancer.telemetry.exposition_lines import series_text
from rebalancer.telemetry.series import ExpositionError, Sample, Series
from rebalancer.wording import clip

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.samples import Sample as ParsedSample

__all__ = [
    "DOCUMENT_SAMPLES",
    "ExpositionError",
    "ExpositionFormat",
    "Sample",
    "Series",
    "parse_exposition",
    "parse_exposition_lines",
    "render_openmetrics",
]

ExpositionFormat = Literal["auto", "prometheus", "openmetrics"]

_SECONDS_PER_YEAR = 31_556_952  # the mean Gregorian year

# Sample lines per document handed to prometheus_client. Its parsers hold a whole metric family (a
# namedtuple and a labels dict per sample, ~1.5 KB) before yielding it, and one DCGM metric of a large
# cluster's history is millions of samples: an exposition is cut into documents of about this size.
DOCUMENT_SAMPLES = 20_000


def _is_openmetrics(text: str) -> bool:
    return any(line.strip() == "# EOF" for line in text.splitlines())


def _fails_alone(line: str, openmetrics: bool) -> bool:
    """Whether the parser refuses this one sample or metadata line on its own."""
    content = line.strip()
    if not content or content == "# EOF" or (line.startswith("#") and _family_of(line) is None):
        return False
    text = line if line.endswith("\n") else line + "\n"
    try:
        if openmetrics:
            list(_any_parser(True)(cast(TextIO, iter((text, "# EOF\n")))))
        else:
            from prometheus_client.parser import text_string_to_metric_families

            list(text_string_to_metric_families(text))
    except Exception:
        return True
    return False


def _family_of(line: str) -> str | None:
    """The family a sample or metadata line belongs to (`h` for `h_bucket{...}`, `# TYPE h ...`)."""
    if line.startswith("#"):
        parts = line.split(None, 3)
        return parts[2] if len(parts) >= 3 and parts[1] in METADATA_KINDS else None
    name = series_text(line).partition("{")[0]
    for suffix in ("_bucket", "_count", "_sum", "_total", "_created", "_gcount", "_gsum", "_info"):
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name or None


def _locate_error(lines: Sequence[str], consumed: int, message: str, *, openmetrics: bool) -> int | None:
    """0-based index of the line at fault in a document the parser refused after reading `consumed`
    lines (None for a problem of the whole document, such as a missing `# EOF`).

    prometheus_client raises on the line it is reading when that line is malformed, but a family-wide
    check (bucket order, a metric type, a name seen twice) only fails when the family ends, on the next
    family's first line or at the end. So: the nearest line the message quotes whole, else the line the
    parser stopped at if it is malformed on its own, else the first line of the family (or the line
    holding the word) the message ends with, else the line the parser stopped at."""
    last = min(consumed, len(lines)) - 1
    if last < 0 or "Missing # EOF" in message:
        return None
    for index in range(last, -1, -1):
        content = lines[index].strip()
        if content and content in message:
            return index
    if _fails_alone(lines[last], openmetrics):
        return last
    word = message.rstrip().rpartition(" ")[2].strip("'\"")
    if word:
        for index in range(last, -1, -1):
            if _family_of(lines[index]) == word:
                first = index
                while first > 0 and _family_of(lines[first - 1]) == word:
                    first -= 1
                return first
        for index in range(last, -1, -1):
            if word in lines[index].split():
                return index
    return last


class _Counted:
    """The lines of a document, counting how many the parser has read."""

    __slots__ = ("consumed", "lines")

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.consumed = 0

    def __iter__(self) -> Iterator[str]:
        for line in self.lines:
            self.consumed += 1
            yield line


def _any_parser(openmetrics: bool) -> Callable[[TextIO], Iterator[Metric]]:
    """prometheus_client's OpenMetrics or text-format parser (both read any iterable of lines), imported
    when first needed: a snapshot whose telemetry is read from its aggregates, or whose expositions
    hold only plain documents, never needs it (40 ms of a command's start)."""
    from prometheus_client.openmetrics.parser import text_fd_to_metric_families as openmetrics_lines
    from prometheus_client.parser import text_fd_to_metric_families as prometheus_lines

    parser = openmetrics_lines if openmetrics else prometheus_lines
    return cast("Callable[[TextIO], Iterator[Metric]]", parser)


def _lines(text: str) -> Iterator[str]:
    """The lines of `text` with their newlines, as iterating `io.StringIO(text)` gives them."""
    start, size = 0, len(text)
    while start < size:
        end = text.find("\n", start) + 1 or size
        yield text[start:end]
        start = end


# --------------------------------------------------------------------------- parsing


def parse_exposition(
    text: str,
    *,
    source: str,
    metrics: Collection[str] | None = None,
    fmt: ExpositionFormat = "auto",
) -> list[Series]:
    """Series of a Prometheus text-format or OpenMetrics exposition, in order of first appearance.

    `fmt="auto"` reads OpenMetrics when the text has a `# EOF` line, Prometheus text format otherwise.
    Timestamps come back in seconds (text-format milliseconds are converted by the parser). `metrics`,
    when given, keeps only samples with those names. Raises ExpositionError on malformed input.
    """
    openmetrics = fmt == "openmetrics" or (fmt == "auto" and _is_openmetrics(text))
    return parse_exposition_lines(_lines(text), source=source, openmetrics=openmetrics, metrics=metrics)


def parse_exposition_lines(
    lines: Iterable[str],
    *,
    source: str,
    openmetrics: bool,
    metrics: Collection[str] | None = None,
    document_samples: int = DOCUMENT_SAMPLES,
    fast: bool = True,
) -> list[Series]:
    """`parse_exposition` over lines (with their newlines) read one at a time, e.g. from an open file:
    neither the text nor a whole metric family is held at once, only the samples kept.

    `fast=False` hands every document to prometheus_client, even the plain ones the reading on the way
    would give the same samples for (the reference that reading is tested against)."""
    wanted = frozenset(metrics) if metrics is not None else None
    collected: dict[SeriesKey, list[Sample]] = {}
    families: set[str] = set()  # OpenMetrics families of earlier documents
    for document in documents(
        lines, openmetrics=openmetrics, samples=document_samples, source=source, wanted=wanted, fast=fast
    ):
        read = document.read
        if read is None or not _commit(read, document, collected, families, openmetrics=openmetrics):
            _parse_document(document, collected, families, wanted, source=source, openmetrics=openmetrics)
        del document, read
    return [
        Series(metric=name, labels=dict(labels), samples=tuple(samples), source=source)
        for (name, labels), samples in collected.items()
    ]


_NOTHING = object()  # no sample before


def _commit(
    read: Read,
    document: Document,
    collected: dict[SeriesKey, list[Sample]],
    families: set[str],
    *,
    openmetrics: bool,
) -> bool:
    """Add a document's fast reading to `collected`, unless what spans documents refuses it (a family
    seen in an earlier document, a series given again at the timestamp it ended with): then nothing is
    added, and False lets prometheus_client read the document and say where."""
    if openmetrics:
        for index, name in enumerate(read.families):
            if name in families and not (index == 0 and name == document.continues):
                return False
    ended: dict[SeriesKey, float | None] = {}
    for key, samples in read.runs:
        before = ended.get(key, _NOTHING)
        if before is _NOTHING:
            existing = collected.get(key)
            before = existing[-1].timestamp if existing else _NOTHING
        if before == samples[0].timestamp:
            return False
        ended[key] = samples[-1].timestamp
    families.update(read.families)
    for key, samples in read.runs:
        existing = collected.get(key)
        if existing is None:
            collected[key] = samples.copy()  # the reading's own lists stay as they were read
        else:
            existing.extend(samples)
    return True


def _parse_document(
    document: Document,
    collected: dict[SeriesKey, list[Sample]],
    families: set[str],
    wanted: frozenset[str] | None,
    *,
    source: str,
    openmetrics: bool,
) -> None:
    """Add what prometheus_client reads in a document to `collected`; ExpositionError naming the line."""
    parser = _any_parser(openmetrics)
    counted = _Counted(document.lines)
    try:
        for index, family in enumerate(parser(cast(TextIO, iter(counted)))):
            if openmetrics:
                if family.name in families and not (index == 0 and family.name == document.continues):
                    raise ValueError(f"Clashing name: {family.name}")
                families.add(family.name)
            _collect(family.samples, collected, wanted, openmetrics=openmetrics)
            del family
    except _BadSample as bad:
        at = _sample_line(document.lines, counted.consumed, bad.name, bad.raw)
        raise ExpositionError(source, f"{bad.name}: {bad.message}", document.line_number(at)) from None
    except Exception as exc:  # prometheus_client raises ValueError, and a few others on odd input
        detail = str(exc) or type(exc).__name__
        kind = "OpenMetrics" if openmetrics else "Prometheus text format"
        at = _locate_error(document.lines, counted.consumed, detail, openmetrics=openmetrics)
        raise ExpositionError(source, f"invalid {kind}: {detail}", document.line_number(at)) from None


class _BadSample(Exception):
    """A sample the parser took but the format's definition does not allow (its timestamp)."""

    def __init__(self, name: str, raw: float | None, message: str) -> None:
        super().__init__(message)
        self.name = name
        self.raw = raw
        self.message = message


def _timestamp_seconds(name: str, timestamp: float, *, openmetrics: bool) -> float:
    """A sample's timestamp in seconds, checked against each format's definition: OpenMetrics writes
    seconds, the Prometheus text format milliseconds (prometheus_client's parser divides them by 1000).
    One that lands before 1973 or after the year 3000 was written in the other unit."""
    raw = timestamp if openmetrics else timestamp * 1000
    unit = "seconds (OpenMetrics)" if openmetrics else "milliseconds (Prometheus text format)"
    written = f"{raw:.0f}" if math.isfinite(raw) else str(raw)
    if not math.isfinite(timestamp):
        raise _BadSample(name, raw, f"timestamp {written} is not a time in {unit}")
    if not openmetrics and timestamp < MIN_TEXT_TIMESTAMP_SECONDS:
        raise _BadSample(
            name,
            raw,
            f"timestamp {written} is before 1973 when read as milliseconds (Prometheus text format); "
            "write milliseconds, or use OpenMetrics (timestamps in seconds, file ends with `# EOF`)",
        )
    if timestamp > MAX_TIMESTAMP_SECONDS:
        year = 1970 + int(timestamp // _SECONDS_PER_YEAR) if timestamp < 1e15 else "10**7 and more"
        hint = (
            "write seconds, or use the Prometheus text format (milliseconds, no `# EOF`)"
            if openmetrics
            else "write milliseconds"
        )
        raise _BadSample(
            name, raw, f"timestamp {clip(written, 30)} is in the year {year} when read as {unit}; {hint}"
        )
    return timestamp


def _sample_line(lines: Sequence[str], consumed: int, name: str, raw: float | None) -> int | None:
    """0-based index of the latest line, among the first `consumed`, of a sample of `name` written with
    timestamp `raw` (None: written without one)."""
    for index in range(min(consumed, len(lines)) - 1, -1, -1):
        line = lines[index]
        if line.startswith("#") or series_text(line).partition("{")[0] != name:
            continue
        rest = line[len(series_text(line)) :].split()
        if raw is None:
            if len(rest) == 1:
                return index
            continue
        try:
            written = float(rest[1]) if len(rest) >= 2 else None
        except ValueError:
            continue
        if written is not None and (written == raw or (math.isnan(written) and math.isnan(raw))):
            return index
    return None


def _collect(
    samples: Iterable[ParsedSample],
    collected: dict[SeriesKey, list[Sample]],
    wanted: frozenset[str] | None,
    *,
    openmetrics: bool,
) -> None:
    for sample in samples:
        if wanted is not None and sample.name not in wanted:
            continue
        timestamp: float | None = None
        if sample.timestamp is not None:
            timestamp = _timestamp_seconds(sample.name, float(sample.timestamp), openmetrics=openmetrics)
        key = (sample.name, tuple(sorted(sample.labels.items())))
        series = collected.setdefault(key, [])
        if series and series[-1].timestamp == timestamp:
            # Two values of one series at one instant: the formats leave it undefined, Prometheus refuses it.
            at = "without a timestamp" if timestamp is None else "at the same timestamp"
            raw = None if timestamp is None else (timestamp if openmetrics else timestamp * 1000)
            raise _BadSample(sample.name, raw, f"the same series is given twice {at}")
        series.append(Sample(value=float(sample.value), timestamp=timestamp))


# --------------------------------------------------------------------------- writing


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _timestamp(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 1000}.{ms % 1000:03d}"


def render_openmetrics(series: Iterable[Series]) -> str:
    """Series with timestamped samples as one OpenMetrics exposition (gauges, seconds, `# EOF`).

    Samples without a timestamp are left out: a snapshot file must say when each sample was taken.
    """
    families: dict[str, list[Series]] = defaultdict(list)
    for one in series:
        families[one.metric].append(one)
    lines: list[str] = []
    for metric in sorted(families):
        lines.append(f"# TYPE {metric} gauge")
        for one in sorted(families[metric], key=lambda s: sorted(s.labels.items())):
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(one.labels.items()))
            head = f"{metric}{{{labels}}}" if labels else metric
            stamped = sorted(
                (s for s in one.samples if s.timestamp is not None), key=lambda s: s.timestamp or 0
            )
            lines.extend(f"{head} {_number(s.value)} {_timestamp(s.timestamp or 0)}" for s in stamped)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"
