"""The Kubernetes objects of a snapshot directory (DESIGN §4): its object files -> model objects, collected.

Owns reading one `*.json` / `*.yaml` / `*.yml` file (`read_objects`) into a `Collected`: Kubernetes
objects or `List`s of them (as `kubectl get nodes,pods,pdb -A -o json` prints), each translated into the
model (`kube_objects`, `kube_pods`) when it is of a kind the model reads (Node, Pod, PodDisruptionBudget,
the controller kinds of `workloads.KINDS`), every other kind counted as ignored, documents with neither
`apiVersion` nor `kind` (a policy file kept alongside) listed as not objects (the policy file in use
skipped silently), and a second object of one kind and name a problem naming the first; and how a file's
text that cannot be read or parsed is named (`read_text`, `yaml_problem`), which `sources.files` also
uses for `snapshot.yaml`.

A JSON `List` is read item by item from the mapped file: msgspec finds the items, then decodes each
straight into its kind's Struct (`kube_types`: the fields the model never reads are skipped unread, not
even checked as UTF-8), and drops it once it is in the model; an item of another kind, or with a field
of the wrong type, is read untyped and named as any document's object is. A file under 64 MiB
(STREAM_JSON_BYTES) that msgspec refuses anywhere is read whole by the standard library instead, which
names the problem by line and column as before (and takes what only it takes, such as NaN); a larger one
is never held whole, and msgspec names its problem.

Problems are collected, each naming its file, never raised: `sources.files` decides what makes the
snapshot unusable. It must not read the clock, talk to a cluster, write anything, or translate an object
itself (`kube_objects` and `kube_pods` do).
"""

from __future__ import annotations

import json
import mmap
import re
from collections import Counter
from collections.abc import Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml

from rebalancer import yaml_input
from rebalancer.model import Controller, Node, Pdb, Pod
from rebalancer.policy import LoadedPolicy
from rebalancer.sources import kube_types
from rebalancer.sources.kube_objects import (
    Model,
    controller_from_json,
    model_of,
    node_from_json,
    pdb_from_json,
)
from rebalancer.sources.kube_pods import pod_from_json
from rebalancer.sources.object_fields import ObjectError
from rebalancer.sources.snapshot_layout import SnapshotFile, UnreadableFile
from rebalancer.wording import clip
from rebalancer.workloads import KINDS

USED_KINDS = ("Node", "Pod", "PodDisruptionBudget", *KINDS)
# JSON files at least this large are never read whole (a List is read item by item, always): decoding a
# kubectl dump of 50,000 pods (~400 MB) whole holds its text and every decoded object at once, over 1 GiB.
STREAM_JSON_BYTES = 64 * 1024 * 1024


@dataclass
class Collected:
    """The objects of a snapshot directory read so far, by kind and key, with what reading them found: where
    each object was first seen (a second sighting is a duplicate), the kinds ignored, the documents that
    are not Kubernetes objects and the problems."""

    nodes: dict[str, Node]
    pods: dict[tuple[str, str], Pod]
    pdbs: dict[tuple[str, str], Pdb]
    controllers: dict[tuple[str, str, str], Controller]
    seen: dict[tuple[str, str], str]
    ignored: Counter[str]
    not_objects: list[str]
    problems: list[str]


# --------------------------------------------------------------------------- reading files


def read_text(file: SnapshotFile, problems: list[str]) -> str | None:
    try:
        return file.read_text()
    except UnreadableFile as exc:
        problems.append(str(exc))
    return None


def yaml_problem(file: Path, exc: yaml.YAMLError, text: str | None = None) -> str:
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
        problems.append(yaml_problem(file.path, exc, text))
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


def _read_json_list(file: SnapshotFile, loaded: LoadedPolicy, out: Collected) -> bool:
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
    kind: str, items: Iterable[tuple[int, object]], where: str, loaded: LoadedPolicy, out: Collected
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


def _add_object(obj: Mapping[str, Any], where: str, loaded: LoadedPolicy, out: Collected) -> None:
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


def _add_typed(obj: kube_types.KubeObject, where: str, loaded: LoadedPolicy, out: Collected) -> None:
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


def _first_sighting(kind: str, name: object, namespace: object, where: str, out: Collected) -> bool:
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


def _collect(model: Model, out: Collected) -> None:
    if isinstance(model, Pod):
        out.pods[model.key] = model
    elif isinstance(model, Node):
        out.nodes[model.name] = model
    elif isinstance(model, Pdb):
        out.pdbs[model.key] = model
    else:
        out.controllers[model.key] = model


def read_objects(file: SnapshotFile, loaded: LoadedPolicy, out: Collected) -> None:
    if file.suffix == ".json" and _read_json_list(file, loaded, out):
        return
    text = read_text(file, out.problems)
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
