"""What ``explain`` reads of Dynamic Resource Allocation (``resource.k8s.io/v1``) to say why a
claim is not allocated: the ResourceClaims of the explained Pods' namespaces (allocated or not,
the device classes their requests name), every DeviceClass (the drivers its selectors pin) and
the drivers ResourceSlices publish devices of. Each list paged, each item reduced as it arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class DraFacts:
    """``claims`` by (namespace, name); ``class_drivers``: each DeviceClass's pinned drivers
    (empty where its selectors pin none this reads); ``published_drivers``: the drivers some
    ResourceSlice publishes a device of."""

    claims: Mapping[tuple[str, str], ClaimState]
    class_drivers: Mapping[str, tuple[str, ...]]
    published_drivers: frozenset[str]


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
    try:
        for scope, list_claims in lists:
            for claim in _items(lister, list_claims, "resourceclaims", scope):
                metadata = _mapping(claim.get("metadata"))
                key = (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
                claims[key] = ClaimState(
                    key[1],
                    bool(_mapping(claim.get("status")).get("allocation")),
                    claimed_classes(_mapping(claim.get("spec"))),
                )
        for device_class in _items(lister, resource.list_device_class, "deviceclasses"):
            record = device_class_record(device_class)
            classes[record.name] = record.drivers
        for resource_slice in _items(lister, resource.list_resource_slice, "resourceslices"):
            spec = _mapping(resource_slice.get("spec"))
            if _list(spec.get("devices")) and isinstance(spec.get("driver"), str):
                published.add(spec["driver"])
    except _NotServed:
        return None
    return DraFacts(MappingProxyType(claims), MappingProxyType(classes), frozenset(published))


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


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
