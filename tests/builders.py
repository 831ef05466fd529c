"""Plain builders for domain objects, so tests say only what matters to them."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from rebalancer.model import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    NO_TELEMETRY,
    Controller,
    GpuRequest,
    GpuTelemetry,
    LabelSelector,
    Node,
    NodeSelectorTerm,
    OwnerRef,
    Pdb,
    Pod,
    PreferredTerm,
    Snapshot,
    Taint,
    Telemetry,
    TelemetryWindow,
    Toleration,
    TopologySpreadConstraint,
    Volume,
)

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"

GIB = 1024**3
REPLICASET_OWNER = OwnerRef(kind="ReplicaSet", name="trainer-abc")

_Frozen = TypeVar("_Frozen")


def replace(obj: _Frozen, **changes: Any) -> _Frozen:
    """A changed copy of a frozen model object: a msgspec Struct's (`Pod`, `GpuTelemetry`...) by
    msgspec.structs.replace, a frozen dataclass's by dataclasses.replace."""
    if isinstance(obj, msgspec.Struct):
        return msgspec.structs.replace(obj, **changes)
    return dataclasses.replace(obj, **changes)  # type: ignore[type-var]


def node(
    name: str,
    *,
    gpus: int = 8,
    model: str | None = A100,
    cpu_milli: int = 96_000,
    memory: int = 512 * GIB,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Iterable[Taint] = (),
    unschedulable: bool = False,
    extra: Mapping[str, int] | None = None,
    zone: str | None = None,
    age: timedelta = timedelta(days=30),
) -> Node:
    all_labels = {"kubernetes.io/hostname": name}
    if model is not None:
        all_labels[GPU_PRODUCT_LABEL] = model
    if zone is not None:
        all_labels["topology.kubernetes.io/zone"] = zone
    all_labels.update(labels or {})
    allocatable = {"cpu": cpu_milli, "memory": memory, "pods": 110}
    if gpus:
        allocatable[GPU_RESOURCE] = gpus
    allocatable.update(extra or {})
    return Node(
        name=name,
        labels=all_labels,
        annotations=dict(annotations or {}),
        allocatable=allocatable,
        taints=tuple(taints),
        unschedulable=unschedulable,
        created=NOW - age,
    )


def pod(
    name: str,
    node_name: str | None = None,
    *,
    namespace: str = "ml",
    gpus: int = 1,
    gpu_milli: int = 1000,
    cpu_milli: int = 4000,
    memory: int = 16 * GIB,
    extra: Mapping[str, int] | None = None,
    owner: OwnerRef | None = REPLICASET_OWNER,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    scheduler_name: str = "gpu-packed-scheduler",
    priority: int = 0,
    priority_class_name: str = "",
    volumes: Iterable[Volume] = (),
    node_selector: Mapping[str, str] | None = None,
    required_affinity: Iterable[NodeSelectorTerm] = (),
    preferred_affinity: Iterable[PreferredTerm] = (),
    tolerations: Iterable[Toleration] = (),
    topology_spread: Iterable[TopologySpreadConstraint] = (),
    gang: str | None = None,
    phase: str = "Running",
    age: timedelta = timedelta(days=1),
    uid: str | None = None,
    terminating_for: timedelta | None = None,
) -> Pod:
    requests = {"cpu": cpu_milli, "memory": memory}
    if gpus and gpu_milli >= 1000:
        requests[GPU_RESOURCE] = gpus
    requests.update(extra or {})
    return Pod(
        namespace=namespace,
        name=name,
        uid=uid or f"uid-{namespace}-{name}",
        node_name=node_name,
        phase=phase,
        scheduler_name=scheduler_name,
        priority=priority,
        priority_class_name=priority_class_name,
        qos_class="Burstable",
        labels=dict(labels or {"app": name}),
        annotations=dict(annotations or {}),
        owner=owner,
        requests=requests,
        gpu=GpuRequest(count=gpus, milli_per_device=gpu_milli) if gpus else GpuRequest(),
        volumes=tuple(volumes),
        node_selector=dict(node_selector or {}),
        required_affinity=tuple(required_affinity),
        preferred_affinity=tuple(preferred_affinity),
        tolerations=tuple(tolerations),
        topology_spread=tuple(topology_spread),
        gang=gang,
        created=NOW - age,
        started=NOW - age,
        deleting_since=NOW - terminating_for if terminating_for is not None else None,
    )


def pdb(name: str, match_labels: Mapping[str, str], allowed: int, namespace: str = "ml") -> Pdb:
    return Pdb(
        namespace=namespace,
        name=name,
        selector=LabelSelector(match_labels=dict(match_labels)),
        disruptions_allowed=allowed,
    )


def gpu_sample(
    node_name: str,
    uuid: str,
    *,
    pod: Pod | None = None,
    util: float | None = 50.0,
    fb_used_mib: float | None = 1000.0,
    samples: int = 30,
    age: timedelta = timedelta(seconds=15),
    model: str = A100,
) -> GpuTelemetry:
    return GpuTelemetry(
        node=node_name,
        uuid=uuid,
        model_name=model,
        pod_namespace=pod.namespace if pod else None,
        pod_name=pod.name if pod else None,
        util_avg_percent=util,
        util_max_percent=util,
        util_samples=samples if util is not None else 0,
        fb_used_mib=fb_used_mib,
        fb_used_max_mib=fb_used_mib,
        newest_sample=NOW - age,
    )


def telemetry(gpus: Iterable[GpuTelemetry], *windows_seconds: int) -> Telemetry:
    rows = tuple(gpus)
    return Telemetry(
        available=True,
        windows={w: TelemetryWindow(window_seconds=w, gpus=rows) for w in (windows_seconds or (1800,))},
    )


def controller(
    kind: str,
    name: str,
    *,
    namespace: str = "ml",
    owner: OwnerRef | None = None,
    annotations: Mapping[str, str] | None = None,
    replicas: int | None = None,
    suspended: bool | None = None,
) -> Controller:
    """A controller object; scalable kinds default to 1 replica, suspendable ones to not suspended."""
    if replicas is None and kind in ("Deployment", "StatefulSet", "ReplicaSet", "LeaderWorkerSet"):
        replicas = 1
    if suspended is None and kind in ("Job", "JobSet"):
        suspended = False
    return Controller(
        namespace=namespace,
        kind=kind,
        name=name,
        uid=f"uid-{namespace}-{kind}-{name}",
        resource_version="1",
        annotations=dict(annotations or {}),
        owner=owner,
        replicas=replicas,
        suspended=suspended,
    )


def snapshot(
    nodes: Iterable[Node],
    pods: Iterable[Pod] = (),
    pdbs: Iterable[Pdb] = (),
    telemetry: Telemetry = NO_TELEMETRY,
    now: datetime = NOW,
    *,
    controllers: Iterable[Controller] = (),
) -> Snapshot:
    return Snapshot(
        now=now,
        nodes={n.name: n for n in nodes},
        pods=tuple(pods),
        pdbs=tuple(pdbs),
        telemetry=telemetry,
        controllers={c.key: c for c in controllers},
    )


def write_snapshot_dir(
    directory: Path, items: list[dict[str, Any]], now: datetime, openmetrics: str | None = None
) -> Path:
    """A snapshot directory: the objects as one `kind: List`, `now`, and DCGM history if given."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cluster.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    (directory / "snapshot.yaml").write_text(f"now: {now.isoformat()}\n")
    if openmetrics is not None:
        (directory / "dcgm.om").write_text(openmetrics)
    return directory
