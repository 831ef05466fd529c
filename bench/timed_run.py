"""One command run as a child process, measured from outside: wall time, and the child's own CPU time
and peak RSS as the kernel counts them (wait4's rusage of that child alone).

Shared by the benchmarks that time whole commands (bench/startup.py, bench/scale.py, the `once` row of
bench/scale_live.py). Standard output is kept whole; standard error only to say why a command failed,
which ends the benchmark (SystemExit) with its last lines.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Timed:
    wall: float  # seconds, from start to exit
    cpu: float  # the child's user + system seconds
    peak_rss_kib: int  # the child's peak resident set (ru_maxrss, KiB on Linux)
    stdout: bytes


def run_timed(
    command: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    what: str | None = None,
    error_tail: int = 3000,
) -> Timed:
    """Run `command` to its end. Raises SystemExit naming `what` (by default the command) with the last
    `error_tail` characters of its standard error when it exits with another status than 0."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=err, cwd=cwd, env=env)
        _pid, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        if child.returncode != 0:
            err.seek(0)
            message = err.read().decode(errors="replace")[-error_tail:]
            raise SystemExit(f"{what or ' '.join(command)} failed ({child.returncode}): {message}")
        out.seek(0)
        stdout = out.read()
    return Timed(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, stdout)
