"""The live cluster source: the Kubernetes API (official client) -> Snapshot.

Owns reading the three kinds a cycle needs (the client comes from `rebalancer.kubeapi`), each listed
with pagination (`limit` + `continue`, restarting the list when a continue token expires) and raw JSON
responses
(`_preload_content=False`), which go straight through `kube_objects` into the model: no client model
objects are built for thousands of pods.

- nodes: every node;
- pods: every namespace (default) or the given ones, skipping finished pods on the server
  (`status.phase!=Succeeded,status.phase!=Failed`). Placement needs every pod that holds resources, so a
  namespace-restricted source says in a `partial-cluster-view` finding that free capacity may be
  overstated. Owner resolution is the pod's controller ownerReference (`kube_objects`): ReplicaSet,
  StatefulSet, Job, JobSet or any custom controller sets `Pod.owner`, which is all the bare-pod guard
  needs; nothing walks further up (Deployment, CronJob);
- PodDisruptionBudgets (policy/v1).

Telemetry comes from a separate source and is passed in (a `Telemetry`, or a callable given `now` and
the pods for attribution). A pod bound to a node that is not in the node list (deleted between the
lists) becomes an `unknown-node` finding, as in the snapshot-directory source.

It must not read the clock (`now` is given), write to the cluster, or decide anything: it reports what
the API server said. Any object it cannot translate, and any API error left after bounded retries of
transient failures (5xx, 429 throttling, timeouts, dropped connections), raises `KubeSourceError`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer.errors import Problems
from rebalancer.fence import RequestTimeout
from rebalancer.kubeapi import Backoff, describe_error, exponential_backoff, load_api_client, with_retries
from rebalancer.model import NO_TELEMETRY, Finding, Node, Pdb, Pod, Snapshot, Telemetry
from rebalancer.policy import LoadedPolicy
from rebalancer.sources.kube_objects import node_from_json, pdb_from_json, pod_from_json, split_unbound
from rebalancer.sources.object_fields import ObjectError
from rebalancer.telemetry.windows import unknown_node_findings

__all__ = ["ACTIVE_PODS", "KubeSource", "KubeSourceError", "TelemetryProvider"]

# Finished pods hold no resources; the API server filters them out for us.
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
DEFAULT_PAGE_SIZE = 500
# (connect, read) seconds for one list page.
DEFAULT_TIMEOUT: tuple[float, float] = (5.0, 60.0)

JsonObj = Mapping[str, Any]


class KubeSourceError(Problems):
    """The cluster could not be read into a snapshot; `problems` holds one line per problem."""


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
    ) -> None:
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self._core = client.CoreV1Api(api_client)
        self._policy_api = client.PolicyV1Api(api_client)
        self._loaded = loaded
        self._namespaces = tuple(dict.fromkeys(namespaces)) if namespaces is not None else None
        self._telemetry = telemetry
        self._page_size = page_size
        self._timeout = request_timeout
        self._retries = retries
        self._backoff = backoff or exponential_backoff(0.5, 5.0)
        self._sleep = sleep
        self._list_restarts = list_restarts

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
        """List nodes, pods and PDBs and assemble them with `telemetry` (or the one given at construction)."""
        raw_nodes = self.list_nodes()
        raw_pods = self.list_pods()
        raw_pdbs = self.list_pdbs()

        problems: list[str] = []
        policy = self._loaded.policy
        nodes: dict[str, Node] = {}
        for obj in raw_nodes:
            try:
                node = node_from_json(obj)
            except ObjectError as exc:
                problems.append(str(exc))
                continue
            nodes[node.name] = node
        pods: dict[tuple[str, str], Pod] = {}
        for obj in raw_pods:
            try:
                pod = pod_from_json(obj, gangs=policy.gangs, sharing=policy.gpu_sharing)
            except ObjectError as exc:
                problems.append(str(exc))
                continue
            pods[pod.key] = pod
        pdbs: list[Pdb] = []
        for obj in raw_pdbs:
            try:
                pdbs.append(pdb_from_json(obj))
            except ObjectError as exc:
                problems.append(str(exc))
        if problems:
            raise KubeSourceError(problems)

        findings: list[Finding] = []
        if self._namespaces is not None:
            findings.append(
                Finding(
                    kind="partial-cluster-view",
                    detail=(
                        f"pods listed only in namespaces {', '.join(self._namespaces)}: pods of other "
                        "namespaces are not seen, so free node capacity may be overstated"
                    ),
                )
            )
        kept, unbound = split_unbound(pods.values(), nodes, missing_from="the nodes the API listed")
        findings.extend(unbound)

        resolved, telemetry_findings = self._resolve_telemetry(
            telemetry if telemetry is not None else self._telemetry, now, {p.key: p for p in kept}
        )
        findings.extend(telemetry_findings)
        if resolved.available:
            findings.extend(unknown_node_findings(resolved, nodes))
        return Snapshot(
            now=now,
            nodes=nodes,
            pods=tuple(kept),
            pdbs=tuple(pdbs),
            telemetry=resolved,
            findings=tuple(findings),
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
        return self._list_all("nodes", self._core.list_node)

    def list_pods(self) -> list[JsonObj]:
        if self._namespaces is None:
            return self._list_all("pods", self._core.list_pod_for_all_namespaces, field_selector=ACTIVE_PODS)
        items: list[JsonObj] = []
        for namespace in self._namespaces:
            items += self._list_all(
                f"pods in {namespace}", self._core.list_namespaced_pod, namespace, field_selector=ACTIVE_PODS
            )
        return items

    def list_pdbs(self) -> list[JsonObj]:
        api = self._policy_api
        if self._namespaces is None:
            return self._list_all("poddisruptionbudgets", api.list_pod_disruption_budget_for_all_namespaces)
        items: list[JsonObj] = []
        for namespace in self._namespaces:
            items += self._list_all(
                f"poddisruptionbudgets in {namespace}", api.list_namespaced_pod_disruption_budget, namespace
            )
        return items

    def _list_all(self, what: str, call: Callable[..., Any], *args: str, **params: str) -> list[JsonObj]:
        """Every item of a list, page by page; a whole new list when a continue token expires (410)."""
        for restart in range(self._list_restarts + 1):
            items: list[JsonObj] = []
            token: str | None = None
            try:
                while True:
                    page = self._page(what, call, args, params, token)
                    items.extend(page.get("items") or ())
                    token = (page.get("metadata") or {}).get("continue") or None
                    if token is None:
                        return items
            except ApiException as exc:
                if exc.status == 410 and restart < self._list_restarts:
                    continue
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
