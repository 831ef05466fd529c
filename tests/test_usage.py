"""Long-window usage per series and the evidence per workload, and the gpu-rightsizing strategy on it.

Expected figures are worked out by hand in each test from the samples it writes.
"""

from __future__ import annotations

import json
import math
import statistics
from datetime import timedelta

import msgspec
import pytest

from rebalancer.model import OwnerRef
from rebalancer.period import period
from rebalancer.policy import EXAMPLE_GPU_PRICES, PolicyError, TelemetryConfig, loads_policy
from rebalancer.registry import StrategyContext
from rebalancer.telemetry.exposition import Sample, Series
from rebalancer.telemetry.identity import DCGM_BLANKS
from rebalancer.usage import (
    MetricUsage,
    SeriesUsage,
    UsageHistory,
    prometheus_quantile,
    usage_from_samples,
    workload_evidence,
)
from strategies.gpu_rightsizing import CatalogueMig, CatalogueModel, GpuRightsizingArgs, gpu_rightsizing
from tests.builders import A100, L4, NOW, node, pod, replace, snapshot

CFG = TelemetryConfig()
HOUR = period(NOW, 3600, 300)  # twelve 5-minute steps ending at NOW
END = NOW.timestamp()


def series(metric: str, values: list[tuple[float, float]], **extra: str) -> Series:
    labels = {"Hostname": "n1", "UUID": "GPU-1", "gpu": "0", "modelName": "NVIDIA A100-SXM4-80GB"}
    labels |= {"namespace": "ml", "pod": "p", "container": "main"} | extra
    return Series(metric=metric, labels=labels, samples=tuple(Sample(v, t) for t, v in values))


@pytest.mark.parametrize("values", [[5.0], [1.0, 2.0], [3.0, 1.0, 2.0, 10.0], list(map(float, range(1, 21)))])
def test_the_quantile_is_prometheus_linear_interpolation(values: list[float]) -> None:
    ordered = sorted(values)
    want = ordered[0] if len(ordered) == 1 else statistics.quantiles(ordered, n=20, method="inclusive")[18]
    assert prometheus_quantile(0.95, ordered) == pytest.approx(want)


def test_each_step_is_its_busiest_sample() -> None:
    # Steps end at NOW - 55 min, ..., NOW. Two samples in the last step (10 and 40): the step is 40.
    # Eleven other steps at 20. Peak 40; p95 of eleven 20s and one 40: rank 0.95 x 11 = 10.45 -> between
    # the 11th (20) and 12th (40): 20 + 0.45 x 20 = 29.
    rows = [(END - 60 * (5 * i + 1), 20.0) for i in range(1, 12)] + [(END - 200, 10.0), (END - 100, 40.0)]
    (found,) = usage_from_samples([series("DCGM_FI_DEV_GPU_UTIL", rows)], CFG, HOUR)
    util = found.metrics["utilization"]
    assert (util.steps, util.bad_steps, util.peak) == (12, 0, 40.0)
    assert util.p95 == pytest.approx(29.0)
    assert found.container == "main"
    assert found.identity.pod_key == ("ml", "p")


@pytest.mark.parametrize("bad", [math.nan, -1.0, min(DCGM_BLANKS)])
def test_a_bad_step_is_counted_and_never_a_reading(bad: float) -> None:
    rows = [(END - 60 * (5 * i + 1), 20.0) for i in range(11)] + [(END - 60 * 56, bad)]
    (found,) = usage_from_samples([series("DCGM_FI_DEV_FB_USED", rows)], CFG, HOUR)
    memory = found.metrics["memory"]
    assert (memory.steps, memory.bad_steps, memory.peak) == (11, 1, 20.0)


def test_series_differing_only_in_unread_labels_are_one() -> None:
    one = series("DCGM_FI_DEV_FB_USED", [(END - 10, 100.0)], instance="a:9400")
    two = series("DCGM_FI_DEV_FB_USED", [(END - 10, 300.0)], instance="b:9400")
    (found,) = usage_from_samples([one, two], CFG, HOUR)
    assert found.metrics["memory"] == MetricUsage(steps=1, bad_steps=0, peak=300.0, p95=300.0)


# --------------------------------------------------------------------------- per workload


def usage(
    uuid: str,
    pod_name: str,
    *,
    util_peak: float = 50,
    util_p95: float = 40,
    fb: float = 8192,
    steps: int = 200,
) -> SeriesUsage:
    identity = msgspec.structs.replace(
        usage_from_samples(
            [series("DCGM_FI_DEV_GPU_UTIL", [(END - 10, 1.0)], UUID=uuid, pod=pod_name)], CFG, HOUR
        )[0].identity
    )
    return SeriesUsage(
        identity=identity,
        container="main",
        metrics={
            "utilization": MetricUsage(steps, 0, util_peak, util_p95),
            "memory": MetricUsage(steps, 0, fb, fb * 0.9),
        },
    )


def history(*rows: SeriesUsage) -> UsageHistory:
    return UsageHistory(period=period(NOW, 7 * 86400, 300), series=rows, source="test")


OWNER = OwnerRef(kind="ReplicaSet", name="infer")


def test_a_workload_is_its_replicas_busiest_figures_and_fewest_samples() -> None:
    cluster = snapshot(
        [node("n1", model=A100)],
        [pod("p", "n1", owner=OWNER), pod("q", "n1", owner=OWNER)],
    )
    found = workload_evidence(
        history(
            usage("GPU-1", "p", util_p95=30, fb=4096, steps=300),
            usage("GPU-2", "q", util_p95=45, fb=8192, steps=150),
        ),
        cluster,
        5.0,
    )
    (evidence,) = found
    assert evidence.workload == "ml/ReplicaSet/infer"
    assert (evidence.replicas, evidence.gpus_per_replica, evidence.product) == (2, 1, A100)
    assert evidence.peak_memory_gib == 8.0
    assert evidence.p95_utilization_percent == 45
    assert evidence.samples == 150
    assert evidence.pods == ("p", "q")
    assert evidence.problems == ()


def test_a_gpu_without_telemetry_is_a_problem_not_an_idle_gpu() -> None:
    cluster = snapshot([node("n1")], [pod("p", "n1", gpus=2, owner=OWNER)])
    (evidence,) = workload_evidence(history(usage("GPU-1", "p")), cluster, 5.0)
    assert evidence.problems == ("telemetry for 1 of the 2 GPUs of pod ml/p",)
    assert evidence.idle_all_window == (False, False)


def test_idle_gpus_are_those_every_replica_leaves_idle() -> None:
    # p: both its GPUs stayed below 5 % (4.9 and 0); q: only GPU-4. The workload can drop one GPU a replica.
    cluster = snapshot(
        [node("n1")], [pod("p", "n1", gpus=2, owner=OWNER), pod("q", "n1", gpus=2, owner=OWNER)]
    )
    rows = (
        usage("GPU-1", "p", util_peak=4.9, fb=300),
        usage("GPU-2", "p", util_peak=0, fb=0),
        usage("GPU-3", "q", util_peak=80),
        usage("GPU-4", "q", util_peak=3, fb=1023),
    )
    (evidence,) = workload_evidence(history(*rows), cluster, 5.0)
    assert evidence.idle_all_window == (False, True)


def test_a_gpu_holding_memory_is_not_idle_whatever_its_utilisation() -> None:
    # Four GPUs at 70 GiB each, three of them at 0 %: their memory is the replica's, not a GPU to drop.
    cluster = snapshot([node("n1")], [pod("p", "n1", gpus=4, owner=OWNER)])
    rows = [usage("GPU-0", "p", util_peak=90, fb=70 * 1024)] + [
        usage(f"GPU-{i}", "p", util_peak=0, fb=70 * 1024) for i in (1, 2, 3)
    ]
    (evidence,) = workload_evidence(history(*rows), cluster, 5.0)
    assert evidence.idle_all_window == (False, False, False, False)


def test_thin_profiling_data_is_thin_evidence() -> None:
    # 2,000 steps of memory and utilisation, but the engine activity judged was seen in one step.
    cluster = snapshot([node("n1")], [pod("p", "n1", owner=OWNER)])
    row = usage("GPU-1", "p", steps=2000)
    profiled = replace(row, metrics={**row.metrics, "engine": MetricUsage(1, 0, 5.0, 5.0)})
    (evidence,) = workload_evidence(history(profiled), cluster, 5.0)
    assert (evidence.profiled, evidence.samples) == (True, 1)


def test_replicas_on_different_gpu_models_are_a_problem() -> None:
    cluster = snapshot(
        [node("a", model=A100), node("l", model=L4)], [pod("p", "a", owner=OWNER), pod("q", "l", owner=OWNER)]
    )
    (evidence,) = workload_evidence(history(usage("GPU-1", "p"), usage("GPU-2", "q")), cluster, 5.0)
    assert evidence.problems == (f"replicas on different GPU models ({A100}, {L4})",)


def test_nvlink_is_measured_only_where_every_gpu_has_it() -> None:
    cluster = snapshot([node("n1")], [pod("p", "n1", gpus=2, owner=OWNER)])
    one, two = usage("GPU-1", "p"), usage("GPU-2", "p")
    link = {"nvlink_tx": MetricUsage(200, 0, 3e8, 2e8), "nvlink_rx": MetricUsage(200, 0, 2e8, 1e8)}
    measured = replace(one, metrics={**one.metrics, **link})
    (partial,) = workload_evidence(history(measured, two), cluster, 5.0)
    assert partial.nvlink_bytes_per_second is None
    both = replace(two, metrics={**two.metrics, **link})
    (full,) = workload_evidence(history(measured, both), cluster, 5.0)
    assert full.nvlink_bytes_per_second == pytest.approx(3e8)


def test_empty_labels_are_no_labels_as_in_prometheus() -> None:
    # The same GPU scraped twice, once with an empty `container` label: one series, as Prometheus holds it.
    one = series("DCGM_FI_DEV_FB_USED", [(END - 10, 100.0)], container="")
    two = series("DCGM_FI_DEV_FB_USED", [(END - 10, 300.0)], container="", instance="b:9400")
    (found,) = usage_from_samples([one, two], CFG, HOUR)
    assert found.container is None
    assert found.metrics["memory"].peak == 300.0


def test_shared_and_mig_pods_and_pods_gone_are_not_judged() -> None:
    cluster = snapshot(
        [node("n1")],
        [
            pod("shared", "n1", gpu_milli=500, owner=OWNER),
            pod("mig", "n1", gpus=0, extra={"nvidia.com/mig-1g.10gb": 1}, owner=OWNER),
        ],
    )
    rows = (usage("GPU-1", "shared"), usage("GPU-2", "mig"), usage("GPU-3", "gone"))
    assert workload_evidence(history(*rows), cluster, 5.0) == []


# --------------------------------------------------------------------------- the strategy


CTX = StrategyContext(gpu_prices=dict(EXAMPLE_GPU_PRICES))


def test_without_usage_history_the_strategy_is_skipped_and_says_why() -> None:
    result = gpu_rightsizing(snapshot([node("n1")], [pod("p", "n1")]), GpuRightsizingArgs(), CTX)
    assert result.skipped is not None and "no GPU usage history over 7d" in result.skipped
    assert result.findings == ()


def test_the_strategy_reports_savings_as_findings_and_the_rest_as_not_chosen() -> None:
    # p: 8 GiB peak, p95 40 % of an A100 -> the L4 (9.6 GiB <= 24, 0.4 <= 0.4): (5.10 - 1.15) an hour.
    # q: 70 GiB peak: nothing fits, keep.
    cluster = snapshot(
        [node("n1", model=A100), node("l4", model=L4, gpus=4)],
        [pod("p", "n1", owner=OWNER), pod("big", "n1", owner=OwnerRef(kind="Job", name="big"))],
    )
    rows = (usage("GPU-1", "p", util_p95=40), usage("GPU-2", "big", fb=70 * 1024))
    result = gpu_rightsizing(replace(cluster, usage=history(*rows)), GpuRightsizingArgs(), CTX)
    assert result.proposals == ()
    (finding,) = result.findings
    assert (finding.kind, finding.workload, finding.namespace) == (
        "gpu-rightsizing",
        "ml/ReplicaSet/infer",
        "ml",
    )
    assert finding.saving_per_hour == pytest.approx(5.10 - 1.15)
    assert "cheaper-model NVIDIA-L4" in finding.detail
    (left,) = result.not_chosen
    assert (left.code, left.namespace, left.pod) == ("keep", "ml", "big")


def test_available_models_and_catalogue_entries_come_from_the_policy() -> None:
    loaded = loads_policy(
        """
strategies:
  - name: gpu-rightsizing
    args:
      window: 3d
      step: 10m
      available_models: [NVIDIA-L4]
      catalogue:
        - {product: NVIDIA-L4, memory_gib: 8, relative_throughput: 0.4}
""",
        "p.yaml",
    )
    (configured,) = loaded.strategies
    args = configured.args
    assert isinstance(args, GpuRightsizingArgs)
    assert loaded.usage_period() == (3 * 86400, 600)
    # With the L4 replaced by an 8 GiB one, 8 GiB + 20 % no longer fits it: a MIG slice instead.
    cluster = snapshot([node("n1", model=A100)], [pod("p", "n1", owner=OWNER)])
    result = gpu_rightsizing(replace(cluster, usage=history(usage("GPU-1", "p", util_p95=10))), args, CTX)
    (finding,) = result.findings
    assert "mig-profile" in finding.detail


def test_a_window_that_is_not_whole_steps_is_refused() -> None:
    with pytest.raises(ValueError, match="window / step"):
        GpuRightsizingArgs(window=3600, step=7 * 60)
    assert timedelta(seconds=GpuRightsizingArgs().window) == timedelta(days=7)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"mig_profiles": [{"name": "1g.10gb", "memory_gib": 10, "slices": 1}]},
            "mig_profiles need compute_slices",
        ),
        (
            {"compute_slices": 4, "mig_profiles": [{"name": "7g.80gb", "memory_gib": 80, "slices": 7}]},
            "MIG profile 7g.80gb (7 slices, 80 GiB) is more than the GPU has (4 slices, 40 GiB)",
        ),
    ],
)
def test_a_catalogue_entry_that_cannot_be_is_a_policy_error(entry: dict[str, object], message: str) -> None:
    text = "strategies:\n  - name: gpu-rightsizing\n    args:\n      catalogue:\n        - " + json.dumps(
        {"product": "NVIDIA-X", "memory_gib": 40, "relative_throughput": 1, **entry}
    )
    with pytest.raises(PolicyError) as info:
        loads_policy(text, "p.yaml")
    assert any(message in problem and problem.startswith("p.yaml:") for problem in info.value.problems)


def test_catalogue_mig_profiles_are_taken_smallest_first() -> None:
    entry = CatalogueModel(
        product="NVIDIA-X",
        memory_gib=40,
        relative_throughput=1,
        compute_slices=4,
        mig_profiles=(
            CatalogueMig(name="2g.24gb", memory_gib=24, slices=2),
            CatalogueMig(name="1g.12gb", memory_gib=12, slices=1),
        ),
    )
    assert [p.name for p in entry.model().mig_profiles] == ["1g.12gb", "2g.24gb"]
