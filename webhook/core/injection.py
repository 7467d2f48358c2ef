"""Annotations that have the node inject devices, mounts, network interfaces or settings into
a container, past everything the Pod spec says: containerd's NRI plugins and GKE's device
injector. A Pod that can reach a GPU node may carry one only where a tenant grant names its key.

NRI plugins (containerd/nri ``plugins/``) read keys under ``noderesource.dev`` (older spellings
under ``nri.io`` and ``nri.containerd.io``), per container (``<key>/container.<name>``), per Pod
(``<key>/pod``) or bare (``<key>``): ``devices.`` injects host device nodes, ``cdi-devices.``
CDI devices, ``mounts.`` host mounts, ``network-devices.`` and ``netdevice.`` move a host
interface into the Pod, ``sysctl.`` sets sysctls past Pod Security's sysctl check, others
(``ulimits.``, ``io-priority.``, ``rdt.``, ``writable-cgroups.``...) tune or loosen the
container. GKE's injector (GoogleCloudPlatform/container-engine-accelerators
``nri_device_injector``) reads ``devices.gke.io/container.<name>`` (and ``/pod``) and injects
the host device nodes it lists.

Each kind is judged by the rule that owns what it injects: devices and mounts by
``host-devices``, CDI devices by ``device-visibility``, the rest by ``pod-security``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple

from webhook.core import advice
from webhook.core.findings import Violation
from webhook.core.pods import PodView
from webhook.policy.model import Policy

NRI_DOMAINS = ("noderesource.dev", "nri.io", "nri.containerd.io")
GKE_DEVICES = "devices.gke.io"

# An NRI plugin's key family (the labels before the NRI domain) -> (what it injects, the rule).
_FAMILIES = {
    "devices": ("host device nodes", "host-devices"),
    "mounts": ("host mounts", "host-devices"),
    "cdi-devices": ("CDI devices, past the scheduler and the device plugin", "device-visibility"),
    "network-devices": ("a host network interface", "pod-security"),
    "netdevice": ("a host network interface", "pod-security"),
    "netdevices": ("a host network interface", "pod-security"),
    "sysctl": ("sysctls, past Pod Security's sysctl check", "pod-security"),
}
_OTHER = ("settings of an NRI plugin's", "pod-security")


class Injection(NamedTuple):
    """An injection annotation of a template: its key, what it injects and the owning rule."""

    key: str
    injects: str
    rule: str


def injections(view: PodView) -> tuple[Injection, ...]:
    """The template's injection annotations; worked out once per view."""
    found = view.injections
    if found is None:
        found = view.injections = tuple(_find(view.annotations))
    return found


def refused(view: PodView, policy: Policy, rule: str) -> Iterator[Violation]:
    """The violations of ``rule``: the template's injection annotations it owns (see the module
    docstring) that no tenant grant of its namespace names."""
    for injection in injections(view):
        if injection.rule != rule or injection.key in policy.grants(view.namespace).annotations:
            continue
        yield Violation(
            rule=rule,
            path=f"{view.metadata_path}.annotations[{injection.key}]",
            value=view.annotations[injection.key],
            message=f"the annotation {injection.key} has the node inject "
            + advice.why(view, policy, f"{injection.injects} into the container")
            + ", past every check of the Pod spec",
            hint=advice.fix(
                view,
                policy,
                "remove the annotation, or have the platform team grant it to the namespace "
                "(spec.tenants[].grants.annotations)",
            ),
            error_type="Forbidden",
            subject="annotations",
            field=f"annotations[{injection.key}]",
        )


def _find(annotations: Mapping) -> list[Injection]:
    found = []
    for key in annotations:
        injection = classify(key)
        if injection is not None:
            found.append(injection)
    return found


def classify(key: object) -> Injection | None:
    """The injection an annotation key asks for, or None for an annotation no node reads so."""
    if not isinstance(key, str):
        return None
    # A plugin reads the bare key too: then the whole key is the domain.
    domain = key.partition("/")[0]
    if domain == GKE_DEVICES:
        return Injection(key, "host device nodes", "host-devices")
    for nri in NRI_DOMAINS:
        if domain == nri or domain.endswith("." + nri):
            family = domain[: -len(nri)].rstrip(".")
            injects, rule = _FAMILIES.get(family, _OTHER)
            return Injection(key, injects, rule)
    return None
