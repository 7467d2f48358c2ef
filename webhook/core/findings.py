"""Findings: what a check returns (a ``Violation``), what the policy makes of it (a ``Finding``,
with its mode), and how they are printed.

Printed the way the API server prints field errors (apimachinery ``field.Error``):
``spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "0.5": <detail>``.
String values are quoted, numbers and booleans bare; ``Forbidden`` and ``Required value``
omit the value.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from webhook.policy.model import Mode, Scope

ErrorType = Literal["Invalid value", "Forbidden", "Required value", "Unsupported value"]

_CAUSE_REASON = {
    "Invalid value": "FieldValueInvalid",
    "Forbidden": "FieldValueForbidden",
    "Required value": "FieldValueRequired",
    "Unsupported value": "FieldValueNotSupported",
}

# What a finding's mode does to the request, as reports word it.
MODE_WORD: dict[Mode, str] = {"Enforce": "deny", "Warn": "warn", "Audit": "audit"}


@dataclass(frozen=True, slots=True)
class Violation:
    """One finding of one check.

    ``subject`` and ``field`` identify the finding independently of list positions (the
    container or volume name, and the path below it), so that on UPDATE a finding that
    ``oldObject`` already had is recognised even when containers were reordered.
    ``advisory`` findings are at most warnings: they flag what may be fine (an undeclared
    resource, an uncatalogued MIG profile) and never deny.
    """

    rule: str
    path: str
    value: object
    message: str
    hint: str = ""
    error_type: ErrorType = "Invalid value"
    subject: str = ""
    field: str = ""
    advisory: bool = False

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.rule, self.subject, self.field or self.path)

    def detail(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message

    def render(self) -> str:
        if self.error_type in ("Forbidden", "Required value"):
            return f"{self.path}: {self.error_type}: {self.detail()}"
        return f"{self.path}: {self.error_type}: {render_value(self.value)}: {self.detail()}"

    def cause(self) -> dict[str, Any]:
        return {
            "reason": _CAUSE_REASON[self.error_type],
            "message": self.render()[len(self.path) + 2 :],
            "field": self.path,
        }


@dataclass(frozen=True, slots=True)
class Finding:
    """A violation with the mode the policy gives it for this object and namespace."""

    violation: Violation
    mode: Mode
    template: str = ""  # the pod template's identity (list items by name): part of the key
    # How its template reaches GPU nodes (security rules; None for the others).
    scope: Scope | None = None
    # The policy exception that made this denial a warning, as decisions name it; "" for none.
    exception: str = ""

    @property
    def key(self) -> tuple[str, ...]:
        return (self.template, *self.violation.key)

    @property
    def rule(self) -> str:
        return self.violation.rule

    @property
    def path(self) -> str:
        return self.violation.path

    @property
    def message(self) -> str:
        return self.violation.detail()

    def as_record(self) -> dict[str, Any]:
        v = self.violation
        return {
            "rule": v.rule,
            "mode": self.mode,
            "path": v.path,
            "value": v.value if isinstance(v.value, (int, float, bool)) else shown(str(v.value)),
            "message": v.message,
            "hint": v.hint,
            **({"exception": self.exception} if self.exception else {}),
        }


# What a message shows of one name or value. Kubernetes names are at most 253 characters and
# paths rarely longer; a review can hold a 40 KB name quoted in a thousand findings.
SHOWN_CHARS = 512


def shown(text: str) -> str:
    """``text``, or its first ``SHOWN_CHARS`` characters and how many more there were."""
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:SHOWN_CHARS]}... ({len(text) - SHOWN_CHARS} more characters)"


def quote(value: object) -> str:
    """A name in a message, quoted as the API server quotes names: ``container "cuda"``."""
    return json.dumps(shown(str(value)), ensure_ascii=False)


def render_value(value: object) -> str:
    """As Go's ``%q``/``%v`` print it in a field error: printable Unicode kept, nil as "null"."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return '"null"'
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


def render_all(
    violations: list[Violation] | tuple[Violation, ...], limit: int = 0, stopped_after: int = 0
) -> str:
    """Several errors are printed as the API server prints an aggregate: ``[e1, e2]``, each
    message once. With ``limit``, at most that many, then how many more there were; with
    ``stopped_after``, that judging stopped after that many and there may be more."""
    rendered = list(dict.fromkeys(v.render() for v in violations))
    if limit and len(rendered) > limit:
        rendered = [*rendered[:limit], f"and {len(rendered) - limit} more"]
    if stopped_after:
        rendered.append(
            f"and more: judging stopped after {stopped_after} violations, "
            "fix these and apply again to see the rest"
        )
    return rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"


def exceptions_of(findings: Iterable[Finding]) -> tuple[str, ...]:
    """The policy exceptions that made these findings warnings, each once, in order."""
    return tuple(dict.fromkeys(f.exception for f in findings if f.exception))
