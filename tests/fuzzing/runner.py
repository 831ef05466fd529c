"""`run_case`: the command run on a case in a forked child, under a time and an address-space limit.

Owns the result of a run (`CaseResult`: exit status or signal, whether it timed out, stdout, stderr,
wall and CPU time, peak memory, and what a message may name as its location), the child's set-up (the
case directory, stdin from /dev/null, output to files, the resource limits, a watchdog that prints where
a slow child is), waiting for the child and killing it past its time, and `warm_up`, which runs the
command once in the parent so that forked children start with what a first run builds.

This module must not judge a result: what breaks the contract is tests/fuzzing/contract.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import io
import math
import os
import resource
import select
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import rebalancer.cli
from tests.fuzzing.case import Case, argv_for, base_case, write_case
from tests.fuzzing.layout import CHILD_CRASH, DEFAULT_MEMORY, DEFAULT_TIMEOUT, SNAPSHOT_DIR, ArgvKind

# --------------------------------------------------------------------------- running a case


@dataclasses.dataclass(frozen=True)
class CaseResult:
    argv: tuple[str, ...]
    argv_kind: ArgvKind
    locations: tuple[str, ...]  # what a message may name as its <where>
    exit_code: int | None  # None when the child was killed by a signal
    signal: int | None
    timed_out: bool
    stdout: str
    stderr: str
    wall_seconds: float
    cpu_seconds: float
    max_rss_mib: float

    @property
    def outcome(self) -> str:
        if self.timed_out:
            return "timeout"
        if self.signal is not None:
            return f"signal {_signal_name(self.signal)}"
        return f"exit {self.exit_code}"


MainFn = Callable[[Sequence[str]], int]


def _main(argv: Sequence[str]) -> int:
    return rebalancer.cli.main(argv)


_warmed = False


def warm_up() -> None:
    """Run the command once in this process on the base case, so that every forked child starts with
    what a first run builds lazily (validators, compiled patterns) instead of paying for it per case."""
    global _warmed  # noqa: PLW0603 - a once-per-process switch
    if _warmed:
        return
    _warmed = True
    case = base_case()
    with tempfile.TemporaryDirectory(prefix="rebalancer-fuzz-") as tmp:
        write_case(Path(tmp), case.files)
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                for argv_kind in ("once", "once-json", "validate"):
                    rebalancer.cli.main(argv_for(case.files, argv_kind))
        finally:
            os.chdir(cwd)


def run_case(
    files: Mapping[str, bytes],
    argv_kind: ArgvKind,
    *,
    main: MainFn | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    memory_bytes: int = DEFAULT_MEMORY,
) -> CaseResult:
    """Write the case into a fresh temporary directory and run the command on it in a forked child.

    The child runs in the case directory with stdin from /dev/null and stdout / stderr redirected to
    files, under RLIMIT_AS = `memory_bytes`, a CPU limit and an alarm of `timeout` seconds; an
    exception that escapes `main` is printed as a traceback and the child exits 99. The parent kills
    a child still running after the timeout and a grace period.
    """
    if main is None:
        warm_up()
    run_main = main or _main
    with tempfile.TemporaryDirectory(prefix="rebalancer-fuzz-") as tmp:
        case_dir = Path(tmp) / "case"
        write_case(case_dir, files)
        argv = argv_for(files, argv_kind)
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        sys.stdout.flush()
        sys.stderr.flush()
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(
                run_main,
                argv,
                case_dir=case_dir,
                out=out_path,
                err=err_path,
                timeout=timeout,
                memory=memory_bytes,
            )
        status, usage, killed = _wait(pid, timeout + 10.0)
        wall = time.perf_counter() - started
        stdout = _read_output(out_path)
        stderr = _read_output(err_path)
    code = os.waitstatus_to_exitcode(status)
    sig = -code if code < 0 else None
    timed_out = killed or sig in (signal.SIGALRM, signal.SIGXCPU)
    return CaseResult(
        argv=tuple(argv),
        argv_kind=argv_kind,
        locations=_locations(files, argv, case_dir),
        exit_code=code if code >= 0 else None,
        signal=sig,
        timed_out=timed_out,
        stdout=stdout,
        stderr=stderr,
        wall_seconds=wall,
        cpu_seconds=usage.ru_utime + usage.ru_stime,
        max_rss_mib=usage.ru_maxrss / 1024,
    )


def run(case: Case, **kwargs: Any) -> CaseResult:
    return run_case(case.files, case.argv_kind, **kwargs)


def _child(
    main: MainFn, argv: list[str], *, case_dir: Path, out: Path, err: Path, timeout: float, memory: int
) -> NoReturn:
    code = CHILD_CRASH
    try:
        os.chdir(case_dir)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(os.open(out, flags, 0o600), 1)
        os.dup2(os.open(err, flags, 0o600), 2)
        # What a console script gets under a UTF-8 locale: strict stdout, backslashreplace stderr.
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="strict")
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
        )
        faulthandler.enable(file=sys.stderr)
        for sig in (signal.SIGALRM, signal.SIGINT, signal.SIGTERM, signal.SIGXCPU):
            signal.signal(sig, signal.SIG_DFL)
        cpu = math.ceil(timeout)
        # A child still running near the limit first prints where it is, then the alarm ends it.
        faulthandler.dump_traceback_later(max(timeout * 0.9, timeout - 2.0), exit=False, file=sys.stderr)
        _limit(resource.RLIMIT_CORE, 0)
        # `memory` on top of what the child inherits (the runner and this case's bytes).
        _limit(resource.RLIMIT_AS, _address_space() + memory)
        _limit(resource.RLIMIT_CPU, cpu, cpu + 2)
        signal.alarm(cpu)
        # The command gets the recursion headroom it has when started from its console script.
        sys.setrecursionlimit(_stack_depth() + 1000)
        code = main(argv)
    except SystemExit as exc:  # as the interpreter does with an uncaught SystemExit
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            _print_safely(str(exc.code))
            code = 1
    except BaseException:
        _print_safely(traceback.format_exc())
        code = CHILD_CRASH
    try:
        sys.stdout.flush()
    except BaseException:
        _print_safely(traceback.format_exc())
        code = CHILD_CRASH
    try:
        sys.stderr.flush()
    finally:
        os._exit(code if isinstance(code, int) else CHILD_CRASH)


def _address_space() -> int:
    """This process's virtual memory size in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _limit(which: int, soft: int, hard: int | None = None) -> None:
    """Lower a resource limit (never above the hard limit already in force)."""
    _, current = resource.getrlimit(which)
    wanted = soft if hard is None else hard
    if current != resource.RLIM_INFINITY:
        wanted = min(wanted, current)
        soft = min(soft, current)
    resource.setrlimit(which, (soft, wanted))


def _print_safely(text: str) -> None:
    try:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()
    except BaseException:
        os.write(2, text.encode("utf-8", "backslashreplace")[:65536])


def _stack_depth() -> int:
    depth = 0
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        depth += 1
        frame = frame.f_back
    return depth


def _wait(pid: int, deadline_seconds: float) -> tuple[int, resource.struct_rusage, bool]:
    """Wait for the child; SIGKILL it after `deadline_seconds`. (status, rusage, killed by us)."""
    end = time.monotonic() + deadline_seconds
    killed = False
    pidfd: int | None = None
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done == pid:
                return status, usage, killed
            left = end - time.monotonic()
            if left <= 0 and not killed:
                os.kill(pid, signal.SIGKILL)
                killed = True
                left = 5.0
            if pidfd is not None:
                select.select([pidfd], [], [], max(left, 0.0))
            else:
                time.sleep(min(0.005, max(left, 0.0)))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _read_output(path: Path, limit: int = 16 * 1024 * 1024) -> str:
    try:
        with path.open("rb") as handle:
            data = handle.read(limit)
    except OSError:
        return ""
    return data.decode("utf-8", "backslashreplace")


def _locations(files: Mapping[str, bytes], argv: Sequence[str], case_dir: Path) -> tuple[str, ...]:
    """What a message may start with: the snapshot directory, a file of the case, a policy named on the
    command line, or a command-line option."""
    names = {SNAPSHOT_DIR, *(k.rstrip("/") for k in files)}
    if argv and argv[0] == "validate":
        names |= set(argv[1:])
    elif "--policy" in argv:
        names.add(argv[argv.index("--policy") + 1])
    names |= {f"{case_dir}/{n}" for n in names}  # the same, made absolute
    names |= {"--snapshot", "--policy", "argument --snapshot", "argument --policy"}
    return tuple(sorted((n for n in names if n), key=len, reverse=True))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
