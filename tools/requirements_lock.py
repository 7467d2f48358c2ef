"""Does ``requirements.lock`` still cover ``pyproject.toml``? Offline, from the two texts alone.

``make lock`` writes the lock (``uv pip compile --generate-hashes``): every requirement pinned
with ``==``, followed by the sha256 of each file of that release and a ``# via`` annotation
naming what requires it; the project's own runtime dependencies say ``# via gpu-admission
(pyproject.toml)``. The image installs the lock with ``--require-hashes --no-deps``, so a
dependency added to pyproject.toml without ``make lock`` would be missing from the image, and a
range narrowed without it would ship a version outside the range. :func:`lock_problems` finds
both, and a lock line without a hash, by comparing the lock's direct requirements (its ``# via``
lines) with ``[project].dependencies``, names normalised as PEP 503 does.
``tests/test_lock.py`` runs it in ``make test``.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

# The environment the lock is resolved for (Makefile's LOCK_PYTHON and LOCK_PLATFORMS, the
# Dockerfile's python:3.11-slim): a dependency whose marker excludes it is not expected there.
# Both platforms resolve alike (make lock checks), so one of them stands for the two here.
LOCK_ENVIRONMENT = {
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "os_name": "posix",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
}
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}\b")


@dataclass
class Pin:
    """One locked requirement: its version, whether a hash follows it, what requires it."""

    name: str
    version: str
    line: int
    hashed: bool = False
    required_by: list[str] = field(default_factory=list)


def parse_lock(text: str, name: str = "requirements.lock") -> tuple[dict[str, Pin], list[str]]:
    """The pins of a lock by normalised name, and the lines that are no pin where one belongs
    (an unpinned requirement, an option the image's install would not expect)."""
    pins: dict[str, Pin] = {}
    problems: list[str] = []
    current: Pin | None = None
    in_via = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if not raw[0].isspace() and not line.startswith("#"):
            match = PIN.match(line)
            if match is None:
                problems.append(f"{name}:{number}: {line!r} is not pinned (NAME==VERSION)")
                current = None
                continue
            pinned = canonicalize_name(match["name"])
            if pinned in pins:
                problems.append(f"{name}:{number}: {pinned} is pinned twice")
            current = pins[pinned] = Pin(pinned, match["version"], number)
            current.hashed = bool(HASH.search(line))
            in_via = False
        elif current is None:
            continue  # the header's comments
        elif line.startswith("--hash="):
            current.hashed = current.hashed or bool(HASH.search(line))
        elif line.startswith("# via"):
            rest = line.removeprefix("# via").strip()
            in_via = not rest  # "# via" alone: one requirer per following "#   X" line
            if rest:
                current.required_by.append(rest)
        elif in_via and line.startswith("#"):
            current.required_by.append(line.lstrip("#").strip())
        else:
            in_via = False
    return pins, problems


def lock_problems(pyproject_text: str, lock_text: str) -> list[str]:
    """What keeps the lock from installing exactly pyproject.toml's runtime dependencies, each
    with its fix; empty when it covers them."""
    project = tomllib.loads(pyproject_text)["project"]
    return _coverage_problems(
        project.get("dependencies", []),
        lock_text,
        LockedSource("requirements.lock", f"{project['name']} (pyproject.toml)", "pyproject.toml"),
    )


def build_lock_problems(pyproject_text: str, lock_text: str) -> list[str]:
    """The same for build-requirements.lock and ``[build-system].requires``: the tools that
    build the project's own wheel in the image (``pip wheel --no-build-isolation``), which
    would otherwise be the newest releases the index has on the day of the build."""
    return _coverage_problems(
        tomllib.loads(pyproject_text)["build-system"]["requires"],
        lock_text,
        LockedSource(
            "build-requirements.lock", f"-r {BUILD_REQUIREMENTS}", "pyproject.toml's build-system"
        ),
    )


# The file `make lock` writes [build-system].requires to, for uv to resolve: the build lock's
# `# via` lines name it.
BUILD_REQUIREMENTS = "build-system.in"


@dataclass(frozen=True)
class LockedSource:
    """A lock file, the requirer its `# via` lines give the declared requirements, and where
    they are declared (for the messages)."""

    lock: str
    requirer: str
    declared_in: str


def _coverage_problems(declared: list[str], lock_text: str, source: LockedSource) -> list[str]:
    lock, ours = source.lock, source.requirer
    pins, problems = parse_lock(lock_text, lock)
    wanted = {
        canonicalize_name(requirement.name): requirement
        for requirement in map(Requirement, declared)
        if requirement.marker is None or requirement.marker.evaluate(LOCK_ENVIRONMENT)
    }
    direct = {name for name, pin in pins.items() if ours in pin.required_by}
    for name in sorted(wanted.keys() - direct):
        problems.append(
            f"{source.declared_in} requires {wanted[name]} but {lock} does not pin it "
            f"as a requirement of {ours}: run `make lock`"
        )
    for name in sorted(direct - wanted.keys()):
        problems.append(
            f"{lock} pins {name}=={pins[name].version} for {ours}, which no longer "
            "requires it: run `make lock`"
        )
    for name in sorted(wanted.keys() & direct):
        specifier, pinned = wanted[name].specifier, pins[name].version
        if not specifier.contains(Version(pinned), prereleases=True):
            problems.append(
                f"{lock} pins {name}=={pinned}, outside {source.declared_in}'s "
                f"{wanted[name]}: run `make lock`"
            )
    for pin in sorted(pins.values(), key=lambda pin: pin.line):
        if not pin.hashed:
            problems.append(
                f"{lock}:{pin.line}: {pin.name}=={pin.version} has no "
                "--hash=sha256: line, which `pip install --require-hashes` refuses: run `make lock`"
            )
        if not pin.required_by:
            problems.append(
                f"{lock}:{pin.line}: {pin.name}=={pin.version} has no `# via` line "
                "saying what requires it: run `make lock`"
            )
    return problems
