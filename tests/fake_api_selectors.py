"""Label and field selectors for the fake API server, for tests only, judged as kube-apiserver judges them.

`parse_label_selector` reads the `labelSelector` query syntax (`a=b`, `a!=b`, `a in (x,y)`,
`a notin (x)`, `a`, `!a`) into `Requirement`s, a malformed term a 400; `selector_matches` judges a
structured metav1.LabelSelector (null matches nothing, `{}` everything) and `selector_string` prints one
as apimachinery does (a Scale's `status.selector`). `parse_field_selector` reads a `fieldSelector`
(`=`, `==`, `!=`) over the fields a kind declares, an unknown field a 400, and `field_value` reads a
field as the API server compares it.

This module must only judge: which objects a list, a watch or an eviction looks at is the server's
business, not this module's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.fake_api_errors import ApiError
from tests.fake_api_kinds import Kind

# --------------------------------------------------------------------------- selectors


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # = != in notin exists !exists
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value in self.values
        if self.op == "!=":
            return not present or value not in self.values
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present  # !exists


_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SET_TERM = re.compile(r"^(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)$")
_EQ_TERM = re.compile(r"^(?P<key>[^=!\s]+)\s*(?P<op>==|=|!=)\s*(?P<value>\S*)$")


def _split_terms(text: str) -> list[str]:
    """Split a label selector on the commas that are not inside `( )`."""
    terms, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current.strip())
    return terms


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """The `labelSelector` query syntax (`a=b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`)."""
    requirements: list[Requirement] = []
    for term in _split_terms(text):
        if match := _SET_TERM.match(term):
            values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
            key, op = match["key"], match["op"]
        elif match := _EQ_TERM.match(term):
            key, op = match["key"], "!=" if match["op"] == "!=" else "="
            values = frozenset({match["value"]})
        elif term.startswith("!"):
            key, op, values = term[1:].strip(), "!exists", frozenset()
        else:
            key, op, values = term, "exists", frozenset()
        if not _LABEL_KEY.match(key) or not all(_LABEL_VALUE.match(v) for v in values):
            raise ApiError(400, f"unable to parse requirement: invalid label selector term {term!r}")
        requirements.append(Requirement(key, op, values))
    return tuple(requirements)


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A structured metav1.LabelSelector against labels: null matches nothing, `{}` everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}[expr["operator"]]
        if not Requirement(expr["key"], op, frozenset(expr.get("values") or ())).matches(labels):
            return False
    return True


def selector_string(selector: Mapping[str, Any] | None) -> str:
    """A metav1.LabelSelector as apimachinery prints it (`LabelSelectorAsSelector(...).String()`, what a
    Scale's `status.selector` holds): requirements sorted by key, set values sorted, `a=b`, `a in (x,y)`,
    `a notin (x)`, `a`, `!a`; a null selector and `{}` print as ""."""
    if not selector:
        return ""
    terms: list[tuple[str, str]] = [(k, f"{k}={v}") for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or ():
        key, operator = expr["key"], expr["operator"]
        values = ",".join(sorted(expr.get("values") or ()))
        text = {
            "In": f"{key} in ({values})",
            "NotIn": f"{key} notin ({values})",
            "Exists": key,
            "DoesNotExist": f"!{key}",
        }[operator]
        terms.append((key, text))
    return ",".join(text for _, text in sorted(terms, key=lambda term: term[0]))


def field_value(obj: Mapping[str, Any], path: tuple[str, ...]) -> str:
    value: Any = obj
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(text: str, kind: Kind) -> list[tuple[tuple[str, ...], bool, str]]:
    """`a=b,c!=d` -> [(json path, equal?, value)]; unknown fields are a 400, as in the API server."""
    out: list[tuple[tuple[str, ...], bool, str]] = []
    known: dict[str, tuple[str, ...]] = {
        "metadata.name": ("metadata", "name"),
        "metadata.namespace": ("metadata", "namespace"),
        **kind.fields,
    }
    for term in (t.strip() for t in text.split(",")):
        if not term:
            continue
        match = re.match(r"^(?P<field>[^=!]+)(?P<op>!=|==|=)(?P<value>.*)$", term)
        if match is None:
            raise ApiError(400, f"invalid selector: '{text}'; can't understand '{term}'")
        name = match["field"].strip()
        if name not in known:
            raise ApiError(400, f'"{name}" is not a known field selector: only "{", ".join(sorted(known))}"')
        out.append((known[name], match["op"] != "!=", match["value"].strip()))
    return out
