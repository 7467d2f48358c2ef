"""Reading Kubernetes manifests from files for the CLI: multi-document YAML, JSON, ``kind: List``
(``kubectl get -o yaml``), Helm-rendered output. Each object keeps where it came from (file,
document number, line) and can say on which line a field path stands, for reports that point
at the offending line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
_PATH_TOKEN = re.compile(r"([^.\[\]]+)|\[([^\]]*)\]")


class DocumentError(ValueError):
    """An input that is not readable as manifests; the message names the file and document."""


@dataclass(slots=True)
class Document:
    source: str  # a file path, or "-" for standard input
    number: int  # 1-based document number within the source
    line: int  # 1-based line where the object starts
    obj: Any
    node: yaml.Node | None = field(default=None, repr=False)

    @property
    def is_kubernetes_object(self) -> bool:
        return (
            isinstance(self.obj, dict)
            and isinstance(self.obj.get("apiVersion"), str)
            and isinstance(self.obj.get("kind"), str)
        )

    def describe(self) -> str:
        if not isinstance(self.obj, dict):
            return f"{self.source} document {self.number}"
        meta = self.obj.get("metadata") or {}
        name = meta.get("name") or meta.get("generateName") or "?"
        return f"{self.obj.get('kind', '?')}/{name}"

    def line_of(self, path: str) -> int:
        """The line of a field path (``spec.containers[0].image``), or of the deepest known part."""
        node = self.node
        if node is None:
            return self.line
        line = node.start_mark.line + 1
        for match in _PATH_TOKEN.finditer(path):
            step = match.group(1) if match.group(1) is not None else match.group(2)
            if isinstance(node, yaml.MappingNode):
                node = next((v for k, v in node.value if k.value == step), None)
            elif (
                isinstance(node, yaml.SequenceNode)
                and step.isdigit()
                and int(step) < len(node.value)
            ):
                node = node.value[int(step)]
            else:
                node = None
            if node is None:
                break
            line = node.start_mark.line + 1
        return line


def read_text(source: str) -> str:
    import sys

    try:
        if source == "-":
            return sys.stdin.read()
        return Path(source).read_text("utf-8")
    except UnicodeDecodeError:
        raise DocumentError(f"{source}: not UTF-8 text") from None
    except OSError as exc:
        raise DocumentError(f"{source}: cannot read: {exc.strerror or exc}") from None


def parse(text: str, source: str) -> list[Document]:
    """Every object in the text, with ``kind: List`` expanded; errors name the document."""
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DocumentError(f"{source}: line {exc.lineno}: not valid JSON: {exc.msg}") from None
        items = data if isinstance(data, list) else [data]
        documents = [Document(source, 1, 1, item) for item in items]
    else:
        documents = []
        loader = yaml.SafeLoader(text)
        number = 0
        try:
            while loader.check_node():
                number += 1
                node = loader.get_node()
                if node is None:
                    continue
                obj = loader.construct_document(node)
                if obj is not None:
                    documents.append(Document(source, number, node.start_mark.line + 1, obj, node))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise DocumentError(
                f"{source}: document {max(number, 1)}{where}: not valid YAML: {problem}"
            ) from None
        finally:
            loader.dispose()
    return list(_expand_lists(documents))


def _expand_lists(documents: list[Document]) -> Iterator[Document]:
    for document in documents:
        obj = document.obj
        if (
            isinstance(obj, dict)
            and str(obj.get("kind", "")).endswith("List")
            and isinstance(obj.get("items"), list)
        ):
            item_nodes = _items_nodes(document.node)
            for index, item in enumerate(obj["items"]):
                node = item_nodes[index] if index < len(item_nodes) else None
                line = node.start_mark.line + 1 if node is not None else document.line
                yield Document(document.source, document.number, line, item, node)
        else:
            yield document


def _items_nodes(node: yaml.Node | None) -> list:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == "items" and isinstance(value, yaml.SequenceNode):
                return list(value.value)
    return []


def discover(paths: list[str]) -> list[str]:
    """Files to read: files as given, directories scanned recursively for YAML and JSON."""
    found: list[str] = []
    for path in paths:
        p = Path(path)
        if path != "-" and p.is_dir():
            found.extend(
                str(f)
                for f in sorted(p.rglob("*"))
                if f.is_file() and f.suffix in MANIFEST_SUFFIXES
            )
        else:
            found.append(path)
    return found
