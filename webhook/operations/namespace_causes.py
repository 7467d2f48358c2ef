"""The causes of a Pending GPU Pod found in its namespace: its ResourceClaims (not created,
missing, not allocated, of a class no driver publishes devices for) and its GPU ResourceQuotas
(one that forbids what it asks for, hard 0; one used up), each with its fix and whom to ask."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.pods import PodView
from webhook.core.wording import plain_number
from webhook.operations.causes import Cause
from webhook.operations.cluster_facts import DEVICE_CLASS_QUOTA, ClusterFacts
from webhook.policy.model import Policy
from webhook.policy.quantity import Quantity


def claim_causes(pod: Mapping[str, Any], view: PodView, facts: ClusterFacts) -> list[Cause]:
    """Claims that keep the Pod from being scheduled: not created, missing, not allocated, of
    a class no driver publishes devices for."""
    dra = facts.dra
    if dra is None:
        return []
    causes = []
    for name, claim_name, template in pod_claims(pod):
        if not claim_name:
            causes.append(
                Cause(
                    "unallocatable-claim",
                    f"claim {name} (from template {template}) has no ResourceClaim yet",
                    "the resource claim controller creates it from the template: check that "
                    f'ResourceClaimTemplate "{template}" exists in {view.namespace}',
                )
            )
            continue
        claim = dra.claims.get((view.namespace, str(claim_name)))
        if claim is None:
            causes.append(
                Cause(
                    "unallocatable-claim",
                    f'claim {name}: ResourceClaim "{claim_name}" does not exist in '
                    f"{view.namespace}",
                    f'create ResourceClaim "{claim_name}", or name one that exists in '
                    "spec.resourceClaims",
                )
            )
            continue
        if claim.allocated:
            continue
        details = []
        for device_class in claim.device_classes:
            drivers = dra.class_drivers.get(device_class)
            if drivers is None:
                details.append(f'DeviceClass "{device_class}" does not exist')
            elif drivers and not set(drivers) & dra.published_drivers:
                details.append(
                    f"no ResourceSlice publishes devices of driver {', '.join(drivers)} "
                    f'(DeviceClass "{device_class}")'
                )
        fix = (
            "install the DRA driver whose kubelet plugin publishes these devices (it writes "
            "ResourceSlices), or ask for a DeviceClass whose devices exist"
            if details
            else "free devices of its classes, or ask for fewer; `kubectl describe "
            f"resourceclaim {claim_name} -n {view.namespace}` shows the scheduler's view"
        )
        causes.append(
            Cause(
                "unallocatable-claim",
                f'claim {name}: ResourceClaim "{claim_name}" is not allocated (asks for '
                f"{', '.join(claim.device_classes) or 'no class'})",
                fix,
                tuple(details),
            )
        )
    return causes


def quota_causes(
    pod: Mapping[str, Any],
    view: PodView,
    facts: ClusterFacts,
    policy: Policy,
    requests: Mapping[str, Quantity],
) -> list[Cause]:
    claimed_classes = {
        device_class
        for _, claim_name, _ in pod_claims(pod)
        if facts.dra is not None and (claim := facts.dra.claims.get((view.namespace, claim_name)))
        for device_class in claim.device_classes
    }
    causes = []
    for use in facts.quotas.get(view.namespace, ()):
        resource = use.resource
        if resource.endswith(DEVICE_CLASS_QUOTA):
            concerned = resource.removesuffix(DEVICE_CLASS_QUOTA) in claimed_classes
        else:
            concerned = resource.removeprefix("requests.").removeprefix("limits.") in requests
        if not concerned:
            continue
        whom = whom_to_ask(policy, view.namespace)
        if use.forbids:
            causes.append(
                Cause(
                    "quota-forbids",
                    f"ResourceQuota {use.quota} in {view.namespace}: the quota forbids "
                    f"{resource} (hard 0): no Pod asking for it can be created in the namespace",
                    f"the namespace is not entitled to {resource}: ask for an entitlement "
                    f"({whom}), which raises spec.hard[{resource}] of ResourceQuota "
                    f"{use.quota}, or ask for a GPU resource the namespace may use",
                )
            )
            continue
        if not use.exhausted:
            continue
        causes.append(
            Cause(
                "quota-exhausted",
                f"ResourceQuota {use.quota} in {view.namespace}: {resource} is used up "
                f"({plain_number(use.used)} of {plain_number(use.hard)}): no more GPU Pods can "
                "be created in the namespace",
                f"free GPUs in {view.namespace} (delete GPU Pods that are done or idle), or "
                f"raise spec.hard[{resource}] of ResourceQuota {use.quota} ({whom})",
            )
        )
    return causes


def pod_claims(pod: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The Pod's claims: (its name in the Pod, the ResourceClaim's name or "" where the claim
    controller has not made it yet, the template's name or "")."""
    spec = _mapping(pod.get("spec"))
    generated = {
        str(s.get("name")): str(s.get("resourceClaimName") or "")
        for s in _list(_mapping(pod.get("status")).get("resourceClaimStatuses"))
        if isinstance(s, Mapping)
    }
    return [
        (
            str(entry.get("name")),
            str(entry.get("resourceClaimName") or generated.get(str(entry.get("name"))) or ""),
            str(entry.get("resourceClaimTemplateName") or ""),
        )
        for entry in _list(spec.get("resourceClaims"))
        if isinstance(entry, Mapping)
    ]


def whom_to_ask(policy: Policy, namespace: str) -> str:
    """Whom a fix tells the namespace's users to ask: its tenant's ``contact``, else the
    platform team."""
    tenant = next((t for t in policy.tenants if t.contact and t.matches(namespace, None)), None)
    return tenant.ask if tenant is not None else "ask the platform team"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
