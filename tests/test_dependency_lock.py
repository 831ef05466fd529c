"""requirements/ (the lock files) against pyproject.toml, so the lock cannot drift silently.

- every dependency of pyproject.toml (runtime, the test and dev extras, the build backend) is pinned in
  the lock file that installs it, at a version its specifier accepts;
- every pin carries hashes, nothing is a URL, a path or an editable, and no index or machine path is
  written in (the files work with any index);
- the runtime pins are the same in the dev lock (CI tests what the image runs);
- the Makefile installs the venv from the lock with `--require-hashes`, then the project on its own:
  `make demo` the runtime lock only, `make test` the dev lock;
- the license is an SPDX expression (PEP 639), so installing warns about nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "requirements"
PROJECT = "gpu-rebalancer"

_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s\\;]+)")


def pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)


def requirements(*groups: str) -> list[Requirement]:
    """The requirements of pyproject.toml: "runtime", an extra's name, or "build" (the build backend)."""
    data = pyproject()
    project = data["project"]
    assert isinstance(project, dict)
    found: list[str] = []
    for group in groups:
        if group == "runtime":
            found += project["dependencies"]
        elif group == "build":
            build = data["build-system"]
            assert isinstance(build, dict)
            found += build["requires"]
        else:
            found += project["optional-dependencies"][group]
    return [r for r in map(Requirement, found) if canonicalize_name(r.name) != PROJECT]


def lock(name: str) -> dict[str, Version]:
    """Package -> pinned version of one lock file; asserts every pin is hashed and nothing is unpinned."""
    path = LOCKS / name
    pins: dict[str, Version] = {}
    current: str | None = None
    hashes: dict[str, int] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"requirements/{name}:{number}"
        if line.startswith("--hash=sha256:"):
            assert current is not None, f"{where}: a hash outside a requirement"
            hashes[current] += 1
            continue
        assert not line.startswith("-"), f"{where}: options ({line}) make the lock depend on one index"
        match = _PIN.match(line)
        assert match, f"{where}: not an exact pin: {line}"
        current = canonicalize_name(match["name"])
        assert current not in pins, f"{where}: {current} pinned twice"
        pins[current] = Version(match["version"])
        hashes[current] = 0
    unhashed = sorted(n for n, count in hashes.items() if count == 0)
    assert not unhashed, f"requirements/{name}: pinned without a hash: {unhashed}"
    return pins


def _check(requirements_: list[Requirement], pins: dict[str, Version], lock_name: str) -> None:
    for requirement in requirements_:
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} (pyproject.toml) is not pinned in requirements/{lock_name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements/{lock_name} pins {name}=={pins[name]}, outside {requirement} (pyproject.toml):"
            " run `make lock`"
        )


def test_the_runtime_lock_pins_every_runtime_dependency() -> None:
    _check(requirements("runtime"), lock("runtime.txt"), "runtime.txt")


def test_the_dev_lock_pins_every_dependency_ci_installs() -> None:
    _check(requirements("runtime", "test", "dev", "build"), lock("dev.txt"), "dev.txt")


def test_the_build_lock_pins_the_build_backend() -> None:
    _check(requirements("build"), lock("build.txt"), "build.txt")


def test_ci_tests_the_versions_the_image_runs() -> None:
    dev, runtime, build = lock("dev.txt"), lock("runtime.txt"), lock("build.txt")
    for locked in (runtime, build):
        differ = {n: (v, dev.get(n)) for n, v in locked.items() if dev.get(n) != v}
        assert not differ, f"pinned differently in requirements/dev.txt: {differ}"


@pytest.mark.parametrize("name", ["runtime.txt", "build.txt", "dev.txt"])
def test_each_lock_says_how_to_regenerate_it_and_names_no_machine(name: str) -> None:
    text = (LOCKS / name).read_text(encoding="utf-8")
    assert "#    make lock\n" in text
    assert not re.search(r"file://|--index-url|--extra-index-url|--find-links", text)


def test_the_checker_catches_drift(tmp_path: Path) -> None:
    """The checks above can fail: an old pin, or a dependency missing from the lock."""
    pins = lock("runtime.txt")
    with pytest.raises(AssertionError, match="outside"):
        _check([Requirement("requests>=2.32.4")], {**pins, "requests": Version("2.31.0")}, "runtime.txt")
    with pytest.raises(AssertionError, match="not pinned"):
        _check([Requirement("left-pad>=1")], pins, "runtime.txt")


def _make_dry_run(target: str, tmp_path: Path) -> list[str]:
    """The pip commands `make target` runs on a machine without the venv (`make -n`, nothing run)."""
    venv = tmp_path / "venv"
    make = shutil.which("make")
    assert make is not None
    done = subprocess.run(
        [make, "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [
        line.replace(str(venv), "VENV").strip() for line in done.stdout.splitlines() if "pip install" in line
    ]


def test_make_test_installs_the_dev_lock_with_hashes_then_the_project_alone(tmp_path: Path) -> None:
    assert _make_dry_run("unit", tmp_path) == [
        "VENV/bin/pip install --quiet --require-hashes -r requirements/dev.txt",
        "VENV/bin/pip install --quiet --no-deps --no-build-isolation -e .",
    ]


def test_make_demo_installs_only_the_runtime_and_build_locks(tmp_path: Path) -> None:
    """The demo's light install: no test or lint tool, every file still checked against its hash."""
    assert _make_dry_run("demo", tmp_path) == [
        "VENV/bin/pip install --quiet --require-hashes -r requirements/runtime.txt -r requirements/build.txt",
        "VENV/bin/pip install --quiet --no-deps --no-build-isolation .",
    ]
    dev_only = set(lock("dev.txt")) - set(lock("runtime.txt")) - set(lock("build.txt"))
    assert {"pytest", "mypy", "ruff"} <= dev_only


def test_the_venv_is_rebuilt_when_a_lock_changes() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    rules = {line.split(":", 1)[0]: line for line in makefile.splitlines() if line.startswith("$(")}
    assert "$(LOCK_DIR)/dev.txt" in rules["$(STAMP)"]
    assert {"$(LOCK_DIR)/runtime.txt", "$(LOCK_DIR)/build.txt"} <= set(rules["$(RUNTIME_STAMP)"].split())
    assert "\nlock:" in makefile


def test_the_license_is_an_spdx_expression() -> None:
    """PEP 639's form: setuptools warns about the old `{text = ...}` table on every install."""
    license_field = pyproject()["project"]["license"]  # type: ignore[index]
    assert license_field == "Apache-2.0"
