"""The user documentation as tests read it: its fenced blocks, and the kustomize overlay of
``docs/installing.md`` ("Your own policy with kustomize") laid out as a user would."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.paths import REPO

INSTALLING = REPO / "docs" / "installing.md"
# The recipe's layout: the overlay beside a checkout of this repository, commands run from the
# checkout (as every block of the guide is).
OVERLAY = "my-gpu-admission"
CHECKOUT = "gpu-admission"
OVERLAY_REF = f"../{OVERLAY}"

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


def fenced_blocks(text: str, language: str) -> list[str]:
    """The bodies of the fenced blocks of ``language`` (``""``: blocks without one), in order."""
    return [body for lang, body in FENCE.findall(text) if lang == language]


def section(text: str, heading: str) -> str:
    """A ``## `` section of a markdown text, from its heading to the next one of its level."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def overlay_kustomization() -> str:
    """The recipe's ``kustomization.yaml``, as the guide writes it."""
    (body,) = fenced_blocks(
        section(INSTALLING.read_text("utf-8"), "Your own policy with kustomize"), "yaml"
    )
    return body


def lay_out_overlay(root: Path, policy_text: str) -> Path:
    """The recipe on disk under ``root``: the repository as the checkout (a symlink) and the
    overlay beside it with ``policy_text``. Returns the overlay's directory."""
    (root / CHECKOUT).symlink_to(REPO, target_is_directory=True)
    overlay = root / OVERLAY
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(overlay_kustomization(), "utf-8")
    (overlay / "policy.yaml").write_text(policy_text, "utf-8")
    return overlay
