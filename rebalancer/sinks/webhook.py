"""The generic webhook sink: the JSON cycle report (DESIGN §7), signed with HMAC-SHA256 over a timestamp.

Owns the delivery format. The body is `report.to_dict()` as JSON, every string redacted
(`redaction.redact`), plus `delivery_id` (a fresh UUID per delivery, the same on every retry of it) and,
for digests, `digest`: `{"period": "daily", "cycles": N}`; `Content-Type: application/json`;
`X-Rebalancer-Delivery: <delivery_id>`. When the policy names a shared secret (`secret_env` /
`secret_file`), two signature headers:

- `X-Rebalancer-Signature-V1: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body bytes>">`: Stripe's
  scheme (https://docs.stripe.com/webhooks#verify-manually; Slack's `v0:<t>:<body>` of
  https://api.slack.com/authentication/verifying-requests-from-slack is the same idea). The timestamp
  is signed with the body, so a receiver that rejects old timestamps (Stripe's and Slack's window:
  5 minutes) and remembers the `delivery_id`s it saw within that window cannot be replayed to.
  `verify_signature()` is the receiver's check, written to be copied (standard library only).
- `X-Rebalancer-Signature: sha256=<hex HMAC-SHA256 of the body bytes>`: the first scheme, kept so that
  existing receivers keep working; it can be replayed for ever, so receivers should move to V1.

The signing time is the sink's wall clock (injectable), read once per delivery. A secret that is
configured but cannot be read stops the delivery: nothing is ever sent unsigned by accident.

Delivery, retries, rate limit and the worker thread are `notify`'s; the secret is read at every
delivery and never logged. This module must not block a cycle or decide anything.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime

from rebalancer.daemon.clock import utcnow
from rebalancer.digits import is_ascii_digits
from rebalancer.policy import WebhookSinkConfig
from rebalancer.redaction import redact_tree
from rebalancer.report import to_dict
from rebalancer.sinks.notify import Delivery, HttpPoster, HttpSink, read_secret

__all__ = [
    "DELIVERY_HEADER",
    "REPLAY_WINDOW",
    "SIGNATURE_HEADER",
    "SIGNATURE_V1_HEADER",
    "WebhookSink",
    "sign",
    "sign_v1",
    "verify_signature",
    "webhook_body",
]

SIGNATURE_HEADER = "X-Rebalancer-Signature"
SIGNATURE_V1_HEADER = "X-Rebalancer-Signature-V1"
DELIVERY_HEADER = "X-Rebalancer-Delivery"
# Seconds a receiver accepts between the signed timestamp and its own clock, either way.
REPLAY_WINDOW = 300


def sign(secret: str, body: bytes) -> str:
    """The first scheme's header value: `sha256=<hex HMAC-SHA256 of body with secret>` (replayable)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def sign_v1(secret: str, body: bytes, timestamp: int) -> str:
    """The V1 header value: `t=<timestamp>,v1=<hex HMAC-SHA256 of "<timestamp>.<body>">`."""
    signed = str(timestamp).encode() + b"." + body
    return f"t={timestamp},v1=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str, body: bytes, header: str | None, *, now: float, tolerance: float = REPLAY_WINDOW
) -> bool:
    """A receiver's check of `X-Rebalancer-Signature-V1`: True only when `header` carries a timestamp
    within `tolerance` seconds of `now` (the receiver's clock, Unix seconds) and a `v1` HMAC of
    `"<t>.<body>"` that matches, compared in constant time. `body` is the raw request body, as received.

    Then reject a `delivery_id` (in the body) already seen within the window: that is a replay.
    """
    if not header:
        return False
    timestamp: str | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            timestamp = value
        elif key == "v1":
            candidates.append(value)  # several when the secret is being rotated
    if timestamp is None or not is_ascii_digits(timestamp) or not candidates:
        return False
    if abs(now - int(timestamp)) > tolerance:
        return False
    signed = timestamp.encode() + b"." + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)


def webhook_body(delivery: Delivery, delivery_id: str) -> bytes:
    """The exact bytes POSTed (and signed): the redacted report, its delivery id, the digest."""
    doc = redact_tree(to_dict(delivery.report))
    doc["delivery_id"] = delivery_id
    if delivery.digest_cycles:
        doc["digest"] = {"period": delivery.digest_period, "cycles": delivery.digest_cycles}
    return json.dumps(doc, separators=(",", ":")).encode()


class WebhookSink(HttpSink[WebhookSinkConfig]):
    """POSTs the JSON report to `url`, signed when a secret is configured."""

    default_name = "webhook"

    def __init__(
        self,
        config: WebhookSinkConfig,
        *,
        name: str | None = None,
        poster: HttpPoster | None = None,
        environ: Mapping[str, str] | None = None,
        wall_clock: Callable[[], datetime] = utcnow,
    ) -> None:
        super().__init__(config, name=name, poster=poster, environ=environ)
        self._wall_clock = wall_clock

    @property
    def signed(self) -> bool:
        return bool(self.config.secret_env or self.config.secret_file)

    def send(self, delivery: Delivery) -> None:
        cfg = self.config
        secret = read_secret(
            f"{self.name} signing secret", env=cfg.secret_env, file=cfg.secret_file, environ=self._environ
        )
        delivery_id = str(uuid.uuid4())
        body = webhook_body(delivery, delivery_id)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "gpu-rebalancer",
            DELIVERY_HEADER: delivery_id,
        }
        if secret is not None:
            headers[SIGNATURE_V1_HEADER] = sign_v1(secret, body, int(self._wall_clock().timestamp()))
            headers[SIGNATURE_HEADER] = sign(secret, body)
        self._poster.post(self.name, cfg.url, body, headers)
