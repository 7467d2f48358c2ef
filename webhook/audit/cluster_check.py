"""Everything ``gpu-admission cluster check`` compares, gathered: the nodes and device plugin
DaemonSets (``webhook.audit.drift``), the ResourceQuotas (``webhook.audit.quota_drift``), the
classes the GPU defaults name (``webhook.audit.class_drift``) and the claims with admin access
(``webhook.audit.admin_access``). The command prints it; ``gpu-admission inspect`` reports it
as its drift section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.audit.admin_access import check_admin_access
from webhook.audit.class_drift import check_classes
from webhook.audit.drift import check_cluster
from webhook.audit.drift_finding import Drift
from webhook.audit.quota_drift import QuotaCheck, check_quotas
from webhook.cluster.connection import Cluster
from webhook.policy.model import DaemonSetName, Policy


@dataclass(frozen=True, slots=True)
class ClusterCheck:
    """What was read (``nodes``, and the namespaces and quotas ``quotas`` counts) and every
    finding, in the order ``cluster check`` prints them."""

    drift: list[Drift]
    nodes: int
    quotas: QuotaCheck


def check_policy_drift(
    cluster: Cluster,
    policy: Policy,
    daemonsets: Mapping[DaemonSetName, Mapping[str, Any] | None] | None = None,
) -> ClusterCheck:
    """Every disagreement between ``policy`` and the cluster (``daemonsets``: the device
    plugin DaemonSets where the caller has read them). A refused list or read, or an
    unreachable server, raises ``ClusterError``."""
    drift, nodes = check_cluster(cluster, policy, daemonsets)
    quotas = check_quotas(cluster, policy, None)
    drift += check_classes(cluster, policy)
    drift += check_admin_access(cluster, policy)
    drift += quotas.drift
    return ClusterCheck(drift, nodes, quotas)
