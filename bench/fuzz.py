#!/usr/bin/env python3
"""Fuzz the command line's input contract with thousands of cases; optionally save what breaks it.

    .venv/bin/python bench/fuzz.py [--cases 10000] [--seed S] [--kinds KIND ...] [--jobs N]
                                   [--timeout SECONDS] [--save-failures] [--max-saved 40]

Runs the hypothesis strategies of tests/fuzzing/ (mutated kubectl objects, expositions,
`snapshot.yaml`, policies, whole files) against `rebalancer once --snapshot` / `rebalancer validate`,
each case in a forked child under memory and time limits, and collects every result instead of
stopping at the first failure. It prints how many cases ran and failed, the failures by violation
kind and by signature (one bug each) with a few examples, and the wall and CPU time.

With `--save-failures`, the smallest case of each signature not yet in tests/fuzz_corpus is reduced
(files, List items, documents, fields, lines dropped while the signature holds) and written there,
most important first, at most `--max-saved`; tests/test_fuzz.py replays the corpus.

Exits 1 when any case failed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import HypothesisException  # noqa: E402

from tests import fuzzing  # noqa: E402
from tests.fuzzing import Case, Kind  # noqa: E402

CHUNK = 250  # cases per task, so that --jobs spreads one kind over several workers


@dataclasses.dataclass
class Bucket:
    """The failures of one signature."""

    signature: str
    count: int = 0
    case: Case | None = None  # the smallest case seen
    found: list[str] = dataclasses.field(default_factory=list)
    examples: list[str] = dataclasses.field(default_factory=list)  # notes of the first few cases
    kinds: Counter[str] = dataclasses.field(default_factory=Counter)

    def add(self, kind: str, case: Case, found: Sequence[str], keep: int) -> None:
        self.count += 1
        self.kinds[kind] += 1
        if len(self.examples) < keep:
            self.examples.append(f"[{kind}] {case.argv_kind}: {case.note}")
        if self.case is None or case.size < self.case.size:
            self.case, self.found = case, list(found)

    def merge(self, other: Bucket, keep: int) -> None:
        self.count += other.count
        self.kinds.update(other.kinds)
        self.examples.extend(other.examples[: max(keep - len(self.examples), 0)])
        if other.case is not None and (self.case is None or other.case.size < self.case.size):
            self.case, self.found = other.case, other.found


@dataclasses.dataclass
class Tally:
    ran: int = 0
    failed: int = 0
    walls: list[float] = dataclasses.field(default_factory=list)
    child_cpu: float = 0.0
    worker_cpu: float = 0.0  # generating cases and collecting results, in the workers
    by_kind: Counter[str] = dataclasses.field(default_factory=Counter)  # violation kind -> cases
    harness_errors: list[str] = dataclasses.field(default_factory=list)  # this runner's own faults
    buckets: dict[str, Bucket] = dataclasses.field(default_factory=dict)

    def merge(self, other: Tally, keep: int) -> None:
        self.ran += other.ran
        self.failed += other.failed
        self.walls.extend(other.walls)
        self.child_cpu += other.child_cpu
        self.worker_cpu += other.worker_cpu
        self.by_kind.update(other.by_kind)
        self.harness_errors.extend(other.harness_errors)
        for sig, bucket in other.buckets.items():
            if sig in self.buckets:
                self.buckets[sig].merge(bucket, keep)
            else:
                self.buckets[sig] = bucket


@dataclasses.dataclass(frozen=True)
class Task:
    kind: Kind
    cases: int
    seed: int
    timeout: float
    keep: int


def run_task(task: Task) -> Tally:
    """Run `task.cases` hypothesis examples of one kind, recording every result (never stopping)."""
    tally = Tally()
    fuzzing.warm_up()
    cpu_started = time.process_time()

    @seed(task.seed)
    @settings(
        max_examples=task.cases,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        try:
            case = data.draw(fuzzing.cases(task.kind))
            result = fuzzing.run(case, timeout=task.timeout)
        except HypothesisException:
            raise
        except Exception as exc:  # a fault of the harness, not of the command: noted, and on
            tally.harness_errors.append(f"[{task.kind}] {type(exc).__name__}: {exc}")
            return
        tally.ran += 1
        tally.walls.append(result.wall_seconds)
        tally.child_cpu += result.cpu_seconds
        found = fuzzing.violations(result)
        if not found:
            return
        tally.failed += 1
        for kind in sorted({v.split(":", 1)[0] for v in found}):
            tally.by_kind[kind] += 1
        sig = fuzzing.signature(found)
        tally.buckets.setdefault(sig, Bucket(sig)).add(task.kind, case, found, task.keep)

    one()
    tally.worker_cpu = time.process_time() - cpu_started
    return tally


def plan(kinds: Sequence[Kind], cases: int, base_seed: int, timeout: float, keep: int) -> list[Task]:
    tasks: list[Task] = []
    per_kind = [cases // len(kinds) + (1 if i < cases % len(kinds) else 0) for i in range(len(kinds))]
    for index, (kind, count) in enumerate(zip(kinds, per_kind, strict=True)):
        for chunk, start in enumerate(range(0, count, CHUNK)):
            size = min(CHUNK, count - start)
            tasks.append(Task(kind, size, base_seed * 1000 + index * 100 + chunk, timeout, keep))
    return tasks


# --------------------------------------------------------------------------- saving failures

SEVERITY = {kind: rank for rank, kind in enumerate(fuzzing.VIOLATION_ORDER)}


def _severity(bucket: Bucket) -> tuple[int, int]:
    return SEVERITY.get(bucket.signature.split(":", 1)[0], len(SEVERITY)), -bucket.count


def save_failures(tally: Tally, max_saved: int, budget: int, minimize_timeout: float) -> list[Path]:
    known = {entry.recorded.get("signature") for entry in fuzzing.load_corpus()}
    saved: list[Path] = []
    for bucket in sorted(tally.buckets.values(), key=_severity):
        if len(saved) >= max_saved:
            print(f"  (stopped at --max-saved {max_saved})")
            break
        if bucket.signature in known or bucket.case is None:
            continue
        target = bucket.signature

        def keeps(candidate: Case, target: str = target) -> bool:
            result = fuzzing.run(candidate, timeout=minimize_timeout)
            return fuzzing.signature(fuzzing.violations(result)) == target

        started = time.perf_counter()
        is_slow = target.startswith(("timeout", "memory"))
        small = fuzzing.minimize(bucket.case, keeps, budget=min(budget, 30) if is_slow else budget)
        result = fuzzing.run(small, timeout=minimize_timeout)
        found = fuzzing.violations(result)
        if fuzzing.signature(found) != target:  # flaky: keep the case as found
            small, found = bucket.case, bucket.found
        elif small.size < bucket.case.size:
            small = dataclasses.replace(small, note=f"{small.note} [reduced from {bucket.case.size:,} bytes]")
        path = fuzzing.save_case(small, found)
        known.add(target)
        saved.append(path)
        took = time.perf_counter() - started
        print(f"  saved {path.relative_to(ROOT)} ({small.size:,} bytes, {took:.1f}s): {target}")
    return saved


# --------------------------------------------------------------------------- the report


def report(tally: Tally, wall: float, cpu: float, examples: int) -> None:
    walls = sorted(tally.walls) or [0.0]
    print(
        f"ran {tally.ran} cases in {wall:.1f}s wall; CPU {tally.child_cpu:.1f}s in the cases, "
        f"{tally.worker_cpu:.1f}s generating them, {cpu:.1f}s in this process"
    )
    print(
        f"per case: mean {statistics.fmean(walls) * 1000:.0f} ms, "
        f"median {walls[len(walls) // 2] * 1000:.0f} ms, "
        f"p95 {walls[int(len(walls) * 0.95)] * 1000:.0f} ms, max {walls[-1] * 1000:.0f} ms"
    )
    share = 100 * tally.failed / tally.ran if tally.ran else 0.0
    print(f"failed: {tally.failed} ({share:.1f}%), {len(tally.buckets)} distinct signatures")
    for error in tally.harness_errors[:10]:
        print(f"harness error (not a finding): {fuzzing._cut(error, 400)}")
    if not tally.failed:
        return
    print("\nby violation kind (cases):")
    for kind in fuzzing.VIOLATION_ORDER:
        if tally.by_kind[kind]:
            print(f"  {kind:20} {tally.by_kind[kind]}")
    print("\nby signature (most important first):")
    for bucket in sorted(tally.buckets.values(), key=_severity):
        kinds = ", ".join(f"{k} {n}" for k, n in bucket.kinds.most_common())
        print(f"\n  {bucket.count:5}  {bucket.signature}\n         input kinds: {kinds}")
        for violation in bucket.found[:2]:
            print(f"         violation: {fuzzing._cut(violation, 300)}")
        for example in bucket.examples[:examples]:
            print(f"         e.g. {fuzzing._cut(example, 300)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cases", type=int, default=10_000, help="cases in total (split over the kinds)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (same seed, same cases)")
    parser.add_argument("--kinds", nargs="+", choices=fuzzing.KINDS, default=list(fuzzing.KINDS))
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--timeout", type=float, default=fuzzing.DEFAULT_TIMEOUT, help="seconds a case")
    parser.add_argument("--examples", type=int, default=3, help="example inputs shown per signature")
    parser.add_argument(
        "--save-failures", action="store_true", help="write new failures to tests/fuzz_corpus"
    )
    parser.add_argument("--max-saved", type=int, default=40)
    parser.add_argument("--minimize-budget", type=int, default=100, help="runs spent reducing one case")
    parser.add_argument("--minimize-timeout", type=float, default=3.0, help="seconds a case while reducing")
    args = parser.parse_args(argv)

    kinds: list[Kind] = list(args.kinds)
    tasks = plan(kinds, args.cases, args.seed, args.timeout, args.examples)
    tally = Tally()
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        if args.jobs > 1:
            with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
                for part in pool.imap_unordered(run_task, tasks):
                    tally.merge(part, args.examples)
                    print(f"  ... {tally.ran} cases, {tally.failed} failed", file=sys.stderr, flush=True)
        else:
            for task in tasks:
                tally.merge(run_task(task), args.examples)
                print(f"  ... {tally.ran} cases, {tally.failed} failed", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted: the report covers the finished tasks", file=sys.stderr)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    report(tally, wall, cpu, args.examples)
    if args.save_failures and tally.failed:
        print("\nsaving failures:")
        save_failures(tally, args.max_saved, args.minimize_budget, args.minimize_timeout)
    return 1 if tally.failed or tally.harness_errors else 0


if __name__ == "__main__":
    sys.exit(main())
