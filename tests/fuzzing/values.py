"""The nasty values the structure-aware strategies put into documents, and the raw text a serialiser
cannot write.

Owns the pools (quantities, timestamps, strings, numbers, object kinds, durations, policy values, YAML
scalars, nesting depths), `_Raw` (fragments written verbatim in place of a marker string: 5000-digit
numbers, nesting thousands deep, YAML tags) and `nasty_value`, a value fitting a place or of any wrong
type.

Values only: this module must not read a case or a file, nor change a document (tests/fuzzing/edits.py
and the strategies of each input put the values in place).
"""

from __future__ import annotations

import json
import math

from hypothesis import strategies as st

from tests.fuzzing.layout import Json, JsonPath

# --------------------------------------------------------------------------- nasty values

QUANTITIES = (
    "1e400",
    "2Gi",
    "1.5",
    "-1",
    "0x10",
    "99999999999",
    "1Ei",
    "1e-400",
    "",
    " ",
    "NaN",
    "Infinity",
    "-0",
    "+1",
    "1m",
    "0.0001m",
    "1.5e3Mi",
    "1__0",
    "١٢",
    "Ki",
    "1Ki1",
    "1 Gi",
    ".5",
    "9223372036854775808",
    "18446744073709551616Ei",
    "1e99999999",
    "1E999999999999",
    "9" * 4400,
    "0.000000000000000000000001",
    "1e18Ei",
    "-1Ei",
    "100%",
)
TIMESTAMPS = (
    "2026-02-30T00:00:00Z",
    "2026-11-29T12:00:00",
    "99999-01-01T00:00:00Z",
    "9999-12-31T23:59:59-10:00",
    "0001-01-01T00:00:00+10:00",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "1970-01-01T00:00:00Z",
    "2026-11-29",
    "2026-11-29T12:00:00+25:00",
    "2026-11-29T12:00:00.123456789Z",
    "2026-11-29 12:00:00Z",
    "2026-13-01T00:00:00Z",
    "2027-01-01T00:00:00Z",
    "2026-11-29T12:00:00+00:00:00.5",
    "20261129T120000Z",
    "now",
)
STRINGS = (
    "",
    " ",
    "ñ€😀",
    "\u202eevil",
    "\x00",
    "\ud800",
    "a\nb",
    "${HOME}",
    "%s%n",
    "\\",
    '"',
    "true",
    "null",
    "1",
    "-",
    "/",
    "..",
    "a" * 300,
    "x" * 100_000,
    "In",
    "Exists",
    "NoSchedule",
    "DoNotSchedule",
    "Memory",
    "kube-system",
    "nvidia.com/gpu",
    "50%",
    "150%",
    "-10%",
    "%",
)
NUMBERS: tuple[Json, ...] = (
    0,
    -1,
    1,
    2**31,
    2**63,
    2**64,
    -(2**63) - 1,
    10**30,
    1.5,
    -0.0,
    1e308,
    1e-308,
    math.nan,
    math.inf,
    -math.inf,
    True,
    False,
)
KIND_VALUES: tuple[Json, ...] = (
    "List",
    "PodList",
    "NodeList",
    "Pod",
    "Node",
    "PodDisruptionBudget",
    "PodDisruptionBudgetList",
    "",
    "Secret",
    "ListList",
    "list",
    "pod",
    5,
    None,
    [],
)
DURATIONS = (
    "99999999999w",
    "1e400s",
    "0s",
    "-5m",
    "5m5",
    "1.5h",
    "1h30m",
    "10ms",
    "9" * 400 + "s",
    "1d1d",
    "5 m",
    "5M",
    "P1D",
    "",
    "0",
    "1w" * 50,
)
POLICY_VALUES: tuple[Json, ...] = (
    "maybe",
    "yes",
    "off",
    "idle-gpu",
    "unknown-strategy",
    101,
    -1,
    1e309,
    9 * 10**18,
    [],
    {},
    [[]],
    [{"name": "idle-gpu"}],
    {"name": "idle-gpu"},
    "http://",
    "https://prometheus:9090",
    "ftp://x",
    "NoSchedule",
    "In",
)
YAML_SCALARS = (  # YAML text, placed after `key: ` in policies and snapshot.yaml
    "maybe",
    "99999999999w",
    "1e400",
    "1.0e+400",
    ".nan",
    "-.inf",
    "-1",
    "[]",
    "{}",
    "~",
    "*undefined",
    "&anchor 5m",
    "!!python/name:os.system",
    "!!python/object/apply:os.getpid []",
    "0x10",
    "1_000",
    "0o17",
    "2026-02-30",
    "2026-02-30T00:00:00Z",
    "!!float abc",
    "!!int 12abc",
    "!!timestamp 2026-02-30",
    "!!binary AAAA",
    "!!set {a, b}",
    "!!omap [a: 1, a: 2]",
    "!!pairs [a: 1]",
    '"\\ud800"',
    '"\\x00"',
    "'",
    '"unterminated',
    "9" * 5000,
    "{a: {b: [1, {c: d}]}}",
    "[a, [b, [c]]]",
    "? x",
    "|\n  block",
    "@reserved",
    "`reserved",
    "%",
    "null",
    "True",
    "NO",
    "1:20",
    "190:20:30",
)


class _Raw:
    """Text written verbatim in place of a value (what a serialiser cannot produce: 5000-digit numbers,
    nesting thousands deep, YAML tags), through a marker string."""

    def __init__(self) -> None:
        self.fragments: dict[str, tuple[str, str]] = {}

    def marker(self, json_text: str, yaml_text: str) -> str:
        key = f"@@fuzz-raw-{len(self.fragments)}@@"
        self.fragments[key] = (json_text, yaml_text)
        return key

    def substitute(self, text: str, *, as_yaml: bool, budget: int = 4_000_000) -> str:
        """`text` with the fragments in place; beyond `budget` characters of fragments (a fragment
        copied by an edit hundreds of times), the rest become `0`."""
        for key, (json_text, yaml_text) in self.fragments.items():
            raw = yaml_text if as_yaml else json_text
            for quoted in (json.dumps(key), f"'{key}'", key):
                count = text.count(quoted)
                if not count:
                    continue
                fits = min(count, budget // max(len(raw), 1))
                budget -= fits * len(raw)
                text = text.replace(quoted, raw, fits).replace(quoted, "0")
        return text


def _deep_list(depth: int) -> str:
    return "[" * depth + "]" * depth


def _deep_json_map(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def _deep_yaml_map(depth: int) -> str:
    return "{a: " * depth + "1" + "}" * depth


DEPTHS = (200, 1000, 3000, 10_000, 50_000)


@st.composite
def raw_value(draw: st.DrawFn, raw: _Raw) -> str:
    """A marker for a fragment a serialiser cannot write (or would write differently)."""
    choice = draw(st.integers(0, 13))
    if choice == 0:
        digits = "9" * draw(st.sampled_from((4301, 5000, 100_000)))
        return raw.marker(digits, digits)
    if choice == 1:
        depth = draw(st.sampled_from(DEPTHS))
        return raw.marker(_deep_list(depth), _deep_list(depth))
    if choice == 2:
        depth = draw(st.sampled_from(DEPTHS))
        return raw.marker(_deep_json_map(depth), _deep_yaml_map(depth))
    pairs = (
        ("1e400", "1.0e+400"),
        ("-1e400", "-1.0e+400"),
        ("NaN", ".nan"),
        ("Infinity", ".inf"),
        ('"2026-02-30"', "2026-02-30"),
        ('"abc"', "!!float abc"),
        ('"0x"', "!!int 0x"),
        ('"2026-02-30T00:00:00Z"', "!!timestamp 2026-02-30T00:00:00Z"),
        ('"AAAA"', "!!binary AAAA"),
        ('"\\ud800"', "*undefined"),
        ("[1, 2]", "!!set {a, b}"),
    )
    return raw.marker(*pairs[choice - 3])


@st.composite
def nasty_value(draw: st.DrawFn, raw: _Raw, key: str | int | None, context: JsonPath) -> Json:
    """A value to put where `key` (under `context`) was: fitting the place, or any wrong type."""
    text = "/".join(str(p) for p in (*context, key if key is not None else ""))
    pools: list[st.SearchStrategy[Json]] = []
    if any(word in text for word in ("requests", "limits", "allocatable", "capacity", "overhead")):
        pools.append(st.sampled_from(QUANTITIES))
    if isinstance(key, str) and (key.endswith(("Timestamp", "Time", "At")) or key == "startTime"):
        pools.append(st.sampled_from(TIMESTAMPS))
    if key == "kind":
        pools.append(st.sampled_from(KIND_VALUES))
    if isinstance(key, str) and key.lower().endswith(
        ("skew", "priority", "available", "unavailable", "allowed", "healthy", "domains", "seconds")
    ):
        pools.append(st.sampled_from((*NUMBERS, "50%", "150%", "-10%", "abc%", "1e400%", "%")))
    pools.append(st.sampled_from(STRINGS))
    pools.append(st.sampled_from(NUMBERS))
    pools.append(st.sampled_from((None, [], {}, [None], {"": None}, [[]], {"a": {"b": {}}})))
    pools.append(st.text(max_size=20))
    pools.append(st.integers() | st.floats())
    pools.append(raw_value(raw))
    return draw(st.one_of(*pools))
