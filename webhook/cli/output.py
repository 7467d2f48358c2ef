"""Rendering CLI outcomes: plain records (for JSON and YAML) and the human table."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

from webhook.admission.objects import Outcome
from webhook.audit.documents import Document
from webhook.core.findings import MODE_WORD, Finding

VERDICT = {True: "allowed", False: "denied"}


class _NoAliasDumper(yaml.SafeDumper):
    """Writes a value shared by two places twice. A patch's values are the very objects put
    into the mutated Pod, and ``&id001``/``*id001`` in a report is noise to a reader and an
    error to tools that reject aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(data: Any) -> str:
    """YAML of a report or an object, in the order its keys were given, without aliases."""
    return yaml.dump(
        data, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=100
    )


def use_colour(stream: TextIO) -> bool:
    """Colours only on a terminal, and never when NO_COLOR is set."""
    return stream.isatty() and "NO_COLOR" not in os.environ


def paint(text: str, colour: str, enabled: bool) -> str:
    codes = {"red": "31", "yellow": "33", "green": "32", "dim": "2", "bold": "1"}
    return f"\033[{codes[colour]}m{text}\033[0m" if enabled else text


def finding_record(finding: Finding, document: Document | None = None) -> dict[str, Any]:
    record = finding.as_record()
    if document is not None:
        record["line"] = document.line_of(finding.path)
    return record


def outcome_record(document: Document, outcome: Outcome, *, with_mutation: bool) -> dict[str, Any]:
    obj = outcome.obj if isinstance(outcome.obj, dict) else {}
    metadata = obj.get("metadata")
    meta = metadata if isinstance(metadata, dict) else {}
    record: dict[str, Any] = {
        "source": document.source,
        "document": document.number,
        "line": document.line,
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "name": meta.get("name") or meta.get("generateName"),
        "namespace": outcome.namespace,
        "judged": outcome.judged,
        **({"skipped": outcome.skipped} if not outcome.judged else {}),
        "verdict": VERDICT[outcome.allowed],
        "violations": [finding_record(f, document) for f in outcome.findings],
    }
    if with_mutation:
        record["mutations"] = [
            {
                "template": m.template_path or None,
                **({"workload": True} if m.workload else {}),
                "patch": list(m.operations),
                "mutated": m.mutated,
            }
            for m in outcome.mutations
        ]
    return record


def dump(data: Any, fmt: str, stream: TextIO | None = None) -> None:
    import json

    stream = stream or sys.stdout  # looked up now: tests and callers may swap sys.stdout

    if fmt == "json":
        json.dump(data, stream, indent=2, default=str)
        stream.write("\n")
    else:
        stream.write(to_yaml(data))


def table(
    rows: Sequence[tuple[Document, Outcome]],
    stream: TextIO,
    *,
    show_mutation: bool,
    failed: int = 0,
    unreadable: int = 0,
) -> None:
    """The verdicts; ``failed`` objects could not be judged and ``unreadable`` files (or
    their rest) could not be read (their errors went to stderr)."""
    colour = use_colour(stream)
    for document, outcome in rows:
        if not outcome.judged:
            where = f"{document.source}:{document.line}"
            stream.write(f"SKIPPED  {document.describe()}  ({where}): {outcome.skipped}\n")
            continue
        verdict = VERDICT[outcome.allowed]
        shade = (
            "green"
            if outcome.allowed and not outcome.findings
            else ("yellow" if outcome.allowed else "red")
        )
        where = f"{document.source}:{document.line}"
        stream.write(
            f"{paint(verdict.upper(), shade, colour)}  {document.describe()}  "
            f"(namespace {outcome.namespace}, {where})\n"
        )
        for finding in outcome.findings:
            mode = MODE_WORD[finding.mode]
            line = document.line_of(finding.path)
            stream.write(
                f"  {mode:<5} [{finding.rule}] {finding.violation.render()}  (line {line})\n"
            )
        if show_mutation:
            for mutation in outcome.mutations:
                target = f" Pods of {mutation.template_path}" if mutation.template_path else ""
                stream.write(f"  mutate{target}:\n")
                for operation in mutation.operations:
                    stream.write(f"    add {operation['path']}: {_short(operation['value'])}\n")
    judged = [o for _, o in rows if o.judged]
    denied = sum(1 for o in judged if not o.allowed)
    skipped = len(rows) - len(judged)
    stream.write(
        f"{len(judged)} object(s) judged: {denied} denied, {len(judged) - denied} allowed"
        + (f"; {skipped} not a Pod or workload, skipped" if skipped else "")
        + (f"; {failed} could not be judged (see the errors above)" if failed else "")
        + (f"; {unreadable} file(s) could not be read (see the errors above)" if unreadable else "")
        + "\n"
    )


def _short(value: Any) -> str:
    import json

    text = json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= 160 else text[:157] + "..."
