"""What the webhook knows of the cluster's nodes: per Node, only what decisions and ``cluster
check`` read, in an immutable record.

Kept of a Node: its name; the labels that the policy's pools select on and the GPU
feature-discovery labels the checks read (``FEATURE_DISCOVERY_LABELS``, a fixed list: whoever
can label a node cannot make the inventory keep more); whether node feature discovery found an
NVIDIA PCI device; its taints; the capacity and allocatable of the resources under the
policy's vendor domains. A Node object is 5 to 20 KB (images, conditions, addresses); what is
kept is a few hundred bytes.

Inventory findings are never a reason to deny: nodes appear with nothing advertised until
their device plugin is up, MIG reconfiguration empties allocatable, autoscaled groups scale
from zero, and GPUs allocated through DRA never appear in allocatable.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from webhook.core.dra_inventory import NO_DRA_OBJECTS, DraLookups, DraObjects
from webhook.policy.mig import (
    GPU_PRODUCT,
    MIG_PREFIX,
    SHARED_SUFFIX,
    GpuProduct,
    base_profile,
    gfd_product,
    is_well_formed,
)
from webhook.policy.model import Policy, Pool
from webhook.policy.quantity import Quantity, parse_quantity

# Written by GPU feature discovery (the GPU Operator) on every node with an NVIDIA GPU.
GPU_PRESENT = "nvidia.com/gpu.present"
GPU_REPLICAS = "nvidia.com/gpu.replicas"
GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB; with the MIG single strategy, one instance's
MIG_CAPABLE = "nvidia.com/mig.capable"
# The device plugin's mixed MIG strategy advertises nvidia.com/mig-<profile>, GPU feature
# discovery's vendor.
MIG_RESOURCE_PREFIX = f"nvidia.com/{MIG_PREFIX}"
# GPU feature discovery's labels that say what a node's GPUs are and how they are shared.
FEATURE_DISCOVERY_LABELS = frozenset(
    {
        GPU_PRESENT,
        GPU_PRODUCT,
        GPU_REPLICAS,
        GPU_MEMORY,
        MIG_CAPABLE,
        "nvidia.com/gpu.count",
        "nvidia.com/gpu.family",
        "nvidia.com/gpu.sharing-strategy",
        "nvidia.com/mig.strategy",
        "nvidia.com/mig.config",
    }
)
# Node feature discovery's PCI labels for NVIDIA's vendor id (10de), in every form its
# deviceLabelFields make: stock NFD's pci-0302_10de.present (class and vendor), the GPU
# Operator's and OpenShift's pci-10de.present (vendor only), with a device id after it.
NVIDIA_PCI_LABEL = re.compile(
    r"feature\.node\.kubernetes\.io/pci-(?:[0-9a-f]{4}_)?10de(?:[_-][0-9a-f]{4})?\.present\Z"
)
# Labels a cloud's node pools put on their GPU nodes from the start (GKE, Karpenter on EKS,
# EKS's older one, AKS).
PROVIDER_GPU_LABELS = frozenset(
    {
        "cloud.google.com/gke-accelerator",
        "karpenter.k8s.aws/instance-gpu-count",
        "karpenter.k8s.aws/instance-gpu-name",
        "karpenter.k8s.aws/instance-gpu-manufacturer",
        "k8s.amazonaws.com/accelerator",
        "kubernetes.azure.com/accelerator",
    }
)
# Taints of a node that is still starting: what it is may not be labelled yet.
STARTING_TAINTS = frozenset(
    {"node.cloudprovider.kubernetes.io/uninitialized", "node.kubernetes.io/not-ready"}
)
EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What is kept of one Node (see the module's docstring)."""

    name: str
    labels: Mapping[str, str]
    # A label not kept says the node has a GPU: node feature discovery's NVIDIA PCI label, a
    # label under a vendor domain (the GPU Operator's nvidia.com/gpu.deploy.*), a cloud's GPU
    # label (PROVIDER_GPU_LABELS).
    gpu_labelled: bool
    taints: tuple[Taint, ...]
    capacity: Mapping[str, str]  # vendor-domain resources only
    allocatable: Mapping[str, str]  # vendor-domain resources only

    def advertises(self, resource: str) -> bool:
        """Whether the node's capacity lists ``resource`` with a quantity above zero."""
        return _positive(self.capacity.get(resource))

    def vendor_resources(self) -> tuple[str, ...]:
        """The vendor-domain resources its capacity lists above zero, sorted."""
        return tuple(sorted(name for name, value in self.capacity.items() if _positive(value)))

    def has_taint(self, declared: Mapping[str, Any]) -> bool:
        """Whether the node carries a taint as declared (key and effect; value when declared)."""
        value = declared.get("value")
        return any(
            taint.key == declared.get("key")
            and taint.effect == declared.get("effect")
            and (value is None or taint.value == str(value))
            for taint in self.taints
        )


class KeptFields(Protocol):
    """What decides what is kept of a Node: the policy's pool label keys and vendor domains
    (a :class:`~webhook.policy.model.Policy`, or :class:`NodeFields` where there is none)."""

    @property
    def gpu_label_keys(self) -> frozenset[str]: ...

    @property
    def vendor_domains(self) -> tuple[str, ...]: ...

    @property
    def namespace_label_keys(self) -> frozenset[str]: ...


class NodeFields(NamedTuple):
    """:class:`KeptFields` without a policy (the inventory's process gets them alone). With
    ``namespace_label_keys`` (the keys tenants select namespaces by), the inventory watches
    Namespaces too and keeps those labels of each."""

    gpu_label_keys: frozenset[str]
    vendor_domains: tuple[str, ...]
    namespace_label_keys: frozenset[str] = frozenset()

    @classmethod
    def of(cls, policy: KeptFields) -> NodeFields:
        return cls(policy.gpu_label_keys, policy.vendor_domains, policy.namespace_label_keys)


def keeps_label(key: str, kept: KeptFields) -> bool:
    """Whether a node label is kept: a pool's selector key or a GPU feature-discovery label."""
    return key in kept.gpu_label_keys or key in FEATURE_DISCOVERY_LABELS


class SharedParts:
    """One copy of each set of labels, resources and taints that several Nodes share (a pool's
    nodes carry the same ones), and of each string in them. Measured on 5,000 Nodes as a
    managed cluster writes them (Python's allocations, tracemalloc): 9.8 MiB kept without
    sharing, 2.4 MiB with it. At most ``limit`` distinct parts are remembered: past that it
    starts over, so nodes relabelled again and again cannot make it grow."""

    def __init__(self, limit: int = 4096) -> None:
        self._parts: dict[Any, Any] = {}
        self._limit = limit

    def mapping(self, items: dict[str, str]) -> Mapping[str, str]:
        if not items:
            return EMPTY
        key = tuple(sorted(items.items()))
        shared = self._parts.get(key)
        if shared is None:
            shared = MappingProxyType({sys.intern(k): sys.intern(v) for k, v in key})
            self._remember(key, shared)
        return shared

    def taints(self, taints: tuple[Taint, ...]) -> tuple[Taint, ...]:
        shared = self._parts.get(taints)
        if shared is None:
            shared = taints
            self._remember(taints, shared)
        return shared

    def _remember(self, key: Any, part: Any) -> None:
        if len(self._parts) >= self._limit:
            self._parts.clear()
        self._parts[key] = part


def node_info(
    node: Mapping[str, Any],
    kept: KeptFields,
    shared: SharedParts | None = None,
    *,
    every_label: bool = False,
) -> NodeInfo:
    """What is kept of a Node object as the API server sent it (malformed parts are left out);
    with ``shared``, parts other Nodes have are one copy. ``every_label``: every label kept,
    not only ``keeps_label``'s: for ``policy init``, which drafts node selectors from any
    label; never for the inventory (whoever can label a node would make it grow)."""
    metadata = _mapping(node.get("metadata"))
    spec = _mapping(node.get("spec"))
    status = _mapping(node.get("status"))
    all_labels = _mapping(metadata.get("labels"))
    labels = (
        {str(key): str(value) for key, value in all_labels.items()}
        if every_label
        else {
            str(key): str(value) for key, value in all_labels.items() if keeps_label(str(key), kept)
        }
    )
    gpu_labelled = any(_gpu_label(str(key), kept.vendor_domains) for key in all_labels)
    taints = tuple(
        Taint(str(taint.get("key") or ""), str(taint.get("value") or ""), str(taint.get("effect")))
        for taint in spec.get("taints") or ()
        if isinstance(taint, Mapping)
    )
    capacity = _vendor(status.get("capacity"), kept.vendor_domains)
    allocatable = _vendor(status.get("allocatable"), kept.vendor_domains)
    if shared is None:
        return NodeInfo(
            str(metadata.get("name") or ""),
            MappingProxyType(labels) if labels else EMPTY,
            gpu_labelled,
            taints,
            MappingProxyType(capacity) if capacity else EMPTY,
            MappingProxyType(allocatable) if allocatable else EMPTY,
        )
    return NodeInfo(
        str(metadata.get("name") or ""),
        shared.mapping(labels),
        gpu_labelled,
        shared.taints(taints),
        shared.mapping(capacity),
        shared.mapping(allocatable),
    )


def pools_of(node: NodeInfo, policy: Policy) -> tuple[Pool, ...]:
    """The declared pools whose node selector the node's labels match."""
    return tuple(
        pool
        for pool in policy.pools
        if pool.node_selector
        and all(node.labels.get(key) == value for key, value in pool.node_selector.items())
    )


def is_gpu_node(node: NodeInfo) -> bool:
    """A node that has GPUs by its own account: a vendor resource in its capacity, or GPU
    feature discovery's ``nvidia.com/gpu.present=true``."""
    return bool(node.vendor_resources()) or node.labels.get(GPU_PRESENT) == "true"


def is_gpu_resource(name: str, policy: Policy) -> bool:
    """A resource that hands out GPUs, as ``explain`` and ``inspect`` count them: a vendor
    resource (``Policy.is_vendor_resource``) the policy does not declare a companion (a
    NIC's ``nvidia.com/hostdev``, HAMi's memory slices: ``companionResources``)."""
    return name not in policy.companion_names and policy.is_vendor_resource(name)


def has_gpus(node: NodeInfo, policy: Policy) -> bool:
    """``is_gpu_node`` as ``explain`` and ``inspect`` count one: a GPU resource
    (:func:`is_gpu_resource`) in its capacity, or ``nvidia.com/gpu.present=true``. (The
    admission path keeps ``is_gpu_node``: a companion-only node is no CPU node to it.)"""
    return node.labels.get(GPU_PRESENT) == "true" or any(
        is_gpu_resource(name, policy) for name in node.vendor_resources()
    )


def time_sliced(node: NodeInfo) -> bool:
    """Whether GPU feature discovery says the node's GPUs are shared: more than one replica,
    or the ``-SHARED`` product suffix."""
    replicas = node.labels.get(GPU_REPLICAS, "")
    return (replicas.isdigit() and int(replicas) > 1) or node.labels.get(GPU_PRODUCT, "").endswith(
        SHARED_SUFFIX
    )


def gpu_product(node: NodeInfo) -> GpuProduct | None:
    """The node's GPU product as GPU feature discovery labelled it; None without the label
    (no feature discovery: a managed cluster's own device plugin, say)."""
    label = node.labels.get(GPU_PRODUCT)
    return gfd_product(label) if label else None


def gpu_memory_mib(node: NodeInfo) -> int | None:
    """GPU feature discovery's ``nvidia.com/gpu.memory`` (MiB), None when absent or not a number."""
    value = node.labels.get(GPU_MEMORY, "")
    return int(value) if value.isdigit() else None


def mig_profiles(node: NodeInfo) -> frozenset[str]:
    """The MIG profiles the node's GPUs are partitioned into: those its capacity advertises
    (mixed strategy; a time-sliced instance's ``.shared`` left out) and the single strategy's
    in the product label."""
    found = {
        base_profile(name[len(MIG_RESOURCE_PREFIX) :])
        for name in node.vendor_resources()
        if name.startswith(MIG_RESOURCE_PREFIX) and is_well_formed(name[len(MIG_RESOURCE_PREFIX) :])
    }
    product = gpu_product(node)
    if product is not None and product.mig_profile is not None:
        found.add(base_profile(product.mig_profile))
    return frozenset(found)


def mig_capable(node: NodeInfo) -> bool:
    """Whether the node's GPUs can be partitioned: GPU feature discovery says so
    (``nvidia.com/mig.capable=true``), or they are."""
    return node.labels.get(MIG_CAPABLE) == "true" or bool(mig_profiles(node))


def surely_cpu_node(node: NodeInfo, policy: Policy) -> bool:
    """A node with no sign of a GPU: none of a declared GPU taint (by key), a pool's label
    key, a GPU feature-discovery label, an NVIDIA PCI label, a label under a vendor domain, a
    cloud's GPU label, a vendor resource in its capacity (even at zero), nor the taint of a
    node still starting. Any one of them and the node may be a GPU node. Not the opposite of
    ``is_gpu_node``: a node still starting, GPU-tainted with nothing advertised, is neither."""
    return not (
        node.capacity
        or node.gpu_labelled
        or any(keeps_label(key, policy) for key in node.labels)
        or any(
            taint.key in policy.gpu_taint_keys or taint.key in STARTING_TAINTS
            for taint in node.taints
        )
    )


def _gpu_label(key: str, vendor_domains: tuple[str, ...]) -> bool:
    prefix, slash, _ = key.partition("/")
    return bool(
        NVIDIA_PCI_LABEL.match(key)
        or key in PROVIDER_GPU_LABELS
        or slash
        and any(prefix == d or prefix.endswith("." + d) for d in vendor_domains)
    )


# The largest node of a pool (None: of no pool), per resource: (capacity, the node's name).
Sizes = Mapping[str | None, Mapping[str, tuple[Quantity, str]]]


EMPTY_NAMESPACES: Mapping[str, Mapping[str, str]] = MappingProxyType({})


def namespace_record(obj: Mapping[str, Any], kept: frozenset[str]) -> tuple[str, Mapping[str, str]]:
    """A Namespace's name and the labels of it that are kept (those tenants select by)."""
    metadata = _mapping(obj.get("metadata"))
    labels = _mapping(metadata.get("labels"))
    return str(metadata.get("name", "")), MappingProxyType(
        {str(k): str(v) for k, v in labels.items() if k in kept}
    )


class NodeSnapshot(DraLookups):
    """The Nodes as the inventory knew them at one moment, for decisions: never changed.
    What decisions read of all of them (the names nodes advertise, the largest node of each
    pool) is worked out on first use and kept with the snapshot, which is replaced as a whole
    when a Node changes what is kept of it. ``fields``: what its Nodes were kept for (a
    policy with other pool label keys or vendor domains is judged without the snapshot until
    the inventory has listed them again: ``covers``). ``dra``: the DeviceClasses and claim
    templates, read through :class:`~webhook.core.dra_inventory.DraLookups`."""

    __slots__ = ("_nodes", "fields", "_namespaces", "dra", "_advertised", "_sizes")

    def __init__(
        self,
        nodes: Mapping[str, NodeInfo],
        fields: NodeFields,
        namespaces: Mapping[str, Mapping[str, str]] = EMPTY_NAMESPACES,
        dra: DraObjects = NO_DRA_OBJECTS,
    ) -> None:
        self._nodes = nodes  # by name
        self.fields = fields
        self._namespaces = namespaces  # name -> the labels kept (fields.namespace_label_keys)
        self.dra = dra
        self._advertised: frozenset[str] | None = None
        self._sizes: tuple[Policy, Sizes] | None = None

    def with_dra(self, dra: DraObjects) -> NodeSnapshot:
        """This snapshot with other DRA objects: the same Nodes and Namespaces, and what was
        worked out from them."""
        other = NodeSnapshot(self._nodes, self.fields, self._namespaces, dra)
        other._advertised, other._sizes = self._advertised, self._sizes
        return other

    def __len__(self) -> int:
        return len(self._nodes)

    @property
    def nodes(self) -> Mapping[str, NodeInfo]:
        """Every node, by name."""
        return self._nodes

    def node(self, name: str) -> NodeInfo | None:
        """The named node, if known."""
        return self._nodes.get(name)

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        """The labels kept of a Namespace; None for one the inventory does not know (or
        when it watches none): its tenants are then found by name only."""
        return self._namespaces.get(name)

    def covers(self, policy: Policy) -> bool:
        """Whether its Nodes (and Namespaces) were kept with every pool label key, vendor
        domain and namespace label key the policy uses: decisions read no other snapshot
        (``webhook.admission.engine``)."""
        fields = self.fields
        return (
            policy.gpu_label_keys <= fields.gpu_label_keys
            and set(policy.vendor_domains) <= set(fields.vendor_domains)
            and policy.namespace_label_keys <= fields.namespace_label_keys
        )

    def advertised(self) -> frozenset[str]:
        """The vendor resources some node's capacity lists above zero."""
        found = self._advertised
        if found is None:
            names: set[str] = set()
            for node in self._nodes.values():
                names.update(node.vendor_resources())
            found = self._advertised = frozenset(names)
        return found

    def largest(
        self, policy: Policy, pool: Pool | None, resource: str
    ) -> tuple[Quantity, str] | None:
        """The largest capacity of ``resource`` on one node of ``pool`` (None: the nodes in no
        pool) and that node's name; None when none of them lists it (unknown, not zero)."""
        sizes = self._sizes
        if sizes is None or sizes[0] is not policy:
            sizes = self._sizes = (policy, self._sizes_for(policy))
        by_resource = sizes[1].get(pool.name if pool is not None else None)
        return by_resource.get(resource) if by_resource is not None else None

    def _sizes_for(self, policy: Policy) -> Sizes:
        sizes: dict[str | None, dict[str, tuple[Quantity, str]]] = {}
        for node in self._nodes.values():
            capacity = [
                (name, quantity)
                for name, value in node.capacity.items()
                if (quantity := parse_quantity(value)) is not None and quantity > 0
            ]
            if not capacity:
                continue
            pool_names: list[str | None] = [p.name for p in pools_of(node, policy)]
            for pool_name in pool_names or [None]:
                largest = sizes.setdefault(pool_name, {})
                for name, quantity in capacity:
                    if name not in largest or quantity > largest[name][0]:
                        largest[name] = (quantity, node.name)
        return sizes


def bound_to_cpu_node(nodes: NodeSnapshot | None, name: Any, policy: Policy) -> bool:
    """Whether ``spec.nodeName`` binds the Pod to a node the inventory knows for a CPU node;
    never where GPU nodes are not told apart by taints (``gpuNodesTainted: false``, or no hard
    taint declared)."""
    node = named_node(nodes, name, policy)
    return (
        node is not None
        and not policy.every_pod_reaches_gpu_nodes
        and surely_cpu_node(node, policy)
    )


def named_node(nodes: NodeSnapshot | None, name: Any, policy: Policy) -> NodeInfo | None:
    """The node a Pod's ``spec.nodeName`` names, as the inventory knows it: None without an
    inventory, with the policy's ``nodeInventory.nodeName`` off, or for a node not known."""
    if nodes is None or not policy.node_inventory.node_name or not isinstance(name, str):
        return None
    return nodes.node(name) if name else None


def _vendor(resources: Any, domains: tuple[str, ...]) -> dict[str, str]:
    return {
        str(name): str(value)
        for name, value in _mapping(resources).items()
        if str(name).partition("/")[0] in domains
    }


def _positive(value: str | None) -> bool:
    quantity = parse_quantity(value) if value is not None else None
    return quantity is not None and quantity > 0


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else EMPTY
