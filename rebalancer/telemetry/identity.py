"""Which GPU, MIG instance and pod a DCGM series is about, and which metrics a policy reads.

Owns the identity of series, shared by the snapshot-directory and the Prometheus sources:

- `identify`: labels -> `SeriesIdentity` (node, GPU UUID and index, model, MIG instance, pod) following
  the policy's `LabelMapping`; `attribute`: a pod label counts only if it names a pod of the cluster that
  requests a GPU (the exporter's own pod does not), or a pod of a namespace the view does not list
  (`PodsOfNamespaces`); `group_key` / `fill_identity`: one row per group;
- `resolve_preset`: the metric names, scales and label names a `telemetry.preset` stands for, filled into
  the fields the policy leaves unset; `telemetry_metrics`: the metric names it reads, by role;
- `is_valid_value`: NaN, infinities, negative values and DCGM's blank sentinels are not data;
- the findings both sources give about series: `bad-telemetry`, `unusable-telemetry`.

It must not do I/O or read the clock.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Literal

from msgspec.structs import replace

from rebalancer.model import Finding, GpuTelemetry, Pod
from rebalancer.policy import LabelMapping, MetricConfig, TelemetryConfig, TelemetryPreset

__all__ = [
    "DCGM_BLANKS",
    "DCGM_INT64_BLANK",
    "PRESETS",
    "GroupKey",
    "PodsOfNamespaces",
    "Role",
    "SeriesIdentity",
    "attribute",
    "bad_telemetry_finding",
    "fill_identity",
    "first_non_empty",
    "format_labels",
    "group_key",
    "identify",
    "is_valid_value",
    "metric_roles",
    "resolve_preset",
    "telemetry_metrics",
    "unusable_finding",
]

# DCGM's "blank" values (no data, not found, not supported, no permission) that the exporter prints
# verbatim: int32 0x7ffffff0..3, fp64 2^47..2^47+3, int64 0x7ffffffffffffff0.. (2^63 once a float).
DCGM_BLANKS = frozenset(float(base + i) for base in (0x7FFFFFF0, 2**47) for i in range(4))
DCGM_INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)


def is_valid_value(value: float) -> bool:
    """False for NaN, infinities, negative values and DCGM's blank / not-supported sentinels."""
    return math.isfinite(value) and value >= 0 and value not in DCGM_BLANKS and value < DCGM_INT64_BLANK


def bad_telemetry_finding(identity: SeriesIdentity, detail: str) -> Finding:
    """The `bad-telemetry` finding for a series whose samples were dropped, naming its GPU and pod."""
    return Finding(
        kind="bad-telemetry",
        node=identity.node,
        gpu=identity.uuid,
        namespace=identity.pod_namespace,
        pod=identity.pod_name,
        detail=detail,
    )


# --------------------------------------------------------------------------- identity


SeriesIdentity = GpuTelemetry
"""Which GPU (or MIG instance) a series is about, and which pod it is attributed to: a row of
`model.Telemetry` before any aggregate is filled in (`telemetry.windows.row` fills them)."""


# (node, GPU UUID, MIG instance, pod namespace, pod name): one GpuTelemetry row per key and window.
GroupKey = tuple[str, str, str | None, str | None, str | None]


def first_non_empty(labels: Mapping[str, str], names: Iterable[str]) -> str | None:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return None


def _first_present(labels: Mapping[str, str], names: Iterable[str]) -> str | None:
    """The value of the first label name that is present, even if empty (empty -> None)."""
    for name in names:
        if name in labels:
            return labels[name] or None
    return None


def identify(labels: Mapping[str, str], mapping: LabelMapping) -> SeriesIdentity | None:
    """The identity of a series, or None when it has no node or no GPU UUID label (unusable).

    Node, UUID, index, model and MIG labels: the first mapped name that is present and non-empty wins.
    Pod and namespace: the first mapped name that is *present* decides, even when empty, so an empty
    `exported_pod` (GPU not allocated to a pod) does not fall through to `pod`, which then names the
    exporter's own pod. A pod needs both a namespace and a name.
    """
    node = first_non_empty(labels, mapping.node)
    uuid = first_non_empty(labels, mapping.uuid)
    if node is None or uuid is None:
        return None
    namespace = _first_present(labels, mapping.namespace)
    pod = _first_present(labels, mapping.pod)
    if namespace is None or pod is None:
        namespace = pod = None
    return SeriesIdentity(
        node=node,
        uuid=uuid,
        gpu_index=first_non_empty(labels, mapping.gpu_index) or "",
        model_name=first_non_empty(labels, mapping.model_name) or "",
        mig_profile=first_non_empty(labels, mapping.mig_profile),
        mig_instance=first_non_empty(labels, mapping.mig_instance),
        pod_namespace=namespace,
        pod_name=pod,
    )


class PodsOfNamespaces(dict[tuple[str, str], Pod]):
    """The pods of a view that lists only `namespaces`: a series naming a pod of another namespace is
    taken as labelled, since the view cannot tell it gone (its GPU is not read as held by no pod)."""

    def __init__(self, pods: Mapping[tuple[str, str], Pod], namespaces: Iterable[str]) -> None:
        super().__init__(pods)
        self.namespaces = frozenset(namespaces)


def attribute(identity: SeriesIdentity, pods: Mapping[tuple[str, str], Pod] | None) -> SeriesIdentity:
    """Keep the pod only if it is a pod of the cluster that requests a GPU; `pods=None` trusts the labels,
    and `PodsOfNamespaces` those of the namespaces it does not list."""
    key = identity.pod_key
    if key is None or pods is None:
        return identity
    if isinstance(pods, PodsOfNamespaces) and key[0] not in pods.namespaces:
        return identity
    pod = pods.get(key)
    if pod is None or not pod.uses_gpu:
        return replace(identity, pod_namespace=None, pod_name=None)
    return identity


def group_key(identity: SeriesIdentity) -> GroupKey:
    return (identity.node, identity.uuid, identity.mig_instance, identity.pod_namespace, identity.pod_name)


def fill_identity(current: SeriesIdentity, other: SeriesIdentity) -> SeriesIdentity:
    """Complete descriptive fields (index, model, MIG profile) one series of a group may lack."""
    filled = (
        current.gpu_index or other.gpu_index,
        current.model_name or other.model_name,
        current.mig_profile or other.mig_profile,
    )
    if filled == (current.gpu_index, current.model_name, current.mig_profile):
        return current  # the usual case: nothing to complete, and `replace` is slow
    return replace(current, gpu_index=filled[0], model_name=filled[1], mig_profile=filled[2])


# --------------------------------------------------------------------------- presets

_MIB = 1024 * 1024

# What each `telemetry.preset` stands for: TelemetryConfig fields, each used only where the policy does not
# set that field itself. Label names not listed keep LabelMapping's defaults.
PRESETS: Mapping[TelemetryPreset, Mapping[str, MetricConfig | LabelMapping]] = {
    # dcgm-exporter >= 4.6 names the node `hostname`; a scrape config may relabel it to kubernetes_node/node.
    "dcgm-exporter": {"labels": LabelMapping(node=("hostname", "kubernetes_node", "node"))},
    # dcgm-exporter < 4.6: `Hostname` (the node name only with hostNetwork, else the exporter pod's name).
    "dcgm-exporter-legacy": {"labels": LabelMapping(node=("Hostname", "kubernetes_node", "node"))},
    # A ServiceMonitor without honorLabels: the exporter's pod / namespace arrive as exported_pod /
    # exported_namespace, and `pod` / `namespace` name the exporter itself, so they are never read.
    "dcgm-exporter-exported": {
        "labels": LabelMapping(pod=("exported_pod",), namespace=("exported_namespace",)),
    },
    # Triton / NIM style `nv_gpu_*` series: utilisation as a 0-1 ratio, memory in bytes, the GPU in
    # `gpu_uuid`; the node comes from scrape relabelling and the pod is the scraped pod itself. There is no
    # free-memory series, so fb_free keeps the DCGM name (read only where a dcgm-exporter runs too).
    "nv-gpu": {
        "utilization": MetricConfig(name="nv_gpu_utilization", scale=100.0),
        "fb_used": MetricConfig(name="nv_gpu_memory_used_bytes", scale=1 / _MIB),
        "labels": LabelMapping(
            node=("kubernetes_node", "node", "hostname", "Hostname"),
            uuid=("gpu_uuid", "UUID", "uuid"),
            pod=("pod",),
            namespace=("namespace",),
            gpu_index=("gpu",),
        ),
    },
}


def resolve_preset(cfg: TelemetryConfig) -> TelemetryConfig:
    """`cfg` with its preset's metric and label mapping in the fields the policy did not set.

    A preset applies only when the policy names one (`telemetry.preset`); without it the built-in defaults
    stay, which accept every dcgm-exporter flavour (`Hostname` or `hostname`, `exported_pod` or `pod`).
    Fields the policy sets itself always win. Idempotent.
    """
    if "preset" not in cfg.model_fields_set:
        return cfg
    update = {name: value for name, value in PRESETS[cfg.preset].items() if name not in cfg.model_fields_set}
    return cfg.model_copy(update=update) if update else cfg


def format_labels(labels: Mapping[str, str] | Iterable[tuple[str, str]], limit: int = 240) -> str:
    """`{a="1",b="2"}`, sorted, cut to `limit` characters for messages."""
    pairs = sorted(labels.items() if isinstance(labels, Mapping) else labels)
    text = "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"
    return text if len(text) <= limit else text[: limit - 4] + "...}"


def unusable_finding(
    metric: str, missing: Literal["node", "uuid"], count: int, example: str, cfg: TelemetryConfig
) -> Finding:
    """The `unusable-telemetry` finding for the `count` series of `metric` without a node or UUID label."""
    tried = ", ".join(cfg.labels.node if missing == "node" else cfg.labels.uuid)
    what = "node" if missing == "node" else "GPU UUID"
    return Finding(
        kind="unusable-telemetry",
        detail=(
            f"{count} series of {metric} have no {what} label (tried {tried}; set "
            f"telemetry.labels.{missing}) and are ignored, e.g. {example}"
        ),
    )


Role = Literal["util", "fb_used", "fb_free"]


def metric_roles(cfg: TelemetryConfig) -> dict[str, list[Role]]:
    """Each metric the policy reads, with the roles it plays (one metric may play two)."""
    roles: dict[str, list[Role]] = defaultdict(list)
    roles[cfg.utilization.name].append("util")
    roles[cfg.fb_used.name].append("fb_used")
    roles[cfg.fb_free.name].append("fb_free")
    return dict(roles)


def telemetry_metrics(cfg: TelemetryConfig) -> tuple[str, ...]:
    """The metric names the policy reads (utilisation, framebuffer used, framebuffer free)."""
    return tuple(metric_roles(resolve_preset(cfg)))
