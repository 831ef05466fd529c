"""The DCGM history of a snapshot directory as raw series, for reports over a period.

Owns reading every `*.prom` / `*.om` file of a snapshot directory (DESIGN §4) into its series with their
samples, for `rebalancer waste` and `rebalancer advise`, which read a period rather than the window
aggregates of `sources.files`, and `with_directory_usage`: a cycle's snapshot with the long-window usage
its policy asks for (`LoadedPolicy.usage_period`, `Snapshot.usage`) over the window ending at its `now`;
a directory without framebuffer history gets none (the strategy is then skipped and says why). Files are
found and opened as `sources.files` finds and opens them
(`snapshot_layout.walk`: subdirectories, gzip, hidden files skipped) and parsed by the same reader
(`telemetry.exposition.parse_exposition_lines`: an `.om` file, or a `.prom` file with a `# EOF` line,
is OpenMetrics with timestamps in seconds; otherwise Prometheus text format, in milliseconds).

Anything unreadable or malformed raises `SnapshotError` listing every problem, each naming its file. It
must not read the clock, summarise or judge the series (`rebalancer.usage` summarises usage), or write
anything.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Collection
from pathlib import Path

from rebalancer.model import Snapshot
from rebalancer.period import period
from rebalancer.policy import LoadedPolicy
from rebalancer.sources.files import METRIC_SUFFIXES, SnapshotError
from rebalancer.sources.snapshot_layout import SnapshotFile, read_problem, walk
from rebalancer.telemetry.exposition import ExpositionError, Series, parse_exposition_lines
from rebalancer.telemetry.identity import resolve_preset
from rebalancer.usage import UsageHistory, usage_from_samples, usage_metrics

__all__ = ["snapshot_series", "with_directory_usage"]


def _openmetrics(file: SnapshotFile) -> bool:
    if file.suffix == ".om":
        return True
    with file.open_text() as handle:
        return any(line.strip() == "# EOF" for line in handle)


def snapshot_series(root: Path, metrics: Collection[str]) -> tuple[list[Series], int]:
    """The series of `metrics` in every exposition file under `root`, and how many such files there are.

    Raises SnapshotError."""
    if not root.is_dir():
        raise SnapshotError([f"{root}: not a snapshot directory"])
    problems: list[str] = []
    series: list[Series] = []
    files = 0
    try:
        for file in walk(root, problems):
            if file.suffix not in METRIC_SUFFIXES:
                continue
            files += 1
            try:
                openmetrics = _openmetrics(file)
                with file.open_text() as handle:
                    series.extend(
                        parse_exposition_lines(
                            handle, source=str(file.path), openmetrics=openmetrics, metrics=metrics
                        )
                    )
            except ExpositionError as exc:
                problems.append(str(exc))
            except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
                problems.append(read_problem(file.path, exc))
    except OSError as exc:
        raise SnapshotError([f"{root}: cannot read directory: {exc.strerror or exc}"]) from None
    if problems:
        raise SnapshotError(problems)
    return series, files


def with_directory_usage(snapshot: Snapshot, root: Path, loaded: LoadedPolicy) -> Snapshot:
    """`snapshot` with the usage its policy asks for, from the directory's history; unchanged when no
    strategy reads usage or the directory holds no framebuffer history. Raises SnapshotError."""
    wanted = loaded.usage_period()
    cfg = loaded.policy.telemetry
    if wanted is None or cfg is None:
        return snapshot
    window = period(snapshot.now, *wanted)
    metrics = usage_metrics(cfg)
    series, _ = snapshot_series(root, tuple(metric.name for metric in metrics.values()))
    if not any(one.metric == resolve_preset(cfg).fb_used.name for one in series):
        return snapshot
    usage = usage_from_samples(series, cfg, window)
    return dataclasses.replace(
        snapshot, usage=UsageHistory(period=window, series=tuple(usage), source=f"snapshot {root}")
    )
