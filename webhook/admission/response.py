"""Building the AdmissionReview response from findings and a patch.

The API server limits what it passes on: warnings are printed by kubectl one per line and are
truncated past 256 characters (runes) each and 4096 in all, and audit annotation keys are bare names
(the server prefixes the webhook's name) of at most 63 characters. We stay inside those limits
ourselves so that what is cut is said, not silently lost.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Callable, Sequence
from typing import Any, cast

from webhook.admission.wire import API_VERSION, AdmissionResponse, AdmissionReviewResponse
from webhook.core.findings import Finding, render_all

MAX_WARNINGS = 16
MAX_WARNING_CHARS = 256
MAX_WARNINGS_TOTAL = 4096
MAX_AUDIT_VALUE = 8192
# The least of a warning's message worth keeping when it is shortened to fit its fix.
MIN_WARNING_MESSAGE = 60
# A denial lists every violation, but a Pod with thousands of containers must not produce a
# megabyte status: past this many, the message says how many more there are.
MAX_DENIAL_ERRORS = 50


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _warning(finding: Finding) -> str:
    """One warning line. Past the limit the message is shortened, not the fix: what to write
    instead is what the reader needs most."""
    if finding.exception:
        # Said first, so that no shortening hides why a denial is only a warning.
        allowed = f"{finding.path}: allowed by {finding.exception}: {finding.message}"
        return _clip(allowed, MAX_WARNING_CHARS)
    text = f"{finding.path}: {finding.message}"
    hint = finding.violation.hint
    if len(text) <= MAX_WARNING_CHARS or not hint:
        return _clip(text, MAX_WARNING_CHARS)
    room = MAX_WARNING_CHARS - len(finding.path) - len(hint) - 4
    if room < MIN_WARNING_MESSAGE:
        return _clip(text, MAX_WARNING_CHARS)
    return f"{finding.path}: {_clip(finding.violation.message, room)}; {hint}"


def warnings_for(findings: Sequence[Finding]) -> list[str]:
    out: list[str] = []
    total = 0
    for index, finding in enumerate(findings):
        text = _warning(finding)
        remaining = len(findings) - index
        if (
            len(out) == MAX_WARNINGS - 1
            and remaining > 1
            or total + len(text) > MAX_WARNINGS_TOTAL - 64
        ):
            out.append(f"and {remaining} more GPU policy warning(s)")
            break
        out.append(text)
        total += len(text)
    return out


# The JSON of an audit record with every string empty.
_SHORTEST_RECORD = len('{"rule":"","mode":"","path":"","value":"","message":"","hint":""},')


def audit_annotations(
    findings: Sequence[Finding], would_patch: Sequence[dict[str, Any]] = ()
) -> dict[str, str]:
    annotations: dict[str, str] = {}
    if findings:
        # No record is shorter than _SHORTEST_RECORD: more than this many never fit.
        records = [f.as_record() for f in findings[: MAX_AUDIT_VALUE // _SHORTEST_RECORD]]
        text = _records_json(records, len(findings))
        while len(text) > MAX_AUDIT_VALUE and len(records) > 1:
            records = records[: len(records) // 2]
            text = _records_json(records, len(findings))
        annotations["violations"] = text
        annotations["rules"] = ",".join(sorted({f.rule for f in findings}))
    if would_patch:
        annotations["would-patch"] = _clipped_patch(list(would_patch))
    return annotations


def _records_json(records: list[dict[str, Any]], total: int) -> str:
    tail = [{"truncated": total - len(records)}] if len(records) < total else []
    return json.dumps(records + tail, separators=(",", ":"), default=str)


def _clipped_patch(operations: list[dict[str, Any]]) -> str:
    """The operations as JSON, whole ones dropped from the end past the size limit and counted
    in a last ``{"omitted": n}`` item, so that the value stays valid JSON."""

    def text(kept: int) -> str:
        omitted = len(operations) - kept
        tail = [{"omitted": omitted}] if omitted else []
        return json.dumps(operations[:kept] + tail, separators=(",", ":"), default=str)

    low, high = 0, len(operations)  # text(low) fits (an empty list does); find the most that fit
    if len(text(high)) <= MAX_AUDIT_VALUE:
        return text(high)
    while low < high - 1:
        middle = (low + high) // 2
        if len(text(middle)) <= MAX_AUDIT_VALUE:
            low = middle
        else:
            high = middle
    return text(low)


# Made once: json.dumps with any option but the defaults builds an encoder per call.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))

# Writes a JSON value as compact UTF-8 bytes. The server passes a faster one than the standard
# library's (a tenth of a mutation's cost): the core itself imports nothing outside it.
JsonEncoder = Callable[[Any], bytes]


def compact_json(value: Any) -> bytes:
    """``value`` as compact JSON, with the standard library."""
    return _COMPACT_JSON.encode(value).encode()


def build(
    uid: str,
    *,
    denials: Sequence[Finding] = (),
    warnings: Sequence[Finding] = (),
    audits: Sequence[Finding] = (),
    patch: Sequence[dict[str, Any]] = (),
    would_patch: Sequence[dict[str, Any]] = (),
    stopped: bool = False,
    encode_json: JsonEncoder = compact_json,
    exceptions: Sequence[str] = (),
) -> AdmissionReviewResponse:
    """The AdmissionReview response. ``stopped``: judging stopped after the denials given,
    and the message says that there may be more. ``encode_json`` writes the patch.
    ``exceptions``: the policy exceptions that made denials warnings, recorded in the API
    server's audit log (``exceptions``) as well as told to the user."""
    response: dict[str, Any] = {"uid": uid, "allowed": not denials}
    if denials:
        violations = [f.violation for f in denials]
        message = render_all(violations, limit=MAX_DENIAL_ERRORS)
        if stopped:
            message = render_all(violations[:MAX_DENIAL_ERRORS], stopped_after=len(violations))
        response["status"] = {
            "code": 403,
            "reason": "Forbidden",
            "message": message,
            "details": {"causes": [v.cause() for v in violations[:MAX_DENIAL_ERRORS]]},
        }
    if warnings:
        response["warnings"] = warnings_for(warnings)
    if audits or would_patch:
        response["auditAnnotations"] = audit_annotations(audits, would_patch)
    if exceptions:
        response.setdefault("auditAnnotations", {})["exceptions"] = _clip(
            json.dumps(list(exceptions), ensure_ascii=False), MAX_AUDIT_VALUE
        )
    if patch and not denials:
        response["patchType"] = "JSONPatch"
        encoded = encode_json(list(patch))
        response["patch"] = binascii.b2a_base64(encoded, newline=False).decode("ascii")
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionReview",
        "response": cast(AdmissionResponse, response),
    }
