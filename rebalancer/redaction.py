"""Credentials never leave the process: the one place that strips them from URLs and free text.

Owns what a credential looks like in text the rebalancer repeats (a URL's `user:password@`, a
`token=` / `password=` / `secret=` query parameter, an `Authorization:` header value) and how it is
shown instead (`***`). Every message built from a configured URL or from an error that may quote one
(findings, skip reasons, report cells, Slack and webhook bodies, log lines) goes through `redact()`
or `redact_url()`. It must stay free of I/O and domain knowledge: it rewrites strings, nothing more.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = ["MASK", "redact", "redact_tree", "redact_url"]

MASK = "***"

# `scheme://user:password@host` or `scheme://token@host` anywhere in a text.
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/?#@\s]+)@")
# Query parameters and `key: value` / `key=value` pairs whose name says they hold a secret.
_SECRET_PARAM = re.compile(
    r"(?P<key>\b(?:[a-z0-9_-]*(?:token|password|passwd|secret|api[_-]?key|access[_-]?key|signature|sig))"
    r"[\"']?\s*[=:]\s*[\"']?)(?P<value>[^&#\s\"',;}]+)",
    re.IGNORECASE,
)
# How a problem line about a field goes on (`FILE:LINE: a.bearer_token: unknown field`): the words of
# the validator, not a value, even when the field is named like a secret.
_PROBLEM_WORDS = ("unknown field", "required field is missing", "expected a ", "Input should ")
_AUTHORIZATION = re.compile(
    r"(?P<key>\bauthorization[\"']?\s*[=:]\s*[\"']?)(?P<value>(?:(?:bearer|basic)\s+)?[^\s\"',;}]+)",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """`text` with every credential it quotes replaced by `***` (userinfo, secret parameters, auth)."""
    if not text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    text = _AUTHORIZATION.sub(lambda m: f"{m['key']}{MASK}", text)
    return _SECRET_PARAM.sub(_mask_param, text)


def _mask_param(match: re.Match[str]) -> str:
    if match["key"].rstrip().endswith(":") and match.string.startswith(_PROBLEM_WORDS, match.start("value")):
        return match[0]
    return f"{match['key']}{MASK}"


def redact_tree(value: Any) -> Any:
    """`value` with every string in it (nested mappings, lists and tuples too) passed through `redact()`;
    an exception becomes its redacted `Type: message`."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {key: redact_tree(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_tree(item) for item in value]
    if isinstance(value, BaseException):
        return redact(f"{type(value).__name__}: {value}")
    return value


def redact_url(url: str) -> str:
    """A URL safe to show: no `user:password@`, secret query parameters masked, the rest as given. A
    `user:password@host` typed without a scheme loses its credentials too."""
    if "://" not in url and "@" in url:
        return redact(f"{MASK}@{url.rpartition('@')[2]}")
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
    shown = SplitResult(parts.scheme, netloc, parts.path, parts.query, parts.fragment)
    return redact(urlunsplit(shown))
