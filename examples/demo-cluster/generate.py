#!/usr/bin/env python3
"""Write the demo cluster snapshot directory: nodes, pods, PDBs, DCGM history, `now`, demo policy.

The output is what `kubectl get nodes,pods,pdb -A -o json` and a Prometheus OpenMetrics export give
(DESIGN §4): `nodes.json`, `pods.json`, `pdbs.json` (each a `List`), `dcgm.om` (dcgm-exporter series
at 60 s resolution over the last two hours, timestamps in seconds), `snapshot.yaml` (`now`) and
`policy.yaml` (policies/default.yaml with namespace `notebooks` opted in to idle-GPU evictions).

Everything derives from the NODES and WORKLOADS tables below with seeded randomness, so running the
script again rewrites the files byte for byte. Standard library only. See README.md for the story.

    python examples/demo-cluster/generate.py [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_POLICY = HERE.parent.parent / "policies" / "default.yaml"

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
SAMPLES = 120  # DCGM samples per series: two hours ...
STEP = 60  # ... one a minute ...
LAST_SAMPLE_AGE = 15  # ... the newest scraped 15 s before `now`
ZONES = {"a": "us-east-1a", "b": "us-east-1b"}
GIB = 1024**3
DAY = timedelta(days=1)
HOUR = timedelta(hours=1)

Json = dict[str, Any]


def rng(*parts: object) -> random.Random:
    """A random stream that depends only on `parts` (never on the run or on PYTHONHASHSEED)."""
    return random.Random(zlib.crc32("/".join(map(str, parts)).encode()))


def uid(*parts: object) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "demo-cluster/" + "/".join(map(str, parts))))


def digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def suffix(length: int, *parts: object) -> str:
    """A Kubernetes-style name suffix (the alphabet of apimachinery's rand.String)."""
    r = rng("suffix", *parts)
    return "".join(r.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(length))


def ts(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class Shape:
    """An instance type: what the cloud sells and what GPU feature discovery labels."""

    instance_type: str
    cpu: int
    memory_gib: int
    gpus: int = 0
    product: str = ""  # nvidia.com/gpu.product
    model_name: str = ""  # DCGM modelName
    fb_total_mib: int = 0  # nvidia.com/gpu.memory
    fb_reserved_mib: int = 0  # the driver's share: FB_USED + FB_FREE = total - reserved
    family: str = ""
    compute: str = ""
    nodepool: str = "system"


H100 = Shape(
    instance_type="p5.48xlarge",
    cpu=192,
    memory_gib=2048,
    gpus=8,
    product="NVIDIA-H100-80GB-HBM3",
    model_name="NVIDIA H100 80GB HBM3",
    fb_total_mib=81559,
    fb_reserved_mib=579,
    family="hopper",
    compute="9.0",
    nodepool="gpu-h100",
)
A100 = Shape(
    instance_type="p4de.24xlarge",
    cpu=96,
    memory_gib=1152,
    gpus=8,
    product="NVIDIA-A100-SXM4-80GB",
    model_name="NVIDIA A100-SXM4-80GB",
    fb_total_mib=81920,
    fb_reserved_mib=561,
    family="ampere",
    compute="8.0",
    nodepool="gpu-a100",
)
L4 = Shape(
    instance_type="g6.12xlarge",
    cpu=48,
    memory_gib=192,
    gpus=4,
    product="NVIDIA-L4",
    model_name="NVIDIA L4",
    fb_total_mib=23034,
    fb_reserved_mib=438,
    family="ada-lovelace",
    compute="8.9",
    nodepool="gpu-l4",
)
CPU = Shape(instance_type="m6i.4xlarge", cpu=16, memory_gib=64)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    shape: Shape
    zone: str  # key of ZONES
    age: timedelta
    number: int  # position in NODES, for addresses

    @property
    def ip(self) -> str:
        return f"10.0.{16 * list(ZONES).index(self.zone) + self.number}.{20 + 7 * self.number}"

    @property
    def capacity_memory(self) -> int:
        return self.shape.memory_gib * GIB * 96 // 100  # what the kernel reports

    # What the kubelet leaves to pods after its reservations (EKS-style kube-reserved).
    @property
    def allocatable_cpu_milli(self) -> int:
        return self.shape.cpu * 1000 - 700 - 25 * self.shape.cpu

    @property
    def allocatable_memory(self) -> int:
        return self.capacity_memory - 3 * GIB


def _nodes(*rows: tuple[str, Shape, str, timedelta]) -> list[NodeSpec]:
    return [NodeSpec(name, shape, zone, age, number) for number, (name, shape, zone, age) in enumerate(rows)]


NODES = _nodes(
    ("h100-a-1", H100, "a", 63 * DAY + 4 * HOUR),
    ("h100-a-2", H100, "a", 63 * DAY + 4 * HOUR),
    ("h100-b-1", H100, "b", 35 * DAY + 9 * HOUR),
    ("h100-b-2", H100, "b", 9 * DAY + 2 * HOUR),
    ("a100-a-1", A100, "a", 121 * DAY),
    ("a100-a-2", A100, "a", 120 * DAY + 22 * HOUR),
    ("a100-a-3", A100, "a", 88 * DAY + 5 * HOUR),
    ("a100-b-1", A100, "b", 88 * DAY + 5 * HOUR),
    ("a100-b-2", A100, "b", 14 * DAY + 7 * HOUR),
    ("l4-a-1", L4, "a", 30 * DAY + 1 * HOUR),
    ("l4-b-1", L4, "b", 30 * DAY + 1 * HOUR),
    ("l4-b-2", L4, "b", 6 * DAY + 11 * HOUR),
    ("cpu-a-1", CPU, "a", 203 * DAY),
)
NODE = {n.name: n for n in NODES}
GPU_NODES = tuple(n.name for n in NODES if n.shape.gpus)


def node_json(node: NodeSpec) -> Json:
    shape = node.shape
    created = NOW - node.age
    r = rng("node", node.name)
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": shape.instance_type,
        "beta.kubernetes.io/os": "linux",
        "karpenter.sh/capacity-type": "on-demand",
        "karpenter.sh/initialized": "true",
        "karpenter.sh/nodepool": shape.nodepool,
        "karpenter.sh/registered": "true",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": shape.instance_type,
        "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": ZONES[node.zone],
    }
    capacity = {
        "cpu": str(shape.cpu),
        "ephemeral-storage": "524275692Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": f"{node.capacity_memory // 1024}Ki",
        "pods": "110",
    }
    allocatable = capacity | {
        "cpu": f"{node.allocatable_cpu_milli}m",
        "ephemeral-storage": "482098735693",
        "memory": f"{node.allocatable_memory // 1024}Ki",
    }
    taints = []
    if shape.gpus:  # GPU feature discovery labels, the GPU Operator's deploy labels, the device plugin
        major, minor = shape.compute.split(".")
        labels |= {
            "nvidia.com/cuda.driver.major": "550",
            "nvidia.com/cuda.driver.minor": "127",
            "nvidia.com/cuda.driver.rev": "05",
            "nvidia.com/cuda.runtime.major": "12",
            "nvidia.com/cuda.runtime.minor": "4",
            "nvidia.com/gpu.compute.major": major,
            "nvidia.com/gpu.compute.minor": minor,
            "nvidia.com/gpu.count": str(shape.gpus),
            "nvidia.com/gpu.deploy.dcgm-exporter": "true",
            "nvidia.com/gpu.deploy.device-plugin": "true",
            "nvidia.com/gpu.family": shape.family,
            "nvidia.com/gpu.machine": shape.instance_type,
            "nvidia.com/gpu.memory": str(shape.fb_total_mib),
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": shape.product,
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/mig.capable": "true" if shape.family in ("ampere", "hopper") else "false",
        }
        capacity["nvidia.com/gpu"] = allocatable["nvidia.com/gpu"] = str(shape.gpus)
        taints = [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "value": "true"}]
    ready_since = ts(created + timedelta(seconds=40 + r.randrange(30)))
    heartbeat = ts(NOW - timedelta(seconds=5 + r.randrange(40)))
    dns = f"ip-{node.ip.replace('.', '-')}.ec2.internal"
    conditions = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "annotations": {
                "alpha.kubernetes.io/provided-node-ip": node.ip,
                "karpenter.sh/nodepool-hash": str(r.randrange(10**18, 10**19)),
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "creationTimestamp": ts(created),
            "labels": labels,
            "name": node.name,
            "resourceVersion": str(880_000_000 + r.randrange(10_000_000)),
            "uid": uid("node", node.name),
        },
        "spec": {"providerID": f"aws:///{ZONES[node.zone]}/i-0{digest(node.name)[:16]}"}
        | ({"taints": taints} if taints else {}),
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
                "bootID": uid("boot", node.name),
                "containerRuntimeVersion": "containerd://1.7.23",
                "kernelVersion": "6.1.115-126.197.amzn2023.x86_64",
                "kubeProxyVersion": "v1.31.2-eks-7f9249a",
                "kubeletVersion": "v1.31.2-eks-7f9249a",
                "machineID": digest("machine", node.name)[:32],
                "operatingSystem": "linux",
                "osImage": "Amazon Linux 2023.6.20241121",
                "systemUUID": uid("system", node.name),
            },
        },
    }


# --------------------------------------------------------------------------- GPU utilisation

Profile = Callable[[random.Random, int], float]
"""(the series' random stream, minute) -> DCGM_FI_DEV_GPU_UTIL in percent."""


def busy(level: float) -> Profile:
    return lambda r, _minute: level + r.uniform(-6, 6)


def steady(level: float) -> Profile:
    return lambda r, _minute: level * r.uniform(0.7, 1.3)


def idle(r: random.Random, minute: int) -> float:
    """A notebook left open: a kernel heartbeat blip every 11 minutes, nothing else."""
    return r.choice((1, 2, 3)) if minute % 11 == 3 else 0


def unused(_r: random.Random, _minute: int) -> float:
    return 0


# --------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Workload:
    """A controller and its pods: one pod per entry of `nodes`, bound to that node."""

    namespace: str
    kind: str  # Deployment | Job | IndexedJob | StatefulSet | DaemonSet
    name: str
    nodes: tuple[str, ...]
    image: str
    cpu: str
    memory: str
    gpus: int = 0  # per pod
    util: Profile = unused
    fb_used_mib: int = 0
    age: timedelta = DAY
    scheduler: str = "default-scheduler"
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    affinity: Json = field(default_factory=dict)
    spread: tuple[Json, ...] = ()
    volumes: tuple[tuple[Json, str], ...] = ()  # (volume, mount path)
    priority_class: tuple[str, int] = ("", 0)
    guaranteed: bool = True  # limits equal requests
    container: str = "main"


def on(shape: Shape) -> dict[str, str]:
    return {"nvidia.com/gpu.product": shape.product}


def requires_gpu_product(product: str) -> Json:
    term = {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [product]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def claim(name: str) -> tuple[Json, str]:
    return {"name": "data", "persistentVolumeClaim": {"claimName": name}}, "/data"


def host_path(name: str, path: str) -> tuple[Json, str]:
    return {"hostPath": {"path": path, "type": ""}, "name": name}, path


DSHM = ({"emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}, "name": "dshm"}, "/dev/shm")
PACKED = "gpu-packed-scheduler"
PYTORCH = "nvcr.io/nvidia/pytorch:24.10-py3"
VLLM = "vllm/vllm-openai:v0.6.4.post1"
TRITON = "nvcr.io/nvidia/tritonserver:24.10-py3"
JUPYTER = "kubeflownotebookswg/jupyter-pytorch-cuda-full:v1.9.2"
NODE_CRITICAL = ("system-node-critical", 2_000_001_000)
LLM_SERVE_SPREAD = {
    "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "llm-serve"}},
    "maxSkew": 1,
    "topologyKey": "topology.kubernetes.io/zone",
    "whenUnsatisfiable": "DoNotSchedule",
}

WORKLOADS = [
    # The NVIDIA GPU Operator's device plugin and DCGM exporter on every GPU node.
    Workload(
        "gpu-operator", "DaemonSet", "nvidia-device-plugin-daemonset", GPU_NODES,
        image="nvcr.io/nvidia/k8s-device-plugin:v0.17.0", cpu="50m", memory="64Mi",
        container="nvidia-device-plugin", priority_class=NODE_CRITICAL, guaranteed=False,
        node_selector={"nvidia.com/gpu.deploy.device-plugin": "true"},
        volumes=(host_path("device-plugin", "/var/lib/kubelet/device-plugins"),),
    ),
    Workload(
        "gpu-operator", "DaemonSet", "nvidia-dcgm-exporter", GPU_NODES,
        image="nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-ubuntu22.04", cpu="100m", memory="512Mi",
        container="nvidia-dcgm-exporter", priority_class=NODE_CRITICAL, guaranteed=False,
        node_selector={"nvidia.com/gpu.deploy.dcgm-exporter": "true"},
        volumes=(host_path("pod-gpu-resources", "/var/lib/kubelet/pod-resources"),),
    ),
    # h100-a-1, h100-a-2 (full): a gang, 4-way data-parallel pretraining in a coscheduling PodGroup.
    Workload(
        "training", "IndexedJob", "llm-pretrain-7b", ("h100-a-1", "h100-a-1", "h100-a-2", "h100-a-2"),
        image=PYTORCH, cpu="80", memory="800Gi", gpus=4, util=busy(93), fb_used_mib=74_112,
        age=2 * DAY + 6 * HOUR, scheduler="scheduler-plugins-scheduler", node_selector=on(H100),
        labels={"scheduling.x-k8s.io/pod-group": "llm-pretrain-7b"},
        volumes=(DSHM, claim("pretrain-corpus")),
    ),
    # h100-b-1 (5/8): busy; the natural destination for H100 work.
    Workload(
        "research", "Job", "protein-fold-v3", ("h100-b-1",), image=PYTORCH, cpu="64", memory="512Gi",
        gpus=4, util=busy(88), fb_used_mib=61_440, age=DAY + 3 * HOUR, scheduler=PACKED,
        node_selector=on(H100), volumes=(DSHM,),
    ),
    Workload(
        "inference", "Deployment", "safety-guard", ("h100-b-1",), image=VLLM, cpu="8", memory="64Gi",
        gpus=1, util=steady(35), fb_used_mib=70_656, age=12 * DAY, node_selector=on(H100),
    ),
    # h100-b-2 (2/8): lightly used, but the reranker's PDB (minAvailable 1 of 1) allows no disruption.
    Workload(
        "ml-platform", "Deployment", "reranker", ("h100-b-2",), image=TRITON, cpu="8", memory="64Gi",
        gpus=1, util=steady(9), fb_used_mib=18_944, age=8 * DAY, scheduler=PACKED, node_selector=on(H100),
    ),
    Workload(
        "research", "Job", "ablation-lr-3e-4", ("h100-b-2",), image=PYTORCH, cpu="16", memory="128Gi",
        gpus=1, util=steady(16), fb_used_mib=22_528, age=20 * HOUR, scheduler=PACKED,
        node_selector=on(H100),
    ),
    # a100-a-1 (full): one 8-GPU tensor-parallel inference server.
    Workload(
        "inference", "Deployment", "llama-70b-instruct", ("a100-a-1",), image=VLLM, cpu="80",
        memory="900Gi", gpus=8, util=steady(55), fb_used_mib=76_800, age=16 * DAY, node_selector=on(A100),
        volumes=(DSHM,),
    ),
    # a100-a-2 (1/8): a single low-utilisation batch pod holds a whole 8-GPU node.
    Workload(
        "ml-platform", "Deployment", "batch-embed", ("a100-a-2",), image=TRITON, cpu="8", memory="96Gi",
        gpus=1, util=steady(12), fb_used_mib=15_360, age=5 * DAY, scheduler=PACKED, node_selector=on(A100),
        volumes=(claim("embed-queue"),),
    ),
    # a100-a-3 (full): two idle Kubeflow notebooks (one opted out) next to two busy training jobs.
    Workload(
        "notebooks", "StatefulSet", "alice-llm-playground", ("a100-a-3",), image=JUPYTER, cpu="8",
        memory="64Gi", gpus=1, util=idle, fb_used_mib=14_336, age=3 * DAY + 2 * HOUR,
        node_selector=on(A100), container="alice-llm-playground",
        labels={"notebook-name": "alice-llm-playground"},
        annotations={"notebooks.kubeflow.org/last-activity": ts(NOW - 2 * DAY - 5 * HOUR)},
        volumes=(claim("alice-llm-playground-workspace"),),
    ),
    Workload(
        "notebooks", "StatefulSet", "bob-eval-harness", ("a100-a-3",), image=JUPYTER, cpu="8",
        memory="64Gi", gpus=1, util=idle, fb_used_mib=31_232, age=6 * DAY, node_selector=on(A100),
        container="bob-eval-harness", labels={"notebook-name": "bob-eval-harness"},
        annotations={
            "notebooks.kubeflow.org/last-activity": ts(NOW - 4 * DAY),
            "rebalancer.gpu/evict": "false",
        },
        volumes=(claim("bob-eval-harness-workspace"),),
    ),
    Workload(
        "research", "Job", "bert-large-finetune", ("a100-a-3",), image=PYTORCH, cpu="40", memory="480Gi",
        gpus=4, util=busy(91), fb_used_mib=58_368, age=DAY + 10 * HOUR, scheduler=PACKED,
        node_selector=on(A100), volumes=(DSHM,),
    ),
    Workload(
        "research", "Job", "reward-model-train", ("a100-a-3",), image=PYTORCH, cpu="16", memory="192Gi",
        gpus=2, util=busy(82), fb_used_mib=52_224, age=14 * HOUR, scheduler=PACKED, node_selector=on(A100),
        volumes=(DSHM,),
    ),
    # a100-b-1 (5/8): a pod that requires H100 sits on this A100 node (the node was relabelled after
    # the pod was bound: IgnoredDuringExecution).
    Workload(
        "research", "Job", "vision-finetune", ("a100-b-1",), image=PYTORCH, cpu="10", memory="120Gi",
        gpus=1, util=steady(60), fb_used_mib=40_960, age=2 * DAY, scheduler=PACKED,
        affinity=requires_gpu_product(H100.product),
    ),
    Workload(
        "research", "Job", "diffusion-xl-train", ("a100-b-1",), image=PYTORCH, cpu="40", memory="480Gi",
        gpus=4, util=busy(85), fb_used_mib=66_560, age=3 * DAY, scheduler=PACKED, node_selector=on(A100),
        volumes=(DSHM,),
    ),
    # a100-b-2 (2/8): two low-utilisation pods hold a whole 8-GPU node.
    Workload(
        "ml-platform", "Deployment", "feature-extract", ("a100-b-2",), image=TRITON, cpu="8",
        memory="96Gi", gpus=1, util=steady(18), fb_used_mib=9_216, age=4 * DAY, scheduler=PACKED,
        node_selector=on(A100),
    ),
    Workload(
        "research", "Job", "hparam-sweep-t17", ("a100-b-2",), image=PYTORCH, cpu="10", memory="96Gi",
        gpus=1, util=steady(22), fb_used_mib=27_648, age=7 * HOUR, scheduler=PACKED, node_selector=on(A100),
    ),
    # L4 (each 3/4): 4 replicas spread over zones with maxSkew 1, yet 3 sit in zone a and 1 in zone b
    # (zone b had no free L4 while it rolled out). GPU 3 of l4-a-1 holds leaked VRAM (see LEAKED).
    Workload(
        "inference", "Deployment", "llm-serve", ("l4-a-1", "l4-a-1", "l4-a-1", "l4-b-1"), image=VLLM,
        cpu="10", memory="40Gi", gpus=1, util=steady(55), fb_used_mib=20_992, age=6 * DAY,
        node_selector=on(L4), spread=(LLM_SERVE_SPREAD,),
    ),
    Workload(
        "inference", "Deployment", "embed-serve", ("l4-b-1", "l4-b-1"), image=TRITON, cpu="8",
        memory="32Gi", gpus=1, util=steady(30), fb_used_mib=6_144, age=9 * DAY, node_selector=on(L4),
    ),
    Workload(
        "inference", "Deployment", "asr-whisper", ("l4-b-2", "l4-b-2", "l4-b-2"), image=TRITON, cpu="8",
        memory="32Gi", gpus=1, util=steady(33), fb_used_mib=10_240, age=5 * DAY, node_selector=on(L4),
    ),
    # cpu-a-1: cluster services.
    Workload(
        "kube-system", "Deployment", "coredns", ("cpu-a-1", "cpu-a-1"),
        image="602401143452.dkr.ecr.us-east-1.amazonaws.com/eks/coredns:v1.11.3-eksbuild.2",
        cpu="100m", memory="70Mi", age=45 * DAY, guaranteed=False, labels={"k8s-app": "kube-dns"},
        priority_class=("system-cluster-critical", 2_000_000_000),
    ),
    Workload(
        "monitoring", "StatefulSet", "prometheus-k8s", ("cpu-a-1",),
        image="quay.io/prometheus/prometheus:v2.55.1", cpu="2", memory="12Gi", age=30 * DAY,
        container="prometheus", volumes=(claim("prometheus-k8s-db-prometheus-k8s-0"),),
    ),
    Workload(
        "gpu-rebalancer", "Deployment", "gpu-rebalancer", ("cpu-a-1",),
        image="registry.example.com/platform/gpu-rebalancer:0.1.0", cpu="200m", memory="256Mi",
        age=2 * DAY,
    ),
]  # fmt: skip


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


def pods_of(w: Workload) -> list[PodSpec]:
    """The pods a controller creates, named and labelled as Kubernetes does."""
    base_labels = {"app.kubernetes.io/name": w.name} | w.labels
    out: list[PodSpec] = []
    for index, node_name in enumerate(w.nodes):
        node = NODE[node_name]
        labels, annotations = dict(base_labels), dict(w.annotations)
        age, restart = w.age, "Always"
        if w.kind == "Deployment":
            template = suffix(10, w.namespace, w.name, "rs")
            labels["pod-template-hash"] = template
            owner = ("apps/v1", "ReplicaSet", f"{w.name}-{template}")
            name = f"{w.name}-{template}-{suffix(5, w.namespace, w.name, index)}"
        elif w.kind in ("Job", "IndexedJob"):
            controller = uid("owner", w.namespace, "Job", w.name)
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
            name = f"{stem}-{suffix(5, w.namespace, w.name, index)}"
            restart = "Never"
        elif w.kind == "StatefulSet":
            name = f"{w.name}-{index}"
            labels |= {
                "apps.kubernetes.io/pod-index": str(index),
                "controller-revision-hash": f"{w.name}-{suffix(10, w.namespace, w.name, 'rev')}",
                "statefulset.kubernetes.io/pod-name": name,
            }
            owner = ("apps/v1", "StatefulSet", w.name)
        else:  # DaemonSet: created with the node, pinned to it by a metadata.name field affinity
            labels |= {"controller-revision-hash": suffix(10, w.namespace, w.name, "rev")}
            labels["pod-template-generation"] = "3"
            owner = ("apps/v1", "DaemonSet", w.name)
            name = f"{w.name}-{suffix(5, w.namespace, w.name, node.name)}"
            age = node.age - timedelta(minutes=2)
        out.append(PodSpec(w, name, node, owner, labels, annotations, age, restart))
    return out


def pin_to(node: str) -> Json:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


NOT_READY_TOLERATIONS: list[Json] = [
    {"effect": "NoExecute", "key": key, "operator": "Exists", "tolerationSeconds": 300}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
]
GPU_TOLERATION: Json = {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def pod_json(pod: PodSpec, ip: str) -> Json:
    w = pod.workload
    created = NOW - pod.age
    r = rng("pod", w.namespace, pod.name)
    started = created + timedelta(seconds=1 + r.randrange(3))
    running = started + timedelta(seconds=8 + r.randrange(90))
    ready = running + timedelta(seconds=5)
    kind = pod.owner[1]

    requests = {"cpu": w.cpu, "memory": w.memory} | ({"nvidia.com/gpu": str(w.gpus)} if w.gpus else {})
    limits = requests if w.guaranteed else {"memory": w.memory}
    token = f"kube-api-access-{suffix(5, w.namespace, pod.name, 'token')}"
    projected = [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": "kube-root-ca.crt"}},
        {"downwardAPI": {"items": [{"fieldRef": {"fieldPath": "metadata.namespace"}, "path": "namespace"}]}},
    ]
    volumes = [volume for volume, _ in w.volumes]
    volumes.append({"name": token, "projected": {"defaultMode": 420, "sources": projected}})
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
    affinity = pin_to(pod.node.name) if kind == "DaemonSet" else w.affinity
    optional = {
        "affinity": affinity,
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
                "uid": uid("owner", w.namespace, kind, pod.owner[2]),
            }
        ],
        "resourceVersion": str(870_000_000 + r.randrange(20_000_000)),
        "uid": uid("pod", w.namespace, pod.name),
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
                "containerID": f"containerd://{digest('container', w.namespace, pod.name)}",
                "image": w.image,
                "imageID": f"{image_name}@sha256:{digest('image', w.image)}",
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


# --------------------------------------------------------------------------- PDBs


def pdb_json(namespace: str, name: str, budget: Json, *, healthy: int, desired: int, age: timedelta) -> Json:
    allowed = max(0, healthy - desired)
    created = NOW - age
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
            "resourceVersion": str(860_000_000 + rng("pdb", name).randrange(10_000_000)),
            "uid": uid("pdb", namespace, name),
        },
        "spec": budget | {"selector": {"matchLabels": {"app.kubernetes.io/name": name}}},
        "status": {
            "conditions": [condition],
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "disruptionsAllowed": allowed,
            "expectedPods": healthy,
            "observedGeneration": 1,
        },
    }


PDBS = [
    pdb_json("inference", "llm-serve", {"maxUnavailable": 1}, healthy=4, desired=3, age=6 * DAY),
    pdb_json("kube-system", "coredns", {"maxUnavailable": 1}, healthy=2, desired=1, age=45 * DAY),
    pdb_json("ml-platform", "reranker", {"minAvailable": 1}, healthy=1, desired=1, age=8 * DAY),
]


# --------------------------------------------------------------------------- DCGM telemetry

# A vLLM replica on l4-a-1 was OOM-killed; its CUDA context outlived it on GPU 3 (MiB held).
LEAKED = {("l4-a-1", 3): 20_480}
METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
}


@dataclass(frozen=True)
class Gpu:
    node: NodeSpec
    index: int
    pod: PodSpec | None  # the pod the device plugin gave this GPU to

    @property
    def uuid(self) -> str:
        return "GPU-" + str(uuid.UUID(digest("gpu", self.node.name, self.index)[:32]))

    @property
    def labels(self) -> str:
        """dcgm-exporter's labels (4.6+ style: lowercase `hostname`), pod labels when attached."""
        labels = {
            "gpu": str(self.index),
            "UUID": self.uuid,
            "pci_bus_id": f"00000000:{0x10 * (self.index + 1):02X}:00.0",
            "device": f"nvidia{self.index}",
            "modelName": self.node.shape.model_name,
            "hostname": self.node.name,
        }
        if self.pod is not None:
            w = self.pod.workload
            labels |= {"container": w.container, "namespace": w.namespace, "pod": self.pod.name}
        return ",".join(f'{key}="{value}"' for key, value in labels.items())

    def samples(self) -> dict[str, list[int]]:
        r = rng("dcgm", self.uuid)
        w = self.pod.workload if self.pod is not None else None
        profile = w.util if w is not None else unused
        util = [round(min(100.0, max(0.0, profile(r, minute)))) for minute in range(SAMPLES)]
        if w is not None:
            used = [w.fb_used_mib + r.randrange(-256, 257, 64) for _ in range(SAMPLES)]
        else:
            used = [LEAKED.get((self.node.name, self.index), 0)] * SAMPLES
        usable = self.node.shape.fb_total_mib - self.node.shape.fb_reserved_mib
        return {
            "DCGM_FI_DEV_GPU_UTIL": util,
            "DCGM_FI_DEV_FB_FREE": [usable - mib for mib in used],
            "DCGM_FI_DEV_FB_USED": used,
        }


def gpus(pods: list[PodSpec]) -> list[Gpu]:
    """Every GPU of every node, handed out to the node's GPU pods in order."""
    out: list[Gpu] = []
    for node in NODES:
        holders = [pod for pod in pods if pod.node is node for _ in range(pod.workload.gpus)]
        out += [Gpu(node, i, holders[i] if i < len(holders) else None) for i in range(node.shape.gpus)]
    return out


def openmetrics(devices: list[Gpu]) -> str:
    newest = int(NOW.timestamp()) - LAST_SAMPLE_AGE
    times = [newest - STEP * (SAMPLES - 1 - k) for k in range(SAMPLES)]
    samples = {gpu.uuid: gpu.samples() for gpu in devices}
    lines: list[str] = []
    for metric, help_text in METRICS.items():
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for gpu in devices:
            values = samples[gpu.uuid][metric]
            lines += [f"{metric}{{{gpu.labels}}} {value} {t}" for value, t in zip(values, times, strict=True)]
    return "\n".join([*lines, "# EOF"]) + "\n"


# --------------------------------------------------------------------------- checks and output


def quantity(text: str) -> int:
    """CPU in millicores or memory in bytes, for the few forms the tables use."""
    units = {"m": 1, "Mi": 1024**2, "Gi": GIB}
    for unit, size in units.items():
        if text.endswith(unit):
            return int(text.removesuffix(unit)) * size
    return int(text) * 1000


def check(pods: list[PodSpec]) -> None:
    """A picture a real cluster could be in: every pod bound, unique, and no node overcommitted."""
    assert len({(p.workload.namespace, p.name) for p in pods}) == len(pods), "pod names must be unique"
    for node in NODES:
        mine = [p.workload for p in pods if p.node is node]
        assert sum(w.gpus for w in mine) <= node.shape.gpus, node.name
        assert sum(quantity(w.cpu) for w in mine) <= node.allocatable_cpu_milli, node.name
        assert sum(quantity(w.memory) for w in mine) <= node.allocatable_memory, node.name


def demo_policy() -> str:
    """policies/default.yaml with one change: namespace `notebooks` opted in to idle-gpu evictions."""
    text = DEFAULT_POLICY.read_text(encoding="utf-8")
    report_only = "      namespaces: []               # opt-in list for evictions; empty = report only\n"
    opted_in = "      namespaces: [notebooks]      # DEMO: idle notebooks may be evicted\n"
    assert text.count(report_only) == 1, "policies/default.yaml changed: update demo_policy()"
    header = (
        "# Demo policy for examples/demo-cluster: policies/default.yaml with one change, namespace\n"
        "# `notebooks` opted in to idle-gpu evictions. Written by generate.py; edit the default instead.\n"
        "#\n"
    )
    return header + text.replace(report_only, opted_in)


def kube_list(items: list[Json]) -> str:
    document = {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}
    return json.dumps(document, indent=4, sort_keys=True) + "\n"  # as kubectl prints it


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the demo cluster snapshot directory.")
    parser.add_argument("--out", type=Path, default=HERE, help="where to write (default: this directory)")
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)

    pods = [pod for workload in WORKLOADS for pod in pods_of(workload)]
    check(pods)
    items: list[Json] = []
    on_node: dict[str, int] = {}
    for pod in sorted(pods, key=lambda p: (p.workload.namespace, p.name)):
        on_node[pod.node.name] = on_node.get(pod.node.name, 0) + 1
        subnet = pod.node.ip.rsplit(".", 1)[0]
        host_network = pod.owner[1] == "DaemonSet"
        ip = pod.node.ip if host_network else f"{subnet}.{100 + on_node[pod.node.name]}"
        items.append(pod_json(pod, ip))

    files = {
        "nodes.json": kube_list([node_json(node) for node in NODES]),
        "pods.json": kube_list(items),
        "pdbs.json": kube_list(PDBS),
        "dcgm.om": openmetrics(gpus(pods)),
        "snapshot.yaml": f"# The instant this snapshot shows.\nnow: {ts(NOW)}\n",
        "policy.yaml": demo_policy(),
    }
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
