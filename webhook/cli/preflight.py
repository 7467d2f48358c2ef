"""The pre-flight of a policy change (``audit --policy NEW --against OLD``): which workloads the
new policy would start denying, stop denying, or judge differently, each policy with its own
modes (what the webhook would answer), over the same objects (files, or one cluster listing).

Findings are compared by rule and field path, so a reworded message is no change; a workload
that stays denied for other reasons is listed with the denials it gains and loses.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from webhook.core.findings import Finding

FindingKey = tuple[str, str]  # (rule, field path)


@dataclass(slots=True)
class Change:
    """How the new policy judges one object differently from the old one."""

    subject: str  # the object, as the audit names it, and where it is
    verdict: str  # "starts denying", "stops denying", or "" (same verdict)
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


def compare(old_items: Iterable[Any], new_items: Iterable[Any]) -> list[Change]:
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
        if change.verdict or change.denials_added or change.denials_removed:
            changes.append(change)
        elif change.warnings_added or change.warnings_removed:
            changes.append(change)
    return changes


def _key(item: Any) -> str:
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


def render(changes: list[Change], old_name: str, new_name: str, fmt: str, stream: TextIO) -> None:
    if fmt == "json":
        json.dump([c.record() for c in changes], stream, indent=2)
        stream.write("\n")
        return
    for change in changes:
        stream.write(f"{(change.verdict or 'changed').upper()}  {change.subject}\n")
        for label, lines in (
            ("+ deny", change.denials_added),
            ("- deny", change.denials_removed),
            ("+ warn", change.warnings_added),
            ("- warn", change.warnings_removed),
        ):
            for line in lines:
                stream.write(f"  {label}  {line}\n")
    stream.write(summary(changes, old_name, new_name) + "\n")


def summary(changes: list[Change], old_name: str, new_name: str) -> str:
    starts = sum(1 for c in changes if c.verdict == "starts denying")
    stops = sum(1 for c in changes if c.verdict == "stops denying")
    other = len(changes) - starts - stops
    return (
        f"policy {new_name} against {old_name}: {starts} object(s) would start being denied, "
        f"{stops} would stop being denied, {other} judged differently with the same verdict"
    )
