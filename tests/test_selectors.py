"""Matching semantics of label selectors, node affinity, node selectors, taints and tolerations."""

from __future__ import annotations

import pytest

from rebalancer.model import (
    LabelRequirement,
    LabelSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PreferredTerm,
    Taint,
    Toleration,
)
from rebalancer.selectors import (
    format_taint,
    label_selector_matches,
    node_requirement_matches,
    node_selector_matches,
    node_selector_term_matches,
    parse_int,
    preferred_affinity_score,
    required_affinity_matches,
    tolerates,
    untolerated_taints,
)
from tests.builders import A100, H100, node, pod, replace

GPU_MEMORY = "nvidia.com/gpu.memory"
ZONE = "topology.kubernetes.io/zone"


def req(key: str, operator: str, *values: str) -> NodeSelectorRequirement:
    return NodeSelectorRequirement(key=key, operator=operator, values=values)


def term(
    *expressions: NodeSelectorRequirement, fields: tuple[NodeSelectorRequirement, ...] = ()
) -> NodeSelectorTerm:
    return NodeSelectorTerm(match_expressions=expressions, match_fields=fields)


# --------------------------------------------------------------------------- label selectors


def test_empty_label_selector_matches_everything() -> None:
    assert label_selector_matches(LabelSelector(), {})
    assert label_selector_matches(LabelSelector(), {"app": "x"})


def test_match_labels_need_every_pair() -> None:
    selector = LabelSelector(match_labels={"app": "trainer", "tier": "gpu"})
    assert label_selector_matches(selector, {"app": "trainer", "tier": "gpu", "extra": "1"})
    assert not label_selector_matches(selector, {"app": "trainer"})
    assert not label_selector_matches(selector, {"app": "trainer", "tier": "cpu"})


@pytest.mark.parametrize(
    ("operator", "values", "labels", "expected"),
    [
        ("In", ("a", "b"), {"k": "a"}, True),
        ("In", ("a", "b"), {"k": "c"}, False),
        ("In", ("a",), {}, False),
        ("NotIn", ("a",), {"k": "b"}, True),
        ("NotIn", ("a",), {}, True),
        ("NotIn", ("a",), {"k": "a"}, False),
        ("Exists", (), {"k": ""}, True),
        ("Exists", (), {}, False),
        ("DoesNotExist", (), {}, True),
        ("DoesNotExist", (), {"k": "a"}, False),
        ("Gt", ("1",), {"k": "5"}, False),  # not a label selector operator
    ],
)
def test_label_selector_expressions(
    operator: str, values: tuple[str, ...], labels: dict[str, str], expected: bool
) -> None:
    selector = LabelSelector(match_expressions=(LabelRequirement("k", operator, values),))
    assert label_selector_matches(selector, labels) is expected


def test_label_selector_ands_labels_and_expressions() -> None:
    selector = LabelSelector(
        match_labels={"app": "trainer"},
        match_expressions=(LabelRequirement("team", "In", ("vision",)),),
    )
    assert label_selector_matches(selector, {"app": "trainer", "team": "vision"})
    assert not label_selector_matches(selector, {"app": "trainer", "team": "nlp"})
    assert not label_selector_matches(selector, {"app": "other", "team": "vision"})


# --------------------------------------------------------------------------- node requirements


@pytest.mark.parametrize(
    ("requirement", "labels", "expected"),
    [
        (req("k", "In", "a", "b"), {"k": "b"}, True),
        (req("k", "In", "a"), {}, False),
        (req("k", "NotIn", "a"), {}, True),
        (req("k", "NotIn", "a"), {"k": "a"}, False),
        (req("k", "Exists"), {"k": "x"}, True),
        (req("k", "DoesNotExist"), {"k": "x"}, False),
        (req("k", "DoesNotExist"), {}, True),
        (req(GPU_MEMORY, "Gt", "40000"), {GPU_MEMORY: "81920"}, True),
        (req(GPU_MEMORY, "Gt", "40000"), {GPU_MEMORY: "24576"}, False),
        (req(GPU_MEMORY, "Gt", "81920"), {GPU_MEMORY: "81920"}, False),  # strictly greater
        (req(GPU_MEMORY, "Lt", "40000"), {GPU_MEMORY: "24576"}, True),
        (req(GPU_MEMORY, "Lt", "40000"), {GPU_MEMORY: "81920"}, False),
        (req(GPU_MEMORY, "Gt", "40000"), {}, False),  # absent label
        (req(GPU_MEMORY, "Gt", "40000"), {GPU_MEMORY: "80GB"}, False),  # non-integer label
        (req(GPU_MEMORY, "Gt", "40GB"), {GPU_MEMORY: "81920"}, False),  # non-integer bound
        (req(GPU_MEMORY, "Gt", "1", "2"), {GPU_MEMORY: "81920"}, False),  # needs exactly one value
        (req(GPU_MEMORY, "Gt", "-5"), {GPU_MEMORY: "-1"}, True),
        (req(GPU_MEMORY, "Lt", "+10"), {GPU_MEMORY: "9"}, True),
        (req("k", "Matches", "a"), {"k": "a"}, False),  # unknown operator
    ],
)
def test_node_requirement(
    requirement: NodeSelectorRequirement, labels: dict[str, str], expected: bool
) -> None:
    assert node_requirement_matches(requirement, labels) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", 42),
        ("-7", -7),
        ("+3", 3),
        (" 42", None),
        ("1_000", None),
        ("4.0", None),
        ("", None),
        ("٣", None),
    ],
)
def test_parse_int_follows_kubernetes_integer_syntax(text: str, expected: int | None) -> None:
    assert parse_int(text) == expected


# --------------------------------------------------------------------------- node selector terms


def test_empty_term_matches_no_node() -> None:
    assert not node_selector_term_matches(NodeSelectorTerm(), node("gpu-1"))


def test_term_ands_its_expressions() -> None:
    both = term(req("nvidia.com/gpu.product", "In", A100), req("zone", "In", "a"))
    assert node_selector_term_matches(both, node("n", labels={"zone": "a"}))
    assert not node_selector_term_matches(both, node("n", labels={"zone": "b"}))
    assert not node_selector_term_matches(both, node("n", model=H100, labels={"zone": "a"}))


def test_match_fields_on_node_name() -> None:
    by_name = term(fields=(req("metadata.name", "In", "gpu-2"),))
    assert node_selector_term_matches(by_name, node("gpu-2"))
    assert not node_selector_term_matches(by_name, node("gpu-1"))
    not_named = term(fields=(req("metadata.name", "NotIn", "gpu-2"),))
    assert node_selector_term_matches(not_named, node("gpu-1"))


def test_match_fields_only_know_the_node_name() -> None:
    other_field = term(fields=(req("metadata.namespace", "DoesNotExist"),))
    assert not node_selector_term_matches(other_field, node("gpu-1"))


def test_term_ands_expressions_with_fields() -> None:
    mixed = term(req("zone", "In", "a"), fields=(req("metadata.name", "In", "gpu-1"),))
    assert node_selector_term_matches(mixed, node("gpu-1", labels={"zone": "a"}))
    assert not node_selector_term_matches(mixed, node("gpu-1", labels={"zone": "b"}))
    assert not node_selector_term_matches(mixed, node("gpu-2", labels={"zone": "a"}))


def test_required_affinity_ors_terms_and_no_terms_match() -> None:
    a100_or_big_memory = (
        term(req("nvidia.com/gpu.product", "In", A100)),
        term(req(GPU_MEMORY, "Gt", "40000")),
    )
    workload = pod("w", required_affinity=a100_or_big_memory)
    assert required_affinity_matches(workload, node("a", model=A100))
    assert required_affinity_matches(workload, node("h", model=H100, labels={GPU_MEMORY: "81920"}))
    assert not required_affinity_matches(workload, node("h", model=H100, labels={GPU_MEMORY: "24576"}))
    assert required_affinity_matches(pod("free"), node("anything", model=None))


def test_node_selector_needs_every_label() -> None:
    workload = pod("w", node_selector={"nvidia.com/gpu.product": A100, "pool": "train"})
    assert node_selector_matches(workload, node("a", labels={"pool": "train"}))
    assert not node_selector_matches(workload, node("b", labels={"pool": "serve"}))
    assert not node_selector_matches(workload, node("c"))
    assert node_selector_matches(pod("free"), node("c"))


def test_preferred_affinity_score_sums_matching_weights() -> None:
    workload = replace(
        pod("w"),
        preferred_affinity=(
            PreferredTerm(weight=50, term=term(req("nvidia.com/gpu.product", "In", H100))),
            PreferredTerm(weight=20, term=term(req(ZONE, "In", "a"))),
            PreferredTerm(weight=7, term=NodeSelectorTerm()),  # matches nothing
        ),
    )
    assert preferred_affinity_score(workload, node("n", model=H100, zone="a")) == 70
    assert preferred_affinity_score(workload, node("n", model=A100, zone="a")) == 20
    assert preferred_affinity_score(workload, node("n", model=A100, zone="b")) == 0


# --------------------------------------------------------------------------- taints and tolerations

DRAINING = Taint(key="rebalancer.gpu/draining", value="x", effect="NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        (Toleration(operator="Exists"), True),  # empty key + Exists tolerates everything
        (Toleration(key="rebalancer.gpu/draining", operator="Exists"), True),
        (Toleration(key="rebalancer.gpu/draining", operator="Equal", value="x"), True),
        (Toleration(key="rebalancer.gpu/draining", operator="Equal", value="y"), False),
        (Toleration(key="rebalancer.gpu/draining", operator="", value="x"), True),  # empty means Equal
        (Toleration(key="other", operator="Exists"), False),
        (Toleration(key="rebalancer.gpu/draining", operator="Exists", effect="NoSchedule"), True),
        (Toleration(key="rebalancer.gpu/draining", operator="Exists", effect="NoExecute"), False),
        (Toleration(operator="Exists", effect="PreferNoSchedule"), False),
        (Toleration(key="rebalancer.gpu/draining", operator="Bogus", value="x"), False),
    ],
)
def test_toleration_of_one_taint(toleration: Toleration, expected: bool) -> None:
    assert tolerates((toleration,), DRAINING) is expected


def test_any_toleration_suffices() -> None:
    assert tolerates((Toleration(key="other", operator="Exists"), Toleration(operator="Exists")), DRAINING)
    assert not tolerates((), DRAINING)


def test_untolerated_taints_ignore_prefer_no_schedule_by_default() -> None:
    prefer = Taint(key="spot", value="true", effect="PreferNoSchedule")
    evict = Taint(key="maintenance", effect="NoExecute")
    tainted = node("n", taints=[DRAINING, prefer, evict])
    workload = pod("w", tolerations=[Toleration(key="maintenance", operator="Exists")])
    assert untolerated_taints(workload, tainted) == (DRAINING,)
    assert untolerated_taints(workload, tainted, effects=("PreferNoSchedule",)) == (prefer,)
    assert untolerated_taints(pod("w", tolerations=[Toleration(operator="Exists")]), tainted) == ()


def test_format_taint_like_kubectl() -> None:
    assert format_taint(DRAINING) == "rebalancer.gpu/draining=x:NoSchedule"
    assert format_taint(Taint(key="maintenance", effect="NoExecute")) == "maintenance:NoExecute"
