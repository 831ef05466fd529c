"""Property: the cluster accounting built from the previous snapshot's equals the one built from scratch.

`ClusterState.from_snapshot` takes over the node states of nodes whose Node and pods are the very
objects of the previous build, and derives the candidate nodes and rankings of each kind of pod from
those of the latest earlier build that made them, re-examining only what changed since. Over random
sequences of snapshots, in which each step keeps most objects and replaces, adds or removes some pods
and nodes (taints, cordons, relabels), some kinds of pod are asked about in some steps only, and the
states of each step are written to (placements, removals, cordons) before the next, the accounting,
the candidates, the rankings and the packed scheduler's choices must be those of a build from scratch
(`snapshot_accounting.build` without a previous build).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rebalancer import snapshot_accounting
from rebalancer.model import (
    GPU_PRODUCT_LABEL,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    Snapshot,
    Taint,
    Toleration,
)
from rebalancer.node_accounting import GPU_INDEX_ANNOTATION
from rebalancer.placement import ClusterState
from tests.builders import A100, GIB, H100, L4, node, pod, replace, snapshot

MODELS = (A100, H100, L4)
TAINT = Taint(key="dedicated", value="training")
TOLERATION = Toleration(key="dedicated", operator="Exists")


def _only(*models: str) -> tuple[NodeSelectorTerm, ...]:
    requirement = NodeSelectorRequirement(GPU_PRODUCT_LABEL, "In", tuple(sorted(models)))
    return (NodeSelectorTerm(match_expressions=(requirement,)),)


# Pending pods of every kind the cluster may be asked about: whole GPUs, shares, none, on one model,
# tolerating the taint or not.
PROBES = (
    pod("whole-1", gpus=1),
    pod("whole-2", gpus=2, cpu_milli=8_000),
    pod("whole-8", gpus=8),
    pod("share-250", gpus=1, gpu_milli=250),
    pod("share-700", gpus=1, gpu_milli=700, memory=64 * GIB),
    pod("cpu-only", gpus=0, cpu_milli=2_000),
    pod("l4-only", gpus=1, required_affinity=_only(L4)),
    pod("a100-share", gpus=1, gpu_milli=500, required_affinity=_only(A100, H100)),
    pod("tolerant", gpus=1, tolerations=[TOLERATION]),
)


def _new_node(draw: st.DrawFn, name: str) -> Node:
    return node(
        name,
        gpus=draw(st.sampled_from((2, 4, 8))),
        model=draw(st.sampled_from(MODELS)),
        cpu_milli=draw(st.sampled_from((16_000, 96_000))),
        memory=draw(st.sampled_from((64, 512))) * GIB,
        taints=[TAINT] if draw(st.integers(0, 5)) == 0 else [],
    )


def _new_pod(draw: st.DrawFn, name: str, on: Node) -> Pod:
    gpus = draw(st.sampled_from((0, 1, 1, 2)))
    milli = draw(st.sampled_from((1000, 1000, 300, 600))) if gpus == 1 else 1000
    annotations: dict[str, str] = {}
    recorded = draw(st.sampled_from(("valid",) * 6 + ("any", "none"))) if gpus else "none"
    if recorded == "valid":  # devices as a GPU-sharing scheduler records them
        devices = draw(st.permutations(range(on.gpu_count)))[:gpus]
        annotations[GPU_INDEX_ANNOTATION] = "-".join(map(str, devices))
    elif recorded == "any":  # maybe not the node's, maybe not distinct: then inferred
        devices = draw(st.lists(st.integers(0, 8), min_size=gpus, max_size=gpus))
        annotations[GPU_INDEX_ANNOTATION] = "-".join(map(str, devices))
    return pod(
        name,
        on.name,
        gpus=gpus,
        gpu_milli=milli,
        cpu_milli=draw(st.sampled_from((500, 4_000))),
        memory=draw(st.sampled_from((1, 16))) * GIB,
        annotations=annotations,
    )


CHANGES = ("add", "remove", "replace", "same", "node", "node-gone", "node-new")


@st.composite
def histories(draw: st.DrawFn) -> list[Snapshot]:
    """A first snapshot, then steps that keep most objects and change a few."""
    nodes = {f"n{i}": _new_node(draw, f"n{i}") for i in range(draw(st.integers(1, 6)))}
    pods: dict[str, Pod] = {}
    serial = 0

    def add_pod(on: Node) -> None:
        nonlocal serial
        serial += 1
        pods[f"p{serial}"] = _new_pod(draw, f"p{serial}", on)

    for n in nodes.values():
        for _ in range(draw(st.integers(0, 4))):
            add_pod(n)
    steps = [snapshot(nodes.values(), pods.values())]
    for step in range(draw(st.integers(1, 6))):
        for _ in range(draw(st.integers(0, 4))):
            change = draw(
                st.sampled_from(("add", "remove", "replace", "same", "node", "node-gone", "node-new"))
            )
            if change == "add" and nodes:
                add_pod(nodes[draw(st.sampled_from(sorted(nodes)))])
            elif change == "remove" and pods:
                del pods[draw(st.sampled_from(sorted(pods)))]
            elif change == "replace" and pods:
                name = draw(st.sampled_from(sorted(pods)))
                pods[name] = _new_pod(draw, name, nodes[pods[name].node_name or ""])
            elif change == "same" and pods:  # an equal pod, but another object
                name = draw(st.sampled_from(sorted(pods)))
                pods[name] = replace(pods[name])
            elif change == "node" and nodes:  # tainted, cordoned, relabelled, or an equal copy
                name = draw(st.sampled_from(sorted(nodes)))
                old = nodes[name]
                nodes[name] = draw(
                    st.sampled_from(
                        (
                            replace(old, taints=() if old.taints else (TAINT,)),
                            replace(old, unschedulable=not old.unschedulable),
                            replace(old, labels={**old.labels, GPU_PRODUCT_LABEL: L4}),
                            replace(old),
                        )
                    )
                )
            elif change == "node-gone" and nodes:
                name = draw(st.sampled_from(sorted(nodes)))
                del nodes[name]
                pods = {k: p for k, p in pods.items() if p.node_name != name}
            elif change == "node-new":
                name = f"m{step}-{len(nodes)}"
                nodes[name] = _new_node(draw, name)
                add_pod(nodes[name])
        # A pod left on a node that is gone stays in the snapshot, ignored by the accounting.
        steps.append(snapshot(nodes.values(), pods.values()))
    return steps


def _accounting(
    built: snapshot_accounting.Built,
) -> tuple[dict[str, tuple[object, ...]], dict[tuple[str, str], str]]:
    """Everything a build holds of each node, orders included (what `free` and `holdings` list, and
    the keys accounted), and where each pod is accounted."""
    nodes: dict[str, tuple[object, ...]] = {
        name: (
            state.node,
            list(state.free.items()),
            state.devices,
            list(state.holdings.items()),
            state.score_cpu,
            state.score_memory,
            built.keys[name],
            name in built.plain,
        )
        for name, state in built.nodes.items()
    }
    return nodes, dict(built.home)


def _scratch(snap: Snapshot) -> ClusterState:
    built = snapshot_accounting.build(snap)
    return ClusterState(built, dict(built.nodes), moves={}, cordoned=set(), changed=set())


def _write(state: ClusterState, snap: Snapshot, data: st.DataObject) -> None:
    """Reserve, move and remove pods and cordon nodes on a state: none of it may reach the shared build."""
    names = sorted(snap.nodes)
    for probe in PROBES[: data.draw(st.integers(0, len(PROBES)))]:
        best = state.best_node(probe)
        if best is not None:
            state.place(probe, best)
    for p in snap.pods[: data.draw(st.integers(0, 3))]:
        state.remove(p)
    if bool(names) and data.draw(st.booleans()):  # bool(): else the draw is typed as the list
        state.cordon(data.draw(st.sampled_from(names)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=histories(), data=st.data())
def test_the_accounting_built_from_the_last_one_equals_one_built_from_scratch(
    steps: list[Snapshot], data: st.DataObject
) -> None:
    for snap in steps:
        state = ClusterState.from_snapshot(snap)
        scratch = _scratch(snap)
        assert _accounting(state._built) == _accounting(scratch._built)
        # Some kinds of pod are not asked about in every step: theirs are carried over several builds.
        asked = data.draw(st.lists(st.sampled_from(PROBES), unique_by=lambda p: p.name, min_size=1))
        for probe in asked:
            assert state.best_nodes(probe) == scratch.best_nodes(probe), probe.name
            assert state.best_node(probe, exclude={"n0"}) == scratch.best_node(probe, exclude={"n0"})
        built, fresh = state._built, scratch._built
        assert built.static_candidates == fresh.static_candidates
        assert built.rankings == fresh.rankings
        _write(state.copy(), snap, data)
        _write(state, snap, data)
    # Written states never changed the build they share: it still equals a build from scratch.
    assert _accounting(ClusterState.from_snapshot(steps[-1])._built) == _accounting(
        _scratch(steps[-1])._built
    )


def test_nodes_whose_objects_are_the_same_are_taken_over_not_rebuilt() -> None:
    a100, l4 = node("a", model=A100), node("b", gpus=4, model=L4)
    on_a, on_b = pod("x", "a", gpus=2), pod("y", "b", gpus=1)
    first = ClusterState.from_snapshot(snapshot([a100, l4], [on_a, on_b]))
    assert first.best_nodes(PROBES[0]) is not None  # ranks nodes for one kind of pod
    moved = replace(on_b, name="z")
    second = ClusterState.from_snapshot(snapshot([a100, l4], [on_a, moved]))
    built = second._built
    assert built.nodes["a"] is first._built.nodes["a"]
    assert built.nodes["b"] is not first._built.nodes["b"]
    assert built.rebuilt == {"b"} and not built.changed_nodes
    assert second.node_of(moved.key) == "b" and second.node_of(on_b.key) is None
    assert second.best_nodes(PROBES[0]) == _scratch(snapshot([a100, l4], [on_a, moved])).best_nodes(PROBES[0])
