"""Idle GPU-hours per team: the step rules and the tally."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from rebalancer.model import OwnerRef, Snapshot
from rebalancer.policy import TelemetryConfig
from rebalancer.sources.prometheus import WASTE_LABEL, idle_steps_query
from rebalancer.telemetry.exposition import Sample, Series
from rebalancer.waste import (
    GONE,
    GroupBy,
    Period,
    SeriesSteps,
    Waste,
    gpu_product,
    period,
    steps_from_samples,
    tally,
)
from tests.builders import controller, node, pod, snapshot

CFG = TelemetryConfig()
END = datetime(2026, 10, 10, tzinfo=UTC)
A100 = "NVIDIA A100-SXM4-80GB"
PRICES = {"NVIDIA-A100-SXM4-80GB": 5.0, "NVIDIA-L4": 1.0}


def price_of(product: str | None) -> float | None:
    return PRICES.get(product) if product is not None else None


def labels(
    device: str,
    pod_name: str | None = None,
    namespace: str = "ml",
    *,
    model: str = A100,
    node_name: str = "gpu-1",
    **extra: str,
) -> dict[str, str]:
    found = {"UUID": f"GPU-{device}", "hostname": node_name, "gpu": "0", "modelName": model, **extra}
    if pod_name is not None:
        found |= {"namespace": namespace, "pod": pod_name}
    return found


def steps(covered: int, idle: int, **kwargs: str) -> SeriesSteps:
    device = kwargs.pop("gpu", "a")
    pod_name = kwargs.pop("pod", None)
    return SeriesSteps(labels=labels(device, pod_name, **kwargs), covered=covered, idle=idle)


def window(hours: int = 1, step: int = 300) -> Period:
    return period(END, hours * 3600, step)


# --------------------------------------------------------------------------- the period and its steps


def test_the_period_ends_on_a_step_and_holds_whole_steps() -> None:
    p = period(END + timedelta(minutes=7, seconds=3), 3600, 300)
    assert p.end == END + timedelta(minutes=5)
    assert p.start == p.end - timedelta(hours=1)
    assert p.steps == 12
    end_ms = p.end_ms
    assert p.step_of(end_ms) == end_ms  # a step is (t - step, t]: its end belongs to it
    assert p.step_of(end_ms - 300_000) == end_ms - 300_000
    assert p.step_of(end_ms - 299_999) == end_ms
    assert p.step_of(p.start_ms) is None  # ... and the period's start to the step before the period
    assert p.step_of(end_ms + 1) is None


@pytest.mark.parametrize(
    ("since", "step", "problem"),
    [
        (3600, 420, "not a whole number of steps"),
        (60, 300, "shorter than one step"),
        (3600, 0, "at least 1s"),
    ],
)
def test_a_period_that_is_not_whole_steps_is_refused(since: int, step: int, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        period(END, since, step)


def series(samples: Sequence[tuple[float, float]], **label_values: str) -> Series:
    return Series(
        metric="DCGM_FI_DEV_GPU_UTIL",
        labels=label_values,
        samples=tuple(Sample(value=value, timestamp=stamp) for stamp, value in samples),
    )


def test_steps_count_samples_in_the_step_they_end_and_gaps_not_at_all() -> None:
    p = window()
    end = END.timestamp()
    start = end - 3600
    samples = [
        (start, 0.0),  # on the period's start: the step before the period
        (start + 300, 0.0),  # the end of the first step
        (start + 301, 50.0),  # the second step: mean of 50 and 0 is not below 5
        (start + 600, 0.0),
        # 45 minutes without a sample: neither idle nor allocated
        (start + 3600, 4.0),  # the period's end: the last step, idle
        (start + 3601, 0.0),  # after it
    ]
    (counted,) = steps_from_samples([series(samples, **labels("a", "p"))], CFG, p, 5.0)
    assert (counted.covered, counted.idle) == (3, 2)
    assert counted.labels == labels("a", "p")


def test_a_series_scraped_twice_counts_once_and_bad_samples_are_never_idle() -> None:
    p = window()
    end = END.timestamp()
    one = labels("a", "p")
    twice = [
        series([(end - 10, 0.0)], **one, instance="10.0.0.1:9400"),
        series([(end - 10, 0.0), (end - 400, 1.0)], **one, instance="10.0.0.2:9400"),
        # NaN in a step: the step is covered, and not idle.
        series([(end - 10, float("nan")), (end - 700, 0.0)], **labels("b", "q")),
        # Untimestamped samples are not history.
        Series(metric="DCGM_FI_DEV_GPU_UTIL", labels=labels("c", "r"), samples=(Sample(value=0.0),)),
        # Nothing in the period: no steps at all.
        series([(end + 10, 0.0)], **labels("d", "s")),
    ]
    found = {s.labels["pod"]: (s.covered, s.idle) for s in steps_from_samples(twice, CFG, p, 5.0)}
    assert found == {"p": (2, 2), "q": (2, 1)}


def test_the_threshold_is_in_percent_whatever_the_metric_scale() -> None:
    cfg = TelemetryConfig(preset="nv-gpu")  # utilisation as a 0-1 ratio, scale 100
    end = END.timestamp()
    util = [
        Series(
            "nv_gpu_utilization",
            {"gpu_uuid": f"GPU-{name}", "node": "n", "namespace": "ml", "pod": name},
            (sample,),
        )
        for name, sample in (("p", Sample(0.04, end - 10)), ("q", Sample(0.06, end - 10)))
    ]
    found = {s.labels["pod"]: s.idle for s in steps_from_samples(util, cfg, window(), 5.0)}
    assert found == {"p": 1, "q": 0}
    query = idle_steps_query(cfg, window(), 5.0)
    assert "nv_gpu_utilization" in query and "< bool 0.05" in query


def test_the_query_depends_on_the_policy_and_period_only() -> None:
    query = idle_steps_query(CFG, window(hours=24), 5.0)
    assert query.count("DCGM_FI_DEV_GPU_UTIL[299999ms]") == 4
    assert "[86399999ms:300s]" in query
    assert f'"{WASTE_LABEL}", "covered"' in query and f'"{WASTE_LABEL}", "idle"' in query
    # Series of one GPU and pod count once: collapsed on every label the mapping reads.
    assert "max by (Hostname, hostname, kubernetes_node, node, exported_pod, pod," in query


# --------------------------------------------------------------------------- the tally


def by_group(waste: Waste) -> dict[str, tuple[float, float, float | None]]:
    return {
        g.group: (g.usage.idle_gpu_hours, g.usage.allocated_gpu_hours, g.usage.cost) for g in waste.groups
    }


def test_namespaces_add_gpu_hours_and_cost_their_idle_hours() -> None:
    counted = [
        steps(12, 6, gpu="a", pod="p-0"),
        steps(12, 12, gpu="b", pod="p-1"),
        steps(6, 0, gpu="c", pod="q-0", namespace="serve", model="NVIDIA L4"),
    ]
    waste = tally(counted, CFG, window(), threshold_percent=5.0, by=GroupBy("namespace"), price_of=price_of)
    assert by_group(waste) == {"ml": (1.5, 2.0, 7.5), "serve": (0.0, 0.5, 0.0)}
    assert [g.group for g in waste.groups] == ["ml", "serve"]  # most idle first
    assert (waste.totals.idle_gpu_hours, waste.totals.allocated_gpu_hours, waste.totals.cost) == (
        1.5,
        2.5,
        7.5,
    )
    assert waste.totals.idle_share == pytest.approx(0.6)
    assert [(w.workload, w.usage.idle_gpu_hours) for w in waste.top_workloads] == [
        ("ml/p-1", 1.0),
        ("ml/p-0", 0.5),
    ]


def test_gpus_without_a_pod_are_charged_to_no_team() -> None:
    counted = [steps(12, 12, gpu="a"), steps(12, 0, gpu="b"), steps(12, 12, gpu="c", pod="p")]
    waste = tally(counted, CFG, window(), threshold_percent=5.0, by=GroupBy("namespace"), price_of=price_of)
    assert by_group(waste) == {"ml": (1.0, 1.0, 5.0)}
    loose = waste.unattributed
    # Every hour of a GPU nobody holds is costed, idle or not.
    assert (loose.series, loose.gpu_hours, loose.idle_gpu_hours, loose.cost) == (2, 2.0, 1.0, 10.0)


def test_a_pod_of_the_cluster_that_holds_no_gpu_is_not_charged() -> None:
    cluster = snapshot([node("gpu-1")], [pod("exporter", "gpu-1", gpus=0), pod("p", "gpu-1")])
    counted = [steps(12, 12, gpu="a", pod="exporter"), steps(12, 12, gpu="b", pod="p")]
    waste = tally(
        counted,
        CFG,
        window(),
        threshold_percent=5.0,
        by=GroupBy("namespace"),
        price_of=price_of,
        cluster=cluster,
    )
    assert by_group(waste) == {"ml": (1.0, 1.0, 5.0)}
    assert waste.unattributed.series == 1


def test_the_exporters_own_pod_is_charged_to_no_team() -> None:
    # A ServiceMonitor without honorLabels: the holder in exported_*, the exporter in pod / namespace.
    exporter = {"pod": "nvidia-dcgm-exporter-x7k2p", "namespace": "gpu-operator", "container": "exporter"}
    counted = [
        SeriesSteps({**labels("a"), **exporter, "exported_pod": "p", "exported_namespace": "ml"}, 12, 6),
        SeriesSteps({**labels("b"), **exporter}, 12, 12),  # a GPU no pod holds
    ]
    waste = tally(counted, CFG, window(), threshold_percent=5.0, by=GroupBy("namespace"), price_of=price_of)
    assert by_group(waste) == {"ml": (0.5, 1.0, 2.5)}
    assert (waste.unattributed.series, waste.unattributed.gpu_hours) == (1, 1.0)


def test_mig_instances_count_as_their_slices_where_the_model_says_how_many() -> None:
    mig = {"GPU_I_ID": "1", "GPU_I_PROFILE": "3g.40gb"}
    counted = [
        steps(12, 12, gpu="a", pod="p", **mig),
        steps(12, 12, gpu="b", pod="q", model="NVIDIA A30", **mig),
    ]
    waste = tally(counted, CFG, window(), threshold_percent=5.0, by=GroupBy("namespace"), price_of=price_of)
    (ml,) = waste.groups
    assert ml.usage.allocated_gpu_hours == pytest.approx(3 / 7 + 1)
    assert any("1 MIG series (3g.40gb on NVIDIA A30) counted as one GPU" in n for n in waste.notes)


def test_idle_hours_of_a_model_without_a_price_leave_the_cost_unknown() -> None:
    counted = [steps(12, 6, gpu="a", pod="p"), steps(12, 6, gpu="b", pod="q", model="Tesla T4")]
    waste = tally(counted, CFG, window(), threshold_percent=5.0, by=GroupBy("namespace"), price_of=price_of)
    assert by_group(waste) == {"ml": (1.0, 2.0, None)}
    assert waste.totals.cost is None
    assert any("'Tesla T4' (Tesla-T4)" in note for note in waste.notes)
    # A model without a price that never idled costs nothing either way.
    busy = tally(
        [steps(12, 6, gpu="a", pod="p"), steps(12, 0, gpu="b", pod="q", model="Tesla T4")],
        CFG,
        window(),
        threshold_percent=5.0,
        by=GroupBy("namespace"),
        price_of=price_of,
    )
    assert by_group(busy) == {"ml": (0.5, 2.0, 2.5)}


def cluster_of_workloads() -> Snapshot:
    rs = OwnerRef(kind="ReplicaSet", name="serve-7d9f")
    return snapshot(
        [node("gpu-1")],
        [
            pod("serve-7d9f-a", "gpu-1", owner=rs, labels={"team": "search"}),
            pod("serve-7d9f-b", "gpu-1", owner=rs, labels={"team": "search"}),
            pod("notebook-0", "gpu-1", owner=OwnerRef(kind="StatefulSet", name="notebook"), labels={}),
        ],
        controllers=[
            controller("ReplicaSet", "serve-7d9f", owner=OwnerRef(kind="Deployment", name="serve")),
            controller("Deployment", "serve"),
        ],
    )


HISTORY = [
    steps(12, 6, gpu="a", pod="serve-7d9f-a"),
    steps(12, 3, gpu="b", pod="serve-7d9f-b"),
    steps(12, 12, gpu="c", pod="notebook-0"),
    steps(6, 6, gpu="d", pod="train-0"),  # gone from the cluster
]


def test_workloads_come_from_the_cluster_view_and_gone_pods_stay_in_their_namespace() -> None:
    waste = tally(
        HISTORY,
        CFG,
        window(),
        threshold_percent=5.0,
        by=GroupBy("workload"),
        price_of=price_of,
        cluster=cluster_of_workloads(),
    )
    assert by_group(waste) == {
        "ml/StatefulSet/notebook": (1.0, 1.0, 5.0),
        "ml/Deployment/serve": (0.75, 2.0, 3.75),
        f"ml/{GONE}": (0.5, 0.5, 2.5),
    }
    rows = {g.group: g for g in waste.groups}
    assert rows["ml/Deployment/serve"].pods == 2
    assert [w.workload for w in rows[f"ml/{GONE}"].top_workloads] == ["ml/train-0"]
    assert any("1 pod of the history no longer in the cluster" in note for note in waste.notes)
    # By namespace, the gone pod is still its namespace's.
    by_namespace = tally(
        HISTORY,
        CFG,
        window(),
        threshold_percent=5.0,
        by=GroupBy("namespace"),
        price_of=price_of,
        cluster=cluster_of_workloads(),
    )
    assert by_group(by_namespace) == {"ml": (2.25, 3.5, 11.25)}
    assert [w.workload for w in by_namespace.top_workloads] == [
        "ml/StatefulSet/notebook",
        "ml/Deployment/serve",
        "ml/train-0",
    ]


def test_labels_group_pods_and_pods_without_the_label_are_named() -> None:
    waste = tally(
        HISTORY,
        CFG,
        window(),
        threshold_percent=5.0,
        by=GroupBy.parse("label:team"),
        price_of=price_of,
        cluster=cluster_of_workloads(),
        top=1,
    )
    assert by_group(waste) == {
        "(no team label)": (1.0, 1.0, 5.0),
        "search": (0.75, 2.0, 3.75),
        f"ml/{GONE}": (0.5, 0.5, 2.5),
    }
    assert [g.namespace for g in waste.groups] == [None, None, "ml"]
    assert len(waste.top_workloads) == 1


def test_grouping_by_workload_needs_a_cluster_view() -> None:
    with pytest.raises(ValueError, match="needs a cluster view"):
        tally(HISTORY, CFG, window(), threshold_percent=5.0, by=GroupBy("workload"), price_of=price_of)


def test_series_without_a_gpu_identity_are_left_out_with_a_note() -> None:
    counted = [SeriesSteps(labels={"pod": "p", "namespace": "ml"}, covered=12, idle=12)]
    waste = tally(counted, CFG, window(), threshold_percent=5.0, by=GroupBy("namespace"), price_of=price_of)
    assert waste.groups == ()
    assert "1 series without a node or GPU UUID label left out" in waste.notes


@pytest.mark.parametrize("text", ["pod", "label:", "label: team", "labels:team", ""])
def test_group_by_accepts_only_its_three_forms(text: str) -> None:
    with pytest.raises(ValueError, match="expected namespace, workload or label:KEY"):
        GroupBy.parse(text)


def test_gpu_products_are_the_model_name_with_dashes() -> None:
    assert gpu_product("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert gpu_product("NVIDIA-L4") == "NVIDIA-L4"
