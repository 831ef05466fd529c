"""The lower bound on node-hours, computed by hand on tiny traces."""

from __future__ import annotations

import pytest

from rebalancer.simulate.bound import lower_bound_node_hours, lower_bound_series
from rebalancer.simulate.cluster import build_pools
from rebalancer.simulate.trace import Job, TraceNode, Window

HOUR = 3600.0


def job(
    index: int,
    arrival_h: float,
    end_h: float,
    *,
    gpus: int = 1,
    milli: int = 1000,
    models: frozenset[str] | None = None,
) -> Job:
    return Job(
        index=index,
        name=f"j{index}",
        cpu_milli=1000,
        memory_mib=1024,
        num_gpu=gpus,
        gpu_milli=milli,
        models=models,
        arrival=arrival_h * HOUR,
        end=end_h * HOUR,
    )


POOLS = build_pools(
    [
        TraceNode("g2-0", 96000, 393216, 8, "G2"),
        TraceNode("g2-1", 96000, 393216, 8, "G2"),
        TraceNode("t4-0", 104000, 524288, 2, "T4"),
    ]
)


def test_three_pod_trace_by_hand() -> None:
    """
    A: 1 GPU, any model, hours [0, 2);  B: 8 GPUs, any model, [1, 3);  C: half a GPU, T4 only, [0, 4).
    G_any = 8 (G2x8), G_T4 = 2 (T4x2).

    [0,1): ceil(1/8 + 0.5/2) = ceil(0.375) = 1
    [1,2): ceil(9/8 + 0.25)  = ceil(1.375) = 2   (one 8-GPU pod: >= 1)
    [2,3): ceil(8/8 + 0.25)  = ceil(1.25)  = 2
    [3,4): ceil(0.25)                      = 1
    total 6 node-hours. Classes share the ceiling: [0,1) is 1 node, not 1 + 1.
    """
    jobs = [job(0, 0, 2), job(1, 1, 3, gpus=8), job(2, 0, 4, milli=500, models=frozenset({"T4"}))]
    window = Window(0, 4 * HOUR)
    assert lower_bound_series(jobs, POOLS, window) == [(0, 1), (HOUR, 2), (3 * HOUR, 1), (4 * HOUR, 0)]
    assert lower_bound_node_hours(jobs, POOLS, window) == pytest.approx(6.0)


def test_eight_gpu_pods_each_need_a_node_even_when_bigger_nodes_exist() -> None:
    """With 16-GPU nodes two 8-GPU pods are one node of fluid demand, but the bound counts 2."""
    pools = build_pools([TraceNode("big", 192000, 786432, 16, "H")])
    jobs = [job(0, 0, 1, gpus=8), job(1, 0, 1, gpus=8), job(2, 0, 1)]
    assert lower_bound_node_hours(jobs, pools, Window(0, HOUR)) == pytest.approx(2.0)


def test_bound_is_clipped_to_the_window_and_ignores_unrunnable_classes() -> None:
    jobs = [
        job(0, 0, 10),  # runs past the window end
        job(1, 0, 10, models=frozenset({"A100"})),  # no node of that model: not counted
    ]
    assert lower_bound_node_hours(jobs, POOLS, Window(0, 2 * HOUR)) == pytest.approx(2.0)


def test_many_shares_fill_whole_nodes_exactly() -> None:
    """16 pods of 500 milli-GPU = 8 GPUs = exactly one 8-GPU node (exact arithmetic, no 1.0000001)."""
    jobs = [job(i, 0, 1, milli=500) for i in range(16)]
    assert lower_bound_node_hours(jobs, POOLS, Window(0, HOUR)) == pytest.approx(1.0)
    jobs.append(job(16, 0, 1, milli=10))
    assert lower_bound_node_hours(jobs, POOLS, Window(0, HOUR)) == pytest.approx(2.0)
