"""Scheduling simulation: feasibility rules, per-device GPU packing, MostAllocated, reservations."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.gpu_devices import gpu_device_count
from rebalancer.model import (
    GPU_RESOURCE,
    GpuRequest,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    PreferredTerm,
    Taint,
    Toleration,
)
from rebalancer.placement import ClusterState, FitResult, PodKey
from rebalancer.scoring import Prediction
from tests.builders import GIB, H100, L4, node, pod, replace, snapshot

GPU_MEMORY = "nvidia.com/gpu.memory"
GPU_COUNT = "nvidia.com/gpu.count"
MIG_1G = "nvidia.com/mig-1g.10gb"
SHARED = "nvidia.com/gpu.shared"
DRAINING = Taint(key="rebalancer.gpu/draining", value="x", effect="NoSchedule")


def state_of(nodes: Iterable[Node], pods: Iterable[Pod] = ()) -> ClusterState:
    return ClusterState.from_snapshot(snapshot(nodes, pods))


def running(prefix: str, node_name: str, count: int, **kwargs: Any) -> list[Pod]:
    return [pod(f"{prefix}-{i}", node_name, **kwargs) for i in range(count)]


def affinity(key: str, operator: str, *values: str) -> list[NodeSelectorTerm]:
    requirement = NodeSelectorRequirement(key=key, operator=operator, values=values)
    return [NodeSelectorTerm(match_expressions=(requirement,))]


def picture(state: ClusterState, nodes: Iterable[str], pods: Iterable[PodKey] = ()) -> object:
    """Everything observable about the given nodes and pods, to compare before and after."""
    return (
        {n: (dict(state.free(n)), state.gpu_free_milli(n), state.is_cordoned(n)) for n in nodes},
        {key: state.node_of(key) for key in pods},
    )


# --------------------------------------------------------------------------- building the state


def test_build_accounts_active_pods_on_their_nodes() -> None:
    state = state_of(
        [node("a", gpus=8)],
        [
            pod("running", "a", gpus=2, cpu_milli=8000, memory=32 * GIB),
            pod("pending", None, gpus=4),
            pod("done", "a", gpus=4, phase="Succeeded"),
            pod("failed", "a", gpus=4, phase="Failed"),
            pod("lost", "gone-node", gpus=1),
        ],
    )
    assert state.free("a") == {"cpu": 88_000, "memory": 480 * GIB, "pods": 109, GPU_RESOURCE: 6}
    assert state.gpu_free_milli("a") == (0, 0, 1000, 1000, 1000, 1000, 1000, 1000)
    assert state.node_of(("ml", "running")) == "a"
    assert state.node_of(("ml", "pending")) is None
    assert state.node_of(("ml", "done")) is None
    assert state.node_of(("ml", "lost")) is None


def test_existing_pods_get_devices_whole_first_then_shares_by_best_fit() -> None:
    pods = [
        pod("share-300", "a", gpus=1, gpu_milli=300),
        pod("whole", "a", gpus=1),
        pod("share-500", "a", gpus=1, gpu_milli=500),
        pod("share-600", "a", gpus=1, gpu_milli=600),
    ]
    state = state_of([node("a", gpus=3)], pods)
    # whole -> device 0; 600 -> device 1; 500 does not fit beside it -> device 2; 300 -> best fit is
    # device 1 (400 free) rather than device 2 (500 free).
    assert state.gpu_free_milli("a") == (0, 100, 500)
    # Listing order does not matter.
    assert state_of([node("a", gpus=3)], reversed(pods)).gpu_free_milli("a") == (0, 100, 500)


def test_overcommitted_snapshot_shows_negative_free_instead_of_failing() -> None:
    state = state_of([node("a", gpus=1)], running("p", "a", 2))
    assert state.free("a")[GPU_RESOURCE] == -1
    assert state.gpu_free_milli("a") == (-1000,)
    assert state.fits(pod("new", gpus=0), "a").ok  # cpu-only pods still fit
    assert not state.fits(pod("new", gpus=1, gpu_milli=100), "a").ok


@pytest.mark.parametrize(
    ("gpus", "labels", "expected"),
    [
        (8, {}, 8),
        (0, {GPU_COUNT: "4"}, 4),
        (2, {GPU_COUNT: "4"}, 4),
        (8, {GPU_COUNT: "4"}, 8),
        (2, {GPU_COUNT: "four"}, 2),
        (0, {GPU_COUNT: "-3"}, 0),
    ],
)
def test_gpu_device_count(gpus: int, labels: dict[str, str], expected: int) -> None:
    assert gpu_device_count(node("n", gpus=gpus, labels=labels)) == expected


# --------------------------------------------------------------------------- resources


def test_fits_reports_ok() -> None:
    assert state_of([node("a")]).fits(pod("p"), "a") == FitResult(ok=True, reason="")


def test_unknown_node_never_fits() -> None:
    state = state_of([node("a")])
    assert state.fits(pod("p"), "nope") == FitResult(ok=False, reason="node nope not found")
    with pytest.raises(ValueError, match="not found"):
        state.place(pod("p"), "nope")


def test_insufficient_gpu() -> None:
    state = state_of([node("a", gpus=8)], running("p", "a", 7))
    assert state.fits(pod("one"), "a").ok
    assert state.fits(pod("two", gpus=2), "a") == FitResult(False, "Insufficient nvidia.com/gpu")


def test_insufficient_cpu_and_memory() -> None:
    state = state_of([node("a", cpu_milli=10_000, memory=64 * GIB)], [pod("p", "a", cpu_milli=8000)])
    assert state.fits(pod("cpu", cpu_milli=2000), "a").ok
    assert state.fits(pod("cpu", cpu_milli=2001), "a").reason == "Insufficient cpu"
    assert state.fits(pod("mem", cpu_milli=0, memory=48 * GIB), "a").ok
    assert state.fits(pod("mem", cpu_milli=0, memory=48 * GIB + 1), "a").reason == "Insufficient memory"


def test_request_for_a_resource_the_node_lacks() -> None:
    state = state_of([node("a")])
    assert state.fits(pod("p", extra={"example.com/fpga": 1}), "a").reason == "Insufficient example.com/fpga"


def test_pod_count_limit_applies_only_when_declared() -> None:
    limited = node("a", extra={"pods": 2})
    state = state_of([limited], running("p", "a", 1, gpus=0))
    state.place(pod("second", gpus=0), "a")
    assert state.fits(pod("third", gpus=0), "a") == FitResult(False, "Too many pods")
    assert state.best_node(pod("third", gpus=0)) is None
    undeclared = Node(name="b", allocatable={"cpu": 96_000, "memory": 512 * GIB})
    state = state_of([undeclared], running("p", "b", 200, gpus=0, cpu_milli=1, memory=1))
    assert state.fits(pod("more", gpus=0, cpu_milli=1, memory=1), "b").ok
    assert "pods" not in state.free("b")


def test_mig_resources_are_counted_per_profile() -> None:
    mig_node = node("mig", gpus=0, extra={MIG_1G: 7, "nvidia.com/mig-3g.40gb": 2})
    state = state_of([mig_node, node("plain")], running("p", "mig", 2, gpus=0, extra={MIG_1G: 2}))
    asks_three = pod("three", gpus=0, extra={MIG_1G: 3})
    assert state.fits(asks_three, "mig").ok
    assert state.fits(asks_three, "plain").reason == f"Insufficient {MIG_1G}"
    state.place(asks_three, "mig")
    assert state.free("mig")[MIG_1G] == 0
    assert state.fits(pod("one-more", gpus=0, extra={MIG_1G: 1}), "mig").reason == f"Insufficient {MIG_1G}"
    assert state.fits(pod("other-profile", gpus=0, extra={"nvidia.com/mig-3g.40gb": 2}), "mig").ok
    assert state.best_node(pod("any", gpus=0, extra={MIG_1G: 1})) is None


def test_shared_gpu_resource_is_counted_like_any_extended_resource() -> None:
    shared_node = node("ts", gpus=0, labels={GPU_COUNT: "1"}, extra={SHARED: 4})
    slice_pod = pod("s", gpus=1, gpu_milli=250, extra={SHARED: 1})
    state = state_of([shared_node], [replace(slice_pod, name=f"s{i}", node_name="ts") for i in range(3)])
    assert state.gpu_free_milli("ts") == (250,)
    assert state.fits(slice_pod, "ts").ok
    state.place(slice_pod, "ts")
    assert state.fits(replace(slice_pod, name="s5"), "ts").reason == f"Insufficient {SHARED}"


# --------------------------------------------------------------------------- GPU devices


def test_share_goes_to_the_device_with_least_free_milli_that_fits() -> None:
    state = state_of([node("a", gpus=3)])
    state.place(pod("s600", gpus=1, gpu_milli=600), "a")
    state.place(pod("s700", gpus=1, gpu_milli=700), "a")
    assert state.gpu_free_milli("a") == (400, 300, 1000)
    state.place(pod("s250", gpus=1, gpu_milli=250), "a")  # first fit would pick device 0
    assert state.gpu_free_milli("a") == (400, 50, 1000)
    state.place(pod("s350", gpus=1, gpu_milli=350), "a")
    assert state.gpu_free_milli("a") == (50, 50, 1000)
    state.place(pod("s100", gpus=1, gpu_milli=100), "a")
    assert state.gpu_free_milli("a") == (50, 50, 900)


def test_shares_are_never_a_fluid_sum() -> None:
    # 800 milli free in total, but no single device has 600.
    state = state_of([node("a", gpus=2)], running("share", "a", 2, gpus=1, gpu_milli=600))
    assert state.gpu_free_milli("a") == (400, 400)
    assert sum(state.gpu_free_milli("a")) >= 600
    assert state.fits(pod("p", gpus=1, gpu_milli=600), "a") == FitResult(
        False, "no GPU device with 600 free milli-GPU"
    )
    assert state.fits(pod("p", gpus=1, gpu_milli=400), "a").ok


def test_two_600_milli_shares_do_not_fit_one_free_device() -> None:
    state = state_of([node("a", gpus=2)], [pod("whole", "a", gpus=1)])
    first, second = pod("s1", gpus=1, gpu_milli=600), pod("s2", gpus=1, gpu_milli=600)
    state.place(first, "a")
    assert state.fits(second, "a") == FitResult(False, "no GPU device with 600 free milli-GPU")
    assert state.best_node(second) is None


def test_whole_gpus_need_entirely_free_devices() -> None:
    state = state_of([node("a", gpus=2)], [pod("tiny", "a", gpus=1, gpu_milli=100)])
    assert state.free("a")[GPU_RESOURCE] == 2  # the scalar resource alone would admit two
    assert state.fits(pod("one", gpus=1), "a").ok
    assert state.fits(pod("two", gpus=2), "a") == FitResult(False, "fewer than 2 entirely free GPU devices")
    state.place(pod("one", gpus=1), "a")
    assert state.gpu_free_milli("a") == (900, 0)
    assert state.fits(pod("another", gpus=1), "a") == FitResult(False, "no entirely free GPU device")


def test_multi_device_shares_take_distinct_devices() -> None:
    state = state_of([node("a", gpus=3)], [pod("big", "a", gpus=1, gpu_milli=700)])
    pair = replace(pod("pair", gpus=0), gpu=GpuRequest(count=2, milli_per_device=500))
    state.place(pair, "a")
    assert state.gpu_free_milli("a") == (300, 500, 500)
    assert state.fits(pair, "a").ok
    state.place(replace(pair, name="pair-2"), "a")
    assert state.fits(replace(pair, name="pair-3"), "a") == FitResult(
        False, "fewer than 2 GPU devices with 500 free milli-GPU"
    )


def test_gpu_request_without_gpu_field_uses_whole_devices() -> None:
    raw = Pod(namespace="ml", name="raw", requests={GPU_RESOURCE: 2, "cpu": 1000})
    state = state_of([node("a", gpus=2)], [pod("tiny", "a", gpus=1, gpu_milli=100)])
    assert state.fits(raw, "a").reason == "fewer than 2 entirely free GPU devices"
    state.remove(pod("tiny", "a"))
    state.place(raw, "a")
    assert state.gpu_free_milli("a") == (0, 0)


def test_shares_fit_nodes_whose_devices_come_from_the_count_label() -> None:
    labelled = node("ts", gpus=0, labels={GPU_COUNT: "2"})
    state = state_of([labelled])
    assert state.gpu_free_milli("ts") == (1000, 1000)
    assert state.fits(pod("share", gpus=1, gpu_milli=500), "ts").ok
    # No nvidia.com/gpu is advertised, so a whole-GPU request is refused by the scalar resource.
    assert state.fits(pod("whole", gpus=1), "ts").reason == "Insufficient nvidia.com/gpu"


# --------------------------------------------------------------------------- taints, cordons, labels


def test_untolerated_no_schedule_taint() -> None:
    state = state_of([node("a", taints=[DRAINING])])
    assert state.fits(pod("p"), "a") == FitResult(
        False, "untolerated taint rebalancer.gpu/draining=x:NoSchedule"
    )
    tolerant = pod("t", tolerations=[Toleration(key="rebalancer.gpu/draining", operator="Equal", value="x")])
    assert state.fits(tolerant, "a").ok


def test_no_execute_taint_blocks_and_prefer_no_schedule_does_not() -> None:
    state = state_of(
        [
            node("evicting", taints=[Taint(key="maintenance", effect="NoExecute")]),
            node("preferring", taints=[Taint(key="spot", value="true", effect="PreferNoSchedule")]),
        ]
    )
    assert state.fits(pod("p"), "evicting").reason == "untolerated taint maintenance:NoExecute"
    assert state.fits(pod("p"), "preferring").ok


def test_toleration_effect_must_match_the_taint() -> None:
    state = state_of([node("a", taints=[DRAINING])])
    wrong_effect = pod(
        "w", tolerations=[Toleration(key="rebalancer.gpu/draining", operator="Exists", effect="NoExecute")]
    )
    assert not state.fits(wrong_effect, "a").ok
    assert state.fits(pod("all", tolerations=[Toleration(operator="Exists")]), "a").ok


def test_unschedulable_node() -> None:
    state = state_of([node("a", unschedulable=True)])
    assert state.fits(pod("p"), "a") == FitResult(False, "node is unschedulable")
    assert state.best_node(pod("p")) is None
    tolerant = pod(
        "t",
        tolerations=[
            Toleration(key="node.kubernetes.io/unschedulable", operator="Exists", effect="NoSchedule")
        ],
    )
    assert state.fits(tolerant, "a").ok


def test_cordoned_node_takes_no_placements() -> None:
    state = state_of([node("a"), node("b")], running("p", "a", 4))
    assert state.best_node(pod("new")) == "a"
    state.cordon("a")
    assert state.is_cordoned("a")
    assert not state.is_cordoned("b")
    assert state.fits(pod("new"), "a") == FitResult(False, "node is cordoned for draining")
    assert state.best_node(pod("new")) == "b"
    with pytest.raises(ValueError, match="cordoned"):
        state.place(pod("new"), "a")
    assert state.free("a")[GPU_RESOURCE] == 4  # what it holds stays accounted


def test_node_selector() -> None:
    state = state_of([node("a", labels={"pool": "train"}), node("b", labels={"pool": "serve"})])
    workload = pod("w", node_selector={"pool": "serve"})
    assert state.fits(workload, "a") == FitResult(False, "node(s) didn't match node selector")
    assert state.fits(workload, "b").ok
    assert state.best_node(workload) == "b"


def test_gt_on_gpu_memory_only_allows_big_gpus() -> None:
    nodes = [
        node("big", model=H100, labels={GPU_MEMORY: "81920"}),
        node("small", model=L4, labels={GPU_MEMORY: "24576"}),
        node("unlabelled"),
        node("garbled", labels={GPU_MEMORY: "80GB"}),
    ]
    state = state_of(nodes)
    needs_big = pod("big-model", required_affinity=affinity(GPU_MEMORY, "Gt", "40000"))
    assert [n.name for n in nodes if state.fits(needs_big, n.name).ok] == ["big"]
    assert state.fits(needs_big, "small") == FitResult(False, "node(s) didn't match node affinity")
    assert state.best_node(needs_big) == "big"
    fits_small = pod("small-model", required_affinity=affinity(GPU_MEMORY, "Lt", "40000"))
    assert [n.name for n in nodes if state.fits(fits_small, n.name).ok] == ["small"]


def test_required_affinity_on_node_name_field() -> None:
    state = state_of([node("a"), node("b")])
    pinned = pod(
        "pinned",
        required_affinity=[
            NodeSelectorTerm(match_fields=(NodeSelectorRequirement("metadata.name", "In", ("b",)),))
        ],
    )
    assert state.best_node(pinned) == "b"
    assert state.fits(pinned, "a").reason == "node(s) didn't match node affinity"


def test_required_affinity_terms_are_ored() -> None:
    state = state_of([node("h", model=H100), node("l", model=L4), node("x", model=None)])
    either = pod(
        "either",
        required_affinity=affinity("nvidia.com/gpu.product", "In", H100)
        + affinity("nvidia.com/gpu.product", "In", L4),
    )
    assert [n for n in ("h", "l", "x") if state.fits(either, n).ok] == ["h", "l"]


# --------------------------------------------------------------------------- scoring


MIB = 1024 * 1024


def zone_term(zone: str) -> NodeSelectorTerm:
    return NodeSelectorTerm(
        match_expressions=(NodeSelectorRequirement("topology.kubernetes.io/zone", "In", (zone,)),)
    )


def test_score_is_kube_schedulers_integer_most_allocated() -> None:
    state = state_of(
        [node("a", gpus=8, cpu_milli=100_000, memory=100 * GIB)],
        [pod("p", "a", gpus=2, cpu_milli=10_000, memory=10 * GIB)],
    )
    asking = pod("q", gpus=1, cpu_milli=10_000, memory=20 * GIB)
    gpu = 3 * 100 // 8  # 37: nvidia.com/gpu, 2 held + 1 asked of 8
    cpu = 20_000 * 100 // 100_000  # 20
    memory = 30 * 100 // 100  # 30
    assert state.score(asking, "a") == (10 * gpu + cpu + memory) // 12 == 35


def test_integer_arithmetic_picks_another_node_than_fractions_would() -> None:
    # a: cpu 69.9 %, memory 50.9 %: 69 and 50, (69 + 50) // 2 = 59; b: 60 % and 60 %: 60. As fractions
    # a would be the fuller (60.4 % against 60 %); kube-scheduler scores b higher and picks it.
    nodes = [node(name, gpus=0, model=None, cpu_milli=1000, memory=1000 * MIB) for name in ("a", "b")]
    state = state_of(
        nodes,
        [
            pod("on-a", "a", gpus=0, cpu_milli=699, memory=509 * MIB),
            pod("on-b", "b", gpus=0, cpu_milli=600, memory=600 * MIB),
        ],
    )
    newcomer = pod("new", gpus=0, cpu_milli=0, memory=0)
    assert (state.score(newcomer, "a"), state.score(newcomer, "b")) == (59, 60)
    assert state.best_node(newcomer) == "b"


def test_a_pod_without_cpu_or_memory_requests_is_scored_with_the_non_zero_defaults() -> None:
    # Scoring counts 100m cpu and 200 MiB for a pod that requests none, on the node and for the pod.
    # "crowded" runs ten such pods (1000m, 2000 MiB counted), "busy" one pod of 400m and 1 GiB; the
    # newcomer asks for 100m and 128 MiB. Counting what the pods request, "busy" would be the fuller.
    nodes = [node(name, gpus=0, model=None, cpu_milli=4000, memory=8 * GIB) for name in ("busy", "crowded")]
    best_effort = [replace(pod(f"be-{i}", "crowded", gpus=0), requests={}) for i in range(10)]
    state = state_of(nodes, [*best_effort, pod("sized", "busy", gpus=0, cpu_milli=400, memory=GIB)])
    newcomer = pod("new", gpus=0, cpu_milli=100, memory=128 * MIB)
    crowded = ((1000 + 100) * 100 // 4000 + (2000 + 128) * 100 // 8192) // 2  # 26
    busy = (500 * 100 // 4000 + (1024 + 128) * 100 // 8192) // 2  # 13
    assert (state.score(newcomer, "crowded"), state.score(newcomer, "busy")) == (crowded, busy) == (26, 13)
    assert state.best_node(newcomer) == "crowded"
    # The newcomer itself without requests counts as 100m and 200 MiB.
    bare = replace(newcomer, requests={})
    assert state.score(bare, "busy") == (500 * 100 // 4000 + (1024 + 200) * 100 // 8192) // 2
    # An explicit 0 stays 0, as upstream counts it.
    assert state.score(pod("zero", gpus=0, cpu_milli=0, memory=0), "busy") == (10 + 12) // 2


def test_the_non_zero_defaults_are_for_scoring_only() -> None:
    # Feasibility uses what pods really request: pods without requests fit a node of 150m, and the
    # score counts their defaults, capped at the allocatable (100).
    state = state_of([node("tiny", gpus=0, model=None, cpu_milli=150, memory=256 * MIB)])
    for i in range(3):
        bare = replace(pod(f"bare-{i}", gpus=0), requests={})
        assert state.fits(bare, "tiny").ok
        state.place(bare, "tiny")
    assert state.free("tiny")["cpu"] == 150
    assert state.score(replace(pod("more", gpus=0), requests={}), "tiny") == 100


def test_extended_resources_the_pod_does_not_request_are_left_out() -> None:
    # A cpu-only pod scores a GPU node on cpu and memory alone (its free GPUs do not count against it)
    # and a pod with whole GPUs scores nvidia.com/gpu; a GPU share that requests no GPU resource is
    # scored like the cpu-only pod.
    gpu_node = node("gpu", gpus=8, cpu_milli=10_000, memory=10 * GIB)
    cpu_node = node("cpu", gpus=0, model=None, cpu_milli=10_000, memory=10 * GIB)
    state = state_of(
        [gpu_node, cpu_node],
        [
            pod(name, where, gpus=0, cpu_milli=5000, memory=5 * GIB)
            for name, where in (("x", "gpu"), ("y", "cpu"))
        ],
    )
    cpu_pod = pod("cpu-only", gpus=0, cpu_milli=0, memory=0)
    assert state.score(cpu_pod, "gpu") == state.score(cpu_pod, "cpu") == 50
    prediction = state.best_nodes(cpu_pod)
    assert prediction is not None and prediction.tied == {"cpu", "gpu"}
    whole = pod("whole", gpus=2, cpu_milli=0, memory=0)
    assert state.score(whole, "gpu") == (10 * 25 + 50 + 50) // 12
    share = pod("share", gpus=1, gpu_milli=500, cpu_milli=0, memory=0)
    assert state.score(share, "gpu") == 50


def test_score_counts_requested_mig_profiles_and_gpu_shares_with_gpu_weight() -> None:
    mig_node = node("mig", gpus=0, cpu_milli=100_000, memory=100 * GIB, extra={MIG_1G: 4})
    state = state_of([mig_node], [pod("p", "mig", gpus=0, cpu_milli=0, memory=0, extra={MIG_1G: 1})])
    asking = pod("q", gpus=0, cpu_milli=10_000, memory=10 * GIB, extra={MIG_1G: 1})
    assert state.score(asking, "mig") == (10 * 50 + 10 + 10) // 12
    # A pod that does not ask for the profile is scored on cpu and memory alone.
    assert state.score(pod("cpu", gpus=0, cpu_milli=10_000, memory=10 * GIB), "mig") == 10
    shared_node = node("shared", gpus=0, cpu_milli=100_000, memory=100 * GIB, extra={SHARED: 8})
    shares = state_of([shared_node], [pod("s", "shared", gpus=0, cpu_milli=0, memory=0, extra={SHARED: 3})])
    asking_share = pod("t", gpus=0, cpu_milli=10_000, memory=10 * GIB, extra={SHARED: 1})
    assert shares.score(asking_share, "shared") == (10 * 50 + 10 + 10) // 12


def test_most_allocated_prefers_the_fuller_node() -> None:
    state = state_of(
        [node("emptier"), node("fuller")], running("e", "emptier", 2) + running("f", "fuller", 6)
    )
    assert state.score(pod("new"), "fuller") > state.score(pod("new"), "emptier")
    assert state.best_node(pod("new")) == "fuller"
    assert state.best_node(pod("new"), exclude={"fuller"}) == "emptier"


def test_best_node_skips_infeasible_fuller_nodes() -> None:
    state = state_of(
        [node("emptier"), node("fuller")], running("e", "emptier", 2) + running("f", "fuller", 7)
    )
    assert state.best_node(pod("pair", gpus=2)) == "emptier"


def test_a_prediction_is_every_node_tied_for_the_top_score_reported_by_name() -> None:
    state = state_of([node("n3"), node("n1"), node("n2"), node("fuller")], running("f", "fuller", 7))
    prediction = state.best_nodes(pod("pair", gpus=2))  # "fuller" has one GPU left
    assert prediction is not None
    assert prediction.tied == {"n1", "n2", "n3"} and prediction.chosen == "n1"
    assert state.best_node(pod("pair", gpus=2)) == "n1"
    assert prediction.accepts("n3") and not prediction.accepts("fuller")
    # Excluded, cordoned and changed nodes are judged as they are now.
    state.cordon("n2")
    state.place(pod("taker", gpus=1), "n3")  # n3 is now fuller than n1: it alone is the top
    assert state.best_nodes(pod("pair", gpus=2)) == Prediction(chosen="n3", tied=frozenset({"n3"}))
    after = state.best_nodes(pod("pair", gpus=2), exclude={"n3"})
    assert after == Prediction(chosen="n1", tied=frozenset({"n1"}))
    assert state.best_nodes(pod("huge", gpus=9)) is None


def test_preferred_node_affinity_is_scored_as_node_affinity_normalised_and_weighted() -> None:
    nodes = [node("n1", zone="a"), node("n2", zone="b"), node("n3", zone="b")]
    state = state_of(nodes)
    assert state.best_node(pod("plain")) == "n1"
    prefers_b = replace(pod("picky"), preferred_affinity=(PreferredTerm(weight=10, term=zone_term("b")),))
    assert state.best_nodes(prefers_b) == Prediction(chosen="n2", tied=frozenset({"n2", "n3"}))
    assert state.best_node(prefers_b) == "n2"


def test_preferred_affinity_weighs_as_much_as_most_allocated() -> None:
    # 10 x MostAllocated + 10 x NodeAffinity (100 on the preferred nodes, 0 on the others): a preference
    # outweighs every difference of MostAllocated short of the whole scale, and among the preferred
    # nodes the fuller one wins.
    prefers_b = replace(pod("picky"), preferred_affinity=(PreferredTerm(weight=1, term=zone_term("b")),))
    full_once_placed = state_of(
        [node("full", zone="a"), node("empty", zone="b")], running("p", "full", 7, cpu_milli=0, memory=0)
    )
    assert full_once_placed.score(prefers_b, "full") - full_once_placed.score(prefers_b, "empty") > 50
    assert full_once_placed.best_node(prefers_b) == "empty"
    both_preferred = state_of(
        [node("full", zone="b"), node("empty", zone="b"), node("other", zone="a")], running("p", "full", 4)
    )
    assert both_preferred.best_node(prefers_b) == "full"


def sized(name: str, gpus: int, **kwargs: Any) -> Node:
    """A GPU node labelled with its GPU count, as GPU feature discovery labels it."""
    return node(name, gpus=gpus, labels={GPU_COUNT: str(gpus)}, **kwargs)


def test_the_profile_prefers_the_node_with_more_gpus_unless_the_smaller_is_much_fuller() -> None:
    # addedAffinity: 8 GPUs match terms of weight 1 + 2 + 4, 4 GPUs 1 + 2: normalised 100 and 42, so
    # the 8-GPU node wins unless the 4-GPU one is more than 58 points fuller (MostAllocated).
    half_and_three_quarters = state_of(
        [sized("eight", 8), sized("four", 4)], [*running("e", "eight", 4), *running("f", "four", 2)]
    )
    assert half_and_three_quarters.score(pod("one"), "four") > half_and_three_quarters.score(
        pod("one"), "eight"
    )
    assert half_and_three_quarters.best_nodes(pod("one")) == Prediction("eight", frozenset({"eight"}))
    nearly_empty_and_full = state_of([sized("eight", 8), sized("four", 4)], running("f", "four", 3))
    fuller_by = nearly_empty_and_full.score(pod("one"), "four") - nearly_empty_and_full.score(
        pod("one"), "eight"
    )
    assert fuller_by > 58
    assert nearly_empty_and_full.best_node(pod("one")) == "four"
    # Only feasible nodes are compared: with the 8-GPU node full, the 4-GPU nodes are the top tier.
    eight_full = state_of(
        [sized("eight", 8), sized("four-a", 4), sized("four-b", 4), sized("two", 2)],
        [*running("e", "eight", 8), *running("b", "four-b", 1), *running("t", "two", 1)],
    )
    assert eight_full.best_nodes(pod("one")) == Prediction("four-b", frozenset({"four-b"}))


def test_a_node_without_a_gpu_count_label_matches_no_added_term() -> None:
    # Gt needs an integer label: a node GPU feature discovery has not labelled is scored as the smallest.
    state = state_of([node("unlabelled", gpus=8), sized("two", 2)], running("u", "unlabelled", 6))
    assert state.score(pod("one"), "unlabelled") > state.score(pod("one"), "two")
    assert state.best_node(pod("one")) == "two"


def test_on_one_node_size_the_added_affinity_changes_nothing() -> None:
    state = state_of([sized("a", 8), sized("b", 8), sized("c", 8)], running("p", "b", 3))
    assert state.best_nodes(pod("one")) == Prediction("b", frozenset({"b"}))
    assert state.best_nodes(pod("one"), exclude={"b"}) == Prediction("a", frozenset({"a", "c"}))


# --------------------------------------------------------------------------- reservations


def test_three_pods_compete_for_one_free_gpu() -> None:
    state = state_of([node("a", gpus=8)], running("p", "a", 7))
    contenders = [pod(f"c{i}") for i in range(3)]
    placed = []
    for contender in contenders:
        target = state.best_node(contender)
        if target is not None:
            state.place(contender, target)
            placed.append(contender.name)
    assert placed == ["c0"]
    with pytest.raises(ValueError, match=r"Insufficient nvidia\.com/gpu"):
        state.place(contenders[1], "a")


def test_failed_place_changes_nothing() -> None:
    state = state_of([node("a", gpus=2), node("b", gpus=1)], [pod("mover", "b"), pod("x", "a", gpus=2)])
    before = picture(state, ["a", "b"], [("ml", "mover")])
    with pytest.raises(ValueError, match="cannot place ml/mover on a"):
        state.place(pod("mover", "b"), "a")
    assert picture(state, ["a", "b"], [("ml", "mover")]) == before


def test_place_moves_a_pod_that_is_already_accounted() -> None:
    state = state_of([node("a", gpus=2), node("b", gpus=2)], [pod("mover", "a", gpus=2)])
    state.place(pod("mover", "a", gpus=2), "b")
    assert state.node_of(("ml", "mover")) == "b"
    assert state.gpu_free_milli("a") == (1000, 1000)
    assert state.gpu_free_milli("b") == (0, 0)
    # Placing it again where it is accounted releases it first, so it still fits there.
    state.place(pod("mover", "a", gpus=2), "b")
    assert state.gpu_free_milli("b") == (0, 0)
    assert state.gpu_free_milli("a") == (1000, 1000)


def test_fits_judges_a_pod_as_a_newcomer() -> None:
    resident = pod("resident", "a", gpus=1)
    state = state_of([node("a", gpus=1)], [resident])
    assert state.fits(resident, "a").reason == "Insufficient nvidia.com/gpu"  # its own GPU is not free
    assert state.best_node(resident) is None
    state.remove(resident)
    assert state.best_node(resident) == "a"


def test_remove_frees_original_and_placed_pods() -> None:
    original = pod("orig", "a", gpus=1, gpu_milli=500, cpu_milli=1000)
    state = state_of([node("a", gpus=1)], [original])
    state.remove(pod("orig", "a", gpus=0, cpu_milli=0))  # frees what was accounted, not what this says
    assert state.gpu_free_milli("a") == (1000,)
    assert state.free("a")["cpu"] == 96_000
    assert state.node_of(original.key) is None
    newcomer = pod("new", gpus=1)
    state.place(newcomer, "a")
    assert state.node_of(newcomer.key) == "a"
    state.remove(newcomer)
    assert state.gpu_free_milli("a") == (1000,)
    state.remove(newcomer)  # not accounted any more: nothing to free
    assert state.free("a") == state_of([node("a", gpus=1)]).free("a")


# --------------------------------------------------------------------------- place_all


def test_place_all_places_the_largest_gpu_request_first() -> None:
    # "a" has 4 free GPUs and is the fuller node: a 1-GPU pod placed first would take one of them and
    # leave no room for the 4-GPU pod.
    state = state_of([node("a", gpus=8), node("b", gpus=2)], running("p", "a", 4))
    one, four = pod("one", gpus=1), pod("four", gpus=4)
    assert state.best_node(one) == "a"
    assert state.place_all([one, four]) == {("ml", "four"): "a", ("ml", "one"): "b"}
    assert state.node_of(one.key) == "b"
    assert state.gpu_free_milli("b") == (0, 1000)


def test_place_all_breaks_gpu_ties_by_cpu() -> None:
    # Only "x" can hold the heavy pod, and "x" is where the light pod would go if placed first.
    state = state_of(
        [node("x", gpus=0, cpu_milli=10_000), node("y", gpus=0, cpu_milli=7_000)],
        [pod("p", "x", gpus=0, cpu_milli=2000, memory=0)],
    )
    light = pod("light", gpus=0, cpu_milli=1000, memory=0)
    heavy = pod("heavy", gpus=0, cpu_milli=8000, memory=0)
    assert state.best_node(light) == "x"
    assert state.place_all([light, heavy]) == {("ml", "heavy"): "x", ("ml", "light"): "y"}


def test_failed_place_all_leaves_the_state_exactly_unchanged() -> None:
    nodes = [node("a", gpus=2), node("b", gpus=1), node("c", gpus=2)]
    state = state_of(nodes, [pod("x", "a"), pod("y", "c", gpus=1, gpu_milli=300), pod("z", "c")])
    group = [pod("y", "c", gpus=1, gpu_milli=300), pod("g1", gpus=1), pod("g2", gpus=2), pod("g3", gpus=2)]
    keys = [p.key for p in group]
    before = picture(state, ["a", "b", "c"], keys)
    copy_before = state.copy()
    assert state.place_all(group) is None
    assert picture(state, ["a", "b", "c"], keys) == before
    for probe in (pod("probe", gpus=1), pod("probe", gpus=1, gpu_milli=700), pod("probe", gpus=2)):
        assert state.best_node(probe) == copy_before.best_node(probe)


def test_place_all_moves_pods_off_a_cordoned_node() -> None:
    drained = running("d", "old", 2, gpus=2)
    state = state_of([node("old", gpus=4), node("new", gpus=4)], drained)
    state.cordon("old")
    targets = state.place_all(drained)
    assert targets == {("ml", "d-0"): "new", ("ml", "d-1"): "new"}
    assert state.gpu_free_milli("old") == (1000, 1000, 1000, 1000)
    assert state.free("old") == state_of([node("old", gpus=4)]).free("old")
    assert state.gpu_free_milli("new") == (0, 0, 0, 0)


def test_place_all_respects_exclude() -> None:
    state = state_of([node("a"), node("b")])
    assert state.place_all([pod("p")], exclude=["a"]) == {("ml", "p"): "b"}
    assert state.place_all([pod("q")], exclude=["a", "b"]) is None
    assert state.node_of(("ml", "q")) is None


def test_place_all_refuses_a_pod_listed_twice() -> None:
    state = state_of([node("a")])
    with pytest.raises(ValueError, match="more than once"):
        state.place_all([pod("p"), pod("p")])
    assert state.gpu_free_milli("a") == (1000,) * 8


# --------------------------------------------------------------------------- copies


def test_copy_is_independent_both_ways() -> None:
    state = state_of([node("a", gpus=2), node("b", gpus=2)], [pod("x", "a")])
    state.place(pod("before", gpus=1, gpu_milli=100), "b")
    what_if = state.copy()
    what_if.place(pod("w1"), "a")
    what_if.cordon("b")
    what_if.remove(pod("x", "a"))
    assert state.gpu_free_milli("a") == (0, 1000)
    assert state.node_of(("ml", "x")) == "a"
    assert state.node_of(("ml", "w1")) is None
    assert not state.is_cordoned("b")
    # Changes to the original after the copy do not leak into the copy either, even on a node the
    # original had already changed before copying.
    state.place(pod("o1", gpus=1), "b")
    assert state.gpu_free_milli("b") == (900, 0)
    assert what_if.gpu_free_milli("b") == (900, 1000)
    assert what_if.best_node(pod("probe", gpus=2)) is None  # "a" holds w1, "b" is cordoned
    assert what_if.best_node(pod("probe", gpus=1)) == "a"
    assert state.best_node(pod("probe", gpus=1)) == "a"


def test_copies_of_copies_stay_independent() -> None:
    state = state_of([node("a", gpus=4)])
    first = state.copy()
    first.place(pod("f"), "a")
    second = first.copy()
    second.place(pod("s"), "a")
    first.place(pod("g"), "a")
    assert state.gpu_free_milli("a") == (1000,) * 4
    assert first.gpu_free_milli("a") == (0, 0, 1000, 1000)
    assert second.gpu_free_milli("a") == (0, 0, 1000, 1000)
    assert first.node_of(("ml", "s")) is None
    assert second.node_of(("ml", "g")) is None


# --------------------------------------------------------------------------- properties

# Four sizes, so the profile's addedAffinity (more GPUs preferred) scores them in four tiers; "twin" is
# "big"'s size, and "unlabelled" has no GPU count label (no term matches it).
POOL = [
    node("huge", gpus=8, cpu_milli=64_000, memory=256 * GIB, labels={GPU_COUNT: "8", GPU_MEMORY: "81920"}),
    node("big", gpus=4, cpu_milli=32_000, memory=128 * GIB, labels={GPU_COUNT: "4", GPU_MEMORY: "81920"}),
    node("twin", gpus=4, cpu_milli=24_000, memory=128 * GIB, labels={GPU_COUNT: "4"}),
    node("mid", gpus=2, cpu_milli=16_000, memory=64 * GIB, labels={GPU_COUNT: "2"}, extra={"pods": 3}),
    node("small", gpus=1, cpu_milli=8_000, memory=32 * GIB, labels={GPU_COUNT: "1", GPU_MEMORY: "24576"}),
    node("unlabelled", gpus=2, cpu_milli=16_000, memory=64 * GIB),
    node("tainted", gpus=2, cpu_milli=16_000, memory=64 * GIB, labels={GPU_COUNT: "2"}, taints=[DRAINING]),
    node("cpu", gpus=0, cpu_milli=16_000, memory=64 * GIB),
]

pods_strategy = st.builds(
    lambda i, gpus, milli, cpu, mem, big, tolerant, prefers: pod(
        f"p{i}",
        gpus=gpus,
        gpu_milli=milli if gpus == 1 else 1000,
        cpu_milli=cpu,
        memory=mem * GIB,
        required_affinity=affinity(GPU_MEMORY, "Gt", "40000") if big else (),
        tolerations=[Toleration(operator="Exists")] if tolerant else (),
        preferred_affinity=[PreferredTerm(weight=prefers, term=affinity(GPU_MEMORY, "Lt", "40000")[0])]
        if prefers
        else (),
    ),
    i=st.integers(0, 20),
    gpus=st.integers(0, 3),
    milli=st.sampled_from([1000, 250, 460, 500, 600]),
    cpu=st.integers(0, 12_000),
    mem=st.integers(0, 40),
    big=st.booleans(),
    tolerant=st.booleans(),
    prefers=st.sampled_from([0, 0, 0, 1, 5, 50]),
)


def assert_nothing_negative(state: ClusterState) -> None:
    for n in POOL:
        assert all(amount >= 0 for amount in state.free(n.name).values()), state.free(n.name)
        assert all(milli >= 0 for milli in state.gpu_free_milli(n.name)), state.gpu_free_milli(n.name)


def reference_prediction(
    state: ClusterState, candidate: Pod, excluded: Sequence[str] = ()
) -> Prediction | None:
    """Every feasible node with the top total, from `fits` and `score` node by node: 10 x MostAllocated
    + 10 x NodeAffinity, whose raw score (the weights of the pod's own preferred terms and of the
    profile's addedAffinity terms the node matches) is normalised to 0..100 over the feasible nodes, in
    integers, before it is weighed."""
    feasible = [n for n in POOL if n.name not in excluded and state.fits(candidate, n.name).ok]
    if not feasible:
        return None
    gpu_count = {n.name: int(n.labels.get(GPU_COUNT, "0")) for n in feasible}
    raw = {
        n.name: (gpu_count[n.name] > 1)
        + 2 * (gpu_count[n.name] > 3)
        + 4 * (gpu_count[n.name] > 7)
        + sum(
            p.weight for p in candidate.preferred_affinity if int(n.labels.get(GPU_MEMORY, "40000")) < 40000
        )
        for n in feasible
    }
    most = max(raw.values())
    scores = {
        n.name: 10 * state.score(candidate, n.name) + 10 * (100 * raw[n.name] // most if most else 0)
        for n in feasible
    }
    top = max(scores.values())
    tied = frozenset(name for name, score in scores.items() if score == top)
    return Prediction(chosen=min(tied), tied=tied)


def reference_best_node(state: ClusterState, candidate: Pod, excluded: Sequence[str] = ()) -> str | None:
    prediction = reference_prediction(state, candidate, excluded)
    return None if prediction is None else prediction.chosen


@settings(max_examples=150, deadline=None)
@given(placements=st.lists(st.tuples(pods_strategy, st.sampled_from([n.name for n in POOL])), max_size=25))
def test_place_never_drives_a_resource_or_device_below_zero(placements: list[tuple[Pod, str]]) -> None:
    state = state_of(POOL)
    for candidate, target in placements:
        verdict = state.fits(candidate, target) if state.node_of(candidate.key) is None else None
        try:
            state.place(candidate, target)
        except ValueError:
            assert verdict is None or not verdict.ok
        else:
            assert verdict is None or verdict.ok
            assert state.node_of(candidate.key) == target
        assert_nothing_negative(state)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["place", "remove", "copy", "cordon", "place_all"]),
            st.lists(pods_strategy, min_size=1, max_size=3, unique_by=lambda p: p.key),
            st.sampled_from([n.name for n in POOL]),
        ),
        max_size=20,
    )
)
def test_best_node_agrees_with_fits_and_score_on_every_node(steps: list[tuple[str, list[Pod], str]]) -> None:
    state = state_of(POOL, [pod("resident", "big", gpus=2), pod("share", "mid", gpus=1, gpu_milli=600)])
    for action, group, target in steps:
        first = group[0]
        assert state.best_node(first) == reference_best_node(state, first)
        assert state.best_node(first, exclude=[target]) == reference_best_node(state, first, [target])
        assert state.best_nodes(first) == reference_prediction(state, first)
        assert state.best_nodes(first, exclude=[target]) == reference_prediction(state, first, [target])
        if action == "place" and (best := state.best_node(first)) is not None:
            state.place(first, best)
        elif action == "remove":
            state.remove(first)
        elif action == "copy":
            discarded, state = state, state.copy()
            for extra in group:  # changes to the original must not leak into the copy
                discarded.remove(extra)
                if (spot := discarded.best_node(extra)) is not None:
                    discarded.place(extra, spot)
        elif action == "cordon":
            state.cordon(target)
        elif action == "place_all":
            state.place_all(group)
        assert_nothing_negative(state)
