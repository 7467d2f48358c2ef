"""What ``explain`` (and ``inspect``) read of a live cluster to say why GPU Pods pend: read once
for any number of Pods, kept in frozen records, only the fields the answers use.

Read, each list paged (``webhook.cluster.listing``), narrowed by field selectors where the API
server offers them, each page reduced as it arrives:

- every Node, kept as the node inventory keeps one (``webhook.core.inventory.NodeInfo``: the
  pools' label keys, GPU feature discovery's labels, taints, vendor resources) plus the label
  keys the explained Pods select nodes by, whether it is cordoned and Ready; only GPU nodes are kept
  (``webhook.core.inventory.has_gpus``), their GPU quantities parsed and pools found once;
- when first needed (a Pod's free GPUs compared), the Pods bound to a node and not finished
  (``spec.nodeName!=``, ``status.phase!=Succeeded``, ``status.phase!=Failed``): of each,
  only what it requests of GPU resources, added to its node's ``allocated``;
- the scheduler's ``FailedScheduling`` events of the explained Pods (``reason=FailedScheduling``,
  ``involvedObject.name`` for a single Pod): message, count, when last seen, who reported it;
- the ResourceQuotas of the Pods' namespaces: their GPU entries, used and hard, and their
  scopes (``webhook.operations.quota_facts``);
- where a Pod claims devices (DRA, ``resource.k8s.io/v1``): its namespace's claims, the
  DeviceClasses and the drivers that publish devices (``webhook.operations.dra_facts``).

A refused read is a :class:`~webhook.cluster.listing.RequestRefused` (one line that says
what was refused, and for a 403 the permission to grant); a cluster that does not serve
``resource.k8s.io/v1`` is a note.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any

from webhook.cluster.connection import Cluster, ClusterError
from webhook.cluster.listing import Lister
from webhook.core.inventory import (
    NodeFields,
    NodeInfo,
    SharedParts,
    has_gpus,
    is_gpu_resource,
    node_info,
    pools_of,
)
from webhook.core.node_lifecycle import ready_status
from webhook.core.requests import spec_requests
from webhook.core.scheduling import selected_label_keys
from webhook.operations.dra_facts import DRA_NOT_SERVED, DraFacts, read_dra
from webhook.operations.quota_facts import QuotaUse, read_quotas
from webhook.operations.refusals import read_refused, where_listed
from webhook.policy.model import Policy, Pool
from webhook.policy.quantity import Quantity, parse_quantity

FAILED_SCHEDULING = "FailedScheduling"
# The MIG manager's state of its last configuration (success, pending, failed): inspect's.
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
PodKey = tuple[str, str]  # (namespace, name)
EMPTY: Mapping[str, Quantity] = MappingProxyType({})


class Allocations:
    """What the Pods bound to the GPU nodes and not finished request of GPU resources, per
    node: read on first use, once (``explain`` asks only when a Pod's free GPUs are
    compared: not for a gated Pod, nor one asking for a name no node advertises)."""

    def __init__(self, read: Callable[[], Mapping[str, Mapping[str, Quantity]]]) -> None:
        self._read: Callable[[], Mapping[str, Mapping[str, Quantity]]] | None = read
        self._by_node: Mapping[str, Mapping[str, Quantity]] = {}

    @classmethod
    def known(cls, by_node: Mapping[str, Mapping[str, Quantity]]) -> Allocations:
        return cls(lambda: by_node)

    @property
    def read(self) -> bool:
        return self._read is None

    def on(self, node: str) -> Mapping[str, Quantity]:
        if self._read is not None:
            self._by_node = self._read()
            self._read = None
        return self._by_node.get(node, EMPTY)


@dataclass(frozen=True, slots=True, eq=False)
class GpuNode:
    """A GPU node (``webhook.core.inventory.has_gpus``): what the inventory keeps of it,
    whether it is cordoned, its Ready condition's status ("True", "False", "Unknown", "" for
    none), its pools, its taints as the scheduling helpers read them, and
    the capacity and allocatable of its GPU resources (``is_gpu_resource``), parsed once.
    Each is one node: compared (and hashed) by identity."""

    info: NodeInfo
    unschedulable: bool
    ready: str
    pools: tuple[Pool, ...]
    taints: tuple[Mapping[str, str], ...]
    capacity: Mapping[str, Quantity]
    allocatable: Mapping[str, Quantity]
    allocations: Allocations

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def resources(self) -> tuple[str, ...]:
        """The GPU resources its capacity lists above zero, sorted."""
        return tuple(sorted(name for name, value in self.capacity.items() if value > 0))

    @property
    def allocated(self) -> Mapping[str, Quantity]:
        """What the Pods bound to it request of each GPU resource (read on first use)."""
        return self.allocations.on(self.name)

    def free(self, resource: str) -> Quantity:
        """Allocatable less allocated (never below zero); 0 where not advertised."""
        return max(self.allocatable.get(resource, 0) - self.allocated.get(resource, 0), 0)


@dataclass(frozen=True, slots=True)
class SchedulingEvent:
    """A scheduler's ``FailedScheduling`` event about one Pod."""

    message: str
    count: int
    last_seen: str  # RFC 3339, "" when the event carries no time
    reporter: str  # the scheduler that wrote it (default-scheduler, or a custom one)


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    """What was read (see the module's docstring). ``advertised``: the GPU resources some GPU
    node's capacity lists above zero. ``namespaces``: those whose events, quotas and claims
    were read (None: every namespace). ``dra``: the claims, DeviceClasses and ResourceSlices
    (None where no explained Pod claims devices, or the cluster does not serve DRA).
    ``notes``: what could not be read, one line each. ``shapes``: what ``explain`` found on
    the nodes for each scheduling shape of Pod (``webhook.operations.pending``), kept for
    the next Pod of the same shape."""

    node_count: int
    nodes: tuple[GpuNode, ...]
    events: Mapping[PodKey, tuple[SchedulingEvent, ...]]
    quotas: Mapping[str, tuple[QuotaUse, ...]]
    namespaces: frozenset[str] | None
    dra: DraFacts | None = None
    notes: tuple[str, ...] = ()
    advertised: frozenset[str] = field(init=False)
    shapes: dict[Hashable, Any] = field(init=False, default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        advertised = frozenset(name for node in self.nodes for name in node.resources)
        object.__setattr__(self, "advertised", advertised)


def read_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """One Pod as the API server sends it; ``ClusterError`` when it does not exist or cannot
    be read."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    lister = Lister(cluster, namespace)
    read = partial(k8s.CoreV1Api(cluster.api_client).read_namespaced_pod, name, namespace)
    try:
        return lister.call(read)
    except ApiException as exc:
        if exc.status == 404:
            raise ClusterError(f'pod "{name}" not found in namespace "{namespace}"') from None
        raise read_refused(
            f'cannot read pod "{name}" in namespace "{namespace}"', '"get" on pods', exc
        ) from None


def pending_pods(cluster: Cluster, namespace: str | None) -> Iterator[dict[str, Any]]:
    """The Pending Pods of a namespace (None: of every namespace), a page at a time."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    core = k8s.CoreV1Api(cluster.api_client)
    selector = "status.phase=Pending"
    pods = (
        partial(core.list_namespaced_pod, namespace, field_selector=selector)
        if namespace
        else partial(core.list_pod_for_all_namespaces, field_selector=selector)
    )
    try:
        for page in Lister(cluster, namespace).pages(pods):
            yield from (pod for pod in page.get("items") or () if isinstance(pod, dict))
    except ApiException as exc:
        raise read_refused(
            f"cannot list pending pods {where_listed(namespace)}", '"list" on pods', exc
        ) from None


def read_cluster_facts(
    cluster: Cluster,
    policy: Policy,
    pods: Sequence[Mapping[str, Any]],
    *,
    all_namespaces: bool = False,
) -> ClusterFacts:
    """The facts that explain ``pods`` (Pods as the API server sent them): the whole node
    side, and the events, quotas and claims of the Pods' namespaces (with ``all_namespaces``,
    of every namespace: one list each instead of one per namespace)."""
    lister = Lister(cluster, None)
    keys = {_key(pod) for pod in pods}
    namespaces = None if all_namespaces else frozenset(ns for ns, _ in keys)
    selected = frozenset(
        key for pod in pods for key in selected_label_keys(_mapping(pod.get("spec")))
    )
    node_count, nodes = _read_nodes(cluster, lister, policy, selected)
    events = _read_events(cluster, lister, pods, namespaces)
    quotas = read_quotas(cluster, lister, policy, namespaces)
    facts = ClusterFacts(node_count, nodes, events, quotas, namespaces)
    if any(_mapping(pod.get("spec")).get("resourceClaims") for pod in pods):
        dra = read_dra(cluster, lister, namespaces)
        if dra is None:
            return dataclasses.replace(facts, notes=(*facts.notes, DRA_NOT_SERVED))
        facts = dataclasses.replace(facts, dra=dra)
    return facts


def _read_nodes(
    cluster: Cluster, lister: Lister, policy: Policy, selected: frozenset[str]
) -> tuple[int, tuple[GpuNode, ...]]:
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    core = k8s.CoreV1Api(cluster.api_client)
    kept = NodeFields(policy.gpu_label_keys | selected | {MIG_CONFIG_STATE}, policy.vendor_domains)
    shared = SharedParts()
    found: dict[str, tuple[NodeInfo, bool, str]] = {}
    count = 0
    try:
        for page in lister.pages(core.list_node):
            for obj in page.get("items") or ():
                if not isinstance(obj, dict):
                    continue
                count += 1
                info = node_info(obj, kept, shared)
                if has_gpus(info, policy):
                    cordoned = _mapping(obj.get("spec")).get("unschedulable") is True
                    found[info.name] = (info, cordoned, ready_status(obj))
    except ApiException as exc:
        raise read_refused("cannot list nodes", '"list" on nodes', exc) from None
    names = frozenset(found)
    allocations = Allocations(partial(_allocated, cluster, lister, policy, names))
    return count, tuple(
        gpu_node(info, cordoned, ready, policy, allocations)
        for _, (info, cordoned, ready) in sorted(found.items())
    )


def gpu_node(
    info: NodeInfo, cordoned: bool, ready: str, policy: Policy, allocations: Allocations
) -> GpuNode:
    """A GPU node's record, its quantities parsed and its pools found once."""
    return GpuNode(
        info,
        cordoned,
        ready,
        pools_of(info, policy),
        tuple({"key": t.key, "value": t.value, "effect": t.effect} for t in info.taints),
        _gpu_quantities(info.capacity, policy),
        _gpu_quantities(info.allocatable, policy),
        allocations,
    )


def _gpu_quantities(resources: Mapping[str, str], policy: Policy) -> Mapping[str, Quantity]:
    return MappingProxyType(
        {
            name: parse_quantity(value) or 0
            for name, value in resources.items()
            if is_gpu_resource(name, policy)
        }
    )


def _allocated(
    cluster: Cluster, lister: Lister, policy: Policy, gpu_nodes: frozenset[str]
) -> dict[str, Mapping[str, Quantity]]:
    """Per GPU node, what the Pods bound to it and not finished request of GPU resources."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    if not gpu_nodes:
        return {}
    bound = partial(
        k8s.CoreV1Api(cluster.api_client).list_pod_for_all_namespaces,
        field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
    )
    wanted = partial(is_gpu_resource, policy=policy)
    allocated: dict[str, dict[str, Quantity]] = {}
    try:
        for page in lister.pages(bound):
            for pod in page.get("items") or ():
                spec = _mapping(pod.get("spec")) if isinstance(pod, dict) else {}
                node = spec.get("nodeName")
                if node not in gpu_nodes:
                    continue
                on_node = allocated.setdefault(str(node), {})
                for name, quantity in spec_requests(spec, wanted).items():
                    on_node[name] = on_node.get(name, 0) + quantity
    except ApiException as exc:
        raise read_refused("cannot list the pods bound to nodes", '"list" on pods', exc) from None
    return {node: MappingProxyType(asked) for node, asked in allocated.items()}


def _read_events(
    cluster: Cluster,
    lister: Lister,
    pods: Sequence[Mapping[str, Any]],
    namespaces: frozenset[str] | None,
) -> Mapping[PodKey, tuple[SchedulingEvent, ...]]:
    """The FailedScheduling events of ``pods``, latest first; an event of an earlier Pod of
    the same name (another uid) is left out."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    if not pods:
        return {}
    core = k8s.CoreV1Api(cluster.api_client)
    uids = {_key(pod): str(_mapping(pod.get("metadata")).get("uid") or "") for pod in pods}
    selector = f"reason={FAILED_SCHEDULING},involvedObject.kind=Pod"
    lists: list[tuple[str | None, Callable[..., Any]]] = []
    if len(pods) == 1:
        namespace, name = _key(pods[0])
        one = f"{selector},involvedObject.name={name}"
        lists.append(
            (namespace, partial(core.list_namespaced_event, namespace, field_selector=one))
        )
    elif namespaces is None:
        lists.append((None, partial(core.list_event_for_all_namespaces, field_selector=selector)))
    else:
        lists += [
            (ns, partial(core.list_namespaced_event, ns, field_selector=selector))
            for ns in sorted(namespaces)
        ]
    found: dict[PodKey, list[tuple[str, SchedulingEvent]]] = {}
    for scope, list_events in lists:
        try:
            for page in lister.pages(list_events):
                for event in page.get("items") or ():
                    _keep_event(event, uids, found)
        except ApiException as exc:
            raise read_refused(
                f"cannot list events {where_listed(scope)}", '"list" on events', exc
            ) from None
    return {
        key: tuple(e for _, e in sorted(kept, key=lambda item: item[0], reverse=True))
        for key, kept in found.items()
    }


def _keep_event(
    event: Any, uids: Mapping[PodKey, str], found: dict[PodKey, list[tuple[str, SchedulingEvent]]]
) -> None:
    if not isinstance(event, dict) or event.get("reason") != FAILED_SCHEDULING:
        return
    involved = _mapping(event.get("involvedObject"))
    key = (str(involved.get("namespace") or ""), str(involved.get("name") or ""))
    uid = uids.get(key)
    if uid is None or (uid and involved.get("uid") and involved.get("uid") != uid):
        return
    series = _mapping(event.get("series"))
    last_seen = str(
        series.get("lastObservedTime")
        or event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or ""
    )
    count = series.get("count") or event.get("count") or 1
    reporter = (
        event.get("reportingComponent")
        or _mapping(event.get("source")).get("component")
        or event.get("reportingController")
        or ""
    )
    found.setdefault(key, []).append(
        (
            last_seen,
            SchedulingEvent(
                " ".join(str(event.get("message") or "").split()),
                count if isinstance(count, int) else 1,
                last_seen,
                str(reporter),
            ),
        )
    )


def _key(pod: Mapping[str, Any]) -> PodKey:
    metadata = _mapping(pod.get("metadata"))
    return str(metadata.get("namespace") or "default"), str(metadata.get("name") or "")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
