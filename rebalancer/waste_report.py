"""Render a `waste.Waste` table as text, JSON, markdown or CSV.

Owns presentation only, in the style of `rebalancer.report`: an aligned text table with totals, a
markdown version for a pull request or a wiki page, JSON whose keys stay stable (additions only: they
are parsed by showback scripts), and CSV (one row per group, through the stdlib `csv` writer; totals
and the GPU time attributed to no pod are in the other formats). GPU-hours are rounded to 4 decimals
and costs to cents in JSON and CSV, to 2 decimals in text and markdown. It never computes or reads
anything: `rebalancer.waste` does.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Literal

from rebalancer import rfc3339
from rebalancer.policy import format_duration
from rebalancer.report import md_cell, text_table
from rebalancer.waste import GroupWaste, Usage, Waste, WorkloadWaste

__all__ = ["CSV_COLUMNS", "WasteFormat", "render", "to_dict"]

WasteFormat = Literal["text", "json", "markdown", "csv"]

CSV_COLUMNS = ("group", "namespace", "pods", "idle_gpu_hours", "allocated_gpu_hours", "idle_share", "cost")


def _hours(value: float) -> float:
    return round(value, 4)


def _cents(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _share(usage: Usage) -> float | None:
    share = usage.idle_share
    return None if share is None else round(share, 4)


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "idle_gpu_hours": _hours(usage.idle_gpu_hours),
        "allocated_gpu_hours": _hours(usage.allocated_gpu_hours),
        "idle_share": _share(usage),
        "cost": _cents(usage.cost),
    }


def _workload(entry: WorkloadWaste) -> dict[str, Any]:
    return {
        "workload": entry.workload,
        "namespace": entry.namespace,
        "pods": entry.pods,
        **_usage(entry.usage),
    }


def _group(group: GroupWaste) -> dict[str, Any]:
    return {
        "group": group.group,
        "namespace": group.namespace,
        "pods": group.pods,
        **_usage(group.usage),
        "top_workloads": [_workload(entry) for entry in group.top_workloads],
    }


def to_dict(waste: Waste) -> dict[str, Any]:
    loose = waste.unattributed
    return {
        "period": {
            "start": rfc3339.format_utc(waste.period.start),
            "end": rfc3339.format_utc(waste.period.end),
            "seconds": waste.period.seconds,
        },
        "step_seconds": waste.period.step,
        "threshold_percent": waste.threshold_percent,
        "by": str(waste.by),
        "history": waste.history,
        "currency": "USD",
        "groups": [_group(group) for group in waste.groups],
        "totals": {"pods": sum(group.pods for group in waste.groups), **_usage(waste.totals)},
        "unattributed": {
            "series": loose.series,
            "gpu_hours": _hours(loose.gpu_hours),
            "idle_gpu_hours": _hours(loose.idle_gpu_hours),
            "cost": _cents(loose.cost),
        },
        "top_workloads": [_workload(entry) for entry in waste.top_workloads],
        "notes": list(waste.notes),
    }


# --------------------------------------------------------------------------- text and markdown


def _h(value: float) -> str:
    return f"{value:,.2f}"


def _pct(usage: Usage) -> str:
    share = usage.idle_share
    return "-" if share is None else f"{share:.1%}"


def _money(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.2f}"


def _heading(waste: Waste) -> str:
    return (
        f"Idle GPU-hours by {waste.by}, {rfc3339.format_utc(waste.period.start)} to "
        f"{rfc3339.format_utc(waste.period.end)}"
    )


def _about(waste: Waste) -> list[str]:
    p = waste.period
    threshold = f"{waste.threshold_percent:g}%"
    loose = waste.unattributed
    return [
        f"{format_duration(p.seconds)} in {format_duration(p.step)} steps; idle: a step in which a GPU a pod "
        f"holds averaged below {threshold} utilisation (idle-gpu max_utilization_percent)",
        f"history: {waste.history}",
        f"not attributed to any pod (unallocated GPUs, leaked VRAM): {_h(loose.gpu_hours)} GPU-hours in "
        f"{loose.series} series, {_h(loose.idle_gpu_hours)} of them idle, cost {_money(loose.cost)}",
    ]


def _group_header(waste: Waste) -> str:
    return f"LABEL {waste.by.label}" if waste.by.kind == "label" else waste.by.kind.upper()


_USAGE_HEADERS = ("PODS", "IDLE GPU-H", "ALLOCATED GPU-H", "IDLE", "COST")


def _cells(name: str, pods: int, usage: Usage) -> list[str]:
    return [
        name,
        str(pods),
        _h(usage.idle_gpu_hours),
        _h(usage.allocated_gpu_hours),
        _pct(usage),
        _money(usage.cost),
    ]


def _rows(waste: Waste) -> list[list[str]]:
    rows = [_cells(g.group, g.pods, g.usage) for g in waste.groups]
    rows.append(_cells("TOTAL", sum(g.pods for g in waste.groups), waste.totals))
    return rows


def _top_rows(waste: Waste) -> list[list[str]]:
    return [_cells(w.workload, w.pods, w.usage) for w in waste.top_workloads]


def render_text(waste: Waste) -> str:
    out = [_heading(waste), *_about(waste), ""]
    if waste.groups:
        out += text_table([_group_header(waste), *_USAGE_HEADERS], _rows(waste))
    else:
        out.append("No GPU time attributed to a pod in this period.")
    if waste.top_workloads:
        out += ["", "Top idle workloads:"]
        out += [f"  {line}" for line in text_table(["WORKLOAD", *_USAGE_HEADERS], _top_rows(waste))]
    if waste.notes:
        out += ["", "Notes:"]
        out += [f"  {note}" for note in waste.notes]
    return "\n".join(out) + "\n"


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(headers) + " |",
        "|---|" + "---:|" * (len(headers) - 1),
        *("| " + " | ".join(md_cell(cell) for cell in row) + " |" for row in rows),
    ]


def render_markdown(waste: Waste) -> str:
    out = [f"## {_heading(waste)}", ""]
    out += [f"- {md_cell(line)}" for line in _about(waste)]
    headers = ["pods", "idle GPU-hours", "allocated GPU-hours", "idle", "cost"]
    if waste.groups:
        rows = _rows(waste)
        rows[-1][0] = "**total**"
        out += ["", *_md_table([_group_header(waste).lower(), *headers], rows)]
    if waste.top_workloads:
        out += ["", "### Top idle workloads", "", *_md_table(["workload", *headers], _top_rows(waste))]
    if waste.notes:
        out += ["", "### Notes", ""]
        out += [f"- {md_cell(note)}" for note in waste.notes]
    return "\n".join(out) + "\n"


def render_csv(waste: Waste) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for group in waste.groups:
        usage = _usage(group.usage)
        writer.writerow(
            [
                group.group,
                group.namespace or "",
                group.pods,
                *("" if usage[key] is None else usage[key] for key in CSV_COLUMNS[3:]),
            ]
        )
    return buffer.getvalue()


def render(waste: Waste, fmt: WasteFormat) -> str:
    if fmt == "json":
        return json.dumps(to_dict(waste), indent=2) + "\n"
    if fmt == "markdown":
        return render_markdown(waste)
    if fmt == "csv":
        return render_csv(waste)
    return render_text(waste)
