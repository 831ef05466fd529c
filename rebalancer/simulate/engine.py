"""The replay's event loop: simulated time, pending queue, autoscaler, rebalancer ticks and metrics.

Owns when things happen and what they cost. Events, in time order; at one instant, in this order:

1. completions: a job whose trace end time has come leaves its node, or the pending queue;
2. arrivals: new jobs join the pending queue;
3. scale-down: a node empty for `scale_down_after` (10 minutes) is removed, and its pool can give it
   again;
4. a scheduling pass (when anything joined the queue or capacity was freed): pending jobs, largest GPU
   request first (then larger cpu, then name), each go to the node the scheduler model picks;
   a job that fits nowhere makes the autoscaler add a node from the pool `SimCluster.pool_for` picks
   (ready at once); a job with no pool left stays pending;
5. a rebalancer tick, every `interval` after the window start: the nodes it drains are tainted (the
   scheduler model skips them), its evictions send jobs back to pending (keeping their end time), and a
   scheduling pass re-places them right away, in eviction order after anything that was already waiting
   (kube-scheduler's queue: equal priorities, first in, first out); when an evicted job finds no room,
   the drain is abandoned (taints removed) and the pass runs again.

Metrics are accounted when spells end (a node's life, a job's run, a job's wait) and cut at the window
end: node-hours, GPU-hours provisioned and used, pending pod-hours, evictions and `lost_gpu_hours`
(per eviction, the evicted job's GPUs times the time since it last started), and the evicted jobs that
landed elsewhere than predicted (`misplaced_evictions`; `equivalent_evictions` of them on a node the
planner found tied with the predicted one). The lower bound is
`bound.lower_bound_node_hours` over the same jobs.

It must not read the clock (simulated seconds only), parse files or print: `run_simulation` in the
package does the I/O and the caller measures wall time.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rebalancer.model import MILLI_PER_GPU
from rebalancer.placement import ClusterState
from rebalancer.policy import LoadedPolicy
from rebalancer.simulate.bound import SECONDS_PER_HOUR, lower_bound_node_hours
from rebalancer.simulate.cluster import (
    InvariantViolation,
    SchedulerModel,
    SimCluster,
    SimNode,
    template_holds,
)
from rebalancer.simulate.rebalancers import (
    PACKED_SCHEDULER,
    SPREAD_SCHEDULER,
    Eviction,
    HighNodeUtilization,
    PolicyRebalancer,
    Rebalancer,
    SnapshotBuilder,
    default_policy,
    replay_policy,
)
from rebalancer.simulate.result import SimulationResult
from rebalancer.simulate.trace import Job, TraceNode, Window

RebalancerMode = Literal["on", "off", "descheduler-hnu"]
SCALE_DOWN_AFTER = 600.0
DEFAULT_INTERVAL = 300.0

_ModelsKey = frozenset[str] | None


@dataclass(frozen=True)
class EngineConfig:
    scheduler: SchedulerModel = "packed"
    rebalancer: RebalancerMode = "off"
    interval: float = DEFAULT_INTERVAL
    scale_down_after: float = SCALE_DOWN_AFTER
    policy: LoadedPolicy | None = None  # `on` only; None = `default_policy()`
    prices: Mapping[str, float] = field(default_factory=dict)  # per GPU-hour, per model
    check_invariants: bool = False
    # Copied into the result, for the record.
    replicas: int = 1
    seed: int = 1
    compress: float = 1.0


def _pass_order(job: Job) -> tuple[int, int, str, int]:
    """Largest GPU request first, then larger cpu, then by name: the order waiting pods are tried in
    (pods a tick just evicted come after them, in eviction order: `Replay._schedule`)."""
    return (-job.gpu_demand_milli, -job.cpu_milli, job.name, job.index)


def _failure_key(job: Job) -> tuple[_ModelsKey, int, int, int, int]:
    return (job.models, job.num_gpu, job.gpu_milli, job.cpu_milli, job.memory_mib)


class Replay:
    """One replay of `jobs` (sorted by arrival, `jobs[i].index == i`) over `window`."""

    def __init__(
        self, trace_nodes: Sequence[TraceNode], jobs: Sequence[Job], window: Window, config: EngineConfig
    ) -> None:
        if config.interval <= 0:
            raise ValueError("interval must be positive")
        if any(job.index != position for position, job in enumerate(jobs)):
            raise ValueError("jobs must be indexed by their position")
        self.config = config
        self.window = window
        self.cluster = SimCluster(trace_nodes, config.scheduler)
        self.jobs = jobs
        templates = [template for pool in self.cluster.pools for template in pool.templates]
        holds: dict[tuple[_ModelsKey, int, int, int], bool] = {}
        runnable: list[Job] = []
        for job in jobs:
            shape = (job.models, job.num_gpu, job.cpu_milli, job.memory_mib)
            if shape not in holds:
                holds[shape] = any(template_holds(template, job) for template in templates)
            if holds[shape]:
                runnable.append(job)
        self.runnable = runnable
        self.unplaceable = len(self.jobs) - len(self.runnable)
        scheduler_name = PACKED_SCHEDULER if config.scheduler == "packed" else SPREAD_SCHEDULER
        self.builder = SnapshotBuilder(jobs, scheduler_name)
        self.policy_rebalancer: PolicyRebalancer | None = None
        self.hnu: HighNodeUtilization | None = None
        self.rebalancer: Rebalancer | None = None
        self.policy_source: str | None = None
        self.policy_notes: tuple[str, ...] = ()
        if config.rebalancer == "on":
            loaded, self.policy_notes = replay_policy(config.policy or default_policy())
            self.policy_source = loaded.source
            self.policy_rebalancer = PolicyRebalancer(loaded, self.builder)
            self.rebalancer = self.policy_rebalancer
        elif config.rebalancer == "descheduler-hnu":
            self.hnu = HighNodeUtilization(jobs)
            self.rebalancer = self.hnu
        elif config.rebalancer != "off":
            raise ValueError(f"unknown rebalancer mode {config.rebalancer!r}")

        self.now = window.start
        self.pending: dict[int, Job] = {}
        self.pending_since: dict[int, float] = {}
        self.fresh: set[int] = set()  # pending jobs not tried since they became pending
        self.freed: set[str] = set()  # GPU models whose capacity grew since the last pass
        self.scale_down: list[tuple[float, int, str, float]] = []  # (check at, seq, node, empty since)
        self._seq = 0
        # Metrics (seconds, milli-GPU-seconds).
        self.node_seconds = 0.0
        self.gpu_seconds_by_model: dict[str, float] = {}
        self.node_seconds_by_pool: dict[str, float] = {}
        self.used_milli_seconds = 0.0
        self.pending_seconds = 0.0
        self.lost_milli_seconds = 0.0
        self.evictions = [0] * len(jobs)
        self.misplaced = 0
        self.equivalent = 0  # misplaced, but on a node the planner found tied with the predicted one
        self.nodes_added = 0
        self.nodes_removed = 0
        self.peak_nodes = 0
        self.cycles = 0

    # ----------------------------------------------------------------------- the loop

    def run(self) -> SimulationResult:
        window, interval = self.window, self.config.interval
        arrivals = sorted(self.runnable, key=lambda job: (job.arrival, job.index))
        ends = sorted(self.runnable, key=lambda job: (job.end, job.index))
        next_arrival = next_end = 0
        tick = window.start + interval
        infinity = float("inf")
        while True:
            moment = min(
                arrivals[next_arrival].arrival if next_arrival < len(arrivals) else infinity,
                ends[next_end].end if next_end < len(ends) else infinity,
                tick,
                self.scale_down[0][0] if self.scale_down else infinity,
            )
            if moment >= window.end:
                break
            self.now = moment
            while next_end < len(ends) and ends[next_end].end <= moment:
                self._complete(ends[next_end])
                next_end += 1
            while next_arrival < len(arrivals) and arrivals[next_arrival].arrival <= moment:
                self._enqueue(arrivals[next_arrival])
                next_arrival += 1
            self._scale_down()
            self._schedule()
            if tick <= moment:
                self._tick()
                tick += interval
            if self.config.check_invariants:
                self.check_invariants()
        return self._finish()

    # ----------------------------------------------------------------------- events

    def _complete(self, job: Job) -> None:
        if job.index in self.cluster.location:
            self._stop(job)
        elif job.index in self.pending:
            self._leave_queue(job)
            self.fresh.discard(job.index)
        self.builder.forget(job)

    def _enqueue(self, job: Job) -> None:
        self.pending[job.index] = job
        self.pending_since[job.index] = self.now
        self.fresh.add(job.index)

    def _leave_queue(self, job: Job) -> None:
        del self.pending[job.index]
        self.pending_seconds += self.now - self.pending_since.pop(job.index)

    def _stop(self, job: Job) -> SimNode:
        """Take a running job off its node, accounting its run."""
        started = self.cluster.started[job.index]
        node = self.cluster.remove(job, self.now)
        self.used_milli_seconds += (self.now - started) * job.gpu_demand_milli
        self.freed.add(node.model)
        if not node.jobs:
            self._seq += 1
            heapq.heappush(
                self.scale_down, (self.now + self.config.scale_down_after, self._seq, node.name, self.now)
            )
        return node

    def _schedule(self, evicted: Sequence[int] = ()) -> None:
        """Place what is pending and may fit now; the autoscaler adds nodes for what fits nowhere.

        The pods just `evicted` (in eviction order) come last and first in, first out, as their
        replacements reach kube-scheduler's queue (equal priorities: oldest first); the others waited
        longer and go first, largest GPU request first.
        """
        if not self.pending or not (self.fresh or self.freed):
            self.freed.clear()
            return
        freed = self.freed
        queued = set(evicted)
        candidates = [
            job
            for job in self.pending.values()
            if job.index not in queued
            and (
                job.index in self.fresh
                or (freed and (job.models is None or not job.models.isdisjoint(freed)))
            )
        ]
        self.fresh = set()
        self.freed = set()
        candidates.sort(key=_pass_order)
        candidates.extend(self.pending[index] for index in evicted if index in self.pending)
        failed: set[tuple[_ModelsKey, int, int, int, int]] = set()
        cluster = self.cluster
        for job in candidates:
            key = _failure_key(job)
            if key in failed:
                continue
            node = cluster.best_node(job)
            if node is None:
                pool = cluster.pool_for(job)
                if pool is None:
                    failed.add(key)
                    continue
                node = cluster.add_node(pool, self.now)
                self.nodes_added += 1
                self.peak_nodes = max(self.peak_nodes, len(cluster.nodes))
            self._leave_queue(job)
            cluster.place(job, node, self.now)

    def _tick(self) -> None:
        if self.rebalancer is None:
            return
        self.cycles += 1
        plan = self.rebalancer.plan(self.now, self.cluster)
        if not plan.evictions:
            return
        cluster = self.cluster
        drained = [cluster.nodes[name] for name in plan.drain if name in cluster.nodes]
        for node in drained:
            node.draining = True
        evicted: list[int] = []
        targets: dict[int, Eviction] = {}
        for eviction in plan.evictions:
            job = self.jobs[eviction.job]
            if job.index not in cluster.location:
                continue
            self.lost_milli_seconds += (self.now - cluster.started[job.index]) * job.gpu_demand_milli
            self.evictions[job.index] += 1
            self._stop(job)
            self._enqueue(job)
            evicted.append(job.index)
            if eviction.target is not None:
                targets[job.index] = eviction
        self._schedule(evicted)
        if drained and any(index in self.pending for index in evicted):
            # Some evicted pod found no room elsewhere: the drain is abandoned, the taints come off.
            for node in drained:
                node.draining = False
                self.freed.add(node.model)
            self._schedule(evicted)
        for index, eviction in targets.items():
            landed = cluster.location.get(index)
            if landed is None or landed.name != eviction.target:
                self.misplaced += 1
                if landed is not None and landed.name in eviction.tied:
                    self.equivalent += 1

    def _scale_down(self) -> None:
        heap = self.scale_down
        while heap and heap[0][0] <= self.now:
            _, _, name, empty_since = heapq.heappop(heap)
            node = self.cluster.nodes.get(name)
            if node is None or node.jobs or node.empty_since != empty_since:
                continue
            self._retire(node, self.now)
            self.cluster.remove_node(node)
            self.nodes_removed += 1
            self.freed.add(node.model)  # the pool has a node to give again

    def _retire(self, node: SimNode, until: float) -> None:
        lived = until - node.created
        self.node_seconds += lived
        self.node_seconds_by_pool[node.pool.name] = self.node_seconds_by_pool.get(node.pool.name, 0.0) + lived
        self.gpu_seconds_by_model[node.model] = (
            self.gpu_seconds_by_model.get(node.model, 0.0) + lived * node.gpus
        )

    # ----------------------------------------------------------------------- the end

    def _finish(self) -> SimulationResult:
        end = self.window.end
        self.now = end
        for node in self.cluster.nodes.values():
            self._retire(node, end)
        for index, started in self.cluster.started.items():
            self.used_milli_seconds += (end - started) * self.jobs[index].gpu_demand_milli
        for since in self.pending_since.values():
            self.pending_seconds += end - since
        hour = SECONDS_PER_HOUR
        milli_hour = hour * MILLI_PER_GPU
        gpu_hours_by_model = {model: seconds / hour for model, seconds in self.gpu_seconds_by_model.items()}
        prices = self.config.prices
        cost = (
            sum(hours * prices.get(model, 0.0) for model, hours in gpu_hours_by_model.items())
            if prices
            else None
        )
        policy = self.policy_rebalancer
        return SimulationResult(
            scheduler=self.config.scheduler,
            rebalancer=self.config.rebalancer,
            replicas=self.config.replicas,
            seed=self.config.seed,
            compress=self.config.compress,
            interval_seconds=self.config.interval,
            window_start=self.window.start,
            window_end=self.window.end,
            node_hours=self.node_seconds / hour,
            lower_bound_node_hours=lower_bound_node_hours(self.runnable, self.cluster.pools, self.window),
            gpu_hours_provisioned=sum(gpu_hours_by_model.values()),
            gpu_hours_used=self.used_milli_seconds / milli_hour,
            pods=len(self.runnable),
            evictions=sum(self.evictions),
            max_evictions_per_pod=max(self.evictions, default=0),
            lost_gpu_hours=self.lost_milli_seconds / milli_hour,
            pending_pod_hours=self.pending_seconds / hour,
            rebalancer_cycles=self.cycles,
            approved_proposals=policy.approved if policy is not None else 0,
            refused_proposals=dict(policy.refused) if policy is not None else {},
            skipped_strategies=dict(policy.skipped) if policy is not None else {},
            policy=self.policy_source,
            policy_notes=self.policy_notes,
            misplaced_evictions=self.misplaced,
            equivalent_evictions=self.equivalent,
            nodes_added=self.nodes_added,
            nodes_removed=self.nodes_removed,
            peak_nodes=self.peak_nodes,
            unplaceable_pods=self.unplaceable,
            pending_at_end=len(self.pending),
            gpu_hours_by_model=gpu_hours_by_model,
            node_hours_by_pool={pool: seconds / hour for pool, seconds in self.node_seconds_by_pool.items()},
            cost=cost,
        )

    # ----------------------------------------------------------------------- checks

    def check_invariants(self) -> None:
        """Every rule of the replay, checked from scratch (slow: for tests).

        The cluster's own accounting; running jobs inside their lifetime and never pending; no pending
        job that fits a node or could get one; and the core's `ClusterState`, built from a Snapshot of
        the simulated state, finds no overcommitted resource or GPU device.
        """
        cluster, now = self.cluster, self.now
        cluster.check_invariants(self.jobs)
        for index in cluster.location:
            job = self.jobs[index]
            if not job.arrival <= now < job.end:
                raise InvariantViolation(f"job {job.name} runs at {now} outside [{job.arrival}, {job.end})")
            if index in self.pending:
                raise InvariantViolation(f"job {job.name} both runs and is pending")
        for job in self.pending.values():
            if not job.arrival <= now < job.end:
                raise InvariantViolation(
                    f"job {job.name} pending at {now} outside [{job.arrival}, {job.end})"
                )
            if cluster.best_node(job) is not None or cluster.pool_for(job) is not None:
                raise InvariantViolation(f"job {job.name} is pending but could be placed")
        if len(cluster.nodes) > self.peak_nodes:
            raise InvariantViolation("peak_nodes missed a peak")
        state = ClusterState.from_snapshot(self.builder.snapshot(now, cluster))
        for name, node in cluster.nodes.items():
            free = state.free(name)
            if any(amount < 0 for amount in free.values()):
                raise InvariantViolation(f"placement finds node {name} overcommitted: {free}")
            if sum(state.gpu_free_milli(name)) != sum(node.devices):
                raise InvariantViolation(f"node {name}: placement counts other free GPU milli")


def simulate(
    trace_nodes: Sequence[TraceNode], jobs: Sequence[Job], window: Window, config: EngineConfig
) -> SimulationResult:
    """Replay `jobs` on pools made of `trace_nodes` and report the metrics."""
    return Replay(trace_nodes, jobs, window, config).run()
