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

What is not compared yet: GPU products and MIG profiles against the MIG catalogue, and a
device plugin DaemonSet's desired count against the GPU nodes it should cover.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.cluster.connection import Cluster
from webhook.cluster.listing import Lister
from webhook.core.inventory import (
    NodeInfo,
    SharedParts,
    is_gpu_node,
    node_info,
    pools_of,
    time_sliced,
)
from webhook.policy.model import Policy

DRIFT_KINDS = (
    "pool-without-nodes",
    "gpu-node-in-no-pool",
    "pool-node-missing-taint",
    "pool-node-undeclared-resource",
    "time-sliced-node-in-exclusive-pool",
    "gpu-node-missing-taint",
)
# The resource time-slicing shares when its replicas keep the device plugin's default name.
SHARED_BY_TIME_SLICING = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class Drift:
    """One disagreement between the policy and the cluster."""

    kind: str  # one of DRIFT_KINDS
    subject: str  # the pool, taint or resource it is about ("" when none)
    nodes: tuple[str, ...]  # the nodes concerned, sorted (none for a pool without nodes)
    message: str  # one sentence that says what disagrees and what to change


def check_cluster(cluster: Cluster, policy: Policy) -> tuple[list[Drift], int]:
    """The drift between ``policy`` and the cluster's nodes, and how many nodes were read.
    An unreachable server raises ``ClusterError``; a refused list raises the client's
    ``ApiException``."""
    from kubernetes import client as k8s

    shared = SharedParts()
    nodes = [
        node_info(obj, policy, shared)  # each page as it arrives: no Node kept whole
        for page in Lister(cluster, None).pages(k8s.CoreV1Api(cluster.api_client).list_node)
        for obj in page.get("items") or ()
        if isinstance(obj, dict)
    ]
    return find_drift(policy, nodes), len(nodes)


def find_drift(policy: Policy, nodes: Iterable[NodeInfo]) -> list[Drift]:
    """Every disagreement, in the order of DRIFT_KINDS, then by subject."""
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
    return found


def _lacking(nodes: Iterable[NodeInfo], taint: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the nodes without ``taint``."""
    return tuple(node.name for node in nodes if not node.has_taint(taint))


def _taint(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    return f"{taint.get('key')}{'' if value is None else '=' + str(value)}:{taint.get('effect')}"


def _selector(selector: Mapping[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(selector.items()))


def _count(names: Iterable[str] | tuple[str, ...] | list[str], what: str) -> str:
    count = len(list(names))
    return f"{count} {what}{'' if count == 1 else 's'}"


def _names(names: Iterable[str]) -> str:
    listed = list(names)
    shown = ", ".join(listed[:10])
    return shown if len(listed) <= 10 else f"{shown} and {len(listed) - 10} more"


def _them(names: tuple[str, ...] | list[str]) -> str:
    return "it" if len(names) == 1 else "them"
