"""Taints a node carries for a while, put there by Kubernetes, a cloud provider or an
autoscaler: the node is starting, NotReady or unreachable, under pressure, cordoned, drained,
being scaled down or replaced. They say the node's health or maintenance, never a pool's
(``policy init`` leaves them out of its pools) and never a toleration for a tenant to write
(``explain`` sends the tenant to the cluster's administrators instead)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.core.scheduling import untolerated

LIFECYCLE_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
# The autoscalers' own: the cluster autoscaler's scale-down, Karpenter's disruption (v1 and
# the releases before it) and its not-yet-registered node.
REMOVAL_TAINTS = frozenset(
    {
        "ToBeDeletedByClusterAutoscaler",
        "DeletionCandidateOfClusterAutoscaler",
        "karpenter.sh/disrupted",
        "karpenter.sh/disruption",
    }
)
LIFECYCLE_TAINTS = REMOVAL_TAINTS | {"karpenter.sh/unregistered"}
# What each lifecycle taint says of its node, as an on-call engineer says it.
_STATES = {
    "node.kubernetes.io/not-ready": "NotReady",
    "node.kubernetes.io/unreachable": "NotReady",
    "node.kubernetes.io/unschedulable": "cordoned",
    "node.kubernetes.io/network-unavailable": "starting",
    "node.cloudprovider.kubernetes.io/uninitialized": "starting",
    "karpenter.sh/unregistered": "starting",
    "node.kubernetes.io/disk-pressure": "under resource pressure",
    "node.kubernetes.io/memory-pressure": "under resource pressure",
    "node.kubernetes.io/pid-pressure": "under resource pressure",
}
BEING_REMOVED = "being removed"
CORDON_TAINT: Mapping[str, str] = {
    "key": "node.kubernetes.io/unschedulable",
    "effect": "NoSchedule",
}
IN_MAINTENANCE = "out of service"


def is_lifecycle_taint(key: str) -> bool:
    """Whether a taint key is a node lifecycle taint (see the module's docstring)."""
    return key.startswith(LIFECYCLE_TAINT_PREFIXES) or key in LIFECYCLE_TAINTS


def lifecycle_state(key: str) -> str:
    """What a lifecycle taint says of its node: ``NotReady``, ``cordoned``, ``starting``,
    ``under resource pressure``, ``being removed`` or, for another, ``out of service``."""
    if key in REMOVAL_TAINTS:
        return BEING_REMOVED
    return _STATES.get(key, IN_MAINTENANCE)


def node_state(
    tolerations: Iterable[Mapping[str, Any]],
    taints: Iterable[Mapping[str, Any]],
    unschedulable: bool,
    ready: str,
) -> str:
    """Why a node is unusable to a Pod by the node's health or maintenance ("" where nothing
    says so): a lifecycle taint the Pod's ``tolerations`` do not tolerate, then
    ``spec.unschedulable`` (the scheduler lets a Pod that tolerates the cordon's taint
    through), then its Ready condition (``ready``: its status; False or Unknown is
    NotReady)."""
    for taint in untolerated(tolerations, taints):
        if is_lifecycle_taint(str(taint.get("key"))):
            return lifecycle_state(str(taint.get("key")))
    if unschedulable and untolerated(tolerations, [CORDON_TAINT]):
        return "cordoned"
    if ready in ("False", "Unknown"):
        return "NotReady"
    return ""


def ready_status(node: Mapping[str, object]) -> str:
    """The status of a Node's Ready condition ("True", "False", "Unknown"; "" without one)."""
    status = node.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for condition in conditions if isinstance(conditions, list) else ():
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return str(condition.get("status") or "")
    return ""
