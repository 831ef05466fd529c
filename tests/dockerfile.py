"""Reading the Dockerfile for the tests: its instructions (continuation lines joined, comments dropped),
its build stages, ARG defaults (with `${NAME}` references resolved), USER, the last of an instruction."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def dockerfile_lines() -> list[str]:
    """Dockerfile instructions, continuation lines joined, comments dropped."""
    lines: list[str] = []
    current = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    return lines


def dockerfile_instruction(name: str) -> list[str]:
    """The arguments of the last `name` instruction, split on whitespace (JSON forms as one string)."""
    found = [line.split(None, 1)[1] for line in dockerfile_lines() if line.split(None, 1)[0].upper() == name]
    assert found, f"no {name} instruction"
    last = found[-1]
    return [last] if last.startswith("[") else last.split()


def dockerfile_args() -> dict[str, str]:
    """Every `ARG NAME=default` (the first default of each name)."""
    args: dict[str, str] = {}
    for line in dockerfile_lines():
        match = re.fullmatch(r"ARG\s+(\w+)=(\S+)", line)
        if match:
            args.setdefault(match.group(1), match.group(2))
    return args


def dockerfile_arg(name: str) -> str:
    args = dockerfile_args()
    assert name in args, f"no ARG {name}=<default>"
    return args[name]


def resolve_args(text: str) -> str:
    """`text` with every `${NAME}` / `$NAME` replaced by that ARG's default."""
    args = dockerfile_args()

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in args, f"{text}: ${name} has no ARG default"
        return args[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)


def dockerfile_user() -> int:
    (user,) = dockerfile_instruction("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and (not gid or gid.isdigit()), "USER must be numeric (runAsNonRoot checks the uid)"
    return int(uid)


def stages() -> list[list[str]]:
    """The instructions of each build stage, `FROM` first (ARGs before the first FROM are global)."""
    found: list[list[str]] = []
    for line in dockerfile_lines():
        if line.upper().startswith("FROM "):
            found.append([])
        if not found:
            assert line.startswith("ARG "), "only ARG may come before the first FROM"
            continue
        found[-1].append(line)
    return found
