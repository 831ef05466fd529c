"""Every GPU node of a snapshot as a row of its GPUs, each with the state the HTML report colours.

Owns how one GPU's state is read from a snapshot and the cycle's findings (`cycle_report.GpuState`):
which pods hold it (dcgm-exporter's pod attribution, then the node's remaining GPU pods on its
unattributed GPUs), whether it is idle or leaked (only the idle-gpu and leaked-vram findings say so:
this module sets no threshold of its own) and what its telemetry averaged over the shortest window.
A GPU a pod holds with no telemetry is `unknown`, never idle. It must not do I/O, read the clock or
decide anything: it describes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import count
from operator import itemgetter
from typing import overload

from rebalancer.cycle_report import GpuCell, GpuState, NodeGpus
from rebalancer.digits import is_ascii_digits
from rebalancer.model import Finding, GpuTelemetry, Node, Pod, Snapshot

__all__ = ["IDLE_FINDING", "LEAKED_FINDING", "ZONE_LABEL", "GpuMap", "gpu_map"]

IDLE_FINDING = "idle-gpu"
LEAKED_FINDING = "leaked-vram"
ZONE_LABEL = "topology.kubernetes.io/zone"


def _cell_order(index: str, uuid: str) -> tuple[int, int | str]:
    """GPUs in index order (numbers by value, then other names), those without an index by UUID last."""
    if not index:
        return (2, uuid)
    return (0, int(index)) if is_ascii_digits(index) else (1, index)


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 1) if known else None


def _telemetry_cells(rows: Sequence[GpuTelemetry]) -> list[tuple[str, str, list[GpuTelemetry]]]:
    """(index, uuid, rows) per physical GPU the node's telemetry names, in index order."""
    by_uuid: dict[str, list[GpuTelemetry]] = {}
    for row in rows:
        same = by_uuid.get(row.uuid)
        if same is None:
            by_uuid[row.uuid] = [row]
        else:
            same.append(row)
    cells: list[tuple[str, str, list[GpuTelemetry]]] = []
    for uuid, gpu_rows in by_uuid.items():
        index = ""
        for row in gpu_rows:
            if row.gpu_index:
                index = row.gpu_index
                break
        cells.append((index, uuid, gpu_rows))
    cells.sort(key=lambda cell: _cell_order(cell[0], cell[1]))
    return cells


def _state(pods: Sequence[str], uuid: str | None, util: float | None, flagged: _Flags) -> GpuState:
    if uuid is not None and uuid in flagged.leaked:
        return "leaked"
    if not pods:
        return "free"
    if (uuid is not None and uuid in flagged.idle_gpus) or (
        flagged.idle_pods and any(p in flagged.idle_pods for p in pods)
    ):
        return "idle"
    return "busy" if util is not None else "unknown"


class _Flags:
    """What the findings say of GPUs: which are leaked, which (or whose pods) are idle."""

    def __init__(self, findings: Iterable[Finding]) -> None:
        self.leaked: set[str] = set()
        self.idle_gpus: set[str] = set()
        self.idle_pods: set[str] = set()
        for finding in findings:
            if finding.kind == LEAKED_FINDING and finding.gpu:
                self.leaked.add(finding.gpu)
            elif finding.kind == IDLE_FINDING:
                if finding.gpu:
                    self.idle_gpus.add(finding.gpu)
                if finding.namespace and finding.pod:
                    self.idle_pods.add(f"{finding.namespace}/{finding.pod}")


def _node_gpus(node: Node, pods: Sequence[Pod], rows: Sequence[GpuTelemetry], flags: _Flags) -> NodeGpus:
    cells: list[tuple[str, str | None, list[str], float | None, float | None]] = []
    attributed: set[str] = set()
    if rows:
        active = {pod.ref for pod in pods}
        for index, uuid, gpu_rows in _telemetry_cells(rows):
            if len(gpu_rows) == 1:  # most GPUs: one series, held by at most one pod
                (row,) = gpu_rows
                one = f"{row.pod_namespace}/{row.pod_name}" if row.pod_namespace and row.pod_name else None
                holders = [one] if one is not None and one in active else []
                # As `_mean` of one value (whose sum starts at 0, so -0.0 reads 0.0).
                util = None if row.util_avg_percent is None else round(0.0 + row.util_avg_percent, 1)
                fb = None if row.fb_used_mib is None else round(0.0 + row.fb_used_mib, 1)
            else:
                holders = sorted(
                    {
                        ref
                        for r in gpu_rows
                        if (key := r.pod_key) is not None and (ref := f"{key[0]}/{key[1]}") in active
                    }
                )
                util = _mean(r.util_avg_percent for r in gpu_rows)
                fb = _mean(r.fb_used_mib for r in gpu_rows)
            attributed.update(holders)
            cells.append((index, uuid, holders, util, fb))
    # Positions for GPUs the telemetry names without an index, and for those it does not name at all (no
    # exporter on the node, or fewer GPUs reported than the device plugin advertises).
    gpu_count = node.gpu_count
    if cells:
        taken = {index for index, *_ in cells}
        spare = (str(i) for i in count() if str(i) not in taken)
        cells = [(index or next(spare), uuid, holders, util, fb) for index, uuid, holders, util, fb in cells]
        while len(cells) < gpu_count:
            cells.append((next(spare), None, [], None, None))
    else:  # no telemetry: the positions 0, 1, ... in order
        cells = [(str(i), None, [], None, None) for i in range(gpu_count)]
    # GPU pods the telemetry does not attribute go on the GPUs no pod holds and no finding names.
    for ref, pod in sorted(((pod.ref, pod) for pod in pods), key=itemgetter(0)):
        if pod.gpu.count <= 0 or ref in attributed:
            continue
        left = pod.gpu.count
        for _, held_uuid, holders, _, _ in cells:
            if left == 0:
                break
            if not holders and (held_uuid is None or held_uuid not in flags.leaked):
                holders.append(ref)
                left -= 1
    return NodeGpus(
        node=node.name,
        gpu_model=node.gpu_model,
        zone=node.labels.get(ZONE_LABEL),
        gpus=tuple(
            # Without telemetry nor idle pods, a GPU is free, or held with nothing known of its use.
            _bare_cell(index, "unknown" if holders else "free", tuple(holders))
            if uuid is None and util is None and fb is None and not flags.idle_pods
            else _bare_cell(index, _state(holders, uuid, util, flags), tuple(holders))
            if uuid is None and util is None and fb is None
            else GpuCell(
                index=index,
                state=_state(holders, uuid, util, flags),
                pods=tuple(holders),
                uuid=uuid,
                util_avg_percent=util,
                fb_used_mib=fb,
            )
            for index, uuid, holders, util, fb in cells
        ),
    )


@functools.lru_cache(maxsize=4096)
def _bare_cell(index: str, state: GpuState, pods: tuple[str, ...]) -> GpuCell:
    """A GPU no telemetry names (cells are immutable: one object for equal ones, as a node's cells mostly
    stay the same when one of its pods changes)."""
    return GpuCell(index=index, state=state, pods=pods)


class GpuMap(Sequence[NodeGpus]):
    """The GPU map of one snapshot, drawn when first read, then kept (most cycles' maps are never read:
    only `/report`, `/report.html`, the webhook and `once`'s JSON and HTML show them; the replay and the
    log lines do not, and drawing one is 40,000 cells at 5,000 nodes).

    It holds what drawing reads, not the snapshot: its nodes, the pods on them, the rows of the shortest
    telemetry window by node (a report kept until the next cycle's keeps those, as it kept the drawn
    cells), and what the findings flag; those go once it is drawn. Drawing is a pure function of
    immutable objects: two threads reading it at once both draw the same map, and one of them is kept.
    """

    __slots__ = ("_drawn", "_flags", "_nodes", "_pods", "_rows")

    def __init__(self, snapshot: Snapshot, findings: Iterable[Finding]) -> None:
        telemetry = snapshot.telemetry
        window = (
            telemetry.windows[min(telemetry.windows)] if telemetry.available and telemetry.windows else None
        )
        self._rows: Mapping[str, tuple[GpuTelemetry, ...]] = window.by_node if window is not None else {}
        self._nodes: Mapping[str, Node] = snapshot.nodes
        self._pods: Mapping[str, tuple[Pod, ...]] = snapshot.pods_by_node
        self._flags = _Flags(findings)
        self._drawn: tuple[NodeGpus, ...] | None = None

    def _map(self) -> tuple[NodeGpus, ...]:
        drawn = self._drawn
        if drawn is None:
            nodes, pods, rows, flags = self._nodes, self._pods, self._rows, self._flags
            drawn = tuple(
                _node_gpus(node, pods.get(name, ()), rows.get(name, ()), flags)
                for name, node in sorted(nodes.items())
                if node.gpu_count > 0
            )
            self._drawn = drawn
            self._nodes, self._pods, self._rows = {}, {}, {}
        return drawn

    @overload
    def __getitem__(self, index: int) -> NodeGpus: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[NodeGpus, ...]: ...

    def __getitem__(self, index: int | slice) -> NodeGpus | tuple[NodeGpus, ...]:
        return self._map()[index]

    def __len__(self) -> int:
        return len(self._map())

    def __iter__(self) -> Iterator[NodeGpus]:
        return iter(self._map())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GpuMap | tuple):
            return self._map() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._map())

    def __repr__(self) -> str:
        return f"GpuMap({self._map()!r})"


def gpu_map(snapshot: Snapshot, findings: Iterable[Finding]) -> GpuMap:
    """Every node with whole GPUs, by name, each GPU in index order with its state at the snapshot
    (drawn when first read: `GpuMap`)."""
    return GpuMap(snapshot, findings)
