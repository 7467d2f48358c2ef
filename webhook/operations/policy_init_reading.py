"""What ``policy init --from-cluster`` reads of a cluster: every Node and every DaemonSet, in
pages, each kept as little as the draft needs (a Node's labels, taints and vendor resources;
a DaemonSet's names and tolerations), a page at a time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from webhook.cluster.connection import Cluster
from webhook.cluster.listing import Lister, RequestRefused
from webhook.core.inventory import NodeInfo, SharedParts, Taint
from webhook.operations.policy_init import AgentDaemonSet

# The default policy's vendor domains: the resources a pool may declare.
VENDOR_DOMAINS = ("nvidia.com",)


class ClusterSample(NamedTuple):
    nodes: list[NodeInfo]
    daemonsets: list[AgentDaemonSet]


def read_cluster(cluster: Cluster) -> ClusterSample:
    """Every Node and DaemonSet of the cluster; a refused list raises ``RequestRefused``."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    lister = Lister(cluster, None)
    shared = SharedParts()
    try:
        nodes = [
            _node(obj, shared)
            for page in lister.pages(k8s.CoreV1Api(cluster.api_client).list_node)
            for obj in page.get("items") or ()
            if isinstance(obj, dict)
        ]
    except ApiException as exc:
        raise RequestRefused("cannot list nodes", exc) from None
    apps = k8s.AppsV1Api(cluster.api_client)
    try:
        daemonsets = [
            _daemonset(obj)
            for page in lister.pages(apps.list_daemon_set_for_all_namespaces)
            for obj in page.get("items") or ()
            if isinstance(obj, dict)
        ]
    except ApiException as exc:
        raise RequestRefused("cannot list daemonsets", exc) from None
    return ClusterSample(nodes, daemonsets)


def _node(obj: Mapping[str, Any], shared: SharedParts) -> NodeInfo:
    """A Node with every label (pools may select by any), its taints and its vendor
    resources."""
    metadata, spec, status = (_mapping(obj.get(k)) for k in ("metadata", "spec", "status"))
    labels = {str(k): str(v) for k, v in _mapping(metadata.get("labels")).items()}
    taints = tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect")))
        for t in spec.get("taints") or ()
        if isinstance(t, Mapping)
    )
    return NodeInfo(
        str(metadata.get("name") or ""),
        shared.mapping(labels),
        False,
        shared.taints(taints),
        shared.mapping(_vendor(status.get("capacity"))),
        shared.mapping(_vendor(status.get("allocatable"))),
    )


def _daemonset(obj: Mapping[str, Any]) -> AgentDaemonSet:
    metadata = _mapping(obj.get("metadata"))
    template = _mapping(_mapping(obj.get("spec")).get("template"))
    tolerations = _mapping(template.get("spec")).get("tolerations") or ()
    return AgentDaemonSet(
        str(metadata.get("namespace") or ""),
        str(metadata.get("name") or ""),
        tuple(
            {k: t[k] for k in ("key", "operator", "effect") if k in t}
            for t in tolerations
            if isinstance(t, Mapping)
        ),
    )


def _vendor(resources: Any) -> dict[str, str]:
    return {
        str(name): str(value)
        for name, value in _mapping(resources).items()
        if str(name).partition("/")[0] in VENDOR_DOMAINS
    }


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
