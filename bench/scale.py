#!/usr/bin/env python3
"""Scale benchmark: synthetic GPU clusters as snapshot directories, timed through `rebalancer once`.

This script is the benchmark's entry point and owns the timing and the report. The synthetic cluster
(how many nodes of each GPU model, how full, which workloads, where they land) and the snapshot
directory it is written as are bench/scale_population.py's, which says what the directory holds; the
Kubernetes objects and DCGM series are written by tools/clustergen. For each size asked for, it has the
snapshot directory written under `bench/out/` (`--history` seconds of DCGM samples every
`--sample-interval` seconds, everything derived from `--seed`; a directory written by the same arguments
is reused) and times it. This script must not shape the cluster: whatever changes what is written
belongs to bench/scale_population.py, whose source keys the reuse of a written directory.

Then, per size, `--repeat` times: the whole command as a subprocess (wall time and the child's peak RSS
from wait4) and the same cycle in-process through the project's public functions, phase by phase:
snapshot load (`load_snapshot_dir`; of it, the cluster objects, the telemetry parse and the window
aggregation, timed by running them again on their own), strategies (`propose`, and each strategy
alone), `plan()`, and the whole cycle (`run_cycle` with the dry-run evictor, and the JSON rendering).
Prints medians and checks the goals of the scale benchmark.

    python bench/scale.py --nodes 500 5000 [--seed 1] [--repeat 3] [--sample-interval 180] [--history 3600]

With `--live`, the same clusters time the live path instead (`rebalancer once` and the daemon's cycle
against a fake API server and a real Prometheus): bench/scale_live.py, imported only then, says how,
and takes the options of the group "the live path" (`--cycles`, `--span`, `--json`,
`--telemetry-deadline`, `--profile`).

    python bench/scale.py --live --nodes 500 5000 [--repeat 3] [--cycles 5] [--span 3600]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from bench.scale_population import Generated, generate  # noqa: E402
from bench.timed_run import run_timed  # noqa: E402
from rebalancer.cycle import propose, run_cycle  # noqa: E402
from rebalancer.evictor import DryRunEvictor  # noqa: E402
from rebalancer.gcpause import collector_paused  # noqa: E402
from rebalancer.planner import plan  # noqa: E402
from rebalancer.policy import LoadedPolicy, load_policy  # noqa: E402
from rebalancer.report import render  # noqa: E402
from rebalancer.sources.files import load_snapshot_dir  # noqa: E402
from rebalancer.telemetry.exposition import Series, parse_exposition_lines  # noqa: E402
from rebalancer.telemetry.identity import telemetry_metrics  # noqa: E402
from rebalancer.telemetry.windows import aggregate  # noqa: E402
from tools.clustergen import GIB, Json  # noqa: E402

OUT = ROOT / "bench" / "out"
POLICY = ROOT / "policies" / "default.yaml"
T = TypeVar("T")

# Goals of the scale benchmark (issue: Scale).
GOAL_NODES = 5000
GOAL_WHOLE_RUN_S = 5.0
GOAL_PLANNING_S = 2.0
GOAL_RSS_BYTES = GIB
GOAL_RATIO = 12.0


# --------------------------------------------------------------------------- timing

# In-process phases, in table order. `planning` (strategies + plan) is what the planning goal measures.
PHASES = (
    ("load", "snapshot load: load_snapshot_dir()"),
    ("objects", "  cluster objects: load_snapshot_dir() of the object files alone"),
    ("parse", "  telemetry read and parse: parse_exposition_lines()"),
    ("aggregate", "  telemetry aggregate"),
    ("planning", "planning: propose() + plan()"),
    ("strategies", "  strategies: propose()"),
    ("plan", "  plan()"),
    ("report", "whole cycle: run_cycle() + JSON (plans again, evicts dry, reports)"),
)


@dataclass
class Run:
    """One measurement of one snapshot: the command as a subprocess, then the cycle in-process."""

    whole_s: float
    rss_bytes: int
    summary: Json  # the report's summary, from the subprocess
    phases: dict[str, float]  # seconds, keys of PHASES
    strategies: dict[str, float]  # seconds per strategy, policy order


def run_subprocess(snapshot: Path, policy: Path) -> tuple[float, int, Json]:
    """`rebalancer once --snapshot DIR --output json`: wall time, peak RSS and the report's summary."""
    command = [
        sys.executable,
        "-m",
        "rebalancer.cli",
        "once",
        "--snapshot",
        str(snapshot),
        "--output",
        "json",
    ]
    command += ["--policy", str(policy)]
    done = run_timed(command, cwd=ROOT, what="rebalancer once")
    summary: Json = json.loads(done.stdout)["summary"]
    return done.wall, done.peak_rss_kib * 1024, summary


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    """What `fn` returns and the seconds it took, the cyclic collector paused as the project pauses it
    around the same work (load_snapshot_dir, evaluate)."""
    with collector_paused():
        start = time.perf_counter()
        value = fn()
        return value, time.perf_counter() - start


def _parse(exposition: Path, metrics: Sequence[str]) -> list[Series]:
    with exposition.open(encoding="utf-8") as handle:
        return parse_exposition_lines(handle, source=str(exposition), openmetrics=True, metrics=metrics)


def _handed_over(series: list[Series]) -> Iterator[Series]:
    """The series in order, each let go once handed over (as the snapshot loader hands them)."""
    series.reverse()
    while series:
        yield series.pop()


OBJECT_FILES = ("nodes.json", "pods.json", "pdbs.json", "snapshot.yaml")


def objects_only(snapshot_dir: Path) -> Path:
    """A sibling directory holding the snapshot's object files alone (hard links: no copy), so that
    `load_snapshot_dir` on it times reading the cluster objects without the telemetry."""
    target = snapshot_dir.with_name(snapshot_dir.name + ".objects")
    target.mkdir(exist_ok=True)
    for name in OBJECT_FILES:
        link = target / name
        if not (link.exists() and link.samefile(snapshot_dir / name)):
            link.unlink(missing_ok=True)
            os.link(snapshot_dir / name, link)
    return target


def run_in_process(snapshot_dir: Path, loaded: LoadedPolicy) -> tuple[dict[str, float], dict[str, float]]:
    """The cycle `rebalancer once` runs, phase by phase, each timed by calling the project's public
    function for it. The cluster's accounting is built once per snapshot and shared by the strategies and
    the planner of a cycle: the strategies alone and the whole cycle each run on a copy of the snapshot,
    so that each pays for it once, as the planning phase did."""
    snapshot, load = _timed(lambda: load_snapshot_dir(snapshot_dir, loaded))
    objects_dir = objects_only(snapshot_dir)
    _, objects = _timed(lambda: load_snapshot_dir(objects_dir, loaded))

    parse = aggregated = 0.0
    cfg = loaded.policy.telemetry
    if cfg is not None:
        series, parse = _timed(lambda: _parse(snapshot_dir / "dcgm.om", telemetry_metrics(cfg)))
        pods = {p.key: p for p in snapshot.pods}
        windows = loaded.telemetry_windows()
        _, aggregated = _timed(lambda: aggregate(_handed_over(series), cfg, windows, snapshot.now, pods))

    proposed, strategies_s = _timed(lambda: propose(snapshot, loaded))
    _, plan_s = _timed(lambda: plan(proposed.proposals, snapshot, loaded.policy))

    alone = dataclasses.replace(snapshot)
    strategies: dict[str, float] = {}
    for configured in loaded.strategies:
        one = loaded.model_copy(update={"strategies": (configured,)})
        _, strategies[configured.name] = _timed(functools.partial(propose, alone, one))

    whole = dataclasses.replace(snapshot)
    _, cycle = _timed(lambda: render(run_cycle(whole, loaded, DryRunEvictor()), "json"))

    planning = strategies_s + plan_s
    phases = {
        "load": load,
        "objects": objects,
        "parse": parse,
        "aggregate": aggregated,
        "planning": planning,
        "strategies": strategies_s,
        "plan": plan_s,
        "report": cycle,
    }
    return phases, strategies


def measure(generated: Generated, loaded: LoadedPolicy, policy: Path, repeat: int) -> list[Run]:
    runs: list[Run] = []
    for number in range(1, repeat + 1):
        whole, rss, summary = run_subprocess(generated.path, policy)
        phases, strategies = run_in_process(generated.path, loaded)
        runs.append(Run(whole, rss, summary, phases, strategies))
        print(
            f"  {generated.nodes:,} nodes, run {number}/{repeat}: {whole:.2f} s, {rss / 2**20:,.0f} MiB",
            file=sys.stderr,
        )
    return runs


# --------------------------------------------------------------------------- report


def _median(values: Iterable[float]) -> float:
    return statistics.median(values)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table: first column left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + (":" if i else "-")) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def _seconds(value: float) -> str:
    return f"{value:.3f} s" if value < 1 else f"{value:.2f} s"


def report(results: Sequence[tuple[Generated, list[Run]]], repeat: int) -> tuple[str, bool]:
    """The table of medians and the goal checks; True when every goal that could be checked holds."""
    Cell = Callable[[Generated, list[Run]], str]

    def row(label: str, cell: Cell) -> list[str]:
        return [label, *(cell(g, runs) for g, runs in results)]

    def phase(key: str) -> Cell:
        return lambda _g, runs: _seconds(_median(r.phases[key] for r in runs))

    def strategy(name: str) -> Cell:
        return lambda _g, runs: _seconds(_median(r.strategies.get(name, 0.0) for r in runs))

    def whole(runs: list[Run]) -> float:
        return _median(r.whole_s for r in runs)

    def rss(runs: list[Run]) -> float:
        return _median(r.rss_bytes for r in runs)

    def median_phase(runs: list[Run], key: str) -> float:
        return _median(r.phases[key] for r in runs)

    rows = [
        row("pods / PDBs", lambda g, _r: f"{g.pods:,} / {g.pdbs:,}"),
        row("GPUs / DCGM samples", lambda g, _r: f"{g.gpus:,} / {g.samples:,}"),
        row("snapshot size", lambda g, _r: f"{g.bytes / 1e6:,.0f} MB"),
        row("**whole run** (subprocess)", lambda _g, runs: _seconds(whole(runs))),
        row("**peak RSS** (subprocess)", lambda _g, runs: f"{rss(runs) / 2**20:,.0f} MiB"),
        row(
            "whole run - telemetry parse",
            lambda _g, runs: _seconds(whole(runs) - median_phase(runs, "parse")),
        ),
    ]
    for key, label in PHASES:
        rows.append(row(label, phase(key)))
        if key == "strategies":
            rows += [row(f"    {name}", strategy(name)) for name in results[0][1][0].strategies]
    rows.append(row("parse throughput", lambda g, runs: f"{g.samples / median_phase(runs, 'parse'):,.0f} /s"))
    rows.append(
        row("proposals / would evict", lambda _g, runs: "{proposals} / {evictions}".format(**runs[0].summary))
    )
    columns = ["", *(f"{g.nodes:,} nodes" for g, _ in results)]
    lines = [f"median of {repeat} runs", "", _table(columns, rows), ""]

    ok = True
    by_nodes = {g.nodes: runs for g, runs in results}
    big, small = by_nodes.get(GOAL_NODES), by_nodes.get(GOAL_NODES // 10)
    checks: list[tuple[str, bool]] = []
    if big is not None:
        planning = median_phase(big, "planning")
        checks.append(
            (
                f"whole run at {GOAL_NODES:,} nodes {_seconds(whole(big))} <= {GOAL_WHOLE_RUN_S:g} s",
                whole(big) <= GOAL_WHOLE_RUN_S,
            )
        )
        checks.append(
            (
                f"planning (strategies + plan) {_seconds(planning)} <= {GOAL_PLANNING_S:g} s",
                planning <= GOAL_PLANNING_S,
            )
        )
        checks.append(
            (
                f"peak RSS {rss(big) / 2**20:,.0f} MiB <= {GOAL_RSS_BYTES // 2**20:,} MiB",
                rss(big) <= GOAL_RSS_BYTES,
            )
        )
        if small is not None:
            ratio = whole(big) / whole(small)
            label = (
                f"{GOAL_NODES:,}-node run {ratio:.1f}x the {GOAL_NODES // 10:,}-node run <= {GOAL_RATIO:g}x"
            )
            checks.append((label, ratio <= GOAL_RATIO))
    for label, passed in checks:
        lines.append(f"{'PASS' if passed else 'FAIL'}  {label}")
        ok = ok and passed
    return "\n".join(lines), ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Time `rebalancer once --snapshot` on synthetic GPU clusters."
    )
    parser.add_argument(
        "--nodes", type=int, nargs="+", default=[500, 5000], help="cluster sizes (8-GPU nodes)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the table shows medians")
    parser.add_argument("--sample-interval", type=int, default=180, help="seconds between DCGM samples")
    parser.add_argument("--history", type=int, default=3600, help="seconds of DCGM history before now")
    parser.add_argument("--policy", type=Path, default=POLICY)
    parser.add_argument("--out", type=Path, default=OUT, help="where the snapshot directories go")
    parser.add_argument("--generate-only", action="store_true", help="write the snapshots, time nothing")
    parser.add_argument(
        "--live",
        action="store_true",
        help="time the live path instead: fake API server + real Prometheus (bench/scale_live.py)",
    )
    live = parser.add_argument_group("the live path (--live)")
    live.add_argument("--cycles", type=int, default=5, help="warm daemon cycles per round")
    live.add_argument("--span", type=int, default=3600, help="seconds of DCGM history after the start")
    live.add_argument("--json", type=Path, help="write every measurement to this file")
    live.add_argument(
        "--telemetry-deadline",
        type=int,
        help="the policy's Prometheus timeout and deadline, in seconds (a loaded machine)",
    )
    live.add_argument(
        "--profile",
        type=Path,
        help="a directory: cProfile one more daemon cycle a round into it, left out of the timings",
    )
    args = parser.parse_args(argv)
    if args.live:
        # Only here: the live path loads the kubernetes client, the daemon and the suite's Prometheus
        # helpers, which an offline run (or a module importing this one) has no use for.
        from bench import scale_live

        return scale_live.run(args)
    loaded = load_policy(str(args.policy))
    results: list[tuple[Generated, list[Run]]] = []
    for count in args.nodes:
        directory = args.out / f"scale-{count}-seed{args.seed}"
        start = time.perf_counter()
        generated = generate(directory, count, args.seed, args.sample_interval, args.history)
        print(
            f"{directory}: {generated.pods:,} pods, {generated.samples:,} samples "
            f"({time.perf_counter() - start:.1f} s)",
            file=sys.stderr,
        )
        if not args.generate_only:
            results.append((generated, measure(generated, loaded, args.policy, args.repeat)))
    if not results:
        return 0
    text, ok = report(results, args.repeat)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
