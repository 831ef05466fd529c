"""A pod's demand, kept by its requests mapping: pods of one template share it, nothing else does."""

from __future__ import annotations

import pytest

from rebalancer import node_accounting
from rebalancer.model import GPU_RESOURCE, GpuRequest
from rebalancer.node_accounting import demand_of
from tests.builders import GIB, pod, replace


def test_pods_sharing_a_requests_mapping_share_one_demand() -> None:
    first = pod("a", gpus=2)
    second = replace(pod("b", gpus=2), requests=first.requests)

    assert demand_of(second) is demand_of(first)
    assert demand_of(first).gpu_count == 2
    assert demand_of(first).requests[0] == (GPU_RESOURCE, 2)


def test_the_same_mapping_with_another_gpu_request_is_derived_again() -> None:
    # A share resource (not `nvidia.com/gpu`) translates to a GPU request the mapping alone does not say.
    share = pod("share", gpus=1, gpu_milli=250, extra={"nvidia.com/gpu.shared": 1})
    whole = replace(share, gpu=GpuRequest(count=1, milli_per_device=1000))

    assert (demand_of(share).gpu_count, demand_of(share).gpu_milli) == (1, 250)
    assert (demand_of(whole).gpu_count, demand_of(whole).gpu_milli) == (1, 1000)
    assert (demand_of(share).gpu_count, demand_of(share).gpu_milli) == (1, 250)


def test_equal_mappings_of_their_own_give_equal_demands() -> None:
    assert demand_of(pod("a", memory=8 * GIB)) == demand_of(pod("b", memory=8 * GIB))
    assert demand_of(pod("a", memory=8 * GIB)) != demand_of(pod("b", memory=9 * GIB))


def test_a_full_table_starts_over_and_still_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_accounting, "_DEMANDS", {})
    monkeypatch.setattr(node_accounting, "_DEMANDS_KEPT", 2)
    pods = [pod(f"p{n}", cpu_milli=1000 * (n + 1)) for n in range(5)]

    assert [demand_of(p).score_cpu for p in pods] == [1000, 2000, 3000, 4000, 5000]
    assert len(node_accounting._DEMANDS) <= 2
    assert [demand_of(p).score_cpu for p in pods] == [1000, 2000, 3000, 4000, 5000]
