"""The exposition reader against prometheus_client's parsers (differential).

`telemetry.exposition` reads the plain documents of an exposition itself and hands every other one to
prometheus_client. Here, for every exposition file of the tests (tests/fixtures, the fuzz corpus), the
real samples in ../shared/data/dcgm-samples, the demo cluster's history, what tools/clustergen writes for
bench/scale_population.py, the invalid expositions of tests/test_dcgm.py and fuzzed ones
(tests/fuzzing/exposition_texts.py: drawn from scratch with tricky escapes, label orders, numbers and
timestamps, and the base snapshot's expositions mutated), in both formats, cut into documents of
several sizes and with and without a metric filter: the fast reading gives what prometheus_client gives
(the same series, values by `repr` so NaN and -0.0 count, the same timestamps) or the same error at the
same line; and where it accepts a text, prometheus_client's parser on the whole text gives the same
samples. tests/conftest.py also compares every document any other test reads.

Then what the fast reading is for: it does read the plain expositions (or the comparisons would be
vacuous), its results on hand-checked lines, and the comparison failing when the reader is broken.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rebalancer.telemetry import exposition_lines
from rebalancer.telemetry.exposition import (
    DOCUMENT_SAMPLES,
    ExpositionError,
    parse_exposition,
    render_openmetrics,
)
from rebalancer.telemetry.exposition_documents import documents
from tests import exposition_differential as differential
from tests import fuzzing
from tests.exposition_differential import difference, lines_of, outcome, unchecked
from tests.test_dcgm import BAD_EXPOSITIONS

ROOT = Path(__file__).resolve().parent.parent
SHARED_SAMPLES = ROOT.parent / "shared" / "data" / "dcgm-samples"
DCGM_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")


def _exposition_files() -> list[Path]:
    found = [
        *sorted((ROOT / "tests" / "fixtures").rglob("*.prom")),
        *sorted((ROOT / "tests" / "fixtures").rglob("*.om")),
        *sorted((ROOT / "tests" / "fuzz_corpus").rglob("*.prom")),
        *sorted((ROOT / "tests" / "fuzz_corpus").rglob("*.om")),
        ROOT / "examples" / "demo-cluster" / "dcgm.om",
    ]
    if SHARED_SAMPLES.is_dir():  # the real exporter output of the shared data (../shared/data/README.md)
        found += [p for p in sorted(SHARED_SAMPLES.glob("*.txt")) if not p.name.endswith(".yaml.txt")]
    return found


FILES = _exposition_files()


def _is_openmetrics(path: Path, text: str) -> bool:
    return path.suffix == ".om" or any(line.strip() == "# EOF" for line in text.splitlines())


def _check_every_way(text: str, openmetrics: bool, *, sizes: tuple[int, ...]) -> None:
    """The fast reading equals prometheus_client's: in the text's own format cut into documents of each
    size, with and without the DCGM metric filter, and in the other format."""
    ways = [(openmetrics, size, metrics) for size in sizes for metrics in (None, DCGM_METRICS)]
    for fmt, size, metrics in [*ways, (not openmetrics, sizes[0], None)]:
        found = difference(text, openmetrics=fmt, metrics=metrics, document_samples=size)
        assert found is None, f"openmetrics={fmt}, documents of {size}, metrics={metrics}:\n{found}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_every_exposition_file_reads_as_prometheus_client_reads_it(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    sizes = (1, 7, DOCUMENT_SAMPLES) if len(text) < 1_000_000 else (DOCUMENT_SAMPLES,)
    _check_every_way(text, _is_openmetrics(path, text), sizes=sizes)


def test_the_shared_dcgm_samples_are_among_them() -> None:
    # The real exporter output must not silently drop out of the parameters above.
    assert SHARED_SAMPLES.is_dir(), f"{SHARED_SAMPLES} is missing (see ../shared/data/README.md)"
    assert sum(1 for p in FILES if p.is_relative_to(SHARED_SAMPLES)) == 3


@pytest.fixture(scope="module")
def clustergen_history(scale_population: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("scale") / "scale-30"
    scale_population.generate(directory, 30, 7, 180, 1800)
    return (directory / "dcgm.om").read_text(encoding="utf-8")


def test_clustergen_history_reads_as_prometheus_client_reads_it(clustergen_history: str) -> None:
    _check_every_way(clustergen_history, True, sizes=(500, DOCUMENT_SAMPLES))


def test_written_snapshots_read_as_prometheus_client_reads_them(clustergen_history: str) -> None:
    # What `rebalancer snapshot` writes: fractional timestamps, values as Python writes floats.
    series = parse_exposition(clustergen_history, source="x")
    written = render_openmetrics(series)
    assert "." in written.splitlines()[2].rpartition(" ")[2]  # a fractional timestamp
    _check_every_way(written, True, sizes=(DOCUMENT_SAMPLES,))


@pytest.mark.parametrize(
    ("text", "openmetrics"), [case[1:3] for case in BAD_EXPOSITIONS], ids=[c[0] for c in BAD_EXPOSITIONS]
)
def test_the_invalid_expositions_of_the_tests_are_refused_alike(text: str, openmetrics: bool) -> None:
    _check_every_way(text, openmetrics, sizes=(1, DOCUMENT_SAMPLES))


# --------------------------------------------------------------------------- fuzzed

FUZZ = settings(
    max_examples=400,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _check_drawn(data: st.DataObject, text: str, openmetrics: bool) -> None:
    fmt = data.draw(st.sampled_from((openmetrics, openmetrics, not openmetrics)), label="openmetrics")
    size = data.draw(st.sampled_from((1, 2, 3, DOCUMENT_SAMPLES)), label="document samples")
    metrics = data.draw(st.sampled_from((None, None, DCGM_METRICS, ("a", "a_total"))), label="metrics")
    found = difference(text, openmetrics=fmt, metrics=metrics, document_samples=size)
    assert found is None, f"{text!r}\nopenmetrics={fmt}, documents of {size}, metrics={metrics}:\n{found}"


@FUZZ
@given(data=st.data())
def test_drawn_expositions_read_as_prometheus_client_reads_them(data: st.DataObject) -> None:
    text, openmetrics = data.draw(fuzzing.exposition_texts(), label="exposition")
    _check_drawn(data, text, openmetrics)


@FUZZ
@given(data=st.data())
def test_mutated_expositions_read_as_prometheus_client_reads_them(data: st.DataObject) -> None:
    text, openmetrics = data.draw(fuzzing.mutated_expositions(), label="exposition")
    _check_drawn(data, text, openmetrics)


def test_drawn_expositions_are_often_read_fast_and_often_not() -> None:
    # Both paths of the reader are exercised by the drawn expositions, in both formats.
    read = {True: 0, False: 0}
    given_up = {True: 0, False: 0}

    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(drawn=fuzzing.exposition_texts())
    def count(drawn: tuple[str, bool]) -> None:
        text, openmetrics = drawn
        with contextlib.suppress(ExpositionError):  # refused while cut: the documents before it count
            for document in documents(
                lines_of(text), openmetrics=openmetrics, samples=DOCUMENT_SAMPLES, source="x"
            ):
                (read if document.read is not None else given_up)[openmetrics] += 1

    count()
    assert min(read.values()) >= 30 and min(given_up.values()) >= 30, (read, given_up)


# --------------------------------------------------------------------------- the fast reading itself


def _read_documents(text: str, openmetrics: bool = True, samples: int = DOCUMENT_SAMPLES) -> list[bool]:
    return [
        document.read is not None
        for document in documents(lines_of(text), openmetrics=openmetrics, samples=samples, source="x")
    ]


def test_the_plain_histories_are_read_fast(clustergen_history: str) -> None:
    demo = (ROOT / "examples" / "demo-cluster" / "dcgm.om").read_text(encoding="utf-8")
    assert all(_read_documents(demo, samples=500))
    assert all(_read_documents(clustergen_history, samples=500))
    assert all(_read_documents(render_openmetrics(parse_exposition(clustergen_history, source="x"))))
    tesla = (ROOT / "tests" / "fixtures" / "snapshots" / "dcgm-samples" / "tesla-t4.prom").read_text()
    assert _read_documents(tesla, openmetrics=False) == [True]


def _samples(
    text: str, *, openmetrics: bool = True
) -> list[tuple[str, dict[str, str], list[tuple[str, str]]]]:
    found = outcome(text, openmetrics=openmetrics, fast=True)
    assert found[0] == "series", found
    assert _read_documents(text, openmetrics) == [True]  # these are read by the fast reading
    return [(name, dict(labels), list(samples)) for name, labels, samples in found[1]]  # type: ignore[attr-defined]


def test_escapes_are_the_three_the_formats_define() -> None:
    # \\ is a backslash, \" a quote, \n a newline; any other backslash pair stays as written.
    text = 'g{a="x\\\\y",b="say \\"hi\\"",c="two\\nlines",d="\\\\x\\t"} 1 100\n# EOF\n'
    ((name, labels, _),) = _samples(text)
    assert (name, labels) == ("g", {"a": "x\\y", "b": 'say "hi"', "c": "two\nlines", "d": "\\x\\t"})


def test_one_series_in_two_label_orders_is_one_series() -> None:
    text = 'g{a="1",b="2"} 1 1795953135000\ng{b="2",a="1"} 2 1795953195000\n'
    assert _samples(text, openmetrics=False) == [
        ("g", {"a": "1", "b": "2"}, [("1.0", "1795953135.0"), ("2.0", "1795953195.0")])
    ]


def test_values_and_timestamps_as_the_library_reads_them() -> None:
    text = (
        "# TYPE g gauge\n"
        'g{v="-0"} -0 1795953135\n'  # int("-0") is 0: the library gives 0.0, not -0.0
        'g{v="-0.0"} -0.0 1795953135.5\n'
        'g{v="nan"} NaN 1795953135.000000001\n'  # nanoseconds, as the library's Timestamp keeps them
        'g{v="inf"} +Inf 1795953135.1234567891\n'  # digits beyond the ninth are dropped
        "# EOF\n"
    )
    assert [(labels["v"], samples) for _, labels, samples in _samples(text)] == [
        ("-0", [("0.0", "1795953135.0")]),
        ("-0.0", [("-0.0", "1795953135.5")]),
        ("nan", [("nan", repr(1795953135.0 + 1 / 1e9))]),
        ("inf", [("inf", repr(1795953135.0 + 123456789 / 1e9))]),
    ]


def test_a_text_format_counter_gets_total_as_the_library_names_it() -> None:
    text = '# TYPE c counter\nc{gpu="0"} 5 1795953135000\n# TYPE d_total counter\nd_total 1 1795953135000\n'
    assert [name for name, _, _ in _samples(text, openmetrics=False)] == ["c_total", "d_total"]


def test_a_line_the_fast_reading_does_not_know_leaves_its_document_to_the_library() -> None:
    plain = "".join(f'g{{gpu="{i}"}} {i} {100 + i}\n' for i in range(6))
    odd = 'g{gpu="x"} 1 100 # {trace_id="a"} 1\n'  # an exemplar on a gauge: the library refuses it
    text = "# TYPE g gauge\n" + plain + odd + plain.replace("gpu", "card") + "# EOF\n"
    # Documents of three series: g 0-2, g 3-5, then the odd line with card 0-1, card 2-4, card 5.
    assert _read_documents(text, samples=3) == [True, True, False, True, True]
    assert outcome(text, openmetrics=True, fast=True, document_samples=3)[0] == "error"


# --------------------------------------------------------------------------- the comparison can fail


@pytest.fixture
def broken_newline_escape(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The fast reading with `\\n` read as `n`, a plausible slip."""
    monkeypatch.setitem(exposition_lines._ESCAPES, "\\n", "n")
    with unchecked():
        yield


@pytest.mark.usefixtures("broken_newline_escape")
def test_the_comparison_catches_a_broken_escape() -> None:
    text = 'g{a="two\\nlines"} 1 100\n# EOF\n'
    found = difference(text, openmetrics=True)
    assert found is not None and "twonlines" in found


def test_the_suite_wide_check_is_on() -> None:
    before = len(differential._checked)
    parse_exposition('g{a="checked by the suite"} 1 100\n# EOF\n', source="x")
    assert len(differential._checked) == before + 1


@pytest.mark.usefixtures("broken_newline_escape")
def test_the_suite_wide_check_catches_a_broken_escape() -> None:
    text = 'g{a="two\\nlines",b="suite"} 1 100\n# EOF\n'
    document = next(documents(lines_of(text), openmetrics=True, samples=DOCUMENT_SAMPLES, source="x"))
    with pytest.raises(AssertionError, match="differs from prometheus_client"):
        differential.check_document(document, openmetrics=True, wanted=None, source="x", force=True)
