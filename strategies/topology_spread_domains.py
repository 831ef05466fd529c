"""Topology domains of `topology-spread`: what one run knows of where pods are and how they spread.

Owns the counting the scheduler's PodTopologySpread does, over the run's predicted cluster. A pod's
eligible domains are the values of topologyKey on the nodes it could be scheduled to (nodeAffinityPolicy
Honor: its nodeSelector and required node affinity; a node without the key is no domain), empty domains
included. A domain's count is the number of active pods of the namespace that match the selector and
sit on an eligible node of that domain; a terminating pod is leaving its domain and counts nowhere.
Skew is max - min, where min is 0 while fewer domains than minDomains exist. `Run.hard_filter` is the
scheduler's filter for a pod's DoNotSchedule constraints. The `Run` carries, from one proposal to the
next, the one `ClusterState` of the run, where each active pod is predicted to be, the pods already
moved, the proposals made and the pods left alone (`NotChosen`, each with why); it indexes the pods
by namespace and label, and caches eligible nodes per (topology key, nodeSelector, affinity), so
counting does not scan the whole cluster.

This module must stay pure: no I/O, no clock (`snapshot.now` is the time). It must not decide which
pod moves where nor word proposals (the repair and gang compaction do).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from rebalancer.model import (
    LabelSelector,
    Node,
    NodeSelectorTerm,
    NotChosen,
    Pod,
    Proposal,
    Snapshot,
    TopologySpreadConstraint,
)
from rebalancer.placement import ClusterState
from rebalancer.registry import StrategyContext
from rebalancer.selectors import label_selector_matches, node_selector_matches, required_affinity_matches

if TYPE_CHECKING:
    from strategies.topology_spread import TopologySpreadArgs

__all__ = ["HARD", "NAME", "Eligible", "Run", "global_min", "old_enough", "skew_of"]

NAME = "topology-spread"
HARD = "DoNotSchedule"

PodKey = tuple[str, str]


def old_enough(pod: Pod, snapshot: Snapshot, min_age: timedelta) -> bool:
    # An unknown creation time counts as too young, as the planner's min-pod-age guard reads it.
    return pod.created is not None and snapshot.now - pod.created >= min_age


def global_min(counts: Mapping[str, int], min_domains: int) -> int:
    """The scheduler's global minimum: 0 while fewer eligible domains than minDomains exist."""
    if not counts or len(counts) < min_domains:
        return 0
    return min(counts.values())


def skew_of(counts: Mapping[str, int], min_domains: int) -> int:
    """The skew: the largest count minus the scheduler's global minimum."""
    return max(counts.values(), default=0) - global_min(counts, min_domains)


# (topology key, nodeSelector, required node affinity): what decides a pod's eligible nodes.
_EligibleKey = tuple[str, tuple[tuple[str, str], ...], tuple[NodeSelectorTerm, ...]]


@dataclass(frozen=True, slots=True)
class Eligible:
    """The nodes carrying a topology key that a pod's nodeSelector / affinity allow, by domain."""

    domain_of: Mapping[str, str]  # node -> domain
    nodes_in: Mapping[str, tuple[str, ...]]  # domain -> its nodes by name, domains in node order


@dataclass
class Run:
    """What one run of the strategy reads, and what it carries from one proposal to the next."""

    snapshot: Snapshot
    args: TopologySpreadArgs
    ctx: StrategyContext
    state: ClusterState
    # Where each active pod is predicted to be once the moves proposed so far have happened.
    location: dict[PodKey, str] = field(default_factory=dict)
    moved: set[PodKey] = field(default_factory=set)
    proposals: list[Proposal] = field(default_factory=list)
    # The pods looked at and not moved, each with why (a pod moved later of the run is dropped at its end).
    left: list[NotChosen] = field(default_factory=list)
    pods_by_namespace: dict[str, list[Pod]] = field(default_factory=dict)
    # Per namespace, the active pods carrying each label (key, value), in snapshot order: a selector's
    # matchLabels narrow `counted` down to a few pods instead of the whole namespace. Built for a
    # namespace when a selector first looks into it (most namespaces, the daemons', never are).
    pods_by_label: dict[str, dict[tuple[str, str], list[Pod]]] = field(default_factory=dict)
    # eligible_nodes per (topology key, nodeSelector, required affinity): every pod of a group, and
    # most groups, share one.
    eligible_cache: dict[_EligibleKey, Eligible] = field(default_factory=dict)
    # Every node's name: what a move into one domain excludes is the rest (a set difference, in C).
    node_names: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.node_names = frozenset(self.snapshot.nodes)
        grouped: dict[str, list[Pod]] = defaultdict(list)
        for pod in self.snapshot.pods:
            # A terminating pod is leaving its domain: neither counted nor moved (as upstream's
            # descheduler and kube-scheduler's PodTopologySpread both skip it).
            if pod.is_active and pod.node_name is not None and not pod.terminating:
                grouped[pod.namespace].append(pod)
                self.location[pod.key] = pod.node_name
        self.pods_by_namespace = dict(grouped)

    @property
    def min_age(self) -> timedelta:
        return timedelta(seconds=self.args.min_pod_age)

    def gang_of(self, pod: Pod) -> tuple[Pod, ...]:
        """The pods that evicting `pod` disrupts: its whole active gang, or the pod alone."""
        if pod.gang is None:
            return (pod,)
        members = self.snapshot.gangs.get(pod.gang, ())
        return members if len(members) > 1 else (pod,)

    def eligible_nodes(self, pod: Pod, topology_key: str) -> Eligible:
        """The nodes carrying the key that the pod's nodeSelector / affinity allow, and their domains."""
        key = (topology_key, tuple(sorted(pod.node_selector.items())), pod.required_affinity)
        eligible = self.eligible_cache.get(key)
        if eligible is None:
            domain_of: dict[str, str] = {}
            for name, node in self.snapshot.nodes.items():
                domain = node.labels.get(topology_key)
                if domain is not None and _affinity_allows(pod, node):
                    domain_of[name] = domain
            nodes_in: dict[str, list[str]] = {domain: [] for domain in domain_of.values()}
            for name, domain in sorted(domain_of.items()):
                nodes_in[domain].append(name)
            eligible = Eligible(domain_of, {domain: tuple(names) for domain, names in nodes_in.items()})
            self.eligible_cache[key] = eligible
        return eligible

    def counted(
        self, namespace: str, selector: LabelSelector, eligible: Eligible, *, without: PodKey | None
    ) -> dict[str, list[Pod]]:
        """Domain -> the matching pods predicted in it; every eligible domain appears, empty or not."""
        by_domain: dict[str, list[Pod]] = {domain: [] for domain in eligible.nodes_in}
        domain_of = eligible.domain_of
        for pod in self._selector_candidates(namespace, selector):
            if pod.key == without:
                continue
            domain = domain_of.get(self.location[pod.key])
            if domain is not None and label_selector_matches(selector, pod.labels):
                by_domain[domain].append(pod)
        return by_domain

    def _selector_candidates(self, namespace: str, selector: LabelSelector) -> Sequence[Pod]:
        """The namespace's active pods that can match the selector: those carrying its rarest matchLabels
        pair (every pod of the namespace when it has no matchLabels), in snapshot order."""
        if not selector.match_labels:
            return self.pods_by_namespace.get(namespace, ())
        index = self.pods_by_label.get(namespace)
        if index is None:
            by_label: dict[tuple[str, str], list[Pod]] = defaultdict(list)
            for pod in self.pods_by_namespace.get(namespace, ()):
                for label in pod.labels.items():
                    by_label[label].append(pod)
            index = self.pods_by_label[namespace] = dict(by_label)
        return min((index.get(label, ()) for label in selector.match_labels.items()), key=len)

    def hard_filter(
        self, pod: Pod, skip: TopologySpreadConstraint | None, names: Iterable[str]
    ) -> frozenset[str]:
        """The nodes of `names` the scheduler's PodTopologySpread filter lets the pod onto, for its
        DoNotSchedule constraints but `skip`."""
        checks: list[tuple[Mapping[str, str], Mapping[str, int], int]] = []
        for constraint in pod.topology_spread:
            if constraint.when_unsatisfiable != HARD or constraint is skip:
                continue
            eligible = self.eligible_nodes(pod, constraint.topology_key)
            by_domain = self.counted(pod.namespace, constraint.label_selector, eligible, without=pod.key)
            counts = {d: len(p) for d, p in by_domain.items()}
            self_match = 1 if label_selector_matches(constraint.label_selector, pod.labels) else 0
            room = constraint.max_skew + global_min(counts, constraint.min_domains or 0) - self_match
            checks.append((eligible.domain_of, counts, room))
        if not checks:  # most pods: no other hard constraint
            return frozenset(names)

        def allows(node_name: str) -> bool:
            for eligible, counts, room in checks:
                domain = eligible.get(node_name)
                if domain is None or counts[domain] > room:
                    return False
            return True

        return frozenset(name for name in names if allows(name))


def _affinity_allows(pod: Pod, node: Node) -> bool:
    """nodeAffinityPolicy Honor: the node matches the pod's nodeSelector and required node affinity."""
    return node_selector_matches(pod, node) and required_affinity_matches(pod, node)
