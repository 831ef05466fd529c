"""The policy's field types: durations, percentages, the strict model base, and what a URL may carry.

Owns how a duration is written and read (`30s`, `5m`, `1h30m`, a bare number of seconds), the base
model every policy section derives from (unknown fields refused, frozen), and the rule every section
holding a URL shares: credentials or signed payloads never go over plain `http://` to a host that is
not loopback. It must not know any section.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from rebalancer.redaction import redact_url
from rebalancer.wording import quoted

__all__ = [
    "MAX_DURATION_SECONDS",
    "Duration",
    "Percent",
    "StrictModel",
    "format_duration",
    "parse_duration",
    "plain_http_to_remote_host",
    "refuse_secrets_over_plain_http",
]

# --------------------------------------------------------------------------- durations

# Past this no setting means anything, and datetime arithmetic overflows a little further on.
MAX_DURATION_SECONDS = 3650 * 86400
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: object) -> int:
    """Seconds from `90`, `"90s"`, `"5m"`, `"1h30m"`, `"1d"` (Prometheus / Go style). Rejects the rest."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 30s, 5m or 1h, got {quoted(value)}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError("empty duration")
        if text.startswith("-"):
            raise ValueError(f"duration must be non-negative, got {quoted(value)}")
        pos = 0
        seconds = 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if pos != len(text):
            raise ValueError(
                f"invalid duration {quoted(value)}: use a number with a unit, e.g. 30s, 5m, 1h30m"
            )
    else:
        raise ValueError(f"expected a duration such as 30s, 5m or 1h, got {type(value).__name__}")
    if seconds > MAX_DURATION_SECONDS:  # infinity included
        raise ValueError(
            f"duration {quoted(value)} is longer than {format_duration(MAX_DURATION_SECONDS)} (ten years)"
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"duration must be a finite, non-negative time, got {quoted(value)}")
    return round(seconds)


def format_duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


Duration = Annotated[int, BeforeValidator(parse_duration)]
"""A duration in whole seconds, written as `30s`, `5m`, `1h30m` or a bare number of seconds."""

Percent = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]


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
