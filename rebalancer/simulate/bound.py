"""The lower bound on node-hours that `ratio` is measured against (documented in bench/README.md).

At each instant t, live pods are those the trace says run at t (arrival <= t < end), whatever the
simulator did with them. Group them by their allowed-model set c (no `gpu_spec`: every model of the node
list); D_c(t) is the class's GPU demand, sum of num_gpu x gpu_milli / 1000, and G_c the most GPUs per
node among the models c allows. Then

    LB(t) = max( ceil( sum_c D_c(t) / G_c ),  number of live pods asking for 8 GPUs )

and `lower_bound_node_hours` is the integral of LB(t) over the window, in hours. GPUs are a fluid here
(shares of different pods fill one GPU, a pod's GPUs need not sit on one node) and cpu and memory are
ignored, so no placement can use fewer nodes; a pod of 8 GPUs needs a node of its own. The bound is
computed exactly (integer milli-GPUs over a common denominator), from the jobs alone: it does not
depend on the scheduler, the autoscaler or the rebalancer, and must not be tuned.

This module must not read the clock or touch the simulated cluster.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from rebalancer.model import MILLI_PER_GPU
from rebalancer.simulate.cluster import Pool
from rebalancer.simulate.trace import Job, Window

WHOLE_NODE_GPUS = 8  # a pod asking for this many GPUs fills a node of the trace's largest shape
SECONDS_PER_HOUR = 3600


def class_capacity(models: frozenset[str] | None, pools: Sequence[Pool]) -> int:
    """G_c: the most GPUs per node among the pools of the models the class allows (0: none allowed)."""
    return max((pool.gpus for pool in pools if models is None or pool.model in models), default=0)


def lower_bound_series(jobs: Iterable[Job], pools: Sequence[Pool], window: Window) -> list[tuple[float, int]]:
    """(t, LB from t on) at every instant the bound can change inside the window, in time order.

    Jobs no node of the pools could run (G_c = 0) are not counted.
    """
    capacity: dict[frozenset[str] | None, int] = {}
    deltas: list[tuple[float, frozenset[str] | None, int, int]] = []  # time, class, milli, whole-node pods
    for job in jobs:
        start, end = max(job.arrival, window.start), min(job.end, window.end)
        if end <= start:
            continue
        if job.models not in capacity:
            capacity[job.models] = class_capacity(job.models, pools)
        if capacity[job.models] == 0:
            continue
        whole = 1 if job.num_gpu >= WHOLE_NODE_GPUS else 0
        deltas.append((start, job.models, job.gpu_demand_milli, whole))
        deltas.append((end, job.models, -job.gpu_demand_milli, -whole))
    if not deltas:
        return [(window.start, 0)]
    common = math.lcm(*(g for g in capacity.values() if g > 0))
    weight = {c: common // g for c, g in capacity.items() if g > 0}
    denominator = common * MILLI_PER_GPU
    deltas.sort(key=lambda d: d[0])
    series: list[tuple[float, int]] = []
    numerator = 0  # sum_c D_c x common / G_c, in milli-GPU
    whole_pods = 0
    if deltas[0][0] > window.start:
        series.append((window.start, 0))
    index = 0
    while index < len(deltas):
        moment = deltas[index][0]
        while index < len(deltas) and deltas[index][0] == moment:
            _, models, milli, whole = deltas[index]
            numerator += milli * weight[models]
            whole_pods += whole
            index += 1
        bound = max(-(-numerator // denominator), whole_pods)
        if not series or series[-1][1] != bound:
            series.append((moment, bound))
    return series


def lower_bound_node_hours(jobs: Iterable[Job], pools: Sequence[Pool], window: Window) -> float:
    """Integral of LB(t) over the window, in node-hours."""
    series = lower_bound_series(jobs, pools, window)
    total = 0.0
    for (moment, bound), (following, _) in zip(series, [*series[1:], (window.end, 0)], strict=True):
        total += bound * (min(following, window.end) - moment)
    return total / SECONDS_PER_HOUR
