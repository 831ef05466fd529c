"""A real browser for tests: Debian's headless Chromium, rendering a local page.

- `ensure_chromium()`: the `chromium` binary, installed with `apt-get install -y chromium` when missing
  and running as root (as `prometheus_server.ensure_prometheus` installs Prometheus); otherwise the test
  fails saying how to install it.
- `Chromium.dump_dom(page)`: the DOM after the page's scripts ran, as HTML, with what the browser logged.
- `Chromium.screenshot(page, png, size)`: the page rendered to a PNG of exactly that window size.

Every run is a fresh process with a fresh profile directory, no sandbox (tests run as root), no GPU, no
first-run, sync, component-update or background traffic, and a host resolver that resolves nothing:
a page that needs the network renders without it, or shows that it does. This module must stay a test
harness: no project code imports it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.debian_packages import ensure_binaries

RUN_TIMEOUT = 90.0
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    # Offline: every host name fails to resolve, so nothing outside the page can load.
    "--host-resolver-rules=MAP * ~NOTFOUND",
    # Console messages (uncaught script errors among them) on stderr.
    "--enable-logging=stderr",
    "--v=0",
)


def ensure_chromium() -> str:
    """The path of `chromium`, installing the Debian package when it is missing."""
    (chromium,) = ensure_binaries("chromium", ("chromium",), "a real browser")
    return chromium
    if os.geteuid() != 0:
        pytest.fail(
            "these tests need a real browser: install it with `sudo apt-get install -y chromium` "
            "(Debian / Ubuntu), or run the tests as root",
            pytrace=False,
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
    found = shutil.which("chromium")
    if done.returncode != 0 or not found:
        pytest.fail(
            f"`{' '.join(install)}` failed (exit {done.returncode}):\n{done.stderr[-2000:]}", pytrace=False
        )
    return found


@dataclass(frozen=True, slots=True)
class Rendered:
    stdout: str
    stderr: str


@dataclass(frozen=True, slots=True)
class Chromium:
    binary: str

    def _run(self, page: Path, *extra: str) -> Rendered:
        with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
            argv = [self.binary, *FLAGS, f"--user-data-dir={profile}", *extra, page.resolve().as_uri()]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
        if done.returncode != 0:
            pytest.fail(f"chromium exited {done.returncode}:\n{done.stderr[-3000:]}", pytrace=False)
        return Rendered(done.stdout, done.stderr)

    def dump_dom(self, page: Path) -> Rendered:
        return self._run(page, "--dump-dom")

    def screenshot(self, page: Path, png: Path, size: tuple[int, int]) -> Rendered:
        return self._run(page, f"--window-size={size[0]},{size[1]}", f"--screenshot={png}")
