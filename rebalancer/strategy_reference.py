"""The installed strategies as a reference: `rebalancer strategies` as text, or as a policy fragment.

Owns how a strategy's default arguments are spelled for people: as a policy writes them (durations
`1h`, not 3600; lists as YAML lists; null), each with its description (the pydantic field's, from the
field's docstring). The YAML form is a pasteable `strategies:` list that loads as a valid policy. It
reads the registry only: it must not run a strategy, load a policy file or do I/O (the command prints).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel, BeforeValidator
from pydantic.fields import FieldInfo

from rebalancer.policy import format_duration, parse_duration
from rebalancer.registry import StrategySpec

__all__ = ["policy_fragment", "text_reference"]

_WIDTH = 100


def _is_duration(field: FieldInfo) -> bool:
    return any(isinstance(m, BeforeValidator) and m.func is parse_duration for m in field.metadata)


def _spelled(value: Any, field: FieldInfo | None = None) -> Any:
    """A default as a policy writes it: durations as `1h`, models as mappings, tuples as lists."""
    if field is not None and _is_duration(field) and isinstance(value, int):
        return format_duration(value)
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        return {name: _spelled(getattr(value, name), fields[name]) for name in fields}
    if isinstance(value, tuple | list):
        return [_spelled(item) for item in value]
    return value


def _defaults(spec: StrategySpec[Any]) -> dict[str, tuple[Any, str]]:
    """Each argument's default, spelled, and its description."""
    out: dict[str, tuple[Any, str]] = {}
    for name, field in spec.args_model.model_fields.items():
        default = field.get_default(call_default_factory=True)
        out[name] = (_spelled(default, field), " ".join((field.description or "").split()))
    return out


def _flow(value: Any) -> str:
    """One value on one line, as YAML writes it (`1h`, `[a, b]`, `null`)."""
    text: str = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def text_reference(strategies: Mapping[str, StrategySpec[Any]]) -> str:
    """`name: summary`, then each argument with its default and description."""
    lines: list[str] = []
    for name, spec in strategies.items():
        lines.append(f"{name}: {spec.summary}")
        for arg, (default, description) in _defaults(spec).items():
            described = f": {description}" if description else ""
            lines.append(f"    {arg} (default {_flow(default)}){described}")
    return "\n".join(lines) + "\n"


def _comment(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, _WIDTH, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# ")


def policy_fragment(strategies: Mapping[str, StrategySpec[Any]]) -> str:
    """A `strategies:` list with every installed strategy and its default arguments, commented."""
    lines = [
        "# Every installed strategy with its default arguments; paste into a policy and keep the ones",
        "# you want (the order is the order they run in).",
        "strategies:",
    ]
    for name, spec in strategies.items():
        lines += _comment(spec.summary, "  ")
        lines += [f"  - name: {name}", "    args:"]
        for arg, (default, description) in _defaults(spec).items():
            lines += _comment(description, "      ")
            dumped = yaml.safe_dump({arg: default}, default_flow_style=False, sort_keys=False, width=_WIDTH)
            lines += [f"      {line}" for line in dumped.rstrip("\n").split("\n")]
    return "\n".join(lines) + "\n"
