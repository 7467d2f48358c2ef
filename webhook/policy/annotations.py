"""Annotations that have the node inject devices, mounts, network interfaces or settings into
a container, past everything the Pod spec says: containerd's NRI plugins and GKE's device
injector. Which keys they are, what each injects and which rule owns it: read by the checks
(``webhook.core.injection``) and by the lint of the grants that name them.

NRI plugins (containerd/nri ``plugins/``) read keys under ``noderesource.dev`` (older spellings
under ``nri.io`` and ``nri.containerd.io``), per container (``<key>/container.<name>``), per Pod
(``<key>/pod``) or bare (``<key>``): ``devices.`` injects host device nodes, ``cdi-devices.``
CDI devices, ``mounts.`` host mounts, ``network-devices.`` and ``netdevice.`` move a host
interface into the Pod, ``sysctl.`` sets sysctls past Pod Security's sysctl check, others
(``ulimits.``, ``io-priority.``, ``rdt.``, ``writable-cgroups.``...) tune or loosen the
container. GKE's injector (GoogleCloudPlatform/container-engine-accelerators
``nri_device_injector``) reads ``devices.gke.io/container.<name>`` (and ``/pod``, and the bare
key) and injects the host device nodes it lists.

Each kind is judged by the rule that owns what it injects: devices and mounts by
``host-devices``, CDI devices by ``device-visibility``, the rest by ``pod-security``.
"""

from __future__ import annotations

from typing import NamedTuple

NRI_DOMAINS = ("noderesource.dev", "nri.io", "nri.containerd.io")
GKE_DEVICES = "devices.gke.io"

# An NRI plugin's key family (the labels before the NRI domain) -> (what it injects into the
# container, the rule that owns it).
_FAMILIES = {
    "devices": ("host device nodes", "host-devices"),
    "mounts": ("host mounts", "host-devices"),
    "cdi-devices": ("CDI devices", "device-visibility"),
    "network-devices": ("a host network interface", "pod-security"),
    "netdevice": ("a host network interface", "pod-security"),
    "netdevices": ("a host network interface", "pod-security"),
    "sysctl": ("sysctls", "pod-security"),
}
_OTHER = ("an NRI plugin's settings", "pod-security")


class Injection(NamedTuple):
    """An injection annotation: its key, what it injects and the rule that owns it."""

    key: str
    injects: str
    rule: str


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
