"""The replay engine on small synthetic traces whose answers are worked out by hand."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rebalancer.placement import ClusterState
from rebalancer.policy import parse_policy
from rebalancer.simulate import SimulationOptions, result_to_dict, run_simulation
from rebalancer.simulate.cluster import InvariantViolation, SimCluster
from rebalancer.simulate.engine import EngineConfig, Replay, simulate
from rebalancer.simulate.rebalancers import (
    PACKED_SCHEDULER,
    Eviction,
    HighNodeUtilization,
    PolicyRebalancer,
    SnapshotBuilder,
    TickPlan,
    build_pod,
    default_policy,
    replay_policy,
)
from rebalancer.simulate.result import render
from rebalancer.simulate.trace import Job, TraceNode, Window
from tests.builders import replace
from tests.test_simulate_cli import REQUIRED_KEYS

HOUR = 3600.0


def g2(name: str, cpu: int = 96000) -> TraceNode:
    return TraceNode(name, cpu, 393216, 8, "G2")


def t4(name: str) -> TraceNode:
    return TraceNode(name, 104000, 524288, 2, "T4")


def job(
    index: int,
    arrival: float,
    end: float,
    *,
    gpus: int = 1,
    milli: int = 1000,
    cpu: int = 4000,
    memory: int = 1024,
    models: frozenset[str] | None = None,
) -> Job:
    return Job(
        index=index,
        name=f"j{index:02d}",
        cpu_milli=cpu,
        memory_mib=memory,
        num_gpu=gpus,
        gpu_milli=milli,
        models=models,
        arrival=arrival,
        end=end,
    )


# --------------------------------------------------------------------------- consolidation


def consolidation_trace() -> tuple[list[TraceNode], list[Job]]:
    """24 one-GPU jobs fill three 8-GPU nodes at t=0 (packed: j00-j07 on g2-a, j08-j15 on g2-b,
    j16-j23 on g2-c). At 1h six jobs end on each of g2-a and g2-b, leaving both at 2/8 GPUs while
    g2-c stays full. j00 and j01 end at 1.5h, everything else at the window end (2h)."""
    nodes = [g2("g2-a"), g2("g2-b"), g2("g2-c")]
    jobs: list[Job] = []
    for i in range(24):
        end = 2 * HOUR
        if 2 <= i <= 7 or 10 <= i <= 15:
            end = HOUR
        elif i in (0, 1):
            end = 1.5 * HOUR
        jobs.append(job(i, 0, end))
    return nodes, jobs


def test_consolidation_frees_exactly_one_node() -> None:
    nodes, jobs = consolidation_trace()
    window = Window(0, 2 * HOUR)
    off = simulate(nodes, jobs, window, EngineConfig(rebalancer="off", check_invariants=True))
    on = simulate(nodes, jobs, window, EngineConfig(rebalancer="on", check_invariants=True))

    # Without the rebalancer g2-a empties when j00/j01 end at 1.5h, and goes 10 minutes later.
    assert off.node_hours == pytest.approx(2 + 2 + 1.5 + 1 / 6)
    assert off.evictions == 0
    # At 1h (the first tick where the nodes are 1h old) g2-a is drained onto g2-b: its two jobs move, g2-b
    # now receives pods so it is not drained too, g2-c is full. g2-a is removed 10 minutes later.
    assert on.evictions == 2
    assert on.max_evictions_per_pod == 1
    assert on.approved_proposals == 1
    assert on.nodes_removed == 1
    assert on.node_hours == pytest.approx(2 + 2 + (HOUR + 600) / HOUR)
    assert on.misplaced_evictions == 0
    assert on.pending_pod_hours == 0
    # Each moved job had run 1h on one GPU: that work is lost.
    assert on.lost_gpu_hours == pytest.approx(2.0)
    # Moved jobs still end at 1.5h: 24 GPU-h in the first hour, 10 GPUs x 1h + 2 GPUs x 0.5h after.
    assert on.gpu_hours_used == pytest.approx(24 + 10 + 1)
    assert off.gpu_hours_used == pytest.approx(on.gpu_hours_used)
    # LB: 24 GPUs -> 3 nodes for 1h, then 12 GPUs -> 2 nodes (1.5h to 2h: 10 GPUs -> 2).
    assert on.lower_bound_node_hours == pytest.approx(5.0)
    assert on.ratio == pytest.approx((5 + 1 / 6) / 5)


def share_trace() -> tuple[list[TraceNode], list[Job]]:
    """Shares 300, 500, 600 arrive on t (2 devices) in that order: best fit leaves its devices free
    [200, 400] (600 | 300 + 500 would leave [100, 500]); a 450 share lands on u."""
    nodes = [TraceNode("t", 32000, 131072, 2, "S"), TraceNode("u", 32000, 131072, 2, "S")]
    jobs = [
        job(0, 0, 2 * HOUR, milli=300, cpu=100),
        job(1, 10, 2 * HOUR, milli=500, cpu=100),
        job(2, 20, 2 * HOUR, milli=600, cpu=100),
        job(3, 30, 2 * HOUR, milli=450, cpu=100),
    ]
    return nodes, jobs


def test_the_snapshot_carries_the_gpu_devices_each_share_runs_on() -> None:
    """Placement sees the devices the replay gave the shares (free [200, 400] on t), not shares
    re-derived largest first ([100, 500]), so it never predicts that the 450 share on u fits t."""
    nodes, jobs = share_trace()
    window = Window(0, 3900 + 100)
    replay = Replay(nodes, jobs, window, EngineConfig(rebalancer="on", check_invariants=True))
    result = replay.run()
    assert [replay.jobs[i].name for i in replay.cluster.nodes["t"].jobs] == ["j00", "j01", "j02"]
    assert replay.cluster.nodes["t"].devices == [200, 400]
    state = ClusterState.from_snapshot(replay.builder.snapshot(replay.now, replay.cluster))
    assert sorted(state.gpu_free_milli("t")) == [200, 400]
    assert result.evictions == 0
    assert result.misplaced_evictions == 0


class _DrainU:
    """A rebalancer that evicts u's share at its first tick (draining u unless `drain` is off),
    predicting it lands on t, with the nodes `tied` with t."""

    def __init__(self, *, drain: bool = True, tied: frozenset[str] = frozenset()) -> None:
        self.ticks = 0
        self.drain = ("u",) if drain else ()
        self.tied = tied

    def plan(self, now: float, cluster: SimCluster) -> TickPlan:
        self.ticks += 1
        if self.ticks > 1:
            return TickPlan()
        return TickPlan(evictions=(Eviction(job=3, target="t", tied=self.tied),), drain=self.drain)


def test_drain_is_abandoned_when_the_predicted_room_is_not_there() -> None:
    """The 450 share evicted from u fits no device of t (free [200, 400]) and nothing else has room, so
    the drain is abandoned: u's taint comes off and the pod lands back on u, elsewhere than predicted."""
    nodes, jobs = share_trace()
    replay = Replay(nodes, jobs, Window(0, 400), EngineConfig(rebalancer="on", check_invariants=True))
    replay.rebalancer = _DrainU()
    result = replay.run()
    assert result.evictions == 1
    assert result.misplaced_evictions == 1
    assert result.equivalent_evictions == 0
    assert replay.cluster.location[3].name == "u"
    assert not replay.cluster.nodes["u"].draining
    assert result.pending_pod_hours == 0
    assert result.lost_gpu_hours == pytest.approx(0.45 * (300 - 30) / HOUR)


@pytest.mark.parametrize(("tied", "equivalent"), [(frozenset({"t", "u"}), 1), (frozenset({"t"}), 0)])
def test_a_pod_landing_on_a_node_tied_with_its_target_counts_as_equivalent(
    tied: frozenset[str], equivalent: int
) -> None:
    nodes, jobs = share_trace()
    replay = Replay(nodes, jobs, Window(0, 400), EngineConfig(rebalancer="on", check_invariants=True))
    replay.rebalancer = _DrainU(drain=False, tied=tied)
    result = replay.run()
    assert replay.cluster.location[3].name == "u"
    assert result.misplaced_evictions == 1
    assert result.equivalent_evictions == equivalent
    assert result_to_dict(result)["equivalent_evictions"] == equivalent


class _EvictInOrder:
    """At its first tick, evicts j02 then j03, predicting j02 lands on x and j03 on y."""

    def __init__(self) -> None:
        self.ticks = 0

    def plan(self, now: float, cluster: SimCluster) -> TickPlan:
        self.ticks += 1
        if self.ticks > 1:
            return TickPlan()
        return TickPlan(evictions=(Eviction(job=2, target="x"), Eviction(job=3, target="y")))


def test_evicted_pods_are_re_placed_first_in_first_out_as_kube_schedulers_queue_does() -> None:
    """Replacements reach kube-scheduler's queue in eviction order, and pods of equal priority are
    scheduled first in, first out: j02 (evicted first) takes x's one free GPU although j03 asks for
    more cpu, which would put it first in a pass of waiting pods."""
    nodes = [g2("x"), g2("y")]
    jobs = [
        job(0, 0, HOUR, gpus=7),  # x: 7 of 8 GPUs
        job(1, 0, HOUR, gpus=4),  # y: 4 of 8
        job(2, 0, HOUR, cpu=1000),
        job(3, 0, HOUR, cpu=8000),  # at t=0 the larger cpu goes first: j03 on x, j02 on y
    ]
    replay = Replay(nodes, jobs, Window(0, 400), EngineConfig(rebalancer="on", check_invariants=True))
    replay.rebalancer = _EvictInOrder()
    result = replay.run()
    assert result.evictions == 2
    assert (replay.cluster.location[2].name, replay.cluster.location[3].name) == ("x", "y")
    assert result.misplaced_evictions == 0


# --------------------------------------------------------------------------- evictions and pending time


@pytest.mark.parametrize(
    ("e_end", "pending_seconds", "e_runs", "n2_removed_at"),
    [
        # E is re-placed on n2 when P ends at 3500, runs until its own end 3550.
        (3550.0, 180 + (3500 - 300), 240 + 50, 3550 + 600),
        # E's end (2000) comes while it is still pending: it waited 1700 s and never ran again.
        (2000.0, 180 + (2000 - 300), 240, 3500 + 600),
    ],
)
def test_evicted_pods_keep_their_end_time_and_count_pending_time(
    e_end: float, pending_seconds: float, e_runs: float, n2_removed_at: float
) -> None:
    """Pool of two 8-GPU nodes. Y (7 GPUs, 90 cores) starts n1 at 0; E (1 GPU, 10 cores) cannot share
    n1's cpu and starts n2 at 60; P (8 GPUs) arrives at 120 and waits: the pool is used up. At the
    300 s tick HighNodeUtilization finds n2 at 12.5 % and n1 with 1 free GPU, so it evicts E; P (larger)
    takes n2 first and E waits until P ends at 3500."""
    nodes = [g2("n1"), g2("n2")]
    jobs = [
        job(0, 0, 2 * HOUR, gpus=7, cpu=90000),  # Y
        job(1, 60, e_end, cpu=10000),  # E
        job(2, 120, 3500, gpus=8, cpu=8000),  # P
    ]
    window = Window(0, 2 * HOUR)
    result = simulate(nodes, jobs, window, EngineConfig(rebalancer="descheduler-hnu", check_invariants=True))
    assert result.evictions == 1
    assert result.pending_pod_hours == pytest.approx(pending_seconds / HOUR)
    assert result.lost_gpu_hours == pytest.approx(240 / HOUR)
    y, p = 7 * 2 * HOUR, 8 * (3500 - 300)
    assert result.gpu_hours_used == pytest.approx((y + p + e_runs) / HOUR)
    assert result.node_hours == pytest.approx((2 * HOUR + n2_removed_at - 60) / HOUR)
    assert result.pending_at_end == 0


# --------------------------------------------------------------------------- autoscaler


def test_autoscaler_prefers_most_gpus_then_larger_pool_and_respects_caps() -> None:
    nodes = [g2("g2-0"), TraceNode("g3-0", 128000, 786432, 8, "G3"), g2("g2-1"), t4("t4-0"), t4("t4-1")]
    cluster = SimCluster(nodes)
    any_model = job(0, 0, 1)
    t4_only = job(1, 0, 1, models=frozenset({"T4"}))
    assert cluster.pool_for(any_model) is not None
    assert cluster.pool_for(any_model).name == "G2x8"  # type: ignore[union-attr]  # 8 GPUs, 2 nodes > G3's 1
    assert cluster.pool_for(t4_only).name == "T4x2"  # type: ignore[union-attr]
    big_cpu = job(2, 0, 1, gpus=8, cpu=120000)
    assert cluster.pool_for(big_cpu).name == "G3x8"  # type: ignore[union-attr]  # only G3 has the cores
    g2_pool = next(pool for pool in cluster.pools if pool.name == "G2x8")
    for _ in range(2):
        cluster.add_node(g2_pool, 0)
    assert cluster.pool_for(any_model).name == "G3x8"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="no nodes left"):
        cluster.add_node(g2_pool, 0)


def test_pending_when_pools_are_used_up_and_scale_down_after_ten_minutes() -> None:
    nodes = [t4("t4-0")]
    jobs = [
        job(0, 0, 1000, gpus=2, models=frozenset({"T4"})),
        job(1, 100, 3000, models=frozenset({"T4"})),  # waits 900 s for job 0
        job(2, 200, 3000, models=frozenset({"G2"})),  # no G2 pool: never runs, left out of `pods`
    ]
    result = simulate(nodes, jobs, Window(0, 4000), EngineConfig(check_invariants=True))
    assert result.pods == 2
    assert result.unplaceable_pods == 1
    assert result.pending_pod_hours == pytest.approx(900 / HOUR)
    # t4-0 from 0 until empty at 3000 + 10 minutes.
    assert result.node_hours == pytest.approx(3600 / HOUR)
    assert result.nodes_added == 1
    assert result.nodes_removed == 1


# --------------------------------------------------------------------------- scheduler models


def test_packed_and_spread_choose_differently() -> None:
    nodes = [g2("a"), g2("b")]
    three, one = job(0, 0, HOUR, gpus=3), job(1, 0, HOUR)
    for scheduler, expected in (("packed", "a"), ("spread", "b")):
        cluster = SimCluster(nodes, scheduler)  # type: ignore[arg-type]
        a = cluster.add_node(cluster.pools[0], 0)
        cluster.add_node(cluster.pools[0], 0)
        cluster.place(three, a, 0)
        chosen = cluster.best_node(one)
        assert chosen is not None
        assert chosen.name == expected  # most allocated vs least allocated


def test_shares_pack_per_device() -> None:
    cluster = SimCluster([t4("t4-0")])
    node = cluster.add_node(cluster.pools[0], 0)
    shares = [job(i, 0, 1, milli=m, cpu=100) for i, m in enumerate((600, 500, 400, 600))]
    for share in shares[:3]:
        chosen = cluster.best_node(share)
        assert chosen is node
        cluster.place(share, node, 0)
    # 600 -> dev0, 500 -> dev1 (dev0 has 400), 400 -> dev0 (best fit): free [0, 500].
    assert node.devices == [0, 500]
    assert cluster.best_node(shares[3]) is None  # 600 fits no single device, though 500 free in total


def test_the_packed_scheduler_model_fills_larger_nodes_first() -> None:
    # The profile's addedAffinity: a pod that may run on both prefers the 8-GPU node, though the 2-GPU
    # node would be fuller once it is placed; a T4-only pod has only the T4 node to go to.
    cluster = SimCluster([g2("g2-0"), t4("t4-0")])
    g2_node = cluster.add_node(cluster.pools[0], 0)
    t4_node = cluster.add_node(cluster.pools[1], 0)
    cluster.place(job(0, 0, HOUR, gpus=4), g2_node, 0)
    cluster.place(job(1, 0, HOUR), t4_node, 0)
    anywhere, t4_only = job(2, 0, HOUR), job(3, 0, HOUR, models=frozenset({"T4"}))
    assert t4_node.score(anywhere) > g2_node.score(anywhere)
    assert cluster.best_node(anywhere) is g2_node
    assert cluster.best_node(t4_only) is t4_node


def test_packed_scheduler_model_agrees_with_placement() -> None:
    """The simulator's packed choice is what `ClusterState.best_node` predicts on the same state."""
    rng = random.Random(3)
    nodes = [
        g2("g2-0"),
        g2("g2-1", cpu=64000),
        t4("t4-0"),
        t4("t4-1"),
        TraceNode("v-0", 96000, 786432, 8, "V100M32"),
    ]
    cluster = SimCluster(nodes)
    for pool in cluster.pools:
        for _ in pool.templates:
            cluster.add_node(pool, 0)
    jobs = [
        job(
            i,
            0,
            1,
            gpus=rng.choice((1, 1, 1, 2, 4)),
            cpu=rng.choice((2000, 8000, 16000, 30000)),
            memory=rng.choice((1024, 65536, 200000)),
            models=rng.choice((None, None, frozenset({"T4"}), frozenset({"G2", "V100M32"}))),
        )
        for i in range(40)
    ]
    builder = SnapshotBuilder(jobs, PACKED_SCHEDULER)
    compared = 0
    for candidate in jobs:
        state = ClusterState.from_snapshot(builder.snapshot(0, cluster))
        expected = state.best_node(build_pod(candidate, None, None, PACKED_SCHEDULER))
        chosen = cluster.best_node(candidate)
        assert (chosen.name if chosen else None) == expected, candidate
        if chosen is not None:
            cluster.place(candidate, chosen, 0)
            compared += 1
    assert compared >= 10


def test_the_real_rebalancer_spends_each_workloads_disruption_budget() -> None:
    # j00 alone on g2-a, 5 GPUs taken on g2-b: g2-a is drained onto g2-b at every tick it is asked.
    cluster = SimCluster([g2("g2-a"), g2("g2-b")])
    (pool,) = cluster.pools
    lone, busy = cluster.add_node(pool, 0), cluster.add_node(pool, 0)
    jobs = [job(i, 0, 48 * HOUR) for i in range(6)]
    cluster.place(jobs[0], lone, 0)
    for filler in jobs[1:]:
        cluster.place(filler, busy, 0)
    document = {
        "strategies": [{"name": "gpu-consolidation", "args": {"max_utilization_percent": None}}],
        "guards": {
            "min_pod_age": 0,
            "cooldown": 0,
            "max_disruptions_per_workload": 2,
            "disruption_window": "24h",
        },
    }
    rebalancer = PolicyRebalancer(parse_policy(document), SnapshotBuilder(jobs, PACKED_SCHEDULER))

    # The cluster is left as it is, so each tick proposes the same drain: twice a day at most.
    moved = [bool(rebalancer.plan(t * HOUR, cluster).evictions) for t in (1, 2, 3, 24, 25.5, 26)]
    assert moved == [True, True, False, False, True, True]
    assert rebalancer.refused == {"disruption-budget": 2}


def test_the_default_policy_drains_in_a_replay_evicting_in_the_order_it_placed_the_pods() -> None:
    # g2-a holds j00 (1 GPU) and j01 (2 GPUs), under half allocated; g2-b has room for both.
    cluster = SimCluster([g2("g2-a"), g2("g2-b")])
    (pool,) = cluster.pools
    lone, busy = cluster.add_node(pool, 0), cluster.add_node(pool, 0)
    jobs = [job(0, 0, 48 * HOUR), job(1, 0, 48 * HOUR, gpus=2), *(job(i, 0, 48 * HOUR) for i in range(2, 6))]
    cluster.place(jobs[0], lone, 0)
    cluster.place(jobs[1], lone, 0)
    for filler in jobs[2:]:
        cluster.place(filler, busy, 0)
    loaded, _ = replay_policy(default_policy())
    rebalancer = PolicyRebalancer(loaded, SnapshotBuilder(jobs, PACKED_SCHEDULER))
    tick = rebalancer.plan(2 * HOUR, cluster)
    assert tick.drain == ("g2-a",)
    assert [(e.job, e.target) for e in tick.evictions] == [(1, "g2-b"), (0, "g2-b")]


# --------------------------------------------------------------------------- invariants


def random_trace(seed: int) -> tuple[list[TraceNode], list[Job], Window]:
    rng = random.Random(seed)
    nodes = [g2(f"g2-{i}") for i in range(4)]
    nodes += [t4(f"t4-{i}") for i in range(3)]
    nodes += [TraceNode(f"v-{i}", 96000, 786432, 8, "V100M32") for i in range(2)]
    nodes += [TraceNode(f"p-{i}", 16000, 122880, 2, "P100") for i in range(3)]
    specs = (None, None, None, frozenset({"T4"}), frozenset({"G2"}), frozenset({"V100M32", "P100"}))
    jobs = []
    for i in range(160):
        arrival = rng.uniform(0, 6 * HOUR)
        gpus = rng.choice((1, 1, 1, 1, 2, 4, 8))
        milli = rng.choice((1000, 1000, 460, 250, 700)) if gpus == 1 else 1000
        jobs.append(
            job(
                i,
                arrival,
                arrival + rng.uniform(300, 3 * HOUR),
                gpus=gpus,
                milli=milli,
                cpu=rng.choice((2000, 6000, 12000)),
                memory=rng.choice((4096, 16384)),
                models=rng.choice(specs),
            )
        )
    jobs.sort(key=lambda j: j.arrival)
    jobs = [replace(j, index=i, name=f"j{i:03d}") for i, j in enumerate(jobs)]
    return nodes, jobs, Window(0, 6 * HOUR)


@pytest.mark.parametrize(
    ("scheduler", "rebalancer"),
    [("packed", "off"), ("spread", "off"), ("packed", "on"), ("packed", "descheduler-hnu")],
)
def test_placements_never_violate_constraints_or_capacity(scheduler: str, rebalancer: str) -> None:
    nodes, jobs, window = random_trace(11)
    config = EngineConfig(scheduler=scheduler, rebalancer=rebalancer, check_invariants=True)  # type: ignore[arg-type]
    result = simulate(nodes, jobs, window, config)  # raises InvariantViolation at the first broken rule
    assert result.pods + result.unplaceable_pods == len(jobs)
    assert result.unplaceable_pods < 10  # e.g. 8-GPU pods allowed only on 2-GPU models
    assert result.gpu_hours_used <= result.gpu_hours_provisioned
    if rebalancer != "off":
        assert result.rebalancer_cycles == int(window.length // 300) - (window.length % 300 == 0)


def test_invariant_check_catches_a_broken_state() -> None:
    nodes, jobs, _ = random_trace(5)
    cluster = SimCluster(nodes)
    node = cluster.add_node(cluster.pools[0], 0)
    cluster.check_invariants(jobs)
    node.free_cpu -= 1  # something holds a core that no job accounts for
    with pytest.raises(InvariantViolation, match="cpu"):
        cluster.check_invariants(jobs)


def test_hnu_leaves_clusters_alone_when_every_node_is_under_used() -> None:
    nodes = [g2("a"), g2("b")]
    jobs = [job(0, 0, HOUR), job(1, 0, HOUR, cpu=95000)]  # two nodes, 1/8 GPU each
    cluster = SimCluster(nodes)
    a = cluster.add_node(cluster.pools[0], 0)
    b = cluster.add_node(cluster.pools[0], 0)
    cluster.place(jobs[0], a, 0)
    cluster.place(jobs[1], b, 0)
    assert HighNodeUtilization(jobs).plan(300, cluster).evictions == ()


# --------------------------------------------------------------------------- end to end


def test_run_simulation_reports_every_json_key(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\na,96000,393216,8,G2\nb,96000,393216,8,G2\n")
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,4000,1024,1,1000,G2,LS,Running,0,7200,0\n"
        "p1,4000,1024,2,1000,,LS,Running,0,3600,0\n"
        "p2,4000,1024,1,500,,BE,Running,0,10800,1800\n"
    )
    result = run_simulation(SimulationOptions(nodes=nodes, pods=pods, replicas=2, seed=3, rebalancer="on"))
    payload = result_to_dict(replace(result, wall_seconds=0.5))
    assert payload.keys() >= REQUIRED_KEYS
    assert payload["wall_seconds"] == 0.5
    assert payload["pods"] == result.pods > 0
    assert json.loads(render(result, "json"))["ratio"] == payload["ratio"]
    assert "node-hours" in render(result, "text")


def test_replay_pods_of_one_job_shape_share_their_requests_and_no_other_pods_do() -> None:
    """What is derived from a pod's requests and GPU request is kept per requests mapping
    (`memo.RequestsMemo`): pods of one shape share one, and a share of another size has its own, or the
    two would take each other's place at every lookup."""
    quarter, half = job(0, 0, HOUR, milli=250), job(1, 0, HOUR, milli=500)
    whole, two = job(2, 0, HOUR), job(3, 0, HOUR, gpus=2)
    pods = [build_pod(j, None, None, PACKED_SCHEDULER) for j in (quarter, half, whole, two)]
    again = build_pod(job(4, HOUR, 2 * HOUR, milli=250), None, None, PACKED_SCHEDULER)

    assert again.requests is pods[0].requests
    assert len({id(p.requests) for p in pods}) == 4
    assert pods[0].requests == pods[1].requests == {"cpu": 4000, "memory": 1024 * 1024 * 1024}
    assert pods[3].requests["nvidia.com/gpu"] == 2
