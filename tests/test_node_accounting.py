"""A pod's demand (what it takes from a node, the same for every pod of its template), and the GPU
devices its annotation says it holds."""

from __future__ import annotations

import pytest

from rebalancer.model import GPU_RESOURCE, GpuRequest
from rebalancer.node_accounting import GPU_INDEX_ANNOTATION, assigned_devices, demand_of
from tests.builders import GIB, pod, replace


def test_pods_of_one_template_share_one_demand() -> None:
    first = pod("a", gpus=2)
    second = replace(pod("b", gpus=2), requests=first.requests)

    assert demand_of(second) is demand_of(first)
    assert demand_of(first).gpu_count == 2
    assert demand_of(first).requests[0] == (GPU_RESOURCE, 2)


def test_a_share_on_the_same_requests_is_not_a_whole_gpu() -> None:
    # A share resource (not `nvidia.com/gpu`) translates to a GPU request the mapping alone does not say.
    share = pod("share", gpus=1, gpu_milli=250, extra={"nvidia.com/gpu.shared": 1})
    whole = replace(share, gpu=GpuRequest(count=1, milli_per_device=1000))

    assert (demand_of(share).gpu_count, demand_of(share).gpu_milli) == (1, 250)
    assert (demand_of(whole).gpu_count, demand_of(whole).gpu_milli) == (1, 1000)


def test_equal_requests_give_equal_demands() -> None:
    assert demand_of(pod("a", memory=8 * GIB)) == demand_of(pod("b", memory=8 * GIB))
    assert demand_of(pod("a", memory=8 * GIB)) != demand_of(pod("b", memory=9 * GIB))


@pytest.mark.parametrize(
    ("text", "devices"),
    [
        ("1-7", (1, 7)),
        ("2-0", (0, 2)),
        ("0-0", None),  # one device named twice
        ("0", None),  # one device for a pod of two GPUs
        ("0-8", None),  # no device 8 on an 8-GPU node
        ("a-1", None),
        ("", None),
        ("²-1", None),  # a digit to str.isdigit, not to int()
        ("٣-1", None),  # a decimal digit to int(), but not one a scheduler writes
    ],
)
def test_the_devices_an_annotation_names(text: str, devices: tuple[int, ...] | None) -> None:
    holder = pod("p", "n1", gpus=2, annotations={GPU_INDEX_ANNOTATION: text})

    assert assigned_devices(holder, demand_of(holder), 8) == devices
