"""The pre-flight of a policy change (``audit --policy NEW --against OLD``): which workloads the
new policy would start denying, stop denying, or judge differently, each policy with its own
modes (what the webhook would answer), over the same objects (files, or one cluster listing).

Findings are compared by rule and field path, so a reworded message is no change; a workload
that stays denied for other reasons is listed with the denials it gains and loses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from webhook.audit.cluster import judge_cluster
from webhook.audit.documents import manifest_files
from webhook.audit.files import Paths, judge_files, path_list
from webhook.audit.judging import Audit, Audited
from webhook.cluster.connection import Cluster
from webhook.core.findings import Finding
from webhook.policy.model import Policy

FindingKey = tuple[str, str]  # (rule, field path)


@dataclass(slots=True)
class Change:
    """How the new policy judges one object differently from the old one."""

    subject: str  # the object, as the audit names it, and where it is
    verdict: Literal["starts denying", "stops denying", ""]  # "": the same verdict
    denials_added: list[str] = field(default_factory=list)
    denials_removed: list[str] = field(default_factory=list)
    warnings_added: list[str] = field(default_factory=list)
    warnings_removed: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {
            "object": self.subject,
            "verdict": self.verdict or "unchanged",
            "denialsAdded": self.denials_added,
            "denialsRemoved": self.denials_removed,
            "warningsAdded": self.warnings_added,
            "warningsRemoved": self.warnings_removed,
        }


def compare(old_items: Iterable[Audited], new_items: Iterable[Audited]) -> list[Change]:
    """The changes between two audits of the same objects (``Audited`` items, paired by the
    object they judged), in the new audit's order. Objects neither policy judges are no
    change; one that only one policy judges (a kind it adds) counts as judged clean by the
    other."""
    old = {_key(item): item for item in old_items}
    changes = []
    for item in new_items:
        before = old.get(_key(item))
        new_findings = item.outcome.findings if item.outcome.judged else ()
        old_findings = before.outcome.findings if before and before.outcome.judged else ()
        new_allowed = item.outcome.allowed
        old_allowed = before.outcome.allowed if before else True
        change = Change(
            subject=f"{item.document.describe()}  ({item.location})",
            verdict=""
            if new_allowed == old_allowed
            else ("stops denying" if new_allowed else "starts denying"),
        )
        change.denials_added, change.denials_removed = _difference(
            _by_key(old_findings, "Enforce"), _by_key(new_findings, "Enforce")
        )
        change.warnings_added, change.warnings_removed = _difference(
            _by_key(old_findings, "Warn"), _by_key(new_findings, "Warn")
        )
        if (
            change.verdict
            or change.denials_added
            or change.denials_removed
            or change.warnings_added
            or change.warnings_removed
        ):
            changes.append(change)
    return changes


def _key(item: Audited) -> str:
    """A live object by its uid (a batch Job and a Volcano Job may share a name), a document
    by where it is."""
    if item.ref is not None:
        return item.ref.uid or str(item.ref)
    return str(item.document.where)


def _by_key(findings: Iterable[Finding], mode: str) -> dict[FindingKey, str]:
    return {
        (f.rule, f.path): f"[{f.rule}] {f.violation.render()}" for f in findings if f.mode == mode
    }


def _difference(
    old: dict[FindingKey, str], new: dict[FindingKey, str]
) -> tuple[list[str], list[str]]:
    return [new[k] for k in new if k not in old], [old[k] for k in old if k not in new]


@dataclass(slots=True)
class Preflight:
    """Two audits of the same objects, each policy with its own modes, and what changes."""

    new: Audit
    old: Audit
    changes: list[Change]

    @property
    def starts_denying(self) -> bool:
        return any(c.verdict == "starts denying" for c in self.changes)


def preflight_files(
    new_policy: Policy,
    old_policy: Policy,
    paths: Paths,
    *,
    recursive: bool = False,
    namespace: str = "default",
    stdin: str | None = None,
    raise_errors: bool = False,
    override: bool = False,
) -> Preflight:
    """The pre-flight over manifests on disk (``-`` in ``paths`` is ``stdin``; ``recursive``,
    ``namespace`` and ``override`` as :func:`~webhook.audit.files.audit_files` takes them)."""
    files = manifest_files(path_list(paths), recursive=recursive)
    new, old = Audit(new_policy, True), Audit(old_policy, True)
    for audit in (new, old):
        judge_files(
            audit, files, namespace, stdin=stdin, raise_errors=raise_errors, override=override
        )
    return Preflight(new, old, compare(old.items, new.items))


def preflight_cluster(
    new_policy: Policy,
    old_policy: Policy,
    cluster: Cluster,
    namespace: str | None,
    *,
    raise_errors: bool = False,
) -> Preflight:
    """The pre-flight over one listing of a cluster's workloads (None: every namespace)."""
    new, old = Audit(new_policy, True), Audit(old_policy, True)
    judge_cluster([new, old], cluster, namespace, raise_errors=raise_errors, keep_mutated=False)
    return Preflight(new, old, compare(old.items, new.items))
