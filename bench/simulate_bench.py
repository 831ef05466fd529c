"""Consolidation-quality and speed benchmark of `rebalancer simulate` on the Alibaba v2023 GPU trace.

Runs the table of bench/README.md: for each scenario (pod list, replicas, compression) and seed, the
configurations packed/off, spread/off, packed/on (the shipped default policy, or `--policy`) and
packed/descheduler-hnu, one after the other in this process (so `wall_seconds` is one replay on one
core), and prints a markdown table plus, with `--json`, one JSON object per run. The goals it reports
against are in bench/README.md; nothing here is a pass/fail test. Wall time is measured here, at the
edge, around `run_simulation`.

    .venv/bin/python bench/simulate_bench.py                      # the full table, seed 1
    .venv/bin/python bench/simulate_bench.py --scenario gpuspec33 --mode packed/on --seed 1 --seed 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rebalancer.simulate import (
    SimulationInputError,
    SimulationOptions,
    SimulationResult,
    result_to_dict,
    run_simulation,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "alibaba-gpu-v2023" / "csv"
NODES = "openb_node_list_gpu_node.csv"


@dataclass(frozen=True)
class Scenario:
    name: str
    pods: str
    replicas: int = 10
    compress: float = 1.0


SCENARIOS = (
    Scenario("gpuspec33", "openb_pod_list_gpuspec33.csv"),
    Scenario("default", "openb_pod_list_default.csv"),
    Scenario("gpuspec33-compress10", "openb_pod_list_gpuspec33.csv", compress=10.0),
    Scenario("default-compress10", "openb_pod_list_default.csv", compress=10.0),
)
MODES = ("packed/off", "spread/off", "packed/on", "packed/descheduler-hnu")


def run(
    data: Path, scenario: Scenario, seed: int, mode: str, *, policy: Path | None, interval: float
) -> SimulationResult:
    scheduler, rebalancer = mode.split("/", 1)
    options = SimulationOptions(
        nodes=data / NODES,
        pods=data / scenario.pods,
        replicas=scenario.replicas,
        seed=seed,
        compress=scenario.compress,
        scheduler=scheduler,  # type: ignore[arg-type]
        rebalancer=rebalancer,  # type: ignore[arg-type]
        policy=policy if rebalancer == "on" else None,
        interval=interval,
    )
    started = time.perf_counter()
    result = run_simulation(options)
    return replace(result, wall_seconds=time.perf_counter() - started)


def row(scenario: Scenario, seed: int, mode: str, result: SimulationResult) -> str:
    ratio = f"{result.ratio:.3f}" if result.ratio is not None else "-"
    misplaced = f"{result.misplaced_evictions / result.evictions:.1%}" if result.evictions else "-"
    return (
        f"| {scenario.name} | {seed} | {mode} | {result.node_hours:,.0f} | "
        f"{result.lower_bound_node_hours:,.0f} | {ratio} | {result.evictions_per_pod:.3f} | "
        f"{result.max_evictions_per_pod} | {misplaced} | {result.lost_gpu_hours:,.0f} | "
        f"{result.pending_pod_hours:,.1f} | {result.wall_seconds or 0:.1f} |"
    )


HEADER = (
    "| scenario | seed | scheduler/rebalancer | node_hours | lower bound | ratio | evictions_per_pod | "
    "max evictions | misplaced | lost_gpu_hours | pending_pod_hours | wall_seconds |\n"
    "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of the v2023 trace CSVs")
    parser.add_argument("--scenario", action="append", choices=[s.name for s in SCENARIOS])
    parser.add_argument("--mode", action="append", choices=MODES)
    parser.add_argument("--seed", type=int, action="append", help="seed of the copies' shifts (default 1)")
    parser.add_argument(
        "--policy", type=Path, help="policy for packed/on (default: the shipped default policy)"
    )
    parser.add_argument("--interval", type=float, default=300.0, help="seconds between rebalancer cycles")
    parser.add_argument("--json", type=Path, help="also write one JSON object per run to this file")
    args = parser.parse_args(argv)

    scenarios = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]
    modes = [m for m in MODES if not args.mode or m in args.mode]
    print(HEADER, flush=True)
    records = []
    for scenario in scenarios:
        for seed in args.seed or [1]:
            for mode in modes:
                try:
                    result = run(args.data, scenario, seed, mode, policy=args.policy, interval=args.interval)
                except SimulationInputError as exc:
                    for problem in exc.problems:
                        print(f"simulate_bench: {problem}", file=sys.stderr)
                    return 2
                print(row(scenario, seed, mode, result), flush=True)
                records.append({"scenario": scenario.name, "mode": mode, **result_to_dict(result)})
    if args.json is not None:
        args.json.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
