"""Policy exceptions: for one workload, named rules stop denying until the exception expires
(``spec.exceptions``). The engine applies them (``webhook.admission.engine``); validate and
the audit say which have expired."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.policy.selectors import LabelSelector


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
