"""Nodes: instance shapes, the node table's row (`NodeSpec`) and the Node object the API server returns.

Owns what a node advertises (capacity, allocatable, GPU feature discovery and Karpenter labels, the GPU
taint, time-slicing) and the shapes more than one generated cluster uses; a script's own shapes live
in the script.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from string import ascii_lowercase

from tools.clustergen.common import GIB, Ids, Json, ts

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"  # the device plugin's resource when time-slicing renames it
PRODUCT_LABEL = "nvidia.com/gpu.product"


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
    compute: str = ""  # compute capability, "major.minor"
    nodepool: str = "system"

    @property
    def fb_usable_mib(self) -> int:
        return self.fb_total_mib - self.fb_reserved_mib


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


@dataclass(frozen=True)
class NodeSpec:
    """One node: its shape, zone (e.g. `us-east-1a`), age at `now` and InternalIP.

    `replicas` > 1 is time-slicing: the device plugin advertises `gpus * replicas` of
    `nvidia.com/gpu.shared` instead of `nvidia.com/gpu`. `nodepool` overrides the shape's.
    """

    name: str
    shape: Shape
    zone: str
    age: timedelta
    ip: str
    replicas: int = 1
    nodepool: str = ""

    @property
    def gpu_resource(self) -> str:
        return SHARED_GPU_RESOURCE if self.replicas > 1 else GPU_RESOURCE

    @property
    def gpu_units(self) -> int:
        """How many of `gpu_resource` the node advertises."""
        return self.shape.gpus * self.replicas

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


CONDITIONS = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
)


def _gpu_labels(node: NodeSpec) -> dict[str, str]:
    """GPU feature discovery's labels and the GPU Operator's deploy labels."""
    shape = node.shape
    major, minor = shape.compute.split(".")
    return {
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
        PRODUCT_LABEL: shape.product,
        "nvidia.com/gpu.replicas": str(node.replicas),
        "nvidia.com/mig.capable": "true" if shape.family in ("ampere", "hopper") else "false",
    }


def node_json(node: NodeSpec, ids: Ids, now: datetime) -> Json:
    """The Node as `kubectl get node -o json` shows it, Karpenter-managed on EKS."""
    shape = node.shape
    created = now - node.age
    r = ids.rng("node", node.name)
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": shape.instance_type,
        "beta.kubernetes.io/os": "linux",
        "karpenter.sh/capacity-type": "on-demand",
        "karpenter.sh/initialized": "true",
        "karpenter.sh/nodepool": node.nodepool or shape.nodepool,
        "karpenter.sh/registered": "true",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": shape.instance_type,
        "topology.kubernetes.io/region": node.zone.rstrip(ascii_lowercase),
        "topology.kubernetes.io/zone": node.zone,
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
    spec: Json = {"providerID": f"aws:///{node.zone}/i-0{ids.digest(node.name)[:16]}"}
    if shape.gpus:
        labels |= _gpu_labels(node)
        capacity[node.gpu_resource] = allocatable[node.gpu_resource] = str(node.gpu_units)
        spec["taints"] = [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "value": "true"}]
    ready_since = ts(created + timedelta(seconds=40 + r.randrange(30)))
    heartbeat = ts(now - timedelta(seconds=5 + r.randrange(40)))
    dns = f"ip-{node.ip.replace('.', '-')}.ec2.internal"
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
            "uid": ids.uid("node", node.name),
        },
        "spec": spec,
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
                for kind, status, reason, message in CONDITIONS
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": ids.uid("boot", node.name),
                "containerRuntimeVersion": "containerd://1.7.23",
                "kernelVersion": "6.1.115-126.197.amzn2023.x86_64",
                "kubeProxyVersion": "v1.31.2-eks-7f9249a",
                "kubeletVersion": "v1.31.2-eks-7f9249a",
                "machineID": ids.digest("machine", node.name)[:32],
                "operatingSystem": "linux",
                "osImage": "Amazon Linux 2023.6.20241121",
                "systemUUID": ids.uid("system", node.name),
            },
        },
    }
