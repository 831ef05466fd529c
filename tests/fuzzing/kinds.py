"""The input kinds and `cases(kind)`, the one strategy the fuzz tests and bench/fuzz.py draw cases from:
the base snapshot (with the demo policy, another shipped one or none) or, for `policy`, the base case
with a command that reads the policy, and mutations of that kind (`mixed`: of two or three kinds).

This module must not mutate anything itself: it picks the base case, the command and the strategies of
the other modules, one per input (objects, files, expositions, snapshot.yaml, policies).
"""

from __future__ import annotations

from typing import Literal

from hypothesis import strategies as st

from tests.builders import replace
from tests.fuzzing.case import POLICY_TEXTS, Case, base_case
from tests.fuzzing.expositions import mutate_exposition
from tests.fuzzing.files import mutate_bytes, mutate_files
from tests.fuzzing.layout import ARGV_KINDS, POLICY_FILE, ArgvKind
from tests.fuzzing.objects import mutate_objects_json, mutate_objects_yaml
from tests.fuzzing.policies import mutate_policy
from tests.fuzzing.snapshot_yaml import mutate_snapshot_yaml

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
