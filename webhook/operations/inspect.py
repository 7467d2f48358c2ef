"""``gpu-admission inspect``: the guide's daily GPU inspection, read from a live cluster in one
pass (``webhook.operations.inspect_report`` says what the report holds).

What is read, each list paged and narrowed by field selectors where the API server offers
them (at 5,000 nodes and 150,000 Pods, what is kept is the GPU nodes and the Pending GPU Pods):

- the Pending Pods (``status.phase=Pending``), of which those no node has been given that ask
  for a GPU (a GPU resource, not a companion such as a NIC, or a DRA claim) are kept, reduced
  to what ``explain`` reads of them (:func:`reduced`);
- ``ClusterFacts`` (``webhook.operations.cluster_facts``, shared with ``explain``): the GPU
  nodes and what the Pods bound to them request, the FailedScheduling events of the Pending
  GPU Pods, the ResourceQuotas, and the claims where a Pending Pod claims devices;
- the DaemonSets ``devicePluginDaemonSets`` names (read once, for this report and for
  ``cluster check``'s), or without them every DaemonSet, of which the well-known device
  plugins are kept, and the nodes their Pods are on, Ready or not;
- everything else ``cluster check`` compares (``webhook.audit.cluster_check``), which lists
  the Nodes again for itself: a second pass over the nodes, the price of one drift check for
  both commands.

Each Pending GPU Pod's first cause is the first of ``explain``'s (``explain_pod``), whose work
on the nodes is done once per scheduling shape of Pod (``webhook.operations.pending``). A
Pending Pod is a finding once it has waited ``--pending-after`` with a cause; a gated one
(``schedulingGates``: a queue such as Kueue holds it) waits for its queue and is listed apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from functools import partial
from typing import Any

from webhook.audit.cluster_check import check_policy_drift
from webhook.audit.drift import daemonset_pods, read_device_plugin_daemonsets
from webhook.cluster.connection import Cluster
from webhook.cluster.listing import Lister, RequestRefused
from webhook.core.inventory import is_gpu_resource
from webhook.core.requests import spec_requests
from webhook.operations.causes import Cause
from webhook.operations.cluster_facts import ClusterFacts, pending_pods, read_cluster_facts
from webhook.operations.daemonset_drafts import device_plugin_evidence
from webhook.operations.explain import explain_pod, policy_named
from webhook.operations.inspect_changes import compare
from webhook.operations.inspect_report import InspectReport
from webhook.operations.inspect_sections import (
    device_plugins,
    gpu_quotas,
    inspected_nodes,
    mixed_pools,
    pending_pod,
)
from webhook.operations.refusals import INSPECTOR_GRANT
from webhook.policy.model import DaemonSetName, Policy

# A Pending Pod younger than this is normal churn (the scheduler, an autoscaler at work).
PENDING_AFTER_SECONDS = 300
# Of a Pod's metadata and status, what explain reads (the verdict, the scheduler's condition,
# the claims the claim controller made); the rest (managedFields, last-applied annotations,
# container statuses) is dropped as each page arrives.
_METADATA_KEPT = (
    "name",
    "generateName",
    "namespace",
    "uid",
    "creationTimestamp",
    "labels",
    "annotations",
    "ownerReferences",
)
_STATUS_KEPT = ("phase", "conditions", "resourceClaimStatuses")
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def inspect_cluster(
    cluster: Cluster,
    policy: Policy,
    now: datetime,
    previous: Mapping[str, Any] | None = None,
    pending_after: int = PENDING_AFTER_SECONDS,
    policy_file: str | None = None,
) -> InspectReport:
    """The inspection of the cluster at ``now``; with ``previous`` (a report document checked
    by ``inspect_changes.check_previous``), what changed since. A Pending GPU Pod is a
    finding once Pending ``pending_after`` seconds with a cause. A refused list or read, or
    an unreachable server, raises ``ClusterError``. ``policy_file``: the file ``--policy``
    named (None: the packaged default)."""
    waiting = [reduced(pod) for pod in pending_pods(cluster, None) if waits_for_gpu(pod, policy)]
    facts = read_cluster_facts(cluster, policy, waiting, all_namespaces=True)
    lister = Lister(cluster, None)
    try:
        daemonsets = read_device_plugin_daemonsets(lister, policy)
        # Without devicePluginDaemonSets, the well-known device plugins, found by what they
        # state (``policy init``'s reading): compared, and said to be found so.
        found_by = {} if daemonsets else find_device_plugins(lister)
        compared = daemonsets or {named: obj for named, (obj, _) in found_by.items()}
        placed = {
            named: daemonset_pods(lister, named, daemonset)
            for named, daemonset in compared.items()
            if daemonset is not None
        }
        checked = check_policy_drift(cluster, policy, daemonsets)
    except RequestRefused as exc:
        # cluster check's readers name the audits' role, which lacks events: ours has all.
        raise exc.granted_by(INSPECTOR_GRANT) from None
    pods = sorted(
        (pending_pod(pod, first_cause(pod, facts, policy), now, policy) for pod in waiting),
        key=lambda pod: (-pod.age_seconds, pod.namespace, pod.name),
    )
    plugins = device_plugins(
        facts.nodes, compared, placed, {named: why for named, (_, why) in found_by.items()}
    )
    report = InspectReport(
        generated=now,
        policy=policy_named(policy_file),
        nodes_read=facts.node_count,
        gpu_nodes=inspected_nodes(facts.nodes, plugins.uncovered),
        pending=tuple(pod for pod in pods if not pod.gates),
        gated=tuple(pod for pod in pods if pod.gates),
        pending_after=pending_after,
        device_plugins=plugins,
        quotas=gpu_quotas(facts.quotas),
        drift=tuple(checked.drift),
        mixed_pools=mixed_pools(facts.nodes, policy),
        notes=facts.notes,
    )
    if previous is not None:
        report = dataclasses.replace(report, changes=compare(previous, report))
    return report


def find_device_plugins(
    lister: Lister,
) -> dict[DaemonSetName, tuple[Mapping[str, Any], str]]:
    """Every DaemonSet that runs NVIDIA's device plugin by what it states (its image or the
    GPU Operator's name: ``webhook.operations.daemonset_drafts``; GKE's by its name), with
    what says so."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    every = k8s.AppsV1Api(lister.cluster.api_client).list_daemon_set_for_all_namespaces
    found: dict[DaemonSetName, tuple[Mapping[str, Any], str]] = {}
    try:
        for page in lister.pages(every):
            for obj in page.get("items") or ():
                if not isinstance(obj, dict):
                    continue
                metadata = _mapping(obj.get("metadata"))
                name = str(metadata.get("name") or "")
                namespace = str(metadata.get("namespace") or "")
                template = _mapping(_mapping(_mapping(obj.get("spec")).get("template")).get("spec"))
                why = device_plugin_evidence(namespace, name, template)
                if why is not None:
                    found[DaemonSetName(namespace, name)] = (obj, why)
    except ApiException as exc:
        raise RequestRefused("cannot list daemonsets in all namespaces", exc) from None
    return found


def waits_for_gpu(pod: Mapping[str, Any], policy: Policy) -> bool:
    """A Pending Pod no node has been given that asks for a GPU: a GPU resource
    (``webhook.core.inventory.is_gpu_resource``: not a companion such as a NIC), or a DRA
    claim (whose class ``explain`` reads)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping) or spec.get("nodeName"):
        return False
    wanted = partial(is_gpu_resource, policy=policy)
    return bool(spec.get("resourceClaims")) or bool(spec_requests(spec, wanted))


def reduced(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What ``explain`` reads of a Pending Pod: its spec, and the parts of its metadata and
    status named above."""
    metadata = _mapping(pod.get("metadata"))
    status = _mapping(pod.get("status"))
    kept = {key: metadata[key] for key in _METADATA_KEPT if key in metadata}
    annotations = _mapping(metadata.get("annotations"))
    if _LAST_APPLIED in annotations:
        kept["annotations"] = {k: v for k, v in annotations.items() if k != _LAST_APPLIED}
    return {
        "apiVersion": pod.get("apiVersion") or "v1",
        "kind": pod.get("kind") or "Pod",
        "metadata": kept,
        "spec": pod.get("spec"),
        "status": {key: status[key] for key in _STATUS_KEPT if key in status},
    }


def first_cause(pod: Mapping[str, Any], facts: ClusterFacts, policy: Policy) -> Cause | None:
    """What ``explain`` finds first of why the Pod pends (None: nothing blocks it)."""
    explanation = explain_pod(pod, facts, policy)
    return explanation.causes[0] if explanation.causes else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
