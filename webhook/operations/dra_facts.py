"""What ``explain`` reads of Dynamic Resource Allocation (``resource.k8s.io/v1``) to say why a
claim is not allocated: the ResourceClaims of the explained Pods' namespaces (allocated or not,
the device classes their requests name), every DeviceClass (the drivers its selectors pin) and
the drivers ResourceSlices publish devices of. Each list paged, each item reduced as it arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any

from webhook.cluster.connection import Cluster
from webhook.cluster.listing import Lister
from webhook.core.dra_inventory import device_class_record
from webhook.operations.refusals import read_refused

DRA_NOT_SERVED = (
    "this cluster does not serve resource.k8s.io/v1 (Kubernetes 1.34+): claims not read"
)


@dataclass(frozen=True, slots=True)
class ClaimState:
    """A ResourceClaim: whether the scheduler allocated devices to it, and the device classes
    its requests name."""

    name: str
    allocated: bool
    device_classes: tuple[str, ...]
    devices: int = 1  # how many devices its requests ask for (0: one asks for all of a class)


@dataclass(frozen=True, slots=True)
class DraFacts:
    """``claims`` by (namespace, name); ``class_drivers``: each DeviceClass's pinned drivers
    (empty where its selectors pin none this reads); ``published_drivers``: the drivers some
    ResourceSlice publishes a device of."""

    claims: Mapping[tuple[str, str], ClaimState]
    class_drivers: Mapping[str, tuple[str, ...]]
    published_drivers: frozenset[str]
    # Per driver, the nodes its ResourceSlices publish devices on (``spec.nodeName``; None
    # where a slice serves several nodes, ``allNodes`` or a ``nodeSelector``: any may do),
    # and how many devices they publish.
    driver_nodes: Mapping[str, frozenset[str] | None] = field(default_factory=dict)
    driver_devices: Mapping[str, int] = field(default_factory=dict)

    def nodes_of(self, device_class: str) -> frozenset[str] | None:
        """The nodes the drivers of a class publish devices on; None: not known (the class
        pins no driver this reads, or a slice serves several nodes)."""
        drivers = self.class_drivers.get(device_class)
        if not drivers:
            return None
        found: set[str] = set()
        for driver in drivers:
            nodes = self.driver_nodes.get(driver, frozenset())
            if nodes is None:
                return None
            found |= nodes
        return frozenset(found)


class _NotServed(Exception):
    """The cluster answers 404 for resource.k8s.io/v1."""


def read_dra(
    cluster: Cluster, lister: Lister, namespaces: frozenset[str] | None
) -> DraFacts | None:
    """The claims of ``namespaces`` (None: of all), the DeviceClasses and the drivers that
    publish devices; None where the cluster does not serve DRA. A refused list raises
    :class:`~webhook.cluster.listing.RequestRefused`."""
    from kubernetes import client as k8s

    resource = k8s.ResourceV1Api(cluster.api_client)
    lists: list[tuple[str, Callable[..., Any]]] = (
        [("in all namespaces", resource.list_resource_claim_for_all_namespaces)]
        if namespaces is None
        else [
            (f'in namespace "{ns}"', partial(resource.list_namespaced_resource_claim, ns))
            for ns in sorted(namespaces)
        ]
    )
    claims: dict[tuple[str, str], ClaimState] = {}
    classes: dict[str, tuple[str, ...]] = {}
    published: set[str] = set()
    nodes: dict[str, set[str] | None] = {}
    devices: dict[str, int] = {}
    try:
        for scope, list_claims in lists:
            for claim in _items(lister, list_claims, "resourceclaims", scope):
                metadata = _mapping(claim.get("metadata"))
                key = (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
                claims[key] = ClaimState(
                    key[1],
                    bool(_mapping(claim.get("status")).get("allocation")),
                    claimed_classes(_mapping(claim.get("spec"))),
                    claimed_devices(_mapping(claim.get("spec"))),
                )
        for device_class in _items(lister, resource.list_device_class, "deviceclasses"):
            record = device_class_record(device_class)
            classes[record.name] = record.drivers
        for resource_slice in _items(lister, resource.list_resource_slice, "resourceslices"):
            spec = _mapping(resource_slice.get("spec"))
            driver = spec.get("driver")
            if not (_list(spec.get("devices")) and isinstance(driver, str)):
                continue
            published.add(driver)
            devices[driver] = devices.get(driver, 0) + len(_list(spec.get("devices")))
            on = nodes.setdefault(driver, set())
            node_name = spec.get("nodeName")
            if on is not None and isinstance(node_name, str) and node_name:
                on.add(node_name)
            else:
                nodes[driver] = None
    except _NotServed:
        return None
    return DraFacts(
        MappingProxyType(claims),
        MappingProxyType(classes),
        frozenset(published),
        MappingProxyType({d: None if n is None else frozenset(n) for d, n in nodes.items()}),
        MappingProxyType(devices),
    )


def _items(
    lister: Lister, list_page: Callable[..., Any], resource: str, scope: str = ""
) -> Iterator[dict[str, Any]]:
    from kubernetes.client.exceptions import ApiException

    try:
        for page in lister.pages(list_page):
            yield from (item for item in page.get("items") or () if isinstance(item, dict))
    except ApiException as exc:
        if exc.status == 404:
            raise _NotServed from None
        what = f"cannot list {resource}" + (f" {scope}" if scope else "")
        raise read_refused(what, f'"list" on {resource}.resource.k8s.io', exc) from None


def claimed_classes(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The device classes a claim's requests name (``exactly``, or each of
    ``firstAvailable``)."""
    found: list[str] = []
    for request in _list(_mapping(spec.get("devices")).get("requests")):
        request = _mapping(request)
        alternatives = [
            _mapping(request.get("exactly")),
            *map(_mapping, _list(request.get("firstAvailable"))),
        ]
        for alternative in alternatives:
            name = alternative.get("deviceClassName")
            if isinstance(name, str) and name not in found:
                found.append(name)
    return tuple(found)


def claimed_devices(spec: Mapping[str, Any]) -> int:
    """How many devices a claim's requests ask for (``exactly``'s count, 1 by default, or
    the first alternative's of ``firstAvailable``); 0 where one asks for all of a class."""
    total = 0
    for request in _list(_mapping(spec.get("devices")).get("requests")):
        request = _mapping(request)
        asked = _mapping(request.get("exactly")) or next(
            iter(map(_mapping, _list(request.get("firstAvailable")))), {}
        )
        if asked.get("allocationMode") == "All":
            return 0
        count = asked.get("count")
        total += count if isinstance(count, int) and count > 0 else 1
    return total


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
