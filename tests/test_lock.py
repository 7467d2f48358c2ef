"""requirements.lock, which the image installs with ``--require-hashes --no-deps``, covers
pyproject.toml's runtime dependencies, is resolved for the image's Python and platforms, and
hashes every file: checked offline (tools/requirements_lock.py). A copy of pyproject.toml
changed without ``make lock`` fails the same check."""

from __future__ import annotations

import re
import tomllib

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.paths import REPO
from tools.requirements_lock import build_lock_problems, lock_problems, parse_lock

PYPROJECT = (REPO / "pyproject.toml").read_text()
LOCK = (REPO / "requirements.lock").read_text()
OURS = "gpu-admission (pyproject.toml)"
# Docker's platform names, and the machine names make lock resolves for.
MACHINES = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


def with_dependencies(edit: str, replacement: str) -> str:
    """pyproject.toml's text with one edit inside [project].dependencies."""
    assert PYPROJECT.count(edit) == 1, edit
    changed = PYPROJECT.replace(edit, replacement)
    assert (
        tomllib.loads(changed)["project"]["dependencies"]
        != tomllib.loads(PYPROJECT)["project"]["dependencies"]
    )
    return changed


def makefile_variable(name: str) -> str:
    [value] = re.findall(rf"^{name} := (.+)$", (REPO / "Makefile").read_text(), re.M)
    return value.strip()


def test_the_lock_covers_pyproject() -> None:
    assert lock_problems(PYPROJECT, LOCK) == []


def test_the_direct_requirements_are_read_from_the_via_lines() -> None:
    pins, problems = parse_lock(LOCK)
    assert problems == []
    declared = tomllib.loads(PYPROJECT)["project"]["dependencies"]
    direct = {name for name, pin in pins.items() if OURS in pin.required_by}
    assert len(direct) == len(declared)
    # One requirer on the `# via` line itself, and several on the lines under a bare `# via`.
    assert pins["flask"].required_by == [OURS]
    assert {OURS, "kubernetes"} <= set(pins["pyyaml"].required_by)
    # Names as PEP 503 normalises them (pyproject.toml says ruamel.yaml and prometheus-client).
    assert {"ruamel-yaml", "prometheus-client"} <= direct
    # Transitive requirements are pinned and hashed too: --no-deps installs nothing else.
    assert pins["greenlet"].required_by == ["gevent"] and pins["greenlet"].hashed


def test_a_dependency_added_without_make_lock_fails() -> None:
    changed = with_dependencies('  "flask>=3.0",\n', '  "flask>=3.0",\n  "Rich_Text>=13",\n')
    assert lock_problems(changed, LOCK) == [
        f"pyproject.toml requires Rich_Text>=13 but requirements.lock does not pin it as a "
        f"requirement of {OURS}: run `make lock`"
    ]


def test_a_dependency_dropped_without_make_lock_fails() -> None:
    changed = with_dependencies('  "pyyaml>=6.0",\n', "")
    [problem] = lock_problems(changed, LOCK)
    assert problem.startswith("requirements.lock pins pyyaml==")
    assert problem.endswith(f"for {OURS}, which no longer requires it: run `make lock`")


def test_a_range_narrowed_without_make_lock_fails() -> None:
    changed = with_dependencies('"gevent>=26.9,<26.10"', '"gevent>=26.10,<26.11"')
    [problem] = lock_problems(changed, LOCK)
    pinned = parse_lock(LOCK)[0]["gevent"].version
    assert problem == (
        f"requirements.lock pins gevent=={pinned}, outside pyproject.toml's "
        "gevent<26.11,>=26.10: run `make lock`"
    )


def test_a_dependency_for_another_platform_is_not_expected() -> None:
    changed = with_dependencies(
        '  "flask>=3.0",\n', '  "flask>=3.0",\n  "pywin32>=306; sys_platform == \'win32\'",\n'
    )
    assert lock_problems(changed, LOCK) == []


def test_a_pin_without_its_hashes_fails() -> None:
    pins, _ = parse_lock(LOCK)
    problems = lock_problems(PYPROJECT, strip_hashes(LOCK, "orjson"))
    assert problems == [
        f"requirements.lock:{pins['orjson'].line}: orjson=={pins['orjson'].version} has no "
        "--hash=sha256: line, which `pip install --require-hashes` refuses: run `make lock`"
    ]


def strip_hashes(lock: str, name: str) -> str:
    """The lock without the hash lines of one pin."""
    lines, dropping = [], False
    for line in lock.splitlines(keepends=True):
        if not line[0].isspace():
            dropping = line.startswith(f"{name}==")
            if dropping:
                line = line.replace(" \\", "")
        elif dropping and line.lstrip().startswith("--hash="):
            continue
        lines.append(line)
    stripped = "".join(lines)
    assert stripped != lock
    return stripped


def test_an_unpinned_requirement_fails() -> None:
    problems = lock_problems(PYPROJECT, LOCK.replace("\norjson==", "\norjson>="))
    assert any("'orjson>=" in p and "is not pinned (NAME==VERSION)" in p for p in problems)


def test_the_lock_is_for_the_image_python_and_the_released_platforms() -> None:
    images = re.findall(r"^FROM python:(\S+?)-slim\b", (REPO / "Dockerfile").read_text(), re.M)
    assert images and {makefile_variable("LOCK_PYTHON")} == set(images)
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
    [build] = [
        step
        for step in workflow["jobs"]["image"]["steps"]
        if step.get("uses", "").startswith("docker/build-push-action")
    ]
    platforms = build["with"]["platforms"].split(",")
    locked = {p.split("-")[0] for p in makefile_variable("LOCK_PLATFORMS").split()}
    assert {MACHINES[platform] for platform in platforms} == locked
    assert LOCK.startswith(
        "# This file was autogenerated by uv via the following command:\n#    make lock\n"
    )


BUILD_LOCK = (REPO / "build-requirements.lock").read_text()
BUILD_OURS = "-r build-system.in"


def test_the_build_lock_covers_the_build_system() -> None:
    assert build_lock_problems(PYPROJECT, BUILD_LOCK) == []
    pins, _ = parse_lock(BUILD_LOCK, "build-requirements.lock")
    declared = tomllib.loads(PYPROJECT)["build-system"]["requires"]
    assert {name for name, pin in pins.items() if BUILD_OURS in pin.required_by} == {
        canonicalize_name(Requirement(r).name) for r in declared
    }
    assert BUILD_LOCK.startswith(
        "# This file was autogenerated by uv via the following command:\n#    make lock\n"
    )


def test_a_build_requirement_changed_without_make_lock_fails() -> None:
    requires = '"setuptools>=77", "wheel"'
    assert PYPROJECT.count(requires) == 1
    narrowed = PYPROJECT.replace(requires, '"setuptools>=90", "wheel"')
    pinned = parse_lock(BUILD_LOCK)[0]["setuptools"].version
    assert build_lock_problems(narrowed, BUILD_LOCK) == [
        f"build-requirements.lock pins setuptools=={pinned}, outside pyproject.toml's "
        "build-system's setuptools>=90: run `make lock`"
    ]
    added = PYPROJECT.replace(requires, '"setuptools>=77", "wheel", "setuptools-scm>=8"')
    assert build_lock_problems(added, BUILD_LOCK) == [
        "pyproject.toml's build-system requires setuptools-scm>=8 but build-requirements.lock "
        f"does not pin it as a requirement of {BUILD_OURS}: run `make lock`"
    ]
