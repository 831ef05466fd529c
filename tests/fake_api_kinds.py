"""The resources the fake API server serves, for tests only: what each kind is, where its URLs are.

`Kind` is one resource as discovery would describe it (group, version, plural, kind, namespaced or not),
plus what the fake needs to serve it as kube-apiserver does: the fields a `fieldSelector` may name, whether
a CustomResourceDefinition serves it (no strategic merge patch, an update must name its resourceVersion,
list items keep their apiVersion and kind) and where the pod selector of its `scale` subresource lives.
`KINDS` is the table of every kind served, `BY_PATH` / `BY_KIND` look one up by URL or by
apiVersion and kind, `CORE_PATH` / `GROUP_PATH` parse a request path, `TIME` is metav1.Time as the API
server writes it, `default` is the API server's defaulting that the project relies on and
`set_generation` is the registry's `metadata.generation` of an updated object (each kind's
`generation` rule).

This module must stay a table: it holds no state, answers no request and builds no error (those are
tests/fake_api_errors.py's); a kind belongs here only when the project calls its API.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

JsonObj = dict[str, Any]

# What a write must change for the kind's registry strategy (its PrepareForUpdate) to move
# `metadata.generation` on by one (PrepareForCreate gives 1):
# - `spec`: the spec (StatefulSet, ReplicaSet, Job, CronJob, PodDisruptionBudget, Pod: the strategy.go of
#   each under pkg/registry);
# - `spec+annotations`: the spec or the annotations (Deployment: "annotation updates bump the generation
#   because annotations are copied from deployments to their replica sets");
# - `content`: anything but `metadata` (custom resources: apiextensions' customresource/strategy.go). Not
#   the status: every CRD the fake serves has the status subresource, and then the strategy puts the stored
#   status back before it compares (without the subresource, a status change would count too).
Generation = Literal["spec", "spec+annotations", "content"]

TIME = "%Y-%m-%dT%H:%M:%SZ"  # metav1.Time as the API server writes it


@dataclass(frozen=True, slots=True)
class Kind:
    group: str
    version: str
    resource: str
    kind: str
    namespaced: bool
    # Fields a fieldSelector may name beyond metadata.name / metadata.namespace, with their JSON paths.
    fields: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Served by a CustomResourceDefinition: no strategic merge patch, an update must name the
    # resourceVersion it replaces, and list items keep their apiVersion and kind.
    custom: bool = False
    # The `scale` subresource, when the kind has one: where its pod selector lives (a metav1.LabelSelector
    # for the built-in kinds, a string at the CRD's `labelSelectorPath` for custom ones). Replicas are
    # always `spec.replicas` and `status.replicas`.
    scale_selector: tuple[str, ...] | None = None
    # How the registry moves `metadata.generation` on (see `Generation`); None: the kind keeps none
    # (nodes, events, configmaps, leases).
    generation: Generation | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """`pods`, `poddisruptionbudgets.policy`: how the API server names the resource in messages."""
        return f"{self.resource}.{self.group}" if self.group else self.resource


_EVENT_FIELDS = {
    "involvedObject.kind": ("involvedObject", "kind"),
    "involvedObject.name": ("involvedObject", "name"),
    "involvedObject.namespace": ("involvedObject", "namespace"),
    "involvedObject.uid": ("involvedObject", "uid"),
    "reason": ("reason",),
    "type": ("type",),
}

KINDS: tuple[Kind, ...] = (
    Kind("", "v1", "nodes", "Node", False, {"spec.unschedulable": ("spec", "unschedulable")}),
    Kind(
        "",
        "v1",
        "pods",
        "Pod",
        True,
        generation="spec",
        fields={
            "spec.nodeName": ("spec", "nodeName"),
            "spec.schedulerName": ("spec", "schedulerName"),
            "spec.serviceAccountName": ("spec", "serviceAccountName"),
            "spec.restartPolicy": ("spec", "restartPolicy"),
            "status.phase": ("status", "phase"),
            "status.podIP": ("status", "podIP"),
            "status.nominatedNodeName": ("status", "nominatedNodeName"),
        },
    ),
    Kind("", "v1", "events", "Event", True, _EVENT_FIELDS),
    Kind("", "v1", "configmaps", "ConfigMap", True),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, generation="spec"),
    Kind(
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        True,
        {
            "regarding.kind": ("regarding", "kind"),
            "regarding.name": ("regarding", "name"),
            "reason": ("reason",),
        },
    ),
    Kind("coordination.k8s.io", "v1", "leases", "Lease", True),
    # Controllers: what re-creates pods, and what a reclaim scales, suspends or stops.
    Kind(
        "apps",
        "v1",
        "replicasets",
        "ReplicaSet",
        True,
        scale_selector=("spec", "selector"),
        generation="spec",
    ),
    Kind(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        True,
        scale_selector=("spec", "selector"),
        generation="spec+annotations",
    ),
    Kind(
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        True,
        scale_selector=("spec", "selector"),
        generation="spec",
    ),
    Kind("batch", "v1", "jobs", "Job", True, generation="spec"),
    Kind("batch", "v1", "cronjobs", "CronJob", True, generation="spec"),
    Kind("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", True, custom=True, generation="content"),
    Kind(
        "leaderworkerset.x-k8s.io",
        "v1",
        "leaderworkersets",
        "LeaderWorkerSet",
        True,
        custom=True,
        scale_selector=("status", "hpaPodSelector"),
        generation="content",
    ),
    Kind("kubeflow.org", "v1", "notebooks", "Notebook", True, custom=True, generation="content"),
    Kind(
        "serving.kserve.io",
        "v1beta1",
        "inferenceservices",
        "InferenceService",
        True,
        custom=True,
        generation="content",
    ),
)
BY_PATH = {(k.group, k.version, k.resource): k for k in KINDS}
BY_KIND = {(k.api_version, k.kind): k for k in KINDS}

CORE_PATH = re.compile(
    r"^/api/(?P<version>[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)
GROUP_PATH = re.compile(
    r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)


def default(kind: Kind, obj: JsonObj) -> None:
    """The API server's defaulting the project relies on: a kind with a `scale` subresource has
    `spec.replicas` 1 when none is given (apps/v1 SetDefaults, the LeaderWorkerSet CRD's schema default)."""
    if kind.scale_selector is not None:
        spec = obj.setdefault("spec", {})
        if isinstance(spec, dict) and spec.get("replicas") is None:
            spec["replicas"] = 1


def set_generation(old: JsonObj, new: JsonObj, *, status: bool = False) -> None:
    """`new`'s `metadata.generation`, as the API server sets it on an update of `old` (a stored object,
    its kind found by its apiVersion and kind) before validating admission sees the pair (the registry's
    Store.Update calls rest.BeforeUpdate, then admission): rest.BeforeUpdate puts the stored generation
    back ("Ensure requests cannot update generation"), then the kind's PrepareForUpdate moves it on by
    one when the write changed what the kind's `generation` names. A write to `scale` goes through the
    same strategy; one to `status` (`status=True`) never moves it. Compared as JSON, an absent `spec` or
    annotations as empty ones."""
    kind = BY_KIND[(str(old.get("apiVersion", "")), str(old.get("kind", "")))]
    meta = new.setdefault("metadata", {})
    stored = (old.get("metadata") or {}).get("generation")
    if stored is None:
        meta.pop("generation", None)
    else:
        meta["generation"] = stored
    if status or kind.generation is None:
        return
    if kind.generation == "content":
        moved = _content(old) != _content(new)
    else:
        moved = (old.get("spec") or {}) != (new.get("spec") or {})
        if kind.generation == "spec+annotations":
            moved = moved or _annotations(old) != _annotations(new)
    if moved:
        meta["generation"] = int(stored or 0) + 1


def _content(obj: JsonObj) -> JsonObj:
    """A custom resource as customResourceStrategy compares it: not its metadata, not the status the
    status subresource keeps, not the type (the same on both sides in the API server)."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _annotations(obj: JsonObj) -> Any:
    return (obj.get("metadata") or {}).get("annotations") or {}
