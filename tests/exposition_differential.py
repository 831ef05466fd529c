"""The exposition reader against prometheus_client's parsers: the comparisons the tests make.

`telemetry.exposition` reads plain documents itself (`exposition_documents`) and hands the others to
prometheus_client. This module holds what tests/test_exposition_reader.py and the suite-wide check of
tests/conftest.py compare:

- `outcome`: what `parse_exposition_lines` gives for a text, with the fast reading (`fast=True`, the
  product) or every document through prometheus_client (`fast=False`, the reference): the series in
  order, each sample's value and timestamp by `repr` (so NaN, -0.0 and the last bit count), or the
  error's message and line;
- `library_outcome`: prometheus_client's own parser on the whole text, its samples grouped the same way,
  for a direct comparison where our reader accepts;
- `check_document` / `checking_documents`: for every document the fast reading accepted, the library's
  reading of the same document must give the same families and samples, or refuse it where the fast
  reading's commit refuses it too. tests/conftest.py wraps `telemetry.exposition.documents` with it for
  the whole suite, so every exposition any test reads is compared; `unchecked()` turns it off.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, cast

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as text_families

from rebalancer.telemetry import exposition
from rebalancer.telemetry.exposition import DOCUMENT_SAMPLES, ExpositionError, Series, parse_exposition_lines
from rebalancer.telemetry.exposition_documents import Document, SeriesKey
from rebalancer.telemetry.series import Sample

NormalSeries = tuple[str, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]
Outcome = tuple[str, object]


def lines_of(text: str) -> list[str]:
    """The lines of `text` split at `\\n` only, with their newlines (as a file or `parse_exposition`
    gives them: no other character ends a line)."""
    return list(io.StringIO(text, newline="\n"))


def normal(series: Iterable[Series]) -> list[NormalSeries]:
    return [
        (
            one.metric,
            tuple(sorted(one.labels.items())),
            tuple((repr(sample.value), repr(sample.timestamp)) for sample in one.samples),
        )
        for one in series
    ]


def outcome(
    text: str,
    *,
    openmetrics: bool,
    fast: bool,
    metrics: Collection[str] | None = None,
    document_samples: int = DOCUMENT_SAMPLES,
) -> Outcome:
    try:
        series = parse_exposition_lines(
            lines_of(text),
            source="x.om",
            openmetrics=openmetrics,
            metrics=metrics,
            document_samples=document_samples,
            fast=fast,
        )
    except ExpositionError as exc:
        return "error", (str(exc), exc.line)
    return "series", normal(series)


def difference(
    text: str,
    *,
    openmetrics: bool,
    metrics: Collection[str] | None = None,
    document_samples: int = DOCUMENT_SAMPLES,
) -> str | None:
    """How the fast reading of `text` differs from prometheus_client's (None: it does not). Where ours
    accepts and the text is one document, prometheus_client's parser on the whole text must also give
    the same samples."""
    kwargs: dict[str, Any] = {
        "openmetrics": openmetrics,
        "metrics": metrics,
        "document_samples": document_samples,
    }
    fast = outcome(text, fast=True, **kwargs)
    reference = outcome(text, fast=False, **kwargs)
    if fast != reference:
        return f"fast reading: {fast!r}\nprometheus_client: {reference!r}"
    if fast[0] == "series" and len(lines_of(text)) <= document_samples:
        direct = library_outcome(text, openmetrics=openmetrics, metrics=metrics)
        if direct != fast:
            return f"our reading: {fast!r}\nprometheus_client on the whole text: {direct!r}"
    return None


def library_outcome(text: str, *, openmetrics: bool, metrics: Collection[str] | None = None) -> Outcome:
    """prometheus_client's parser on the whole text: its samples by series, in order of first appearance,
    timestamps as floats (seconds), values as floats."""
    parse = openmetrics_families if openmetrics else text_families
    collected: dict[SeriesKey, list[Sample]] = {}
    try:
        for family in parse(text):
            for sample in family.samples:
                if metrics is not None and sample.name not in metrics:
                    continue
                stamp = None if sample.timestamp is None else float(sample.timestamp)
                key = (sample.name, tuple(sorted(sample.labels.items())))
                collected.setdefault(key, []).append(Sample(float(sample.value), stamp))
    except Exception as exc:  # the library raises ValueError and a few others
        return "error", repr(exc)
    return "series", normal(Series(name, dict(labels), tuple(s)) for (name, labels), s in collected.items())


# --------------------------------------------------------------------------- every document of the suite

_checking = [True]  # the innermost `unchecked()` last
_checked: set[int] = set()


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Documents read inside are not compared (for tests that break the reader on purpose)."""
    _checking.append(False)
    try:
        yield
    finally:
        _checking.pop()


def check_document(
    document: Document, *, openmetrics: bool, wanted: Collection[str] | None, source: str, force: bool = False
) -> None:
    """AssertionError unless the fast reading of `document` is prometheus_client's (read alone, with no
    earlier document): the same families and samples, or a refusal by both. Each document once a session,
    none inside `unchecked()`, unless `force`."""
    read = document.read
    if read is None or not (force or _checking[-1]):
        return
    fingerprint = hash(
        (tuple(document.lines), openmetrics, frozenset(wanted or ()), wanted is None, document.continues)
    )
    if fingerprint in _checked and not force:
        return
    fast_samples: dict[SeriesKey, list[Sample]] = {}
    fast_families: set[str] = set()
    accepted = exposition._commit(read, document, fast_samples, fast_families, openmetrics=openmetrics)
    library_samples: dict[SeriesKey, list[Sample]] = {}
    library_families: set[str] = set()
    wanted_set = frozenset(wanted) if wanted is not None else None
    try:
        exposition._parse_document(
            document, library_samples, library_families, wanted_set, source=source, openmetrics=openmetrics
        )
        refused: str | None = None
    except ExpositionError as exc:
        refused = str(exc)
    shown = "".join(document.lines[:40])
    if refused is not None:
        assert not accepted, f"the fast reading accepts what prometheus_client refuses ({refused}):\n{shown}"
    else:
        assert accepted, f"the fast reading refuses what prometheus_client accepts:\n{shown}"
        fast = normal(Series(n, dict(labels), tuple(s)) for (n, labels), s in fast_samples.items())
        library = normal(Series(n, dict(labels), tuple(s)) for (n, labels), s in library_samples.items())
        assert fast == library, f"the fast reading differs from prometheus_client's:\n{shown}"
        assert fast_families == library_families, f"families {fast_families} != {library_families}:\n{shown}"
    _checked.add(fingerprint)


def checking_documents(documents: Callable[..., Iterator[Document]]) -> Callable[..., Iterator[Document]]:
    """`telemetry.exposition_documents.documents`, each document it yields checked first."""

    def checked(lines: Iterable[str], **kwargs: Any) -> Iterator[Document]:
        for document in documents(lines, **kwargs):
            check_document(
                document,
                openmetrics=cast(bool, kwargs["openmetrics"]),
                wanted=kwargs.get("wanted"),
                source=cast(str, kwargs["source"]),
            )
            yield document

    return checked
