"""Policy exceptions: for one workload, named rules stop denying until the exception expires
(``spec.exceptions``). The engine applies them (``webhook.admission.engine``); validate and
the audit say which have expired."""

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


@dataclass(frozen=True, slots=True)
class PolicyException:
    """An exception for one workload: ``rules`` stop denying the objects of ``namespace``
    named ``names`` or whose (Pod or Pod template) labels ``selector`` matches, until
    ``expires`` (seconds since the epoch, UTC)."""

    name: str
    owner: str
    expires: float
    expires_text: str  # as the policy writes it, for messages
    namespace: str
    names: frozenset[str]
    selector: LabelSelector | None
    rules: frozenset[str]
    reason: str = ""
    line: int = 0  # in the policy file, for what validate and the audit say of it

    def matches(self, namespace: str, object_name: str, labels: Mapping[str, Any]) -> bool:
        if namespace != self.namespace:
            return False
        return object_name in self.names or (
            self.selector is not None and self.selector.matches(labels)
        )

    def describe(self) -> str:
        """How a decision it changed names it."""
        return f"exception {self.name!r} (owner {self.owner}, until {self.expires_text})"
