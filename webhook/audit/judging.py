"""The result of an audit, and judging one object into it.

An object the engine fails on is that object's :class:`Problem` and the audit goes on: one
malformed object must not hide every other verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from webhook.admission.objects import Outcome, decide_object
from webhook.audit.documents import Document
from webhook.cluster.listing import Problem
from webhook.cluster.ownership import ObjectRef
from webhook.policy.model import Policy


@dataclass(slots=True)
class Audited:
    """One judged object: a document from a file, or a live object with what it owns. Of a
    live object, the document and the outcome hold a stub (apiVersion, kind, names and uid):
    a cluster's objects are not kept once judged."""

    document: Document
    outcome: Outcome
    ref: ObjectRef | None = None  # a live object's reference; None for a file's document
    owned: list[ObjectRef] = field(default_factory=list)

    @property
    def location(self) -> str:
        return f"uid {self.ref.uid}" if self.ref else f"{self.document.source}:{self.document.line}"

    def line_of(self, path: str) -> int | None:
        return None if self.ref else self.document.line_of(path)


@dataclass(slots=True)
class Audit:
    """What one policy says of a set of objects. ``policy`` is the policy the objects were
    judged with: with ``respect_modes`` false, every rule it turns on is enforced."""

    policy: Policy
    respect_modes: bool
    items: list[Audited] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was skipped, and why

    @property
    def denies(self) -> bool:
        """Whether the policy would deny any judged object."""
        return any(not item.outcome.allowed for item in self.items)


def judge(
    audit: Audit,
    document: Document,
    where: str,
    namespace: str,
    *,
    ref: ObjectRef | None = None,
    raise_errors: bool = False,
    made_by_controller: bool = False,
    override: bool = False,
) -> Audited | None:
    """Decide one object into the audit, with its mutations; None when the engine failed on
    it (a problem of the audit, or raised with ``raise_errors``). ``made_by_controller``: a
    live object whose controller the audit found; ``override``: ``namespace`` wins over the
    object's own (both as ``decide_object`` takes them)."""
    try:
        outcome = decide_object(
            document.obj,
            audit.policy,
            namespace,
            mutate=True,
            made_by_controller=made_by_controller,
            override=override,
        )
    except Exception as exc:
        if raise_errors:
            raise
        message = judging_failure(where, document, exc)
        audit.problems.append(Problem(document.source, message, stage="judge"))
        return None
    item = Audited(document, outcome, ref)
    audit.items.append(item)
    return item


def judging_failure(where: str, document: Document, exc: Exception) -> str:
    """One line for an object the engine failed on: where it is, and what was raised."""
    detail = " ".join(str(exc).split()) or "(no message)"
    return f"{where}: cannot judge {document.describe()}: {type(exc).__name__}: {detail}"
