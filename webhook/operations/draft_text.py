"""How ``policy init --from-cluster`` writes YAML text from cluster data: scalars that read back
as the strings they were, flow lists, wrapped comments."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterable

import yaml

WIDTH = 99
# A scalar that may be written plain: the characters of label keys and values (the API server's
# syntax, less its leading "-", "_", "."), none of them YAML syntax. Among them, those a YAML 1.2
# reader takes for a number (PyYAML, YAML 1.1, does not: "1e3") are quoted too.
_PLAIN = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_./]*\Z")
_NUMBER_LIKE = re.compile(r"[0-9][0-9_]*(\.[0-9_]*)?([eE][-+]?[0-9]+)?\Z|0[xXoObB][0-9a-fA-F_]+\Z")


def yaml_scalar(value: str) -> str:
    """A YAML scalar that loads back as the string ``value``, whatever the cluster wrote: plain
    where every YAML reader takes the plain form for that string, double-quoted (JSON's
    escapes, which YAML reads alike) where it would be read as something else (``true``,
    ``yes``, ``on``, ``null``, ``~``, ``1``, ``1.0``, ``1e3``, ``0x1``, a date) or as YAML
    syntax (``*x``, ``a: b``, a leading ``-`` or ``#``)."""
    if _PLAIN.match(value) and not _NUMBER_LIKE.match(value) and yaml.safe_load(value) == value:
        return value
    return json.dumps(value)


def comment(text: str, indent: int) -> str:
    prefix = " " * indent + "# "
    return "".join(
        line + "\n"
        for paragraph in text.rstrip("\n").split("\n")
        for line in textwrap.wrap(
            paragraph,
            WIDTH,
            initial_indent=prefix,
            subsequent_indent=prefix,
            break_on_hyphens=False,
        )
        or [prefix.rstrip()]
    )


def flow(items: Iterable[str]) -> str:
    return "[" + ", ".join(yaml_scalar(i) for i in items) + "]"
