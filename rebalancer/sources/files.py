"""The snapshot-directory source (DESIGN §4): a directory an operator can make with kubectl -> Snapshot.

Owns reading one directory and its subdirectories (which files, and how they are opened and gunzipped,
is `snapshot_layout`'s):

- every `*.json` / `*.yaml` / `*.yml` file (except the top-level `snapshot.yaml`) holding Kubernetes
  objects or `List`s of them (as `kubectl get nodes,pods,pdb -A -o json` prints): Node, Pod,
  PodDisruptionBudget, and the controller kinds of `workloads.KINDS` (ReplicaSet, Deployment,
  StatefulSet, Job, JobSet, LeaderWorkerSet, Notebook, InferenceService: as `kubectl get
  rs,deploy,sts,jobs -A -o json` prints them, or the `workloads.json` that `rebalancer snapshot` writes)
  into `Snapshot.controllers`, every one read, so that workloads resolve as against the live cluster;
  other kinds (a CronJob too: a Job is the workload), and documents with neither `apiVersion` nor
  `kind` (a policy file kept alongside), are ignored and reported in an `ignored-objects` finding (the
  policy file in use is skipped silently). Each file is read by `snapshot_objects`. Nodes without a
  single Pod object are a `partial-cluster-view` finding, and the telemetry's pod labels are then taken
  as they are (a GPU a pod holds is not read as leaked because the pods were left out);
- every `*.prom` / `*.om` file: DCGM exporter series in Prometheus text format or OpenMetrics (an `.om`
  file must be OpenMetrics, ending with `# EOF`), aggregated for the policy's telemetry windows;
- the optional `snapshot.yaml` with `now: <RFC 3339 with timezone>`; without it `now` is the newest
  sample timestamp;
- the optional top-level `telemetry-windows.json` (rebalancer.sources.telemetry_aggregates): the
  window aggregates themselves. When they fit the policy and the snapshot's `now` the raw history is
  not read; when they do not, it is, and a `telemetry-aggregates-unused` finding (and a warning in the
  log) says why. A malformed file is a SnapshotError naming file and field. `aggregate_snapshot_dir`
  computes them from the raw history for `rebalancer aggregate` and `rebalancer snapshot`;
- any other file is listed in an `unread-files` finding.

A JSON `List` is read item by item from the mapped file, each item dropped once it is in the model, and
a large JSON file is never held whole (`snapshot_objects`); expositions are read line by line. So a
5,000-node cluster's dump and hour of DCGM history fit in under 1 GiB.

Anything that makes the snapshot unusable (unreadable directory or file, invalid JSON / YAML / exposition,
malformed or duplicate objects, no usable `now`) raises `SnapshotError` listing every problem, each naming
its file; problems that only lose part of the picture (a pod bound to an unknown node, bad samples) become
findings in `Snapshot.findings`. This module must not read the clock, talk to a cluster or Prometheus, or
write anything: the reading of object files lives in `snapshot_objects`, object translation in
`kube_objects` and `kube_pods`, telemetry maths in `rebalancer.telemetry`.
"""

from __future__ import annotations

import logging
import zlib
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import yaml

from rebalancer import rfc3339, yaml_input
from rebalancer.errors import InputError
from rebalancer.gcpause import collector_paused
from rebalancer.model import Finding, Pod, Snapshot, Telemetry
from rebalancer.policy import LoadedPolicy, TelemetryConfig, duplicate_keys
from rebalancer.sources.kube_objects import split_unbound
from rebalancer.sources.snapshot_layout import SnapshotFile, read_problem, walk
from rebalancer.sources.snapshot_objects import Collected, read_objects, read_text, yaml_problem
from rebalancer.sources.telemetry_aggregates import (
    AGGREGATES_FILE,
    Aggregates,
    aggregates_of,
    mismatch,
    read_aggregates,
)
from rebalancer.telemetry.exposition import ExpositionError, Series, parse_exposition_lines
from rebalancer.telemetry.identity import telemetry_metrics
from rebalancer.telemetry.windows import aggregate, unknown_node_findings
from rebalancer.wording import clip, plural, quoted

__all__ = [
    "AGGREGATES_UNUSED",
    "METRIC_SUFFIXES",
    "NO_POD_OBJECTS",
    "OBJECT_SUFFIXES",
    "SNAPSHOT_FILE",
    "SnapshotError",
    "aggregate_snapshot_dir",
    "load_snapshot_dir",
]

SNAPSHOT_FILE = "snapshot.yaml"
NO_POD_OBJECTS = (
    "the snapshot holds nodes but no Pod objects (were pods left out of `kubectl get`?): nothing can be "
    "moved, and the DCGM series' pod labels are taken as they are"
)
# The finding when a snapshot's telemetry-windows.json does not fit the policy or the snapshot.
AGGREGATES_UNUSED: Final = "telemetry-aggregates-unused"
log = logging.getLogger(__name__)
OBJECT_SUFFIXES = (".json", ".yaml", ".yml")
METRIC_SUFFIXES = (".prom", ".om")

_NOW_HINT = (
    f"add {SNAPSHOT_FILE} with a line such as `now: {rfc3339.EXAMPLE}` (RFC 3339 with a timezone), "
    "or include DCGM samples with timestamps"
)


class SnapshotError(InputError):
    """A snapshot directory that cannot be used; `problems` holds one line per problem, each naming where."""


# --------------------------------------------------------------------------- expositions


def _read_exposition(
    file: SnapshotFile, metrics: Collection[str] | None, problems: list[str]
) -> list[Series]:
    """The series of a `.prom` / `.om` file, read line by line (an exposition of a large cluster's
    history is hundreds of MB). `.prom` is OpenMetrics when it has a `# EOF` line."""
    try:
        openmetrics = file.suffix == ".om" or _has_eof_line(file)
        with file.open_text() as handle:
            return parse_exposition_lines(
                handle, source=str(file.path), openmetrics=openmetrics, metrics=metrics
            )
    except ExpositionError as exc:
        problems.append(str(exc))
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        problems.append(read_problem(file.path, exc))
    return []


def _has_eof_line(file: SnapshotFile) -> bool:
    with file.open_text() as handle:
        return any(line.strip() == "# EOF" for line in handle)


# --------------------------------------------------------------------------- now


def _parse_now(file: SnapshotFile, problems: list[str]) -> datetime | None:
    text = read_text(file, problems)
    if text is None:
        return None
    try:
        root, doc = yaml_input.compose_and_load(text)
    except yaml.YAMLError as exc:
        problems.append(yaml_problem(file.path, exc, text))
        return None
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        problems.append(f"{file.path}: expected a mapping such as `now: {rfc3339.EXAMPLE}`")
        return None
    assert isinstance(root, yaml.MappingNode)  # the document is a mapping
    for key, _ in root.value:  # a misspelt `now` is no `now`: never silently the newest sample's instant
        if getattr(key, "value", None) != "now":
            name, line = clip(str(getattr(key, "value", "?")), 60), key.start_mark.line + 1
            problems.append(f"{file.path}:{line}: {name}: unknown key ({SNAPSHOT_FILE} holds only `now`)")
    problems.extend(duplicate_keys(root, str(file.path)))
    value = doc.get("now")
    if value is None:
        return None
    where = f"{file.path}:{_key_line(root, 'now')}"
    if not isinstance(value, str):
        problems.append(f"{where}: now: expected an RFC 3339 timestamp, got {quoted(value)}")
        return None
    try:
        return rfc3339.parse(value.strip()).astimezone(UTC)
    except ValueError as exc:
        problems.append(f"{where}: now: {exc}")
        return None


def _key_line(root: yaml.Node | None, key: str) -> int:
    """1-based line of `key`'s value in a mapping document (of the document when not found)."""
    if isinstance(root, yaml.MappingNode):
        for name, value in root.value:
            if getattr(name, "value", None) == key:
                return int(value.start_mark.line) + 1
    return int(root.start_mark.line) + 1 if root is not None else 1


def _unread_finding(unread: Sequence[str], shown: int = 5) -> Finding:
    names = ", ".join(unread[:shown])
    more = f" and {len(unread) - shown} more" if len(unread) > shown else ""
    kinds = ", ".join(OBJECT_SUFFIXES + METRIC_SUFFIXES[:-1])
    return Finding(
        kind="unread-files",
        detail=(
            f"not read (a snapshot holds {kinds} and {METRIC_SUFFIXES[-1]} files, optionally gzipped): "
            f"{plural(len(unread), 'file')}: {names}{more}"
        ),
    )


def _handed_over(series: list[Series]) -> Iterator[Series]:
    """The series in order, each dropped from the list as it is handed over, so that its samples (millions
    for a large cluster's history) can go once aggregated."""
    series.reverse()
    while series:
        yield series.pop()


def _newest_sample(series: Sequence[Series]) -> datetime | None:
    newest = max(
        (s.timestamp for one in series for s in one.samples if s.timestamp is not None),
        default=None,
    )
    return None if newest is None else datetime.fromtimestamp(newest, tz=UTC)


# --------------------------------------------------------------------------- the source


def load_snapshot_dir(path: str | Path, loaded: LoadedPolicy) -> Snapshot:
    """Read a snapshot directory into a Snapshot. Raises SnapshotError (never a traceback) when unusable.

    Telemetry comes from the directory's `telemetry-windows.json` when it fits the policy and the
    snapshot's `now` (rebalancer.sources.telemetry_aggregates), else from its raw history."""
    with collector_paused():
        return _load_snapshot_dir(Path(path), loaded, use_aggregates=True)[0]


def aggregate_snapshot_dir(path: str | Path, loaded: LoadedPolicy) -> Aggregates:
    """The telemetry rows of a snapshot directory computed from its raw history for the policy's windows
    (an existing `telemetry-windows.json` is not read). Raises SnapshotError when the directory is
    unusable or holds no DCGM history."""
    root = Path(path)
    with collector_paused():
        _snapshot, computed = _load_snapshot_dir(root, loaded, use_aggregates=False)
    if computed is None:
        raise SnapshotError([f"{root}: no telemetry to aggregate: {_snapshot.telemetry.problem}"])
    return computed


def _load_snapshot_dir(
    root: Path, loaded: LoadedPolicy, *, use_aggregates: bool
) -> tuple[Snapshot, Aggregates | None]:
    """The snapshot, and the aggregates computed from raw history when that is where telemetry came from."""
    if not root.exists():
        raise SnapshotError([f"{root}: snapshot directory does not exist"])
    if not root.is_dir():
        raise SnapshotError(
            [f"{root}: not a directory (a snapshot is a directory of .json/.yaml/.prom files)"]
        )
    out = Collected(
        nodes={}, pods={}, pdbs={}, controllers={}, seen={}, ignored=Counter(), not_objects=[], problems=[]
    )
    now: datetime | None = None
    cfg = loaded.policy.telemetry
    wanted = telemetry_metrics(cfg) if cfg is not None else None
    metric_files: list[SnapshotFile] = []
    aggregates_file: SnapshotFile | None = None
    unread: list[str] = []
    try:
        for file in walk(root, out.problems):
            suffix = file.suffix
            top_level = file.relative == file.path.name
            if file.inner_name == SNAPSHOT_FILE and top_level:
                now = _parse_now(file, out.problems)
            elif file.inner_name == AGGREGATES_FILE and top_level:
                aggregates_file = file
            elif suffix in OBJECT_SUFFIXES:
                read_objects(file, loaded, out)
            elif suffix in METRIC_SUFFIXES:
                metric_files.append(file)
            else:
                unread.append(file.relative)
    except OSError as exc:
        raise SnapshotError([f"{root}: cannot read directory: {exc.strerror or exc}"]) from None

    held: Aggregates | None = None
    if aggregates_file is not None and use_aggregates and cfg is not None:
        held = _read_aggregates(aggregates_file, out.problems)
    # The raw history is read unless the aggregates stand in for it (they need the snapshot's `now`).
    series: list[Series] = []
    raw_read = held is None or now is None
    if raw_read:
        for file in metric_files:
            series.extend(_read_exposition(file, wanted, out.problems))
    if now is None and not out.problems:
        now = _newest_sample(series)
        if now is None:
            out.problems.append(f"{root}: no `now` for this snapshot: {_NOW_HINT}")
    if out.problems or now is None:
        raise SnapshotError(out.problems)

    findings: list[Finding] = []
    if out.ignored:
        kinds = ", ".join(f"{kind} ({count})" for kind, count in sorted(out.ignored.items()))
        findings.append(
            Finding(
                kind="ignored-objects",
                detail=(
                    f"ignored {sum(out.ignored.values())} objects of kinds the rebalancer does not use: "
                    f"{kinds}"
                ),
            )
        )
    if unread:
        findings.append(_unread_finding(unread))
    if out.not_objects:
        findings.append(
            Finding(
                kind="ignored-objects",
                detail=f"ignored documents that are not Kubernetes objects: {', '.join(out.not_objects)}",
            )
        )

    pods, unbound = split_unbound(out.pods.values(), out.nodes, missing_from="the snapshot")
    findings.extend(unbound)
    # No pod on the snapshot's nodes (every real node runs some): the pods were left out, so the exporter's
    # pod labels are taken as they are (None), not read as pods gone (their GPUs as leaked). No Pod
    # object at all is also said in a finding.
    attribution = {p.key: p for p in pods} if pods else None
    if out.nodes and not out.pods:
        findings.append(Finding(kind="partial-cluster-view", detail=NO_POD_OBJECTS))

    computed: Aggregates | None = None
    windows = loaded.telemetry_windows()
    unused = None
    if held is not None and cfg is not None:
        unused = (
            f"{SNAPSHOT_FILE} gives no `now`"
            if raw_read
            else mismatch(held, now=now, windows=windows, cfg=cfg, pods=pods)
        )
    if cfg is None:
        telemetry = Telemetry(available=False, problem="telemetry disabled by policy")
    elif held is not None and unused is None:
        log.info("%s: telemetry from %s (raw history not read)", root, AGGREGATES_FILE)
        telemetry = held.telemetry_for(windows)
        findings.extend(held.findings)
        findings.extend(unknown_node_findings(telemetry, out.nodes))
    else:
        if unused is not None:
            log.warning("%s: %s not used: %s; telemetry from the raw history", root, AGGREGATES_FILE, unused)
            findings.append(
                Finding(
                    kind=AGGREGATES_UNUSED,
                    detail=f"{AGGREGATES_FILE} not used: {unused}; telemetry from the raw history",
                )
            )
        if not raw_read:
            for file in metric_files:
                series.extend(_read_exposition(file, wanted, out.problems))
            if out.problems:
                raise SnapshotError(out.problems)
        telemetry, raw_findings, computed = _raw_telemetry(
            series, metric_files, cfg, windows=windows, now=now, pods=pods, attribution=attribution
        )
        findings.extend(raw_findings)
        findings.extend(unknown_node_findings(telemetry, out.nodes))

    return Snapshot(
        now=now,
        nodes=out.nodes,
        pods=tuple(pods),
        pdbs=tuple(out.pdbs.values()),
        telemetry=telemetry,
        findings=tuple(findings),
        controllers=out.controllers,
        source=f"snapshot {root}",
    ), computed


def _read_aggregates(file: SnapshotFile, problems: list[str]) -> Aggregates | None:
    try:
        with file.open_bytes() as handle:
            data = handle.read()
        return read_aggregates(file.path, data)
    except InputError as exc:
        problems.extend(exc.problems)
    except (OSError, EOFError, zlib.error) as exc:
        problems.append(read_problem(file.path, exc))
    return None


def _raw_telemetry(
    series: list[Series],
    metric_files: Sequence[SnapshotFile],
    cfg: TelemetryConfig,
    *,
    windows: frozenset[int],
    now: datetime,
    pods: Sequence[Pod],
    attribution: Mapping[tuple[str, str], Pod] | None,
) -> tuple[Telemetry, tuple[Finding, ...], Aggregates | None]:
    """Telemetry aggregated from the raw history (series attributed to the pods of `attribution`, or
    labelled as they are when None), and the same as the rows a snapshot may carry."""
    if not series:
        wanted = telemetry_metrics(cfg)
        where = f"{len(metric_files)} metric files" if metric_files else "no .prom / .om files"
        problem = f"no DCGM series in snapshot (looked for {', '.join(wanted)}: {where})"
        return Telemetry(available=False, problem=problem), (), None
    telemetry, findings = aggregate(_handed_over(series), cfg, windows, now, attribution)
    if not telemetry.available:
        return telemetry, findings, None
    return telemetry, findings, aggregates_of(telemetry, findings, now=now, cfg=cfg, pods=pods)
