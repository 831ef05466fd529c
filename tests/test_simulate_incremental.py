"""A replay whose snapshots reuse objects cycle after cycle decides exactly as one that builds them anew.

The replay's snapshot builder hands the same Pod and Node objects for everything that did not change,
as a watch cache does, and the cycle then keeps what it derived from them (`rebalancer.memo`, the
placement accounting). Building every snapshot from new objects instead (a deep copy each cycle, as a
source without a cache would) defeats every such cache: each cycle's report, not-chosen records and
hints, and the replay's results, must be the same.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rebalancer import report as report_json
from rebalancer.cycle import run_cycle
from rebalancer.cycle_report import CycleReport
from rebalancer.model import Snapshot
from rebalancer.policy import parse_policy
from rebalancer.simulate import rebalancers as replay_rebalancers
from rebalancer.simulate import result_to_dict
from rebalancer.simulate.cluster import SimCluster
from rebalancer.simulate.engine import EngineConfig, Replay
from rebalancer.simulate.rebalancers import PACKED_SCHEDULER, SnapshotBuilder
from tests.test_simulate_engine import random_trace


class _NewObjects(SnapshotBuilder):
    """Every snapshot made of new objects: nothing derived in an earlier cycle can be reused."""

    def snapshot(self, now: float, cluster: SimCluster) -> Snapshot:
        return copy.deepcopy(super().snapshot(now, cluster))


def _replay(seed: int, *, reuse: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, Any]]:
    nodes, jobs, window = random_trace(seed)
    # The shipped strategies, nodes old enough after 10 minutes: every part of the consolidation runs.
    policy = parse_policy(
        {
            "strategies": [
                {"name": "gpu-affinity"},
                {"name": "topology-spread"},
                {"name": "gpu-consolidation", "args": {"min_node_age": "10m"}},
            ]
        },
        "<test>",
    )
    replay = Replay(nodes, jobs, window, EngineConfig(rebalancer="on", policy=policy, check_invariants=True))
    if not reuse:
        builder = _NewObjects(jobs, PACKED_SCHEDULER)
        replay.builder = builder
        assert replay.policy_rebalancer is not None
        replay.policy_rebalancer.builder = builder
    reports: list[str] = []

    def recorded(*args: Any, **kwargs: Any) -> CycleReport:
        report = run_cycle(*args, **kwargs)
        reports.append(report_json.to_json(report) + repr((report.not_chosen, report.hints)))
        return report

    monkeypatch.setattr(replay_rebalancers, "run_cycle", recorded)
    result = result_to_dict(replay.run())
    result.pop("wall_seconds", None)
    return reports, result


@pytest.mark.parametrize("seed", [11, 23])
def test_reusing_objects_across_cycles_changes_no_decision(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    reused, reused_result = _replay(seed, reuse=True, monkeypatch=monkeypatch)
    fresh, fresh_result = _replay(seed, reuse=False, monkeypatch=monkeypatch)
    assert len(reused) == len(fresh) > 50
    for cycle, (one, other) in enumerate(zip(reused, fresh, strict=True)):
        assert one == other, f"cycle {cycle}"
    assert reused_result == fresh_result
    assert reused_result["evictions"] > 0  # the replay moved pods: decisions were compared, not silence
