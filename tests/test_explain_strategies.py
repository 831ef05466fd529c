"""What gpu-affinity and topology-spread leave alone, and why: one `NotChosen` record per pod they
looked at and did not propose, each reason code on builders, and `rebalancer explain` showing them."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from rebalancer.cli import main
from rebalancer.model import Node, NotChosen, Pod, Snapshot, StrategyResult
from rebalancer.registry import StrategyContext
from strategies.gpu_affinity import GpuAffinityArgs, gpu_affinity
from strategies.topology_spread import TopologySpreadArgs, topology_spread
from tests.builders import A100, H100, L4, NOW, node, pod, replace, snapshot
from tests.test_gpu_affinity import PREFERRED, fillers, prefers, wants
from tests.test_topology_spread import (
    HOST,
    TRAINER,
    cluster_with_counts,
    spread,
    spread_gang,
    trainers,
    zone_nodes,
)

CTX = StrategyContext()


def all_left_alone(result: StrategyResult, strategy: str) -> list[NotChosen]:
    """The records, checked to be pod records of `strategy` for pods it did not propose."""
    proposed = {p.key for proposal in result.proposals for p in proposal.pods}
    for record in result.not_chosen:
        assert record.strategy == strategy and record.pod is not None
        assert (record.namespace, record.pod) not in proposed, "a pod is proposed or left alone, not both"
    return list(result.not_chosen)


def left_alone(result: StrategyResult, strategy: str) -> dict[str, NotChosen]:
    """The records by pod name, one per pod."""
    records: dict[str, NotChosen] = {}
    for record in all_left_alone(result, strategy):
        assert record.pod is not None and record.pod not in records, f"{record.pod}: one record per pod"
        records[record.pod] = record
    return records


# --------------------------------------------------------------------------- gpu-affinity


def affinity(nodes: list[Node], pods: list[Pod], args: GpuAffinityArgs | None = None) -> dict[str, NotChosen]:
    return left_alone(gpu_affinity(snapshot(nodes, pods), args or GpuAffinityArgs(), CTX), "gpu-affinity")


def test_affinity_every_pod_looked_at_is_proposed_or_says_why_not() -> None:
    nodes = [node("a100-1", model=A100), node("h100-1", model=H100)]
    pods = [
        wants(H100, "moved", "a100-1"),  # violates, an H100 has room: proposed
        wants(A100, "fine", "a100-1"),
        pod("plain", "a100-1"),
        wants(H100, "young", "a100-1", age=timedelta(minutes=2)),
        pod("done", "a100-1", phase="Succeeded"),  # not active: not looked at
    ]
    records = affinity(nodes, pods)
    assert {name: r.code for name, r in records.items()} == {
        "fine": "affinity-satisfied",
        "plain": "no-rule",
        "young": "too-young",
    }
    assert records["fine"].reason == "its node matches its nodeSelector and required node affinity"
    assert records["plain"].reason == "no nodeSelector or required node affinity to check"
    assert records["young"].reason == (
        f"node a100-1 ({A100}) no longer matches required affinity nvidia.com/gpu.product In [{H100}]; "
        "younger than min_pod_age 10m (or of unknown age)"
    )
    assert records["fine"].node == "a100-1" and records["fine"].namespace == "ml"


def test_affinity_a_violating_pod_nowhere_to_go_says_whether_no_node_allows_it_or_none_has_room() -> None:
    nodes = [node("a100-1", model=A100), node("h100-1", model=H100)]
    records = affinity(
        nodes, [wants(L4, "no-l4", "a100-1"), wants(H100, "full", "a100-1", gpus=2), *fillers("h100-1", 7)]
    )
    assert records["no-l4"].code == "no-allowed-node"
    assert records["no-l4"].reason.endswith("; no other node matches its node affinity")
    assert records["full"].code == "no-room"
    assert records["full"].reason.endswith("; none of the 1 node its affinity allows can take it now")


def test_affinity_a_gang_that_cannot_move_together_names_its_violating_member() -> None:
    nodes = [node("a100-1", model=A100), node("h100-1", model=H100, gpus=4)]
    pods = [
        wants(H100, "job-w0", "a100-1", gpus=4, gang="ml/job"),
        wants(H100, "job-w1", "a100-1", gpus=4, gang="ml/job"),
    ]
    records = affinity(nodes, pods)
    assert {r.code for r in records.values()} == {"gang-cannot-move"}
    assert records["job-w1"].reason.endswith(
        "; its gang ml/job (2 pods) cannot be re-placed together on allowed nodes"
    )


def test_affinity_preferred_terms_say_satisfied_no_room_gang_or_off() -> None:
    nodes = [node("a100-1", model=A100), node("h100-1", model=H100, gpus=2)]
    pods = [
        prefers(pod("on-h100", "h100-1"), (10, H100)),
        prefers(pod("wants-h100", "a100-1", gpus=4), (10, H100)),  # H100 node too small: no room
        prefers(pod("ganged", "a100-1", gang="ml/g"), (10, H100)),
        prefers(pod("young", "a100-1", age=timedelta(minutes=1)), (10, H100)),
    ]
    records = affinity(nodes, pods, PREFERRED)
    assert {name: r.code for name, r in records.items()} == {
        "on-h100": "preferred-satisfied",
        "wants-h100": "no-preferred-room",
        "ganged": "gang-kept-together",
        "young": "too-young",
    }
    assert records["on-h100"].reason == f"node h100-1 ({H100}) matches a preferred affinity term"
    assert records["wants-h100"].reason == (
        f"node a100-1 ({A100}) matches none of its preferred affinity terms; "
        "no node that matches one can take it now"
    )
    assert records["ganged"].reason == "a gang is not moved for a preferred node affinity"
    # Without `preferred`, the same pods have no rule it checks, and it says that it checks none.
    off = affinity(nodes, pods)
    assert {r.code for r in off.values()} == {"no-rule"}
    assert off["on-h100"].reason == (
        "no nodeSelector or required node affinity to check "
        "(preferred terms are checked with preferred: true)"
    )


# --------------------------------------------------------------------------- topology-spread

ZONE_SPREAD = "spread constraint of app=trainer over topology.kubernetes.io/zone (maxSkew 1)"


def spread_left(snap: Snapshot, **args: object) -> dict[str, NotChosen]:
    result = topology_spread(snap, TopologySpreadArgs.model_validate(args), CTX)
    return left_alone(result, "topology-spread")


def codes(records: dict[str, NotChosen]) -> dict[str, str]:
    return {name: r.code for name, r in records.items()}


def test_spread_within_max_skew_every_member_says_so_with_the_spread() -> None:
    records = spread_left(cluster_with_counts([3, 2, 2], 1))
    assert set(codes(records).values()) == {"within-max-skew"} and len(records) == 7
    assert records["t-gpu-0-0"].reason == (
        f"{ZONE_SPREAD}: skew 1 <= maxSkew 1 (us-east-1a: 3, us-east-1b: 2, us-east-1c: 2)"
    )
    assert records["t-gpu-0-0"].node == "gpu-0"


def test_spread_the_members_the_repair_did_not_move_say_the_others_moves_suffice() -> None:
    snap = cluster_with_counts([4, 1], 1)
    result = topology_spread(snap, TopologySpreadArgs(), CTX)
    records = left_alone(result, "topology-spread")
    (moved,) = [p.name for proposal in result.proposals for p in proposal.pods]
    assert set(records) == {p.name for p in snap.pods} - {moved}
    assert set(codes(records).values()) == {"skew-repaired"}
    assert records["t-gpu-1-0"].reason == (
        f"{ZONE_SPREAD}: skew 3 falls to 1 <= maxSkew 1 with 1 other move proposed for it; it stays"
    )


def test_spread_a_member_on_a_node_without_the_topology_label_is_in_no_domain() -> None:
    snap = cluster_with_counts([1, 1], 1)
    unlabelled = node("bare", gpus=8)  # no zone label
    pods = [*snap.pods, *trainers("bare", 1, [spread()])]
    records = spread_left(snapshot([*snap.nodes.values(), unlabelled], pods))
    assert records["t-bare-0"].code == "no-domain"
    assert records["t-bare-0"].reason == (
        f"{ZONE_SPREAD}: node bare has no label topology.kubernetes.io/zone: it is in no domain of it"
    )
    assert codes(records)["t-gpu-0-0"] == "within-max-skew"


def test_spread_too_young_and_too_few_to_give_when_skew_stays_too_high() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    pods = trainers("gpu-a-1", 4, [spread()], age=timedelta(minutes=1)) + trainers("gpu-b-1", 1, [spread()])
    records = spread_left(snapshot(nodes, pods))
    state = "skew 3 (us-east-1a: 4, us-east-1b: 1) > maxSkew"
    assert codes(records) == {
        **dict.fromkeys((f"t-gpu-a-1-{i}" for i in range(4)), "too-young"),
        "t-gpu-b-1-0": "in-least-loaded-domain",
    }
    assert records["t-gpu-a-1-0"].reason == (
        f"{ZONE_SPREAD}: {state}; it is younger than min_pod_age 10m (or of unknown age)"
    )
    assert (
        records["t-gpu-b-1-0"].reason
        == f"{ZONE_SPREAD}: {state}; zone us-east-1b has 1 pod, too few to give one"
    )


def test_spread_a_young_gang_member_keeps_its_gang_from_moving() -> None:
    nodes = zone_nodes("us-east-1a", "us-east-1b")
    ganged = [
        pod(
            f"g-{i}",
            "gpu-a-1",
            labels=TRAINER,
            topology_spread=[spread()],
            gang="ml/g",
            age=timedelta(minutes=1) if i == 0 else timedelta(days=1),
        )
        for i in range(3)
    ]
    records = spread_left(snapshot(nodes, [*ganged]))
    assert records["g-1"].code == "too-young"
    assert records["g-1"].reason.endswith(
        "; its gang's ml/g-0 is younger than min_pod_age 10m (or of unknown age)"
    )


def test_spread_the_eviction_limit_per_constraint_says_so() -> None:
    records = spread_left(cluster_with_counts([6, 0, 0], 1), max_evictions_per_constraint=1)
    assert set(codes(records).values()) == {"eviction-limit"} and len(records) == 5
    assert {r.reason for r in records.values()} == {
        f"{ZONE_SPREAD}: skew 5 (us-east-1a: 5, us-east-1b: 1, us-east-1c: 0) > maxSkew; "
        "max_evictions_per_constraint 1 reached"
    }


def test_spread_no_less_loaded_domain_with_room_says_no_domain_can_take_it() -> None:
    nodes = [node("gpu-a-1", zone="us-east-1a"), node("gpu-b-1", zone="us-east-1b", gpus=1)]
    pods = trainers("gpu-a-1", 4, [spread()]) + trainers("gpu-b-1", 1, [spread()])
    records = spread_left(snapshot(nodes, pods))
    assert codes(records)["t-gpu-a-1-0"] == "no-domain-can-take"
    assert codes(records)["t-gpu-b-1-0"] == "in-least-loaded-domain"
    assert "no less-loaded domain can take it now" in records["t-gpu-a-1-0"].reason


def test_spread_a_pod_with_only_schedule_anyway_constraints_left_alone_without_include_soft() -> None:
    snap = snapshot(zone_nodes("us-east-1a", "us-east-1b"), trainers("gpu-a-1", 3, [spread(soft=True)]))
    records = spread_left(snap)
    assert set(codes(records).values()) == {"soft-constraint"} and len(records) == 3
    assert records["t-gpu-a-1-0"].reason == (
        "only ScheduleAnyway spread constraints, which are not repaired (include_soft: false)"
    )
    # With include_soft, the constraint is repaired: one pod moves, the others stay (repaired).
    soft = " (maxSkew 1, ScheduleAnyway)"
    repaired = spread_left(snap, include_soft=True)
    assert set(codes(repaired).values()) == {"skew-repaired"} and len(repaired) == 2
    assert next(iter(repaired.values())).reason.startswith(ZONE_SPREAD.replace(" (maxSkew 1)", soft))


def test_spread_gangs_not_compacted_say_why() -> None:
    nodes = [node("gpu-1", gpus=4), node("gpu-2", gpus=4), node("gpu-3", gpus=4)]
    together = spread_gang({"gpu-1": 3}, gang="ml/together")
    full = spread_gang({"gpu-1": 4, "gpu-2": 4, "gpu-3": 4}, gang="ml/full")
    assert codes(spread_left(snapshot(nodes, together), compact_gangs=True)) == dict.fromkeys(
        (p.name for p in together), "gang-together"
    )
    records = spread_left(snapshot(nodes, full), compact_gangs=True)
    assert set(codes(records).values()) == {"cannot-pack"}
    assert records["worker-0"].reason == (
        "gang ml/full not compacted: its 12 pods on 3 nodes fit on no fewer nodes now"
    )
    young = [
        replace(p, created=NOW - timedelta(minutes=1)) if p.name == "worker-0" else p
        for p in spread_gang({"gpu-1": 1, "gpu-2": 1})
    ]
    records = spread_left(snapshot(nodes, young), compact_gangs=True)
    assert codes(records) == {"worker-0": "too-young", "worker-1": "too-young"}
    assert (
        records["worker-1"].reason
        == "gang ml/job-1 not compacted: ml/worker-0 is younger than min_pod_age 10m"
    )
    asks = [
        replace(p, topology_spread=(spread(HOST, match={"job": "1"}),))
        for p in spread_gang({"gpu-1": 1, "gpu-2": 1})
    ]
    result = topology_spread(snapshot(nodes, asks), TopologySpreadArgs(compact_gangs=True), CTX)
    # Each member: its own constraint (within skew) and the gang's compaction, one record each.
    assert sorted((r.pod, r.code) for r in all_left_alone(result, "topology-spread")) == [
        ("worker-0", "asks-to-spread"),
        ("worker-0", "within-max-skew"),
        ("worker-1", "asks-to-spread"),
        ("worker-1", "within-max-skew"),
    ]


# --------------------------------------------------------------------------- explain, on the demo cluster

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo-cluster"
DEMO_ARGS = ["--snapshot", str(DEMO), "--policy", str(DEMO / "policy.yaml")]


def explained(capsys: pytest.CaptureFixture[str], subject: str) -> list[str]:
    assert main(["explain", subject, *DEMO_ARGS]) == 0
    return capsys.readouterr().out.splitlines()


def test_explain_shows_what_gpu_affinity_left_alone(capsys: pytest.CaptureFixture[str]) -> None:
    # The demo's coredns has no rule to check; its other pods' nodes match theirs.
    out = explained(capsys, "kube-system/coredns-6tzdwcz8wn-852s8")
    assert (
        "gpu-affinity: kube-system/coredns-6tzdwcz8wn-852s8: "
        "no nodeSelector or required node affinity to check" in out
    )
    assert not [line for line in out if line.startswith("gpu-affinity: no verdict")]
    # On a node: one line per pod there it looked at, and the one it moves.
    out = explained(capsys, "a100-b-1")
    affinity = [line for line in out if line.startswith("gpu-affinity: ")]
    assert "gpu-affinity: proposed evicting research/vision-finetune-hgqsq to " in "\n".join(affinity)
    assert any(
        line.endswith(": its node matches its nodeSelector and required node affinity") for line in affinity
    )


def test_explain_shows_what_topology_spread_left_alone(capsys: pytest.CaptureFixture[str]) -> None:
    # llm-serve is 3:1 over two zones: one pod moves (to 2:2), the others stay.
    out = explained(capsys, "inference/llm-serve-hlntxhwkcg-v4s87")
    assert (
        "topology-spread: inference/llm-serve-hlntxhwkcg-v4s87: spread constraint of "
        "app.kubernetes.io/name=llm-serve over topology.kubernetes.io/zone (maxSkew 1): skew 2 falls to 0 "
        "<= maxSkew 1 with 1 other move proposed for it; it stays"
    ) in out
    out = explained(capsys, "l4-a-1")
    spread_lines = [line for line in out if line.startswith("topology-spread: ")]
    assert spread_lines[0].startswith(
        "topology-spread: proposed evicting inference/llm-serve-hlntxhwkcg-59dbk to "
    )
    assert sorted(line.split(":")[1].strip() for line in spread_lines[1:] if "it stays" in line) == [
        "inference/llm-serve-hlntxhwkcg-v4s87",
        "inference/llm-serve-hlntxhwkcg-v6cwm",
    ]


def test_the_report_counts_what_gpu_affinity_and_topology_spread_left_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["once", *DEMO_ARGS, "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    not_chosen = data["not_chosen"]
    assert not_chosen["topology-spread"] == {
        "count": 3,
        "top_reasons": [{"code": "skew-repaired", "count": 3}],
    }
    affinity = not_chosen["gpu-affinity"]
    # Every pod of the snapshot (all placed and running) but the ones it moves.
    moved = [d for d in data["decisions"] if d["strategy"] == "gpu-affinity"]
    assert affinity["count"] == data["summary"]["pods"] - len(moved)
    assert {r["code"] for r in affinity["top_reasons"]} == {"affinity-satisfied", "no-rule"}
