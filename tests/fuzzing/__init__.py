"""Fuzzing the command line's input contract.

The contract (README, "Commands"): for every input, `rebalancer once --snapshot DIR [--policy FILE]`
and `rebalancer validate POLICY...` exit 0, or exit 2 with one line per problem on stderr, each of
the form `rebalancer: error: <where>: <what>` where <where> names the file (and the line or field
where known). Never a traceback, never exit 1 for a problem in a file, always in bounded time and
memory.

This module holds everything the fuzz tests (tests/test_fuzz.py) and the long runner (bench/fuzz.py)
share:

- `Case`: the files of one input (a snapshot directory `snapshot/`, policies next to it) and the
  command to run on them;
- hypothesis strategies that mutate the real inputs of `tests/fixtures/fuzz/base` (a small cut of
  examples/demo-cluster) and the shipped policies: structure-aware (parse the JSON / YAML, change one
  path, write it back) and byte-level, kubectl objects and Lists, DCGM expositions, `snapshot.yaml`,
  policies, and whole files (compressed, moved, renamed, deleted);
- `run_case`: runs the command on a case in a forked child under an address-space limit and a time
  limit, and collects its exit status, output and resource use;
- `violations`: what in a result breaks the contract, and `signature`, a short key that groups the
  results of one bug;
- `minimize`: a delta-debugging reducer that keeps a failing case small while its signature holds;
- the corpus: `save_case` writes a failing case under `tests/fuzz_corpus/<hash>/` (its files plus a
  `case.json`), `load_corpus` reads every saved case back.
"""

from __future__ import annotations

import json
import re
from typing import Literal

import yaml
from hypothesis import strategies as st

from tests.builders import replace
from tests.fuzzing.case import BASE_FILES, POLICY_TEXTS, Case, base_case
from tests.fuzzing.contract import VIOLATION_ORDER, _cut, describe, signature, violations
from tests.fuzzing.corpus import CorpusEntry, load_corpus, save_case
from tests.fuzzing.edits import dump_yaml, edit_document
from tests.fuzzing.exposition_texts import exposition_texts, mutated_expositions
from tests.fuzzing.expositions import mutate_exposition
from tests.fuzzing.files import mutate_bytes, mutate_files
from tests.fuzzing.layout import (
    ARGV_KINDS,
    CHILD_CRASH,
    DEFAULT_TIMEOUT,
    GIB,
    POLICY_FILE,
    SNAPSHOT_DIR,
    STRATEGY_NAMES,
    ArgvKind,
    Json,
)
from tests.fuzzing.objects import mutate_objects_json, mutate_objects_yaml
from tests.fuzzing.reducer import minimize
from tests.fuzzing.runner import run, run_case, warm_up
from tests.fuzzing.values import (
    DEPTHS,
    DURATIONS,
    POLICY_VALUES,
    YAML_SCALARS,
    _deep_list,
    _deep_yaml_map,
    _Raw,
)

# The names bench/ and the tests use as `fuzzing.X` (bench/fuzz.py also borrows `_cut`).
__all__ = [
    "BASE_FILES",
    "CHILD_CRASH",
    "DEFAULT_TIMEOUT",
    "GIB",
    "KINDS",
    "POLICY_TEXTS",
    "STRATEGY_NAMES",
    "VIOLATION_ORDER",
    "Case",
    "CorpusEntry",
    "Kind",
    "_cut",
    "base_case",
    "cases",
    "describe",
    "exposition_texts",
    "load_corpus",
    "minimize",
    "mutated_expositions",
    "run",
    "run_case",
    "save_case",
    "signature",
    "violations",
    "warm_up",
]

Kind = Literal[
    "objects-json", "objects-yaml", "bytes", "files", "exposition", "snapshot-yaml", "policy", "mixed"
]
KINDS: tuple[Kind, ...] = (
    "objects-json",
    "objects-yaml",
    "bytes",
    "files",
    "exposition",
    "snapshot-yaml",
    "policy",
    "mixed",
)


# --------------------------------------------------------------------------- strategies per input kind


@st.composite
def snapshot_argv(draw: st.DrawFn) -> ArgvKind:
    return draw(st.sampled_from(("once", "once", "once", "once-json", "once-markdown")))


@st.composite
def snapshot_base(draw: st.DrawFn) -> Case:
    """The base snapshot, run with the demo policy, another shipped policy or the built-in default."""
    argv_kind = draw(snapshot_argv())
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return base_case(argv_kind).without([POLICY_FILE], "built-in default policy")
    if choice == 1:
        name = draw(st.sampled_from(sorted(POLICY_TEXTS)))
        case = base_case(argv_kind, policy=POLICY_TEXTS[name])
        return replace(case, note=f"policy {name}")
    return base_case(argv_kind)


NOW_VALUES = (
    "2026-02-30T00:00:00Z",
    "2026-11-29T12:00:00",
    "2026-11-29 12:00:00",
    "2026-11-29 12:00:00 +01:00",
    "99999-01-01T00:00:00Z",
    "9999-12-31T23:59:59-10:00",
    "9999-12-31T23:59:59Z",
    "9999-12-31T23:59:59.999999+00:00",
    "0001-01-01T00:00:00+10:00",
    "0001-01-01T00:00:00Z",
    "1970-01-01T00:00:00Z",
    "1969-12-31T23:59:59Z",
    "2030-01-01T00:00:00Z",
    "2026-11-29T12:10:00Z",
    "2026-11-29",
    "2026-13-01T00:00:00Z",
    "2026-11-29T24:00:00Z",
    "2026-11-29T12:00:60Z",
    "2026-11-29T12:00:00+99:00",
    "2026-11-29t12:00:00z",
    "2026-11-29T12:00:00.1234567890123Z",
    "1e400",
    "12",
    "-1",
    "1795953600",
    "true",
    "null",
    "~",
    "[]",
    "{}",
    "[2026-11-29T12:00:00Z]",
    "{at: 2026-11-29T12:00:00Z}",
    "!!timestamp 2026-02-30",
    "!!timestamp 2026-11-29",
    "!!binary AAAA",
    "!!str 2026-11-29T12:00:00Z",
    "!!float 2026",
    "!!int now",
    "&a 2026-11-29T12:00:00Z",
    "*undefined",
    '"2026-11-29T12:00:00Z"',
    "'2026-02-30T00:00:00Z'",
    "'\uff12\uff10\uff12\uff16-11-29T12:00:00Z'",
    "'2026-11-29T12:00:00+24:00'",
    '"\\ud800"',
    "'" + "9" * 5000 + "'",
    "9" * 5000,
    "2026-11-29T12:00:00Z " + "x" * 3000,
)
NOW_SHAPES = (
    "now: {value}\n",
    "now: {value}\n",
    "now: {value}\n",
    "# The instant this snapshot shows.\nnow: {value}\n",
    "now: {value}\nnow: 2026-11-29T12:00:00Z\n",
    "now: 2026-11-29T12:00:00Z\nnow: {value}\n",
    "- now: {value}\n",
    "then: {value}\n",
    "now:\n  nested: {value}\n",
    "now: {value}\n---\nnow: {value}\n",
    "now: {value}\n...\ngarbage: [\n",
    "{{now: {value}}}\n",
    "now: {value} # a comment\n",
    "\ufeffnow: {value}\n",
    "now: {value}\nextra: {value}\n",
    "{value}\n",
    "",
    "# only a comment\n",
    "---\n",
    "now:\n",
    "now: &t {value}\nagain: *t\n",
)


@st.composite
def mutate_snapshot_yaml(draw: st.DrawFn, case: Case) -> Case:
    """`snapshot.yaml`: wrong types, invalid or far dates, no timezone, odd document shapes."""
    name = f"{SNAPSHOT_DIR}/snapshot.yaml"
    value = draw(st.sampled_from(NOW_VALUES) | st.text(max_size=30).map(json.dumps), label="now")
    shape = draw(st.sampled_from(NOW_SHAPES), label="shape")
    text = shape.format(value=value)
    note = f"snapshot.yaml {text[:70]!r}"
    return case.with_file(name, text.encode("utf-8", "surrogatepass"), note)


BILLION_LAUGHS = 'lol: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"l{i}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)
POLICY_TEXT_OPS = (
    "edit-line",
    "edit-line",
    "edit-line",
    "duplicate-key",
    "duplicate-key",
    "alias",
    "bomb",
    "deep",
    "recursive-alias",
    "whole-file",
    "tabs",
    "merge-key",
    "insert-line",
)
WHOLE_POLICIES = (
    "",
    "# just a comment\n",
    "[]\n",
    "null\n",
    "- a\n",
    "42\n",
    "---\n---\n",
    "dry_run: true\n---\ndry_run: false\n",
    "strategies:\n",
    "strategies: [{name: idle-gpu, enabled: maybe}]\n",
    "strategies: [{name: idle-gpu}, {name: idle-gpu}]\n",
    "strategies: [{name: gpu-consolidation, args: {window: 99999999999w, min_node_age: 99999999999w}}]\n",
    (
        "strategies: [{name: idle-gpu, args: {window: 99999999999w, min_pod_age: 99999999999w, "
        "max_telemetry_age: 99999999999w}}]\n"
    ),
    "guards: {min_pod_age: 99999999999w, cooldown: 99999999999w, disruption_window: 99999999999w}\n",
    "interval: 99999999999w\n",
    "telemetry: {max_age: 99999999999w}\n",
    "eviction: {drain_timeout: 99999999999w, checkpoint_timeout: 99999999999w}\n",
    "telemetry: null\n",
    "telemetry: {utilization: {name: DCGM_FI_DEV_FB_USED}, fb_used: {name: DCGM_FI_DEV_GPU_UTIL}}\n",
    "telemetry: {utilization: {name: DCGM_FI_DEV_GPU_UTIL, scale: 1e-300}}\n",
    "telemetry: {utilization: {name: DCGM_FI_DEV_GPU_UTIL, scale: 1e300}}\n",
    "telemetry: {labels: {node: [], pod: [], uuid: []}}\n",
    "gpu_sharing: {resources: {nvidia.com/gpu: {milli_per_unit: 1}}}\n",
    "gpu_sharing: {resources: {cpu: {milli_per_unit: 1000}, memory: {milli_per_unit: 1}}}\n",
    "gangs: {keys: [app.kubernetes.io/name, '', pod-template-hash]}\n",
    "limits: {max_per_node: 99999999999999999999, max_per_cycle: 1}\n",
    "guards: {priority_threshold: -99999999999999999999}\n",
    "prices: {per_gpu_hour: {NVIDIA-L4: 1e308}, default_per_gpu_hour: 1e308}\n",
    "guards: {namespaces: {include: [a], exclude: [a]}}\n",
    "guards: {label_selector: {match_expressions: [{key: a, operator: In}]}}\n",
    "strategies: [{name: topology-spread, args: {max_evictions_per_constraint: 99999999999999999999}}]\n",
    (
        "strategies: [{name: gpu-consolidation, args: {max_nodes_per_cycle: 99999999999999999999, "
        "peer_pods_to_make_room: 99999999999999999999, drain_onto_larger_nodes: true}}]\n"
    ),
    (
        "strategies: [{name: gpu-consolidation, args: {max_allocated_percent: 100, "
        "max_utilization_percent: 100, min_node_age: 0, packed_schedulers: [default-scheduler, "
        "gpu-packed-scheduler, scheduler-plugins-scheduler], move_to_smaller_nodes: true, "
        "drain_onto_larger_nodes: true, peer_pods_to_make_room: 5}}]\n"
    ),
    (
        "strategies: [{name: idle-gpu, args: {namespaces: [notebooks, inference, research, training, "
        "ml-platform], min_pod_age: 0, max_utilization_percent: 100, min_samples: 1}}]\n"
    ),
    (
        "strategies: [{name: topology-spread, args: {include_soft: true, compact_gangs: true, "
        "min_pod_age: 0}}]\n"
    ),
    "strategies: [{name: gpu-affinity, args: {preferred: true, min_pod_age: 0}}]\n",
    "\t- tab\n",
    "a: &a [*a]\n",
    "\ufeffdry_run: true\n",
    "%YAML 1.1\n---\ndry_run: true\n",
    "%YAML 9.9\n---\ndry_run: true\n",
    "!!python/object/apply:os.system ['true']\n",
    "dry_run: !!binary AAAA\n",
    "? [a, b]\n: c\n",
    "{[a]: 1}\n",
    "dry_run: true\n" * 3,
)


@st.composite
def mutate_policy(draw: st.DrawFn, case: Case) -> Case:
    """Policies: structure-aware edits of the shipped ones, and text-level YAML tricks."""
    seed_name = draw(st.sampled_from(sorted(POLICY_TEXTS)))
    text = POLICY_TEXTS[seed_name].decode("utf-8")
    notes = [f"from {seed_name}"]
    if draw(st.booleans()):
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            doc = {}
        raw = _Raw()
        extra: list[Json] = [*POLICY_VALUES, *DURATIONS]
        for _ in range(draw(st.integers(1, 3))):
            doc, note = draw(edit_document(doc, raw, extra=extra))
            notes.append(note)
        data = dump_yaml([doc], raw, flow=draw(st.sampled_from((None, False, True))))
    else:
        lines = text.split("\n")
        for _ in range(draw(st.integers(1, 2))):
            op = draw(st.sampled_from(POLICY_TEXT_OPS), label="policy-op")
            lines, note = _policy_text_op(draw, op, lines)
            notes.append(note)
        data = "\n".join(lines).encode("utf-8", "surrogatepass")
    case = case.with_file(POLICY_FILE, data, ", ".join(notes))
    if draw(st.integers(0, 4)) == 0:
        second = draw(st.sampled_from(sorted(POLICY_TEXTS)))
        case = case.with_file("policy-2.yaml", POLICY_TEXTS[second], f"and {second} as policy-2.yaml")
    return case


_KEY_LINE = re.compile(r"^(?P<indent>\s*(?:- )?)(?P<key>[A-Za-z_][\w.-]*):(?P<value>.*)$")


def _policy_text_op(draw: st.DrawFn, op: str, lines: list[str]) -> tuple[list[str], str]:
    keyed = [i for i, line in enumerate(lines) if _KEY_LINE.match(line) and not line.lstrip().startswith("#")]
    if op in ("edit-line", "duplicate-key", "alias", "merge-key", "insert-line") and keyed:
        index = keyed[draw(st.integers(0, len(keyed) - 1))]
        match = _KEY_LINE.match(lines[index])
        assert match is not None
        indent, key, value = match["indent"], match["key"], match["value"]
        if op == "edit-line":
            new = draw(st.sampled_from(YAML_SCALARS + DURATIONS), label="yaml-value")
            lines[index] = f"{indent}{key}: {new}"
            return lines, f"line {index + 1} {key}: {new[:30]}"
        if op == "duplicate-key":
            plain = indent.replace("- ", "  ")
            lines.insert(index + 1, f"{plain}{key}:{value}")
            return lines, f"line {index + 1} {key} given twice"
        if op == "alias":
            lines[index] = f"{indent}{key}: &shared{value}"
            target = keyed[draw(st.integers(0, len(keyed) - 1))]
            tm = _KEY_LINE.match(lines[target])
            assert tm is not None
            if target != index:
                lines[target] = f"{tm['indent']}{tm['key']}: *shared"
            return lines, f"line {index + 1} anchored, line {target + 1} its alias"
        if op == "merge-key":
            lines.insert(index + 1, f"{indent.replace('- ', '  ')}<<: {{{key}: 1}}")
            return lines, f"merge key after line {index + 1}"
        # insert-line
        new_key = draw(
            st.sampled_from(("unknown", "dry_run", "strategies", "args", "name", "enabled", "x" * 300))
        )
        lines.insert(
            index + 1, f"{indent.replace('- ', '  ')}{new_key}: {draw(st.sampled_from(YAML_SCALARS))}"
        )
        return lines, f"{new_key} inserted after line {index + 1}"
    if op == "bomb":
        where = draw(st.sampled_from(("top", "args", "namespaces")))
        if where == "top":
            return [*BILLION_LAUGHS.splitlines(), *lines], "billion laughs (top level)"
        if where == "args":
            bomb = [
                *BILLION_LAUGHS.splitlines(),
                "strategies:",
                "  - name: idle-gpu",
                "    args: {namespaces: *i}",
            ]
            return bomb, "billion laughs in strategy args"
        bomb = [*BILLION_LAUGHS.splitlines(), "guards:", "  namespaces:", "    include: *i"]
        return bomb, "billion laughs in guards.namespaces.include"
    if op == "deep":
        depth = draw(st.sampled_from(DEPTHS))
        where = draw(st.sampled_from(("args", "top")))
        deep = _deep_list(depth) if draw(st.booleans()) else _deep_yaml_map(depth)
        if where == "top":
            return [*lines, f"deep: {deep}"], f"nested {depth} deep (top level)"
        return [
            f"strategies: [{{name: idle-gpu, args: {{namespaces: {deep}}}}}]"
        ], f"strategy args nested {depth} deep"
    if op == "recursive-alias":
        form = draw(
            st.sampled_from(
                (
                    "a: &a [*a]",
                    "strategies: &s [{name: idle-gpu, args: {x: *s}}]",
                    "guards: &g {namespaces: *g}",
                )
            )
        )
        return [form], f"recursive alias {form!r}"
    if op == "tabs":
        return [line.replace("  ", "\t", 1) for line in lines], "tabs for indentation"
    whole = draw(st.sampled_from(WHOLE_POLICIES), label="policy")
    return whole.split("\n"), f"policy {whole[:60]!r}"


def _apply(draw: st.DrawFn, kind: Kind, case: Case) -> Case:
    if kind == "objects-json":
        return draw(mutate_objects_json(case))
    if kind == "objects-yaml":
        return draw(mutate_objects_yaml(case))
    if kind == "bytes":
        return draw(mutate_bytes(case))
    if kind == "files":
        return draw(mutate_files(case))
    if kind == "exposition":
        return draw(mutate_exposition(case))
    if kind == "snapshot-yaml":
        return draw(mutate_snapshot_yaml(case))
    if kind == "policy":
        return draw(mutate_policy(case))
    raise ValueError(f"not a single input kind: {kind}")


POLICY_ARGV: tuple[ArgvKind, ...] = ("validate", "validate", "once", "once-json")
SINGLE_KINDS: tuple[Kind, ...] = tuple(k for k in KINDS if k != "mixed")


@st.composite
def cases(draw: st.DrawFn, kind: Kind) -> Case:
    """A case of `kind`: the base input with mutations of that kind (`mixed`: of two or three kinds)."""
    if kind == "policy":
        argv_kind = draw(st.sampled_from(POLICY_ARGV))
        return draw(mutate_policy(base_case(argv_kind)))
    case = draw(snapshot_base())
    if kind == "mixed":
        kinds = draw(st.lists(st.sampled_from(SINGLE_KINDS), min_size=2, max_size=3))
        for one in kinds:
            case = _apply(draw, one, case)
        if "policy" in kinds:
            case = case.with_argv(draw(st.sampled_from(ARGV_KINDS)))
        return case
    if kind == "bytes" and draw(st.integers(0, 3)) == 0:
        return draw(mutate_bytes(case, POLICY_FILE if POLICY_FILE in case.files else None))
    return _apply(draw, kind, case)
