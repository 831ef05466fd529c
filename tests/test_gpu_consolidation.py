"""Behaviour of the `gpu-consolidation` strategy, one rule per test."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta

import pytest
from pydantic import ValidationError

from rebalancer.gpu_devices import mig_share
from rebalancer.model import (
    NO_TELEMETRY,
    Finding,
    GpuTelemetry,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    OwnerRef,
    Pod,
    Snapshot,
    StrategyResult,
    Telemetry,
)
from rebalancer.placement import ClusterState
from rebalancer.registry import Refusal, StrategyContext, get_strategy
from strategies.gpu_consolidation import GpuConsolidationArgs, gpu_consolidation
from strategies.gpu_consolidation_accounting import MIG_SLICES_PER_GPU, node_capacity_gpus, pod_gpus
from strategies.gpu_consolidation_candidates import Candidate, static_block
from tests.builders import A100, H100, L4, gpu_sample, node, pod, replace, snapshot, telemetry

# The plainest profile the rules below are read against: allocation alone, node sizes ignored (the
# defaults keep drains monotone in node size; the tests of those rules switch them on by name).
ALLOCATION_ONLY = GpuConsolidationArgs(
    max_utilization_percent=None,
    max_allocated_percent=50,
    move_to_smaller_nodes=True,
    drain_onto_larger_nodes=False,
    peer_pods_to_make_room=0,
)
PodKey = tuple[str, str]


def run(
    nodes: Iterable[Node],
    pods: Iterable[Pod],
    args: GpuConsolidationArgs = ALLOCATION_ONLY,
    *,
    ctx: StrategyContext | None = None,
    tel: Telemetry = NO_TELEMETRY,
) -> tuple[Snapshot, StrategyResult]:
    snap = snapshot(nodes, pods, telemetry=tel)
    return snap, gpu_consolidation(snap, args, ctx or StrategyContext())


def busy(node_name: str, count: int, *, gpus: int = 1, prefix: str = "busy") -> list[Pod]:
    """`count` pods of `gpus` whole GPUs each, bound to the node."""
    return [pod(f"{prefix}-{node_name}-{i}", node_name, gpus=gpus) for i in range(count)]


def drained(result: StrategyResult) -> list[str]:
    return [p.node for p in result.proposals if p.node is not None]


def kinds(result: StrategyResult, kind: str) -> list[Finding]:
    return [f for f in result.findings if f.kind == kind]


def refuse(*names: str, guard: str = "opt-out") -> Callable[[Pod], Refusal | None]:
    def check(p: Pod) -> Refusal | None:
        return Refusal(guard, f"{p.ref} is protected") if p.name in names else None

    return check


def final_positions(snap: Snapshot, result: StrategyResult) -> dict[PodKey, str]:
    """Where every active pod is once the plan is applied by its predicted placements."""
    where = {p.key: p.node_name for p in snap.pods if p.is_active and p.node_name is not None}
    for proposal in result.proposals:
        for moved in proposal.pods:
            where[moved.key] = proposal.targets[moved.key]
    return where


def assert_plan_fits(snap: Snapshot, result: StrategyResult) -> None:
    """Re-place every pod at its final position on an empty cluster: each must fit where it ends."""
    where = final_positions(snap, result)
    state = ClusterState.from_snapshot(snapshot(snap.nodes.values()))
    ordered = sorted(
        (p for p in snap.pods if p.key in where),
        key=lambda p: (p.gpu.milli_per_device < 1000, -p.gpu.milli_per_device, -p.gpu.count, p.key),
    )
    for p in ordered:
        fit = state.fits(p, where[p.key])
        assert fit.ok, f"{p.ref} on {where[p.key]}: {fit.reason}"
        state.place(p, where[p.key])


# --------------------------------------------------------------------------- arguments


def test_args_defaults_registration_and_telemetry_needs() -> None:
    args = GpuConsolidationArgs()
    # Measured on the trace replay (bench/README.md): under 60 % allocated, nodes older than the cluster
    # autoscaler's 10 minutes of settling.
    assert args.max_allocated_percent == 60
    assert args.max_utilization_percent == 30
    assert (args.window, args.min_node_age, args.max_telemetry_age) == (3600, 600, 300)
    assert args.max_nodes_per_cycle == 3
    assert args.packed_schedulers == ("gpu-packed-scheduler",)
    # Drains are monotone in node size by default: never onto smaller nodes, fuller nodes lifted up.
    assert not args.move_to_smaller_nodes
    assert args.drain_onto_larger_nodes
    assert args.peer_pods_to_make_room == 1
    assert args.needs_telemetry()
    assert args.telemetry_windows() == frozenset({3600})
    assert not ALLOCATION_ONLY.needs_telemetry()
    assert ALLOCATION_ONLY.telemetry_windows() == frozenset()
    spec = get_strategy("gpu-consolidation")
    assert spec is not None
    assert spec.args_model is GpuConsolidationArgs


def test_without_telemetry_the_utilisation_threshold_is_treated_as_met_and_said_so() -> None:
    args, note = GpuConsolidationArgs().without_telemetry()
    assert args.max_utilization_percent is None
    assert not args.needs_telemetry()
    assert args.model_dump(exclude={"max_utilization_percent"}) == GpuConsolidationArgs().model_dump(
        exclude={"max_utilization_percent"}
    )
    assert note is not None and note.startswith("max_utilization_percent 30% treated as met")
    assert ALLOCATION_ONLY.without_telemetry() == (ALLOCATION_ONLY, None)


def test_args_parse_durations_and_reject_bad_values() -> None:
    args = GpuConsolidationArgs.model_validate(
        {"window": "30m", "min_node_age": "2h", "max_telemetry_age": "90s", "max_utilization_percent": None}
    )
    assert (args.window, args.min_node_age, args.max_telemetry_age) == (1800, 7200, 90)
    assert args.max_utilization_percent is None
    bad_values: list[dict[str, object]] = [
        {"max_nodes_per_cycle": 0},
        {"max_allocated_percent": 101},
        {"max_utilization_percent": -1},
        {"packed_schedulers": []},
        {"window": "0s"},
        {"window": "soon"},
        {"unknown": 1},
    ]
    for bad in bad_values:
        with pytest.raises(ValidationError):
            GpuConsolidationArgs.model_validate(bad)


# --------------------------------------------------------------------------- reservations


def test_three_pods_that_each_fit_one_free_gpu_are_not_all_proposed() -> None:
    # Three small nodes whose pods cannot go onto each other (CPU), and one free GPU elsewhere.
    small = [node(n, cpu_milli=10_000) for n in ("gpu-a-1", "gpu-a-2", "gpu-a-3")]
    lone = [pod(f"job-{n.name}", n.name, cpu_milli=6_000) for n in small]
    receiver = node("gpu-b-1")
    snap, result = run([*small, receiver], [*lone, *busy("gpu-b-1", 7)])

    # Each pod alone fits the free GPU: a static picture would approve all three.
    state = ClusterState.from_snapshot(snap)
    assert all(state.fits(p, "gpu-b-1").ok for p in lone)

    assert len(result.proposals) == 1
    (proposal,) = result.proposals
    assert set(proposal.targets.values()) == {"gpu-b-1"}
    blocked = kinds(result, "consolidation-blocked")
    assert {f.node for f in blocked} == {"gpu-a-1", "gpu-a-2", "gpu-a-3"} - {proposal.node}
    assert all("cannot be re-placed" in f.detail for f in blocked)
    assert_plan_fits(snap, result)


def test_reservations_carry_across_pods_of_one_node() -> None:
    # Two 1-GPU pods, one free GPU elsewhere: the node cannot be drained whole.
    nodes = [node("gpu-a-1"), node("gpu-b-1")]
    _, result = run(nodes, [*busy("gpu-a-1", 2, prefix="job"), *busy("gpu-b-1", 7)])
    assert result.proposals == ()
    assert [f.node for f in kinds(result, "consolidation-blocked")] == ["gpu-a-1"]


def test_nodes_drained_in_the_same_run_never_receive_pods() -> None:
    # gpu-a-2 is the fullest node a packed scheduler could pick for gpu-a-1's pod, but it is drained
    # in the same run; gpu-c-1 (too young to drain, nearly empty) must take everything.
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-c-1", age=timedelta(minutes=5))]
    pods = [
        *busy("gpu-a-1", 1, prefix="one"),
        *busy("gpu-a-2", 3, prefix="three"),
        *busy("gpu-c-1", 1, prefix="young"),
    ]
    snap, result = run(nodes, pods)
    state = ClusterState.from_snapshot(snap)
    first = snap.pods_on("gpu-a-1")[0]
    assert state.best_node(first, exclude=("gpu-a-1",)) == "gpu-a-2"

    assert drained(result) == ["gpu-a-1", "gpu-a-2"]
    freed = {n for p in result.proposals for n in p.nodes_freed}
    for proposal in result.proposals:
        assert set(proposal.targets.values()) == {"gpu-c-1"}
        assert not set(proposal.targets.values()) & freed
    assert_plan_fits(snap, result)


def test_a_candidate_that_received_pods_is_not_drained() -> None:
    # Nowhere else to go: the cheaper candidate is drained onto the other one, which then stays.
    nodes = [node("gpu-a-1"), node("gpu-a-2")]
    pods = [*busy("gpu-a-1", 1, prefix="one"), *busy("gpu-a-2", 2, prefix="two")]
    snap, result = run(nodes, pods)
    assert drained(result) == ["gpu-a-1"]
    assert set(result.proposals[0].targets.values()) == {"gpu-a-2"}
    assert_plan_fits(snap, result)


# --------------------------------------------------------------------------- protected pods


def test_a_node_with_one_protected_pod_is_not_touched() -> None:
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-b-1")]
    pods = [
        pod("free-1", "gpu-a-1"),
        pod("keep", "gpu-a-1", gpus=0),
        pod("free-2", "gpu-a-2"),
        *busy("gpu-b-1", 6),
    ]
    ctx = StrategyContext(refusal=refuse("keep", guard="pdb"))
    _, result = run(nodes, pods, ctx=ctx)
    assert drained(result) == ["gpu-a-2"]
    assert all(p.node_name != "gpu-a-1" for prop in result.proposals for p in prop.pods)
    (finding,) = kinds(result, "consolidation-blocked")
    assert (finding.node, finding.namespace, finding.pod) == ("gpu-a-1", "ml", "keep")
    assert "pdb" in finding.detail


def test_mirror_pods_pin_the_node_and_daemonset_pods_stay_behind() -> None:
    agent = OwnerRef(kind="DaemonSet", name="dcgm-exporter")
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-b-1")]
    pods = [
        pod("static", "gpu-a-1", gpus=0, annotations={"kubernetes.io/config.mirror": "x"}, owner=None),
        pod("job-1", "gpu-a-1"),
        pod("job-2", "gpu-a-2"),
        pod("exporter", "gpu-a-2", gpus=0, owner=agent, scheduler_name="default-scheduler"),
        *busy("gpu-b-1", 6),
    ]
    # DaemonSet pods would be refused by the static guards: they must never be asked about.
    _, result = run(nodes, pods, ctx=StrategyContext(refusal=refuse("exporter", guard="daemonset")))
    assert drained(result) == ["gpu-a-2"]
    assert [p.name for p in result.proposals[0].pods] == ["job-2"]
    assert result.hints == ()


def test_the_pods_before_a_candidate_s_static_pod_are_asked_about_as_the_same_tuple_each_time() -> None:
    """The static guards keep an answer per tuple of pods asked about: a candidate asks about the same
    tuple each time (its pods before its first static pod), never a fresh slice that no answer kept
    for it can serve."""
    static = pod("static", "gpu-b-1", gpus=0, annotations={"kubernetes.io/config.mirror": "x"}, owner=None)
    pods = (pod("a", "gpu-a-1"), pod("b", "gpu-a-1"), static, pod("c", "gpu-a-1"))
    candidate = Candidate(
        node=node("gpu-a-1"),
        allocated=3,
        capacity=8,
        utilisation=None,
        pods=pods,
        on_node=frozenset({pods[0].key, pods[1].key, pods[3].key}),
        price=0.0,
    )
    asked: list[Sequence[Pod]] = []

    def refusals(some: Sequence[Pod]) -> tuple[Pod, Refusal] | None:
        asked.append(some)
        return None

    ctx = StrategyContext(refusals=refusals)
    for _ in range(2):
        finding = static_block(candidate, ctx)
        assert finding is not None and finding.pod == "static"
    assert asked[0] == pods[:2]
    assert asked[1] is asked[0]


def test_empty_and_daemonset_only_gpu_nodes_are_not_candidates() -> None:
    agent = OwnerRef(kind="DaemonSet", name="dcgm-exporter")
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-b-1")]
    pods = [pod("exporter", "gpu-a-2", gpus=0, owner=agent), *busy("gpu-b-1", 6)]
    _, result = run(nodes, pods)
    assert result.proposals == ()
    assert result.findings == ()


def test_a_gpu_node_holding_only_cpu_pods_is_drained() -> None:
    nodes = [node("gpu-a-1"), node("gpu-b-1"), node("cpu-1", gpus=0, model=None)]
    pods = [pod("web", "gpu-a-1", gpus=0), *busy("gpu-b-1", 6)]
    _, result = run(nodes, pods)
    assert drained(result) == ["gpu-a-1"]


# --------------------------------------------------------------------------- gangs


def gang_pods(gang: str, *where: str, gpus: int = 1) -> list[Pod]:
    return [pod(f"{gang}-{i}", n, gpus=gpus, gang=f"ml/{gang}") for i, n in enumerate(where)]


def test_a_gang_half_on_the_node_moves_whole() -> None:
    nodes = [node("gpu-a-1"), node("gpu-b-1"), node("gpu-b-2")]
    members = gang_pods("train", "gpu-a-1", "gpu-b-1")
    pods = [*members, *busy("gpu-b-1", 5), *busy("gpu-b-2", 4)]
    snap, result = run(nodes, pods)
    (proposal,) = result.proposals
    assert proposal.node == "gpu-a-1"
    assert proposal.group == "ml/train"
    assert {p.key for p in proposal.pods} == {p.key for p in members}
    assert set(proposal.targets) == {p.key for p in members}
    assert "gpu-a-1" not in proposal.targets.values()
    assert "gang member" in proposal.reason
    assert_plan_fits(snap, result)


def test_a_gang_half_on_the_node_moves_not_at_all_when_a_member_is_protected() -> None:
    nodes = [node("gpu-a-1"), node("gpu-b-1"), node("gpu-b-2")]
    pods = [*gang_pods("train", "gpu-a-1", "gpu-b-1"), *busy("gpu-b-1", 5), *busy("gpu-b-2", 4)]
    _, result = run(nodes, pods, ctx=StrategyContext(refusal=refuse("train-1")))
    assert result.proposals == ()
    (finding,) = kinds(result, "consolidation-blocked")
    assert finding.pod == "train-1"
    assert "gpu-b-1" in finding.detail


def test_a_gang_that_cannot_be_re_placed_whole_is_not_moved() -> None:
    # Even with the member on gpu-b-1 gone, there is no room for the whole gang: nothing moves.
    nodes = [node("gpu-a-1"), node("gpu-b-1")]
    pods = [*gang_pods("train", "gpu-a-1", "gpu-b-1", gpus=2), *busy("gpu-b-1", 5)]
    _, result = run(nodes, pods)
    assert result.proposals == ()
    assert [f.node for f in kinds(result, "consolidation-blocked")] == ["gpu-a-1"]


def test_a_node_holding_only_members_of_a_moved_gang_is_freed_too() -> None:
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-b-1")]
    pods = [*gang_pods("train", "gpu-a-1", "gpu-a-2"), *busy("gpu-b-1", 5)]
    snap, result = run(nodes, pods)
    (proposal,) = result.proposals
    assert set(proposal.nodes_freed) == {"gpu-a-1", "gpu-a-2"}
    assert set(proposal.targets.values()) == {"gpu-b-1"}
    assert_plan_fits(snap, result)


# --------------------------------------------------------------------------- constraints


def test_a_gpu_memory_gt_affinity_only_targets_a_matching_node() -> None:
    big = "nvidia.com/gpu.memory"
    needs_big = NodeSelectorTerm(match_expressions=(NodeSelectorRequirement(big, "Gt", ("40000",)),))
    nodes = [
        node("gpu-a-1", labels={big: "81920"}),
        node("gpu-l4-1", model=L4, labels={big: "24576"}),
        node("gpu-a-2", labels={big: "81920"}),
    ]
    mover = pod("llm", "gpu-a-1", required_affinity=[needs_big])
    pods = [mover, *busy("gpu-l4-1", 7), *busy("gpu-a-2", 4)]
    snap, result = run(nodes, pods)
    # The packed scheduler would prefer the fuller L4 node for an unconstrained pod.
    plain = pod("plain", "gpu-a-1")
    assert ClusterState.from_snapshot(snap).best_node(plain, exclude=("gpu-a-1",)) == "gpu-l4-1"
    (proposal,) = result.proposals
    assert proposal.targets[mover.key] == "gpu-a-2"


def test_gpu_shares_are_packed_per_device() -> None:
    # The receiver has 1800 free milli-GPU in total, but only one device with room for 600.
    receiver_pods = [
        *busy("gpu-b-1", 5),
        pod("other-1", "gpu-b-1", gpu_milli=600),
        pod("other-2", "gpu-b-1", gpu_milli=600),
    ]
    shares = [pod("share-1", "gpu-a-1", gpu_milli=600), pod("share-2", "gpu-a-1", gpu_milli=600)]
    snap, result = run([node("gpu-a-1"), node("gpu-b-1")], [*shares, *receiver_pods])
    assert sum(ClusterState.from_snapshot(snap).gpu_free_milli("gpu-b-1")) >= 1200
    assert result.proposals == ()
    assert [f.node for f in kinds(result, "consolidation-blocked")] == ["gpu-a-1"]

    # With a second free device, both shares move.
    roomier = [*busy("gpu-b-1", 4), *receiver_pods[5:]]
    snap, result = run([node("gpu-a-1"), node("gpu-b-1")], [*shares, *roomier])
    (proposal,) = result.proposals
    assert set(proposal.targets.values()) == {"gpu-b-1"}
    assert_plan_fits(snap, result)


def test_allocation_counts_shares_in_milli() -> None:
    # 4 devices each 900/1000 used by shares: 45% of 8 GPUs, below 50%; at 40% it is not a candidate.
    shares = [pod(f"share-{i}", "gpu-a-1", gpu_milli=900) for i in range(4)]
    nodes = [node("gpu-a-1"), node("gpu-b-1")]
    _, result = run(nodes, [*shares, *busy("gpu-b-1", 4)])
    assert drained(result) == ["gpu-a-1"]
    strict = GpuConsolidationArgs(max_utilization_percent=None, max_allocated_percent=40)
    _, result = run(nodes, [*shares, *busy("gpu-b-1", 4)], strict)
    assert result.proposals == ()


A30 = "NVIDIA-A30"


@pytest.mark.parametrize(
    ("model", "mig", "gpus"),
    [
        (A30, {"nvidia.com/mig-2g.12gb": 4}, 2.0),  # an A30 has 4 compute slices: 2 GPUs in halves
        (A30, {"nvidia.com/mig-1g.6gb": 4}, 1.0),
        (A100, {"nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-1g.10gb": 1}, 1.0),  # 7 slices
        ("NVIDIA-Unknown", {"nvidia.com/mig-1g.10gb": 7}, 1.0),  # a model not known: 7 slices
    ],
)
def test_mig_instances_count_by_the_slices_of_their_gpu_model(
    model: str, mig: dict[str, int], gpus: float
) -> None:
    mig_node = node("mig-1", gpus=0, model=model, extra=mig)
    assert node_capacity_gpus(mig_node) == pytest.approx(gpus)
    for resource, count in mig.items():
        held = pod("p", "mig-1", gpus=0, extra={resource: count})
        share = mig_share(resource.removeprefix("nvidia.com/mig-"), model) or 1 / MIG_SLICES_PER_GPU
        assert pod_gpus(held, model) == pytest.approx(count * share)


def test_a_mixed_mig_node_is_judged_on_its_own_model_s_slices() -> None:
    # One A30 whole and one in four 1g.6gb instances: 2 GPUs, half allocated by the whole-GPU pod. Counted
    # in sevenths the instances made 1 + 4/7 GPUs and the node 64 % allocated, above the threshold.
    mixed = node("a30-mixed", gpus=1, model=A30, extra={"nvidia.com/mig-1g.6gb": 4})
    other = node("a30-other", gpus=4, model=A30)
    args = ALLOCATION_ONLY.model_copy(update={"max_allocated_percent": 60})
    _, result = run([mixed, other], [*busy("a30-mixed", 1), *busy("a30-other", 3)], args)
    assert drained(result) == ["a30-mixed"]


# --------------------------------------------------------------------------- schedulers


def test_pods_of_a_non_packed_scheduler_block_the_node_with_a_hint() -> None:
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-a-3"), node("gpu-b-1")]
    pods = [
        pod("spread-1", "gpu-a-1", scheduler_name="default-scheduler"),
        pod("spread-2", "gpu-a-1", scheduler_name="default-scheduler"),
        pod("spread-3", "gpu-a-2", scheduler_name="default-scheduler"),
        pod("packed", "gpu-a-3"),
        *busy("gpu-b-1", 4),
    ]
    _, result = run(nodes, pods)
    assert drained(result) == ["gpu-a-3"]
    (hint,) = result.hints
    assert "3 pods on 2 candidate nodes" in hint
    assert "(default-scheduler)" in hint
    assert "gpu-packed-scheduler" in hint

    args = GpuConsolidationArgs(
        max_utilization_percent=None, packed_schedulers=("gpu-packed-scheduler", "default-scheduler")
    )
    _, result = run(nodes, pods, args)
    assert set(drained(result)) == {"gpu-a-1", "gpu-a-2", "gpu-a-3"}
    assert result.hints == ()


# --------------------------------------------------------------------------- node exclusions


@pytest.mark.parametrize(
    "excluded",
    [
        node("gpu-a-1", annotations={"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}),
        node("gpu-a-1", annotations={"karpenter.sh/do-not-disrupt": "true"}),
        node("gpu-a-1", unschedulable=True),
        node("gpu-a-1", age=timedelta(minutes=5)),
        Node(name="gpu-a-1", labels={"nvidia.com/gpu.product": A100}, allocatable={"nvidia.com/gpu": 8}),
    ],
    ids=["scale-down-disabled", "do-not-disrupt", "unschedulable", "young", "unknown-age"],
)
def test_excluded_nodes_are_not_candidates(excluded: Node) -> None:
    pods = [pod("job", "gpu-a-1", cpu_milli=0, memory=0), *busy("gpu-b-1", 4)]
    _, control = run([node("gpu-a-1"), node("gpu-b-1")], pods)
    assert drained(control) == ["gpu-a-1"]
    _, result = run([excluded, node("gpu-b-1")], pods)
    assert result.proposals == ()
    assert result.findings == ()


def test_node_age_threshold_is_configurable() -> None:
    pods = [pod("job", "gpu-a-1"), *busy("gpu-b-1", 4)]
    nodes = [node("gpu-a-1", age=timedelta(minutes=30)), node("gpu-b-1")]
    args = GpuConsolidationArgs(max_utilization_percent=None, min_node_age="20m")
    _, result = run(nodes, pods, args)
    assert drained(result) == ["gpu-a-1"]


def test_nodes_at_or_above_the_allocation_threshold_are_not_candidates() -> None:
    nodes = [node("gpu-a-1"), node("gpu-b-1", gpus=16)]
    _, result = run(nodes, [*busy("gpu-a-1", 4), *busy("gpu-b-1", 8)])
    assert result.proposals == ()
    _, result = run(nodes, [*busy("gpu-a-1", 3), *busy("gpu-b-1", 8)])
    assert drained(result) == ["gpu-a-1"]


# --------------------------------------------------------------------------- telemetry


def node_rows(
    node_name: str,
    util: float,
    *,
    gpus: int = 8,
    age: timedelta = timedelta(seconds=15),
    samples: int = 30,
) -> list[GpuTelemetry]:
    return [
        gpu_sample(node_name, f"GPU-{node_name}-{i}", util=util, age=age, samples=samples)
        for i in range(gpus)
    ]


UTIL = GpuConsolidationArgs()


def test_utilisation_threshold() -> None:
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-b-1")]
    pods = [pod("idle", "gpu-a-1"), pod("hot", "gpu-a-2"), *busy("gpu-b-1", 5)]
    rows = [*node_rows("gpu-a-1", 3.0), *node_rows("gpu-a-2", 45.0), *node_rows("gpu-b-1", 90.0)]
    _, result = run(nodes, pods, UTIL, tel=telemetry(rows, UTIL.window))
    assert drained(result) == ["gpu-a-1"]
    reason = result.proposals[0].reason
    assert "gpu-a-1" in reason
    assert "avg util 3%" in reason
    assert "over 1h" in reason
    loose = GpuConsolidationArgs(max_utilization_percent=50)
    _, result = run(nodes, pods, loose, tel=telemetry(rows, loose.window))
    assert set(drained(result)) == {"gpu-a-1", "gpu-a-2"}


def test_stale_or_missing_telemetry_is_never_read_as_idle() -> None:
    nodes = [node(n) for n in ("gpu-a-1", "gpu-a-2", "gpu-a-3", "gpu-a-4", "gpu-b-1")]
    pods = [pod(f"job-{n}", n) for n in ("gpu-a-1", "gpu-a-2", "gpu-a-3", "gpu-a-4")] + busy("gpu-b-1", 3)
    rows = [
        *node_rows("gpu-a-1", 1.0),
        *node_rows("gpu-a-2", 1.0, age=timedelta(minutes=10)),  # stale
        *node_rows("gpu-a-3", 1.0, gpus=6),  # two GPUs without telemetry
        *node_rows("gpu-b-1", 90.0),
    ]  # gpu-a-4: no telemetry at all
    _, result = run(nodes, pods, UTIL, tel=telemetry(rows, UTIL.window))
    assert drained(result) == ["gpu-a-1"]
    stale = kinds(result, "stale-telemetry")
    assert sorted(f.node or "" for f in stale) == ["gpu-a-2", "gpu-a-3", "gpu-a-4"]
    assert any("10m old" in f.detail for f in stale)


def test_too_few_samples_on_any_gpu_is_never_read_as_under_used() -> None:
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-a-3"), node("gpu-b-1")]
    pods = [pod("job-1", "gpu-a-1"), pod("job-2", "gpu-a-2"), pod("job-3", "gpu-a-3"), *busy("gpu-b-1", 3)]
    thin = node_rows("gpu-a-2", 1.0, samples=1)  # one sample per GPU: no evidence
    one_thin = [*node_rows("gpu-a-3", 1.0, gpus=7), *node_rows("gpu-a-3", 1.0, gpus=1, samples=9)]
    one_thin[-1] = replace(one_thin[-1], uuid="GPU-gpu-a-3-7")
    rows = [*node_rows("gpu-a-1", 1.0, samples=10), *thin, *one_thin, *node_rows("gpu-b-1", 90.0)]
    _, result = run(nodes, pods, UTIL, tel=telemetry(rows, UTIL.window))
    assert drained(result) == ["gpu-a-1"]  # exactly min_samples is enough
    stale = {f.node: f for f in kinds(result, "stale-telemetry")}
    assert set(stale) == {"gpu-a-2", "gpu-a-3"}
    assert "1 utilisation samples in the 1h window (need 10)" in stale["gpu-a-2"].detail
    assert stale["gpu-a-3"].gpu == "GPU-gpu-a-3-7"
    assert "9 utilisation samples" in stale["gpu-a-3"].detail
    # The bar is the policy's to set.
    lenient = GpuConsolidationArgs(min_samples=1)
    _, result = run(nodes, pods, lenient, tel=telemetry(rows, lenient.window))
    assert set(drained(result)) == {"gpu-a-1", "gpu-a-2", "gpu-a-3"}


def test_min_samples_defaults_like_idle_gpu_and_is_at_least_one() -> None:
    assert GpuConsolidationArgs().min_samples == 10
    with pytest.raises(ValidationError):
        GpuConsolidationArgs(min_samples=0)


def test_telemetry_unavailable_skips_the_strategy() -> None:
    nodes = [node("gpu-a-1"), node("gpu-b-1")]
    pods = [pod("job", "gpu-a-1"), *busy("gpu-b-1", 3)]
    down = Telemetry(available=False, problem="prometheus unreachable")
    _, result = run(nodes, pods, UTIL, tel=down)
    assert result.proposals == ()
    assert result.skipped is not None
    assert result.skipped.startswith("telemetry unavailable: prometheus unreachable")
    assert "max_utilization_percent: null" in result.skipped
    # Telemetry present but not over the window the strategy asked for.
    _, result = run(nodes, pods, UTIL, tel=telemetry(node_rows("gpu-a-1", 1.0), 1800))
    assert result.skipped is not None
    assert result.skipped.startswith("telemetry unavailable")


def test_allocation_only_mode_needs_no_telemetry() -> None:
    nodes = [node("gpu-a-1"), node("gpu-b-1")]
    pods = [pod("job", "gpu-a-1"), *busy("gpu-b-1", 3)]
    _, result = run(nodes, pods, ALLOCATION_ONLY, tel=NO_TELEMETRY)
    assert result.skipped is None
    assert drained(result) == ["gpu-a-1"]
    assert "avg util" not in result.proposals[0].reason


# --------------------------------------------------------------------------- ordering


def test_fewest_evictions_first_then_priciest_node() -> None:
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-h-1", model=H100), node("gpu-b-1", gpus=16)]
    pods = [
        *busy("gpu-a-1", 2, prefix="two"),  # two evictions
        *busy("gpu-a-2", 1, prefix="one"),  # one eviction, cheaper model
        *busy("gpu-h-1", 1, prefix="one"),  # one eviction, pricier model
        *busy("gpu-b-1", 9),
    ]
    prices = StrategyContext(gpu_prices={A100: 2.0, H100: 4.0})
    args = GpuConsolidationArgs(max_utilization_percent=None, max_nodes_per_cycle=3)
    _, result = run(nodes, pods, args, ctx=prices)
    assert drained(result) == ["gpu-h-1", "gpu-a-2", "gpu-a-1"]
    priorities = [p.priority for p in result.proposals]
    assert priorities == sorted(priorities, reverse=True)
    assert len(set(priorities)) == len(priorities)

    # Prices reversed: the A100 node goes first.
    cheap_h100 = StrategyContext(gpu_prices={A100: 4.0, H100: 2.0})
    _, result = run(nodes, pods, args, ctx=cheap_h100)
    assert drained(result)[:2] == ["gpu-a-2", "gpu-h-1"]


def test_unknown_prices_order_by_gpus_then_name() -> None:
    nodes = [node("gpu-a-2"), node("gpu-a-1"), node("gpu-big", gpus=16), node("gpu-b-1", gpus=16)]
    pods = [p for n in ("gpu-a-1", "gpu-a-2", "gpu-big") for p in busy(n, 1, prefix="one")]
    _, result = run(nodes, [*pods, *busy("gpu-b-1", 9)])
    assert drained(result) == ["gpu-big", "gpu-a-1", "gpu-a-2"]


def test_max_nodes_per_cycle() -> None:
    nodes = [node(f"gpu-a-{i}") for i in range(1, 5)] + [node("gpu-b-1", gpus=16)]
    pods = [p for i in range(1, 5) for p in busy(f"gpu-a-{i}", 1, prefix="one")] + busy("gpu-b-1", 8)
    for cap in (1, 2, 4):
        args = GpuConsolidationArgs(max_utilization_percent=None, max_nodes_per_cycle=cap)
        snap, result = run(nodes, pods, args)
        assert len(result.proposals) == cap
        assert_plan_fits(snap, result)


# --------------------------------------------------------------------------- node sizes


def only(model: str) -> NodeSelectorTerm:
    """Required node affinity on one GPU model, as a `gpu_spec` of one model becomes."""
    return NodeSelectorTerm(
        match_expressions=(NodeSelectorRequirement("nvidia.com/gpu.product", "In", (model,)),)
    )


def gpus_of(snap: Snapshot, name: str) -> int:
    return snap.nodes[name].gpu_count


def test_pods_move_to_smaller_nodes_only_when_allowed() -> None:
    # An 8-GPU node with one pod; the only room is the free GPU of a 2-GPU node.
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-l4-1", gpus=2, model=L4)]
    pods = [pod("lone", "gpu-a-1"), *busy("gpu-a-2", 8), *busy("gpu-l4-1", 1)]
    snap, result = run(nodes, pods)
    (proposal,) = result.proposals
    assert set(proposal.targets.values()) == {"gpu-l4-1"}

    keep_small_free = ALLOCATION_ONLY.model_copy(update={"move_to_smaller_nodes": False})
    _, result = run(nodes, pods, keep_small_free)
    assert result.proposals == ()
    (finding,) = kinds(result, "consolidation-blocked")
    assert finding.node == "gpu-a-1"
    assert "fewer GPUs" in finding.detail

    # The rule judges where the packed scheduler puts the pods, it does not steer them: with room on a
    # node of the same size too, the scheduler still prefers the fuller small node, so no drain ...
    roomy = [pod("lone", "gpu-a-1"), *busy("gpu-a-2", 6), *busy("gpu-l4-1", 1)]
    snap, result = run(nodes, roomy, keep_small_free)
    assert ClusterState.from_snapshot(snap).best_node(roomy[0], exclude=("gpu-a-1",)) == "gpu-l4-1"
    assert result.proposals == ()
    # ... until the small node is full.
    full_small = [pod("lone", "gpu-a-1"), *busy("gpu-a-2", 6), *busy("gpu-l4-1", 2)]
    snap, result = run(nodes, full_small, keep_small_free)
    (proposal,) = result.proposals
    assert set(proposal.targets.values()) == {"gpu-a-2"}
    assert_plan_fits(snap, result)


UPWARD = ALLOCATION_ONLY.model_copy(update={"move_to_smaller_nodes": False, "drain_onto_larger_nodes": True})


def test_a_full_small_node_of_pods_that_may_run_anywhere_is_drained_onto_larger_nodes() -> None:
    nodes = [node("gpu-l4-1", gpus=2, model=L4), node("gpu-a-1")]
    pods = [*busy("gpu-l4-1", 2), *busy("gpu-a-1", 4)]
    _, result = run(nodes, pods)
    assert result.proposals == ()  # full: never a candidate by the allocation threshold

    snap, result = run(nodes, pods, UPWARD)
    (proposal,) = result.proposals
    assert proposal.node == "gpu-l4-1"
    assert all(gpus_of(snap, target) > gpus_of(snap, "gpu-l4-1") for target in proposal.targets.values())
    assert "(100% >= 50%), 2 of them onto nodes with more GPUs" in proposal.reason
    assert result.findings == ()
    assert_plan_fits(snap, result)

    # A protected pod keeps it, silently: a full node is no under-used node to report.
    protected = StrategyContext(refusal=refuse(pods[0].name))
    _, result = run(nodes, pods, UPWARD, ctx=protected)
    assert result.proposals == ()
    assert result.findings == ()


def test_a_full_small_node_of_pods_bound_to_its_model_stays() -> None:
    nodes = [node("gpu-l4-1", gpus=2, model=L4), node("gpu-l4-2", gpus=2, model=L4), node("gpu-a-1")]
    bound = [pod(f"l4-only-{i}", "gpu-l4-1", required_affinity=[only(L4)]) for i in range(2)]
    pods = [*bound, pod("l4-only-other", "gpu-l4-2", required_affinity=[only(L4)]), *busy("gpu-a-1", 4)]
    _, result = run(nodes, pods, UPWARD)
    # Its pods cannot go to larger nodes, and moving them to the other L4 node would take more room
    # there than the drained node leaves free (none): no drain, and no finding (it is not under-used).
    assert result.proposals == ()
    assert result.findings == ()


def test_pods_that_stay_on_nodes_of_the_same_size_must_fit_in_the_room_the_node_leaves() -> None:
    nodes = [node("gpu-l4-1", gpus=4, model=L4), node("gpu-l4-2", gpus=4, model=L4), node("gpu-a-1")]
    # The L4-only pod asks for more cpu, so it is placed first and takes the free GPU of gpu-l4-2.
    bound = pod("l4-only", "gpu-l4-1", cpu_milli=8_000, required_affinity=[only(L4)])
    l4_full = [pod(f"l4-full-{i}", "gpu-l4-2", required_affinity=[only(L4)]) for i in range(3)]
    others = [*l4_full, *busy("gpu-a-1", 4)]

    # 3 of 4 GPUs allocated: the one GPU that stays on a 4-GPU node fits in the one the node leaves free.
    three = [bound, *busy("gpu-l4-1", 2, prefix="flexible")]
    snap, result = run(nodes, [*three, *others], UPWARD)
    (proposal,) = result.proposals
    assert proposal.node == "gpu-l4-1"
    assert proposal.targets[bound.key] == "gpu-l4-2"
    assert {proposal.targets[p.key] for p in three[1:]} == {"gpu-a-1"}
    assert_plan_fits(snap, result)

    # Full: the same move would eat a free GPU of the L4 nodes that the drained node does not give back.
    four = [bound, *busy("gpu-l4-1", 3, prefix="flexible")]
    _, result = run(nodes, [*four, *others], UPWARD)
    assert result.proposals == ()


MAKE_ROOM = UPWARD.model_copy(update={"peer_pods_to_make_room": 1})


def room_cluster(
    maker: Pod | None = None, big_busy: tuple[int, int, int] = (6, 6, 7)
) -> tuple[list[Node], list[Pod], Pod]:
    """gpu-l4-1 is full: one L4-only pod and three pods that may run anywhere. Its L4-only pod fits in
    the free GPU of gpu-l4-2, but that takes a GPU of the L4 pool the full node does not give back.
    gpu-l4-2 holds a 2-GPU pod (`maker`) that could run on the 8-GPU nodes (`big_busy` GPUs taken)."""
    nodes = [
        node("gpu-l4-1", gpus=4, model=L4),
        node("gpu-l4-2", gpus=4, model=L4),
        node("gpu-a-1"),
        node("gpu-a-2"),
        node("gpu-a-3"),
    ]
    bound = pod("l4-only", "gpu-l4-1", cpu_milli=8_000, required_affinity=[only(L4)])
    maker = maker or pod("flexible-2gpu", "gpu-l4-2", gpus=2)
    pods = [
        bound,
        *busy("gpu-l4-1", 3, prefix="flexible"),
        pod("l4-only-peer", "gpu-l4-2", required_affinity=[only(L4)]),
        maker,
        *busy("gpu-a-1", big_busy[0]),
        *busy("gpu-a-2", big_busy[1]),
        *busy("gpu-a-3", big_busy[2]),
    ]
    return nodes, pods, bound


def test_room_for_pods_bound_to_the_node_size_is_made_by_lifting_a_peer_pod() -> None:
    nodes, pods, bound = room_cluster()
    maker = pods[5]
    _, result = run(nodes, pods, UPWARD)
    assert result.proposals == ()  # the L4-only pod would take a free L4 GPU the node does not give back

    snap, result = run(nodes, pods, MAKE_ROOM)
    (proposal,) = result.proposals
    assert proposal.node == "gpu-l4-1"
    assert proposal.nodes_freed == ("gpu-l4-1",)
    # One proposal, room first: the peer pod is evicted before the drain's own pods.
    assert proposal.pods[0] == maker
    assert {p.key for p in proposal.pods[1:]} == {p.key for p in snap.pods_on("gpu-l4-1")}
    assert gpus_of(snap, proposal.targets[maker.key]) == 8
    assert proposal.targets[bound.key] == "gpu-l4-2"
    flexible = [p for p in proposal.pods if p.name.startswith("flexible-gpu-l4-1")]
    assert len(flexible) == 3
    assert all(gpus_of(snap, proposal.targets[p.key]) == 8 for p in flexible)
    assert "room made on gpu-l4-2 by moving 1 pod (2 GPUs) to gpu-a-1" in proposal.reason
    assert_plan_fits(snap, result)


def test_room_is_made_only_by_pods_that_may_move_and_do_land_on_larger_nodes() -> None:
    def drains(
        maker: Pod, args: GpuConsolidationArgs = MAKE_ROOM, ctx: StrategyContext | None = None
    ) -> bool:
        nodes, pods, _ = room_cluster(maker)
        return bool(run(nodes, pods, args, ctx=ctx)[1].proposals)

    assert drains(pod("flexible-2gpu", "gpu-l4-2", gpus=2))
    # Bound to L4 itself, in a gang, placed by a spreading scheduler, or protected: never a room maker.
    assert not drains(pod("flexible-2gpu", "gpu-l4-2", gpus=2, required_affinity=[only(L4)]))
    assert not drains(pod("flexible-2gpu", "gpu-l4-2", gpus=2, gang="ml/g"))
    assert not drains(pod("flexible-2gpu", "gpu-l4-2", gpus=2, scheduler_name="default-scheduler"))
    protected = StrategyContext(refusal=refuse("flexible-2gpu"))
    assert not drains(pod("flexible-2gpu", "gpu-l4-2", gpus=2), ctx=protected)
    # Held back by the history this cycle (its workload cooling down): its eviction would sink the
    # drain, so it makes no room either, and the node is not drained this cycle.
    cooling = StrategyContext(history_refusal=refuse("flexible-2gpu", guard="cooldown"))
    assert not drains(pod("flexible-2gpu", "gpu-l4-2", gpus=2), ctx=cooling)
    # A pod the packed scheduler would put back on a node of the same size makes no room: with the
    # 8-GPU nodes emptier, the fullest node after placing it is its own again.
    nodes, pods, _ = room_cluster(big_busy=(3, 3, 7))
    maker = pods[5]
    state = ClusterState.from_snapshot(snapshot(nodes, pods))
    state.remove(maker)
    assert state.best_node(maker, exclude=("gpu-l4-1",)) == "gpu-l4-2"
    assert run(nodes, pods, MAKE_ROOM)[1].proposals == ()


def test_room_takes_no_more_peer_pods_than_the_policy_allows() -> None:
    # Two L4-only pods would take the two free GPUs of gpu-l4-2 (kept by the autoscaler, so no
    # candidate itself): two 1-GPU peer pods must move.
    keep = {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}
    nodes = [node("gpu-l4-1", gpus=4, model=L4), node("gpu-l4-2", gpus=4, model=L4, annotations=keep)]
    nodes += [node("gpu-a-1"), node("gpu-a-2"), node("gpu-a-3")]
    bound = [pod(f"l4-only-{i}", "gpu-l4-1", cpu_milli=8_000, required_affinity=[only(L4)]) for i in range(2)]
    makers = [pod(f"flexible-peer-{i}", "gpu-l4-2") for i in range(2)]
    pods = [*bound, *busy("gpu-l4-1", 2, prefix="flexible"), *makers]
    pods += [*busy("gpu-a-1", 6), *busy("gpu-a-2", 6), *busy("gpu-a-3", 7)]
    assert run(nodes, pods, MAKE_ROOM)[1].proposals == ()

    snap, result = run(nodes, pods, MAKE_ROOM.model_copy(update={"peer_pods_to_make_room": 2}))
    (proposal,) = result.proposals
    assert proposal.node == "gpu-l4-1"
    assert {p.key for p in proposal.pods[:2]} == {p.key for p in makers}
    assert {proposal.targets[p.key] for p in bound} == {"gpu-l4-2"}
    assert all(gpus_of(snap, proposal.targets[p.key]) == 8 for p in makers)
    assert_plan_fits(snap, result)


def test_the_defaults_are_the_room_making_profile() -> None:
    # What the shipped policy drains on a mixed-size cluster, telemetry aside: the case above, at the
    # default threshold.
    defaults = GpuConsolidationArgs(max_utilization_percent=None)
    assert defaults == MAKE_ROOM.model_copy(update={"max_allocated_percent": 60})
    nodes, pods, _ = room_cluster()
    _, result = run(nodes, pods, defaults)
    assert drained(result) == ["gpu-l4-1"]


def test_making_room_needs_upward_drains() -> None:
    with pytest.raises(ValidationError, match="peer_pods_to_make_room needs drain_onto_larger_nodes: true"):
        GpuConsolidationArgs(drain_onto_larger_nodes=False, peer_pods_to_make_room=1)
    # Turning upward drains off is enough: the default room making then has nothing to act on.
    assert GpuConsolidationArgs(drain_onto_larger_nodes=False).peer_pods_to_make_room == 1
    with pytest.raises(ValidationError):
        UPWARD.model_validate({**UPWARD.model_dump(), "peer_pods_to_make_room": -1})


def test_nodes_under_the_threshold_still_drain_onto_nodes_of_their_size() -> None:
    nodes = [node("gpu-a-1"), node("gpu-a-2")]
    pods = [*busy("gpu-a-1", 2), *busy("gpu-a-2", 5)]
    snap, result = run(nodes, pods, UPWARD)
    (proposal,) = result.proposals
    assert proposal.node == "gpu-a-1"
    assert set(proposal.targets.values()) == {"gpu-a-2"}
    assert "(25% < 50%)" in proposal.reason
    assert_plan_fits(snap, result)

    # At or above the threshold a node is drained only by lifting pods onto larger nodes: none here.
    half = [*busy("gpu-a-1", 4), *busy("gpu-a-2", 4)]
    _, result = run(nodes, half, UPWARD)
    assert result.proposals == ()


# --------------------------------------------------------------------------- proposals


def test_proposal_shape() -> None:
    nodes = [node("gpu-a-1"), node("gpu-b-1"), node("gpu-b-2")]
    movers = [pod("big", "gpu-a-1", gpus=2)]
    pods = [*movers, *busy("gpu-b-1", 7), *busy("gpu-b-2", 6)]
    snap, result = run(nodes, pods)
    (proposal,) = result.proposals
    assert proposal.strategy == "gpu-consolidation"
    assert proposal.kind == "node"
    assert proposal.node == "gpu-a-1"
    assert proposal.nodes_freed == ("gpu-a-1",)
    assert proposal.group is None
    assert proposal.targets == {movers[0].key: "gpu-b-2"}
    assert "2/8 GPUs allocated (25% < 50%)" in proposal.reason
    assert proposal.reason.endswith("1 pod re-placed on gpu-b-2")
    # The snapshot is not changed by the simulation.
    assert snap.pods_on("gpu-a-1") == tuple(movers)


def test_is_deterministic() -> None:
    nodes = [node(f"gpu-a-{i}") for i in range(1, 6)] + [node("gpu-b-1", gpus=16)]
    pods = [pod(f"p{i}-{j}", f"gpu-a-{i}") for i in range(1, 6) for j in range(i % 3 + 1)]
    pods += busy("gpu-b-1", 10)

    def run_once() -> list[tuple[str | None, Mapping[PodKey, str]]]:
        _, result = run(nodes, pods)
        return [(p.node, dict(p.targets)) for p in result.proposals]

    assert run_once() == run_once()


# --------------------------------------------------------------------------- destination rules


def test_a_drain_may_be_re_placed_anywhere_else_when_smaller_nodes_are_allowed() -> None:
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-l4-1", gpus=2, model=L4)]
    _, result = run(nodes, [pod("lone", "gpu-a-1"), *busy("gpu-a-2", 6)])
    (proposal,) = result.proposals
    assert proposal.destinations == {("ml", "lone"): ()}


def test_a_drain_that_keeps_small_nodes_free_may_be_re_placed_only_on_nodes_as_large() -> None:
    nodes = [node("gpu-a-1"), node("gpu-a-2"), node("gpu-l4-1", gpus=2, model=L4)]
    keep_small_free = ALLOCATION_ONLY.model_copy(update={"move_to_smaller_nodes": False})
    _, result = run(
        nodes, [pod("lone", "gpu-a-1"), *busy("gpu-a-2", 6), *busy("gpu-l4-1", 2)], keep_small_free
    )
    (proposal,) = result.proposals
    [rule] = proposal.destinations[("ml", "lone")]
    assert (rule.nodes, rule.outside) == (frozenset({"gpu-a-1", "gpu-a-2"}), False)
    assert rule.text == "with at least 8 GPUs (no smaller nodes)"


def test_pods_lifted_onto_larger_nodes_may_be_re_placed_only_on_larger_nodes() -> None:
    nodes = [node("gpu-l4-1", gpus=2, model=L4), node("gpu-l4-2", gpus=2, model=L4), node("gpu-a-1")]
    pods = [*busy("gpu-l4-1", 2), *busy("gpu-a-1", 4)]
    _, result = run(nodes, pods, UPWARD)
    (proposal,) = result.proposals
    assert set(proposal.destinations) == {p.key for p in pods[:2]}
    for rules in proposal.destinations.values():
        [rule] = rules
        assert (rule.nodes, rule.outside) == (frozenset({"gpu-a-1"}), False)
        assert rule.text == "with more than 2 GPUs (moved up a size)"
