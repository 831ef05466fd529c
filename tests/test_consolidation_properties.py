"""Property: applying a `gpu-consolidation` plan by its predicted placements leaves a valid cluster.

For random clusters (GPU models, memory labels, taints, cordoned nodes, whole GPUs and shares, node
selectors, `Gt` affinities, gangs, DaemonSets, protected pods and non-packed schedulers), every pod
must end on a node that satisfies all its constraints, no node may be over capacity on any resource or
GPU device, every drained node must end empty of non-DaemonSet pods, and gangs move whole. With the
node-size options, no pod goes to a node with fewer GPUs than the drained one, and a node at or above
the threshold is drained only by lifting pods onto larger nodes, the rest fitting in its free GPUs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rebalancer.model import (
    GPU_RESOURCE,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    OwnerRef,
    Pod,
    Snapshot,
    Taint,
    Toleration,
)
from rebalancer.placement import ClusterState
from rebalancer.registry import Refusal, StrategyContext
from strategies.gpu_consolidation import GpuConsolidationArgs, gpu_consolidation
from tests.builders import A100, GIB, H100, L4, node, pod, replace, snapshot

PodKey = tuple[str, str]
MEMORY_LABEL = "nvidia.com/gpu.memory"
MODELS = {A100: "81920", H100: "81920", L4: "24576"}
TAINT = Taint(key="dedicated", value="training")
AGENT = OwnerRef(kind="DaemonSet", name="dcgm-exporter")
# Shares from a divisible set (250, 500), so first-fit decreasing is an exact per-device check.
SHARES = (250, 500)


@dataclass(frozen=True)
class Cluster:
    snapshot: Snapshot
    protected: frozenset[str]


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    nodes = []
    for i in range(draw(st.integers(2, 7))):
        model = draw(st.sampled_from(sorted(MODELS)))
        nodes.append(
            node(
                f"n{i}",
                gpus=draw(st.sampled_from((2, 4, 8))),
                model=model,
                cpu_milli=draw(st.sampled_from((16_000, 32_000, 96_000))),
                memory=draw(st.sampled_from((64, 256))) * GIB,
                labels={MEMORY_LABEL: MODELS[model]},
                taints=[TAINT] if draw(st.integers(0, 5)) == 0 else [],
            )
        )
    # Bind pods where they fit, as a scheduler would have.
    state = ClusterState.from_snapshot(snapshot(nodes))
    pods: list[Pod] = []
    for j in range(draw(st.integers(1, 24))):
        kind = draw(st.sampled_from(("whole", "whole", "share", "cpu", "daemon")))
        gpus, milli = 0, 1000
        if kind == "whole":
            gpus = draw(st.sampled_from((1, 1, 2, 4)))
        elif kind == "share":
            gpus, milli = 1, draw(st.sampled_from(SHARES))
        selector = {}
        affinity = []
        if draw(st.integers(0, 4)) == 0:
            selector = {"nvidia.com/gpu.product": draw(st.sampled_from(sorted(MODELS)))}
        if draw(st.integers(0, 4)) == 0:
            requirement = NodeSelectorRequirement(MEMORY_LABEL, "Gt", ("40000",))
            affinity = [NodeSelectorTerm(match_expressions=(requirement,))]
        gang = draw(st.sampled_from((None, None, None, "ml/g1", "ml/g2")))
        candidate = pod(
            f"p{j}",
            None,
            gpus=gpus,
            gpu_milli=milli,
            cpu_milli=draw(st.sampled_from((500, 2_000, 8_000))),
            memory=draw(st.sampled_from((1, 8, 32))) * GIB,
            owner=AGENT if kind == "daemon" else OwnerRef(kind="ReplicaSet", name=f"rs-{j}"),
            scheduler_name=draw(st.sampled_from(("gpu-packed-scheduler",) * 4 + ("default-scheduler",))),
            node_selector=selector,
            required_affinity=affinity,
            tolerations=[Toleration(key="dedicated", operator="Exists")] if draw(st.booleans()) else [],
            gang=None if kind == "daemon" else gang,
        )
        target = nodes[draw(st.integers(0, len(nodes) - 1))].name
        if state.fits(candidate, target).ok:
            state.place(candidate, target)
            pods.append(replace(candidate, node_name=target))
    # Some nodes are cordoned after the fact: their pods stay, nothing new may land there.
    cordoned = {n.name for n in nodes if draw(st.integers(0, 6)) == 0}
    nodes = [replace(n, unschedulable=n.name in cordoned) for n in nodes]
    protected = frozenset(p.name for p in pods if draw(st.integers(0, 9)) == 0)
    return Cluster(snapshot(nodes, pods), protected)


def _final(snap: Snapshot, proposals_targets: list[dict[PodKey, str]]) -> dict[PodKey, str]:
    where = {p.key: p.node_name for p in snap.pods if p.node_name is not None}
    for targets in proposals_targets:
        where.update(targets)
    return where


def _gpus(p: Pod) -> float:
    return p.gpu.count * p.gpu.milli_per_device / 1000


def _devices_hold(gpus: int, whole: int, shares: list[int]) -> bool:
    """Independent per-device check: whole GPUs take free devices, shares pack first-fit decreasing."""
    if whole > gpus:
        return False
    free = [1000] * (gpus - whole)
    for share in sorted(shares, reverse=True):
        for index, room in enumerate(free):
            if room >= share:
                free[index] -= share
                break
        else:
            return False
    return True


@st.composite
def consolidation_args(draw: st.DrawFn) -> GpuConsolidationArgs:
    onto_larger = draw(st.booleans())
    return GpuConsolidationArgs(
        max_utilization_percent=None,
        max_allocated_percent=draw(st.sampled_from((30.0, 50.0, 80.0))),
        max_nodes_per_cycle=draw(st.integers(1, 4)),
        move_to_smaller_nodes=draw(st.booleans()),
        drain_onto_larger_nodes=onto_larger,
        peer_pods_to_make_room=draw(st.integers(0, 2)) if onto_larger else 0,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), args=consolidation_args())
def test_applying_the_plan_leaves_a_valid_cluster(cluster: Cluster, args: GpuConsolidationArgs) -> None:
    check_plan(cluster, args)


@st.composite
def crowded_small_nodes(draw: st.DrawFn) -> Cluster:
    """Full and nearly full 4-GPU L4 nodes holding L4-only pods and pods that may run anywhere, beside
    8-GPU nodes with some room: where room on peers can be made."""
    nodes = [node(f"l4-{i}", gpus=4, model=L4) for i in range(draw(st.integers(2, 4)))]
    nodes += [node(f"a100-{i}", model=A100) for i in range(draw(st.integers(1, 3)))]
    pods: list[Pod] = []
    for n in nodes:
        target = draw(st.integers(5, 7) if n.gpu_count == 8 else st.integers(3, 4))
        held = 0
        while held < target:
            gpus = min(draw(st.sampled_from((1, 1, 2))), target - held)
            bound = n.gpu_count == 4 and draw(st.booleans())
            pods.append(
                pod(
                    f"p{len(pods)}",
                    n.name,
                    gpus=gpus,
                    cpu_milli=draw(st.sampled_from((2_000, 8_000))),
                    owner=OwnerRef(kind="ReplicaSet", name=f"rs-{len(pods)}"),
                    node_selector={"nvidia.com/gpu.product": L4} if bound else {},
                )
            )
            held += gpus
    protected = frozenset(p.name for p in pods if draw(st.integers(0, 9)) == 0)
    return Cluster(snapshot(nodes, pods), protected)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=crowded_small_nodes(), cap=st.integers(1, 3), room=st.integers(1, 2))
def test_making_room_on_peers_leaves_a_valid_cluster(cluster: Cluster, cap: int, room: int) -> None:
    args = GpuConsolidationArgs(
        max_utilization_percent=None,
        max_nodes_per_cycle=cap,
        move_to_smaller_nodes=False,
        drain_onto_larger_nodes=True,
        peer_pods_to_make_room=room,
    )
    check_plan(cluster, args)


def check_plan(cluster: Cluster, args: GpuConsolidationArgs) -> None:
    snap = cluster.snapshot
    protected = cluster.protected

    def refusal(p: Pod) -> Refusal | None:
        return Refusal("opt-out", "protected") if p.name in protected else None

    result = gpu_consolidation(snap, args, StrategyContext(refusal=refusal))
    cap, threshold = args.max_nodes_per_cycle, args.max_allocated_percent
    to_smaller, onto_larger = args.move_to_smaller_nodes, args.drain_onto_larger_nodes
    assert len(result.proposals) <= cap
    event(f"proposals: {min(len(result.proposals), 2)}{'+' if len(result.proposals) >= 2 else ''}")
    event(f"gang moved: {any(p.group for p in result.proposals)}")

    # Proposals are disjoint, complete, and never move protected, DaemonSet or non-packed pods.
    seen: Counter[PodKey] = Counter()
    freed: set[str] = set()
    for proposal in result.proposals:
        assert proposal.kind == "node"
        assert proposal.node in proposal.nodes_freed
        assert set(proposal.targets) == {p.key for p in proposal.pods}
        freed.update(proposal.nodes_freed)
        for p in proposal.pods:
            seen[p.key] += 1
            assert p.name not in protected
            assert not p.is_daemonset
            assert p.scheduler_name in args.packed_schedulers
        # Gangs move whole.
        for gang in {p.gang for p in proposal.pods if p.gang is not None}:
            assert {m.key for m in snap.gangs[gang]} <= {p.key for p in proposal.pods}
    assert all(count == 1 for count in seen.values())

    # Node sizes: never onto smaller nodes unless allowed; above the threshold, only by lifting pods,
    # and room made on peers only by lifting at most `room` of their pods, in no gang, onto larger nodes.
    for proposal in result.proposals:
        assert proposal.node is not None
        drained = snap.nodes[proposal.node]
        size = drained.gpu_count
        allocated = sum(_gpus(p) for p in snap.pods_on(proposal.node))
        lands = {p.key: snap.nodes[proposal.targets[p.key]].gpu_count for p in proposal.pods}
        makers = [p for p in proposal.pods if p.node_name != proposal.node and p.gang is None]
        assert len(makers) <= args.peer_pods_to_make_room
        for maker in makers:
            event("room made on a peer")
            assert maker.node_name is not None
            peer = snap.nodes[maker.node_name]
            assert (peer.gpu_count, peer.gpu_model) == (size, drained.gpu_model)
            assert lands[maker.key] > size
        own = [p for p in proposal.pods if p not in makers]
        if not to_smaller:
            assert all(lands[p.key] >= size for p in own)
        if allocated / size * 100 >= threshold:
            event("drained onto larger nodes")
            assert onto_larger
            assert any(lands[p.key] > size for p in own)
            assert all(lands[p.key] >= size for p in own)
            same = sum(_gpus(p) for p in own if lands[p.key] == size)
            assert same <= size - allocated + sum(_gpus(p) for p in makers) + 1e-9
        else:
            assert not makers
    for proposal in result.proposals:
        assert not set(proposal.targets.values()) & freed

    where = _final(snap, [dict(p.targets) for p in result.proposals])
    by_key = snap.pods_by_key

    # Every drained node ends empty of non-DaemonSet pods.
    for name in freed:
        left = [k for k, n in where.items() if n == name and not by_key[k].is_daemonset]
        assert left == [], f"{name} still holds {left}"

    # Every moved pod fits where it lands (constraints and capacity), re-placing everything on an
    # empty cluster; unmoved pods on cordoned nodes are judged as if the node were schedulable.
    moved = set(seen)
    for p in snap.pods:
        if p.key in moved:
            assert not snap.nodes[where[p.key]].unschedulable
    open_nodes = [replace(n, unschedulable=False) for n in snap.nodes.values()]
    check = ClusterState.from_snapshot(snapshot(open_nodes))
    ordered = sorted(
        snap.pods, key=lambda p: (p.gpu.milli_per_device < 1000, -p.gpu.milli_per_device, -p.gpu.count, p.key)
    )
    for p in ordered:
        fit = check.fits(p, where[p.key])
        assert fit.ok, f"{p.ref} on {where[p.key]}: {fit.reason}"
        check.place(p, where[p.key])

    # Independently of placement: no node over capacity on any resource or GPU device.
    used: dict[str, Counter[str]] = defaultdict(Counter)
    whole: Counter[str] = Counter()
    shares: dict[str, list[int]] = defaultdict(list)
    for p in snap.pods:
        target = where[p.key]
        used[target].update(p.requests)
        used[target]["pods"] += 1
        if p.gpu.is_shared:
            shares[target].append(p.gpu.milli_per_device)
        else:
            whole[target] += p.gpu.count
    for name, amounts in used.items():
        allocatable = snap.nodes[name].allocatable
        for resource, amount in amounts.items():
            assert amount <= allocatable.get(resource, 0), f"{name} over capacity on {resource}"
        gpus = allocatable.get(GPU_RESOURCE, 0)
        assert _devices_hold(gpus, whole[name], shares[name]), f"{name} over capacity on a GPU device"
