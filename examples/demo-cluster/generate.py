#!/usr/bin/env python3
"""Write the demo cluster snapshot directory: nodes, pods, PDBs, workloads, DCGM history, `now`, policy.

The output is what `kubectl get nodes,pods,pdb -A -o json`, `kubectl get rs,deploy,sts,jobs -A -o json`
and a Prometheus OpenMetrics export give (DESIGN §4): `nodes.json`, `pods.json`, `pdbs.json`,
`workloads.json` (the Deployments, ReplicaSets, StatefulSets and Jobs behind the pods; each a `List`),
`dcgm.om` (dcgm-exporter series at 60 s resolution over the last two hours, timestamps in seconds),
`snapshot.yaml` (`now`) and `policy.yaml` (policies/default.yaml with idle workloads in namespace
`notebooks` reclaimed).

This script owns only the story: the NODES and WORKLOADS tables, the PDBs, the leaked VRAM and the demo
policy. Turning tables into Kubernetes objects and DCGM series is tools/clustergen's, shared with the
scale benchmark. Everything derives from the tables with seeded randomness, so running the script again
rewrites the files byte for byte. Standard library only. See README.md for the story.

    python examples/demo-cluster/generate.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from tools.clustergen import (  # noqa: E402
    A100,
    CLUSTER_CRITICAL,
    DAY,
    DSHM,
    GANG_LABEL,
    GANG_SCHEDULER,
    H100,
    HOUR,
    JUPYTER,
    PACKED,
    PYTORCH,
    TRITON,
    VLLM,
    Ids,
    NodeSpec,
    Shape,
    Workload,
    all_controllers,
    assign_ips,
    busy,
    check,
    claim,
    gpu_operator,
    gpus,
    idle,
    node_json,
    on,
    pdb_json,
    pod_json,
    pods_of,
    requires_gpu_product,
    steady,
    ts,
    write_list,
    write_openmetrics,
    zone_spread,
)

DEFAULT_POLICY = ROOT / "policies" / "default.yaml"

IDS = Ids("demo-cluster")
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
SAMPLES = 120  # DCGM samples per series: two hours ...
STEP = 60  # ... one a minute ...
LAST_SAMPLE_AGE = 15  # ... the newest scraped 15 s before `now`
ZONES = {"a": "us-east-1a", "b": "us-east-1b"}
# rebalancer.workloads.IDLE_SINCE (this script is standard library only): when a workload's owner was
# first told its GPUs are idle.
IDLE_SINCE = "rebalancer.gpu/idle-since"

# --------------------------------------------------------------------------- nodes

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


def _nodes(*rows: tuple[str, Shape, str, timedelta]) -> list[NodeSpec]:
    """Rows of (name, shape, zone key, age); the n-th node's address is 10.0.(16 * zone + n).(20 + 7n)."""
    return [
        NodeSpec(name, shape, ZONES[zone], age, ip=f"10.0.{16 * list(ZONES).index(zone) + n}.{20 + 7 * n}")
        for n, (name, shape, zone, age) in enumerate(rows)
    ]


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

# --------------------------------------------------------------------------- workloads

LLM_SERVE_SPREAD = zone_spread("llm-serve")

WORKLOADS = [
    # The NVIDIA GPU Operator's device plugin and DCGM exporter on every GPU node.
    *gpu_operator(GPU_NODES),
    # h100-a-1, h100-a-2 (full): a gang, 4-way data-parallel pretraining in a coscheduling PodGroup.
    Workload(
        "training", "IndexedJob", "llm-pretrain-7b", ("h100-a-1", "h100-a-1", "h100-a-2", "h100-a-2"),
        image=PYTORCH, cpu="80", memory="800Gi", gpus=4, util=busy(93), fb_used_mib=74_112,
        age=2 * DAY + 6 * HOUR, scheduler=GANG_SCHEDULER, node_selector=on(H100),
        labels={GANG_LABEL: "llm-pretrain-7b"},
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
        # Its owner was told five hours ago that its GPU sits idle.
        controller_annotations={IDLE_SINCE: ts(NOW - 5 * HOUR)},
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
        priority_class=CLUSTER_CRITICAL,
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

# --------------------------------------------------------------------------- PDBs and DCGM telemetry

PDBS = [
    pdb_json("inference", "llm-serve", {"maxUnavailable": 1}, IDS, NOW, healthy=4, desired=3, age=6 * DAY),
    pdb_json("kube-system", "coredns", {"maxUnavailable": 1}, IDS, NOW, healthy=2, desired=1, age=45 * DAY),
    pdb_json("ml-platform", "reranker", {"minAvailable": 1}, IDS, NOW, healthy=1, desired=1, age=8 * DAY),
]

# A vLLM replica on l4-a-1 was OOM-killed; its CUDA context outlived it on GPU 3 (MiB held).
LEAKED = {("l4-a-1", 3): 20_480}


# --------------------------------------------------------------------------- output


def demo_policy() -> str:
    """policies/default.yaml with one change: idle workloads in namespace `notebooks` reclaimed."""
    text = DEFAULT_POLICY.read_text(encoding="utf-8")
    report_only = "      actions: []\n"
    reclaim = "      actions: [{action: reclaim, namespaces: [notebooks], grace: 4h}]  # DEMO\n"
    assert text.count(report_only) == 1, "policies/default.yaml changed: update demo_policy()"
    header = (
        "# Demo policy for examples/demo-cluster: policies/default.yaml with one change, idle workloads\n"
        "# in namespace `notebooks` reclaimed. Written by generate.py; edit the default instead.\n"
        "#\n"
    )
    return header + text.replace(report_only, reclaim)


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the demo cluster snapshot directory.")
    parser.add_argument("--out", type=Path, default=HERE, help="where to write (default: this directory)")
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)

    taken: set[tuple[str, str]] = set()
    pods = [pod for workload in WORKLOADS for pod in pods_of(workload, NODE, IDS, taken)]
    check(NODES, pods)
    write_list(out / "nodes.json", (node_json(node, IDS, NOW) for node in NODES))
    write_list(out / "pods.json", (pod_json(pod, ip, IDS, NOW) for pod, ip in assign_ips(pods)))
    write_list(out / "pdbs.json", PDBS)
    write_list(out / "workloads.json", all_controllers(WORKLOADS, IDS, NOW))
    devices = gpus(NODES, pods, IDS)
    write_openmetrics(
        out / "dcgm.om", devices, NOW, SAMPLES, STEP, last_sample_age=LAST_SAMPLE_AGE, leaked=LEAKED
    )
    (out / "snapshot.yaml").write_text(
        f"# The instant this snapshot shows.\nnow: {ts(NOW)}\n", encoding="utf-8"
    )
    (out / "policy.yaml").write_text(demo_policy(), encoding="utf-8")


if __name__ == "__main__":
    main()
