"""Render `rebalancer advise`'s recommendations as text, JSON or markdown.

Owns presentation only, in the style of `rebalancer.waste_report`: the workloads the largest saving first
with the total, each with its recommendation, confidence, reason and evidence (peak and p95 figures,
window, samples), then the change to make (the YAML patch) of every recommendation with a saving. JSON
keys stay stable (additions only); money is rounded to cents, memory to 0.01 GiB, percentages to 0.1.
It never computes or reads anything: `strategies.gpu_rightsizing.advice` does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from rebalancer import rfc3339
from rebalancer.policy import format_duration
from rebalancer.report import md_cell, text_table
from rebalancer.rightsizing import Evidence, Recommendation
from rebalancer.usage import UsageHistory
from rebalancer.wording import plural

__all__ = ["AdviseFormat", "render", "to_dict"]

AdviseFormat = Literal["text", "json", "markdown"]
Advice = Sequence[tuple[Evidence, Recommendation]]


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _total(advice: Advice) -> float:
    return round(sum(found.monthly_saving for _, found in advice), 2)


def _evidence(evidence: Evidence) -> dict[str, Any]:
    return {
        "peak_memory_gib": _round(evidence.peak_memory_gib, 2),
        "p95_memory_gib": _round(evidence.p95_memory_gib, 2),
        "p95_compute_percent": _round(evidence.p95_utilization_percent, 1),
        "compute_metric": "DCGM_FI_PROF_GR_ENGINE_ACTIVE" if evidence.profiled else "DCGM_FI_DEV_GPU_UTIL",
        "p95_sm_active_percent": _round(evidence.p95_sm_percent, 1),
        "p95_tensor_active_percent": _round(evidence.p95_tensor_percent, 1),
        "p95_dram_active_percent": _round(evidence.p95_dram_percent, 1),
        "p95_nvlink_bytes_per_second": _round(evidence.nvlink_bytes_per_second, 0),
        "idle_gpus_per_replica": sum(evidence.idle_all_window),
        "samples": evidence.samples,
        "problems": list(evidence.problems),
    }


def to_dict(advice: Advice, history: UsageHistory) -> dict[str, Any]:
    window = history.period
    return {
        "period": {
            "start": rfc3339.format_utc(window.start),
            "end": rfc3339.format_utc(window.end),
            "step_seconds": window.step,
        },
        "history": history.source,
        "total_monthly_saving": _total(advice),
        "workloads": [
            {
                "workload": evidence.workload,
                "namespace": evidence.namespace,
                "gpu_model": evidence.product,
                "replicas": evidence.replicas,
                "gpus_per_replica": evidence.gpus_per_replica,
                "recommendation": found.kind,
                "target": found.target,
                "confidence": found.confidence,
                "reason": found.reason,
                "notes": list(found.notes),
                "monthly_saving": round(found.monthly_saving, 2),
                "evidence": _evidence(evidence),
                "patch": found.patch or None,
            }
            for evidence, found in advice
        ],
        "notes": list(history.notes),
    }


def _heading(history: UsageHistory) -> str:
    window = history.period
    return (
        f"GPU right-sizing over {format_duration(window.seconds)} "
        f"({rfc3339.format_utc(window.start)} to {rfc3339.format_utc(window.end)}, "
        f"{format_duration(window.step)} steps), from {history.source}"
    )


def _change(found: Recommendation) -> str:
    return f"{found.kind} {found.target}" if found.target else found.kind


def _rows(advice: Advice) -> list[list[str]]:
    return [
        [
            evidence.workload,
            f"{evidence.replicas}x{evidence.gpus_per_replica} {evidence.product}",
            _change(found),
            f"{found.monthly_saving:,.2f}",
            found.confidence,
        ]
        for evidence, found in advice
    ]


def _figures(evidence: Evidence) -> str:
    return f"p95 memory {evidence.p95_memory_gib:.2f} GiB, {evidence.samples} samples"


def _notes(advice: Advice) -> list[str]:
    """Each confidence note once, with how many workloads it concerns."""
    counted: dict[str, int] = {}
    for _, found in advice:
        for note in found.notes:
            counted[note] = counted.get(note, 0) + 1
    return [f"{note} ({plural(count, 'workload')})" for note, count in counted.items()]


_HEADERS = ["WORKLOAD", "GPUS", "ADVICE", "SAVING/MONTH", "CONFIDENCE"]


def render_text(advice: Advice, history: UsageHistory) -> str:
    out = [_heading(history), ""]
    if not advice:
        out.append("No workload of the cluster view holds whole GPUs.")
    else:
        table = text_table(_HEADERS, _rows(advice))
        out.append(table[0])
        for line, (evidence, found) in zip(table[1:], advice, strict=True):
            out += [line, f"    {found.reason}; {_figures(evidence)}"]
        out += ["", f"Total: {_total(advice):,.2f} a month (730 h), at the policy's prices."]
    if notes := _notes(advice):
        out += ["", "Confidence below high:", *(f"  {note}" for note in notes)]
    changes = [(evidence, found) for evidence, found in advice if found.patch]
    if changes:
        out += ["", "Changes (strategic-merge patches of the pod template):"]
        for evidence, found in changes:
            out += ["", f"  {evidence.workload} ({_change(found)}):"]
            out += [f"    {line}" for line in found.patch.splitlines()]
    if history.notes:
        out += ["", "Notes:", *(f"  {note}" for note in history.notes)]
    return "\n".join(out) + "\n"


def render_markdown(advice: Advice, history: UsageHistory) -> str:
    out = [f"## {_heading(history)}", ""]
    headers = ["workload", "GPUs", "advice", "saving / month", "confidence", "why"]
    out += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row, (evidence, found) in zip(_rows(advice), advice, strict=True):
        why = f"{found.reason}; {_figures(evidence)}"
        out.append("| " + " | ".join(md_cell(cell) for cell in [*row, why]) + " |")
    out += ["", f"**Total: {_total(advice):,.2f} a month** (730 h), at the policy's prices."]
    if notes := _notes(advice):
        out += ["", "Confidence below high:", "", *(f"- {md_cell(note)}" for note in notes)]
    for evidence, found in advice:
        if found.patch:
            out += ["", f"### {md_cell(evidence.workload)}: {md_cell(_change(found))}", "", "```yaml"]
            out += [found.patch.rstrip("\n"), "```"]
    return "\n".join(out) + "\n"


def render(advice: Advice, history: UsageHistory, fmt: AdviseFormat) -> str:
    if fmt == "json":
        return json.dumps(to_dict(advice, history), indent=2) + "\n"
    if fmt == "markdown":
        return render_markdown(advice, history)
    return render_text(advice, history)
