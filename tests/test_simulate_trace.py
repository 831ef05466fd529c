"""Trace replay input: CSV parsing edge cases, the window, load scaling (replicas, seed, compress)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rebalancer.simulate import SimulationInputError, SimulationOptions, load_prices, run_simulation
from rebalancer.simulate.trace import (
    TraceError,
    TracePod,
    build_jobs,
    load_nodes,
    load_pods,
    parse_gpu_spec,
    replica_offsets,
)
from rebalancer.simulate_command import add_arguments, options_from_args

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"


def write(path: Path, header: str, *rows: str) -> Path:
    path.write_text("\n".join((header, *rows)) + "\n", encoding="utf-8")
    return path


def trace_pod(name: str, scheduled: float, deletion: float) -> TracePod:
    return TracePod(
        name=name,
        cpu_milli=4000,
        memory_mib=1024,
        num_gpu=1,
        gpu_milli=1000,
        gpu_spec=(),
        scheduled_time=scheduled,
        deletion_time=deletion,
    )


# --------------------------------------------------------------------------- CSV parsing


def test_gpu_spec_is_deduplicated_and_sorted() -> None:
    assert parse_gpu_spec("V100M32|V100M16|V100M32") == ("V100M16", "V100M32")
    assert parse_gpu_spec("") == ()
    assert parse_gpu_spec("nan") == ()
    assert parse_gpu_spec("T4| |T4") == ("T4",)


def test_pod_csv_keeps_scheduled_gpu_pods_only(tmp_path: Path) -> None:
    path = write(
        tmp_path / "pods.csv",
        POD_HEADER,
        "gpu-whole,12000,16384,2,1000,,LS,Running,0,500,10",
        "gpu-share,6000,12288,1,460,V100M16|V100M32|V100M32,BE,Succeeded,5,900,20",
        "cpu-only,8000,4096,0,0,,BE,Running,0,800,0",
        "never-scheduled,4000,4096,1,1000,T4,LS,Pending,30,700,",
        # pod_phase is unreliable: a "Failed" pod with times ran, and is kept.
        "failed-but-ran,4000,4096,1,1000,nan,LS,Failed,40,600,50",
    )
    trace = load_pods(path)
    assert trace.has_times
    assert [pod.name for pod in trace.pods] == ["gpu-whole", "gpu-share", "failed-but-ran"]
    assert trace.cpu_only_dropped == 1
    assert trace.unscheduled_dropped == 1
    whole, share, failed = trace.pods
    assert (whole.num_gpu, whole.gpu_milli, whole.gpu_spec) == (2, 1000, ())
    assert (whole.scheduled_time, whole.deletion_time) == (10, 500)
    assert (share.num_gpu, share.gpu_milli, share.gpu_spec) == (1, 460, ("V100M16", "V100M32"))
    assert failed.gpu_spec == ()


def test_multigpu_files_have_five_columns_and_no_times(tmp_path: Path) -> None:
    path = write(
        tmp_path / "multigpu.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli",
        "a,12000,16384,8,1000",
        "b,6000,12288,1,460",
        "c,4000,4096,0,0",
    )
    trace = load_pods(path)
    assert not trace.has_times
    assert [(p.name, p.num_gpu, p.gpu_milli, p.gpu_spec) for p in trace.pods] == [
        ("a", 8, 1000, ()),
        ("b", 1, 460, ()),
    ]
    assert trace.pods[0].scheduled_time is None
    assert trace.cpu_only_dropped == 1


def test_a_pod_list_without_times_cannot_be_replayed(tmp_path: Path) -> None:
    nodes = write(tmp_path / "nodes.csv", NODE_HEADER, "n1,96000,393216,8,G2")
    pods = write(
        tmp_path / "multigpu.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli", "a,1000,1024,1,1000"
    )
    with pytest.raises(SimulationInputError) as caught:
        run_simulation(SimulationOptions(nodes=nodes, pods=pods))
    assert "cannot be replayed" in caught.value.problems[0]


def test_bad_rows_are_reported_with_file_and_line(tmp_path: Path) -> None:
    path = write(
        tmp_path / "pods.csv",
        POD_HEADER,
        "ok,1000,1024,1,1000,,LS,Running,0,100,0",
        "bad,lots,1024,1,1000,,LS,Running,0,100,0",
        "worse,1000,1024,1,1500,,LS,Running,0,100,0",
    )
    with pytest.raises(TraceError) as caught:
        load_pods(path)
    problems = caught.value.problems
    assert any(f"{path}:3: cpu_milli: not a number" in p for p in problems)
    assert any(f"{path}:4: gpu_milli" in p for p in problems)


def test_rows_that_do_not_match_the_header_are_refused(tmp_path: Path) -> None:
    # A truncated row read as a pod never scheduled, and a truncated node row as a CPU node.
    pods = write(
        tmp_path / "pods.csv", POD_HEADER, "ok,1000,1024,1,1000,,LS,Running,0,100,0", "cut,8000,30000,1,1000"
    )
    nodes = write(tmp_path / "nodes.csv", NODE_HEADER, "n1,96000,786432,8", "n2,96000,786432,8,G2,extra")
    with pytest.raises(TraceError) as caught:
        load_pods(pods)
    assert caught.value.problems == (f"{pods}:3: expected 11 fields as in the header, got 5",)
    with pytest.raises(TraceError) as caught:
        load_nodes(nodes)
    assert caught.value.problems == (
        f"{nodes}:2: expected 5 fields as in the header, got 4",
        f"{nodes}:3: expected 5 fields as in the header, got 6",
    )


def test_impossible_pod_times_are_refused(tmp_path: Path) -> None:
    # Deleted before it was scheduled: silently dropped, while its deletion time still moved the window.
    # Past ten years: a replay of that window would step for ever.
    path = write(
        tmp_path / "pods.csv",
        POD_HEADER,
        "early,8000,30000,1,1000,,LS,Running,0,50,30000",
        "far,8000,30000,2,1000,V100M32,LS,Running,0,1e300,100",
    )
    with pytest.raises(TraceError) as caught:
        load_pods(path)
    assert caught.value.problems == (
        f"{path}:2: deletion_time 50 is before scheduled_time 30000",
        f"{path}:3: deletion_time: 1e300 is more than ten years of seconds (315360000)",
    )


def test_a_compression_that_stretches_the_window_past_ten_years_is_refused() -> None:
    pods = [trace_pod("a", scheduled=0, deletion=100), trace_pod("b", scheduled=0, deletion=1000)]
    with pytest.raises(TraceError) as caught:
        build_jobs(pods, compress=1e-6)
    assert caught.value.problems == (
        "--compress 1e-06 stretches the 900-second replay window past ten years (315360000 seconds)",
    )


def test_missing_columns_are_named(tmp_path: Path) -> None:
    path = write(tmp_path / "pods.csv", "name,cpu_milli,num_gpu", "a,1,1")
    with pytest.raises(TraceError, match=r"missing column.*memory_mib, gpu_milli"):
        load_pods(path)


def test_node_csv_skips_cpu_nodes(tmp_path: Path) -> None:
    path = write(
        tmp_path / "nodes.csv",
        NODE_HEADER,
        "cpu-node,32000,262144,0,",
        "g2,96000,393216,8,G2",
        "t4,104000,524288,2,T4",
        "other,32000,262144,0,nan",
    )
    assert [(n.name, n.gpus, n.model) for n in load_nodes(path)] == [("g2", 8, "G2"), ("t4", 2, "T4")]


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    nodes = write(tmp_path / "nodes.csv", NODE_HEADER, "n1,96000,393216,8,G2")
    with pytest.raises(SimulationInputError, match="cannot read"):
        run_simulation(SimulationOptions(nodes=nodes, pods=tmp_path / "absent.csv"))


# --------------------------------------------------------------------------- window and scaling


def test_window_is_min_to_max_deletion_and_warm_start_is_clipped() -> None:
    pods = [
        trace_pod("warm", scheduled=0, deletion=400),  # alive at the window start
        trace_pod("first-end", scheduled=50, deletion=100),  # ends at the window start: nothing left
        trace_pod("late", scheduled=300, deletion=1000),
    ]
    window, jobs = build_jobs(pods)
    assert (window.start, window.end) == (100, 1000)
    assert [(j.name, j.arrival, j.end) for j in jobs] == [("warm", 100, 400), ("late", 300, 1000)]


def test_compress_divides_arrivals_keeps_durations_and_shrinks_the_window() -> None:
    pods = [
        trace_pod("a", scheduled=0, deletion=100),
        trace_pod("b", scheduled=300, deletion=400),
        trace_pod("c", scheduled=500, deletion=1100),
    ]
    window, jobs = build_jobs(pods, compress=2)
    # Window [100, 1100] of length 1000 becomes [100, 600].
    assert (window.start, window.end) == (100, 600)
    # b: arrival 100 + (300 - 100) / 2 = 200, duration 100; c: 100 + 400 / 2 = 300, duration 600.
    assert [(j.name, j.arrival, j.end) for j in jobs] == [("b", 200, 300), ("c", 300, 900)]


def test_replicas_are_deterministic_for_a_seed() -> None:
    pods = [trace_pod(f"p{i}", scheduled=100 * i, deletion=100 * i + 250) for i in range(1, 11)]
    first = build_jobs(pods, replicas=4, seed=7)
    again = build_jobs(pods, replicas=4, seed=7)
    other = build_jobs(pods, replicas=4, seed=8)
    assert first == again
    assert first[1] != other[1]
    assert replica_offsets(4, 7, 1000.0) == replica_offsets(4, 7, 1000.0)
    assert replica_offsets(4, 7, 1000.0)[0] == 0.0


def test_copy_zero_is_the_trace_and_copies_shift_circularly_keeping_durations() -> None:
    pods = [trace_pod(f"p{i}", scheduled=100 * i, deletion=100 * i + 250) for i in range(1, 11)]
    window, single = build_jobs(pods)
    window3, jobs = build_jobs(pods, replicas=3, seed=1)
    assert window3 == window
    offsets = replica_offsets(3, 1, window.length)
    for copy in range(3):
        copies = [j for j in jobs if j.name.endswith(f"-r{copy}")]
        assert len(copies) == len(single)  # every arrival falls inside the window
        for job in copies:
            original = next(j for j in single if j.name == job.name.rsplit("-r", 1)[0])
            assert job.end - job.arrival == pytest.approx(original.end - original.arrival)
            expected = window.start + (original.arrival - window.start + offsets[copy]) % window.length
            assert job.arrival == pytest.approx(expected)
            assert window.start <= job.arrival < window.end
    assert [j.index for j in jobs] == list(range(len(jobs)))
    assert [j.arrival for j in jobs] == sorted(j.arrival for j in jobs)


# --------------------------------------------------------------------------- flags and prices


def test_flags_become_options() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = (
        "--nodes n.csv --pods p.csv --replicas 10 --seed 3 --compress 2.5 --rebalancer on --interval 1m30s"
    )
    args = parser.parse_args(flags.split())
    options = options_from_args(args)
    assert (options.replicas, options.seed, options.compress, options.interval) == (10, 3, 2.5, 90.0)
    assert (options.scheduler, options.rebalancer, options.policy) == ("packed", "on", None)
    with pytest.raises(SimulationInputError, match="--interval"):
        options_from_args(parser.parse_args(["--nodes", "n", "--pods", "p", "--interval", "soon"]))


def test_bad_options_are_listed_together(tmp_path: Path) -> None:
    options = SimulationOptions(
        nodes=tmp_path / "n.csv", pods=tmp_path / "p.csv", replicas=0, compress=0, policy=tmp_path / "x.yaml"
    )
    with pytest.raises(SimulationInputError) as caught:
        run_simulation(options)
    assert len(caught.value.problems) == 3  # replicas, compress, --policy without --rebalancer on


def test_prices_add_a_cost(tmp_path: Path) -> None:
    nodes = write(tmp_path / "nodes.csv", NODE_HEADER, "n1,96000,393216,8,G2")
    pods = write(
        tmp_path / "pods.csv",
        POD_HEADER,
        "a,1000,1024,1,1000,,LS,Running,0,3600,0",
        "b,1,1,1,1000,,LS,Running,0,7200,0",
    )
    prices = tmp_path / "prices.yaml"
    prices.write_text("G2: 1.5\n")
    result = run_simulation(SimulationOptions(nodes=nodes, pods=pods, prices=prices))
    # Window [3600, 7200]: one 8-GPU node for the hour, at 1.5 per GPU-hour.
    assert result.node_hours == pytest.approx(1.0)
    assert result.cost == pytest.approx(8 * 1.5)
    prices.write_text("G2: -1\nT4: cheap\n")
    with pytest.raises(SimulationInputError) as caught:
        load_prices(prices)
    assert len(caught.value.problems) == 2
    # Read as `waste` reads its prices: past 10,000 per GPU-hour (an infinite cost is no JSON), a
    # number too large for a float, a model given twice.
    prices.write_text(f"G2: 1.0e+308\nT4: {'9' * 400}\nP100: 1\nP100: 2\n")
    with pytest.raises(SimulationInputError) as caught:
        load_prices(prices)
    assert caught.value.problems == (
        f"{prices}:1: 'G2': a price must be from 0 to 10000 USD per GPU-hour",
        f"{prices}:2: 'T4': a price must be from 0 to 10000 USD per GPU-hour",
        f"{prices}:4: P100: duplicate key (also on line 3; only one value may be given)",
    )
