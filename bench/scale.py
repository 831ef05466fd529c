#!/usr/bin/env python3
"""Scale benchmark: synthetic GPU clusters as snapshot directories, timed through `rebalancer once`.

For each size asked for, writes a snapshot directory (DESIGN §4) under `bench/out/` and times it:

- `nodes.json`, `pods.json`, `pdbs.json`: `List`s as `kubectl get -o json` prints them (4-space indent,
  sorted keys, objects shaped like the demo cluster's: metadata, spec, status with conditions);
- `dcgm.om`: dcgm-exporter series (utilisation, framebuffer used and free) for every GPU, one series per
  (GPU, pod) when a GPU is shared, with `--history` of samples every `--sample-interval` seconds, the
  newest 15 s before `now` (OpenMetrics: timestamps in seconds, `# EOF`);
- `snapshot.yaml`: `now`.

The cluster: 8-GPU nodes of three models (H100, A100 80GB, L40S; part of the L40S pool time-sliced four
ways) over three zones, five DaemonSet pods per node and workloads of realistic shapes: gangs of 8-GPU
and 4-GPU training pods (coscheduling pod groups), single 4- and 2-GPU jobs, inference Deployments of 1-
and 2-GPU replicas (some spread over zones with maxSkew 1, most behind a PodDisruptionBudget), shared-GPU
replicas (quarter and half GPUs), idle notebooks, a few pods whose node was relabelled away from the
GPU model they require, and a share of lightly used nodes that gpu-consolidation can drain. Everything
derives from `--seed`: the same arguments write the same bytes.

Then, per size, `--repeat` times: the whole command as a subprocess (wall time and the child's peak RSS
from wait4) and the same cycle in-process, split into phases: snapshot load (cluster objects, telemetry
parse with prometheus_client, window aggregation), strategies, plan(), report (evictor + assembly + JSON).
Prints medians and checks the goals of the scale benchmark.

    python bench/scale.py --nodes 500 5000 [--seed 1] [--repeat 3] [--sample-interval 180] [--history 3600]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

import rebalancer.cycle as cycle_module  # noqa: E402
import rebalancer.sources.files as files_module  # noqa: E402
from rebalancer.cycle import assemble_report, evaluate, execute  # noqa: E402
from rebalancer.evictor import DryRunEvictor  # noqa: E402
from rebalancer.policy import LoadedPolicy, load_policy  # noqa: E402
from rebalancer.registry import StrategySpec, get_strategy  # noqa: E402
from rebalancer.report import render  # noqa: E402

Json = dict[str, Any]

OUT = ROOT / "bench" / "out"
POLICY = ROOT / "policies" / "default.yaml"
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
LAST_SAMPLE_AGE = 15  # the newest scrape, seconds before `now`
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
GIB = 1024**3
GPUS_PER_NODE = 8
SHARE_REPLICAS = 4  # time-slicing replicas per GPU on the shared L40S pool
GANG_LABEL = "scheduling.x-k8s.io/pod-group"
PRODUCT_LABEL = "nvidia.com/gpu.product"
PACKED = "gpu-packed-scheduler"
GANG_SCHEDULER = "scheduler-plugins-scheduler"
DEFAULT_SCHEDULER = "default-scheduler"

# Goals of the scale benchmark (issue: Scale).
GOAL_NODES = 5000
GOAL_WHOLE_RUN_S = 5.0
GOAL_PLANNING_S = 2.0
GOAL_RSS_BYTES = GIB
GOAL_RATIO = 12.0


# --------------------------------------------------------------------------- cluster model


@dataclass(frozen=True)
class Model:
    """A GPU instance type: what the cloud sells and what GPU feature discovery labels."""

    key: str
    instance_type: str
    cpu: int
    memory_gib: int
    product: str
    model_name: str
    family: str
    fb_total_mib: int
    fb_reserved_mib: int
    share: float  # of the cluster's nodes
    cpu_per_gpu: int  # what a pod asks for each whole GPU it requests: 8 of them fit the node
    memory_gib_per_gpu: int


MODELS = (
    Model("h100", "p5.48xlarge", 192, 2048, "NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3", "hopper",
          81559, 579, 0.40, 20, 200),
    Model("a100", "p4de.24xlarge", 96, 1152, "NVIDIA-A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "ampere",
          81920, 561, 0.35, 10, 120),
    Model("l40s", "g6e.48xlarge", 192, 1536, "NVIDIA-L40S", "NVIDIA L40S", "ada-lovelace",
          46068, 523, 0.25, 20, 160),
)  # fmt: skip


@dataclass
class NodeSpec:
    index: int
    name: str
    model: Model
    zone: str
    age: timedelta
    shared: bool  # time-sliced: advertises nvidia.com/gpu.shared instead of nvidia.com/gpu
    budget: int  # GPUs (or, when shared, GPU replicas) the generator may hand out on this node
    used: int = 0
    pods: list[PodSpec] = field(default_factory=list)

    @property
    def cpu_milli(self) -> int:
        return self.model.cpu * 1000 - 700 - 25 * self.model.cpu

    @property
    def memory(self) -> int:
        return self.model.memory_gib * GIB * 96 // 100 - 3 * GIB

    @property
    def ip(self) -> str:
        return f"10.{self.index // 250 % 250}.{self.index % 250}.10"


@dataclass
class Workload:
    namespace: str
    kind: str  # Deployment | StatefulSet | Job | IndexedJob
    name: str
    model: Model
    gpus: int  # per pod: whole GPUs, or GPU replicas on the shared pool
    shared: bool
    replicas: int
    cpu: str
    memory: str
    image: str
    scheduler: str
    util: tuple[float, float]  # utilisation (percent) range of its GPUs
    fb_used_mib: int
    age: timedelta
    gang: bool = False
    spread: bool = False
    skewed: bool = False  # spread, but one replica landed in the wrong zone (its zone was full then)
    pdb: bool = False
    dshm: bool = False
    claim: bool = False
    pods: list[PodSpec] = field(default_factory=list)


@dataclass
class PodSpec:
    workload: Workload | None  # None for DaemonSet pods
    name: str
    node: NodeSpec
    index: int
    json: Json = field(default_factory=dict)


class Rng(random.Random):
    """A seeded stream per purpose: `Rng(seed, "nodes")` never depends on the other streams' use."""

    def __init__(self, seed: int, *parts: object) -> None:
        super().__init__("/".join(map(str, (seed, *parts))))

    def suffix(self, length: int) -> str:
        """A Kubernetes-style name suffix (the alphabet of apimachinery's rand.String)."""
        return "".join(self.choices("bcdfghjklmnpqrstvwxz2456789", k=length))

    def uid(self) -> str:
        return str(uuid.UUID(int=self.getrandbits(128), version=4))


def ts(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- building the cluster


def build_nodes(count: int, seed: int) -> list[NodeSpec]:
    """Nodes of the three models over three zones; 15 % lightly used, 5 % empty, 2 % younger than 1h."""
    r = Rng(seed, "nodes")
    nodes: list[NodeSpec] = []
    models = [m for m in MODELS for _ in range(round(m.share * 100))]
    for index in range(count):
        model = models[index * 100 // count % len(models)] if count >= 100 else r.choice(models)
        zone = ZONES[index % len(ZONES)]
        profile = r.random()
        shared = model.key == "l40s" and r.random() < 0.2
        unit = SHARE_REPLICAS if shared else 1
        if profile < 0.15:
            budget = r.randint(1, 2) * unit  # lightly used: consolidation's candidates
        elif profile < 0.20:
            budget = 0  # empty: where drained pods can go
        else:
            budget = r.randint(6, 8) * unit
        young = r.random() < 0.02
        age = timedelta(minutes=r.randint(5, 50)) if young else timedelta(hours=r.randint(2, 24 * 90))
        name = f"gpu-{model.key}-{zone[-1]}-{index:05d}"
        nodes.append(NodeSpec(index, name, model, zone, age, shared, budget))
    return nodes


class Placer:
    """First fit of pods onto nodes of a model and zone, within each node's budget."""

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        self.open: dict[tuple[str, bool, str], list[NodeSpec]] = {}
        for node in nodes:
            if node.budget:
                self.open.setdefault((node.model.key, node.shared, node.zone), []).append(node)

    def place(self, model: Model, shared: bool, zone: str, units: int) -> NodeSpec | None:
        candidates = self.open.get((model.key, shared, zone), [])
        for position, node in enumerate(candidates):
            if node.budget - node.used >= units:
                node.used += units
                if node.used == node.budget:
                    del candidates[position]
                return node
        return None


def _workload(r: Rng, number: int, model: Model, kind: str) -> Workload:
    """One workload of a kind: its shape, scheduler, utilisation and safety features."""
    age = timedelta(hours=r.randint(2, 24 * 30))
    packed = PACKED if r.random() < 0.7 else DEFAULT_SCHEDULER

    def whole(gpus: int) -> dict[str, Any]:  # requests of a pod holding whole GPUs
        return {
            "gpus": gpus,
            "shared": False,
            "cpu": str(model.cpu_per_gpu * gpus),
            "memory": f"{model.memory_gib_per_gpu * gpus}Gi",
            "model": model,
            "age": age,
        }

    pytorch = "nvcr.io/nvidia/pytorch:24.10-py3"
    if kind in ("gang-8", "gang-4"):
        gpus = int(kind[-1])
        return Workload(
            namespace="training",
            kind="IndexedJob",
            name=f"{'pretrain' if gpus == 8 else 'finetune'}-{number:05d}",
            replicas=r.randint(2, 4),
            image=pytorch,
            scheduler=PACKED if r.random() < 0.5 else GANG_SCHEDULER,
            util=(85, 97) if gpus == 8 else (70, 95),
            fb_used_mib=int(model.fb_total_mib * (0.9 if gpus == 8 else 0.75)),
            gang=True,
            dshm=True,
            claim=gpus == 8,
            **whole(gpus),
        )
    if kind == "job":
        return Workload(
            namespace="research",
            kind="Job",
            name=f"experiment-{number:05d}",
            replicas=1,
            image=pytorch,
            scheduler=packed,
            util=(40, 90),
            fb_used_mib=int(model.fb_total_mib * 0.6),
            dshm=True,
            **whole(r.choice((2, 4))),
        )
    if kind == "serve":
        spread = r.random() < 0.4
        return Workload(
            namespace="inference",
            kind="Deployment",
            name=f"serve-{number:05d}",
            replicas=3 * r.randint(1, 4) if spread else r.randint(2, 8),
            image="vllm/vllm-openai:v0.6.4.post1",
            scheduler=packed,
            util=(15, 60),
            fb_used_mib=int(model.fb_total_mib * 0.85),
            spread=spread,
            skewed=spread and r.random() < 0.15,
            pdb=r.random() < 0.8,
            **whole(1 if r.random() < 0.85 else 2),
        )
    if kind == "shared":  # a quarter or half of a time-sliced GPU
        return Workload(
            namespace="ml-platform",
            kind="Deployment",
            name=f"embed-{number:05d}",
            model=model,
            gpus=r.choice((1, 2)),
            shared=True,
            replicas=r.randint(2, 8),
            cpu="4",
            memory="24Gi",
            image="nvcr.io/nvidia/tritonserver:24.10-py3",
            scheduler=PACKED,
            util=(10, 40),
            fb_used_mib=model.fb_total_mib // 5,
            age=age,
            pdb=r.random() < 0.5,
        )
    # An idle notebook: a kernel heartbeat now and then, nothing else.
    return Workload(
        namespace="notebooks",
        kind="StatefulSet",
        name=f"notebook-{number:05d}",
        replicas=1,
        image="kubeflownotebookswg/jupyter-pytorch-cuda-full:v1.9.2",
        scheduler=DEFAULT_SCHEDULER,
        util=(0, 2),
        fb_used_mib=int(model.fb_total_mib * 0.3),
        claim=True,
        **whole(1),
    )


# Share of each model's GPU budget per workload kind, largest pods first (they need emptier nodes).
KIND_SHARES = (("gang-8", 0.10), ("gang-4", 0.08), ("job", 0.06), ("serve", 0.66), ("notebook", 0.10))


def build_workloads(nodes: Sequence[NodeSpec], seed: int) -> list[Workload]:
    """Workloads placed onto the nodes until every model's budget is spent (up to what no longer fits)."""
    r = Rng(seed, "workloads")
    placer = Placer(nodes)
    workloads: list[Workload] = []
    for model in MODELS:
        for shared in (False, True):
            budget = sum(n.budget for n in nodes if n.model is model and n.shared is shared)
            kinds = (("shared", 1.0),) if shared else KIND_SHARES
            for kind, share in kinds:
                if kind.startswith("gang-8") and model.key == "l40s":
                    continue
                quota = budget * share
                failures = 0
                while quota > 0 and failures < 20:
                    w = _workload(r, len(workloads), model, kind)
                    start = r.randrange(len(ZONES))
                    placed: list[NodeSpec] = []
                    for replica in range(w.replicas):
                        turn = start if w.skewed and replica == w.replicas - 1 else start + replica
                        zones = [ZONES[turn % len(ZONES)]] if w.spread else r.sample(ZONES, 3)
                        node = next(
                            (n for z in zones if (n := placer.place(model, shared, z, w.gpus)) is not None),
                            None,
                        )
                        if node is None:
                            break
                        placed.append(node)
                    if w.gang and len(placed) < w.replicas:  # a gang runs whole or not at all
                        for node in placed:
                            node.used -= w.gpus  # budget handed back; the node stays full in the placer
                        placed = []
                    if not placed:
                        failures += 1
                        continue
                    w.replicas = len(placed)
                    for replica, node in enumerate(placed):
                        pod = PodSpec(w, _pod_name(r, w, replica), node, replica)
                        w.pods.append(pod)
                        node.pods.append(pod)
                    quota -= w.gpus * w.replicas
                    workloads.append(w)
    return workloads


def _pod_name(r: Rng, w: Workload, replica: int) -> str:
    if w.kind == "Deployment":
        return f"{w.name}-{r.suffix(10)}-{r.suffix(5)}"
    if w.kind == "StatefulSet":
        return f"{w.name}-{replica}"
    if w.kind == "IndexedJob":
        return f"{w.name}-{replica}-{r.suffix(5)}"
    return f"{w.name}-{r.suffix(5)}"


DAEMONSETS = (
    ("kube-system", "kube-proxy", "public.ecr.aws/eks/kube-proxy:v1.31.2-eksbuild.3", "100m", "64Mi"),
    ("gpu-operator", "nvidia-device-plugin-daemonset", "nvcr.io/nvidia/k8s-device-plugin:v0.17.0", "50m",
     "64Mi"),
    ("gpu-operator", "nvidia-dcgm-exporter", "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-ubuntu22.04",
     "100m", "512Mi"),
    ("gpu-operator", "gpu-feature-discovery", "nvcr.io/nvidia/k8s-device-plugin:v0.17.0", "10m", "64Mi"),
    ("monitoring", "node-exporter", "quay.io/prometheus/node-exporter:v1.8.2", "100m", "128Mi"),
)  # fmt: skip


# --------------------------------------------------------------------------- Kubernetes JSON


def node_json(node: NodeSpec, seed: int) -> Json:
    model = node.model
    r = Rng(seed, "node", node.name)
    created = NOW - node.age
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": model.instance_type,
        "beta.kubernetes.io/os": "linux",
        "karpenter.sh/capacity-type": "on-demand",
        "karpenter.sh/nodepool": f"gpu-{model.key}" + ("-shared" if node.shared else ""),
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": model.instance_type,
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/gpu.count": str(GPUS_PER_NODE),
        "nvidia.com/gpu.deploy.dcgm-exporter": "true",
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.family": model.family,
        "nvidia.com/gpu.memory": str(model.fb_total_mib),
        "nvidia.com/gpu.present": "true",
        PRODUCT_LABEL: model.product,
        "nvidia.com/gpu.replicas": str(SHARE_REPLICAS if node.shared else 1),
        "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": node.zone,
    }
    gpu = (
        {"nvidia.com/gpu.shared": str(GPUS_PER_NODE * SHARE_REPLICAS)}
        if node.shared
        else {"nvidia.com/gpu": str(GPUS_PER_NODE)}
    )
    capacity = {
        "cpu": str(model.cpu),
        "ephemeral-storage": "524275692Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": f"{model.memory_gib * GIB * 96 // 100 // 1024}Ki",
        "pods": "110",
        **gpu,
    }
    allocatable = capacity | {
        "cpu": f"{node.cpu_milli}m",
        "ephemeral-storage": "482098735693",
        "memory": f"{node.memory // 1024}Ki",
    }
    heartbeat = ts(NOW - timedelta(seconds=5 + r.randrange(40)))
    ready_since = ts(created + timedelta(seconds=40 + r.randrange(30)))
    conditions = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    dns = f"ip-{node.ip.replace('.', '-')}.ec2.internal"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "annotations": {
                "alpha.kubernetes.io/provided-node-ip": node.ip,
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "creationTimestamp": ts(created),
            "labels": labels,
            "name": node.name,
            "resourceVersion": str(880_000_000 + r.randrange(10_000_000)),
            "uid": r.uid(),
        },
        "spec": {
            "providerID": f"aws:///{node.zone}/i-0{r.getrandbits(64):016x}",
            "taints": [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "value": "true"}],
        },
        "status": {
            "addresses": [
                {"address": node.ip, "type": "InternalIP"},
                {"address": dns, "type": "InternalDNS"},
                {"address": dns, "type": "Hostname"},
            ],
            "allocatable": allocatable,
            "capacity": capacity,
            "conditions": [
                {
                    "lastHeartbeatTime": heartbeat,
                    "lastTransitionTime": ready_since,
                    "message": message,
                    "reason": reason,
                    "status": status,
                    "type": kind,
                }
                for kind, status, reason, message in conditions
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "containerRuntimeVersion": "containerd://1.7.23",
                "kernelVersion": "6.1.115-126.197.amzn2023.x86_64",
                "kubeProxyVersion": "v1.31.2-eks-7f9249a",
                "kubeletVersion": "v1.31.2-eks-7f9249a",
                "operatingSystem": "linux",
                "osImage": "Amazon Linux 2023.6.20241121",
            },
        },
    }


GPU_TOLERATION: Json = {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}
NOT_READY_TOLERATIONS: list[Json] = [
    {"effect": "NoExecute", "key": key, "operator": "Exists", "tolerationSeconds": 300}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
]


def _spread(w: Workload) -> Json:
    return {
        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": w.name}},
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
    }


def _requires(product: str) -> Json:
    term = {"matchExpressions": [{"key": PRODUCT_LABEL, "operator": "In", "values": [product]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def _pin(node: str) -> Json:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def pod_json(pod: PodSpec, seed: int, ip: str, wrong_model: Model | None) -> Json:
    """A Pod as the API server returns it. `wrong_model`: the node was relabelled away from what the pod
    requires (node affinity is IgnoredDuringExecution, so the pod keeps running there)."""
    node, w = pod.node, pod.workload
    r = Rng(seed, "pod", pod.name, node.name)
    if w is None:  # a DaemonSet pod
        namespace, ds_name, image, cpu, memory = DAEMONSETS[pod.index]
        kind, owner_name, owner_version = "DaemonSet", ds_name, "apps/v1"
        age = node.age - timedelta(minutes=2)
        labels = {
            "app.kubernetes.io/name": ds_name,
            "controller-revision-hash": Rng(seed, ds_name).suffix(10),
            "pod-template-generation": "3",
        }
        requests: Json = {"cpu": cpu, "memory": memory}
        limits: Json = {"memory": memory}
        scheduler, priority = DEFAULT_SCHEDULER, ("system-node-critical", 2_000_001_000)
        container = ds_name
        qos = "Burstable"
    else:
        namespace, image, container, qos = w.namespace, w.image, "main", "Guaranteed"
        age = w.age
        labels = {"app.kubernetes.io/name": w.name}
        kind, owner_name, owner_version = {
            "Deployment": ("ReplicaSet", f"{w.name}-{Rng(seed, w.name).suffix(10)}", "apps/v1"),
            "StatefulSet": ("StatefulSet", w.name, "apps/v1"),
            "Job": ("Job", w.name, "batch/v1"),
            "IndexedJob": ("Job", w.name, "batch/v1"),
        }[w.kind]
        if w.kind == "Deployment":
            labels["pod-template-hash"] = owner_name.rsplit("-", 1)[1]
        elif w.kind == "StatefulSet":
            labels["statefulset.kubernetes.io/pod-name"] = pod.name
        else:
            labels["batch.kubernetes.io/job-name"] = w.name
            labels["job-name"] = w.name
        if w.kind == "IndexedJob":
            labels["batch.kubernetes.io/job-completion-index"] = str(pod.index)
        if w.gang:
            labels[GANG_LABEL] = w.name
        gpu_resource = "nvidia.com/gpu.shared" if w.shared else "nvidia.com/gpu"
        requests = {"cpu": w.cpu, "memory": w.memory, gpu_resource: str(w.gpus)}
        limits = requests
        scheduler, priority = w.scheduler, ("", 0)
    created = NOW - age
    started = created + timedelta(seconds=1 + r.randrange(3))
    running = started + timedelta(seconds=8 + r.randrange(90))
    ready = running + timedelta(seconds=5)
    token = f"kube-api-access-{r.suffix(5)}"
    volumes: list[Json] = []
    mounts: list[Json] = []
    if w is not None and w.dshm:
        volumes.append({"emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}, "name": "dshm"})
        mounts.append({"mountPath": "/dev/shm", "name": "dshm"})
    if w is not None and w.claim:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": f"{w.name}-data"}})
        mounts.append({"mountPath": "/data", "name": "data"})
    if w is None and pod.index in (1, 2):  # the device plugin and the exporter read kubelet sockets
        volumes.append({"hostPath": {"path": "/var/lib/kubelet", "type": ""}, "name": "kubelet"})
        mounts.append({"mountPath": "/var/lib/kubelet", "name": "kubelet"})
    volumes.append(
        {
            "name": token,
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {
                        "configMap": {
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                            "name": "kube-root-ca.crt",
                        }
                    },
                    {
                        "downwardAPI": {
                            "items": [{"fieldRef": {"fieldPath": "metadata.namespace"}, "path": "namespace"}]
                        }
                    },
                ],
            },
        }
    )
    mounts.append(
        {"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "name": token, "readOnly": True}
    )
    tolerations = [{"operator": "Exists"}] if w is None else [GPU_TOLERATION, *NOT_READY_TOLERATIONS]
    spec: Json = {
        "containers": [
            {
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "name": container,
                "resources": {"limits": limits, "requests": requests},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "volumeMounts": mounts,
            }
        ],
        "dnsPolicy": "ClusterFirst",
        "enableServiceLinks": True,
        "nodeName": node.name,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": priority[1],
        "restartPolicy": "Never" if w is not None and w.kind in ("Job", "IndexedJob") else "Always",
        "schedulerName": scheduler,
        "securityContext": {},
        "serviceAccount": "default",
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
        "tolerations": tolerations,
        "volumes": volumes,
    }
    if priority[0]:
        spec["priorityClassName"] = priority[0]
    if w is None:
        spec["affinity"] = _pin(node.name)
    elif wrong_model is not None:
        spec["affinity"] = _requires(wrong_model.product)
    else:
        spec["nodeSelector"] = {PRODUCT_LABEL: w.model.product}
    if w is not None and w.spread:
        spec["topologySpreadConstraints"] = [_spread(w)]
    metadata: Json = {
        "creationTimestamp": ts(created),
        "generateName": pod.name.rsplit("-", 1)[0] + "-",
        "labels": labels,
        "name": pod.name,
        "namespace": namespace,
        "ownerReferences": [
            {
                "apiVersion": owner_version,
                "blockOwnerDeletion": True,
                "controller": True,
                "kind": kind,
                "name": owner_name,
                "uid": Rng(seed, "owner", namespace, owner_name).uid(),
            }
        ],
        "resourceVersion": str(870_000_000 + r.randrange(20_000_000)),
        "uid": r.uid(),
    }
    image_name = image.rsplit(":", 1)[0]
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
                "containerID": f"containerd://{r.getrandbits(256):064x}",
                "image": image,
                "imageID": f"{image_name}@sha256:{Rng(seed, image).getrandbits(256):064x}",
                "lastState": {},
                "name": container,
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": ts(running)}},
            }
        ],
        "hostIP": node.ip,
        "hostIPs": [{"ip": node.ip}],
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "qosClass": qos,
        "startTime": ts(started),
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def pdb_json(w: Workload, seed: int) -> Json:
    r = Rng(seed, "pdb", w.name)
    healthy = w.replicas
    allowed = 0 if r.random() < 0.2 else min(1, healthy)  # some are at their budget (a replica restarting)
    created = NOW - w.age
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "creationTimestamp": ts(created),
            "generation": 1,
            "name": w.name,
            "namespace": w.namespace,
            "resourceVersion": str(860_000_000 + r.randrange(10_000_000)),
            "uid": r.uid(),
        },
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": w.name}}},
        "status": {
            "conditions": [
                {
                    "lastTransitionTime": ts(created + timedelta(minutes=1)),
                    "message": "",
                    "observedGeneration": 1,
                    "reason": "SufficientPods" if allowed else "InsufficientPods",
                    "status": "True" if allowed else "False",
                    "type": "DisruptionAllowed",
                }
            ],
            "currentHealthy": healthy - (1 - allowed),
            "desiredHealthy": healthy - 1,
            "disruptionsAllowed": allowed,
            "expectedPods": healthy,
            "observedGeneration": 1,
        },
    }


def write_list(path: Path, items: Iterator[Json]) -> int:
    """A `List` as `kubectl get -o json` prints it (4-space indent, sorted keys), written item by item."""
    count = 0
    with path.open("w", encoding="utf-8") as out:
        out.write('{\n    "apiVersion": "v1",\n    "items": [')
        for item in items:
            text = json.dumps(item, indent=4, sort_keys=True).replace("\n", "\n        ")
            out.write(("," if count else "") + "\n        " + text)
            count += 1
        out.write(
            '\n    ],\n    "kind": "List",\n    "metadata": {\n        "resourceVersion": ""\n    }\n}\n'
        )
    return count


# --------------------------------------------------------------------------- DCGM telemetry


METRICS = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
)


def _devices(node: NodeSpec) -> list[list[PodSpec]]:
    """The pods on each of the node's GPUs, as the device plugin hands them out (shares packed)."""
    devices: list[list[PodSpec]] = [[] for _ in range(GPUS_PER_NODE)]
    free = [SHARE_REPLICAS if node.shared else 1] * GPUS_PER_NODE
    for pod in node.pods:
        w = pod.workload
        if w is None:
            continue
        need = w.gpus
        if node.shared:  # replicas of one GPU: the fullest device that still has room
            room = [i for i in range(GPUS_PER_NODE) if free[i] >= need] or list(range(GPUS_PER_NODE))
            index = min(room, key=lambda i: (free[i], i))
            free[index] -= need
            devices[index].append(pod)
            continue
        for index in [i for i in range(GPUS_PER_NODE) if free[i]][:need]:
            free[index] = 0
            devices[index].append(pod)
    return devices


def write_openmetrics(path: Path, nodes: Sequence[NodeSpec], seed: int, interval: int, history: int) -> int:
    """Every GPU's series, `history` seconds at `interval`; returns the number of samples written."""
    newest = int(NOW.timestamp()) - LAST_SAMPLE_AGE
    times = list(range(newest - history + (history % interval), newest + 1, interval))
    series: list[tuple[str, list[int], list[int], list[int]]] = []  # labels, util, fb free, fb used
    samples = 0
    with path.open("w", encoding="utf-8") as out:
        for metric_index, (metric, help_text) in enumerate(METRICS):
            out.write(f"# HELP {metric} {help_text}\n# TYPE {metric} gauge\n")
            if metric_index == 0:
                series = [s for node in nodes for s in _gpu_series(node, seed, len(times))]
            for labels, *values in series:
                chunk = [
                    f"{metric}{{{labels}}} {v} {t}\n"
                    for v, t in zip(values[metric_index], times, strict=True)
                ]
                out.write("".join(chunk))
                samples += len(chunk)
        out.write("# EOF\n")
    return samples


def _gpu_series(
    node: NodeSpec, seed: int, count: int
) -> Iterator[tuple[str, list[int], list[int], list[int]]]:
    model = node.model
    r = Rng(seed, "dcgm", node.name)
    usable = model.fb_total_mib - model.fb_reserved_mib
    leaked = r.random() < 0.01  # a crashed process left its CUDA context on an unused GPU
    for index, holders in enumerate(_devices(node)):
        gpu_uuid = "GPU-" + str(uuid.UUID(int=r.getrandbits(128), version=4))
        base = (
            f'gpu="{index}",UUID="{gpu_uuid}",pci_bus_id="00000000:{0x10 * (index + 1):02X}:00.0",'
            f'device="nvidia{index}",modelName="{model.model_name}",hostname="{node.name}"'
        )
        if not holders:
            held = 20_480 if leaked and index == GPUS_PER_NODE - 1 else 0
            yield base, [0] * count, [usable - held] * count, [held] * count
            continue
        for pod in holders:
            w = pod.workload
            assert w is not None
            low, high = w.util
            level = r.uniform(low, high)
            if w.kind == "StatefulSet":  # idle notebook: a kernel heartbeat every 11th scrape
                util = [r.choice((1, 2, 3)) if k % 11 == 3 else 0 for k in range(count)]
            else:
                util = [round(min(100.0, max(0.0, level + r.uniform(-5, 5)))) for _ in range(count)]
            fb = w.fb_used_mib // len(holders)
            used = [max(0, fb + r.randrange(-256, 257, 64)) for _ in range(count)]
            labels = f'{base},container="main",namespace="{w.namespace}",pod="{pod.name}"'
            yield labels, util, [usable - u for u in used], used


# --------------------------------------------------------------------------- the snapshot directory


@dataclass(frozen=True)
class Generated:
    path: Path
    nodes: int
    pods: int
    pdbs: int
    gpus: int
    samples: int
    bytes: int


def generate(out: Path, node_count: int, seed: int, interval: int, history: int) -> Generated:
    """Write the snapshot directory (or reuse it when written by the same arguments)."""
    # A directory written by another version of this script is rewritten.
    source = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    params = {
        "generator": source,
        "nodes": node_count,
        "seed": seed,
        "interval": interval,
        "history": history,
    }
    stamp = out / ".params.json"
    if stamp.exists():
        cached = json.loads(stamp.read_text(encoding="utf-8"))
        if cached.get("params") == params:
            return Generated(path=out, **cached["counts"])
    out.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)  # written last: a directory without it is incomplete

    nodes = build_nodes(node_count, seed)
    workloads = build_workloads(nodes, seed)
    r = Rng(seed, "pods")
    taken: set[str] = set()
    for node in nodes:  # DaemonSet pods: the controller retries a name that is taken
        for index, (_ns, name, *_rest) in enumerate(DAEMONSETS):
            while (pod_name := f"{name}-{r.suffix(5)}") in taken:
                pass
            taken.add(pod_name)
            node.pods.insert(index, PodSpec(None, pod_name, node, index))
    # A few serving pods whose node was relabelled away from the GPU model they require.
    relabelled: dict[str, Model] = {}
    for w in workloads:
        if w.kind == "Deployment" and not w.shared and r.random() < 0.03:
            pod = w.pods[0]
            relabelled[pod.name] = next(m for m in MODELS if m is not w.model)

    def pods() -> Iterator[Json]:
        for node in nodes:
            for number, pod in enumerate(node.pods):
                ip = node.ip if pod.workload is None else f"{node.ip.rsplit('.', 1)[0]}.{100 + number}"
                yield pod_json(pod, seed, ip, relabelled.get(pod.name))

    pod_count = write_list(out / "pods.json", pods())
    write_list(out / "nodes.json", (node_json(node, seed) for node in nodes))
    pdb_count = write_list(out / "pdbs.json", (pdb_json(w, seed) for w in workloads if w.pdb))
    samples = write_openmetrics(out / "dcgm.om", nodes, seed, interval, history)
    (out / "snapshot.yaml").write_text(f"now: {ts(NOW)}\n", encoding="utf-8")
    names = ("pods.json", "nodes.json", "pdbs.json", "dcgm.om", "snapshot.yaml")
    size = sum((out / name).stat().st_size for name in names)
    counts = {
        "nodes": node_count,
        "pods": pod_count,
        "pdbs": pdb_count,
        "gpus": node_count * GPUS_PER_NODE,
        "samples": samples,
        "bytes": size,
    }
    stamp.write_text(json.dumps({"params": params, "counts": counts}) + "\n", encoding="utf-8")
    return Generated(path=out, **counts)


# --------------------------------------------------------------------------- timing

# In-process phases, in table order. `planning` (strategies + plan) is what the planning goal measures.
PHASES = (
    ("load", "snapshot load"),
    ("objects", "  cluster objects (read, decode, to model)"),
    ("parse", "  telemetry read and parse (prometheus_client)"),
    ("aggregate", "  telemetry aggregate"),
    ("planning", "planning: evaluate()"),
    ("strategies", "  strategies"),
    ("plan", "  plan()"),
    ("report", "report (evictor, assembly, JSON)"),
)


@dataclass
class Run:
    """One measurement of one snapshot: the command as a subprocess, then the cycle in-process."""

    whole_s: float
    rss_bytes: int
    summary: Json  # the report's summary, from the subprocess
    phases: dict[str, float]  # seconds, keys of PHASES
    strategies: dict[str, float]  # seconds per strategy, policy order


def run_subprocess(snapshot: Path, policy: Path) -> tuple[float, int, Json]:
    """`rebalancer once --snapshot DIR --output json`: wall time, peak RSS and the report's summary."""
    command = [
        sys.executable,
        "-m",
        "rebalancer.cli",
        "once",
        "--snapshot",
        str(snapshot),
        "--output",
        "json",
    ]
    command += ["--policy", str(policy)]
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=stdout, stderr=stderr, cwd=ROOT)
        _pid, status, usage = os.wait4(child.pid, 0)  # this child's own rusage (ru_maxrss in KiB)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            stderr.seek(0)
            raise SystemExit(f"rebalancer once failed ({child.returncode}): {stderr.read().decode()}")
        stdout.seek(0)
        summary: Json = json.loads(stdout.read())["summary"]
    return wall, usage.ru_maxrss * 1024, summary


class _Timer:
    """Time spent in wrapped functions, by label."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[label] = self.spent.get(label, 0.0) + time.perf_counter() - start

        return timed


class _TimedSpec:
    """A registered strategy whose runs are timed."""

    def __init__(self, spec: StrategySpec[Any], timer: _Timer, name: str) -> None:
        self._spec = spec
        self.run = timer.wrap(f"strategy {name}", spec.run)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spec, name)


def run_in_process(snapshot: Path, loaded: LoadedPolicy) -> tuple[dict[str, float], dict[str, float]]:
    """The cycle `rebalancer once` runs, with the project's own functions, timed phase by phase."""
    timer = _Timer()

    def timed_strategy(name: str) -> Any:
        spec = get_strategy(name)
        return None if spec is None else _TimedSpec(spec, timer, name)

    # Wrap what load_snapshot_dir and evaluate() call, where they look it up.
    wrapped = (
        (files_module, "_read_exposition", "parse"),
        (files_module, "aggregate", "aggregate"),
        (cycle_module, "plan", "plan"),
    )
    with ExitStack() as patches:
        for module, attribute, label in wrapped:
            patches.enter_context(
                mock.patch.object(module, attribute, timer.wrap(label, getattr(module, attribute)))
            )
        patches.enter_context(mock.patch.object(cycle_module, "get_strategy", timed_strategy))
        start = time.perf_counter()
        snap = files_module.load_snapshot_dir(snapshot, loaded)
        loaded_at = time.perf_counter()
        evaluation = evaluate(snap, loaded)
        evaluated_at = time.perf_counter()
        outcomes = execute(evaluation, DryRunEvictor())
        render(assemble_report("dry-run", evaluation, outcomes, loaded), "json")
        done = time.perf_counter()
    spent = timer.spent
    load, planning = loaded_at - start, evaluated_at - loaded_at
    phases = {
        "load": load,
        "objects": load - spent.get("parse", 0.0) - spent.get("aggregate", 0.0),
        "parse": spent.get("parse", 0.0),
        "aggregate": spent.get("aggregate", 0.0),
        "planning": planning,
        "strategies": planning - spent.get("plan", 0.0),
        "plan": spent.get("plan", 0.0),
        "report": done - evaluated_at,
    }
    strategies = {k.removeprefix("strategy "): v for k, v in spent.items() if k.startswith("strategy ")}
    return phases, strategies


def measure(generated: Generated, loaded: LoadedPolicy, policy: Path, repeat: int) -> list[Run]:
    runs: list[Run] = []
    for number in range(1, repeat + 1):
        whole, rss, summary = run_subprocess(generated.path, policy)
        phases, strategies = run_in_process(generated.path, loaded)
        runs.append(Run(whole, rss, summary, phases, strategies))
        print(
            f"  {generated.nodes:,} nodes, run {number}/{repeat}: {whole:.2f} s, {rss / 2**20:,.0f} MiB",
            file=sys.stderr,
        )
    return runs


# --------------------------------------------------------------------------- report


def _median(values: Iterable[float]) -> float:
    return statistics.median(values)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table: first column left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + (":" if i else "-")) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def _seconds(value: float) -> str:
    return f"{value:.3f} s" if value < 1 else f"{value:.2f} s"


def report(results: Sequence[tuple[Generated, list[Run]]], repeat: int) -> tuple[str, bool]:
    """The table of medians and the goal checks; True when every goal that could be checked holds."""
    Cell = Callable[[Generated, list[Run]], str]

    def row(label: str, cell: Cell) -> list[str]:
        return [label, *(cell(g, runs) for g, runs in results)]

    def phase(key: str) -> Cell:
        return lambda _g, runs: _seconds(_median(r.phases[key] for r in runs))

    def strategy(name: str) -> Cell:
        return lambda _g, runs: _seconds(_median(r.strategies.get(name, 0.0) for r in runs))

    def whole(runs: list[Run]) -> float:
        return _median(r.whole_s for r in runs)

    def rss(runs: list[Run]) -> float:
        return _median(r.rss_bytes for r in runs)

    def median_phase(runs: list[Run], key: str) -> float:
        return _median(r.phases[key] for r in runs)

    rows = [
        row("pods / PDBs", lambda g, _r: f"{g.pods:,} / {g.pdbs:,}"),
        row("GPUs / DCGM samples", lambda g, _r: f"{g.gpus:,} / {g.samples:,}"),
        row("snapshot size", lambda g, _r: f"{g.bytes / 1e6:,.0f} MB"),
        row("**whole run** (subprocess)", lambda _g, runs: _seconds(whole(runs))),
        row("**peak RSS** (subprocess)", lambda _g, runs: f"{rss(runs) / 2**20:,.0f} MiB"),
        row(
            "whole run - telemetry parse",
            lambda _g, runs: _seconds(whole(runs) - median_phase(runs, "parse")),
        ),
    ]
    for key, label in PHASES:
        rows.append(row(label, phase(key)))
        if key == "strategies":
            rows += [row(f"    {name}", strategy(name)) for name in results[0][1][0].strategies]
    rows.append(row("parse throughput", lambda g, runs: f"{g.samples / median_phase(runs, 'parse'):,.0f} /s"))
    rows.append(
        row("proposals / would evict", lambda _g, runs: "{proposals} / {evictions}".format(**runs[0].summary))
    )
    columns = ["", *(f"{g.nodes:,} nodes" for g, _ in results)]
    lines = [f"median of {repeat} runs", "", _table(columns, rows), ""]

    ok = True
    by_nodes = {g.nodes: runs for g, runs in results}
    big, small = by_nodes.get(GOAL_NODES), by_nodes.get(GOAL_NODES // 10)
    checks: list[tuple[str, bool]] = []
    if big is not None:
        planning = median_phase(big, "planning")
        checks.append(
            (
                f"whole run at {GOAL_NODES:,} nodes {_seconds(whole(big))} <= {GOAL_WHOLE_RUN_S:g} s",
                whole(big) <= GOAL_WHOLE_RUN_S,
            )
        )
        checks.append(
            (
                f"planning (strategies + plan) {_seconds(planning)} <= {GOAL_PLANNING_S:g} s",
                planning <= GOAL_PLANNING_S,
            )
        )
        checks.append(
            (
                f"peak RSS {rss(big) / 2**20:,.0f} MiB <= {GOAL_RSS_BYTES // 2**20:,} MiB",
                rss(big) <= GOAL_RSS_BYTES,
            )
        )
        if small is not None:
            ratio = whole(big) / whole(small)
            label = (
                f"{GOAL_NODES:,}-node run {ratio:.1f}x the {GOAL_NODES // 10:,}-node run <= {GOAL_RATIO:g}x"
            )
            checks.append((label, ratio <= GOAL_RATIO))
    for label, passed in checks:
        lines.append(f"{'PASS' if passed else 'FAIL'}  {label}")
        ok = ok and passed
    return "\n".join(lines), ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Time `rebalancer once --snapshot` on synthetic GPU clusters."
    )
    parser.add_argument(
        "--nodes", type=int, nargs="+", default=[500, 5000], help="cluster sizes (8-GPU nodes)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the table shows medians")
    parser.add_argument("--sample-interval", type=int, default=180, help="seconds between DCGM samples")
    parser.add_argument("--history", type=int, default=3600, help="seconds of DCGM history before now")
    parser.add_argument("--policy", type=Path, default=POLICY)
    parser.add_argument("--out", type=Path, default=OUT, help="where the snapshot directories go")
    parser.add_argument("--generate-only", action="store_true", help="write the snapshots, time nothing")
    args = parser.parse_args(argv)
    loaded = load_policy(str(args.policy))
    results: list[tuple[Generated, list[Run]]] = []
    for count in args.nodes:
        directory = args.out / f"scale-{count}-seed{args.seed}"
        start = time.perf_counter()
        generated = generate(directory, count, args.seed, args.sample_interval, args.history)
        print(
            f"{directory}: {generated.pods:,} pods, {generated.samples:,} samples "
            f"({time.perf_counter() - start:.1f} s)",
            file=sys.stderr,
        )
        if not args.generate_only:
            results.append((generated, measure(generated, loaded, args.policy, args.repeat)))
    if not results:
        return 0
    text, ok = report(results, args.repeat)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
