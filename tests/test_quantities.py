"""Resource quantities: the Kubernetes grammar, integer extended resources and physical bounds.

The parse table is ported from kubernetes/apimachinery `pkg/api/resource/quantity_test.go`
(`TestQuantityParse`): every valid input parses to the value upstream expects (rounded up to nano
precision as upstream does), and every invalid one is refused.
"""

from __future__ import annotations

import copy
import random
from decimal import ROUND_UP, Decimal
from typing import Any

import pytest

from rebalancer.policy import GangConfig, GpuSharingConfig
from rebalancer.sources.kube_objects import node_from_json
from rebalancer.sources.kube_pods import pod_from_json
from rebalancer.sources.object_fields import MAX_GPU_DEVICES, ObjectError, parse_kubernetes_quantity

KI, MI, GI, TI, PI, EI = (1024**n for n in range(1, 7))

# (input, value) from TestQuantityParse; upstream's `decQuantity(v, s, _)` is v * 10^s.
UPSTREAM_VALID: list[tuple[str, Decimal]] = [
    ("0", Decimal(0)),
    ("0n", Decimal(0)),
    ("0u", Decimal(0)),
    ("0m", Decimal(0)),
    ("0Ki", Decimal(0)),
    ("0k", Decimal(0)),
    ("0Mi", Decimal(0)),
    ("0M", Decimal(0)),
    ("0Gi", Decimal(0)),
    ("0G", Decimal(0)),
    ("0Ti", Decimal(0)),
    ("0T", Decimal(0)),
    ("1", Decimal(1)),
    ("1Ki", Decimal(KI)),
    ("8Ki", Decimal(8 * KI)),
    ("7Mi", Decimal(7 * MI)),
    ("6Gi", Decimal(6 * GI)),
    ("5Ti", Decimal(5 * TI)),
    ("4Pi", Decimal(4 * PI)),
    ("3Ei", Decimal(3 * EI)),
    ("10Ti", Decimal(10 * TI)),
    ("100Ti", Decimal(100 * TI)),
    ("5n", Decimal("5e-9")),
    ("4u", Decimal("4e-6")),
    ("3m", Decimal("3e-3")),
    ("9", Decimal(9)),
    ("8k", Decimal(8000)),
    ("50k", Decimal(50000)),
    ("7M", Decimal("7e6")),
    ("6G", Decimal("6e9")),
    ("5T", Decimal("5e12")),
    ("40T", Decimal("4e13")),
    ("300T", Decimal("3e14")),
    ("2P", Decimal("2e15")),
    ("1E", Decimal("1e18")),
    ("1E-3", Decimal("1e-3")),
    ("1e3", Decimal("1e3")),
    ("1E6", Decimal("1e6")),
    ("1e9", Decimal("1e9")),
    ("1E12", Decimal("1e12")),
    ("1e15", Decimal("1e15")),
    ("1E18", Decimal("1e18")),
    ("1e14", Decimal("1e14")),
    ("1e13", Decimal("1e13")),
    ("100.035k", Decimal(100035)),
    ("0.001", Decimal("1e-3")),
    ("0.0005k", Decimal("5e-1")),
    ("0.005", Decimal("5e-3")),
    ("0.05", Decimal("5e-2")),
    ("0.5", Decimal("5e-1")),
    ("0.00050k", Decimal("5e-1")),
    ("0.00500", Decimal("5e-3")),
    ("0.05000", Decimal("5e-2")),
    ("0.50000", Decimal("5e-1")),
    ("0.5e0", Decimal("5e-1")),
    ("0.5e-1", Decimal("5e-2")),
    ("0.5e-2", Decimal("5e-3")),
    ("10.035M", Decimal("10035e3")),
    ("1.2e3", Decimal("12e2")),
    ("1.3E+6", Decimal("13e5")),
    ("1.40e9", Decimal("14e8")),
    ("1.53E12", Decimal("153e10")),
    ("1.6e15", Decimal("16e14")),
    ("1.7E18", Decimal("17e17")),
    ("9.01", Decimal("901e-2")),
    ("8.1k", Decimal("81e2")),
    ("7.123456M", Decimal(7123456)),
    ("6.987654321G", Decimal(6987654321)),
    ("5.444T", Decimal("5444e9")),
    ("40.1T", Decimal("401e11")),
    ("300.2T", Decimal("3002e11")),
    ("2.5P", Decimal("25e14")),
    ("1.01E", Decimal("101e16")),
    # Things that saturate / round: up to the next nano, as upstream.
    ("3.001n", Decimal("4e-9")),
    ("1.1E-9", Decimal("2e-9")),
    ("0.0000000001", Decimal("1e-9")),
    ("0.0000000005", Decimal("1e-9")),
    ("0.00000000050", Decimal("1e-9")),
    ("0.5e-9", Decimal("1e-9")),
    ("0.9n", Decimal("1e-9")),
    ("0.00000012345", Decimal("124e-9")),
    ("0.00000012354", Decimal("124e-9")),
    ("9Ei", Decimal(2**63 - 1)),  # binary quantities are capped at the int64 maximum
    ("9223372036854775807Ki", Decimal(2**63 - 1)),
    ("12E", Decimal("12e18")),
    ("100.035Ki", Decimal("10243584e-2")),
    ("0.5Mi", Decimal(MI // 2)),
    ("0.05Gi", Decimal("536870912e-1")),
    ("0.025Ti", Decimal("274877906944e-1")),
    ("0.000000000001Ki", Decimal("2e-9")),
    (".001", Decimal("1e-3")),
    (".0001k", Decimal("100e-3")),
    ("1.", Decimal(1)),
    ("1.G", Decimal("1e9")),
]

UPSTREAM_INVALID = [
    "",
    "1.1.M",
    "1+1.0M",
    "0.1mi",
    "0.1am",
    "aoeu",
    ".5i",
    "1i",
    "-3.01i",
    "-3.01e-",
    " 1",
    "1 ",
]
# What Python's Decimal accepts but Kubernetes' grammar does not.
LOOSER_THAN_UPSTREAM = ["NaN", "Infinity", "-inf", "1_000", "1e3Mi", "1K", "0x10", "１"]  # noqa: RUF001


@pytest.mark.parametrize(("text", "value"), UPSTREAM_VALID)
def test_upstream_valid_quantities_parse_to_upstream_values(text: str, value: Decimal) -> None:
    assert parse_kubernetes_quantity(text) == value


@pytest.mark.parametrize("text", UPSTREAM_INVALID + LOOSER_THAN_UPSTREAM)
def test_quantities_outside_the_grammar_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_kubernetes_quantity(text)


def test_negative_quantities_parse_but_requests_refuse_them() -> None:
    assert parse_kubernetes_quantity("-2") == Decimal(-2)
    with pytest.raises(ObjectError, match='quantity "-2" is negative'):
        pod_from_json(pod_requesting("cpu", "-2"), gangs=GangConfig(), sharing=GpuSharingConfig())


# --------------------------------------------------------------------------- objects

NODE: dict[str, Any] = {
    "kind": "Node",
    "metadata": {"name": "gpu-a-1", "labels": {"nvidia.com/gpu.count": "8"}},
    "status": {"allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8", "pods": "110"}},
}


def pod_requesting(resource: str, amount: object) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": "train-0", "namespace": "ml"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {resource: amount}}}]},
    }


def pod_error(resource: str, amount: object) -> str:
    with pytest.raises(ObjectError) as info:
        pod_from_json(pod_requesting(resource, amount), gangs=GangConfig(), sharing=GpuSharingConfig())
    return str(info.value)


def node_error(mutate: Any) -> str:
    obj = copy.deepcopy(NODE)
    mutate(obj)
    with pytest.raises(ObjectError) as info:
        node_from_json(obj)
    return str(info.value)


def test_a_fractional_extended_resource_is_refused_as_the_api_server_does() -> None:
    assert pod_error("nvidia.com/gpu", "1.5") == (
        'Pod ml/train-0: spec.containers[0].resources.limits.nvidia.com/gpu: quantity "1.5" must be an '
        "integer (nvidia.com/gpu is an extended resource)"
    )
    assert "must be an integer" in pod_error("nvidia.com/mig-1g.10gb", "500m")
    assert "must be an integer" in pod_error("nvidia.com/gpu", 1.5)
    # Whole units written otherwise are integers.
    pod = pod_from_json(
        pod_requesting("nvidia.com/gpu", "2000m"), gangs=GangConfig(), sharing=GpuSharingConfig()
    )
    assert pod.gpu.count == 2


def test_native_resources_may_be_fractional() -> None:
    pod = pod_from_json(pod_requesting("cpu", "1.5"), gangs=GangConfig(), sharing=GpuSharingConfig())
    assert pod.requests["cpu"] == 1500


@pytest.mark.parametrize("amount", ["1e400", "2Gi", "1Ei", "99999999999", str(MAX_GPU_DEVICES + 1)])
def test_gpu_requests_are_bounded_to_something_physical(amount: str) -> None:
    message = pod_error("nvidia.com/gpu", amount)
    assert message.startswith("Pod ml/train-0: spec.containers[0].resources.limits.nvidia.com/gpu: ")
    assert f"more GPU devices than a node can hold (at most {MAX_GPU_DEVICES})" in message


def test_a_pod_at_the_device_bound_is_accepted() -> None:
    pod = pod_from_json(
        pod_requesting("nvidia.com/gpu", str(MAX_GPU_DEVICES)), gangs=GangConfig(), sharing=GpuSharingConfig()
    )
    assert pod.gpu.count == MAX_GPU_DEVICES


def test_node_device_counts_are_bounded() -> None:
    message = node_error(lambda o: o["status"]["allocatable"].update({"nvidia.com/gpu": "2Gi"}))
    assert message.startswith("Node gpu-a-1: status.allocatable.nvidia.com/gpu: ")
    assert "more GPU devices than a node can hold" in message
    message = node_error(lambda o: o["status"]["allocatable"].update({"nvidia.com/mig-1g.10gb": "1e400"}))
    assert message.startswith("Node gpu-a-1: status.allocatable.nvidia.com/mig-1g.10gb: ")


@pytest.mark.parametrize("label", ["99999999999", "-1", "eight", "1e3", "9" * 200_000])
def test_the_gpu_count_label_is_checked(label: str) -> None:
    message = node_error(lambda o: o["metadata"]["labels"].update({"nvidia.com/gpu.count": label}))
    assert message.startswith("Node gpu-a-1: metadata.labels.nvidia.com/gpu.count: ")
    assert f"not a GPU count (a whole number from 0 to {MAX_GPU_DEVICES})" in message


def test_a_huge_native_quantity_is_too_large_not_an_overflow() -> None:
    message = pod_error("cpu", "1e400")
    assert message == (
        'Pod ml/train-0: spec.containers[0].resources.limits.cpu: quantity "1e400" is too large '
        "(more than the 64-bit integers Kubernetes counts resources in)"
    )
    assert "too large" in pod_error("memory", "1e30")


def test_a_huge_value_is_quoted_cut_short() -> None:
    message = pod_error("cpu", "9" * 5000)
    assert len(message) < 300
    assert "more characters" in message


def _fuzzed_quantities(count: int) -> list[str]:
    rng = random.Random(16)
    alphabet = "0123456789.+-eEKMGTPEnumki"
    texts = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(count)}
    return sorted(texts | {text for text, _ in UPSTREAM_VALID})


def test_values_within_the_grammar_are_the_official_clients() -> None:
    """The value is computed without the Kubernetes client (a snapshot is read without importing it):
    for every text the grammar takes, it is what the client's `parse_quantity` computes, rounded as
    upstream rounds."""
    from kubernetes.utils import parse_quantity

    compared = 0
    for text in _fuzzed_quantities(60_000):
        try:
            ours = parse_kubernetes_quantity(text)
        except ValueError:
            continue
        theirs: Decimal = parse_quantity(text)  # type: ignore[no-untyped-call]
        if theirs != 0 and theirs.adjusted() < 19:
            theirs = theirs.quantize(Decimal("1e-9"), rounding=ROUND_UP)
        if text.endswith("i") and abs(theirs) > 2**63 - 1:
            theirs = Decimal(2**63 - 1).copy_sign(theirs)
        assert ours == theirs, text
        compared += 1
    assert compared > 1_000
