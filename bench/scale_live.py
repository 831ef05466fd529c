#!/usr/bin/env python3
"""The live path at scale: `rebalancer once` and the daemon's cycle, fake API server and real Prometheus.

    .venv/bin/python bench/scale.py --live --nodes 500 5000 [--repeat 3] [--cycles 5] [--span 3600]
        [--telemetry-deadline SECONDS] [--json FILE] [--profile DIR]

For each size, the scale benchmark's synthetic cluster (bench/scale_population.py):

- its nodes, pods and PDBs (`scale_population.generate` with one DCGM sample a series, the directories
  bench/kube_cache.py uses) served over real HTTP by tests/fake_apiserver.py from a process of its own
  (`kube_cache.serving`), so that the CPU time measured is the rebalancer's alone;
- its DCGM series (tools/clustergen, the same devices, utilisation and pods as the snapshot directory)
  backfilled with promtool into a real Prometheus (the Debian `prometheus` the test suite uses,
  tests/prometheus_server.py): `--history` of samples every `--sample-interval` seconds before the
  bench starts and `--span` after it (samples in the future, which a query at the wall clock's `now`
  does not see yet), so that every cycle, whenever it runs, reads fresh telemetry over full windows.

Then, `--repeat` times, one after the other:

- `once`: `rebalancer once --dry-run --output json` as a subprocess (kubeconfig on the fake, the
  Prometheus by `--prometheus-url`): wall, CPU (user + system) and peak RSS from wait4;
- `once` by phase, in a child process, each phase a public call of the project, the collector paused as
  `once` pauses it: listing the cluster (`KubeSource.snapshot` without telemetry: nodes, pods, PDBs and
  the controllers' walk), the telemetry read (`PrometheusTelemetrySource.telemetry`: the queries and
  the rows), planning (`propose`, `plan`) and the report (`run_cycle` with the dry-run evictor, JSON);
- the daemon, in a child process built as `rebalancer run` builds it (`KubeCache`,
  `kube_snapshot_source`, `Daemon`, dry-run): the cache's first sync (`KubeCache.read`, timed alone),
  then `--cycles` cycles (`Daemon.run_cycle`, as the scheduler calls it, CPU of the whole process,
  watch threads included), then the phases of one more warm cycle as above, the cluster part from the
  warm cache. Peak RSS of the process, first sync included. With `--profile DIR`, one more cycle after
  all that, under cProfile (into DIR), is left out of every figure.

Each child reports wall and CPU seconds per phase and its RSS after each phase (and the peak) as JSON;
the table shows medians over the repeats (a daemon's own median over its cycles first). The goals of
the issue are checked at 5,000 nodes.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from kubernetes import client  # noqa: E402

from bench import kube_cache, scale, scale_population  # noqa: E402
from bench.timed_run import run_timed  # noqa: E402
from rebalancer.cycle import propose, run_cycle  # noqa: E402
from rebalancer.daemon.clock import utcnow  # noqa: E402
from rebalancer.daemon.loop import Daemon  # noqa: E402
from rebalancer.daemon.wiring import kube_snapshot_source  # noqa: E402
from rebalancer.evictor import DryRunEvictor  # noqa: E402
from rebalancer.gcpause import collector_paused  # noqa: E402
from rebalancer.model import Snapshot  # noqa: E402
from rebalancer.planner import plan  # noqa: E402
from rebalancer.policy import LoadedPolicy, load_policy, prometheus_with_url  # noqa: E402
from rebalancer.report import render  # noqa: E402
from rebalancer.sinks.log import configure_logging  # noqa: E402
from rebalancer.sources.kube import KubeSource  # noqa: E402
from rebalancer.sources.kube_cache import KubeCache  # noqa: E402
from rebalancer.sources.prometheus import PrometheusTelemetrySource  # noqa: E402
from rebalancer.telemetry.windows import unknown_node_findings  # noqa: E402
from tests.prometheus_server import PrometheusServer, ensure_prometheus  # noqa: E402
from tools import clustergen  # noqa: E402

T = TypeVar("T")
MIB = 2**20

# Goals of the issue for the live path (5,000 nodes, steady state with the watch cache warm).
GOAL_NODES = 5000
GOAL_CYCLE_CPU_S = 5.0
GOAL_RSS_MIB = 600
GOAL_FIRST_SYNC_S = 30.0
GOAL_RATIO = 12.0

UNAVAILABLE = "telemetry-unavailable"  # the finding of a cycle without telemetry
ONCE_PHASES = ("cluster", "telemetry", "strategies", "plan", "report")
DAEMON_PHASES = ("cache", "telemetry", "strategies", "plan", "report")


# --------------------------------------------------------------------------- measuring in a child


def _rss_mib() -> float:
    """The resident set of this process now (Linux /proc)."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / MIB


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) another process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Recorder:
    """Wall and CPU seconds (the whole process: every thread) and RSS after each timed call, and the CPU
    the Prometheus process `prometheus_pid` used meanwhile."""

    def __init__(self, prometheus_pid: int | None = None) -> None:
        self.phases: dict[str, dict[str, float]] = {}
        self._prometheus = prometheus_pid

    def time(self, name: str, fn: Callable[[], T]) -> T:
        served = process_cpu(self._prometheus) if self._prometheus else 0.0
        wall, cpu = time.perf_counter(), time.process_time()
        value = fn()
        self.phases[name] = {
            "wall": time.perf_counter() - wall,
            "cpu": time.process_time() - cpu,
            "rss": _rss_mib(),
            "prometheus_cpu": process_cpu(self._prometheus) - served if self._prometheus else 0.0,
        }
        return value


def _api_client(url: str) -> client.ApiClient:

    configuration = client.Configuration(host=url)
    configuration.proxy = None
    return client.ApiClient(configuration)


def _cycle_phases(
    rec: Recorder, loaded: LoadedPolicy, snapshot: Snapshot, prometheus_url: str, now: datetime
) -> bool:
    """Telemetry, planning and report of one cycle on `snapshot` (its cluster part already read)."""

    cfg = loaded.policy.telemetry
    conn = prometheus_with_url(cfg.prometheus, prometheus_url)
    source = PrometheusTelemetrySource(cfg, loaded.telemetry_windows(), prometheus=conn)
    pods = {p.key: p for p in snapshot.pods}
    with collector_paused():  # as KubeSource.snapshot reads its telemetry
        telemetry, found = rec.time("telemetry", lambda: source.telemetry(now, pods))
    findings = (*snapshot.findings, *found, *unknown_node_findings(telemetry, snapshot.nodes))
    whole = replace(snapshot, telemetry=telemetry, findings=findings)
    proposed = rec.time("strategies", lambda: propose(whole, loaded))
    rec.time("plan", lambda: plan(proposed.proposals, whole, loaded.policy))
    rec.time("report", lambda: render(run_cycle(replace(whole), loaded, DryRunEvictor()), "json"))
    return telemetry.available


def run_once_phases(api_url: str, prometheus_url: str, policy: Path, prometheus_pid: int) -> dict[str, Any]:
    """`rebalancer once`'s cycle phase by phase, the collector off as the command runs it."""

    gc.disable()
    loaded = load_policy(policy)
    rec = Recorder(prometheus_pid)
    now = utcnow()
    kube = KubeSource(_api_client(api_url), loaded)
    snapshot = rec.time("cluster", lambda: kube.snapshot(now))
    read = _cycle_phases(rec, loaded, snapshot, prometheus_url, now)
    return {"phases": rec.phases, "peak_rss": _peak_mib(), "pods": len(snapshot.pods), "telemetry": read}


def _profiled_cycle(daemon: Daemon, profile: Path) -> None:
    """One more cycle under cProfile, its statistics written to `profile`."""
    profiler = cProfile.Profile()
    profiler.enable()
    report = daemon.run_cycle(raise_errors=True)
    profiler.disable()
    if report is None:
        raise SystemExit("the profiled cycle did not run")
    profiler.dump_stats(profile)


def run_daemon(
    api_url: str, prometheus_url: str, policy: Path, cycles: int, *, prometheus_pid: int, profile: Path | None
) -> dict[str, Any]:
    """The daemon as `rebalancer run` builds it (dry-run, logging JSON lines to stderr): first sync,
    `cycles` cycles, then one more cycle's phases on the warm cache; with `profile`, then one more cycle
    under cProfile into that file, after every measurement (its peak RSS included), so that profiling
    slows no cycle timed."""

    configure_logging("json")
    loaded = load_policy(policy)
    api = _api_client(api_url)
    cache = KubeCache(api)
    rec = Recorder(prometheus_pid)
    try:
        rec.time("first_sync", lambda: cache.read(loaded))
        source = kube_snapshot_source(api, prometheus_url=prometheus_url, cluster=cache.read)
        daemon = Daemon(loaded, source, dry_run=True)
        runs: list[dict[str, float]] = []
        read = True
        for number in range(cycles):
            report = rec.time("cycle", lambda: daemon.run_cycle(raise_errors=True))
            if report is None:
                raise SystemExit(f"cycle {number + 1} did not run")
            read = read and not any(f.kind == UNAVAILABLE for f in report.findings)
            runs.append(rec.phases.pop("cycle"))
        now = utcnow()
        kube = KubeSource(api, loaded, cluster=cache.read)
        with collector_paused():  # as Daemon.run_cycle runs a cycle
            snapshot = rec.time("cache", lambda: kube.snapshot(now))
            read = _cycle_phases(rec, loaded, snapshot, prometheus_url, now) and read
        peak = _peak_mib()
        if profile is not None:
            _profiled_cycle(daemon, profile)
    finally:
        cache.stop()
    return {
        "phases": rec.phases,
        "cycles": runs,
        "peak_rss": peak,
        "pods": len(snapshot.pods),
        "telemetry": read,
    }


# --------------------------------------------------------------------------- the servers


def live_history(path: Path, nodes: int, seed: int, *, interval: int, history: int, end: datetime) -> int:
    """The cluster's DCGM series (bench/scale_population.py's population) from `end - history` to `end`,
    every `interval` seconds, as OpenMetrics; the number of samples."""
    cluster = scale_population.population(nodes, seed)
    devices = clustergen.gpus(cluster.nodes, cluster.pods, cluster.ids)
    return clustergen.write_openmetrics(
        path,
        devices,
        end,
        history // interval + 1,
        interval,
        last_sample_age=scale_population.LAST_SAMPLE_AGE,
        leaked=cluster.leaked,
    )


@contextmanager
def prometheus(root: Path, history_file: Path, newest: float) -> Iterator[tuple[str, int]]:
    """A real Prometheus holding `history_file`, started on loopback for the block: its URL and PID."""

    binary, promtool = ensure_prometheus()
    server = PrometheusServer(root, binary, promtool)
    server.backfill_file(history_file)
    server.start()
    try:
        if not server.query('count({__name__=~".+"})', newest):
            raise SystemExit(f"the backfilled history is not queryable at {newest}")
        assert server.pid is not None
        yield server.url, server.pid
    finally:
        server.stop()


def write_kubeconfig(path: Path, url: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "bench"}}],
        "current-context": "fake",
    }
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- the parent


def _env() -> dict[str, str]:
    """The children's environment: the checkout importable, loopback never through a proxy."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1"}


def run_once_command(kubeconfig: Path, prometheus_url: str, policy: Path) -> dict[str, Any]:
    """`rebalancer once --dry-run --output json` on the live cluster: wall, CPU, peak RSS, summary."""
    command = [
        sys.executable, "-m", "rebalancer.cli", "once", "--dry-run", "--output", "json",
        "--kubeconfig", str(kubeconfig), "--prometheus-url", prometheus_url, "--policy", str(policy),
    ]  # fmt: skip
    done = run_timed(command, cwd=ROOT, env=_env(), what="rebalancer once")
    report = json.loads(done.stdout)
    return {
        "wall": done.wall,
        "cpu": done.cpu,
        "peak_rss": done.peak_rss_kib / 1024,
        "summary": report["summary"],
        "telemetry": not any(f["kind"] == UNAVAILABLE for f in report["findings"]),
    }


def run_child(
    mode: str,
    api_url: str,
    prometheus: tuple[str, int],
    args: argparse.Namespace,
    profile: Path | None = None,
) -> dict[str, Any]:
    url, pid = prometheus
    command = [sys.executable, __file__, "--child", mode, api_url, url, "--policy", str(args.policy)]
    command += ["--cycles", str(args.cycles), "--prometheus-pid", str(pid)]
    if profile is not None:
        command += ["--profile", str(profile)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=_env(), check=False)
    if done.returncode != 0:
        raise SystemExit(f"{mode} child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure_size(nodes: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Every measurement of one size: `repeat` rounds of once, once by phase and the daemon."""
    directory = out / f"objects-{nodes}-seed{args.seed}"
    objects = scale_population.generate(directory, nodes, args.seed, args.sample_interval, 0)
    start = datetime.now(UTC).replace(microsecond=0)
    end = start + timedelta(seconds=args.span)
    results: dict[str, Any] = {"nodes": nodes, "pods": objects.pods, "gpus": objects.gpus, "rounds": []}
    with tempfile.TemporaryDirectory(prefix="scale-live-") as scratch:
        root = Path(scratch)
        history = root / "dcgm.om"
        began = time.perf_counter()
        results["samples"] = live_history(
            history,
            nodes,
            args.seed,
            interval=args.sample_interval,
            history=args.history + args.span,
            end=end,
        )
        print(f"  {nodes:,} nodes: {results['samples']:,} samples written", file=sys.stderr)
        with prometheus(root / "prometheus", history, start.timestamp()) as served:
            history.unlink()
            print(f"  backfilled and started ({time.perf_counter() - began:.0f} s)", file=sys.stderr)
            with kube_cache.serving(objects.path) as api_url:
                kubeconfig = write_kubeconfig(root / "kubeconfig", api_url)
                for number in range(args.repeat):
                    if datetime.now(UTC) > end - timedelta(minutes=10):
                        raise SystemExit("the backfilled history ends in 10 minutes: give a longer --span")
                    profile = None
                    if args.profile is not None:
                        args.profile.mkdir(parents=True, exist_ok=True)
                        profile = args.profile / f"daemon-cycle-{nodes}-{number + 1}.pstats"
                    one = {
                        "once": run_once_command(kubeconfig, served[0], args.policy),
                        "once_phases": run_child("once", api_url, served, args),
                        "daemon": run_child("daemon", api_url, served, args, profile),
                    }
                    results["rounds"].append(one)
                    print(
                        f"  round {number + 1}/{args.repeat}: once {one['once']['wall']:.1f} s wall, "
                        f"{one['once']['cpu']:.1f} s CPU, {one['once']['peak_rss']:.0f} MiB; daemon cycle "
                        f"{_median(c['cpu'] for c in one['daemon']['cycles']):.2f} s CPU, "
                        f"{one['daemon']['peak_rss']:.0f} MiB",
                        file=sys.stderr,
                    )
    return results


# --------------------------------------------------------------------------- the table


def _median(values: Iterator[float] | Sequence[float]) -> float:
    return statistics.median(list(values))


def summarise(results: Mapping[str, Any]) -> dict[str, float]:
    rounds = results["rounds"]
    row: dict[str, float] = {}
    for what in ("wall", "cpu", "peak_rss"):
        row[f"once_{what}"] = _median(r["once"][what] for r in rounds)
    for kind, phases in (("once_phases", ONCE_PHASES), ("daemon", (*DAEMON_PHASES, "first_sync"))):
        for phase in phases:
            for what in ("wall", "cpu", "rss", "prometheus_cpu"):
                row[f"{kind}.{phase}.{what}"] = _median(r[kind]["phases"][phase][what] for r in rounds)
        row[f"{kind}.peak_rss"] = _median(r[kind]["peak_rss"] for r in rounds)
    for what in ("wall", "cpu", "rss"):
        row[f"cycle_{what}"] = _median(_median(c[what] for c in r["daemon"]["cycles"]) for r in rounds)
    for kind in ("once_phases", "daemon"):
        for what in ("wall", "cpu"):
            row[f"{kind}.planning.{what}"] = _median(
                r[kind]["phases"]["strategies"][what] + r[kind]["phases"]["plan"][what] for r in rounds
            )
    row["telemetry"] = all(r[kind]["telemetry"] for r in rounds for kind in ("once", "once_phases", "daemon"))
    summary = rounds[0]["once"]["summary"]
    row.update(
        nodes=results["nodes"],
        pods=results["pods"],
        gpus=results["gpus"],
        samples=results["samples"],
        proposals=summary["proposals"],
        evictions=summary["evictions"],
    )
    return row


def _cell(row: Mapping[str, float], key: str) -> str:
    wall, cpu, rss = row[f"{key}.wall"], row[f"{key}.cpu"], row[f"{key}.rss"]
    return f"{wall:.2f} s / {cpu:.2f} s / {rss:,.0f} MiB"


def table(rows: Sequence[Mapping[str, float]], repeat: int) -> tuple[str, bool]:
    """The Markdown table of medians, and the goal checks (True when every checked goal holds)."""
    lines = [
        f"median of {repeat} rounds; phases: wall / CPU / RSS after the phase",
        "",
        "| live path | " + " | ".join(f"{int(r['nodes']):,} nodes" for r in rows) + " |",
        "|---|" + "---:|" * len(rows),
    ]

    def line(label: str, cell: Callable[[Mapping[str, float]], str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in rows) + " |")

    line(
        "pods / GPUs / DCGM samples in Prometheus",
        lambda r: f"{int(r['pods']):,} / {int(r['gpus']):,} / {int(r['samples']):,}",
    )
    line("**`once`** (subprocess): wall / CPU", lambda r: f"{r['once_wall']:.2f} s / {r['once_cpu']:.2f} s")
    line("**`once`**: peak RSS", lambda r: f"{r['once_peak_rss']:,.0f} MiB")
    labels = {
        "cluster": "list nodes, pods, PDBs, controllers",
        "cache": "warm cache snapshot (+ controllers)",
        "telemetry": "telemetry (PromQL queries, rows)",
        "strategies": "strategies: propose()",
        "plan": "plan()",
        "report": "run_cycle() + JSON (plans again, evicts dry, reports)",
    }
    for phase in ONCE_PHASES:
        line(f"`once` by phase: {labels[phase]}", lambda r, p=phase: _cell(r, f"once_phases.{p}"))
    line("`once` by phase: peak RSS", lambda r: f"{r['once_phases.peak_rss']:,.0f} MiB")
    line("**daemon: first sync** (`KubeCache.read`)", lambda r: _cell(r, "daemon.first_sync"))
    line(
        "**daemon: steady-state cycle** (`Daemon.run_cycle`)",
        lambda r: f"{r['cycle_wall']:.2f} s / {r['cycle_cpu']:.2f} s / {r['cycle_rss']:,.0f} MiB",
    )
    for phase in DAEMON_PHASES:
        line(f"daemon cycle by phase: {labels[phase]}", lambda r, p=phase: _cell(r, f"daemon.{p}"))
    line(
        "Prometheus' own CPU for the cycle's telemetry read",
        lambda r: f"{r['daemon.telemetry.prometheus_cpu']:.2f} s",
    )
    line("**daemon: peak RSS** (first sync included)", lambda r: f"{r['daemon.peak_rss']:,.0f} MiB")
    line("proposals / would evict", lambda r: f"{int(r['proposals'])} / {int(r['evictions'])}")
    line(
        "telemetry read in every cycle",
        lambda r: "yes" if r["telemetry"] else "**no** (telemetry-unavailable)",
    )
    lines.append("")

    ok = True
    by_nodes = {int(r["nodes"]): r for r in rows}
    big, small = by_nodes.get(GOAL_NODES), by_nodes.get(GOAL_NODES // 10)
    checks: list[tuple[str, bool]] = []
    if big is not None:
        cpu, rss, sync = big["cycle_cpu"], big["daemon.peak_rss"], big["daemon.first_sync.wall"]
        checks += [
            (f"steady-state cycle CPU {cpu:.2f} s <= {GOAL_CYCLE_CPU_S:g} s", cpu <= GOAL_CYCLE_CPU_S),
            (f"daemon peak RSS {rss:,.0f} MiB <= {GOAL_RSS_MIB} MiB", rss <= GOAL_RSS_MIB),
            (f"first sync {sync:.1f} s <= {GOAL_FIRST_SYNC_S:g} s", sync <= GOAL_FIRST_SYNC_S),
        ]
        if small is not None:
            ratio = big["cycle_cpu"] / small["cycle_cpu"]
            label = f"{GOAL_NODES:,}-node cycle CPU {ratio:.1f}x the {GOAL_NODES // 10:,}-node one"
            checks.append((f"{label} <= {GOAL_RATIO:g}x", ratio <= GOAL_RATIO))
    for label, passed in checks:
        lines.append(f"{'PASS' if passed else 'FAIL'}  {label}")
        ok = ok and passed
    return "\n".join(lines), ok


# --------------------------------------------------------------------------- the command


def patient_policy(policy: Path, seconds: int, directory: Path) -> Path:
    """`policy` with its Prometheus request timeout and telemetry deadline set to `seconds`."""
    document = yaml.safe_load(policy.read_text(encoding="utf-8"))
    telemetry = document.setdefault("telemetry", {})
    connection = telemetry.get("prometheus") or {"url": "http://127.0.0.1:9"}  # --prometheus-url replaces it
    telemetry["prometheus"] = {**connection, "timeout": f"{seconds}s", "deadline": f"{seconds}s"}
    path = directory / f"policy-{seconds}s.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    load_policy(path)  # refused here, not in a child, when the interval is too short for it
    return path


def run(args: argparse.Namespace) -> int:
    """`bench/scale.py --live`: every size of `args.nodes`, then the table (its arguments are parsed
    there)."""
    rows = []
    everything = []
    with tempfile.TemporaryDirectory(prefix="scale-live-policy-") as scratch:
        if args.telemetry_deadline is not None:
            args.policy = patient_policy(args.policy, args.telemetry_deadline, Path(scratch))
        for nodes in args.nodes:
            print(f"{nodes:,} nodes (live)", file=sys.stderr)
            results = measure_size(nodes, args, args.out)
            everything.append(results)
            rows.append(summarise(results))
            print(json.dumps(rows[-1]), file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(everything, indent=1), encoding="utf-8")
    text, ok = table(rows, args.repeat)
    print(text)
    return 0 if ok else 1


def child_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=3, metavar=("MODE", "API", "PROMETHEUS"), required=True)
    parser.add_argument("--policy", type=Path, default=scale.POLICY)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--prometheus-pid", type=int, required=True)
    parser.add_argument("--profile", type=Path)
    args = parser.parse_args(argv)
    mode, api_url, prometheus_url = args.child
    if mode == "once":
        result = run_once_phases(api_url, prometheus_url, args.policy, args.prometheus_pid)
    else:
        result = run_daemon(
            api_url,
            prometheus_url,
            args.policy,
            args.cycles,
            prometheus_pid=args.prometheus_pid,
            profile=args.profile,
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
