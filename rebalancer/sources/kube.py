"""The live cluster source: the Kubernetes API (official client) -> Snapshot.

Owns reading what a cycle needs (the client comes from `rebalancer.kubeapi`), each kind listed with
pagination (`limit` + `continue`, restarting the list when a continue token expires) and raw JSON
responses (`_preload_content=False`), each page decoded as it arrives (`sources.kube_lists`, shared
with the watch cache) by msgspec into `kube_types`' Structs, which name only the fields the model
reads, and those translated into the model by `kube_objects`: no client model objects are built for
thousands of pods and no raw page is held. The nodes, pods and PDBs come from a `ClusterReader`: listed
now (the default, `list_cluster`), or the daemon's watch cache (`sources.kube_cache`); the controllers
are always listed per snapshot.

- nodes: every node;
- pods: every namespace (default) or the given ones, skipping finished pods on the server
  (`status.phase!=Succeeded,status.phase!=Failed`). Placement needs every pod that holds resources, so a
  namespace-restricted source says in a `partial-cluster-view` finding that free capacity may be
  overstated. A pod's owner is its controller ownerReference (`kube_pods`), which is all the
  bare-pod guard needs;
- PodDisruptionBudgets (policy/v1);
- the controllers of the GPU pods, walked up as `workloads.resolve()` walks them, into
  `Snapshot.controllers`: one list per kind of `workloads.KINDS` the walk reaches (cluster-wide, or per
  given namespace that needs it; never one request per pod or per object), in rounds: first the kinds
  of the GPU pods' controllers (ReplicaSet, StatefulSet, Job...), then the kinds of those objects' own
  controllers the walk goes into (Deployment, then InferenceService; LeaderWorkerSet or Notebook; JobSet;
  a LeaderWorkerSet worker StatefulSet through its leader pod's owner), until a round finds no new
  kind. Only the objects the walk reaches are kept. Kinds outside `KINDS` (DaemonSet, a CronJob above a
  Job, custom operators) are not read. A list the API server refuses with 404 (a custom kind whose
  CustomResourceDefinition is not installed) or 403 (no permission) is not a failure: it becomes an
  `unread-controllers` finding naming the kind and why (the missing permission as verb, resource and
  API group), and the walk ends below it, leaving those workloads unresolved (report-only downstream).

Telemetry comes from a separate source and is passed in (a `Telemetry`, or a callable given `now` and
the pods for attribution). A pod bound to a node that is not in the node list (deleted between the
lists) becomes an `unknown-node` finding, as in the snapshot-directory source.

It must not read the clock (`now` is given), write to the cluster, or decide anything: it reports what
the API server said. Any object it cannot translate, and any API error left after bounded retries of
transient failures (5xx, 429 throttling, timeouts, dropped connections), raises `KubeSourceError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer.fence import RequestTimeout
from rebalancer.gcpause import collector_paused
from rebalancer.history import Workload
from rebalancer.kubeapi import Backoff, describe_error, load_api_client
from rebalancer.model import NO_TELEMETRY, Controller, Finding, Pod, Snapshot, Telemetry
from rebalancer.policy import LoadedPolicy
from rebalancer.sources.kube_lists import (
    ACTIVE_PODS,
    DEFAULT_PAGE_SIZE,
    DEFAULT_TIMEOUT,
    ClusterObjects,
    KindStore,
    KubeSourceError,
    ListCall,
    Lister,
    Refused,
    assemble,
    cluster_calls,
    decoding_of,
)
from rebalancer.sources.kube_objects import controller_from_json, split_unbound
from rebalancer.sources.kube_pods import pod_from_json
from rebalancer.sources.object_fields import ObjectError
from rebalancer.telemetry.identity import PodsOfNamespaces
from rebalancer.telemetry.windows import unknown_node_findings
from rebalancer.wording import plural
from rebalancer.workloads import KINDS, Kind, walks_to

__all__ = [
    "ACTIVE_PODS",
    "UNREAD_CONTROLLERS",
    "ClusterReader",
    "KubeSource",
    "KubeSourceError",
    "TelemetryProvider",
]

# The finding when a kind of controller the GPU pods need cannot be listed (not installed, no permission).
UNREAD_CONTROLLERS: Final = "unread-controllers"
# A list the API server refuses this way is left unread (a finding), never a failed cycle.
_UNREADABLE = (403, 404)
# How many of the objects that needed an unread kind a finding names.
_NAMED = 3

JsonObj = Mapping[str, Any]

ClusterReader = Callable[[LoadedPolicy], ClusterObjects]
"""The nodes, pods and PDBs of a snapshot under a policy (the policy says how pods translate): listed
now by default, or the watch cache's (`sources.kube_cache`)."""


class TelemetryProvider(Protocol):
    """Live telemetry for `now`, given the snapshot's pods (to attribute GPU series to pods).

    May return the telemetry alone or with findings (as `telemetry.windows.aggregate` does).
    """

    def __call__(
        self, now: datetime, pods: Mapping[tuple[str, str], Pod]
    ) -> Telemetry | tuple[Telemetry, Sequence[Finding]]: ...


class KubeSource:
    """Builds Snapshots from a live cluster. One instance per client; `snapshot()` is safe to call again."""

    def __init__(
        self,
        api_client: client.ApiClient,
        loaded: LoadedPolicy,
        *,
        namespaces: Sequence[str] | None = None,
        telemetry: Telemetry | TelemetryProvider | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        request_timeout: RequestTimeout = DEFAULT_TIMEOUT,
        retries: int = 2,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        list_restarts: int = 2,
        described: str = "live cluster",
        cluster: ClusterReader | None = None,
    ) -> None:
        self._objects = client.CustomObjectsApi(api_client)
        self._loaded = loaded
        self._namespaces = tuple(dict.fromkeys(namespaces)) if namespaces is not None else None
        self._calls = cluster_calls(api_client, self._namespaces)
        self._telemetry = telemetry
        self._described = described  # what the snapshot says it was read from: never a credential
        self._lister = Lister(
            page_size=page_size,
            request_timeout=request_timeout,
            retries=retries,
            backoff=backoff,
            sleep=sleep,
            list_restarts=list_restarts,
        )
        self._cluster = cluster or self.list_cluster

    @classmethod
    def from_kubeconfig(
        cls,
        loaded: LoadedPolicy,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        **kwargs: Any,
    ) -> KubeSource:
        """A source for the cluster `kubeapi.load_api_client(kubeconfig, context)` reaches."""
        return cls(load_api_client(kubeconfig, context), loaded, **kwargs)

    # ---- the snapshot

    def snapshot(self, now: datetime, telemetry: Telemetry | TelemetryProvider | None = None) -> Snapshot:
        """List nodes, pods, PDBs and the GPU pods' controllers and assemble them with `telemetry` (or the
        one given at construction).

        The cyclic collector is paused for the whole of it, the Prometheus queries included
        (rebalancer.gcpause): decoded pages, model objects and telemetry rows are not garbage until the
        snapshot is built, and full collections over them would cost more than building it."""
        with collector_paused():
            return self._snapshot(now, telemetry)

    def _snapshot(self, now: datetime, telemetry: Telemetry | TelemetryProvider | None) -> Snapshot:
        cluster = self._cluster(self._loaded)
        nodes = cluster.nodes
        problems: list[str] = []
        findings: list[Finding] = list(cluster.findings)
        if self._namespaces is not None:
            findings.append(
                Finding(
                    kind="partial-cluster-view",
                    detail=(
                        f"pods listed only in namespaces {', '.join(self._namespaces)}: pods of other "
                        "namespaces are not seen, so free node capacity may be overstated (their GPUs' "
                        "series are taken as their pod labels say, never as held by no pod)"
                    ),
                )
            )
        kept, unbound = split_unbound(cluster.pods, nodes, missing_from="the nodes the API listed")
        findings.extend(unbound)
        raw_controllers, unread = self._walk_controllers(kept)
        findings.extend(unread)
        controllers: dict[tuple[str, str, str], Controller] = {}
        for obj in raw_controllers:
            try:
                controller = controller_from_json(obj)
            except ObjectError as exc:
                problems.append(str(exc))
                continue
            controllers[controller.key] = controller
        if problems:
            raise KubeSourceError(problems)

        by_key = {p.key: p for p in kept}
        resolved, telemetry_findings = self._resolve_telemetry(
            telemetry if telemetry is not None else self._telemetry,
            now,
            by_key if self._namespaces is None else PodsOfNamespaces(by_key, self._namespaces),
        )
        findings.extend(telemetry_findings)
        if resolved.available:
            findings.extend(unknown_node_findings(resolved, nodes))
        return Snapshot(
            now=now,
            nodes=nodes,
            pods=tuple(kept),
            pdbs=cluster.pdbs,
            telemetry=resolved,
            findings=tuple(findings),
            controllers=controllers,
            source=self._described,
        )

    def list_cluster(self, loaded: LoadedPolicy) -> ClusterObjects:
        """Nodes, pods and PDBs listed now, each page decoded into the model as it arrives (no raw page
        is kept); KubeSourceError naming every object that cannot be translated."""
        decoding = decoding_of(loaded)
        stores: list[KindStore] = []
        for call in self._calls:
            store = KindStore(call.kind, decoding)
            self._lister.fill(call, store)
            stores.append(store)
        return assemble(stores)

    @property
    def calls(self) -> tuple[ListCall, ...]:
        """The lists of nodes, pods and PDBs this source makes (what a watch cache of it watches)."""
        return self._calls

    @property
    def lister(self) -> Lister:
        return self._lister

    def _pods(self, raw_pods: Iterable[JsonObj], problems: list[str]) -> dict[tuple[str, str], Pod]:
        policy = self._loaded.policy
        pods: dict[tuple[str, str], Pod] = {}
        for obj in raw_pods:
            try:
                pod = pod_from_json(obj, gangs=policy.gangs, sharing=policy.gpu_sharing)
            except ObjectError as exc:
                problems.append(str(exc))
                continue
            pods[pod.key] = pod
        return pods

    # ---- controllers

    def list_controllers(self, raw_pods: Iterable[JsonObj]) -> tuple[list[JsonObj], list[Finding]]:
        """The controller objects the GPU pods among `raw_pods` resolve through (as `snapshot()` reads
        them, each with its kind and apiVersion), and the `unread-controllers` findings of kinds that
        could not be listed."""
        problems: list[str] = []
        pods = self._pods(raw_pods, problems)
        if problems:
            raise KubeSourceError(problems)
        return self._walk_controllers(pods.values())

    def _walk_controllers(self, pods: Iterable[Pod]) -> tuple[list[JsonObj], list[Finding]]:
        """Round by round, list the kinds the walk up from the GPU pods reaches next (see the module
        docstring); the objects reached, and a finding for each kind that could not be listed."""
        by_key = {pod.key: pod for pod in pods}
        frontier: dict[Workload, str] = {}  # the controllers to look up next, each with who needs it
        for pod in by_key.values():
            if pod.uses_gpu and pod.owner is not None and pod.owner.kind in KINDS:
                key = Workload(pod.namespace, pod.owner.kind, pod.owner.name)
                frontier.setdefault(key, f"pod {pod.ref}")
        listed: dict[str, dict[tuple[str, str], JsonObj]] = {}
        unread: dict[str, tuple[str, list[str]]] = {}  # kind -> (why, who needed it)
        reached: dict[Workload, JsonObj] = {}
        visited = set(frontier)
        while frontier:
            for kind in KINDS:
                if kind in listed or kind in unread or not any(key.kind == kind for key in frontier):
                    continue
                namespaces = sorted({key.namespace for key in frontier if key.kind == kind})
                try:
                    listed[kind] = self._list_kind(KINDS[kind], namespaces)
                except _Unread as exc:
                    unread[kind] = (exc.why, [])
            following: dict[Workload, str] = {}
            for key, needed_by in frontier.items():
                if key.kind in unread:
                    unread[key.kind][1].append(needed_by)
                    continue
                obj = listed[key.kind].get((key.namespace, key.name))
                if obj is None:
                    continue  # gone, or never there: the walk ends below it
                reached[key] = obj
                try:
                    up = walks_to(controller_from_json(obj), by_key)
                except ObjectError:
                    continue  # reported by the caller, which translates every object reached
                if up is not None and up.kind in KINDS and up not in visited:
                    visited.add(up)
                    following[up] = f"{key.kind} {key.namespace}/{key.name}"
            frontier = following
        findings = [self._unread_finding(KINDS[kind], why, needed) for kind, (why, needed) in unread.items()]
        return list(reached.values()), findings

    def _list_kind(self, kind: Kind, namespaces: Sequence[str]) -> dict[tuple[str, str], JsonObj]:
        """One kind's objects by (namespace, name), each with its kind and apiVersion: one list over
        every namespace, or one per namespace of `namespaces` when the source is restricted."""
        api = self._objects
        what = f"{kind.resource}.{kind.group}"
        items: list[JsonObj] = []
        where: str | None = None
        try:
            if self._namespaces is None:
                items = self._list_all(
                    what,
                    api.list_cluster_custom_object,
                    kind.group,
                    kind.version,
                    kind.resource,
                    refused=_UNREADABLE,
                )
            else:
                for where in namespaces:
                    items += self._list_all(
                        f"{what} in {where}",
                        api.list_namespaced_custom_object,
                        kind.group,
                        kind.version,
                        where,
                        kind.resource,
                        refused=_UNREADABLE,
                    )
        except Refused as refused:
            raise _Unread(_why_unread(kind, where, refused.error)) from None
        out: dict[tuple[str, str], JsonObj] = {}
        for item in items:
            meta = item.get("metadata")
            if not isinstance(meta, Mapping):
                continue  # translated (and refused) only if the walk needs it: it cannot, without a name
            typed = {**item, "kind": kind.kind, "apiVersion": item.get("apiVersion") or kind.api_version}
            out[(str(meta.get("namespace") or "default"), str(meta.get("name") or ""))] = typed
        return out

    @staticmethod
    def _unread_finding(kind: Kind, why: str, needed_by: Sequence[str]) -> Finding:
        names = ", ".join(needed_by[:_NAMED]) + (
            f" and {len(needed_by) - _NAMED} more" if len(needed_by) > _NAMED else ""
        )
        return Finding(
            kind=UNREAD_CONTROLLERS,
            detail=(
                f"{kind.kind} objects ({kind.resource}.{kind.group}/{kind.version}) not read: {why}; "
                f"needed by {plural(len(needed_by), 'object')} ({names}), whose workloads stay unresolved "
                "(reported, never acted on)"
            ),
        )

    @staticmethod
    def _resolve_telemetry(
        given: Telemetry | TelemetryProvider | None, now: datetime, pods: Mapping[tuple[str, str], Pod]
    ) -> tuple[Telemetry, tuple[Finding, ...]]:
        if given is None:
            return NO_TELEMETRY, ()
        if isinstance(given, Telemetry):
            return given, ()
        try:
            result = given(now, pods)
        except Exception as exc:  # the telemetry edge failing must not hide the cluster
            return Telemetry(
                available=False, problem=f"telemetry source failed: {type(exc).__name__}: {exc}"
            ), ()
        if isinstance(result, Telemetry):
            return result, ()
        telemetry, findings = result
        return telemetry, tuple(findings)

    # ---- raw lists

    def list_nodes(self) -> list[JsonObj]:
        return self._list_raw("Node")

    def list_pods(self) -> list[JsonObj]:
        return self._list_raw("Pod")

    def list_pdbs(self) -> list[JsonObj]:
        return self._list_raw("PodDisruptionBudget")

    def _list_raw(self, kind: str) -> list[JsonObj]:
        items: list[JsonObj] = []
        for call in self._calls:
            if call.kind == kind:
                listed: list[JsonObj] = []
                self._lister.each(
                    call.what, call.call, call.args, call.params, begin=listed.clear, item=listed.append
                )
                items += listed
        return items

    def _list_all(
        self, what: str, call: Callable[..., Any], *args: str, refused: Sequence[int] = (), **params: str
    ) -> list[JsonObj]:
        return self._lister.items(what, call, *args, refused=refused, **params)


class _Unread(Exception):
    """A kind of controller that cannot be listed, and why."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _why_unread(kind: Kind, namespace: str | None, error: ApiException) -> str:
    """Why a kind could not be listed: not served (404), or the permission that is missing (403)."""
    if error.status == 404:
        return (
            f"the API server does not serve {kind.resource}.{kind.group}/{kind.version} (is its "
            f"CustomResourceDefinition installed?): {describe_error(error)}"
        )
    scope = f"in namespace {namespace}" if namespace is not None else "cluster-wide"
    return (
        f"no permission: grant verb `list` on resource `{kind.resource}` in API group `{kind.group}` "
        f"({scope}): {describe_error(error)}"
    )
