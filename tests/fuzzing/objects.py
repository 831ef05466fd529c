"""kubectl objects and Lists as the snapshot holds them: one to three edits (semantic or at a random
path) of `pods.json` / `nodes.json`, or of the multi-document `extra.yaml`, or a JSON List rewritten as
YAML (one document, or one per item), written back.

Owns which object file a mutation takes and how it is decoded and written back. This module must not
hold values or fields of its own: tests/fuzzing/object_fields.py and tests/fuzzing/edits.py make the
edits.
"""

from __future__ import annotations

import json

import yaml
from hypothesis import strategies as st

from tests.fuzzing.case import Case
from tests.fuzzing.edits import _loads_yaml_all, dump_json, dump_yaml, edit_document
from tests.fuzzing.layout import SNAPSHOT_DIR, Json
from tests.fuzzing.object_fields import semantic_edit
from tests.fuzzing.values import _Raw

OBJECT_JSON_FILES = ("snapshot/pods.json", "snapshot/nodes.json")


@st.composite
def object_edit(draw: st.DrawFn, doc: Json, raw: _Raw) -> tuple[Json, str]:
    """A semantic edit or an edit at a random path."""
    if draw(st.booleans()):
        return draw(semantic_edit(doc, raw))
    return draw(edit_document(doc, raw))


@st.composite
def mutate_objects_json(draw: st.DrawFn, case: Case) -> Case:
    """kubectl JSON: one to three edits at random paths of a List file, written back."""
    names = [n for n in OBJECT_JSON_FILES if n in case.files] or [
        n for n in case.files if n.endswith(".json")
    ]
    if not names:
        return case
    name = draw(st.sampled_from(names))
    try:
        doc = json.loads(case.files[name])
    except (ValueError, RecursionError):
        return case
    raw = _Raw()
    notes: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        doc, note = draw(object_edit(doc, raw))
        notes.append(note)
    data = dump_json(doc, raw, indent=draw(st.sampled_from((None, 1))), ascii_only=draw(st.booleans()))
    return case.with_file(name, data, f"{name.split('/')[-1]}: {', '.join(notes)}")


@st.composite
def mutate_objects_yaml(draw: st.DrawFn, case: Case) -> Case:
    """Kubernetes objects as YAML: edits in the multi-document file, or a JSON List rewritten as YAML."""
    name = f"{SNAPSHOT_DIR}/extra.yaml"
    notes: list[str] = []
    if draw(st.booleans()) or name not in case.files:
        source = draw(st.sampled_from([n for n in OBJECT_JSON_FILES if n in case.files] or [name]))
        if source not in case.files:
            return case
        try:
            docs = (
                [json.loads(case.files[source])]
                if source.endswith(".json")
                else _loads_yaml_all(case.files[source])
            )
        except (ValueError, yaml.YAMLError, RecursionError):
            return case  # already broken by an earlier mutation
        if source != name:
            target = source.removesuffix(".json") + draw(st.sampled_from((".yaml", ".yml")))
            case = case.without([source], f"{source.split('/')[-1]} as YAML")
            name = target
            if draw(st.booleans()) and isinstance(docs[0], dict) and isinstance(docs[0].get("items"), list):
                docs = list(docs[0]["items"])  # one document per object
                notes.append("one document per item")
    else:
        try:
            docs = _loads_yaml_all(case.files[name])
        except (ValueError, yaml.YAMLError, RecursionError):
            return case
    raw = _Raw()
    holder: Json = list(docs)
    for _ in range(draw(st.integers(1, 3))):
        holder, note = draw(object_edit(holder, raw))
        notes.append(note)
    if not isinstance(holder, list):
        holder = [holder]
    text = dump_yaml(holder, raw, flow=draw(st.sampled_from((None, False, True))))
    return case.with_file(name, text, f"{name.split('/')[-1]}: {', '.join(notes)}")
