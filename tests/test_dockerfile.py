"""The container image recipe. No Docker engine is needed: the Dockerfile is parsed and
checked statically, and the wheel it installs is built from exactly the files it copies."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.paths import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

COMPILERS = re.compile(r"\b(gcc|g\+\+|cc|clang|build-essential|python3?-dev|rustc|cargo)\b")
PACKAGE_DATA = (
    "webhook/policy/data/default.yaml",
    "webhook/policy/data/policy.schema.json",
    "webhook/policy/data/policy-test.schema.json",
)


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]


def parse_dockerfile(text: str) -> list[Stage]:
    """Instructions grouped by stage; line continuations joined, comments dropped."""
    logical, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):  # comments inside a continuation
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    assert not current, "Dockerfile ends with a line continuation"

    stages: list[Stage] = []
    for line in logical:
        instruction, _, args = line.partition(" ")
        instruction, args = instruction.upper(), args.strip()
        if instruction == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(image=words[0], name=name))
        elif instruction == "ARG" and not stages:
            continue
        else:
            assert stages, f"{instruction} before the first FROM"
            stages[-1].instructions.append((instruction, args))
    return stages


def copy_args(args: str) -> tuple[dict[str, str], list[str], str]:
    """(flags, sources, destination) of a COPY/ADD, shell or JSON form."""
    words = shlex.split(args)
    flags = {}
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        flags[key] = value
    rest = " ".join(words)
    if rest.startswith("["):
        words = json.loads(rest)
    assert len(words) >= 2, f"COPY needs a source and a destination: {args}"
    return flags, words[:-1], words[-1]


def env_pairs(args: str) -> dict[str, str]:
    words = shlex.split(args)
    if words and "=" not in words[0]:  # legacy `ENV KEY value`
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) for w in words)


def exec_form(args: str) -> list[str]:
    assert args.startswith("["), f"use the exec (JSON) form, not {args!r}"
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    """Approximation of .dockerignore matching (enough for the patterns used here)."""
    result = False
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        bare = pattern.removeprefix("**/")
        for prefix in prefixes:
            name = prefix.rsplit("/", 1)[-1]
            hit = fnmatch.fnmatchcase(prefix, pattern) or (
                pattern.startswith("**/") and fnmatch.fnmatchcase(name, bare)
            )
            if hit:
                result = not negate
                break
    return result


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final(stages) -> Stage:
    return stages[-1]


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def local_copy_sources(stages: list[Stage]) -> list[str]:
    """Sources of every COPY/ADD that reads the build context (not another stage)."""
    sources = []
    for stage in stages:
        for instruction, args in stage.instructions:
            if instruction in {"COPY", "ADD"}:
                flags, srcs, _ = copy_args(args)
                if "from" not in flags:
                    sources.extend(srcs)
    return sources


# ---------------------------------------------------------------------------- structure


def test_multi_stage_on_slim_images(stages):
    assert len(stages) >= 2
    assert stages[0].name, "name the builder stage (FROM ... AS builder)"
    for stage in stages:
        assert re.fullmatch(r"python:3\.1[1-9]-slim(-[a-z]+)?", stage.image), stage.image
    # The final stage starts from a clean image, not from the builder.
    assert stages[-1].image not in {s.name for s in stages[:-1]}


def test_copy_sources_exist_and_are_not_dockerignored(stages):
    patterns = dockerignore_patterns()
    sources = local_copy_sources(stages)
    assert sources
    for source in sources:
        assert not source.startswith(("/", "..")), f"{source} is outside the build context"
        assert list(REPO.glob(source)), f"COPY source {source} does not exist"
        assert not ignored(source, patterns), f"COPY source {source} is in .dockerignore"


def test_copy_from_refers_to_an_earlier_stage(stages):
    for index, stage in enumerate(stages):
        earlier = {s.name for s in stages[:index]}
        for args in stage.all("COPY"):
            flags, _, _ = copy_args(args)
            if "from" in flags:
                assert flags["from"] in earlier, f"COPY --from={flags['from']}"


def test_final_stage_runs_as_numeric_non_root_user(final):
    users = final.all("USER")
    assert users, "the final stage needs a USER"
    user = users[-1]
    assert re.fullmatch(r"\d+(:\d+)?", user), f"USER {user} must be numeric (uid[:gid])"
    assert all(int(part) != 0 for part in user.split(":"))
    assert user.split(":")[0] == "10001"  # manifests/base/deployment.yaml runs as 10001


def test_no_build_tools_in_final_stage(final):
    for args in final.all("RUN"):
        assert not COMPILERS.search(args), f"build tool in the final stage: RUN {args}"


def test_final_stage_environment_and_port(final):
    env = {}
    for args in final.all("ENV"):
        env.update(env_pairs(args))
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"
    assert env.get("PYTHONUNBUFFERED") == "1"
    assert "8443" in " ".join(final.all("EXPOSE")).split()


def test_entrypoint_is_a_declared_console_script(final, pyproject):
    [entrypoint] = final.all("ENTRYPOINT")
    command = exec_form(entrypoint)
    assert command[0] in pyproject["project"]["scripts"], command
    [cmd] = final.all("CMD")
    assert exec_form(cmd) == ["serve"]


def test_dockerignore_keeps_secrets_and_clutter_out():
    patterns = dockerignore_patterns()
    for path in (
        ".git/config",
        ".venv/bin/python",
        "certs/tls.key",
        "certs/ca.crt",
        "some/dir/server.key",
        "webhook/cli/__pycache__/main.cpython-311.pyc",
        ".pytest_cache/v",
        ".ruff_cache/x",
        "tests/test_dockerfile.py",
    ):
        assert ignored(path, patterns), f"{path} would be sent to the Docker daemon"
    assert not ignored("webhook/cli/main.py", patterns)
    assert not ignored("pyproject.toml", patterns)


# ---------------------------------------------------------------------------- the wheel


def _build_isolation_needed() -> bool:
    """--no-build-isolation only works if this environment has the build backend."""
    try:
        setuptools = tuple(int(p) for p in importlib.metadata.version("setuptools").split(".")[:2])
    except importlib.metadata.PackageNotFoundError:
        return True
    if setuptools < (68, 0):  # pyproject.toml requires setuptools>=68
        return True
    if setuptools >= (70, 1):  # bdist_wheel is built in from 70.1
        return False
    try:
        importlib.metadata.version("wheel")
    except importlib.metadata.PackageNotFoundError:
        return True
    return False


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, stages) -> Path:
    # Build from a copy holding only what the Dockerfile copies into the builder: this also
    # proves the build context is enough (nothing the wheel needs is missed or ignored).
    src = tmp_path_factory.mktemp("context")
    for source in local_copy_sources(stages[:1]):
        for path in REPO.glob(source):
            target = src / path.relative_to(REPO)
            if path.is_dir():
                shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(path, target)
    out = tmp_path_factory.mktemp("wheels")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out)]
    if not _build_isolation_needed():
        command.append("--no-build-isolation")
    result = subprocess.run(
        [*command, str(src)], capture_output=True, text=True, check=False, timeout=600
    )
    assert result.returncode == 0, f"wheel build failed:\n{result.stdout}\n{result.stderr}"
    [built] = out.glob("gpu_admission-*.whl")
    return built


def test_wheel_contains_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    layers = ("policy", "core", "checks", "admission", "server", "certs", "cli")
    assert {f"webhook/{layer}/__init__.py" for layer in layers} <= names
    assert "webhook/cli/main.py" in names
    missing = [p for p in PACKAGE_DATA if p not in names]
    assert not missing, f"package data missing from the wheel: {missing}"


def test_wheel_declares_the_entrypoint_script(wheel, final):
    command = exec_form(final.all("ENTRYPOINT")[0])[0]
    with zipfile.ZipFile(wheel) as archive:
        [entry_points] = [
            n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")
        ]
        text = archive.read(entry_points).decode()
    assert re.search(rf"^{re.escape(command)}\s*=\s*webhook\.cli\.main:main$", text, re.M), text


def test_the_wheel_runs_with_its_runtime_dependencies_alone(wheel, tmp_path):
    """What the image holds: the wheel and what it declares, nothing of the test tooling (which
    once hid an undeclared dependency of gunicorn's gevent worker). The server's modules
    import, the command runs, and a policy check works."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    modules = "webhook.cli.main, webhook.server.gunicorn, webhook.server.worker"
    imported = subprocess.run(
        [str(python), "-c", f"import {modules}"], capture_output=True, text=True, cwd=tmp_path
    )
    assert imported.returncode == 0, imported.stderr
    command = venv / "bin" / "gpu-admission"
    version = subprocess.run([str(command), "version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("gpu-admission "), version
    validated = subprocess.run(
        [str(command), "policy", "validate", str(REPO / "policies" / "default.yaml")],
        capture_output=True,
        text=True,
    )
    assert validated.returncode == 0, validated.stderr
