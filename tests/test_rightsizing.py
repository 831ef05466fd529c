"""The right-sizing judgement: each case's expected recommendation and saving worked out by hand."""

from __future__ import annotations

import pytest
import yaml

from rebalancer.gpu_catalogue import DEFAULT_CATALOGUE, model_of
from rebalancer.policy import EXAMPLE_GPU_PRICES
from rebalancer.rightsizing import Evidence, advise
from tests.builders import replace


def price_of(product: str | None) -> float | None:
    """The shipped policy's example prices (prices.per_gpu_hour)."""
    return EXAMPLE_GPU_PRICES.get(product or "")


A100_80 = "NVIDIA-A100-SXM4-80GB"
L4 = "NVIDIA-L4"
H100 = "NVIDIA-H100-80GB-HBM3"


def evidence(**changes: object) -> Evidence:
    base = Evidence(
        namespace="ml",
        workload="Deployment/infer",
        container="server",
        product=A100_80,
        replicas=2,
        gpus_per_replica=1,
        peak_memory_gib=30.0,
        p95_memory_gib=25.0,
        p95_utilization_percent=60.0,
        samples=2000,
    )
    return replace(base, **changes)


def test_fits_a_cheaper_model_present_in_the_cluster() -> None:
    # 16 GiB peak + 20 % = 19.2 GiB <= L4's 24; 30 % of an A100 (1.0) = 0.3 <= L4's 0.4. Cheapest fitting:
    # the L4 at 1.15/h (T4: 16 GiB too small, and unpriced; A10 not in the cluster).
    # 2 replicas x 730 h x (5.10 - 1.15).
    found = advise(
        evidence(peak_memory_gib=16, p95_utilization_percent=30), frozenset({A100_80, L4}), price_of
    )
    assert found.kind == "cheaper-model"
    assert found.target == L4
    assert found.monthly_saving == pytest.approx(2 * 730 * 3.95)
    patch = yaml.safe_load(found.patch)
    assert patch == {"spec": {"template": {"spec": {"nodeSelector": {"nvidia.com/gpu.product": L4}}}}}


def test_a_cheaper_model_absent_from_the_cluster_is_not_offered() -> None:
    found = advise(evidence(peak_memory_gib=16, p95_utilization_percent=30), frozenset({A100_80}), price_of)
    assert found.kind == "mig-profile"  # 19.2 GiB -> 2g.20gb; 30 % > 2/7 = 28.6 % -> 3g.40gb
    assert found.target == "3g.40gb"


def test_fits_a_mig_slice_of_its_model() -> None:
    # 8 GiB peak + 20 % = 9.6 GiB <= 10; 12 % <= 1/7 = 14.3 %: 1g.10gb, costing 5.10 / 7 an hour.
    # Saving: 2 replicas x 730 h x 5.10 x 6/7.
    found = advise(evidence(peak_memory_gib=8, p95_utilization_percent=12), frozenset({A100_80}), price_of)
    assert found.kind == "mig-profile"
    assert found.target == "1g.10gb"
    assert found.monthly_saving == pytest.approx(2 * 730 * 5.10 * 6 / 7)
    container = yaml.safe_load(found.patch)["spec"]["template"]["spec"]["containers"][0]
    assert container == {
        "name": "server",
        "resources": {
            "limits": {"nvidia.com/gpu": None, "nvidia.com/mig-1g.10gb": 1},
            "requests": {"nvidia.com/gpu": None, "nvidia.com/mig-1g.10gb": 1},
        },
    }


def test_without_a_container_name_there_is_no_patch_but_a_note() -> None:
    found = advise(
        evidence(peak_memory_gib=8, p95_utilization_percent=12, container=""), frozenset({A100_80}), price_of
    )
    assert (found.kind, found.patch) == ("mig-profile", "")
    assert any("names no container" in note for note in found.notes)


def test_nine_gib_peak_needs_more_than_a_ten_gib_slice_with_headroom() -> None:
    # 9 GiB + 20 % = 10.8 GiB > 10: the next profile with the memory, 2g.20gb (15 % <= 2/7).
    found = advise(evidence(peak_memory_gib=9, p95_utilization_percent=15), frozenset({A100_80}), price_of)
    assert found.target == "2g.20gb"
    assert found.monthly_saving == pytest.approx(2 * 730 * 5.10 * 5 / 7)


def test_needs_its_gpu_when_peak_memory_is_too_high() -> None:
    # 70 GiB + 20 % = 84 GiB: more than any model or profile (80 GiB at most).
    found = advise(
        evidence(peak_memory_gib=70, p95_utilization_percent=10), frozenset({A100_80, L4}), price_of
    )
    assert found.kind == "keep"
    assert found.monthly_saving == 0
    assert found.patch == ""


def test_thin_data_is_low_confidence_never_fits() -> None:
    found = advise(
        evidence(peak_memory_gib=1, p95_utilization_percent=1, samples=99),
        frozenset({L4}),
        price_of,
        min_samples=100,
    )
    assert found.kind == "low-confidence"
    assert "99 samples" in found.reason
    assert found.monthly_saving == 0


def test_an_unknown_model_is_low_confidence() -> None:
    found = advise(evidence(product="NVIDIA-Mystery"), frozenset({L4}), price_of)
    assert found.kind == "low-confidence"


def test_multi_gpu_with_idle_gpus_fits_fewer() -> None:
    # 4 GPUs a replica on H100, 3 idle all window: keep 1; 3 x 6.90 x 730 h x 2 replicas.
    found = advise(
        evidence(product=H100, gpus_per_replica=4, idle_all_window=(False, True, True, True)),
        frozenset({H100}),
        price_of,
    )
    assert found.kind == "fewer-gpus"
    assert found.monthly_saving == pytest.approx(3 * 6.90 * 730 * 2)
    resources = yaml.safe_load(found.patch)["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {"nvidia.com/gpu": 1}, "requests": {"nvidia.com/gpu": 1}}


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"gang": True}, "gang-scheduled"),
        ({"nvlink_bytes_per_second": 1e9}, "NVLink-heavy (p95 1 GB/s)"),  # the default bound itself
    ],
)
def test_multi_gpu_gang_or_nvlink_is_not_advised(changes: dict[str, object], why: str) -> None:
    found = advise(
        evidence(product=H100, gpus_per_replica=4, idle_all_window=(False, True, True, True), **changes),
        frozenset({H100}),
        price_of,
    )
    assert found.kind == "not-advised"
    assert why in found.reason
    assert found.monthly_saving == 0


def test_nvlink_traffic_below_the_bound_still_gets_fewer_gpus() -> None:
    found = advise(
        evidence(
            product=H100,
            gpus_per_replica=4,
            idle_all_window=(False, True, True, True),
            nvlink_bytes_per_second=0.99e9,
            profiled=True,
        ),
        frozenset({H100}),
        price_of,
    )
    assert found.kind == "fewer-gpus"
    assert found.confidence == "high"


def test_telemetry_problems_are_never_read_as_fitting() -> None:
    found = advise(
        evidence(
            peak_memory_gib=1,
            p95_utilization_percent=1,
            problems=("telemetry for 0 of the 1 GPUs of pod ml/a",),
        ),
        frozenset({A100_80, L4}),
        price_of,
    )
    assert (found.kind, found.confidence, found.monthly_saving) == ("low-confidence", "low", 0)
    assert "0 of the 1 GPUs" in found.reason


def test_confidence_says_what_was_not_measured() -> None:
    unprofiled = advise(
        evidence(peak_memory_gib=8, p95_utilization_percent=12), frozenset({A100_80}), price_of
    )
    assert unprofiled.confidence == "medium"
    assert any("DCGM_FI_DEV_GPU_UTIL" in note for note in unprofiled.notes)
    profiled = advise(
        evidence(peak_memory_gib=8, p95_utilization_percent=12, profiled=True), frozenset({A100_80}), price_of
    )
    assert (profiled.confidence, profiled.notes) == ("high", ())
    multi = advise(
        evidence(product=H100, gpus_per_replica=2, idle_all_window=(False, True), profiled=True),
        frozenset({H100}),
        price_of,
    )
    assert multi.confidence == "medium"
    assert any("NVLink traffic not measured" in note for note in multi.notes)


@pytest.mark.parametrize(
    ("peak", "expected"),
    [
        (20 / 1.2, "2g.20gb"),  # exactly 20 GiB with headroom: fits
        (20 / 1.2 + 0.01, "3g.40gb"),  # just over: the next profile with more memory
    ],
)
def test_headroom_edge(peak: float, expected: str) -> None:
    found = advise(evidence(peak_memory_gib=peak, p95_utilization_percent=10), frozenset({A100_80}), price_of)
    assert found.target == expected


def test_zero_headroom_lets_the_peak_fill_the_slice() -> None:
    found = advise(
        evidence(peak_memory_gib=10, p95_utilization_percent=10), frozenset({A100_80}), price_of, headroom=0
    )
    assert found.target == "1g.10gb"
    found = advise(evidence(peak_memory_gib=10, p95_utilization_percent=10), frozenset({A100_80}), price_of)
    assert found.target == "2g.20gb"


def test_catalogue_lists_the_common_models_and_mig_profiles_smallest_first() -> None:
    for product in (
        "Tesla-T4",
        L4,
        "NVIDIA-A10",
        "NVIDIA-A30",
        "NVIDIA-A100-SXM4-40GB",
        A100_80,
        H100,
        "NVIDIA-L40S",
    ):
        assert model_of(product) is not None
    for model in DEFAULT_CATALOGUE:
        slices = [profile.slices for profile in model.mig_profiles]
        assert slices == sorted(slices)
        assert all(profile.memory_gib <= model.memory_gib for profile in model.mig_profiles)


def test_prices_are_the_policys_a_model_without_one_is_never_offered() -> None:
    # The L4 would fit (16 GiB + 20 % <= 24; 30 % of an A100 <= 0.4), but the policy prices no L4.
    def no_l4(product: str | None) -> float | None:
        return None if product == L4 else price_of(product)

    found = advise(evidence(peak_memory_gib=16, p95_utilization_percent=30), frozenset({A100_80, L4}), no_l4)
    assert found.kind == "mig-profile"
    unpriced = advise(
        evidence(peak_memory_gib=16, p95_utilization_percent=30), frozenset({L4}), lambda _: None
    )
    assert (unpriced.kind, unpriced.monthly_saving) == ("low-confidence", 0)
    assert "prices.per_gpu_hour" in unpriced.reason
