"""Reading Kubernetes manifests from files: multi-document YAML, JSON, ``kind: List``
(``kubectl get -o yaml``), Helm-rendered output. Each object keeps where it came from (file,
document number, line) and can say on which line a field path stands, for reports that point
at the offending line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from webhook.policy.files import unreadable_file

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
_PATH_TOKEN = re.compile(r"([^.\[\]]+)|\[([^\]]*)\]")


class DocumentError(ValueError):
    """An input that is not readable as manifests; the message names the file and document.
    ``readable`` are the documents before the one that is not (a YAML stream cannot be read
    past a broken document)."""

    def __init__(self, message: str, readable: list[Document] | None = None) -> None:
        super().__init__(message)
        self.readable = readable or []


@dataclass(slots=True)
class Document:
    source: str  # a file path, or "-" for standard input
    number: int  # 1-based document number within the source
    line: int  # 1-based line where the object starts
    obj: Any
    node: yaml.Node | None = field(default=None, repr=False)

    @property
    def where(self) -> str:
        """``file document N (line L)``: a List's items share their document's number."""
        return f"{self.source} document {self.number} (line {self.line})"

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
        # Malformed input (``metadata: [a]``) is still named, so its report can be read.
        meta = self.obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
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


def read_text(source: str, stdin: str | None = None) -> str:
    """The text of a file; ``-`` is ``stdin``, standard input as the caller read it."""
    if source == "-":
        if stdin is None:
            raise DocumentError("-: standard input was not given")
        return stdin
    try:
        return Path(source).read_text("utf-8")
    except UnicodeDecodeError:
        raise DocumentError(f"{source}: not UTF-8 text") from None
    except OSError as exc:
        raise DocumentError(unreadable_file(source, exc)) from None


def parse(text: str, source: str) -> list[Document]:
    """Every object in the text, with ``kind: List`` expanded; errors name the document."""
    if text.lstrip().startswith(("{", "[")):
        try:
            documents = _parse_json(text, source)
        except DocumentError as json_error:
            # YAML in flow style (``{apiVersion: v1, kind: Pod, ...}``) starts the same way.
            try:
                documents = _parse_yaml(text, source)
            except DocumentError:
                raise json_error from None
    else:
        try:
            documents = _parse_yaml(text, source)
        except DocumentError as exc:
            exc.readable = list(_expand_lists(exc.readable))
            raise
    return list(_expand_lists(documents))


def _parse_yaml(text: str, source: str) -> list[Document]:
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
            f"{source}: document {max(number, 1)}{where}: not valid YAML: {problem}", documents
        ) from None
    finally:
        loader.dispose()
    return documents


def _parse_json(text: str, source: str) -> list[Document]:
    """A JSON object or array, its values as JSON reads them and its lines from YAML nodes.

    ``json.loads`` validates (with JSON's own error messages) and gives the values: YAML 1.1
    would read ``1e5`` as a string. PyYAML's composer then gives the nodes, so findings point
    at their line: JSON is a subset of YAML's flow style, except that PyYAML refuses tabs
    between tokens. A valid JSON text has raw tabs only there (a string cannot hold one), so
    they become spaces, which keeps every line where it is.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"{source}: line {exc.lineno}: not valid JSON: {exc.msg}") from None
    try:
        node = yaml.compose(text.replace("\t", " "), Loader=yaml.SafeLoader)
    except yaml.YAMLError:  # a JSON corner PyYAML does not take: findings point at line 1
        node = None
    if not isinstance(data, list):
        return [Document(source, 1, _line(node, 1), data, node)]
    nodes = node.value if isinstance(node, yaml.SequenceNode) else []
    return [
        Document(source, 1, _line(item_node, 1), item, item_node)
        for item, item_node in zip(data, _padded(nodes, len(data)), strict=True)
    ]


def _padded(nodes: list[Any], length: int) -> list[Any]:
    """One node per item, None for each item without one (its text could not be composed)."""
    return list(nodes[:length]) + [None] * (length - len(nodes))


def _line(node: yaml.Node | None, default: int) -> int:
    return node.start_mark.line + 1 if node is not None else default


def _expand_lists(documents: list[Document]) -> Iterator[Document]:
    for document in documents:
        obj = document.obj
        if (
            isinstance(obj, dict)
            and str(obj.get("kind", "")).endswith("List")
            and isinstance(obj.get("items"), list)
        ):
            item_nodes = _padded(_items_nodes(document.node), len(obj["items"]))
            for item, node in zip(obj["items"], item_nodes, strict=True):
                yield Document(
                    document.source, document.number, _line(node, document.line), item, node
                )
        else:
            yield document


def _items_nodes(node: yaml.Node | None) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == "items" and isinstance(value, yaml.SequenceNode):
                return list(value.value)
    return []


def discover(paths: Sequence[str]) -> list[str]:
    """Files to read: files as given, directories scanned recursively for YAML and JSON."""
    return manifest_files(paths, recursive=True)


class SubdirectoriesNotRead(ValueError):
    """A directory given without recursion has manifest files in its subdirectories: reading
    only its own files would silently shrink what a run covers. ``left_out`` are those files,
    in the order of their paths."""

    def __init__(self, left_out: list[Path]) -> None:
        super().__init__(
            f"{len(left_out)} manifest file(s) in subdirectories were not read (such as "
            f"{left_out[0]}): read recursively to include them (or name the files)"
        )
        self.left_out = left_out


def manifest_files(paths: Sequence[str], *, recursive: bool) -> list[str]:
    """Files to read, as ``kubectl -f`` reads them: files as given, a directory's own YAML and
    JSON files, and with ``recursive`` those of its subdirectories too; ``-`` (standard input)
    once, where it is first given. Without ``recursive``, a directory whose subdirectories
    hold manifest files raises :class:`SubdirectoriesNotRead`, before anything is read.

    The one place directories are expanded: ``review``, ``audit`` and ``explain`` (through
    ``webhook.cli.common.input_files``) and :func:`~webhook.audit.files.audit_files` alike."""
    found: list[str] = []
    left_out: list[Path] = []
    for path in paths:
        p = Path(path)
        if path == "-":
            if path not in found:
                found.append(path)
        elif p.is_dir():
            everything = sorted(p.rglob("*") if recursive else p.iterdir())
            found.extend(str(f) for f in everything if _is_manifest(f))
            if not recursive:
                left_out.extend(
                    f
                    for sub in everything
                    if sub.is_dir()
                    for f in sorted(sub.rglob("*"))
                    if _is_manifest(f)
                )
        else:
            found.append(path)
    if left_out:
        raise SubdirectoriesNotRead(left_out)
    return found


def _is_manifest(path: Path) -> bool:
    return path.suffix in MANIFEST_SUFFIXES and path.is_file()
