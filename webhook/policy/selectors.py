"""Kubernetes label selectors, compiled once: an exception's on a workload's Pod labels, a
tenant's on its namespaces' labels."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes label selector: ``matchLabels`` and ``matchExpressions`` (In, NotIn,
    Exists, DoesNotExist), all of which must hold."""

    match_labels: tuple[tuple[str, str], ...]
    expressions: tuple[tuple[str, str, frozenset[str]], ...]  # (key, operator, values)

    def __str__(self) -> str:
        """As kubectl's ``-l`` writes it: ``team=vision,tier in (gold,silver),!legacy``."""
        parts = [f"{key}={value}" for key, value in self.match_labels]
        for key, operator, values in self.expressions:
            listed = ",".join(sorted(values))
            parts.append(
                {
                    "In": f"{key} in ({listed})",
                    "NotIn": f"{key} notin ({listed})",
                    "Exists": key,
                    "DoesNotExist": f"!{key}",
                }.get(operator, f"{key} {operator} ({listed})")
            )
        return ",".join(parts)

    def keys(self) -> frozenset[str]:
        """The label keys it reads."""
        return frozenset(key for key, _ in self.match_labels) | frozenset(
            key for key, _, _ in self.expressions
        )

    def matches(self, labels: Mapping[str, Any]) -> bool:
        if any(labels.get(key) != value for key, value in self.match_labels):
            return False
        for key, operator, values in self.expressions:
            present = key in labels
            if operator == "Exists" and not present or operator == "DoesNotExist" and present:
                return False
            if operator == "In" and (not present or str(labels[key]) not in values):
                return False
            if operator == "NotIn" and present and str(labels[key]) in values:
                return False
        return True


def compile_selector(raw: Mapping[str, Any]) -> LabelSelector:
    """The selector of a ``matchLabels``/``matchExpressions`` object the schema accepted."""
    return LabelSelector(
        tuple(sorted(raw.get("matchLabels", {}).items())),
        tuple(
            (e["key"], e["operator"], frozenset(e.get("values", ())))
            for e in raw.get("matchExpressions", ())
        ),
    )
