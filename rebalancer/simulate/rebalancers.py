"""What runs every `--interval` of simulated time: the real rebalancer, or the descheduler baseline.

Owns two things the engine calls with the simulated state and time, each answering "evict these jobs":

- `PolicyRebalancer` (`--rebalancer on`): builds a Snapshot of the simulated cluster (nodes labelled
  `nvidia.com/gpu.product` with allocatable cpu, memory, `nvidia.com/gpu` and pods; one Job-owned pod per
  running job with its GPU request, cpu and memory, the GPU devices it holds (annotation
  `alibabacloud.com/gpu-index`, as a GPU-sharing scheduler records them), required node affinity on the
  GPU model from `gpu_spec`, the scheduler that placed it, and its creation and start times), runs the
  REAL `rebalancer.cycle.run_cycle` with the policy, the same memory of earlier cycles a live daemon keeps
  (`history.Memory`: cooldowns, the disruption budget) and an evictor that collects the pods of every
  approved decision, and the nodes it drains: like the live evictor, it taints them
  `rebalancer.gpu/draining:NoSchedule` first so the evicted pods do not land back. `now` is the Unix epoch
  plus the simulated seconds.
- `HighNodeUtilization` (`--rebalancer descheduler-hnu`): the upstream descheduler's plugin of that
  name, on GPU requests: nodes at or under 50 % of their GPUs requested are under-used (nothing happens
  when none is, or when all are); their pods are evicted, emptiest node first, while the GPUs left
  free on the other nodes, summed over them, stay positive. No placement simulation, no per-node
  reservations, no cooldown, no taint.

Also `default_policy()`, the policy `on` uses unless `--policy` gives one (the shipped defaults), and
`replay_policy()`, how a policy is run without telemetry, with a line per difference from a live run.
This module must not read the clock, move jobs itself or decide when ticks happen: the engine applies
the evictions.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from rebalancer.cycle import run_cycle
from rebalancer.evictor import UnframedEvictor
from rebalancer.history import Memory
from rebalancer.model import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    MILLI_PER_GPU,
    Decision,
    Finding,
    GpuRequest,
    Mode,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Outcome,
    OwnerRef,
    Pod,
    Snapshot,
    Taint,
)
from rebalancer.node_accounting import GPU_INDEX_ANNOTATION
from rebalancer.policy import ConfiguredStrategy, LoadedPolicy, parse_policy
from rebalancer.simulate.cluster import MIB, POD_SLOTS, SimCluster, SimNode, node_labels
from rebalancer.simulate.trace import Job

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NAMESPACE = "trace"
PACKED_SCHEDULER = "gpu-packed-scheduler"
SPREAD_SCHEDULER = "default-scheduler"  # kube-scheduler's default scoring is LeastAllocated
HNU_THRESHOLD_PERCENT = 50.0
# The taint the live evictor puts on a node before draining it, so evicted pods do not land back.
DRAINING_TAINT = Taint(key="rebalancer.gpu/draining", value="simulation", effect="NoSchedule")


def default_policy() -> LoadedPolicy:
    """The built-in defaults, which policies/default.yaml writes out: what `on` runs without `--policy`."""
    return parse_policy({}, "<default policy>")


def replay_policy(loaded: LoadedPolicy) -> tuple[LoadedPolicy, tuple[str, ...]]:
    """The policy as the replay runs it, and one line per way that differs from a live run of it.

    The trace has no GPU telemetry: each strategy's `without_telemetry()` says how its telemetry
    thresholds are treated (gpu-consolidation's utilisation threshold as met, idle-gpu not run). The
    replay acts out every approved eviction whatever `dry_run` says: it measures what the policy would
    do live. Everything else (guards, limits, cooldowns, the disruption budget) applies as written;
    the per-namespace limit and the disruption budget are noted, since every replayed pod is in one
    namespace and is its own workload.
    """
    notes: list[str] = []
    if loaded.policy.dry_run:
        notes.append("dry_run: true not honoured: the replay acts out every approved eviction")
    strategies: list[ConfiguredStrategy] = []
    for configured in loaded.strategies:
        args, note = configured.args.without_telemetry()
        if note is not None:
            notes.append(f"{configured.name} (no telemetry in the trace): {note}")
        strategies.append(
            configured if args is configured.args else configured.model_copy(update={"args": args})
        )
    per_namespace = loaded.policy.limits.max_per_namespace
    if per_namespace is not None:
        notes.append(
            f"limits.max_per_namespace {per_namespace}: the trace has no namespaces, every pod is in "
            f"{NAMESPACE!r}, so no cycle evicts more than {per_namespace} pods"
        )
    budget = loaded.policy.guards.max_disruptions_per_workload
    if budget is not None:
        notes.append(
            f"guards.max_disruptions_per_workload {budget}: every trace pod is its own workload (a Job), "
            "so the budget is per pod; live, the replicas of one controller share it"
        )
    return loaded.model_copy(update={"strategies": tuple(strategies)}), tuple(notes)


def sim_datetime(seconds: float) -> datetime:
    """The Snapshot time of a simulated instant: the Unix epoch plus the trace seconds."""
    return EPOCH + timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class Eviction:
    """One job to evict, the node the rebalancer predicted it would land on (None: no prediction) and
    the nodes the planner found tied with that one (kube-scheduler picks among them at random)."""

    job: int
    target: str | None = None
    tied: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What one tick does: evict these jobs, after tainting these nodes (being drained) NoSchedule."""

    evictions: tuple[Eviction, ...] = ()
    drain: tuple[str, ...] = ()


NOTHING = TickPlan()


class Rebalancer(Protocol):
    """Called at each tick with the simulated time; says what to evict and which nodes to taint."""

    def plan(self, now: float, cluster: SimCluster) -> TickPlan: ...


# --------------------------------------------------------------------------- the real rebalancer


def model_affinity(models: frozenset[str] | None) -> tuple[NodeSelectorTerm, ...]:
    """Required node affinity `nvidia.com/gpu.product In (models)`; none when any model will do."""
    if models is None:
        return ()
    requirement = NodeSelectorRequirement(GPU_PRODUCT_LABEL, "In", tuple(sorted(models)))
    return (NodeSelectorTerm(match_expressions=(requirement,)),)


def build_pod(
    job: Job,
    node: str | None,
    started: float | None,
    scheduler_name: str,
    *,
    required_affinity: tuple[NodeSelectorTerm, ...] | None = None,
    devices: tuple[int, ...] = (),
) -> Pod:
    """The pod of a job as the Kubernetes model sees it: a Job's pod with the job's requests, and the GPU
    devices it runs on (`GPU_INDEX_ANNOTATION`, as the GPU-sharing scheduler records them)."""
    return Pod(
        namespace=NAMESPACE,
        name=job.name,
        uid=f"job-{job.index}",
        node_name=node,
        phase="Running" if node is not None else "Pending",
        scheduler_name=scheduler_name,
        qos_class="Burstable",
        labels={"job-name": job.name},
        annotations={GPU_INDEX_ANNOTATION: "-".join(map(str, devices))} if devices else {},
        owner=OwnerRef(kind="Job", name=job.name, api_version="batch/v1"),
        requests=_requests(job.cpu_milli, job.memory_mib, job.num_gpu, job.gpu_milli),
        gpu=GpuRequest(count=job.num_gpu, milli_per_device=job.gpu_milli),
        required_affinity=model_affinity(job.models) if required_affinity is None else required_affinity,
        created=sim_datetime(job.arrival),
        started=sim_datetime(started) if started is not None else None,
    )


@functools.lru_cache(maxsize=4096)
def _requests(cpu_milli: int, memory_mib: int, num_gpu: int, gpu_milli: int) -> Mapping[str, int]:
    """One mapping for the pods of every job of one shape, GPU share included, as the API sources share
    one per pod template (what is derived from a pod's requests and GPU request is then kept once per
    shape: `memo.RequestsMemo`)."""
    requests = {"cpu": cpu_milli, "memory": memory_mib * MIB}
    if gpu_milli >= MILLI_PER_GPU:
        requests[GPU_RESOURCE] = num_gpu
    return requests


class SnapshotBuilder:
    """Builds Snapshots of the simulated cluster, reusing the Node and Pod objects that did not change."""

    def __init__(self, jobs: Sequence[Job], scheduler_name: str) -> None:
        self.jobs = jobs
        self.scheduler_name = scheduler_name
        self._nodes: dict[str, tuple[tuple[float, bool], Node]] = {}
        self._pods: dict[int, tuple[str, float, Pod]] = {}
        self._affinity: dict[frozenset[str], tuple[NodeSelectorTerm, ...]] = {}
        self.index: dict[tuple[str, str], int] = {}  # pod key -> job index
        self._on_node: dict[str, tuple[SimNode, int, tuple[Pod, ...]]] = {}

    def _node(self, node: SimNode) -> Node:
        cached = self._nodes.get(node.name)
        if cached is not None and cached[0] == (node.created, node.draining):
            return cached[1]
        built = Node(
            name=node.name,
            labels=node_labels(node.name, node.model, node.gpus),
            allocatable={
                "cpu": node.cpu,
                "memory": node.memory,
                GPU_RESOURCE: node.gpus,
                "pods": POD_SLOTS,
            },
            taints=(DRAINING_TAINT,) if node.draining else (),
            created=sim_datetime(node.created),
        )
        self._nodes[node.name] = ((node.created, node.draining), built)
        return built

    def _required_affinity(self, models: frozenset[str] | None) -> tuple[NodeSelectorTerm, ...]:
        if models is None:
            return ()
        terms = self._affinity.get(models)
        if terms is None:
            terms = model_affinity(models)
            self._affinity[models] = terms
        return terms

    def _pod(self, job: Job, node: str, started: float, devices: tuple[int, ...]) -> Pod:
        cached = self._pods.get(job.index)
        if cached is not None and cached[0] == node and cached[1] == started:
            return cached[2]
        built = build_pod(
            job,
            node,
            started,
            self.scheduler_name,
            required_affinity=self._required_affinity(job.models),
            devices=devices,
        )
        self._pods[job.index] = (node, started, built)
        self.index[built.key] = job.index
        return built

    def snapshot(self, now: float, cluster: SimCluster) -> Snapshot:
        """The simulated cluster as the rebalancer sees it at `now`."""
        nodes: dict[str, Node] = {}
        pods: dict[str, tuple[Pod, ...]] = {}
        built_nodes, on_node = self._nodes, self._on_node
        for name, node in cluster.nodes.items():
            built = built_nodes.get(name)
            if built is None or built[0] != (node.created, node.draining):
                nodes[name] = self._node(node)
            else:
                nodes[name] = built[1]
            cached = on_node.get(name)
            if cached is None or cached[0] is not node or cached[1] != node.version:
                held = tuple(
                    self._pod(self.jobs[index], name, cluster.started[index], devices)
                    for index, devices in node.jobs.items()
                )
                cached = (node, node.version, held)
                on_node[name] = cached
            pods[name] = cached[2]
        return Snapshot.node_by_node(sim_datetime(now), nodes, pods)

    def forget(self, job: Job) -> None:
        """Drop what is cached about a job that ended."""
        cached = self._pods.pop(job.index, None)
        if cached is not None:
            self.index.pop(cached[2].key, None)


class _ReplayEvictor(UnframedEvictor):
    """The replay's evictor: every approved pod is `evicted` (the engine moves it), and the jobs, their
    predicted targets and the drained nodes are collected for the tick."""

    mode: Mode = "live"

    def __init__(self, builder: SnapshotBuilder, cluster: SimCluster, stats: PolicyRebalancer) -> None:
        self._builder = builder
        self._cluster = cluster
        self._stats = stats
        self.evictions: list[Eviction] = []
        self.drain: list[str] = []
        self._seen: set[int] = set()

    def evict(self, decision: Decision) -> tuple[Outcome, ...]:
        self._stats.approved += 1
        proposal = decision.proposal
        if proposal.kind == "node" and proposal.node is not None:
            self.drain.extend(
                n for n in dict.fromkeys((proposal.node, *proposal.nodes_freed)) if n not in self.drain
            )
        targets = decision.targets or proposal.targets
        for pod in decision.pods_in_order:
            index = self._builder.index.get(pod.key)
            if index is None or index in self._seen or index not in self._cluster.location:
                continue
            self._seen.add(index)
            target = targets.get(pod.key)
            tied = decision.tied.get(pod.key, frozenset()) if target is not None else frozenset()
            self.evictions.append(Eviction(job=index, target=target, tied=tied))
        return tuple(Outcome(p.namespace, p.name, "evicted") for p in decision.pods_in_order)

    def end_cycle(self, decisions: Sequence[Decision], *, completed: bool) -> tuple[Finding, ...]:
        for decision in decisions:
            if not decision.approved:
                self._stats.refused[decision.blocked_by or "unknown"] += 1
        return ()


class PolicyRebalancer:
    """Runs `rebalancer.cycle.run_cycle` on a Snapshot of the simulated cluster, with the same memory of
    earlier cycles (`history.Memory`, the history a live daemon keeps) and the replay's evictor."""

    def __init__(self, loaded: LoadedPolicy, builder: SnapshotBuilder) -> None:
        self.loaded = loaded
        self.builder = builder
        self.cycles = 0
        self.approved = 0
        self.refused: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()  # "strategy: reason" -> cycles it was skipped
        self.memory = Memory()

    # ----------------------------------------------------------------------- cycle

    def plan(self, now: float, cluster: SimCluster) -> TickPlan:
        snapshot = self.builder.snapshot(now, cluster)
        evictor = _ReplayEvictor(self.builder, cluster, self)
        report = run_cycle(snapshot, self.loaded, evictor, memory=self.memory)
        self.cycles += 1
        for skipped in report.skipped_strategies:
            self.skipped[f"{skipped.strategy}: {skipped.reason}"] += 1
        if not evictor.evictions and not evictor.drain:
            return NOTHING
        return TickPlan(evictions=tuple(evictor.evictions), drain=tuple(evictor.drain))


# --------------------------------------------------------------------------- descheduler baseline


class HighNodeUtilization:
    """The upstream descheduler's HighNodeUtilization on GPU requests (the peer baseline)."""

    def __init__(self, jobs: Sequence[Job], threshold_percent: float = HNU_THRESHOLD_PERCENT) -> None:
        self.jobs = jobs
        self.threshold_percent = threshold_percent
        self.cycles = 0

    def plan(self, now: float, cluster: SimCluster) -> TickPlan:
        self.cycles += 1
        nodes = [node for node in cluster.nodes.values() if node.gpus > 0]

        def usage(node: SimNode) -> float:
            return node.used_milli / (node.gpus * MILLI_PER_GPU) * 100

        low = [node for node in nodes if usage(node) <= self.threshold_percent]
        if not low or len(low) == len(nodes):
            return NOTHING  # nothing under-used, or everything is: upstream does nothing
        high = [node for node in nodes if usage(node) > self.threshold_percent]
        available = sum(node.gpus * MILLI_PER_GPU - node.used_milli for node in high)
        evictions: list[Eviction] = []
        for node in sorted(low, key=lambda n: (usage(n), n.name)):
            for index in sorted(node.jobs, key=lambda i: self.jobs[i].name):
                if available <= 0:
                    return TickPlan(evictions=tuple(evictions))
                evictions.append(Eviction(job=index))
                available -= self.jobs[index].gpu_demand_milli
        return TickPlan(evictions=tuple(evictions))
