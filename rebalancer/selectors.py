"""Pure matching helpers: label selectors, node affinity, node selectors, taints and tolerations.

Owns the Kubernetes matching semantics on the model types (metav1 label selectors, v1 node selector
requirements including Gt/Lt, node selector terms with `metadata.name` fields, toleration of taints),
so that placement, guards and strategies all agree on what "matches" means. It must not do I/O, read
the clock, or know about resources, capacity or scoring: that is `placement`'s job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from rebalancer.model import (
    LabelSelector,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    Taint,
    Toleration,
)

# The only field a node selector term may match on, as in Kubernetes.
NODE_NAME_FIELD = "metadata.name"
SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")

# Go's strconv.ParseInt(s, 10, 64) syntax: optional sign, ASCII digits, nothing else (Python's int()
# would also accept spaces, underscores and non-ASCII digits, which Kubernetes does not).
_INTEGER = re.compile(r"[+-]?[0-9]+")


def parse_int(text: str) -> int | None:
    """The integer a label value spells in Kubernetes' syntax, or None when it is not one."""
    return int(text) if _INTEGER.fullmatch(text) else None


def label_selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics: every matchLabels pair and every expression must hold.

    An empty selector matches every set of labels. An unknown operator matches nothing.
    """
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return False
    for requirement in selector.match_expressions:
        present = requirement.key in labels
        operator = requirement.operator
        if operator == "In":
            matched = present and labels[requirement.key] in requirement.values
        elif operator == "NotIn":
            matched = not present or labels[requirement.key] not in requirement.values
        elif operator == "Exists":
            matched = present
        elif operator == "DoesNotExist":
            matched = not present
        else:
            return False
        if not matched:
            return False
    return True


def node_requirement_matches(requirement: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    """One v1.NodeSelectorRequirement against a node's labels (or its fields, mapped like labels).

    In / NotIn / Exists / DoesNotExist as for labels; Gt / Lt compare integers and need exactly one
    integer value and an integer label: anything else (absent label, `"80GB"`) does not match.
    """
    operator = requirement.operator
    value = labels.get(requirement.key)
    if operator == "In":
        return value is not None and value in requirement.values
    if operator == "NotIn":
        return value is None or value not in requirement.values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        if value is None or len(requirement.values) != 1:
            return False
        actual = parse_int(value)
        bound = parse_int(requirement.values[0])
        if actual is None or bound is None:
            return False
        return actual > bound if operator == "Gt" else actual < bound
    return False


def node_selector_term_matches(term: NodeSelectorTerm, node: Node) -> bool:
    """All matchExpressions (on labels) and all matchFields (on `metadata.name`) of one term hold.

    An empty term matches no node, as in Kubernetes. A field other than `metadata.name` never matches.
    """
    if not term.match_expressions and not term.match_fields:
        return False
    labels = node.labels
    for requirement in term.match_expressions:
        if not node_requirement_matches(requirement, labels):
            return False
    if term.match_fields:
        fields = {NODE_NAME_FIELD: node.name}
        for requirement in term.match_fields:
            if requirement.key != NODE_NAME_FIELD or not node_requirement_matches(requirement, fields):
                return False
    return True


def required_affinity_matches(pod: Pod, node: Node) -> bool:
    """requiredDuringSchedulingIgnoredDuringExecution: terms are ORed; a pod without terms matches."""
    terms = pod.required_affinity
    if not terms:
        return True
    return any(node_selector_term_matches(term, node) for term in terms)


def node_selector_matches(pod: Pod, node: Node) -> bool:
    """pod.spec.nodeSelector: every key must be a node label with exactly that value."""
    labels = node.labels
    return all(labels.get(key) == value for key, value in pod.node_selector.items())


def preferred_affinity_score(pod: Pod, node: Node) -> int:
    """Sum of the weights of the pod's preferred node affinity terms that the node matches."""
    return sum(
        preferred.weight
        for preferred in pod.preferred_affinity
        if node_selector_term_matches(preferred.term, node)
    )


def tolerates(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    """Whether any toleration tolerates the taint (v1.Toleration.ToleratesTaint).

    An empty effect tolerates every effect; an empty key with operator Exists tolerates every taint;
    Equal (or an empty operator) needs the same value.
    """
    for toleration in tolerations:
        if toleration.effect and toleration.effect != taint.effect:
            continue
        if toleration.key and toleration.key != taint.key:
            continue
        if toleration.operator == "Exists":
            return True
        if toleration.operator in ("Equal", "") and toleration.value == taint.value:
            return True
    return False


def untolerated_taints(
    pod: Pod, node: Node, effects: Iterable[str] = SCHEDULING_EFFECTS
) -> tuple[Taint, ...]:
    """The node's taints with one of `effects` that none of the pod's tolerations tolerates."""
    if not node.taints:
        return ()
    wanted = frozenset(effects)
    return tuple(
        taint for taint in node.taints if taint.effect in wanted and not tolerates(pod.tolerations, taint)
    )


def format_taint(taint: Taint) -> str:
    """`key=value:Effect`, or `key:Effect` without a value, as kubectl and the scheduler print it."""
    if taint.value:
        return f"{taint.key}={taint.value}:{taint.effect}"
    return f"{taint.key}:{taint.effect}"
