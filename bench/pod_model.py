#!/usr/bin/env python3
"""Per-pod cost of the pod model: decoded kubectl pod dicts -> `rebalancer.model.Pod`.

    .venv/bin/python bench/pod_model.py [--pods FILE] [--count N] [--repeat R]

Reads a `kubectl get pods -A -o json` file (default: the demo cluster's pods.json; a bench/scale.py
snapshot's pods.json works too), repeats its items up to N pods, and times `pod_from_json` over all
of them R times. Prints the median wall and CPU microseconds per pod. Decoding the file is outside
the measurement: this is the model's own cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rebalancer.policy import GangConfig, GpuSharingConfig  # noqa: E402
from rebalancer.sources.kube_objects import pod_from_json  # noqa: E402

DEMO_PODS = ROOT / "examples" / "demo-cluster" / "pods.json"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=Path, default=DEMO_PODS, help="a kubectl pod List in JSON")
    parser.add_argument("--count", type=int, default=20000, help="pods per run (items repeated)")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the medians are printed")
    args = parser.parse_args(argv)
    items = json.loads(args.pods.read_bytes())["items"]
    if not items:
        print(f"{args.pods}: no pods in items", file=sys.stderr)
        return 1
    pods = (items * (args.count // len(items) + 1))[: args.count]
    gangs, sharing = GangConfig(), GpuSharingConfig()
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(args.repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        for pod in pods:
            pod_from_json(pod, gangs=gangs, sharing=sharing)
        walls.append((time.perf_counter() - wall) / len(pods) * 1e6)
        cpus.append((time.process_time() - cpu) / len(pods) * 1e6)
    print(
        f"{len(pods)} pods x {args.repeat} runs: median {statistics.median(walls):.1f} us wall, "
        f"{statistics.median(cpus):.1f} us CPU a pod"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
