"""Live telemetry rows: the answers of a telemetry read's queries -> per-window GpuTelemetry rows.

Owns reading the answers of `sources.prometheus_plan`'s queries into the same rows
`telemetry.windows.aggregate` computes from raw samples (the path from series to rows, `Grouping` and
`row`, is that module's), so that a snapshot directory and a live Prometheus give the same decisions:

- one label set per GPU, MIG instance and pod (Prometheus aggregates the series of each by the labels
  the mapping reads), known by a small integer id the caller gives it when it first decodes it
  (`labels[id]`): each is identified and attributed once (`Grouping`), however many queries and
  windows there are, then read window by window from dictionaries keyed by that id;
- utilisation per label set and window must be plausible (`telemetry.sanity`, a label set of n series
  held to n times a series' sample bound): an impossible answer makes its GPU's telemetry unusable
  (a `bad-telemetry` finding, and no row for that GPU in any window); a framebuffer aggregate that is
  NaN, infinite, negative or a DCGM blank is dropped (`bad-telemetry`);
- freshness: a row's newest sample in a window is the newest of its label sets' samples there, from
  `timestamp()` at `now` for the label sets heard from within the lookback, else from the late query's
  answer (`late_uuids` says which label sets need it: those of groups with samples in a window and
  none within the lookback); the instant fb used / free is a label set's newest value when its
  timestamp is within the lookback, the newest label set of a group winning (ties: the largest), and
  whether it is a label set naming a pod the view does not have;
- `stale-telemetry` findings for series no current pod holds whose newest sample is older than
  `telemetry.max_age`.

It must not do I/O, read the clock or judge pods.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from rebalancer.model import Finding, Pod, Telemetry, TelemetryWindow
from rebalancer.policy import TelemetryConfig, format_duration
from rebalancer.sources.prometheus_plan import Aggregate, Query
from rebalancer.telemetry.identity import (
    GroupKey,
    SeriesIdentity,
    bad_telemetry_finding,
    format_labels,
    is_valid_value,
)
from rebalancer.telemetry.sanity import UtilisationRule, unusable_gpu_finding
from rebalancer.telemetry.windows import (
    LOOKBACK_SECONDS,
    Admitted,
    Grouping,
    datetime_from_ms,
    epoch_ms,
    row,
    seconds_to_ms,
)

__all__ = ["LabelKey", "Rows", "Vector"]

LabelKey = tuple[tuple[str, str], ...]
# An answer: label set id -> value.
Vector = dict[int, float]
PodKey = tuple[str, str]


@dataclass(slots=True)
class _Window:
    """What one group's label sets say about one window."""

    util_sums: list[float] = field(default_factory=list)  # one per label set
    util_count: int = 0
    util_max: float | None = None
    used_max: float | None = None
    newest: int | None = None

    def seen(self, ms: int | None) -> None:
        if ms is not None and (self.newest is None or ms > self.newest):
            self.newest = ms

    def util_avg(self) -> float | None:
        """The mean of every sample of the group, as `telemetry.windows.aggregate` computes it."""
        if not self.util_sums:
            return None
        return math.fsum(self.util_sums) / self.util_count


@dataclass(slots=True)
class _Group:
    """One (node, UUID, MIG instance, pod) group: its identity, its windows, its instant framebuffer."""

    identity: SeriesIdentity
    windows: dict[int, _Window] = field(default_factory=dict)
    used_last: tuple[int, float] | None = None
    free_last: tuple[int, float] | None = None
    # The newest fb used of the group's label sets that named a pod the view does not have.
    unseen_used_last: tuple[int, float] | None = None

    @property
    def used_by_unseen_pod(self) -> bool:
        """The instant fb used came from a label set naming a pod the view does not have (as
        `telemetry.windows` judges it: the same newest sample, ties the largest value)."""
        return self.used_last is not None and self.unseen_used_last == self.used_last


@dataclass(frozen=True, slots=True)
class _Unusable:
    """The first impossible utilisation answer about a GPU: which series, over which window, and why."""

    identity: SeriesIdentity
    window: int
    problem: str


def _newer(current: tuple[int, float] | None, candidate: tuple[int, float]) -> tuple[int, float]:
    """The newest sample of a group; between label sets with the same timestamp, the largest value."""
    if current is None or candidate[0] > current[0]:
        return candidate
    if candidate[0] == current[0]:
        return (current[0], max(current[1], candidate[1]))
    return current


class Rows:
    """The answers of one telemetry read, identified once; `late_uuids`, `add_late`, then `build`.

    `answers` holds the answer of every query of the plan, keyed by label set id; `labels[id]` is that
    label set; `where` names the Prometheus in findings; `identity_of(id)` is the label set's identity,
    already resolved (`prometheus_labels.LabelSets.identity`; None: unusable, which is then identified
    here again, metric by metric, for its finding).
    """

    def __init__(
        self,
        cfg: TelemetryConfig,
        windows: Iterable[int],
        answers: Mapping[Query, Vector],
        labels: Sequence[LabelKey],
        *,
        now_ms: int,
        pods: Mapping[PodKey, Pod] | None,
        where: str,
        identity_of: Callable[[int], SeriesIdentity | None],
    ) -> None:
        self._cfg = cfg
        self._labels = labels
        self._windows = tuple(sorted(set(windows)))
        self._now = now_ms
        self._pods = pods
        self._where = where
        self._answers = {(q.metric, q.aggregate, q.window): vector for q, vector in answers.items()}
        self._ts = {q.metric: vector for q, vector in answers.items() if q.aggregate == "ts"}
        self._last = {q.metric: vector for q, vector in answers.items() if q.aggregate == "last"}
        self._series = next((v for q, v in answers.items() if q.aggregate == "series"), {})
        self._late: dict[str, dict[int, int]] = {}
        self.by_metric: dict[str, set[int]] = {}
        for query, vector in answers.items():
            self.by_metric.setdefault(query.metric, set()).update(vector)
        self.grouping: Grouping[_Group] = Grouping(cfg, pods, _Group)
        # Each label set's identity (None: unusable) and group, resolved once, in the order of the label
        # sets (which series is a metric's first unusable example, which completes a group's identity).
        self._identity: dict[int, SeriesIdentity | None] = {}
        self._group: dict[int, _Group] = {}
        self._unseen_pod: set[int] = set()  # label sets naming a pod the view does not have
        for key in sorted(set().union(*self.by_metric.values()), key=labels.__getitem__):
            known = identity_of(key)
            if known is not None:
                self._admit(key, self.grouping.admit(known))
                continue
            for metric, keys in self.by_metric.items():
                if key not in keys:
                    continue
                admitted = self.grouping.identify(metric, dict(labels[key]))  # an unusable one: per metric
                self._identity[key] = None
                if admitted is not None:
                    self._admit(key, admitted)
                    break

    def _admit(self, key: int, admitted: Admitted) -> None:
        self._identity[key] = admitted.identity
        self._group[key] = self.grouping.group(admitted.identity)
        if admitted.unseen_pod:
            self._unseen_pod.add(key)

    @property
    def identified(self) -> bool:
        return bool(self._group)

    def _get(self, metric: str, aggregate: Aggregate, window: int) -> Vector:
        return self._answers.get((metric, aggregate, window)) or {}

    # ---- the label sets that need the late query

    def late_uuids(self) -> dict[str, set[str]]:
        """UUID label name -> values, of the label sets of every group that has samples in a window but
        none within the lookback (whose newest sample only the late query can find)."""
        if max(self._windows, default=0) <= LOOKBACK_SECONDS:
            return {}
        cfg = self._cfg
        fresh: set[int] = set()
        for metric in dict.fromkeys((cfg.utilization.name, cfg.fb_used.name, cfg.fb_free.name)):
            for key in self._ts.get(metric, {}):
                if (group := self._group.get(key)) is not None:
                    fresh.add(id(group))
        uuids: dict[str, set[str]] = {}
        for key, group in self._group.items():
            if id(group) in fresh:
                continue
            labels = dict(self._labels[key])
            for name in cfg.labels.uuid:
                if labels.get(name):
                    uuids.setdefault(name, set()).add(labels[name])
                    break
        return uuids

    def add_late(self, metric: str, key: int, seconds: float) -> None:
        """The late query's newest sample timestamp of `metric` for `key` (ignored unless needed)."""
        if key in self._group and key not in self._ts.get(metric, {}):
            self._late.setdefault(metric, {})[key] = seconds_to_ms(seconds)

    # ---- rows

    def _newest_ms(self, metric: str) -> dict[int, int]:
        """Each label set's newest sample of `metric` (ms): within the lookback, else the late query's."""
        newest = {key: seconds_to_ms(stamp) for key, stamp in self._ts.get(metric, {}).items()}
        for key, ms in self._late.get(metric, {}).items():
            newest.setdefault(key, ms)
        return newest

    def build(self) -> tuple[Telemetry, list[Finding]]:
        """Per window, one row per group with a sample; the findings about the answers."""
        cfg = self._cfg
        bad: dict[tuple[str, int], str] = {}
        unusable: dict[tuple[str, str], _Unusable] = {}
        self._instants(bad)
        newest_ms = {metric: self._newest_ms(metric) for metric in self.by_metric}
        for window in self._windows:
            self._read_window(window, newest_ms, bad, unusable)
        ordered = [
            group
            for group in self.grouping.ordered()
            # an impossible answer about a GPU discredits all of its telemetry
            if not unusable or (group.identity.node, group.identity.uuid) not in unusable
        ]
        moments: dict[int, datetime] = {}  # rows of one scrape share their newest sample's time
        windows: dict[int, TelemetryWindow] = {}
        for window in self._windows:
            rows = []
            for group in ordered:
                acc = group.windows.get(window)
                newest = acc.newest if acc is not None else None
                used_last, free_last = group.used_last, group.free_last
                if used_last is not None and (newest is None or used_last[0] > newest):
                    newest = used_last[0]
                if free_last is not None and (newest is None or free_last[0] > newest):
                    newest = free_last[0]
                if newest is None:
                    continue
                moment = moments.get(newest)
                if moment is None:
                    moment = moments[newest] = datetime_from_ms(newest)
                fb_used = used_last[1] if used_last is not None else None
                fb_free = free_last[1] if free_last is not None else None
                by_unseen_pod = group.used_by_unseen_pod
                if acc is None:
                    only = row(
                        group.identity,
                        cfg,
                        fb_used=fb_used,
                        fb_free=fb_free,
                        fb_used_by_unseen_pod=by_unseen_pod,
                        newest_sample=moment,
                    )
                    rows.append(only)
                    continue
                rows.append(
                    row(
                        group.identity,
                        cfg,
                        util_avg=acc.util_avg(),
                        util_max=acc.util_max,
                        util_samples=acc.util_count,
                        fb_used=fb_used,
                        fb_used_max=acc.used_max,
                        fb_free=fb_free,
                        fb_used_by_unseen_pod=by_unseen_pod,
                        newest_sample=moment,
                    )
                )
            windows[window] = TelemetryWindow(window_seconds=window, gpus=tuple(rows))

        findings = self.grouping.unusable_findings()
        findings.extend(
            unusable_gpu_finding(u.identity, cfg.utilization.name, u.window, self._where, u.problem)
            for _, u in sorted(unusable.items())
        )
        labels = self._labels
        for (metric, key), what in sorted(bad.items(), key=lambda item: (item[0][0], labels[item[0][1]])):
            identity = self._identity[key]
            if identity is None:  # a bug: only label sets with a group (an identity) are judged
                raise AssertionError(
                    f"bad telemetry of {metric}{format_labels(labels[key])}, which has no identity"
                )
            findings.append(
                bad_telemetry_finding(
                    identity,
                    f"{metric}{format_labels(labels[key])} from {self._where}: {what} is NaN, "
                    "infinite, negative or a DCGM blank value; ignored",
                )
            )
        telemetry = Telemetry(available=True, windows=windows)
        findings.extend(_stale_findings(telemetry, self.grouping.claimed, self._pods, self._now, cfg.max_age))
        return telemetry, findings

    def _instants(self, bad: dict[tuple[str, int], str]) -> None:
        """Each group's fb used / free at `now`: its newest label set's value within the lookback."""
        cfg = self._cfg
        lookback = self._now - LOOKBACK_SECONDS * 1000
        for metric, role in ((cfg.fb_used.name, "used"), (cfg.fb_free.name, "free")):
            stamps = self._ts.get(metric, {})
            for key, value in self._last.get(metric, {}).items():
                stamp = stamps.get(key)
                if stamp is None or (group := self._group.get(key)) is None:
                    continue  # nothing within the lookback: no instant value
                ms = seconds_to_ms(stamp)
                if ms < lookback:
                    continue
                if not is_valid_value(value):
                    bad.setdefault((metric, key), "its newest sample")
                    continue
                if role == "used":
                    group.used_last = _newer(group.used_last, (ms, value))
                    if key in self._unseen_pod:
                        group.unseen_used_last = _newer(group.unseen_used_last, (ms, value))
                else:
                    group.free_last = _newer(group.free_last, (ms, value))

    def _read_window(
        self,
        window: int,
        newest_ms: Mapping[str, Mapping[int, int]],
        bad: dict[tuple[str, int], str],
        unusable: dict[tuple[str, str], _Unusable],
    ) -> None:
        cfg = self._cfg
        util, used, free = cfg.utilization.name, cfg.fb_used.name, cfg.fb_free.name
        lo = self._now - window * 1000
        group_of = self._group.get

        def opened(group: _Group) -> _Window:  # the group's first label set in this window
            found = group.windows[window] = _Window()
            return found

        problem_of = UtilisationRule(window, cfg.scrape_interval, cfg.utilization.scale).problem

        counts, sums = self._get(util, "count", window), self._get(util, "sum", window)
        maxes, series = self._get(util, "max", window), self._series
        first_problem: dict[tuple[str, str], tuple[LabelKey, _Unusable]] = {}
        labels = self._labels
        util_newest = newest_ms.get(util, {})
        for key in {*counts, *sums, *maxes}:
            count, total, peak = counts.get(key), sums.get(key), maxes.get(key)
            problem = problem_of(count, total, peak, series.get(key, 1.0))
            if problem is not None:
                if (identity := self._identity.get(key)) is not None:
                    gpu = (identity.node, identity.uuid)
                    held = first_problem.get(gpu)
                    if gpu not in unusable and (held is None or labels[key] < held[0]):
                        first_problem[gpu] = (labels[key], _Unusable(identity, window, problem))
                continue
            if count is None or total is None or peak is None:  # a bug: a partial answer is a problem
                raise AssertionError(f"UtilisationRule passed a partial answer: {count}, {total}, {peak}")
            if (group := group_of(key)) is None:
                continue
            acc = group.windows.get(window) or opened(group)
            acc.util_sums.append(total)
            acc.util_count += int(count)
            if acc.util_max is None or peak > acc.util_max:
                acc.util_max = peak
            if (ms := util_newest.get(key)) is not None and ms >= lo:
                acc.seen(ms)

        unusable.update((gpu, found) for gpu, (_, found) in first_problem.items())

        used_newest = newest_ms.get(used, {})
        what = f"its {format_duration(window)} maximum"
        for key, peak in self._get(used, "max", window).items():
            if (group := group_of(key)) is None:
                continue
            if not _valid(bad, used, key, peak, what):
                continue
            acc = group.windows.get(window) or opened(group)
            if acc.used_max is None or peak > acc.used_max:
                acc.used_max = peak
            if (ms := used_newest.get(key)) is not None and ms >= lo:
                acc.seen(ms)

        if free != used:
            for key, ms in newest_ms.get(free, {}).items():
                if ms >= lo and (group := group_of(key)) is not None:
                    (group.windows.get(window) or opened(group)).seen(ms)


def _valid(bad: dict[tuple[str, int], str], metric: str, key: int, value: float, what: str) -> bool:
    if not is_valid_value(value):
        bad.setdefault((metric, key), what)
        return False
    return True


def _stale_findings(
    telemetry: Telemetry,
    claimed: Mapping[GroupKey, set[PodKey]],
    pods: Mapping[PodKey, Pod] | None,
    now_ms: int,
    max_age: int,
) -> list[Finding]:
    """Series no current pod holds whose newest sample is older than `max_age` (deleted pods, mostly)."""
    if not telemetry.windows:
        return []
    widest = telemetry.windows[max(telemetry.windows)]
    findings: list[Finding] = []
    for gpu in widest.gpus:
        if gpu.pod_key is not None or gpu.newest_sample is None:
            continue
        age_ms = now_ms - epoch_ms(gpu.newest_sample)
        if age_ms <= max_age * 1000:
            continue
        gone: list[tuple[str | None, str | None]] = sorted(
            claimed.get((gpu.node, gpu.uuid, gpu.mig_instance, None, None), ())
        )
        for namespace, name in gone or [(None, None)]:
            if name is None:
                whose = "no pod"
            elif pods is not None and (namespace, name) in pods:
                whose = f"pod {namespace}/{name}, which holds no GPU"
            else:
                whose = f"pod {namespace}/{name}, which no longer exists"
            findings.append(
                Finding(
                    kind="stale-telemetry",
                    node=gpu.node,
                    gpu=gpu.uuid,
                    namespace=namespace,
                    pod=name,
                    detail=(
                        f"newest sample of the series of {whose} on this GPU is "
                        f"{format_duration(age_ms // 1000)} old (max {format_duration(max_age)}); ignored"
                    ),
                )
            )
    return findings
