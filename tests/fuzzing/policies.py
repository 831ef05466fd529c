"""Policies: structure-aware edits of the shipped ones (examples/demo-cluster, policies/), and text-level
YAML tricks (values edited in place, keys given twice, anchors and aliases, billion laughs, nesting
thousands deep, recursive aliases, tabs, merge keys, whole odd policies); sometimes a second policy
next to the first.

Owns `mutate_policy` and its pools. This module must not change the snapshot directory: which command
a policy case runs is tests/fuzzing/kinds.py's choice.
"""

from __future__ import annotations

import re

import yaml
from hypothesis import strategies as st

from tests.fuzzing.case import POLICY_TEXTS, Case
from tests.fuzzing.edits import dump_yaml, edit_document
from tests.fuzzing.layout import POLICY_FILE, Json
from tests.fuzzing.values import (
    DEPTHS,
    DURATIONS,
    POLICY_VALUES,
    YAML_SCALARS,
    _deep_list,
    _deep_yaml_map,
    _Raw,
)

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
