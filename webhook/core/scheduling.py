"""Small pieces of the scheduler's semantics: tolerations, taints and node selector terms."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether a toleration tolerates a taint, as the scheduler decides it."""
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    operator = toleration.get("operator") or "Equal"
    key = toleration.get("key")
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def toleration_for(taint: Mapping[str, Any]) -> dict[str, Any]:
    """The narrowest toleration for a taint: what we inject."""
    toleration = {"key": taint["key"]}
    if taint.get("value"):
        toleration.update(operator="Equal", value=taint["value"])
    else:
        toleration["operator"] = "Exists"
    toleration["effect"] = taint["effect"]
    return toleration


def expression_matches(expr: Mapping[str, Any], value: str | None) -> bool:
    """A node selector requirement against one label value (None: the label is absent)."""
    operator = expr.get("operator")
    values = expr.get("values") or []
    if not isinstance(values, list):
        return False  # malformed: the API server rejects it; it matches nothing meanwhile
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            left, right = int(value), int(values[0])
        except (TypeError, ValueError):
            return False
        return left > right if operator == "Gt" else left < right
    return False


def term_allows_labels(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a nodeSelectorTerm can match a node with these labels.

    Only the keys we know (``labels``) are judged; requirements on other keys may hold on
    the pool's nodes, so they never rule a pool out.
    """
    expressions = term.get("matchExpressions")
    for expr in expressions if isinstance(expressions, list) else ():
        if isinstance(expr, dict) and isinstance(expr.get("key"), str) and expr["key"] in labels:
            if not expression_matches(expr, labels[expr["key"]]):
                return False
    return True
