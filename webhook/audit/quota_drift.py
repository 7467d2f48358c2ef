"""Where the cluster's ResourceQuotas and the tenants' entitlements disagree: part of what
``gpu-admission cluster check`` reports, and noted by ``gpu-admission audit --cluster``.

The entitlement rule judges one Pod at a time; only a ResourceQuota limits what a namespace
requests in all, and the API server refuses the Pods past it whoever wrote them (an exempt
namespace's, one admitted while the rule only warns). ``gpu-admission quota`` writes the
quotas a policy implies (``webhook.audit.quotas``); what is live can say otherwise. In each
namespace whose tenant states entitlements that imply a quota, for each GPU resource:

- ``quota-allows-forbidden-resource``: a quota lets it request a GPU resource its tenant may
  not use (``requests.<name>`` above 0), and no quota holds that at 0;
- ``quota-above-max-gpus``: a quota lets it request more of a resource than the tenant's
  ``maxGPUs``, and no quota holds it at or below that;
- ``max-gpus-without-quota``: no quota mentions the resource at all, so nothing holds the
  tenant's ``maxGPUs``;
- ``forbidden-resource-without-quota`` (info): no quota holds a resource the tenant may not use
  at 0: the entitlement rule alone keeps its Pods from it, Pod by Pod.

Only ``requests.<name>`` counts: the API server accepts ``limits.nvidia.com/gpu`` or
``nvidia.com/gpu`` in a quota, but never counts an extended resource under those names
(``webhook.audit.quotas``), and such entries are named where they would mislead. A quota with
scopes (``scopes``, ``scopeSelector``) counts only the Pods of its scopes: it holds nothing for
the namespace. Each finding gathers every namespace of one tenant and resource: at 5,000
namespaces, a few lines. Namespaces are listed in pages (their names kept, and the labels
tenants select namespaces by) to find those without a quota, and quotas in pages, of which
only the GPU entries of entitled namespaces are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, NamedTuple

from webhook.audit.drift_finding import Drift
from webhook.audit.quotas import QUOTA_NAME, implied_limits
from webhook.cluster.connection import Cluster
from webhook.cluster.listing import Lister, RequestRefused
from webhook.core.inventory import namespace_record
from webhook.core.wording import count, first, names, plain_number
from webhook.policy.model import Policy
from webhook.policy.quantity import Quantity, parse_quantity
from webhook.policy.tenants import Tenant

QUOTA_DRIFT_KINDS = (
    "quota-allows-forbidden-resource",
    "quota-above-max-gpus",
    "max-gpus-without-quota",
    "forbidden-resource-without-quota",
)
REQUESTS = "requests."


@dataclass(frozen=True, slots=True)
class LiveQuota:
    """What is kept of a ResourceQuota: its name, whether it has scopes, and its GPU entries:
    ``counted`` the ``requests.<name>`` ones by resource name, ``uncounted`` the keys that
    name a GPU resource otherwise (``limits.nvidia.com/gpu``)."""

    name: str
    scoped: bool
    counted: Mapping[str, Quantity]
    uncounted: tuple[str, ...] = ()


@dataclass(slots=True)
class QuotaCheck:
    """What was read and found: the namespaces compared (those whose tenant's entitlements
    imply a quota), the quotas of theirs with GPU entries, and the drift."""

    namespaces: int = 0
    quotas: int = 0
    drift: list[Drift] = field(default_factory=list)


def compares_quotas(policy: Policy) -> bool:
    """Whether some tenant states entitlements that imply a quota (else nothing is read)."""
    return any(implied_limits(policy, tenant) for tenant in policy.tenants)


def check_quotas(cluster: Cluster, policy: Policy, namespace: str | None) -> QuotaCheck:
    """The quota drift of one namespace (None: every namespace, listed). A refused list raises
    ``RequestRefused``; an unreachable server, ``ClusterError`` (which it is one of)."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    if not compares_quotas(policy):
        return QuotaCheck()
    lister = Lister(cluster, None)
    core = k8s.CoreV1Api(cluster.api_client)
    labels: dict[str, Mapping[str, str] | None]
    if namespace is not None and not policy.namespace_label_keys:
        labels = {namespace: None}  # judged by name: nothing to read of it
    else:
        # The labels tenants select namespaces by, and only those, of every namespace (or of
        # the one audited).
        listed = (
            partial(core.list_namespace, field_selector=f"metadata.name={namespace}")
            if namespace is not None
            else core.list_namespace
        )
        try:
            labels = dict(
                namespace_record(item, policy.namespace_label_keys)
                for page in lister.pages(listed)
                for item in page.get("items") or ()
                if isinstance(item, dict)
            )
        except ApiException as exc:
            raise RequestRefused("cannot list namespaces", exc) from None
    cache: dict[int, dict[str, int]] = {}
    compared = {
        name: known for name, known in labels.items() if _limits_of(policy, name, known, cache)
    }
    list_quotas: Callable[..., Any] = (
        partial(core.list_namespaced_resource_quota, namespace)
        if namespace is not None
        else core.list_resource_quota_for_all_namespaces
    )
    if not compared:
        return QuotaCheck()
    gpu_names = policy.declared_names | {
        name for tenant in policy.tenants for name in implied_limits(policy, tenant)
    }
    live: dict[str, list[LiveQuota]] = {}
    try:
        for page in lister.pages(list_quotas):
            for item in page.get("items") or ():
                metadata = item.get("metadata") or {}
                if metadata.get("namespace") in compared:
                    quota = live_quota(item, gpu_names)
                    if quota is not None:
                        live.setdefault(metadata["namespace"], []).append(quota)
    except ApiException as exc:
        where = f"in namespace {namespace}" if namespace else "in all namespaces"
        raise RequestRefused(f"cannot list resourcequotas {where}", exc) from None
    return QuotaCheck(
        len(compared),
        sum(len(quotas) for quotas in live.values()),
        find_quota_drift(policy, compared, live),
    )


def live_quota(obj: Mapping[str, Any], gpu_names: frozenset[str] | set[str]) -> LiveQuota | None:
    """A ResourceQuota's GPU entries (None when it has none)."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    hard = spec.get("hard") if isinstance(spec, dict) else None
    counted: dict[str, Quantity] = {}
    uncounted: list[str] = []
    for key, value in (hard or {}).items() if isinstance(hard, dict) else ():
        if not isinstance(key, str):
            continue
        if key.startswith(REQUESTS) and key[len(REQUESTS) :] in gpu_names:
            quantity = parse_quantity(value)
            if quantity is not None:  # the API server refuses what does not parse
                counted[key[len(REQUESTS) :]] = quantity
        elif key in gpu_names or key.partition(".")[2] in gpu_names:
            uncounted.append(key)
    if not counted and not uncounted:
        return None
    scoped = bool(spec.get("scopes") or spec.get("scopeSelector"))
    return LiveQuota(str(metadata.get("name", "")), scoped, counted, tuple(sorted(uncounted)))


class _Key(NamedTuple):
    kind: str
    tenant: int
    resource: str


@dataclass(slots=True)
class _Found:
    """One finding as it gathers: its tenant and limit, the namespaces concerned, and the
    quotas to name (``namespace/name (value)``, or the entries that hold nothing)."""

    tenant: Tenant
    limit: int
    namespaces: list[str] = field(default_factory=list)
    quotas: list[str] = field(default_factory=list)
    asides: list[str] = field(default_factory=list)


def find_quota_drift(
    policy: Policy,
    namespaces: Mapping[str, Mapping[str, str] | None],
    live: Mapping[str, list[LiveQuota]],
) -> list[Drift]:
    """Every disagreement, in the order of QUOTA_DRIFT_KINDS, then by tenant and resource.
    ``namespaces``: those compared, with the labels tenants select by (None: not read);
    ``live``: their quotas' GPU entries, by namespace."""
    found: dict[_Key, _Found] = {}
    cache: dict[int, dict[str, int]] = {}
    for namespace in sorted(namespaces):
        tenant = policy.entitled_tenant(namespace, namespaces[namespace])
        limits = _limits_of(policy, namespace, namespaces[namespace], cache)
        if tenant is None or tenant.entitlements is None or not limits:
            continue
        quotas = live.get(namespace, [])
        allowed = tenant.entitlements.resources
        # A declared resource no implied quota names (a MIG profile the catalogue adds) is
        # compared where a quota lets the tenant request it and it may not.
        extra = {
            name: 0
            for quota in quotas
            for name in quota.counted
            if name not in limits
            and allowed is not None
            and name not in allowed
            and name in policy.declared_names
        }
        for name, limit in {**limits, **extra}.items():
            forbidden = allowed is not None and name not in allowed
            values = [(quota, quota.counted[name]) for quota in quotas if name in quota.counted]
            if any(not quota.scoped and value <= limit for quota, value in values):
                continue  # held: the strictest quota wins
            over = [(quota, value) for quota, value in values if value > limit]
            if over:
                kind = "quota-allows-forbidden-resource" if forbidden else "quota-above-max-gpus"
            elif name in limits:
                kind = "forbidden-resource-without-quota" if forbidden else "max-gpus-without-quota"
            else:
                continue
            entry = found.setdefault(_Key(kind, tenant.index, name), _Found(tenant, limit))
            entry.namespaces.append(namespace)
            entry.quotas += [
                f"{namespace}/{quota.name} ({plain_number(value)})" for quota, value in over
            ]
            entry.asides += _asides(namespace, quotas, name, limit)
    order = {kind: i for i, kind in enumerate(QUOTA_DRIFT_KINDS)}
    return [
        _drift(policy, key, entry)
        for key, entry in sorted(found.items(), key=lambda item: (order[item[0].kind], item[0]))
    ]


def _limits_of(
    policy: Policy,
    namespace: str,
    labels: Mapping[str, str] | None,
    cache: dict[int, dict[str, int]],
) -> dict[str, int]:
    """What the namespace's tenant's entitlements hold each resource at ({} for none)."""
    tenant = policy.entitled_tenant(namespace, labels)
    if tenant is None:
        return {}
    if tenant.index not in cache:
        cache[tenant.index] = implied_limits(policy, tenant)
    return cache[tenant.index]


def _asides(namespace: str, quotas: list[LiveQuota], name: str, limit: int) -> list[str]:
    """The quotas that look as if they held the resource and do not: by a key the quota
    evaluator does not count, or only for the Pods of their scopes."""
    asides = [
        f"{namespace}/{quota.name} writes {key}, a key ResourceQuota never counts for an "
        f"extended resource (only {REQUESTS}{name})"
        for quota in quotas
        for key in quota.uncounted
        if key in (name, f"limits.{name}")
    ]
    asides += [
        f"{namespace}/{quota.name} holds it for the Pods of its scopes only"
        for quota in quotas
        if quota.scoped and name in quota.counted and quota.counted[name] <= limit
    ]
    return asides


def _drift(policy: Policy, key: _Key, entry: _Found) -> Drift:
    tenant, name, limit = entry.tenant, key.resource, entry.limit
    setting = tenant.setting("entitlements")
    namespaces, quotas = entry.namespaces, entry.quotas
    one = len(namespaces) == 1
    where = f"namespace {namespaces[0]}" if one else count(namespaces, "namespace")
    have = "has" if one else "have"
    let = "lets" if len(quotas) == 1 else "let"
    fix = _fix(policy, tenant, namespaces)
    # What keeps a Pod from a resource its tenant may not use when no quota does.
    rule = (
        "the entitlement rule only warns of it (newChecks: Warn)"
        if policy.new_checks_advisory
        else "only the entitlement rule refuses it, one Pod at a time"
    )
    listed = "" if one else f": {names(namespaces)}"
    asides = (
        f" What looks as if it held it does not: {'; '.join(first(entry.asides, 3))}."
        if entry.asides
        else ""
    )
    if key.kind == "quota-allows-forbidden-resource":
        entitled = tenant.entitlements
        allowed = ", ".join(sorted(entitled.resources or ())) if entitled is not None else ""
        # The quota the policy implies holds at 0 the resources the policy declares itself.
        implied = (
            f", or apply the quota the policy implies, which holds it at 0: {fix}"
            if name in implied_limits(policy, tenant)
            else ""
        )
        message = (
            f"{count(quotas, 'ResourceQuota')} {let} {where} of {setting} request {name}, "
            f"which it leaves out (resources: {allowed}): {names(quotas)}; {rule}. Set "
            f"{REQUESTS}{name} to 0 in {'it' if len(quotas) == 1 else 'them'}{implied}"
        )
    elif key.kind == "quota-above-max-gpus":
        message = (
            f"{count(quotas, 'ResourceQuota')} {let} {where} of {setting} request more {name} "
            f"than its maxGPUs of {limit}: {names(quotas)}; lower {REQUESTS}{name} to "
            f"{limit}, or apply the quota the policy implies: {fix}"
        )
    elif key.kind == "max-gpus-without-quota":
        message = (
            f"{where} of {setting} {have} no ResourceQuota that holds {REQUESTS}{name} to its "
            f"maxGPUs of {limit}{listed}; nothing else limits how many {name} "
            f"{'it requests' if one else 'they request'} in all.{asides} Apply the quota the "
            f"policy implies: {fix}"
        )
    else:
        message = (
            f"{where} of {setting}, which leaves {name} out, {have} no ResourceQuota that "
            f"holds {REQUESTS}{name} at 0{listed}; {rule}.{asides} For the API server to "
            f"refuse it too, apply the quota the policy implies: {fix}"
        )
    info = key.kind == "forbidden-resource-without-quota"
    level: Literal["drift", "info"] = "info" if info else "drift"
    subject = f"tenants[{tenant.index}]: {name}"
    return Drift(key.kind, subject, (), message, tuple(namespaces), level)


def _fix(policy: Policy, tenant: Tenant, namespaces: list[str]) -> str:
    """The command that writes the quota the policy implies in these namespaces:
    ``gpu-admission quota`` for a tenant that names them (it judges a namespace by name), the
    same quota with kubectl for one that selects them by label."""
    more = f" (and for each of the {len(namespaces) - 5} more)" if len(namespaces) > 5 else ""
    if tenant.selector is not None:
        hard = ",".join(f"{REQUESTS}{n}={v}" for n, v in implied_limits(policy, tenant).items())
        return (
            "; ".join(
                f"kubectl create quota {QUOTA_NAME} -n {namespace} --hard={hard}"
                for namespace in namespaces[:5]
            )
            + more
        )
    flags = " ".join(f"-n {namespace}" for namespace in namespaces[:5])
    return f"gpu-admission quota --policy {policy.source} {flags} | kubectl apply -f -" + (
        more.replace(" (and for", " (and -n for")
    )
