"""Trace replay (`rebalancer simulate`): what would a policy save on a real GPU cluster trace?

The package replays the Alibaba cluster-trace-gpu-v2023 CSV format through a scheduler model, an
autoscaler model and the real strategies and planner, and reports node-hours against a lower bound.

- `trace`: CSV parsing and load scaling (replicas, seeded shifts, compression) into `Job`s;
- `cluster`: node pools, provisioned nodes, the packed / spread scheduler models, the autoscaler's pick;
- `rebalancers`: the real rebalancer on a Snapshot of the simulated state, and the descheduler baseline;
- `bound`: the lower bound on node-hours;
- `engine`: the event loop and the metrics;
- `result`: the result value, its JSON keys and text rendering.

This module is the entry point: `run_simulation(options)` reads the files named in `SimulationOptions`
and runs the replay; bad input raises `SimulationInputError` with one line per problem. Nothing in the
package reads the clock: the caller (CLI, benchmark) measures `wall_seconds` around `run_simulation`
and sets it on the result with `dataclasses.replace`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from rebalancer.errors import InputError
from rebalancer.policy import LoadedPolicy, PolicyError, load_policy
from rebalancer.price_files import read_price_file
from rebalancer.simulate.cluster import SchedulerModel
from rebalancer.simulate.engine import DEFAULT_INTERVAL, EngineConfig, RebalancerMode, simulate
from rebalancer.simulate.rebalancers import default_policy, replay_policy
from rebalancer.simulate.result import (
    ResultFormat,
    SimulationResult,
    render,
    render_text,
    result_to_dict,
)
from rebalancer.simulate.trace import TraceError, build_jobs, load_nodes, load_pods

__all__ = [
    "ResultFormat",
    "SimulationInputError",
    "SimulationOptions",
    "SimulationResult",
    "default_policy",
    "load_prices",
    "render",
    "render_text",
    "replay_policy",
    "result_to_dict",
    "run_simulation",
]


class SimulationInputError(InputError):
    """Input the operator must fix (files, flags, policy); `problems` has one line per problem."""


@dataclass(frozen=True)
class SimulationOptions:
    """Everything `rebalancer simulate` takes; `interval` in seconds."""

    nodes: Path
    pods: Path
    replicas: int = 1
    seed: int = 1
    compress: float = 1.0
    policy: Path | None = None
    scheduler: SchedulerModel = "packed"
    rebalancer: RebalancerMode = "off"
    interval: float = DEFAULT_INTERVAL
    prices: Path | None = None
    check_invariants: bool = False


def load_prices(path: str | Path) -> dict[str, float]:
    """`--prices FILE` (`price_files`, as `waste` reads it): GPU model (the node CSV's `model`) -> price
    per GPU-hour. Raises SimulationInputError naming the file, line and model of every problem."""
    try:
        return {price.model: price.per_gpu_hour for price in read_price_file(path)}
    except InputError as exc:
        raise SimulationInputError(exc.problems) from None


def _check(options: SimulationOptions) -> list[str]:
    problems: list[str] = []
    if options.replicas < 1:
        problems.append(f"--replicas must be at least 1, got {options.replicas}")
    if not math.isfinite(options.compress) or options.compress <= 0:
        problems.append(f"--compress must be a positive number, got {options.compress}")
    if not math.isfinite(options.interval) or options.interval <= 0:
        problems.append(f"--interval must be a positive duration, got {options.interval}s")
    if options.scheduler not in ("packed", "spread"):
        problems.append(f"--scheduler must be packed or spread, got {options.scheduler!r}")
    if options.rebalancer not in ("on", "off", "descheduler-hnu"):
        problems.append(f"--rebalancer must be on, off or descheduler-hnu, got {options.rebalancer!r}")
    if options.policy is not None and options.rebalancer != "on":
        problems.append("--policy is only used with --rebalancer on")
    return problems


def run_simulation(options: SimulationOptions) -> SimulationResult:
    """Read the trace, policy and prices named in `options` and replay the trace.

    Raises SimulationInputError (never a traceback) for anything the operator must fix.
    """
    problems = _check(options)
    if problems:
        raise SimulationInputError(problems)
    loaded: LoadedPolicy | None = None
    if options.policy is not None:
        try:
            loaded = load_policy(options.policy)
        except PolicyError as exc:
            raise SimulationInputError(exc.problems) from None
    prices = load_prices(options.prices) if options.prices is not None else {}
    try:
        nodes = load_nodes(options.nodes)
        trace = load_pods(options.pods)
        if not trace.has_times:
            raise TraceError(
                [
                    f"{options.pods}: no scheduled_time / deletion_time columns (like the multigpu* files): "
                    "a pod list without times cannot be replayed"
                ]
            )
        window, jobs = build_jobs(
            trace.pods, replicas=options.replicas, seed=options.seed, compress=options.compress
        )
    except TraceError as exc:
        raise SimulationInputError(exc.problems) from None
    config = EngineConfig(
        scheduler=options.scheduler,
        rebalancer=options.rebalancer,
        interval=options.interval,
        policy=loaded,
        prices=prices,
        check_invariants=options.check_invariants,
        replicas=options.replicas,
        seed=options.seed,
        compress=options.compress,
    )
    return simulate(nodes, jobs, window, config)
