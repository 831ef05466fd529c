"""A small, stateful fake Kubernetes API server over real HTTP, for tests only.

The official `kubernetes` client talks to it unchanged (a `Configuration` whose host is this server), so
the code under test runs its real request building, serialisation and error handling. It serves:

- core/v1 `nodes` (cluster-scoped), `pods`, `events`, `configmaps`; `policy/v1` `poddisruptionbudgets`;
  `events.k8s.io/v1` `events`; `coordination.k8s.io/v1` `leases`;
- the controllers behind pods: `apps/v1` `replicasets`, `deployments`, `statefulsets`; `batch/v1` `jobs`,
  `cronjobs`; and, as custom resources, `jobset.x-k8s.io/v1alpha2` `jobsets`,
  `leaderworkerset.x-k8s.io/v1` `leaderworkersets`, `kubeflow.org/v1` `notebooks`,
  `serving.kserve.io/v1beta1` `inferenceservices`. Custom resources are served as apiextensions serves
  them: no strategic merge patch (415), an update must carry the resourceVersion it replaces (422), list
  items keep their apiVersion and kind. `FakeApiServer(missing_kinds=...)` leaves a CRD uninstalled:
  every path of that resource answers 404 (after authorization). Kinds with a `scale` subresource get
  `spec.replicas: 1` when created without one, as the API server defaults it;
- `.../{name}/scale` of deployments, statefulsets, replicasets and leaderworkersets, as the apps registry's
  ScaleREST and apiextensions' serve it: GET gives an autoscaling/v1 `Scale` (the parent's name,
  namespace, uid, resourceVersion and creationTimestamp, `spec.replicas`, `status.replicas`, the pod
  selector as a string); PUT and PATCH change only the parent's `spec.replicas` and move its
  resourceVersion on; a stale resourceVersion in the Scale is a 409 naming the parent, an empty one
  replaces unconditionally, a missing parent is a 404 naming it, negative replicas a 422 Invalid;
- list (all namespaces or one), with `labelSelector`, `fieldSelector` (`=`, `==`, `!=`) and pagination
  (`limit` / `continue` over a consistent snapshot, `metadata.continue` in the List; a token can be
  expired to get the API server's 410); get; create; update (PUT, with the `resourceVersion` conflict
  check); patch (strategic merge, JSON merge, JSON patch); an update or patch that leaves the uid out
  keeps it, one that changes it is a 422 (`metadata.uid` is immutable), both before admission; delete
  (with uid / resourceVersion preconditions); `dryRun=All` on every write;
- `metadata.generation` as the registry sets it before admission sees an update (its Store.Update runs
  rest.BeforeUpdate, then validating admission): no request sets it (the stored one is kept), and the
  kind's strategy moves it on by one for a write that changes the spec of a Pod, ReplicaSet,
  StatefulSet, Job, CronJob or PodDisruptionBudget, the spec or the annotations of a Deployment, anything
  but the metadata and status of a custom resource (each CRD served has the status subresource); a write
  to `scale` that changes the replicas moves it on too, one to `status` never; an object created of those
  kinds has generation 1; nodes, events, configmaps and leases keep none (tests/fake_api_kinds.py,
  `set_generation`). Differs on purpose: `add()` stores the generation it is given (`pod_json`'s pods
  have none), a delete never moves it on (the API server's first graceful delete does), and a write to
  `status` is otherwise carried out as one to the main resource (the API server keeps the stored spec,
  and a write to the main resource the stored status);
- a pod's delete is graceful as the API server makes it: a pod on a node that has not ended is marked
  terminating (`deletionTimestamp` = now + the grace period asked, else its
  `terminationGracePeriodSeconds`, 30 by default; `deletionGracePeriodSeconds`), a later delete may only
  shorten that, and the kubelet stand-in ends it: `kubelet="prompt"` (the default) at once, as
  containers that stop on SIGTERM, `kubelet="manual"` when the test calls `finish_terminating()`; a pod
  on no node, one that has ended or a grace period of 0 goes at once;
- watch (`?watch=1&resourceVersion=RV&allowWatchBookmarks=true&timeoutSeconds=N`), as the watch cache
  serves it: chunked JSON lines `{"type", "object"}` for the changes after RV (no RV or "0": ADDED for
  every current object first), DELETED carrying the deletion's own resourceVersion (as etcd3's watcher),
  label and field selectors judged on the object before and after each change as the cacher's
  cacheWatcher.convertToWatchEvent does (an object that stops matching, a pod turning Succeeded under
  `status.phase!=Succeeded`, is DELETED at the change's resourceVersion; one that starts matching is
  ADDED), BOOKMARK events with the latest resourceVersion, an ERROR event with a 410 Status "too old
  resource version" when RV predates `compact()`, the stream ending after timeoutSeconds;
  `drop_watches()` cuts every open stream without its last chunk (an API server restarting, a proxy
  dropping the connection). Differs on purpose: one history shared by all kinds, bookmarks every 0.5 s
  of quiet instead of about once a minute;
- `POST .../pods/{name}/eviction` in the order of the API server's EvictionREST.Create: 404 for a
  missing pod; terminal, Pending or terminating pods are deleted without a look at the PDBs; else PDBs
  of the namespace that select the pod: none -> delete; more than one -> 500; a not-ready pod the budget
  can spare is deleted without spending it; a budget whose status is behind its spec -> 429 "still being
  processed" (Retry-After 10); `disruptionsAllowed` 0 -> 429 with the real message and a
  `DisruptionBudget` cause; otherwise decrement, then the pod gets the `DisruptionTarget` condition
  (reason `EvictionByEvictionAPI`) and is deleted, gracefully. The delete checks the uid precondition,
  after the budget is spent: a failed one is a 409, or the 429 "still being processed" for a spared
  not-ready pod. Differs on purpose: a conflicting delete of a pod that skips the PDBs is answered at
  once, where the API server retries it for about 10 s;
- authorization: `forbid(verb, resource, namespace)` refuses what no role grants, as the API server's
  authorizer does (403 Forbidden, its message naming the user and what it cannot do, before the
  object is looked up), until `permit` lifts it; `deny_updates(resource, namespace, policy=...)`
  refuses every update and patch there as a ValidatingAdmissionPolicy's denial reads (its reason, the
  policy's message, one cause), after the object is found and the patch applied.

Every response is JSON with `Content-Type: application/json` (the client turns anything else into
`ApiException(status=0)`); errors are `Status` objects shaped like the API server's. Every request is
recorded (method, path, query, parsed body) so a test can assert, for example, that a dry run wrote
nothing; faults (a status code, a delay, a dropped connection) can be injected per path pattern for the
next N matching requests (`watch=True` / `False`: only watch requests, or only the others).

The fake is this module and its parts, one concern a module: tests/fake_api_kinds.py (the kinds served),
tests/fake_api_errors.py (errors as `Status` objects), tests/fake_api_selectors.py and
tests/fake_api_patches.py (selectors judged and patches applied as the API server does),
tests/fake_api_http.py (the request log's entries, faults, the HTTP handler), tests/fake_api_core.py
(the state and the steps every request shares) and the parts `FakeApiServer` inherits from:
tests/fake_api_verbs.py (list, create, update, patch), tests/fake_api_deletes.py (deletes and
evictions), tests/fake_api_scale.py (the scale subresource) and tests/fake_api_watch.py (watches);
tests/fake_api_objects.py builds the objects tests load. This module keeps what tests hold: the server's
lifecycle, its helpers for state, the request log, faults and authorization, the dispatch of each
request to its part, and the `fake_apiserver` fixture; tests import what they use of the fake from here
(`__all__`).

This module and its parts must stay a test double: no project code imports them, they never grow
scheduling or controller behaviour (no ReplicaSet re-creating evicted pods, no disruption controller
recomputing budgets; the kubelet stand-in only confirms terminating pods gone); tests change state
through `add()` / `remove()` (at once, whatever the pod), `finish_terminating()` or the HTTP API.
"""

from __future__ import annotations

import copy
import fnmatch
import threading
from collections.abc import Iterator, Mapping
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from tests.fake_api_deletes import EVICTION_REFUSED, MULTIPLE_PDBS, Deletes
from tests.fake_api_errors import NOT_FOUND_RESOURCE, ApiError
from tests.fake_api_http import Fault, Handler, RecordedRequest, last
from tests.fake_api_kinds import BY_KIND, BY_PATH, CORE_PATH, GROUP_PATH, JsonObj, set_generation
from tests.fake_api_objects import add_consolidation_cluster, controller_json, node_json, pdb_json, pod_json
from tests.fake_api_patches import json_patch, merge_patch, strategic_merge_patch
from tests.fake_api_scale import ScaleSubresource
from tests.fake_api_selectors import parse_label_selector, selector_string
from tests.fake_api_verbs import CONTINUE_EXPIRED, Verbs
from tests.fake_api_watch import Watches

# The names the tests import from here, the fake's one entry point, wherever they are defined.
__all__ = [
    "CONTINUE_EXPIRED",
    "EVICTION_REFUSED",
    "MULTIPLE_PDBS",
    "SERVICE_ACCOUNT_USER",
    "FakeApiServer",
    "RecordedRequest",
    "add_consolidation_cluster",
    "controller_json",
    "fake_apiserver",
    "json_patch",
    "merge_patch",
    "node_json",
    "parse_label_selector",
    "pdb_json",
    "pod_json",
    "selector_string",
    "set_generation",
    "strategic_merge_patch",
]

# Who `forbid` names as refused by default: gpu-rebalancer's service account, as the API server names it.
SERVICE_ACCOUNT_USER = "system:serviceaccount:gpu-rebalancer:gpu-rebalancer"


# --------------------------------------------------------------------------- the server


class FakeApiServer(Verbs, Deletes, ScaleSubresource, Watches):
    """The fake API server. Use as a context manager; `url` is `http://127.0.0.1:<port>`. What it is
    built with (`missing_kinds`, `kubelet`, `clock`) is `FakeApiCore`'s constructor's to say."""

    # ---- lifecycle

    def start(self) -> FakeApiServer:
        handler = type("_BoundHandler", (Handler,), {"fake": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def configuration(self) -> client.Configuration:
        """A client Configuration pointing at this server (no auth, no proxy)."""
        config = client.Configuration(host=self.url)
        config.proxy = None
        return config

    def api_client(self) -> client.ApiClient:
        return client.ApiClient(self.configuration())

    # ---- state, for tests

    def add(self, obj: Mapping[str, Any]) -> JsonObj:
        """Store an object (by its kind and apiVersion), filling uid / resourceVersion; returns the copy."""
        kind = BY_KIND.get((str(obj.get("apiVersion", "")), str(obj.get("kind", ""))))
        if kind is None:
            raise ValueError(f"unsupported object {obj.get('apiVersion')}/{obj.get('kind')}")
        if kind.qualified in self._missing:
            raise ValueError(f"{kind.qualified} is not installed in this fake (missing_kinds)")
        stored = copy.deepcopy(dict(obj))
        meta = stored.setdefault("metadata", {})
        if kind.namespaced:
            meta.setdefault("namespace", "default")
        else:
            meta.pop("namespace", None)
        with self._lock:
            self._fill_new(kind, stored)
            key = self._key(kind, meta.get("namespace"), meta["name"])
            before = self._store(kind).get(key)
            self._store(kind)[key] = stored
            self._emit(kind, "MODIFIED" if before is not None else "ADDED", stored, before)
            return copy.deepcopy(stored)

    def remove(self, kind: str, name: str, namespace: str | None = None, api_version: str = "v1") -> None:
        resolved = self._kind_of(kind, api_version)
        with self._lock:
            gone = self._store(resolved).pop(self._key(resolved, namespace, name), None)
            if gone is not None:
                self._emit(resolved, "DELETED", gone)

    def finish_terminating(self) -> list[tuple[str, str]]:
        """The kubelets confirm every terminating pod gone (their delete with grace 0), as `kubelet="manual"`
        leaves them; the (namespace, name) of each, in order."""
        pods = self._kind_of("Pod", "v1")
        with self._lock:
            ended = [
                key
                for key, pod in sorted(self._store(pods).items())
                if pod["metadata"].get("deletionTimestamp")
            ]
            for key in ended:
                self._emit(pods, "DELETED", self._store(pods).pop(key))
        return [(ns or "", name) for ns, name in ended]

    def get(
        self, kind: str, name: str, namespace: str | None = None, api_version: str = "v1"
    ) -> JsonObj | None:
        resolved = self._kind_of(kind, api_version)
        with self._lock:
            found = self._store(resolved).get(self._key(resolved, namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def objects(self, kind: str, api_version: str = "v1") -> list[JsonObj]:
        resolved = self._kind_of(kind, api_version)
        with self._lock:
            return [copy.deepcopy(o) for _, o in sorted(self._store(resolved).items())]

    def pod(self, namespace: str, name: str) -> JsonObj | None:
        return self.get("Pod", name, namespace)

    def node(self, name: str) -> JsonObj | None:
        return self.get("Node", name)

    def pdb(self, namespace: str, name: str) -> JsonObj | None:
        return self.get("PodDisruptionBudget", name, namespace, "policy/v1")

    def events(self) -> list[JsonObj]:
        """Events of both APIs (core/v1 and events.k8s.io/v1)."""
        return self.objects("Event") + self.objects("Event", "events.k8s.io/v1")

    def expire_continue_tokens(self) -> None:
        """Make every outstanding `continue` token answer 410 Expired (as after an etcd compaction)."""
        with self._lock:
            self._snapshots.clear()

    # ---- request log and faults

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def writes(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.is_write]

    def requests_to(self, pattern: str, method: str | None = None) -> list[RecordedRequest]:
        return [
            r
            for r in self.requests
            if fnmatch.fnmatchcase(r.path, pattern) and (method is None or r.method == method)
        ]

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def inject(
        self,
        pattern: str,
        *,
        status: int | None = None,
        delay: float = 0.0,
        drop: bool = False,
        times: int | None = 1,
        skip: int = 0,
        method: str | None = None,
        message: str = "injected fault",
        lose_answer: bool = False,
        watch: bool | None = None,
    ) -> Fault:
        """Fault the next `times` requests (None: every one) whose path matches the fnmatch `pattern`,
        after letting `skip` of them through.

        `status`: answer with this code and a Status body; `delay`: wait this long first (then fault or
        serve normally); `drop`: close the connection without an answer; `lose_answer`: carry the
        request out, then close the connection without its answer (a committed change whose answer the
        network lost), or with `status` answer that failure instead (a gateway timing out on it);
        `watch`: True faults only watch requests, False only the others, None both.
        """
        fault = Fault(pattern, method, status, message, delay, drop, times, skip, lose_answer, watch)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _record(self, request: RecordedRequest) -> Fault | None:
        watching = request.method == "GET" and request.param("watch") in ("true", "1")
        with self._lock:
            fault = next((f for f in self._faults if f.matches(request.method, request.path, watching)), None)
            if fault is not None and not fault.consume():
                fault = None
            recorded = request
            if fault is not None:
                recorded = RecordedRequest(
                    request.method,
                    request.path,
                    request.query,
                    request.body,
                    request.content_type,
                    fault.describe(),
                )
            self._requests.append(recorded)
            if watching and fault is None:
                # A watch is open from the moment it is seen: `drop_watches()` ends it even if it comes
                # before the stream is set up (the handler thread picks this epoch up in `watch`).
                self._watch_epoch_seen[threading.get_ident()] = self._watch_epoch
            return fault

    # ---- authorization

    def forbid(
        self, verb: str, resource: str, namespace: str, *, group: str = "", user: str = SERVICE_ACCOUNT_USER
    ) -> None:
        """Refuse `verb` (`get`, `list`, `patch`...) on `resource` (`pods`, `pods/eviction`) of `group` in
        `namespace` ("" for cluster-scoped objects) from now on, as the authorizer does when no role of
        `user` grants it: 403 Forbidden, before the object is looked up."""
        with self._lock:
            self._forbidden[(verb, group, resource, namespace)] = user

    def permit(self, verb: str, resource: str, namespace: str, *, group: str = "") -> None:
        """Lift a `forbid` (a role now grants it)."""
        with self._lock:
            self._forbidden.pop((verb, group, resource, namespace), None)

    def deny_updates(
        self,
        resource: str,
        namespace: str,
        *,
        policy: str,
        message: str,
        reason: str = "Forbidden",
        group: str = "",
    ) -> None:
        """Refuse every update and patch of `resource` in `namespace` as the ValidatingAdmissionPolicy
        `policy` (bound by a binding of the same name) refusing with `message` and `reason`."""
        with self._lock:
            self._denials[(group, resource, namespace)] = (policy, message, reason)

    # ---- dispatch

    def handle(
        self, method: str, path: str, query: Mapping[str, tuple[str, ...]], body: Any, ctype: str
    ) -> tuple[int, JsonObj]:
        if path == "/version":
            return 200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake"}
        match = CORE_PATH.match(path) or GROUP_PATH.match(path)
        if match is None:
            raise ApiError(404, NOT_FOUND_RESOURCE)
        parts = match.groupdict()
        group = parts.get("group") or ""
        kind = BY_PATH.get((group, parts["version"], parts["resource"]))
        if kind is None:
            raise ApiError(404, NOT_FOUND_RESOURCE)
        ns, name, sub = parts["ns"], parts["name"], parts["sub"]
        if kind.qualified in self._missing:
            # No CRD: the authorizer still runs first (it knows nothing of what is installed).
            with self._lock:
                self._authorize(_verb(method, name, query), kind, ns, name, sub)
            raise ApiError(404, NOT_FOUND_RESOURCE)
        if ns is not None and not kind.namespaced:
            raise ApiError(404, NOT_FOUND_RESOURCE)
        dry_run = _dry_run(query)
        with self._lock:
            self._authorize(_verb(method, name, query), kind, ns, name, sub)
            if sub == "eviction":
                if kind.resource != "pods" or kind.group or method != "POST" or name is None or ns is None:
                    raise ApiError(405, "the server does not allow this method on the requested resource")
                return self._evict(kind, ns, name, body, dry_run)
            if sub == "scale" and kind.scale_selector is not None and name is not None and ns is not None:
                if method == "GET":
                    return 200, self._scale_of(kind, self._existing(kind, ns, name))
                if method in ("PUT", "PATCH"):
                    return self._rescale(
                        kind, ns, name, method=method, body=body, ctype=ctype, dry_run=dry_run
                    )
                raise ApiError(405, "the server does not allow this method on the requested resource")
            if sub not in (None, "status"):
                raise ApiError(404, NOT_FOUND_RESOURCE)
            if name is None:
                if method == "GET":
                    return 200, self._list(kind, ns, query)
                if method == "POST" and sub is None:
                    return self._create(kind, ns, body, dry_run)
                raise ApiError(405, "the server does not allow this method on the requested resource")
            if kind.namespaced and ns is None:
                raise ApiError(404, NOT_FOUND_RESOURCE)
            if method == "GET":
                return 200, self._with_type(kind, self._existing(kind, ns, name))
            status = sub == "status"
            if method == "PUT":
                return self._update(kind, ns, name, body=body, dry_run=dry_run, status=status)
            if method == "PATCH":
                return self._patch(kind, ns, name, body=body, ctype=ctype, dry_run=dry_run, status=status)
            if method == "DELETE" and sub is None:
                options = dict(body) if isinstance(body, dict) else {}
                grace = last(query, "gracePeriodSeconds")  # DeleteOptions may come as query parameters
                if grace is not None and "gracePeriodSeconds" not in options:
                    options["gracePeriodSeconds"] = int(grace)
                return self._delete(kind, ns, name, body=options, dry_run=dry_run)
            raise ApiError(405, "the server does not allow this method on the requested resource")


def _verb(method: str, name: str | None, query: Mapping[str, tuple[str, ...]]) -> str:
    """The verb the authorizer checks for an HTTP request (the API server's RequestInfo)."""
    if method == "GET":
        return "get" if name else ("watch" if last(query, "watch") in ("true", "1") else "list")
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def _dry_run(query: Mapping[str, tuple[str, ...]]) -> bool:
    values = query.get("dryRun") or ()
    for value in values:
        if value != "All":
            raise ApiError(400, f'Invalid dryRun: unsupported value "{value}" (only "All" is supported)')
    return bool(values)


# --------------------------------------------------------------------------- fixture


@pytest.fixture
def fake_apiserver() -> Iterator[FakeApiServer]:
    """A started fake API server, stopped after the test."""
    with FakeApiServer() as server:
        yield server
