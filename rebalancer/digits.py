"""Whole numbers written as text: ASCII decimal digits, and nothing else.

Owns `is_ascii_digits`, the test every reader of a number in text makes before `int()` (GPU counts and
device indexes in labels and annotations, replica counts, ports, flags, signature timestamps):
`str.isdigit` takes "²" and other superscripts, which `int()` refuses (a traceback instead of a
message), and `int()` takes other scripts' digits (full-width ones), which no Kubernetes component
writes (Go's strconv reads ASCII digits only). Pure, standard library only: command lines read their
flags with it.
"""

from __future__ import annotations

__all__ = ["is_ascii_digits"]


def is_ascii_digits(text: str) -> bool:
    """Whether `text` is one or more of the digits 0-9, and so a whole number `int()` reads."""
    return text.isascii() and text.isdigit()
