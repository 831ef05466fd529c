"""Behaviour of the `idle-gpu` strategy: idle evictions, evidence rules, gangs and leaked VRAM."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from rebalancer.model import Finding, GpuTelemetry, Pod, StrategyResult, Telemetry
from rebalancer.registry import StrategyContext, get_strategy
from strategies.idle_gpu import IdleGpuArgs, idle_gpu
from tests.builders import NOW, gpu_sample, node, pod, replace, snapshot, telemetry

CTX = StrategyContext()
OPTED_IN = IdleGpuArgs(namespaces=("ml",))


def run(
    pods: list[Pod],
    rows: list[GpuTelemetry],
    args: IdleGpuArgs = OPTED_IN,
    *,
    tel: Telemetry | None = None,
) -> StrategyResult:
    snap = snapshot(
        [node("gpu-a-1"), node("gpu-a-2")],
        pods,
        telemetry=tel if tel is not None else telemetry(rows, args.window),
    )
    return idle_gpu(snap, args, CTX)


def kinds(result: StrategyResult, kind: str) -> list[Finding]:
    return [f for f in result.findings if f.kind == kind]


# --------------------------------------------------------------------------- arguments


def test_args_defaults_and_registration() -> None:
    args = IdleGpuArgs()
    assert args.max_utilization_percent == 5
    assert args.window == 1800
    assert args.min_pod_age == 3600
    assert args.min_samples == 10
    assert args.max_telemetry_age == 300
    assert args.namespaces == ()
    assert args.leaked_vram_mib == 1024
    assert args.needs_telemetry()
    assert args.telemetry_windows() == frozenset({1800})
    spec = get_strategy("idle-gpu")
    assert spec is not None
    assert spec.args_model is IdleGpuArgs


def test_args_parse_durations_and_reject_bad_values() -> None:
    args = IdleGpuArgs.model_validate({"window": "1h", "min_pod_age": "2h30m", "max_telemetry_age": "90s"})
    assert (args.window, args.min_pod_age, args.max_telemetry_age) == (3600, 9000, 90)
    assert args.telemetry_windows() == frozenset({3600})
    for bad in (
        {"max_utilization_percent": 101},
        {"max_utilization_percent": -1},
        {"min_samples": 0},
        {"window": "soon"},
        {"window": 0},
        {"leaked_vram_mib": -5},
        {"namespace": ["ml"]},
    ):
        with pytest.raises(ValidationError):
            IdleGpuArgs.model_validate(bad)


def test_args_are_frozen() -> None:
    with pytest.raises(ValidationError):
        OPTED_IN.window = 60  # type: ignore[misc]


# --------------------------------------------------------------------------- telemetry availability


def test_unavailable_telemetry_skips_without_proposals() -> None:
    p = pod("train", "gpu-a-1")
    result = run([p], [], tel=Telemetry(available=False, problem="prometheus unreachable"))
    assert result.skipped == "telemetry unavailable: prometheus unreachable"
    assert result.proposals == ()
    assert result.findings == ()


def test_missing_window_skips() -> None:
    p = pod("train", "gpu-a-1")
    rows = [gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.5)]
    result = run([p], [], tel=telemetry(rows, 600))
    assert result.skipped is not None
    assert result.skipped.startswith("telemetry unavailable:")
    assert result.proposals == ()


# --------------------------------------------------------------------------- idle vs busy


def test_idle_pod_in_opted_in_namespace_is_proposed() -> None:
    p = pod("train", "gpu-a-1", gpus=1)
    result = run([p], [gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.8)])
    assert result.skipped is None
    [proposal] = result.proposals
    assert proposal.strategy == "idle-gpu"
    assert proposal.kind == "pod"
    assert proposal.pods == (p,)
    assert proposal.node == "gpu-a-1"
    assert proposal.priority == 1.0
    assert proposal.reason == "GPU idle: avg 0.8% over 30m (threshold 5%) on GPU-1"
    [finding] = kinds(result, "idle-gpu")
    assert (finding.node, finding.gpu, finding.namespace, finding.pod) == ("gpu-a-1", "GPU-1", "ml", "train")
    assert "avg 0.8%" in finding.detail
    assert "30m" in finding.detail
    assert "1000 MiB" in finding.detail


MIG_1G = "nvidia.com/mig-1g.10gb"


def mig_row(p: Pod, instance: str, util: float) -> GpuTelemetry:
    row = gpu_sample("gpu-a-1", "GPU-1", pod=p, util=util)
    return replace(row, mig_instance=instance, mig_profile="1g.10gb")


def test_a_pod_holding_only_mig_instances_is_judged_by_them() -> None:
    p = pod("notebook", "gpu-a-1", gpus=0, extra={MIG_1G: 2})
    assert p.gpu.count == 0 and p.mig_instances == 2 and p.uses_gpu

    [proposal] = run([p], [mig_row(p, "3", 0.5), mig_row(p, "4", 1.0)]).proposals
    assert proposal.pods == (p,)
    assert "GPU-1 (MIG 3 1g.10gb)" in proposal.reason and "GPU-1 (MIG 4 1g.10gb)" in proposal.reason

    # One busy instance keeps it.
    assert run([p], [mig_row(p, "3", 0.5), mig_row(p, "4", 40.0)]).proposals == ()
    # Telemetry for one of its two instances is no verdict: stale, never idle.
    result = run([p], [mig_row(p, "3", 0.5)])
    assert result.proposals == ()
    [stale] = kinds(result, "stale-telemetry")
    assert "telemetry covers 1 of the 2 GPUs and MIG instances the pod holds" in stale.detail


def test_busy_pod_is_left_alone() -> None:
    p = pod("train", "gpu-a-1")
    result = run([p], [gpu_sample("gpu-a-1", "GPU-1", pod=p, util=63.0)])
    assert result.proposals == ()
    assert result.findings == ()


def test_threshold_is_strict() -> None:
    p = pod("train", "gpu-a-1")
    result = run([p], [gpu_sample("gpu-a-1", "GPU-1", pod=p, util=5.0)])
    assert result.proposals == ()
    assert kinds(result, "idle-gpu") == []


def test_one_busy_gpu_keeps_a_multi_gpu_pod() -> None:
    p = pod("train", "gpu-a-1", gpus=2)
    rows = [
        gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.0),
        gpu_sample("gpu-a-1", "GPU-2", pod=p, util=40.0),
    ]
    result = run([p], rows)
    assert result.proposals == ()
    assert kinds(result, "idle-gpu") == []


def test_multi_gpu_idle_pod_lists_every_gpu_and_bigger_frees_more() -> None:
    big = pod("big", "gpu-a-1", gpus=4)
    small = pod("small", "gpu-a-2", gpus=1)
    rows = [gpu_sample("gpu-a-1", f"GPU-{i}", pod=big, util=1.0 + i) for i in range(4)]
    rows.append(gpu_sample("gpu-a-2", "GPU-9", pod=small, util=0.0))
    result = run([big, small], rows)
    by_pod = {p.pods[0].name: p for p in result.proposals}
    assert by_pod["big"].priority == 4.0
    assert by_pod["small"].priority == 1.0
    assert by_pod["big"].priority > by_pod["small"].priority
    assert by_pod["big"].reason == (
        "GPU idle: avg 1% over 30m (threshold 5%) on GPU-0, avg 2% on GPU-1, avg 3% on GPU-2, avg 4% on GPU-3"
    )
    assert sorted(f.gpu or "" for f in kinds(result, "idle-gpu") if f.pod == "big") == [
        "GPU-0",
        "GPU-1",
        "GPU-2",
        "GPU-3",
    ]


def test_pods_without_gpus_or_not_running_are_ignored() -> None:
    cpu = pod("cpu-only", "gpu-a-1", gpus=0)
    done = pod("done", "gpu-a-1", phase="Succeeded")
    pending = pod("pending", None)
    rows = [
        gpu_sample("gpu-a-1", "GPU-1", pod=done, util=0.0, fb_used_mib=10),
        gpu_sample("gpu-a-1", "GPU-2", pod=pending, util=0.0, fb_used_mib=10),
    ]
    result = run([cpu, done, pending], rows)
    assert result.proposals == ()
    assert result.findings == ()


# --------------------------------------------------------------------------- evidence


def test_stale_telemetry_is_a_finding_never_a_proposal() -> None:
    p = pod("train", "gpu-a-1")
    rows = [gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.0, age=timedelta(minutes=12))]
    result = run([p], rows)
    assert result.proposals == ()
    assert kinds(result, "idle-gpu") == []
    [finding] = kinds(result, "stale-telemetry")
    assert (finding.node, finding.gpu, finding.namespace, finding.pod) == ("gpu-a-1", "GPU-1", "ml", "train")
    assert "12m old" in finding.detail
    assert "max 5m" in finding.detail


def test_custom_telemetry_age_accepts_older_samples() -> None:
    p = pod("train", "gpu-a-1")
    rows = [gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.0, age=timedelta(minutes=12))]
    result = run([p], rows, IdleGpuArgs(namespaces=("ml",), max_telemetry_age="15m"))
    assert len(result.proposals) == 1
    assert kinds(result, "stale-telemetry") == []


def test_too_few_samples_is_not_enough_evidence() -> None:
    p = pod("train", "gpu-a-1")
    rows = [gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.0, samples=3)]
    result = run([p], rows)
    assert result.proposals == ()
    [finding] = kinds(result, "stale-telemetry")
    assert "3 utilisation samples" in finding.detail
    assert "need 10" in finding.detail


def test_missing_telemetry_is_never_idle() -> None:
    p = pod("train", "gpu-a-1")
    other = pod("other", "gpu-a-2")
    result = run([p, other], [gpu_sample("gpu-a-2", "GPU-7", pod=other, util=80.0)])
    assert result.proposals == ()
    [finding] = kinds(result, "stale-telemetry")
    assert (finding.pod, finding.node, finding.gpu) == ("train", "gpu-a-1", None)
    assert "no GPU telemetry" in finding.detail


def test_no_newest_sample_is_stale() -> None:
    p = pod("train", "gpu-a-1")
    row = replace(gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.0), newest_sample=None)
    result = run([p], [row])
    assert result.proposals == ()
    assert len(kinds(result, "stale-telemetry")) == 1


def test_telemetry_for_fewer_gpus_than_held_is_incomplete() -> None:
    p = pod("train", "gpu-a-1", gpus=2)
    result = run([p], [gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.0)])
    assert result.proposals == ()
    [finding] = kinds(result, "stale-telemetry")
    assert "1 of the 2 GPUs" in finding.detail


def test_one_stale_row_taints_the_whole_pod() -> None:
    p = pod("train", "gpu-a-1", gpus=2)
    rows = [
        gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.0),
        gpu_sample("gpu-a-1", "GPU-2", pod=p, util=0.0, age=timedelta(hours=1)),
    ]
    result = run([p], rows)
    assert result.proposals == ()
    [finding] = kinds(result, "stale-telemetry")
    assert "GPU-2" in finding.detail
    assert "GPU-1" not in finding.detail


# --------------------------------------------------------------------------- age


def test_too_young_pod_is_neither_proposed_nor_reported_idle() -> None:
    p = pod("fresh", "gpu-a-1", age=timedelta(minutes=20))
    result = run([p], [gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.0, fb_used_mib=100)])
    assert result.proposals == ()
    assert result.findings == ()


def test_unknown_age_counts_as_too_young() -> None:
    p = replace(pod("ageless", "gpu-a-1"), created=None, started=None)
    result = run([p], [gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.0, fb_used_mib=100)])
    assert result.proposals == ()
    assert kinds(result, "idle-gpu") == []


def test_start_time_wins_over_creation_time() -> None:
    base = pod("restarted", "gpu-a-1", age=timedelta(days=3))
    recently_started = replace(base, started=NOW - timedelta(minutes=5))
    result = run([recently_started], [gpu_sample("gpu-a-1", "GPU-1", pod=recently_started, util=0.0)])
    assert result.proposals == ()
    only_created = replace(base, started=None)
    result = run([only_created], [gpu_sample("gpu-a-1", "GPU-1", pod=only_created, util=0.0)])
    assert len(result.proposals) == 1


# --------------------------------------------------------------------------- namespaces


def test_default_args_report_only() -> None:
    p = pod("train", "gpu-a-1")
    result = run([p], [gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.0)], IdleGpuArgs())
    assert result.proposals == ()
    [finding] = kinds(result, "idle-gpu")
    assert finding.pod == "train"
    assert "namespace ml not opted in" in finding.detail


def test_only_opted_in_namespaces_are_proposed() -> None:
    ml = pod("a", "gpu-a-1", namespace="ml")
    research = pod("b", "gpu-a-1", namespace="research")
    rows = [
        gpu_sample("gpu-a-1", "GPU-1", pod=ml, util=0.0),
        gpu_sample("gpu-a-1", "GPU-2", pod=research, util=0.0),
    ]
    result = run([ml, research], rows, IdleGpuArgs(namespaces=("research",)))
    assert [p.pods[0].key for p in result.proposals] == [("research", "b")]
    assert {f.namespace for f in kinds(result, "idle-gpu")} == {"ml", "research"}


# --------------------------------------------------------------------------- gangs


def test_gang_with_every_member_idle_moves_whole() -> None:
    w0 = pod("job-w0", "gpu-a-1", gpus=2, gang="ml/job")
    w1 = pod("job-w1", "gpu-a-2", gpus=2, gang="ml/job")
    launcher = pod("job-launcher", "gpu-a-2", gpus=0, gang="ml/job")
    rows = [
        gpu_sample("gpu-a-1", "GPU-1", pod=w0, util=0.5),
        gpu_sample("gpu-a-1", "GPU-2", pod=w0, util=0.5),
        gpu_sample("gpu-a-2", "GPU-3", pod=w1, util=1.5),
        gpu_sample("gpu-a-2", "GPU-4", pod=w1, util=0.0),
    ]
    result = run([w0, w1, launcher], rows)
    [proposal] = result.proposals
    assert proposal.kind == "gang"
    assert proposal.group == "ml/job"
    assert {p.key for p in proposal.pods} == {w0.key, w1.key, launcher.key}
    assert proposal.priority == 4.0
    assert "gang ml/job" in proposal.reason
    assert "1.5%" in proposal.reason
    assert len(kinds(result, "idle-gpu")) == 4


def test_gang_with_a_busy_member_is_not_proposed() -> None:
    w0 = pod("job-w0", "gpu-a-1", gang="ml/job")
    w1 = pod("job-w1", "gpu-a-2", gang="ml/job")
    rows = [
        gpu_sample("gpu-a-1", "GPU-1", pod=w0, util=0.5),
        gpu_sample("gpu-a-2", "GPU-3", pod=w1, util=70.0),
    ]
    result = run([w0, w1], rows)
    assert result.proposals == ()
    [finding] = kinds(result, "idle-gpu")
    assert finding.pod == "job-w0"
    assert "1 of 2 GPU members idle" in finding.detail


def test_gang_with_a_stale_member_is_not_proposed() -> None:
    w0 = pod("job-w0", "gpu-a-1", gang="ml/job")
    w1 = pod("job-w1", "gpu-a-2", gang="ml/job")
    rows = [
        gpu_sample("gpu-a-1", "GPU-1", pod=w0, util=0.5),
        gpu_sample("gpu-a-2", "GPU-3", pod=w1, util=0.5, samples=2),
    ]
    result = run([w0, w1], rows)
    assert result.proposals == ()
    assert [f.pod for f in kinds(result, "stale-telemetry")] == ["job-w1"]


def test_gang_outside_opted_in_namespaces_is_report_only() -> None:
    w0 = pod("job-w0", "gpu-a-1", gang="ml/job")
    w1 = pod("job-w1", "gpu-a-2", gang="ml/job")
    rows = [
        gpu_sample("gpu-a-1", "GPU-1", pod=w0, util=0.5),
        gpu_sample("gpu-a-2", "GPU-3", pod=w1, util=0.5),
    ]
    result = run([w0, w1], rows, IdleGpuArgs())
    assert result.proposals == ()
    assert all("not opted in" in f.detail for f in kinds(result, "idle-gpu"))


# --------------------------------------------------------------------------- time-slicing


def test_time_sliced_pods_are_judged_on_their_own_rows() -> None:
    idle = pod("notebook", "gpu-a-1", gpus=1, gpu_milli=250)
    busy = pod("inference", "gpu-a-1", gpus=1, gpu_milli=250)
    rows = [
        gpu_sample("gpu-a-1", "GPU-1", pod=idle, util=0.2, fb_used_mib=500),
        gpu_sample("gpu-a-1", "GPU-1", pod=busy, util=55.0, fb_used_mib=9000),
    ]
    result = run([idle, busy], rows)
    [proposal] = result.proposals
    assert proposal.pods == (idle,)
    assert proposal.priority == 0.25
    assert [f.pod for f in kinds(result, "idle-gpu")] == ["notebook"]
    assert kinds(result, "leaked-vram") == []


# --------------------------------------------------------------------------- leaked VRAM


def test_framebuffer_used_with_no_pod_is_leaked() -> None:
    rows = [gpu_sample("gpu-a-1", "GPU-1", util=0.0, fb_used_mib=6144)]
    result = run([], rows)
    assert result.proposals == ()
    [finding] = kinds(result, "leaked-vram")
    assert (finding.node, finding.gpu, finding.namespace, finding.pod) == ("gpu-a-1", "GPU-1", None, None)
    assert "6144 MiB" in finding.detail
    assert "no pod attached" in finding.detail
    assert "1024 MiB" in finding.detail


def test_unattributed_row_of_a_device_a_pod_uses_is_not_leaked() -> None:
    p = pod("train", "gpu-a-1")
    rows = [
        gpu_sample("gpu-a-1", "GPU-1", util=60.0, fb_used_mib=6144),
        gpu_sample("gpu-a-1", "GPU-1", pod=p, util=60.0, fb_used_mib=6144),
    ]
    result = run([p], rows)
    assert kinds(result, "leaked-vram") == []


def test_memory_of_a_pod_the_view_does_not_have_yet_is_not_leaked() -> None:
    # The exporter names a pod created after the pod list: the row carries no pod, but a pod holds it.
    held = replace(gpu_sample("gpu-a-1", "GPU-1", util=80.0, fb_used_mib=30000), fb_used_by_unseen_pod=True)
    assert kinds(run([], [held]), "leaked-vram") == []
    assert len(kinds(run([], [replace(held, fb_used_by_unseen_pod=False)]), "leaked-vram")) == 1


def test_small_or_stale_unattributed_use_is_not_leaked() -> None:
    rows = [
        gpu_sample("gpu-a-1", "GPU-1", util=0.0, fb_used_mib=512),
        gpu_sample("gpu-a-1", "GPU-2", util=0.0, fb_used_mib=8000, age=timedelta(hours=2)),
        gpu_sample("gpu-a-1", "GPU-3", util=0.0, fb_used_mib=None),
    ]
    result = run([], rows)
    assert kinds(result, "leaked-vram") == []


def test_pod_holding_vram_at_zero_utilisation_is_leaked_too() -> None:
    p = pod("stuck", "gpu-a-1", namespace="research")
    rows = [gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.0, fb_used_mib=30000)]
    result = run([p], rows)
    [leak] = kinds(result, "leaked-vram")
    assert (leak.node, leak.gpu, leak.namespace, leak.pod) == ("gpu-a-1", "GPU-1", "research", "stuck")
    assert "30000 MiB" in leak.detail
    assert "0% utilisation for the whole 30m window" in leak.detail
    # The leak itself never evicts; research is not opted in, so nothing is proposed.
    assert result.proposals == ()
    assert len(kinds(result, "idle-gpu")) == 1


def test_pod_with_any_activity_is_not_leaked() -> None:
    p = pod("warm", "gpu-a-1")
    row = replace(gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.1, fb_used_mib=30000), util_max_percent=3.0)
    result = run([p], [row])
    assert kinds(result, "leaked-vram") == []
    assert len(result.proposals) == 1


def test_zero_utilisation_needs_enough_samples_for_a_leak() -> None:
    p = pod("stuck", "gpu-a-1")
    rows = [gpu_sample("gpu-a-1", "GPU-1", pod=p, util=0.0, fb_used_mib=30000, samples=2)]
    result = run([p], rows)
    assert kinds(result, "leaked-vram") == []
    assert len(kinds(result, "stale-telemetry")) == 1


def test_leaked_vram_threshold_is_configurable() -> None:
    rows = [gpu_sample("gpu-a-1", "GPU-1", util=0.0, fb_used_mib=700)]
    assert kinds(run([], rows), "leaked-vram") == []
    assert len(kinds(run([], rows, IdleGpuArgs(leaked_vram_mib=512)), "leaked-vram")) == 1
