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
  policy file in use is skipped silently);
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

A JSON `List` is read item by item from the mapped file: msgspec finds the items, then decodes each
straight into its kind's Struct (`kube_types`: the fields the model never reads are skipped unread, not
even checked as UTF-8), and drops it once it is in the model; an item of another kind, or with a field
of the wrong type, is read untyped and named as any document's object is. A file under 64 MiB
(STREAM_JSON_BYTES) that msgspec refuses anywhere is read whole by the standard library instead, which
names the problem by line and column as before (and takes what only it takes, such as NaN); a larger one
is never held whole, and msgspec names its problem. Expositions are read line by line. So a 5,000-node
cluster's dump and hour of DCGM history fit in under 1 GiB.

Anything that makes the snapshot unusable (unreadable directory or file, invalid JSON / YAML / exposition,
malformed or duplicate objects, no usable `now`) raises `SnapshotError` listing every problem, each naming
its file; problems that only lose part of the picture (a pod bound to an unknown node, bad samples) become
findings in `Snapshot.findings`. This module must not read the clock, talk to a cluster or Prometheus, or
write anything: object translation lives in `kube_objects` and `kube_pods`, telemetry maths in
`rebalancer.telemetry`.
"""

from __future__ import annotations

import json
import logging
import mmap
import re
import zlib
from collections import Counter
from collections.abc import Collection, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import yaml

from rebalancer import rfc3339, yaml_input
from rebalancer.errors import InputError
from rebalancer.gcpause import collector_paused
from rebalancer.model import Controller, Finding, Node, Pdb, Pod, Snapshot, Telemetry
from rebalancer.policy import LoadedPolicy, TelemetryConfig
from rebalancer.sources import kube_types
from rebalancer.sources.kube_objects import (
    Model,
    controller_from_json,
    model_of,
    node_from_json,
    pdb_from_json,
    split_unbound,
)
from rebalancer.sources.kube_pods import pod_from_json
from rebalancer.sources.object_fields import ObjectError
from rebalancer.sources.snapshot_layout import SnapshotFile, UnreadableFile, read_problem, walk
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
from rebalancer.workloads import KINDS

__all__ = [
    "AGGREGATES_UNUSED",
    "METRIC_SUFFIXES",
    "OBJECT_SUFFIXES",
    "SNAPSHOT_FILE",
    "SnapshotError",
    "aggregate_snapshot_dir",
    "load_snapshot_dir",
]

SNAPSHOT_FILE = "snapshot.yaml"
# The finding when a snapshot's telemetry-windows.json does not fit the policy or the snapshot.
AGGREGATES_UNUSED = "telemetry-aggregates-unused"
log = logging.getLogger(__name__)
OBJECT_SUFFIXES = (".json", ".yaml", ".yml")
METRIC_SUFFIXES = (".prom", ".om")
USED_KINDS = ("Node", "Pod", "PodDisruptionBudget", *KINDS)
# JSON files at least this large are never read whole (a List is read item by item, always): decoding a
# kubectl dump of 50,000 pods (~400 MB) whole holds its text and every decoded object at once, over 1 GiB.
STREAM_JSON_BYTES = 64 * 1024 * 1024

_NOW_HINT = (
    f"add {SNAPSHOT_FILE} with a line such as `now: {rfc3339.EXAMPLE}` (RFC 3339 with a timezone), "
    "or include DCGM samples with timestamps"
)


class SnapshotError(InputError):
    """A snapshot directory that cannot be used; `problems` holds one line per problem, each naming where."""


@dataclass
class _Collected:
    nodes: dict[str, Node]
    pods: dict[tuple[str, str], Pod]
    pdbs: dict[tuple[str, str], Pdb]
    controllers: dict[tuple[str, str, str], Controller]
    seen: dict[tuple[str, str], str]
    ignored: Counter[str]
    not_objects: list[str]
    problems: list[str]


# --------------------------------------------------------------------------- reading files


def _read_text(file: SnapshotFile, problems: list[str]) -> str | None:
    try:
        return file.read_text()
    except UnreadableFile as exc:
        problems.append(str(exc))
    return None


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


def _yaml_problem(file: Path, exc: yaml.YAMLError, text: str | None = None) -> str:
    line, problem = yaml_input.problem_of(exc, text)
    return f"{file}{f':{line}' if line is not None else ''}: invalid YAML: {clip(problem, 300)}"


def _documents(file: SnapshotFile, text: str, problems: list[str]) -> list[tuple[object, str]]:
    """Top-level documents of a JSON or YAML file, each with a label for messages."""
    if file.suffix == ".json":
        try:
            return [(json.loads(text), str(file.path))]
        except json.JSONDecodeError as exc:
            problems.append(f"{file.path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}")
            return []
        except ValueError as exc:  # an integer of more digits than Python converts
            problems.append(f"{file.path}: invalid JSON: {clip(str(exc), 200)}")
            return []
        except RecursionError:
            problems.append(f"{file.path}: invalid JSON: nested too deeply")
            return []
    try:
        docs = list(yaml_input.load_all(text))
    except yaml.YAMLError as exc:
        problems.append(_yaml_problem(file.path, exc, text))
        return []
    label = str(file.path)
    if len(docs) == 1:
        return [(docs[0], label)]
    return [(doc, f"{label} (document {index + 1})") for index, doc in enumerate(docs)]


def _objects(doc: object, where: str, problems: list[str]) -> Iterator[tuple[Mapping[str, Any], str]]:
    """Kubernetes objects of one document, unwrapping `List` and typed lists (`PodList`, ...)."""
    if doc is None:
        return
    if not isinstance(doc, Mapping):
        problems.append(f"{where}: expected a Kubernetes object or List, got {type(doc).__name__}")
        return
    kind = doc.get("kind")
    if not isinstance(kind, str) or not kind:
        problems.append(f"{where}: Kubernetes object without a kind")
        return
    if not kind.endswith("List"):
        yield doc, where
        return
    items = doc.get("items")
    if items is None:
        return
    if not isinstance(items, list):
        problems.append(f"{where}: {kind}.items must be a list")
        return
    yield from _list_items(kind, items, where, problems)


def _list_items(
    kind: str, items: Iterable[object], where: str, problems: list[str], *, start: int = 0
) -> Iterator[tuple[Mapping[str, Any], str]]:
    # Items of typed lists (as the API returns them) carry no kind of their own.
    item_kind = kind.removesuffix("List") if kind != "List" else None
    for index, raw in enumerate(items, start=start):
        at = f"{where} items[{index}]"
        item = (
            {**raw, "kind": item_kind}
            if isinstance(raw, Mapping) and "kind" not in raw and item_kind
            else raw
        )
        if isinstance(item, Mapping) and isinstance(item.get("kind"), str) and item["kind"].endswith("List"):
            problems.append(f"{at}: nested lists are not supported")
            continue
        yield from _objects(item, at, problems)


class _ListHead(msgspec.Struct):
    """The top level of a JSON file holding a List: its kind, and its items left undecoded."""

    kind: object = None
    items: list[msgspec.Raw] | None = None


def _size_hint(file: SnapshotFile) -> int:
    try:
        return file.size_hint
    except OSError:
        return 0  # the whole-file path reports it


def _read_json_list(file: SnapshotFile, loaded: LoadedPolicy, out: _Collected) -> bool:
    """Read a JSON file holding a List item by item from its mapped bytes: msgspec decodes the list's
    skeleton first, then each item straight into its kind's Struct (`kube_types`) when its turn comes.
    False, having read nothing, when the file holds something else, or (below STREAM_JSON_BYTES) JSON
    that msgspec refuses anywhere: it is read whole then, by the standard library, which names the
    problem by line and column (or takes what only it takes, such as NaN)."""
    small = _size_hint(file) < STREAM_JSON_BYTES
    try:
        with file.mapped() as data:
            try:
                head = msgspec.json.decode(data, type=_ListHead)
            except msgspec.ValidationError:
                return False  # not an object, or a kind that is not a string
            except msgspec.DecodeError as exc:
                if small:
                    return False
                out.problems.append(_json_problem(file, data, exc))
                return True
            except RecursionError:
                out.problems.append(f"{file.path}: invalid JSON: nested too deeply")
                return True
            kind, raws = head.kind, head.items
            del head
            if not isinstance(kind, str) or not kind.endswith("List") or raws is None:
                del raws  # no item's bytes may outlive the mapping
                return False
            items = _decoded_items(file, kind, raws, strict=small)
            refused = False
            try:
                # A small file is decoded whole before anything is read from it, so that it can still
                # be read by the standard library instead; a large one item by item, each dropped once
                # read.
                _add_items(kind, list(items) if small else items, str(file.path), loaded, out)
            except _NotMsgspecJson:
                refused = True
            finally:
                items.close()  # no item's bytes may outlive the mapping
                raws.clear()
            return not refused
    except UnreadableFile as exc:
        out.problems.append(str(exc))
        return True


class _NotMsgspecJson(Exception):
    """An item msgspec refuses as JSON (not UTF-8, a number past what Python converts...)."""


@dataclass(frozen=True)
class _Unreadable:
    problem: str


def _decoded_items(
    file: SnapshotFile, kind: str, raws: list[msgspec.Raw], *, strict: bool
) -> Generator[tuple[int, object], None, None]:
    """Each raw item decoded in turn (and dropped): an item of a kind the model reads into its Struct;
    anything else (another kind, no kind, a field of the wrong type) untyped, to go the way of a
    document's objects, which ignores it or names its problem. JSON msgspec refuses raises
    _NotMsgspecJson when `strict`, else is an _Unreadable problem naming the item."""
    item_kind = kind.removesuffix("List") if kind != "List" else None
    raws.reverse()
    index = -1
    while raws:
        raw = raws.pop()
        index += 1
        try:
            try:
                yield index, kube_types.decode_item(raw, item_kind)
                continue
            except msgspec.ValidationError:
                pass
            yield index, kube_types.decode_any(raw)
        except RecursionError:
            yield index, _Unreadable(f"{file.path}: invalid JSON: nested too deeply")
        except msgspec.DecodeError as exc:
            if strict:
                raise _NotMsgspecJson from None
            yield index, _Unreadable(f"{file.path} items[{index}]: invalid JSON: {clip(str(exc), 200)}")


def _add_items(
    kind: str, items: Iterable[tuple[int, object]], where: str, loaded: LoadedPolicy, out: _Collected
) -> None:
    for index, item in items:
        if isinstance(item, _Unreadable):
            out.problems.append(item.problem)
        elif isinstance(item, kube_types.KubeObject):
            _add_typed(item, f"{where} items[{index}]", loaded, out)
        else:
            for obj, at in _list_items(kind, (item,), where, out.problems, start=index):
                _add_object(obj, at, loaded, out)


def _json_problem(file: SnapshotFile, data: bytes | mmap.mmap, exc: msgspec.DecodeError) -> str:
    """`FILE:LINE:COLUMN: invalid JSON: what`, from msgspec's `... (byte N)`."""
    message = str(exc).removeprefix("JSON is malformed: ")
    match = re.search(r" \(byte (\d+)\)$", message)
    if match is None:
        return f"{file.path}: invalid JSON: {message}"
    offset = int(match.group(1))
    before = bytes(data[:offset])
    line = before.count(b"\n") + 1
    column = offset - (before.rfind(b"\n") + 1) + 1
    return f"{file.path}:{line}:{column}: invalid JSON: {message[: match.start()]}"


def _is_foreign(doc: object) -> bool:
    """A mapping with neither apiVersion nor kind: another file (a policy...), not a malformed object."""
    return isinstance(doc, Mapping) and "kind" not in doc and "apiVersion" not in doc


def _same_file(file: Path, other: str) -> bool:
    try:
        return file.resolve() == Path(other).resolve()
    except (OSError, ValueError):
        return False


def _add_object(obj: Mapping[str, Any], where: str, loaded: LoadedPolicy, out: _Collected) -> None:
    """An object of a document (decoded untyped: YAML, small or odd JSON) into the collection."""
    kind = str(obj["kind"])
    if kind not in USED_KINDS:
        out.ignored[kind] += 1
        return
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    namespace = meta.get("namespace") if isinstance(meta, Mapping) and kind != "Node" else None
    if not _first_sighting(kind, name, namespace, where, out):
        return
    policy = loaded.policy
    try:
        if kind == "Node":
            _collect(node_from_json(obj), out)
        elif kind == "Pod":
            _collect(pod_from_json(obj, gangs=policy.gangs, sharing=policy.gpu_sharing), out)
        elif kind == "PodDisruptionBudget":
            _collect(pdb_from_json(obj), out)
        else:
            _collect(controller_from_json(obj), out)
    except ObjectError as exc:
        out.problems.append(f"{where}: {exc}")


def _add_typed(obj: kube_types.KubeObject, where: str, loaded: LoadedPolicy, out: _Collected) -> None:
    """An object decoded into its Struct into the collection, as `_add_object` adds its mapping."""
    kind = kube_types.kind_of(obj)
    meta = obj.metadata
    name = meta.name if meta is not None else None
    namespace = meta.namespace if meta is not None and kind != "Node" else None
    if not _first_sighting(kind, name, namespace, where, out):
        return
    policy = loaded.policy
    try:
        _collect(model_of(obj, gangs=policy.gangs, sharing=policy.gpu_sharing), out)
    except ObjectError as exc:
        out.problems.append(f"{where}: {exc}")


def _first_sighting(kind: str, name: object, namespace: object, where: str, out: _Collected) -> bool:
    """Whether this object is new to the snapshot (a duplicate is a problem naming the first)."""
    ref = name if isinstance(name, str) and name else "<unnamed>"
    if isinstance(namespace, str) and namespace:
        ref = f"{namespace}/{ref}"
    key = (kind, ref)
    first = out.seen.get(key)
    if first is not None:
        out.problems.append(f"{where}: duplicate {kind} {clip(ref, 120)} (first in {first})")
        return False
    out.seen[key] = where
    return True


def _collect(model: Model, out: _Collected) -> None:
    if isinstance(model, Pod):
        out.pods[model.key] = model
    elif isinstance(model, Node):
        out.nodes[model.name] = model
    elif isinstance(model, Pdb):
        out.pdbs[model.key] = model
    else:
        out.controllers[model.key] = model


# --------------------------------------------------------------------------- now


def _parse_now(file: SnapshotFile, problems: list[str]) -> datetime | None:
    text = _read_text(file, problems)
    if text is None:
        return None
    try:
        root, doc = yaml_input.compose_and_load(text)
    except yaml.YAMLError as exc:
        problems.append(_yaml_problem(file.path, exc, text))
        return None
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        problems.append(f"{file.path}: expected a mapping such as `now: {rfc3339.EXAMPLE}`")
        return None
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


def _read_objects(file: SnapshotFile, loaded: LoadedPolicy, out: _Collected) -> None:
    if file.suffix == ".json" and _read_json_list(file, loaded, out):
        return
    text = _read_text(file, out.problems)
    if text is None:
        return
    documents = _documents(file, text, out.problems)
    del text  # free the text (hundreds of MB for a large cluster) before building the objects
    for doc, where in documents:
        if _is_foreign(doc):
            if not _same_file(file.path, loaded.source):
                out.not_objects.append(where)
            continue
        for obj, at in _objects(doc, where, out.problems):
            _add_object(obj, at, loaded, out)


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
    out = _Collected(
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
                _read_objects(file, loaded, out)
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
            series, metric_files, cfg, windows=windows, now=now, pods=pods
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
) -> tuple[Telemetry, tuple[Finding, ...], Aggregates | None]:
    """Telemetry aggregated from the raw history, and the same as the rows a snapshot may carry."""
    if not series:
        wanted = telemetry_metrics(cfg)
        where = f"{len(metric_files)} metric files" if metric_files else "no .prom / .om files"
        problem = f"no DCGM series in snapshot (looked for {', '.join(wanted)}: {where})"
        return Telemetry(available=False, problem=problem), (), None
    telemetry, findings = aggregate(_handed_over(series), cfg, windows, now, {p.key: p for p in pods})
    if not telemetry.available:
        return telemetry, findings, None
    return telemetry, findings, aggregates_of(telemetry, findings, now=now, cfg=cfg, pods=pods)
