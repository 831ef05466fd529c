"""The scale benchmark's synthetic cluster: its population, and the snapshot directory it is written as.

This module owns the population (how many nodes of each GPU model, how full, which workloads of which
shapes, where they land: `population`) and the writing of it as a snapshot directory (DESIGN §4) through
tools/clustergen, the generator the demo cluster uses too (`generate`). bench/scale.py times what it
writes; bench/startup.py, bench/kube_cache.py and bench/scale_live.py use the same clusters.

It must not time anything, and must not import the project (rebalancer) or the live path: what it writes
is the project's input, made by the standard library and tools/clustergen alone, and the benches that
import it for the cluster load nothing more. Its source and tools/clustergen's key the reuse of a written
directory (`generate`): a change here rewrites the snapshots at the next run.

A snapshot directory holds:

- `nodes.json`, `pods.json`, `pdbs.json`: `List`s as `kubectl get -o json` prints them (4-space indent,
  sorted keys, objects shaped like the demo cluster's: metadata, spec, status with conditions);
- `dcgm.om`: dcgm-exporter series (utilisation, framebuffer used and free) for every GPU, one series per
  (GPU, pod) when a GPU is shared, with `history` of samples every `interval` seconds, the newest 15 s
  before `now` (OpenMetrics: timestamps in seconds, `# EOF`);
- `snapshot.yaml`: `now`.

The cluster: 8-GPU nodes of three models (H100, A100 80GB, L40S; part of the L40S pool time-sliced four
ways) over three zones, five DaemonSet pods per node and workloads of realistic shapes: gangs of 8-GPU
and 4-GPU training pods (coscheduling pod groups), single 4- and 2-GPU jobs, inference Deployments of 1-
and 2-GPU replicas (some spread over zones with maxSkew 1, most behind a PodDisruptionBudget, a fifth
of those at their budget), shared-GPU replicas (quarter and half GPUs), idle notebooks, a few serving
Deployments whose pods run on another GPU model than their template requires (the nodes were
relabelled), leaked VRAM on 1 % of the nodes, and a share of lightly used nodes that gpu-consolidation
can drain. Everything derives from the seed: the same arguments write the same bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tools import clustergen
from tools.clustergen import (
    A100,
    DEVICE_PLUGIN,
    DSHM,
    GANG_LABEL,
    GANG_SCHEDULER,
    H100,
    JUPYTER,
    NODE_CRITICAL,
    PACKED,
    PYTORCH,
    TRITON,
    VLLM,
    Ids,
    Json,
    NodeSpec,
    PodSpec,
    Shape,
    Workload,
    busy,
    claim,
    gpu_operator,
    idle,
    on,
    requires_gpu_product,
    steady,
    zone_spread,
)

ROOT = Path(__file__).resolve().parent.parent
GENERATOR = (Path(__file__).resolve(), *sorted((ROOT / "tools" / "clustergen").glob("*.py")))
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
LAST_SAMPLE_AGE = 15  # the newest scrape, seconds before `now`
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
SHARE_REPLICAS = 4  # time-slicing replicas per GPU on the shared L40S pool
DEFAULT_SCHEDULER = "default-scheduler"


# --------------------------------------------------------------------------- the population

L40S = Shape(
    instance_type="g6e.48xlarge",
    cpu=192,
    memory_gib=1536,
    gpus=8,
    product="NVIDIA-L40S",
    model_name="NVIDIA L40S",
    fb_total_mib=46068,
    fb_reserved_mib=523,
    family="ada-lovelace",
    compute="8.9",
    nodepool="gpu-l40s",
)


@dataclass(frozen=True)
class Model:
    """A GPU model of the cluster: its shape, its share of the nodes, what a pod asks per whole GPU."""

    key: str
    shape: Shape
    share: float
    cpu_per_gpu: int  # 8 GPUs' worth fits the node with room for the DaemonSets
    memory_gib_per_gpu: int


MODELS = (
    Model("h100", H100, 0.40, 20, 200),
    Model("a100", A100, 0.35, 10, 120),
    Model("l40s", L40S, 0.25, 20, 160),
)


@dataclass
class Room:
    """A node and the GPUs (time-sliced: GPU replicas) the population may hand out on it."""

    node: NodeSpec
    model: Model
    budget: int
    used: int = 0

    @property
    def shared(self) -> bool:
        return self.node.replicas > 1


def build_nodes(count: int, ids: Ids) -> list[Room]:
    """Nodes of the three models over three zones; 15 % lightly used, 5 % empty, 2 % younger than 1h."""
    r = ids.rng("nodes")
    rooms: list[Room] = []
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
        node = NodeSpec(
            name=f"gpu-{model.key}-{zone[-1]}-{index:05d}",
            shape=model.shape,
            zone=zone,
            age=age,
            ip=f"10.{index // 250 % 250}.{index % 250}.10",
            replicas=SHARE_REPLICAS if shared else 1,
            nodepool=f"gpu-{model.key}-shared" if shared else "",
        )
        rooms.append(Room(node, model, budget))
    return rooms


class Placer:
    """First fit of pods onto nodes of a model and zone, within each node's budget."""

    def __init__(self, rooms: Sequence[Room]) -> None:
        self.open: dict[tuple[str, bool, str], list[Room]] = {}
        for room in rooms:
            if room.budget:
                self.open.setdefault((room.model.key, room.shared, room.node.zone), []).append(room)

    def place(self, model: Model, shared: bool, zone: str, units: int) -> Room | None:
        candidates = self.open.get((model.key, shared, zone), [])
        for position, room in enumerate(candidates):
            if room.budget - room.used >= units:
                room.used += units
                if room.used == room.budget:
                    del candidates[position]
                return room
        return None


@dataclass
class Draft:
    """A workload before it is placed (its `nodes` empty), with what the population decided about it."""

    workload: Workload
    replicas: int
    gang: bool = False  # runs whole or not at all
    skewed: bool = False  # spread, but one replica landed in the wrong zone (its zone was full then)
    pdb: bool = False


def _draft(r: random.Random, number: int, model: Model, kind: str) -> Draft:
    """One workload of a kind: its shape, scheduler, utilisation and safety features."""
    shape = model.shape
    age = timedelta(hours=r.randint(2, 24 * 30))
    packed = PACKED if r.random() < 0.7 else DEFAULT_SCHEDULER

    def whole(namespace: str, controller: str, name: str, gpus: int, **more: Any) -> Workload:
        """A workload of pods holding whole GPUs of the model, with CPU and memory to match."""
        base = Workload(
            namespace, controller, name, (), image=PYTORCH, cpu=str(model.cpu_per_gpu * gpus),
            memory=f"{model.memory_gib_per_gpu * gpus}Gi", gpus=gpus, age=age, scheduler=packed,
            node_selector=on(shape),
        )  # fmt: skip
        return dataclasses.replace(base, **more)

    if kind in ("gang-8", "gang-4"):
        gpus = int(kind[-1])
        name = f"{'pretrain' if gpus == 8 else 'finetune'}-{number:05d}"
        volumes = (DSHM, claim(f"{name}-data")) if gpus == 8 else (DSHM,)
        w = whole(
            "training", "IndexedJob", name, gpus,
            scheduler=PACKED if r.random() < 0.5 else GANG_SCHEDULER,
            util=busy(r.uniform(85, 97) if gpus == 8 else r.uniform(70, 95)),
            fb_used_mib=int(shape.fb_total_mib * (0.9 if gpus == 8 else 0.75)),
            labels={GANG_LABEL: name}, volumes=volumes,
        )  # fmt: skip
        return Draft(w, r.randint(2, 4), gang=True)
    if kind == "job":
        w = whole(
            "research", "Job", f"experiment-{number:05d}", r.choice((2, 4)), util=busy(r.uniform(40, 90)),
            fb_used_mib=int(shape.fb_total_mib * 0.6), volumes=(DSHM,),
        )  # fmt: skip
        return Draft(w, 1)
    if kind == "serve":
        name = f"serve-{number:05d}"
        spread = r.random() < 0.4
        replicas = 3 * r.randint(1, 4) if spread else r.randint(2, 8)
        skewed = spread and r.random() < 0.15
        pdb = r.random() < 0.8
        gpus = 1 if r.random() < 0.85 else 2
        placement: dict[str, Any] = {}
        if r.random() < 0.01:  # the template requires another model: its nodes were relabelled since
            other = next(m for m in MODELS if m is not model)
            placement = {"node_selector": {}, "affinity": requires_gpu_product(other.shape.product)}
        w = whole(
            "inference", "Deployment", name, gpus, image=VLLM, util=steady(r.uniform(15, 60)),
            fb_used_mib=int(shape.fb_total_mib * 0.85), spread=(zone_spread(name),) if spread else (),
            **placement,
        )  # fmt: skip
        return Draft(w, replicas, skewed=skewed, pdb=pdb)
    if kind == "shared":  # a quarter or half of a time-sliced GPU
        w = Workload(
            "ml-platform", "Deployment", f"embed-{number:05d}", (), image=TRITON, cpu="4", memory="24Gi",
            gpus=r.choice((1, 2)), shared=True, util=steady(r.uniform(10, 40)),
            fb_used_mib=shape.fb_total_mib // 5, age=age, scheduler=PACKED, node_selector=on(shape),
        )  # fmt: skip
        return Draft(w, r.randint(2, 8), pdb=r.random() < 0.5)
    # An idle notebook: a kernel heartbeat now and then, nothing else.
    name = f"notebook-{number:05d}"
    w = whole(
        "notebooks", "StatefulSet", name, 1, image=JUPYTER, scheduler=DEFAULT_SCHEDULER, util=idle,
        fb_used_mib=int(shape.fb_total_mib * 0.3), container=name, labels={"notebook-name": name},
        volumes=(claim(f"{name}-workspace"),),
    )  # fmt: skip
    return Draft(w, 1)


# Share of each model's GPU budget per workload kind, largest pods first (they need emptier nodes).
KIND_SHARES = (("gang-8", 0.10), ("gang-4", 0.08), ("job", 0.06), ("serve", 0.66), ("notebook", 0.10))


def build_workloads(rooms: Sequence[Room], ids: Ids) -> list[Draft]:
    """Workloads placed onto the nodes until every model's budget is spent (up to what no longer fits)."""
    r = ids.rng("workloads")
    placer = Placer(rooms)
    drafts: list[Draft] = []
    for model in MODELS:
        for shared in (False, True):
            budget = sum(room.budget for room in rooms if room.model is model and room.shared is shared)
            kinds = (("shared", 1.0),) if shared else KIND_SHARES
            for kind, share in kinds:
                if kind == "gang-8" and model.key == "l40s":
                    continue
                quota = budget * share
                failures = 0
                while quota > 0 and failures < 20:
                    draft = _draft(r, len(drafts), model, kind)
                    units = draft.workload.gpus
                    start = r.randrange(len(ZONES))
                    placed: list[Room] = []
                    for replica in range(draft.replicas):
                        turn = start if draft.skewed and replica == draft.replicas - 1 else start + replica
                        zones = [ZONES[turn % len(ZONES)]] if draft.workload.spread else r.sample(ZONES, 3)
                        room = next(
                            (n for z in zones if (n := placer.place(model, shared, z, units)) is not None),
                            None,
                        )
                        if room is None:
                            break
                        placed.append(room)
                    if draft.gang and len(placed) < draft.replicas:  # a gang runs whole or not at all
                        for room in placed:
                            room.used -= units  # budget handed back; the node stays full in the placer
                        placed = []
                    if not placed:
                        failures += 1
                        continue
                    nodes = tuple(room.node.name for room in placed)
                    draft.workload = dataclasses.replace(draft.workload, nodes=nodes)
                    draft.replicas = len(placed)
                    quota -= units * len(placed)
                    drafts.append(draft)
    return drafts


def daemonsets(nodes: tuple[str, ...]) -> list[Workload]:
    """The five DaemonSets of every node: kube-proxy, the GPU Operator's three, node-exporter."""

    def system(namespace: str, name: str, image: str, cpu: str, memory: str) -> Workload:
        return Workload(
            namespace, "DaemonSet", name, nodes, image=image, cpu=cpu, memory=memory, container=name,
            priority_class=NODE_CRITICAL, guaranteed=False,
        )  # fmt: skip

    return [
        system(
            "kube-system", "kube-proxy", "public.ecr.aws/eks/kube-proxy:v1.31.2-eksbuild.3", "100m", "64Mi"
        ),
        *gpu_operator(nodes),
        system("gpu-operator", "gpu-feature-discovery", DEVICE_PLUGIN, "10m", "64Mi"),
        system("monitoring", "node-exporter", "quay.io/prometheus/node-exporter:v1.8.2", "100m", "128Mi"),
    ]


@dataclass(frozen=True)
class Population:
    """A whole synthetic cluster, ready to write."""

    ids: Ids
    nodes: list[NodeSpec]
    pods: list[PodSpec]
    pdbs: list[Json]
    leaked: dict[tuple[str, int], int]  # (node, GPU index) -> MiB a GPU no pod holds shows in use


def population(node_count: int, seed: int) -> Population:
    """The cluster of `node_count` nodes for `seed`: nodes, their pods (checked), PDBs, leaked VRAM."""
    ids = Ids("bench-scale", seed)
    rooms = build_nodes(node_count, ids)
    nodes = [room.node for room in rooms]
    drafts = build_workloads(rooms, ids)
    by_name = {node.name: node for node in nodes}
    taken: set[tuple[str, str]] = set()
    workloads = [*daemonsets(tuple(by_name)), *(draft.workload for draft in drafts)]
    pods = [pod for w in workloads for pod in clustergen.pods_of(w, by_name, ids, taken)]
    clustergen.check(nodes, pods)
    r = ids.rng("pdbs")
    pdbs: list[Json] = []
    for draft in drafts:
        if not draft.pdb:
            continue
        w, replicas = draft.workload, draft.replicas
        healthy = replicas - 1 if r.random() < 0.2 else replicas  # at its budget: a replica restarting
        pdbs.append(
            clustergen.pdb_json(
                w.namespace, w.name, {"maxUnavailable": 1}, ids, NOW,
                healthy=healthy, desired=replicas - 1, expected=replicas, age=w.age,
            )
        )  # fmt: skip
    r = ids.rng("leaked")  # a crashed process left its CUDA context on the node's last GPU
    leaked = {(node.name, node.shape.gpus - 1): 20_480 for node in nodes if r.random() < 0.01}
    return Population(ids, nodes, pods, pdbs, leaked)


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
    # A directory written by another version of this module or of the generator is rewritten.
    source = hashlib.sha256(b"".join(path.read_bytes() for path in GENERATOR)).hexdigest()[:16]
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

    cluster = population(node_count, seed)
    ids = cluster.ids
    pods = (clustergen.pod_json(pod, ip, ids, NOW) for pod, ip in clustergen.assign_ips(cluster.pods))
    pod_count = clustergen.write_list(out / "pods.json", pods)
    clustergen.write_list(
        out / "nodes.json", (clustergen.node_json(node, ids, NOW) for node in cluster.nodes)
    )
    pdb_count = clustergen.write_list(out / "pdbs.json", cluster.pdbs)
    devices = clustergen.gpus(cluster.nodes, cluster.pods, ids)
    samples = clustergen.write_openmetrics(
        out / "dcgm.om",
        devices,
        NOW,
        history // interval + 1,
        interval,
        last_sample_age=LAST_SAMPLE_AGE,
        leaked=cluster.leaked,
    )
    (out / "snapshot.yaml").write_text(f"now: {clustergen.ts(NOW)}\n", encoding="utf-8")
    names = ("pods.json", "nodes.json", "pdbs.json", "dcgm.om", "snapshot.yaml")
    size = sum((out / name).stat().st_size for name in names)
    counts = {
        "nodes": node_count,
        "pods": pod_count,
        "pdbs": pdb_count,
        "gpus": len(devices),
        "samples": samples,
        "bytes": size,
    }
    stamp.write_text(json.dumps({"params": params, "counts": counts}) + "\n", encoding="utf-8")
    return Generated(path=out, **counts)
