"""GPU devices and their DCGM history: which pods hold which GPU, and dcgm-exporter's series in OpenMetrics.

Owns the device plugin's hand-out of GPUs to pods (whole GPUs in order, time-sliced replicas packed),
the labels dcgm-exporter 4.6+ puts on a series, the samples each series shows, and the streaming
OpenMetrics writer (timestamps in seconds, `# EOF`).
"""

from __future__ import annotations

import uuid
from array import array
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tools.clustergen.common import Ids
from tools.clustergen.nodes import NodeSpec
from tools.clustergen.pods import PodSpec
from tools.clustergen.workloads import unused

METRICS = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
)

Leaked = Mapping[tuple[str, int], int]
"""(node name, GPU index) -> MiB of framebuffer a GPU no pod holds still shows in use (a CUDA context
that outlived its process)."""


@dataclass(frozen=True)
class SeriesValues:
    """One dcgm-exporter series (a GPU, or a GPU and one of the pods sharing it): labels and samples."""

    labels: str  # `key="value",...` in dcgm-exporter's order
    util: array[int]
    fb_free: array[int]
    fb_used: array[int]


@dataclass(frozen=True)
class Gpu:
    """One GPU of a node and the pods the device plugin gave it to (several when time-sliced)."""

    node: NodeSpec
    index: int
    holders: tuple[PodSpec, ...]
    ids: Ids

    @property
    def uuid(self) -> str:
        return "GPU-" + str(uuid.UUID(self.ids.digest("gpu", self.node.name, self.index)[:32]))

    def labels(self) -> list[str]:
        """dcgm-exporter's labels (4.6+ style: lowercase `hostname`), one set per series: the GPU's own
        when no pod holds it, else one per holder with its container, namespace and pod."""
        shape = self.node.shape
        base = (
            f'gpu="{self.index}",UUID="{self.uuid}",pci_bus_id="00000000:{0x10 * (self.index + 1):02X}:00.0",'
            f'device="nvidia{self.index}",modelName="{shape.model_name}",hostname="{self.node.name}"'
        )
        if not self.holders:
            return [base]
        return [
            f'{base},container="{p.workload.container}",namespace="{p.workload.namespace}",pod="{p.name}"'
            for p in self.holders
        ]

    def series(self, samples: int, leaked: Leaked) -> list[SeriesValues]:
        """`samples` values of each metric per series, from the GPU's own random stream: per holder in
        order, the utilisation its workload's profile gives, then its framebuffer (split evenly between
        the holders of a shared GPU) +- jitter; a GPU without a holder shows 0 % and what `leaked` says."""
        r = self.ids.rng("dcgm", self.uuid)
        usable = self.node.shape.fb_usable_mib
        out: list[SeriesValues] = []
        for holder, labels in zip(self.holders or (None,), self.labels(), strict=True):
            w = holder.workload if holder is not None else None
            profile = w.util if w is not None else unused
            util = array("i", (round(min(100.0, max(0.0, profile(r, k)))) for k in range(samples)))
            if w is not None:
                fb = w.fb_used_mib // len(self.holders)
                used = array("i", (max(0, fb + r.randrange(-256, 257, 64)) for _ in range(samples)))
            else:
                used = array("i", [leaked.get((self.node.name, self.index), 0)] * samples)
            out.append(SeriesValues(labels, util, array("i", (usable - mib for mib in used)), used))
        return out


def gpus(nodes: Iterable[NodeSpec], pods: Iterable[PodSpec], ids: Ids) -> list[Gpu]:
    """Every GPU of every node, in node order, handed out to the node's GPU pods in pod order.

    A pod of whole GPUs takes the node's first GPUs no pod holds yet; a pod of time-sliced replicas
    goes to the fullest GPU that still has room for all of them (any GPU if none has)."""
    by_node: dict[str, list[PodSpec]] = defaultdict(list)
    for pod in pods:
        if pod.workload.gpus:
            by_node[pod.node.name].append(pod)
    out: list[Gpu] = []
    for node in nodes:
        count = node.shape.gpus
        holders: list[list[PodSpec]] = [[] for _ in range(count)]
        free = [node.replicas] * count
        for pod in by_node.get(node.name, ()):
            need = pod.workload.gpus
            if pod.workload.shared:
                room = [i for i in range(count) if free[i] >= need] or list(range(count))
                chosen = [min(room, key=lambda i: (free[i], i))]
            else:
                chosen = [i for i in range(count) if not holders[i]][:need]
            for i in chosen:
                free[i] = max(0, free[i] - need) if pod.workload.shared else 0
                holders[i].append(pod)
        out += [Gpu(node, i, tuple(holders[i]), ids) for i in range(count)]
    return out


def write_openmetrics(
    path: Path,
    devices: Sequence[Gpu],
    now: datetime,
    samples: int,
    step: int,
    *,
    last_sample_age: int = 15,
    leaked: Leaked | None = None,
) -> int:
    """Write every device's series, `samples` of each `step` seconds apart, the newest `last_sample_age`
    seconds before `now`, metric by metric (HELP and TYPE first, `# EOF` last); return the samples
    written."""
    newest = int(now.timestamp()) - last_sample_age
    times = [str(newest - step * (samples - 1 - k)) for k in range(samples)]
    leaked = leaked or {}
    series = [one for gpu in devices for one in gpu.series(samples, leaked)]
    written = 0
    with path.open("w", encoding="utf-8") as out:
        for number, (metric, help_text) in enumerate(METRICS):
            out.write(f"# HELP {metric} {help_text}\n# TYPE {metric} gauge\n")
            for one in series:
                values = (one.util, one.fb_free, one.fb_used)[number]
                head = f"{metric}{{{one.labels}}} "
                out.write("".join(f"{head}{v} {t}\n" for v, t in zip(values, times, strict=True)))
                written += len(times)
        out.write("# EOF\n")
    return written
