"""Idle GPU-hours per team: the step rules, the tally, and `rebalancer waste`'s inputs and outputs.

The Prometheus side, end to end, is in test_waste_prometheus.py.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rebalancer.cli import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, main
from rebalancer.model import OwnerRef, Snapshot
from rebalancer.policy import TelemetryConfig
from rebalancer.sources.prometheus_steps import WASTE_LABEL, idle_steps_query
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

if TYPE_CHECKING:
    from tests.prometheus_server import StubFactory

pytest_plugins = ["tests.prometheus_server"]

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo-cluster"
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


def test_one_series_read_from_two_files_is_one_series() -> None:
    end = END.timestamp()
    one = labels("a", "p")
    halves = [series([(end - 10, 0.0)], **one), series([(end - 20, 9.0), (end - 400, 50.0)], **one)]
    (counted,) = steps_from_samples(halves, CFG, window(), 5.0)
    # The last step's mean is of both files' samples (4.5: idle), not the larger of two means.
    assert (counted.covered, counted.idle) == (2, 1)


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
    assert "nv_gpu_utilization" in query and "< bool 0.05" in query and "> 1.0)" in query


def test_the_query_depends_on_the_policy_and_period_only() -> None:
    query = idle_steps_query(CFG, window(hours=24), 5.0)
    # Twice for the covered steps' means, twice for the idle ones', twice to leave impossible samples out.
    assert query.count("DCGM_FI_DEV_GPU_UTIL[299999ms]") == 6
    assert (
        "unless (min_over_time(DCGM_FI_DEV_GPU_UTIL[299999ms]) < 0 or "
        "max_over_time(DCGM_FI_DEV_GPU_UTIL[299999ms]) > 100.0)) < bool 5.0"
    ) in query
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
        steps(12, 12, gpu="a", pod="p", **mig),  # an A100: 3 of its 7 compute slices
        steps(12, 12, gpu="b", pod="q", model="NVIDIA A30", GPU_I_ID="1", GPU_I_PROFILE="2g.12gb"),  # 2 of 4
        steps(12, 12, gpu="c", pod="r", model="NVIDIA RTX 6000", **mig),  # slices unknown
    ]
    waste = tally(counted, CFG, window(), threshold_percent=5.0, by=GroupBy("namespace"), price_of=price_of)
    (ml,) = waste.groups
    assert ml.usage.allocated_gpu_hours == pytest.approx(3 / 7 + 2 / 4 + 1)
    assert any("1 MIG series (3g.40gb on NVIDIA RTX 6000) counted as one GPU" in n for n in waste.notes)


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


# --------------------------------------------------------------------------- the command


def pod_json(
    name: str, namespace: str, node_name: str, owner: tuple[str, str], team: str | None
) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "labels": {"team": team} if team else {},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1], "uid": "x", "controller": True}
            ],
        },
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Running"},
    }


# (namespace, pod, node, GPU model, controller, team label, utilisation of its minutes)
SmallGpu = tuple[str | None, str | None, str, str, tuple[str, str] | None, str | None, Callable[[int], float]]
SMALL: tuple[SmallGpu, ...] = (
    ("ml", "notebook-0", "a100-1", A100, ("StatefulSet", "notebook"), "science", lambda m: 1.0),
    ("ml", "train-0", "a100-1", A100, ("Job", "train"), "science", lambda m: 90.0 if m % 30 < 15 else 0.0),
    ("serve", "infer-0", "t4-1", "Tesla T4", ("ReplicaSet", "infer-5c"), None, lambda m: 0.0),
    (None, None, "a100-1", A100, None, None, lambda m: 0.0),
)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A snapshot directory: two nodes, three GPU pods, a GPU no pod holds, two hours of samples."""
    directory = tmp_path_factory.mktemp("small")
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    objects: list[dict[str, object]] = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": gpu_product(model)}},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "4"}},
        }
        for name, model in (("a100-1", A100), ("t4-1", "Tesla T4"))
    ]
    for index, (namespace, name, node_name, model, owner, team, util) in enumerate(SMALL):
        found = labels(str(index), name, namespace or "", model=model, node_name=node_name, gpu=str(index))
        text = ",".join(f'{k}="{v}"' for k, v in sorted(found.items()))
        lines += [
            f"DCGM_FI_DEV_GPU_UTIL{{{text}}} {util(m)!r} {END.timestamp() - 60 * m:.3f}"
            for m in range(119, -1, -1)
        ]
        if name is not None and namespace is not None and owner is not None:
            objects.append(pod_json(name, namespace, node_name, owner, team))
    (directory / "cluster.json").write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )
    (directory / "dcgm.om").write_text("\n".join([*lines, "# EOF"]) + "\n")
    (directory / "snapshot.yaml").write_text(f"now: {END.isoformat()}\n")
    return directory


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["waste", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def in_small(small: Path, *argv: str) -> tuple[str, ...]:
    return ("--snapshot", str(small), "--since", "2h", *argv)


def test_json_and_csv_give_the_same_groups(capsys: pytest.CaptureFixture[str], small: Path) -> None:
    code, out, err = run(capsys, *in_small(small, "--by", "workload", "--output", "json"))
    assert code == EXIT_OK, err
    report = json.loads(out)
    assert list(report) == [
        "period",
        "step_seconds",
        "threshold_percent",
        "by",
        "history",
        "currency",
        "groups",
        "totals",
        "unattributed",
        "top_workloads",
        "notes",
    ]
    assert report["period"] == {
        "start": "2026-10-09T22:00:00Z",
        "end": "2026-10-10T00:00:00Z",
        "seconds": 7200,
    }
    assert (report["step_seconds"], report["threshold_percent"], report["by"]) == (300, 5.0, "workload")
    usage = {"idle_gpu_hours", "allocated_gpu_hours", "idle_share", "cost"}
    for group in report["groups"]:
        assert set(group) == {"group", "namespace", "pods", "top_workloads"} | usage
        for entry in group["top_workloads"]:
            assert set(entry) == {"workload", "namespace", "pods"} | usage
    assert set(report["totals"]) == {"pods"} | usage
    assert set(report["unattributed"]) == {"series", "gpu_hours", "idle_gpu_hours", "cost"}
    rows = {g["group"]: g for g in report["groups"]}
    assert set(rows) == {"ml/StatefulSet/notebook", "ml/Job/train", "serve/ReplicaSet/infer-5c"}
    assert rows["serve/ReplicaSet/infer-5c"]["cost"] is None  # a T4: no price in the policy
    assert report["totals"]["allocated_gpu_hours"] == pytest.approx(
        sum(g["allocated_gpu_hours"] for g in report["groups"])
    )

    code, out, err = run(capsys, *in_small(small, "--by", "workload", "--output", "csv"))
    assert code == EXIT_OK, err
    table = list(csv.reader(io.StringIO(out)))
    assert table[0] == [
        "group",
        "namespace",
        "pods",
        "idle_gpu_hours",
        "allocated_gpu_hours",
        "idle_share",
        "cost",
    ]
    assert [row[0] for row in table[1:]] == [g["group"] for g in report["groups"]]
    for row, group in zip(table[1:], report["groups"], strict=True):
        assert row[1] == group["namespace"]
        assert int(row[2]) == group["pods"]
        assert [float(cell) if cell else None for cell in row[3:]] == [
            group[key] for key in ("idle_gpu_hours", "allocated_gpu_hours", "idle_share", "cost")
        ]


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_human_formats_show_the_groups_and_the_total(
    capsys: pytest.CaptureFixture[str], small: Path, fmt: str
) -> None:
    code, out, err = run(capsys, *in_small(small, "--output", fmt))
    assert code == EXIT_OK, err
    assert "Idle GPU-hours by namespace, 2026-10-09T22:00:00Z to 2026-10-10T00:00:00Z" in out
    assert "ml" in out and "serve" in out
    assert ("TOTAL" if fmt == "text" else "**total**") in out
    assert "not attributed to any pod (unallocated GPUs, leaked VRAM): 2.00 GPU-hours in 1 series" in out
    assert "no price for GPU model 'Tesla T4'" in out


def test_the_demo_cluster_shows_its_idle_notebooks(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--snapshot", str(DEMO), "--since", "2h", "--output", "json")
    assert code == EXIT_OK, err
    report = json.loads(out)
    # The demo's notebooks idle for hours; its GPU holding leaked VRAM has no pod.
    assert [w["workload"] for w in report["top_workloads"]] == [
        "notebooks/StatefulSet/alice-llm-playground",
        "notebooks/StatefulSet/bob-eval-harness",
    ]
    assert report["unattributed"]["series"] >= 1


def test_the_readme_example_is_what_the_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Idle GPU-hours by team", 1)[1]
    command = next(line for line in section.splitlines() if "--snapshot examples/demo-cluster" in line)
    argv = command.split("#", 1)[0].split()
    assert argv[:2] == ["rebalancer", "waste"]
    shown = section.split("The last one prints:", 1)[1].split("```", 2)[1].lstrip("\n")
    code, out, err = run(capsys, *(str(ROOT / a) if a.startswith("examples/") else a for a in argv[2:]))
    assert code == EXIT_OK, err
    assert out.replace(str(ROOT) + "/", "") == shown


def prices_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_prices_file_replaces_the_policy_prices(
    capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path
) -> None:
    # Keyed by DCGM's modelName or by the node label's form: both name the same GPU.
    path = prices_file(tmp_path, "NVIDIA A100-SXM4-80GB: 2.0\nTesla-T4: 0.5\n")
    code, out, err = run(capsys, *in_small(small, "--prices", str(path), "--output", "json"))
    assert code == EXIT_OK, err
    report = json.loads(out)
    rows = {g["group"]: g for g in report["groups"]}
    assert rows["ml"]["cost"] == pytest.approx(rows["ml"]["idle_gpu_hours"] * 2.0, abs=0.01)
    assert rows["serve"]["cost"] == pytest.approx(rows["serve"]["idle_gpu_hours"] * 0.5, abs=0.01)
    assert report["unattributed"]["cost"] == pytest.approx(
        report["unattributed"]["gpu_hours"] * 2.0, abs=0.01
    )
    assert report["notes"] == []


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        (
            "NVIDIA-L4: cheap\nNVIDIA-A100-SXM4-80GB: -1\nNVIDIA-H100-80GB-HBM3: true\n",
            [
                ":1: 'NVIDIA-L4': expected USD per GPU-hour (a number), got 'cheap'",
                ":2: 'NVIDIA-A100-SXM4-80GB': a price must be from 0 to 10000 USD per GPU-hour",
                ":3: 'NVIDIA-H100-80GB-HBM3': expected USD per GPU-hour (a number), got True",
            ],
        ),
        ("- NVIDIA-L4\n", [":1: expected a mapping of GPU model to USD per GPU-hour"]),
        ("", [":1: expected a mapping of GPU model to USD per GPU-hour (NVIDIA-L4: 1.15), got nothing"]),
        ("NVIDIA-L4: [1\n", [": YAML syntax error"]),
        ("NVIDIA L4: 1\nNVIDIA-L4: 2\n", [":2: 'NVIDIA-L4': NVIDIA-L4 is priced twice, 1.0 and 2"]),
        (f"NVIDIA-L4: {'9' * 400}\n", [":1: 'NVIDIA-L4': a price must be from 0 to 10000 USD per GPU-hour"]),
        (
            "NVIDIA-L4: 1\nNVIDIA-L4: 2\n",
            [":2: NVIDIA-L4: duplicate key (also on line 1; only one value may be given)"],
        ),
    ],
    ids=["values", "a-list", "empty", "syntax", "twice", "huge", "duplicate-key"],
)
def test_a_bad_prices_file_is_exit_2_naming_file_line_and_model(
    capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path, text: str, problems: list[str]
) -> None:
    path = prices_file(tmp_path, text)
    code, out, err = run(capsys, *in_small(small, "--prices", str(path)))
    assert code == EXIT_BAD_INPUT
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == len(problems)
    for line, problem in zip(lines, problems, strict=True):
        assert line.startswith(f"rebalancer: error: {path}")
        assert problem in line


def test_a_missing_prices_file_is_exit_2(
    capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path
) -> None:
    code, _, err = run(capsys, *in_small(small, "--prices", str(tmp_path / "nope.yaml")))
    assert code == EXIT_BAD_INPUT
    assert err.startswith(f"rebalancer: error: {tmp_path / 'nope.yaml'}: cannot read prices")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("--since", "1h", "--step", "7m"),
            "--since / --step: the period (1h) is not a whole number of steps (7m)",
        ),
        (
            ("--step", "10s"),
            "--step 10s is shorter than telemetry.scrape_interval (15s): steps without a sample",
        ),
        (("--until", "2026-11-29"), "--until: '2026-11-29' is a date; give a time with a timezone"),
        (
            ("--until", "0001-01-01T00:00:00Z"),
            "--until / --since: the period would start before 1970-01-01T00:00:00Z, older than any history",
        ),
        (
            ("--until", "1970-01-01T01:00:00Z", "--since", "2h"),
            "--until / --since: the period would start before 1970-01-01T00:00:00Z, older than any history",
        ),
        (("--kubeconfig", "k"), "--snapshot and --kubeconfig / --context name two cluster views: give one"),
        (("--prometheus-url", "ftp://x"), "--prometheus-url: expected an http(s):// URL (got 'ftp://x')"),
    ],
)
def test_bad_flags_are_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], small: Path, argv: tuple[str, ...], message: str
) -> None:
    code, out, err = run(capsys, "--snapshot", str(small), *argv)
    assert code == EXIT_BAD_INPUT
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"rebalancer: error: waste: {message}")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--by", "team"), "argument --by: expected namespace, workload or label:KEY, got 'team'"),
        (("--since", "soon"), "argument --since: invalid duration 'soon'"),
        (("--step", "0s"), "argument --step: expected a positive duration, got '0s'"),
        (("--top", "-1"), "argument --top: expected a number of entries (0 or more), got '-1'"),
        (("--top", "²"), "argument --top: expected a number of entries (0 or more), got '²'"),
    ],
)
def test_unparsable_flags_are_exit_2(
    capsys: pytest.CaptureFixture[str], small: Path, argv: tuple[str, ...], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["waste", *in_small(small, *argv)])
    assert exc.value.code == EXIT_BAD_INPUT
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"rebalancer: error: {message}")


def test_without_any_history_it_says_where_to_find_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys)
    assert code == EXIT_BAD_INPUT
    assert "waste: no history: pass --prometheus-url URL" in err


def answered(
    samples: Sequence[tuple[Mapping[str, str], float]],
) -> Callable[[dict[str, str]], tuple[int, bytes]]:
    result = [{"metric": dict(labels), "value": [END.timestamp(), repr(value)]} for labels, value in samples]
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
    return lambda _params: (200, body)


def test_prometheus_answers_become_the_table(
    capsys: pytest.CaptureFixture[str], stub_prometheus: StubFactory
) -> None:
    pod_labels = labels("a", "p")
    stub = stub_prometheus(
        responder=answered(
            [({**pod_labels, WASTE_LABEL: "covered"}, 12.0), ({**pod_labels, WASTE_LABEL: "idle"}, 6.0)]
        )
    )
    code, out, err = run(
        capsys, "--prometheus-url", stub.url, "--since", "1h", "--until", END.isoformat(), "--output", "json"
    )
    assert code == EXIT_OK, err
    assert len(stub.requests) == 1
    (asked,) = stub.requests
    assert asked["time"] == f"{END.timestamp():.3f}"
    assert asked["query"] == idle_steps_query(CFG, window(), 5.0)
    (group,) = json.loads(out)["groups"]
    assert (group["group"], group["idle_gpu_hours"], group["allocated_gpu_hours"]) == ("ml", 0.5, 1.0)


@pytest.mark.parametrize(
    ("samples", "problem"),
    [
        ([(labels("a", "p"), 1.0)], f"a series without its {WASTE_LABEL} label"),
        ([({**labels("a", "p"), WASTE_LABEL: "covered"}, 1.5)], "a step count of 1.5 is not a count"),
        ([({**labels("a", "p"), WASTE_LABEL: "idle"}, 2.0)], "2 idle of None covered steps"),
    ],
)
def test_an_impossible_prometheus_answer_is_exit_1(
    capsys: pytest.CaptureFixture[str],
    stub_prometheus: StubFactory,
    samples: Sequence[tuple[Mapping[str, str], float]],
    problem: str,
) -> None:
    stub = stub_prometheus(responder=answered(samples))
    code, out, err = run(capsys, "--prometheus-url", stub.url, "--since", "1h", "--until", END.isoformat())
    assert code == EXIT_FAILED
    assert out == ""
    assert err.startswith(f"rebalancer: error: waste: Prometheus at {stub.url}: ")
    assert problem in err


def test_prometheus_down_is_exit_1(capsys: pytest.CaptureFixture[str], stub_prometheus: StubFactory) -> None:
    stub = stub_prometheus(responder=lambda _params: (503, b"overloaded"))
    code, _, err = run(capsys, "--prometheus-url", stub.url, "--since", "1h", "--until", END.isoformat())
    assert code == EXIT_FAILED
    assert "HTTP 503" in err and "Traceback" not in err
