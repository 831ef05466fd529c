"""The Alibaba GenAI per-container GPU duty-cycle trace (`../shared/data/alibaba-genai-v2026/`), read for
tests that backfill realistic DCGM_FI_DEV_GPU_UTIL history.

`read_genai_trace(directory)` extracts the archive into `directory` and returns each container's
samples, `(timestamp seconds, duty cycle percent)` sorted by time, by container id. The shared data sits
beside the checkout in CI; its absence is a broken setup, not a skip. This module must stay a test
helper: no project code imports it.
"""

from __future__ import annotations

import csv
import tarfile
from collections import defaultdict
from pathlib import Path

GENAI = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-genai-v2026"
ARCHIVE = GENAI / "pod_gpu_duty_cycle_anon.tar.gz"
CONTAINERS = 143


def read_genai_trace(directory: Path) -> dict[str, list[tuple[float, float]]]:
    assert ARCHIVE.exists(), f"{ARCHIVE} is missing: the GenAI duty-cycle trace is needed for this test"
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(directory, filter="data")
    by_container: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with (directory / "pod_gpu_duty_cycle_anon.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            by_container[row["container_ip"]].append((float(row["timestamp_anon"]), float(row["value"])))
    assert len(by_container) == CONTAINERS
    return {container: sorted(rows) for container, rows in by_container.items()}
