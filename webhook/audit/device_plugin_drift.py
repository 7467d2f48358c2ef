"""Where the device plugin DaemonSets the policy names and the cluster disagree: part of what
``gpu-admission cluster check`` reports (``webhook.audit.drift`` reads the DaemonSets and
gathers it). Without ``devicePluginDaemonSets`` no DaemonSet is read or compared.

- ``device-plugin-daemonset-missing``: a DaemonSet ``devicePluginDaemonSets`` names that the
  cluster does not have;
- ``device-plugin-desired-mismatch``: a named DaemonSet whose desired count
  (``status.desiredNumberScheduled``) differs from the GPU nodes it should cover: those its
  template's node selector and required node affinity admit and whose NoSchedule and NoExecute
  taints it tolerates (with those the DaemonSet controller adds). More: the nodes without GPUs
  it also runs on are named. Fewer: its Pods are listed, and the GPU nodes it admits where it
  has none are named (none named when each has one: a stale status).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from webhook.audit.drift_finding import Drift
from webhook.core.inventory import NodeInfo, is_gpu_node
from webhook.core.scheduling import daemon_pod_fits
from webhook.core.wording import count, names, number
from webhook.policy.model import DaemonSetName


def find_device_plugin_drift(
    nodes: list[NodeInfo],
    daemonsets: Mapping[DaemonSetName, Mapping[str, Any] | None],
    placed: Callable[[DaemonSetName], frozenset[str]] | None,
) -> list[Drift]:
    """The named DaemonSets that do not exist, then those whose desired count differs from
    the GPU nodes they should cover. ``daemonsets``: as read (None: not found); ``placed``:
    the nodes a named DaemonSet's Pods are on, asked only of one that wants fewer Pods than it
    should have."""
    found = [
        Drift(
            "device-plugin-daemonset-missing",
            str(named),
            (),
            f"DaemonSet {named} (devicePluginDaemonSets) does not exist: correct its namespace "
            "and name (kubectl get daemonsets -A), or remove it from devicePluginDaemonSets",
        )
        for named, daemonset in daemonsets.items()
        if daemonset is None
    ]
    for named, daemonset in daemonsets.items():
        if daemonset is None:
            continue
        spec = pod_spec(daemonset)
        desired = status_count(daemonset, "desiredNumberScheduled")
        admitted = [node for node in nodes if runs_on(spec, node)]
        covered = [node.name for node in admitted if is_gpu_node(node)]
        if desired == len(covered):
            continue
        extra = tuple(node.name for node in admitted if not is_gpu_node(node))
        should = (
            f"DaemonSet {named} would run {number(desired, 'Pod')} "
            f"(status.desiredNumberScheduled; {status_count(daemonset, 'numberReady')} ready) "
            f"where {count(covered, 'GPU node')} "
            f"{'admits' if len(covered) == 1 else 'admit'} it (its node selector, node "
            "affinity and tolerations)"
        )
        if desired > len(covered) and extra:
            message = (
                f"{should}; it also runs on {count(extra, 'node')} without GPUs: "
                f"{names(extra)}; narrow its nodeSelector or node affinity to the GPU nodes"
            )
            concerned = extra
        else:
            on = placed(named) if placed is not None and desired < len(covered) else None
            concerned = tuple(name for name in covered if on is not None and name not in on)
            why = f"(kubectl describe daemonset -n {named.namespace} {named.name})"
            if concerned:
                message = (
                    f"{should}; {count(concerned, 'GPU node')} it admits "
                    f"{'has' if len(concerned) == 1 else 'have'} no Pod of it, and no Pod "
                    f"can be given {'its' if len(concerned) == 1 else 'their'} GPUs: "
                    f"{names(concerned)}; see why {why}"
                )
            else:
                message = (
                    f"{should}: its status is stale or the DaemonSet controller places it "
                    f"otherwise; see which GPU nodes lack its Pod (kubectl get pods -n "
                    f"{named.namespace} -o wide) and why {why}"
                )
        found.append(Drift("device-plugin-desired-mismatch", str(named), concerned, message))
    return found


def pod_spec(daemonset: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A DaemonSet's ``spec.template.spec`` ({} when absent or malformed)."""
    value: Any = daemonset
    for key in ("spec", "template", "spec"):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def runs_on(spec: Mapping[str, Any], node: NodeInfo) -> bool:
    """Whether the DaemonSet controller places a Pod of this template on the node."""
    taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in node.taints]
    return daemon_pod_fits(spec, node.labels, node.name, taints)


def status_count(daemonset: Mapping[str, Any], field: str) -> int:
    """A count in a DaemonSet's status (the API server leaves out zeros)."""
    status = daemonset.get("status")
    value = status.get(field) if isinstance(status, Mapping) else None
    return value if isinstance(value, int) else 0
