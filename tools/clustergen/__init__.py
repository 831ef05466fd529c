"""Synthetic GPU clusters as snapshot directories (DESIGN §4): the one generator behind the demo cluster
(examples/demo-cluster/generate.py) and the scale benchmark (bench/scale_population.py).

A script describes its cluster as tables (`NodeSpec` rows, `Workload` rows, PDBs, leaked VRAM) and this
package turns them into what `kubectl get nodes,pods,pdb -A -o json`, `kubectl get rs,deploy,sts,jobs -A
-o json` and a dcgm-exporter OpenMetrics export give, deterministically (`Ids`): the same tables write
the same bytes.

- `common`: `Ids` (seeded streams, uids, digests, name suffixes), `ts`, units, `write_list`;
- `nodes`: `Shape`, the shared shapes, `NodeSpec`, `node_json`;
- `workloads`: utilisation profiles, `Workload`, pod template pieces, the GPU Operator's DaemonSets;
- `pods`: `PodSpec`, `pods_of` (controllers' naming), `assign_ips`, `pod_json`, `pdb_json`, `check`;
- `controllers`: `controllers_of` / `all_controllers`, the Deployments, ReplicaSets, StatefulSets and
  Jobs behind the pods;
- `dcgm`: `Gpu`, `gpus` (the device plugin's hand-out), `write_openmetrics`.

Standard library only, so that the scripts run from a checkout without the project installed.
"""

from tools.clustergen.common import DAY, GIB, HOUR, Ids, Json, ts, write_list
from tools.clustergen.controllers import all_controllers, controllers_of
from tools.clustergen.dcgm import METRICS, Gpu, Leaked, SeriesValues, gpus, write_openmetrics
from tools.clustergen.nodes import (
    A100,
    GPU_RESOURCE,
    H100,
    PRODUCT_LABEL,
    SHARED_GPU_RESOURCE,
    NodeSpec,
    Shape,
    node_json,
)
from tools.clustergen.pods import (
    GPU_TOLERATION,
    NOT_READY_TOLERATIONS,
    PodSpec,
    assign_ips,
    check,
    pdb_json,
    pod_json,
    pods_of,
    quantity,
)
from tools.clustergen.workloads import (
    CLUSTER_CRITICAL,
    DEVICE_PLUGIN,
    DSHM,
    GANG_LABEL,
    GANG_SCHEDULER,
    JUPYTER,
    NODE_CRITICAL,
    PACKED,
    PYTORCH,
    TRITON,
    VLLM,
    Profile,
    Workload,
    busy,
    claim,
    gpu_operator,
    host_path,
    idle,
    on,
    pin_to,
    requires_gpu_product,
    steady,
    unused,
    zone_spread,
)

__all__ = [
    "A100",
    "CLUSTER_CRITICAL",
    "DAY",
    "DEVICE_PLUGIN",
    "DSHM",
    "GANG_LABEL",
    "GANG_SCHEDULER",
    "GIB",
    "GPU_RESOURCE",
    "GPU_TOLERATION",
    "H100",
    "HOUR",
    "JUPYTER",
    "METRICS",
    "NODE_CRITICAL",
    "NOT_READY_TOLERATIONS",
    "PACKED",
    "PRODUCT_LABEL",
    "PYTORCH",
    "SHARED_GPU_RESOURCE",
    "TRITON",
    "VLLM",
    "Gpu",
    "Ids",
    "Json",
    "Leaked",
    "NodeSpec",
    "PodSpec",
    "Profile",
    "SeriesValues",
    "Shape",
    "Workload",
    "all_controllers",
    "assign_ips",
    "busy",
    "check",
    "claim",
    "controllers_of",
    "gpu_operator",
    "gpus",
    "host_path",
    "idle",
    "node_json",
    "on",
    "pdb_json",
    "pin_to",
    "pod_json",
    "pods_of",
    "quantity",
    "requires_gpu_product",
    "steady",
    "ts",
    "unused",
    "write_list",
    "write_openmetrics",
    "zone_spread",
]
