"""The sections of the daily inspection, each worked out from what was read: no request here
(``webhook.operations.inspect`` reads the cluster and calls these).

- GPU nodes: those ``ClusterFacts`` keeps (a vendor resource in the capacity, or GPU feature
  discovery's ``nvidia.com/gpu.present=true``); per resource its capacity, allocatable and
  what the Pods bound to it that have not ended request;
- mixed pools: a pool (or the GPU nodes in none) where nodes of different products offer
  the same GPU resource, by the product GPU feature discovery labels (its MIG and
  ``-SHARED`` suffixes left out: a MIG-partitioned A100 is still an A100);
- device plugins: the DaemonSets the policy names (else the well-known ones, found by name
  or image), and the GPU nodes none of them has a Ready Pod on (uncovered: the kubelet
  advertises no GPU there, or stale ones), those whose Pod is there and not Ready named;
- GPU quotas: the GPU entries of the quotas ``ClusterFacts`` read, used against hard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import partial
from typing import Any

from webhook.audit.device_plugin_drift import status_count
from webhook.core.inventory import (
    GPU_REPLICAS,
    gpu_product,
    is_gpu_resource,
    mig_profiles,
    time_sliced,
)
from webhook.core.node_lifecycle import node_state
from webhook.core.requests import spec_requests
from webhook.operations.causes import Cause
from webhook.operations.cluster_facts import MIG_CONFIG_STATE, GpuNode
from webhook.operations.inspect_report import (
    DevicePlugin,
    DevicePlugins,
    InspectedNode,
    MixedPool,
    NodeResource,
    PendingPod,
)
from webhook.operations.quota_facts import QuotaUse
from webhook.policy.mig import GPU_PRODUCT
from webhook.policy.model import DaemonSetName, Policy

MIG_CONFIG = "nvidia.com/mig.config"  # the MIG manager's layout, by the name of its config


def inspected_nodes(
    nodes: Iterable[GpuNode], uncovered: Iterable[str] = ()
) -> tuple[InspectedNode, ...]:
    """The GPU nodes, by name, with what their GPU resources hold, whether they are usable,
    and what about each needs attention (``uncovered``: the GPU nodes without a Ready device
    plugin Pod)."""
    without_plugin = set(uncovered)
    rows = []
    for node in sorted(nodes, key=lambda n: n.name):
        info = node.info
        replicas = info.labels.get(GPU_REPLICAS, "")
        allocated = node.allocated
        state = node_state((), node.taints, node.unschedulable, node.ready)
        attention = [state] if state else []
        short = [r for r in node.capacity if node.capacity[r] > node.allocatable.get(r, 0)]
        if short:
            attention.append(f"capacity above allocatable ({', '.join(sorted(short))})")
        if info.labels.get(MIG_CONFIG_STATE) == "failed":
            attention.append(f"MIG configuration failed ({MIG_CONFIG_STATE}=failed)")
        if node.name in without_plugin:
            attention.append("no Ready device plugin Pod")
        rows.append(
            InspectedNode(
                name=node.name,
                pools=tuple(pool.name for pool in node.pools),
                product=info.labels.get(GPU_PRODUCT),
                mig_config=info.labels.get(MIG_CONFIG),
                mig_profiles=tuple(sorted(mig_profiles(info))),
                replicas=int(replicas) if replicas.isdigit() else None,
                resources=tuple(
                    NodeResource(
                        name,
                        node.capacity.get(name, 0),
                        node.allocatable.get(name, 0),
                        allocated.get(name, 0),
                    )
                    for name in sorted({*node.capacity, *node.allocatable, *allocated})
                ),
                state=state,
                sharing=_sharing(node),
                attention=tuple(attention),
            )
        )
    return tuple(rows)


def _sharing(node: GpuNode) -> str:
    """How the node hands out its GPUs: MIG instances (a ``mig-`` resource, or the single
    strategy's ``-MIG-`` product), time-sliced replicas, or whole GPUs."""
    if mig_profiles(node.info) or "-MIG-" in node.info.labels.get(GPU_PRODUCT, ""):
        return "MIG"
    if time_sliced(node.info):
        return "time-sliced"
    return "whole"


def mixed_pools(nodes: Iterable[GpuNode], policy: Policy) -> tuple[MixedPool, ...]:
    """The pools (in the policy's order, then the GPU nodes in none) where one GPU resource is
    offered by nodes of more than one product: a Pod asking for it there gets either. Nodes
    that offer different resources (an A100 partitioned into MIG instances beside H100s
    offering whole GPUs) are no mix: a Pod asks for one or the other. Nodes without a
    product label are not counted."""
    by_pool: dict[str | None, dict[str, dict[str, list[str]]]] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        product = gpu_product(node.info)
        if product is None:
            continue
        pools: list[str | None] = [pool.name for pool in node.pools] or [None]
        for pool in pools:
            for resource in node.resources:
                offered = by_pool.setdefault(pool, {}).setdefault(resource, {})
                offered.setdefault(product.name, []).append(node.name)
    order = {pool.name: index for index, pool in enumerate(policy.pools)}
    found = []
    for pool, by_resource in sorted(
        by_pool.items(), key=lambda item: order.get(item[0] or "", len(order))
    ):
        mixed = sorted(resource for resource, products in by_resource.items() if len(products) > 1)
        if not mixed:
            continue
        products: dict[str, set[str]] = {}
        for resource in mixed:
            for offering, on in by_resource[resource].items():
                products.setdefault(offering, set()).update(on)
        found.append(
            MixedPool(
                pool,
                {name: tuple(sorted(on)) for name, on in sorted(products.items())},
                tuple(mixed),
            )
        )
    return tuple(found)


def device_plugins(
    nodes: Iterable[GpuNode],
    daemonsets: Mapping[DaemonSetName, Mapping[str, Any] | None],
    placed: Mapping[DaemonSetName, Mapping[str, bool]],
    found_by: Mapping[DaemonSetName, str] | None = None,
) -> DevicePlugins:
    """Each DaemonSet compared (``daemonsets`` as read, None: not found) and, per node its
    Pods are on, whether one there is Ready (``placed``), against the GPU nodes. Only a Ready
    Pod covers its node. ``found_by``: what says each runs the device plugin, where the
    policy names none and they were found by name or image."""
    gpu = sorted(node.name for node in nodes)
    rows = []
    covered: set[str] = set()
    present: set[str] = set()
    for named, daemonset in daemonsets.items():
        on = placed.get(named, {})
        present |= set(on)
        covered |= {node for node, ready in on.items() if ready}
        rows.append(
            DevicePlugin(
                named.namespace,
                named.name,
                daemonset is not None,
                status_count(daemonset, "desiredNumberScheduled") if daemonset else 0,
                status_count(daemonset, "numberReady") if daemonset else 0,
                sum(1 for name in gpu if name in on),
                (found_by or {}).get(named),
            )
        )
    compared = bool(daemonsets)
    uncovered = tuple(name for name in gpu if name not in covered) if compared else ()
    not_ready = tuple(name for name in uncovered if name in present)
    return DevicePlugins(
        compared,
        tuple(rows),
        len(gpu),
        uncovered,
        not_ready,
        found_by is not None and bool(found_by),
    )


def gpu_quotas(quotas: Mapping[str, Iterable[QuotaUse]]) -> tuple[QuotaUse, ...]:
    """The GPU entries of the quotas read, by namespace, name and resource."""
    return tuple(
        sorted(
            (use for uses in quotas.values() for use in uses),
            key=lambda q: (q.namespace, q.quota, q.resource),
        )
    )


def pending_pod(
    pod: Mapping[str, Any], cause: Cause | None, now: datetime, policy: Policy
) -> PendingPod:
    """A Pending GPU Pod's line: its age (from its creation), its scheduling gates and the
    cause given."""
    metadata = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    created = metadata.get("creationTimestamp")
    age = 0
    if isinstance(created, str):
        try:
            age = max(0, int((now - datetime.fromisoformat(created)).total_seconds()))
        except ValueError:  # the API server writes RFC 3339; anything else has no age
            age = 0
    gates = spec.get("schedulingGates")
    return PendingPod(
        str(metadata.get("namespace") or ""),
        str(metadata.get("name") or ""),
        age,
        spec_requests(spec, partial(is_gpu_resource, policy=policy)),
        cause,
        tuple(
            str(gate.get("name"))
            for gate in (gates if isinstance(gates, list) else ())
            if isinstance(gate, Mapping)
        ),
    )


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
