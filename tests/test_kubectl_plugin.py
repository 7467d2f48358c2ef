"""The package installs ``kubectl-gpu_admission`` beside ``gpu-admission`` (pyproject.toml's
scripts), so that with it on PATH ``kubectl gpu-admission ...`` runs the same commands, its
usage and help naming them as typed. Played with the real kubectl and the entry point that
``make install`` put in this venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.paths import REPO

PLUGIN = "kubectl-gpu_admission"


@pytest.fixture(scope="module")
def plugin_path() -> str:
    """PATH holding the venv's scripts and kubectl, and nothing else that could hold a
    plugin of the same name."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "these tests need kubectl: install it first"
    scripts = Path(sys.executable).parent
    assert (scripts / PLUGIN).is_file(), (
        f"{scripts / PLUGIN} is missing: `make install` installs the package's scripts"
    )
    return os.pathsep.join(dict.fromkeys([str(scripts), str(Path(kubectl).parent)]))


def kubectl(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", *args],
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_plugin_is_a_declared_script_of_the_same_commands() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[PLUGIN] == "webhook.cli.main:kubectl_plugin_main"
    assert scripts["gpu-admission"] == "webhook.cli.main:main"


def test_kubectl_plugin_list_finds_it(plugin_path: str) -> None:
    listed = kubectl(plugin_path, "plugin", "list")
    assert listed.returncode == 0, listed.stderr
    found = [Path(line.strip()).name for line in listed.stdout.splitlines()]
    assert PLUGIN in found, listed.stdout
    assert "overshadowed" not in listed.stderr + listed.stdout


def test_kubectl_gpu_admission_help_names_the_commands(plugin_path: str) -> None:
    shown = kubectl(plugin_path, "gpu-admission", "--help")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: kubectl gpu-admission [-h]"), shown.stdout
    # The same help as gpu-admission's, every command listed, only the program's name differs:
    # in the usage, and in the examples' command lines.
    direct = subprocess.run(
        [str(Path(sys.executable).parent / "gpu-admission"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    head, _, examples = shown.stdout.partition("\nexamples:\n")
    direct_head, _, direct_examples = direct.stdout.partition("\nexamples:\n")
    assert head == direct_head.replace("usage: gpu-admission ", "usage: kubectl gpu-admission ", 1)
    assert examples == direct_examples.replace(
        "  gpu-admission ", "  kubectl gpu-admission "
    ).replace("`gpu-admission ", "`kubectl gpu-admission ")
    for command in ("review", "audit", "policy", "cluster", "version"):
        assert f"\n    {command} " in shown.stdout, command


def test_a_sub_command_runs_through_kubectl(plugin_path: str) -> None:
    validated = kubectl(
        plugin_path, "gpu-admission", "policy", "validate", str(REPO / "policies" / "default.yaml")
    )
    assert validated.returncode == 0, validated.stderr
    wrong = kubectl(plugin_path, "gpu-admission", "review")
    assert wrong.returncode == 2
    assert wrong.stderr.splitlines()[0].startswith("usage: kubectl gpu-admission review "), (
        wrong.stderr
    )


@pytest.mark.parametrize("changed", ["pyproject.toml", "requirements.lock"])
def test_make_install_reinstalls_when_pyproject_or_the_lock_changes(
    tmp_path: Path, changed: str
) -> None:
    """A new script in pyproject.toml (as this one was) appears with `make install`, and a
    changed lock installs its releases: the install stamps depend on both. Dry runs (make -n)
    on a copy of the Makefile, with a venv whose stamps are newer than both, then older."""
    for name in ("Makefile", "pyproject.toml", "requirements.lock"):
        shutil.copy2(REPO / name, tmp_path / name)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    for stamp in (".installed-runtime", ".installed"):
        (venv / stamp).touch()
    sources = [tmp_path / "pyproject.toml", tmp_path / "requirements.lock"]
    stamps = [venv / ".installed-runtime", venv / ".installed"]
    for index, path in enumerate(sources + stamps):
        os.utime(path, (1_000_000 + index, 1_000_000 + index))

    def dry_run() -> str:
        done = subprocess.run(
            ["make", "-n", "install", f"VENV={venv}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "pip install" not in dry_run()
    os.utime(tmp_path / changed, (2_000_000, 2_000_000))
    commands = dry_run()
    assert f"{venv}/bin/python -m pip install --quiet --require-hashes -r requirements.lock" in (
        commands
    )
    assert f"{venv}/bin/python -m pip install --quiet -e .\n" in commands
    assert f"{venv}/bin/python -m pip install --quiet -e '.[test]'" in commands
