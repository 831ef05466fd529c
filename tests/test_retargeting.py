"""Plans that come true across strategies: when an earlier approved proposal used the room a later
proposal's predicted target had, the planner re-places the pod on the packed scheduler's next choice
among the nodes its strategy allows, and refuses `no-fit` only when none remains, naming the rule."""

from __future__ import annotations

from rebalancer.cycle import run_cycle
from rebalancer.evictor import DryRunEvictor
from rebalancer.model import LabelSelector, Pod, Proposal, Snapshot, TopologySpreadConstraint
from rebalancer.placement import ClusterState
from rebalancer.planner import plan
from rebalancer.policy import LimitsConfig, Policy, parse_policy
from rebalancer.registry import StrategyContext
from strategies.gpu_affinity import GpuAffinityArgs, gpu_affinity
from strategies.gpu_consolidation import GpuConsolidationArgs, gpu_consolidation
from strategies.topology_spread import TopologySpreadArgs, topology_spread
from tests.builders import node, pod, snapshot

NO_LIMITS = Policy(limits=LimitsConfig(max_per_cycle=None))
POOL_B = {"pool": "b"}


def busy(node_name: str, count: int) -> list[Pod]:
    return [pod(f"busy-{node_name}-{i}", node_name) for i in range(count)]


def last_gpu_cluster() -> Snapshot:
    """Two strategies want the last free GPU of gpu-t.

    `stray` needs a pool-b node and sits on the cordoned gpu-old: gpu-affinity moves it to the fullest
    pool-b node, gpu-t (3 of 4 GPUs used). gpu-c holds one pod on 4 GPUs: gpu-consolidation drains it
    onto gpu-t as well. gpu-u (pool b, 2 of 4 used) is the packed scheduler's next choice for both.
    """
    nodes = [
        node("gpu-old", gpus=4, unschedulable=True),
        node("gpu-t", gpus=4, labels=POOL_B),
        node("gpu-u", gpus=4, labels=POOL_B),
        node("gpu-c", gpus=4),
    ]
    pods = [
        pod("stray", "gpu-old", node_selector=POOL_B),
        *busy("gpu-t", 3),
        *busy("gpu-u", 2),
        pod("lonely", "gpu-c"),
    ]
    return snapshot(nodes, pods)


AFFINITY_THEN_CONSOLIDATION = {
    "strategies": [
        {"name": "gpu-affinity"},
        {"name": "gpu-consolidation", "args": {"max_utilization_percent": None}},
    ],
    "telemetry": None,
}


def test_two_strategies_wanting_the_same_last_gpu_the_second_is_re_placed_not_refused() -> None:
    snap = last_gpu_cluster()
    ctx = StrategyContext()
    [fix] = gpu_affinity(snap, GpuAffinityArgs(), ctx).proposals
    [drain] = gpu_consolidation(snap, GpuConsolidationArgs(max_utilization_percent=None), ctx).proposals
    [stray] = snap.pods_on("gpu-old")
    [lonely] = snap.pods_on("gpu-c")
    assert fix.targets == {stray.key: "gpu-t"}
    assert drain.targets == {lonely.key: "gpu-t"}

    first, second = plan([fix, drain], snap, NO_LIMITS)

    assert first.approved
    assert second.approved, second.reason
    assert second.targets == {lonely.key: "gpu-u"}
    assert second.reason.startswith(
        "ml/lonely re-placed on gpu-u: its predicted target node gpu-t cannot take it any more ("
    )


def test_the_report_shows_the_node_the_re_placed_pod_will_go_to() -> None:
    report = run_cycle(last_gpu_cluster(), parse_policy(AFFINITY_THEN_CONSOLIDATION), DryRunEvictor())

    rows = {row.pod: row for row in report.decisions}
    assert (rows["stray"].action, rows["stray"].target_node) == ("evict", "gpu-t")
    assert (rows["lonely"].action, rows["lonely"].target_node) == ("evict", "gpu-u")
    assert report.freed_nodes == ("gpu-c",)


def taking(target: str, *, name: str = "taker", gpus: int = 1) -> tuple[Pod, Proposal]:
    """A pod on a cordoned node and an earlier proposal moving it onto `target`."""
    taker = pod(name, "gpu-old", gpus=gpus)
    return taker, Proposal(
        strategy="earlier", kind="pod", pods=(taker,), reason="earlier", targets={taker.key: target}
    )


ZONE = "topology.kubernetes.io/zone"
WEB = {"app": "web"}
BY_ZONE = TopologySpreadConstraint(
    max_skew=1,
    topology_key=ZONE,
    when_unsatisfiable="DoNotSchedule",
    label_selector=LabelSelector(match_labels=WEB),
)


def test_a_spread_fix_whose_only_allowed_domain_is_full_is_refused_naming_the_domain() -> None:
    taker, earlier = taking("gpu-b1")
    webs = [pod(f"web-{i}", "gpu-a1", labels=WEB, topology_spread=[BY_ZONE]) for i in range(3)]
    nodes = [
        node("gpu-old", unschedulable=True),
        node("gpu-a1", zone="a"),
        node("gpu-a2", zone="a"),  # empty: room, but in the loaded zone
        node("gpu-b1", zone="b"),
        node("gpu-b2", zone="b"),
    ]
    others = [pod("full-b1", "gpu-b1", gpus=7), pod("full-b2", "gpu-b2", gpus=8)]
    snap = snapshot(nodes, [taker, *webs, *others])
    [fix] = topology_spread(snap, TopologySpreadArgs(), StrategyContext()).proposals
    [moved] = fix.pods
    assert fix.targets == {moved.key: "gpu-b1"}

    first, second = plan([earlier, fix], snap, NO_LIMITS)

    assert first.approved
    assert second.blocked_by == "no-fit"
    assert second.reason.startswith(f"{moved.ref}: its predicted target node gpu-b1 cannot take it (")
    assert second.reason.endswith("), and no node in zone b can take it")


def last_gpu_of_gpu_t() -> tuple[Pod, Proposal, Snapshot]:
    """4-GPU gpu-t has one GPU free, which an earlier proposal takes (`taker`); gpu-c's one pod would
    be drained onto gpu-t, and the only other room is a 2-GPU node."""
    taker, earlier = taking("gpu-t")
    nodes = [
        node("gpu-old", gpus=4, unschedulable=True),
        node("gpu-t", gpus=4),
        node("gpu-small", gpus=2),
        node("gpu-c", gpus=4),
    ]
    return taker, earlier, snapshot(nodes, [taker, *busy("gpu-t", 3), pod("lonely", "gpu-c")])


def test_a_drain_whose_pods_could_only_go_to_smaller_nodes_is_refused_naming_no_smaller_nodes() -> None:
    taker, earlier, snap = last_gpu_of_gpu_t()
    args = GpuConsolidationArgs(max_utilization_percent=None, move_to_smaller_nodes=False)
    [drain] = gpu_consolidation(snap, args, StrategyContext()).proposals
    assert drain.targets == {("ml", "lonely"): "gpu-t"}
    # Once gpu-t is full, the packed scheduler would take the 2-GPU node.
    after = ClusterState.from_snapshot(snap)
    after.place(taker, "gpu-t")
    after.cordon("gpu-c")
    assert after.best_node(snap.pods_on("gpu-c")[0], exclude={"gpu-c"}) == "gpu-small"

    first, second = plan([earlier, drain], snap, NO_LIMITS)

    assert first.approved
    assert second.blocked_by == "no-fit"
    assert second.reason.startswith("ml/lonely: its predicted target node gpu-t cannot take it (")
    assert second.reason.endswith(
        "), and no node with at least 4 GPUs (no smaller nodes) other than the drained node gpu-c can take it"
    )


def test_the_same_drain_moves_to_the_smaller_node_when_smaller_nodes_are_allowed() -> None:
    _, earlier, snap = last_gpu_of_gpu_t()
    anywhere = GpuConsolidationArgs(
        max_utilization_percent=None,
        move_to_smaller_nodes=True,
        drain_onto_larger_nodes=False,
        peer_pods_to_make_room=0,
    )
    [drain] = gpu_consolidation(snap, anywhere, StrategyContext()).proposals

    _, second = plan([earlier, drain], snap, NO_LIMITS)

    assert second.approved
    assert second.targets == {("ml", "lonely"): "gpu-small"}


# --------------------------------------------------------------------------- eviction order


def test_a_decision_evicts_its_pods_in_the_order_the_planner_placed_them() -> None:
    """kube-scheduler queues replacements first in, first out (equal priorities): evicting in the
    order the prediction placed the pods (largest GPU request first) lets them land as predicted."""
    nodes = [node("gpu-old", gpus=8), node("gpu-a", gpus=8)]
    small, large = pod("a-small", "gpu-old", gpus=1), pod("z-large", "gpu-old", gpus=4)
    snap = snapshot(nodes, [small, large, *busy("gpu-a", 2)])
    proposal = Proposal(
        strategy="gpu-consolidation",
        kind="node",
        pods=(small, large),
        reason="drain",
        node="gpu-old",
        targets={small.key: "gpu-a", large.key: "gpu-a"},
    )
    [decision] = plan([proposal], snap, NO_LIMITS)
    assert decision.approved
    assert decision.order == (large.key, small.key)
    assert decision.pods_in_order == (large, small)
    outcomes = DryRunEvictor().evict(decision)
    assert [outcome.pod for outcome in outcomes] == ["z-large", "a-small"]


def test_room_made_on_another_node_is_evicted_first_whatever_its_size() -> None:
    """A drain that lifts a peer's pod to make room evicts that pod first, so the room exists when
    the drained node's replacements are scheduled; then largest GPU request first."""
    nodes = [node("gpu-old", gpus=8), node("gpu-peer", gpus=8), node("gpu-a", gpus=8)]
    maker = pod("maker", "gpu-peer", gpus=1)
    small, large = pod("a-small", "gpu-old", gpus=1), pod("z-large", "gpu-old", gpus=4)
    snap = snapshot(nodes, [maker, small, large, *busy("gpu-peer", 6), *busy("gpu-a", 2)])
    proposal = Proposal(
        strategy="gpu-consolidation",
        kind="node",
        pods=(small, large, maker),
        reason="drain",
        node="gpu-old",
        targets={maker.key: "gpu-a", small.key: "gpu-peer", large.key: "gpu-a"},
    )
    [decision] = plan([proposal], snap, NO_LIMITS)
    assert decision.approved
    assert decision.order == (maker.key, large.key, small.key)
