"""Finding kinds: every `Finding.kind` the rebalancer can report, with what it means.

Owns the closed list. `FindingKind` types `Finding.kind`, so `mypy --strict` refuses a finding of a kind
not listed here; `FINDING_KINDS` gives each its meaning (tests hold it, the Literal and the README's
table equal). The policy's `notify.*.finding_kinds` filter refuses a kind not listed, since a misspelt
kind would silence a sink without a word; `unknown_kind_problem` words that refusal.

It must not import anything of the project but `wording`: every layer reports findings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from rebalancer.wording import quoted

__all__ = ["FINDING_KINDS", "FindingKind", "unknown_kind_problem"]

FindingKind = Literal[
    "affinity-violation",
    "bad-telemetry",
    "checkpoint-request",
    "circuit-open",
    "consolidation-blocked",
    "cycle-cut-short",
    "drain-interrupted",
    "drain-timeout",
    "gpu-rightsizing",
    "idle-gpu",
    "ignored-objects",
    "leaked-vram",
    "partial-cluster-view",
    "stale-cluster-cache",
    "stale-telemetry",
    "state-superseded",
    "telemetry-aggregates-unused",
    "telemetry-unavailable",
    "telemetry-unknown-node",
    "unknown-node",
    "unread-controllers",
    "unread-files",
    "unusable-telemetry",
    "usage-history-unavailable",
]

FINDING_KINDS: Final[Mapping[FindingKind, str]] = {
    "affinity-violation": "a pod runs on a GPU model its node affinity no longer allows; not moved now",
    "bad-telemetry": "a GPU's samples that cannot be true (negative, not a number, DCGM blanks) were dropped",
    "checkpoint-request": "a pod that opted in was asked to checkpoint before its eviction",
    "circuit-open": "pods the rebalancer evicted are not scheduled again: their workload is not touched",
    "consolidation-blocked": "an under-used node that cannot be drained, and the pod (or rule) that keeps it",
    "cycle-cut-short": "a cycle's evictions stopped before every approved plan was attempted",
    "drain-interrupted": "a drain mark was removed from a node whose drain did not finish",
    "drain-timeout": "a drain mark was removed after `eviction.drain_timeout`",
    "gpu-rightsizing": "a workload would fit a cheaper GPU model, a MIG slice or fewer GPUs",
    "idle-gpu": "a workload holds GPUs it has not used over the window",
    "ignored-objects": "objects of a snapshot directory that were not read, and why",
    "leaked-vram": "GPU memory in use with no pod, or by a pod idle all window",
    "partial-cluster-view": "the view lacks part of the cluster (namespaces not listed, pods left out)",
    "stale-cluster-cache": "a watched kind's cache fell behind and was listed again",
    "stale-telemetry": "a series whose newest sample is too old: not judged, never read as idle",
    "state-superseded": "a later leader wrote the state: this replica stopped evicting until its next term",
    "telemetry-aggregates-unused": "a snapshot's telemetry aggregates do not fit the policy or the snapshot",
    "telemetry-unavailable": "Prometheus could not be read: telemetry-dependent strategies skip",
    "telemetry-unknown-node": "telemetry names a node the cluster does not have",
    "unknown-node": "a pod names a node the cluster does not have: it is ignored",
    "unread-controllers": "a kind of controller the GPU pods need could not be listed",
    "unread-files": "files of a snapshot directory that could not be read",
    "unusable-telemetry": "telemetry series without the node or GPU UUID label, ignored",
    "usage-history-unavailable": "the week of GPU usage history could not be read",
}


def unknown_kind_problem(kind: str) -> str | None:
    """Why `kind` is not a finding kind, naming the nearest one or listing them all; None when it is."""
    if kind in FINDING_KINDS:
        return None
    import difflib  # noqa: PLC0415 - only on an error: not on every start-up

    near = difflib.get_close_matches(kind.lower(), FINDING_KINDS, n=1)
    hint = f"did you mean {near[0]!r}?" if near else "known: " + ", ".join(sorted(FINDING_KINDS))
    return f"unknown finding kind {quoted(kind)} ({hint})"
