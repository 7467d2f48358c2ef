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
  the policy says GPU nodes are tainted);
- ``mig-product-not-catalogued``: where GPU feature discovery labelled the product
  (``nvidia.com/gpu.product``), a MIG-capable one that the MIG catalogue (built in, and
  ``migCatalogue.customProducts``) does not know (its profiles cannot be checked), or that
  ``migCatalogue.products`` leaves out while its nodes are in MIG instances (their profiles are
  not the policy's). Products that cannot be partitioned (L4, T4) and nodes without feature
  discovery's labels are not compared;
- ``mig-profile-not-catalogued``: a MIG profile a node is partitioned into (advertised as
  ``nvidia.com/mig-<profile>``, or the single strategy's in the product label) that the
  catalogue does not list for the node's product;
- ``device-plugin-daemonset-missing``: a DaemonSet ``devicePluginDaemonSets`` names that the
  cluster does not have;
- ``device-plugin-desired-mismatch``: a named DaemonSet whose desired count
  (``status.desiredNumberScheduled``) differs from the GPU nodes it should cover: those its
  template's node selector and required node affinity admit and whose NoSchedule and NoExecute
  taints it tolerates (with those the DaemonSet controller adds). More: the nodes without GPUs
  it also runs on are named. Fewer: its Pods are listed, and the GPU nodes it admits where it
  has none are named (none named when each has one: a stale status).

- ``gpu-node-without-product-label``: where a tenant may use some GPU products only
  (``tenants[].entitlements.products``), a GPU node without feature discovery's product label:
  its GPU Pods, confined by that label, cannot land there (GKE without feature discovery).

Without ``devicePluginDaemonSets`` no DaemonSet is read or compared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from webhook.cluster.connection import Cluster, ClusterError
from webhook.cluster.listing import AUDITOR_ROLE, Lister, selector_text, status_message
from webhook.cluster.ownership import controller_uid
from webhook.core.inventory import (
    NodeFields,
    NodeInfo,
    SharedParts,
    gpu_memory_mib,
    gpu_product,
    is_gpu_node,
    mig_capable,
    mig_profiles,
    node_info,
    pools_of,
    time_sliced,
)
from webhook.core.scheduling import assigned_node, daemon_pod_fits, selected_label_keys
from webhook.policy.mig import GPU_PRODUCT, catalogued_as
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


@dataclass(frozen=True, slots=True)
class Drift:
    """One disagreement between the policy and the cluster."""

    kind: str  # one of DRIFT_KINDS (or of the quotas', webhook.audit.quota_drift)
    subject: str  # the pool, taint or resource it is about ("" when none)
    nodes: tuple[str, ...]  # the nodes concerned, sorted (none when none can be named)
    message: str  # one sentence that says what disagrees and what to change
    namespaces: tuple[str, ...] = ()  # the namespaces concerned, sorted (quota drift)
    # "info": what holds, though not as the policy means it (no exit status of its own).
    level: Literal["drift", "info"] = "drift"


def check_cluster(cluster: Cluster, policy: Policy) -> tuple[list[Drift], int]:
    """The drift between ``policy`` and the cluster's nodes (and its device plugin
    DaemonSets), and how many nodes were read. An unreachable server, or a refused list or
    read, raises ``ClusterError``."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    lister = Lister(cluster, None)
    apps = k8s.AppsV1Api(cluster.api_client)
    core = k8s.CoreV1Api(cluster.api_client)
    daemonsets: dict[DaemonSetName, Mapping[str, Any] | None] = {}
    for named in policy.device_plugin_daemonsets:
        read = partial(apps.read_namespaced_daemon_set, named.name, named.namespace)
        try:
            daemonsets[named] = lister.call(read)
        except ApiException as exc:
            if exc.status != 404:
                raise refused(f"cannot read DaemonSet {named}", exc) from None
            daemonsets[named] = None
    # The labels the DaemonSets select nodes by are kept with the pools' (the GPU Operator's
    # nvidia.com/gpu.deploy.device-plugin is neither).
    selected = {key for ds in daemonsets.values() for key in selected_label_keys(_pod_spec(ds))}
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
        raise refused("cannot list nodes", exc) from None

    def placed(named: DaemonSetName) -> frozenset[str]:
        """The nodes the DaemonSet's Pods are on or bound for: listed (by its selector, kept
        if it controls them) only for one that wants fewer Pods than it should have."""
        daemonset = daemonsets.get(named) or {}
        metadata = daemonset.get("metadata")
        uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
        spec = daemonset.get("spec")
        selector = selector_text(spec.get("selector") if isinstance(spec, Mapping) else None)
        pods = partial(core.list_namespaced_pod, named.namespace, label_selector=selector)
        try:
            return frozenset(
                node
                for page in lister.pages(pods)
                for pod in page.get("items") or ()
                if isinstance(pod, dict) and uid is not None and controller_uid(pod) == uid
                for node in (assigned_node(_mapping(pod.get("spec"))),)
                if node
            )
        except ApiException as exc:
            raise refused(f"cannot list the Pods of DaemonSet {named}", exc) from None

    return find_drift(policy, nodes, daemonsets, placed), len(nodes)


def refused(what: str, exc: Any) -> ClusterError:
    """A refused read or list, as one line that names it (and the role, for a 403)."""
    hint = f": bind {AUDITOR_ROLE}" if exc.status == 403 else ""
    return ClusterError(f"{what} (HTTP {exc.status}): {status_message(exc)}{hint}")


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
        unpooled = tuple(node.name for node in nodes if is_gpu_node(node) and not pools[node.name])
        if unpooled:
            found.append(
                Drift(
                    "gpu-node-in-no-pool",
                    "",
                    unpooled,
                    f"{_count(unpooled, 'GPU node')} in no declared pool: "
                    f"{_names(unpooled)}; label {_them(unpooled)} as a pool selects, or declare "
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
                        f"{_count(lacking, 'node')} of pool {pool.name!r} "
                        f"{'lacks' if len(lacking) == 1 else 'lack'} its taint {_taint(taint)}: "
                        f"{_names(lacking)}; Pods that do not tolerate it can land there "
                        f"(kubectl taint nodes NODE {_taint(taint)})",
                    )
                )

    for pool, pool_nodes in zip(policy.pools, members, strict=True):
        advertised: dict[str, list[str]] = {}
        for node in pool_nodes:
            for resource in node.vendor_resources():
                if resource not in pool.resources and resource not in policy.companion_names:
                    advertised.setdefault(resource, []).append(node.name)
        for resource, names in sorted(advertised.items()):
            found.append(
                Drift(
                    "pool-node-undeclared-resource",
                    f"{pool.name}: {resource}",
                    tuple(names),
                    f"{_count(names, 'node')} of pool {pool.name!r} "
                    f"{'advertises' if len(names) == 1 else 'advertise'} {resource}, which the "
                    f"pool does not declare: {_names(names)}; add it to the pool's resources "
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
                    f"{_count(shared, 'node')} of it {'shares' if len(shared) == 1 else 'share'} "
                    f"{'its' if len(shared) == 1 else 'their'} GPUs (time-slicing or MPS): "
                    f"{_names(shared)}; declare the sharing the nodes run, or give them the "
                    "pool's exclusive device plugin configuration",
                )
            )

    if policy.gpu_nodes_tainted:
        outside = [node for node in nodes if is_gpu_node(node) and not pools[node.name]]
        for taint in policy.gpu_node_taints:
            lacking = _lacking(outside, taint)
            if lacking:
                found.append(
                    Drift(
                        "gpu-node-missing-taint",
                        _taint(taint),
                        lacking,
                        f"{_count(lacking, 'GPU node')} in no pool "
                        f"{'lacks' if len(lacking) == 1 else 'lack'} the GPU taint "
                        f"{_taint(taint)} (gpuNodeTaints): {_names(lacking)}; taint "
                        f"{_them(lacking)} (kubectl taint nodes NODE {_taint(taint)}), or set "
                        "gpuNodesTainted: false if GPU nodes are not tainted here",
                    )
                )
    found += _catalogue_drift(policy, nodes)
    found += _device_plugin_drift(nodes, daemonsets or {}, placed)
    found += _product_label_drift(policy, nodes)
    return found


def _product_label_drift(policy: Policy, nodes: list[NodeInfo]) -> list[Drift]:
    """GPU nodes a product entitlement cannot reach: they lack the label it confines by."""
    entitled = [
        f"tenants[{t.index}] ({t.named})"
        for t in policy.tenants
        if t.entitlements is not None and t.entitlements.products is not None
    ]
    unlabelled = tuple(n.name for n in nodes if is_gpu_node(n) and GPU_PRODUCT not in n.labels)
    if not entitled or not unlabelled:
        return []
    return [
        Drift(
            "gpu-node-without-product-label",
            "",
            unlabelled,
            f"{_count(unlabelled, 'GPU node')} without GPU feature discovery's product label "
            f"({GPU_PRODUCT}): {_names(unlabelled)}; the GPU Pods of tenants that may use some "
            f"products only ({'; '.join(entitled)}) are confined by that label and cannot land "
            f"there: run GPU feature discovery (the GPU Operator runs it), or label "
            f"{_them(unlabelled)} with {'its' if len(unlabelled) == 1 else 'their'} product "
            f"(kubectl label nodes NODE {GPU_PRODUCT}=PRODUCT)",
        )
    ]


def _catalogue_drift(policy: Policy, nodes: list[NodeInfo]) -> list[Drift]:
    """The MIG-capable products the policy's catalogue does not know, those in MIG instances
    that its products leave out, then the profiles it does not list for a product it knows;
    nodes without feature discovery's product label are not compared."""
    catalogue = policy.mig_catalogue
    every_product = "*" in policy.mig_products
    unknown: dict[str, list[str]] = {}  # the product as labelled -> nodes
    left_out: dict[str, list[str]] = {}  # a catalogued product not in products -> nodes
    unlisted: dict[tuple[str, str], list[str]] = {}  # (catalogued product, profile) -> nodes
    for node in nodes:
        product = gpu_product(node)
        if product is None or not mig_capable(node):
            continue
        entry = catalogued_as(product, gpu_memory_mib(node), catalogue)
        if entry is None:
            unknown.setdefault(product.name, []).append(node.name)
            continue
        profiles = mig_profiles(node)
        if profiles and not every_product and entry not in policy.mig_products:
            left_out.setdefault(entry, []).append(node.name)
        for profile in sorted(profiles - catalogue[entry]):
            unlisted.setdefault((entry, profile), []).append(node.name)

    found: list[Drift] = []
    also = "" if every_product else " and to migCatalogue.products"
    for labelled, names in sorted(unknown.items()):
        found.append(
            Drift(
                "mig-product-not-catalogued",
                labelled,
                tuple(names),
                f"{_count(names, 'node')} with the MIG-capable GPU {labelled} "
                f"(nvidia.com/gpu.product), which the MIG catalogue does not know: "
                f"{_names(names)}; the MIG profiles of such nodes cannot be checked. Add it to "
                f"migCatalogue.customProducts (name: {labelled}, profiles: those nvidia-smi mig "
                f"-lgip lists on one of them){also}",
            )
        )
    for entry, names in sorted(left_out.items()):
        found.append(
            Drift(
                "mig-product-not-catalogued",
                entry,
                tuple(names),
                f"{_count(names, 'node')} with {entry} GPUs in MIG instances, a catalogued "
                f"product that migCatalogue.products leaves out: {_names(names)}; the policy "
                "accepts their profiles only where a listed product offers them too: add "
                f"{entry} to migCatalogue.products",
            )
        )
    for (entry, profile), names in sorted(unlisted.items()):
        offered = ", ".join(sorted(catalogue[entry]))
        found.append(
            Drift(
                "mig-profile-not-catalogued",
                f"{entry}: {profile}",
                tuple(names),
                f"{_count(names, 'node')} with {entry} GPUs "
                f"{'is' if len(names) == 1 else 'are'} partitioned into MIG profile {profile}, "
                f"which the catalogue does not list for {entry} ({offered}): {_names(names)}; "
                "correct the nodes' MIG configuration (nvidia.com/mig.config) or their product, "
                f"or, if {entry} does offer {profile}, declare {entry} in "
                "migCatalogue.customProducts with every profile it offers",
            )
        )
    return found


def _device_plugin_drift(
    nodes: list[NodeInfo],
    daemonsets: Mapping[DaemonSetName, Mapping[str, Any] | None],
    placed: Callable[[DaemonSetName], frozenset[str]] | None,
) -> list[Drift]:
    """The named DaemonSets that do not exist, then those whose desired count differs from
    the GPU nodes they should cover."""
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
        spec = _pod_spec(daemonset)
        desired = _status_count(daemonset, "desiredNumberScheduled")
        admitted = [node for node in nodes if _runs_on(spec, node)]
        covered = [node.name for node in admitted if is_gpu_node(node)]
        if desired == len(covered):
            continue
        extra = tuple(node.name for node in admitted if not is_gpu_node(node))
        should = (
            f"DaemonSet {named} would run {_number(desired, 'Pod')} "
            f"(status.desiredNumberScheduled; {_status_count(daemonset, 'numberReady')} ready) "
            f"where {_count(covered, 'GPU node')} "
            f"{'admits' if len(covered) == 1 else 'admit'} it (its node selector, node "
            "affinity and tolerations)"
        )
        if desired > len(covered) and extra:
            message = (
                f"{should}; it also runs on {_count(extra, 'node')} without GPUs: "
                f"{_names(extra)}; narrow its nodeSelector or node affinity to the GPU nodes"
            )
            concerned = extra
        else:
            on = placed(named) if placed is not None and desired < len(covered) else None
            concerned = tuple(name for name in covered if on is not None and name not in on)
            why = f"(kubectl describe daemonset -n {named.namespace} {named.name})"
            if concerned:
                message = (
                    f"{should}; {_count(concerned, 'GPU node')} it admits "
                    f"{'has' if len(concerned) == 1 else 'have'} no Pod of it, and no Pod "
                    f"can be given {'its' if len(concerned) == 1 else 'their'} GPUs: "
                    f"{_names(concerned)}; see why {why}"
                )
            else:
                message = (
                    f"{should}: its status is stale or the DaemonSet controller places it "
                    f"otherwise; see which GPU nodes lack its Pod (kubectl get pods -n "
                    f"{named.namespace} -o wide) and why {why}"
                )
        found.append(Drift("device-plugin-desired-mismatch", str(named), concerned, message))
    return found


def _runs_on(spec: Mapping[str, Any], node: NodeInfo) -> bool:
    """Whether the DaemonSet controller places a Pod of this template on the node."""
    taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in node.taints]
    return daemon_pod_fits(spec, node.labels, node.name, taints)


def _status_count(daemonset: Mapping[str, Any], field: str) -> int:
    """A count in a DaemonSet's status (the API server leaves out zeros)."""
    status = daemonset.get("status")
    value = status.get(field) if isinstance(status, Mapping) else None
    return value if isinstance(value, int) else 0


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _pod_spec(daemonset: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A DaemonSet's ``spec.template.spec`` ({} when absent or malformed)."""
    value: Any = daemonset
    for key in ("spec", "template", "spec"):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _lacking(nodes: Iterable[NodeInfo], taint: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the nodes without ``taint``."""
    return tuple(node.name for node in nodes if not node.has_taint(taint))


def _taint(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    return f"{taint.get('key')}{'' if value is None else '=' + str(value)}:{taint.get('effect')}"


def _selector(selector: Mapping[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(selector.items()))


def _count(names: Iterable[str] | tuple[str, ...] | list[str], what: str) -> str:
    return _number(len(list(names)), what)


def _number(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _names(names: Iterable[str]) -> str:
    listed = list(names)
    shown = ", ".join(listed[:10])
    return shown if len(listed) <= 10 else f"{shown} and {len(listed) - 10} more"


def _them(names: tuple[str, ...] | list[str]) -> str:
    return "it" if len(names) == 1 else "them"
