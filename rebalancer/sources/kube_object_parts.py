"""The parts of Kubernetes objects that several kinds share, translated into the model, and the
translations remembered for the parts that repeat.

Owns `remembered` (a translation that depends only on a hashable part of an object, kept once it passed
its checks, so that equal parts share one model object), label selectors (`label_selector`: a pod's
spread constraints, a PodDisruptionBudget's selector) and the controller ownerReference (`controller_owner`:
a pod's, a controller's), for `kube_pods` and `kube_objects`. It must not do I/O, read the clock or build
kubernetes client model objects, and keeps no failure: anything malformed raises `ObjectError`, naming
the object and the field path, each time it is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from rebalancer.model import LabelRequirement, LabelSelector, OwnerRef
from rebalancer.sources import kube_types as kt
from rebalancer.sources.object_fields import FieldReader, join_path
from rebalancer.wording import quoted

__all__ = ["NO_META", "controller_owner", "label_selector", "remembered"]


# --------------------------------------------------------------------------- remembered translations

# Translations that depend only on a hashable part of the object (equal tolerations, affinities, owner
# references, container resources), remembered once they passed every check: pods of one template (or
# the daemons of one node) repeat them thousands of times, and then share one model object. A failure is
# never kept (it is reported with its object each time); a table that holds `_KEPT` entries starts over.
_KEPT = 16384
_T = TypeVar("_T")
_K = TypeVar("_K")


def remembered(table: dict[_K, _T], key: _K, make: Callable[[], _T]) -> _T:
    """The translation `table` keeps for `key`, made (and kept) when it has none."""
    value = table.get(key)
    if value is None:
        value = make()
        if len(table) >= _KEPT:
            table.clear()
        table[key] = value
    return value


# --------------------------------------------------------------------------- label selectors

# The API server's validation of label selector requirements (node selectors also have Gt / Lt).
_LABEL_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


def label_selector(reader: FieldReader, value: kt.LabelSelector, path: str) -> LabelSelector:
    expressions: list[LabelRequirement] = []
    for index, expr in enumerate(value.match_expressions or ()):
        where = f"{join_path(path, 'matchExpressions')}[{index}]"
        operator = expr.operator
        if not operator:
            raise reader.error(join_path(where, "operator"), "required field is missing")
        if operator not in _LABEL_SELECTOR_OPERATORS:
            raise reader.error(
                join_path(where, "operator"),
                f"{quoted(operator)} is not an operator (In, NotIn, Exists, DoesNotExist)",
            )
        expressions.append(LabelRequirement(expr.key or "", operator, expr.values or ()))
    return LabelSelector(match_labels=value.match_labels or {}, match_expressions=tuple(expressions))


# --------------------------------------------------------------------------- owner references

_OWNERS: dict[tuple[kt.OwnerReference, ...], OwnerRef | None] = {}


def controller_owner(references: tuple[kt.OwnerReference, ...] | None) -> OwnerRef | None:
    """The controller ownerReference, the only one the model keeps."""
    if not references:
        return None
    found = _OWNERS.get(references, _NOT_KNOWN)
    if found is not _NOT_KNOWN:
        return found  # type: ignore[return-value]
    owner = next(
        (
            OwnerRef(
                kind=ref.kind or "", name=ref.name or "", api_version=ref.api_version or "", controller=True
            )
            for ref in references
            if ref.controller
        ),
        None,
    )
    if len(_OWNERS) >= _KEPT:
        _OWNERS.clear()
    _OWNERS[references] = owner
    return owner


_NOT_KNOWN = object()

# The metadata of an object without any.
NO_META = kt.ObjectMeta()
