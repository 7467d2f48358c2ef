"""The ResourceQuotas a policy's entitlements imply (``gpu-admission quota``): per namespace of
a tenant that states entitlements, ``requests.<resource>`` at its ``maxGPUs`` for each resource
it names, and 0 for each GPU resource the policy declares that the tenant may not use. A
ResourceQuota limits what a namespace requests in all; the entitlement rule limits what one
Pod asks for and which kind: the two together say what the policy means.

DRA claims are quotaed per device class (``<class>.deviceclass.resource.k8s.io/devices``): 0
for a GPU class ``entitlements.deviceClasses`` leaves out, ``maxGPUs`` for a class it names.

Extended resources are quotaed by their requests only: the API server accepts any qualified
name in a quota's ``hard`` (``limits.nvidia.com/gpu``, ``nvidia.com/gpu``), but its quota
evaluator counts an extended resource only as ``requests.<name>`` (kubernetes
pkg/quota/v1/evaluator/core/pods.go, ``isExtendedResourceNameForQuota``), and a GPU's request
equals its limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.policy.dra import DEVICE_CLASS_RESOURCE_PREFIX
from webhook.policy.model import Policy
from webhook.policy.tenants import Tenant

QUOTA_NAME = "gpu-admission-gpus"
# How a ResourceQuota counts the devices claims allocate from one DeviceClass (KEP-4381):
# ``<class>.deviceclass.resource.k8s.io/devices``.
DEVICE_CLASS_QUOTA = "deviceclass.resource.k8s.io/devices"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-admission"}
TENANT_ANNOTATION = "gpu-admission.io/tenant"


def entitled_namespaces(policy: Policy) -> list[str]:
    """The namespaces the tenants that state entitlements name exactly (globs name none)."""
    names: dict[str, None] = {}
    for tenant in policy.tenants:
        if tenant.entitlements is not None:
            names.update(dict.fromkeys(sorted(tenant.namespaces.names)))
    return list(names)


def implied_limits(policy: Policy, tenant: Tenant) -> dict[str, int]:
    """What a tenant's entitlements hold each GPU resource at in its namespaces, by name
    (sorted): 0 for a resource the policy declares (cluster-wide or in a pool) and they leave
    out, their ``maxGPUs`` for the others they name; {} without entitlements."""
    entitled = tenant.entitlements
    if entitled is None:
        return {}
    declared = {*policy.resources, *(name for pool in policy.pools for name in pool.resources)}
    # DRA's extended resources are quotaed as their class's devices (implied_device_limits).
    declared = {name for name in declared if not name.startswith(DEVICE_CLASS_RESOURCE_PREFIX)}
    limits: dict[str, int] = {}
    for name in sorted(declared | {n for n in entitled.max_gpus if "/" in n}):
        if entitled.resources is not None and name not in entitled.resources:
            limits[name] = 0
        elif name in entitled.max_gpus:
            limits[name] = entitled.max_gpus[name]
    return limits


def implied_device_limits(policy: Policy, tenant: Tenant) -> dict[str, int]:
    """What a tenant's entitlements hold the devices of each DRA device class at, by class
    (sorted): 0 for a GPU class the policy knows that ``deviceClasses`` leaves out, ``maxGPUs``
    for a class it names (a key without ``/``)."""
    entitled = tenant.entitlements
    if entitled is None:
        return {}
    gpu_classes = {name for name, known in policy.dra.classes.items() if known.gpu}
    limits: dict[str, int] = {}
    for name in sorted(gpu_classes | {n for n in entitled.max_gpus if "/" not in n}):
        if entitled.device_classes is not None and name not in entitled.device_classes:
            limits[name] = 0
        elif name in entitled.max_gpus:
            limits[name] = entitled.max_gpus[name]
    return limits


def implied_quotas(
    policy: Policy, namespaces: Iterable[str], labels: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """One ResourceQuota per namespace whose tenant's entitlements imply one, in order: the
    tenant the webhook finds for it, by name, or by ``labels`` (the namespaces') where an
    entry selects namespaces by label (None: by name only)."""
    quotas = []
    for namespace in namespaces:
        tenant = policy.entitled_tenant(namespace, labels)
        if tenant is None:
            continue
        hard = {f"requests.{name}": str(n) for name, n in implied_limits(policy, tenant).items()}
        hard.update(
            (f"{name}.{DEVICE_CLASS_QUOTA}", str(n))
            for name, n in implied_device_limits(policy, tenant).items()
        )
        if not hard:
            continue
        quotas.append(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {
                    "name": QUOTA_NAME,
                    "namespace": namespace,
                    "labels": dict(MANAGED_BY),
                    "annotations": {
                        TENANT_ANNOTATION: f"{policy.name}: tenants[{tenant.index}] "
                        f"({tenant.named})"
                    },
                },
                "spec": {"hard": hard},
            }
        )
    return quotas
