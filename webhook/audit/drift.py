"""Where the policy and the cluster disagree: what ``gpu-admission cluster check`` reports.

The policy is a copy, typed by an administrator, of what the cluster's GPU nodes are: their
pools, labels, taints and resources. Nothing else checks that copy, and it drifts (a pool
added, GPUs re-partitioned, labels changed by a driver upgrade, a node that lost its taint);
the fail-closed webhook then denies Pods the cluster could run, or admits Pods that pend
forever. Each disagreement is reported once, with the nodes concerned:

- ``pool-without-nodes``: a declared pool whose node selector no node matches;
- ``gpu-node-in-no-pool``: when the policy declares pools, a GPU node (a vendor resource in
  its capacity, or ``nvidia.com/gpu.present=true``) that no pool selects;
- ``pool-node-missing-taint``: a pool's node without one of the pool's taints;
- ``pool-node-undeclared-resource``: a pool's node advertising a vendor resource that its pool
  does not declare (companion resources, which go beside GPUs in any pool, excepted);
- ``time-sliced-node-in-exclusive-pool``: a node whose GPUs GPU feature discovery says are
  shared (``nvidia.com/gpu.replicas`` above 1, or the ``-SHARED`` product suffix) in a pool
  that declares ``nvidia.com/gpu`` Exclusive;
- ``gpu-node-missing-taint``: a GPU node in no pool without one of ``gpuNodeTaints`` (when
  the policy says GPU nodes are tainted).

The nodes' GPU products (against the MIG catalogue, and the product label that entitlements
confine Pods by) are compared by ``webhook.audit.catalogue_drift`` (``mig-product-not-catalogued``,
``mig-profile-not-catalogued``, ``gpu-node-without-product-label``), and the device plugin
DaemonSets ``devicePluginDaemonSets`` names by ``webhook.audit.device_plugin_drift``
(``device-plugin-daemonset-missing``, ``device-plugin-desired-mismatch``): ``DRIFT_KINDS`` lists
every kind in the order they are reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from webhook.audit.catalogue_drift import find_catalogue_drift, find_product_label_drift
from webhook.audit.device_plugin_drift import find_device_plugin_drift, pod_spec
from webhook.audit.drift_finding import Drift
from webhook.cluster.connection import Cluster
from webhook.cluster.listing import Lister, RequestRefused, selector_text
from webhook.cluster.ownership import controller_uid
from webhook.core.inventory import (
    NodeFields,
    NodeInfo,
    SharedParts,
    has_gpus,
    node_info,
    pools_of,
    time_sliced,
)
from webhook.core.scheduling import assigned_node, selected_label_keys
from webhook.core.wording import count, names, them
from webhook.policy.model import DaemonSetName, Policy

DRIFT_KINDS = (
    "pool-without-nodes",
    "gpu-node-in-no-pool",
    "pool-node-missing-taint",
    "pool-node-undeclared-resource",
    "time-sliced-node-in-exclusive-pool",
    "gpu-node-missing-taint",
    "mig-product-not-catalogued",
    "mig-profile-not-catalogued",
    "device-plugin-daemonset-missing",
    "device-plugin-desired-mismatch",
    "gpu-node-without-product-label",
)
# The resource time-slicing shares when its replicas keep the device plugin's default name.
SHARED_BY_TIME_SLICING = "nvidia.com/gpu"


def check_cluster(
    cluster: Cluster,
    policy: Policy,
    daemonsets: Mapping[DaemonSetName, Mapping[str, Any] | None] | None = None,
) -> tuple[list[Drift], int]:
    """The drift between ``policy`` and the cluster's nodes (and its device plugin
    DaemonSets: ``daemonsets`` where the caller has read them, else read here), and how many
    nodes were read. An unreachable server, or a refused list or read, raises
    ``ClusterError``."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    lister = Lister(cluster, None)
    core = k8s.CoreV1Api(cluster.api_client)
    if daemonsets is None:
        daemonsets = read_device_plugin_daemonsets(lister, policy)
    # The labels the DaemonSets select nodes by are kept with the pools' (the GPU Operator's
    # nvidia.com/gpu.deploy.device-plugin is neither).
    selected = {key for ds in daemonsets.values() for key in selected_label_keys(pod_spec(ds))}
    kept = NodeFields(policy.gpu_label_keys | selected, policy.vendor_domains)
    shared = SharedParts()
    try:
        nodes = [
            node_info(obj, kept, shared)  # each page as it arrives: no Node kept whole
            for page in lister.pages(core.list_node)
            for obj in page.get("items") or ()
            if isinstance(obj, dict)
        ]
    except ApiException as exc:
        raise RequestRefused("cannot list nodes", exc) from None

    def placed(named: DaemonSetName) -> frozenset[str]:
        """The nodes the DaemonSet's Pods are on or bound for: listed only for one that
        wants fewer Pods than it should have."""
        return daemonset_pod_nodes(lister, named, daemonsets.get(named) or {})

    return find_drift(policy, nodes, daemonsets, placed), len(nodes)


def read_device_plugin_daemonsets(
    lister: Lister, policy: Policy
) -> dict[DaemonSetName, Mapping[str, Any] | None]:
    """The DaemonSets ``devicePluginDaemonSets`` names, as read (None: not found), each by a
    get. A read refused raises ``RequestRefused``."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    apps = k8s.AppsV1Api(lister.cluster.api_client)
    daemonsets: dict[DaemonSetName, Mapping[str, Any] | None] = {}
    for named in policy.device_plugin_daemonsets:
        read = partial(apps.read_namespaced_daemon_set, named.name, named.namespace)
        try:
            daemonsets[named] = lister.call(read)
        except ApiException as exc:
            if exc.status != 404:
                raise RequestRefused(f"cannot read DaemonSet {named}", exc) from None
            daemonsets[named] = None
    return daemonsets


def daemonset_pod_nodes(
    lister: Lister, named: DaemonSetName, daemonset: Mapping[str, Any]
) -> frozenset[str]:
    """The nodes a DaemonSet's Pods are on or bound for: its namespace's Pods listed by its
    selector, kept if it controls them. A list refused raises ``RequestRefused``."""
    return frozenset(daemonset_pods(lister, named, daemonset))


def daemonset_pods(
    lister: Lister, named: DaemonSetName, daemonset: Mapping[str, Any]
) -> dict[str, bool]:
    """Per node a DaemonSet's Pods are on or bound for, whether one of them there is Ready
    (its ``Ready`` condition True: a crash-looping Pod is on its node and covers nothing).
    A list refused raises ``RequestRefused``."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    core = k8s.CoreV1Api(lister.cluster.api_client)
    metadata = daemonset.get("metadata")
    uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
    spec = daemonset.get("spec")
    selector = selector_text(spec.get("selector") if isinstance(spec, Mapping) else None)
    pods = partial(core.list_namespaced_pod, named.namespace, label_selector=selector)
    found: dict[str, bool] = {}
    try:
        for page in lister.pages(pods):
            for pod in page.get("items") or ():
                if not isinstance(pod, dict) or uid is None or controller_uid(pod) != uid:
                    continue
                node = assigned_node(_mapping(pod.get("spec")))
                if node:
                    found[node] = found.get(node, False) or _pod_ready(pod)
    except ApiException as exc:
        raise RequestRefused(f"cannot list the Pods of DaemonSet {named}", exc) from None
    return found


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    """Its Ready condition is True; a Pod whose status has no Ready condition (written by
    nothing but a kubelet) counts as Ready when Running."""
    status = _mapping(pod.get("status"))
    conditions = status.get("conditions")
    ready = [
        c
        for c in (conditions if isinstance(conditions, list) else ())
        if isinstance(c, Mapping) and c.get("type") == "Ready"
    ]
    if not ready:
        return status.get("phase") == "Running"
    return any(c.get("status") == "True" for c in ready)


def find_drift(
    policy: Policy,
    nodes: Iterable[NodeInfo],
    daemonsets: Mapping[DaemonSetName, Mapping[str, Any] | None] | None = None,
    placed: Callable[[DaemonSetName], frozenset[str]] | None = None,
) -> list[Drift]:
    """Every disagreement, in the order of DRIFT_KINDS, then by subject. ``daemonsets``: the
    DaemonSets ``devicePluginDaemonSets`` names, as read (None: not found); ``placed``: the
    nodes a named DaemonSet's Pods are on, asked only of one that wants fewer Pods than it
    should have (its Pods are listed only then)."""
    nodes = sorted(nodes, key=lambda node: node.name)
    pools = {node.name: pools_of(node, policy) for node in nodes}
    found: list[Drift] = []

    for pool in policy.pools:
        if not any(pool in pools[node.name] for node in nodes):
            selector = _selector(pool.node_selector)
            found.append(
                Drift(
                    "pool-without-nodes",
                    pool.name,
                    (),
                    f"pool {pool.name!r} selects nodes labelled {selector}, and no node is: "
                    "correct its nodeSelector to the labels its nodes carry, or remove the pool",
                )
            )

    if policy.pools:
        # A node with only companion resources (a NIC's nvidia.com/hostdev) has no GPU.
        unpooled = tuple(
            node.name for node in nodes if has_gpus(node, policy) and not pools[node.name]
        )
        if unpooled:
            found.append(
                Drift(
                    "gpu-node-in-no-pool",
                    "",
                    unpooled,
                    f"{count(unpooled, 'GPU node')} in no declared pool: "
                    f"{names(unpooled)}; label {them(unpooled)} as a pool selects, or declare "
                    "a pool for them",
                )
            )

    # Each pool's nodes, in the order of policy.pools.
    members = [[node for node in nodes if pool in pools[node.name]] for pool in policy.pools]

    for pool, pool_nodes in zip(policy.pools, members, strict=True):
        for taint in pool.taints:
            lacking = _lacking(pool_nodes, taint)
            if lacking:
                found.append(
                    Drift(
                        "pool-node-missing-taint",
                        f"{pool.name}: {_taint(taint)}",
                        lacking,
                        f"{count(lacking, 'node')} of pool {pool.name!r} "
                        f"{'lacks' if len(lacking) == 1 else 'lack'} its taint {_taint(taint)}: "
                        f"{names(lacking)}; Pods that do not tolerate it can land there "
                        f"(kubectl taint nodes NODE {_taint(taint)})",
                    )
                )

    for pool, pool_nodes in zip(policy.pools, members, strict=True):
        advertised: dict[str, list[str]] = {}
        for node in pool_nodes:
            for resource in node.vendor_resources():
                if resource not in pool.resources and resource not in policy.companion_names:
                    advertised.setdefault(resource, []).append(node.name)
        for resource, listed in sorted(advertised.items()):
            found.append(
                Drift(
                    "pool-node-undeclared-resource",
                    f"{pool.name}: {resource}",
                    tuple(listed),
                    f"{count(listed, 'node')} of pool {pool.name!r} "
                    f"{'advertises' if len(listed) == 1 else 'advertise'} {resource}, which the "
                    f"pool does not declare: {names(listed)}; add it to the pool's resources "
                    "(with its sharing mode), or move the nodes to the pool that declares it",
                )
            )

    for pool, pool_nodes in zip(policy.pools, members, strict=True):
        spec = pool.resources.get(SHARED_BY_TIME_SLICING)
        if spec is None or spec.sharing != "Exclusive":
            continue
        shared = tuple(node.name for node in pool_nodes if time_sliced(node))
        if shared:
            found.append(
                Drift(
                    "time-sliced-node-in-exclusive-pool",
                    pool.name,
                    shared,
                    f"pool {pool.name!r} declares {SHARED_BY_TIME_SLICING} Exclusive, and "
                    f"{count(shared, 'node')} of it {'shares' if len(shared) == 1 else 'share'} "
                    f"{'its' if len(shared) == 1 else 'their'} GPUs (time-slicing or MPS): "
                    f"{names(shared)}; declare the sharing the nodes run, or give them the "
                    "pool's exclusive device plugin configuration",
                )
            )

    if policy.gpu_nodes_tainted:
        outside = [node for node in nodes if has_gpus(node, policy) and not pools[node.name]]
        for taint in policy.gpu_node_taints:
            lacking = _lacking(outside, taint)
            if lacking:
                found.append(
                    Drift(
                        "gpu-node-missing-taint",
                        _taint(taint),
                        lacking,
                        f"{count(lacking, 'GPU node')} in no pool "
                        f"{'lacks' if len(lacking) == 1 else 'lack'} the GPU taint "
                        f"{_taint(taint)} (gpuNodeTaints): {names(lacking)}; taint "
                        f"{them(lacking)} (kubectl taint nodes NODE {_taint(taint)}), or set "
                        "gpuNodesTainted: false if GPU nodes are not tainted here",
                    )
                )
    found += find_catalogue_drift(policy, nodes)
    found += find_device_plugin_drift(nodes, daemonsets or {}, placed)
    found += find_product_label_drift(policy, nodes)
    return found


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _lacking(nodes: Iterable[NodeInfo], taint: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the nodes without ``taint``."""
    return tuple(node.name for node in nodes if not node.has_taint(taint))


def _taint(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    return f"{taint.get('key')}{'' if value is None else '=' + str(value)}:{taint.get('effect')}"


def _selector(selector: Mapping[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(selector.items()))
