"""Pods that are already going away (`metadata.deletionTimestamp` set).

As upstream's descheduler (`IsPodTerminating`, its DefaultEvictor and spread counting) and
kube-scheduler's PodTopologySpread: a terminating pod is never proposed or evicted, is left out of
spread and gang counts, and keeps holding its node's resources until it is gone.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from rebalancer.cycle import evaluate
from rebalancer.guards import GUARD_NAMES, TERMINATING, pod_refusal
from rebalancer.model import (
    GPU_PRODUCT_LABEL,
    LabelSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Proposal,
    TopologySpreadConstraint,
)
from rebalancer.placement import ClusterState
from rebalancer.planner import plan
from rebalancer.policy import GuardsConfig, Policy, parse_policy
from rebalancer.registry import StrategyContext
from rebalancer.sources.files import load_snapshot_dir
from rebalancer.sources.kube_pods import pod_from_json
from strategies.gpu_affinity import GpuAffinityArgs, gpu_affinity
from strategies.idle_gpu import IdleGpuArgs, idle_gpu
from strategies.topology_spread import TopologySpreadArgs, topology_spread
from tests.builders import A100, H100, NOW, gpu_sample, node, pod, snapshot, telemetry

GOING = timedelta(seconds=30)
ZONE = "topology.kubernetes.io/zone"
TRAINER = {"app": "trainer"}
SPREAD = TopologySpreadConstraint(
    max_skew=1,
    topology_key=ZONE,
    when_unsatisfiable="DoNotSchedule",
    label_selector=LabelSelector(match_labels=TRAINER),
)


def test_the_guard_refuses_a_terminating_pod_first_and_names_itself() -> None:
    leaving = pod("train-0", "gpu-a-1", terminating_for=GOING, annotations={"rebalancer.gpu/evict": "false"})
    refusal = pod_refusal(leaving, snapshot([node("gpu-a-1")], [leaving]), GuardsConfig())
    assert refusal is not None
    assert refusal.guard == TERMINATING == "terminating"
    assert "already terminating" in refusal.reason
    assert "2026-11-29T11:59:30Z" in refusal.reason
    assert TERMINATING in GUARD_NAMES


def test_the_planner_refuses_any_proposal_holding_a_terminating_pod() -> None:
    """A third-party strategy that forgets the rule still cannot evict a pod being deleted."""
    leaving = pod("train-0", "gpu-a-1", terminating_for=GOING)
    snap = snapshot([node("gpu-a-1"), node("gpu-a-2")], [leaving])
    proposal = Proposal(strategy="custom", kind="pod", pods=(leaving,), reason="because")
    [decision] = plan([proposal], snap, Policy())
    assert not decision.approved
    assert decision.blocked_by == "terminating"
    assert decision.blocked_pod == leaving.key


def test_spread_does_not_count_terminating_pods_in_their_domain() -> None:
    """A balanced [2, 2] with two terminating pods in zone a must not read as [4, 2]."""
    nodes = [node("gpu-a-1", zone="zone-a", gpus=16), node("gpu-b-1", zone="zone-b", gpus=16)]
    healthy = [pod(f"a-{i}", "gpu-a-1", labels=TRAINER, topology_spread=[SPREAD]) for i in range(2)]
    healthy += [pod(f"b-{i}", "gpu-b-1", labels=TRAINER, topology_spread=[SPREAD]) for i in range(2)]
    leaving = [
        pod(f"old-{i}", "gpu-a-1", labels=TRAINER, topology_spread=[SPREAD], terminating_for=GOING)
        for i in range(2)
    ]
    result = topology_spread(snapshot(nodes, [*healthy, *leaving]), TopologySpreadArgs(), StrategyContext())
    assert result.proposals == ()


def test_spread_never_proposes_a_terminating_pod() -> None:
    """[3, 0] where two of zone a's pods are terminating: one healthy pod is all that counts."""
    nodes = [node("gpu-a-1", zone="zone-a", gpus=16), node("gpu-b-1", zone="zone-b", gpus=16)]
    pods = [pod("a-0", "gpu-a-1", labels=TRAINER, topology_spread=[SPREAD])]
    pods += [
        pod(f"a-{i}", "gpu-a-1", labels=TRAINER, topology_spread=[SPREAD], terminating_for=GOING)
        for i in (1, 2)
    ]
    pods += [pod("b-0", "gpu-b-1", labels=TRAINER, topology_spread=[SPREAD])]
    pods += [pod("a-3", "gpu-a-1", labels=TRAINER, topology_spread=[SPREAD])]
    pods += [pod("a-4", "gpu-a-1", labels=TRAINER, topology_spread=[SPREAD])]
    # Healthy counts [3, 1]: one move; the terminating a-1 and a-2 are never the one.
    result = topology_spread(snapshot(nodes, pods), TopologySpreadArgs(), StrategyContext())
    moved = [p.name for proposal in result.proposals for p in proposal.pods]
    assert len(moved) == 1
    assert moved[0] in ("a-0", "a-3", "a-4")


def test_gangs_leave_terminating_members_out() -> None:
    members = [pod(f"w-{i}", "gpu-a-1", gang="ml/job") for i in range(3)]
    leaving = pod("w-3", "gpu-a-1", gang="ml/job", terminating_for=GOING)
    snap = snapshot([node("gpu-a-1")], [*members, leaving])
    assert {p.name for p in snap.gangs["ml/job"]} == {"w-0", "w-1", "w-2"}
    # The gang guard then accepts the three healthy members as the whole gang.
    proposal = Proposal(strategy="custom", kind="gang", pods=tuple(members), reason="x", group="ml/job")
    [decision] = plan([proposal], snapshot([node("gpu-a-1"), node("gpu-a-2")], [*members, leaving]), Policy())
    assert decision.blocked_by != "gang"


def test_a_terminating_pod_keeps_its_resources_on_its_node() -> None:
    full = [pod(f"old-{i}", "gpu-a-1", terminating_for=GOING) for i in range(8)]
    state = ClusterState.from_snapshot(snapshot([node("gpu-a-1", gpus=8)], full))
    newcomer = pod("new", None)
    fit = state.fits(newcomer, "gpu-a-1")
    assert not fit.ok
    assert "nvidia.com/gpu" in fit.reason


def test_idle_gpu_neither_judges_nor_proposes_a_terminating_pod() -> None:
    leaving = pod("nb-0", "gpu-a-1", terminating_for=GOING, age=timedelta(days=2))
    rows = [gpu_sample("gpu-a-1", "GPU-1", pod=leaving, util=0.0)]
    snap = snapshot([node("gpu-a-1")], [leaving], telemetry=telemetry(rows, 1800))
    result = idle_gpu(snap, IdleGpuArgs(namespaces=("ml",)), StrategyContext())
    assert result.proposals == ()
    assert [f for f in result.findings if f.kind == "idle-gpu"] == []


def test_gpu_affinity_leaves_a_terminating_pod_alone() -> None:
    wrong = pod(
        "train",
        "gpu-a-1",
        terminating_for=GOING,
        required_affinity=[
            NodeSelectorTerm(match_expressions=(NodeSelectorRequirement(GPU_PRODUCT_LABEL, "In", (H100,)),))
        ],
    )
    snap = snapshot([node("gpu-a-1", model=A100), node("gpu-h-1", model=H100)], [wrong])
    result = gpu_affinity(snap, GpuAffinityArgs(), StrategyContext())
    assert result.proposals == ()


def test_a_node_with_a_terminating_pod_is_not_drained_and_the_report_says_why() -> None:
    """Draining around a pod stuck in Terminating (a finalizer, a dead kubelet) would disrupt the
    rest without freeing the node: the drain waits, and the finding names the `terminating` guard."""
    nodes = [node("gpu-a-1"), node("gpu-a-2")]
    pods = [pod("light-0", "gpu-a-1"), pod("leaving", "gpu-a-1", terminating_for=GOING)]
    pods += [pod(f"busy-{i}", "gpu-a-2") for i in range(5)]
    loaded = parse_policy(
        {"strategies": [{"name": "gpu-consolidation", "args": {"max_utilization_percent": None}}]}
    )
    evaluation = evaluate(snapshot(nodes, pods, now=NOW), loaded)
    assert not [d for d in evaluation.decisions if d.approved]
    [blocked] = [f for f in evaluation.findings if f.node == "gpu-a-1"]
    assert blocked.pod == "leaving"
    assert "terminating" in blocked.detail


def pod_json(name: str, **metadata: object) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", **metadata},
        "spec": {"nodeName": "gpu-a-1", "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }


def test_both_sources_read_the_deletion_timestamp(tmp_path: Path) -> None:
    policy = Policy()
    raw = pod_json(
        "going", deletionTimestamp="2026-11-29T11:59:00Z", creationTimestamp="2026-11-28T00:00:00Z"
    )
    # The live source hands the API's JSON to the same translation.
    live = pod_from_json(raw, gangs=policy.gangs, sharing=policy.gpu_sharing)
    assert live.terminating
    assert live.deleting_since is not None and live.deleting_since.isoformat() == "2026-11-29T11:59:00+00:00"
    # The snapshot directory, in JSON and in YAML.
    node_json = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-a-1"}}
    (tmp_path / "cluster.json").write_text(json.dumps({"kind": "List", "items": [node_json, raw]}))
    (tmp_path / "more.yaml").write_text(
        "kind: Pod\napiVersion: v1\nmetadata: {name: yaml-going, namespace: ml, "
        "deletionTimestamp: 2026-11-29T11:58:00Z}\nspec: {nodeName: gpu-a-1}\n"
    )
    (tmp_path / "snapshot.yaml").write_text("now: 2026-11-29T12:00:00Z\n")
    loaded = parse_policy({"telemetry": None})
    snap = load_snapshot_dir(tmp_path, loaded)
    assert {p.name for p in snap.pods if p.terminating} == {"going", "yaml-going"}
