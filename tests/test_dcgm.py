"""DCGM telemetry: parsing real expositions, label identity, PromQL-equivalent window aggregates."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.model import GpuTelemetry, Telemetry
from rebalancer.policy import LabelMapping, MetricConfig, TelemetryConfig
from rebalancer.telemetry.exposition import (
    ExpositionError,
    Sample,
    Series,
    parse_exposition,
    parse_exposition_lines,
)
from rebalancer.telemetry.identity import (
    PodsOfNamespaces,
    SeriesIdentity,
    attribute,
    group_key,
    identify,
    is_valid_value,
)
from rebalancer.telemetry.windows import LOOKBACK_SECONDS, aggregate, unknown_node_findings
from rebalancer.telemetry.windows import row as to_gpu_telemetry
from tests.builders import NOW, pod

SAMPLES = Path(__file__).parent / "fixtures" / "snapshots" / "dcgm-samples"
MAPPING = LabelMapping()
CFG = TelemetryConfig()
T0 = NOW.timestamp()  # 2026-11-29T12:00:00Z in seconds
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def read(name: str) -> str:
    return (SAMPLES / name).read_text(encoding="utf-8")


def series_named(series: list[Series], metric: str) -> list[Series]:
    return [s for s in series if s.metric == metric]


def om(*lines: str) -> str:
    return "\n".join(lines) + "\n# EOF\n"


def only_row(telemetry: Telemetry, window: int) -> GpuTelemetry:
    found = telemetry.window(window)
    assert found is not None
    (row,) = found.gpus
    return row


# --------------------------------------------------------------------------- documents


def lines_of(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def cut_parse(text: str, size: int, *, openmetrics: bool = True) -> list[Series]:
    return parse_exposition_lines(lines_of(text), source="x", openmetrics=openmetrics, document_samples=size)


@st.composite
def expositions(draw: st.DrawFn) -> tuple[str, bool]:
    """Gauge, counter and untyped families of several series with timestamped samples, in either format."""
    openmetrics = draw(st.booleans())
    out: list[str] = []
    for f in range(draw(st.integers(1, 4))):
        typ = draw(st.sampled_from(("gauge", "gauge", "counter", None)))
        name = f"m{f}"
        if typ is not None:
            out.append(f"# HELP {name} metric {f}")
            out.append(f"# TYPE {name} {typ}")
        sample = f"{name}_total" if typ == "counter" else name
        for g in range(draw(st.integers(1, 4))):
            labels = (
                f'{{gpu="{g}",UUID="GPU-{f}-{g}",note="a b}}c"}}' if draw(st.booleans()) else f'{{gpu="{g}"}}'
            )
            for t in range(draw(st.integers(1, 4))):
                stamp = 1_764_417_600 + 60 * t
                out.append(f"{sample}{labels} {t * 1.5 + g} {stamp if openmetrics else stamp * 1000}")
    text = "\n".join(out) + ("\n# EOF\n" if openmetrics else "\n")
    return text, openmetrics


@settings(max_examples=150, deadline=None)
@given(exposition=expositions(), size=st.integers(1, 6))
def test_cutting_an_exposition_into_documents_changes_nothing(
    exposition: tuple[str, bool], size: int
) -> None:
    text, openmetrics = exposition
    whole = parse_exposition(text, source="x", fmt="openmetrics" if openmetrics else "prometheus")
    assert cut_parse(text, size, openmetrics=openmetrics) == whole


def test_documents_are_cut_only_between_series_of_a_gauge() -> None:
    text = om(
        "# HELP g gauge",
        "# TYPE g gauge",
        'g{gpu="0"} 1 100',
        'g{gpu="0"} 2 101',
        'g{gpu="1"} 3 100',
        "# TYPE c counter",
        'c_total{gpu="0"} 1 100',
        'c_total{gpu="1"} 2 100',
    )
    cut = cut_parse(text, 1)
    assert [(s.metric, s.labels["gpu"], len(s.samples)) for s in cut] == [
        ("g", "0", 2),
        ("g", "1", 1),
        ("c_total", "0", 1),
        ("c_total", "1", 1),
    ]
    # A series kept whole: the parser's own check on its timestamps still sees both samples.
    backwards = om("# TYPE g gauge", 'g{gpu="0"} 1 100', 'g{gpu="1"} 2 100', 'g{gpu="1"} 3 99')
    with pytest.raises(ExpositionError, match="Timestamps went backwards") as info:
        cut_parse(backwards, 1)
    assert info.value.line == 4


def test_errors_after_a_cut_name_the_line_of_the_input() -> None:
    text = om("# TYPE g gauge", *(f'g{{gpu="{i}"}} {i} 100' for i in range(6)), 'g{gpu="6} 1 100')
    with pytest.raises(ExpositionError) as info:
        cut_parse(text, 2)
    assert info.value.line == 8
    prom = "# TYPE g gauge\n" + "".join(f'g{{gpu="{i}"}} {i}\n' for i in range(6)) + 'g{gpu="6} 1\n'
    with pytest.raises(ExpositionError) as info:
        cut_parse(prom, 2, openmetrics=False)
    assert info.value.line == 8
    assert str(info.value).startswith("x:8: invalid Prometheus text format")


def test_a_family_seen_twice_is_refused_across_documents_too() -> None:
    text = om(
        "# TYPE g gauge",
        'g{gpu="0"} 1 100',
        'g{gpu="1"} 1 100',
        "# TYPE h gauge",
        "h 1 100",
        'g{gpu="2"} 1 100',
    )
    for size in (1, 2, 1000):
        with pytest.raises(ExpositionError, match="Clashing name: g"):
            cut_parse(text, size)


def test_an_interleaved_series_is_refused_across_documents_too() -> None:
    lines = ["# TYPE g gauge", 'g{gpu="0"} 1 100', 'g{gpu="1"} 1 100', 'g{gpu="2"} 1 100', 'g{gpu="0"} 2 101']
    for size in (1, 2, 1000):
        with pytest.raises(ExpositionError, match="Invalid metric grouping") as info:
            cut_parse(om(*lines), size)
        assert info.value.line == 5


def test_a_missing_eof_is_still_refused_when_cut() -> None:
    text = "# TYPE g gauge\n" + "".join(f'g{{gpu="{i}"}} {i} 100\n' for i in range(5))
    with pytest.raises(ExpositionError, match="Missing # EOF at end"):
        cut_parse(text, 2)


# --------------------------------------------------------------------------- parsing real samples


def test_parse_tesla_t4_sample() -> None:
    series = parse_exposition(read("tesla-t4.prom"), source="tesla-t4.prom")
    (util,) = series_named(series, "DCGM_FI_DEV_GPU_UTIL")
    assert util.samples == (Sample(0.0, None),)
    assert util.source == "tesla-t4.prom"
    assert util.labels["Hostname"] == "424773df46e0"
    assert util.labels["modelName"] == "Tesla T4"
    (free,) = series_named(series, "DCGM_FI_DEV_FB_FREE")
    assert free.samples[0].value == 15109
    # Dummy lines without labels parse too; they are unusable later, not a parse error.
    (gr,) = series_named(series, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    assert gr.labels == {}


def test_metric_filter_keeps_only_requested_names() -> None:
    series = parse_exposition(
        read("tesla-t4.prom"), source="t4", metrics={"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"}
    )
    assert sorted(s.metric for s in series) == ["DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"]


def test_parse_mig_sample_keeps_instance_series_apart() -> None:
    series = parse_exposition(read("mig-a100.prom"), source="mig")
    xid = series_named(series, "DCGM_FI_DEV_XID_ERRORS")
    assert len(xid) == 2
    identities = {identify(s.labels, MAPPING) for s in series_named(series, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")}
    assert identities == {
        SeriesIdentity(node="ub20-a100-k8s", uuid="GPU-34319582-d595-d1c7-d1d2-179bcfa61660", gpu_index="0"),
        SeriesIdentity(
            node="ub20-a100-k8s",
            uuid="GPU-34319582-d595-d1c7-d1d2-179bcfa61660",
            gpu_index="0",
            mig_profile="1g.5gb",
            mig_instance="13",
        ),
    }


def test_openmetrics_timestamps_are_seconds() -> None:
    text = om(
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n1",UUID="{UUID}"}} 10 1764417540.5',
        f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n1",UUID="{UUID}"}} 20 1764417600',
    )
    (util,) = parse_exposition(text, source="x.om")
    assert util.samples == (Sample(10.0, 1764417540.5), Sample(20.0, 1764417600.0))


def test_prometheus_text_timestamps_are_milliseconds() -> None:
    text = f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n1",UUID="{UUID}"}} 10 1764417540500\n'
    (util,) = parse_exposition(text, source="x.prom")
    assert util.samples == (Sample(10.0, 1764417540.5),)


def test_prometheus_text_timestamps_in_seconds_are_refused_with_a_hint() -> None:
    text = f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n1",UUID="{UUID}"}} 10 1764417540\n'
    with pytest.raises(ExpositionError, match="use OpenMetrics"):
        parse_exposition(text, source="x.prom")


def test_forced_openmetrics_needs_eof() -> None:
    with pytest.raises(ExpositionError) as info:
        parse_exposition("a 1 100\n", source="x.om", fmt="openmetrics")
    assert str(info.value) == "x.om: invalid OpenMetrics: Missing # EOF at end"


def test_invalid_text_names_the_line() -> None:
    text = '# TYPE a gauge\na 1\na{x="1} 2\n'
    with pytest.raises(ExpositionError) as info:
        parse_exposition(text, source="bad.prom")
    assert info.value.line == 3
    assert str(info.value).startswith("bad.prom:3: invalid Prometheus text format:")


def test_invalid_openmetrics_names_the_line() -> None:
    text = om("a 1 100", "a 2 99")
    with pytest.raises(ExpositionError) as info:
        parse_exposition(text, source="bad.om")
    assert info.value.line == 2
    assert "Timestamps went backwards" in str(info.value)


# (name, exposition, OpenMetrics?, the line at fault, a piece of the message)
BAD_EXPOSITIONS = [
    ("garbage", '# TYPE a gauge\na 1\ngarbage\na{x="2"} 2\n', False, 3, "garbage"),
    ("garbage-om", '# TYPE a gauge\na 1\ngarbage\na{x="2"} 2\n# EOF\n', True, 3, "garbage"),
    ("metadata-again", '# TYPE a gauge\na 1\n# TYPE a gauge\na{x="1"} 2\n# EOF\n', True, 3, "metadata"),
    ("metadata-after-samples", 'a 1\n# TYPE a gauge\na{x="2"} 2\n# EOF\n', True, 2, "metadata"),
    ("unknown-type", "# HELP a x\n# TYPE a gaugex\na 1\n", False, 2, "gaugex"),
    ("unknown-type-om", "# HELP a x\n# TYPE a gaugex\na 1\n# EOF\n", True, 2, "gaugex"),
    (
        "buckets-out-of-order",
        '# TYPE g gauge\ng 1\n# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 0\n'
        "h_count 1\nh_sum 1\n# EOF\n",
        True,
        3,
        "Bucket values out of order",
    ),
    ("same-series-twice", "# TYPE a gauge\na 1\na 2\n# EOF\n", True, 3, "given twice"),
    ("same-series-twice-text", '# TYPE a gauge\na{x="1"} 1\na{x="1"} 2\n', False, 3, "given twice"),
    (
        "same-timestamp-twice",
        "# TYPE a gauge\na 1 1764417540000\na 2 1764417540000\n",
        False,
        3,
        "given twice at the same timestamp",
    ),
    ("text-seconds", "# TYPE a gauge\na 1 1764417540000\nfoo 1 2\n", False, 3, "before 1973"),
    ("nan-timestamp", '# TYPE a gauge\na 1 NaN\na{x="2"} 2\n', False, 2, "timestamp"),
    ("inf-timestamp", "# TYPE a gauge\na 1 +Inf\n", False, 2, "timestamp"),
    (
        "om-milliseconds",
        '# TYPE a gauge\na 1 1764417540\na{x="2"} 2 1764417540000\n# EOF\n',
        True,
        3,
        "milliseconds",
    ),
    ("text-far-future", "# TYPE a gauge\na 1 99999999999999999\n", False, 2, "year"),
]


@pytest.mark.parametrize(
    ("text", "openmetrics", "line", "fragment"),
    [case[1:] for case in BAD_EXPOSITIONS],
    ids=[case[0] for case in BAD_EXPOSITIONS],
)
def test_an_invalid_exposition_names_the_line_at_fault(
    text: str, openmetrics: bool, line: int, fragment: str
) -> None:
    with pytest.raises(ExpositionError) as info:
        parse_exposition(text, source="x", fmt="openmetrics" if openmetrics else "prometheus")
    assert (info.value.line, str(info.value)) == (line, str(info.value))
    assert fragment in info.value.message


def test_openmetrics_timestamps_in_milliseconds_are_refused_with_a_hint() -> None:
    text = om("# TYPE a gauge", "a 1 1764417540000")
    with pytest.raises(ExpositionError) as info:
        parse_exposition(text, source="x.om")
    assert str(info.value) == (
        "x.om:2: a: timestamp 1764417540000 is in the year 57882 when read as seconds (OpenMetrics); "
        "write seconds, or use the Prometheus text format (milliseconds, no `# EOF`)"
    )


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (0.0, True),
        (100.0, True),
        (math.nan, False),
        (math.inf, False),
        (-1.0, False),
        (9223372036854775794.0, False),  # DCGM int64 "not supported", as in the exporter README
        (2147483632.0, False),  # DCGM int32 blank
        (140737488355328.0, False),  # DCGM fp64 blank
        (2147483648.0, True),
    ],
)
def test_is_valid_value(value: float, valid: bool) -> None:
    assert is_valid_value(value) is valid


# --------------------------------------------------------------------------- identity


def test_identity_hostname_before_and_after_exporter_4_6() -> None:
    (legacy,) = series_named(parse_exposition(read("tesla-t4.prom"), source="t4"), "DCGM_FI_DEV_GPU_UTIL")
    identity = identify(legacy.labels, MAPPING)
    assert identity == SeriesIdentity(
        node="424773df46e0",
        uuid="GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e",
        gpu_index="0",
        model_name="Tesla T4",
    )
    # exporter >= 4.6 spells it `hostname`; same series otherwise
    modern = {("hostname" if k == "Hostname" else k): v for k, v in legacy.labels.items()}
    assert identify(modern, MAPPING) == identity


def test_node_label_first_present_and_non_empty() -> None:
    labels = {"Hostname": "", "kubernetes_node": "gpu-a-1", "node": "other", "UUID": UUID}
    identity = identify(labels, MAPPING)
    assert identity is not None
    assert identity.node == "gpu-a-1"
    relabelled = identify(labels, LabelMapping(node=("node",)))
    assert relabelled is not None
    assert relabelled.node == "other"


def test_label_remap_sample_pod_labels() -> None:
    (util,) = parse_exposition(read("label-remap.prom"), source="remap")
    identity = identify(util.labels, MAPPING)
    assert identity is not None
    assert (identity.pod_namespace, identity.pod_name) == ("foo", "bar")


def test_empty_exported_pod_does_not_fall_through_to_the_exporter_pod() -> None:
    labels = {
        "Hostname": "gpu-a-1",
        "UUID": UUID,
        "exported_pod": "",
        "exported_namespace": "",
        "pod": "nvidia-dcgm-exporter-x7k2p",
        "namespace": "gpu-operator",
    }
    identity = identify(labels, MAPPING)
    assert identity is not None
    assert identity.pod_key is None
    labels.update(exported_pod="train-0", exported_namespace="ml")
    identity = identify(labels, MAPPING)
    assert identity is not None
    assert identity.pod_key == ("ml", "train-0")


def test_pod_needs_name_and_namespace() -> None:
    identity = identify({"Hostname": "n", "UUID": UUID, "pod": "train-0"}, MAPPING)
    assert identity is not None
    assert identity.pod_key is None


def test_series_without_node_or_uuid_is_unusable() -> None:
    # Straight from the exporter README: no node label at all (the exporter was run without one).
    series = parse_exposition(read("readme-kubernetes.prom"), source="readme")
    assert all(identify(s.labels, MAPPING) is None for s in series)
    assert identify({"Hostname": "n1", "gpu": "0"}, MAPPING) is None
    assert identify({"Hostname": "n1", "UUID": ""}, MAPPING) is None


def test_attribution_checks_pods_against_the_cluster() -> None:
    trainer = pod("train-0", "n1", namespace="ml")
    exporter = pod("dcgm-exporter-x", "n1", namespace="gpu-operator", gpus=0)
    mig = pod("mig-0", "n1", namespace="ml", gpus=0, extra={"nvidia.com/mig-1g.10gb": 1})
    pods = {p.key: p for p in (trainer, exporter, mig)}
    base = SeriesIdentity(node="n1", uuid=UUID)

    def with_pod(ns: str, name: str) -> SeriesIdentity:
        return SeriesIdentity(node="n1", uuid=UUID, pod_namespace=ns, pod_name=name)

    assert attribute(with_pod("ml", "train-0"), pods).pod_key == ("ml", "train-0")
    assert attribute(with_pod("ml", "mig-0"), pods).pod_key == ("ml", "mig-0")
    assert attribute(with_pod("gpu-operator", "dcgm-exporter-x"), pods) == base
    assert attribute(with_pod("ml", "gone"), pods) == base
    assert attribute(with_pod("ml", "gone"), None).pod_key == ("ml", "gone")


# --------------------------------------------------------------------------- aggregation maths


def util_series(points: list[tuple[float | None, float]], **labels: str) -> Series:
    return Series(
        metric="DCGM_FI_DEV_GPU_UTIL",
        labels={"Hostname": "n1", "UUID": UUID, **labels},
        samples=tuple(Sample(value, ts) for ts, value in points),
        source="test",
    )


def fb_series(metric: str, points: list[tuple[float | None, float]]) -> Series:
    return Series(
        metric=metric,
        labels={"Hostname": "n1", "UUID": UUID},
        samples=tuple(Sample(value, ts) for ts, value in points),
        source="test",
    )


def test_window_bounds_are_inclusive_and_future_samples_ignored() -> None:
    series = util_series(
        [
            (T0 - 660, 100.0),  # before the window
            (T0 - 600, 10.0),  # exactly now - window: included (Prometheus 2.x)
            (T0 - 300, 20.0),
            (T0 - 60, 30.0),
            (T0, 40.0),  # exactly now: included
            (T0 + 30, 90.0),  # after now: not seen at now
        ]
    )
    telemetry, findings = aggregate([series], CFG, [600, 60], NOW)
    assert findings == ()
    row = only_row(telemetry, 600)
    assert row.util_avg_percent == 25.0  # (10 + 20 + 30 + 40) / 4
    assert row.util_max_percent == 40.0
    assert row.util_samples == 4
    assert row.newest_sample == NOW
    short = only_row(telemetry, 60)
    assert (short.util_avg_percent, short.util_samples) == (35.0, 2)  # 30 at now-60 and 40 at now


def test_fractional_boundary_timestamps() -> None:
    series = util_series([(T0 - 600.001, 50.0), (T0 - 599.999, 10.0)])
    row = only_row(aggregate([series], CFG, [600], NOW)[0], 600)
    assert (row.util_avg_percent, row.util_samples) == (10.0, 1)


def test_framebuffer_instant_lookback() -> None:
    used = fb_series("DCGM_FI_DEV_FB_USED", [(T0 - 900, 7000.0), (T0 - 400, 3000.0), (T0 - 301, 2000.0)])
    free = fb_series("DCGM_FI_DEV_FB_FREE", [(T0 - LOOKBACK_SECONDS, 500.0)])
    telemetry, _ = aggregate([used, free], CFG, [600], NOW)
    row = only_row(telemetry, 600)
    assert row.fb_used_mib is None  # newest sample is 301 s old: outside the 5 minute lookback
    assert row.fb_used_max_mib == 3000.0  # max over [now-600, now]; 7000 is older
    assert row.fb_free_mib == 500.0  # exactly now - 5m: still inside the lookback
    assert row.util_avg_percent is None
    assert row.util_samples == 0
    assert row.newest_sample == NOW - timedelta(seconds=300)


def test_framebuffer_takes_newest_at_or_before_now() -> None:
    used = fb_series("DCGM_FI_DEV_FB_USED", [(T0 - 120, 1000.0), (T0 - 15, 1500.0), (T0 + 15, 9999.0)])
    row = only_row(aggregate([used], CFG, [3600], NOW)[0], 3600)
    assert (row.fb_used_mib, row.fb_used_max_mib) == (1500.0, 1500.0)
    assert row.newest_sample == NOW - timedelta(seconds=15)


def test_samples_without_timestamps_count_as_now() -> None:
    series = util_series([(None, 12.0)])
    row = only_row(aggregate([series], CFG, [300], NOW)[0], 300)
    assert (row.util_avg_percent, row.util_samples, row.newest_sample) == (12.0, 1, NOW)


def test_groups_with_nothing_in_the_window_are_left_out() -> None:
    series = util_series([(T0 - 7200, 0.0)])
    telemetry, _ = aggregate([series], CFG, [600], NOW)
    assert telemetry.available
    window = telemetry.window(600)
    assert window is not None
    assert window.gpus == ()


def test_scale_applies_to_each_metric() -> None:
    cfg = TelemetryConfig(
        utilization=MetricConfig(name="DCGM_FI_PROF_GR_ENGINE_ACTIVE", scale=100),
        fb_used=MetricConfig(name="gpu_memory_used_bytes", scale=1 / 1024**2),
    )
    ratio = Series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", {"Hostname": "n1", "UUID": UUID}, (Sample(0.25, T0),))
    used = Series("gpu_memory_used_bytes", {"Hostname": "n1", "UUID": UUID}, (Sample(2 * 1024**3, T0),))
    row = only_row(aggregate([ratio, used], cfg, [60], NOW)[0], 60)
    assert row.util_avg_percent == 25.0
    assert row.fb_used_mib == 2048.0


def test_mig_sample_with_profiling_utilisation() -> None:
    cfg = TelemetryConfig(utilization=MetricConfig(name="DCGM_FI_PROF_GR_ENGINE_ACTIVE", scale=100))
    series = parse_exposition(read("mig-a100.prom"), source="mig")
    telemetry, findings = aggregate(series, cfg, [1800], NOW)
    assert findings == ()
    window = telemetry.window(1800)
    assert window is not None
    whole, instance = window.gpus
    assert whole.mig_instance is None
    assert whole.util_avg_percent == pytest.approx(99.563)
    assert (whole.fb_used_mib, whole.fb_free_mib) == (4845.0, 35690.0)
    assert (instance.mig_profile, instance.mig_instance) == ("1g.5gb", "13")
    assert instance.util_avg_percent == pytest.approx(99.5687)
    assert instance.fb_used_mib is None
    assert instance.device_key == ("ub20-a100-k8s", "GPU-34319582-d595-d1c7-d1d2-179bcfa61660", "13")


def test_bad_values_dropped_with_one_finding_per_series() -> None:
    series = util_series([(T0 - 30, math.nan), (T0 - 20, -5.0), (T0 - 10, math.inf), (T0, 30.0)])
    other = util_series([(T0, 9223372036854775794.0)], gpu="1")
    telemetry, findings = aggregate([series, other], CFG, [60], NOW)
    row = only_row(telemetry, 60)  # `other` has no usable sample left
    assert (row.util_avg_percent, row.util_samples) == (30.0, 1)
    assert [f.kind for f in findings] == ["bad-telemetry", "bad-telemetry"]
    assert "dropped 3 of 4 samples" in findings[0].detail
    assert (findings[0].node, findings[0].gpu) == ("n1", UUID)
    assert "dropped 1 of 1 samples" in findings[1].detail


def test_unusable_series_are_summarised_per_metric() -> None:
    series = parse_exposition(read("tesla-t4.prom"), source="t4")
    series += parse_exposition(read("readme-kubernetes.prom"), source="readme")
    cfg = TelemetryConfig(utilization=MetricConfig(name="DCGM_FI_DEV_SM_CLOCK"))
    telemetry, findings = aggregate(series, cfg, [60], NOW)
    assert telemetry.available  # the T4 series are fine
    (unusable,) = [f for f in findings if f.kind == "unusable-telemetry"]
    assert unusable.detail.startswith("1 series of DCGM_FI_DEV_SM_CLOCK have no node label")
    assert "from readme" in unusable.detail


def test_all_series_unusable_makes_telemetry_unavailable() -> None:
    no_node = Series("DCGM_FI_DEV_GPU_UTIL", {"UUID": UUID}, (Sample(1.0, T0),))
    no_uuid = Series("DCGM_FI_DEV_FB_USED", {"Hostname": "n1"}, (Sample(1.0, T0),))
    telemetry, findings = aggregate([no_node, no_uuid], CFG, [60], NOW)
    assert not telemetry.available
    assert telemetry.problem is not None
    assert "carries both a node and a GPU UUID label" in telemetry.problem
    assert sorted(f.detail.split(" label")[0] for f in findings) == [
        "1 series of DCGM_FI_DEV_FB_USED have no GPU UUID",
        "1 series of DCGM_FI_DEV_GPU_UTIL have no node",
    ]


def test_no_series_of_the_configured_metrics() -> None:
    other = Series("DCGM_FI_DEV_SM_CLOCK", {"Hostname": "n1", "UUID": UUID}, (Sample(1.0, T0),))
    telemetry, findings = aggregate([other], CFG, [60], NOW)
    assert not telemetry.available
    assert (
        telemetry.problem
        == "no DCGM series of DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_FB_FREE"
    )
    assert findings == ()


def test_exporter_pod_label_merges_into_the_unattributed_gpu() -> None:
    exporter = pod("dcgm-exporter-a", "n1", namespace="gpu-operator", gpus=0)
    before = util_series([(T0 - 120, 10.0)], pod="dcgm-exporter-a", namespace="gpu-operator")
    after = util_series([(T0 - 60, 30.0)], pod="dcgm-exporter-b", namespace="gpu-operator")  # restarted
    telemetry, _ = aggregate([before, after], CFG, [600], NOW, {exporter.key: exporter})
    row = only_row(telemetry, 600)
    assert row.pod_key is None
    assert (row.util_avg_percent, row.util_samples) == (20.0, 2)


def test_pod_attribution_in_aggregate() -> None:
    trainer = pod("train-0", "n1")
    series = util_series(
        [(T0, 5.0)], exported_pod="train-0", exported_namespace="ml", pod="exp", namespace="gpu"
    )
    row = only_row(aggregate([series], CFG, [60], NOW, {trainer.key: trainer})[0], 60)
    assert row.pod_key == ("ml", "train-0")


def used_series(points: list[tuple[float, float]], **labels: str) -> Series:
    return Series(
        "DCGM_FI_DEV_FB_USED",
        {"Hostname": "n1", "UUID": UUID, **labels},
        tuple(Sample(value, ts) for ts, value in points),
        "test",
    )


@pytest.mark.parametrize(
    ("unlabelled_at", "pod_label_at", "in_view", "held"),
    [
        # A pod created after the pod list: the exporter names it in the newest sample.
        (T0 - 60, T0 - 15, False, True),
        # A pod deleted before the pod list: the exporter's newest sample names no pod (memory left
        # behind is the GPU's own), and the pod's older one does not hide it.
        (T0 - 15, T0 - 60, False, False),
        # Same instant: the larger value is the instant one, and it is the pod's.
        (T0 - 15, T0 - 15, False, True),
        # A pod the view has that holds no GPU (the exporter's own, a mislabelled series) holds nothing.
        (T0 - 60, T0 - 15, True, False),
    ],
    ids=["created-after-the-list", "deleted-before-the-list", "same-instant", "a-pod-without-gpus"],
)
def test_framebuffer_of_a_pod_the_view_does_not_have_is_marked_held(
    unlabelled_at: float, pod_label_at: float, in_view: bool, held: bool
) -> None:
    free = used_series([(T0 - 600, 0.0), (unlabelled_at, 2.0)])
    busy = used_series([(pod_label_at, 30000.0)], namespace="ml", pod="new-0")
    pods = {("other", "p"): pod("p", "n1", namespace="other")}
    if in_view:
        pods[("ml", "new-0")] = pod("new-0", "n1", namespace="ml", gpus=0)
    row = only_row(aggregate([free, busy], CFG, [600], NOW, pods)[0], 600)
    assert row.pod_key is None
    assert row.fb_used_by_unseen_pod is held
    assert row.fb_used_mib == (30000.0 if pod_label_at >= unlabelled_at else 2.0)


def test_without_pod_objects_or_outside_the_listed_namespaces_the_label_is_kept_not_marked() -> None:
    busy = used_series([(T0 - 15, 30000.0)], namespace="ml", pod="new-0")
    for pods in (None, PodsOfNamespaces({}, ["web"])):
        row = only_row(aggregate([busy], CFG, [600], NOW, pods)[0], 600)
        assert (row.pod_key, row.fb_used_by_unseen_pod) == (("ml", "new-0"), False)


def test_same_series_from_two_sources_is_merged_without_double_counting() -> None:
    first = util_series([(T0 - 60, 10.0), (T0 - 30, 20.0)])
    second = util_series([(T0 - 30, 20.0), (T0, 60.0)])
    row = only_row(aggregate([first, second], CFG, [600], NOW)[0], 600)
    assert (row.util_avg_percent, row.util_samples) == (30.0, 3)


def test_rows_are_sorted_and_carry_identity() -> None:
    a = Series("DCGM_FI_DEV_GPU_UTIL", {"Hostname": "n2", "UUID": "GPU-b", "gpu": "1"}, (Sample(1.0, T0),))
    b = Series(
        "DCGM_FI_DEV_GPU_UTIL", {"Hostname": "n1", "UUID": "GPU-a", "modelName": "L4"}, (Sample(2.0, T0),)
    )
    telemetry, _ = aggregate([a, b], CFG, [60], NOW)
    window = telemetry.window(60)
    assert window is not None
    assert [(g.node, g.uuid, g.gpu_index, g.model_name) for g in window.gpus] == [
        ("n1", "GPU-a", "", "L4"),
        ("n2", "GPU-b", "1", ""),
    ]


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone"):
        aggregate([util_series([(T0, 1.0)])], CFG, [60], datetime(2026, 11, 29, 12, 0))


# --------------------------------------------------------------------------- helpers for a live source


def test_group_key_and_to_gpu_telemetry() -> None:
    identity = SeriesIdentity(
        node="n1", uuid=UUID, gpu_index="0", mig_instance="3", pod_namespace="ml", pod_name="train-0"
    )
    assert group_key(identity) == ("n1", UUID, "3", "ml", "train-0")
    cfg = TelemetryConfig(utilization=MetricConfig(name="DCGM_FI_PROF_GR_ENGINE_ACTIVE", scale=100))
    row = to_gpu_telemetry(identity, cfg, util_avg=0.5, util_max=0.75, util_samples=10, fb_used=100.0)
    assert (row.util_avg_percent, row.util_max_percent, row.util_samples) == (50.0, 75.0, 10)
    assert (row.fb_used_mib, row.fb_used_max_mib, row.fb_free_mib, row.newest_sample) == (
        100.0,
        None,
        None,
        None,
    )
    assert row.pod_key == ("ml", "train-0")


def test_unknown_node_findings() -> None:
    (util,) = series_named(parse_exposition(read("tesla-t4.prom"), source="t4"), "DCGM_FI_DEV_GPU_UTIL")
    telemetry, _ = aggregate([util], CFG, [60, 600], NOW)
    (finding,) = unknown_node_findings(telemetry, {"gpu-a-1"})
    assert (finding.kind, finding.node) == ("telemetry-unknown-node", "424773df46e0")
    assert unknown_node_findings(telemetry, {"424773df46e0"}) == ()
