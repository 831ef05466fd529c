"""Reading the Alibaba cluster-trace-gpu-v2023 CSV files, and turning a pod list into a workload.

Owns the input semantics of `rebalancer simulate`:

- node CSV `sn,cpu_milli,memory_mib,gpu,model`: GPU nodes only (rows without GPUs or model are skipped);
- pod CSV `name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,creation_time,
  deletion_time,scheduled_time]`: GPU pods only (CPU-only pods are dropped), pods never scheduled (no
  `scheduled_time`) are dropped, `gpu_spec` becomes a de-duplicated set of allowed GPU models (empty or
  `nan`: any model), `pod_phase` is ignored (the times say what happened). The `multigpu*` files carry
  only the first five columns: they parse, but have no times to replay;
- the window [min deletion_time, max deletion_time]; a pod runs from `scheduled_time` to
  `deletion_time`, clipped to the window (pods alive at its start are the warm start);
- load scaling: `compress` divides arrival times (relative to the window start) by C, keeping
  durations, and shrinks the window to L / C; then `replicas` superposes K copies, copy 0 as it is and
  copy i >= 1 with every arrival shifted circularly inside the window by one seeded random offset
  (durations kept; whatever runs past the window end is outside the replay).

Refused, each naming file and line: a row with more or fewer fields than the header, a number that is
not one (or negative), a pod deleted before it was scheduled, a time past ten years of seconds, and a
`compress` that would stretch the window past ten years (the replay steps through all of it).

It must not simulate anything, read the clock or know about Kubernetes objects: it produces plain
`TraceNode`, `TracePod` and `Job` values.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rebalancer.durations import MAX_DURATION_SECONDS
from rebalancer.errors import InputError
from rebalancer.model import MILLI_PER_GPU

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_TIME_COLUMNS = ("scheduled_time", "deletion_time")
_MISSING = ("", "nan", "none", "null")
# Trace times are seconds from the trace's start, and its window at most this long: a replay steps
# through every interval of it.
MAX_TRACE_SECONDS = MAX_DURATION_SECONDS


class TraceError(InputError):
    """A trace file that cannot be used; `problems` holds one line per problem, each naming where."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One GPU node of the node CSV."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    """One GPU pod of the pod CSV. Times are None when the column is absent or empty."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per device; < 1000 is a share of one device
    gpu_spec: tuple[str, ...]  # allowed GPU models, sorted and de-duplicated; () = any model
    scheduled_time: float | None = None
    deletion_time: float | None = None

    @property
    def gpu_demand_milli(self) -> int:
        return self.num_gpu * self.gpu_milli


@dataclass(frozen=True)
class PodTrace:
    """The GPU pods of a pod CSV, and what was dropped on the way."""

    pods: tuple[TracePod, ...]
    has_times: bool
    cpu_only_dropped: int = 0
    unscheduled_dropped: int = 0


@dataclass(frozen=True, slots=True)
class Window:
    """The replayed span of simulated time, in trace seconds."""

    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Job:
    """One simulated pod: a copy of a trace pod that arrives at `arrival` and ends at `end`, whatever
    happens to it in between (the trace decides when a workload ends)."""

    index: int
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    models: frozenset[str] | None  # allowed GPU models; None = any
    arrival: float
    end: float

    @property
    def gpu_demand_milli(self) -> int:
        return self.num_gpu * self.gpu_milli


# --------------------------------------------------------------------------- CSV parsing


def _rows(path: Path, problems: list[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV file with a header; a row of more or fewer fields than the header is
    a problem, and skipped. TraceError when the file cannot be read."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise TraceError([f"{path}: empty file, expected a CSV header"])
            names = [name.strip() for name in header]
            for fields in reader:
                if not fields:  # a blank line, as DictReader skips it
                    continue
                if len(fields) != len(names):
                    where = f"{path}:{reader.line_num}"
                    problems.append(
                        f"{where}: expected {len(names)} fields as in the header, got {len(fields)}"
                    )
                    continue
                yield (
                    reader.line_num,
                    {name: value.strip() for name, value in zip(names, fields, strict=True)},
                )
    except OSError as exc:
        raise TraceError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise TraceError([f"{path}: not UTF-8 text ({exc.reason})"]) from None
    except csv.Error as exc:
        raise TraceError([f"{path}: malformed CSV: {exc}"]) from None


def _header(path: Path) -> tuple[str, ...]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            first = next(csv.reader(handle), None)
    except OSError as exc:
        raise TraceError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TraceError([f"{path}: cannot read the CSV header: {exc}"]) from None
    if not first:
        raise TraceError([f"{path}: empty file, expected a CSV header"])
    return tuple(column.strip() for column in first)


def _require(path: Path, header: tuple[str, ...], columns: Iterable[str]) -> None:
    missing = [column for column in columns if column not in header]
    if missing:
        raise TraceError([f"{path}: missing column(s) {', '.join(missing)} (header: {','.join(header)})"])


def _is_missing(text: str) -> bool:
    return text.lower() in _MISSING


def _number(
    text: str, *, where: str, column: str, problems: list[str], most: float | None = None
) -> float | None:
    if _is_missing(text):
        return None
    try:
        value = float(text)
    except ValueError:
        problems.append(f"{where}: {column}: not a number: {text!r}")
        return None
    if not math.isfinite(value) or value < 0:
        problems.append(f"{where}: {column}: expected a finite, non-negative number, got {text!r}")
        return None
    if most is not None and value > most:
        problems.append(f"{where}: {column}: {text} is more than ten years of seconds ({MAX_TRACE_SECONDS})")
        return None
    return value


def _integer(text: str, *, where: str, column: str, problems: list[str], default: int = 0) -> int:
    value = _number(text, where=where, column=column, problems=problems)
    if value is None:
        return default
    if value != int(value):
        problems.append(f"{where}: {column}: expected a whole number, got {text!r}")
        return default
    return int(value)


def parse_gpu_spec(text: str) -> tuple[str, ...]:
    """`"V100M16|V100M32|V100M32"` -> `("V100M16", "V100M32")`; empty or `nan` -> `()` (any model)."""
    if _is_missing(text):
        return ()
    return tuple(sorted({part.strip() for part in text.split("|") if not _is_missing(part.strip())}))


def _raise_if(problems: list[str], limit: int = 20) -> None:
    if problems:
        shown = problems[:limit]
        if len(problems) > limit:
            shown.append(f"... and {len(problems) - limit} more problems")
        raise TraceError(shown)


def load_nodes(path: str | Path) -> tuple[TraceNode, ...]:
    """The GPU nodes of a node CSV (rows with no GPU or no model are CPU nodes and skipped)."""
    path = Path(path)
    _require(path, _header(path), NODE_COLUMNS)
    nodes: list[TraceNode] = []
    problems: list[str] = []
    for line, row in _rows(path, problems):
        where = f"{path}:{line}"
        gpus = _integer(row["gpu"], where=where, column="gpu", problems=problems)
        model = row["model"]
        if gpus <= 0 or _is_missing(model):
            continue
        nodes.append(
            TraceNode(
                name=row["sn"] or f"node-{line}",
                cpu_milli=_integer(row["cpu_milli"], where=where, column="cpu_milli", problems=problems),
                memory_mib=_integer(row["memory_mib"], where=where, column="memory_mib", problems=problems),
                gpus=gpus,
                model=model,
            )
        )
    _raise_if(problems)
    if not nodes:
        raise TraceError([f"{path}: no GPU nodes (rows with gpu > 0 and a model)"])
    names = [node.name for node in nodes]
    if len(set(names)) != len(names):
        duplicates = sorted({name for name in names if names.count(name) > 1})
        raise TraceError([f"{path}: duplicate node name(s): {', '.join(duplicates[:5])}"])
    return tuple(nodes)


def load_pods(path: str | Path) -> PodTrace:
    """The GPU pods of a pod CSV that were scheduled; CPU-only and never-scheduled pods are counted and
    dropped. A file without the time columns parses (every pod has `scheduled_time` None) with
    `has_times` False."""
    path = Path(path)
    header = _header(path)
    _require(path, header, POD_COLUMNS)
    has_times = all(column in header for column in POD_TIME_COLUMNS)
    has_spec = "gpu_spec" in header
    pods: list[TracePod] = []
    problems: list[str] = []
    cpu_only = unscheduled = 0
    for line, row in _rows(path, problems):
        where = f"{path}:{line}"
        num_gpu = _integer(row["num_gpu"], where=where, column="num_gpu", problems=problems)
        if num_gpu <= 0:
            cpu_only += 1
            continue
        gpu_milli = _integer(
            row["gpu_milli"], where=where, column="gpu_milli", problems=problems, default=MILLI_PER_GPU
        )
        if gpu_milli == 0:
            gpu_milli = MILLI_PER_GPU  # a GPU pod without a share asks for whole devices
        if gpu_milli > MILLI_PER_GPU:
            problems.append(f"{where}: gpu_milli: {gpu_milli} is more than one device ({MILLI_PER_GPU})")
            continue
        scheduled = deletion = None
        if has_times:
            scheduled, deletion = (
                _number(row[column], where=where, column=column, problems=problems, most=MAX_TRACE_SECONDS)
                for column in POD_TIME_COLUMNS
            )
            if scheduled is None:
                unscheduled += 1
                continue
            if deletion is None:
                if _is_missing(row["deletion_time"]):  # else the value's problem is said already
                    problems.append(f"{where}: deletion_time: a scheduled pod needs a deletion time")
                continue
            if deletion < scheduled:
                problems.append(
                    f"{where}: deletion_time {row['deletion_time']} is before scheduled_time "
                    f"{row['scheduled_time']}"
                )
                continue
        pods.append(
            TracePod(
                name=row["name"] or f"pod-{line}",
                cpu_milli=_integer(row["cpu_milli"], where=where, column="cpu_milli", problems=problems),
                memory_mib=_integer(row["memory_mib"], where=where, column="memory_mib", problems=problems),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_spec=parse_gpu_spec(row.get("gpu_spec", "")) if has_spec else (),
                scheduled_time=scheduled,
                deletion_time=deletion,
            )
        )
    _raise_if(problems)
    return PodTrace(
        pods=tuple(pods), has_times=has_times, cpu_only_dropped=cpu_only, unscheduled_dropped=unscheduled
    )


# --------------------------------------------------------------------------- workload


def trace_window(pods: Sequence[TracePod]) -> Window:
    """[min deletion_time, max deletion_time] of the scheduled pods."""
    deletions = [pod.deletion_time for pod in pods if pod.deletion_time is not None]
    if not deletions:
        raise TraceError(["the pod list has no scheduled pod with a deletion time: nothing to replay"])
    return Window(start=min(deletions), end=max(deletions))


def replica_offsets(replicas: int, seed: int, length: float) -> tuple[float, ...]:
    """Shift of each copy: 0 for copy 0, then one seeded uniform draw in [0, length) per copy."""
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    rng = random.Random(seed)
    return (0.0, *(rng.random() * length for _ in range(replicas - 1)))


def build_jobs(
    pods: Sequence[TracePod], *, replicas: int = 1, seed: int = 1, compress: float = 1.0
) -> tuple[Window, tuple[Job, ...]]:
    """The replay window and every simulated pod, sorted by arrival (then by copy and trace order).

    Each trace pod runs [max(scheduled, W0), deletion); with `compress` C its arrival becomes
    W0 + (arrival - W0) / C, its duration unchanged, and the window [W0, W0 + L / C]. Copy i >= 1
    arrives at W0 + ((arrival - W0 + offset_i) mod L'), L' the (compressed) window length. Pods with
    nothing left to run inside the window are left out.
    """
    if compress <= 0 or not math.isfinite(compress):
        raise ValueError("compress must be a positive number")
    window = trace_window(pods)
    if window.length <= 0:
        raise TraceError(["every pod ends at the same instant: the replay window is empty"])
    start = window.start
    length = window.length / compress
    if length > MAX_TRACE_SECONDS:  # a replay steps through its window: this one would step for ever
        raise TraceError(
            [
                f"--compress {compress:g} stretches the {window.length:g}-second replay window past ten "
                f"years ({MAX_TRACE_SECONDS} seconds)"
            ]
        )
    window = Window(start=start, end=start + length)
    base: list[tuple[TracePod, float, float]] = []  # pod, arrival, duration
    for pod in pods:
        if pod.scheduled_time is None or pod.deletion_time is None:
            continue
        arrival = max(pod.scheduled_time, start)
        duration = pod.deletion_time - arrival
        if duration <= 0:
            continue
        base.append((pod, start + (arrival - start) / compress, duration))
    offsets = replica_offsets(replicas, seed, length)
    staged: list[tuple[float, int, int, TracePod, float, float]] = []
    for copy, offset in enumerate(offsets):
        for order, (pod, arrival, duration) in enumerate(base):
            shifted = start + math.fmod(arrival - start + offset, length) if offset else arrival
            if shifted >= window.end:
                continue
            staged.append((shifted, copy, order, pod, shifted, shifted + duration))
    staged.sort(key=lambda item: (item[0], item[1], item[2]))
    names = [pod.name for pod, _, _ in base]
    unique = len(set(names)) == len(names)

    def name_of(pod: TracePod, copy: int, order: int) -> str:
        name = pod.name if unique else f"{pod.name}-{order}"
        return name if replicas == 1 else f"{name}-r{copy}"

    jobs = tuple(
        Job(
            index=index,
            name=name_of(pod, copy, order),
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
            num_gpu=pod.num_gpu,
            gpu_milli=pod.gpu_milli,
            models=frozenset(pod.gpu_spec) if pod.gpu_spec else None,
            arrival=arrival,
            end=end,
        )
        for index, (_, copy, order, pod, arrival, end) in enumerate(staged)
    )
    return window, jobs
