"""The simulated cluster: node pools, provisioned nodes, the scheduler model and the autoscaler's choice.

Owns the mutable state of the replay: which nodes exist (each an instance of a trace node of its pool),
what every node has free (cpu, memory, pod slots, free milli-GPU per device) and which job runs where,
with the GPU devices it holds. The scheduler models follow `rebalancer.placement` exactly, so what the
strategies predict with `ClusterState` is what the replay does:

- a job fits a node when the node's GPU model is allowed (the job's `gpu_spec`), cpu, memory and a pod
  slot are free, and `num_gpu` distinct devices each have `gpu_milli` free (shares packed per device);
  the job takes the best-fit devices (least free that still fit, lowest index on ties);
- `packed` picks the feasible node with the highest total of the shipped profile: MostAllocated plus
  NodeAffinity with the profile's `addedAffinity` (more GPUs per node preferred, normalised over the
  feasible nodes), `spread` the one with the highest LeastAllocated score (kube-scheduler's default
  profile; the pods have no preferred affinity of their own), all kube-scheduler's integer arithmetic
  (`rebalancer.scoring`) over what the job's pod requests (`simulate.rebalancers.build_pod`: cpu,
  memory, and `nvidia.com/gpu` for whole GPUs; a GPU share requests no GPU resource, so only its cpu
  and memory are scored) against what its node advertises and is labelled (`node_labels`). Ties
  (kube-scheduler picks among them at random) go to the first name in sorted order, the node the
  prediction reports;
- a node the rebalancer is draining carries its NoSchedule taint: the scheduler model skips it.

The autoscaler's choice (`pool_for`) is the pool of an allowed model whose next node, empty, holds the
job, with the most GPUs per node and nodes left; ties go to the pool with more nodes in the trace. A
pool is capped at its node count in the trace and starts empty; the next node it provisions is its
largest unused trace node (cpu, then memory), and a removed node goes back to the pool.

It must not read the clock, run strategies or decide when things happen: the engine calls it with the
simulated time.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rebalancer.gpu_devices import GPU_COUNT_LABEL, best_fit_devices, has_devices
from rebalancer.model import GPU_PRODUCT_LABEL, MILLI_PER_GPU, Node
from rebalancer.node_accounting import added_affinity_score
from rebalancer.scoring import (
    CPU_WEIGHT,
    GPU_WEIGHT,
    MEMORY_WEIGHT,
    least_allocated,
    most_allocated,
    normalised_affinity,
    total_score,
)
from rebalancer.simulate.trace import Job, TraceNode

SchedulerModel = Literal["packed", "spread"]
MIB = 1024 * 1024
POD_SLOTS = 110  # the kubelet's default max-pods, advertised as allocatable `pods`


class InvariantViolation(AssertionError):
    """The simulated state broke a rule (capacity, devices, GPU model, bookkeeping): a simulator bug."""


@dataclass(frozen=True, slots=True)
class Pool:
    """All trace nodes of one (GPU model, GPUs per node) shape, largest first."""

    model: str
    gpus: int
    templates: tuple[TraceNode, ...]

    @property
    def name(self) -> str:
        return f"{self.model}x{self.gpus}"

    @property
    def size(self) -> int:
        return len(self.templates)


def build_pools(nodes: Sequence[TraceNode]) -> tuple[Pool, ...]:
    """One pool per (model, GPUs per node), sorted by model then GPUs; templates largest first."""
    shapes: dict[tuple[str, int], list[TraceNode]] = {}
    for node in nodes:
        shapes.setdefault((node.model, node.gpus), []).append(node)
    return tuple(
        Pool(model=model, gpus=gpus, templates=tuple(sorted(members, key=_template_order)))
        for (model, gpus), members in sorted(shapes.items())
    )


def node_labels(name: str, model: str, gpus: int) -> dict[str, str]:
    """The labels of a provisioned node: its host name and GPU feature discovery's model and count."""
    return {"kubernetes.io/hostname": name, GPU_PRODUCT_LABEL: model, GPU_COUNT_LABEL: str(gpus)}


def _template_order(node: TraceNode) -> tuple[int, int, str]:
    return (-node.cpu_milli, -node.memory_mib, node.name)


class SimNode:
    """One provisioned node and what it holds."""

    __slots__ = (
        "affinity",
        "cpu",
        "created",
        "devices",
        "draining",
        "empty_since",
        "free_cpu",
        "free_memory",
        "free_slots",
        "gpus",
        "jobs",
        "memory",
        "model",
        "name",
        "pool",
        "template",
        "used_milli",
        "version",
        "whole_gpus",
    )

    def __init__(self, template: TraceNode, pool: Pool, created: float) -> None:
        self.template = template
        self.pool = pool
        self.name = template.name
        self.model = template.model
        self.gpus = template.gpus
        self.cpu = template.cpu_milli
        self.memory = template.memory_mib * MIB
        self.free_cpu = self.cpu
        self.free_memory = self.memory
        self.free_slots = POD_SLOTS
        self.devices = [MILLI_PER_GPU] * template.gpus  # free milli-GPU per device
        self.used_milli = 0
        self.whole_gpus = 0  # `nvidia.com/gpu` requested by the whole-GPU jobs here
        self.jobs: dict[int, tuple[int, ...]] = {}  # job index -> devices held
        self.created = created
        self.empty_since: float | None = created
        self.draining = False  # tainted NoSchedule by the rebalancer: the scheduler model skips it
        self.version = 0  # bumped whenever the set of jobs on the node changes
        # The raw NodeAffinity score the packed profile's `addedAffinity` gives the node.
        self.affinity = added_affinity_score(
            Node(name=self.name, labels=node_labels(self.name, self.model, self.gpus))
        )

    def fits(self, job: Job) -> bool:
        """Whether the job fits what is free now (the GPU model is the caller's business)."""
        if self.free_cpu < job.cpu_milli or self.free_memory < job.memory_mib * MIB or self.free_slots < 1:
            return False
        return has_devices(self.devices, job.num_gpu, job.gpu_milli)

    def score(self, job: Job, *, packed: bool = True) -> int:
        """The score of the node for the job's pod (`rebalancer.scoring`, as `placement` computes it):
        MostAllocated when `packed`, else LeastAllocated."""
        parts = [
            (CPU_WEIGHT, self.cpu - self.free_cpu + job.cpu_milli, self.cpu),
            (MEMORY_WEIGHT, self.memory - self.free_memory + job.memory_mib * MIB, self.memory),
        ]
        whole = whole_gpus(job)
        if whole:
            parts.append((GPU_WEIGHT, self.whole_gpus + whole, self.gpus))
        return most_allocated(parts) if packed else least_allocated(parts)

    def best_fit_devices(self, count: int, milli: int) -> tuple[int, ...] | None:
        """The `count` devices with the least free milli that still hold `milli` (lowest index on ties)."""
        return best_fit_devices(self.devices, count, milli)


def whole_gpus(job: Job) -> int:
    """The `nvidia.com/gpu` the job's pod requests: its GPUs when whole, 0 for a share."""
    return job.num_gpu if job.gpu_milli >= MILLI_PER_GPU else 0


def template_holds(template: TraceNode, job: Job) -> bool:
    """Whether an empty node made from the template could run the job."""
    return (
        template.gpus >= job.num_gpu
        and template.cpu_milli >= job.cpu_milli
        and template.memory_mib >= job.memory_mib
        and (job.models is None or template.model in job.models)
    )


@dataclass
class _PoolState:
    pool: Pool
    unused: list[tuple[int, int, str, int]] = field(default_factory=list)  # heap of template order, index

    def __post_init__(self) -> None:
        self.unused = [(*_template_order(t), i) for i, t in enumerate(self.pool.templates)]
        heapq.heapify(self.unused)

    def next_template(self) -> TraceNode | None:
        return self.pool.templates[self.unused[0][3]] if self.unused else None

    def take(self) -> TraceNode:
        return self.pool.templates[heapq.heappop(self.unused)[3]]

    def give_back(self, template: TraceNode) -> None:
        index = self.pool.templates.index(template)
        heapq.heappush(self.unused, (*_template_order(template), index))


class SimCluster:
    """Provisioned nodes, where each job runs, and the scheduler model choosing nodes for jobs."""

    def __init__(self, trace_nodes: Sequence[TraceNode], scheduler: SchedulerModel = "packed") -> None:
        if scheduler not in ("packed", "spread"):
            raise ValueError(f"unknown scheduler model {scheduler!r}")
        self.scheduler: SchedulerModel = scheduler
        self.pools = build_pools(trace_nodes)
        self._pool_states = {pool.name: _PoolState(pool) for pool in self.pools}
        self.nodes: dict[str, SimNode] = {}
        self._by_model: dict[str, dict[str, SimNode]] = {pool.model: {} for pool in self.pools}
        self.location: dict[int, SimNode] = {}  # running job index -> its node
        self.started: dict[int, float] = {}  # running job index -> when it was (last) placed

    # ----------------------------------------------------------------------- queries

    def candidate_nodes(self, job: Job) -> Iterator[SimNode]:
        """Provisioned nodes of the GPU models the job allows."""
        if job.models is None:
            yield from self.nodes.values()
            return
        for model in job.models:
            nodes = self._by_model.get(model)
            if nodes:
                yield from nodes.values()

    def best_node(self, job: Job) -> SimNode | None:
        """The node the scheduler model picks for the job now, or None when no node fits."""
        feasible = [node for node in self.candidate_nodes(job) if not node.draining and node.fits(job)]
        if self.scheduler == "spread":
            scored = [(node.score(job, packed=False), node) for node in feasible]
        else:
            top = max((node.affinity for node in feasible), default=0)
            scored = [
                (total_score(node.score(job), normalised_affinity(node.affinity, top)), node)
                for node in feasible
            ]
        best: SimNode | None = None
        best_score = 0
        for score, node in scored:
            if best is None or score > best_score or (score == best_score and node.name < best.name):
                best, best_score = node, score
        return best

    def pool_for(self, job: Job) -> Pool | None:
        """The pool the autoscaler adds a node from for a job that fits nowhere, or None."""
        chosen: Pool | None = None
        for pool in self.pools:
            template = self._pool_states[pool.name].next_template()
            if template is None or not template_holds(template, job):
                continue
            if chosen is None or (pool.gpus, pool.size) > (chosen.gpus, chosen.size):
                chosen = pool
        return chosen

    def nodes_left(self, pool: Pool) -> int:
        return len(self._pool_states[pool.name].unused)

    # ----------------------------------------------------------------------- changes

    def add_node(self, pool: Pool, now: float) -> SimNode:
        """Provision the pool's next node (ready at once). Raises ValueError when the pool is used up."""
        state = self._pool_states[pool.name]
        if not state.unused:
            raise ValueError(f"pool {pool.name} has no nodes left")
        node = SimNode(state.take(), pool, now)
        self.nodes[node.name] = node
        self._by_model[node.model][node.name] = node
        return node

    def remove_node(self, node: SimNode) -> None:
        """Deprovision an empty node; its trace node goes back to the pool."""
        if node.jobs:
            raise ValueError(f"node {node.name} still runs {len(node.jobs)} job(s)")
        del self.nodes[node.name]
        del self._by_model[node.model][node.name]
        self._pool_states[node.pool.name].give_back(node.template)

    def place(self, job: Job, node: SimNode, now: float) -> None:
        """Run the job on the node, on its best-fit devices. Raises ValueError when it does not fit."""
        if job.index in self.location:
            raise ValueError(f"job {job.name} already runs on {self.location[job.index].name}")
        if (job.models is not None and node.model not in job.models) or not node.fits(job):
            raise ValueError(f"job {job.name} does not fit node {node.name}")
        devices = node.best_fit_devices(job.num_gpu, job.gpu_milli) or ()
        for index in devices:
            node.devices[index] -= job.gpu_milli
        node.used_milli += job.num_gpu * job.gpu_milli
        node.whole_gpus += whole_gpus(job)
        node.free_cpu -= job.cpu_milli
        node.free_memory -= job.memory_mib * MIB
        node.free_slots -= 1
        node.jobs[job.index] = devices
        node.version += 1
        node.empty_since = None
        self.location[job.index] = node
        self.started[job.index] = now

    def remove(self, job: Job, now: float) -> SimNode:
        """Stop the job where it runs; the node records when it became empty. Returns the node."""
        node = self.location.pop(job.index)
        del self.started[job.index]
        devices = node.jobs.pop(job.index)
        node.version += 1
        for index in devices:
            node.devices[index] += job.gpu_milli
        node.used_milli -= job.num_gpu * job.gpu_milli
        node.whole_gpus -= whole_gpus(job)
        node.free_cpu += job.cpu_milli
        node.free_memory += job.memory_mib * MIB
        node.free_slots += 1
        if not node.jobs:
            node.empty_since = now
        return node

    # ----------------------------------------------------------------------- checks

    def check_invariants(self, jobs: Sequence[Job]) -> None:
        """Recompute every node's accounting from the jobs it holds; raise InvariantViolation on any
        overcommit, device misuse, disallowed GPU model, pool overrun or bookkeeping mismatch."""
        located = 0
        per_pool: dict[str, int] = {}
        for name, node in self.nodes.items():
            per_pool[node.pool.name] = per_pool.get(node.pool.name, 0) + 1
            if self._by_model[node.model].get(name) is not node:
                raise InvariantViolation(f"node {name} missing from the model index")
            devices = [MILLI_PER_GPU] * node.gpus
            cpu = memory = used = whole = 0
            for index, held in node.jobs.items():
                job = jobs[index]
                located += 1
                if self.location.get(index) is not node:
                    raise InvariantViolation(f"job {job.name} on {name} but located elsewhere")
                if job.models is not None and node.model not in job.models:
                    raise InvariantViolation(
                        f"job {job.name} needs {sorted(job.models)}, runs on {node.model}"
                    )
                if len(held) != job.num_gpu or len(set(held)) != len(held):
                    raise InvariantViolation(f"job {job.name} holds devices {held}, needs {job.num_gpu}")
                for device in held:
                    devices[device] -= job.gpu_milli
                cpu += job.cpu_milli
                memory += job.memory_mib * MIB
                used += job.num_gpu * job.gpu_milli
                whole += whole_gpus(job)
            if devices != node.devices or used != node.used_milli or whole != node.whole_gpus:
                raise InvariantViolation(f"node {name}: device accounting {node.devices} != {devices}")
            if min(devices, default=0) < 0:
                raise InvariantViolation(f"node {name}: a GPU device is overcommitted: {devices}")
            if node.free_cpu != node.cpu - cpu or node.free_cpu < 0:
                raise InvariantViolation(f"node {name}: cpu free {node.free_cpu}, holds {cpu} of {node.cpu}")
            if node.free_memory != node.memory - memory or node.free_memory < 0:
                raise InvariantViolation(f"node {name}: memory overcommitted or misaccounted")
            if node.free_slots != POD_SLOTS - len(node.jobs) or node.free_slots < 0:
                raise InvariantViolation(f"node {name}: pod slots misaccounted")
            if node.draining and node.jobs:
                raise InvariantViolation(f"node {name} is draining but runs {len(node.jobs)} job(s)")
            if (node.empty_since is None) == (not node.jobs):
                raise InvariantViolation(
                    f"node {name}: empty_since {node.empty_since} with {len(node.jobs)} jobs"
                )
        if located != len(self.location) or len(self.started) != len(self.location):
            raise InvariantViolation("a running job is located on no node, or on two")
        for pool in self.pools:
            if per_pool.get(pool.name, 0) + self.nodes_left(pool) != pool.size:
                raise InvariantViolation(f"pool {pool.name}: provisioned + unused != {pool.size}")
