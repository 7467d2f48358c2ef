"""A read that ``explain`` (and ``inspect``) cannot do without, refused by the API server: one
line that says what was asked, the server's words and, for a 403, the permission to grant and
the role that has it: the inspector's (the audits' role lacks events, DeviceClasses and
ResourceSlices)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from webhook.cluster.connection import ClusterError
from webhook.cluster.listing import status_message

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException


# Every read of explain and inspect, including those of cluster check that inspect runs.
INSPECTOR_ROLE = (
    "the gpu-admission-inspector ClusterRole (manifests/base/inspector-clusterrole.yaml)"
)


class ReadRefused(ClusterError):
    """``what`` (``cannot list events in namespace "ml"``) refused with ``exc``;
    ``permission`` the verb and resource that grant it (``"list" on events``)."""

    def __init__(self, what: str, permission: str, exc: ApiException) -> None:
        hint = f": grant {permission}, or bind {INSPECTOR_ROLE}" if exc.status == 403 else ""
        super().__init__(f"{what} (HTTP {exc.status}): {status_message(exc)}{hint}")
