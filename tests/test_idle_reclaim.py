"""`idle-gpu` per workload: report, notify, reclaim after the grace period, snooze, busy again; and the
planner's guards and the dry run on those workload actions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta

import pytest
from pydantic import ValidationError

from rebalancer import rfc3339
from rebalancer.cycle import run_cycle
from rebalancer.evictor import DryRunEvictor
from rebalancer.gpu_devices import mig_share
from rebalancer.model import (
    Controller,
    Finding,
    GpuTelemetry,
    OwnerRef,
    Pod,
    Proposal,
    Snapshot,
    StrategyResult,
)
from rebalancer.planner import plan
from rebalancer.policy import LoadedPolicy, parse_policy
from rebalancer.registry import StrategyContext
from rebalancer.report import to_dict
from rebalancer.workloads import IDLE_SINCE, SNOOZE_UNTIL
from strategies.idle_gpu import IdleGpuArgs, idle_gpu
from strategies.idle_gpu_reclaim import gpu_equivalents
from tests.builders import NOW, controller, gpu_sample, node, pod, replace, snapshot, telemetry

PRICE = 5.10  # per A100-hour in the context below
CTX = StrategyContext(gpu_prices={"NVIDIA-A100-SXM4-80GB": PRICE})
STS = OwnerRef(kind="StatefulSet", name="alice")


def _args(action: str, **rule: object) -> IdleGpuArgs:
    return IdleGpuArgs.model_validate({"actions": [{"action": action, **rule}]})


def _told(hours: float) -> dict[str, str]:
    return {IDLE_SINCE: rfc3339.format_utc(NOW - timedelta(hours=hours))}


def _run(
    pods: Iterable[Pod],
    rows: Iterable[GpuTelemetry],
    args: IdleGpuArgs,
    controllers: Iterable[Controller] = (),
) -> StrategyResult:
    snap = snapshot(
        [node("gpu-a-1"), node("gpu-a-2")],
        pods,
        telemetry=telemetry(rows, args.window),
        controllers=controllers,
    )
    return idle_gpu(snap, args, CTX)


def _notebook(annotations: Mapping[str, str] | None = None, gpus: int = 2) -> StrategyResult:
    nb = pod("alice-0", "gpu-a-1", namespace="notebooks", gpus=gpus, owner=STS)
    rows = [gpu_sample("gpu-a-1", f"GPU-{i}", pod=nb, util=0.3) for i in range(gpus)]
    sts = controller("StatefulSet", "alice", namespace="notebooks", annotations=annotations)
    return _run([nb], rows, _args("reclaim", namespaces=["notebooks"]), [sts])


def _only_finding(result: StrategyResult) -> Finding:
    [finding] = [f for f in result.findings if f.kind == "idle-gpu"]
    return finding


# --------------------------------------------------------------------------- judged per workload


def test_one_idle_replica_of_a_busy_deployment_is_not_an_idle_workload() -> None:
    rs = OwnerRef(kind="ReplicaSet", name="serve-5f")
    replicas = [pod(f"serve-5f-{i}", "gpu-a-1", owner=rs) for i in range(3)]
    rows = [
        gpu_sample("gpu-a-1", "GPU-0", pod=replicas[0], util=0.2),
        gpu_sample("gpu-a-1", "GPU-1", pod=replicas[1], util=60.0),
        gpu_sample("gpu-a-1", "GPU-2", pod=replicas[2], util=55.0),
    ]
    controllers = [
        controller("ReplicaSet", "serve-5f", owner=OwnerRef(kind="Deployment", name="serve")),
        controller("Deployment", "serve", replicas=3),
    ]
    result = _run(replicas, rows, _args("reclaim"), controllers)
    assert result.proposals == ()
    assert [f for f in result.findings if f.kind == "idle-gpu"] == []


def test_report_is_one_finding_per_workload_with_idle_gpu_hours_and_cost() -> None:
    result = _run(
        [nb := pod("alice-0", "gpu-a-1", namespace="notebooks", gpus=2, owner=STS)],
        [gpu_sample("gpu-a-1", f"GPU-{i}", pod=nb, util=0.3) for i in range(2)],
        IdleGpuArgs(),
        [controller("StatefulSet", "alice", namespace="notebooks", annotations=_told(5))],
    )
    assert result.proposals == ()
    finding = _only_finding(result)
    assert finding.workload == "notebooks/StatefulSet/alice"
    assert finding.gpus == 2
    # 2 GPUs idle for the 5 h since the owner was told: 10 GPU-hours at $5.10 each.
    assert "10 GPU-hours" in finding.detail
    assert f"${10 * PRICE:.2f}" in finding.detail
    assert "report only: namespace notebooks not opted in" in finding.detail


# --------------------------------------------------------------------------- notify, grace, reclaim


def test_an_idle_workload_not_yet_told_gets_a_notify_proposal_of_all_its_pods() -> None:
    result = _notebook()
    [proposal] = result.proposals
    assert proposal.kind == "workload"
    assert proposal.action is not None
    assert proposal.action.verb == "notify"
    assert proposal.action.workload == ("notebooks", "StatefulSet", "alice")
    assert proposal.action.grace_until == NOW + timedelta(hours=4)
    assert proposal.action.cost_per_hour == pytest.approx(2 * PRICE)
    assert [p.name for p in proposal.pods] == ["alice-0"]
    assert "scaled to 0 replicas after 4h unless snoozed" in proposal.reason


def test_within_the_grace_period_nothing_is_proposed_and_the_finding_says_when() -> None:
    result = _notebook(_told(1))
    assert result.proposals == ()
    due = rfc3339.format_utc(NOW + timedelta(hours=3))
    assert f"to be scaled to 0 replicas at {due}" in _only_finding(result).detail


def test_after_the_grace_period_the_statefulset_is_reclaimed_by_scaling() -> None:
    result = _notebook(_told(5))
    [proposal] = result.proposals
    assert proposal.action is not None
    assert (proposal.action.verb, proposal.action.how) == ("reclaim", "scale")
    assert proposal.action.idle_since == NOW - timedelta(hours=5)


def test_a_snoozed_workload_is_held() -> None:
    until = rfc3339.format_utc(NOW + timedelta(hours=2))
    result = _notebook({**_told(5), SNOOZE_UNTIL: until})
    assert result.proposals == ()
    assert f"snoozed until {until}" in _only_finding(result).detail


def test_an_expired_snooze_no_longer_holds() -> None:
    result = _notebook({**_told(5), SNOOZE_UNTIL: rfc3339.format_utc(NOW - timedelta(minutes=1))})
    [proposal] = result.proposals
    assert proposal.action is not None and proposal.action.verb == "reclaim"


def test_an_unreadable_snooze_holds_and_says_so() -> None:
    result = _notebook({**_told(5), SNOOZE_UNTIL: "next tuesday"})
    assert result.proposals == ()
    assert 'annotation rebalancer.gpu/snooze-until: "next tuesday" is not an RFC 3339 time' in (
        _only_finding(result).detail
    )


def test_a_workload_busy_again_has_its_idle_mark_cleared() -> None:
    nb = pod("alice-0", "gpu-a-1", namespace="notebooks", owner=STS)
    sts = controller("StatefulSet", "alice", namespace="notebooks", annotations=_told(2))
    result = _run(
        [nb],
        [gpu_sample("gpu-a-1", "GPU-0", pod=nb, util=40.0)],
        _args("reclaim", namespaces=["notebooks"]),
        [sts],
    )
    [proposal] = result.proposals
    assert proposal.action is not None and proposal.action.verb == "clear"
    assert "busy again" in proposal.reason


def test_stale_telemetry_does_not_clear_the_mark_nor_reclaim() -> None:
    nb = pod("alice-0", "gpu-a-1", namespace="notebooks", owner=STS)
    sts = controller("StatefulSet", "alice", namespace="notebooks", annotations=_told(5))
    stale = gpu_sample("gpu-a-1", "GPU-0", pod=nb, util=0.1, age=timedelta(hours=1))
    result = _run([nb], [stale], _args("reclaim", namespaces=["notebooks"]), [sts])
    assert result.proposals == ()
    assert [f.kind for f in result.findings] == ["stale-telemetry"]


@pytest.mark.parametrize(
    ("kind", "how"),
    [("Job", "suspend"), ("JobSet", "suspend"), ("Notebook", "stop"), ("Deployment", "scale")],
)
def test_each_owner_kind_is_reclaimed_its_own_way(kind: str, how: str) -> None:
    direct = {"Job": "Job", "JobSet": "Job", "Notebook": "StatefulSet", "Deployment": "ReplicaSet"}[kind]
    owner = OwnerRef(kind=direct, name="child")
    p = pod("w-0", "gpu-a-1", owner=owner)
    chain = [controller(direct, "child", owner=OwnerRef(kind=kind, name="top") if direct != kind else None)]
    if direct != kind:
        chain.append(controller(kind, "top", annotations=_told(5)))
    else:
        chain = [controller(kind, "child", annotations=_told(5))]
    result = _run([p], [gpu_sample("gpu-a-1", "GPU-0", pod=p, util=0.1)], _args("reclaim"), chain)
    [proposal] = result.proposals
    assert proposal.action is not None
    assert (proposal.action.verb, proposal.action.how) == ("reclaim", how)


def test_a_bare_pod_is_reclaimed_by_eviction_and_only_reported_under_notify() -> None:
    bare = pod("scratch", "gpu-a-1", owner=None)
    rows = [gpu_sample("gpu-a-1", "GPU-0", pod=bare, util=0.1)]
    [proposal] = _run([bare], rows, _args("reclaim")).proposals
    assert proposal.action is not None and proposal.action.how == "evict"
    notified = _run([bare], rows, _args("notify"))
    assert notified.proposals == ()
    assert "a bare pod has no object to keep a notice on" in _only_finding(notified).detail


def test_a_workload_whose_object_was_not_read_is_reported_only() -> None:
    result = _run(
        [p := pod("w-0", "gpu-a-1", owner=OwnerRef(kind="StatefulSet", name="unlisted"))],
        [gpu_sample("gpu-a-1", "GPU-0", pod=p, util=0.1)],
        _args("reclaim"),
    )
    assert result.proposals == ()
    assert "ml/StatefulSet/unlisted could not be read" in _only_finding(result).detail


def test_the_first_matching_rule_wins_and_selectors_match_pod_labels() -> None:
    args = IdleGpuArgs.model_validate(
        {
            "actions": [
                {"action": "report", "selector": {"match_labels": {"team": "research"}}},
                {"action": "notify"},
            ]
        }
    )
    research = pod("r-0", "gpu-a-1", owner=None, labels={"team": "research"})
    other = pod("o-0", "gpu-a-1", owner=OwnerRef(kind="Job", name="o"))
    rows = [
        gpu_sample("gpu-a-1", "GPU-0", pod=research, util=0.1),
        gpu_sample("gpu-a-1", "GPU-1", pod=other, util=0.1),
    ]
    result = _run([research, other], rows, args, [controller("Job", "o")])
    assert [(p.action.verb if p.action else None, p.group) for p in result.proposals] == [
        ("notify", "ml/Job/o")
    ]


def test_the_older_namespaces_spelling_cannot_be_mixed_with_actions() -> None:
    with pytest.raises(ValidationError, match="older spelling"):
        IdleGpuArgs.model_validate({"namespaces": ["ml"], "actions": [{"action": "notify"}]})


# --------------------------------------------------------------------------- planner and dry run


def _policy(limits: Mapping[str, object] | None = None) -> LoadedPolicy:
    return parse_policy(
        {
            "strategies": [{"name": "idle-gpu", "args": {"actions": [{"action": "reclaim"}]}}],
            "limits": dict(limits or {}),
        }
    )


def _reclaim_proposal(annotations: Mapping[str, str] | None = None) -> tuple[Proposal, Snapshot]:
    nb = pod("alice-0", "gpu-a-1", namespace="notebooks", owner=STS, annotations=annotations)
    sts = controller("StatefulSet", "alice", namespace="notebooks", annotations=_told(5))
    snap = snapshot(
        [node("gpu-a-1")],
        [nb],
        telemetry=telemetry([gpu_sample("gpu-a-1", "GPU-0", pod=nb, util=0.1)]),
        controllers=[sts],
    )
    [proposal] = idle_gpu(snap, _args("reclaim"), CTX).proposals
    return proposal, snap


def test_the_planner_refuses_a_reclaim_of_an_opted_out_pod_with_the_opt_out_guard() -> None:
    proposal, snap = _reclaim_proposal({"rebalancer.gpu/evict": "false"})
    [decision] = plan([proposal], snap, _policy().policy)
    assert not decision.approved
    assert decision.blocked_by == "opt-out"


def test_a_reclaim_spends_the_cycle_limit_and_places_nothing() -> None:
    pods = [
        pod(f"{name}-0", "gpu-a-1", namespace="notebooks", owner=OwnerRef(kind="StatefulSet", name=name))
        for name in ("alice", "bob")
    ]
    snap = snapshot(
        [node("gpu-a-1")],
        pods,
        telemetry=telemetry([gpu_sample("gpu-a-1", f"GPU-{i}", pod=p, util=0.1) for i, p in enumerate(pods)]),
        controllers=[
            controller("StatefulSet", name, namespace="notebooks", annotations=_told(5))
            for name in ("alice", "bob")
        ],
    )
    proposals = idle_gpu(snap, _args("reclaim"), CTX).proposals
    assert len(proposals) == 2
    first, second = plan(proposals, snap, _policy({"max_per_cycle": 1}).policy)
    assert first.approved
    assert first.targets == {}
    assert not second.approved
    assert second.blocked_by == "limit-cycle"
    # Telling owners spends nothing: both are told under the same limit.
    # Without their objects there is nothing to keep the notice on: nothing is proposed.
    assert idle_gpu(replace(snap, controllers={}), _args("notify"), CTX).proposals == ()
    fresh = replace(snap, controllers={k: replace(c, annotations={}) for k, c in snap.controllers.items()})
    notify = idle_gpu(fresh, _args("notify"), CTX).proposals
    assert all(d.approved for d in plan(notify, fresh, _policy({"max_per_cycle": 1}).policy))
    assert len(notify) == 2


def test_the_dry_run_reports_would_scale_with_the_workload_and_writes_nothing() -> None:
    _proposal, snap = _reclaim_proposal()
    report = run_cycle(snap, _policy(), DryRunEvictor())
    out = to_dict(report)
    [row] = [d for d in out["decisions"] if d["strategy"] == "idle-gpu"]
    assert (row["action"], row["outcome"], row["workload"]) == (
        "reclaim",
        "would-scale",
        "notebooks/StatefulSet/alice",
    )
    assert out["summary"]["reclaims"] == 1
    assert out["summary"]["gpus_reclaimed"] == 1
    assert out["summary"]["evictions"] == 0


def test_an_inference_service_is_told_but_never_promised_or_given_a_reclaim() -> None:
    p = pod("llm-1", "gpu-a-1", owner=OwnerRef(kind="ReplicaSet", name="llm-predictor-5f"))
    rows = [gpu_sample("gpu-a-1", "GPU-0", pod=p, util=0.1)]
    chain = [
        controller("ReplicaSet", "llm-predictor-5f", owner=OwnerRef(kind="Deployment", name="llm-predictor")),
        controller("Deployment", "llm-predictor", owner=OwnerRef(kind="InferenceService", name="llm")),
    ]
    [told] = _run([p], rows, _args("reclaim"), [*chain, controller("InferenceService", "llm")]).proposals
    assert told.action is not None
    assert (told.action.verb, told.action.grace_until) == ("notify", None)
    assert "after" not in told.reason
    later = _run(
        [p], rows, _args("reclaim"), [*chain, controller("InferenceService", "llm", annotations=_told(9))]
    )
    assert later.proposals == ()
    assert "no reclaim frees the GPUs of an idle InferenceService" in _only_finding(later).detail


@pytest.mark.parametrize(
    ("profile", "model", "share"),
    [
        ("3g.40gb", "NVIDIA-A100-SXM4-80GB", 3 / 7),
        ("1g.10gb", "NVIDIA-H100-80GB-HBM3", 1 / 7),
        ("2g.12gb", "NVIDIA-A30", 2 / 4),
        ("7g.80gb", "NVIDIA-A100-SXM4-80GB", 1.0),
        ("3g.40gb", "NVIDIA-L4", None),  # no MIG on that model: unknown
        ("mixed", "NVIDIA-A100-SXM4-80GB", None),
    ],
)
def test_a_mig_instance_is_its_share_of_the_gpu_model(profile: str, model: str, share: float | None) -> None:
    assert mig_share(profile, model) == (pytest.approx(share) if share is not None else None)


def test_a_workload_of_mig_instances_holds_their_slices() -> None:
    mig = pod("m-0", "gpu-a-1", gpus=0, owner=None, extra={"nvidia.com/mig-3g.40gb": 2})
    assert gpu_equivalents(mig, "NVIDIA-A100-SXM4-80GB") == pytest.approx(6 / 7)
    assert gpu_equivalents(mig, "unknown") == 2  # a profile the model does not explain counts whole
