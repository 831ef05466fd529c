"""`rebalancer.redaction`: what a credential looks like in text, and that it never survives."""

from __future__ import annotations

from pathlib import Path

import pytest

from rebalancer.cli import main
from rebalancer.redaction import MASK, redact, redact_tree, redact_url
from tests.test_daemon_cli import kubeconfig


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://bob:hunter2@prom.example:9090/api", "https://***@prom.example:9090/api"),
        ("http://token-only@10.0.0.1", "http://***@10.0.0.1"),
        ("https://prom.example/path?token=abc123&step=30", "https://prom.example/path?token=***&step=30"),
        ("https://prom.example/x?api_key=k3y", "https://prom.example/x?api_key=***"),
        ("https://prom.example:9090", "https://prom.example:9090"),
        ("https://a:b@c@prom.example", "https://***@prom.example"),
        ("bob:hunter2@prom.example:9090", "***@prom.example:9090"),  # typed without a scheme
    ],
)
def test_redact_url_masks_userinfo_and_secret_parameters(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_url_of_an_unparseable_url_still_masks() -> None:
    shown = redact_url("https://bob:hunter2@[::1")
    assert "hunter2" not in shown


@pytest.mark.parametrize(
    "text",
    [
        "GET https://bob:hunter2@prom:9090/api/v1/query failed",
        "Authorization: Bearer hunter2",
        "authorization=Basic hunter2",
        "retry with password=hunter2 and user bob",
        "client_secret: hunter2",
        "x-api-key=hunter2",
        "redirect to wss://hunter2@relay.example/",
        '{"authorization": "Basic hunter2"}',
        "{'Authorization': 'Bearer hunter2'}",
    ],
)
def test_redact_masks_credentials_anywhere_in_free_text(text: str) -> None:
    shown = redact(text)
    assert "hunter2" not in shown
    assert MASK in shown


def test_redact_leaves_ordinary_text_alone() -> None:
    text = "query 'count_over_time(DCGM_FI_DEV_GPU_UTIL[1800s])' failed: HTTP 503: too many samples"
    assert redact(text) == text
    assert redact("") == ""
    assert redact("mail bob@example.com") == "mail bob@example.com"


@pytest.mark.parametrize(
    "line",
    [
        "p.yaml:4: telemetry.prometheus.bearer_token: unknown field",
        "p.yaml:4: notify.webhooks[0].secret_env: required field is missing",
        "p.yaml:4: notify.webhooks[0].secret_file: expected a mapping, got a list",
        "p.yaml:4: notify.webhooks[0].secret_env: Input should be a valid string (got 5)",
    ],
)
def test_a_problem_about_a_secret_named_field_keeps_its_message(line: str) -> None:
    # The field is named like a secret, but what follows it is the validator's own words, no value.
    assert redact(line) == line


def test_a_secret_that_reads_like_a_message_is_still_masked() -> None:
    assert redact("password: unknown") == "password: ***"
    assert redact("token=unknown field") == "token=*** field"


def test_a_masked_query_parameter_keeps_what_follows_it() -> None:
    assert redact("https://p/x?token=hunter2#section") == "https://p/x?token=***#section"
    assert redact("https://p/x?token=hunter2&q=up") == "https://p/x?token=***&q=up"


def test_redact_tree_masks_every_string_of_a_document() -> None:
    doc = {"url": "https://bob:hunter2@p", "rows": [("Authorization: Bearer hunter2", 3)], "n": 1}
    assert redact_tree(doc) == {"url": "https://***@p", "rows": [["Authorization: ***", 3]], "n": 1}
    assert redact_tree(ValueError("password=hunter2")) == "ValueError: password=***"


def test_the_command_line_never_prints_a_credential_it_was_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    code = main(["once", "--kubeconfig", str(config), "--prometheus-url", "ftp://bob:hunter2@p"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--prometheus-url" in err and "hunter2" not in err


@pytest.mark.parametrize("command", ["advise", "waste"])
def test_a_bad_prometheus_url_is_refused_without_echoing_its_password(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = str(Path(__file__).resolve().parents[1] / "examples" / "demo-cluster")
    code = main([command, "--snapshot", demo, "--prometheus-url", "bob:hunter2@prom.example:9090"])
    err = capsys.readouterr().err
    assert code == 2
    assert "expected an http(s):// URL" in err and "***@prom.example:9090" in err
    assert "hunter2" not in err


@pytest.mark.parametrize("command", ["once", "run"])
def test_a_prometheus_url_the_policy_s_credentials_refuse_is_an_error_at_start_without_them(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A token over plain http:// is refused by the policy; the flag must not turn that into a traceback
    # quoting the URL's password (nor a daemon whose every cycle fails).
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "telemetry:\n  prometheus:\n    url: https://prometheus.example.com\n"
        "    bearer_token_env: PROMETHEUS_BEARER_TOKEN\n"
    )
    config = kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    argv = [command, "--kubeconfig", str(config), "--policy", str(policy)]
    code = main([*argv, "--prometheus-url", "http://admin:hunter2@prom:9090"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines()[-1] == (
        "rebalancer: error: --prometheus-url: url is plain http:// but credentials are configured "
        "(bearer_token_env, credentials in url): they would cross the network unencrypted; use an "
        "https:// url (plain http:// only to a loopback host: 127.0.0.1, ::1, localhost) "
        "(got 'http://***@prom:9090')"
    )
    assert "hunter2" not in err and "Traceback" not in err
