"""Values derived from immutable model objects, kept while those very objects (or, for a pod's requests,
the pods of its template) are in use: what lets a cycle skip the work an earlier cycle (or an earlier
strategy of the same cycle) did on the same objects.

A source that keeps its objects from one cycle to the next (the watch cache, the trace replay's
snapshot builder) hands the same `Pod` and `Node` objects cycle after cycle for everything that did
not change, and they are immutable: what was derived from them still holds. Owns three caches, all
deterministic (a value is a pure function of what it is keyed on) and bounded:

- `ObjectMemo`: one value per object (a Pod, a Node, a Policy, a gpu-consolidation Candidate: any
  object that takes weak references), matched by identity, never by equality (two equal objects never
  share a value by accident), computed at its first use and forgotten when the object is freed (a weak
  reference: the memo never keeps an object alive). A value must not refer to its object, or the object
  would never be freed.
- `NodeMemo`: one value per node, derived from the Node and the pods on it in a snapshot, reused in
  the next snapshot while the node and each of its pods, in order, are the very same objects. It
  holds the objects of the last snapshot it was asked about, no more.
- `RequestsMemo`: one value per pod *template*, for what is derived from a pod's requests and GPU
  request alone, and so the same for every pod of the template: keyed by the identity of the requests
  mapping, which the sources give every pod of a template (`rebalancer.sources.kube_pods`, the replay's
  snapshot builder), with the GPU request it comes with compared by value (a mapping seen with another
  one is derived again, and replaces the value). It holds the mappings it has values for (a mapping
  takes no weak reference), so their ids stay theirs, until a table holding `kept` of them starts over
  (as the sources' own table of templates does at the same size). A requests mapping is never changed
  once a pod holds it: a change would reach every pod of its template.

A source that builds new objects every cycle never hits an `ObjectMemo` or a `NodeMemo`. This module
must not do I/O, read the clock, or know what the values mean; callers own what they derive and must
derive it from the keyed objects alone (nothing of the snapshot's time, telemetry or policy unless it
is part of the key).

Used from one thread at a time: values are derived, stored and read only by the thread running the
cycle (the daemon runs one cycle at a time, the commands have one thread), and nothing here locks. An
object may be freed on another thread (the watch cache's threads drop the Pod and Node objects they
replace), and its values are forgotten there, by the weak reference's callback: that touches only the
freed object's own entries, which no other thread can reach (no live object has its id until its
memory is reused, after the callback), each by a single dictionary or list operation.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Callable, Mapping
from operator import is_
from typing import Any, Final, Generic, TypeVar

from rebalancer.model import GpuRequest, Node, Pod, Snapshot

__all__ = ["MISSING", "Missing", "NodeMemo", "ObjectMemo", "RequestsMemo", "same_objects"]

K = TypeVar("K")
V = TypeVar("V")


class Missing(enum.Enum):
    """The type of `MISSING`: an enum of one member, so that `value is MISSING` (or `is not`) narrows
    `V | Missing` to one side for the type checker, and a value used unchecked is a type error."""

    MISSING = enum.auto()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = Missing.MISSING
"""What `ObjectMemo.get` returns for an object it holds no value for."""


class _Ref(weakref.ref):  # type: ignore[type-arg]
    """A weak reference that remembers the id its object was tracked under, and the memos holding a
    value for it."""

    __slots__ = ("key", "tables")
    key: int
    tables: list[dict[int, Any]]


# One weak reference per tracked object, shared by every memo. An object's values go, in every memo
# holding one, when it is freed: CPython calls the callback before the object's memory (and so its id)
# can be reused, so a value found under an id belongs to the live object that has it.
_TRACKED: dict[int, _Ref] = {}


def _forget(ref: _Ref) -> None:
    key = ref.key
    if _TRACKED.get(key) is ref:
        del _TRACKED[key]
        for table in ref.tables:
            table.pop(key, None)


def _track(obj: object, table: dict[int, Any]) -> int:
    """The id of `obj`, tracked, and `table` noted as holding a value for it (the caller stores it)."""
    key = id(obj)
    ref = _TRACKED.get(key)
    if ref is None:
        ref = _Ref(obj, _forget)
        ref.key = key
        ref.tables = [table]
        _TRACKED[key] = ref
    elif key not in table:
        ref.tables.append(table)
    return key


class ObjectMemo(Generic[K, V]):
    """One value per live object, by identity. `memo(obj)` derives it at the first call (with the
    `derive` given); `get` / `put` serve values that depend on something besides the object, which the
    caller then stores beside the value and checks itself. The object must support weak references."""

    __slots__ = ("_derive", "_values")

    def __init__(self, derive: Callable[[K], V] | None = None) -> None:
        self._derive = derive
        self._values: dict[int, V] = {}

    def __call__(self, obj: K) -> V:
        try:
            return self._values[id(obj)]
        except KeyError:
            if self._derive is None:
                raise TypeError("this ObjectMemo has no derive function: use get and put") from None
            value = self._derive(obj)
            self._values[_track(obj, self._values)] = value
            return value

    def get(self, obj: K) -> V | Missing:
        """The value held for `obj`, or `MISSING`."""
        return self._values.get(id(obj), MISSING)

    @property
    def by_id(self) -> Mapping[int, V]:
        """The values by `id()` of their live object, for the hottest loops: `memo.by_id.get(id(obj),
        MISSING)` is `memo.get(obj)` without the call. Read it only; it changes as objects come and go."""
        return self._values

    def put(self, obj: K, value: V) -> None:
        self._values[_track(obj, self._values)] = value

    def __len__(self) -> int:
        return len(self._values)


class RequestsMemo(Generic[V]):
    """One value per requests mapping and GPU request: `memo(pod)` derives it (with the `derive` given,
    which must read nothing of the pod but `requests` and `gpu`) for the first pod of a template, and
    every other pod sharing that mapping gets the same value. At 5,000 nodes, 48,567 pods have a few
    hundred templates."""

    __slots__ = ("_derive", "_kept", "_values")

    def __init__(self, derive: Callable[[Pod], V], *, kept: int = 16384) -> None:
        self._derive = derive
        self._kept = kept
        # id(requests) -> (the mapping, held so that its id is not reused; the GPU request; the value).
        self._values: dict[int, tuple[Mapping[str, int], GpuRequest, V]] = {}

    def __call__(self, pod: Pod) -> V:
        requests = pod.requests
        entry = self._values.get(id(requests))
        if entry is not None and entry[1] == pod.gpu:
            return entry[2]
        value = self._derive(pod)
        if len(self._values) >= self._kept:
            self._values.clear()
        self._values[id(requests)] = (requests, pod.gpu, value)
        return value

    def __len__(self) -> int:
        return len(self._values)


def same_objects(first: tuple[object, ...], second: tuple[object, ...]) -> bool:
    """Whether two tuples hold the very same objects in the same order."""
    return first is second or (len(first) == len(second) and all(map(is_, first, second)))


_Last = tuple[weakref.ref[Snapshot], dict[str, V], dict[str, tuple[Node, tuple[Pod, ...], V]]]


class NodeMemo(Generic[V]):
    """One value per node of a snapshot, derived from the Node and the pods on it
    (`Snapshot.pods_by_node`), reused across snapshots while both are the same objects.

    The first call with a snapshot works out the value of every node of it at once (taking over those
    of the previous snapshot's nodes whose objects are the same); the other calls with that snapshot
    are lookups. Only the last snapshot's values are kept (each snapshot's values are replaced as one
    unit).
    """

    __slots__ = ("_derive", "_last")

    def __init__(self, derive: Callable[[Node, tuple[Pod, ...]], V]) -> None:
        self._derive = derive
        # The last snapshot asked about, its values by node, and what each was derived from.
        self._last: (
            tuple[weakref.ref[Snapshot], dict[str, V], dict[str, tuple[Node, tuple[Pod, ...], V]]] | None
        )
        self._last = None

    def __call__(self, snapshot: Snapshot, name: str) -> V:
        """The value for node `name` of `snapshot` (KeyError when the snapshot has no such node)."""
        last = self._last
        if last is not None and last[0]() is snapshot:
            return last[1][name]
        return self._refresh(snapshot, last)[name]

    def _refresh(self, snapshot: Snapshot, last: _Last[V] | None) -> dict[str, V]:
        before = last[2] if last is not None else {}
        values: dict[str, V] = {}
        sources: dict[str, tuple[Node, tuple[Pod, ...], V]] = {}
        by_node = snapshot.pods_by_node
        derive = self._derive
        for name, node in snapshot.nodes.items():
            pods = by_node.get(name, ())
            entry = before.get(name)
            if entry is None or entry[0] is not node or not same_objects(entry[1], pods):
                entry = (node, pods, derive(node, pods))
            sources[name] = entry
            values[name] = entry[2]
        self._last = (weakref.ref(snapshot), values, sources)
        return values
