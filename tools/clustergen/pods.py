"""Pods and PodDisruptionBudgets: what controllers create from a workload, as the API server returns it.

Owns pod naming and labelling as each controller does it (ReplicaSet, Job, indexed Job, StatefulSet,
DaemonSet), pod addresses, the Pod and PodDisruptionBudget objects, and `check`, which refuses a
picture no real cluster could be in (a name twice, a node overcommitted).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from tools.clustergen.common import GIB, Ids, Json, ts
from tools.clustergen.nodes import NodeSpec
from tools.clustergen.workloads import Workload, pin_to

NOT_READY_TOLERATIONS: list[Json] = [
    {"effect": "NoExecute", "key": key, "operator": "Exists", "tolerationSeconds": 300}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
]
GPU_TOLERATION: Json = {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
NAME_ATTEMPTS = 20  # a controller retries a generated name that is taken; give up after this many


@dataclass(frozen=True)
class PodSpec:
    """One pod of a workload: its name, node, owner and labels as its controller would set them."""

    workload: Workload
    name: str
    node: NodeSpec
    owner: tuple[str, str, str]  # apiVersion, kind, name
    labels: dict[str, str]
    annotations: dict[str, str]
    age: timedelta
    restart_policy: str = "Always"


def _take(taken: set[tuple[str, str]], namespace: str, name: str) -> bool:
    if (namespace, name) in taken:
        return False
    taken.add((namespace, name))
    return True


def _generated_name(taken: set[tuple[str, str]], ids: Ids, w: Workload, stem: str, key: object) -> str:
    """`stem-xxxxx`, the suffix drawn for (`w`, `key`): drawn again while the name is taken, as the
    controller retries (an API server refuses a name that exists)."""
    for attempt in range(NAME_ATTEMPTS):
        again = () if attempt == 0 else ("retry", attempt)
        name = f"{stem}-{ids.suffix(5, w.namespace, w.name, key, *again)}"
        if _take(taken, w.namespace, name):
            return name
    raise ValueError(f"{w.namespace}/{w.name}: no free pod name after {NAME_ATTEMPTS} attempts")


def pods_of(
    w: Workload, nodes: Mapping[str, NodeSpec], ids: Ids, taken: set[tuple[str, str]] | None = None
) -> list[PodSpec]:
    """The pods a controller creates, named and labelled as Kubernetes does.

    `taken` holds the (namespace, name) of pods made so far (shared between calls, it keeps names unique
    across workloads): a generated name that is taken is drawn again, as the controller's retry would.
    """
    taken = set() if taken is None else taken
    ns = w.namespace
    base_labels = {"app.kubernetes.io/name": w.name} | w.labels
    template = ids.suffix(10, ns, w.name, "rs") if w.kind == "Deployment" else ""
    revision = ids.suffix(10, ns, w.name, "rev") if w.kind in ("StatefulSet", "DaemonSet") else ""
    controller = ids.uid("owner", ns, "Job", w.name) if w.kind in ("Job", "IndexedJob") else ""
    out: list[PodSpec] = []
    for index, node_name in enumerate(w.nodes):
        node = nodes[node_name]
        labels, annotations = dict(base_labels), dict(w.annotations)
        age, restart = w.age, "Always"
        if w.kind == "Deployment":
            labels["pod-template-hash"] = template
            owner = ("apps/v1", "ReplicaSet", f"{w.name}-{template}")
            name = _generated_name(taken, ids, w, f"{w.name}-{template}", index)
        elif w.kind in ("Job", "IndexedJob"):
            labels |= {
                "batch.kubernetes.io/controller-uid": controller,
                "batch.kubernetes.io/job-name": w.name,
                "controller-uid": controller,
                "job-name": w.name,
            }
            stem = w.name
            if w.kind == "IndexedJob":
                labels["batch.kubernetes.io/job-completion-index"] = str(index)
                annotations["batch.kubernetes.io/job-completion-index"] = str(index)
                stem = f"{w.name}-{index}"
            owner = ("batch/v1", "Job", w.name)
            name = _generated_name(taken, ids, w, stem, index)
            restart = "Never"
        elif w.kind == "StatefulSet":
            name = f"{w.name}-{index}"
            if not _take(taken, ns, name):
                raise ValueError(f"{ns}/{name} twice: StatefulSet pod names are fixed")
            labels |= {
                "apps.kubernetes.io/pod-index": str(index),
                "controller-revision-hash": f"{w.name}-{revision}",
                "statefulset.kubernetes.io/pod-name": name,
            }
            owner = ("apps/v1", "StatefulSet", w.name)
        else:  # DaemonSet: created with the node, pinned to it by a metadata.name field affinity
            labels |= {"controller-revision-hash": revision, "pod-template-generation": "3"}
            owner = ("apps/v1", "DaemonSet", w.name)
            name = _generated_name(taken, ids, w, w.name, node.name)
            age = node.age - timedelta(minutes=2)
        out.append(PodSpec(w, name, node, owner, labels, annotations, age, restart))
    return out


def assign_ips(pods: Iterable[PodSpec]) -> list[tuple[PodSpec, str]]:
    """The pods in `kubectl get pods -A` order (namespace, name), each with its IP: a DaemonSet pod uses
    its node's (host network), the n-th pod of a node (in that order) `<node subnet>.(100 + n)`."""
    on_node: dict[str, int] = defaultdict(int)
    out: list[tuple[PodSpec, str]] = []
    for pod in sorted(pods, key=lambda p: (p.workload.namespace, p.name)):
        on_node[pod.node.name] += 1
        subnet = pod.node.ip.rsplit(".", 1)[0]
        host_network = pod.owner[1] == "DaemonSet"
        out.append((pod, pod.node.ip if host_network else f"{subnet}.{100 + on_node[pod.node.name]}"))
    return out


def _projected_token() -> list[Json]:
    return [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": "kube-root-ca.crt"}},
        {"downwardAPI": {"items": [{"fieldRef": {"fieldPath": "metadata.namespace"}, "path": "namespace"}]}},
    ]


def pod_json(pod: PodSpec, ip: str, ids: Ids, now: datetime) -> Json:
    """The Pod as the API server returns it: Running and Ready on its node."""
    w = pod.workload
    created = now - pod.age
    r = ids.rng("pod", w.namespace, pod.name)
    started = created + timedelta(seconds=1 + r.randrange(3))
    running = started + timedelta(seconds=8 + r.randrange(90))
    ready = running + timedelta(seconds=5)
    kind = pod.owner[1]

    requests = {"cpu": w.cpu, "memory": w.memory} | ({w.gpu_resource: str(w.gpus)} if w.gpus else {})
    limits = requests if w.guaranteed else {"memory": w.memory}
    token = f"kube-api-access-{ids.suffix(5, w.namespace, pod.name, 'token')}"
    volumes = [volume for volume, _ in w.volumes]
    volumes.append({"name": token, "projected": {"defaultMode": 420, "sources": _projected_token()}})
    mounts = [{"mountPath": path, "name": volume["name"]} for volume, path in w.volumes]
    mounts.append({"mountPath": SERVICE_ACCOUNT_MOUNT, "name": token, "readOnly": True})
    tolerations = [{"operator": "Exists"}] if kind == "DaemonSet" else list(NOT_READY_TOLERATIONS)
    if w.gpus:
        tolerations.insert(0, GPU_TOLERATION)

    spec: Json = {
        "containers": [
            {
                "image": w.image,
                "imagePullPolicy": "IfNotPresent",
                "name": w.container,
                "resources": {"limits": limits, "requests": requests},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "volumeMounts": mounts,
            }
        ],
        "dnsPolicy": "ClusterFirst",
        "enableServiceLinks": True,
        "nodeName": pod.node.name,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": w.priority_class[1],
        "restartPolicy": pod.restart_policy,
        "schedulerName": w.scheduler,
        "securityContext": {},
        "serviceAccount": "default",
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
        "tolerations": tolerations,
        "volumes": volumes,
    }
    optional = {
        "affinity": pin_to(pod.node.name) if kind == "DaemonSet" else w.affinity,
        "nodeSelector": w.node_selector,
        "priorityClassName": w.priority_class[0],
        "topologySpreadConstraints": list(w.spread),
    }
    spec |= {key: value for key, value in optional.items() if value}

    metadata: Json = {
        "creationTimestamp": ts(created),
        "labels": pod.labels,
        "name": pod.name,
        "namespace": w.namespace,
        "ownerReferences": [
            {
                "apiVersion": pod.owner[0],
                "blockOwnerDeletion": True,
                "controller": True,
                "kind": kind,
                "name": pod.owner[2],
                "uid": ids.uid("owner", w.namespace, kind, pod.owner[2]),
            }
        ],
        "resourceVersion": str(870_000_000 + r.randrange(20_000_000)),
        "uid": ids.uid("pod", w.namespace, pod.name),
    }
    if pod.annotations:
        metadata["annotations"] = pod.annotations
    if kind != "StatefulSet":
        metadata["generateName"] = pod.name.rsplit("-", 1)[0] + "-"

    image_name = w.image.rsplit(":", 1)[0]
    status = {
        "conditions": [
            {"lastProbeTime": None, "lastTransitionTime": ts(moment), "status": "True", "type": condition}
            for condition, moment in (
                ("PodReadyToStartContainers", running),
                ("Initialized", started),
                ("Ready", ready),
                ("ContainersReady", ready),
                ("PodScheduled", created),
            )
        ],
        "containerStatuses": [
            {
                "containerID": f"containerd://{ids.digest('container', w.namespace, pod.name)}",
                "image": w.image,
                "imageID": f"{image_name}@sha256:{ids.digest('image', w.image)}",
                "lastState": {},
                "name": w.container,
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": ts(running)}},
            }
        ],
        "hostIP": pod.node.ip,
        "hostIPs": [{"ip": pod.node.ip}],
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "qosClass": "Guaranteed" if w.guaranteed else "Burstable",
        "startTime": ts(started),
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def pdb_json(
    namespace: str,
    name: str,
    budget: Json,
    ids: Ids,
    now: datetime,
    *,
    healthy: int,
    desired: int,
    age: timedelta,
    expected: int | None = None,
) -> Json:
    """A PodDisruptionBudget over the pods labelled `app.kubernetes.io/name: name`, with its status:
    `healthy` of `expected` pods (default: all healthy) healthy, `desired` needed."""
    allowed = max(0, healthy - desired)
    created = now - age
    condition = {
        "lastTransitionTime": ts(created + timedelta(minutes=1)),
        "message": "",
        "observedGeneration": 1,
        "reason": "SufficientPods" if allowed else "InsufficientPods",
        "status": "True" if allowed else "False",
        "type": "DisruptionAllowed",
    }
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "creationTimestamp": ts(created),
            "generation": 1,
            "name": name,
            "namespace": namespace,
            "resourceVersion": str(860_000_000 + ids.rng("pdb", name).randrange(10_000_000)),
            "uid": ids.uid("pdb", namespace, name),
        },
        "spec": budget | {"selector": {"matchLabels": {"app.kubernetes.io/name": name}}},
        "status": {
            "conditions": [condition],
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "disruptionsAllowed": allowed,
            "expectedPods": healthy if expected is None else expected,
            "observedGeneration": 1,
        },
    }


# --------------------------------------------------------------------------- checks


def quantity(text: str) -> int:
    """CPU in millicores or memory in bytes, for the forms generated clusters use (m, Mi, Gi, plain)."""
    units = {"m": 1, "Mi": 1024**2, "Gi": GIB}
    for unit, size in units.items():
        if text.endswith(unit):
            return int(text.removesuffix(unit)) * size
    return int(text) * 1000


def check(nodes: Sequence[NodeSpec], pods: Iterable[PodSpec]) -> None:
    """Refuse a picture no real cluster could be in: a pod name twice in a namespace, a pod on a node
    not in `nodes`, or a node whose pods request more CPU, memory or GPUs than it has."""
    by_node: dict[str, list[Workload]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    known = {node.name for node in nodes}
    for pod in pods:
        key = (pod.workload.namespace, pod.name)
        if key in seen:
            raise ValueError(f"pod {key[0]}/{key[1]} twice: pod names must be unique")
        if pod.node.name not in known:
            raise ValueError(f"pod {key[0]}/{key[1]} on {pod.node.name}, a node not in the table")
        seen.add(key)
        by_node[pod.node.name].append(pod.workload)
    for node in nodes:
        mine = by_node.get(node.name, [])
        gpus: dict[str, int] = defaultdict(int)
        for w in mine:
            gpus[w.gpu_resource] += w.gpus
        advertised = {node.gpu_resource: node.gpu_units} if node.shape.gpus else {}
        over = [
            resource for resource, wanted in gpus.items() if wanted and wanted > advertised.get(resource, 0)
        ]
        if sum(quantity(w.cpu) for w in mine) > node.allocatable_cpu_milli:
            over.append("cpu")
        if sum(quantity(w.memory) for w in mine) > node.allocatable_memory:
            over.append("memory")
        if over:
            raise ValueError(f"{node.name} is overcommitted: {', '.join(over)}")
