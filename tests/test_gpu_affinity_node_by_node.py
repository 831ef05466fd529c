"""`gpu-affinity` looks at a snapshot's pods node by node when they are listed node by node (keeping
what it found of each node while its objects stay the same), else pod by pod: both give the same
result, records in the pods' order.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from rebalancer.model import Pod
from rebalancer.registry import StrategyContext
from strategies.gpu_affinity import GpuAffinityArgs, _grouped_by_node, gpu_affinity
from tests.builders import A100, L4, node, pod, snapshot
from tests.test_gpu_affinity import prefers, wants

NODES = [node("l4-a", gpus=4, model=L4), node("a100-a", model=A100), node("a100-b", model=A100)]


def _pods() -> list[Pod]:
    """Node by node: pods that match, violate (old and young), have no rule, prefer, form a gang."""
    return [
        wants(L4, "fits", "l4-a"),
        wants(A100, "moved-off-l4", "l4-a"),
        pod("no-rule", "l4-a"),
        wants(A100, "young-on-l4", "l4-a", age=timedelta(minutes=1)),
        prefers(pod("prefers-l4", "a100-a"), (10, L4)),
        wants(A100, "gang-0", "a100-a", gang="ml/g"),
        wants(A100, "gang-1", "a100-b", gang="ml/g"),
        pod("terminating", "a100-b", terminating_for=timedelta(seconds=5)),
        wants(A100, "fits-too", "a100-b"),
    ]


@pytest.mark.parametrize("preferred", [False, True])
def test_node_by_node_and_pod_by_pod_agree(preferred: bool) -> None:
    args = GpuAffinityArgs(preferred=preferred)
    pods = _pods()
    listed = snapshot(NODES, pods)
    assert _grouped_by_node(listed)
    # One pending pod at the end: the pods are no longer those of the nodes, node by node.
    pending = snapshot(NODES, [*pods, pod("pending", None)])
    assert not _grouped_by_node(pending)
    by_node = gpu_affinity(listed, args, StrategyContext())
    assert by_node == gpu_affinity(pending, args, StrategyContext())
    assert by_node == gpu_affinity(snapshot(NODES, pods), args, StrategyContext())  # what was kept
    assert by_node.proposals and by_node.not_chosen
    assert {r.pod for r in by_node.not_chosen} >= {"fits", "no-rule", "young-on-l4", "fits-too"}
