"""The policy's field types: durations, percentages, counts, the strict model base, and what a URL may carry.

Owns the duration field (written and read as `rebalancer.durations` says, re-exported here), the base
model every policy section derives from (unknown fields refused, frozen), and the rule every section
holding a URL shares: credentials or signed payloads never go over plain `http://` to a host that is
not loopback. It must not know any section.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from rebalancer.durations import MAX_DURATION_SECONDS, format_duration, parse_duration
from rebalancer.finding_kinds import FindingKind, unknown_kind_problem
from rebalancer.redaction import redact_url

__all__ = [
    "MAX_COUNT",
    "MAX_DURATION_SECONDS",
    "Count",
    "Duration",
    "KnownFindingKind",
    "Percent",
    "StrictModel",
    "format_duration",
    "parse_duration",
    "plain_http_to_remote_host",
    "refuse_secrets_over_plain_http",
]

Duration = Annotated[int, BeforeValidator(parse_duration)]
"""A duration in whole seconds, written as `30s`, `5m`, `1h30m` or a bare number of seconds."""

# Strict: YAML's `true` is no 1 (pydantic's lax mode would read it so); an integer is still a number.
Percent = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False, strict=True)]

# Past this no count of a policy (nodes, pods, evictions, samples) means anything, and the ones a
# Python C function takes (islice's stop) fit.
MAX_COUNT = 1_000_000_000
Count = Annotated[int, Field(le=MAX_COUNT, strict=True)]
"""A count (nodes, pods, evictions, samples): a whole number up to `MAX_COUNT`, never a boolean; each
field gives its lower bound (`Field(ge=1)`)."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def plain_http_to_remote_host(url: str) -> bool:
    """True when `url` is plain `http://` to a host that is not loopback (127.0.0.0/8, ::1, localhost):
    what is sent there crosses a network unencrypted. A local relay or sidecar may take plain http."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return True  # unparsable: never assumed local
    if parts.scheme.lower() != "http":
        return False
    host = (parts.hostname or "").rstrip(".")
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def refuse_secrets_over_plain_http(url: str, secrets: dict[str, object], what: str) -> None:
    """Raise ValueError when `url` is plain http:// to a non-loopback host and any of `secrets` (setting
    name: configured value) is set, or the URL itself carries credentials (`user:password@`, a token
    parameter); `what` says what would be exposed. The URL is never repeated."""
    if not plain_http_to_remote_host(url):
        return
    sent = [name for name, configured in secrets.items() if configured]
    if redact_url(url) != url:
        sent.append("credentials in url")
    if sent:
        raise ValueError(
            f"url is plain http:// but {what} ({', '.join(sent)}): they would cross the network "
            "unencrypted; use an https:// url (plain http:// only to a loopback host: 127.0.0.1, ::1, "
            "localhost)"
        )


def _known_finding_kind(value: object) -> object:
    problem = unknown_kind_problem(value) if isinstance(value, str) else None
    if problem is not None:
        raise ValueError(problem)
    return value


KnownFindingKind = Annotated[FindingKind, BeforeValidator(_known_finding_kind)]
"""A finding kind (`rebalancer.finding_kinds`); another word is refused naming the nearest kind."""
