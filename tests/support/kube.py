"""Manifests as the cluster would receive them: rendered by ``kubectl kustomize``."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO


def kustomize_text(directory: str | Path) -> str:
    """What ``kubectl kustomize`` prints for ``directory`` (relative to the repository, or
    absolute)."""
    result = subprocess.run(
        ["kubectl", "kustomize", str(REPO / directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return result.stdout


def kustomize(directory: str | Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize`` renders from ``directory``."""
    return [doc for doc in yaml.safe_load_all(kustomize_text(directory)) if doc]
