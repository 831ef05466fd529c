"""Workloads: which object a person manages behind each GPU pod, and how a reclaim frees its GPUs.

Owns the table of controller kinds the product knows (`KINDS`: API group, version, resource, and how
a reclaim frees the GPUs: scale to zero, suspend, stop), the annotations that carry a reclaim's state
on the workload, and `resolve()`: walking each pod's controller ownerReferences up the controllers the
snapshot holds to the workload a person manages:

- ReplicaSet -> Deployment -> KServe InferenceService (raw-deployment mode);
- StatefulSet -> LeaderWorkerSet or Kubeflow Notebook; a LeaderWorkerSet's worker StatefulSet is owned
  by its leader pod, which is followed to the leader's StatefulSet;
- Job -> JobSet. A Job of a CronJob stays the workload: each run holds the GPUs, suspending it frees
  them, and the CronJob's next run is a workload of its own (`Resolved.parent` names the CronJob);
- any other controller kind is the workload itself, and no reclaim knows how to free it.

`walks_to()` is one step of that walk: what a source must read next to let `resolve()` go on.

A controller the snapshot lacks (not listed, kind not installed, no permission) ends the walk there,
with `Resolved.controller` None: such a workload is reported, never acted on, since its state cannot be
read.

This module must stay pure: no I/O, no clock. It decides nothing: strategies judge, the planner guards,
the actuator writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import msgspec

from rebalancer import rfc3339
from rebalancer.cycle_report import WorkloadNotice
from rebalancer.history import Workload
from rebalancer.model import Controller, OutcomeResult, OwnerRef, Pod, ReclaimHow, Snapshot, WorkloadAction

__all__ = [
    "ANNOTATION_PREFIX",
    "IDLE_SINCE",
    "KINDS",
    "KUBEFLOW_STOPPED",
    "RECLAIMED_AT",
    "RECLAIMED_BY",
    "RECLAIM_RBAC_TEMPLATE",
    "RECLAIM_REASON",
    "RESULTS",
    "SCALED_DOWN_FROM",
    "SNOOZE_UNTIL",
    "Kind",
    "Resolved",
    "notice",
    "resolve",
    "result_of",
    "snooze_command",
    "walks_to",
]

# How long the snooze the owner's message offers lasts.
SNOOZE_OFFERED = timedelta(days=7)
_DONE_WORDS: Mapping[str, str] = {
    "scale": "scaled to 0 replicas",
    "suspend": "suspended",
    "stop": "stopped",
    "evict": "evicted",
}

ANNOTATION_PREFIX = "rebalancer.gpu/"
# When the workload was first found idle and its owner told (RFC 3339); the grace period runs from it.
IDLE_SINCE = ANNOTATION_PREFIX + "idle-since"
# Set by the owner (RFC 3339): no reclaim before then.
SNOOZE_UNTIL = ANNOTATION_PREFIX + "snooze-until"
# What a reclaim did, so that `rebalancer restore` (or kubectl) can undo it.
SCALED_DOWN_FROM = ANNOTATION_PREFIX + "scaled-down-from"
RECLAIMED_AT = ANNOTATION_PREFIX + "reclaimed-at"
RECLAIMED_BY = ANNOTATION_PREFIX + "reclaimed-by"
RECLAIM_REASON = ANNOTATION_PREFIX + "reclaim-reason"
# The Role (and its RoleBinding) a namespace applies so the rebalancer may tell and reclaim there.
RECLAIM_RBAC_TEMPLATE = "deploy/reclaim-rbac.example.yaml"
# Kubeflow's own: the Notebook controller scales the notebook's StatefulSet to 0 while it is set.
KUBEFLOW_STOPPED = "kubeflow-resource-stopped"


# The outcome of a workload action (dry run, done), per verb and per way of reclaiming.
RESULTS: Mapping[str, tuple[OutcomeResult, OutcomeResult]] = {
    "notify": ("would-notify", "notified"),
    "clear": ("would-clear", "cleared"),
    "scale": ("would-scale", "scaled"),
    "suspend": ("would-suspend", "suspended"),
    "stop": ("would-stop", "stopped"),
    "evict": ("would-evict", "evicted"),
}


def result_of(action: WorkloadAction, *, dry_run: bool) -> OutcomeResult:
    """The outcome an action has when it is done (or would be, in a dry run)."""
    key = action.how if action.verb == "reclaim" and action.how is not None else action.verb
    would, done = RESULTS[key]
    return would if dry_run else done


@dataclass(frozen=True, slots=True)
class Kind:
    """A controller kind: where the API serves it, and how a reclaim frees its GPUs (None: it cannot)."""

    kind: str
    group: str
    version: str
    resource: str
    reclaim: ReclaimHow | None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS: Mapping[str, Kind] = {
    k.kind: k
    for k in (
        Kind("ReplicaSet", "apps", "v1", "replicasets", "scale"),
        Kind("Deployment", "apps", "v1", "deployments", "scale"),
        Kind("StatefulSet", "apps", "v1", "statefulsets", "scale"),
        Kind("Job", "batch", "v1", "jobs", "suspend"),
        Kind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets", "suspend"),
        Kind("LeaderWorkerSet", "leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "scale"),
        Kind("Notebook", "kubeflow.org", "v1", "notebooks", "stop"),
        Kind("InferenceService", "serving.kserve.io", "v1beta1", "inferenceservices", None),
    )
}

# Owner kinds a walk continues into from each kind; any other owner ends it (CronJob: see above).
_WALKS_INTO: Mapping[str, frozenset[str]] = {
    "ReplicaSet": frozenset({"Deployment"}),
    "Deployment": frozenset({"InferenceService"}),
    "StatefulSet": frozenset({"LeaderWorkerSet", "Notebook", "Pod"}),
    "Job": frozenset({"JobSet"}),
}


# A frozen msgspec Struct, one per pod of every cycle: built in C
# (`rebalancer.model.cluster` says why).
class Resolved(msgspec.Struct, frozen=True):
    """A pod's workload: its key (a bare pod is its own), the controller object when the snapshot has
    it, and the kind of a parent the walk stopped below on purpose (a Job's CronJob)."""

    key: Workload
    controller: Controller | None
    parent: OwnerRef | None = None

    @property
    def kind(self) -> Kind | None:
        return KINDS.get(self.key.kind)

    @property
    def ref(self) -> str:
        """`namespace/Kind/name`, as `rebalancer restore` takes it."""
        return f"{self.key.namespace}/{self.key.kind}/{self.key.name}"

    @property
    def bare(self) -> bool:
        return self.key.kind == "Pod"

    @property
    def reclaim(self) -> ReclaimHow | None:
        """How a reclaim frees it: evict a bare pod, else its kind's way; None when it cannot."""
        if self.bare:
            return "evict"
        kind = self.kind
        return kind.reclaim if kind is not None and self.controller is not None else None


def resolve(snapshot: Snapshot) -> Mapping[tuple[str, str], Resolved]:
    """Every pod's workload, by pod key."""
    pods = snapshot.pods_by_key
    return {pod.key: _resolve(pod, snapshot.controllers, pods) for pod in snapshot.pods}


def walks_to(controller: Controller, pods: Mapping[tuple[str, str], Pod]) -> Workload | None:
    """The controller `resolve()` walks on to from `controller` (what a source must read next), or None
    where the walk ends at it."""
    return _step(controller, pods)[0]


def _step(found: Controller, pods: Mapping[tuple[str, str], Pod]) -> tuple[Workload | None, OwnerRef | None]:
    """(the next controller up, None) or, where the walk ends, (None, the owner it stopped below)."""
    up = found.owner
    if up is None or up.kind not in _WALKS_INTO.get(found.kind, frozenset()):
        return None, up
    if up.kind == "Pod":
        # A LeaderWorkerSet's worker StatefulSet is owned by the leader pod: go on from its owner.
        leader = pods.get((found.namespace, up.name))
        if leader is None or leader.owner is None:
            return None, up
        up = leader.owner
    return Workload(found.namespace, up.kind, up.name), None


def _resolve(
    pod: Pod,
    controllers: Mapping[tuple[str, str, str], Controller],
    pods: Mapping[tuple[str, str], Pod],
) -> Resolved:
    if pod.owner is None:
        return Resolved(Workload(pod.namespace, "Pod", pod.name), None)
    key = Workload(pod.namespace, pod.owner.kind, pod.owner.name)
    seen = {key}
    while True:
        found = controllers.get(key)
        if found is None:
            return Resolved(key, None)
        nxt, parent = _step(found, pods)
        if nxt is None:
            return Resolved(key, found, parent)
        if nxt in seen:  # an ownership loop: stop where it closes
            return Resolved(key, found)
        seen.add(nxt)
        key = nxt


def kubectl_resource(kind: Kind) -> str:
    """How kubectl names the kind's resource: `statefulset`, `notebooks.kubeflow.org`."""
    if kind.group in ("", "apps", "batch"):
        return kind.resource.removesuffix("s")
    return f"{kind.resource}.{kind.group}"


def snooze_command(workload: tuple[str, str, str], until: datetime) -> str | None:
    """The `kubectl annotate` that holds the workload's reclaim until `until`; None for unknown kinds."""
    namespace, kind_name, name = workload
    kind = KINDS.get(kind_name)
    if kind is None:
        return None
    stamp = rfc3339.format_utc(until)
    return (
        f"kubectl annotate {kubectl_resource(kind)} {name} -n {namespace} {SNOOZE_UNTIL}={stamp} --overwrite"
    )


def notice(action: WorkloadAction, result: OutcomeResult, now: datetime, uid: str = "") -> WorkloadNotice:
    """The owner's message about one workload action, in words and with the command to snooze."""
    namespace, kind, name = action.workload
    ref = f"{namespace}/{kind}/{name}"
    gpus = f"{action.gpus:g} GPU" + ("" if action.gpus == 1 else "s")
    cost = f", ${action.cost_per_hour:,.2f}/h" if action.cost_per_hour is not None else ""
    since = f"idle since {rfc3339.format_utc(action.idle_since)}" if action.idle_since else "idle"
    dry = result.startswith("would-")
    snooze = snooze_command(action.workload, now + SNOOZE_OFFERED)
    if action.verb == "notify":
        text = f"{ref} holds {gpus} {since}{cost}."
        if action.grace_until is not None:
            then = _DONE_WORDS.get(action.how or "", "reclaimed")
            due = rfc3339.format_utc(action.grace_until)
            text += f" It will be {then} after {due} unless it is busy again or snoozed."
    elif action.verb == "reclaim":
        done = _DONE_WORDS.get(action.how or "", "reclaimed")
        text = f"{ref} {'would be' if dry else 'was'} {done}: {gpus} {since}{cost}."
        if action.how != "evict":
            text += f" Undo: rebalancer restore {ref}"
        snooze = None  # done: the undo is what the owner needs now
    else:
        text = f"{ref} is busy again: its idle mark {'would be' if dry else 'was'} lifted."
        snooze = None
    return WorkloadNotice(
        workload=action.workload,
        verb=action.verb,
        result=result,
        message=text,
        snooze_command=snooze,
        uid=uid,
        gpus=action.gpus,
        cost_per_hour=action.cost_per_hour,
        idle_since=action.idle_since,
        grace_until=action.grace_until,
    )
