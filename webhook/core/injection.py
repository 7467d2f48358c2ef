"""The injection annotations of a template (``webhook.policy.annotations``: containerd NRI's,
GKE's), and the violations of the rule that owns each: a Pod that can reach a GPU node may
carry one only where a tenant grant names its key."""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core import advice
from webhook.core.findings import Violation
from webhook.core.pods import PodView, grants_of
from webhook.policy.annotations import Injection, classify
from webhook.policy.model import Policy


def injections(view: PodView) -> tuple[Injection, ...]:
    """The template's injection annotations; worked out once per view."""
    found = view.injections
    if found is None:
        found = view.injections = tuple(
            injection for injection in map(classify, view.annotations) if injection is not None
        )
    return found


def refused(
    view: PodView, policy: Policy, rule: str, *, advisory: bool = False
) -> Iterator[Violation]:
    """The violations of ``rule``: the template's injection annotations it owns that no tenant
    grant of its namespace names (``advisory``: warned at most)."""
    for injection in injections(view):
        value = view.annotations[injection.key]
        if injection.rule != rule or grants_of(view, policy).allows_annotation(
            injection.key, value
        ):
            continue
        yield Violation(
            rule=rule,
            path=f"{view.metadata_path}.annotations[{injection.key}]",
            value=value,
            message=f"the annotation {injection.key} has the node add "
            + advice.why(view, policy, f"{injection.injects} to the container")
            + ", past every check of the Pod spec",
            hint=advice.fix(
                view,
                policy,
                "remove the annotation, or have the platform team grant it, with this value, to "
                "the namespace (spec.tenants[].grants.annotations)",
            ),
            error_type="Forbidden",
            subject="annotations",
            field=f"annotations[{injection.key}]",
            advisory=advisory,
        )
