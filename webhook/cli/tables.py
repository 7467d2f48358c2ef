"""The compact table of ``review`` and ``audit`` (one line per object), the count per rule that
follows the rows of every table, and the same counts for JSON.

A run over a repository's manifests prints hundreds of objects: one line each, clipped to the
terminal, says which to look at; ``-o wide`` prints every message in full.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from webhook.admission.objects import Outcome
from webhook.audit.documents import Document
from webhook.audit.judging import Audit
from webhook.cli.output import exemption_text, paint, use_colour
from webhook.core.findings import MODE_WORD
from webhook.policy.model import Mode

# The findings' modes in the order a table counts them, with the column each is counted in.
COUNTED: tuple[tuple[Mode, str], ...] = (
    ("Enforce", "denials"),
    ("Warn", "warnings"),
    ("Audit", "audits"),
)


# How wide the compact table's name and file columns are padded at most, and how much of a
# file's path a clipped line keeps.
MAX_SUBJECT_COLUMN = 48
MAX_WHERE_COLUMN = 60
MIN_WHERE = 24


@dataclass(frozen=True, slots=True)
class Row:
    """One object as the compact table prints it."""

    verdict: str  # DENIED, ALLOWED, EXEMPT or SKIPPED
    shade: str  # the verdict's colour on a terminal ("" for none)
    subject: str  # Kind/namespace/name
    where: str  # file:line, or a live object's uid
    detail: str  # the rules that fired, the exemption, or why it was skipped


def verdict(outcome: Outcome) -> tuple[str, str]:
    """The verdict word of an object and its colour."""
    if not outcome.judged:
        return "SKIPPED", ""
    if outcome.exempt:
        return "EXEMPT", "dim"
    if not outcome.allowed:
        return "DENIED", "red"
    return "ALLOWED", "yellow" if outcome.findings else "green"


def row(document: Document, outcome: Outcome, where: str, *, owned: int = 0) -> Row:
    """The compact row of one object; ``owned``: how many objects a live workload owns."""
    word, shade = verdict(outcome)
    if not outcome.judged:
        return Row(word, shade, document.describe(), where, outcome.skipped)
    kind, _, name = document.describe().partition("/")
    parts = []
    for mode, _ in COUNTED:
        rules = Counter(f.rule for f in outcome.findings if f.mode == mode)
        if rules:
            fired = ", ".join(r + (f"×{n}" if n > 1 else "") for r, n in rules.items())
            parts.append(f"{MODE_WORD[mode]}: {fired}")
    if outcome.exemptions:
        parts.append(exemption_text(outcome))
    if outcome.mutations:
        parts.append("mutated")
    if owned:
        parts.append(f"owns {owned}")
    return Row(word, shade, f"{kind}/{outcome.namespace}/{name}", where, "; ".join(parts))


def compact(rows: Sequence[Row], stream: TextIO, *, colour: bool) -> None:
    """One line per object, the columns aligned (up to a width: one long name does not push
    every line right), clipped to the terminal's width on a terminal (or where ``COLUMNS``
    says how wide lines may be): a file's path is cut from the left first, so that its name
    and the rules stay in sight."""
    if not rows:
        return
    verdict_width = max(len(r.verdict) for r in rows)
    subject_width = min(max(len(r.subject) for r in rows), MAX_SUBJECT_COLUMN)
    where_width = min(max(len(r.where) for r in rows), MAX_WHERE_COLUMN)
    width = (
        shutil.get_terminal_size().columns if stream.isatty() or "COLUMNS" in os.environ else None
    )
    for r in rows:
        subject, where, pad = r.subject.ljust(subject_width), r.where, where_width
        if width is not None:
            room = width - (verdict_width + len(subject) + len(r.detail) + 6)
            if len(where) > room:
                where = "…" + where[-max(room - 1, MIN_WHERE - 1) :]
            pad = max(min(pad, room), 0)
        line = "  ".join((r.verdict.ljust(verdict_width), subject, where.ljust(pad)))
        line = f"{line}  {r.detail}".rstrip()
        if width is not None and len(line) > width:
            line = line[: max(width - 1, 0)] + "…"
        stream.write(_paint(r.verdict, r.shade, colour) + line[len(r.verdict) :] + "\n")


def _paint(text: str, shade: str, enabled: bool) -> str:
    return paint(text, shade, enabled) if shade else text


def rule_counts(outcomes: Iterable[Outcome]) -> dict[str, dict[str, int]]:
    """Per rule that fired: its denials, warnings and audits (findings), and the objects it
    fired on, the rules in their order of first appearance."""
    counts: dict[str, dict[str, int]] = {}
    for outcome in outcomes:
        for rule in dict.fromkeys(f.rule for f in outcome.findings):
            counts.setdefault(rule, {column: 0 for _, column in COUNTED} | {"objects": 0})
            counts[rule]["objects"] += 1
        for finding in outcome.findings:
            counts[finding.rule][dict(COUNTED)[finding.mode]] += 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1]["objects"], item[0])))


def rule_table(counts: dict[str, dict[str, int]], stream: TextIO) -> None:
    """The counts per rule, most objects first; nothing when no rule fired."""
    if not counts:
        return
    header = ("RULE", "DENIALS", "WARNINGS", "AUDITS", "OBJECTS")
    width = max(len(header[0]), *map(len, counts))
    stream.write(f"{header[0]:<{width}}  " + "  ".join(header[1:]) + "\n")
    for rule, count in counts.items():
        numbers = (count["denials"], count["warnings"], count["audits"], count["objects"])
        stream.write(
            f"{rule:<{width}}  "
            + "  ".join(f"{n:>{len(h)}}" for n, h in zip(numbers, header[1:], strict=True))
            + "\n"
        )


@dataclass(frozen=True, slots=True)
class Counts:
    """Objects by verdict, counted once for a table's summary line and a JSON summary."""

    objects: int
    judged: int
    denied: int
    warned: int  # allowed, with warnings
    exempt: int  # judged, every template exempt from every rule
    mutated: int

    @property
    def allowed(self) -> int:
        return self.judged - self.denied

    @property
    def skipped(self) -> int:
        """Not Pods or workloads: not judged."""
        return self.objects - self.judged

    @classmethod
    def of(cls, outcomes: Sequence[Outcome]) -> Counts:
        judged = [o for o in outcomes if o.judged]
        return cls(
            objects=len(outcomes),
            judged=len(judged),
            denied=sum(1 for o in judged if not o.allowed),
            warned=sum(1 for o in judged if o.allowed and o.warned),
            exempt=sum(1 for o in judged if o.exempt),
            mutated=sum(1 for o in judged if o.mutations),
        )


def summary_record(outcomes: Sequence[Outcome], **extra: int) -> dict[str, Any]:
    """The ``summary`` entry that ends a JSON report: objects by verdict, then per rule."""
    counts = Counts.of(outcomes)
    return {
        "summary": {
            "objects": counts.objects,
            "judged": counts.judged,
            "denied": counts.denied,
            "allowed": counts.allowed,
            "warned": counts.warned,
            "exempt": counts.exempt,
            "skipped": counts.skipped,
            **extra,
            "rules": rule_counts(outcomes),
        }
    }


def review_table(
    rows: Sequence[tuple[Document, Outcome]],
    stream: TextIO,
    *,
    wide: bool,
    show_mutation: bool,
    failed: int = 0,
    unreadable: int = 0,
) -> None:
    """review's verdicts, one line each or with ``wide`` every message, then the counts per
    rule and a summary line; ``failed`` objects could not be judged and ``unreadable`` files
    (or their rest) could not be read (their errors went to stderr)."""
    colour = use_colour(stream)
    if wide:
        for document, outcome in rows:
            _wide_rows(document, outcome, f"{document.source}:{document.line}", stream, colour)
            if show_mutation:
                _mutation_lines(outcome, stream, shorten=True)
    else:
        where = [f"{d.source}:{d.line}" for d, _ in rows]
        compact(
            [row(d, o, w) for (d, o), w in zip(rows, where, strict=True)], stream, colour=colour
        )
    outcomes = [o for _, o in rows]
    rule_table(rule_counts(outcomes), stream)
    counts = Counts.of(outcomes)
    stream.write(
        f"{counts.judged} object(s) judged: {counts.denied} denied, {counts.allowed} allowed"
        + (f" ({counts.exempt} exempt)" if counts.exempt else "")
        + (f"; {counts.skipped} not a Pod or workload, skipped" if counts.skipped else "")
        + (f"; {failed} could not be judged (see the errors above)" if failed else "")
        + (f"; {unreadable} file(s) could not be read (see the errors above)" if unreadable else "")
        + "\n"
    )


def audit_table(audit: Audit, stream: TextIO, *, wide: bool) -> None:
    """The audit's objects, one line each or with ``wide`` every message and mutation, then
    the counts per rule and the summary line."""
    colour = use_colour(stream)
    if wide:
        for item in audit.items:
            _wide_rows(item.document, item.outcome, item.location, stream, colour, item.line_of)
            if item.outcome.judged:
                _mutation_lines(item.outcome, stream)
            if item.owned:
                stream.write(f"  owns {', '.join(f'{r.kind}/{r.name}' for r in item.owned)}\n")
    else:
        compact(
            [row(i.document, i.outcome, i.location, owned=len(i.owned)) for i in audit.items],
            stream,
            colour=colour,
        )
    outcomes = [i.outcome for i in audit.items]
    rule_table(rule_counts(outcomes), stream)
    stream.write(audit_summary(audit, Counts.of(outcomes)) + "\n")


def _wide_rows(
    document: Document,
    outcome: Outcome,
    where: str,
    stream: TextIO,
    colour: bool,
    line_of: Callable[[str], int | None] | None = None,
) -> None:
    """An object's verdict line and one line per finding, each message in full."""
    word, shade = verdict(outcome)
    if not outcome.judged:
        stream.write(f"SKIPPED  {document.describe()}  ({where}): {outcome.skipped}\n")
        return
    head = (
        f"{_paint(word, shade, colour)}  {document.describe()}  "
        f"(namespace {outcome.namespace}, {where})"
    )
    if outcome.exemptions:
        head += f": {exemption_text(outcome)}"
    stream.write(head + "\n")
    for finding in outcome.findings:
        line = (line_of or document.line_of)(finding.path)
        stream.write(
            f"  {MODE_WORD[finding.mode]:<5} [{finding.rule}] {finding.violation.render()}"
            + (f"  (line {line})" if line is not None else "")
            + "\n"
        )


def _mutation_lines(outcome: Outcome, stream: TextIO, *, shorten: bool = False) -> None:
    """The patch of each mutation; with ``shorten`` a value is cut at 160 characters
    (review prints the mutated objects in full after the table)."""
    for mutation in outcome.mutations:
        target = f" Pods of {mutation.template_path}" if mutation.template_path else ""
        stream.write(f"  mutate{target}:\n")
        for operation in mutation.operations:
            value = json.dumps(operation["value"], separators=(", ", ": "))
            if shorten and len(value) > 160:
                value = value[:157] + "..."
            stream.write(f"    add {operation['path']}: {value}\n")


def audit_summary(audit: Audit, counts: Counts) -> str:
    """The audit's summary line: ``counts`` of its objects, and its problems."""
    modes = "its own modes" if audit.respect_modes else "every rule enforced"
    parts = [
        f"{counts.judged} object(s) audited with policy {audit.policy.name} ({modes}): "
        f"{counts.denied} would be denied, {counts.allowed} allowed ({counts.warned} with "
        "warnings"
        + (f", {counts.exempt} exempt" if counts.exempt else "")
        + f"); {counts.mutated} would be mutated"
    ]
    if counts.skipped:
        parts.append(f"{counts.skipped} not a Pod or workload, skipped")
    unread = sum(1 for p in audit.problems if p.stage == "read")
    if unread:
        parts.append(f"{unread} could not be read (see the errors above)")
    if len(audit.problems) > unread:
        parts.append(f"{len(audit.problems) - unread} could not be judged (see the errors above)")
    return "; ".join(parts)
