"""What a Pending GPU Pod's namespace shows: the causes its ResourceClaims give (not created,
missing, not allocated, of a class no driver publishes devices for), and notes on its GPU
ResourceQuotas (one that forbids what it asks for, hard 0; one used up: they refuse the
workload's next Pods, never hold this one), each with its fix and whom to ask."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.pods import PodView
from webhook.core.scheduling import expression_matches
from webhook.core.wording import plain_number
from webhook.operations.causes import Cause
from webhook.operations.cluster_facts import ClusterFacts
from webhook.operations.quota_facts import DEVICE_CLASS_QUOTA, QuotaUse
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
        asked = (
            "all the devices of its classes"
            if claim.devices == 0
            else (f"{claim.devices} device{'' if claim.devices == 1 else 's'}")
        )
        published = sorted(
            {d for c in claim.device_classes for d in dra.class_drivers.get(c) or ()}
        )
        have = ", ".join(f"{dra.driver_devices.get(d, 0)} of driver {d}" for d in published)
        fix = (
            "install the DRA driver whose kubelet plugin publishes these devices (it writes "
            "ResourceSlices), or ask for a DeviceClass whose devices exist"
            if details
            else f"it asks for {asked}"
            + (f"; the cluster's ResourceSlices publish {have} in all" if have else "")
            + ": free devices of its classes, or ask for fewer; `kubectl describe "
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


def quota_notes(
    pod: Mapping[str, Any],
    view: PodView,
    facts: ClusterFacts,
    policy: Policy,
    requests: Mapping[str, Quantity],
) -> list[str]:
    """The GPU quotas of the Pod's namespace that refuse the next Pods like it: one that
    forbids what it asks for (hard 0), one used up. A ResourceQuota is checked when a Pod is
    created: it never holds a Pod that exists, so these are notes about its workload's next
    Pods (its controller's ``FailedCreate``), never a cause of this one's Pending. A quota
    whose scopes leave the Pod out is left out; one whose scope this tool does not read may
    apply."""
    claimed_classes = {
        device_class
        for _, claim_name, _ in pod_claims(pod)
        if facts.dra is not None and (claim := facts.dra.claims.get((view.namespace, claim_name)))
        for device_class in claim.device_classes
    }
    next_pods = (
        "its controller's next Pods are refused (FailedCreate events on the controller)"
        if _mapping(pod.get("metadata")).get("ownerReferences")
        else "the next Pod asking for it is refused at creation"
    )
    notes = []
    for use in facts.quotas.get(view.namespace, ()):
        resource = use.resource
        if resource.endswith(DEVICE_CLASS_QUOTA):
            concerned = resource.removesuffix(DEVICE_CLASS_QUOTA) in claimed_classes
        else:
            concerned = resource.removeprefix("requests.").removeprefix("limits.") in requests
        if not concerned or not (use.forbids or use.exhausted):
            continue
        applies = quota_applies(use, view.spec)
        if applies is False:
            continue
        may = (
            f" (its scope {applies} is not read here: it may apply)"
            if isinstance(applies, str)
            else ""
        )
        whom = whom_to_ask(policy, view.namespace)
        where = f"ResourceQuota {use.quota} in {view.namespace}{may}"
        held = "it does not hold this Pod (a quota is checked when a Pod is created), but"
        if use.forbids:
            notes.append(
                f"{where} forbids {resource} (hard 0): {held} {next_pods}; the namespace is "
                f"not entitled to it: ask for an entitlement ({whom}), which raises "
                f"spec.hard[{resource}] of ResourceQuota {use.quota}, or ask for a GPU "
                "resource the namespace may use"
            )
        else:
            notes.append(
                f"{where}: {resource} is used up ({plain_number(use.used)} of "
                f"{plain_number(use.hard)}): {held} {next_pods}; free GPUs in "
                f"{view.namespace} (delete GPU Pods that are done or idle), or raise "
                f"spec.hard[{resource}] of ResourceQuota {use.quota} ({whom})"
            )
    return notes


def quota_applies(use: QuotaUse, spec: Mapping[str, Any]) -> bool | str:
    """Whether a quota's scopes count a Pod of this spec: True, False, or the scope this tool
    does not read (it may apply). Read: ``Terminating`` and ``NotTerminating``
    (``activeDeadlineSeconds``), ``BestEffort`` and ``NotBestEffort`` (no cpu or memory
    request or limit in any container), ``PriorityClass`` (``priorityClassName``, with the
    selector's In, NotIn, Exists, DoesNotExist)."""
    terms = [(scope, "Exists", ()) for scope in use.scopes] + list(use.scope_selector)
    unread = ""
    for scope, operator, values in terms:
        if scope == "PriorityClass":
            name = spec.get("priorityClassName")
            requirement = {"operator": operator, "values": list(values)}
            matched = expression_matches(requirement, str(name) if name else None)
        elif scope in ("Terminating", "NotTerminating"):
            terminating = isinstance(spec.get("activeDeadlineSeconds"), int)
            matched = terminating == (scope == "Terminating")
        elif scope in ("BestEffort", "NotBestEffort"):
            matched = _best_effort(spec) == (scope == "BestEffort")
        else:
            unread = unread or scope
            continue
        if matched is not True:
            return False
    return unread or True


def _best_effort(spec: Mapping[str, Any]) -> bool:
    """The BestEffort QoS class: no container asks for cpu or memory, as request or limit."""
    for list_name in ("initContainers", "containers"):
        for container in _list(spec.get(list_name)):
            resources = _mapping(_mapping(container).get("resources"))
            for part in ("requests", "limits"):
                if {"cpu", "memory"} & set(_mapping(resources.get(part))):
                    return False
    return True


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
