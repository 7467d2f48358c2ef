"""RFC 6902 JSON Patch operations that only ``add``: never replace the user's lists.

Paths are RFC 6901 pointers with ``~`` and ``/`` escaped. A value whose parents are missing
(or ``null``) is added at the deepest existing parent, wrapped in the missing levels, so every
operation applies to the object as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Segment = str | int


def escape(segment: Segment) -> str:
    return str(segment).replace("~", "~0").replace("/", "~1")


def pointer(segments: Sequence[Segment]) -> str:
    parts = list(map(str, segments))
    joined = "/".join(parts)
    if "~" in joined or joined.count("/") != len(parts) - 1:
        # A segment holds a character to escape (an annotation key has a slash).
        joined = "/".join([escape(part) for part in parts])
    return "/" + joined if parts else ""


def _wrap(segments: Sequence[Segment], value: Any) -> Any:
    for segment in reversed(segments):
        value = {segment: value}
    return value


def _child(node: Any, segment: Segment) -> Any:
    # dict first: decoded JSON holds nothing else, and an ABC's isinstance costs ten times more.
    if isinstance(node, dict) or isinstance(node, Mapping):
        return node.get(segment)
    if isinstance(node, list) and isinstance(segment, int) and 0 <= segment < len(node):
        return node[segment]
    return None


def lookup(obj: Any, segments: Sequence[Segment]) -> Any:
    """The value at ``segments`` (None where the path does not lead to one)."""
    for segment in segments:
        obj = _child(obj, segment)
    return obj


def add(
    obj: Mapping[str, Any], segments: Sequence[Segment], value: Any
) -> list[dict[str, Any]] | None:
    """One ``add`` that sets ``segments`` to ``value``, creating missing parent objects.

    Returns None when a parent exists but is not an object (a malformed object the API server
    rejects anyway): nothing is added there.
    """
    node: Any = obj
    for depth, segment in enumerate(segments[:-1]):
        child = _child(node, segment)
        if child is None:
            if isinstance(node, list):
                return None  # an index past the end: nothing to add into
            return [
                {
                    "op": "add",
                    "path": pointer(segments[: depth + 1]),
                    "value": _wrap(segments[depth + 1 :], value),
                }
            ]
        if not isinstance(child, (dict, list)) and not isinstance(child, Mapping):
            return None
        node = child
    if isinstance(node, list) != isinstance(segments[-1], int):
        return None  # a field of a list or an index of an object: nothing sensible to add
    return [{"op": "add", "path": pointer(segments), "value": value}]


def append(
    obj: Mapping[str, Any], segments: Sequence[Segment], items: Sequence[Any]
) -> list[dict[str, Any]] | None:
    """Append items to the list at ``segments``; create it (and its parents) when missing."""
    if not items:
        return []
    current: Any = obj
    for segment in segments:
        current = _child(current, segment)
        if current is None:
            break
    if isinstance(current, list):
        path = pointer(segments) + "/-"
        return [{"op": "add", "path": path, "value": item} for item in items]
    if current is not None:
        return None
    return add(obj, segments, list(items))


class Planned:
    """Operations planned so far, and the object as they leave it, so that a later operation
    sees the parents an earlier one created (two ``add``s of a missing ``spec.affinity`` would
    otherwise overwrite each other). Only the path of each operation is copied: the object
    under review is never changed and never copied whole."""

    def __init__(self, obj: Mapping[str, Any]) -> None:
        self.operations: list[dict[str, Any]] = []
        self.working: Mapping[str, Any] = obj

    def add(self, operations: Iterable[dict[str, Any]] | None) -> None:
        for operation in operations or ():
            self.working = with_add(self.working, operation)
            self.operations.append(operation)


def unescape(segment: str) -> str:
    return segment.replace("~1", "/").replace("~0", "~")


def _segments(path: str) -> list[str]:
    """The unescaped segments of a pointer."""
    segments = path.split("/")[1:]
    return [unescape(s) for s in segments] if "~" in path else segments


def apply_add(obj: Any, operation: Mapping[str, Any]) -> None:
    """Apply one ``add`` in place. The value is copied: a later operation of the same patch
    may add inside it, and must not change this operation."""
    *parents, last = _segments(operation["path"])
    node = obj
    for segment in parents:
        node = node[int(segment)] if isinstance(node, list) else node[segment]
    _insert(node, last, _copy_json(operation["value"]))


def with_add(obj: Any, operation: Mapping[str, Any]) -> Any:
    """The object with one ``add`` applied, ``obj`` untouched: only the objects and lists on
    the operation's path are copied (shallowly), the rest is shared. The planner keeps its
    view of the Pod current this way without copying the whole Pod. The value is not copied:
    a later ``with_add`` inside it copies the objects on its own path first, so nothing it
    shares is ever changed."""
    *parents, last = _segments(operation["path"])
    root = obj.copy()  # objects and arrays of decoded JSON: dicts and lists
    node = root
    for segment in parents:
        key: Any = int(segment) if isinstance(node, list) else segment
        child = node[key] = node[key].copy()
        node = child
    _insert(node, last, operation["value"])
    return root


def _copy_json(value: Any) -> Any:
    """A copy of a JSON value (objects, arrays, scalars): what ``copy.deepcopy`` does for
    these, without its memo and dispatch, which cost more than the planning itself."""
    if isinstance(value, dict):
        return {key: _copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy_json(item) for item in value]
    return value


def _insert(node: Any, last: str, value: Any) -> None:
    if isinstance(node, list):
        node.insert(len(node) if last == "-" else int(last), value)
    else:
        node[last] = value
