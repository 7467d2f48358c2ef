"""DRA claims ask for device classes, configurations and MIG profiles that exist.

The API server checks a claim's structure, not what its driver will do with it: a class that
does not exist leaves the Pod unschedulable, and NVIDIA's driver reads its opaque parameters
only when it prepares the devices on the node, after scheduling, so a bad one leaves the Pod
failing to start (``kubectl describe`` shows it in the kubelet's events). Judged in a
ResourceClaim or ResourceClaimTemplate when it is written:

- the device class: a near miss of a known one is refused (did you mean?); an undeclared class
  under a vendor domain follows ``unknownResources``; other drivers' classes (Intel's, a NIC's)
  are theirs; with the node inventory, a class the cluster does not have is warned;
- NVIDIA's opaque parameters (``webhook.core.dra_parameters``): what the driver would refuse
  is refused, what it may not know yet (an unknown kind or field) warned; an opaque driver
  that is a near miss of ``gpu.nvidia.com`` is refused, since no driver would read it;
- MIG profiles named by simple CEL selectors (``webhook.core.cel_selectors``), as the
  resource-name rule judges ``nvidia.com/mig-<profile>``: a well-formed profile no declared
  product offers follows ``migCatalogue.uncataloguedProfiles``; a malformed one is refused.
  A selector the reader cannot read exactly is left alone.

In a ComputeDomain: more ``numNodes`` than ``dra.computeDomains.maxNodes`` (it never forms). In
a Pod, with the node inventory's templates: a template it names that the inventory does not
have (a warning: applied with the Pod, or a ComputeDomain's channel template not made yet).

Every finding is advisory while ``newChecks`` is Warn (new in this release).
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core.cel_selectors import profiles_named
from webhook.core.claims import ClaimSpec, DeviceAsk, OpaqueConfig, config_applies
from webhook.core.dra import in_vendor_domain, known_class
from webhook.core.dra_parameters import check_parameters
from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView
from webhook.policy import mig
from webhook.policy.dra import near_miss
from webhook.policy.model import Policy
from webhook.policy.nvidia_dra import GPU_DRIVER, catalogue_profile

RULE = "dra-claims"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    if not view.claim_object:
        yield from _templates_not_found(view)
        return
    if view.compute_domain is not None:
        yield from _compute_domain(view, policy)
        return
    advisory = policy.new_checks_advisory
    for spec in view.claim_specs:
        types: list[tuple[DeviceAsk, str | None]] = []  # with NVIDIA's device type (None: other)
        for ask in spec.asks:
            known = known_class(ask.device_class, policy, view.nodes)
            types.append((ask, known.device_type if known is not None else None))
            yield from _device_class(view, policy, ask, advisory)
            if known is not None and known.device_type == "mig":
                yield from _mig_profiles(ask, policy, advisory)
        yield from _configs(spec, policy, types, advisory)


def _compute_domain(view: PodView, policy: Policy) -> Iterator[Violation]:
    """A ComputeDomain spanning more nodes than one NVLink domain holds never forms: its
    workload's Pods wait for IMEX daemons on nodes that cannot join it."""
    most = policy.dra.max_compute_domain_nodes
    nodes = view.compute_domain.get("numNodes") if view.compute_domain is not None else None
    if most is None or not isinstance(nodes, int) or isinstance(nodes, bool) or nodes <= most:
        return
    yield Violation(
        rule=RULE,
        path=f"{view.spec_path}.numNodes",
        value=nodes,
        message=f"a ComputeDomain of {nodes} nodes spans more than one NVLink domain, which "
        f"holds {most} here (dra.computeDomains.maxNodes), so it would never form",
        hint=f"set numNodes to at most {most}; split the job into domains of one rack each",
        subject="numNodes",
        field="numNodes",
        advisory=policy.new_checks_advisory,
    )


def _templates_not_found(view: PodView) -> Iterator[Violation]:
    """With the node inventory's templates: a Pod's template it has not seen. A warning: the
    template may be applied with the Pod (the inventory hears of it a moment later), or be a
    ComputeDomain's channel template, which the driver creates once the domain exists."""
    claims = view.pod_claims
    if claims is None or not claims.templates_known:
        return
    for claim in claims.by_name.values():
        if claim.template is not None and claim.spec is None:
            yield Violation(
                rule=RULE,
                path=f"{claim.path}.resourceClaimTemplateName",
                value=claim.template,
                message=f"no ResourceClaimTemplate {quote(claim.template)} in the node "
                "inventory: the Pod cannot start without it; its sharing mode is not checked",
                hint="apply it first (a ComputeDomain's driver makes its channel template)",
                subject="resourceClaims",
                field=f"resourceClaims[{claim.name}]",
                advisory=True,
            )


def _device_class(
    view: PodView, policy: Policy, ask: DeviceAsk, advisory: bool
) -> Iterator[Violation]:
    name = ask.device_class
    if not isinstance(name, str) or not name:
        return  # the API server requires a class name
    nodes = view.nodes
    if name in policy.dra.classes:
        if nodes is not None and nodes.knows_device_classes and nodes.device_class(name) is None:
            yield _missing(ask, name)
        return
    meant = policy.dra.near_miss(name)
    if meant is not None:
        yield Violation(
            rule=RULE,
            path=ask.class_path,
            value=name,
            message=f"device class {quote(name)} is a near miss of {quote(meant)}: no "
            "DeviceClass of that name exists, so the Pod would never be scheduled",
            hint=f"did you mean {meant}?",
            subject=ask.reference,
            field="deviceClassName",
            advisory=advisory,
        )
        return
    if nodes is not None and nodes.knows_device_classes:
        if nodes.device_class(name) is None:
            yield _missing(ask, name)
        return
    if in_vendor_domain(name, policy) and policy.unknown_resources != "Allow":
        yield Violation(
            rule=RULE,
            path=ask.class_path,
            value=name,
            message=f"device class {quote(name)} is not one this policy knows",
            hint=f"use one of {', '.join(sorted(policy.dra.classes))}, or declare it in the "
            "policy's dra.deviceClasses",
            subject=ask.reference,
            field="deviceClassName",
            advisory=advisory or policy.unknown_resources == "Warn",
        )


def _missing(ask: DeviceAsk, name: str) -> Violation:
    """Known from the node inventory alone: a warning (a driver may be installing it)."""
    return Violation(
        rule=RULE,
        path=ask.class_path,
        value=name,
        message=f"the cluster has no DeviceClass {quote(name)}, so the Pod would not be "
        "scheduled until one exists",
        hint="install the driver that publishes it, or name a class the cluster has",
        subject=ask.reference,
        field="deviceClassName",
        advisory=True,
    )


def _mig_profiles(ask: DeviceAsk, policy: Policy, advisory: bool) -> Iterator[Violation]:
    for path, expression in ask.selectors:
        for written in profiles_named(expression) or ():
            profile = catalogue_profile(written)
            if profile is None or not mig.is_well_formed(profile):
                yield Violation(
                    rule=RULE,
                    path=path,
                    value=written,
                    message=f"malformed MIG profile {quote(written)}: no MIG device has it, "
                    "so the claim would never be allocated",
                    hint="write the profile as the driver publishes it, <g>g.<mem>gb, e.g. "
                    f"{min(policy.mig_profiles, default='1g.10gb')}",
                    subject=ask.reference,
                    field="selectors.profile",
                    advisory=advisory,
                )
            elif mig.base_profile(profile) not in policy.mig_profiles:
                close = mig.closest_profile(mig.base_profile(profile), policy.mig_sizes)
                products = (
                    "any catalogued product"
                    if "*" in policy.mig_products
                    else ", ".join(policy.mig_products)
                )
                yield Violation(
                    rule=RULE,
                    path=path,
                    value=written,
                    message=f"MIG profile {quote(written)} is not offered by the GPU products "
                    f"this cluster declares ({products}), so the claim would never be allocated",
                    hint=(f"did you mean {close}?" if close else "check the nodes' MIG devices")
                    + "; new hardware goes into the policy's migCatalogue",
                    subject=ask.reference,
                    field="selectors.profile",
                    advisory=advisory or policy.uncatalogued_mig == "Warn",
                )


def _configs(
    spec: ClaimSpec, policy: Policy, types: list[tuple[DeviceAsk, str | None]], advisory: bool
) -> Iterator[Violation]:
    for config in spec.configs:
        driver = config.driver
        if driver != GPU_DRIVER:
            meant = near_miss(driver, (GPU_DRIVER,)) if isinstance(driver, str) else None
            if meant is not None:
                yield Violation(
                    rule=RULE,
                    path=f"{config.path}.driver",
                    value=driver,
                    message=f"opaque driver {quote(driver)} is a near miss of {quote(meant)}: "
                    "no driver reads this configuration, so the devices would be prepared "
                    "without it",
                    hint=f"did you mean {meant}?",
                    subject=",".join(config.requests) or "*",
                    field="config.opaque.driver",
                    advisory=advisory,
                )
            continue
        for problem in check_parameters(
            config.parameters,
            f"{config.path}.parameters",
            gates=policy.dra.feature_gates,
            device_types=_device_types(config, types),
        ):
            yield Violation(
                rule=RULE,
                path=problem.path,
                value=problem.value,
                message=problem.message,
                hint=problem.hint,
                subject=",".join(config.requests) or "*",
                field=problem.path.removeprefix(config.path),
                advisory=advisory or not problem.refused,
            )


def _device_types(
    config: OpaqueConfig, asks: list[tuple[DeviceAsk, str | None]]
) -> frozenset[str] | None:
    """The device types of the asks a config names and applies to (``config_applies``),
    where each is an NVIDIA class's: the driver refuses a kind for another type there. None
    for a config that names no request (the driver applies it to the devices of its own type
    and skips the others), names none it applies to, or a request of a class it does not
    know."""
    if not config.requests:
        return None
    named = [kind for ask, kind in asks if config_applies(config, ask, None)]
    if not named or None in named:
        return None
    return frozenset(kind for kind in named if kind is not None)
