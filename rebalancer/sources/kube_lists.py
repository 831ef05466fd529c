"""Reading one kind of the cluster's objects: the list calls, their pages, and their decoding.

Owns what both live readers of nodes, pods and PodDisruptionBudgets share, so they read the same
objects the same way: the per-cycle lister (`sources.kube`) and the watch cache (`sources.kube_cache`):

- `cluster_calls`: the list calls of a snapshot, each one `ListCall` (nodes; pods skipping finished ones
  on the server, `ACTIVE_PODS`; PDBs), cluster-wide or one per given namespace;
- `Lister`: one list, page by page (`limit` + `continue`, the whole list again when a continue token
  expires with 410), each page through `kubeapi.with_retries` (the one retry rule) as raw JSON
  (`_preload_content=False`), handing each item on as its page arrives, so no caller has to hold raw
  pages; it answers the list's resourceVersion, which a watch starts from;
- `KindStore`: one call's objects decoded into the model as they arrive (`kube_objects`), keyed by
  namespace and name, with the objects that cannot be decoded kept as problems (so a snapshot refuses
  them, naming the object and the field) until they change or go.

It must not read the clock, write to the cluster or decide anything. An API error left after bounded
retries of transient failures raises `KubeSourceError`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer.errors import Problems
from rebalancer.fence import RequestTimeout
from rebalancer.kubeapi import Backoff, describe_error, exponential_backoff, with_retries
from rebalancer.model import Finding, Node, Pdb, Pod
from rebalancer.policy import GangConfig, GpuSharingConfig, LoadedPolicy
from rebalancer.sources.kube_objects import node_from_json, pdb_from_json, pod_from_json
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
        """Every item of a list. An answer whose status is in `refused` raises `Refused` (the caller's to
        report), any other error KubeSourceError."""
        items: list[JsonObj] = []
        self.each(what, call, args, params, begin=items.clear, item=items.append, refused=refused)
        return items

    def each(
        self,
        what: str,
        call: Callable[..., Any],
        args: Iterable[str],
        params: Mapping[str, str],
        *,
        begin: Callable[[], None],
        item: Callable[[JsonObj], None],
        refused: Sequence[int] = (),
    ) -> str:
        """`item(obj)` for every item of a list as its page arrives, `begin()` before the first page of
        each attempt (a list restarted after its continue token expired starts over); the list's
        resourceVersion."""
        args = tuple(args)
        for restart in range(self._list_restarts + 1):
            begin()
            token: str | None = None
            try:
                while True:
                    page = self._page(what, call, args, params, token)
                    for obj in page.get("items") or ():
                        item(obj)
                    meta = page.get("metadata") or {}
                    token = meta.get("continue") or None
                    if token is None:
                        return str(meta.get("resourceVersion") or "")
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
    ) -> JsonObj:
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
        try:
            page = json.loads(data)
        except ValueError as exc:
            raise KubeSourceError([f"cannot list {what}: the API answered invalid JSON: {exc}"]) from None
        if not isinstance(page, dict):
            raise KubeSourceError([f"cannot list {what}: the API answered {type(page).__name__}"])
        return page


# --------------------------------------------------------------------------- decoded objects


@dataclass(frozen=True)
class Decoding:
    """What the translation of pods depends on in the policy (gangs, GPU sharing)."""

    gangs: GangConfig
    sharing: GpuSharingConfig


def decoding_of(loaded: LoadedPolicy) -> Decoding:
    return Decoding(gangs=loaded.policy.gangs, sharing=loaded.policy.gpu_sharing)


Model = Node | Pod | Pdb
Key = tuple[str, str]


def _key(obj: JsonObj) -> Key | None:
    """(namespace, name) of a raw object; None for an object without a name (it cannot be keyed)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
        return None
    namespace = meta.get("namespace")
    return (namespace if isinstance(namespace, str) else "", meta["name"])


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

    def put(self, obj: JsonObj) -> None:
        """Add or replace an object (a listed item, an ADDED or MODIFIED event)."""
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

    def delete(self, obj: JsonObj) -> None:
        """Forget an object (a DELETED event)."""
        key = _key(obj)
        if key is not None:
            self.objects.pop(key, None)
            self.problems.pop(key, None)

    def all_problems(self) -> list[str]:
        return [*self._unnamed, *self.problems.values()]

    def _decode(self, obj: JsonObj) -> Model:
        if self.kind == "Pod":
            return pod_from_json(obj, gangs=self.decoding.gangs, sharing=self.decoding.sharing)
        if self.kind == "Node":
            return node_from_json(obj)
        return pdb_from_json(obj)

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
            else:
                pdbs.append(model)
    if problems:
        raise KubeSourceError(problems)
    nodes.sort(key=lambda n: n.name)
    pods.sort(key=lambda p: p.key)
    pdbs.sort(key=lambda p: p.key)
    return ClusterObjects(
        nodes={n.name: n for n in nodes}, pods=tuple(pods), pdbs=tuple(pdbs), findings=tuple(findings)
    )
