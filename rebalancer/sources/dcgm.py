"""DCGM exporter telemetry: parse expositions, resolve series identity, aggregate over windows.

Owns what the snapshot-directory source and the live Prometheus source share about dcgm-exporter series:

- `parse_exposition` / `parse_exposition_lines`: Prometheus text format or OpenMetrics -> `Series`
  (through prometheus_client's parsers; timestamps become seconds since the epoch, samples without one
  get None), the lines read one at a time and handed to the parser in documents of bounded size;
- `identify`: labels -> `SeriesIdentity` (node, GPU UUID and index, model, MIG instance, pod) following the
  policy's `LabelMapping`;
- `attribute`: a pod label counts only if it names a pod of the cluster that requests a GPU (the
  exporter's own pod does not);
- `aggregate`: raw samples -> `Telemetry` per window, with PromQL semantics of Prometheus 2.x evaluated at
  `now` (`avg_over_time` / `max_over_time` / `count_over_time` over `[now - window, now]`, both ends
  inclusive; instant vectors take the newest sample in `[now - 5m, now]`), so a snapshot directory
  backfilled into a real Prometheus gives the same numbers;
- `group_key` / `to_gpu_telemetry`: the grouping and unit scaling a live source applies to aggregates it
  gets straight from PromQL;
- `resolve_preset`: the metric names, scales and label names a `telemetry.preset` stands for, filled into
  the fields the policy leaves unset (both sources read the policy through it).

It must not do I/O (no files, no HTTP), read the clock or know about strategies: callers pass text and
`now`. Missing data stays None and is never turned into "idle".
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Literal, TextIO, cast

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_fd_to_metric_families as openmetrics_lines
from prometheus_client.parser import text_fd_to_metric_families as prometheus_lines
from prometheus_client.parser import text_string_to_metric_families as prometheus_families
from prometheus_client.samples import Sample as ParsedSample

from rebalancer.model import Finding, GpuTelemetry, Pod, Telemetry, TelemetryWindow
from rebalancer.policy import LabelMapping, MetricConfig, TelemetryConfig, TelemetryPreset
from rebalancer.wording import clip

__all__ = [
    "LOOKBACK_SECONDS",
    "PRESETS",
    "ExpositionError",
    "ExpositionFormat",
    "GroupKey",
    "Sample",
    "Series",
    "SeriesIdentity",
    "aggregate",
    "attribute",
    "bad_telemetry_finding",
    "fill_identity",
    "group_key",
    "identify",
    "is_valid_value",
    "parse_exposition",
    "parse_exposition_lines",
    "resolve_preset",
    "telemetry_metrics",
    "to_gpu_telemetry",
    "unknown_node_findings",
]

# Prometheus' default --query.lookback-delta: how far back an instant vector looks for a sample.
LOOKBACK_SECONDS = 300

ExpositionFormat = Literal["auto", "prometheus", "openmetrics"]

# Prometheus text format timestamps are milliseconds. One that lands before this (March 1973) was
# almost certainly written in seconds; reading it as milliseconds would put the samples in 1970.
_MIN_TEXT_TIMESTAMP_SECONDS = 1e8
# OpenMetrics timestamps are seconds: one after the year 3000 was written in milliseconds.
_MAX_TIMESTAMP_SECONDS = 32_503_680_000.0
_SECONDS_PER_YEAR = 31_556_952  # the mean Gregorian year

# DCGM's "blank" values (no data, not found, not supported, no permission) that the exporter prints
# verbatim: int32 0x7ffffff0..3, fp64 2^47..2^47+3, int64 0x7ffffffffffffff0.. (2^63 once a float).
_DCGM_BLANKS = frozenset(float(base + i) for base in (0x7FFFFFF0, 2**47) for i in range(4))
_DCGM_INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)


# --------------------------------------------------------------------------- series


@dataclass(frozen=True, slots=True)
class Sample:
    value: float
    # Seconds since the epoch; None when the exposition gave no timestamp (read as taken at `now`).
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class Series:
    """One time series (metric name + full label set) as read from one exposition."""

    metric: str
    labels: Mapping[str, str]
    samples: tuple[Sample, ...]
    source: str = ""


class ExpositionError(ValueError):
    """An exposition that prometheus_client cannot parse; the message names the source (and line)."""

    def __init__(self, source: str, message: str, line: int | None = None) -> None:
        self.source = source
        self.line = line
        self.message = message
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")


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
            list(prometheus_families(text))
    except Exception:
        return True
    return False


def _family_of(line: str) -> str | None:
    """The family a sample or metadata line belongs to (`h` for `h_bucket{...}`, `# TYPE h ...`)."""
    if line.startswith("#"):
        parts = line.split(None, 3)
        return parts[2] if len(parts) >= 3 and parts[1] in _METADATA else None
    name = _series_text(line).partition("{")[0]
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
    """prometheus_client's OpenMetrics or text-format parser (both read any iterable of lines)."""
    return cast(Callable[[TextIO], Iterator[Metric]], openmetrics_lines if openmetrics else prometheus_lines)


def _lines(text: str) -> Iterator[str]:
    """The lines of `text` with their newlines, as iterating `io.StringIO(text)` gives them."""
    start, size = 0, len(text)
    while start < size:
        end = text.find("\n", start) + 1 or size
        yield text[start:end]
        start = end


# --------------------------------------------------------------------------- documents

# Sample lines per document handed to prometheus_client. Its parsers hold a whole metric family (a
# namedtuple and a labels dict per sample, ~1.5 KB) before yielding it, and one DCGM metric of a large
# cluster's history is millions of samples: an exposition is cut into documents of about this size.
DOCUMENT_SAMPLES = 20_000
# Families whose samples are independent series, so a document may end between two of them.
_CUTTABLE_TYPES = frozenset({"gauge", "untyped"})
_METADATA = frozenset({"HELP", "TYPE", "UNIT"})


@dataclass(slots=True)
class _Document:
    """Part of an exposition that prometheus_client parses on its own."""

    lines: list[str] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)  # 1-based input line of each line, 0 if added
    continues: str | None = None  # the family the previous document was cut in

    def add(self, line: str, number: int) -> None:
        self.lines.append(line)
        self.numbers.append(number)

    def line_number(self, index: int | None) -> int | None:
        return self.numbers[index] or None if index is not None else None


def _series_text(line: str) -> str:
    """The `name{labels}` part of a sample line (as written: two spellings of one series differ)."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        return line[: line.rfind("}") + 1]
    return line[:space] if space != -1 else line


def _without_timestamp(line: str, series: str) -> bool:
    """Whether a sample line gives only a value (an OpenMetrics exemplar after `#` aside)."""
    rest = line[len(series) :].partition("#")[0].split()
    return len(rest) == 1


def _documents(lines: Iterable[str], *, openmetrics: bool, samples: int, source: str) -> Iterator[_Document]:
    """Cut an exposition into documents of about `samples` sample lines.

    A document ends only inside a gauge (or untyped) family, between two of its series; the next one
    starts again with that family's metadata lines, and an OpenMetrics document gets its `# EOF`. A
    series is never cut, so the parsers' checks on it (timestamps in order, no mixed presence) hold; a
    family seen twice is refused across documents by the caller, and an OpenMetrics series that shows up
    again after others of its family (interleaved groups) here, as the parser would within a document.
    Any line this does not recognise simply stays in the current document, so cutting never changes what
    is parsed.
    """
    document = _Document()
    family: str | None = None  # the family of the latest metadata lines
    header: list[tuple[str, int]] = []
    cuttable = False
    taken = 0
    previous: str | None = None  # the series of the previous sample line
    previous_untimed = False
    seen: set[str] = set()  # the series of the current family, when it may be cut
    for number, line in enumerate(lines, start=1):
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in _METADATA:
                if parts[2] != family:
                    family, header, cuttable = parts[2], [], False
                    seen = set()
                header.append((line, number))
                if parts[1] == "TYPE":
                    cuttable = len(parts) == 4 and parts[3].strip() in _CUTTABLE_TYPES
            previous = None
        elif line.strip():
            series = _series_text(line)
            untimed = _without_timestamp(line, series)
            if series == previous and untimed and previous_untimed:
                # Two values of one series at one instant: undefined in both formats, refused by Prometheus
                # (prometheus_client's OpenMetrics parser silently keeps the first).
                raise ExpositionError(
                    source, f"{series}: the same series is given twice without a timestamp", number
                )
            previous_untimed = untimed
            if openmetrics and cuttable and series != previous:
                if series in seen:
                    message = f"invalid OpenMetrics: Invalid metric grouping: {line.strip()}"
                    raise ExpositionError(source, message, number)
                seen.add(series)
            if (
                taken >= samples
                and cuttable
                and previous is not None
                and series != previous
                and family is not None
                and (series == family or series.startswith(family + "{"))
            ):
                if openmetrics:
                    document.add("# EOF\n", 0)
                yield document
                document = _Document(continues=family)
                for header_line, header_number in header:
                    document.add(header_line, header_number)
                taken = 0
            taken += 1
            previous = series
        document.add(line, number)
    yield document


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
) -> list[Series]:
    """`parse_exposition` over lines (with their newlines) read one at a time, e.g. from an open file:
    neither the text nor a whole metric family is held at once, only the samples kept."""
    parser = _any_parser(openmetrics)
    kind = "OpenMetrics" if openmetrics else "Prometheus text format"
    wanted = frozenset(metrics) if metrics is not None else None
    collected: dict[tuple[str, tuple[tuple[str, str], ...]], list[Sample]] = {}
    families: set[str] = set()  # OpenMetrics families of earlier documents
    for document in _documents(lines, openmetrics=openmetrics, samples=document_samples, source=source):
        counted = _Counted(document.lines)
        try:
            for index, family in enumerate(parser(cast(TextIO, iter(counted)))):
                if openmetrics:
                    if family.name in families and not (index == 0 and family.name == document.continues):
                        raise ValueError(f"Clashing name: {family.name}")
                    families.add(family.name)
                _collect(family.samples, collected, wanted, openmetrics=openmetrics)
                del family
        except ExpositionError:
            raise
        except _BadSample as bad:
            at = _sample_line(document.lines, counted.consumed, bad.name, bad.raw)
            raise ExpositionError(source, f"{bad.name}: {bad.message}", document.line_number(at)) from None
        except Exception as exc:  # prometheus_client raises ValueError, and a few others on odd input
            detail = str(exc) or type(exc).__name__
            at = _locate_error(document.lines, counted.consumed, detail, openmetrics=openmetrics)
            raise ExpositionError(source, f"invalid {kind}: {detail}", document.line_number(at)) from None
        del document
    return [
        Series(metric=name, labels=dict(labels), samples=tuple(samples), source=source)
        for (name, labels), samples in collected.items()
    ]


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
    if not openmetrics and timestamp < _MIN_TEXT_TIMESTAMP_SECONDS:
        raise _BadSample(
            name,
            raw,
            f"timestamp {written} is before 1973 when read as milliseconds (Prometheus text format); "
            "write milliseconds, or use OpenMetrics (timestamps in seconds, file ends with `# EOF`)",
        )
    if timestamp > _MAX_TIMESTAMP_SECONDS:
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
        if line.startswith("#") or _series_text(line).partition("{")[0] != name:
            continue
        rest = line[len(_series_text(line)) :].split()
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
    collected: dict[tuple[str, tuple[tuple[str, str], ...]], list[Sample]],
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


def bad_telemetry_finding(identity: SeriesIdentity, detail: str) -> Finding:
    """The `bad-telemetry` finding for a series whose samples were dropped, naming its GPU and pod."""
    return Finding(
        kind="bad-telemetry",
        node=identity.node,
        gpu=identity.uuid,
        namespace=identity.pod_namespace,
        pod=identity.pod_name,
        detail=detail,
    )


def is_valid_value(value: float) -> bool:
    """False for NaN, infinities, negative values and DCGM's blank / not-supported sentinels."""
    return math.isfinite(value) and value >= 0 and value not in _DCGM_BLANKS and value < _DCGM_INT64_BLANK


# --------------------------------------------------------------------------- identity


@dataclass(frozen=True, slots=True)
class SeriesIdentity:
    """Which GPU (or MIG instance) a series is about, and which pod it is attributed to."""

    node: str
    uuid: str
    gpu_index: str = ""
    model_name: str = ""
    mig_profile: str | None = None
    mig_instance: str | None = None
    pod_namespace: str | None = None
    pod_name: str | None = None

    @property
    def pod_key(self) -> tuple[str, str] | None:
        if self.pod_namespace and self.pod_name:
            return (self.pod_namespace, self.pod_name)
        return None

    def without_pod(self) -> SeriesIdentity:
        return replace(self, pod_namespace=None, pod_name=None)


# (node, GPU UUID, MIG instance, pod namespace, pod name): one GpuTelemetry row per key and window.
GroupKey = tuple[str, str, str | None, str | None, str | None]


def _first_non_empty(labels: Mapping[str, str], names: Iterable[str]) -> str | None:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return None


def _first_present(labels: Mapping[str, str], names: Iterable[str]) -> str | None:
    """The value of the first label name that is present, even if empty (empty -> None)."""
    for name in names:
        if name in labels:
            return labels[name] or None
    return None


def identify(labels: Mapping[str, str], mapping: LabelMapping) -> SeriesIdentity | None:
    """The identity of a series, or None when it has no node or no GPU UUID label (unusable).

    Node, UUID, index, model and MIG labels: the first mapped name that is present and non-empty wins.
    Pod and namespace: the first mapped name that is *present* decides, even when empty, so an empty
    `exported_pod` (GPU not allocated to a pod) does not fall through to `pod`, which then names the
    exporter's own pod. A pod needs both a namespace and a name.
    """
    node = _first_non_empty(labels, mapping.node)
    uuid = _first_non_empty(labels, mapping.uuid)
    if node is None or uuid is None:
        return None
    namespace = _first_present(labels, mapping.namespace)
    pod = _first_present(labels, mapping.pod)
    if namespace is None or pod is None:
        namespace = pod = None
    return SeriesIdentity(
        node=node,
        uuid=uuid,
        gpu_index=_first_non_empty(labels, mapping.gpu_index) or "",
        model_name=_first_non_empty(labels, mapping.model_name) or "",
        mig_profile=_first_non_empty(labels, mapping.mig_profile),
        mig_instance=_first_non_empty(labels, mapping.mig_instance),
        pod_namespace=namespace,
        pod_name=pod,
    )


def attribute(identity: SeriesIdentity, pods: Mapping[tuple[str, str], Pod] | None) -> SeriesIdentity:
    """Keep the pod only if it is a pod of the cluster that requests a GPU; `pods=None` trusts the labels."""
    key = identity.pod_key
    if key is None or pods is None:
        return identity
    pod = pods.get(key)
    if pod is None or not pod.uses_gpu:
        return identity.without_pod()
    return identity


def group_key(identity: SeriesIdentity) -> GroupKey:
    return (identity.node, identity.uuid, identity.mig_instance, identity.pod_namespace, identity.pod_name)


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def to_gpu_telemetry(
    identity: SeriesIdentity,
    cfg: TelemetryConfig,
    *,
    util_avg: float | None = None,
    util_max: float | None = None,
    util_samples: int = 0,
    fb_used: float | None = None,
    fb_used_max: float | None = None,
    fb_free: float | None = None,
    newest_sample: datetime | None = None,
) -> GpuTelemetry:
    """One model row from raw (exporter-unit) aggregates: applies each metric's `scale`."""
    return GpuTelemetry(
        node=identity.node,
        uuid=identity.uuid,
        gpu_index=identity.gpu_index,
        model_name=identity.model_name,
        mig_profile=identity.mig_profile,
        mig_instance=identity.mig_instance,
        pod_namespace=identity.pod_namespace,
        pod_name=identity.pod_name,
        util_avg_percent=_scaled(util_avg, cfg.utilization.scale),
        util_max_percent=_scaled(util_max, cfg.utilization.scale),
        util_samples=util_samples,
        fb_used_mib=_scaled(fb_used, cfg.fb_used.scale),
        fb_used_max_mib=_scaled(fb_used_max, cfg.fb_used.scale),
        fb_free_mib=_scaled(fb_free, cfg.fb_free.scale),
        newest_sample=newest_sample,
    )


# --------------------------------------------------------------------------- presets

_MIB = 1024 * 1024

# What each `telemetry.preset` stands for: TelemetryConfig fields, each used only where the policy does not
# set that field itself. Label names not listed keep LabelMapping's defaults.
PRESETS: Mapping[TelemetryPreset, Mapping[str, MetricConfig | LabelMapping]] = {
    # dcgm-exporter >= 4.6 names the node `hostname`; a scrape config may relabel it to kubernetes_node/node.
    "dcgm-exporter": {"labels": LabelMapping(node=("hostname", "kubernetes_node", "node"))},
    # dcgm-exporter < 4.6: `Hostname` (the node name only with hostNetwork, else the exporter pod's name).
    "dcgm-exporter-legacy": {"labels": LabelMapping(node=("Hostname", "kubernetes_node", "node"))},
    # A ServiceMonitor without honorLabels: the exporter's pod / namespace arrive as exported_pod /
    # exported_namespace, and `pod` / `namespace` name the exporter itself, so they are never read.
    "dcgm-exporter-exported": {
        "labels": LabelMapping(pod=("exported_pod",), namespace=("exported_namespace",)),
    },
    # Triton / NIM style `nv_gpu_*` series: utilisation as a 0-1 ratio, memory in bytes, the GPU in
    # `gpu_uuid`; the node comes from scrape relabelling and the pod is the scraped pod itself. There is no
    # free-memory series, so fb_free keeps the DCGM name (read only where a dcgm-exporter runs too).
    "nv-gpu": {
        "utilization": MetricConfig(name="nv_gpu_utilization", scale=100.0),
        "fb_used": MetricConfig(name="nv_gpu_memory_used_bytes", scale=1 / _MIB),
        "labels": LabelMapping(
            node=("kubernetes_node", "node", "hostname", "Hostname"),
            uuid=("gpu_uuid", "UUID", "uuid"),
            pod=("pod",),
            namespace=("namespace",),
            gpu_index=("gpu",),
        ),
    },
}


def resolve_preset(cfg: TelemetryConfig) -> TelemetryConfig:
    """`cfg` with its preset's metric and label mapping in the fields the policy did not set.

    A preset applies only when the policy names one (`telemetry.preset`); without it the built-in defaults
    stay, which accept every dcgm-exporter flavour (`Hostname` or `hostname`, `exported_pod` or `pod`).
    Fields the policy sets itself always win. Idempotent.
    """
    if "preset" not in cfg.model_fields_set:
        return cfg
    update = {name: value for name, value in PRESETS[cfg.preset].items() if name not in cfg.model_fields_set}
    return cfg.model_copy(update=update) if update else cfg


# --------------------------------------------------------------------------- aggregation

_Role = Literal["util", "fb_used", "fb_free"]


@dataclass
class _Points:
    """Samples of one role in one group, as (timestamp ms, value) sorted by time."""

    times: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def extend(self, points: Iterable[tuple[int, float]]) -> None:
        merged = sorted([*zip(self.times, self.values, strict=True), *points])
        self.times = [t for t, _ in merged]
        self.values = [v for _, v in merged]

    def between(self, lo: int, hi: int) -> tuple[list[int], list[float]]:
        start, end = bisect_left(self.times, lo), bisect_right(self.times, hi)
        return self.times[start:end], self.values[start:end]

    def instant(self, lo: int, hi: int) -> tuple[int, float] | None:
        """Newest sample in [lo, hi] (ties between series: the largest value)."""
        end = bisect_right(self.times, hi)
        if end == 0 or self.times[end - 1] < lo:
            return None
        newest = self.times[end - 1]
        start = bisect_left(self.times, newest, 0, end)
        return newest, max(self.values[start:end])


@dataclass
class _Group:
    identity: SeriesIdentity
    points: dict[_Role, _Points] = field(default_factory=dict)


def seconds_to_ms(seconds: float) -> int:
    return round(seconds * 1000)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_ms(moment: datetime) -> int:
    if moment.tzinfo is None:
        raise ValueError(f"now must carry a timezone, got {moment.isoformat()}")
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def datetime_from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _format_labels(labels: Mapping[str, str], limit: int = 240) -> str:
    text = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    return text if len(text) <= limit else text[: limit - 4] + "...}"


def _roles(cfg: TelemetryConfig) -> dict[str, list[_Role]]:
    roles: dict[str, list[_Role]] = defaultdict(list)
    roles[cfg.utilization.name].append("util")
    roles[cfg.fb_used.name].append("fb_used")
    roles[cfg.fb_free.name].append("fb_free")
    return dict(roles)


def telemetry_metrics(cfg: TelemetryConfig) -> tuple[str, ...]:
    """The metric names the policy reads (utilisation, framebuffer used, framebuffer free)."""
    return tuple(_roles(resolve_preset(cfg)))


def _window_row(group: _Group, cfg: TelemetryConfig, lo: int, now: int) -> GpuTelemetry | None:
    lookback = now - LOOKBACK_SECONDS * 1000
    newest: list[int] = []
    util_avg = util_max = fb_used = fb_used_max = fb_free = None
    util_count = 0
    if (util := group.points.get("util")) is not None:
        times, values = util.between(lo, now)
        if values:
            util_avg, util_max, util_count = math.fsum(values) / len(values), max(values), len(values)
            newest.append(times[-1])
    if (used := group.points.get("fb_used")) is not None:
        times, values = used.between(lo, now)
        if values:
            fb_used_max = max(values)
            newest.append(times[-1])
        if (last := used.instant(lookback, now)) is not None:
            newest.append(last[0])
            fb_used = last[1]
    if (free := group.points.get("fb_free")) is not None:
        times, _ = free.between(lo, now)
        newest.extend(times[-1:])
        if (last := free.instant(lookback, now)) is not None:
            newest.append(last[0])
            fb_free = last[1]
    if not newest:
        return None
    return to_gpu_telemetry(
        group.identity,
        cfg,
        util_avg=util_avg,
        util_max=util_max,
        util_samples=util_count,
        fb_used=fb_used,
        fb_used_max=fb_used_max,
        fb_free=fb_free,
        newest_sample=datetime_from_ms(max(newest)),
    )


def aggregate(
    series: Iterable[Series],
    cfg: TelemetryConfig,
    windows: Iterable[int],
    now: datetime,
    pods: Mapping[tuple[str, str], Pod] | None = None,
) -> tuple[Telemetry, tuple[Finding, ...]]:
    """Per window, one GpuTelemetry per (node, GPU UUID, MIG instance, pod) group, evaluated at `now`.

    Utilisation: avg / max / count over the samples in `[now - window, now]` (both ends inclusive, as
    Prometheus 2.x range selectors). Framebuffer used / free: the newest sample in `[now - 5m, now]`
    (instant-vector lookback); framebuffer used max over the window. Samples without a timestamp count as
    taken at `now`; samples after `now` are ignored. The same series from several sources is merged (one
    value per timestamp, the last read wins). Each metric's `scale` is applied.

    Findings: `bad-telemetry` once per series that had NaN, infinite, negative or DCGM-blank samples
    (they are dropped); `unusable-telemetry` once per metric and missing label for series without a node
    or GPU UUID. A pod label that names no GPU-requesting pod of `pods` is read as no pod.
    """
    cfg = resolve_preset(cfg)
    roles = _roles(cfg)
    now_ms = epoch_ms(now)
    merged: dict[tuple[str, tuple[tuple[str, str], ...]], dict[int, float]] = {}
    # Where each series was first read. Not the Series itself: a caller handing series over one at a
    # time lets each one's samples go once merged.
    first_source: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
    for one in series:
        if one.metric not in roles:
            continue
        key = (one.metric, tuple(sorted(one.labels.items())))
        points = merged.setdefault(key, {})
        first_source.setdefault(key, one.source)
        for sample in one.samples:
            points[now_ms if sample.timestamp is None else seconds_to_ms(sample.timestamp)] = sample.value

    metric_names = ", ".join(roles)
    if not merged:
        return Telemetry(available=False, problem=f"no DCGM series of {metric_names}"), ()

    findings: list[Finding] = []
    unusable: dict[tuple[str, str], list[tuple[dict[str, str], str]]] = defaultdict(list)
    groups: dict[GroupKey, _Group] = {}
    identified = 0
    for key in list(merged):
        points = merged.pop(key)  # each series's points go once grouped
        source = first_source[key]
        metric, labels = key[0], dict(key[1])
        identity = identify(labels, cfg.labels)
        if identity is None:
            missing = "node" if _first_non_empty(labels, cfg.labels.node) is None else "uuid"
            unusable[(metric, missing)].append((labels, source))
            continue
        identified += 1
        identity = attribute(identity, pods)
        valid = {t: v for t, v in points.items() if is_valid_value(v)}
        if len(valid) < len(points):
            bad = [v for v in points.values() if not is_valid_value(v)]
            findings.append(
                bad_telemetry_finding(
                    identity,
                    f"{metric}{_format_labels(labels)} from {source or 'unknown source'}: "
                    f"dropped {len(bad)} of {len(points)} samples that are NaN, infinite, negative or "
                    f"a DCGM blank value (first: {bad[0]!r})",
                )
            )
        good = [(t, v) for t, v in valid.items() if t <= now_ms]
        if not good:
            continue
        gkey = group_key(identity)
        group = groups.get(gkey)
        if group is None:
            group = groups[gkey] = _Group(identity)
        else:
            group.identity = _fill(group.identity, identity)
        for role in roles[metric]:
            group.points.setdefault(role, _Points()).extend(good)

    for (metric, missing), items in sorted(unusable.items()):
        tried = ", ".join(cfg.labels.node if missing == "node" else cfg.labels.uuid)
        example_labels, example_source = items[0]
        findings.append(
            Finding(
                kind="unusable-telemetry",
                detail=(
                    f"{len(items)} series of {metric} have no {'node' if missing == 'node' else 'GPU UUID'} "
                    f"label (tried {tried}; set telemetry.labels.{missing}) and are ignored, e.g. "
                    f"{_format_labels(example_labels)} from {example_source or 'unknown source'}"
                ),
            )
        )

    if not identified:
        problem = (
            f"no DCGM series of {metric_names} carries both a node and a GPU UUID label "
            f"(tried node labels {', '.join(cfg.labels.node)}; UUID labels {', '.join(cfg.labels.uuid)})"
        )
        return Telemetry(available=False, problem=problem), tuple(findings)

    ordered = sorted(groups.items(), key=lambda item: tuple(part or "" for part in item[0]))
    result: dict[int, TelemetryWindow] = {}
    for window in sorted(set(windows)):
        lo = now_ms - window * 1000
        rows = [row for _, group in ordered if (row := _window_row(group, cfg, lo, now_ms)) is not None]
        result[window] = TelemetryWindow(window_seconds=window, gpus=tuple(rows))
    return Telemetry(available=True, windows=result), tuple(findings)


def _fill(current: SeriesIdentity, other: SeriesIdentity) -> SeriesIdentity:
    """Complete descriptive fields (index, model, MIG profile) one series of a group may lack."""
    filled = (
        current.gpu_index or other.gpu_index,
        current.model_name or other.model_name,
        current.mig_profile or other.mig_profile,
    )
    if filled == (current.gpu_index, current.model_name, current.mig_profile):
        return current  # the usual case: nothing to complete, and `replace` is slow
    return replace(current, gpu_index=filled[0], model_name=filled[1], mig_profile=filled[2])


fill_identity = _fill
"""Merge the descriptive fields of two series of one group (the live source groups as `aggregate` does)."""


def unknown_node_findings(telemetry: Telemetry, node_names: Collection[str]) -> tuple[Finding, ...]:
    """One `telemetry-unknown-node` finding per node label value that names no node of the cluster.

    Usually a label mapping problem: before exporter 4.6 `Hostname` is the exporter container's host
    name, which is the node name only with hostNetwork; relabel to `node` / `kubernetes_node` instead.
    """
    seen: dict[str, str] = {}
    for window in telemetry.windows.values():
        for gpu in window.gpus:
            if gpu.node not in node_names:
                seen.setdefault(gpu.node, gpu.uuid)
    return tuple(
        Finding(
            kind="telemetry-unknown-node",
            node=name,
            gpu=uuid,
            detail=(
                f"DCGM series name node {name!r}, which is not a node of the cluster; check "
                "telemetry.labels.node (the exporter's Hostname label is the node name only with hostNetwork)"
            ),
        )
        for name, uuid in sorted(seen.items())
    )
