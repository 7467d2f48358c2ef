"""DRA admin access to devices only where a tenant grant allows it.

A request with ``adminAccess: true`` is allocated devices whether or not other claims hold
them, and its Pod sees them: it is how a monitoring agent (DCGM) reaches every GPU of a node,
and how a tenant would read another tenant's GPU. The API server allows it only in namespaces
labelled ``resource.kubernetes.io/admin-access: "true"``; this rule narrows that to the
namespaces a tenant entry grants ``draAdminAccess`` (the GPU operator's namespaces are exempt
in the default policy). Judged in ResourceClaims and ResourceClaimTemplates; advisory while
``newChecks`` is Warn (new in this release).
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView, grants_of
from webhook.policy.model import Policy

RULE = "dra-admin-access"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    for spec in view.claim_specs:
        for ask in spec.asks:
            if ask.admin_access and not grants_of(view, policy).dra_admin_access:
                yield Violation(
                    rule=RULE,
                    path=f"{ask.path}.adminAccess",
                    value=True,
                    message=f"admin access to {quote(str(ask.device_class))} devices sees and "
                    "manages devices other Pods use, and no tenant grant allows it in "
                    f"namespace {quote(view.namespace)}",
                    hint="remove adminAccess, or have the platform team grant it to this "
                    "namespace (tenants[].grants.draAdminAccess)",
                    error_type="Forbidden",
                    subject=ask.reference,
                    field="adminAccess",
                    advisory=policy.new_checks_advisory,
                )
