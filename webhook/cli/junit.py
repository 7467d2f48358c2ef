"""The audit as JUnit XML (``audit -o junit``), for CI systems that show test reports."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from webhook.audit.judging import Audited
from webhook.cli.output import exemption_text
from webhook.cluster.listing import Problem
from webhook.core.findings import MODE_WORD, Finding


def report(items: Sequence[Audited], problems: Sequence[Problem]) -> str:
    """One testsuite, one testcase per object: a failure per object that would be denied, a
    skipped one per object not judged (no Pod or workload) or exempt from every rule; inputs
    that could not be read and objects that could not be judged are errors."""
    skipped = [i for i in items if not i.outcome.judged or i.outcome.exempt]
    suite = ET.Element(
        "testsuite",
        name="gpu-admission audit",
        tests=str(len(items) + len(problems)),
        failures=str(sum(1 for i in items if not i.outcome.allowed)),
        errors=str(len(problems)),
        skipped=str(len(skipped)),
    )
    for item in items:
        classname = item.ref.namespace if item.ref else item.document.source
        case = ET.SubElement(
            suite, "testcase", classname=classname or "cluster", name=item.document.describe()
        )
        if not item.outcome.judged:
            ET.SubElement(case, "skipped", message=item.outcome.skipped)
            continue
        if item.outcome.exempt:
            ET.SubElement(case, "skipped", message=exemption_text(item.outcome))
            continue
        if not item.outcome.allowed:
            denied = item.outcome.denied
            rules = sorted({f.rule for f in denied})
            failure = ET.SubElement(
                case,
                "failure",
                type="denied",
                message=f"would be denied: {len(denied)} violation(s) of {', '.join(rules)}",
            )
            failure.text = "\n".join(_finding_line(item, f) for f in denied)
        others = [f for f in item.outcome.findings if f.mode != "Enforce"]
        if others:
            ET.SubElement(case, "system-out").text = "\n".join(
                _finding_line(item, f) for f in others
            )
    for problem in problems:
        case = ET.SubElement(suite, "testcase", classname=problem.source, name=problem.stage)
        kind = "unreadable" if problem.stage == "read" else "unjudgeable"
        ET.SubElement(case, "error", type=kind, message=problem.message)
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, "unicode") + "\n"


def _finding_line(item: Audited, finding: Finding) -> str:
    line = item.line_of(finding.path)
    where = f" (line {line})" if line is not None else ""
    return f"{MODE_WORD[finding.mode]} [{finding.rule}] {finding.violation.render()}{where}"
