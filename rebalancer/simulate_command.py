"""The flags of `rebalancer simulate` and their translation into `SimulationOptions`.

Owns the command-line surface of the replay (names, defaults, help) so that `rebalancer.cli` only has
to mount it: `add_arguments(parser)` declares the flags, `options_from_args(namespace)` validates them
into `SimulationOptions` (SimulationInputError with one line per problem otherwise). It must not run
the replay, print or read the clock: the CLI times `run_simulation` and renders the result. It sits
outside the `rebalancer.simulate` package and imports it only when the options are built, so that
declaring the flags (`rebalancer --help`) loads none of the simulator.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rebalancer.durations import parse_duration

if TYPE_CHECKING:
    from rebalancer.simulate import SimulationOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the flags of `rebalancer simulate` on a (sub)parser."""
    parser.add_argument(
        "--nodes", required=True, metavar="NODES.csv", help="node list (sn,cpu_milli,...,model)"
    )
    parser.add_argument(
        "--pods", required=True, metavar="PODS.csv", help="pod list of the v2023 trace format"
    )
    parser.add_argument(
        "--replicas", type=int, default=1, metavar="K", help="superpose K copies of the pod list (default 1)"
    )
    parser.add_argument(
        "--seed", type=int, default=1, metavar="S", help="seed of the copies' time shifts (default 1)"
    )
    parser.add_argument(
        "--compress",
        type=float,
        default=1.0,
        metavar="C",
        help="divide inter-arrival times by C, keeping durations (default 1)",
    )
    parser.add_argument(
        "--policy",
        metavar="FILE",
        help="policy for --rebalancer on (default: the shipped default policy, policies/default.yaml)",
    )
    parser.add_argument(
        "--scheduler",
        choices=("packed", "spread"),
        default="packed",
        help="scheduler model: packed = MostAllocated on GPUs, spread = LeastAllocated",
    )
    parser.add_argument(
        "--rebalancer",
        choices=("on", "off", "descheduler-hnu"),
        default="off",
        help="on: the strategies and planner; descheduler-hnu: the descheduler's HighNodeUtilization; "
        "off: none",
    )
    parser.add_argument(
        "--interval", default="5m", metavar="DURATION", help="simulated time between rebalancer cycles"
    )
    parser.add_argument(
        "--prices", metavar="FILE", help="YAML/JSON: GPU model -> price per GPU-hour (adds a cost)"
    )
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text", help="report format")


def options_from_args(args: argparse.Namespace) -> SimulationOptions:
    """The options the parsed flags ask for; SimulationInputError for a bad `--interval`."""
    from rebalancer.simulate import SimulationInputError, SimulationOptions

    try:
        interval = parse_duration(args.interval)
    except ValueError as exc:
        raise SimulationInputError([f"--interval: {exc}"]) from None
    return SimulationOptions(
        nodes=Path(args.nodes),
        pods=Path(args.pods),
        replicas=args.replicas,
        seed=args.seed,
        compress=args.compress,
        policy=Path(args.policy) if args.policy else None,
        scheduler=args.scheduler,
        rebalancer=args.rebalancer,
        interval=float(interval),
        prices=Path(args.prices) if args.prices else None,
    )
