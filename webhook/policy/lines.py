"""YAML nodes with their line numbers: where a field path stands, and keys given twice.

PyYAML's composed nodes keep the position of every value; loading them gives the document.
Errors and warnings about a policy (or a test suite) point at the line of the field they name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml


def duplicate_keys(
    node: yaml.Node | None, path: list[Any] | None = None
) -> Iterator[tuple[list[Any], int]]:
    """Every key given twice in one mapping, as (path, line). PyYAML keeps the last of two
    equal keys, so a second ``rules:`` would silently replace the first."""
    path = path or []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            name = key.value
            if name in seen:
                yield [*path, name], key.start_mark.line + 1
            seen.add(name)
            yield from duplicate_keys(value, [*path, name])
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from duplicate_keys(item, [*path, index])


class LineFinder:
    """The line of a field path in the YAML a policy was read from."""

    def __init__(self, source: str, root: yaml.Node) -> None:
        self.source = source
        self.root = root

    def line(self, path: list[Any]) -> int:
        node = self.root
        for step in path:
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if key.value == step:
                        node = value
                        break
                else:
                    break
            elif isinstance(node, yaml.SequenceNode) and isinstance(step, int):
                if step >= len(node.value):
                    break
                node = node.value[step]
            else:
                break
        return node.start_mark.line + 1

    def key_line(self, path: list[Any]) -> int:
        """The line of the key that ends ``path`` (a field written as a block starts below
        it); the line of its value where the path does not end in a written key."""
        parent = self.root
        for step in path[:-1]:
            found = self._child(parent, step)
            if found is None:
                return self.line(path)
            parent = found
        if isinstance(parent, yaml.MappingNode):
            for key, _ in parent.value:
                if key.value == path[-1]:
                    return int(key.start_mark.line) + 1
        return self.line(path)

    def has(self, path: list[Any]) -> bool:
        """Whether the document writes the field at ``path``."""
        node: yaml.Node | None = self.root
        for step in path:
            node = self._child(node, step)
            if node is None:
                return False
        return True

    @staticmethod
    def _child(node: yaml.Node | None, step: Any) -> yaml.Node | None:
        if isinstance(node, yaml.MappingNode):
            return next((value for key, value in node.value if key.value == step), None)
        if isinstance(node, yaml.SequenceNode) and isinstance(step, int):
            return node.value[step] if 0 <= step < len(node.value) else None
        return None

    def error(self, path: list[Any], message: str) -> str:
        return f"{self.source}:{self.line(path)}: {render_path(path)}: {message}"


def render_path(path: list[Any]) -> str:
    """``spec.pools[0].name``: list items by index, fields joined by dots."""
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out or "(document)"
