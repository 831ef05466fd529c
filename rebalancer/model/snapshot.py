"""The snapshot: an immutable picture of one instant, the indexes over it, and `Finding`.

`Snapshot` holds the cluster objects (`rebalancer.model.cluster`) and the telemetry
(`rebalancer.model.telemetry`) of one instant, with `now`, the only clock a cycle reads; its indexes
(pods by node and by key, gangs) are worked out on first use. A `Finding` is something worth an
operator's attention that is not an eviction: a source's, met while building the snapshot, or a
strategy's. This module must not do I/O, read the clock, parse Kubernetes JSON or know about any
client library: sources build snapshots, everything else only reads them. Frozen dataclasses.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING

from rebalancer.finding_kinds import FindingKind
from rebalancer.model.cluster import _FINISHED, Controller, Node, Pdb, Pod
from rebalancer.model.telemetry import NO_TELEMETRY, Telemetry

if TYPE_CHECKING:
    from rebalancer.usage import UsageHistory


@dataclass(frozen=True, slots=True)
class Finding:
    """Something worth an operator's attention that is not an eviction (leaked VRAM, stale telemetry...)."""

    kind: FindingKind
    node: str | None = None
    gpu: str | None = None
    namespace: str | None = None
    pod: str | None = None
    detail: str = ""
    # leaked-vram: the framebuffer in use on that GPU (and pod), MiB, as the telemetry's newest sample.
    fb_used_mib: float | None = None
    # idle-gpu: the workload (`namespace/Kind/name`) and the GPU-equivalents it holds idle.
    workload: str | None = None
    gpus: float | None = None
    # gpu-rightsizing: what the recommended change saves an hour, at the policy's prices.
    saving_per_hour: float | None = None

    @classmethod
    def about(cls, kind: FindingKind, pod: Pod, detail: str) -> Finding:
        """A finding about a pod, on its node."""
        return cls(kind=kind, node=pod.node_name, namespace=pod.namespace, pod=pod.name, detail=detail)


@dataclass(frozen=True)
class Snapshot:
    """An immutable picture of one instant. `now` is the only clock a cycle reads."""

    now: datetime
    nodes: Mapping[str, Node]
    pods: tuple[Pod, ...]
    pdbs: tuple[Pdb, ...] = ()
    telemetry: Telemetry = NO_TELEMETRY
    # Problems the source met while building the snapshot (pods on unknown nodes, bad samples...).
    findings: tuple[Finding, ...] = ()
    # The controllers of GPU pods and their own controllers, by (namespace, kind, name): what
    # `rebalancer.workloads` resolves a pod's workload with. Empty when the source read none.
    controllers: Mapping[tuple[str, str, str], Controller] = field(default_factory=dict)
    # Where the picture was taken, for the report (`snapshot DIR`, `live cluster (context ...)`): never
    # a credential.
    source: str = ""
    # GPU usage over a long window (peak, p95 per series), read only when a strategy asks for it
    # (`StrategyArgs.usage_period`); None when not read.
    usage: UsageHistory | None = None

    @classmethod
    def node_by_node(
        cls, now: datetime, nodes: Mapping[str, Node], pods_on: Mapping[str, tuple[Pod, ...]]
    ) -> Snapshot:
        """A snapshot of `nodes` whose pods are those of `pods_on`, node by node in the order of
        `nodes`, each active and bound to the node it is listed under (ValueError otherwise). Its
        `pods_by_node` holds those very tuples, so a source that keeps its objects across cycles hands
        the same tuple for a node whose pods did not change."""
        grouped: dict[str, tuple[Pod, ...]] = {}
        for name in nodes:
            held = pods_on.get(name, ())
            if not held:
                continue
            for pod in held:
                if pod.node_name != name or pod.phase in _FINISHED:
                    raise ValueError(f"pod {pod.ref} is listed on node {name} but is not active there")
            grouped[name] = held
        if len(grouped) != sum(1 for held in pods_on.values() if held):
            raise ValueError("pods are listed on nodes the snapshot does not have")
        snapshot = cls(now=now, nodes=nodes, pods=tuple(pod for held in grouped.values() for pod in held))
        snapshot.__dict__["pods_by_node"] = grouped  # what the cached property would work out
        return snapshot

    @cached_property
    def pods_by_node(self) -> Mapping[str, tuple[Pod, ...]]:
        grouped: dict[str, list[Pod]] = defaultdict(list)
        for pod in self.pods:
            node = pod.node_name
            if node is not None and pod.phase not in _FINISHED:  # `Pod.is_active`, inline
                grouped[node].append(pod)
        return {k: tuple(v) for k, v in grouped.items()}

    @cached_property
    def pods_by_key(self) -> Mapping[tuple[str, str], Pod]:
        return {p.key: p for p in self.pods}

    @cached_property
    def gangs(self) -> Mapping[str, tuple[Pod, ...]]:
        """Active pods grouped by gang id (namespace-qualified by the source); terminating members are
        already leaving and do not count."""
        grouped: dict[str, list[Pod]] = defaultdict(list)
        for pod in self.pods:
            if pod.gang is not None and pod.is_active and not pod.terminating:
                grouped[pod.gang].append(pod)
        return {k: tuple(v) for k, v in grouped.items()}

    @property
    def gpu_total(self) -> int:
        return sum(n.gpu_count for n in self.nodes.values())

    def pods_on(self, node: str) -> tuple[Pod, ...]:
        return self.pods_by_node.get(node, ())
