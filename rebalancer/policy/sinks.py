"""The policy's `notify:` section: Slack and webhook sinks, what each sends and how often.

Owns the filters every sink shares (evictions only, dry runs, finding kinds, rate, digests) and each
sink's settings: where its secret lives (an env var or a file, never the secret itself) and the URL a
webhook posts to, refused over plain http when it would carry a secret. It must not deliver anything.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rebalancer.policy.fields import Duration, KnownFindingKind, StrictModel, refuse_secrets_over_plain_http

__all__ = ["DigestPeriod", "NotifyConfig", "SinkFilters", "SlackSinkConfig", "WebhookSinkConfig"]


DigestPeriod = Literal["hourly", "daily"]


class SinkFilters(StrictModel):
    """What a notification sink sends, and how often: shared by every kind of sink."""

    only_when_evicted: bool = False
    include_dry_run: bool = True
    finding_kinds: tuple[KnownFindingKind, ...] | None = None
    min_interval: Duration = 0
    # Dry-run reports are not sent one by one but as one digest (the latest report) per period.
    digest: DigestPeriod | None = None


class SlackSinkConfig(SinkFilters):
    webhook_url_env: str | None = None
    webhook_url_file: str | None = None
    dashboard_url: str | None = None

    @model_validator(mode="after")
    def _has_secret_source(self) -> SlackSinkConfig:
        if not (self.webhook_url_env or self.webhook_url_file):
            raise ValueError("set webhook_url_env or webhook_url_file (the URL itself is a secret)")
        return self


class WebhookSinkConfig(SinkFilters):
    url: str = Field(min_length=1, pattern=r"^https?://")
    secret_env: str | None = None
    secret_file: str | None = None

    @model_validator(mode="after")
    def _secrets_need_https(self) -> WebhookSinkConfig:
        """A signed delivery, or a URL carrying credentials, sent over plain http is readable on the wire."""
        refuse_secrets_over_plain_http(
            self.url,
            {"secret_env": self.secret_env, "secret_file": self.secret_file},
            "the webhook carries secrets: signed reports and credentials",
        )
        return self


class NotifyConfig(StrictModel):
    slack: tuple[SlackSinkConfig, ...] = ()
    webhooks: tuple[WebhookSinkConfig, ...] = ()
