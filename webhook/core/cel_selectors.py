"""TEMPORARY STUB."""

from __future__ import annotations

import re

_EQ = re.compile(
    r"""^\s*device\.attributes\[["']gpu\.nvidia\.com["']\]\.profile\s*==\s*["']([^"']+)["']\s*$"""
)


def profiles_named(expression: str) -> tuple[str, ...] | None:
    m = _EQ.match(expression)
    return (m.group(1),) if m else None
