"""The locked install: `requirements.lock` pins every dependency that pyproject.toml names (all
extras), each pin satisfies pyproject's specifier, and `make install` installs through it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)\s*(?:;\s*([^#]+?))?\s*(?:#.*)?$")


def lock_pins() -> dict[str, list[tuple[Version, str | None]]]:
    """name -> [(version, marker or None)]: a universal lock may pin one name per platform."""
    pins: dict[str, list[tuple[Version, str | None]]] = {}
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = PIN.match(line.strip())
        assert match, f"requirements.lock: not an exact pin: {line!r}"
        name, version, marker = match.groups()
        pins.setdefault(canonicalize_name(name), []).append((Version(version), marker))
    return pins


def pyproject_requirements() -> list[tuple[str, Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    found = [("dependencies", Requirement(text)) for text in project["dependencies"]]
    for extra, items in project.get("optional-dependencies", {}).items():
        found += [(f"[{extra}]", Requirement(text)) for text in items]
    return found


def test_lock_pins_every_pyproject_dependency_within_its_specifier():
    pins = lock_pins()
    own = canonicalize_name(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"])
    problems = []
    for where, requirement in pyproject_requirements():
        name = canonicalize_name(requirement.name)
        if name == own:  # `searchsmith[deploy]` inside another extra: this project itself
            continue
        if name not in pins:
            problems.append(f"{where} {requirement}: not in requirements.lock (run `make lock`)")
            continue
        for version, _ in pins[name]:
            if not requirement.specifier.contains(version, prereleases=True):
                problems.append(f"{where} {requirement}: locked at {version}, outside the specifier (run `make lock`)")
    assert not problems, "\n".join(problems)


def test_lock_is_exact_and_single_per_platform():
    for name, versions in lock_pins().items():
        unmarked = [version for version, marker in versions if marker is None]
        assert len(unmarked) <= 1, f"{name} pinned twice without markers: {versions}"


def test_lock_pins_torch_to_the_cpu_wheel_the_makefile_installs():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    torch_cpu = re.search(r"^TORCH_CPU := (\S+)$", makefile, re.M).group(1)
    assert [str(version) for version, _ in lock_pins()["torch"]] == [torch_cpu]


def test_make_install_installs_through_the_lock():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("$(STAMP):", 1)[1].split("\n\n", 1)[0]
    assert "$(LOCK)" in recipe.splitlines()[0], "the install stamp must depend on the lock"
    installs = [line for line in recipe.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    for line in installs:
        assert "-c $(LOCK)" in line or "==" in line, f"an install outside the lock: {line.strip()}"
    assert re.search(r"^LOCK := requirements\.lock$", makefile, re.M)
    assert re.search(r"^lock:", makefile, re.M), "the documented command that regenerates the lock"


def test_production_instance_packages_are_locked_with_the_dagster_they_need():
    """dagster-postgres and dagster-aws pin dagster exactly: the lock must hold one consistent set."""
    pins = lock_pins()
    dagster = pins["dagster"][0][0]
    for library in ("dagster-postgres", "dagster-aws", "dagster-k8s"):
        (version, _), = pins[library]
        # dagster 1.X.Y goes with its libraries 0.(X+16).Y
        assert (version.minor, version.micro) == (dagster.minor + 16, dagster.micro), (library, version, dagster)
