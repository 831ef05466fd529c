"""Render a CycleReport as one self-contained HTML page: the cluster's GPUs before and after the plan.

Owns the page only: every GPU node as a row of its GPUs coloured by state (`CycleReport.gpu_nodes`),
before the plan and after it (the freed nodes emptied, each moved pod on its predicted target), the
moves drawn from node to target, the blocked plans with their guards, the findings, the idle workloads
and the savings. The page has no external asset (inline CSS and SVG, one inline script that only marks
the page rendered) so it works offline and from a mail attachment. Every string from the report is
redacted (`redaction.redact`) and HTML-escaped: pod names and reasons come from the cluster. It is a
pure function, report in, text out: no I/O, no clock, no decision.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC
from html import escape

from rebalancer.cycle_report import CycleReport, GpuCell, NodeGpus, ReportedDecision
from rebalancer.redaction import redact

__all__ = ["render_html"]

# Outcomes of a row whose pod leaves its node (or would, in a dry run).
_GONE = frozenset(
    {"evicted", "would-evict", "scaled", "would-scale", "suspended", "would-suspend", "stopped", "would-stop"}
)

_STATES = (
    ("busy", "#2e7d32", "allocated, busy"),
    ("idle", "#f9a825", "allocated, idle (idle-gpu finding)"),
    ("leaked", "#c62828", "leaked VRAM (memory used, no pod)"),
    ("unknown", "#78909c", "allocated, no telemetry"),
    ("free", "#eceff1", "free"),
)

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#212121;
background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.sub{color:#616161;margin:0 0 16px}
.tiles{display:flex;flex-wrap:wrap;gap:8px}
.tile{border:1px solid #cfd8dc;border-radius:6px;padding:8px 12px;min-width:96px}
.tile b{display:block;font-size:20px}
.tile span{color:#616161;font-size:12px}
table{border-collapse:collapse;margin-top:4px}
th,td{border-bottom:1px solid #e0e0e0;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#fafafa;font-weight:600}
td.reason{max-width:720px;color:#424242}
.legend{display:flex;flex-wrap:wrap;gap:14px;margin:8px 0}
.legend i{display:inline-block;width:12px;height:12px;border:1px solid #90a4ae;margin-right:4px;
vertical-align:-1px}
svg text{font:12px system-ui,sans-serif;fill:#212121}
svg .freed{fill:#1565c0;font-weight:600}
svg .head{font-weight:600;font-size:13px}
.none{color:#757575}
"""

# Marks the page rendered, and any script error on it, as attributes a test (or a person) can read.
_SCRIPT = (
    "window.addEventListener('error',function(e){document.documentElement.setAttribute("
    "'data-js-error',String(e.message))});"
    "document.addEventListener('DOMContentLoaded',function(){document.documentElement.setAttribute("
    "'data-rendered','ok')});"
)

_CELL = 16  # one GPU's square
_GAP = 3
_ROW = 24
_CHAR = 7  # width of one character of a node label, roughly
_ARROWS = 170  # the band between the two pictures where the moves are drawn
_TOP = 40
_BLOCKED = 160  # right of the picture: the guards that blocked a plan on the node


def _t(text: object) -> str:
    """Report text, redacted and escaped for element content and attribute values alike."""
    return escape(redact(str(text)), quote=True)


@dataclass(frozen=True, slots=True)
class _Move:
    pod: str
    source: str
    target: str
    strategy: str


def _moves(report: CycleReport) -> list[_Move]:
    return [
        _Move(f"{d.namespace}/{d.pod}", d.node, d.target_node, d.strategy)
        for d in report.decisions
        if d.action == "evict" and d.outcome in _GONE and d.node and d.target_node and d.node != d.target_node
    ]


def _after(report: CycleReport, moves: Sequence[_Move]) -> dict[str, list[tuple[GpuCell, bool]]]:
    """Every node's GPUs after the plan, each with whether it holds a pod moved there."""
    leaving = {f"{d.namespace}/{d.pod}" for d in report.decisions if d.outcome in _GONE}
    freed = set(report.freed_nodes)
    after: dict[str, list[tuple[GpuCell, bool]]] = {}
    moved_cells: dict[str, list[GpuCell]] = {}
    for node in report.gpu_nodes:
        cells: list[tuple[GpuCell, bool]] = []
        for cell in node.gpus:
            if node.node in freed or (cell.pods and all(p in leaving for p in cell.pods)):
                moved_cells.setdefault(cell.pods[0] if cell.pods else "", []).append(cell)
                cells.append((GpuCell(index=cell.index, state="free", uuid=cell.uuid), False))
            else:
                cells.append((cell, False))
        after[node.node] = cells
    for move in moves:
        target = after.get(move.target, [])
        for source_cell in moved_cells.get(move.pod, ()):
            slot = next((i for i, (c, _) in enumerate(target) if c.state == "free"), None)
            if slot is None:
                break
            index = target[slot][0].index
            target[slot] = (GpuCell(index=index, state=source_cell.state, pods=(move.pod,)), True)
    return after


def _square(x: int, y: int, cell: GpuCell, node: str, moved: bool = False) -> str:
    colour = next(c for s, c, _ in _STATES if s == cell.state)
    parts = [f"GPU {cell.index} on {node}: {cell.state}"]
    if cell.pods:
        parts.append(", ".join(cell.pods))
    if cell.util_avg_percent is not None:
        parts.append(f"util avg {cell.util_avg_percent:g}%")
    if cell.fb_used_mib is not None:
        parts.append(f"framebuffer {cell.fb_used_mib:g} MiB")
    if moved:
        parts.append("moved here by the plan")
    stroke = ' stroke="#1565c0" stroke-width="2.5"' if moved else ' stroke="#90a4ae"'
    return (
        f'<rect class="gpu gpu-{cell.state}{" moved" if moved else ""}" x="{x}" y="{y}" width="{_CELL}" '
        f'height="{_CELL}" rx="2" fill="{colour}"{stroke}><title>{_t(" · ".join(parts))}</title></rect>'
    )


def _model(node: NodeGpus) -> str:
    return (node.gpu_model or "").removeprefix("NVIDIA-")


def _label_width(nodes: Sequence[NodeGpus]) -> int:
    """Room for the longest node name (with " (freed)") and the longest model, at ~7 px a character."""
    names = max(len(n.node) for n in nodes) + len(" (freed)")
    models = max(len(_model(n)) for n in nodes)
    return _CHAR * (names + models) + 24


def _node_label(x: int, y: int, node: NodeGpus, freed: bool, width: int) -> str:
    cls = ' class="freed"' if freed else ""
    tail = " (freed)" if freed else ""
    return (
        f'<text x="{x}" y="{y + 12}"{cls}>{_t(node.node + tail)}</text>'
        f'<text x="{x + width - 8}" y="{y + 12}" text-anchor="end" fill="#757575">{_t(_model(node))}</text>'
    )


def _picture(report: CycleReport) -> str:
    nodes = report.gpu_nodes
    if not nodes:
        return '<p class="none">No GPU nodes in the snapshot.</p>'
    moves = _moves(report)
    after = _after(report, moves)
    freed = set(report.freed_nodes)
    width_cells = max(len(n.gpus) for n in nodes) * (_CELL + _GAP)
    label = _label_width(nodes)
    before_x = 0
    after_x = label + width_cells + _ARROWS
    blocked: dict[str, set[str]] = {}
    for d in _blocked(report):
        if d.node:
            blocked.setdefault(d.node, set()).add(d.blocked_by or d.outcome or "?")
    width = after_x + label + width_cells + _BLOCKED
    height = _TOP + len(nodes) * _ROW + 10
    row_y = {n.node: _TOP + i * _ROW for i, n in enumerate(nodes)}
    out = [
        f'<svg id="cluster" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="GPUs before and after the plan">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#1565c0"/></marker></defs>',
        f'<text class="head" x="{before_x}" y="20">Before</text>',
        f'<text class="head" x="{after_x}" y="20">After the plan</text>',
    ]
    for node in nodes:
        y = row_y[node.node]
        out.append(f'<g class="node-row before" data-node="{_t(node.node)}">')
        out.append(_node_label(before_x, y, node, False, label))
        out += [
            _square(before_x + label + i * (_CELL + _GAP), y, cell, node.node)
            for i, cell in enumerate(node.gpus)
        ]
        out.append("</g>")
        is_freed = node.node in freed
        out.append(
            f'<g class="node-row after{" freed" if is_freed else ""}" data-node="{_t(node.node)}"'
            f' data-freed="{"true" if is_freed else "false"}">'
        )
        out.append(_node_label(after_x, y, node, is_freed, label))
        out += [
            _square(after_x + label + i * (_CELL + _GAP), y, cell, node.node, moved)
            for i, (cell, moved) in enumerate(after[node.node])
        ]
        if node.node in blocked:
            guards = ", ".join(sorted(blocked[node.node]))
            out.append(
                f'<text class="blocked" x="{after_x + label + width_cells + 6}" y="{y + 12}" fill="#e65100">'
                f"{_t(f'blocked: {guards}')}</text>"
            )
        out.append("</g>")
    x1 = before_x + label + width_cells + 4
    x2 = after_x - 6
    for move in moves:
        if move.source not in row_y or move.target not in row_y:
            continue
        y1, y2 = row_y[move.source] + _CELL // 2, row_y[move.target] + _CELL // 2
        out.append(
            f'<path class="move" data-pod="{_t(move.pod)}" data-from="{_t(move.source)}" '
            f'data-to="{_t(move.target)}" fill="none" '
            f'd="M{x1},{y1} C{x1 + 70},{y1} {x2 - 70},{y2} {x2},{y2}" '
            f'stroke="#1565c0" stroke-width="1.5" marker-end="url(#arrow)">'
            f"<title>{_t(f'{move.pod}: {move.source} → {move.target} ({move.strategy})')}</title></path>"
        )
    out.append("</svg>")
    return "\n".join(out)


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"${value:,.2f}/h"


def _tiles(report: CycleReport) -> str:
    s = report.summary
    tiles = [
        (s.nodes, "nodes"),
        (s.gpus, "GPUs"),
        (s.pods, "pods"),
        (s.evictions, "evictions" if report.mode == "live" else "would evict"),
        (s.blocked, "blocked"),
        (s.nodes_freed, "nodes freed"),
        (s.gpus_freed, "GPUs freed"),
        (_money(s.estimated_savings_per_hour), "estimated savings"),
        (
            s.reclaims,
            f"idle workloads reclaimed, {s.gpus_reclaimed:g} GPU{'' if s.gpus_reclaimed == 1 else 's'}",
        ),
    ]
    return (
        '<div class="tiles" id="summary">'
        + "".join(
            f'<div class="tile"><b>{_t(value)}</b><span>{_t(label)}</span></div>' for value, label in tiles
        )
        + "</div>"
    )


def _table(table_id: str, headers: Sequence[str], rows: Iterable[Sequence[str]], empty: str) -> str:
    body = [
        "<tr>"
        + "".join(
            f'<td class="reason">{_t(c)}</td>' if i == len(r) - 1 else f"<td>{_t(c)}</td>"
            for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    ]
    if not body:
        return f'<p class="none" id="{table_id}">{_t(empty)}</p>'
    head = "".join(f"<th>{_t(h)}</th>" for h in headers)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _blocked(report: CycleReport) -> list[ReportedDecision]:
    return [d for d in report.decisions if d.action == "skip" or d.outcome == "blocked-by-pdb"]


def render_html(report: CycleReport) -> str:
    """The report as one HTML document (UTF-8, no external reference)."""
    moves = _moves(report)
    blocked = _blocked(report)
    guards = Counter(d.blocked_by or d.outcome or "?" for d in blocked)
    when = report.now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    legend = "".join(f'<span><i style="background:{c}"></i>{_t(label)}</span>' for _, c, label in _STATES)
    legend += '<span><i style="background:#fff;border:2px solid #1565c0"></i>moved here by the plan</span>'
    freed = ", ".join(report.freed_nodes) or "none"
    sections = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_t(f'gpu-rebalancer {report.mode} report {when}')}</title>",
        f"<style>{_CSS}</style>",
        f"<script>{_SCRIPT}</script>",
        "</head><body>",
        f"<h1>gpu-rebalancer {_t(report.mode)} report</h1>",
        f'<p class="sub">Snapshot at {_t(when)}; nodes freed: {_t(freed)}.</p>',
        _tiles(report),
        "<h2>GPUs before and after the plan</h2>",
        f'<div class="legend">{legend}</div>',
        _picture(report),
        f"<h2>Moves ({len(moves)})</h2>",
        _table(
            "moves",
            ["pod", "from", "to", "strategy"],
            ([m.pod, m.source, m.target, m.strategy] for m in moves),
            "No pod is moved.",
        ),
        f"<h2>Blocked ({len(blocked)})</h2>",
        (
            '<p class="sub" id="guards">'
            + _t(", ".join(f"{guard}: {n}" for guard, n in sorted(guards.items())))
            + "</p>"
            if guards
            else ""
        ),
        _table(
            "blocked",
            ["guard", "pod", "node", "strategy", "reason"],
            (
                [
                    d.blocked_by or d.outcome or "?",
                    f"{d.namespace}/{d.pod}",
                    d.node or "-",
                    d.strategy,
                    d.reason,
                ]
                for d in blocked
            ),
            "Nothing was blocked.",
        ),
        f"<h2>All decisions ({len(report.decisions)})</h2>",
        _table(
            "decisions",
            ["strategy", "pod", "node", "verdict", "target", "reason"],
            (
                [
                    d.strategy,
                    f"{d.namespace}/{d.pod}",
                    d.node or "-",
                    d.outcome or f"skip ({d.blocked_by})",
                    d.target_node or "-",
                    d.reason,
                ]
                for d in report.decisions
            ),
            "No evictions proposed.",
        ),
        f"<h2>Findings ({len(report.findings)})</h2>",
        _table(
            "findings",
            ["kind", "node", "GPU", "pod", "detail"],
            (
                [f.kind, f.node or "-", f.gpu or "-", f"{f.namespace}/{f.pod}" if f.pod else "-", f.detail]
                for f in report.findings
            ),
            "No findings.",
        ),
    ]
    if report.notices:
        sections += [
            f"<h2>Idle workloads ({len(report.notices)})</h2>",
            _table(
                "notices",
                ["result", "workload", "message"],
                ([n.result, n.ref, n.text] for n in report.notices),
                "",
            ),
        ]
    if report.skipped_strategies:
        sections += [
            "<h2>Skipped strategies</h2>",
            _table(
                "skipped",
                ["strategy", "reason"],
                ([s.strategy, s.reason] for s in report.skipped_strategies),
                "",
            ),
        ]
    if report.hints:
        sections += ["<h2>Hints</h2>", "<ul>" + "".join(f"<li>{_t(h)}</li>" for h in report.hints) + "</ul>"]
    sections.append("</body></html>")
    return "\n".join(sections) + "\n"
