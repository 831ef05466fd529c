"""The HTML report: each GPU's state as the report records it, and the page drawn from it.

The page is parsed with the standard library's HTML parser (the browser test, test_report_browser.py,
renders it in Chromium): its structure, its escaping of cluster-provided text, its lack of external
references.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from rebalancer.cli import EXIT_OK, main
from rebalancer.cycle_report import CycleReport, GpuCell, NodeGpus, ReportedDecision, Summary
from rebalancer.gpu_map import gpu_map
from rebalancer.model import Finding
from rebalancer.report_html import render_html
from tests.builders import gpu_sample, node, pod, replace, snapshot, telemetry
from tests.html_dom import parse

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo-cluster"
HOSTILE = "<script>alert('pwned')</script>\"onmouseover=alert(1) x='&amp;"


# --------------------------------------------------------------------------- the GPU map


def test_gpu_states_come_from_telemetry_and_findings() -> None:
    busy = pod("train", "n1", gpus=2)
    idle = pod("notebook", "n1", gpus=1)
    rows = [
        gpu_sample("n1", "GPU-a", pod=busy, util=80.0),
        gpu_sample("n1", "GPU-b", pod=busy, util=70.0),
        gpu_sample("n1", "GPU-c", pod=idle, util=0.5),
        gpu_sample("n1", "GPU-d", util=0.0, fb_used_mib=20480.0),
    ]
    snap = snapshot([node("n1", gpus=5)], [busy, idle], telemetry=telemetry(rows))
    findings = [
        Finding(kind="idle-gpu", node="n1", gpu="GPU-c", namespace="ml", pod="notebook"),
        Finding(kind="leaked-vram", node="n1", gpu="GPU-d"),
    ]
    [n1] = gpu_map(snap, findings)
    assert [(c.uuid, c.state, c.pods) for c in n1.gpus] == [
        ("GPU-a", "busy", ("ml/train",)),
        ("GPU-b", "busy", ("ml/train",)),
        ("GPU-c", "idle", ("ml/notebook",)),
        ("GPU-d", "leaked", ()),
        (None, "free", ()),
    ]
    assert [c.index for c in n1.gpus] == ["0", "1", "2", "3", "4"]
    assert n1.gpus[0].util_avg_percent == 80.0


def test_a_cycles_gpu_map_is_drawn_when_read_not_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """Most cycles' maps are never read (only `/report`, `/report.html`, the webhook and `once`'s JSON
    and HTML show them; the replay and the log lines do not): a cycle does not draw it, reading does,
    once, and what is read is the map `gpu_map` draws."""
    import rebalancer.gpu_map as gpu_map_module
    from rebalancer.cycle import run_cycle
    from rebalancer.evictor import DryRunEvictor
    from rebalancer.policy import parse_policy

    drawn: list[str] = []
    draw = gpu_map_module._node_gpus

    def counted(node, *rest):  # type: ignore[no-untyped-def]
        drawn.append(node.name)
        return draw(node, *rest)

    busy = pod("train", "n1", gpus=2)
    snap = snapshot(
        [node("n1", gpus=4), node("n2", gpus=2)],
        [busy],
        telemetry=telemetry([gpu_sample("n1", "GPU-a", pod=busy, util=80.0)]),
    )
    monkeypatch.setattr(gpu_map_module, "_node_gpus", counted)
    report = run_cycle(snap, parse_policy({"strategies": []}), DryRunEvictor())
    assert drawn == []
    first = tuple(report.gpu_nodes)
    assert [n.node for n in first] == ["n1", "n2"] and drawn == ["n1", "n2"]
    assert tuple(report.gpu_nodes) == first and drawn == ["n1", "n2"]  # drawn once
    monkeypatch.setattr(gpu_map_module, "_node_gpus", draw)
    assert report.gpu_nodes == gpu_map(snap, report.findings) == first
    assert len(report.gpu_nodes) == 2 and report.gpu_nodes[1].node == "n2"


def test_a_gpu_pod_without_telemetry_is_unknown_never_idle() -> None:
    quiet = pod("quiet", "n1", gpus=2)
    snap = snapshot([node("n1", gpus=4), node("cpu", gpus=0)], [quiet])  # no telemetry at all
    [n1] = gpu_map(snap, [])  # the node without GPUs is not drawn
    assert [c.state for c in n1.gpus] == ["unknown", "unknown", "free", "free"]
    assert n1.gpus[0].pods == ("ml/quiet",)


def test_without_telemetry_gpu_pods_take_the_gpus_in_order_of_their_names() -> None:
    """Positions 0, 1, ... in order; each GPU pod (by `namespace/name`) takes the first GPUs no pod holds
    yet, one a share, as many as it asks for whole; a pod without GPUs takes none. Drawn again from the
    same objects, the node is the same."""
    pods = [
        pod("b", "n1", gpus=2),
        pod("a", "n1", gpus=1, gpu_milli=500),
        pod("d", "n1", gpus=0),
        pod("c", "n1", gpus=1),
    ]
    nodes = [node("n1", gpus=5)]
    [n1] = gpu_map(snapshot(nodes, pods), [])
    assert [(c.index, c.pods, c.state) for c in n1.gpus] == [
        ("0", ("ml/a",), "unknown"),
        ("1", ("ml/b",), "unknown"),
        ("2", ("ml/b",), "unknown"),
        ("3", ("ml/c",), "unknown"),
        ("4", (), "free"),
    ]
    assert gpu_map(snapshot(nodes, pods), []) == (n1,)


def test_low_utilisation_alone_is_not_idle() -> None:
    """Only the idle-gpu strategy calls a GPU idle (its threshold, window, pod age, samples)."""
    slow = pod("slow", "n1", gpus=1)
    snap = snapshot(
        [node("n1", gpus=1)], [slow], telemetry=telemetry([gpu_sample("n1", "G", pod=slow, util=0.1)])
    )
    [n1] = gpu_map(snap, [])
    assert n1.gpus[0].state == "busy"


def test_the_gpu_index_label_orders_the_gpus() -> None:
    a, b = pod("a", "n1"), pod("b", "n1")
    rows = [
        replace(gpu_sample("n1", "GPU-z", pod=a), gpu_index="0"),
        replace(gpu_sample("n1", "GPU-y", pod=b), gpu_index="1"),
    ]
    [n1] = gpu_map(snapshot([node("n1", gpus=2)], [a, b], telemetry=telemetry(rows)), [])
    assert [(c.index, c.uuid) for c in n1.gpus] == [("0", "GPU-z"), ("1", "GPU-y")]


def test_an_index_of_other_digits_sorts_after_the_numbers() -> None:
    a, b, c = pod("a", "n1"), pod("b", "n1"), pod("c", "n1")
    rows = [
        replace(gpu_sample("n1", "GPU-x", pod=a), gpu_index="²"),  # a digit to str.isdigit, not to int()
        replace(gpu_sample("n1", "GPU-y", pod=b), gpu_index="10"),
        replace(gpu_sample("n1", "GPU-z", pod=c), gpu_index="9"),
    ]
    [n1] = gpu_map(snapshot([node("n1", gpus=3)], [a, b, c], telemetry=telemetry(rows)), [])
    assert [(cell.index, cell.uuid) for cell in n1.gpus] == [("9", "GPU-z"), ("10", "GPU-y"), ("²", "GPU-x")]


# --------------------------------------------------------------------------- the page


def _report(**changes: object) -> CycleReport:
    base = CycleReport(
        mode="dry-run",
        now=datetime(2026, 11, 29, 12, tzinfo=UTC),
        summary=Summary(
            nodes=2,
            gpus=4,
            pods=1,
            proposals=1,
            evictions=1,
            blocked=0,
            nodes_freed=1,
            gpus_freed=2,
            estimated_savings_per_hour=2.3,
        ),
        decisions=(
            ReportedDecision(
                strategy="gpu-consolidation",
                namespace="ml",
                pod="p",
                node="a",
                action="evict",
                outcome="would-evict",
                reason="node a is light",
                blocked_by=None,
                group=None,
                target_node="b",
            ),
        ),
        freed_nodes=("a",),
        gpu_nodes=(
            NodeGpus("a", "NVIDIA-L4", None, (GpuCell("0", "busy", ("ml/p",)), GpuCell("1", "free"))),
            NodeGpus("b", "NVIDIA-L4", None, (GpuCell("0", "busy", ("ml/q",)), GpuCell("1", "free"))),
        ),
    )
    return replace(base, **changes)


def test_the_moved_pod_lands_on_its_target_and_the_freed_node_is_empty() -> None:
    dom = parse(render_html(_report()))
    after = {row["data-node"]: row for row in dom.having("g", class_="after")}
    assert after["a"]["data-freed"] == "true" and after["b"]["data-freed"] == "false"
    [move] = dom.having("path", class_="move")
    assert (move["data-pod"], move["data-from"], move["data-to"]) == ("ml/p", "a", "b")
    # 2 nodes x 2 GPUs before, and after; of the after ones, b's free GPU now holds the moved pod.
    assert len(dom.having("rect", class_="gpu")) == 8
    assert len(dom.having("rect", class_="moved")) == 1
    assert len(dom.having("rect", class_="gpu-busy")) == 2 + 2  # before: p and q; after: q and p on b


def test_a_blocked_plan_names_its_guard_on_the_node_and_in_the_table() -> None:
    blocked = ReportedDecision(
        strategy="gpu-consolidation",
        namespace="ml",
        pod="q",
        node="b",
        action="skip",
        outcome=None,
        reason="PDB ml/q allows 0 more disruptions",
        blocked_by="pdb",
        group=None,
        target_node="a",
    )
    dom = parse(render_html(_report(decisions=(blocked,), freed_nodes=())))
    assert dom.having("path", class_="move") == []
    text = "".join(dom.text)
    assert "blocked: pdb" in text and "PDB ml/q allows 0 more disruptions" in text
    assert len(dom.having("table", id="blocked")) == 1


def test_cluster_text_is_escaped_everywhere() -> None:
    hostile = ReportedDecision(
        strategy="gpu-consolidation",
        namespace="ml",
        pod=HOSTILE,
        node="a",
        action="evict",
        outcome="would-evict",
        reason=f"reason {HOSTILE}",
        blocked_by=None,
        group=None,
        target_node="b",
    )
    report = _report(
        decisions=(hostile,),
        findings=(Finding(kind="leaked-vram", node="a", gpu=HOSTILE, detail=HOSTILE),),
        gpu_nodes=(
            NodeGpus(HOSTILE, HOSTILE, HOSTILE, (GpuCell("0", "busy", (f"ml/{HOSTILE}",)),)),
            NodeGpus("a", None, None, (GpuCell("0", "busy", (f"ml/{HOSTILE}",)),)),
            NodeGpus("b", None, None, (GpuCell("0", "free"),)),
        ),
    )
    page = render_html(report)
    dom = parse(page)
    assert len(dom.having("script")) == 1  # the page's own
    assert not [attrs for _, attrs in dom.tags if any(k.startswith("on") for k in attrs)]
    assert "<script>alert" not in page
    # The text survives escaping intact: as a pod of a move, in a tooltip, in the tables.
    assert dom.having("path", class_="move")[0]["data-pod"] == f"ml/{HOSTILE}"
    assert sum(HOSTILE in t for t in dom.text) >= 4


def test_credentials_in_report_text_are_redacted() -> None:
    finding = Finding(kind="telemetry-unavailable", detail="GET https://bob:hunter2@prom.example/api failed")
    page = render_html(_report(findings=(finding,)))
    assert "hunter2" not in page and "https://***@prom.example/api" in page


def test_the_page_references_nothing_outside_itself() -> None:
    dom = parse(render_html(_report()))
    for tag, attrs in dom.tags:
        for key in ("src", "href"):
            assert attrs.get(key) is None, (tag, attrs)
    assert dom.having("link") == []


def test_once_output_html_draws_every_gpu_node_of_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["once", "--snapshot", str(DEMO), "--policy", str(DEMO / "policy.yaml"), "--output", "html"])
    page = capsys.readouterr().out
    assert code == EXIT_OK
    dom = parse(page)
    before = dom.having("g", class_="before")
    # The demo's README table: 12 GPU nodes (cpu-a-1 has none), 84 GPUs.
    assert len(before) == 12
    assert len(dom.having("rect", class_="gpu")) == 2 * 84
    freed = [row["data-node"] for row in dom.having("g", class_="after") if row["data-freed"] == "true"]
    # Every node row is written with its data-node value.
    assert sorted(cast("list[str]", freed)) == ["a100-a-2", "a100-b-2"]
    moves = {(m["data-from"], m["data-to"]) for m in dom.having("path", class_="move")}
    assert ("a100-a-2", "a100-b-1") in moves and ("a100-b-1", "h100-b-1") in moves
    assert len(dom.having("rect", class_="gpu-leaked")) == 2  # l4-a-1 GPU 3, before and after
