"""Small wording helpers shared by every message the rebalancer writes (reports, findings, errors).

Owns how counts are pluralised and how a value taken from the input is quoted back: cut to a
readable length, so that a message about a huge value never prints megabytes on one line. It must
stay free of domain knowledge and I/O.
"""

from __future__ import annotations

__all__ = ["CLIP_CHARS", "clip", "plural", "quoted"]

# Longest piece of an input value a message repeats.
CLIP_CHARS = 80


def plural(count: int, word: str) -> str:
    """`1 pod`, `3 pods`."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def clip(text: str, limit: int = CLIP_CHARS) -> str:
    """`text` itself when short, else its head and how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def quoted(value: object, limit: int = CLIP_CHARS) -> str:
    """The Python repr of a value from the input (`'abc'`, `12`), clipped to `limit` characters."""
    return clip(repr(value), limit)
