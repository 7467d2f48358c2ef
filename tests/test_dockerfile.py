"""The container image recipe. No Docker engine is needed: the Dockerfile is parsed and
checked statically, and its builder stage is played here (its RUN steps as written, from
exactly the files it copies): the locked dependencies, checked against their hashes, and the
project's wheel, in a venv that must hold those and nothing else, and run."""

from __future__ import annotations

import fnmatch
import json
import os
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
from packaging.utils import canonicalize_name

from tests.support.paths import REPO
from tools.requirements_lock import parse_lock

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
LOCK = REPO / "requirements.lock"

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
        "tools/requirements_lock.py",
    ):
        assert ignored(path, patterns), f"{path} would be sent to the Docker daemon"
    assert not ignored("webhook/cli/main.py", patterns)
    assert not ignored("pyproject.toml", patterns)
    assert not ignored("requirements.lock", patterns)


# ------------------------------------------------------------ installing from the lock


def pip_commands(stage: Stage) -> list[list[str]]:
    """Every pip command of a stage's RUN steps, as words (the shell's ``&&`` chains split)."""
    commands = []
    for args in stage.all("RUN"):
        for command in re.split(r"\s*(?:&&|;)\s*", args):
            words = shlex.split(command)
            if words[:1] == ["pip"] or words[:3] == ["python", "-m", "pip"]:
                commands.append(words)
    return commands


def test_dependencies_come_from_the_lock_with_their_hashes(stages):
    [builder, *_] = stages
    installs = [words for words in pip_commands(builder) if "install" in words]
    assert installs, "the builder installs nothing with pip"
    locked = {}
    for lock in ("requirements.lock", "build-requirements.lock"):
        [locked[lock]] = [words for words in installs if lock in words]
        assert {"--require-hashes", "--no-deps", "--only-binary"} <= set(locked[lock]), lock
        assert locked[lock][locked[lock].index("-r") + 1] == lock
    # The runtime into the image's venv, the build tools into the builder's own Python.
    assert "/opt/venv/bin/python" in locked["requirements.lock"]
    assert "--python" not in locked["build-requirements.lock"]
    # Nothing else is resolved from an index: the project's wheel comes without dependencies,
    # from the wheels just built.
    for words in installs:
        assert words in locked.values() or {"--no-deps", "--no-index"} <= set(words), words
    # Built with the locked tools: build isolation would fetch the newest setuptools and wheel.
    builds = [words for words in pip_commands(builder) if "wheel" in words]
    assert builds and all({"--no-deps", "--no-build-isolation"} <= set(w) for w in builds), builds
    # pip check proves the lock holds every dependency of what was installed.
    assert any(words[-1] == "check" for words in pip_commands(builder))
    # The lock is copied on its own, first: its layer is rebuilt only when it changes.
    copies = [copy_args(args)[1] for args in builder.all("COPY")]
    assert copies[0] == ["requirements.lock", "build-requirements.lock"], copies
    for stage in stages[1:]:
        assert not any("install" in words for words in pip_commands(stage)), stage.name


@dataclass
class Built:
    """What the builder stage leaves: the venv the image copies, and the project's wheel."""

    venv: Path
    wheel: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory, stages) -> Built:
    """The builder stage played here: its build context (only what it copies, which proves the
    context is enough and nothing it needs is dockerignored), its environment, and its RUN
    steps as written, with /opt/venv and /wheels moved into a temporary folder and ``python``
    and ``pip`` those of a fresh virtualenv of the Python 3.11 running the tests, standing for
    python:3.11-slim's own (the build tools go there, not into the tests' environment).
    Installs the locked wheels from the package index, as the image build does."""
    builder = stages[0]
    root = tmp_path_factory.mktemp("builder")
    context = root / "src"
    context.mkdir()
    for source in local_copy_sources([builder]):
        for path in REPO.glob(source):
            target = context / path.relative_to(REPO)
            if path.is_dir():
                shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(path, target)
    system = root / "system-python"
    subprocess.run([sys.executable, "-m", "venv", str(system)], check=True, timeout=300)
    shims = root / "bin"
    shims.mkdir()
    for name, command in (("python", ""), ("pip", " -m pip")):
        shim = shims / name
        python = shlex.quote(str(system / "bin" / "python"))
        shim.write_text(f'#!/bin/sh\nexec {python}{command} "$@"\n')
        shim.chmod(0o755)
    environment = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}
    for args in builder.all("ENV"):
        environment.update(env_pairs(args))
    venv, wheels = root / "venv", root / "wheels"
    for args in builder.all("RUN"):
        script = args.replace("/opt/venv", str(venv)).replace("/wheels", str(wheels))
        done = subprocess.run(
            ["bash", "-euc", script],
            cwd=context,
            env=environment,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, f"RUN {args}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    [wheel] = wheels.glob("gpu_admission-*.whl")
    return Built(venv=venv, wheel=wheel)


def test_wheel_contains_package_data(built):
    names = set(zipfile.ZipFile(built.wheel).namelist())
    layers = ("policy", "core", "checks", "admission", "server", "certs", "cli")
    assert {f"webhook/{layer}/__init__.py" for layer in layers} <= names
    assert "webhook/cli/main.py" in names
    missing = [p for p in PACKAGE_DATA if p not in names]
    assert not missing, f"package data missing from the wheel: {missing}"


def test_wheel_declares_the_entrypoint_and_the_kubectl_plugin(built, final):
    command = exec_form(final.all("ENTRYPOINT")[0])[0]
    with zipfile.ZipFile(built.wheel) as archive:
        [entry_points] = [
            n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")
        ]
        text = archive.read(entry_points).decode()
    assert re.search(rf"^{re.escape(command)}\s*=\s*webhook\.cli\.main:main$", text, re.M), text
    # kubectl runs `kubectl gpu-admission ...` as the executable kubectl-gpu_admission.
    assert re.search(r"^kubectl-gpu_admission\s*=\s*webhook\.cli\.main:\w+$", text, re.M), text


def test_the_venv_holds_the_lock_and_the_wheel_and_nothing_else(built):
    """What the image holds: the locked releases and the project, nothing of the test tooling
    (which once hid an undeclared dependency of gunicorn's gevent worker)."""
    listed = subprocess.run(
        [
            str(built.venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m\n"
            "for d in m.distributions(): print(d.metadata['Name'], d.version)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {
        canonicalize_name(name): version
        for name, version in (line.split() for line in listed.stdout.splitlines())
    }
    pins, _ = parse_lock(LOCK.read_text())
    locked = {name: pin.version for name, pin in pins.items()}
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert installed == {**locked, "gpu-admission": version}


def test_the_image_venv_runs(built, tmp_path):
    """The server's modules import, the command runs, and a policy check works, with the
    runtime dependencies alone."""
    python = built.venv / "bin" / "python"
    modules = "webhook.cli.main, webhook.server.gunicorn, webhook.server.worker"
    imported = subprocess.run(
        [str(python), "-c", f"import {modules}"], capture_output=True, text=True, cwd=tmp_path
    )
    assert imported.returncode == 0, imported.stderr
    command = built.venv / "bin" / "gpu-admission"
    version = subprocess.run([str(command), "version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("gpu-admission "), version
    validated = subprocess.run(
        [str(command), "policy", "validate", str(REPO / "policies" / "default.yaml")],
        capture_output=True,
        text=True,
    )
    assert validated.returncode == 0, validated.stderr
    plugin = subprocess.run(
        [str(built.venv / "bin" / "kubectl-gpu_admission"), "--help"],
        capture_output=True,
        text=True,
    )
    assert plugin.returncode == 0, plugin.stderr
    assert plugin.stdout.startswith("usage: kubectl gpu-admission "), plugin.stdout
