"""What a refused read of ``explain`` and ``inspect`` tells the user to grant: the verb and
resource, or the inspector's role, which has them all (the audits' role lacks events,
DeviceClasses and ResourceSlices)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from webhook.cluster.listing import RequestRefused

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException


# Every read of explain and inspect, including those of cluster check that inspect runs.
INSPECTOR_ROLE = (
    "the gpu-admission-inspector ClusterRole (manifests/base/inspector-clusterrole.yaml)"
)
INSPECTOR_GRANT = f"bind {INSPECTOR_ROLE}"


def read_refused(what: str, permission: str, exc: ApiException) -> RequestRefused:
    """``what`` (``cannot list events in namespace "ml"``) refused with ``exc``;
    ``permission`` the verb and resource that grant it (``"list" on events``)."""
    return RequestRefused(what, exc, grant=f"grant {permission}, or {INSPECTOR_GRANT}")


def where_listed(namespace: str | None) -> str:
    """Where a list reads, as a refusal names it: ``in namespace "ml"``, or all of them."""
    return f'in namespace "{namespace}"' if namespace else "in all namespaces"
