"""The GPU entries of the ResourceQuotas ``explain`` and ``inspect`` read: vendor resources
(``requests.nvidia.com/gpu``, or the bare name) and DRA's
``<class>.deviceclass.resource.k8s.io/devices``, used and hard as the quota's status says,
with the quota's scopes (which Pods it counts)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from webhook.cluster.connection import Cluster
from webhook.cluster.listing import Lister
from webhook.core.inventory import is_gpu_resource
from webhook.operations.refusals import read_refused, where_listed
from webhook.policy.model import Policy
from webhook.policy.quantity import Quantity, parse_quantity

# Quota entries of DRA devices: ``<class>.deviceclass.resource.k8s.io/devices``.
DEVICE_CLASS_QUOTA = ".deviceclass.resource.k8s.io/devices"


@dataclass(frozen=True, slots=True)
class QuotaUse:
    """One GPU entry of a ResourceQuota: ``resource`` as the quota names it
    (``requests.nvidia.com/gpu``), used and hard as its status says. ``forbids``: hard 0,
    the namespace may not have the resource at all (its tenant is not entitled to it: no
    shortage, nothing to wait for); ``exhausted``: hard above 0 and used at or past it, the
    next Pod asking for one more is refused."""

    namespace: str
    quota: str
    resource: str
    used: Quantity
    hard: Quantity
    # ``spec.scopes`` and ``spec.scopeSelector.matchExpressions`` (scopeName, operator,
    # values): the Pods it counts (``webhook.operations.namespace_causes.quota_applies``).
    scopes: tuple[str, ...] = ()
    scope_selector: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    @property
    def forbids(self) -> bool:
        return self.hard == 0

    @property
    def exhausted(self) -> bool:
        return self.hard > 0 and self.used >= self.hard


def read_quotas(
    cluster: Cluster, lister: Lister, policy: Policy, namespaces: frozenset[str] | None
) -> Mapping[str, tuple[QuotaUse, ...]]:
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    core = k8s.CoreV1Api(cluster.api_client)
    lists: list[tuple[str | None, Callable[..., Any]]] = (
        [(None, core.list_resource_quota_for_all_namespaces)]
        if namespaces is None
        else [(ns, partial(core.list_namespaced_resource_quota, ns)) for ns in sorted(namespaces)]
    )
    found: dict[str, list[QuotaUse]] = {}
    for namespace, list_quotas in lists:
        try:
            for page in lister.pages(list_quotas):
                for quota in page.get("items") or ():
                    if isinstance(quota, dict):
                        _keep_quota(quota, policy, found)
        except ApiException as exc:
            raise read_refused(
                f"cannot list resourcequotas {where_listed(namespace)}",
                '"list" on resourcequotas',
                exc,
            ) from None
    return {namespace: tuple(uses) for namespace, uses in found.items()}


def _keep_quota(quota: Mapping[str, Any], policy: Policy, found: dict[str, list[QuotaUse]]) -> None:
    metadata = _mapping(quota.get("metadata"))
    status = _mapping(quota.get("status"))
    hard = _mapping(status.get("hard")) or _mapping(_mapping(quota.get("spec")).get("hard"))
    used = _mapping(status.get("used"))
    spec = _mapping(quota.get("spec"))
    scopes = tuple(str(scope) for scope in _list(spec.get("scopes")))
    selector = tuple(
        (
            str(expr.get("scopeName")),
            str(expr.get("operator")),
            tuple(str(v) for v in _list(expr.get("values"))),
        )
        for expr in _list(_mapping(spec.get("scopeSelector")).get("matchExpressions"))
        if isinstance(expr, Mapping)
    )
    for resource, value in hard.items():
        if not is_gpu_quota(str(resource), policy):
            continue
        limit = parse_quantity(value)
        if limit is None:
            continue
        found.setdefault(str(metadata.get("namespace") or ""), []).append(
            QuotaUse(
                str(metadata.get("namespace") or ""),
                str(metadata.get("name") or ""),
                str(resource),
                parse_quantity(used.get(resource, "0")) or 0,
                limit,
                scopes,
                selector,
            )
        )


def is_gpu_quota(resource: str, policy: Policy) -> bool:
    """Whether a quota entry limits GPUs: a vendor resource (``requests.nvidia.com/gpu``, or
    the bare name) or DRA devices of a class."""
    if resource.endswith(DEVICE_CLASS_QUOTA):
        return True
    name = resource.removeprefix("requests.").removeprefix("limits.")
    return "/" in name and is_gpu_resource(name, policy)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
