"""`violations`: what in a run's result breaks the command line's input contract; `signature`: a short
key that groups the results of one bug.

Owns the violation kinds and their order of importance, the checks of the exit code and of every
stderr line (prefixed, located in a file of the case, not overlong, no traceback), of the JSON report,
the summary of a traceback or a faulthandler dump, and `describe`, the failure message of a test.

This module must not run anything: it reads a `CaseResult` only (tests/fuzzing/runner.py makes them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from tests.fuzzing.case import Case
from tests.fuzzing.layout import CHILD_CRASH, ERROR_PREFIX, MAX_LINE, WARNING_PREFIX
from tests.fuzzing.runner import CaseResult, _signal_name

# --------------------------------------------------------------------------- the contract

# Violation kinds, most important first; a case's signature is that of its most important violation.
VIOLATION_ORDER = (
    "timeout",
    "signal",
    "memory",
    "traceback",
    "exit-code",
    "empty-stderr",
    "unprefixed-line",
    "unlocated-line",
    "overlong-line",
    "stderr-on-success",
    "invalid-json-report",
)

_TRACEBACK = "Traceback (most recent call last):"
_SLOW = re.compile(r"^Timeout \(\d+:\d\d:\d\d(?:\.\d+)?\)!$", re.MULTILINE)  # faulthandler's watchdog
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')


def violations(result: CaseResult) -> list[str]:
    """Every way `result` breaks the contract, each `<kind>: <detail>` (empty: it holds)."""
    found: list[str] = []
    # Lines as a terminal shows them (str.splitlines would also break at \x1c-\x1e, \x85, \u2028...).
    lines = result.stderr.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    if result.timed_out:
        found.append(f"timeout: no exit within the time limit{_fault_frame(result.stderr)}")
    elif _SLOW.search(result.stderr):
        # Finished, but only after the watchdog printed where it was at 90% of the limit.
        return [f"timeout: close to the time limit ({result.wall_seconds:.1f}s){_fault_frame(result.stderr)}"]
    elif result.signal is not None:
        found.append(f"signal: killed by {_signal_name(result.signal)}{_fault_frame(result.stderr)}")
    crash = traceback_summary(result.stderr)
    if crash is not None:
        found.append(f"{'memory' if crash.startswith('MemoryError') else 'traceback'}: {crash}")
    if result.exit_code is not None and result.exit_code not in (0, 2) and result.exit_code != CHILD_CRASH:
        first = _cut(lines[-1], 160) if lines else "no message"
        found.append(f"exit-code: exit {result.exit_code} ({first})")
    elif result.exit_code == CHILD_CRASH and crash is None:
        found.append("exit-code: exit 99 without a traceback")
    if result.exit_code == 2 and crash is None:
        if not any(line.strip() for line in lines):
            found.append("empty-stderr: exit 2 without a message")
        for line in lines:
            found.extend(_line_problems(line, result.locations))
    elif result.exit_code == 0 and crash is None:
        noise = [line for line in lines if line.strip() and not line.startswith(WARNING_PREFIX)]
        if noise:
            found.append(f"stderr-on-success: {_cut(noise[0], 160)}")
        if result.argv_kind == "once-json":
            problem = _json_problem(result.stdout)
            if problem is not None:
                found.append(f"invalid-json-report: {problem}")
    long_lines = [line for line in lines if len(line) > MAX_LINE]
    if long_lines and result.exit_code != 2:
        found.append(f"overlong-line: {len(long_lines[0])} characters: {_cut(long_lines[0], 120)}")
    return found


def _line_problems(line: str, locations: Sequence[str]) -> list[str]:
    problems: list[str] = []
    if len(line) > MAX_LINE:
        problems.append(f"overlong-line: {len(line)} characters: {_cut(line, 120)}")
    if not line.startswith(ERROR_PREFIX):
        if line.strip():
            problems.append(f"unprefixed-line: {_cut(line, 160)}")
        return problems
    rest = line[len(ERROR_PREFIX) :]
    if not _located(rest, locations):
        problems.append(f"unlocated-line: {_cut(line, 160)}")
    return problems


def _located(rest: str, locations: Sequence[str]) -> bool:
    """Whether a message starts with a location of the case followed by `:` or ` ` and has a <what>."""
    for where in locations:
        if rest.startswith(where) and len(rest) > len(where) and rest[len(where)] in ": (":
            what = rest[len(where) :]
            if ": " in what and what.split(": ", 1)[1].strip():
                return True
    return False


def _json_problem(stdout: str) -> str | None:
    def refuse(token: str) -> float:
        raise ValueError(f"non-standard JSON token {token}")

    try:
        json.loads(stdout, parse_constant=refuse)
    except ValueError as exc:
        return _cut(str(exc), 160)
    return None


def traceback_summary(stderr: str) -> str | None:
    """`<ExceptionType>: <message head> at <innermost project frame>` of the last traceback, if any."""
    start = stderr.rfind(_TRACEBACK)
    if start == -1:
        return None
    block = stderr[start:].splitlines()[1:]
    frames = [m for m in (_FRAME.match(line) for line in block) if m is not None]
    tail = [line for line in block if line and not line.startswith(" ")]
    exception = tail[-1] if tail else "unknown exception"
    where = ""
    own = [m for m in frames if _project_file(m["file"]) is not None]
    if own:
        last = own[-1]
        where = f" at {_project_file(last['file'])}:{last['line']} in {last['func']}"
    if frames and (not own or frames[-1] is not own[-1]):
        inner = frames[-1]
        where += f" (raised in {_short_file(inner['file'])} {inner['func']})"
    return f"{_cut(exception, 200)}{where}"


def _project_file(path: str) -> str | None:
    parts = Path(path).parts
    for top in ("rebalancer", "strategies"):
        if top in parts:
            index = len(parts) - 1 - parts[::-1].index(top)
            if "site-packages" not in parts[:index]:
                return "/".join(parts[index:])
    return None


def _short_file(path: str) -> str:
    parts = Path(path).parts
    if "site-packages" in parts:
        return "/".join(parts[parts.index("site-packages") + 1 :])
    return "/".join(parts[-2:])


def _fault_frame(stderr: str) -> str:
    """The innermost project frame of a faulthandler dump, when the child crashed in C."""
    frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', stderr)
    own = [(f, ln, fn) for f, ln, fn in frames if _project_file(f) is not None]
    if not own:
        return ""
    # faulthandler prints the innermost frame first
    file, line, func = own[0]
    return f" at {_project_file(file)}:{line} in {func}"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _normalise(text: str) -> str:
    """Case-specific parts of a message (values, numbers, names) replaced, to group one bug's messages."""
    text = re.sub(r"(.{1,16}?)\1{3,}", "…", text)  # a value repeated thousands of times
    text = re.sub(r"\S{40,}", "…", text)
    text = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "'…'", text)
    text = re.sub(r"\bsnapshot/\S+?(?=[: ]|$)", "FILE", text)
    text = re.sub(r"\b(?:policy|policy-\d+)\.ya?ml\b", "FILE", text)
    text = re.sub(r"\d+", "N", text)
    text = re.sub(r"\[N\]", "[]", text)
    return text


def signature(found: Sequence[str]) -> str:
    """A short key naming the bug behind a case's violations (its most important one)."""
    if not found:
        return ""
    rank = {kind: index for index, kind in enumerate(VIOLATION_ORDER)}
    top = min(found, key=lambda v: rank.get(v.split(":", 1)[0], len(rank)))
    kind, _, detail = top.partition(": ")
    if kind in ("traceback", "memory"):
        exception, _, where = detail.partition(" at ")
        exc_type, _, message = exception.partition(":")
        where = re.sub(r":\d+ in ", ":", where.split(" (raised in ")[0])
        return f"{kind}: {exc_type} {_normalise(message.strip())[:32]} @ {where or '?'}"
    if kind in ("unlocated-line", "unprefixed-line", "overlong-line", "stderr-on-success"):
        detail = detail.removeprefix(ERROR_PREFIX)
        if kind == "overlong-line":
            detail = detail.split(": ", 1)[-1].removeprefix(ERROR_PREFIX)
        return f"{kind}: {_normalise(detail)[:60]}"
    return f"{kind}: {_normalise(detail)[:80]}"


def describe(case: Case, result: CaseResult, found: Sequence[str]) -> str:
    """A failure message: what was run on what, what came back, what is wrong with it."""
    err = result.stderr.splitlines()
    shown = "\n".join("    " + _cut(line, 300) for line in err[-25:]) or "    (empty)"
    return (
        f"{case!r}\n  command: rebalancer {' '.join(result.argv)}\n  outcome: {result.outcome} in "
        f"{result.wall_seconds:.2f}s\n  violations:\n"
        + "\n".join(f"    - {v}" for v in found)
        + f"\n  stderr (last {min(len(err), 25)} lines):\n{shown}"
    )
