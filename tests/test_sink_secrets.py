"""Secrets in notifications and logs: webhook signatures that cannot be replayed, no secret over plain
HTTP, and credentials quoted by a finding or an error redacted in logs, Slack and webhook bodies."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import structlog

from rebalancer.cycle_report import CycleReport
from rebalancer.errors import InputError
from rebalancer.model import Finding, SkippedStrategy
from rebalancer.policy import (
    PolicyError,
    SlackSinkConfig,
    WebhookSinkConfig,
    parse_policy,
    plain_http_to_remote_host,
)
from rebalancer.sinks.log import LogSink, configure_logging
from rebalancer.sinks.notify import Delivery, SinkError
from rebalancer.sinks.slack import SlackSink
from rebalancer.sinks.webhook import (
    DELIVERY_HEADER,
    REPLAY_WINDOW,
    SIGNATURE_HEADER,
    SIGNATURE_V1_HEADER,
    WebhookSink,
    sign,
    sign_v1,
    verify_signature,
)
from tests.http_receiver import HttpReceiver, http_receiver
from tests.test_sinks import EVICTING, SECRET, fast_poster, make_report, row

__all__ = ["http_receiver"]

SENT_AT = datetime(2026, 11, 29, 12, 0, 7, tzinfo=UTC)
LEAKY = "http://bob:hunter2@prometheus.example:9090/api/v1/query?token=t0ps3cret"


def leaky_report() -> CycleReport:
    base = make_report(
        "live",
        decisions=[row("train-0", "evicted")],
        findings=[Finding("telemetry-unavailable", node="a-1", detail=f"Prometheus at {LEAKY}: refused")],
    )
    decision = base.decisions[0]
    return CycleReport(
        mode=base.mode,
        now=base.now,
        summary=base.summary,
        decisions=(
            type(decision)(**{**{f: getattr(decision, f) for f in decision.__slots__}, "reason": LEAKY}),
        ),
        findings=base.findings,
        skipped_strategies=(SkippedStrategy("idle-gpu", f"telemetry-unavailable: GET {LEAKY} failed"),),
        freed_nodes=("a-1",),
    )


def assert_no_secret(text: str) -> None:
    for secret in ("hunter2", "t0ps3cret", "bob:"):
        assert secret not in text, f"{secret!r} in {text[:2000]}"


def signed_webhook(receiver: HttpReceiver, retries: int = 3) -> WebhookSink:
    cfg = WebhookSinkConfig(url=receiver.url + "/hook", secret_env="HOOK_SECRET")
    return WebhookSink(
        cfg, poster=fast_poster(retries), environ={"HOOK_SECRET": SECRET}, wall_clock=lambda: SENT_AT
    )


# --------------------------------------------------------------------------- signatures


def test_v1_signature_signs_the_timestamp_with_the_body(http_receiver: HttpReceiver) -> None:
    signed_webhook(http_receiver).send(Delivery(EVICTING))
    [request] = http_receiver.wait_for(1)
    header = request.header(SIGNATURE_V1_HEADER)
    sent = int(SENT_AT.timestamp())
    assert header == sign_v1(SECRET, request.body, sent) and header.startswith(f"t={sent},v1=")
    assert verify_signature(SECRET, request.body, header, now=sent + 10)
    # The first scheme stays, for receivers that check it.
    assert request.header(SIGNATURE_HEADER) == sign(SECRET, request.body)

    assert not verify_signature(SECRET, request.body + b" ", header, now=sent)  # tampered body
    assert not verify_signature("other", request.body, header, now=sent)  # another secret
    assert not verify_signature(SECRET, request.body, header, now=sent + REPLAY_WINDOW + 1)  # replayed late
    assert not verify_signature(SECRET, request.body, header, now=sent - REPLAY_WINDOW - 1)  # from the future
    later = sign_v1(SECRET, request.body, sent + 3600)
    moved = f"t={sent + 3600},{header.split(',')[1]}"  # a fresh timestamp on the old signature
    assert verify_signature(SECRET, request.body, later, now=sent + 3600)
    assert not verify_signature(SECRET, request.body, moved, now=sent + 3600)
    for broken in (None, "", "v1=abc", f"t={sent}", f"t=²,v1={header.split('v1=')[1]}", "garbage"):
        assert not verify_signature(SECRET, request.body, broken, now=sent), broken
    # Secret rotation: any of several v1 values may match.
    rotated = f"t={sent},v1={'0' * 64},v1={header.split('v1=')[1]}"
    assert verify_signature(SECRET, request.body, rotated, now=sent)


def test_a_delivery_has_one_id_for_all_its_retries_and_a_new_one_next_time(
    http_receiver: HttpReceiver,
) -> None:
    http_receiver.script([500, 200])
    sink = signed_webhook(http_receiver)
    sink.send(Delivery(EVICTING))
    first, retry = http_receiver.wait_for(2)
    assert first.body == retry.body and first.headers == retry.headers
    delivery_id = first.json()["delivery_id"]
    assert first.header(DELIVERY_HEADER) == delivery_id and len(delivery_id) == 36

    sink.send(Delivery(EVICTING))
    _, _, again = http_receiver.wait_for(3)
    assert again.json()["delivery_id"] != delivery_id  # the id is in the signed body: a receiver keeps it


def test_the_signing_time_is_read_at_every_delivery(http_receiver: HttpReceiver) -> None:
    times = iter([SENT_AT, SENT_AT + timedelta(minutes=10)])
    cfg = WebhookSinkConfig(url=http_receiver.url + "/hook", secret_env="HOOK_SECRET")
    sink = WebhookSink(
        cfg, poster=fast_poster(), environ={"HOOK_SECRET": SECRET}, wall_clock=lambda: next(times)
    )
    sink.send(Delivery(EVICTING))
    sink.send(Delivery(EVICTING))
    stamps = [r.header(SIGNATURE_V1_HEADER) or "" for r in http_receiver.wait_for(2)]
    sent = int(SENT_AT.timestamp())
    assert [s.split(",")[0] for s in stamps] == [f"t={sent}", f"t={sent + 600}"]


# --------------------------------------------------------------------------- no secrets over plain HTTP


def webhooks(**hook: object) -> dict[str, object]:
    return {"notify": {"webhooks": [hook]}}


@pytest.mark.parametrize(
    ("hook", "named"),
    [
        ({"url": "http://hooks.example.com/x", "secret_env": "HOOK_SECRET"}, "secret_env"),
        ({"url": "http://10.0.0.7:8080/x", "secret_file": "/etc/hook/secret"}, "secret_file"),
        ({"url": "http://alice:pw@hooks.example.com/x"}, "credentials in url"),
        ({"url": "http://hooks.example.com/x?token=abc"}, "credentials in url"),
        ({"url": "http://127.0.0.1.example.com/x", "secret_env": "S"}, "secret_env"),
    ],
)
def test_a_webhook_carrying_a_secret_over_plain_http_is_refused(hook: dict[str, object], named: str) -> None:
    with pytest.raises(PolicyError) as refused:
        parse_policy(webhooks(**hook), source="policy.yaml")
    assert isinstance(refused.value, InputError)  # exit 2
    [problem] = refused.value.problems
    assert problem.startswith("policy.yaml: notify.webhooks[0]: url is plain http://"), problem
    assert named in problem and "https://" in problem
    assert str(hook["url"]) not in problem  # it may carry a credential: never echoed


@pytest.mark.parametrize(
    "hook",
    [
        {"url": "https://hooks.example.com/x", "secret_env": "HOOK_SECRET"},
        {"url": "https://alice:pw@hooks.example.com/x"},
        {"url": "http://127.0.0.1:8080/x", "secret_env": "HOOK_SECRET"},  # a local relay or sidecar
        {"url": "http://127.9.9.9/x", "secret_env": "HOOK_SECRET"},
        {"url": "http://[::1]:8080/x", "secret_env": "HOOK_SECRET"},
        {"url": "http://localhost:8080/x", "secret_file": "/s"},
        {"url": "http://hooks.example.com/x"},  # unsigned and without credentials: warned about, allowed
    ],
)
def test_https_loopback_and_unsigned_webhooks_are_accepted(hook: dict[str, object]) -> None:
    parse_policy(webhooks(**hook))


def test_plain_http_to_remote_host() -> None:
    assert plain_http_to_remote_host("http://example.com")
    assert plain_http_to_remote_host("http://[::ffff:10.0.0.1]/")
    assert plain_http_to_remote_host("http://[::1")  # unparsable: never assumed local
    assert not plain_http_to_remote_host("https://example.com")
    assert not plain_http_to_remote_host("http://localhost./x")
    assert not plain_http_to_remote_host("http://127.0.0.1")


def test_a_slack_webhook_url_over_plain_http_is_never_posted_to() -> None:
    cfg = SlackSinkConfig(webhook_url_env="SLACK_URL")
    secret_url = "http://hooks.slack.example/services/T0/B0/TOPSECRET"
    sink = SlackSink(cfg, poster=fast_poster(retries=0), environ={"SLACK_URL": secret_url})
    with pytest.raises(SinkError, match=r"slack: the webhook URL .* is not https://") as refused:
        sink.send(Delivery(EVICTING))
    assert "TOPSECRET" not in str(refused.value)


# --------------------------------------------------------------------------- redaction


@pytest.fixture
def logging_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_credentials_in_reports_and_errors_never_reach_the_log(fmt: str, logging_restored: None) -> None:
    out = io.StringIO()
    configure_logging(fmt, stream=out)  # type: ignore[arg-type]
    LogSink().publish(leaky_report())
    log = structlog.get_logger("rebalancer.test")
    log.warning("notification failed", error=f"GET {LEAKY}: refused", urls=[LEAKY], nested={"u": LEAKY})
    logging.getLogger("urllib3.connectionpool").warning("Retrying %s", LEAKY)
    try:
        raise ConnectionError(f"cannot reach {LEAKY}")
    except ConnectionError:
        log.exception("cycle failed")
    text = out.getvalue()
    assert text.count("http://***@prometheus.example:9090") >= 5
    assert_no_secret(text)
    if fmt == "json":
        lines = [json.loads(line) for line in text.splitlines()]
        assert {line["event"] for line in lines} >= {"decision", "cycle report", "notification failed"}
        failed = next(line for line in lines if line["event"] == "cycle failed")
        assert "ConnectionError" in failed["exception"]


def test_credentials_never_reach_slack_or_webhook_bodies(http_receiver: HttpReceiver) -> None:
    report = leaky_report()
    cfg = SlackSinkConfig(webhook_url_env="SLACK_URL")
    SlackSink(cfg, poster=fast_poster(), environ={"SLACK_URL": http_receiver.url + "/s"}).send(
        Delivery(report)
    )
    signed_webhook(http_receiver).send(Delivery(report))
    slack_request, hook_request = http_receiver.wait_for(2)
    for request in (slack_request, hook_request):
        assert_no_secret(request.body.decode())
    assert "http://***@prometheus.example:9090" in slack_request.body.decode()
    hook = hook_request.json()
    assert hook["decisions"][0]["reason"].startswith("http://***@prometheus.example:9090")
    assert hook["skipped_strategies"][0]["reason"].startswith("telemetry-unavailable: GET http://***@")
    # What is signed is what is sent: the redacted body.
    header = hook_request.header(SIGNATURE_V1_HEADER)
    assert verify_signature(SECRET, hook_request.body, header, now=SENT_AT.timestamp())
