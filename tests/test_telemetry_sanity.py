"""Impossible utilisation answers from Prometheus make a GPU's telemetry unusable, never idle.

Unit rules of `telemetry.sanity`, then the live source against a stub that answers them, then the
strategies on what the source gives: no idle-gpu finding or eviction, no consolidation drain.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import pytest

from rebalancer.model import Finding, Telemetry
from rebalancer.policy import MetricConfig, PolicyError, PrometheusConfig, TelemetryConfig, parse_policy
from rebalancer.registry import StrategyContext
from rebalancer.sources.prometheus import PrometheusTelemetrySource
from rebalancer.telemetry.sanity import ALIGNMENT_SLACK, max_samples, utilisation_problem
from strategies.gpu_consolidation import GpuConsolidationArgs, gpu_consolidation
from strategies.idle_gpu import IdleGpuArgs, idle_gpu
from tests.builders import NOW, node, pod, snapshot
from tests.prometheus_answers import USED, UTIL, Answer, Samples, plan_responder

if TYPE_CHECKING:
    from tests.prometheus_server import StubFactory

pytest_plugins = ["tests.prometheus_server"]

UUID = "GPU-11111111-2222-3333-4444-555555555555"
OTHER = "GPU-99999999-2222-3333-4444-555555555555"
LABELS = {"Hostname": "gpu-a-1", "UUID": UUID, "gpu": "0", "exported_namespace": "ml", "exported_pod": "p"}
OTHER_LABELS = {**LABELS, "UUID": OTHER, "gpu": "1", "exported_pod": "q"}
WINDOW = 1800


def check(count: float | None, total: float | None, peak: float | None, **kw: float) -> str | None:
    options: dict[str, float] = {"window": WINDOW, "scrape_interval": 30, "scale": 1.0, "series": 1, **kw}
    return utilisation_problem(
        count,
        total,
        peak,
        window=int(options["window"]),
        scrape_interval=int(options["scrape_interval"]),
        scale=options["scale"],
        series=options["series"],
    )


# --------------------------------------------------------------------------- the rules


def test_plausible_answers_pass() -> None:
    assert check(60, 120, 5) is None  # mean 2 %, max 5 %
    assert check(1, 0, 0) is None
    assert check(61, 6100, 100) is None  # every sample at 100 %
    assert check(max_samples(WINDOW, 30), 0, 0) is None  # the bound itself is allowed
    assert check(60, 30, 1, scale=100.0) is None  # nv-gpu: a 0-1 ratio scaled to percent


def test_the_count_bound_follows_window_and_scrape_interval() -> None:
    assert max_samples(1800, 30) == 60 + ALIGNMENT_SLACK
    assert max_samples(1800, 15) == 120 + ALIGNMENT_SLACK
    problem = check(1e9, 10, 1)
    assert problem is not None
    assert "count 1e+09" in problem and "62 samples" in problem and "every 30s" in problem
    assert "telemetry.scrape_interval" in problem
    assert check(max_samples(WINDOW, 30) + 1, 0, 0) is not None
    assert check(100, 0, 0, scrape_interval=15) is None


@pytest.mark.parametrize(
    ("count", "total", "peak", "said"),
    [
        (-3, 0, 0, "count -3 is NaN, infinite, negative"),
        (math.nan, 0, 0, "count nan"),
        (math.inf, 0, 0, "count inf"),
        (10, -1, 0, "sum -1"),
        (10, math.inf, 0, "sum inf"),
        (10, 5, math.nan, "max nan"),
        (10, 5, float(2**47), "max 1.40737e+14 is NaN, infinite, negative or a DCGM blank"),
        (10.5, 5, 1, "not a whole number"),
        (0, 0, 0, "not a whole number"),
        (10, 5, 150, "maximum 150% is above 100%"),
        (10, 1500, 100, "mean (sum / count) 150% is above 100%"),
        (10, 400, 20, "mean (sum / count) 40% is above its maximum 20%"),
        (None, 5, 1, "has its sum, max but no count"),
        (10, None, 1, "has its count, max but no sum"),
        (10, 5, None, "no max"),
    ],
)
def test_impossible_answers_say_what_is_wrong(
    count: float | None, total: float | None, peak: float | None, said: str
) -> None:
    problem = check(count, total, peak)
    assert problem is not None
    assert said in problem


def test_a_sum_of_several_series_is_held_to_that_many_series_bound() -> None:
    bound = max_samples(WINDOW, 30)
    assert check(2 * bound, 0, 0, series=2) is None
    problem = check(2 * bound + 1, 0, 0, series=2)
    assert problem is not None
    assert f"more than the {2 * bound} samples 2 series scraped every 30s" in problem
    assert check(bound + 1, 0, 0) is not None  # one series: the bound alone
    for series in (0, 1.5, math.nan, -1):
        problem = check(10, 5, 1, series=series)
        assert problem is not None and "series count" in problem


def test_the_scale_applies_before_the_percent_bounds() -> None:
    problem = check(10, 5, 2, scale=100.0)  # a ratio of 2 is 200 %
    assert problem is not None and "200%" in problem


def test_scrape_interval_is_a_telemetry_setting_with_the_exporter_charts_default() -> None:
    assert TelemetryConfig().scrape_interval == 15
    cfg = parse_policy({"telemetry": {"scrape_interval": "5s"}}).policy.telemetry
    assert cfg is not None and cfg.scrape_interval == 5
    with pytest.raises(ValueError, match="greater than 0"):
        TelemetryConfig(scrape_interval=0)


# --------------------------------------------------------------------------- through the live source


def answers(util: Mapping[tuple[str, str], Samples]) -> Callable[[dict[str, str]], Answer]:
    """A responder: the given utilisation aggregates, and fresh framebuffer data for both GPUs."""
    t0 = NOW.timestamp()
    return plan_responder(
        {
            **util,
            ("ts", UTIL): [(LABELS, t0), (OTHER_LABELS, t0)],
            ("last", USED): [(LABELS, 100.0), (OTHER_LABELS, 100.0)],
            ("ts", USED): [(LABELS, t0), (OTHER_LABELS, t0)],
        },
        windows=(WINDOW,),
    )


PODS = {("ml", "p"): pod("p", "gpu-a-1"), ("ml", "q"): pod("q", "gpu-a-1")}


def read(url: str, **telemetry: object) -> tuple[Telemetry, tuple[Finding, ...]]:
    cfg = TelemetryConfig.model_validate({**telemetry, "prometheus": PrometheusConfig(url=url)})
    return PrometheusTelemetrySource(cfg, [WINDOW]).telemetry(NOW, PODS)


def test_a_count_of_a_billion_makes_that_gpu_unusable_with_a_finding(stub_prometheus: StubFactory) -> None:
    stub = stub_prometheus(
        responder=answers(
            {
                ("count", UTIL): [(LABELS, 1e9), (OTHER_LABELS, 60.0)],
                ("sum", UTIL): [(LABELS, 60.0), (OTHER_LABELS, 3000.0)],
                ("max", UTIL): [(LABELS, 1.0), (OTHER_LABELS, 70.0)],
            }
        )
    )
    telemetry, findings = read(stub.url)
    window = telemetry.window(WINDOW)
    assert window is not None
    assert [g.uuid for g in window.gpus] == [OTHER]  # the other GPU keeps its telemetry
    (bad,) = [f for f in findings if f.kind == "bad-telemetry"]
    assert (bad.node, bad.gpu, bad.namespace, bad.pod) == ("gpu-a-1", UUID, "ml", "p")
    assert "DCGM_FI_DEV_GPU_UTIL" in bad.detail and "over 30m" in bad.detail
    assert "count 1e+09" in bad.detail and "treated as none" in bad.detail

    # What the strategies make of it: the busy pods on the GPU are not idle, the node not under-used.
    pods = list(PODS.values())
    snap = snapshot([node("gpu-a-1"), node("gpu-a-2")], pods, telemetry=telemetry)
    idle = idle_gpu(snap, IdleGpuArgs(namespaces=("ml",), min_pod_age=0), StrategyContext())
    assert idle.proposals == ()
    assert [f.kind for f in idle.findings if f.pod == "p"] == ["stale-telemetry"]
    consolidation = gpu_consolidation(
        snap,
        GpuConsolidationArgs(max_utilization_percent=100, window=WINDOW, min_node_age=0),
        StrategyContext(),
    )
    assert consolidation.proposals == ()


def test_the_bound_uses_the_policys_scrape_interval(stub_prometheus: StubFactory) -> None:
    util = {
        ("count", UTIL): [(LABELS, 360.0)],  # a 5s scrape over 30m
        ("sum", UTIL): [(LABELS, 720.0)],
        ("max", UTIL): [(LABELS, 4.0)],
    }
    stub = stub_prometheus(responder=answers(util))
    telemetry, findings = read(stub.url)
    window = telemetry.window(WINDOW)
    assert window is not None and UUID not in {g.uuid for g in window.gpus}
    assert any("telemetry.scrape_interval" in f.detail for f in findings)
    telemetry, findings = read(stub.url, scrape_interval="5s")
    window = telemetry.window(WINDOW)
    assert window is not None
    (row,) = [g for g in window.gpus if g.uuid == UUID]
    assert (row.util_samples, row.util_avg_percent) == (360, 2.0)
    assert not [f for f in findings if f.kind == "bad-telemetry"]


def test_a_label_set_of_two_series_may_hold_two_series_samples(stub_prometheus: StubFactory) -> None:
    """Two scrape jobs of one exporter: Prometheus answers one label set (the labels the mapping reads)
    with the samples of both, and says it holds two series."""
    bound = max_samples(WINDOW, 15)
    util = {
        ("count", UTIL): [(LABELS, 2.0 * bound)],
        ("sum", UTIL): [(LABELS, 4.0 * bound)],
        ("max", UTIL): [(LABELS, 3.0)],
    }
    stub = stub_prometheus(responder=answers({**util, ("series", UTIL): [(LABELS, 2.0)]}))
    telemetry, findings = read(stub.url)
    window = telemetry.window(WINDOW)
    assert window is not None
    (row,) = [g for g in window.gpus if g.uuid == UUID]
    assert (row.util_samples, row.util_avg_percent) == (2 * bound, 2.0)
    assert not [f for f in findings if f.kind == "bad-telemetry"]
    # The same count said to be of one series is impossible.
    stub = stub_prometheus(responder=answers({**util, ("series", UTIL): [(LABELS, 1.0)]}))
    telemetry, findings = read(stub.url)
    window = telemetry.window(WINDOW)
    assert window is not None and UUID not in {g.uuid for g in window.gpus}
    (bad,) = [f for f in findings if f.kind == "bad-telemetry"]
    assert f"more than the {bound} samples a series" in bad.detail


def test_a_mean_above_the_maximum_and_a_half_answer_are_unusable(stub_prometheus: StubFactory) -> None:
    stub = stub_prometheus(
        responder=answers(
            {
                ("count", UTIL): [(LABELS, 10.0)],  # OTHER: sum and max, no count
                ("sum", UTIL): [(LABELS, 400.0), (OTHER_LABELS, 10.0)],
                ("max", UTIL): [(LABELS, 20.0), (OTHER_LABELS, 1.0)],
            }
        )
    )
    telemetry, findings = read(stub.url)
    window = telemetry.window(WINDOW)
    assert window is not None and window.gpus == ()
    details = {f.gpu: f.detail for f in findings if f.kind == "bad-telemetry"}
    assert "above its maximum" in details[UUID]
    assert "no count" in details[OTHER]


def test_a_scaled_metric_is_judged_in_percent(stub_prometheus: StubFactory) -> None:
    util = {
        ("count", UTIL): [(LABELS, 10.0)],
        ("sum", UTIL): [(LABELS, 5.0)],  # a 0-1 ratio: mean 50 %
        ("max", UTIL): [(LABELS, 0.9)],
    }
    stub = stub_prometheus(responder=answers(util))
    scaled = MetricConfig(name="DCGM_FI_DEV_GPU_UTIL", scale=100.0)
    telemetry, findings = read(stub.url, utilization=scaled)
    window = telemetry.window(WINDOW)
    assert window is not None
    (row,) = [g for g in window.gpus if g.uuid == UUID]
    assert row.util_avg_percent == 50.0
    assert not [f for f in findings if f.kind == "bad-telemetry"]


def test_the_telemetry_deadline_must_leave_half_the_interval_to_the_cycle() -> None:
    doc = {"interval": "1m", "telemetry": {"prometheus": {"url": "https://p:9090", "deadline": "45s"}}}
    with pytest.raises(PolicyError) as caught:
        parse_policy(doc, source="policy.yaml")
    (problem,) = caught.value.problems
    assert problem == (
        "policy.yaml: (top level): telemetry.prometheus.deadline (45s) must be at most half the "
        "interval (1m): a cycle also plans and evicts"
    ), problem
    doc["telemetry"]["prometheus"]["deadline"] = "30s"  # type: ignore[index]
    parse_policy(doc)
