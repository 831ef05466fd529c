#!/usr/bin/env python3
"""Per-pod cost of the pod model: a pod's JSON bytes -> `rebalancer.model.Pod`, decoding included.

    .venv/bin/python bench/pod_model.py [--pods FILE] [--count N] [--repeat R] [--baseline DIR]

Reads a `kubectl get pods -A -o json` file (default: the demo cluster's pods.json; a bench/scale.py
snapshot's pods.json works too), cuts its items into their JSON bytes, repeats them up to N pods, and
times R runs over all of them, each in a fresh process: per pod, the median wall and CPU microseconds of

- decode + build: the bytes of one item to the model object, as the snapshot directory and the API
  pages read them (`kube_objects.model_from_bytes`; a tree from before typed decoding has none, and
  decodes each item untyped with msgspec, then `pod_from_json`, as its snapshot reader did);
- build alone: the same with each item decoded beforehand (into its Struct, or untyped before).

and the peak RSS of a process that holds the N pods' bytes and models. `--baseline DIR` runs the same
measures with another checkout (e.g. `git archive main | tar -x -C DIR`), alternated with this tree's
run by run, so that both share the machine's load.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
DEMO_PODS = ROOT / "examples" / "demo-cluster" / "pods.json"


class _Items(msgspec.Struct):
    items: list[msgspec.Raw]


def _measure(pods_file: Path, count: int) -> dict[str, float]:
    """One run in this process, with whichever checkout's `rebalancer` is first on the path (so it is
    imported here, not at the top)."""
    from rebalancer.policy import GangConfig, GpuSharingConfig  # noqa: PLC0415
    from rebalancer.sources import kube_objects  # noqa: PLC0415

    try:  # pods translated in a module of their own
        from rebalancer.sources import kube_pods  # noqa: PLC0415
    except ImportError:  # a tree from before that: kube_objects translated them
        kube_pods = kube_objects

    raws = [bytes(raw) for raw in msgspec.json.decode(pods_file.read_bytes(), type=_Items).items]
    if not raws:
        raise SystemExit(f"{pods_file}: no pods in items")
    raws = (raws * (count // len(raws) + 1))[:count]
    gangs, sharing = GangConfig(), GpuSharingConfig()
    from_bytes: Callable[[bytes], object]
    decode: Callable[[bytes], Any]
    build: Callable[[Any], object]
    if hasattr(kube_objects, "model_from_bytes"):  # typed decoding
        from rebalancer.sources import kube_types  # noqa: PLC0415

        def from_bytes(raw: bytes) -> object:
            return kube_objects.model_from_bytes("Pod", raw, gangs=gangs, sharing=sharing)

        def decode(raw: bytes) -> Any:
            return kube_types.decode(kube_types.PodObject, raw)

        def build(obj: Any) -> object:
            return kube_pods.pod_model(obj, gangs=gangs, sharing=sharing)

    else:  # before: untyped decoding, then the model's checks of each field

        def from_bytes(raw: bytes) -> object:
            return kube_pods.pod_from_json(msgspec.json.decode(raw), gangs=gangs, sharing=sharing)

        decode = msgspec.json.decode

        def build(obj: Any) -> object:
            return kube_pods.pod_from_json(obj, gangs=gangs, sharing=sharing)

    gc.disable()  # as the sources read: the collector paused
    wall, cpu = time.perf_counter(), time.process_time()
    models = [from_bytes(raw) for raw in raws]
    full = (time.perf_counter() - wall, time.process_time() - cpu)
    del models
    decoded = [decode(raw) for raw in raws]
    wall, cpu = time.perf_counter(), time.process_time()
    models = [build(obj) for obj in decoded]
    alone = (time.perf_counter() - wall, time.process_time() - cpu)
    del decoded
    return {
        "wall": full[0] / count * 1e6,
        "cpu": full[1] / count * 1e6,
        "build_wall": alone[0] / count * 1e6,
        "build_cpu": alone[1] / count * 1e6,
        "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "pods": len(models),
    }


def _run(root: Path, pods_file: Path, count: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--pods", str(pods_file)]
    done = subprocess.run(
        [*argv, "--count", str(count)], env=env, cwd=root, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{root}: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=Path, default=DEMO_PODS, help="a kubectl pod List in JSON")
    parser.add_argument("--count", type=int, default=20000, help="pods per run (items repeated)")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the medians are printed")
    parser.add_argument("--baseline", type=Path, help="another checkout to measure alternately")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_measure(args.pods.resolve(), args.count)))
        return 0
    roots = [("this tree", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in roots}
    for _ in range(args.repeat):
        for name, root in roots:
            runs[name].append(_run(root, args.pods.resolve(), args.count))
    print(f"{args.count} pods a run, {args.repeat} runs a tree, medians (us a pod; MiB):")
    print("| tree | decode + build: wall / CPU | build alone: wall / CPU | peak RSS |")
    print("|---|---:|---:|---:|")
    for name, results in runs.items():

        def med(key: str, results: list[dict[str, float]] = results) -> float:
            return statistics.median(r[key] for r in results)

        print(
            f"| {name} | {med('wall'):.1f} / {med('cpu'):.1f} | {med('build_wall'):.1f} / "
            f"{med('build_cpu'):.1f} | {med('rss'):.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
