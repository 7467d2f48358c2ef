"""SARIF 2.1.0 logs of judged manifests, so that code review tools annotate the offending line.

One run, one result per finding, each pointing at the file (a relative URI with forward
slashes) and at the line of the offending field. Files that could not be read are tool
execution notifications: the run was not complete, and the log says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import quote

from webhook.admission.objects import Outcome
from webhook.audit.documents import Document
from webhook.checks.registry import BY_RULE

VERSION = "2.1.0"
SCHEMA_URI = (
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
)
TOOL = "gpu-admission"
LEVEL = {"Enforce": "error", "Warn": "warning", "Audit": "note"}


def log(
    rows: Sequence[tuple[Document, Outcome]], errors: Iterable[tuple[str, str]] = ()
) -> dict[str, Any]:
    """The SARIF log of judged documents; ``errors`` are (source, one-line message) pairs."""
    rule_ids = sorted({f.rule for _, outcome in rows for f in outcome.findings})
    index = {rule: i for i, rule in enumerate(rule_ids)}
    results = [
        {
            "ruleId": finding.rule,
            "ruleIndex": index[finding.rule],
            "level": LEVEL[finding.mode],
            "message": {"text": f"{document.describe()}: {finding.violation.render()}"},
            "locations": [_location(document.source, document.line_of(finding.path))],
        }
        for document, outcome in rows
        for finding in outcome.findings
    ]
    driver: dict[str, Any] = {
        "name": TOOL,
        "rules": [
            {"id": rule, "shortDescription": {"text": BY_RULE[rule].summary}} for rule in rule_ids
        ],
    }
    version = _tool_version()
    if version:
        driver["version"] = version
    notifications = [
        {
            "level": "error",
            "message": {"text": message},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": uri(source)}}}],
        }
        for source, message in errors
    ]
    return {
        "$schema": SCHEMA_URI,
        "version": VERSION,
        "runs": [
            {
                "tool": {"driver": driver},
                "invocations": [
                    {
                        "executionSuccessful": not notifications,
                        "toolExecutionNotifications": notifications,
                    }
                ],
                "results": results,
            }
        ],
    }


def uri(source: str) -> str:
    """A file as a URI relative to the working directory, where review tools resolve it."""
    relative = os.path.relpath(source) if source != "-" else source
    return quote(Path(relative).as_posix())


def _location(source: str, line: int) -> dict[str, Any]:
    return {
        "physicalLocation": {
            "artifactLocation": {"uri": uri(source)},
            "region": {"startLine": max(line, 1)},
        }
    }


def _tool_version() -> str | None:
    try:
        return metadata.version(TOOL)
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return None
