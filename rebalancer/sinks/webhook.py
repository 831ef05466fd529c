"""The generic webhook sink: the JSON cycle report (DESIGN §7), signed with HMAC-SHA256.

Owns the delivery format: the body is `report.to_dict()` as JSON (digests add a `digest` object:
`{"period": "daily", "cycles": N}`), `Content-Type: application/json`, and, when the policy names a
shared secret (`secret_env` / `secret_file`), `X-Rebalancer-Signature: sha256=<hex HMAC-SHA256 of the
exact body bytes>`, so a receiver verifies with `hmac.compare_digest(expected, header)`. A secret that
is configured but cannot be read stops the delivery: nothing is ever sent unsigned by accident.

Delivery, retries, rate limit and the worker thread are `notify`'s; the secret is read at every
delivery and never logged. This module must not block a cycle or decide anything.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from rebalancer.policy import WebhookSinkConfig
from rebalancer.report import to_dict
from rebalancer.sinks.notify import Delivery, HttpSink, read_secret

__all__ = ["SIGNATURE_HEADER", "WebhookSink", "sign", "webhook_body"]

SIGNATURE_HEADER = "X-Rebalancer-Signature"


def sign(secret: str, body: bytes) -> str:
    """The signature header value: `sha256=<hex HMAC-SHA256 of body with secret>`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def webhook_body(delivery: Delivery) -> bytes:
    doc = to_dict(delivery.report)
    if delivery.digest_cycles:
        doc["digest"] = {"period": delivery.digest_period, "cycles": delivery.digest_cycles}
    return json.dumps(doc, separators=(",", ":")).encode()


class WebhookSink(HttpSink[WebhookSinkConfig]):
    """POSTs the JSON report to `url`, signed when a secret is configured."""

    default_name = "webhook"

    @property
    def signed(self) -> bool:
        return bool(self.config.secret_env or self.config.secret_file)

    def send(self, delivery: Delivery) -> None:
        cfg = self.config
        secret = read_secret(
            f"{self.name} signing secret", env=cfg.secret_env, file=cfg.secret_file, environ=self._environ
        )
        body = webhook_body(delivery)
        headers = {"Content-Type": "application/json", "User-Agent": "gpu-rebalancer"}
        if secret is not None:
            headers[SIGNATURE_HEADER] = sign(secret, body)
        self._poster.post(self.name, cfg.url, body, headers)
