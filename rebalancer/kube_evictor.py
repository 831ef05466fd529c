"""The evictor that talks to the Eviction API: `KubeEvictor`, and turning its answers into Outcomes.

The protocol it implements and the dry-run evictor are rebalancer.evictor's (which stays free of the
Kubernetes client); this module is imported only where a live cluster is written.

`KubeEvictor` POSTs a policy/v1 Eviction per pod with `deleteOptions.preconditions.uid` (a re-created
pod of the same name is never evicted), an optional grace period, and `rebalancer.gpu/requested-by` /
`rebalancer.gpu/reason` annotations. Optionally server-side dry-run (`dryRun=All`): the API server runs
its checks (PDBs included, one pod at a time) and persists nothing; pods come back `would-evict`.

Answers: 200/201 `evicted` (`would-evict` in server dry-run); 429 from a disruption budget
`blocked-by-pdb`, never retried, and that PDB (namespace + selector) is remembered until `begin_cycle()`
so later pods it covers are not attempted ("PDB exhausted earlier this cycle"); 404 / 409 `gone` (the
pod, or that incarnation of it, no longer exists); the 500 for a pod under more than one PDB an
immediate `error` (always so, nothing written); other 5xx, 429 throttling, status 0, timeouts and dropped
connections are retried a bounded number of times with backoff, then `error`; other answers (400, 403,
422...) are an immediate `error`. A retry after a timeout is safe: an eviction that did land left the
pod terminating (the retry's 201 changes nothing: a terminating pod skips the budgets, and a second
graceful delete may only shorten its grace period), or gone once its kubelet stopped it, or re-created
under the same name, which the uid precondition turns into a 404 / 409. After a request without an
answer those mean that request went through, so they are `evicted` (and the circuit breaker watches
it); when every attempt went unanswered the pod is read back (a list by name: gone, re-created or
terminating is `evicted`).

Fencing: before every write (each eviction attempt, each node patch) the evictor and tainter ask their
`fence` (rebalancer.fence) how long the write may take and clip the request timeout to it. A closed
fence (the leader lease lost, a deadline passed) stops the plan at once: that pod and the rest get
`error` "not attempted: <why>"; a mark that cannot be written is not ok.

A multi-pod decision (gang or node) stops at the first pod that ends `blocked-by-pdb` or `error`: the
pods after it are not attempted and get `error` with "not attempted: plan stopped after <ns/pod>
<result>", so the report says exactly what was done; a pod already `gone` does not stop the plan. When
a pod of the decision is covered by a PDB already exhausted this cycle, nothing of the decision is
attempted.

Node drain marks (the taint that keeps evicted pods from landing back) are rebalancer.node_marks'.
A workload action (`Proposal.action`: tell an idle workload's owner, scale it to 0, suspend or stop it)
writes the workload, not the Eviction API: `KubeEvictor` hands it to rebalancer.reclaim's
`WorkloadWriter`, under the same fence; a bare pod's reclaim is an eviction like any other.

It must not plan: no choosing, ordering or re-checking of guards and budgets beyond the API server's
verdicts (the planner's ledger is the client-side PDB check). It never reads the clock except to sleep
between retries, and it does not write Events (another edge does).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer.evictor import UnframedEvictor, approved_pods, not_attempted
from rebalancer.fence import UNFENCED, Fence, FenceLost, RequestTimeout, clip_timeout
from rebalancer.kubeapi import (
    Backoff,
    describe_answer,
    exponential_backoff,
    is_transient,
    read_json,
    release_unread,
    status_body,
    status_message,
    with_retries,
)
from rebalancer.model import (
    NOT_ATTEMPTED,
    Decision,
    Mode,
    Outcome,
    OutcomeResult,
    Pdb,
    Pod,
    Snapshot,
)
from rebalancer.reclaim import WorkloadWriter
from rebalancer.selectors import label_selector_matches
from rebalancer.sources.kube_objects import pdb_from_json
from rebalancer.sources.object_fields import ObjectError

__all__ = [
    "PDB_EXHAUSTED",
    "REASON_ANNOTATION",
    "REQUESTED_BY_ANNOTATION",
    "REQUESTER",
    "KubeEvictor",
]

REQUESTED_BY_ANNOTATION = "rebalancer.gpu/requested-by"
REASON_ANNOTATION = "rebalancer.gpu/reason"
REQUESTER = "gpu-rebalancer"
PDB_EXHAUSTED = "PDB exhausted earlier this cycle"
# Annotation values may be large, but a reason is for humans: keep it to a readable size.
MAX_REASON_CHARS = 1024

_BUDGET_NAME = re.compile(r"^The disruption budget (?P<name>\S+) ")
_STOPPING: frozenset[OutcomeResult] = frozenset({"blocked-by-pdb", "error"})
# EvictionREST.Create's answer for a pod more than one PDB selects: a 500 it gives every time, before
# anything is written, so neither worth a retry nor an eviction that may have landed.
_MULTIPLE_PDBS = "This pod has more than one PodDisruptionBudget"
# The most the read-back of a pod whose eviction got no answer may take.
READ_BACK_SECONDS = 5.0


def _may_have_landed(exc: BaseException) -> bool:
    """A failed request the API server may have carried out all the same: no answer (a timeout, a
    dropped connection) or a 5xx (a gateway timeout, an apiserver that committed then failed)."""
    if not isinstance(exc, ApiException):
        return True
    status = exc.status or 0
    return status == 0 or status >= 500


# An eviction whose request got no answer, found done when the pod was read back.
_WENT_THROUGH = "the eviction request got no final answer but went through"

log = logging.getLogger(__name__)


class KubeEvictor(UnframedEvictor):
    """Evicts through the policy/v1 Eviction API, framed by `begin_cycle` (which resets its PDB memory)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        grace_period_seconds: int | None = None,
        server_dry_run: bool = False,
        retries: int = 3,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        request_timeout: RequestTimeout = (5.0, 30.0),
        requested_by: str = REQUESTER,
        fence: Fence = UNFENCED,
    ) -> None:
        if grace_period_seconds is not None and grace_period_seconds < 0:
            raise ValueError("grace_period_seconds must not be negative")
        if retries < 0:
            raise ValueError("retries must not be negative")
        self._core = client.CoreV1Api(api_client)
        self._policy = client.PolicyV1Api(api_client)
        self._grace = grace_period_seconds
        self._server_dry_run = server_dry_run
        self._retries = retries
        self._backoff = backoff or exponential_backoff()
        self._sleep = sleep
        self._timeout = request_timeout
        self._requested_by = requested_by
        self.fence = fence
        # Told of each pod as it is evicted, before the next is tried (the actuator saves its memory).
        self.on_evicted: Callable[[Decision, Outcome], None] | None = None
        self._known: dict[tuple[str, str], Pdb] = {}
        self._exhausted: dict[tuple[str, str], Pdb] = {}
        self.mode: Mode = "dry-run" if server_dry_run else "live"
        self._workloads = WorkloadWriter(
            api_client,
            server_dry_run=server_dry_run,
            retries=retries,
            backoff=self._backoff,
            sleep=sleep,
            request_timeout=request_timeout,
        )
        self._now: datetime | None = None

    def begin_cycle(self, snapshot: Snapshot, cycle_id: str = "") -> None:
        """Forget the PDBs exhausted last cycle; the snapshot's PDBs save a lookup after a 429."""
        self._exhausted.clear()
        self._known = {p.key: p for p in snapshot.pdbs}
        self._now = snapshot.now

    @property
    def exhausted_pdbs(self) -> tuple[tuple[str, str], ...]:
        """(namespace, name) of the PDBs that refused an eviction this cycle."""
        return tuple(self._exhausted)

    def evict(self, decision: Decision) -> tuple[Outcome, ...]:
        pods = approved_pods(decision)
        action = decision.proposal.action
        if action is not None and action.how != "evict":
            if self._now is None:
                raise RuntimeError("KubeEvictor.evict() of a workload action before begin_cycle()")
            self._workloads.fence = self.fence
            return self._workloads.apply(decision, self._now)
        blocked = next((p for p in pods if self._covered_by_exhausted_pdb(p)), None)
        if blocked is not None:
            stop = not_attempted(blocked, "blocked-by-pdb")
            return tuple(
                Outcome(p.namespace, p.name, "blocked-by-pdb", PDB_EXHAUSTED)
                if p is blocked
                else Outcome(p.namespace, p.name, "error", stop)
                for p in pods
            )
        reason = f"{decision.proposal.strategy}: {decision.proposal.reason}"[:MAX_REASON_CHARS]
        outcomes: list[Outcome] = []
        for index, pod in enumerate(pods):
            try:
                outcome = self._evict_pod(pod, reason)
            except FenceLost as lost:  # no write may start: neither this one nor the rest of the plan
                log.warning("evictions stopped before %s: %s", pod.ref, lost.reason)
                detail = f"{NOT_ATTEMPTED}{lost.reason}"
                outcomes.extend(Outcome(p.namespace, p.name, "error", detail) for p in pods[index:])
                break
            log.info("eviction %s %s %s", pod.ref, outcome.result, outcome.detail)
            outcomes.append(outcome)
            if outcome.result == "evicted" and self.on_evicted is not None:
                self.on_evicted(decision, outcome)
            if outcome.result in _STOPPING:
                stop = not_attempted(pod, outcome.result)
                outcomes.extend(Outcome(p.namespace, p.name, "error", stop) for p in pods[index + 1 :])
                break
        return tuple(outcomes)

    # ---- one pod

    def _body(self, pod: Pod, reason: str) -> client.V1Eviction:
        options = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=pod.uid),
            grace_period_seconds=self._grace,
            dry_run=["All"] if self._server_dry_run else None,
        )
        metadata = client.V1ObjectMeta(
            name=pod.name,
            namespace=pod.namespace,
            annotations={REQUESTED_BY_ANNOTATION: self._requested_by, REASON_ANNOTATION: reason},
        )
        return client.V1Eviction(
            api_version="policy/v1", kind="Eviction", metadata=metadata, delete_options=options
        )

    def _evict_pod(self, pod: Pod, reason: str) -> Outcome:
        def outcome(result: OutcomeResult, detail: str = "") -> Outcome:
            return Outcome(pod.namespace, pod.name, result, detail)

        if not pod.uid:
            return outcome("error", "pod has no uid: refusing to evict without a uid precondition")
        body = self._body(pod, reason)
        # Set once a request got no answer: the API server may have evicted the pod all the same.
        unanswered: list[BaseException] = []

        def attempt() -> Outcome:
            timeout = clip_timeout(self._timeout, self.fence.check())
            try:
                response = cast(
                    "urllib3.BaseHTTPResponse",
                    self._core.create_namespaced_pod_eviction(
                        pod.name,
                        pod.namespace,
                        body,
                        dry_run="All" if self._server_dry_run else None,
                        _preload_content=False,
                        _request_timeout=timeout,
                    ),
                )
            except ApiException as exc:
                final = self._final_answer(pod, exc)
                if final is None:
                    raise
                if unanswered and final.result == "gone" and not self._server_dry_run:
                    return outcome("evicted", f"{_WENT_THROUGH}: {final.detail}")
                return final
            release_unread(response)  # the answer was 2xx: it is in
            if self._server_dry_run:
                return outcome("would-evict", "server dry-run: the API server accepted the eviction")
            return outcome("evicted")

        def retrying(exc: BaseException) -> None:
            if _may_have_landed(exc):
                unanswered.append(exc)
            log.warning("eviction of %s failed (%s); retrying", pod.ref, describe_answer(exc))

        try:
            return with_retries(
                attempt, retries=self._retries, backoff=self._backoff, sleep=self._sleep, on_retry=retrying
            )
        except FenceLost as lost:
            if not unanswered:
                raise  # nothing was sent: not attempted
            if not self._server_dry_run and (gone := self._went_away(pod)) is not None:
                return outcome("evicted", f"{_WENT_THROUGH}: {gone}")
            # Not this pod's failure (this replica stopped itself), so it starts as a stop does.
            return outcome(
                "error",
                f"{NOT_ATTEMPTED}a retry ({lost.reason}) after {describe_answer(unanswered[-1])}; "
                "the eviction may still have happened",
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            problem = describe_answer(exc)
            if _may_have_landed(exc) and not self._server_dry_run:
                gone = self._went_away(pod)
                if gone is not None:
                    return outcome("evicted", f"{_WENT_THROUGH}: {gone}")
                if not isinstance(exc, ApiException):  # no answer at all: it may be on its way still
                    problem += "; the eviction may still have happened"
            return outcome("error", f"{problem} (after {self._retries + 1} attempts)")

    def _went_away(self, pod: Pod) -> str | None:
        """Why `pod` counts as evicted after requests that got no answer (gone, re-created, terminating),
        or None when it is still there as it was, or cannot be read. A read, so it is not fenced."""
        try:
            page = read_json(
                cast(
                    "urllib3.BaseHTTPResponse",
                    self._core.list_namespaced_pod(
                        pod.namespace,
                        field_selector=f"metadata.name={pod.name}",
                        _preload_content=False,
                        # Bounded: it runs after a fence or a deadline may have closed.
                        _request_timeout=clip_timeout(self._timeout, READ_BACK_SECONDS),
                    ),
                )
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            log.warning("cannot read %s back after its eviction got no answer: %s", pod.ref, exc)
            return None
        items = [i for i in page.get("items") or () if isinstance(i, dict)]
        meta = (items[0].get("metadata") or {}) if items else {}
        if not items:
            return "the pod no longer exists"
        if meta.get("uid") != pod.uid:
            return "the pod was replaced"
        if meta.get("deletionTimestamp"):
            return "the pod is terminating"
        return None

    def _final_answer(self, pod: Pod, exc: ApiException) -> Outcome | None:
        """The outcome an API answer settles, or None when it is worth another try (429 throttling, 5xx,
        no answer). A PDB's 429 is final: the budget will not change within the backoff."""
        status = exc.status or 0
        message = status_message(exc)
        if status == 429 and _is_budget_refusal(exc):
            self._remember_exhausted(pod, exc)
            return Outcome(pod.namespace, pod.name, "blocked-by-pdb", _budget_detail(exc) or message)
        if status == 404:
            return Outcome(pod.namespace, pod.name, "gone", f"pod no longer exists (404: {message})")
        if status == 409:
            return Outcome(pod.namespace, pod.name, "gone", f"pod was replaced or changed (409: {message})")
        # A pod under more than one PDB gets the same 500 every time, and nothing was written.
        if not is_transient(exc) or (status == 500 and message.startswith(_MULTIPLE_PDBS)):
            return Outcome(pod.namespace, pod.name, "error", f"HTTP {status}: {message}")
        return None

    # ---- PDB memory

    def _covered_by_exhausted_pdb(self, pod: Pod) -> bool:
        return any(
            ns == pod.namespace and label_selector_matches(pdb.selector, pod.labels)
            for (ns, _), pdb in self._exhausted.items()
        )

    def _remember_exhausted(self, pod: Pod, exc: ApiException) -> None:
        name = _budget_name(exc)
        if name is None:
            # No name in the answer: every known PDB of the namespace that covers the pod is suspect.
            for pdb in self._known.values():
                if pdb.namespace == pod.namespace and label_selector_matches(pdb.selector, pod.labels):
                    self._exhausted[pdb.key] = pdb
            return
        found = self._known.get((pod.namespace, name)) or self._read_pdb(pod.namespace, name)
        if found is not None:
            self._exhausted[found.key] = found

    def _read_pdb(self, namespace: str, name: str) -> Pdb | None:
        try:
            response = cast(
                "urllib3.BaseHTTPResponse",
                self._policy.read_namespaced_pod_disruption_budget(
                    name, namespace, _preload_content=False, _request_timeout=self._timeout
                ),
            )
            try:
                data = response.data
            finally:
                response.release_conn()
            pdb = pdb_from_json(json.loads(data))
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError, ObjectError) as exc:
            log.warning("cannot read PodDisruptionBudget %s/%s after a 429: %s", namespace, name, exc)
            return None
        self._known[pdb.key] = pdb
        return pdb


# --------------------------------------------------------------------------- reading Status answers


def _causes(exc: ApiException) -> list[Mapping[str, Any]]:
    details = status_body(exc).get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return [c for c in causes if isinstance(c, dict)] if isinstance(causes, list) else []


def _is_budget_refusal(exc: ApiException) -> bool:
    """A PDB's 429, as opposed to API priority-and-fairness throttling (which is worth a retry)."""
    if any(c.get("reason") == "DisruptionBudget" for c in _causes(exc)):
        return True
    return "disruption budget" in status_message(exc)


def _budget_detail(exc: ApiException) -> str:
    return "; ".join(
        str(c.get("message"))
        for c in _causes(exc)
        if c.get("reason") == "DisruptionBudget" and c.get("message")
    )


def _budget_name(exc: ApiException) -> str | None:
    for cause in _causes(exc):
        if cause.get("reason") == "DisruptionBudget":
            match = _BUDGET_NAME.match(str(cause.get("message", "")))
            if match:
                return match["name"]
    return None
