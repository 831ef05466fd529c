"""Reading one kind of the cluster's objects: the list calls, their pages, and their decoding.

Owns what both live readers of nodes, pods and PodDisruptionBudgets share, so they read the same
objects the same way: the per-cycle lister (`sources.kube`) and the watch cache (`sources.kube_cache`):

- `cluster_calls`: the list calls of a snapshot, each one `ListCall` (nodes; pods skipping finished ones
  on the server, `ACTIVE_PODS`; PDBs), cluster-wide or one per given namespace;
- `Lister`: one list, page by page (`limit` + `continue`, the whole list again when a continue token
  expires with 410), each page through `kubeapi.with_retries` (the one retry rule) as raw JSON
  (`_preload_content=False`), handing each item on as its page arrives, so no caller has to hold raw
  pages; it answers the list's resourceVersion, which a watch starts from. A page of a kind the model
  reads is decoded straight into that kind's Structs (`kube_types`: the fields the model never reads are
  skipped unread); a page msgspec refuses so is decoded again with its items left as their JSON, so
  that each bad object is named alone. Other lists' items are handed on as plain dicts;
- `KindStore`: one call's objects decoded into the model as they arrive (`kube_objects`), keyed by
  namespace and name, with the objects that cannot be decoded kept as problems (so a snapshot refuses
  them, naming the object and the field) until they change or go. It takes a decoded Struct, an item's
  JSON (a refused page's item, a watch event's object) or a dict.

It must not read the clock, write to the cluster or decide anything. An API error left after bounded
retries of transient failures raises `KubeSourceError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, cast

import msgspec
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer.errors import Problems
from rebalancer.fence import RequestTimeout
from rebalancer.kubeapi import Backoff, describe_error, exponential_backoff, with_retries
from rebalancer.model import Finding, Node, Pdb, Pod
from rebalancer.policy import GangConfig, GpuSharingConfig, LoadedPolicy
from rebalancer.sources import kube_types
from rebalancer.sources.kube_objects import Model, model_from_bytes, model_from_json, model_of
from rebalancer.sources.object_fields import ObjectError

__all__ = [
    "ACTIVE_PODS",
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_TIMEOUT",
    "ClusterKind",
    "ClusterObjects",
    "Decoding",
    "KindStore",
    "KubeSourceError",
    "ListCall",
    "Lister",
    "Refused",
    "assemble",
    "cluster_calls",
    "decoding_of",
    "head_of",
]

# Finished pods hold no resources; the API server filters them out for us.
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
DEFAULT_PAGE_SIZE = 500
# (connect, read) seconds for one list page.
DEFAULT_TIMEOUT: tuple[float, float] = (5.0, 60.0)

JsonObj = Mapping[str, Any]
ClusterKind = Literal["Node", "Pod", "PodDisruptionBudget"]


class KubeSourceError(Problems):
    """The cluster could not be read into a snapshot; `problems` holds one line per problem."""


class Refused(Exception):
    """A list answered with a status its caller handles (`Lister.items(refused=...)`)."""

    def __init__(self, error: ApiException) -> None:
        super().__init__(str(error))
        self.error = error


# --------------------------------------------------------------------------- the calls


@dataclass(frozen=True)
class ListCall:
    """One list of a snapshot: its kind, how messages name it (`pods in ml`), the client method and its
    positional arguments and query parameters. The same method with `watch=True` is its watch."""

    kind: ClusterKind
    what: str
    call: Callable[..., Any]
    args: tuple[str, ...] = ()
    params: Mapping[str, str] = field(default_factory=dict)


def cluster_calls(api_client: client.ApiClient, namespaces: Sequence[str] | None) -> tuple[ListCall, ...]:
    """The lists of a snapshot: every node; the active pods and the PDBs of every namespace, or of each
    of `namespaces`."""
    core = client.CoreV1Api(api_client)
    policy = client.PolicyV1Api(api_client)
    active = {"field_selector": ACTIVE_PODS}
    calls = [ListCall("Node", "nodes", core.list_node)]
    if namespaces is None:
        calls.append(ListCall("Pod", "pods", core.list_pod_for_all_namespaces, params=active))
        every_pdb = policy.list_pod_disruption_budget_for_all_namespaces
        calls.append(ListCall("PodDisruptionBudget", "poddisruptionbudgets", every_pdb))
        return tuple(calls)
    calls += [ListCall("Pod", f"pods in {ns}", core.list_namespaced_pod, (ns,), active) for ns in namespaces]
    calls += [
        ListCall(
            "PodDisruptionBudget",
            f"poddisruptionbudgets in {ns}",
            policy.list_namespaced_pod_disruption_budget,
            (ns,),
        )
        for ns in namespaces
    ]
    return tuple(calls)


# --------------------------------------------------------------------------- pages


class Lister:
    """Lists page by page with bounded retries; a whole new list when a continue token expires."""

    def __init__(
        self,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        request_timeout: RequestTimeout = DEFAULT_TIMEOUT,
        retries: int = 2,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        list_restarts: int = 2,
    ) -> None:
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self._page_size = page_size
        self._timeout = request_timeout
        self._retries = retries
        self._backoff = backoff or exponential_backoff(0.5, 5.0)
        self._sleep = sleep
        self._list_restarts = list_restarts

    def items(
        self, what: str, call: Callable[..., Any], *args: str, refused: Sequence[int] = (), **params: str
    ) -> list[JsonObj]:
        """Every item of a list, as a dict. An answer whose status is in `refused` raises `Refused` (the
        caller's to report), any other error KubeSourceError."""
        items: list[JsonObj] = []
        self.each(what, call, args, params, begin=items.clear, item=items.append, refused=refused)
        return items

    def fill(self, call: ListCall, store: KindStore) -> str:
        """List `call` into `store` (emptied first, and again if the list starts over), each page's
        objects decoded into its kind's Structs; the list's resourceVersion."""
        return self.each(
            call.what, call.call, call.args, call.params, begin=store.clear, item=store.put, kind=call.kind
        )

    def each(
        self,
        what: str,
        call: Callable[..., Any],
        args: Iterable[str],
        params: Mapping[str, str],
        *,
        begin: Callable[[], None],
        item: Callable[[Any], None],
        refused: Sequence[int] = (),
        kind: str | None = None,
    ) -> str:
        """`item(obj)` for every item of a list as its page arrives, `begin()` before the first page of
        each attempt (a list restarted after its continue token expired starts over); the list's
        resourceVersion. Items are dicts, or with `kind` (one the model reads) that kind's Structs, and
        the JSON (`msgspec.Raw`) of the items of a page that does not decode so."""
        args = tuple(args)
        typed = kube_types.type_of(kind) if kind is not None else None
        for restart in range(self._list_restarts + 1):
            begin()
            token: str | None = None
            try:
                while True:
                    page = _decoded_page(what, self._page(what, call, args, params, token), typed)
                    for obj in page.items or ():
                        item(obj)
                    meta = page.metadata or _NO_LIST_META
                    token = meta.continue_ or None
                    if token is None:
                        return meta.resource_version or ""
            except ApiException as exc:
                if exc.status == 410 and restart < self._list_restarts:
                    continue
                if exc.status in refused:
                    raise Refused(exc) from None
                raise KubeSourceError([f"cannot list {what}: {describe_error(exc)}"]) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _page(
        self,
        what: str,
        call: Callable[..., Any],
        args: Iterable[str],
        params: Mapping[str, str],
        token: str | None,
    ) -> bytes:
        kwargs: dict[str, Any] = dict(params, limit=self._page_size, _preload_content=False)
        kwargs["_request_timeout"] = self._timeout
        if token is not None:
            kwargs["_continue"] = token

        def attempt() -> bytes:
            response = cast("urllib3.BaseHTTPResponse", call(*args, **kwargs))
            try:
                return bytes(response.data)
            finally:
                response.release_conn()

        try:
            data = with_retries(attempt, retries=self._retries, backoff=self._backoff, sleep=self._sleep)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeSourceError(
                [f"cannot list {what}: {describe_error(exc)} (after {self._retries + 1} attempts)"]
            ) from None
        return data


class _ListMeta(msgspec.Struct, rename="camel"):
    resource_version: str | None = None
    continue_: str | None = msgspec.field(default=None, name="continue")


_NO_LIST_META = _ListMeta()
_Item = TypeVar("_Item")


class _Page(msgspec.Struct, Generic[_Item]):
    """One page of a list: its items (undecoded, typed, or plain), and where the next page starts."""

    items: list[_Item] | None = None
    metadata: _ListMeta | None = None


_PAGE_DECODERS: dict[object, msgspec.json.Decoder[_Page[Any]]] = {
    None: msgspec.json.Decoder(_Page[Any], float_hook=float),
    msgspec.Raw: msgspec.json.Decoder(_Page[msgspec.Raw]),
}


def _decoded_page(what: str, data: bytes, typed: type[kube_types.KubeObject] | None) -> _Page[Any]:
    """A page's items as `typed` Structs (or, when a field is not of its type, as their JSON), or as
    dicts without `typed`; KubeSourceError for an answer that is not a list."""
    decoder = _PAGE_DECODERS.get(typed)
    if decoder is None:
        decoder = _PAGE_DECODERS[typed] = msgspec.json.Decoder(_Page[typed], float_hook=float)  # type: ignore[valid-type]
    try:
        try:
            return decoder.decode(data)
        except msgspec.ValidationError:
            if typed is None:
                raise
        return _PAGE_DECODERS[msgspec.Raw].decode(data)
    except msgspec.DecodeError as exc:
        raise KubeSourceError([f"cannot list {what}: the API answered invalid JSON: {exc}"]) from None
    except msgspec.ValidationError as exc:
        raise KubeSourceError(
            [f"cannot list {what}: the API answered something else than a list: {exc}"]
        ) from None


# --------------------------------------------------------------------------- decoded objects


@dataclass(frozen=True)
class Decoding:
    """What the translation of pods depends on in the policy (gangs, GPU sharing)."""

    gangs: GangConfig
    sharing: GpuSharingConfig


def decoding_of(loaded: LoadedPolicy) -> Decoding:
    return Decoding(gangs=loaded.policy.gangs, sharing=loaded.policy.gpu_sharing)


Key = tuple[str, str]


class _Ref(msgspec.Struct, rename="camel"):
    """What a key and a watch need of any object's metadata."""

    name: object = None
    namespace: object = None
    resource_version: object = None


class _Head(msgspec.Struct):
    metadata: _Ref | None = None


_HEAD = msgspec.json.Decoder(_Head)


def head_of(data: msgspec.Raw | bytes) -> tuple[Key | None, str | None]:
    """The (namespace, name) key and the resourceVersion of an object's JSON, read alone (the rest of the
    object skipped); (None, None) for JSON that is not an object with a metadata object."""
    try:
        meta = _HEAD.decode(data).metadata
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None, None
    if meta is None:
        return None, None
    rv = meta.resource_version if isinstance(meta.resource_version, str) and meta.resource_version else None
    return _key_of(meta.name, meta.namespace), rv


def _key_of(name: object, namespace: object) -> Key | None:
    """(namespace, name) of an object; None for an object without a name (it cannot be keyed)."""
    if not isinstance(name, str) or not name:
        return None
    return (namespace if isinstance(namespace, str) else "", name)


def _key(obj: object) -> Key | None:
    if isinstance(obj, msgspec.Raw):
        return head_of(obj)[0]
    if isinstance(obj, kube_types.KubeObject):
        meta = obj.metadata
        return _key_of(meta.name, meta.namespace) if meta is not None else None
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return None
    return _key_of(meta.get("name"), meta.get("namespace"))


class KindStore:
    """One ListCall's objects, decoded into the model as they arrive, by (namespace, name).

    An object that cannot be translated is kept as a problem (the ObjectError's text) in place of its
    model, until it is replaced by a valid one or deleted. Not thread-safe: its owner locks.
    """

    def __init__(self, kind: ClusterKind, decoding: Decoding) -> None:
        self.kind = kind
        self.decoding = decoding
        self.objects: dict[Key, Model] = {}
        self.problems: dict[Key, str] = {}
        self._unnamed: list[str] = []

    def clear(self) -> None:
        self.objects.clear()
        self.problems.clear()
        self._unnamed.clear()

    def put(self, obj: kube_types.KubeObject | msgspec.Raw | JsonObj) -> None:
        """Add or replace an object (a listed item, an ADDED or MODIFIED event's object): its Struct, its
        JSON or a dict."""
        key = _key(obj)
        try:
            model = self._decode(obj)
        except ObjectError as exc:
            if key is None:
                self._unnamed.append(str(exc))
            else:
                self.objects.pop(key, None)
                self.problems[key] = str(exc)
            return
        key = key or ("", "")
        self.objects[key] = model
        self.problems.pop(key, None)

    def delete(self, obj: msgspec.Raw | JsonObj) -> None:
        """Forget an object (a DELETED event's)."""
        key = _key(obj)
        if key is not None:
            self.objects.pop(key, None)
            self.problems.pop(key, None)

    def all_problems(self) -> list[str]:
        return [*self._unnamed, *self.problems.values()]

    def _decode(self, obj: kube_types.KubeObject | msgspec.Raw | JsonObj) -> Model:
        gangs, sharing = self.decoding.gangs, self.decoding.sharing
        if isinstance(obj, msgspec.Raw):
            return model_from_bytes(self.kind, obj, gangs=gangs, sharing=sharing)
        if isinstance(obj, Mapping):
            return model_from_json(self.kind, obj, gangs=gangs, sharing=sharing)
        return model_of(obj, gangs=gangs, sharing=sharing)

    def models(self) -> Iterator[Model]:
        return iter(self.objects.values())


# --------------------------------------------------------------------------- the cluster


@dataclass(frozen=True)
class ClusterObjects:
    """The nodes, pods and PDBs of a snapshot (each in key order), and what the reader found to say."""

    nodes: dict[str, Node]
    pods: tuple[Pod, ...]
    pdbs: tuple[Pdb, ...]
    findings: tuple[Finding, ...] = ()


def assemble(stores: Iterable[KindStore], findings: Iterable[Finding] = ()) -> ClusterObjects:
    """The objects of `stores` in key order, whatever order they arrived in; KubeSourceError naming
    every object that cannot be translated."""
    problems: list[str] = []
    nodes: list[Node] = []
    pods: list[Pod] = []
    pdbs: list[Pdb] = []
    for store in stores:
        problems += store.all_problems()
        for model in store.models():
            if isinstance(model, Pod):
                pods.append(model)
            elif isinstance(model, Node):
                nodes.append(model)
            elif isinstance(model, Pdb):
                pdbs.append(model)
    if problems:
        raise KubeSourceError(problems)
    nodes.sort(key=lambda n: n.name)
    pods.sort(key=lambda p: p.key)
    pdbs.sort(key=lambda p: p.key)
    return ClusterObjects(
        nodes={n.name: n for n in nodes}, pods=tuple(pods), pdbs=tuple(pdbs), findings=tuple(findings)
    )
