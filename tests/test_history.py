"""The one history of disruptions: recording outcomes, pruning, the circuit breaker, the checkpoint guard,
and the facts a report carries for sinks that see no snapshot."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.cycle import run_cycle
from rebalancer.cycle_report import NodeFacts
from rebalancer.evictor import DryRunEvictor
from rebalancer.history import NO_HISTORY, DisruptionHistory, EvictionRecord, Memory, Workload
from rebalancer.history_circuit import open_circuits
from rebalancer.model import Decision, Finding, Outcome, Pod, Proposal, ProposalKind
from rebalancer.planner import plan
from rebalancer.policy import parse_policy
from tests.builders import A100, H100, NOW, gpu_sample, node, pod, snapshot, telemetry

MINUTE = timedelta(minutes=1)
TRAINER = Workload("ml", "ReplicaSet", "trainer-abc")
RELAXED = parse_policy(
    {
        "telemetry": None,
        "guards": {
            "min_pod_age": 0,
            "cooldown": "30m",
            "max_disruptions_per_workload": 3,
            "disruption_window": "24h",
        },
        "limits": {"max_per_node": None, "max_per_namespace": None, "max_per_cycle": None},
    }
)


def _decision(*pods: Pod, kind: ProposalKind = "pod", node: str | None = None) -> Decision:
    proposal = Proposal(
        strategy="x",
        kind=kind,
        pods=pods,
        reason="r",
        node=node,
        nodes_freed=(node,) if node else (),
    )
    return Decision(proposal=proposal, approved=True)


def test_only_evicted_pods_are_recorded_once_per_cycle() -> None:
    a, b = pod("a", "n1"), pod("b", "n1")
    decision = _decision(a, b, kind="node", node="n1")
    would = [Outcome("ml", "a", "would-evict"), Outcome("ml", "b", "would-evict")]
    assert NO_HISTORY.recorded(decision, would, NOW) is NO_HISTORY  # a dry run changes nothing
    evicted = [Outcome("ml", "a", "evicted"), Outcome("ml", "b", "evicted")]
    history = NO_HISTORY.recorded(decision, evicted, NOW)
    assert history.workloads == {TRAINER: NOW}
    assert history.disruptions == {TRAINER: (NOW,)}  # two pods, one cycle: one disruption
    assert history.nodes == {"n1": NOW}
    assert [r.pod for r in history.evictions] == ["a", "b"]
    # A node plan that stopped part-way drained nothing.
    partial = NO_HISTORY.recorded(decision, [evicted[0], Outcome("ml", "b", "blocked-by-pdb")], NOW)
    assert partial.nodes == {} and [r.pod for r in partial.evictions] == ["a"]


def test_a_bare_pod_is_watched_but_has_no_cooldown() -> None:
    bare = pod("solo", "n1", owner=None)
    history = NO_HISTORY.recorded(_decision(bare), [Outcome("ml", "solo", "evicted")], NOW)
    assert history.evictions == (EvictionRecord(Workload("ml", "Pod", "solo"), "solo", NOW, "n1"),)
    assert history.workloads == {} and history.disruptions == {}


def test_pruning_keeps_only_what_a_guard_can_still_refuse_with() -> None:
    old, recent = NOW - 2 * timedelta(days=1), NOW - 10 * MINUTE
    history = DisruptionHistory(
        nodes={"n1": old, "n2": recent},
        workloads={TRAINER: recent},
        disruptions={TRAINER: (old, recent)},
    )
    pruned = history.pruned(NOW, RELAXED.policy)
    assert pruned.nodes == {"n2": recent}
    assert pruned.disruptions == {TRAINER: (recent,)}
    without_budget = history.pruned(
        NOW, parse_policy({"telemetry": None, "guards": {"max_disruptions_per_workload": None}}).policy
    )
    assert without_budget.disruptions == {}


@settings(max_examples=200, deadline=None)
@given(
    times=st.lists(
        st.lists(st.integers(0, 60 * 48), min_size=1, max_size=4).map(sorted), min_size=0, max_size=12
    ),
    steps=st.lists(st.integers(0, 60 * 30), min_size=1, max_size=6),
)
def test_pruning_disruptions_keeps_exactly_the_times_within_the_window(
    times: list[list[int]], steps: list[int]
) -> None:
    """Pruned cycle after cycle (what a cycle keeps of the last prune included), each workload keeps
    exactly its disruption times within the budget's window, in order, and none is left empty."""
    start = NOW - timedelta(hours=48)
    history = DisruptionHistory(
        disruptions={
            Workload("ml", "Job", f"j{i}"): tuple(start + timedelta(minutes=m) for m in minutes)
            for i, minutes in enumerate(times)
        }
    )
    window = timedelta(hours=24)
    now = NOW
    for step in steps:
        now += timedelta(minutes=step)
        expected = {
            key: kept
            for key, ts in history.disruptions.items()
            if (kept := tuple(t for t in ts if now - t < window))
        }
        history = history.pruned(now, RELAXED.policy)
        assert dict(history.disruptions) == expected
        assert list(history.disruptions) == list(expected)


def test_the_circuit_opens_for_replacements_still_pending_after_the_timeout() -> None:
    history = DisruptionHistory(evictions=(EvictionRecord(TRAINER, "train-0", NOW),))
    pending = pod("train-1", None, phase="Pending", age=timedelta(0))
    earlier = pod("train-x", None, phase="Pending", age=timedelta(hours=2))  # not the eviction's doing

    def at(minutes: int, *pods: object) -> tuple[str, ...]:
        snap = snapshot([node("n1")], pods, now=NOW + minutes * MINUTE)  # type: ignore[arg-type]
        return tuple(t.detail for t in open_circuits(snap, history, 900))

    assert at(14, pending) == ()
    assert at(16, pending) == ("circuit open: ml/trainer-abc still Pending 16m after eviction",)
    assert at(16, earlier) == ()


def test_the_planner_refuses_everything_while_the_circuit_is_open_and_the_report_says_why() -> None:
    history = DisruptionHistory(evictions=(EvictionRecord(TRAINER, "train-0", NOW - 20 * MINUTE),))
    waiting = pod("train-1", None, phase="Pending", age=timedelta(minutes=19))
    other = pod("serve-0", "n1", owner=None)
    snap = snapshot([node("n1"), node("n2")], [waiting, other])
    [decision] = plan([_decision(other).proposal], snap, RELAXED.policy, history=history)
    assert decision.blocked_by == "circuit-open"
    assert decision.reason.startswith("circuit open: ml/trainer-abc still Pending 20m after eviction")


def test_the_checkpoint_guard_runs_last_and_holds_the_whole_plan() -> None:
    asked = pod("w0", "n1", annotations={"rebalancer.gpu/checkpoint": "true"})
    other = pod("w1", "n1")
    snap = snapshot([node("n1"), node("n2")], [asked, other])
    [held] = plan([_decision(asked, other, kind="gang").proposal], snap, RELAXED.policy)
    assert (held.blocked_by, held.blocked_pod) == ("checkpoint-pending", ("ml", "w0"))
    # A plan refused earlier for another reason never asks for a checkpoint.
    full = snapshot([node("n1", gpus=2)], [asked, other])
    [refused] = plan([_decision(asked, other, kind="node", node="n1").proposal], full, RELAXED.policy)
    assert refused.blocked_by == "no-fit"


def test_a_memory_keeps_what_each_cycle_recorded() -> None:
    memory = Memory()
    snap = snapshot([node("n1")], [pod("a", "n1")])
    assert memory.begin(snap, RELAXED.policy) == NO_HISTORY
    memory.record(_decision(pod("a", "n1")), [Outcome("ml", "a", "evicted")], NOW)
    assert memory.history.workloads == {TRAINER: NOW}


def test_a_report_carries_what_its_sinks_need() -> None:
    leaking = gpu_sample("h-1", "GPU-9", fb_used_mib=20480.0, util=0.0)
    snap = snapshot(
        [node("a-1"), node("a-2"), node("h-1", model=H100)],
        # a-2 above the default threshold (5 of 8 GPUs): one drain, a-1 onto a-2.
        [pod("lonely", "a-1", uid="u-1"), *(pod(f"busy-{i}", "a-2") for i in range(5))],
        telemetry=telemetry([leaking]),
    )
    loaded = parse_policy(
        {
            "telemetry": {},
            "strategies": [
                {"name": "gpu-consolidation", "args": {"max_utilization_percent": None}},
                {"name": "idle-gpu"},
            ],
        }
    )
    report = run_cycle(snap, loaded, DryRunEvictor())
    assert report.freed_nodes == ("a-1",)
    assert report.nodes["a-1"] == NodeFacts(A100, 8)
    assert report.nodes["h-1"] == NodeFacts(H100, 8)
    assert report.proposals_by_strategy == {"gpu-consolidation": 1}
    [leak] = [f for f in report.findings if f.kind == "leaked-vram"]
    assert leak == Finding("leaked-vram", node="h-1", gpu="GPU-9", detail=leak.detail, fb_used_mib=20480.0)
    assert [row.uid for row in report.decisions] == ["u-1"]
