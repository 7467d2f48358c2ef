"""DRA from a Pod's side, and claims as objects of their own.

A Pod names its claims in ``spec.resourceClaims`` (each made from a ResourceClaimTemplate,
``resourceClaimTemplateName``, or an existing ResourceClaim, ``resourceClaimName``; before
v1.31 both under ``source``), and each container lists the claims (and requests of them) it
uses in ``resources.claims``. What a claim asks for is in its template or claim, not in the
Pod: the node inventory keeps the cluster's ResourceClaimTemplates
(``NodeSnapshot.claim_template``); ResourceClaims are not watched.

A container may claim a GPU (``ContainerView.may_claim_gpu``) when a claim it uses asks, in
the requests it uses, for a device of a GPU class (``webhook.policy.dra``; with the inventory,
a DeviceClass of NVIDIA's GPU driver) in some alternative, or when what the claim asks for
cannot be read (a ResourceClaim, a template the inventory has not seen, no inventory): a claim
is made to give a container devices, and the GPU rules err towards treating it as one. It
surely claims one (``surely_claims_gpu``) only where the claim was read and the request is a
GPU class in every alternative, or through the extended resource name DRA derives from a GPU
class (``deviceclass.resource.kubernetes.io/gpu.nvidia.com``): only that spares it the void
requirement and the legacy CUDA refusal (``webhook.core.scope.surely_gets_gpu``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from webhook.core.claims import ClaimSpec, DeviceAsk, read_claim_spec, sharing_of
from webhook.policy.dra import DEVICE_CLASS_RESOURCE_PREFIX, KnownClass
from webhook.policy.model import Policy
from webhook.policy.nvidia_dra import GPU_DRIVER

if TYPE_CHECKING:
    from webhook.core.inventory import NodeSnapshot
    from webhook.core.pods import ContainerView, PodView


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One of a Pod's ``spec.resourceClaims``. ``spec``: its template's claim spec as the
    inventory has it; None when that cannot be read (a ResourceClaim, a template not seen)."""

    name: str
    path: str
    template: str | None
    claim: str | None
    spec: ClaimSpec | None

    @property
    def source(self) -> str:
        if self.template is not None:
            return f"ResourceClaimTemplate {self.template}"
        return f"ResourceClaim {self.claim}" if self.claim is not None else "no source"


@dataclass(frozen=True, slots=True)
class PodClaims:
    """A Pod's claims by name, and whether the inventory's templates were looked in."""

    by_name: Mapping[str, PodClaim]
    templates_known: bool


NO_CLAIMS = PodClaims({}, False)


def pod_claims(view: PodView) -> PodClaims:
    """The view's Pod claims, read on first use (``mark_claimed_gpus`` reads them first)."""
    found = view.pod_claims
    if found is None:
        found = view.pod_claims = _read_pod_claims(view)
    return found


def _read_pod_claims(view: PodView) -> PodClaims:
    entries = view.spec.get("resourceClaims")
    if not isinstance(entries, list) or not entries:
        return NO_CLAIMS
    nodes = view.nodes
    known = nodes is not None and nodes.knows_claim_templates
    claims: dict[str, PodClaim] = {}
    path = view.field_path("resourceClaims")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        source = entry.get("source")
        if not isinstance(source, dict):
            source = entry
        template = _string(source.get("resourceClaimTemplateName"))
        spec = None
        if template is not None and nodes is not None and known:
            kept = nodes.claim_template(view.namespace, template)
            if kept is not None:
                # Paths as in the template, where a message points.
                spec = read_claim_spec({"devices": kept}, "spec.spec")
        claims[entry["name"]] = PodClaim(
            entry["name"],
            f"{path}[{index}]",
            template,
            _string(source.get("resourceClaimName")),
            spec,
        )
    return PodClaims(claims, known)


def container_claims(container: ContainerView) -> list[tuple[str, str, str]]:
    """The claims a container uses: (claim name, request name or "", field path)."""
    listed = container.resources.get("claims")
    if not isinstance(listed, list):
        return []
    where = f"{container.path}.{container.resources_field}.claims"
    return [
        (item["name"], _string(item.get("request")) or "", f"{where}[{index}]")
        for index, item in enumerate(listed)
        if isinstance(item, dict) and isinstance(item.get("name"), str)
    ]


def known_class(name: Any, policy: Policy, nodes: NodeSnapshot | None) -> KnownClass | None:
    """The device class ``name`` as the policy knows it or, with the inventory, as a
    DeviceClass of NVIDIA's GPU driver (whose sharing mode is then unknown)."""
    if not isinstance(name, str):
        return None
    found = policy.dra.classes.get(name)
    if found is not None or nodes is None:
        return found
    record = nodes.device_class(name)
    if record is not None and GPU_DRIVER in record.drivers:
        return KnownClass(name, True, None)
    return None


def mark_claimed_gpus(view: PodView, policy: Policy) -> None:
    """Mark the containers that claim a GPU (``ContainerView.may_claim_gpu``), with the Pod's
    claims as the view's inventory has them, and the view GPU-relevant where they make it."""
    view.pod_claims = None
    claims = pod_claims(view)
    marked = False
    for container in view.containers:
        container.may_claim_gpu, container.surely_claims_gpu = _claims_gpu(
            container, claims, policy, view.nodes
        )
        marked = marked or container.may_claim_gpu
    if marked and not view.gpu_relevant:
        view.gpu_relevant = view.relevant_by_claims = True
    elif not marked and view.relevant_by_claims:
        view.gpu_relevant = view.relevant_by_claims = False


def claimed_classes(view: PodView, policy: Policy) -> tuple[str, ...]:
    """The GPU device classes the Pod's containers surely claim devices of, in first-seen
    order: each request's class, read from the inventory's templates, where every
    alternative of it asks for that one class (one that may be served by several chooses no
    pool of its own)."""
    claims = pod_claims(view)
    found: dict[str, None] = {}
    for container in view.containers:
        if not container.surely_claims_gpu:
            continue
        for name, request, _ in container_claims(container):
            claim = claims.by_name.get(name)
            if claim is None or claim.spec is None:
                continue
            by_request: dict[str, set[str | None]] = {}
            for ask in claim.spec.asks:
                if request and ask.request != request:
                    continue
                known = known_class(ask.device_class, policy, view.nodes)
                by_request.setdefault(ask.request, set()).add(
                    known.name if known is not None and known.gpu else None
                )
            for classes in by_request.values():
                only = classes.pop() if len(classes) == 1 else None
                if only is not None:
                    found[only] = None
    return tuple(found)


def has_claims(view: PodView) -> bool:
    """Whether anything of the Pod's could claim a device through DRA."""
    if view.spec.get("resourceClaims"):
        return True
    for container in view.containers:
        resources = container.resources
        if resources.get("claims"):
            return True
        limits = resources.get("limits")
        if isinstance(limits, dict) and any(
            isinstance(k, str)
            and (
                k.startswith(DEVICE_CLASS_RESOURCE_PREFIX)
                or (view.nodes is not None and _served_by_gpu_class(k, view.nodes))
            )
            for k in limits
        ):
            return True
    return False


def _claims_gpu(
    container: ContainerView, claims: PodClaims, policy: Policy, nodes: NodeSnapshot | None
) -> tuple[bool, bool]:
    """Whether the container may be handed a GPU through DRA, and whether it surely is
    (``webhook.core.scope``): a claim it uses whose spec cannot be read may; one read whose
    request asks for a GPU class in some alternative may, in every alternative surely."""
    may = surely = False
    for name, request, _ in container_claims(container):
        claim = claims.by_name.get(name)
        if claim is None:
            continue  # names no claim of the Pod's: the API server refuses it
        if claim.spec is None:
            may = True
            continue
        by_request: dict[str, list[bool]] = {}
        for ask in claim.spec.asks:
            if not request or ask.request == request:
                known = known_class(ask.device_class, policy, nodes)
                by_request.setdefault(ask.request, []).append(known is not None and known.gpu)
        for alternatives in by_request.values():
            may = may or any(alternatives)
            surely = surely or all(alternatives)
    limits = container.resources.get("limits")
    for key in limits if isinstance(limits, dict) else ():
        if not isinstance(key, str):
            continue
        if key.startswith(DEVICE_CLASS_RESOURCE_PREFIX):
            known = known_class(key[len(DEVICE_CLASS_RESOURCE_PREFIX) :], policy, nodes)
            if known is not None and known.gpu:
                may = surely = True
        elif nodes is not None and _served_by_gpu_class(key, nodes):
            may = surely = True
    return may, surely


def _served_by_gpu_class(resource: str, nodes: NodeSnapshot) -> bool:
    """With the inventory: an extended resource a DeviceClass of NVIDIA's GPU driver serves
    (its ``extendedResourceName``, DRAExtendedResource), whatever its domain: the scheduler
    makes the claim, the driver hands over the GPU. (A cluster has a few classes.)"""
    return (
        any(
            record.extended_resource_name == resource and GPU_DRIVER in record.drivers
            for record in nodes.dra.device_classes.values()
        )
        if nodes.knows_device_classes
        else False
    )


def claim_view_relevant(spec: ClaimSpec, policy: Policy, nodes: NodeSnapshot | None = None) -> bool:
    """Whether a claim or template is the GPU rules' business: it asks for admin access (to
    any device: what it sees is other Pods'), for a device class the policy knows (or, with
    the inventory, one of NVIDIA's GPU driver), a near miss of one, or one under a vendor
    domain (nvidia.com)."""
    for ask in spec.asks:
        name = ask.device_class
        if ask.admin_access:
            return True
        if not isinstance(name, str):
            continue
        if (
            known_class(name, policy, nodes) is not None
            or policy.dra.near_miss(name) is not None
            or in_vendor_domain(name, policy)
        ):
            return True
    return False


def in_vendor_domain(name: str, policy: Policy) -> bool:
    """A device class named under a vendor domain (``mig-1g-12gb.gpu.nvidia.com``)."""
    return any(name == d or name.endswith(f".{d}") for d in policy.vendor_domains)


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True, slots=True)
class ClaimedMode:
    """The sharing mode of the devices one ask of a claim gets: ``where`` is the field that
    sets it (the opaque configuration's strategy, else the class name)."""

    mode: str
    ask: DeviceAsk
    where: str


def claim_modes(spec: ClaimSpec, policy: Policy, nodes: NodeSnapshot | None) -> list[ClaimedMode]:
    """The sharing mode of each request of ``spec`` that asks for a GPU class whose mode is
    known. A ``firstAvailable`` request gets one of its subrequests: it counts only when all
    of them share one mode (the allocation could take any)."""
    by_request: dict[str, list[ClaimedMode | None]] = {}
    for ask in spec.asks:
        known = known_class(ask.device_class, policy, nodes)
        if known is None or not known.gpu:
            continue
        if known.sharing is None:
            by_request.setdefault(ask.request, []).append(None)
            continue
        record = nodes.device_class(known.name) if nodes is not None else None
        mode, where = sharing_of(ask, known, spec, record.config if record is not None else ())
        by_request.setdefault(ask.request, []).append(ClaimedMode(mode, ask, where))
    found = []
    for modes in by_request.values():
        if all(m is not None for m in modes) and len({m.mode for m in modes if m}) == 1:
            found.append(modes[0])
    return [m for m in found if m is not None]
