"""SARIF 2.1.0 logs of judged manifests, so that code review tools annotate the offending line.

One run, one result per finding, each pointing at the file and at the line of the offending
field. A file is a URI relative to the repository's root (``%SRCROOT%``: the git top-level
above the working directory, else the working directory, or ``--sarif-root``), as code review
tools resolve it wherever the audit ran from; a file outside that root is an absolute
``file:`` URI, never ``../``. Files that could not be read are tool execution notifications:
the run was not complete, and the log says so.
"""

from __future__ import annotations

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
ROOT_ID = "%SRCROOT%"


def repository_root(start: Path | None = None) -> Path:
    """The git top-level of ``start`` (the working directory): the nearest directory up that
    holds ``.git`` (a directory, or a worktree's file); else ``start`` itself."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / ".git").exists():
            return directory
    return here


def log(
    rows: Sequence[tuple[Document, Outcome]],
    errors: Iterable[tuple[str, str]] = (),
    root: Path | None = None,
) -> dict[str, Any]:
    """The SARIF log of judged documents; ``errors`` are (source, one-line message) pairs;
    locations are relative to ``root`` (default: :func:`repository_root`)."""
    root = (root or repository_root()).resolve()
    rule_ids = sorted({f.rule for _, outcome in rows for f in outcome.findings})
    index = {rule: i for i, rule in enumerate(rule_ids)}
    results = [
        {
            "ruleId": finding.rule,
            "ruleIndex": index[finding.rule],
            "level": LEVEL[finding.mode],
            "message": {"text": f"{document.describe()}: {finding.violation.render()}"},
            "locations": [_location(document.source, document.line_of(finding.path), root)],
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
            "locations": [{"physicalLocation": {"artifactLocation": artifact(source, root)}}],
        }
        for source, message in errors
    ]
    return {
        "$schema": SCHEMA_URI,
        "version": VERSION,
        "runs": [
            {
                "tool": {"driver": driver},
                "originalUriBaseIds": {ROOT_ID: {"uri": root.as_uri().rstrip("/") + "/"}},
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


def artifact(source: str, root: Path) -> dict[str, str]:
    """A file's artifact location: relative to ``root`` (``%SRCROOT%``) where it is under it,
    else its absolute ``file:`` URI; standard input is ``-``."""
    if source == "-":
        return {"uri": "-"}
    path = Path(source).resolve()
    if not path.is_relative_to(root):
        return {"uri": path.as_uri()}
    return {"uri": quote(path.relative_to(root).as_posix()), "uriBaseId": ROOT_ID}


def _location(source: str, line: int, root: Path) -> dict[str, Any]:
    return {
        "physicalLocation": {
            "artifactLocation": artifact(source, root),
            "region": {"startLine": max(line, 1)},
        }
    }


def _tool_version() -> str | None:
    try:
        return metadata.version(TOOL)
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return None
