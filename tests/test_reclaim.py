"""Reclaiming idle GPUs for real, against the fake API server: notify, grace, reclaim, snooze, busy again,
restore, every owner kind, dry runs that write nothing, a restart in the middle of a grace period, and a
scale to 0 that fails, or whose record cannot follow it.

Each cycle is a fresh source, evictor and policy, as after a restart or a leader change: all the state
the lifecycle needs is on the workload's annotations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from kubernetes import client

from rebalancer import rfc3339
from rebalancer.cli import main
from rebalancer.cycle import run_cycle
from rebalancer.cycle_report import CycleReport
from rebalancer.evictor import DryRunEvictor
from rebalancer.fence import UNFENCED, Fence, WriteFence
from rebalancer.kube_evictor import KubeEvictor
from rebalancer.model import GpuTelemetry, Telemetry
from rebalancer.policy import LoadedPolicy, parse_policy
from rebalancer.reclaim import WorkloadWriter
from rebalancer.sinks.events import KubeEventsSink
from rebalancer.sources.kube import KubeSource
from rebalancer.workloads import (
    IDLE_SINCE,
    KUBEFLOW_STOPPED,
    RECLAIM_REASON,
    RECLAIMED_AT,
    RECLAIMED_BY,
    SCALED_DOWN_FROM,
    SNOOZE_UNTIL,
)
from tests.builders import NOW, gpu_sample, replace, telemetry
from tests.fake_apiserver import FakeApiServer, controller_json, node_json, pod_json
from tests.test_daemon_cli import kubeconfig

NS = "notebooks"
GRACE = timedelta(hours=4)


def _policy(action: str = "reclaim", **guards: object) -> LoadedPolicy:
    settings: dict[str, object] = {"min_pod_age": "0s", **guards}
    return parse_policy(
        {
            "strategies": [
                {
                    "name": "idle-gpu",
                    "args": {"actions": [{"action": action, "namespaces": [NS], "grace": "4h"}]},
                }
            ],
            "guards": settings,
        }
    )


def _idle(pods: Iterable[str], util: float = 0.2) -> Telemetry:
    """Each named pod of NS on its own GPU of node gpu-1, at `util` percent over the window."""
    return telemetry(
        _attributed(gpu_sample("gpu-1", f"GPU-{i}", util=util), name) for i, name in enumerate(pods)
    )


def _attributed(row: GpuTelemetry, name: str) -> GpuTelemetry:
    return replace(row, pod_namespace=NS, pod_name=name)


def _cycle(
    api_client: client.ApiClient,
    tel: Telemetry,
    at: datetime,
    *,
    loaded: LoadedPolicy | None = None,
    dry_run: bool = False,
    fence: Fence = UNFENCED,
) -> CycleReport:
    loaded = loaded or _policy()
    source = KubeSource(api_client, loaded, telemetry=_at(tel, at), sleep=lambda _s: None)
    snapshot = source.snapshot(at)
    evictor = DryRunEvictor() if dry_run else KubeEvictor(api_client, sleep=lambda _s: None, fence=fence)
    sinks = [] if dry_run else [KubeEventsSink(api_client)]
    return run_cycle(snapshot, loaded, evictor, sinks)


def _at(tel: Telemetry, at: datetime) -> Telemetry:
    """The same telemetry, its newest samples just before `at`."""
    windows = {
        seconds: replace(
            window,
            gpus=tuple(replace(row, newest_sample=at - timedelta(seconds=15)) for row in window.gpus),
        )
        for seconds, window in tel.windows.items()
    }
    return replace(tel, windows=windows)


def _notebook(
    api: FakeApiServer,
    name: str = "alice",
    *,
    replicas: int = 1,
    annotations: Mapping[str, str] | None = None,
) -> None:
    api.add(controller_json("StatefulSet", name, namespace=NS, replicas=replicas, annotations=annotations))
    for index in range(replicas):
        api.add(pod_json(f"{name}-{index}", "gpu-1", namespace=NS, owner_kind="StatefulSet", owner_name=name))


def _notes(api: FakeApiServer, kind: str, name: str, api_version: str = "apps/v1") -> dict[str, str]:
    found = api.get(kind, name, NS, api_version)
    assert found is not None
    return dict(found["metadata"].get("annotations") or {})


def _replicas(api: FakeApiServer, kind: str, name: str, api_version: str = "apps/v1") -> int:
    found = api.get(kind, name, NS, api_version)
    assert found is not None
    return int(found["spec"]["replicas"])


@pytest.fixture
def cluster(api: FakeApiServer) -> FakeApiServer:
    api.add(node_json("gpu-1"))
    return api


# --------------------------------------------------------------------------- the lifecycle


def test_notify_then_grace_then_reclaim_by_scaling_the_statefulset_to_zero(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    _notebook(cluster)
    tel = _idle(["alice-0"])

    first = _cycle(api_client, tel, NOW)
    assert [n.result for n in first.notices] == ["notified"]
    assert _notes(cluster, "StatefulSet", "alice")[IDLE_SINCE] == rfc3339.format_utc(NOW)
    assert _replicas(cluster, "StatefulSet", "alice") == 1
    [event] = [e for e in cluster.events() if e["involvedObject"]["kind"] == "StatefulSet"]
    assert event["involvedObject"]["name"] == "alice"
    assert event["involvedObject"]["uid"] == "uid-owner-alice"
    assert f"kubectl annotate statefulset alice -n {NS} {SNOOZE_UNTIL}=" in event["message"]

    # Within the grace period (a restart in between: every cycle is a new source and evictor).
    waiting = _cycle(api_client, tel, NOW + timedelta(hours=2))
    assert waiting.notices == ()
    assert _replicas(cluster, "StatefulSet", "alice") == 1

    done = _cycle(api_client, tel, NOW + GRACE + timedelta(minutes=5))
    [notice] = done.notices
    assert (notice.verb, notice.result) == ("reclaim", "scaled")
    assert _replicas(cluster, "StatefulSet", "alice") == 0
    notes = _notes(cluster, "StatefulSet", "alice")
    assert notes[SCALED_DOWN_FROM] == "1"
    assert notes[RECLAIMED_BY] == "scale"
    assert IDLE_SINCE not in notes
    assert done.summary.reclaims == 1
    # Written through the scale subresource, as the RBAC grants it.
    assert cluster.requests_to("*/statefulsets/alice/scale", "PATCH")


def test_a_snooze_holds_the_reclaim_until_it_expires(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    until = NOW + timedelta(hours=8)
    _notebook(
        cluster,
        annotations={
            IDLE_SINCE: rfc3339.format_utc(NOW - timedelta(hours=5)),
            SNOOZE_UNTIL: rfc3339.format_utc(until),
        },
    )
    tel = _idle(["alice-0"])
    held = _cycle(api_client, tel, NOW)
    assert held.notices == ()
    assert _replicas(cluster, "StatefulSet", "alice") == 1
    assert not cluster.writes()
    after = _cycle(api_client, tel, until + timedelta(minutes=1))
    assert [n.result for n in after.notices] == ["scaled"]


def test_a_workload_busy_again_during_the_grace_period_starts_over(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    _notebook(cluster, annotations={IDLE_SINCE: rfc3339.format_utc(NOW - timedelta(hours=3))})
    busy = _cycle(api_client, _idle(["alice-0"], util=45.0), NOW)
    assert [n.result for n in busy.notices] == ["cleared"]
    assert IDLE_SINCE not in _notes(cluster, "StatefulSet", "alice")
    # Idle again after the old grace would have ended: told again, not reclaimed.
    again = _cycle(api_client, _idle(["alice-0"]), NOW + timedelta(hours=2))
    assert [n.result for n in again.notices] == ["notified"]
    assert _replicas(cluster, "StatefulSet", "alice") == 1


def test_a_snooze_set_after_the_snapshot_stops_the_reclaim(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The writer reads the workload again before it writes: the owner's last-minute snooze wins."""
    _notebook(cluster, annotations={IDLE_SINCE: rfc3339.format_utc(NOW - timedelta(hours=5))})
    loaded = _policy()
    source = KubeSource(api_client, loaded, telemetry=_at(_idle(["alice-0"]), NOW), sleep=lambda _s: None)
    snapshot = source.snapshot(NOW)
    stored = cluster.get("StatefulSet", "alice", NS, "apps/v1")
    assert stored is not None
    stored["metadata"]["annotations"][SNOOZE_UNTIL] = rfc3339.format_utc(NOW + timedelta(days=1))
    cluster.add(stored)
    report = run_cycle(snapshot, loaded, KubeEvictor(api_client, sleep=lambda _s: None))
    [row] = [d for d in report.decisions if d.strategy == "idle-gpu"]
    assert row.outcome == "error"
    assert "snoozed meanwhile" in row.reason
    assert _replicas(cluster, "StatefulSet", "alice") == 1


def test_restore_scales_back_and_removes_the_record(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    _notebook(cluster, annotations={IDLE_SINCE: rfc3339.format_utc(NOW - timedelta(hours=5))})
    _cycle(api_client, _idle(["alice-0"]), NOW)
    assert _replicas(cluster, "StatefulSet", "alice") == 0
    done = WorkloadWriter(api_client).restore(NS, "StatefulSet", "alice")
    assert done.ok, done.detail
    assert "scaled back to 1 replicas" in done.detail
    assert _replicas(cluster, "StatefulSet", "alice") == 1
    notes = _notes(cluster, "StatefulSet", "alice")
    assert not {SCALED_DOWN_FROM, RECLAIMED_BY, IDLE_SINCE} & set(notes)
    again = WorkloadWriter(api_client).restore(NS, "StatefulSet", "alice")
    assert not again.ok
    assert "was not reclaimed" in again.detail


@pytest.mark.parametrize("recorded", ["two", "²", ""])
def test_restore_refuses_a_replica_count_it_cannot_read(
    cluster: FakeApiServer, api_client: client.ApiClient, recorded: str
) -> None:
    _notebook(cluster, annotations={IDLE_SINCE: rfc3339.format_utc(NOW - timedelta(hours=5))})
    _cycle(api_client, _idle(["alice-0"]), NOW)
    stored = cluster.get("StatefulSet", "alice", NS, "apps/v1")
    assert stored is not None
    stored["metadata"]["annotations"][SCALED_DOWN_FROM] = recorded
    cluster.add(stored)
    done = WorkloadWriter(api_client).restore(NS, "StatefulSet", "alice")
    assert not done.ok
    assert f'{SCALED_DOWN_FROM} is "{recorded}", not a number of replicas' in done.detail
    assert _replicas(cluster, "StatefulSet", "alice") == 0


def test_restore_all_reclaimed_from_the_command_line(
    cluster: FakeApiServer, api_client: client.ApiClient, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for name in ("alice", "bob"):
        _notebook(cluster, name, annotations={IDLE_SINCE: rfc3339.format_utc(NOW - timedelta(hours=5))})
    _cycle(api_client, _idle(["alice-0", "bob-0"]), NOW)
    assert _replicas(cluster, "StatefulSet", "bob") == 0
    config = kubeconfig(tmp_path / "kubeconfig", cluster.url)
    code = main(["restore", "--all-reclaimed", "-n", NS, "--kubeconfig", str(config)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"{NS}/StatefulSet/alice: StatefulSet {NS}/alice scaled back to 1 replicas" in out
    assert _replicas(cluster, "StatefulSet", "alice") == 1
    assert _replicas(cluster, "StatefulSet", "bob") == 1
    assert main(["restore", f"{NS}/StatefulSet/alice", "--kubeconfig", str(config)]) == 1
    with pytest.raises(SystemExit) as bad:
        main(["restore", "nonsense", "--kubeconfig", str(config)])
    assert bad.value.code == 2
    assert "expected NAMESPACE/KIND/NAME" in capsys.readouterr().err


# --------------------------------------------------------------------------- a scale that fails

SCALE = "*/statefulsets/alice/scale"
RECORD = "*/statefulsets/alice"


def _due(cluster: FakeApiServer) -> str:
    """alice, told 5 hours ago: past its grace period. Its idle-since."""
    told = rfc3339.format_utc(NOW - timedelta(hours=5))
    _notebook(cluster, annotations={IDLE_SINCE: told})
    return told


def _reclaim_row(report: CycleReport) -> tuple[str | None, str]:
    [row] = [d for d in report.decisions if d.strategy == "idle-gpu"]
    return row.outcome, row.reason


def _scaled_without_record(cluster: FakeApiServer, report: CycleReport, told: str) -> str:
    """alice at 0 replicas with only its idle-since, and an error that says so and how to undo it: the
    error's words."""
    outcome, reason = _reclaim_row(report)
    assert outcome == "error"
    assert (
        f"StatefulSet {NS}/alice scaled from 1 to 0 replicas, but its reclaim record was not written"
        in reason
    )
    assert f"kubectl scale statefulset alice -n {NS} --replicas=1" in reason
    assert _replicas(cluster, "StatefulSet", "alice") == 0
    assert _notes(cluster, "StatefulSet", "alice") == {IDLE_SINCE: told}
    return reason


def test_one_transient_failure_of_the_scale_is_retried_and_the_reclaim_completes(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    _due(cluster)
    cluster.inject(SCALE, status=503, times=1, method="PATCH")
    report = _cycle(api_client, _idle(["alice-0"]), NOW)
    assert [(n.verb, n.result) for n in report.notices] == [("reclaim", "scaled")]
    assert _replicas(cluster, "StatefulSet", "alice") == 0
    notes = _notes(cluster, "StatefulSet", "alice")
    assert (notes[SCALED_DOWN_FROM], notes[RECLAIMED_BY]) == ("1", "scale")
    assert {RECLAIMED_AT, RECLAIM_REASON} <= set(notes)
    assert IDLE_SINCE not in notes
    assert len(cluster.requests_to(SCALE, "PATCH")) == 2


def test_a_scale_whose_answer_was_lost_is_recorded_not_judged_again(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The scale went through but its answer never came: the retry finds the workload at 0 replicas, which
    is this reclaim's own doing, and writes the record with the replicas it had."""
    _due(cluster)
    cluster.inject(SCALE, drop=True, lose_answer=True, times=1, method="PATCH")
    report = _cycle(api_client, _idle(["alice-0"]), NOW)
    assert [n.result for n in report.notices] == ["scaled"]
    assert _replicas(cluster, "StatefulSet", "alice") == 0
    notes = _notes(cluster, "StatefulSet", "alice")
    assert (notes[SCALED_DOWN_FROM], notes[RECLAIMED_BY]) == ("1", "scale")
    assert IDLE_SINCE not in notes
    restored = WorkloadWriter(api_client).restore(NS, "StatefulSet", "alice")
    assert restored.ok, restored.detail
    assert _replicas(cluster, "StatefulSet", "alice") == 1


def test_a_scale_that_keeps_failing_writes_nothing_and_the_next_cycle_reclaims(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    """A running workload never carries a reclaim record: its idle-since stays, so the next cycle reclaims
    it (its grace period is long over) instead of telling the owner again."""
    told = _due(cluster)
    cluster.inject(SCALE, status=503, times=None, method="PATCH")
    failed = _cycle(api_client, _idle(["alice-0"]), NOW)
    outcome, reason = _reclaim_row(failed)
    assert outcome == "error"
    assert "HTTP 503" in reason
    assert failed.notices == ()
    assert _replicas(cluster, "StatefulSet", "alice") == 1
    assert _notes(cluster, "StatefulSet", "alice") == {IDLE_SINCE: told}
    assert not cluster.requests_to(RECORD, "PATCH")
    assert "was not reclaimed" in WorkloadWriter(api_client).restore(NS, "StatefulSet", "alice").detail

    cluster.clear_faults()
    again = _cycle(api_client, _idle(["alice-0"]), NOW + timedelta(minutes=5))
    assert [(n.verb, n.result) for n in again.notices] == [("reclaim", "scaled")]
    assert _replicas(cluster, "StatefulSet", "alice") == 0
    notes = _notes(cluster, "StatefulSet", "alice")
    assert (notes[SCALED_DOWN_FROM], notes[RECLAIMED_BY]) == ("1", "scale")


def test_a_record_that_cannot_follow_the_scale_is_reported_with_the_undo(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    told = _due(cluster)
    cluster.inject(RECORD, status=503, times=None, method="PATCH")
    report = _cycle(api_client, _idle(["alice-0"]), NOW)
    assert "HTTP 503" in _scaled_without_record(cluster, report, told)


class _Lease:
    """A leader lease with time to spare for the first `checks` writes, then lost."""

    def __init__(self, checks: int) -> None:
        self.checks = checks

    def __call__(self) -> float:
        self.checks -= 1
        return 60.0 if self.checks >= 0 else 0.0


class _Clock:
    """A monotonic clock that moves an hour on with each reading: a deadline passes after one write."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 3600.0
        return self.now


def test_a_deadline_passing_after_the_scale_still_lets_its_record_be_written(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    """A deadline stops writes from starting, but must not leave a scale to 0 without the record that
    `restore` undoes it from: the record asks only the lease."""
    _due(cluster)
    fence = WriteFence(lambda: 60.0, monotonic=_Clock())
    fence.set_deadline(5000.0, "the cycle deadline passed")
    report = _cycle(api_client, _idle(["alice-0"]), NOW, fence=fence)
    assert [n.result for n in report.notices] == ["scaled"]
    assert _replicas(cluster, "StatefulSet", "alice") == 0
    notes = _notes(cluster, "StatefulSet", "alice")
    assert (notes[SCALED_DOWN_FROM], notes[RECLAIMED_BY]) == ("1", "scale")
    assert {RECLAIMED_AT, RECLAIM_REASON} <= set(notes)
    assert IDLE_SINCE not in notes


def test_a_lease_lost_between_the_scale_and_its_record_is_reported_as_it_is(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The outcome says what was written: the scale, not the record, and how to undo it."""
    told = _due(cluster)
    report = _cycle(api_client, _idle(["alice-0"]), NOW, fence=WriteFence(_Lease(1)))
    assert "no longer holds the leader lease" in _scaled_without_record(cluster, report, told)


def test_a_lease_lost_before_the_scale_writes_nothing_and_says_not_attempted(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    told = _due(cluster)
    report = _cycle(api_client, _idle(["alice-0"]), NOW, fence=WriteFence(_Lease(0)))
    outcome, reason = _reclaim_row(report)
    assert outcome == "error"
    assert "error: not attempted: this replica no longer holds the leader lease" in reason
    assert _replicas(cluster, "StatefulSet", "alice") == 1
    assert _notes(cluster, "StatefulSet", "alice") == {IDLE_SINCE: told}
    assert not cluster.writes()


# --------------------------------------------------------------------------- per workload


def test_one_idle_replica_of_a_busy_deployment_is_left_alone(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    cluster.add(controller_json("Deployment", "serve", namespace=NS, replicas=3))
    cluster.add(
        controller_json("ReplicaSet", "serve-5f", namespace=NS, replicas=3, owner=("Deployment", "serve"))
    )
    for index in range(3):
        cluster.add(
            pod_json(
                f"serve-5f-{index}", "gpu-1", namespace=NS, owner_kind="ReplicaSet", owner_name="serve-5f"
            )
        )
    rows = [
        _attributed(gpu_sample("gpu-1", "GPU-0", util=0.1), "serve-5f-0"),
        _attributed(gpu_sample("gpu-1", "GPU-1", util=70.0), "serve-5f-1"),
        _attributed(gpu_sample("gpu-1", "GPU-2", util=65.0), "serve-5f-2"),
    ]
    report = _cycle(api_client, telemetry(rows), NOW)
    assert report.notices == ()
    assert not cluster.writes()


@pytest.mark.parametrize(
    ("kind", "api_version", "check"),
    [
        ("Deployment", "apps/v1", "replicas"),
        ("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", "replicas"),
        ("Job", "batch/v1", "suspend"),
        ("JobSet", "jobset.x-k8s.io/v1alpha2", "suspend"),
        ("Notebook", "kubeflow.org/v1", "stopped"),
    ],
)
def test_every_owner_kind_is_reclaimed_its_own_way(
    cluster: FakeApiServer, api_client: client.ApiClient, kind: str, api_version: str, check: str
) -> None:
    told = {IDLE_SINCE: rfc3339.format_utc(NOW - timedelta(hours=5))}
    direct = {
        "Deployment": "ReplicaSet",
        "LeaderWorkerSet": "StatefulSet",
        "Job": "Job",
        "JobSet": "Job",
        "Notebook": "StatefulSet",
    }[kind]
    scalable = kind in ("Deployment", "LeaderWorkerSet")
    cluster.add(
        controller_json(kind, "top", namespace=NS, annotations=told, replicas=1 if scalable else None)
    )
    if direct != kind:
        cluster.add(controller_json(direct, "child", namespace=NS, owner=(kind, "top")))
    owner_name = "child" if direct != kind else "top"
    direct_version = {"ReplicaSet": "apps/v1", "StatefulSet": "apps/v1", "Job": "batch/v1"}[direct]
    cluster.add(
        pod_json(
            "w-0",
            "gpu-1",
            namespace=NS,
            owner_kind=direct,
            owner_name=owner_name,
            owner_api_version=direct_version,
        )
    )

    report = _cycle(api_client, _idle(["w-0"]), NOW)
    [notice] = report.notices
    assert notice.verb == "reclaim"
    stored = cluster.get(kind, "top", NS, api_version)
    assert stored is not None
    notes = stored["metadata"]["annotations"]
    if check == "replicas":
        assert notice.result == "scaled"
        assert stored["spec"]["replicas"] == 0
        assert notes[SCALED_DOWN_FROM] == "1"
    elif check == "suspend":
        assert notice.result == "suspended"
        assert stored["spec"]["suspend"] is True
    else:
        assert notice.result == "stopped"
        assert KUBEFLOW_STOPPED in notes
    assert notes[RECLAIMED_BY] == {"replicas": "scale", "suspend": "suspend", "stopped": "stop"}[check]

    restored = WorkloadWriter(api_client).restore(NS, kind, "top")
    assert restored.ok, restored.detail
    back = cluster.get(kind, "top", NS, api_version)
    assert back is not None
    if check == "replicas":
        assert back["spec"]["replicas"] == 1
    elif check == "suspend":
        assert back["spec"]["suspend"] is False
    else:
        assert KUBEFLOW_STOPPED not in (back["metadata"].get("annotations") or {})


def test_a_bare_pod_is_evicted_only_where_bare_pods_may_be(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    cluster.add(pod_json("scratch", "gpu-1", namespace=NS, owner_kind=None))
    refused = _cycle(api_client, _idle(["scratch"]), NOW)
    [row] = [d for d in refused.decisions if d.strategy == "idle-gpu"]
    assert (row.action, row.blocked_by) == ("skip", "bare-pod")
    allowed = _cycle(api_client, _idle(["scratch"]), NOW, loaded=_policy(evict_bare_pods=True))
    [row] = [d for d in allowed.decisions if d.strategy == "idle-gpu"]
    assert (row.action, row.outcome) == ("reclaim", "evicted")
    assert cluster.pod(NS, "scratch") is None


def test_an_opted_out_notebook_is_blocked_by_the_opt_out_guard(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    cluster.add(
        controller_json(
            "StatefulSet",
            "bob",
            namespace=NS,
            annotations={IDLE_SINCE: rfc3339.format_utc(NOW - timedelta(hours=5))},
        )
    )
    cluster.add(
        pod_json(
            "bob-0",
            "gpu-1",
            namespace=NS,
            owner_kind="StatefulSet",
            owner_name="bob",
            annotations={"rebalancer.gpu/evict": "false"},
        )
    )
    report = _cycle(api_client, _idle(["bob-0"]), NOW)
    [row] = [d for d in report.decisions if d.strategy == "idle-gpu"]
    assert (row.action, row.blocked_by) == ("skip", "opt-out")
    assert _replicas(cluster, "StatefulSet", "bob") == 1


# --------------------------------------------------------------------------- dry runs


def test_a_dry_run_writes_nothing_and_says_what_it_would_do(
    cluster: FakeApiServer, api_client: client.ApiClient
) -> None:
    _notebook(cluster, annotations={IDLE_SINCE: rfc3339.format_utc(NOW - timedelta(hours=5))})
    _notebook(cluster, "carol")
    report = _cycle(api_client, _idle(["alice-0", "carol-0"]), NOW, dry_run=True)
    assert sorted((n.ref, n.result) for n in report.notices) == [
        (f"{NS}/StatefulSet/alice", "would-scale"),
        (f"{NS}/StatefulSet/carol", "would-notify"),
    ]
    assert not cluster.writes()


def test_a_server_side_dry_run_persists_nothing(cluster: FakeApiServer, api_client: client.ApiClient) -> None:
    _notebook(cluster, annotations={IDLE_SINCE: rfc3339.format_utc(NOW - timedelta(hours=5))})
    loaded = _policy()
    snapshot = KubeSource(
        api_client, loaded, telemetry=_at(_idle(["alice-0"]), NOW), sleep=lambda _s: None
    ).snapshot(NOW)
    report = run_cycle(snapshot, loaded, KubeEvictor(api_client, server_dry_run=True, sleep=lambda _s: None))
    assert [n.result for n in report.notices] == ["would-scale"]
    assert _replicas(cluster, "StatefulSet", "alice") == 1
    assert IDLE_SINCE in _notes(cluster, "StatefulSet", "alice")
    assert all(r.param("dryRun") == "All" for r in cluster.writes())
