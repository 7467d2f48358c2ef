"""The daily GPU inspection (``gpu-admission inspect``) as a record: what the report says of
each section, and its JSON document (``data/inspect.schema.json`` describes it).

Sections, in the guide's order of its daily checklist: the GPU nodes (allocatable and allocated
GPUs by resource, product, MIG layout), the Pending GPU Pods (age and the first cause
``explain`` finds), the device plugin DaemonSets against the GPU nodes they should cover, the
GPU quotas, the policy's drift (``cluster check``'s findings), mixed hardware pools, and, with a
previous report, what changed since (``webhook.operations.inspect_changes``).

Findings, what makes the command exit 1: a GPU Pod Pending longer than ``--pending-after``
with a cause (not a younger one, nor one the scheduler has not tried yet, nor one its
scheduling gates hold for its queue), a GPU node no device plugin Pod covers, a GPU quota
used up (hard above 0: a quota of 0 forbids the resource, it is not used up), a drift (not a
note). The rest is information.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from webhook.audit.drift_finding import Drift
from webhook.core.wording import plain_number
from webhook.operations.causes import Cause
from webhook.operations.quota_facts import QuotaUse
from webhook.policy.quantity import Quantity

API_VERSION = "gpu-admission.io/v1alpha1"
KIND = "GPUInspection"


@dataclass(frozen=True, slots=True)
class NodeResource:
    """One vendor resource of a node: what its capacity and allocatable say, and what the
    Pods bound to it that have not ended request."""

    name: str
    capacity: Quantity
    allocatable: Quantity
    allocated: Quantity


@dataclass(frozen=True, slots=True)
class InspectedNode:
    """One GPU node: its pools, product (``nvidia.com/gpu.product``, None without it), MIG
    layout (``nvidia.com/mig.config`` and the profiles it advertises), time-slicing replicas
    (``nvidia.com/gpu.replicas``) and its GPU resources. ``state``: why it is out of use
    ("" where usable: ``webhook.core.node_lifecycle``, NotReady, cordoned, being removed);
    ``sharing``: how its GPUs are handed out (``whole``, ``MIG``, ``time-sliced``);
    ``attention``: what about it needs a look (out of use, capacity above allocatable, a
    failed MIG configuration, no Ready device plugin Pod)."""

    name: str
    pools: tuple[str, ...]
    product: str | None
    mig_config: str | None
    mig_profiles: tuple[str, ...]
    replicas: int | None
    resources: tuple[NodeResource, ...]
    state: str = ""
    sharing: str = "whole"
    attention: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A GPU Pod no node has been given: how long it has waited, the first cause ``explain``
    finds (None: nothing blocks it, the scheduler has not yet placed it) and its scheduling
    gates (a queue such as Kueue holds it until it removes them)."""

    namespace: str
    name: str
    age_seconds: int
    requests: Mapping[str, Quantity]  # its GPU resources, by name
    cause: Cause | None
    gates: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DevicePlugin:
    """A device plugin DaemonSet the policy names: its status counts and the GPU nodes its
    Pods are on. ``found`` false: the cluster has no such DaemonSet. (Whether its desired
    count matches the GPU nodes its selector and tolerations admit is ``cluster check``'s
    ``device-plugin-desired-mismatch``, in the drift section.)"""

    namespace: str
    name: str
    found: bool
    desired: int
    ready: int
    on_gpu_nodes: int
    found_by: str | None = None  # what says it runs the device plugin, where found by it


@dataclass(frozen=True, slots=True)
class DevicePlugins:
    """The device plugin section: ``compared`` false when the policy names no DaemonSet
    (``devicePluginDaemonSets``); ``gpu_nodes`` how many GPU nodes they should cover between
    them; ``uncovered`` those no named DaemonSet has a Pod on: no Pod can be given their
    GPUs."""

    compared: bool
    daemonsets: tuple[DevicePlugin, ...]
    gpu_nodes: int
    uncovered: tuple[str, ...]
    not_ready: tuple[str, ...] = ()  # of ``uncovered``, those whose plugin Pod is not Ready
    discovered: bool = False  # the policy names none: the DaemonSets were found by name/image


@dataclass(frozen=True, slots=True)
class MixedPool:
    """A pool where nodes of different GPU products offer the same GPU resource: ``pool``
    None for the GPU nodes in no pool; ``products`` each product and its nodes that offer
    one of ``resources``."""

    pool: str | None
    products: Mapping[str, tuple[str, ...]]
    resources: tuple[str, ...] = ()  # the GPU resources nodes of different products offer


@dataclass(frozen=True, slots=True)
class GpusLost:
    """A node that advertises fewer of a resource (allocatable) than the previous report."""

    node: str
    resource: str
    before: Quantity
    after: Quantity


@dataclass(frozen=True, slots=True)
class Reshaped:
    """A node that lost some GPU resources and gained others: a MIG re-partition
    (``mig-1g.10gb`` 56 to ``mig-3g.40gb`` 16) or a rename (``nvidia.com/gpu`` to
    ``nvidia.com/gpu.shared``), one change, not a loss. ``before`` and ``after``: the
    resources that changed, with their allocatable."""

    node: str
    before: tuple[tuple[str, Quantity], ...]
    after: tuple[tuple[str, Quantity], ...]


@dataclass(frozen=True, slots=True)
class ProductChange:
    """A node of the same name that now carries another product (re-boarded)."""

    node: str
    before: str | None
    after: str | None


@dataclass(frozen=True, slots=True)
class NetChange:
    """A pool's product's GPU resource whose allocatable over its nodes went up or down
    (nodes gone and added, GPUs lost or gained): ``pool`` None for the nodes in none."""

    pool: str | None
    product: str | None
    resource: str
    before: Quantity
    after: Quantity


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed since a previous report (``--since``), made at ``since``: GPUs lost
    (a node's resource down, nothing gained beside it), gained, re-shaped (lost and gained
    on one node), products changed per node, and the net per pool and product."""

    since: str
    nodes_gone: tuple[str, ...]
    nodes_added: tuple[str, ...]
    gpus_lost: tuple[GpusLost, ...]
    new_products: tuple[str, ...]
    gpus_gained: tuple[GpusLost, ...] = ()
    reshaped: tuple[Reshaped, ...] = ()
    products_changed: tuple[ProductChange, ...] = ()
    net: tuple[NetChange, ...] = ()


@dataclass(frozen=True, slots=True)
class InspectReport:
    """The whole inspection, made at ``generated`` against the policy ``policy``.
    ``pending``: the Pending GPU Pods no gate holds, of which those Pending ``pending_after``
    seconds or more with a cause are findings (:meth:`overdue`); ``gated``: those their
    scheduling gates hold, waiting for their queue (no finding)."""

    generated: datetime
    policy: str
    nodes_read: int
    gpu_nodes: tuple[InspectedNode, ...]
    pending: tuple[PendingPod, ...]
    gated: tuple[PendingPod, ...]
    pending_after: int
    device_plugins: DevicePlugins
    quotas: tuple[QuotaUse, ...]
    drift: tuple[Drift, ...]
    mixed_pools: tuple[MixedPool, ...]
    changes: Changes | None = None
    notes: tuple[str, ...] = field(default=())  # what could not be read, and was left out

    def overdue(self, pod: PendingPod) -> bool:
        """A Pending Pod that is a finding: it waited ``pending_after`` and has a cause (a
        younger one, or one the scheduler has not tried yet, is the cluster's churn)."""
        return pod.cause is not None and pod.age_seconds >= self.pending_after

    def findings(self) -> dict[str, int]:
        """What makes ``inspect`` exit 1, counted by section."""
        return {
            "pendingGpuPods": sum(1 for pod in self.pending if self.overdue(pod)),
            "uncoveredGpuNodes": len(self.device_plugins.uncovered),
            "exhaustedQuotas": sum(1 for quota in self.quotas if quota.exhausted),
            "drift": sum(1 for found in self.drift if found.level == "drift"),
        }

    def clean(self) -> bool:
        return not any(self.findings().values())


def timestamp(moment: datetime) -> str:
    """A moment as the API server writes one: RFC 3339 in UTC, to the second."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def report_document(report: InspectReport) -> dict[str, Any]:
    """The report as JSON (``data/inspect.schema.json``), what ``--since`` reads back."""
    plugins = report.device_plugins
    changes = report.changes
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "generatedAt": timestamp(report.generated),
        "policy": report.policy,
        "nodesRead": report.nodes_read,
        "findings": report.findings(),
        "nodes": [
            {
                "name": node.name,
                "pools": list(node.pools),
                "product": node.product,
                "migConfig": node.mig_config,
                "migProfiles": list(node.mig_profiles),
                "replicas": node.replicas,
                "state": node.state or None,
                "sharing": node.sharing,
                "attention": list(node.attention),
                "resources": [
                    {
                        "name": resource.name,
                        "capacity": plain_number(resource.capacity),
                        "allocatable": plain_number(resource.allocatable),
                        "allocated": plain_number(resource.allocated),
                    }
                    for resource in node.resources
                ],
            }
            for node in report.gpu_nodes
        ],
        "pendingAfterSeconds": report.pending_after,
        "pendingPods": [
            {
                "namespace": pod.namespace,
                "name": pod.name,
                "ageSeconds": pod.age_seconds,
                "requests": {name: plain_number(n) for name, n in pod.requests.items()},
                "cause": None
                if pod.cause is None
                else {"kind": pod.cause.kind, "summary": pod.cause.summary, "fix": pod.cause.fix},
                "finding": report.overdue(pod),
            }
            for pod in report.pending
        ],
        "gatedPods": [
            {
                "namespace": pod.namespace,
                "name": pod.name,
                "ageSeconds": pod.age_seconds,
                "requests": {name: plain_number(n) for name, n in pod.requests.items()},
                "gates": list(pod.gates),
            }
            for pod in report.gated
        ],
        "devicePlugins": {
            "compared": plugins.compared,
            "daemonSets": [
                {
                    "namespace": ds.namespace,
                    "name": ds.name,
                    "found": ds.found,
                    "desired": ds.desired,
                    "ready": ds.ready,
                    "onGpuNodes": ds.on_gpu_nodes,
                    "foundBy": ds.found_by,
                }
                for ds in plugins.daemonsets
            ],
            "gpuNodes": plugins.gpu_nodes,
            "uncoveredNodes": list(plugins.uncovered),
            "notReadyNodes": list(plugins.not_ready),
            "discovered": plugins.discovered,
        },
        "quotas": [
            {
                "namespace": quota.namespace,
                "name": quota.quota,
                "resource": quota.resource,
                "used": plain_number(quota.used),
                "hard": plain_number(quota.hard),
                "exhausted": quota.exhausted,
                "forbids": quota.forbids,
            }
            for quota in report.quotas
        ],
        "drift": [
            {
                "kind": found.kind,
                "level": found.level,
                "subject": found.subject,
                "nodes": list(found.nodes),
                "namespaces": list(found.namespaces),
                "message": found.message,
            }
            for found in report.drift
        ],
        "mixedPools": [
            {
                "pool": mixed.pool,
                "products": {product: list(nodes) for product, nodes in mixed.products.items()},
                "resources": list(mixed.resources),
            }
            for mixed in report.mixed_pools
        ],
        "changes": None
        if changes is None
        else {
            "since": changes.since,
            "nodesGone": list(changes.nodes_gone),
            "nodesAdded": list(changes.nodes_added),
            "gpusLost": [
                {
                    "node": lost.node,
                    "resource": lost.resource,
                    "before": plain_number(lost.before),
                    "after": plain_number(lost.after),
                }
                for lost in changes.gpus_lost
            ],
            "newProducts": list(changes.new_products),
            "gpusGained": [
                {
                    "node": gained.node,
                    "resource": gained.resource,
                    "before": plain_number(gained.before),
                    "after": plain_number(gained.after),
                }
                for gained in changes.gpus_gained
            ],
            "reshaped": [
                {
                    "node": reshaped.node,
                    "before": {name: plain_number(q) for name, q in reshaped.before},
                    "after": {name: plain_number(q) for name, q in reshaped.after},
                }
                for reshaped in changes.reshaped
            ],
            "productsChanged": [
                {"node": changed.node, "before": changed.before, "after": changed.after}
                for changed in changes.products_changed
            ],
            "net": [
                {
                    "pool": net.pool,
                    "product": net.product,
                    "resource": net.resource,
                    "before": plain_number(net.before),
                    "after": plain_number(net.after),
                }
                for net in changes.net
            ],
        },
        "notes": list(report.notes),
    }


def report_schema() -> dict[str, Any]:
    """The JSON Schema of :func:`report_document`'s output, as packaged."""
    text = resources.files("webhook.operations").joinpath("data/inspect.schema.json")
    schema: dict[str, Any] = json.loads(text.read_text("utf-8"))
    return schema
