"""The label sets of Prometheus' answers: known by ids that hold across answers and reads, identified
once per label mapping, bounded while series come and go, and never carrying one read's pod
attribution into the next (the daemon keeps one `LabelSets` for all its cycles)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec
import pytest

from rebalancer.model import Finding, Pod, Telemetry
from rebalancer.policy import LabelMapping, PrometheusConfig, TelemetryConfig
from rebalancer.sources.prometheus import PrometheusTelemetrySource
from rebalancer.sources.prometheus_http import PrometheusError, VectorSample
from rebalancer.sources.prometheus_labels import SLACK, LabelSets
from rebalancer.sources.prometheus_rows import Vector
from rebalancer.telemetry.identity import resolve_preset
from tests.builders import NOW, pod
from tests.prometheus_answers import USED, UTIL, plan_responder

if TYPE_CHECKING:
    from tests.prometheus_server import StubFactory

pytest_plugins = ["tests.prometheus_server"]

UUID = "GPU-11111111-2222-3333-4444-555555555555"
OTHER = "GPU-99999999-2222-3333-4444-555555555555"
A = {"__name__": UTIL, "Hostname": "gpu-a-1", "UUID": UUID, "exported_namespace": "ml", "exported_pod": "p"}
B = {**A, "UUID": OTHER, "exported_pod": "q"}
MAPPING = resolve_preset(TelemetryConfig()).labels


def answer(samples: Sequence[tuple[Mapping[str, str], float]]) -> list[VectorSample]:
    """Samples as the HTTP layer decodes them: each series' labels as raw JSON."""
    at = NOW.timestamp()
    return [VectorSample(msgspec.Raw(json.dumps(labels).encode()), (at, v)) for labels, v in samples]


def by_labels(sets: LabelSets, vector: Vector) -> dict[tuple[tuple[str, str], ...], float]:
    return {sets.keys[key]: value for key, value in vector.items()}


def key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def test_an_answer_reads_as_label_set_ids_in_whatever_order_its_series_come() -> None:
    sets = LabelSets()
    sets.begin(MAPPING)
    first = sets.vector(answer([(A, 1.0), (B, 2.0)]))
    same_order = sets.vector(answer([(A, 3.0), (B, 4.0)]))
    swapped = sets.vector(answer([(B, 5.0), (A, 6.0)]))
    fewer = sets.vector(answer([(B, 7.0)]))
    assert by_labels(sets, first) == {key(A): 1.0, key(B): 2.0}
    assert by_labels(sets, same_order) == {key(A): 3.0, key(B): 4.0}
    assert by_labels(sets, swapped) == {key(A): 6.0, key(B): 5.0}
    assert by_labels(sets, fewer) == {key(B): 7.0}
    assert set(first) == set(same_order) == set(swapped)
    assert len(sets) == 2


def test_label_sets_keep_their_ids_and_identities_across_reads() -> None:
    sets = LabelSets()
    sets.begin(MAPPING)
    first = sets.vector(answer([(A, 1.0), (B, 2.0)]))
    identities = {k: sets.identity(k) for k in first}
    sets.begin(MAPPING)
    second = sets.vector(answer([(A, 1.0), (B, 2.0)]))
    assert list(second) == list(first)
    assert {k: sets.identity(k) for k in second} == identities
    assert len(sets) == 2
    found = identities[next(iter(first))]
    assert found is not None
    assert (found.node, found.uuid, found.pod_namespace, found.pod_name) == ("gpu-a-1", UUID, "ml", "p")


def test_a_changed_label_mapping_identifies_every_label_set_again() -> None:
    sets = LabelSets()
    sets.begin(MAPPING)
    (only,) = sets.vector(answer([(A, 1.0)]))
    assert sets.identity(only) is not None
    sets.begin(LabelMapping(node=("kubernetes_node",)))  # A has no such label: unusable now
    (again,) = sets.vector(answer([(A, 1.0)]))
    assert again == only
    assert sets.identity(again) is None


def test_label_sets_of_series_that_are_gone_do_not_pile_up() -> None:
    sets = LabelSets()
    per_read = 4
    sizes = []
    for read in range(3 * SLACK // per_read):
        sets.begin(MAPPING)
        gpus = [({**A, "UUID": f"GPU-{read}-{gpu}"}, 1.0) for gpu in range(per_read)]
        vector = sets.vector(answer(gpus))
        assert by_labels(sets, vector) == {key(labels): 1.0 for labels, _ in gpus}
        sizes.append(len(sets))
    assert max(sizes) <= 2 * per_read + SLACK + per_read
    assert sizes.count(per_read) > 1  # it did start afresh


def test_malformed_labels_are_a_prometheus_error() -> None:
    sets = LabelSets()
    sets.begin(MAPPING)
    with pytest.raises(PrometheusError, match="malformed series labels"):
        sets.vector([VectorSample(msgspec.Raw(b'{"UUID": 1}'), (NOW.timestamp(), 1.0))])


# --------------------------------------------------------------------------- the daemon's reads


def _read(
    url: str, pods: Mapping[tuple[str, str], Pod], label_sets: LabelSets | None
) -> tuple[Telemetry, tuple[Finding, ...]]:
    cfg = TelemetryConfig(prometheus=PrometheusConfig(url=url))
    source = PrometheusTelemetrySource(cfg, (1800,), label_sets=label_sets)
    return source.telemetry(NOW, pods)


def test_reads_sharing_label_sets_attribute_pods_afresh_and_read_as_fresh_ones(
    stub_prometheus: StubFactory,
) -> None:
    t0 = NOW.timestamp()
    labels = {k: v for k, v in A.items() if k != "__name__"}
    stub = stub_prometheus(
        responder=plan_responder(
            {
                ("count", UTIL): [(labels, 30.0)],
                ("sum", UTIL): [(labels, 60.0)],
                ("max", UTIL): [(labels, 3.0)],
                ("ts", UTIL): [(labels, t0)],
                ("last", USED): [(labels, 100.0)],
                ("ts", USED): [(labels, t0)],
            }
        )
    )
    with_pod = {("ml", "p"): pod("p", "gpu-a-1")}
    shared = LabelSets()
    reads = [with_pod, {}, with_pod]  # the pod is deleted, then (a new one of that name) back
    pods_seen = []
    for pods in reads:
        kept = _read(stub.url, pods, shared)
        assert kept == _read(stub.url, pods, None)  # as a read of its own
        window = kept[0].window(1800)
        assert window is not None
        (row,) = window.gpus
        pods_seen.append(row.pod_name)
    assert pods_seen == ["p", None, "p"]
    assert len(shared) == 1


def test_the_label_sets_of_one_node_s_gpus_share_their_common_labels() -> None:
    sets = LabelSets()
    sets.begin(MAPPING)
    first, second = sets.vector(answer([(A, 1.0), (B, 2.0)]))
    shared = [pair for pair in sets.keys[first] if pair in sets.keys[second]]
    assert ("Hostname", "gpu-a-1") in shared
    for pair in shared:  # one (name, value) pair for both: a 5,000-node cluster has 42,243 label sets
        assert next(p for p in sets.keys[second] if p == pair) is pair
