"""What ``policy init --from-cluster`` reads of a cluster: every Node and every DaemonSet, in
pages, each kept as little as the draft needs, a page at a time. A Node as the inventory keeps
it (``webhook.core.inventory.node_info``, under the base policy's vendor domains), with every
label (pools may select by any); a DaemonSet as ``webhook.operations.daemonset_drafts`` keeps
it (its names, placement, status counts and whether it runs NVIDIA's device plugin)."""

from __future__ import annotations

from typing import NamedTuple

from webhook.cluster.connection import Cluster
from webhook.cluster.listing import Lister, RequestRefused
from webhook.core.inventory import KeptFields, NodeInfo, SharedParts, node_info
from webhook.operations.daemonset_drafts import SeenDaemonSet, seen_daemonset
from webhook.policy.load import default_policy_path, load_policy


class ClusterSample(NamedTuple):
    nodes: list[NodeInfo]
    daemonsets: list[SeenDaemonSet]


def read_cluster(cluster: Cluster, base: KeptFields | None = None) -> ClusterSample:
    """Every Node and DaemonSet of the cluster, Nodes kept with the vendor resources of
    ``base`` (the policy drafted on; the default policy when None); a refused list raises
    ``RequestRefused``."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    kept = base if base is not None else load_policy(default_policy_path())
    lister = Lister(cluster, None)
    shared = SharedParts()
    try:
        nodes = [
            node_info(obj, kept, shared, every_label=True)
            for page in lister.pages(k8s.CoreV1Api(cluster.api_client).list_node)
            for obj in page.get("items") or ()
            if isinstance(obj, dict)
        ]
    except ApiException as exc:
        raise RequestRefused("cannot list nodes", exc) from None
    apps = k8s.AppsV1Api(cluster.api_client)
    try:
        daemonsets = [
            seen_daemonset(obj)
            for page in lister.pages(apps.list_daemon_set_for_all_namespaces)
            for obj in page.get("items") or ()
            if isinstance(obj, dict)
        ]
    except ApiException as exc:
        raise RequestRefused("cannot list daemonsets", exc) from None
    return ClusterSample(nodes, daemonsets)
