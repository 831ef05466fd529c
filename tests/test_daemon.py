"""The daemon: cycles, stop flag, policy hot reload, HTTP endpoints, the apscheduler loop (freezegun)."""

from __future__ import annotations

import gc
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
from freezegun import freeze_time
from prometheus_client.parser import text_string_to_metric_families

from rebalancer.daemon.http import StatusServer
from rebalancer.daemon.loop import JOB_ID, Clock, Daemon, DaemonSinks, GatedEvictor, LiveEdge
from rebalancer.daemon.reload import PolicyWatcher
from rebalancer.daemon.wiring import build_notifiers
from rebalancer.evictor import DryRunEvictor, UnframedEvictor
from rebalancer.model import Decision, Finding, Mode, Outcome, Snapshot
from rebalancer.policy import NotifyConfig, PolicyError, parse_policy
from rebalancer.sinks.notify import HttpPoster, Notifier
from tests.builders import A100, NOW, node, pod, snapshot
from tests.http_receiver import HttpReceiver, http_receiver

__all__ = ["http_receiver"]

POLICY: dict[str, Any] = {
    "dry_run": True,
    "interval": "5m",
    "strategies": [{"name": "gpu-consolidation", "args": {"max_utilization_percent": None}}],
    "telemetry": None,
    "prices": {"per_gpu_hour": {A100: 2.5}},
}


def cluster(now: datetime = NOW) -> Snapshot:
    """Three 8-GPU nodes holding 2, 3 and 3 one-GPU pods: drain a-1, then a-3, both onto a-2."""
    return snapshot(
        [node("a-1"), node("a-2"), node("a-3")],
        [
            pod("a1-x", "a-1"),
            pod("a1-y", "a-1"),
            *(pod(f"a2-{i}", "a-2") for i in range(3)),
            *(pod(f"a3-{i}", "a-3") for i in range(3)),
        ],
        now=now,
    )


def source(now: datetime, _loaded: object) -> Snapshot:
    return cluster(now)


def write_policy(path: Path, **changes: Any) -> Path:
    path.write_text(json.dumps({**POLICY, **changes}), encoding="utf-8")
    return path


class RecordingEvictor(UnframedEvictor):
    """A live evictor that evicts everything and remembers the decisions it was handed."""

    mode: Mode = "live"

    def __init__(self, during: Callable[[Decision], None] | None = None) -> None:
        self.decisions: list[Decision] = []
        self._during = during

    def evict(self, decision: Decision) -> tuple[Outcome, ...]:
        self.decisions.append(decision)
        if self._during is not None:
            self._during(decision)
        return tuple(Outcome(p.namespace, p.name, "evicted") for p in decision.proposal.pods)


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def no_notifiers(_notify: NotifyConfig, _on_result: Callable[[str, str], None]) -> list[Notifier]:
    return []


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    made: list[Daemon] = []
    yield made
    for daemon in made:
        daemon.shutdown(notify_timeout=0.5)


def sample(daemon: Daemon, name: str, **labels: str) -> float | None:
    body, _ = daemon.metrics.exposition()
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


# --------------------------------------------------------------------------- one cycle


def test_a_cycle_reads_the_clock_once_evaluates_and_keeps_the_report(daemons: list[Daemon]) -> None:
    reads: list[datetime] = []

    def clock() -> datetime:
        reads.append(NOW)
        return NOW

    seen: list[datetime] = []

    def recording_source(now: datetime, loaded: object) -> Snapshot:
        seen.append(now)
        return cluster(now)

    daemon = Daemon(
        parse_policy(POLICY),
        recording_source,
        sinks=DaemonSinks(notifiers=no_notifiers),
        clock=Clock(wall=clock),
    )
    daemons.append(daemon)
    with structlog.testing.capture_logs([structlog.contextvars.merge_contextvars]) as logs:
        report = daemon.run_cycle()
    assert report is not None and report.mode == "dry-run"
    assert len(reads) == 1 and seen == [NOW]
    assert report.freed_nodes == ("a-1", "a-3")
    assert daemon.last_report is report
    decisions = [e for e in logs if e["event"] == "decision"]
    assert len(decisions) == 5
    assert len({e["cycle_id"] for e in logs if "cycle_id" in e}) == 1
    assert all("cycle_id" in e for e in decisions)
    assert sample(daemon, "gpu_rebalancer_cycles_total", result="success") == 1
    assert sample(daemon, "gpu_rebalancer_nodes_freeable", gpu_model=A100) == 2
    assert sample(daemon, "gpu_rebalancer_estimated_savings_per_hour") == 40.0


def test_a_failing_source_is_an_error_cycle_and_the_next_one_runs(daemons: list[Daemon]) -> None:
    calls: list[int] = []

    def flaky(now: datetime, loaded: object) -> Snapshot:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("apiserver down")
        return cluster(now)

    daemon = Daemon(
        parse_policy(POLICY), flaky, sinks=DaemonSinks(notifiers=no_notifiers), clock=Clock(wall=lambda: NOW)
    )
    daemons.append(daemon)
    assert daemon.run_cycle() is None
    assert daemon.run_cycle() is not None
    assert daemon.counts["error"] == 1 and daemon.counts["success"] == 1
    assert sample(daemon, "gpu_rebalancer_cycles_total", result="error") == 1
    assert sample(daemon, "gpu_rebalancer_cycle_duration_seconds_count") == 2


def test_live_cycles_remember_disruptions_for_the_cooldown(daemons: list[Daemon]) -> None:
    evictor = RecordingEvictor()
    loaded = parse_policy({**POLICY, "dry_run": False})
    daemon = Daemon(
        loaded,
        source,
        live=LiveEdge(evictor),
        sinks=DaemonSinks(notifiers=no_notifiers),
        clock=Clock(wall=lambda: NOW),
    )
    daemons.append(daemon)
    first = daemon.run_cycle()
    assert first is not None and first.mode == "live" and first.summary.evictions == 5
    second = daemon.run_cycle()  # the same (stale) cluster again: those workloads are cooling down
    assert second is not None and second.summary.evictions == 0
    assert {d.blocked_by for d in second.decisions} == {"cooldown"}


def test_live_cycles_count_disruptions_against_the_workload_budget(daemons: list[Daemon]) -> None:
    guards = {"cooldown": 0, "max_disruptions_per_workload": 2, "disruption_window": "1h"}
    loaded = parse_policy({**POLICY, "dry_run": False, "guards": guards})
    now = [NOW]
    daemon = Daemon(
        loaded,
        source,
        live=LiveEdge(RecordingEvictor()),
        sinks=DaemonSinks(notifiers=no_notifiers),
        clock=Clock(wall=lambda: now[0]),
    )
    daemons.append(daemon)
    evictions = []
    for minutes in (0, 10, 20, 61, 65):  # the same (stale) cluster each time, no cooldown
        now[0] = NOW + timedelta(minutes=minutes)
        report = daemon.run_cycle()
        assert report is not None and report.mode == "live"
        evictions.append(report.summary.evictions)
        if report.summary.evictions == 0:
            assert {d.blocked_by for d in report.decisions} == {"disruption-budget"}
    # Two disruptions per workload per hour: at 20 minutes both (0, 10) count; at 61 the one at 0 has
    # left the window; at 65 those at 10 and 61 both count again.
    assert evictions == [5, 5, 0, 5, 0]


def test_live_without_an_evictor_fails_the_cycle(daemons: list[Daemon]) -> None:
    daemon = Daemon(
        parse_policy(POLICY),
        source,
        dry_run=False,
        sinks=DaemonSinks(notifiers=no_notifiers),
        clock=Clock(wall=lambda: NOW),
    )
    daemons.append(daemon)
    assert daemon.run_cycle() is None
    assert daemon.counts["error"] == 1


class FramedEvictor(RecordingEvictor):
    """A live evictor whose cycle frame records its calls and has a finding of its own."""

    def __init__(self, calls: list[tuple[str, object]], during: Callable[[Decision], None]) -> None:
        super().__init__(during=during)
        self.calls = calls

    def begin_cycle(self, snapshot: Snapshot, cycle_id: str) -> None:
        self.calls.append(("begin", cycle_id))

    def end_cycle(self, decisions: Sequence[Decision], *, completed: bool) -> tuple[Finding, ...]:
        self.calls.append(("end", completed))
        return (Finding("drain-timeout", node="a-9", detail="drain mark removed"),)


def test_the_live_evictors_frame_frames_every_live_cycle_and_adds_its_findings(daemons: list[Daemon]) -> None:
    calls: list[tuple[str, object]] = []
    fail = [False]

    def during(_decision: Decision) -> None:
        if fail[0]:
            raise RuntimeError("apiserver vanished")

    daemon = Daemon(
        parse_policy({**POLICY, "guards": {"cooldown": 0}}),
        source,
        live=LiveEdge(FramedEvictor(calls, during)),
        sinks=DaemonSinks(notifiers=no_notifiers),
        clock=Clock(wall=lambda: NOW),
    )
    daemons.append(daemon)
    assert daemon.run_cycle() is not None  # the policy says dry-run: the live evictor is not used
    assert calls == []

    daemon._dry_run = False
    report = daemon.run_cycle()
    assert report is not None and report.findings[-1].kind == "drain-timeout"
    assert [c[0] for c in calls] == ["begin", "end"] and calls[1] == ("end", True)
    assert str(calls[0][1]).startswith("20261129T120000Z-")

    fail[0] = True
    calls.clear()
    assert daemon.run_cycle() is None
    assert calls[1] == ("end", False)  # the evictor learns the cycle did not complete


# --------------------------------------------------------------------------- the stop flag


def test_stop_lets_the_decision_in_flight_finish_and_attempts_no_other(daemons: list[Daemon]) -> None:
    holder: list[Daemon] = []
    evictor = RecordingEvictor(during=lambda _d: holder[0].request_stop())
    daemon = Daemon(
        parse_policy(POLICY),
        source,
        dry_run=False,
        live=LiveEdge(evictor),
        sinks=DaemonSinks(notifiers=no_notifiers),
        clock=Clock(wall=lambda: NOW),
    )
    holder.append(daemon)
    daemons.append(daemon)
    report = daemon.run_cycle()
    assert report is not None
    [handed] = evictor.decisions  # the whole node plan of a-1, never half of it
    assert {p.name for p in handed.proposal.pods} == {"a1-x", "a1-y"}
    outcomes = {d.pod: (d.outcome, d.reason) for d in report.decisions}
    assert outcomes["a1-x"][0] == outcomes["a1-y"][0] == "evicted"
    assert {outcomes[f"a3-{i}"][0] for i in range(3)} == {"error"}
    assert "not attempted: shutting down" in outcomes["a3-0"][1]
    assert report.freed_nodes == ("a-1",)
    assert daemon.run_cycle() is None  # stopping: no new cycle


def test_gated_evictor_checks_only_between_decisions() -> None:
    calls: list[str] = []
    answers = iter([None, "leadership lost", None])

    def gate() -> str | None:
        calls.append("gate")
        return next(answers)

    loaded = parse_policy(POLICY)
    from rebalancer.cycle import evaluate

    decisions = [d for d in evaluate(cluster(), loaded).decisions if d.approved]
    gated = GatedEvictor(DryRunEvictor(), gate)
    first = gated.evict(decisions[0])
    second = gated.evict(decisions[1])
    assert [o.result for o in first] == ["would-evict", "would-evict"]
    assert {(o.result, o.detail) for o in second} == {("error", "not attempted: leadership lost")}
    assert gated.evict(decisions[0])[0].result == "error"  # stopped for the rest of the cycle
    assert calls == ["gate", "gate"]
    assert gated.mode == "dry-run"


# --------------------------------------------------------------------------- hot reload


def test_valid_policy_change_is_used_from_the_next_cycle(tmp_path: Path, daemons: list[Daemon]) -> None:
    path = write_policy(tmp_path / "policy.yaml")
    evictor = RecordingEvictor()
    daemon = Daemon(
        PolicyWatcher(path),
        source,
        live=LiveEdge(evictor),
        sinks=DaemonSinks(notifiers=no_notifiers),
        clock=Clock(wall=lambda: NOW),
    )
    daemons.append(daemon)
    first = daemon.run_cycle()
    assert first is not None and first.mode == "dry-run"

    write_policy(path, dry_run=False, limits={"max_per_cycle": 1})
    second = daemon.run_cycle()
    assert second is not None and second.mode == "live"
    assert second.summary.evictions == 0  # a node drain does not fit a budget of 1
    assert sample(daemon, "gpu_rebalancer_policy_valid") == 1
    assert sample(daemon, "gpu_rebalancer_policy_reload_errors_total") == 0


def test_invalid_policy_change_keeps_the_running_policy(tmp_path: Path, daemons: list[Daemon]) -> None:
    path = write_policy(tmp_path / "policy.yaml")
    daemon = Daemon(
        PolicyWatcher(path), source, sinks=DaemonSinks(notifiers=no_notifiers), clock=Clock(wall=lambda: NOW)
    )
    daemons.append(daemon)
    assert daemon.run_cycle() is not None

    path.write_text(json.dumps({**POLICY, "interval": "1s", "limits": {"max_per_cycle": 0}, "bogus": 1}))
    with structlog.testing.capture_logs() as logs:
        report = daemon.run_cycle()
        daemon.run_cycle()  # the same bad content is not reported twice
    assert report is not None and report.summary.evictions == 5  # the old policy still runs
    [rejected] = [e for e in logs if e["event"].startswith("policy change rejected")]
    problems = "\n".join(rejected["problems"])
    assert "interval: interval must be at least 10s" in problems
    assert "limits.max_per_cycle" in problems
    assert "bogus: unknown field" in problems
    assert sample(daemon, "gpu_rebalancer_policy_valid") == 0
    assert sample(daemon, "gpu_rebalancer_policy_reload_errors_total") == 1
    assert daemon.policy.policy.interval == 300

    write_policy(path)  # back to the running content
    daemon.run_cycle()
    assert sample(daemon, "gpu_rebalancer_policy_valid") == 1


def test_an_unreadable_policy_file_keeps_the_running_policy_and_says_so_in_the_metrics(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    """A removed file (a renamed ConfigMap key) is alerted on as an invalid one: counted once per time it
    goes missing, the policy not valid while it stays so."""
    path = write_policy(tmp_path / "policy.yaml")
    daemon = Daemon(
        PolicyWatcher(path), source, sinks=DaemonSinks(notifiers=no_notifiers), clock=Clock(wall=lambda: NOW)
    )
    daemons.append(daemon)
    assert daemon.run_cycle() is not None

    path.unlink()
    with structlog.testing.capture_logs() as logs:
        report = daemon.run_cycle()
        daemon.run_cycle()
    assert report is not None and report.summary.evictions == 5  # the running policy still runs
    assert [e for e in logs if e["event"].startswith("policy file unreadable")]
    assert sample(daemon, "gpu_rebalancer_policy_valid") == 0
    assert sample(daemon, "gpu_rebalancer_policy_reload_errors_total") == 1
    assert daemon.policy.policy.interval == 300

    write_policy(path)  # back, with the running content
    daemon.run_cycle()
    assert sample(daemon, "gpu_rebalancer_policy_valid") == 1
    assert sample(daemon, "gpu_rebalancer_policy_reload_errors_total") == 1

    path.unlink()  # gone again: a new error
    daemon.run_cycle()
    assert sample(daemon, "gpu_rebalancer_policy_valid") == 0
    assert sample(daemon, "gpu_rebalancer_policy_reload_errors_total") == 2


def test_configmap_symlink_swap_is_noticed(tmp_path: Path) -> None:
    """kubelet's atomic update: policy.yaml -> ..data/policy.yaml, ..data -> ..<timestamp> swapped."""
    mount = tmp_path / "mount"
    mount.mkdir()
    for version, interval in (("..v1", "5m"), ("..v2", "10m")):
        (mount / version).mkdir()
        write_policy(mount / version / "policy.yaml", interval=interval)
    os.symlink("..v1", mount / "..data")
    os.symlink("..data/policy.yaml", mount / "policy.yaml")
    watcher = PolicyWatcher(mount / "policy.yaml")
    assert watcher.check().status == "unchanged"
    os.symlink("..v2", mount / "..data_tmp")
    os.replace(mount / "..data_tmp", mount / "..data")
    result = watcher.check()
    assert result.status == "reloaded" and result.previous_interval == 300
    assert watcher.current.policy.interval == 600


def test_an_invalid_policy_at_start_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("interval: soon\n")
    with pytest.raises(PolicyError, match="interval"):
        PolicyWatcher(path)


# --------------------------------------------------------------------------- notifications


def test_a_hung_notification_receiver_does_not_delay_the_next_cycle(
    http_receiver: HttpReceiver, daemons: list[Daemon]
) -> None:
    http_receiver.hang()
    env = {"HOOK_SECRET": "k"}

    def notifiers(notify: NotifyConfig, on_result: Callable[[str, str], None]) -> list[Notifier]:
        return build_notifiers(
            notify,
            on_result=on_result,
            environ=env,
            poster_factory=lambda: HttpPoster(timeout=(1.0, 20.0), retries=0),
        )

    loaded = parse_policy(
        {**POLICY, "notify": {"webhooks": [{"url": http_receiver.url, "secret_env": "HOOK_SECRET"}]}}
    )
    daemon = Daemon(loaded, source, sinks=DaemonSinks(notifiers=notifiers), clock=Clock(wall=lambda: NOW))
    daemons.append(daemon)
    durations = []
    for _ in range(3):
        started = time.monotonic()
        assert daemon.run_cycle() is not None
        durations.append(time.monotonic() - started)
    http_receiver.wait_for(1)  # the first delivery is stuck in the receiver
    assert max(durations) < 1.0
    http_receiver.release()
    http_receiver.wait_for(3)


def test_each_one_cycle_daemon_sends_its_dry_run_digest_when_it_shuts_down(
    http_receiver: HttpReceiver,
) -> None:
    """`rebalancer once` runs one cycle a process (the CronJob): a `digest:` sink sends that report, with
    its one cycle, at the end, instead of keeping it for a period no process lives to see."""
    loaded = parse_policy({**POLICY, "notify": {"webhooks": [{"url": http_receiver.url, "digest": "daily"}]}})
    results: list[str] = []

    def notifiers(notify: NotifyConfig, _on_result: Callable[[str, str], None]) -> list[Notifier]:
        return build_notifiers(notify, on_result=lambda _sink, result: results.append(result))

    for _ in range(3):
        daemon = Daemon(loaded, source, sinks=DaemonSinks(notifiers=notifiers), clock=Clock(wall=lambda: NOW))
        assert daemon.run_cycle() is not None
        daemon.shutdown(notify_timeout=5.0)
    assert results == ["digested", "sent"] * 3
    assert [r.json()["digest"] for r in http_receiver.requests] == [{"period": "daily", "cycles": 1}] * 3


class Outcomes:
    """What the notifiers tell the metrics: (sink name, result), in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def notifiers(self, notify: NotifyConfig, _on_result: Callable[[str, str], None]) -> list[Notifier]:
        return build_notifiers(notify, on_result=lambda sink, result: self.seen.append((sink, result)))

    def daemon(self, policy_file: Path) -> Daemon:
        """A daemon watching `policy_file` whose notifiers tell their outcomes here."""
        sinks = DaemonSinks(notifiers=self.notifiers)
        return Daemon(PolicyWatcher(policy_file), source, sinks=sinks, clock=Clock(wall=lambda: NOW))

    def since(self, start: int, count: int, timeout: float = 5.0) -> list[tuple[str, str]]:
        """The `count` outcomes from the `start`th once there, sorted (workers tell theirs in any order)."""
        deadline = time.monotonic() + timeout
        while len(self.seen) < start + count:
            assert time.monotonic() < deadline, f"expected {start + count} outcomes, saw {self.seen}"
            time.sleep(0.01)
        return sorted(self.seen[start : start + count])


def paths(receiver: HttpReceiver) -> list[str]:
    return [r.path for r in receiver.requests]


def test_a_notify_reload_keeps_the_notifier_of_every_unchanged_sink_where_it_moved(
    tmp_path: Path, http_receiver: HttpReceiver, daemons: list[Daemon]
) -> None:
    """A sink whose configuration is unchanged keeps its notifier, so its `min_interval` goes on: adding
    a sink in front of it (or any change to another) does not make it post again. It takes the name of
    its new place."""
    hourly = {"url": http_receiver.url + "/hourly", "min_interval": "1h"}
    path = write_policy(tmp_path / "policy.yaml", notify={"webhooks": [hourly]})
    outcomes = Outcomes()
    daemon = outcomes.daemon(path)
    daemons.append(daemon)
    daemon.run_cycle()
    daemon.run_cycle()
    assert outcomes.since(0, 2) == [("webhook[0]", "rate-limited"), ("webhook[0]", "sent")]

    write_policy(path, notify={"webhooks": [{"url": http_receiver.url + "/new"}, hourly]})
    daemon.run_cycle()
    assert outcomes.since(2, 2) == [("webhook[0]", "sent"), ("webhook[1]", "rate-limited")]
    assert sorted(paths(http_receiver)) == ["/hourly", "/new"]


def test_a_notify_reload_closes_only_the_sinks_it_changes_or_removes_and_they_send_their_digest(
    tmp_path: Path, http_receiver: HttpReceiver, daemons: list[Daemon]
) -> None:
    kept = {"url": http_receiver.url + "/kept", "digest": "daily"}
    changed = {"url": http_receiver.url + "/changed", "digest": "daily"}
    removed = {"url": http_receiver.url + "/removed", "digest": "daily"}
    path = write_policy(tmp_path / "policy.yaml", notify={"webhooks": [kept, changed, removed]})
    outcomes = Outcomes()
    daemon = outcomes.daemon(path)
    daemons.append(daemon)
    daemon.run_cycle()
    daemon.run_cycle()
    assert http_receiver.requests == []

    write_policy(path, notify={"webhooks": [kept, {**changed, "min_interval": "1m"}]})
    daemon.run_cycle()  # the changed and the removed sink send what they had summed up
    http_receiver.wait_for(2)
    digests = {r.path: r.json()["digest"]["cycles"] for r in http_receiver.requests}
    assert digests == {"/changed": 2, "/removed": 2}

    daemon.shutdown(notify_timeout=5.0)
    digests = {r.path: r.json()["digest"]["cycles"] for r in http_receiver.requests[2:]}
    assert digests == {"/kept": 3, "/changed": 1}  # the kept sink's digest went on through the reload


def test_a_raising_sink_never_fails_the_cycle(daemons: list[Daemon]) -> None:
    class Broken:
        def publish(self, report: object) -> None:
            raise RuntimeError("boom")

    daemon = Daemon(
        parse_policy(POLICY),
        source,
        sinks=DaemonSinks(notifiers=no_notifiers, extra=[Broken()]),
        clock=Clock(wall=lambda: NOW),
    )
    daemons.append(daemon)
    assert daemon.run_cycle() is not None
    assert daemon.counts["success"] == 1


def test_the_collector_is_paused_for_the_whole_cycle_and_runs_between_cycles(daemons: list[Daemon]) -> None:
    """A cycle at 5,000 nodes allocates millions of objects that are not garbage before it ends; full
    collections over them (and the cache's objects) cost more than the cycle's own work, report and
    sinks included (bench/README.md). The collector runs again once the cycle is over."""
    enabled: dict[str, bool] = {}

    def recording_source(now: datetime, _loaded: object) -> Snapshot:
        enabled["snapshot"] = gc.isenabled()
        return cluster(now)

    class Recording:
        def publish(self, report: object) -> None:
            enabled["sink"] = gc.isenabled()

    daemon = Daemon(
        parse_policy(POLICY),
        recording_source,
        sinks=DaemonSinks(notifiers=no_notifiers, extra=[Recording()]),
        clock=Clock(wall=lambda: NOW),
    )
    daemons.append(daemon)
    assert gc.isenabled()
    assert daemon.run_cycle() is not None
    assert enabled == {"snapshot": False, "sink": False}
    assert gc.isenabled()


# --------------------------------------------------------------------------- HTTP


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def test_http_endpoints(daemons: list[Daemon]) -> None:
    mono = FakeMonotonic()
    daemon = Daemon(
        parse_policy(POLICY),
        source,
        sinks=DaemonSinks(notifiers=no_notifiers),
        clock=Clock(wall=lambda: NOW, monotonic=mono),
    )
    daemons.append(daemon)
    server = StatusServer(daemon, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert get(f"{base}/healthz")[0] == 200
        status, _, body = get(f"{base}/readyz")
        assert (status, body.strip()) == (503, "no cycle has completed yet")
        assert get(f"{base}/report")[0] == 404

        daemon.run_cycle()
        status, _, body = get(f"{base}/readyz")
        assert (status, body.strip()) == (200, "ok")
        status, content_type, body = get(f"{base}/report")
        assert status == 200 and content_type == "application/json"
        report = json.loads(body)
        assert report["mode"] == "dry-run" and report["now"] == "2026-11-29T12:00:00Z"
        assert [d["pod"] for d in report["decisions"]] == ["a1-x", "a1-y", "a3-0", "a3-1", "a3-2"]

        status, content_type, body = get(f"{base}/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        names = {family.name for family in text_string_to_metric_families(body)}
        for name in (
            "gpu_rebalancer_evictions",
            "gpu_rebalancer_proposals",
            "gpu_rebalancer_blocked",
            "gpu_rebalancer_cycle_duration_seconds",
            "gpu_rebalancer_cycles",
            "gpu_rebalancer_last_success_timestamp_seconds",
            "gpu_rebalancer_nodes_freeable",
            "gpu_rebalancer_idle_gpus",
            "gpu_rebalancer_leaked_vram_bytes",
            "gpu_rebalancer_estimated_savings_per_hour",
            "gpu_rebalancer_build_info",
            "gpu_rebalancer_policy_reload_errors",
            "gpu_rebalancer_policy_valid",
        ):
            assert name in names, name
        labels = 'mode="dry-run",result="would-evict",strategy="gpu-consolidation"'
        assert f"gpu_rebalancer_evictions_total{{{labels}}} 5.0" in body
        assert "python_gc" not in body  # a private registry, not the process-global one

        mono.now += 3 * 300 + 1  # three intervals without a successful cycle
        status, _, body = get(f"{base}/readyz")
        assert status == 503 and "more than 3 intervals" in body
        assert get(f"{base}/nope")[0] == 404
    finally:
        server.stop()


# --------------------------------------------------------------------------- the loop (freezegun)


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    # Real time, bounded (freezegun freezes time.monotonic); generous, so a loaded CI machine is no
    # reason to fail: the predicate normally holds within milliseconds.
    for _ in range(2000):
        if predicate():
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def wait_for_cycles(daemon: Daemon, successes: int, what: str) -> None:
    """Wait until `successes` cycles succeeded and their scheduler jobs returned.

    Until the job function returns, apscheduler counts it as running and skips a tick that comes due
    (max_instances=1); moving the frozen clock before then would test that race instead.
    """
    wait_until(lambda: daemon.counts["success"] == successes and daemon.jobs_finished == successes, what)


def settle() -> None:
    threading.Event().wait(0.1)


def test_loop_runs_at_start_then_every_interval(daemons: list[Daemon]) -> None:
    with freeze_time(NOW) as frozen:
        daemon = Daemon(
            parse_policy(POLICY), source, sinks=DaemonSinks(notifiers=no_notifiers), clock=Clock(jitter=0)
        )
        daemons.append(daemon)
        daemon.start()
        wait_for_cycles(daemon, 1, "the first cycle at start")
        assert daemon.last_report is not None and daemon.last_report.now == NOW

        frozen.tick(timedelta(seconds=299))
        daemon.wakeup()
        settle()
        assert daemon.counts["success"] == 1
        frozen.tick(timedelta(seconds=1))
        daemon.wakeup()
        wait_for_cycles(daemon, 2, "the second cycle")
        assert daemon.last_report is not None and daemon.last_report.now == NOW + timedelta(minutes=5)


def test_missed_intervals_are_coalesced_into_one_cycle(daemons: list[Daemon]) -> None:
    with freeze_time(NOW) as frozen:
        daemon = Daemon(
            parse_policy(POLICY), source, sinks=DaemonSinks(notifiers=no_notifiers), clock=Clock(jitter=0)
        )
        daemons.append(daemon)
        daemon.start()
        wait_for_cycles(daemon, 1, "the first cycle")
        frozen.tick(timedelta(minutes=17))  # three runs missed (5, 10, 15 min)
        daemon.wakeup()
        wait_for_cycles(daemon, 2, "one coalesced cycle")
        settle()
        assert daemon.counts["success"] == 2
        assert daemon.scheduler is not None
        job = daemon.scheduler.get_job(JOB_ID)
        assert job.next_run_time == NOW + timedelta(minutes=20)


def test_an_overlapping_tick_is_skipped_not_queued(daemons: list[Daemon]) -> None:
    release = threading.Event()
    entered = threading.Event()
    calls: list[datetime] = []

    def slow(now: datetime, loaded: object) -> Snapshot:
        calls.append(now)
        if len(calls) == 1:
            entered.set()
            release.wait(10)
        return cluster(now)

    with freeze_time(NOW) as frozen:
        daemon = Daemon(
            parse_policy(POLICY), slow, sinks=DaemonSinks(notifiers=no_notifiers), clock=Clock(jitter=0)
        )
        daemons.append(daemon)
        daemon.start()
        wait_until(entered.is_set, "the first cycle to start")
        frozen.tick(timedelta(minutes=5))
        daemon.wakeup()
        wait_until(lambda: daemon.counts["skipped"] == 1, "the overlapping tick to be skipped")
        release.set()
        wait_for_cycles(daemon, 1, "the first cycle to finish")
        settle()
        assert len(calls) == 1  # the skipped tick did not run later
        assert sample(daemon, "gpu_rebalancer_cycles_total", result="skipped") == 1
        frozen.tick(timedelta(minutes=5))
        daemon.wakeup()
        wait_for_cycles(daemon, 2, "the next regular cycle")


def test_a_new_interval_reschedules_the_loop(tmp_path: Path, daemons: list[Daemon]) -> None:
    path = write_policy(tmp_path / "policy.yaml")
    with freeze_time(NOW) as frozen:
        daemon = Daemon(
            PolicyWatcher(path), source, sinks=DaemonSinks(notifiers=no_notifiers), clock=Clock(jitter=0)
        )
        daemons.append(daemon)
        daemon.start()
        wait_for_cycles(daemon, 1, "the first cycle")
        write_policy(path, interval="15m")
        frozen.tick(timedelta(minutes=5))
        daemon.wakeup()
        wait_for_cycles(daemon, 2, "the cycle that reads the new policy")
        assert daemon.scheduler is not None
        wait_until(
            lambda: (
                daemon.scheduler is not None
                and daemon.scheduler.get_job(JOB_ID).next_run_time == NOW + timedelta(minutes=20)
            ),
            "the job to be rescheduled 15 minutes later",
        )
        frozen.tick(timedelta(minutes=10))
        daemon.wakeup()
        settle()
        assert daemon.counts["success"] == 2
        frozen.tick(timedelta(minutes=5))
        daemon.wakeup()
        wait_for_cycles(daemon, 3, "the cycle 15 minutes later")
