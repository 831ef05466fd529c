"""Price files: the `--prices FILE` of `rebalancer waste` and `rebalancer simulate`, a YAML (or JSON)
mapping of GPU model to USD per GPU-hour.

Owns reading one and what makes it bad, each problem naming the file, the line and the model: not
readable or not UTF-8, not YAML, not a non-empty mapping, a model given twice (YAML would keep the last
silently), a model that is not a non-empty string, a price that is not a number (a boolean is none)
or not from 0 to `MAX_GPU_PRICE_PER_HOUR` (an infinite or 400-digit price included). Models come back
as written: each caller keys them the way it prices (`waste` in `nvidia.com/gpu.product` form,
`simulate` by the node list's model). It reads the one file it is given and nothing else.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import yaml

from rebalancer import yaml_input
from rebalancer.errors import InputError
from rebalancer.policy import MAX_GPU_PRICE_PER_HOUR, duplicate_keys
from rebalancer.wording import quoted

__all__ = ["Price", "read_price_file"]


class Price(NamedTuple):
    """One model's price, as written on its line of the file."""

    model: str
    per_gpu_hour: float
    line: int


def read_price_file(path: str | Path) -> list[Price]:
    """The prices of the file, in its order. Raises InputError listing every problem."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise InputError([f"{path}: cannot read prices: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise InputError([f"{path}: not UTF-8 text ({exc.reason})"]) from None
    try:
        root, data = yaml_input.compose_and_load(text)
    except yaml.YAMLError as exc:
        line, problem = yaml_input.problem_of(exc, text)
        raise InputError([f"{path}:{line or 1}: YAML syntax error: {problem}"]) from None
    if not isinstance(data, dict) or not data:
        got = "nothing" if data is None or data == {} else f"a {type(data).__name__}"
        raise InputError(
            [f"{path}:1: expected a mapping of GPU model to USD per GPU-hour (NVIDIA-L4: 1.15), got {got}"]
        )
    lines = _key_lines(root)
    problems: list[str] = []
    prices: list[Price] = []
    for model, value in data.items():
        line = lines.get(str(model), 1)
        where = f"{path}:{line}: {quoted(model)}"
        if not isinstance(model, str) or not model.strip():
            problems.append(f"{where}: a GPU model must be a non-empty string")
        elif isinstance(value, bool) or not isinstance(value, int | float) or _is_nan(value):
            problems.append(f"{where}: expected USD per GPU-hour (a number), got {quoted(value)}")
        elif not 0 <= value <= MAX_GPU_PRICE_PER_HOUR:  # an int is compared as it is: float() overflows
            problems.append(f"{where}: a price must be from 0 to {MAX_GPU_PRICE_PER_HOUR} USD per GPU-hour")
        else:
            prices.append(Price(model, float(value), line))
    problems.extend(duplicate_keys(root, str(path)))
    if problems:
        raise InputError(problems)
    return prices


def _is_nan(value: float) -> bool:
    return isinstance(value, float) and math.isnan(value)  # math.isnan(int) would overflow on a huge one


def _key_lines(root: yaml.Node | None) -> dict[str, int]:
    """1-based line of each key of a mapping document (the first, for a key given twice)."""
    if not isinstance(root, yaml.MappingNode):
        return {}
    lines: dict[str, int] = {}
    for key, _ in root.value:
        if isinstance(key, yaml.ScalarNode):
            lines.setdefault(key.value, key.start_mark.line + 1)
    return lines
