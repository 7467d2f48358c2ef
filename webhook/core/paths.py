"""Walking a catalogue path (``spec.templates[*]``, ``spec.replicatedJobs[*].template``)
through an object as written: every match with its field path and its identity.

Only navigation: what the matches are made into (the views) is ``webhook.core.targets``'.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from webhook.policy.model import EachItem, EachValue, FieldStep, TemplatePath, TemplateStep

Match = tuple[str, str, Mapping[str, Any]]  # (field path, identity, the object there)


def walk_path(obj: Any, path: TemplatePath) -> Iterator[Match]:
    """Every (field path, identity, object) that ``path`` reaches in ``obj``. The identity names
    list items by their ``name`` (JobSet's replicatedJobs, Ray's workerGroupSpecs by
    ``groupName``) instead of their position, so that an UPDATE that reorders or inserts items
    is matched by name."""
    yield from _walk(obj, path, 0, "", "")


def walk_pointers(
    obj: Any, path: TemplatePath
) -> Iterator[tuple[str, tuple[str | int, ...], Mapping[str, Any]]]:
    """Every (field path, JSON Pointer segments, object) that ``path`` reaches in ``obj``: where
    a patch of the match goes (map keys and list indexes as they are, whatever they hold)."""
    yield from _pointers(obj, path.steps, "", ())


def _pointers(
    node: Any, steps: tuple[TemplateStep, ...], where: str, segments: tuple[str | int, ...]
) -> Iterator[tuple[str, tuple[str | int, ...], Mapping[str, Any]]]:
    if not steps:
        if isinstance(node, dict):
            yield where, segments, node
        return
    step, rest = steps[0], steps[1:]
    if isinstance(step, FieldStep):
        if isinstance(node, dict) and step.name in node:
            child = f"{where}.{step.name}" if where else step.name
            yield from _pointers(node[step.name], rest, child, (*segments, step.name))
    elif isinstance(step, EachValue):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from _pointers(value, rest, f"{where}[{key}]", (*segments, key))
    elif isinstance(step, EachItem) and isinstance(node, list):
        for index, value in enumerate(node):
            yield from _pointers(value, rest, f"{where}[{index}]", (*segments, index))


def walk_paired(
    obj: Mapping[str, Any], holder: TemplatePath, pod_fields: TemplatePath
) -> Iterator[tuple[str, Match]]:
    """(holder path, pod-fields match) pairs: through the steps both paths share, each holder
    meets only the pod fields under the same map entries and list items (a NIMPipeline
    service's resources, that service's spec), and every pod field otherwise."""
    shared = 0
    for mine, theirs in zip(holder.steps, pod_fields.steps, strict=False):
        if mine != theirs:
            break
        shared += 1
    prefix = TemplatePath("", holder.steps[:shared])
    holder_rest = TemplatePath("", holder.steps[shared:])
    pod_rest = TemplatePath("", pod_fields.steps[shared:])
    for where, identity, node in walk_path(obj, prefix):
        matches = list(_walk(node, pod_rest, 0, where, identity))
        for holder_path, _, _ in _walk(node, holder_rest, 0, where, identity):
            for match in matches:
                yield holder_path, match


def _walk(node: Any, path: TemplatePath, step: int, where: str, identity: str) -> Iterator[Match]:
    if step == len(path.steps):
        if isinstance(node, dict):
            yield where, identity, node
        return
    kind = path.steps[step]
    if isinstance(kind, FieldStep):
        if isinstance(node, dict) and kind.name in node:
            child = f"{where}.{kind.name}" if where else kind.name
            child_identity = f"{identity}.{kind.name}" if identity else kind.name
            yield from _walk(node[kind.name], path, step + 1, child, child_identity)
    elif isinstance(kind, EachValue):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from _walk(value, path, step + 1, f"{where}[{key}]", f"{identity}[{key}]")
    elif isinstance(kind, EachItem) and isinstance(node, list):
        for index, value in enumerate(node):
            name = _item_name(value)
            item = f"[name={name}]" if name is not None else f"[{index}]"
            yield from _walk(value, path, step + 1, f"{where}[{index}]", identity + item)


def _item_name(item: Any) -> str | None:
    if isinstance(item, dict):
        for key in ("name", "groupName"):
            value = item.get(key)
            if isinstance(value, str):
                return value
    return None
