"""Typed decoding (kube_types): the bytes path and the mapping path give the same model and the same
errors, and msgspec's refusals read as the model's own checks always read."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgspec
import pytest
import yaml

from rebalancer.policy import GangConfig, GpuSharingConfig
from rebalancer.sources import kube_types
from rebalancer.sources.kube_objects import (
    Model,
    controller_from_json,
    model_from_bytes,
    model_from_json,
    node_from_json,
)
from rebalancer.sources.kube_pods import pod_from_json
from rebalancer.sources.object_fields import ObjectError
from tests.test_kube_objects import FULL_POD, NODE, _controller, _pod

GANGS = GangConfig()
SHARING = GpuSharingConfig()
DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo-cluster"


def _both(kind: str, obj: dict[str, Any]) -> tuple[Model | str, Model | str]:
    """The model (or the error's text) from the object's JSON bytes and from the decoded mapping."""
    results: list[Model | str] = []
    reads: tuple[Callable[[], Model], ...] = (
        lambda: model_from_bytes(kind, json.dumps(obj).encode(), gangs=GANGS, sharing=SHARING),
        lambda: model_from_json(kind, obj, gangs=GANGS, sharing=SHARING),
    )
    for read in reads:
        try:
            results.append(read())
        except ObjectError as exc:
            results.append(str(exc))
    return results[0], results[1]


def _demo_objects() -> list[tuple[str, dict[str, Any]]]:
    objects: list[tuple[str, dict[str, Any]]] = []
    for name in ("nodes.json", "pods.json", "pdbs.json", "workloads.json"):
        doc = json.loads((DEMO / name).read_text(encoding="utf-8"))
        objects += [(item["kind"], item) for item in doc["items"]]
    return objects


def test_every_demo_object_reads_the_same_from_bytes_and_from_a_mapping() -> None:
    objects = _demo_objects()
    assert {kind for kind, _ in objects} >= {"Node", "Pod", "PodDisruptionBudget", "ReplicaSet", "Job"}
    for kind, obj in objects:
        from_bytes, from_mapping = _both(kind, obj)
        assert not isinstance(from_bytes, str), from_bytes
        assert from_bytes == from_mapping


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda o: o["metadata"]["labels"].update(rev=7),
            "Pod ml/train-0: metadata.labels.rev: expected a string, got the number 7",
        ),
        (
            lambda o: o["spec"]["tolerations"][1].update(effect=["NoExecute"]),
            "Pod ml/train-0: spec.tolerations[1].effect: expected a string, got a list",
        ),
        (
            lambda o: o["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"
            ][0]["matchExpressions"][0].update(values=["40000", 40000]),
            "Pod ml/train-0: spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
            "nodeSelectorTerms[0].matchExpressions[0].values: expected a list of strings",
        ),
        (
            lambda o: o["spec"]["topologySpreadConstraints"][0].update(matchLabelKeys="rev"),
            "Pod ml/train-0: spec.topologySpreadConstraints[0].matchLabelKeys: expected a list of strings",
        ),
        (
            lambda o: o["metadata"].update(creationTimestamp=1764417600),
            "Pod ml/train-0: metadata.creationTimestamp: expected an RFC 3339 timestamp, got the number "
            "1764417600",
        ),
        (
            lambda o: o["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": True}),
            "Pod ml/train-0: spec.containers[0].resources.limits.nvidia.com/gpu: expected a quantity such "
            "as 500m, 2 or 4Gi, got a boolean",
        ),
        (
            lambda o: o["spec"]["overhead"].update(cpu={"m": 250}),
            "Pod ml/train-0: spec.overhead.cpu: expected a quantity such as 500m, 2 or 4Gi, got an object",
        ),
        (
            lambda o: o["spec"].update(priority=1000.0),
            "Pod ml/train-0: spec.priority: expected an integer, got the number 1000.0",
        ),
        (
            lambda o: o["spec"]["containers"][1].update(resources=[]),
            "Pod ml/train-0: spec.containers[1].resources: expected an object, got a list",
        ),
        (
            lambda o: o["metadata"]["ownerReferences"][0].update(controller="true"),
            "Pod ml/train-0: metadata.ownerReferences[0].controller: expected true or false, got the "
            "string 'true'",
        ),
        (
            lambda o: o["spec"]["volumes"].append("scratch"),
            "Pod ml/train-0: spec.volumes[4]: expected an object, got the string 'scratch'",
        ),
        (
            lambda o: o["spec"]["volumes"][0]["emptyDir"].update(medium=1),
            "Pod ml/train-0: spec.volumes[0].emptyDir.medium: expected a string, got the number 1",
        ),
        (
            lambda o: o["spec"]["volumes"][0].update(emptyDir=5),
            "Pod ml/train-0: spec.volumes[0].emptyDir: expected an object, got the number 5",
        ),
        (
            lambda o: o["spec"]["volumes"][0].update(emptyDir=["Memory"]),
            "Pod ml/train-0: spec.volumes[0].emptyDir: expected an object, got a list",
        ),
        (lambda o: o.update(spec=7), "Pod ml/train-0: spec: expected an object, got the number 7"),
        # The metadata's problems first, as the model's checks always began with them.
        (
            lambda o: o["metadata"].update(name=5, labels={"a": 1}),
            "Pod ml/<unnamed>: metadata.name: expected a string, got the number 5",
        ),
        (
            lambda o: o["metadata"].update(namespace=None, labels={"a": 1}),
            "Pod default/train-0: metadata.labels.a: expected a string, got the number 1",
        ),
        (
            lambda o: (o["metadata"].pop("name"), o["spec"].update(priority="x")),
            "Pod ml/<unnamed>: metadata.name: required field is missing",
        ),
    ],
)
def test_a_wrong_type_is_named_alike_from_bytes_and_from_a_mapping(mutate: Any, message: str) -> None:
    obj = copy.deepcopy(FULL_POD)
    mutate(obj)
    assert _both("Pod", obj) == (message, message)


def test_a_json_number_too_large_for_a_float_reads_as_the_standard_library_reads_it() -> None:
    """msgspec alone calls 1e400 out of range; read as infinity, the quantity check names it."""
    text = json.dumps(_pod()).replace('"cpu": "1"', '"cpu": 1e400')
    with pytest.raises(ObjectError, match=r'requests.cpu: invalid quantity "inf"'):
        model_from_bytes("Pod", text.encode(), gangs=GANGS, sharing=SHARING)


def test_a_number_past_what_python_converts_is_an_object_error() -> None:
    text = json.dumps(_pod()).replace('"cpu": "1"', '"cpu": ' + "9" * 4301)
    with pytest.raises(ObjectError, match=r"^Pod <unnamed>: cannot be read: Integer value out of range"):
        model_from_bytes("Pod", text.encode(), gangs=GANGS, sharing=SHARING)


def test_nodes_and_controllers_name_their_fields_alike() -> None:
    node = copy.deepcopy(NODE)
    node["status"]["conditions"][0]["status"] = False
    message = "Node gpu-a-1: status.conditions[0].status: expected a string, got a boolean"
    assert _both("Node", node) == (message, message)
    replica_set = _controller("ReplicaSet", "apps/v1", replicas=True)
    message = "ReplicaSet ml/serve-5f: spec.replicas: expected an integer, got a boolean"
    assert _both("ReplicaSet", replica_set) == (message, message)
    # Another kind's field of the same name is not read, so never refused.
    notebook = _controller("Notebook", "kubeflow.org/v1", replicas="many")
    from_bytes, from_mapping = _both("Notebook", notebook)
    assert from_bytes == from_mapping == controller_from_json(notebook)


def test_a_mapping_that_is_not_a_dict_is_read_whole() -> None:
    """msgspec reads a mapping that is not a dict through its attributes, where `values` is a method:
    such mappings are made dicts first."""
    pod = copy.deepcopy(FULL_POD)
    pod["metadata"]["labels"]["values"] = "x"
    frozen = json.loads(json.dumps(pod), object_hook=MappingProxyType)
    assert pod_from_json(frozen, gangs=GANGS, sharing=SHARING) == pod_from_json(
        pod, gangs=GANGS, sharing=SHARING
    )


def test_a_yaml_label_key_that_is_not_a_string_is_named() -> None:
    node = yaml.safe_load("kind: Node\nmetadata:\n  name: n1\n  labels:\n    1: one\n")
    with pytest.raises(ObjectError) as info:
        node_from_json(node)
    assert (
        str(info.value)
        == "Node n1: metadata.labels: expected an object with string keys, got the key the number 1"
    )


def test_an_item_of_another_kind_is_refused_typed_and_read_as_its_own() -> None:
    data = json.dumps(NODE).encode()
    with pytest.raises(msgspec.ValidationError):
        kube_types.decode_item(data, "Pod")
    assert kube_types.kind_of(kube_types.decode_item(data, None)) == "Node"
    with pytest.raises(msgspec.ValidationError):
        kube_types.decode_item(json.dumps({**NODE, "kind": "ConfigMap"}).encode(), None)


def test_equal_tolerations_and_affinities_share_one_model_object() -> None:
    one = model_from_bytes("Pod", json.dumps(FULL_POD).encode(), gangs=GANGS, sharing=SHARING)
    other = copy.deepcopy(FULL_POD)
    other["metadata"]["name"] = "train-1"
    two = model_from_bytes("Pod", json.dumps(other).encode(), gangs=GANGS, sharing=SHARING)
    assert one.tolerations is two.tolerations  # type: ignore[union-attr]
    assert one.required_affinity is two.required_affinity  # type: ignore[union-attr]
    assert one.requests is two.requests  # type: ignore[union-attr]


def test_a_quantity_spelt_as_a_boolean_never_matches_a_remembered_one() -> None:
    """Remembered resources are keyed by their spelling: True equals 1 in Python, but is refused."""
    good = _pod(containers=[{"name": "m", "resources": {"limits": {"nvidia.com/gpu": 1}}}])
    assert pod_from_json(good, gangs=GANGS, sharing=SHARING).gpu.count == 1
    bad = _pod(containers=[{"name": "m", "resources": {"limits": {"nvidia.com/gpu": True}}}])
    with pytest.raises(ObjectError, match="got a boolean"):
        pod_from_json(bad, gangs=GANGS, sharing=SHARING)
