"""Field errors print as the API server prints them; responses stay within its limits."""

from __future__ import annotations

from webhook.admission import response
from webhook.core.findings import Finding, Violation, render_all


def violation(value: object = "0.5", path: str = "spec.x", error_type: str = "Invalid value"):
    return Violation(rule="r", path=path, value=value, message="m", hint="h", error_type=error_type)


def test_values_print_like_go() -> None:
    assert violation("ä").render() == 'spec.x: Invalid value: "ä": m; h'
    assert violation(0.5).render() == "spec.x: Invalid value: 0.5: m; h"
    assert violation(True).render() == "spec.x: Invalid value: true: m; h"
    assert violation(None).render() == 'spec.x: Invalid value: "null": m; h'
    assert violation(error_type="Forbidden").render() == "spec.x: Forbidden: m; h"
    assert (
        violation(error_type="Unsupported value")
        .render()
        .startswith('spec.x: Unsupported value: "0.5"')
    )


def test_aggregate_is_bracketed_and_each_message_appears_once() -> None:
    one, other = violation(path="a"), violation(path="b")
    assert render_all([one]) == one.render()
    assert render_all([one, other, one]) == f"[{one.render()}, {other.render()}]"


def test_a_denial_with_thousands_of_violations_is_bounded() -> None:
    findings = [Finding(violation(path=f"spec.c[{i}]"), "Enforce") for i in range(2000)]
    status = response.build("u", denials=findings)["response"]["status"]
    assert status["message"].endswith(f"and {2000 - response.MAX_DENIAL_ERRORS} more]")
    assert len(status["details"]["causes"]) == response.MAX_DENIAL_ERRORS


def test_warnings_are_bounded_in_count_and_size() -> None:
    findings = [Finding(violation(path="spec." + "x" * 300), "Warn") for _ in range(40)]
    warnings = response.build("u", warnings=findings)["response"]["warnings"]
    assert len(warnings) <= response.MAX_WARNINGS
    assert all(len(w) <= response.MAX_WARNING_CHARS for w in warnings)
    assert sum(len(w) for w in warnings) <= response.MAX_WARNINGS_TOTAL
    assert warnings[-1].startswith("and ") and not any(w.startswith("Warning") for w in warnings)


def test_audit_annotation_keys_are_bare_short_names() -> None:
    findings = [Finding(violation(), "Audit")]
    annotations = response.build("u", audits=findings, would_patch=[{"op": "add"}])["response"][
        "auditAnnotations"
    ]
    assert set(annotations) == {"violations", "rules", "would-patch"}
    assert all("/" not in key and len(key) <= 63 for key in annotations)
