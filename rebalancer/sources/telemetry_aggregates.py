"""The per-window telemetry rows a snapshot may carry: `telemetry-windows.json` (DESIGN §4, additive).

A snapshot's raw DCGM history (`.prom` / `.om`) is millions of samples for a large cluster, and parsing
them is most of what evaluating it costs. `rebalancer snapshot` and `rebalancer aggregate` also write
the rows the cycle's telemetry model holds (one `GpuTelemetry` per GPU series group per window, as
`telemetry.windows.aggregate` computed them from that raw history), with what they were computed for:

- `now`: the evaluation instant (the snapshot's `now`, RFC 3339);
- `windows`: every window length, seconds, each with its rows;
- `telemetry`: the policy's metric and label mapping (preset resolved) they were computed with;
- `gpu_pods`: how many GPU-requesting pods series were attributed against, and a SHA-256 of their
  `namespace/name` keys (a series naming another pod is read as no pod);
- `findings`: the telemetry findings the aggregation gave (bad samples, unusable series).

Owns that file's format: building it from a telemetry result, writing it, reading and validating it
(pydantic, as the policy is: every problem names the file and the field; a file msgspec takes as the
same definition is read by it straight into the model's rows, twice as fast), and saying why a file does
not fit a policy and snapshot (`mismatch`). The files source decides what to do about it: it uses the
rows when they fit, else it reads the raw history, and says so in a `telemetry-aggregates-unused`
finding. This module must not read raw history, aggregate samples, or read the clock.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from rebalancer import rfc3339
from rebalancer.errors import InputError
from rebalancer.finding_kinds import FindingKind
from rebalancer.model import Finding, GpuTelemetry, Pod, Telemetry, TelemetryWindow
from rebalancer.policy import TelemetryConfig, format_loc
from rebalancer.policy.fields import KnownFindingKind
from rebalancer.telemetry.identity import resolve_preset
from rebalancer.wording import clip

__all__ = [
    "AGGREGATES_FILE",
    "FORMAT",
    "Aggregates",
    "aggregates_of",
    "mismatch",
    "read_aggregates",
    "telemetry_mapping",
    "write_aggregates",
]

AGGREGATES_FILE = "telemetry-windows.json"
FORMAT = "gpu-rebalancer/telemetry-windows/v1"
# The fields of the policy's telemetry section that decide what the rows hold.
_MAPPING_FIELDS = frozenset({"utilization", "fb_used", "fb_free", "labels"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _Row(_Strict):
    node: str = Field(min_length=1)
    uuid: str = Field(min_length=1)
    gpu_index: str = ""
    model_name: str = ""
    mig_profile: str | None = None
    mig_instance: str | None = None
    pod_namespace: str | None = None
    pod_name: str | None = None
    util_avg_percent: float | None = Field(default=None, ge=0)
    util_max_percent: float | None = Field(default=None, ge=0)
    util_samples: int = Field(default=0, ge=0)
    fb_used_mib: float | None = Field(default=None, ge=0)
    fb_used_max_mib: float | None = Field(default=None, ge=0)
    fb_free_mib: float | None = Field(default=None, ge=0)
    fb_used_by_unseen_pod: bool = False
    newest_sample: AwareDatetime | None = None


class _Window(_Strict):
    seconds: int = Field(gt=0)
    gpus: list[_Row]


class _Finding(_Strict):
    kind: KnownFindingKind
    node: str | None = None
    gpu: str | None = None
    namespace: str | None = None
    pod: str | None = None
    detail: str = ""
    fb_used_mib: float | None = None
    workload: str | None = None
    gpus: float | None = None


class _Pods(_Strict):
    count: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class _File(_Strict):
    format: Literal["gpu-rebalancer/telemetry-windows/v1"]
    now: AwareDatetime
    windows: list[_Window]
    telemetry: dict[str, Any]
    gpu_pods: _Pods
    findings: list[_Finding] = []


@dataclass(frozen=True)
class Aggregates:
    """What a `telemetry-windows.json` holds, as the model's objects."""

    now: datetime
    windows: Mapping[int, TelemetryWindow]
    telemetry: Mapping[str, Any]
    gpu_pods: tuple[int, str]
    findings: tuple[Finding, ...]

    def telemetry_for(self, windows: Iterable[int]) -> Telemetry:
        """The Telemetry of the given windows (each must be held: see `mismatch`)."""
        return Telemetry(available=True, windows={seconds: self.windows[seconds] for seconds in windows})


def telemetry_mapping(cfg: TelemetryConfig) -> dict[str, Any]:
    """The part of the policy's telemetry section the rows depend on, preset resolved, as JSON."""
    return resolve_preset(cfg).model_dump(mode="json", include=set(_MAPPING_FIELDS))


def _gpu_pods(pods: Iterable[Pod]) -> tuple[int, str]:
    keys = sorted(f"{pod.namespace}/{pod.name}" for pod in pods if pod.uses_gpu)
    return len(keys), hashlib.sha256("\n".join(keys).encode()).hexdigest()


def aggregates_of(
    telemetry: Telemetry,
    findings: Iterable[Finding],
    *,
    now: datetime,
    cfg: TelemetryConfig,
    pods: Iterable[Pod],
) -> Aggregates:
    """The file's content for a telemetry result computed from raw history at `now` with `cfg`."""
    return Aggregates(
        now=now,
        windows=dict(telemetry.windows),
        telemetry=telemetry_mapping(cfg),
        gpu_pods=_gpu_pods(pods),
        findings=tuple(findings),
    )


def mismatch(
    aggregates: Aggregates,
    *,
    now: datetime,
    windows: Iterable[int],
    cfg: TelemetryConfig,
    pods: Iterable[Pod],
) -> str | None:
    """Why these rows are not what the raw history would give this policy and snapshot, or None."""
    if aggregates.now != now:
        return (
            f"computed for now {rfc3339.format_utc(aggregates.now, 'milliseconds')}, the snapshot's now is "
            f"{rfc3339.format_utc(now, 'milliseconds')}"
        )
    missing = sorted(set(windows) - set(aggregates.windows))
    if missing:
        held = ", ".join(f"{s}s" for s in sorted(aggregates.windows)) or "none"
        return f"the policy's windows {', '.join(f'{s}s' for s in missing)} are not held (held: {held})"
    mapping = telemetry_mapping(cfg)
    if dict(aggregates.telemetry) != mapping:
        changed = sorted(
            k
            for k in mapping.keys() | aggregates.telemetry.keys()
            if aggregates.telemetry.get(k) != mapping.get(k)
        )
        return f"computed with another telemetry mapping (telemetry.{', telemetry.'.join(changed)} differ)"
    if aggregates.gpu_pods != _gpu_pods(pods):
        return (
            f"computed against other GPU pods ({aggregates.gpu_pods[0]} then, "
            f"{_gpu_pods(pods)[0]} in the snapshot now)"
        )
    return None


# --------------------------------------------------------------------------- writing


def _stamp(moment: datetime | None) -> str | None:
    return None if moment is None else rfc3339.format_utc(moment, "microseconds")


def _row(gpu: GpuTelemetry) -> dict[str, Any]:
    fields = {
        "node": gpu.node,
        "uuid": gpu.uuid,
        "gpu_index": gpu.gpu_index,
        "model_name": gpu.model_name,
        "mig_profile": gpu.mig_profile,
        "mig_instance": gpu.mig_instance,
        "pod_namespace": gpu.pod_namespace,
        "pod_name": gpu.pod_name,
        "util_avg_percent": gpu.util_avg_percent,
        "util_max_percent": gpu.util_max_percent,
        "util_samples": gpu.util_samples,
        "fb_used_mib": gpu.fb_used_mib,
        "fb_used_max_mib": gpu.fb_used_max_mib,
        "fb_free_mib": gpu.fb_free_mib,
        "newest_sample": _stamp(gpu.newest_sample),
    }
    # Additive: written only when set, so rows without it read as before everywhere.
    if gpu.fb_used_by_unseen_pod:
        fields["fb_used_by_unseen_pod"] = True
    return fields


def _finding(finding: Finding) -> dict[str, Any]:
    fields = {
        "kind": finding.kind,
        "node": finding.node,
        "gpu": finding.gpu,
        "namespace": finding.namespace,
        "pod": finding.pod,
        "detail": finding.detail,
        "fb_used_mib": finding.fb_used_mib,
        "workload": finding.workload,
        "gpus": finding.gpus,
    }
    return {key: value for key, value in fields.items() if value is not None}


def write_aggregates(path: Path, aggregates: Aggregates) -> None:
    """Write the file (one GPU row a line, so that it diffs and greps well). Raises OSError."""
    head = {
        "format": FORMAT,
        "now": rfc3339.format_utc(aggregates.now, "milliseconds"),
        "telemetry": aggregates.telemetry,
        "gpu_pods": {"count": aggregates.gpu_pods[0], "sha256": aggregates.gpu_pods[1]},
        "findings": [_finding(f) for f in aggregates.findings],
    }
    parts = [json.dumps(head, indent=1)[:-2] + ',\n "windows": [']
    for index, seconds in enumerate(sorted(aggregates.windows)):
        rows = ",\n".join(json.dumps(_row(gpu), allow_nan=False) for gpu in aggregates.windows[seconds].gpus)
        parts.append(("," if index else "") + f'\n  {{"seconds": {seconds}, "gpus": [\n{rows}\n  ]}}')
    parts.append("\n ]\n}\n")
    path.write_text("".join(parts), encoding="utf-8")


# --------------------------------------------------------------------------- reading


def _gpu(row: _Row) -> GpuTelemetry:
    fields = dict(row.__dict__)
    if row.newest_sample is not None:
        fields["newest_sample"] = row.newest_sample.astimezone(UTC)
    return GpuTelemetry(**fields)


def read_aggregates(path: Path | str, data: bytes) -> Aggregates:
    """Validate the file's bytes (`path` names it in messages). Raises InputError naming the file and
    each field that is wrong."""
    return _read_fast(data) or _read_validated(path, data)


def _read_validated(path: Path | str, data: bytes) -> Aggregates:
    """The file read by its pydantic definition, which names every problem."""
    try:
        parsed = _File.model_validate_json(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors()[:20]:
            where = format_loc(error["loc"]) if error["loc"] else "(top level)"
            problems.append(f"{path}: {where}: {clip(error['msg'], 200)}")
        raise InputError(problems) from None
    seen: set[int] = set()
    windows: dict[int, TelemetryWindow] = {}
    for index, window in enumerate(parsed.windows):
        if window.seconds in seen:
            raise InputError([f"{path}: windows[{index}].seconds: {window.seconds} appears twice"])
        seen.add(window.seconds)
        gpus = tuple(_gpu(row) for row in window.gpus)
        windows[window.seconds] = TelemetryWindow(window_seconds=window.seconds, gpus=gpus)
    return Aggregates(
        now=parsed.now.astimezone(UTC),
        windows=windows,
        telemetry=parsed.telemetry,
        gpu_pods=(parsed.gpu_pods.count, parsed.gpu_pods.sha256),
        findings=tuple(Finding(**finding.__dict__) for finding in parsed.findings),
    )


# --------------------------------------------------------------------------- reading, fast

# The same file read by msgspec straight into the model's rows, with the same fields, bounds and
# required ones as the pydantic models above, which stay its definition and its messages: a file that
# msgspec refuses, or whose timestamps are not in the UTC form `write_aggregates` writes, is read by them
# instead, and one msgspec takes they take alike (tests hold the two readers to the same verdict and the
# same rows on mutated files). The 84,000 rows of a 5,000-node snapshot: 0.5 s with pydantic, 0.3 s so.
_Utc = Annotated[str, msgspec.Meta(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z\Z")]
_Named = Annotated[str, msgspec.Meta(min_length=1)]
_NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class _FastRow(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A row, its fields in `GpuTelemetry`'s order (a row becomes one from its values as they stand)."""

    node: _Named
    uuid: _Named
    gpu_index: str = ""
    model_name: str = ""
    mig_profile: str | None = None
    mig_instance: str | None = None
    pod_namespace: str | None = None
    pod_name: str | None = None
    util_avg_percent: _NonNegative | None = None
    util_max_percent: _NonNegative | None = None
    util_samples: Annotated[int, msgspec.Meta(ge=0)] = 0
    fb_used_mib: _NonNegative | None = None
    fb_used_max_mib: _NonNegative | None = None
    fb_free_mib: _NonNegative | None = None
    fb_used_by_unseen_pod: bool = False
    newest_sample: _Utc | None = None


# `_read_fast` makes a row's GpuTelemetry from its values by position (as fast as it gets): a field
# added to one and not the other, or moved, is an error on import rather than rows with shifted values.
if _FastRow.__struct_fields__ != GpuTelemetry.__struct_fields__:
    raise TypeError("_FastRow must have GpuTelemetry's fields, in GpuTelemetry's order")


class _FastWindow(msgspec.Struct, forbid_unknown_fields=True):
    seconds: Annotated[int, msgspec.Meta(gt=0)]
    gpus: list[_FastRow]


class _FastFinding(msgspec.Struct, forbid_unknown_fields=True):
    kind: FindingKind
    node: str | None = None
    gpu: str | None = None
    namespace: str | None = None
    pod: str | None = None
    detail: str = ""
    fb_used_mib: float | None = None
    workload: str | None = None
    gpus: float | None = None


class _FastPods(msgspec.Struct, forbid_unknown_fields=True):
    count: Annotated[int, msgspec.Meta(ge=0)]
    sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}\Z")]


class _FastFile(msgspec.Struct, forbid_unknown_fields=True):
    format: Literal["gpu-rebalancer/telemetry-windows/v1"]
    now: _Utc
    windows: list[_FastWindow]
    telemetry: dict[str, Any]
    gpu_pods: _FastPods
    findings: list[_FastFinding] = []


_FAST = msgspec.json.Decoder(_FastFile)


def _read_fast(data: bytes) -> Aggregates | None:
    """The file read by msgspec, or None for the pydantic reader to read (and name what is wrong)."""
    try:
        parsed = _FAST.decode(data)
    except (msgspec.MsgspecError, RecursionError):
        return None
    stamps: dict[str, datetime] = {}  # rows of one scrape share their newest sample
    windows: dict[int, TelemetryWindow] = {}
    try:
        for window in parsed.windows:
            if window.seconds in windows:
                return None
            gpus: list[GpuTelemetry] = []
            for row in window.gpus:
                values = msgspec.structs.astuple(row)
                stamp = values[-1]
                if stamp is not None:
                    moment = stamps.get(stamp)
                    if moment is None:
                        moment = stamps[stamp] = datetime.fromisoformat(stamp)
                    values = (*values[:-1], moment)
                gpus.append(GpuTelemetry(*values))
            windows[window.seconds] = TelemetryWindow(window_seconds=window.seconds, gpus=tuple(gpus))
        now = datetime.fromisoformat(parsed.now)
    except ValueError:  # an impossible date
        return None
    return Aggregates(
        now=now,
        windows=windows,
        telemetry=parsed.telemetry,
        gpu_pods=(parsed.gpu_pods.count, parsed.gpu_pods.sha256),
        findings=tuple(Finding(**msgspec.structs.asdict(finding)) for finding in parsed.findings),
    )
