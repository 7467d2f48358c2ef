"""Rendering CLI outcomes: plain records (for JSON and YAML) and the human table."""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

import yaml

from webhook.admission.objects import Outcome
from webhook.audit.documents import Document
from webhook.core.findings import Finding
from webhook.policy.model import Exemption
from webhook.policy.namespace_lint import setting

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
    if outcome.exemptions:
        record["exempt"] = exemption_record(outcome)
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


def exemption_text(outcome: Outcome) -> str:
    """``exempt by tenants[1].exemptions[0] (kube-system)``, and from which rules when not
    from every rule."""
    return "exempt by " + ", ".join(
        _exemption_words(e, outcome.namespace) for e in outcome.exemptions
    )


def _exemption_words(exemption: Exemption, namespace: str) -> str:
    words = f"{setting(exemption.path)} ({namespace}"
    if exemption.service_accounts is not None:
        words += f", service account {', '.join(sorted(exemption.service_accounts))}"
    words += ")"
    if exemption.rules is not None:
        words += f" from {', '.join(sorted(exemption.rules))}"
    return words


def exemption_record(outcome: Outcome) -> dict[str, Any]:
    """The exemptions of an object for JSON: whether they cover every rule of every
    template (``all``: nothing was judged) and each exemption's setting."""
    return {
        "all": outcome.exempt,
        "by": [
            {
                "setting": setting(e.path),
                "namespaces": list(e.namespaces.patterns),
                "serviceAccounts": None
                if e.service_accounts is None
                else sorted(e.service_accounts),
                "rules": None if e.rules is None else sorted(e.rules),
            }
            for e in outcome.exemptions
        ],
    }


def dump(data: Any, fmt: str, stream: TextIO | None = None) -> None:
    import json

    stream = stream or sys.stdout  # looked up now: tests and callers may swap sys.stdout

    if fmt == "json":
        json.dump(data, stream, indent=2, default=str)
        stream.write("\n")
    else:
        stream.write(to_yaml(data))
