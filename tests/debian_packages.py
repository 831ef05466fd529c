"""The suite's own programs from Debian's packages (Prometheus, Chromium): found on PATH, or installed.

`ensure_binaries(package, names, why)` returns the paths of the named binaries, installing `package`
with `apt-get install -y --no-install-recommends` (after an `apt-get update` when the first attempt
fails) when one is missing and the tests run as root; otherwise the test fails saying how to install
it. This module must stay a test harness: no project code imports it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def ensure_binaries(package: str, names: tuple[str, ...], why: str) -> tuple[str, ...]:
    """Paths of `names`, installing the Debian `package` that provides them when one is missing."""
    found = tuple(shutil.which(name) for name in names)
    if all(found):
        return tuple(str(path) for path in found)
    if os.geteuid() != 0:
        pytest.fail(
            f"these tests need {why}: install it with `sudo apt-get install -y {package}` "
            f"(Debian / Ubuntu; it provides {', '.join(f'`{name}`' for name in names)}), "
            "or run the tests as root",
            pytrace=False,
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", package]
    done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
    found = tuple(shutil.which(name) for name in names)
    if done.returncode != 0 or not all(found):
        pytest.fail(
            f"`{' '.join(install)}` failed (exit {done.returncode}):\n{done.stderr[-2000:]}", pytrace=False
        )
    return tuple(str(path) for path in found)
