"""Shared pytest configuration.

freezegun walks module attributes when it patches the clock and trips over the kubernetes client's lazily
built models, so the kubernetes package is excluded from its patching.
"""

from __future__ import annotations

import freezegun

freezegun.configure(extend_ignore_list=["kubernetes"])
