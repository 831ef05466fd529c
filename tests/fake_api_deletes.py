"""Deletes and evictions on the fake API server, for tests only, carried out as kube-apiserver does.

`Deletes` is the part of `FakeApiServer` that removes objects. `_delete` checks the uid and
resourceVersion preconditions, then removes the object; a pod's delete is graceful (`_delete_pod`): a pod
on a node that has not ended is marked terminating for its grace period, and the kubelet stand-in
confirms it gone at once or on `finish_terminating()`. `_evict` is `POST .../pods/{name}/eviction` in
the order of EvictionREST.Create: terminal, Pending and terminating pods skip the budgets; more than one
budget is a 500; a not-ready pod a budget can spare goes without spending it; a budget behind its spec
or with no disruption left refuses with a 429; otherwise the budget is spent, then the pod gets its
DisruptionTarget condition and is deleted, gracefully.

This module must not stand in for a controller: a budget's `disruptionsAllowed` only goes down by the
evictions it allows (no disruption controller recomputes it), and nothing re-creates an evicted pod.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from tests.fake_api_core import FakeApiCore
from tests.fake_api_errors import ApiError, conflict_error
from tests.fake_api_kinds import BY_KIND, BY_PATH, TIME, JsonObj, Kind
from tests.fake_api_selectors import selector_matches

EVICTION_REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE_PDBS = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
)


class Deletes(FakeApiCore):
    """Any object's delete, a pod's graceful one and the eviction subresource."""

    def _delete(
        self, kind: Kind, ns: str | None, name: str, *, body: Any, dry_run: bool
    ) -> tuple[int, JsonObj]:
        current = self._existing(kind, ns, name)
        options = body if isinstance(body, dict) else {}
        self._check_preconditions(kind, name, current, options)
        if dry_run or "All" in (options.get("dryRun") or ()):
            return 200, self._with_type(kind, current)
        if kind.kind == "Pod":
            return 200, self._with_type(kind, self._delete_pod(kind, ns, name, options))
        del self._store(kind)[self._key(kind, ns, name)]
        self._emit(kind, "DELETED", current)
        return 200, self._with_type(kind, current)

    def _delete_pod(self, pods: Kind, ns: str | None, name: str, options: Mapping[str, Any]) -> JsonObj:
        """A pod's delete, graceful as podStrategy.CheckGracefulDelete and rest.BeforeDelete make it: the
        grace period asked, else the pod's `terminationGracePeriodSeconds` (30 when unset, the API
        server's default), 0 for a pod on no node or one that has ended (a negative one is 1). A pod
        already terminating may only have its grace period shortened. A graceful delete marks the pod
        (`deletionTimestamp` = now + the period, `deletionGracePeriodSeconds`); the kubelet stand-in ends
        it. The pod as the answer shows it."""
        key = self._key(pods, ns, name)
        current = self._store(pods)[key]
        meta, spec = current["metadata"], current.get("spec") or {}
        asked = options.get("gracePeriodSeconds")
        if meta.get("deletionTimestamp"):
            pending = meta.get("deletionGracePeriodSeconds")
            if pending and (asked is None or asked >= pending):
                return current  # graceful deletion pending: nothing changes
            period = max(0, cast(int, asked)) if pending else 0  # pending: a shorter period was asked
            if period:  # shortened: the deadline moves as much earlier as the period
                deadline = datetime.strptime(meta["deletionTimestamp"], TIME).replace(tzinfo=UTC) - timedelta(
                    seconds=pending - period
                )
                return self._mark_terminating(pods, key, deadline, period)
        else:
            period = asked if asked is not None else spec.get("terminationGracePeriodSeconds", 30)
            phase = (current.get("status") or {}).get("phase")
            if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
                period = 0
            period = 1 if period < 0 else period
            if period:
                return self._mark_terminating(pods, key, self._clock() + timedelta(seconds=period), period)
        self._emit(pods, "DELETED", self._store(pods).pop(key))
        return current

    def _mark_terminating(self, pods: Kind, key: tuple[str, str], deadline: datetime, period: int) -> JsonObj:
        before = self._store(pods)[key]
        marked = copy.deepcopy(before)
        marked["metadata"]["deletionTimestamp"] = deadline.strftime(TIME)
        marked["metadata"]["deletionGracePeriodSeconds"] = period
        marked["metadata"]["resourceVersion"] = self._next_rv()
        self._store(pods)[key] = marked
        self._emit(pods, "MODIFIED", marked, before)
        if self._kubelet == "prompt":
            self._emit(pods, "DELETED", self._store(pods).pop(key))
        return marked

    @staticmethod
    def _check_preconditions(kind: Kind, name: str, current: JsonObj, options: Mapping[str, Any]) -> None:
        preconditions = options.get("preconditions") or {}
        uid, rv = preconditions.get("uid"), preconditions.get("resourceVersion")
        meta = current["metadata"]
        if uid is not None and uid != meta.get("uid"):
            raise conflict_error(
                kind,
                name,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta.get('uid')}",
            )
        if rv is not None and rv != meta.get("resourceVersion"):
            raise conflict_error(
                kind,
                name,
                f"Precondition failed: ResourceVersion in precondition: {rv}, "
                f"ResourceVersion in object meta: {meta.get('resourceVersion')}",
            )

    def _evict(self, pods: Kind, ns: str, name: str, body: Any, dry_run: bool) -> tuple[int, JsonObj]:
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        if (body.get("metadata") or {}).get("name") != name:
            raise ApiError(400, "name in URL does not match name in Eviction object")
        options = body.get("deleteOptions") or {}
        option_dry_run = "All" in (options.get("dryRun") or ())
        if dry_run and options.get("dryRun") not in (None, [], ["All"]):
            raise ApiError(400, "Invalid dryRun options: query and deleteOptions differ")
        dry_run = dry_run or option_dry_run
        pod = self._existing(pods, ns, name)
        success: JsonObj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }

        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
            # canIgnorePDB: deleted without a look at the budgets. (The API server retries a conflicting
            # delete for about 10 s before its 409; this answers at once.)
            self._check_preconditions(pods, name, pod, options)
            return 201, success if dry_run else self._evicted(pods, ns, name, options, success)
        labels = pod["metadata"].get("labels") or {}
        pdb_kind = BY_PATH[("policy", "v1", "poddisruptionbudgets")]
        matching = [
            pdb
            for (pdb_ns, _), pdb in sorted(self._store(pdb_kind).items())
            if pdb_ns == ns and selector_matches((pdb.get("spec") or {}).get("selector"), labels)
        ]
        if len(matching) > 1:
            raise ApiError(500, MULTIPLE_PDBS)
        budget = self._pdb_verdict(matching[0], pod) if matching else None
        if budget is not None and not dry_run:  # checkAndDecrement, before the delete's preconditions
            before = copy.deepcopy(budget)
            status = budget.setdefault("status", {})
            status["disruptionsAllowed"] = int(status.get("disruptionsAllowed") or 0) - 1
            status.setdefault("disruptedPods", {})[name] = self._clock().strftime(TIME)
            budget["metadata"]["resourceVersion"] = self._next_rv()
            self._emit(BY_KIND[(budget["apiVersion"], budget["kind"])], "MODIFIED", budget, before)
        try:
            self._check_preconditions(pods, name, pod, options)
        except ApiError as conflict:
            # A not-ready pod the budget spared is deleted under a resourceVersion precondition.
            spared = bool(matching) and budget is None
            if spared and (options.get("preconditions") or {}).get("resourceVersion") is None:
                raise _still_processing(matching[0]["metadata"]["name"]) from conflict
            raise
        return 201, success if dry_run else self._evicted(pods, ns, name, options, success)

    def _evicted(
        self, pods: Kind, ns: str, name: str, options: Mapping[str, Any], success: JsonObj
    ) -> JsonObj:
        """addConditionAndDeletePod: the pod gets the DisruptionTarget condition (written only when it
        changes, as an update that changes nothing writes nothing), then the delete; the Status."""
        key = self._key(pods, ns, name)
        before = self._store(pods)[key]
        marked = copy.deepcopy(before)
        conditions = marked.setdefault("status", {}).setdefault("conditions", [])
        wanted = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
        }
        found = next((c for c in conditions if c.get("type") == "DisruptionTarget"), None)
        if found is None or any(found.get(k) != v for k, v in wanted.items()):
            # podutil.UpdatePodCondition: the transition time moves only when the status does.
            moved = found is None or found.get("status") != "True"
            at = self._clock().strftime(TIME) if moved or found is None else found.get("lastTransitionTime")
            if found is not None:
                conditions.remove(found)
            conditions.append({**wanted, "lastTransitionTime": at})
            marked["metadata"]["resourceVersion"] = self._next_rv()
            self._store(pods)[key] = marked
            self._emit(pods, "MODIFIED", marked, before)
        self._delete_pod(pods, ns, name, options)
        return success

    @staticmethod
    def _pdb_verdict(pdb: JsonObj, pod: JsonObj) -> JsonObj | None:
        """The PDB to decrement, None when the pod may go without spending it, or a 429."""
        status = pdb.get("status") or {}
        name = pdb["metadata"]["name"]
        generation = pdb["metadata"].get("generation")
        observed = status.get("observedGeneration")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or ()
        )
        current, desired = int(status.get("currentHealthy") or 0), int(status.get("desiredHealthy") or 0)
        if not ready:  # before checkAndDecrement's look at the generation, as the API server does
            policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy")
            if policy == "AlwaysAllow" or (current >= desired > 0):
                return None
        if generation is not None and observed is not None and observed < generation:
            raise _still_processing(name)
        allowed = int(status.get("disruptionsAllowed") or 0)
        if allowed < 0:
            raise ApiError(
                403, f'poddisruptionbudgets.policy "{name}" is forbidden: pdb disruptions allowed is negative'
            )
        if allowed == 0:
            raise ApiError(
                429,
                EVICTION_REFUSED,
                causes=[
                    {
                        "reason": "DisruptionBudget",
                        "message": f"The disruption budget {name} needs {desired} healthy pods "
                        f"and has {current} currently",
                    }
                ],
            )
        return pdb


def _still_processing(pdb: str) -> ApiError:
    """createTooManyRequestsError: the budget's status is behind its spec, or the delete of a not-ready
    pod it spared conflicted; a 429 to retry in 10 s."""
    return ApiError(
        429,
        EVICTION_REFUSED,
        causes=[
            {
                "reason": "DisruptionBudget",
                "message": f"The disruption budget {pdb} is still being processed by the server.",
            }
        ],
        retry_after=10,
    )
