"""Finding kinds: one closed list, each kind with its meaning, the README's table the same list."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from rebalancer.finding_kinds import FINDING_KINDS, FindingKind, unknown_kind_problem

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_kind_has_a_meaning() -> None:
    assert set(FINDING_KINDS) == set(get_args(FindingKind))
    assert all(meaning.strip() for meaning in FINDING_KINDS.values())


def test_the_readme_lists_every_kind_with_its_meaning() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("### Findings\n", 1)[1].split("\n### ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| (.+) \|$", section, re.MULTILINE))
    assert rows == dict(FINDING_KINDS)


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("leaked-vram", None),
        ("leaked_vram", "unknown finding kind 'leaked_vram' (did you mean 'leaked-vram'?)"),
        ("Idle-GPU", "unknown finding kind 'Idle-GPU' (did you mean 'idle-gpu'?)"),
        ("zzz", "unknown finding kind 'zzz' (known: " + ", ".join(sorted(FINDING_KINDS)) + ")"),
    ],
)
def test_an_unknown_kind_is_named_with_the_nearest(kind: str, problem: str | None) -> None:
    assert unknown_kind_problem(kind) == problem
