"""The demo's HTML report in a real browser: headless Chromium (tests/chromium.py) loads the page the
installed `rebalancer once --output html` prints, offline, and both its DOM after the scripts ran and
its screenshot are checked: every GPU node drawn, the freed nodes marked, the moves drawn, no script
error, and a PNG of the window's size that shows the GPU states' colours."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from tests.chromium import Chromium, ensure_chromium
from tests.html_dom import parse

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo-cluster"
CONSOLE_SCRIPT = str(Path(sys.executable).parent / "rebalancer")
WINDOW = (1240, 980)  # docs/report.png's size
# The demo's README tables: 12 GPU nodes (cpu-a-1 has none) holding 84 GPUs; two nodes freed.
GPU_NODES, GPUS, FREED = 12, 84, ["a100-a-2", "a100-b-2"]
# Its five evictions each name a predicted target (the idle notebook is scaled down, not moved).
MOVES = 5
# Fill colours of the GPU squares (rebalancer/report_html.py), as a screenshot's pixels show them.
BUSY, IDLE, LEAKED = (0x2E, 0x7D, 0x32), (0xF9, 0xA8, 0x25), (0xC6, 0x28, 0x28)


@pytest.fixture(scope="module")
def chromium() -> Chromium:
    return Chromium(ensure_chromium())


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    done = subprocess.run(
        [
            CONSOLE_SCRIPT,
            "once",
            "--snapshot",
            str(DEMO),
            "--policy",
            str(DEMO / "policy.yaml"),
            "--output",
            "html",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    page = tmp_path_factory.mktemp("report") / "report.html"
    page.write_text(done.stdout, encoding="utf-8")
    return page


def test_the_browser_runs_the_page_and_finds_every_node_and_move(chromium: Chromium, demo_page: Path) -> None:
    rendered = chromium.dump_dom(demo_page)
    dom = parse(rendered.stdout)
    [root] = dom.having("html")
    assert root.get("data-rendered") == "ok", "the page's script did not run"
    assert root.get("data-js-error") is None, root.get("data-js-error")
    assert "Uncaught" not in rendered.stderr, rendered.stderr[-2000:]
    assert len(dom.having("g", class_="before")) == GPU_NODES
    assert len(dom.having("g", class_="after")) == GPU_NODES
    assert len(dom.having("rect", class_="gpu")) == 2 * GPUS
    freed = sorted(str(g["data-node"]) for g in dom.having("g", class_="after") if g["data-freed"] == "true")
    assert freed == FREED
    moves = dom.having("path", class_="move")
    assert len(moves) == MOVES
    assert {(m["data-from"], m["data-to"]) for m in moves} >= {("a100-a-2", "a100-b-1"), ("l4-a-1", "l4-b-1")}


def test_the_screenshot_is_the_window_size_and_shows_the_gpu_states(
    chromium: Chromium, demo_page: Path, tmp_path: Path
) -> None:
    png = tmp_path / "report.png"
    chromium.screenshot(demo_page, png, WINDOW)
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == WINDOW
        pixels = image.convert("RGB")
        colours = pixels.getcolors(maxcolors=WINDOW[0] * WINDOW[1])
    assert colours is not None
    counts = {colour: n for n, colour in colours}
    white = counts.get((255, 255, 255), 0)
    assert white < 0.95 * WINDOW[0] * WINDOW[1], "the page rendered (nearly) blank"
    # Each square is 16 px wide: the demo's busy, idle and leaked GPUs are all painted.
    assert counts.get(BUSY, 0) > 100 * 14 * 14
    assert counts.get(IDLE, 0) >= 2 * 14 * 14
    assert counts.get(LEAKED, 0) >= 2 * 14 * 14
