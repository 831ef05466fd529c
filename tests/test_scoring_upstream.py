"""kube-scheduler's own MostAllocated and NodeAffinity score tables, ported: our scores are upstream's.

The cases are those of TestMostAllocatedScoringStrategy in kubernetes/kubernetes
pkg/scheduler/framework/plugins/noderesources/most_allocated_test.go: the same nodes, pods, requests,
scored resources and expected scores. Upstream quantities keep their units: `"cpu": "4000"` is 4000
cores (4,000,000 millicores here), `"memory": "10000"` is 10000 bytes.

Each case runs through `scoring` with the case's resources and weights, and, when the case scores
only what the shipped profile scores the same way (cpu and memory weighing 1; extended resources the
pod does not request), through the placement model (`ClusterState.score`) with the shipped profile.

Upstream's pods are lists of containers; ours carry the pod's total request. A container without a
cpu (memory) request is a pod whose total has no `cpu` (`memory`) key; upstream's pod with no
container at all requests nothing, not even the non-zero default: an explicit 0 here.

The table's configuration errors (no resources; weights below 1 or above 100) are not scores: the
shipped profile is checked against those rules instead.

The NodeAffinity cases are TestNodeAffinityPriority of pkg/scheduler/framework/plugins/nodeaffinity/
node_affinity_test.go: the raw score of a node is the sum of the weights of the pod's preferred terms
and of the plugin's `addedAffinity` terms it matches, normalised to 0..100 over the nodes. The table's
PreScore flag (scores are the same without it) has no counterpart here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from rebalancer.model import Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, PreferredTerm, Snapshot
from rebalancer.placement import ClusterState
from rebalancer.scoring import (
    MAX_NODE_SCORE,
    PROFILE_RESOURCES,
    affinity_scores,
    most_allocated,
    nonzero_cpu_memory,
    score_requests,
)
from rebalancer.selectors import preferred_affinity_score

MI = 1024 * 1024
NOW = datetime(2026, 1, 1, tzinfo=UTC)
EXTENDED = "abc.com/xyz"  # upstream's extendedRes
DEFAULT_RESOURCES = (("cpu", 1), ("memory", 1))
EXTENDED_RESOURCE_SET = (("cpu", 1), ("memory", 1), (EXTENDED, 1))
NO_CONTAINER: Mapping[str, int] = {"cpu": 0, "memory": 0}  # st.MakePod().Obj()
ONE_EMPTY_CONTAINER: Mapping[str, int] = {}  # st.MakePod().Container("container").Obj()


def cores(n: int) -> int:
    return n * 1000


@dataclass(frozen=True)
class Case:
    name: str
    pod: Mapping[str, int]
    nodes: Mapping[str, Mapping[str, int]]  # name -> allocatable
    expected: Mapping[str, int]
    resources: Sequence[tuple[str, int]] = DEFAULT_RESOURCES
    existing: Sequence[tuple[str, Mapping[str, int]]] = ()  # (node, requests)


def both(cpu: int, memory: int, **extra: int) -> dict[str, int]:
    return {"cpu": cpu, "memory": memory, **{EXTENDED if k == "xyz" else k: v for k, v in extra.items()}}


CASES = [
    Case(
        "nothing scheduled, nothing requested",
        pod=NO_CONTAINER,
        nodes={"node1": both(cores(4000), 10000), "node2": both(cores(4000), 10000)},
        expected={"node1": 0, "node2": 0},
    ),
    Case(
        "nothing scheduled, resources requested, differently sized nodes",
        pod=both(cores(1000 + 2000), 2000 + 3000),
        nodes={"node1": both(cores(4000), 10000), "node2": both(cores(6000), 10000)},
        expected={"node1": 62, "node2": 50},
    ),
    Case(
        "no resources requested, pods scheduled with resources",
        pod=NO_CONTAINER,
        nodes={"node1": both(cores(10000), 20000), "node2": both(cores(10000), 20000)},
        existing=[
            ("node1", both(cores(3000), 0)),
            ("node1", both(cores(3000), 0)),
            ("node2", both(cores(3000), 0)),
            ("node2", both(cores(3000), 5000)),
        ],
        expected={"node1": 30, "node2": 42},
    ),
    Case(
        "resources requested, pods scheduled with resources",
        pod=both(cores(1000 + 2000), 2000 + 3000),
        nodes={"node1": both(cores(10000), 20000), "node2": both(cores(10000), 20000)},
        existing=[("node1", both(cores(3000), 0)), ("node2", both(cores(3000), 5000))],
        expected={"node1": 42, "node2": 55},
    ),
    Case(
        "resources requested equal node capacity",
        pod=both(cores(2000 + 3000), 4000 + 5000),
        nodes={"node1": both(cores(5000), 10000), "node2": both(cores(10000), 9000)},
        expected={"node1": 95, "node2": 75},
    ),
    Case(
        "nothing scheduled, resources requested, differently sized nodes (memory weighs 2)",
        pod=both(cores(1000 + 2000), 2000 + 3000),
        nodes={"node1": both(cores(4000), 10000), "node2": both(cores(6000), 10000)},
        resources=(("memory", 2), ("cpu", 1)),
        expected={"node1": 58, "node2": 50},
    ),
    Case(
        "no resources requested, pods scheduled, nonzero request for resource",
        pod=ONE_EMPTY_CONTAINER,
        nodes={"node1": both(250, 1000 * MI), "node2": both(250, 1000 * MI)},
        existing=[("node1", ONE_EMPTY_CONTAINER), ("node1", ONE_EMPTY_CONTAINER)],
        expected={"node1": 80, "node2": 30},
    ),
    Case(
        "bypass extended resource if the pod does not request",
        pod=both(cores(1000 + 2000), 2000 + 3000),
        nodes={"node1": both(cores(6000), 10000), "node2": both(cores(6000), 10000, xyz=4)},
        resources=EXTENDED_RESOURCE_SET,
        expected={"node1": 50, "node2": 50},
    ),
    Case(
        "honor extended resource if the pod request",
        pod=both(cores(3000), 5000, xyz=2),
        nodes={"node1": both(cores(6000), 10000, xyz=4), "node2": both(cores(6000), 10000, xyz=10)},
        resources=EXTENDED_RESOURCE_SET,
        expected={"node1": 50, "node2": 40},
    ),
    Case(
        "if the node doesn't have a resource",
        pod=both(cores(3000), 4000),
        nodes={"node1": both(cores(6000), 10000), "node2": both(cores(6000), 10000, xyz=4)},
        resources=((EXTENDED, 2), ("cpu", 1), ("memory", 1)),
        expected={"node1": 45, "node2": 45},
    ),
]


def _node_requested(case: Case, node: str) -> dict[str, int]:
    """What the node's pods request as the score counts it: NonZeroRequested for cpu and memory,
    Requested for the rest."""
    total: dict[str, int] = {}
    for where, requests in case.existing:
        if where != node:
            continue
        cpu, memory = nonzero_cpu_memory(requests)
        counted = {**requests, "cpu": cpu, "memory": memory}
        for name, amount in counted.items():
            total[name] = total.get(name, 0) + amount
    return total


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_scoring_gives_upstreams_score(case: Case) -> None:
    got = {}
    for node, allocatable in case.nodes.items():
        requested = _node_requested(case, node)
        got[node] = most_allocated(
            (weight, requested.get(name, 0) + amount, allocatable.get(name, 0))
            for name, weight, amount in score_requests(case.pod, case.resources)
        )
    assert got == case.expected


def _scored_the_same_by_the_profile(case: Case) -> bool:
    """Whether the shipped profile scores the case as its own resources do: cpu and memory at weight
    1, and no extended resource the pod requests."""
    weights = dict(case.resources)
    extended_requested = any(amount > 0 for name, amount in case.pod.items() if name not in ("cpu", "memory"))
    return weights.get("cpu") == weights.get("memory") == 1 and not extended_requested


PROFILE_CASES = [c for c in CASES if _scored_the_same_by_the_profile(c)]


def test_the_profile_cases_are_most_of_the_table() -> None:
    assert [c.name for c in CASES if c not in PROFILE_CASES] == [
        "nothing scheduled, resources requested, differently sized nodes (memory weighs 2)",
        "honor extended resource if the pod request",
    ]


@pytest.mark.parametrize("case", PROFILE_CASES, ids=[c.name for c in PROFILE_CASES])
def test_the_placement_model_gives_upstreams_score_with_the_shipped_profile(case: Case) -> None:
    nodes = {name: Node(name=name, allocatable=dict(allocatable)) for name, allocatable in case.nodes.items()}
    pods = [
        Pod(namespace="ns", name=f"existing-{i}", node_name=where, requests=dict(requests))
        for i, (where, requests) in enumerate(case.existing)
    ]
    state = ClusterState.from_snapshot(Snapshot(now=NOW, nodes=nodes, pods=tuple(pods)))
    newcomer = Pod(namespace="ns", name="requested", requests=dict(case.pod))
    assert {name: state.score(newcomer, name) for name in nodes} == case.expected


def test_the_profile_passes_upstreams_weight_validation() -> None:
    # Upstream rejects an empty resource list and weights outside 1..MaxNodeScore.
    assert PROFILE_RESOURCES
    assert all(1 <= weight <= MAX_NODE_SCORE for _, weight in PROFILE_RESOURCES)
    assert len({name for name, _ in PROFILE_RESOURCES}) == len(PROFILE_RESOURCES)


# --------------------------------------------------------------------------- NodeAffinity

LABEL1 = {"foo": "bar"}
LABEL2 = {"key": "value"}
LABEL3 = {"az": "az1"}
LABEL4 = {"abc": "az11", "def": "az22"}
LABEL5 = {"foo": "bar", "key": "value", "az": "az1"}


def term(weight: int, *pairs: tuple[str, str]) -> PreferredTerm:
    """A preferred term whose `In` expressions (ANDed) each name one value."""
    expressions = tuple(NodeSelectorRequirement(key, "In", (value,)) for key, value in pairs)
    return PreferredTerm(weight=weight, term=NodeSelectorTerm(match_expressions=expressions))


AFFINITY1 = (term(2, ("foo", "bar")),)
AFFINITY2 = (
    term(2, ("foo", "bar")),
    term(4, ("key", "value")),
    term(5, ("foo", "bar"), ("key", "value"), ("az", "az1")),
)


@dataclass(frozen=True)
class AffinityCase:
    name: str
    preferred: tuple[PreferredTerm, ...]
    nodes: Mapping[str, Mapping[str, str]]  # name -> labels
    expected: Mapping[str, int]
    added: tuple[PreferredTerm, ...] = ()


AFFINITY_CASES = [
    AffinityCase(
        "all nodes are same priority as NodeAffinity is nil",
        preferred=(),
        nodes={"node1": LABEL1, "node2": LABEL2, "node3": LABEL3},
        expected={"node1": 0, "node2": 0, "node3": 0},
    ),
    AffinityCase(
        "no node matches preferred scheduling requirements in NodeAffinity of pod so all nodes' "
        "priority is zero",
        preferred=AFFINITY1,
        nodes={"node1": LABEL4, "node2": LABEL2, "node3": LABEL3},
        expected={"node1": 0, "node2": 0, "node3": 0},
    ),
    AffinityCase(
        "only node1 matches the preferred scheduling requirements of pod",
        preferred=AFFINITY1,
        nodes={"node1": LABEL1, "node2": LABEL2, "node3": LABEL3},
        expected={"node1": MAX_NODE_SCORE, "node2": 0, "node3": 0},
    ),
    AffinityCase(
        "all nodes matches the preferred scheduling requirements of pod but with different priorities",
        preferred=AFFINITY2,
        nodes={"node1": LABEL1, "node5": LABEL5, "node2": LABEL2},
        expected={"node1": 18, "node5": MAX_NODE_SCORE, "node2": 36},
    ),
    AffinityCase(
        "added affinity",
        preferred=(),
        nodes={"node1": LABEL1, "node2": LABEL2},
        expected={"node1": MAX_NODE_SCORE, "node2": 0},
        added=AFFINITY1,
    ),
    AffinityCase(
        "added affinity and pod has default affinity",
        preferred=AFFINITY1,
        nodes={"node1": LABEL1, "node2": LABEL2, "node3": LABEL5},
        expected={"node1": 40, "node2": 60, "node3": MAX_NODE_SCORE},
        added=(term(3, ("key", "value")),),
    ),
    AffinityCase(
        "calculate the priorities correctly even if PreScore is not called",
        preferred=AFFINITY2,
        nodes={"node1": LABEL1, "node5": LABEL5, "node2": LABEL2},
        expected={"node1": 18, "node5": MAX_NODE_SCORE, "node2": 36},
    ),
]


@pytest.mark.parametrize("case", AFFINITY_CASES, ids=[c.name for c in AFFINITY_CASES])
def test_node_affinity_gives_upstreams_normalised_score(case: AffinityCase) -> None:
    own = Pod(namespace="ns", name="pod", preferred_affinity=case.preferred)
    added = Pod(namespace="ns", name="added", preferred_affinity=case.added)
    raw = {}
    for name, labels in case.nodes.items():
        node = Node(name=name, labels=dict(labels))
        raw[name] = preferred_affinity_score(own, node) + preferred_affinity_score(added, node)
    assert affinity_scores(raw) == case.expected


PROFILE_AFFINITY_CASES = [c for c in AFFINITY_CASES if not c.added]


@pytest.mark.parametrize("case", PROFILE_AFFINITY_CASES, ids=[c.name for c in PROFILE_AFFINITY_CASES])
def test_the_placement_model_picks_upstreams_top_node_affinity_with_the_shipped_profile(
    case: AffinityCase,
) -> None:
    # Equal empty nodes, so MostAllocated ties and NodeAffinity decides; the table's nodes carry no GPU
    # count label, so the profile's addedAffinity scores them alike.
    nodes = {
        name: Node(name=name, labels=dict(labels), allocatable={"cpu": cores(8), "memory": 8 * 1024 * MI})
        for name, labels in case.nodes.items()
    }
    state = ClusterState.from_snapshot(Snapshot(now=NOW, nodes=nodes, pods=()))
    newcomer = Pod(namespace="ns", name="pod", requests={"cpu": 1000}, preferred_affinity=case.preferred)
    prediction = state.best_nodes(newcomer)
    assert prediction is not None
    top = max(case.expected.values())
    assert prediction.tied == {name for name, score in case.expected.items() if score == top}
