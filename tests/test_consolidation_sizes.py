"""`gpu-consolidation`'s node sizes, kept from one snapshot to the next, equal sizes worked out afresh.

`sizes_of` hands the next snapshot a Sizes made from the last one, which takes over the GPUs per node
of the nodes that did not change and, per kind of pod and size, whether a larger node admits it (judging
again only the new and changed nodes). Over random histories of nodes added, removed, tainted, cordoned
and relabelled, every answer must be that of a Sizes made from the snapshot alone.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from rebalancer.model import Snapshot
from strategies.gpu_consolidation_sizes import Sizes, sizes_of
from tests.test_placement_incremental import PROBES, histories


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=histories())
def test_sizes_taken_over_from_the_last_snapshot_equal_sizes_from_scratch(steps: list[Snapshot]) -> None:
    for snap in steps:
        kept, fresh = sizes_of(snap), Sizes(snap.nodes)
        for name in snap.nodes:
            assert kept.of(name) == fresh.of(name)
        for size in (1.0, 2.0, 4.0, 8.0):
            assert kept.more_than(size) == fresh.more_than(size)
            assert kept.at_least(size) == fresh.at_least(size)
            for probe in PROBES:
                assert kept.could_go_larger(probe, size) == fresh.could_go_larger(probe, size), (
                    probe.name,
                    size,
                )
