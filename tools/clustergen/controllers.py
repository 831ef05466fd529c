"""Controllers: the objects behind a workload's pods, as the API server returns them.

Owns the Deployment and the ReplicaSet of its current template, the StatefulSet, and the Job (indexed or
not) that a `Workload` row stands for, with the names and uids its pods' ownerReferences and labels
already carry (`pods.pods_of`, `pods.pod_json`), a pod template made of the row's pieces, the row's
`controller_annotations`, and a status of all replicas ready. A DaemonSet is not written: the
rebalancer does not read that kind (its pods are never moved).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from tools.clustergen.common import Ids, Json, ts
from tools.clustergen.pods import GPU_TOLERATION
from tools.clustergen.workloads import Workload

# Kinds of Workload rows whose controller objects `controllers_of` writes.
WRITTEN_KINDS = ("Deployment", "StatefulSet", "Job", "IndexedJob")


def _template(w: Workload, labels: dict[str, str], restart_policy: str) -> Json:
    """The pod template the controller stamps pods from: what the row sets, before admission adds the
    service account token, default tolerations and the priority value."""
    requests = {"cpu": w.cpu, "memory": w.memory} | ({w.gpu_resource: str(w.gpus)} if w.gpus else {})
    limits = requests if w.guaranteed else {"memory": w.memory}
    container: Json = {
        "image": w.image,
        "imagePullPolicy": "IfNotPresent",
        "name": w.container,
        "resources": {"limits": limits, "requests": requests},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }
    if w.volumes:
        container["volumeMounts"] = [
            {"mountPath": path, "name": volume["name"]} for volume, path in w.volumes
        ]
    spec: Json = {
        "containers": [container],
        "dnsPolicy": "ClusterFirst",
        "restartPolicy": restart_policy,
        "schedulerName": w.scheduler,
        "securityContext": {},
        "terminationGracePeriodSeconds": 30,
    }
    optional = {
        "affinity": w.affinity,
        "nodeSelector": w.node_selector,
        "priorityClassName": w.priority_class[0],
        "topologySpreadConstraints": list(w.spread),
        "tolerations": [GPU_TOLERATION] if w.gpus else [],
        "volumes": [volume for volume, _ in w.volumes],
    }
    spec |= {key: value for key, value in optional.items() if value}
    return {"metadata": {"labels": labels}, "spec": spec}


def _metadata(
    w: Workload, kind: str, name: str, ids: Ids, *, created: datetime, labels: dict[str, str]
) -> Json:
    return {
        "creationTimestamp": ts(created),
        "generation": 1,
        "labels": labels,
        "name": name,
        "namespace": w.namespace,
        "resourceVersion": str(
            850_000_000 + ids.rng("controller", w.namespace, kind, name).randrange(10_000_000)
        ),
        "uid": ids.uid("owner", w.namespace, kind, name),
    }


def _owned_by(w: Workload, kind: str, name: str, ids: Ids) -> list[Json]:
    return [
        {
            "apiVersion": "apps/v1",
            "blockOwnerDeletion": True,
            "controller": True,
            "kind": kind,
            "name": name,
            "uid": ids.uid("owner", w.namespace, kind, name),
        }
    ]


def _available(created: datetime, kind: str) -> list[Json]:
    moment = ts(created + timedelta(minutes=2))
    reason = {"Available": "MinimumReplicasAvailable", "Progressing": "NewReplicaSetAvailable"}
    return [
        {
            "lastTransitionTime": moment,
            "lastUpdateTime": moment,
            "message": f"{kind} has minimum availability."
            if condition == "Available"
            else f"{kind} has successfully progressed.",
            "reason": reason[condition],
            "status": "True",
            "type": condition,
        }
        for condition in ("Available", "Progressing")
    ]


def controllers_of(w: Workload, ids: Ids, now: datetime) -> list[Json]:
    """The controller objects behind `w`'s pods (none for a DaemonSet), created a minute before its
    pods, every replica running and ready."""
    if w.kind not in WRITTEN_KINDS:
        return []
    created = now - w.age - timedelta(minutes=1)
    replicas = len(w.nodes)
    labels = {"app.kubernetes.io/name": w.name} | w.labels
    selector = {"app.kubernetes.io/name": w.name}
    annotations = dict(w.controller_annotations)
    out: list[Json] = []
    if w.kind == "Deployment":
        template = ids.suffix(10, w.namespace, w.name, "rs")
        revision = {"deployment.kubernetes.io/revision": "1"}
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _metadata(w, "Deployment", w.name, ids, created=created, labels=dict(labels))
            | {"annotations": revision | annotations},
            "spec": {
                "progressDeadlineSeconds": 600,
                "replicas": replicas,
                "revisionHistoryLimit": 10,
                "selector": {"matchLabels": selector},
                "strategy": {
                    "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
                    "type": "RollingUpdate",
                },
                "template": _template(w, dict(labels), "Always"),
            },
            "status": {
                "availableReplicas": replicas,
                "conditions": _available(created, "Deployment"),
                "observedGeneration": 1,
                "readyReplicas": replicas,
                "replicas": replicas,
                "updatedReplicas": replicas,
            },
        }
        name = f"{w.name}-{template}"
        hashed = dict(labels) | {"pod-template-hash": template}
        replica_set = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": _metadata(w, "ReplicaSet", name, ids, created=created, labels=hashed)
            | {
                "annotations": {
                    "deployment.kubernetes.io/desired-replicas": str(replicas),
                    "deployment.kubernetes.io/max-replicas": str(replicas + (replicas + 3) // 4),
                }
                | revision,
                "ownerReferences": _owned_by(w, "Deployment", w.name, ids),
            },
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": selector | {"pod-template-hash": template}},
                "template": _template(w, hashed, "Always"),
            },
            "status": {
                "availableReplicas": replicas,
                "fullyLabeledReplicas": replicas,
                "observedGeneration": 1,
                "readyReplicas": replicas,
                "replicas": replicas,
            },
        }
        out += [deployment, replica_set]
    elif w.kind == "StatefulSet":
        current = f"{w.name}-{ids.suffix(10, w.namespace, w.name, 'rev')}"
        meta = _metadata(w, "StatefulSet", w.name, ids, created=created, labels=dict(labels))
        if annotations:
            meta["annotations"] = annotations
        out.append(
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": meta,
                "spec": {
                    "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
                    "podManagementPolicy": "OrderedReady",
                    "replicas": replicas,
                    "revisionHistoryLimit": 10,
                    "selector": {"matchLabels": selector},
                    "serviceName": w.name,
                    "template": _template(w, dict(labels), "Always"),
                    "updateStrategy": {"rollingUpdate": {"partition": 0}, "type": "RollingUpdate"},
                },
                "status": {
                    "availableReplicas": replicas,
                    "collisionCount": 0,
                    "currentReplicas": replicas,
                    "currentRevision": current,
                    "observedGeneration": 1,
                    "readyReplicas": replicas,
                    "replicas": replicas,
                    "updateRevision": current,
                    "updatedReplicas": replicas,
                },
            }
        )
    else:  # Job, IndexedJob
        controller = ids.uid("owner", w.namespace, "Job", w.name)
        job_labels = {
            "batch.kubernetes.io/controller-uid": controller,
            "batch.kubernetes.io/job-name": w.name,
            "controller-uid": controller,
            "job-name": w.name,
        }
        meta = _metadata(w, "Job", w.name, ids, created=created, labels=dict(labels) | job_labels)
        if annotations:
            meta["annotations"] = annotations
        spec: Json = {
            "backoffLimit": 6,
            "completionMode": "Indexed" if w.kind == "IndexedJob" else "NonIndexed",
            "completions": replicas,
            "manualSelector": False,
            "parallelism": replicas,
            "podReplacementPolicy": "TerminatingOrFailed",
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": controller}},
            "suspend": False,
            "template": _template(w, dict(labels) | job_labels, "Never"),
        }
        out.append(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": meta,
                "spec": spec,
                "status": {
                    "active": replicas,
                    "ready": replicas,
                    "startTime": ts(created + timedelta(seconds=1)),
                    "terminating": 0,
                    "uncountedTerminatedPods": {},
                },
            }
        )
    return out


def all_controllers(workloads: Iterable[Workload], ids: Ids, now: datetime) -> list[Json]:
    """Every workload's controller objects, in `kubectl get -A` order (namespace, kind, name)."""
    objects = [obj for w in workloads for obj in controllers_of(w, ids, now)]
    return sorted(objects, key=lambda o: (o["metadata"]["namespace"], o["kind"], o["metadata"]["name"]))
