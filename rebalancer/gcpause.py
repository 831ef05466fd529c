"""Pausing CPython's cyclic garbage collector around allocation-heavy, garbage-light work.

Building a snapshot of a large cluster, and evaluating strategies and planner on it, allocate millions
of objects that are not garbage until the work ends; CPython runs a full collection, visiting every
one of them, each time the heap grows by a quarter, which on 50,000 pods costs more than the work
itself. Reference counting still frees memory as usual while the collector is paused.

Owns only that context manager; it must not hold any state of its own or change anything else.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector (if it runs) for the duration of the block; nested uses are fine."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
