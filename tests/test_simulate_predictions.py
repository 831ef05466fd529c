"""Predictions the replay can check: a drained pod's predicted node is where the packed scheduler puts
it when the cycle's plan runs (`destinations.land`), on the state the replay's scheduler model sees."""

from __future__ import annotations

from rebalancer.destinations import Landed, Misfit, land
from rebalancer.model import DestinationRule, Pod, Proposal
from rebalancer.placement import ClusterState
from rebalancer.simulate.cluster import SimCluster
from rebalancer.simulate.rebalancers import PACKED_SCHEDULER, SnapshotBuilder
from rebalancer.simulate.trace import Job, TraceNode

HOUR = 3600.0


def one_gpu_job(index: int) -> Job:
    return Job(
        index=index,
        name=f"j{index:02d}",
        cpu_milli=4000,
        memory_mib=1024,
        num_gpu=1,
        gpu_milli=1000,
        models=None,
        arrival=0.0,
        end=HOUR,
    )


def drain_scene() -> tuple[SimCluster, SnapshotBuilder, list[Job]]:
    """Three 8-GPU nodes: a holds 6 GPUs, b 4, d 1 (the node drained). The packed scheduler puts d's pod
    on a, the fullest; a strategy that assumed a would be drained too predicted b."""
    cluster = SimCluster([TraceNode(name, 96000, 393216, 8, "G2") for name in ("a", "b", "d")])
    for _ in range(3):
        cluster.add_node(cluster.pools[0], 0.0)
    jobs = [one_gpu_job(i) for i in range(11)]
    for job in jobs:
        cluster.place(job, cluster.nodes["a" if job.index < 6 else "b" if job.index < 10 else "d"], 0.0)
    return cluster, SnapshotBuilder(jobs, PACKED_SCHEDULER), jobs


def drain_d(
    builder: SnapshotBuilder,
    cluster: SimCluster,
    rules: tuple[DestinationRule, ...] | None,
    *,
    whole_node: bool = True,
) -> tuple[Landed | Misfit, Pod]:
    """d's pod predicted on b: a drain of d (`whole_node`), else a move of that one pod."""
    snapshot = builder.snapshot(0.0, cluster)
    pod = next(p for p in snapshot.pods if p.node_name == "d")
    proposal = Proposal(
        strategy="gpu-consolidation" if whole_node else "topology-spread",
        kind="node" if whole_node else "pod",
        pods=(pod,),
        reason="test",
        node="d" if whole_node else None,
        targets={pod.key: "b"},
        destinations={} if rules is None else {pod.key: rules},
    )
    drained = "d" if whole_node else None
    return land(proposal, proposal.pods, snapshot, ClusterState.from_snapshot(snapshot), drained), pod


def test_a_pod_is_predicted_where_the_packed_scheduler_puts_it_not_where_its_strategy_assumed() -> None:
    cluster, builder, jobs = drain_scene()
    landed, pod = drain_d(builder, cluster, (DestinationRule("with at least 8 GPUs", frozenset("abd")),))
    assert isinstance(landed, Landed)
    assert landed.targets == {pod.key: "a"}
    assert landed.replaced == (
        "trace/j10 re-placed on a: the packed scheduler prefers it to its predicted target node b",
    )
    # The replay's scheduler model agrees.
    cluster.remove(jobs[10], 0.0)
    cluster.nodes["d"].draining = True
    chosen = cluster.best_node(jobs[10])
    assert chosen is not None and chosen.name == "a"


def test_a_proposal_whose_pod_the_scheduler_would_send_where_its_rules_forbid_is_refused() -> None:
    cluster, builder, _ = drain_scene()
    landed, pod = drain_d(builder, cluster, (DestinationRule("in zone b", frozenset("b")),))
    assert isinstance(landed, Misfit)
    assert landed.pod == pod
    assert landed.reason == (
        "the packed scheduler would put it on node a, not on its predicted target node b, "
        "and that node is not one in zone b"
    )


def test_a_pod_without_destination_rules_keeps_its_target() -> None:
    cluster, builder, _ = drain_scene()
    landed, pod = drain_d(builder, cluster, None)
    assert isinstance(landed, Landed)
    assert landed.targets == {pod.key: "b"}
    assert landed.replaced == ()


def test_a_moved_pod_keeps_a_target_its_strategy_chose_under_constraints_placement_does_not_model() -> None:
    """A one-pod move (a topology spread fix, say) predicts where the scheduler goes under the pod's own
    constraints, which the packed score alone does not see: its target stands."""
    cluster, builder, _ = drain_scene()
    rules = (DestinationRule("in zone b", frozenset("b")),)
    landed, pod = drain_d(builder, cluster, rules, whole_node=False)
    assert isinstance(landed, Landed)
    assert landed.targets == {pod.key: "b"}
