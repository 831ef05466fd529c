#!/usr/bin/env python3
"""Start-up benchmark: how long the offline commands take, whole, as a user runs them.

Each command runs as a subprocess, `--repeat` times; the table shows the median wall time and the
median CPU time of the child (user + system, from wait4), so that a machine shared with other work
shows in the gap between them. The commands:

- `rebalancer --help` and `rebalancer validate` on the demo policy (imports and argument parsing);
- `make demo`'s command, `rebalancer once --snapshot examples/demo-cluster` with its policy: the demo
  carries `telemetry-windows.json`, and the same directory without it (raw history only) is timed too;
- with `--nodes N` (the scale benchmark's synthetic cluster, bench/scale_population.py's, written under
  bench/out/ if missing): `once --snapshot` on it with aggregates (written by `rebalancer aggregate`
  once, not timed), and with `--raw` also on its raw history alone and `rebalancer aggregate` on it (a
  copy of its own, which each run writes `telemetry-windows.json` into).

`--baseline DIR` runs the same commands against another checkout of the project (e.g. `git archive
main | tar -x -C DIR`), in the same run, each run of this tree followed by one of the baseline, so before
and after share the machine's load; the baseline reads the same snapshot directories (an older checkout
ignores `telemetry-windows.json`, or lists it as not read), and the table says whether both wrote the
same output (standard output, byte for byte). Both trees are byte-compiled first, as an installed
package is.

    python bench/startup.py [--repeat 7] [--nodes 5000] [--raw] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import compileall
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from bench import scale, scale_population  # noqa: E402
from bench.timed_run import run_timed  # noqa: E402

DEMO = ROOT / "examples" / "demo-cluster"
DEMO_POLICY = DEMO / "policy.yaml"
AGGREGATES = "telemetry-windows.json"
# The goals of issue 16's "start fast" (bench/README.md).
GOALS = {
    "--help": 0.3,
    "once --snapshot demo": 1.5,
    "once --snapshot 5,000 nodes, aggregates": 5.0,
    "once --snapshot 5,000 nodes, raw history": 30.0,
}


@dataclass(frozen=True)
class Timing:
    wall: float
    cpu: float
    output: str = ""  # a digest of what the command wrote to standard output


def run(root: Path, argv: Sequence[str]) -> Timing:
    """`python -m rebalancer ARGV` with `root` first on the path: wall, the child's CPU seconds and a
    digest of its standard output."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = run_timed(
        [sys.executable, "-m", "rebalancer", *argv],
        cwd=root,
        env=env,
        what=f"{' '.join(argv)} in {root}",
        error_tail=2000,
    )
    return Timing(done.wall, done.cpu, hashlib.sha256(done.stdout).hexdigest())


def byte_compile(root: Path) -> None:
    """The checkout's packages compiled to bytecode, as an installed package is, so that no tree is timed
    compiling its modules (which a fresh checkout, or an environment that sets PYTHONDONTWRITEBYTECODE,
    would do on every run: about 0.06 s of the demo's 0.3 s)."""
    for package in ("rebalancer", "strategies"):
        if (root / package).is_dir() and not compileall.compile_dir(root / package, quiet=1):
            print(f"{root / package}: not byte-compiled: its runs include compiling it", file=sys.stderr)


def median(timings: Sequence[Timing]) -> Timing:
    return Timing(statistics.median(t.wall for t in timings), statistics.median(t.cpu for t in timings))


def raw_copy(source: Path, target: Path) -> Path:
    if not target.exists():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns(AGGREGATES))
    return target


def scale_dir(nodes: int) -> Path:
    """bench/scale.py's cluster of `nodes` nodes, with its aggregates for the scale policy."""
    directory = scale.OUT / f"scale-{nodes}-seed1"
    scale_population.generate(directory, nodes, 1, 180, 3600)
    if not (directory / AGGREGATES).exists():
        started = time.perf_counter()
        run(ROOT, ["aggregate", "--snapshot", str(directory), "--policy", str(scale.POLICY)])
        print(f"{directory}: aggregated in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return directory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time the offline commands from start to exit.")
    parser.add_argument("--repeat", type=int, default=7, help="runs per command; the table shows medians")
    parser.add_argument("--nodes", type=int, help="also time bench/scale.py's cluster of this many nodes")
    parser.add_argument("--raw", action="store_true", help="with --nodes: also time its raw history alone")
    parser.add_argument("--baseline", type=Path, help="another checkout to time the same commands with")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="startup-bench-"))
    try:
        commands: list[tuple[str, list[str]]] = [
            ("--help", ["--help"]),
            ("validate", ["validate", str(DEMO_POLICY)]),
            ("once --snapshot demo", ["once", "--snapshot", str(DEMO), "--policy", str(DEMO_POLICY)]),
            (
                "once --snapshot demo, raw history only",
                ["once", "--snapshot", str(raw_copy(DEMO, work / "demo-raw")), "--policy", str(DEMO_POLICY)],
            ),
        ]
        if args.nodes:
            directory = scale_dir(args.nodes)
            once = ["once", "--snapshot", str(directory), "--policy", str(scale.POLICY), "--output", "json"]
            commands.append((f"once --snapshot {args.nodes:,} nodes, aggregates", once))
            if args.raw:
                raw = raw_copy(directory, work / "scale-raw")
                commands.append(
                    (
                        f"once --snapshot {args.nodes:,} nodes, raw history",
                        ["once", "--snapshot", str(raw), "--policy", str(scale.POLICY), "--output", "json"],
                    )
                )
                target = raw_copy(directory, work / "scale-aggregate")
                commands.append(
                    (
                        f"aggregate {args.nodes:,} nodes",
                        ["aggregate", "--snapshot", str(target), "--policy", str(scale.POLICY)],
                    )
                )
        roots = [("this tree", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
        for _name, root in roots:
            byte_compile(root)
        rows: list[list[str]] = []
        ok = True
        for label, command in commands:
            cells = [label]
            timings: dict[Path, list[Timing]] = {root: [] for _, root in roots}
            for _ in range(args.repeat):  # alternated, so that before and after share the load
                for _name, root in roots:
                    timings[root].append(run(root, command))
            for _name, root in roots:
                result = median(timings[root])
                cells.append(f"{result.wall:.2f} s wall, {result.cpu:.2f} s CPU")
                if root == ROOT:
                    goal = GOALS.get(label.replace(f"{args.nodes or 0:,} nodes", "5,000 nodes"))
                    # On a machine shared with other work the CPU time is the honest measure.
                    met = goal is None or result.cpu <= goal
                    ok = ok and met
                    cells.append("" if goal is None else f"<= {goal} s: {'met' if met else 'MISSED'}")
            if len(roots) > 1:
                outputs = {t.output for runs in timings.values() for t in runs}
                cells.append("same" if len(outputs) == 1 else "differs")
            rows.append(cells)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    headers = ["command", *(f"{name} (median of {args.repeat})" for name, _ in roots)]
    headers.insert(2, "goal")
    if len(roots) > 1:
        headers.append("output")
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
