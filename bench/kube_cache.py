#!/usr/bin/env python3
"""The live snapshot's cluster part: a full list every cycle against a warm watch cache.

    .venv/bin/python bench/kube_cache.py --nodes 500 1000 [--repeat 3] [--reads 5] [--seed 1]

For each size, the scale benchmark's synthetic cluster (bench/scale_population.py's `generate`, with one
DCGM sample a series: only the nodes, pods and PDBs are used) is loaded into the fake API server of
tests/fake_apiserver.py, served over real HTTP from a process of its own, so the client's CPU time is the
rebalancer's alone.
Then, `--repeat` times, one client process per way of building the snapshot, one after the other:

- `held`: each kind listed whole (every raw page held), then decoded into the model: the live source
  as it was before the watch cache, kept here as the baseline;
- `list`: `KubeSource` listing every cycle (`rebalancer once`, `explain`): each page decoded as it
  arrives;
- `cache`: `KubeSource` on a `KubeCache`, as `rebalancer run` builds it: the first snapshot lists and
  starts the watches (the first sync), then `--reads` snapshots from the warm cache.

Each snapshot is `KubeSource.snapshot(now)` without telemetry (the controllers the GPU pods need are
listed each cycle in every mode; the fake holds none). Per process it records wall and CPU seconds per
snapshot (CPU of the whole client process, watch threads included) and its peak RSS; the table shows
medians over the processes (a cache process's own median over its warm reads first). The cluster is
idle between reads: watch events, when they come, cost one pod decode each (bench/pod_model.py).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from kubernetes import client  # noqa: E402

from bench import scale, scale_population  # noqa: E402
from rebalancer.policy import LoadedPolicy, load_policy  # noqa: E402
from rebalancer.sources.kube import KubeSource  # noqa: E402
from rebalancer.sources.kube_cache import KubeCache  # noqa: E402
from rebalancer.sources.kube_lists import ClusterObjects, KindStore, assemble, decoding_of  # noqa: E402
from tests.fake_apiserver import FakeApiServer  # noqa: E402

MODES = ("held", "list", "cache")
FILES = (
    ("nodes.json", "v1", "Node"),
    ("pods.json", "v1", "Pod"),
    ("pdbs.json", "policy/v1", "PodDisruptionBudget"),
)


# --------------------------------------------------------------------------- the server process


def serve(directory: Path) -> int:
    """Load the snapshot's objects into a fake API server, print its URL, serve until stdin closes."""
    with FakeApiServer() as api:
        for name, api_version, kind in FILES:
            for item in json.loads((directory / name).read_bytes())["items"]:
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                api.add(item)
        print(api.url, flush=True)
        sys.stdin.read()
    return 0


# --------------------------------------------------------------------------- the client process


def _held(source: KubeSource) -> Callable[[LoadedPolicy], ClusterObjects]:
    """The cluster read as before the cache: every raw item of a kind held, then decoded."""

    def read(loaded: LoadedPolicy) -> ClusterObjects:
        decoding = decoding_of(loaded)
        raw = {
            "Node": source.list_nodes(),
            "Pod": source.list_pods(),
            "PodDisruptionBudget": source.list_pdbs(),
        }
        stores = []
        for kind, items in raw.items():
            store = KindStore(kind, decoding)  # type: ignore[arg-type]
            for item in items:
                store.put(item)
            stores.append(store)
        return assemble(stores)

    return read


def _timed(fn: Callable[[], Any]) -> dict[str, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def run_client(mode: str, url: str, reads: int, policy: Path) -> int:
    loaded = load_policy(policy)
    configuration = client.Configuration(host=url)
    configuration.proxy = None
    api_client = client.ApiClient(configuration)
    out: dict[str, Any] = {"mode": mode}
    if mode == "cache":
        cache = KubeCache(api_client)
        source = KubeSource(api_client, loaded, cluster=cache.read)
        out["first"] = _timed(lambda: source.snapshot(scale_population.NOW))
        out["reads"] = [_timed(lambda: source.snapshot(scale_population.NOW)) for _ in range(reads)]
        out["pods"] = len(source.snapshot(scale_population.NOW).pods)
        cache.stop()
    else:
        plain = KubeSource(api_client, loaded)
        source = plain if mode == "list" else KubeSource(api_client, loaded, cluster=_held(plain))
        out["reads"] = [_timed(lambda: source.snapshot(scale_population.NOW))]
        out["pods"] = len(source.snapshot(scale_population.NOW).pods)
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))
    return 0


# --------------------------------------------------------------------------- the bench


@contextmanager
def serving(directory: Path) -> Iterator[str]:
    """The snapshot directory's nodes, pods and PDBs served by a fake API server in a process of its
    own (so that a client's CPU time is its own), for the duration of the block: its URL."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert server.stdout is not None and server.stdin is not None
    try:
        yield server.stdout.readline().strip()
    finally:
        server.stdin.close()
        server.wait(timeout=60)


def measure(directory: Path, repeat: int, reads: int, policy: Path) -> dict[str, list[dict[str, Any]]]:
    """Serve the snapshot from one process; time `repeat` client processes of each mode, in turn."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with serving(directory) as url:
        for _ in range(repeat):
            for mode in MODES:
                command = [sys.executable, __file__, "--client", mode, url, "--reads", str(reads)]
                done = subprocess.run(
                    [*command, "--policy", str(policy)], capture_output=True, text=True, env=env, check=True
                )
                results[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def summarise(results: Mapping[str, list[dict[str, Any]]]) -> dict[str, float]:
    row: dict[str, float] = {}
    for mode, runs in results.items():
        for what in ("wall", "cpu"):
            row[f"{mode}_{what}"] = _median([_median([r[what] for r in run["reads"]]) for run in runs])
        row[f"{mode}_rss"] = _median([run["peak_rss_mib"] for run in runs])
        if mode == "cache":
            row["first_wall"] = _median([run["first"]["wall"] for run in runs])
            row["first_cpu"] = _median([run["first"]["cpu"] for run in runs])
    row["pods"] = results["cache"][0]["pods"]
    return row


def table(rows: Mapping[int, Mapping[str, float]]) -> str:
    sizes = sorted(rows)
    lines = [
        "| snapshot's cluster part | " + " | ".join(f"{n:,} nodes" for n in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]

    def line(label: str, cell: Callable[[Mapping[str, float]], str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(rows[n]) for n in sizes) + " |")

    line("pods", lambda r: f"{int(r['pods']):,}")
    for mode, label in (
        ("held", "full list, raw pages held (before)"),
        ("list", "full list, pages decoded as they arrive (`once`)"),
        ("cache", "warm cache (`run`, each cycle)"),
    ):
        line(f"{label}: wall / CPU", lambda r, m=mode: f"{r[m + '_wall']:.3f} s / {r[m + '_cpu']:.3f} s")
        line(f"{label}: peak RSS", lambda r, m=mode: f"{r[m + '_rss']:.0f} MiB")
    line("cache first sync: wall / CPU", lambda r: f"{r['first_wall']:.3f} s / {r['first_cpu']:.3f} s")
    line("CPU, held list / warm cache", lambda r: f"{r['held_cpu'] / r['cache_cpu']:.0f}x")
    if len(sizes) > 1:
        first, last = rows[sizes[0]], rows[sizes[-1]]
        lines.append("")
        cached = last["cache_cpu"] / first["cache_cpu"]
        listed = last["list_cpu"] / first["list_cpu"]
        lines.append(
            f"{sizes[0]:,} -> {sizes[-1]:,} nodes: warm cache CPU {cached:.1f}x, full list CPU {listed:.1f}x"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[500, 1000])
    parser.add_argument("--repeat", type=int, default=3, help="client processes per mode; medians shown")
    parser.add_argument("--reads", type=int, default=5, help="warm-cache snapshots per cache process")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", type=Path, default=scale.POLICY)
    parser.add_argument("--out", type=Path, default=scale.OUT, help="where the snapshot directories go")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=2, metavar=("MODE", "URL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        return serve(args.serve)
    if args.client is not None:
        return run_client(args.client[0], args.client[1], args.reads, args.policy)
    rows: dict[int, dict[str, float]] = {}
    for count in args.nodes:
        directory = args.out / f"objects-{count}-seed{args.seed}"
        scale_population.generate(directory, count, args.seed, 180, 0)
        rows[count] = summarise(measure(directory, args.repeat, args.reads, args.policy))
        print(f"{count} nodes: {json.dumps(rows[count])}", flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
