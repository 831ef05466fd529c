"""Checks of Kubernetes objects' fields beyond their JSON types, and resource quantities as the API server
reads them.

Owns `ObjectError` (an object that cannot be read, naming its kind, name and field path), `FieldReader`
(one object's checks that raise it: the fields `kube_types` leaves untyped, timestamps), how a value from
the input is named in a message (`type_name`, `quote_value`), and quantities: apimachinery's
grammar (`parse_kubernetes_quantity`), whole units for extended resources (`1.5` GPUs is refused as the
API server refuses it), and physical bounds on GPU device counts (`MAX_GPU_DEVICES`). `kube_objects`
and `kube_pods` build the model with them. It must not do I/O, read the clock or build model objects.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from decimal import ROUND_UP, Decimal
from functools import lru_cache
from typing import Any

from rebalancer import rfc3339
from rebalancer.gpu_devices import GPU_COUNT_LABEL
from rebalancer.model import GPU_RESOURCE, MIG_RESOURCE_PREFIX
from rebalancer.wording import clip, quoted

__all__ = [
    "CPU_RESOURCE",
    "GPU_COUNT_LABEL",
    "MAX_GPU_DEVICES",
    "FieldReader",
    "ObjectError",
    "checked_units",
    "is_extended_resource",
    "join_path",
    "object_ref",
    "parse_kubernetes_quantity",
    "quantity_to_int",
    "quote_value",
    "resource_list",
    "type_name",
]

CPU_RESOURCE = "cpu"


class ObjectError(ValueError):
    """A Kubernetes object that cannot be turned into the model.

    `str()` reads `Pod ml/train-0: spec.containers[0].resources.requests.cpu: invalid quantity "abc"`.
    """

    def __init__(self, kind: str, name: str, field_path: str, message: str) -> None:
        self.kind = kind
        self.name = name
        self.field_path = field_path
        self.message = message
        # Names and field paths come from the input too: cut, as quoted values are.
        where = f"{clip(field_path, 160)}: " if field_path else ""
        super().__init__(f"{kind} {clip(name, 120)}: {where}{message}")


def object_ref(obj: Mapping[str, Any]) -> str:
    """`namespace/name` (or `name` for cluster-scoped objects), tolerant of malformed metadata."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return "<unnamed>"
    name = meta.get("name")
    namespace = meta.get("namespace")
    name_text = name if isinstance(name, str) and name else "<unnamed>"
    return f"{namespace}/{name_text}" if isinstance(namespace, str) and namespace else name_text


# --------------------------------------------------------------------------- checks of one object


class FieldReader:
    """One object's checks beyond its JSON types (kube_types checks those): each raises ObjectError naming
    the object and the field path."""

    __slots__ = ("kind", "name")

    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name

    def error(self, path: str, message: str) -> ObjectError:
        return ObjectError(self.kind, self.name, path, message)

    def mapping(self, value: object, path: str) -> Mapping[str, Any]:
        """An object (a field msgspec left untyped); {} for null."""
        if value is None:
            return {}
        if type(value) is not dict and not isinstance(value, Mapping):
            raise self.error(path, f"expected an object, got {type_name(value)}")
        return value

    def string(self, value: object, path: str, default: str = "") -> str:
        """A string (a field msgspec left untyped); `default` for null."""
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(path, f"expected a string, got {type_name(value)}")
        return value

    def integer(self, value: object, path: str, default: int | None) -> int | None:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(path, f"expected an integer, got {type_name(value)}")
        return value

    def boolean(self, value: object, path: str) -> bool:
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.error(path, f"expected true or false, got {type_name(value)}")
        return value

    def timestamp(self, value: str | None, path: str) -> datetime | None:
        """An RFC 3339 timestamp (its type already checked); None when absent."""
        if value is None:
            return None
        try:
            return _parsed_timestamp(value)
        except ValueError as exc:
            raise self.error(path, str(exc)) from None


@lru_cache(maxsize=8192)
def _parsed_timestamp(text: str) -> datetime:
    """rfc3339.parse, remembered: pods started together share their timestamps (a failure is not kept)."""
    return rfc3339.parse(text)


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {clip(str(value))}"
    if isinstance(value, str):
        return f"the string {quoted(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


# --------------------------------------------------------------------------- quantities

# apimachinery's quantity grammar (pkg/api/resource/quantity.go): a signed decimal number, then a binary
# suffix (Ki..Ei), a decimal suffix (n, u, m, k, M, G, T, P, E) or a decimal exponent (e3, E-9). The
# official client's `parse_quantity` computes the value but also takes what Python's Decimal takes
# (NaN, Infinity, `1_000`, `1e3Mi`...), which the API server refuses. The value is computed here, within
# the grammar, as that function computes it (the number times base ** exponent in Decimal arithmetic), so
# reading a snapshot does not import the Kubernetes client.
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]*))"
    r"(?:(?P<suffix>[KMGTPE]i|[numkMGTPE])|(?P<exponent>[eE][+-]?[0-9]+))?"
)
# suffix -> (base, power): quantity.go's binary (Ki = 1024) and decimal (k = 1000, m = 1/1000) suffixes.
_SUFFIX_POWERS: dict[str, tuple[int, int]] = {
    **{f"{prefix}i": (1024, power) for power, prefix in enumerate("KMGTPE", start=1)},
    **{prefix: (1000, power) for power, prefix in enumerate("num", start=-3)},
    **{prefix: (1000, power) for power, prefix in enumerate("kMGTPE", start=1)},
}
_NANO = Decimal("1e-9")
_MAX_INT64 = 2**63 - 1
# Extended resources whose amounts are GPU devices (or MIG instances): a node or pod with more than this
# is not a real one (the largest GPU servers hold 16; time-sliced replicas multiply that by tens).
MAX_GPU_DEVICES = 1024
_INTEGER_NATIVE = frozenset({"pods"})


@lru_cache(maxsize=4096)
def parse_kubernetes_quantity(text: str) -> Decimal:
    """The value of a quantity string, as apimachinery's `ParseQuantity` gives it.

    Non-zero values are rounded up to a whole nano (upstream's precision), binary quantities are capped
    at the int64 maximum as upstream caps them. Raises ValueError for anything outside the grammar.
    """
    match = _QUANTITY.fullmatch(text) if len(text) <= 200 else None
    if match is None:
        raise ValueError(f"invalid quantity {quote_value(text)}")
    try:
        amount = Decimal(match["number"] + (match["exponent"] or ""))
        if suffix := match["suffix"]:
            base, exponent = _SUFFIX_POWERS[suffix]
            amount = amount * (base ** Decimal(exponent))
    except (ValueError, ArithmeticError):
        raise ValueError(f"invalid quantity {quote_value(text)}") from None
    if amount != 0:
        amount = amount.quantize(_NANO, rounding=ROUND_UP) if amount.adjusted() < 19 else amount
    if text.endswith("i") and abs(amount) > _MAX_INT64:
        amount = Decimal(_MAX_INT64).copy_sign(amount)
    return amount


def quote_value(value: object) -> str:
    return f'"{clip(str(value))}"'


def is_extended_resource(name: str) -> bool:
    """apimachinery's IsExtendedResourceName: a qualified name outside the `kubernetes.io/` namespace
    (and not a quota `requests.` name). Its amounts must be whole numbers."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _is_device_resource(name: str) -> bool:
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


def _quantity(reader: FieldReader, value: object, path: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise reader.error(path, f"expected a quantity such as 500m, 2 or 4Gi, got {type_name(value)}")
    try:
        if isinstance(value, str):
            parsed = parse_kubernetes_quantity(value)
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(value)
        else:
            parsed = Decimal(value)
    except (ValueError, ArithmeticError):
        raise reader.error(path, f"invalid quantity {quote_value(value)}") from None
    if parsed < 0:
        raise reader.error(path, f"quantity {quote_value(value)} is negative")
    return parsed


def _checked_amount(reader: FieldReader, resource: str, amount: Decimal, given: object, path: str) -> int:
    """Model units for one resource amount, refusing what the API server (or physics) would not hold."""
    if (
        is_extended_resource(resource) or resource in _INTEGER_NATIVE
    ) and amount != amount.to_integral_value():
        kind = "an extended resource" if is_extended_resource(resource) else "counted in whole units"
        raise reader.error(path, f"quantity {quote_value(given)} must be an integer ({resource} is {kind})")
    if _is_device_resource(resource) and amount > MAX_GPU_DEVICES:
        raise reader.error(
            path,
            f"quantity {quote_value(given)} is more GPU devices than a node can hold "
            f"(at most {MAX_GPU_DEVICES})",
        )
    units = quantity_to_int(resource, amount)
    if units > _MAX_INT64:
        raise reader.error(
            path,
            f"quantity {quote_value(given)} is too large (more than the 64-bit integers Kubernetes counts "
            "resources in)",
        )
    return units


def quantity_to_int(resource: str, amount: Decimal) -> int:
    """Model units for a resource amount: millicores for CPU, whole units (bytes, GPUs) otherwise.

    Rounds up, as Kubernetes' `MilliValue()` / `Value()` do, so a request is never under-counted.
    """
    if amount.adjusted() > 30:  # far past int64: neither scale nor build the integer
        return _MAX_INT64 + 1
    return math.ceil(amount * 1000 if resource == CPU_RESOURCE else amount)


# (resource, type, value) -> amount, for quantities that passed every check: a cluster's pods repeat a
# few hundred spellings (`4`, `16Gi`, `1`) tens of thousands of times. Only valid ones are kept (a bad
# one is reported with its path each time), and the checks are pure, so a hit is what they would give.
_VALID_AMOUNTS: dict[tuple[str, type, object], Decimal] = {}
_VALID_AMOUNTS_KEPT = 4096


def resource_list(
    reader: FieldReader, amounts: Mapping[str, object] | None, where: str
) -> dict[str, Decimal]:
    """A resource list (names to quantities, at `where`) as amounts, each checked."""
    out: dict[str, Decimal] = {}
    if not amounts:
        return out
    for name, value in amounts.items():
        resource = str(name)
        memo = (resource, type(value), value) if isinstance(value, str | int | float) else None
        amount = _VALID_AMOUNTS.get(memo) if memo is not None else None
        if amount is None:
            at = f"{where}.{name}"
            amount = _quantity(reader, value, at)
            _checked_amount(reader, resource, amount, value, at)
            if memo is not None and len(_VALID_AMOUNTS) < _VALID_AMOUNTS_KEPT:
                _VALID_AMOUNTS[memo] = amount
        out[resource] = amount
    return out


def checked_units(reader: FieldReader, amounts: Mapping[str, Decimal], what: str) -> dict[str, int]:
    """Model units of amounts each already checked alone; a sum of them (a pod's effective request) is
    checked again, named by `what`."""
    return {
        name: _checked_amount(reader, name, amount, amount, f"{what}.{name}")
        for name, amount in amounts.items()
    }
