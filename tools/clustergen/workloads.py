"""Workloads: a controller and where its pods run, with the utilisation profile its GPUs show.

Owns the `Workload` row of a generated cluster's table, the utilisation profiles, and the pieces of pod
templates the tables share (node selectors and affinities, volumes, images, schedulers, priority
classes, the GPU Operator's DaemonSets).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from tools.clustergen.common import DAY, Json
from tools.clustergen.nodes import PRODUCT_LABEL, Shape

# --------------------------------------------------------------------------- GPU utilisation

Profile = Callable[[random.Random, int], float]
"""(the series' random stream, sample number) -> DCGM_FI_DEV_GPU_UTIL in percent. At a 60 s step the
sample number is the minute."""


def busy(level: float) -> Profile:
    """Saturating work: `level` +- 6 points."""
    return lambda r, _sample: level + r.uniform(-6, 6)


def steady(level: float) -> Profile:
    """Serving or light training: `level` +- 30 %."""
    return lambda r, _sample: level * r.uniform(0.7, 1.3)


def idle(r: random.Random, sample: int) -> float:
    """A notebook left open: a kernel heartbeat blip every 11th sample, nothing else."""
    return r.choice((1, 2, 3)) if sample % 11 == 3 else 0


def unused(_r: random.Random, _sample: int) -> float:
    return 0


# --------------------------------------------------------------------------- workloads

KINDS = ("Deployment", "Job", "IndexedJob", "StatefulSet", "DaemonSet")


@dataclass(frozen=True)
class Workload:
    """A controller and its pods: one pod per entry of `nodes` (node names), bound to that node.

    `gpus` is per pod: whole GPUs (`nvidia.com/gpu`), or with `shared` replicas of a time-sliced GPU
    (`nvidia.com/gpu.shared`). `fb_used_mib` is the framebuffer each pod's GPUs show in use.
    `annotations` are the pods', `controller_annotations` the controller object's (a Deployment's, not
    its ReplicaSet's).
    """

    namespace: str
    kind: str  # one of KINDS
    name: str
    nodes: tuple[str, ...]
    image: str
    cpu: str
    memory: str
    gpus: int = 0
    shared: bool = False
    util: Profile = unused
    fb_used_mib: int = 0
    age: timedelta = DAY
    scheduler: str = "default-scheduler"
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    controller_annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    affinity: Json = field(default_factory=dict)
    spread: tuple[Json, ...] = ()
    volumes: tuple[tuple[Json, str], ...] = ()  # (volume, mount path)
    priority_class: tuple[str, int] = ("", 0)
    guaranteed: bool = True  # limits equal requests
    container: str = "main"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.namespace}/{self.name}: unknown kind {self.kind!r}")

    @property
    def gpu_resource(self) -> str:
        return "nvidia.com/gpu.shared" if self.shared else "nvidia.com/gpu"


# --------------------------------------------------------------------------- pod template pieces


def on(shape: Shape) -> dict[str, str]:
    """A node selector for the shape's GPU model."""
    return {PRODUCT_LABEL: shape.product}


def _required(term: Json) -> Json:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def requires_gpu_product(product: str) -> Json:
    """A required node affinity for a GPU model (IgnoredDuringExecution: a relabelled node keeps the pod)."""
    return _required({"matchExpressions": [{"key": PRODUCT_LABEL, "operator": "In", "values": [product]}]})


def pin_to(node: str) -> Json:
    """The affinity the DaemonSet controller gives each pod: its node, by a metadata.name field."""
    return _required({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]})


def zone_spread(app: str) -> Json:
    """A topology spread over zones of the pods labelled `app.kubernetes.io/name: app`, maxSkew 1."""
    return {
        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": app}},
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
    }


def claim(name: str) -> tuple[Json, str]:
    return {"name": "data", "persistentVolumeClaim": {"claimName": name}}, "/data"


def host_path(name: str, path: str) -> tuple[Json, str]:
    return {"hostPath": {"path": path, "type": ""}, "name": name}, path


DSHM: tuple[Json, str] = ({"emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}, "name": "dshm"}, "/dev/shm")

PACKED = "gpu-packed-scheduler"
GANG_SCHEDULER = "scheduler-plugins-scheduler"
GANG_LABEL = "scheduling.x-k8s.io/pod-group"  # coscheduling: the PodGroup a gang's pods belong to
PYTORCH = "nvcr.io/nvidia/pytorch:24.10-py3"
VLLM = "vllm/vllm-openai:v0.6.4.post1"
TRITON = "nvcr.io/nvidia/tritonserver:24.10-py3"
JUPYTER = "kubeflownotebookswg/jupyter-pytorch-cuda-full:v1.9.2"
DEVICE_PLUGIN = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"
NODE_CRITICAL = ("system-node-critical", 2_000_001_000)
CLUSTER_CRITICAL = ("system-cluster-critical", 2_000_000_000)


def gpu_operator(nodes: Sequence[str]) -> list[Workload]:
    """The NVIDIA GPU Operator's device plugin and DCGM exporter DaemonSets, on `nodes`."""
    return [
        Workload(
            "gpu-operator", "DaemonSet", "nvidia-device-plugin-daemonset", tuple(nodes),
            image=DEVICE_PLUGIN, cpu="50m", memory="64Mi",
            container="nvidia-device-plugin", priority_class=NODE_CRITICAL, guaranteed=False,
            node_selector={"nvidia.com/gpu.deploy.device-plugin": "true"},
            volumes=(host_path("device-plugin", "/var/lib/kubelet/device-plugins"),),
        ),
        Workload(
            "gpu-operator", "DaemonSet", "nvidia-dcgm-exporter", tuple(nodes),
            image="nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-ubuntu22.04", cpu="100m", memory="512Mi",
            container="nvidia-dcgm-exporter", priority_class=NODE_CRITICAL, guaranteed=False,
            node_selector={"nvidia.com/gpu.deploy.dcgm-exporter": "true"},
            volumes=(host_path("pod-gpu-resources", "/var/lib/kubelet/pod-resources"),),
        ),
    ]  # fmt: skip
