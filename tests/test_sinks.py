"""Notification sinks against a real local HTTP receiver; the log sink; the metrics of one cycle."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path

import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from rebalancer.cycle_report import CycleReport, NodeFacts, ReportedDecision, Summary, WorkloadNotice
from rebalancer.finding_kinds import FINDING_KINDS
from rebalancer.model import Finding, Mode, OutcomeResult
from rebalancer.policy import SlackSinkConfig, WebhookSinkConfig
from rebalancer.report import decision_dict, summary_dict, to_dict
from rebalancer.sinks.log import LogSink
from rebalancer.sinks.metrics import DaemonMetrics, cycle_state
from rebalancer.sinks.notify import (
    Delivery,
    HttpPoster,
    Notifier,
    SinkError,
    read_secret,
    skip_reason,
)
from rebalancer.sinks.slack import SlackSink, build_message
from rebalancer.sinks.webhook import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    SIGNATURE_V1_HEADER,
    WebhookSink,
    sign,
    webhook_body,
)
from rebalancer.sources.kube_cache import RELIST_REASONS, ListStatus
from tests.builders import A100, H100, NOW, replace
from tests.http_receiver import HttpReceiver, http_receiver

__all__ = ["http_receiver"]

SECRET = "s3cret-shared"


def row(
    name: str,
    outcome: OutcomeResult | None = "would-evict",
    *,
    node_name: str = "a-1",
    strategy: str = "gpu-consolidation",
    blocked_by: str | None = None,
) -> ReportedDecision:
    return ReportedDecision(
        strategy=strategy,
        namespace="ml",
        pod=name,
        node=node_name,
        action="skip" if blocked_by else "evict",
        outcome=outcome,
        reason="node a-1 is 12% allocated",
        blocked_by=blocked_by,
        group=None,
        target_node="a-2" if not blocked_by else None,
    )


def make_report(
    mode: Mode = "dry-run",
    *,
    decisions: Sequence[ReportedDecision] = (),
    findings: Sequence[Finding] = (),
    freed: Sequence[str] = (),
    savings: float | None = None,
    nodes: Mapping[str, NodeFacts] | None = None,
    proposals: Mapping[str, int] | None = None,
) -> CycleReport:
    done = sum(1 for d in decisions if d.outcome in ("would-evict", "evicted"))
    return CycleReport(
        mode=mode,
        now=NOW,
        summary=Summary(
            nodes=3,
            gpus=24,
            pods=6,
            proposals=1 if decisions else 0,
            evictions=done,
            blocked=sum(1 for d in decisions if d.action == "skip"),
            nodes_freed=len(freed),
            gpus_freed=8 * len(freed),
            estimated_savings_per_hour=savings,
        ),
        decisions=tuple(decisions),
        findings=tuple(findings),
        freed_nodes=tuple(freed),
        nodes=dict(nodes or {}),
        proposals_by_strategy=dict(proposals or {}),
    )


EVICTING = make_report(
    "live",
    decisions=[row("train-0", "evicted"), row("train-1", "evicted")],
    freed=["a-1"],
    savings=20.0,
    findings=[
        Finding("leaked-vram", node="a-3", gpu="GPU-9", detail="20480 MiB framebuffer used with no pod"),
        Finding("idle-gpu", node="a-2", gpu="GPU-2", namespace="ml", pod="nb-1", detail="GPU idle: avg 0.1%"),
    ],
)
QUIET = make_report()
LEAK_ONLY = make_report(findings=[Finding("leaked-vram", node="a-3", gpu="GPU-9", detail="leaked")])


def fast_poster(retries: int = 3, read_timeout: float = 2.0) -> HttpPoster:
    return HttpPoster(timeout=(1.0, read_timeout), retries=retries, backoff=0.01, backoff_max=0.02)


class Results:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, sink: str, result: str) -> None:
        self.seen.append((sink, result))

    def count(self, result: str) -> int:
        return sum(1 for _, r in self.seen if r == result)

    def wait(self, result: str, count: int = 1, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self.count(result) < count:
            assert time.monotonic() < deadline, f"expected {count} {result!r}, saw {self.seen}"
            time.sleep(0.01)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def results() -> Results:
    return Results()


@pytest.fixture
def notifiers() -> Iterator[list[Notifier]]:
    made: list[Notifier] = []
    yield made
    for notifier in made:
        notifier.close(0.5)


def slack(receiver: HttpReceiver, **config: object) -> SlackSink:
    cfg = SlackSinkConfig.model_validate({"webhook_url_env": "SLACK_URL", **config})
    return SlackSink(cfg, poster=fast_poster(), environ={"SLACK_URL": receiver.url + "/services/T0/B0/XYZ"})


def webhook(receiver: HttpReceiver, retries: int = 3, **config: object) -> WebhookSink:
    cfg = WebhookSinkConfig.model_validate(
        {"url": receiver.url + "/hook", "secret_env": "HOOK_SECRET", **config}
    )
    return WebhookSink(cfg, poster=fast_poster(retries), environ={"HOOK_SECRET": SECRET})


# --------------------------------------------------------------------------- Slack


def test_slack_message_has_summary_evictions_nodes_savings_findings_and_dashboard(
    http_receiver: HttpReceiver, results: Results, notifiers: list[Notifier]
) -> None:
    sink = slack(http_receiver, dashboard_url="https://grafana.example/d/gpu")
    notifiers.append(Notifier(sink, on_result=results))
    notifiers[0].publish(EVICTING)

    [request] = http_receiver.wait_for(1)
    assert request.path == "/services/T0/B0/XYZ"
    assert (request.header("Content-Type") or "").startswith("application/json")
    message = request.json()
    blocks = message["blocks"]
    assert blocks[0]["type"] == "header"
    assert blocks[0]["text"]["text"] == "gpu-rebalancer evicted 2 pods, freed 1 node"
    fields = {f["text"].split("\n")[0]: f["text"].split("\n")[1] for f in blocks[1]["fields"]}
    assert fields["*Mode*"] == "live"
    assert fields["*Evictions*"] == "2"
    assert fields["*Nodes freed*"] == "1"
    assert fields["*GPUs freed*"] == "8"
    assert fields["*Est. savings*"] == "$20.00/h"
    texts = [b["text"]["text"] for b in blocks if b["type"] == "section" and "text" in b]
    evicted = next(t for t in texts if t.startswith("*Evicted*"))
    assert "`ml/train-0` on a-1 → a-2 (gpu-consolidation: evicted)" in evicted
    assert any(t.startswith("*Nodes freed*\n• a-1") for t in texts)
    findings = next(t for t in texts if t.startswith("*Top findings*"))
    assert "idle-gpu: 1, leaked-vram: 1" in findings
    assert "*leaked-vram* a-3 GPU-9: 20480 MiB framebuffer used with no pod" in findings
    [actions] = [b for b in blocks if b["type"] == "actions"]
    assert actions["elements"][0]["url"] == "https://grafana.example/d/gpu"
    assert message["text"].startswith("gpu-rebalancer evicted 2 pods")
    results.wait("sent")


def test_slack_message_respects_block_kit_limits_and_escapes_mrkdwn() -> None:
    rows = [row(f"p<{i}>&x") for i in range(40)]
    findings = [Finding("idle-gpu", node="n", gpu=f"GPU-{i}", detail="x" * 2000) for i in range(20)]
    message = build_message(make_report(decisions=rows, findings=findings), finding_kinds=None)
    header = message["blocks"][0]["text"]["text"]
    assert header.endswith("(dry-run)") and len(header) <= 150
    for block in message["blocks"]:
        if block["type"] == "section" and "text" in block:
            assert len(block["text"]["text"]) <= 3000
        assert len(block.get("fields", [])) <= 10
    evictions = message["blocks"][2]["text"]["text"]
    assert evictions.startswith("*Would evict*")
    assert "`ml/p&lt;0&gt;&amp;x`" in evictions
    assert "…and 30 more" in evictions


def test_slack_url_from_a_file_is_read_at_every_delivery(
    http_receiver: HttpReceiver, tmp_path: Path, results: Results, notifiers: list[Notifier]
) -> None:
    url_file = tmp_path / "slack-url"
    url_file.write_text(http_receiver.url + "/first\n")
    cfg = SlackSinkConfig(webhook_url_file=str(url_file))
    notifiers.append(Notifier(SlackSink(cfg, poster=fast_poster()), on_result=results))
    notifiers[0].publish(EVICTING)
    http_receiver.wait_for(1)
    url_file.write_text(http_receiver.url + "/rotated\n")
    notifiers[0].publish(EVICTING)
    assert [r.path for r in http_receiver.wait_for(2)] == ["/first", "/rotated"]


def test_errors_never_carry_the_secret_webhook_url(results: Results, notifiers: list[Notifier]) -> None:
    secret_url = "http://127.0.0.1:9/services/T0/B0/TOPSECRET"  # port 9: nothing listens
    cfg = SlackSinkConfig(webhook_url_env="SLACK_URL")
    sink = SlackSink(cfg, poster=fast_poster(retries=1), environ={"SLACK_URL": secret_url})
    with pytest.raises(SinkError) as raised:
        sink.send(Delivery(EVICTING))
    assert "TOPSECRET" not in str(raised.value)
    assert str(raised.value) == "slack: connection failed"
    with structlog.testing.capture_logs() as logs:
        notifiers.append(Notifier(sink, on_result=results))
        notifiers[0].publish(EVICTING)
        results.wait("failed")
    assert not any("TOPSECRET" in json.dumps(entry, default=str) for entry in logs)


def test_a_missing_secret_env_var_stops_the_delivery(http_receiver: HttpReceiver) -> None:
    cfg = SlackSinkConfig(webhook_url_env="NOT_SET")
    with pytest.raises(SinkError, match="env var NOT_SET is not set"):
        SlackSink(cfg, poster=fast_poster(), environ={}).send(Delivery(EVICTING))
    assert http_receiver.requests == []


# --------------------------------------------------------------------------- webhooks


def test_webhook_posts_the_json_report_signed_with_hmac_sha256(
    http_receiver: HttpReceiver, results: Results, notifiers: list[Notifier]
) -> None:
    notifiers.append(Notifier(webhook(http_receiver), on_result=results))
    notifiers[0].publish(EVICTING)

    [request] = http_receiver.wait_for(1)
    assert request.method == "POST" and request.path == "/hook"
    body = request.json()
    assert body.pop("delivery_id") == request.header(DELIVERY_HEADER)
    assert body == to_dict(EVICTING)
    expected = "sha256=" + hmac.new(SECRET.encode(), request.body, hashlib.sha256).hexdigest()
    signature = request.header(SIGNATURE_HEADER)
    assert signature is not None and hmac.compare_digest(expected, signature)
    results.wait("sent")


def test_webhook_secret_from_a_file_and_a_tampered_body_fails_verification(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    assert read_secret("x", env=None, file=str(secret_file)) == SECRET
    body = webhook_body(Delivery(EVICTING), "delivery-1")
    assert hmac.compare_digest(sign(SECRET, body), sign(SECRET, body))
    assert not hmac.compare_digest(sign(SECRET, body), sign(SECRET, body + b" "))
    assert not hmac.compare_digest(sign(SECRET, body), sign("other", body))


def test_webhook_without_a_secret_is_sent_unsigned(http_receiver: HttpReceiver) -> None:
    cfg = WebhookSinkConfig(url=http_receiver.url + "/hook")
    sink = WebhookSink(cfg, poster=fast_poster())
    assert not sink.signed
    sink.send(Delivery(EVICTING))
    [request] = http_receiver.wait_for(1)
    assert request.header(SIGNATURE_HEADER) is None and request.header(SIGNATURE_V1_HEADER) is None


def test_retries_on_500_then_delivers(
    http_receiver: HttpReceiver, results: Results, notifiers: list[Notifier]
) -> None:
    http_receiver.script([500, 503, 200])
    notifiers.append(Notifier(webhook(http_receiver), on_result=results))
    notifiers[0].publish(EVICTING)
    results.wait("sent")
    requests = http_receiver.requests
    assert len(requests) == 3
    assert len({r.body for r in requests}) == 1  # the same signed body every time


def test_retries_are_bounded_and_4xx_is_not_retried(http_receiver: HttpReceiver) -> None:
    http_receiver.script([500] * 10)
    with pytest.raises(SinkError, match=r"webhook: HTTP 500"):
        webhook(http_receiver, retries=2).send(Delivery(EVICTING))
    assert len(http_receiver.requests) == 3

    http_receiver.requests.clear()
    http_receiver.script([400])
    with pytest.raises(SinkError, match=r"webhook: HTTP 400"):
        webhook(http_receiver).send(Delivery(EVICTING))
    assert len(http_receiver.requests) == 1


def test_a_429_is_retried_once_its_retry_after_has_passed(http_receiver: HttpReceiver) -> None:
    """Slack answers its rate limit with 429 and Retry-After (seconds): asking sooner gets more 429s."""
    http_receiver.script([(429, {"Retry-After": "1"}), 200])
    webhook(http_receiver).send(Delivery(EVICTING))
    first, second = http_receiver.requests
    assert second.at - first.at >= 0.9  # not the 0.01 s backoff


def test_a_retry_after_longer_than_the_bound_fails_the_delivery_at_once(http_receiver: HttpReceiver) -> None:
    """A delivery waits at most `retry_after_max` for a Retry-After: never asks sooner than told, and never
    keeps its worker (which a shutdown waits for) asleep for longer."""
    http_receiver.script([(429, {"Retry-After": "3600"})] * 4)
    sink = WebhookSink(
        WebhookSinkConfig.model_validate({"url": http_receiver.url + "/hook"}),
        poster=HttpPoster(timeout=(1.0, 2.0), retries=3, backoff=0.01, retry_after_max=2.0),
    )
    started = time.monotonic()
    with pytest.raises(SinkError, match=r"^webhook: HTTP 429 Too Many Requests \(Retry-After 3600 s\)$"):
        sink.send(Delivery(EVICTING))
    assert time.monotonic() - started < 1.0
    assert len(http_receiver.requests) == 1


def test_an_unreadable_retry_after_falls_back_to_the_backoff(http_receiver: HttpReceiver) -> None:
    http_receiver.script([(503, {"Retry-After": "soon"}), 200])
    webhook(http_receiver).send(Delivery(EVICTING))
    assert len(http_receiver.requests) == 2


def test_rate_limit_drops_reports_within_min_interval(
    http_receiver: HttpReceiver, results: Results, notifiers: list[Notifier]
) -> None:
    clock = FakeClock()
    notifier = Notifier(webhook(http_receiver, min_interval="1m"), clock=clock, on_result=results)
    notifiers.append(notifier)
    notifier.publish(EVICTING)
    clock.now += 30
    notifier.publish(EVICTING)
    clock.now += 31
    notifier.publish(EVICTING)
    results.wait("sent", 2)
    assert results.count("rate-limited") == 1
    assert len(http_receiver.requests) == 2


@pytest.mark.parametrize(
    ("config", "report", "reason"),
    [
        ({}, QUIET, "nothing to report"),
        ({"include_dry_run": False}, LEAK_ONLY, "dry-run report"),
        ({"only_when_evicted": True}, LEAK_ONLY, "nothing evicted"),
        ({"finding_kinds": ["idle-gpu"]}, LEAK_ONLY, "nothing to report"),
        ({"finding_kinds": ["leaked-vram"]}, LEAK_ONLY, None),
        ({"only_when_evicted": True}, EVICTING, None),
        ({"finding_kinds": []}, EVICTING, None),
    ],
)
def test_filters(config: dict[str, object], report: CycleReport, reason: str | None) -> None:
    cfg = WebhookSinkConfig.model_validate({"url": "http://x", **config})
    got = skip_reason(
        report,
        include_dry_run=cfg.include_dry_run,
        only_when_evicted=cfg.only_when_evicted,
        finding_kinds=cfg.finding_kinds,
    )
    assert got == reason


def test_finding_kinds_also_select_what_slack_shows() -> None:
    message = build_message(EVICTING, finding_kinds=("idle-gpu",))
    text = json.dumps(message)
    assert "idle-gpu" in text and "leaked-vram" not in text


def test_filtered_reports_are_not_sent(
    http_receiver: HttpReceiver, results: Results, notifiers: list[Notifier]
) -> None:
    notifier = Notifier(webhook(http_receiver, include_dry_run=False), on_result=results)
    notifiers.append(notifier)
    notifier.publish(LEAK_ONLY)
    notifier.publish(QUIET)
    notifier.publish(EVICTING)
    results.wait("sent")
    assert results.count("filtered") == 2
    assert [r.json()["mode"] for r in http_receiver.requests] == ["live"]


def test_a_hung_receiver_never_blocks_publish_and_a_full_queue_drops(
    http_receiver: HttpReceiver, results: Results, notifiers: list[Notifier]
) -> None:
    http_receiver.hang()
    notifier = Notifier(webhook(http_receiver), queue_size=2, on_result=results)
    notifiers.append(notifier)
    started = time.monotonic()
    for _ in range(6):
        notifier.publish(EVICTING)
    assert time.monotonic() - started < 0.2
    http_receiver.wait_for(1)  # the worker is stuck in the first delivery
    dropped = results.count("dropped")
    assert 3 <= dropped <= 4  # two wait in the queue, maybe one more was taken by the worker
    http_receiver.release()
    results.wait("sent", 6 - dropped)


def test_dry_run_digest_sends_the_latest_report_once_per_period(
    http_receiver: HttpReceiver, results: Results, notifiers: list[Notifier]
) -> None:
    clock = FakeClock()
    notifier = Notifier(webhook(http_receiver, digest="hourly"), clock=clock, on_result=results)
    notifiers.append(notifier)
    for _ in range(4):
        notifier.publish(LEAK_ONLY)
        clock.now += 15 * 60
    notifier.publish(QUIET)  # the hour is over: this latest report goes out as the digest
    results.wait("sent")
    [request] = http_receiver.requests
    body = request.json()
    assert body["digest"] == {"period": "hourly", "cycles": 5}
    assert body["findings"] == []
    assert results.count("digested") == 4
    # Live reports are not part of the digest.
    notifier.publish(EVICTING)
    results.wait("sent", 2)


def test_close_sends_the_pending_digest_the_latest_report_with_its_cycles(
    http_receiver: HttpReceiver, results: Results
) -> None:
    """A daemon's shutdown, a notify reload and the end of `rebalancer once` close the notifier: the
    cycles summed since the last digest are sent then, not lost with the process."""
    clock = FakeClock()
    notifier = Notifier(webhook(http_receiver, digest="daily"), clock=clock, on_result=results)
    for _ in range(3):
        notifier.publish(LEAK_ONLY)
        clock.now += 5 * 60
    notifier.publish(QUIET)
    assert results.count("digested") == 4 and http_receiver.requests == []
    notifier.close(5.0)
    [request] = http_receiver.requests
    body = request.json()
    assert body["digest"] == {"period": "daily", "cycles": 4}
    assert body["findings"] == []  # the latest report
    assert results.count("sent") == 1
    notifier.close(0.5)  # nothing pending any more
    assert len(http_receiver.requests) == 1


def test_close_sends_no_digest_when_none_is_pending(http_receiver: HttpReceiver, results: Results) -> None:
    clock = FakeClock()
    notifier = Notifier(webhook(http_receiver, digest="hourly"), clock=clock, on_result=results)
    notifier.publish(LEAK_ONLY)
    clock.now += 3600
    notifier.publish(LEAK_ONLY)  # the period is over: sent now, nothing left pending
    results.wait("sent")
    notifier.close(1.0)
    assert len(http_receiver.requests) == 1


def test_digest_headline_in_slack() -> None:
    message = build_message(LEAK_ONLY, delivery=Delivery(LEAK_ONLY, digest_cycles=288, digest_period="daily"))
    assert message["blocks"][0]["text"]["text"].startswith("daily dry-run digest (288 cycles)")


# --------------------------------------------------------------------------- log sink


def test_log_sink_writes_one_line_per_decision_and_a_summary() -> None:
    report = make_report(
        decisions=[row("a"), row("b"), row("c", None, blocked_by="pdb")], findings=LEAK_ONLY.findings
    )
    with structlog.testing.capture_logs() as logs:
        LogSink().publish(report)
    decisions = [e for e in logs if e["event"] == "decision"]
    assert [(d["pod"], d["action"], d["outcome"], d["blocked_by"]) for d in decisions] == [
        ("a", "evict", "would-evict", None),
        ("b", "evict", "would-evict", None),
        ("c", "skip", None, "pdb"),
    ]
    [summary] = [e for e in logs if e["event"] == "cycle report"]
    assert summary["evictions"] == 2 and summary["blocked"] == 1
    assert summary["findings"] == {"leaked-vram": 1}


def test_log_sink_lines_carry_the_json_reports_fields_without_drawing_its_gpu_map() -> None:
    """The decision lines and the summary are the JSON report's own fields; the GPU map (40,000 cells at
    5,000 nodes) is for `/report` and `--output json`, not rendered for every cycle's log lines."""

    class Untouchable(tuple):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            raise AssertionError("the log sink drew the GPU map")

    report = replace(make_report(decisions=[row("a")]), gpu_nodes=Untouchable())
    with structlog.testing.capture_logs() as logs:
        LogSink().publish(report)
    [decision] = [e for e in logs if e["event"] == "decision"]
    [summary] = [e for e in logs if e["event"] == "cycle report"]
    assert {k: decision[k] for k in decision_dict(report.decisions[0])} == decision_dict(report.decisions[0])
    assert {k: summary[k] for k in summary_dict(report.summary)} == summary_dict(report.summary)


# --------------------------------------------------------------------------- metrics


def _samples(metrics: DaemonMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, _ = metrics.exposition()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_cycle_state_counts_distinct_idle_gpus_by_model_and_leaked_bytes_by_node() -> None:
    findings = [
        Finding("idle-gpu", node="h-1", gpu="GPU-H1", namespace="ml", pod="nb"),
        Finding("idle-gpu", node="h-1", gpu="GPU-H1", namespace="ml", pod="nb"),  # same GPU again
        Finding("idle-gpu", node="a-1", gpu="GPU-A1", namespace="ml", pod="x"),
        Finding("leaked-vram", node="a-3", gpu="GPU-9", fb_used_mib=20480.0),
    ]
    facts = {name: NodeFacts(model, 8) for name, model in (("a-1", A100), ("h-1", H100), ("a-3", A100))}
    state = cycle_state(make_report(findings=findings, freed=["a-1", "h-1"], savings=3.5, nodes=facts))
    assert state.idle_gpus == {H100: 1, A100: 1}
    assert state.nodes_freeable == {A100: 1, H100: 1}
    assert state.gpus_freeable == {A100: 8, H100: 8}
    assert state.circuit_open is False
    assert state.leaked_vram_bytes == {"a-3": 20480.0 * 1024 * 1024}
    assert state.estimated_savings_per_hour == 3.5


def test_rightsizing_savings_are_summed_by_namespace_and_replaced_each_cycle() -> None:
    metrics = DaemonMetrics()
    findings = [
        Finding("gpu-rightsizing", namespace="ml", workload="ml/ReplicaSet/a", saving_per_hour=3.95),
        Finding("gpu-rightsizing", namespace="ml", workload="ml/Job/b", saving_per_hour=4.37),
        Finding("gpu-rightsizing", namespace="serve", workload="serve/ReplicaSet/c", saving_per_hour=1.5),
        Finding("idle-gpu", namespace="serve", workload="serve/ReplicaSet/c", gpus=1.0),
    ]
    metrics.publish(make_report(findings=findings))
    samples = _samples(metrics)
    gauge = "gpu_rebalancer_rightsizing_savings_per_hour"
    assert samples[(gauge, (("namespace", "ml"),))] == pytest.approx(3.95 + 4.37)
    assert samples[(gauge, (("namespace", "serve"),))] == 1.5
    metrics.publish(make_report(findings=findings[2:]))
    samples = _samples(metrics)
    assert (gauge, (("namespace", "ml"),)) not in samples
    assert samples[(gauge, (("namespace", "serve"),))] == 1.5


def test_circuit_open_follows_the_circuit_finding() -> None:
    metrics = DaemonMetrics()
    opened = make_report(findings=[Finding("circuit-open", namespace="ml", detail="ml/train still Pending")])
    metrics.publish(opened)
    assert _samples(metrics)[("gpu_rebalancer_circuit_open", ())] == 1
    metrics.publish(make_report())
    assert _samples(metrics)[("gpu_rebalancer_circuit_open", ())] == 0


def test_findings_of_the_last_cycle_are_counted_by_kind_every_kind_said() -> None:
    """What alerts read the rebalancer's own view from (a telemetry-unavailable finding: it could not
    read GPU telemetry, whatever the exporter's metric names), replaced whole every cycle."""
    metrics = DaemonMetrics()
    gauge = "gpu_rebalancer_findings"
    unavailable = Finding("telemetry-unavailable", detail="Prometheus at http://prom:9090: timed out")
    leaked = Finding("leaked-vram", node="a-3", gpu="GPU-9", fb_used_mib=1024.0)
    metrics.publish(make_report(findings=[unavailable, leaked, replace(leaked, gpu="GPU-8")]))
    samples = {dict(labels)["kind"]: v for (name, labels), v in _samples(metrics).items() if name == gauge}
    assert samples == dict.fromkeys(FINDING_KINDS, 0) | {"telemetry-unavailable": 1, "leaked-vram": 2}
    metrics.publish(make_report())
    samples = {dict(labels)["kind"]: v for (name, labels), v in _samples(metrics).items() if name == gauge}
    assert samples == dict.fromkeys(FINDING_KINDS, 0)
    assert not any(name == gauge for name, _ in _samples(DaemonMetrics()))  # no cycle, no findings


def test_a_replica_that_stops_leading_clears_the_last_cycles_gauges() -> None:
    """Its last cycle no longer describes the cluster (the new leader's do): the per-cycle gauges are
    those of a replica that has run no cycle; counters and the last success stay."""
    metrics = DaemonMetrics()
    leading = make_report(
        decisions=[row("a")],
        freed=["a-1"],
        savings=20.0,
        nodes={"a-1": NodeFacts(A100, 8), "a-3": NodeFacts(A100, 8)},
        findings=[
            Finding("circuit-open", namespace="ml", detail="ml/train still Pending"),
            Finding("leaked-vram", node="a-3", gpu="GPU-9", fb_used_mib=1024.0),
            Finding("idle-gpu", node="a-1", gpu="GPU-1", namespace="ml", pod="nb"),
            Finding("gpu-rightsizing", namespace="ml", workload="ml/Job/b", saving_per_hour=4.0),
        ],
    )
    metrics.publish(leading)
    fresh = _samples(DaemonMetrics())
    cycle_gauges = {
        "gpu_rebalancer_nodes_freeable",
        "gpu_rebalancer_gpus_freeable",
        "gpu_rebalancer_idle_gpus",
        "gpu_rebalancer_leaked_vram_bytes",
        "gpu_rebalancer_estimated_savings_per_hour",
        "gpu_rebalancer_rightsizing_savings_per_hour",
        "gpu_rebalancer_circuit_open",
        "gpu_rebalancer_findings",
    }
    assert cycle_gauges <= {name for name, _ in _samples(metrics)}

    metrics.clear_cycle_state()
    samples = _samples(metrics)
    assert {k: v for k, v in samples.items() if k[0] in cycle_gauges} == {
        k: v for k, v in fresh.items() if k[0] in cycle_gauges
    }
    assert samples[("gpu_rebalancer_circuit_open", ())] == 0
    assert samples[("gpu_rebalancer_cycles_total", (("result", "success"),))] == 1
    assert samples[("gpu_rebalancer_last_success_timestamp_seconds", ())] == NOW.timestamp()
    evicted = (("mode", "dry-run"), ("result", "would-evict"), ("strategy", "gpu-consolidation"))
    assert samples[("gpu_rebalancer_evictions_total", evicted)] == 1


def test_idle_gpu_seconds_are_not_counted_across_a_time_as_standby() -> None:
    """Another replica led (and counted) meanwhile: the first cycle of a new term counts nothing."""
    idle = [Finding("idle-gpu", node="a-1", gpu="GPU-1", namespace="ml", pod="nb")]
    seconds = ("gpu_rebalancer_idle_gpu_seconds_total", (("namespace", "ml"),))
    metrics = DaemonMetrics()
    metrics.publish(make_report(findings=idle))
    metrics.publish(replace(make_report(findings=idle), now=NOW + timedelta(minutes=5)))
    assert _samples(metrics)[seconds] == 300
    metrics.clear_cycle_state()
    metrics.publish(replace(make_report(findings=idle), now=NOW + timedelta(minutes=30)))
    assert _samples(metrics)[seconds] == 300
    metrics.publish(replace(make_report(findings=idle), now=NOW + timedelta(minutes=35)))
    assert _samples(metrics)[seconds] == 600


def test_metrics_of_a_cycle_use_the_contract_names_and_no_pod_labels() -> None:
    metrics = DaemonMetrics()
    report = make_report(
        decisions=[row("a"), row("b", "blocked-by-pdb"), row("c", None, blocked_by="no-fit")],
        freed=["a-1"],
        savings=None,
        nodes={"a-1": NodeFacts(A100, 8)},
        proposals={"gpu-consolidation": 2},
    )
    metrics.cycle_took(1.5)
    metrics.publish(report)
    samples = _samples(metrics)
    evictions = "gpu_rebalancer_evictions_total"
    mode = (("mode", "dry-run"), ("result", "would-evict"), ("strategy", "gpu-consolidation"))
    assert samples[(evictions, mode)] == 1
    pdb_key = (("mode", "dry-run"), ("result", "blocked-by-pdb"), ("strategy", "gpu-consolidation"))
    assert samples[(evictions, pdb_key)] == 1
    assert samples[("gpu_rebalancer_proposals_total", (("strategy", "gpu-consolidation"),))] == 2
    blocked = ("gpu_rebalancer_blocked_total", (("guard", "no-fit"), ("strategy", "gpu-consolidation")))
    assert samples[blocked] == 1
    assert samples[("gpu_rebalancer_cycles_total", (("result", "success"),))] == 1
    assert samples[("gpu_rebalancer_cycles_total", (("result", "error"),))] == 0
    assert samples[("gpu_rebalancer_cycle_duration_seconds_count", ())] == 1
    assert samples[("gpu_rebalancer_last_success_timestamp_seconds", ())] == NOW.timestamp()
    assert samples[("gpu_rebalancer_nodes_freeable", (("gpu_model", A100),))] == 1
    assert samples[("gpu_rebalancer_gpus_freeable", (("gpu_model", A100),))] == 8
    assert samples[("gpu_rebalancer_circuit_open", ())] == 0
    assert samples[("gpu_rebalancer_policy_valid", ())] == 1
    assert samples[("gpu_rebalancer_policy_reload_errors_total", ())] == 0
    names = {name for name, _ in samples}
    assert "gpu_rebalancer_estimated_savings_per_hour" not in names  # no prices: no value
    assert any(name == "gpu_rebalancer_build_info" for name in names)
    assert all("pod" not in dict(labels) for _, labels in samples)

    # The next cycle replaces the per-cycle gauges whole.
    metrics.publish(make_report(savings=0.0))
    samples = _samples(metrics)
    assert not any(name == "gpu_rebalancer_nodes_freeable" for name, _ in samples)
    assert samples[("gpu_rebalancer_estimated_savings_per_hour", ())] == 0.0


def test_the_watch_cache_is_exported_by_kind_its_oldest_list_and_all_relists() -> None:
    """Two namespaces watched: the pods' age is the older list's, their relists are summed by reason;
    the status is read at each scrape."""
    metrics = DaemonMetrics()
    assert not [name for name, _ in _samples(metrics) if "cluster_cache" in name]  # no cache yet
    lists = [
        ListStatus("Node", "nodes", 12.5, {"gone": 0, "watch-failed": 0, "stale": 0, "policy": 0}),
        ListStatus("Pod", "pods in ml", 3.0, {"gone": 1, "watch-failed": 2, "stale": 0, "policy": 0}),
        ListStatus("Pod", "pods in web", 95.0, {"gone": 0, "watch-failed": 1, "stale": 1, "policy": 0}),
        ListStatus(
            "PodDisruptionBudget", "poddisruptionbudgets in ml", None, dict.fromkeys(RELIST_REASONS, 0)
        ),
    ]
    metrics.watch_cache(lambda: lists)
    samples = _samples(metrics)
    age = "gpu_rebalancer_cluster_cache_age_seconds"
    assert {labels: value for (name, labels), value in samples.items() if name == age} == {
        (("kind", "Node"),): 12.5,
        (("kind", "Pod"),): 95.0,  # the older of the two lists; the never-listed PDBs have no age
    }
    relists = "gpu_rebalancer_cluster_cache_relists_total"
    assert samples[(relists, (("kind", "Pod"), ("reason", "watch-failed")))] == 3
    assert samples[(relists, (("kind", "Pod"), ("reason", "gone")))] == 1
    assert samples[(relists, (("kind", "Pod"), ("reason", "stale")))] == 1
    assert samples[(relists, (("kind", "Node"), ("reason", "policy")))] == 0
    assert samples[(relists, (("kind", "PodDisruptionBudget"), ("reason", "gone")))] == 0
    lists[0] = ListStatus("Node", "nodes", 0.5, {"gone": 1, "watch-failed": 0, "stale": 0, "policy": 0})
    samples = _samples(metrics)
    assert samples[(age, (("kind", "Node"),))] == 0.5
    assert samples[(relists, (("kind", "Node"), ("reason", "gone")))] == 1


@pytest.mark.parametrize(
    ("stale_after", "said"),
    [
        (60.0, "Stale past the cache's bound (60 s)."),
        (180.0, "Stale past the cache's bound (180 s)."),
        (None, "Stale past the cache's bound."),
    ],
)
def test_the_cache_age_help_gives_the_bound_of_the_cache_it_exports(
    stale_after: float | None, said: str
) -> None:
    """The help of the cache's age says when a kind is stale as the cache watched says it, not a
    constant: a cache given another bound is described with it (and one given none, with none)."""
    metrics = DaemonMetrics()
    lists = [ListStatus("Node", "nodes", 12.5, dict.fromkeys(RELIST_REASONS, 0))]
    if stale_after is None:
        metrics.watch_cache(lambda: lists)
    else:
        metrics.watch_cache(lambda: lists, stale_after=stale_after)
    body, _ = metrics.exposition()
    families = text_string_to_metric_families(body.decode())
    (help_text,) = [f.documentation for f in families if f.name == "gpu_rebalancer_cluster_cache_age_seconds"]
    assert help_text.endswith(f"the oldest of its lists. {said}")


def test_openmetrics_is_served_when_asked_for() -> None:
    body, content_type = DaemonMetrics().exposition("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


SNOOZE = "kubectl annotate statefulset alice -n notebooks rebalancer.gpu/snooze-until=X --overwrite"


def test_slack_tells_owners_of_idle_workloads_with_the_command_to_snooze() -> None:
    told = WorkloadNotice(
        workload=("notebooks", "StatefulSet", "alice"),
        verb="notify",
        result="notified",
        message="notebooks/StatefulSet/alice holds 1 GPU idle since 2026-11-29T07:00:00Z, $5.10/h.",
        snooze_command=SNOOZE,
    )
    scaled = WorkloadNotice(
        workload=("notebooks", "StatefulSet", "bob"),
        verb="reclaim",
        result="scaled",
        message="nb/StatefulSet/bob was scaled to 0 replicas. Undo: rebalancer restore nb/StatefulSet/bob",
        snooze_command=None,
    )
    report = replace(make_report("live", decisions=[row("bob-0", "scaled")]), notices=(told, scaled))
    texts = [
        b["text"]["text"] for b in build_message(report)["blocks"] if b["type"] == "section" and "text" in b
    ]
    [idle] = [t for t in texts if t.startswith("*Idle workloads*")]
    assert (
        "• notebooks/StatefulSet/alice holds 1 GPU idle since 2026-11-29T07:00:00Z, $5.10/h. "
        f"To keep it: `{SNOOZE}`"
    ) in idle
    assert "Undo: rebalancer restore nb/StatefulSet/bob" in idle
    # A reclaim is reported with the idle workloads, never as a pod that was not evicted.
    assert not [t for t in texts if t.startswith("*Not evicted*")]
