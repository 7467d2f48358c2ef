"""The ResourceQuotas a policy's entitlements imply (``gpu-admission quota``): per namespace of
a tenant that states entitlements, ``requests.<resource>`` at its ``maxGPUs`` for each resource
it names, and 0 for each GPU resource the policy declares that the tenant may not use. A
ResourceQuota limits what a namespace requests in all; the entitlement rule limits what one
Pod asks for and which kind: the two together say what the policy means.

Extended resources are quotaed by their requests only (``requests.nvidia.com/gpu``: the API
server refuses ``limits.`` for them), and a GPU's request equals its limit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from webhook.policy.model import Policy

QUOTA_NAME = "gpu-admission-gpus"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-admission"}
TENANT_ANNOTATION = "gpu-admission.io/tenant"


def entitled_namespaces(policy: Policy) -> list[str]:
    """The namespaces the tenants that state entitlements name exactly (globs name none)."""
    names: dict[str, None] = {}
    for tenant in policy.tenants:
        if tenant.entitlements is not None:
            names.update(dict.fromkeys(sorted(tenant.namespaces.names)))
    return list(names)


def implied_quotas(policy: Policy, namespaces: Iterable[str]) -> list[dict[str, Any]]:
    """One ResourceQuota per namespace whose tenant's entitlements imply one, in order."""
    declared = {*policy.resources, *(name for pool in policy.pools for name in pool.resources)}
    quotas = []
    for namespace in namespaces:
        tenant = policy.entitled_tenant(namespace)
        entitled = tenant.entitlements if tenant is not None else None
        if tenant is None or entitled is None:
            continue
        hard: dict[str, str] = {}
        for name in sorted(declared | set(entitled.max_gpus)):
            if entitled.resources is not None and name not in entitled.resources:
                hard[f"requests.{name}"] = "0"
            elif name in entitled.max_gpus:
                hard[f"requests.{name}"] = str(entitled.max_gpus[name])
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
