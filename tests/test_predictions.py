"""Live prediction feedback: where the replacements of evicted pods landed, against the prediction.

- `history_landings.judge_landings` (pure): a replacement is a placed pod of the evicted pod's workload
  created since the eviction; it landed `as-predicted`, `equivalent` (on a node tied with the predicted
  one), `elsewhere`, or, none placed `reschedule_timeout` after the eviction, `pending`; judged
  evictions leave the watch list, which the state store keeps (older states without it still load);
- the planner records the tied set of each approved pod;
- the report (JSON and text) and the metrics sink carry the judged landings;
- end to end against the fake API server: live cycles evict a node's pods, a scheduler stand-in
  places each replacement where the test likes, and the next cycles judge all four results.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from kubernetes import client
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rebalancer.actuator import ClusterActuator
from rebalancer.cycle import run_cycle
from rebalancer.cycle_report import PredictionCheck
from rebalancer.evictor import DryRunEvictor
from rebalancer.history import MAX_TIED_KEPT, NO_HISTORY, DisruptionHistory, EvictionRecord, Memory, Workload
from rebalancer.history_landings import judge_landings
from rebalancer.model import Decision, Outcome, OwnerRef, Proposal
from rebalancer.planner import plan
from rebalancer.policy import EvictionConfig, parse_policy
from rebalancer.report import render_text, to_dict
from rebalancer.rfc3339 import format_utc
from rebalancer.scoring import Prediction
from rebalancer.sinks.metrics import DaemonMetrics
from rebalancer.sources.kube import KubeSource
from rebalancer.state import ActuatorState
from tests.builders import NOW, node, pod, replace, snapshot
from tests.fake_apiserver import FakeApiServer, node_json, pod_json

MINUTE = timedelta(minutes=1)
TIMEOUT = 900  # the default eviction.reschedule_timeout
CONSOLIDATE = parse_policy(
    {
        "strategies": [
            {
                "name": "gpu-consolidation",
                "args": {"max_utilization_percent": None, "max_allocated_percent": 60},
            }
        ],
        "telemetry": None,
    }
)


def owner(name: str) -> OwnerRef:
    return OwnerRef("ReplicaSet", name, "apps/v1")


def watched(name: str, chosen: str, *tied: str, at: datetime = NOW) -> EvictionRecord:
    return EvictionRecord(
        Workload("ml", "ReplicaSet", f"rs-{name}"),
        name,
        at,
        "a-1",
        strategy="gpu-consolidation",
        predicted=Prediction(chosen, frozenset({chosen, *tied})),
    )


def replacement(name: str, workload: str, where: str | None, *, created: datetime = NOW + MINUTE) -> Any:
    return pod(
        name,
        where,
        owner=owner(f"rs-{workload}"),
        phase="Running" if where else "Pending",
        age=NOW - created,
    )


NODES = [node(f"a-{n}") for n in range(1, 6)]


def results(checks: tuple[PredictionCheck, ...]) -> dict[str, tuple[str, str | None, str | None]]:
    return {c.pod: (c.result, c.landed, c.replacement) for c in checks}


# --------------------------------------------------------------------------- the pure judgement


def test_each_replacement_is_judged_against_its_prediction() -> None:
    history = DisruptionHistory(
        awaiting=(
            watched("p", "a-2"),
            watched("q", "a-3", "a-4"),
            watched("r", "a-3", "a-4"),
            watched("s", "a-2"),
        )
    )
    snap = snapshot(
        NODES,
        [
            replacement("p-new", "p", "a-2"),
            replacement("q-new", "q", "a-4"),
            replacement("r-new", "r", "a-5"),
            replacement("s-new", "s", None),  # not placed yet
        ],
        now=NOW + 5 * MINUTE,
    )
    landings = judge_landings(snap, history, TIMEOUT)
    assert results(landings.checks) == {
        "p": ("as-predicted", "a-2", "p-new"),
        "q": ("equivalent", "a-4", "q-new"),
        "r": ("elsewhere", "a-5", "r-new"),
    }
    assert landings.awaiting == 1
    assert {c.strategy for c in landings.checks} == {"gpu-consolidation"}
    assert {c.predicted for c in landings.checks} == {"a-2", "a-3"}
    # The judged leave the watch list; the one still waiting stays.
    settled = history.settled(snap, TIMEOUT)
    assert [r.pod for r in settled.awaiting] == ["s"]
    assert judge_landings(snap, settled, TIMEOUT).checks == ()

    # Still unplaced at the timeout: pending, and no longer watched.
    late = snapshot(NODES, [replacement("s-new", "s", None)], now=NOW + 15 * MINUTE)
    assert results(judge_landings(late, settled, TIMEOUT).checks) == {"s": ("pending", None, None)}
    assert settled.settled(late, TIMEOUT).awaiting == ()


def test_only_placed_pods_of_the_workload_created_since_the_eviction_are_replacements() -> None:
    history = DisruptionHistory(awaiting=(watched("p", "a-2"),))
    snap = snapshot(
        NODES,
        [
            replacement("p-old", "p", "a-3", created=NOW - 10 * MINUTE),  # was there before
            replacement("other", "x", "a-2"),  # another workload
            pod("p-leaving", "a-2", owner=owner("rs-p"), age=-MINUTE, terminating_for=timedelta(0)),
        ],
        now=NOW + 5 * MINUTE,
    )
    assert judge_landings(snap, history, TIMEOUT).checks == ()
    # Created within the allowed clock skew of the eviction: a replacement.
    snap = snapshot(NODES, [replacement("p-new", "p", "a-2", created=NOW - 30 * timedelta(seconds=1))])
    assert results(judge_landings(snap, history, TIMEOUT).checks) == {"p": ("as-predicted", "a-2", "p-new")}


def test_a_workloads_evictions_are_judged_together_each_on_its_best_matching_replacement() -> None:
    # Two pods of one ReplicaSet, predicted on a-2 and a-3; the replacements came up the other way round.
    first = replace_workload(watched("p0", "a-2"), "rs-p")
    second = replace_workload(watched("p1", "a-3"), "rs-p")
    history = DisruptionHistory(awaiting=(first, second))
    one = snapshot(NODES, [replacement("p-x", "p", "a-3")], now=NOW + 2 * MINUTE)
    assert judge_landings(one, history, TIMEOUT).checks == (), "one of two placed: both keep waiting"
    both = snapshot(
        NODES,
        [replacement("p-x", "p", "a-3"), replacement("p-y", "p", "a-2", created=NOW + 2 * MINUTE)],
        now=NOW + 3 * MINUTE,
    )
    assert results(judge_landings(both, history, TIMEOUT).checks) == {
        "p0": ("as-predicted", "a-2", "p-y"),
        "p1": ("as-predicted", "a-3", "p-x"),
    }


def test_a_workload_evicted_again_and_again_never_keeps_an_old_eviction_waiting() -> None:
    old = replace_workload(watched("p0", "a-2"), "rs-p")
    young = replace_workload(watched("p1", "a-3", at=NOW + 10 * MINUTE), "rs-p")
    history = DisruptionHistory(awaiting=(old, young))
    snap = snapshot(NODES, [replacement("p-x", "p", None)], now=NOW + 16 * MINUTE)
    landings = judge_landings(snap, history, TIMEOUT)
    assert results(landings.checks) == {"p0": ("pending", None, None)}
    assert landings.awaiting == 1
    assert history.settled(snap, TIMEOUT).awaiting == (young,)


def replace_workload(record: EvictionRecord, name: str) -> EvictionRecord:
    return replace(record, workload=Workload("ml", "ReplicaSet", name))


def test_recorded_evictions_are_watched_with_their_prediction_and_the_state_keeps_them() -> None:
    moving = pod("p", "a-1", owner=owner("rs-p"))
    unpredicted = pod("u", "a-1", owner=owner("rs-u"))
    proposal = Proposal("gpu-consolidation", "node", (moving, unpredicted), "drain a-1", node="a-1")
    decision = Decision(
        proposal, approved=True, targets={moving.key: "a-3"}, tied={moving.key: frozenset({"a-3", "a-4"})}
    )
    outcomes = (Outcome("ml", "p", "evicted"), Outcome("ml", "u", "evicted"))
    history = NO_HISTORY.recorded(decision, outcomes, NOW)
    assert history.awaiting == (watched("p", "a-3", "a-4"),)
    assert history.recorded(decision, outcomes, NOW) == history, "recording again adds nothing"
    # A dry run watches nothing.
    assert NO_HISTORY.recorded(decision, (Outcome("ml", "p", "would-evict"),), NOW).awaiting == ()

    doc = json.loads(json.dumps(ActuatorState(history=history).to_json()))
    assert ActuatorState.from_json(doc).history == history
    # A state written before the watch list existed still loads, with nothing watched.
    del doc["awaitingLanding"]
    assert ActuatorState.from_json(doc).history.awaiting == ()


def test_the_planner_records_the_nodes_tied_with_each_target() -> None:
    # a-3 and a-4 are alike (6 of 8 GPUs used): the packed scheduler may pick either for the first pod.
    pods = [pod(f"x{n}", "a-1", owner=owner(f"rs-{n}")) for n in range(2)]
    busy = [pod(f"busy-{name}", name, gpus=6, owner=owner(f"rs-{name}")) for name in ("a-3", "a-4")]
    snap = snapshot(NODES[:4], [*pods, *busy])
    proposal = Proposal(
        "gpu-consolidation",
        "node",
        tuple(pods),
        "drain a-1",
        node="a-1",
        targets={pods[0].key: "a-3", pods[1].key: "a-3"},
    )
    (decision,) = plan([proposal], snap, CONSOLIDATE.policy)
    assert decision.approved
    assert decision.tied == {pods[0].key: frozenset({"a-3", "a-4"}), pods[1].key: frozenset({"a-3"})}


# --------------------------------------------------------------------------- report and metrics


def test_the_report_and_the_metrics_carry_the_judged_landings() -> None:
    memory = Memory(DisruptionHistory(awaiting=(watched("p", "a-2"), watched("q", "a-3", "a-4"))))
    snap = snapshot(
        NODES, [replacement("p-new", "p", "a-5"), replacement("q-new", "q", "a-4")], now=NOW + 5 * MINUTE
    )
    report = run_cycle(snap, CONSOLIDATE, DryRunEvictor(), memory=memory)
    assert memory.history.awaiting == ()
    assert to_dict(report)["predictions"] == {
        "awaiting": 0,
        "by_strategy": {
            "gpu-consolidation": {"as-predicted": 0, "equivalent": 1, "elsewhere": 1, "pending": 0}
        },
        "checked": [
            {
                "strategy": "gpu-consolidation",
                "namespace": "ml",
                "pod": "p",
                "predicted": "a-2",
                "result": "elsewhere",
                "landed": "a-5",
                "replacement": "p-new",
            },
            {
                "strategy": "gpu-consolidation",
                "namespace": "ml",
                "pod": "q",
                "predicted": "a-3",
                "result": "equivalent",
                "landed": "a-4",
                "replacement": "q-new",
            },
        ],
    }
    text = render_text(report)
    assert "landings: 2 judged (equivalent: 1, elsewhere: 1), 0 awaiting" in text
    assert "gpu-consolidation  ml/p     a-2        elsewhere   a-5     p-new" in text

    metrics = DaemonMetrics()
    metrics.publish(report)
    metrics.publish(report)
    assert predictions_counted(metrics) == {
        ("gpu-consolidation", "elsewhere"): 2.0,
        ("gpu-consolidation", "equivalent"): 2.0,
    }


def test_a_report_without_landings_says_nothing_of_them() -> None:
    report = run_cycle(snapshot(NODES), CONSOLIDATE, DryRunEvictor())
    assert to_dict(report)["predictions"] == {"awaiting": 0, "by_strategy": {}, "checked": []}
    assert "landings" not in render_text(report).lower()


def predictions_counted(metrics: DaemonMetrics) -> dict[tuple[str, str], float]:
    exposition = generate_latest(metrics.registry).decode()
    return {
        (sample.labels["strategy"], sample.labels["result"]): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "gpu_rebalancer_predictions_total"
    }


# --------------------------------------------------------------------------- live, on the fake API server


def _placed(name: str, owner_name: str, where: str | None, created: datetime) -> dict[str, Any]:
    """The scheduler stand-in: the ReplicaSet's new pod, bound where the test likes (None: Pending)."""
    obj = pod_json(name, where, owner_name=owner_name, phase="Running" if where else "Pending")
    obj["metadata"]["creationTimestamp"] = format_utc(created)
    return obj


def test_live_cycles_judge_where_the_replacements_landed(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    # a-1 holds four 1-GPU pods (50 %: drained); a-3 and a-4 are alike (6 of 8 GPUs), a-2 has 5 of 8.
    for name in ("a-1", "a-2", "a-3", "a-4", "a-5"):
        api.add(node_json(name))
    for index in range(4):
        api.add(pod_json(f"x{index}", "a-1", owner_name=f"rs-x{index}"))
    api.add(pod_json("busy-2", "a-2", gpus=5, owner_name="rs-busy-2"))
    api.add(pod_json("busy-3", "a-3", gpus=6, owner_name="rs-busy-3"))
    api.add(pod_json("busy-4", "a-4", gpus=6, owner_name="rs-busy-4"))
    api.add(pod_json("busy-5", "a-5", gpus=8, owner_name="rs-busy-5"))
    actuator = ClusterActuator.from_config(api_client, EvictionConfig(), sleep=lambda _: None)
    source = KubeSource(api_client, CONSOLIDATE)
    metrics = DaemonMetrics()

    def cycle(at: datetime, cycle_id: str) -> Any:
        return run_cycle(
            source.snapshot(at), CONSOLIDATE, actuator, [metrics], memory=actuator.memory, cycle_id=cycle_id
        )

    first = cycle(NOW, "c1")
    evicted = {r.pod: r.target_node for r in first.decisions if r.outcome == "evicted"}
    assert sorted(evicted) == ["x0", "x1", "x2", "x3"]
    assert first.predictions == () and first.predictions_awaiting == 0
    predicted = {r.pod: r.predicted for r in actuator.history.awaiting if r.predicted is not None}
    assert {name: p.chosen for name, p in predicted.items()} == evicted
    tied = next(name for name, p in predicted.items() if len(p.tied) > 1)
    others = [name for name in sorted(evicted) if name != tied]
    tie_node = next(n for n in sorted(predicted[tied].tied) if n != evicted[tied])

    # The scheduler stand-in places three replacements and leaves the fourth Pending.
    exact, away, waiting = others
    landing = {tied: tie_node, exact: evicted[exact], away: "a-1", waiting: None}
    for name, where in landing.items():
        api.add(_placed(f"{name}-new", f"rs-{name}", where, NOW + MINUTE))

    second = cycle(NOW + 5 * MINUTE, "c2")
    assert results(second.predictions) == {
        tied: ("equivalent", tie_node, f"{tied}-new"),
        exact: ("as-predicted", evicted[exact], f"{exact}-new"),
        away: ("elsewhere", "a-1", f"{away}-new"),
    }
    assert second.predictions_awaiting == 1
    assert "landings: 3 judged (as-predicted: 1, equivalent: 1, elsewhere: 1), 1 awaiting" in render_text(
        second
    )

    # Judged once: the next cycle says nothing of them; the unplaced one is pending at the timeout.
    assert cycle(NOW + 10 * MINUTE, "c3").predictions == ()
    fourth = cycle(NOW + 16 * MINUTE, "c4")
    assert results(fourth.predictions) == {waiting: ("pending", None, None)}
    assert fourth.predictions_awaiting == 0
    assert actuator.history.awaiting == ()
    assert predictions_counted(metrics) == counted(
        {"as-predicted": 1, "equivalent": 1, "elsewhere": 1, "pending": 1}
    )


def counted(by_result: Mapping[str, int]) -> dict[tuple[str, str], float]:
    return {("gpu-consolidation", result): float(n) for result, n in by_result.items()}


def test_a_prediction_tied_with_many_alike_nodes_keeps_a_bounded_set() -> None:
    moving = pod("p", "a-1", owner=owner("rs-p"))
    proposal = Proposal("gpu-consolidation", "pod", (moving,), "drain a-1", node="a-1")
    alike = frozenset(f"e-{index:03d}" for index in range(500))
    decision = Decision(proposal, approved=True, targets={moving.key: "e-250"}, tied={moving.key: alike})
    history = NO_HISTORY.recorded(decision, (Outcome("ml", "p", "evicted"),), NOW)
    (record,) = history.awaiting
    assert record.predicted is not None and record.predicted.chosen == "e-250"
    assert record.predicted.tied == {"e-250", *(f"e-{index:03d}" for index in range(MAX_TIED_KEPT))}
