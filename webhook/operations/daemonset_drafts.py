"""The DaemonSets a starting policy speaks of (``policy init --from-cluster``): the node agents
whose Pods land on every node, GPU nodes whatever their taints (their namespaces proposed as
exemptions), and those that run NVIDIA's device plugin (``devicePluginDaemonSets``, whose
desired count ``cluster check`` compares with the GPU nodes each should cover).

The device plugin is recognised by what a DaemonSet states, never by where it runs: a
container runs its image (``nvcr.io/nvidia/k8s-device-plugin``, any tag or digest) and none of
the image's other programs, or GKE's (an image named ``nvidia-gpu-device-plugin``, any
registry), or the DaemonSet has the name the GPU Operator gives its own or, in kube-system, the
name GKE gives its own (``nvidia-gpu-device-plugin``, ``-<node image>``): their images may
come from a mirror.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.policy.model import DaemonSetName

DEVICE_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin"
GPU_OPERATOR_DEVICE_PLUGIN = "nvidia-device-plugin-daemonset"
# GKE's own device plugin: the kube-system DaemonSets nvidia-gpu-device-plugin-* (one per node
# image: -small-cos, -large-cos, ...), whose image (gke.gcr.io/, registry.k8s.io/, a mirror)
# is named nvidia-gpu-device-plugin.
GKE_DEVICE_PLUGIN = "nvidia-gpu-device-plugin"
# The image's other programs, which DaemonSets of their own run by command: GPU feature
# discovery (in the image since v0.15), the MPS control daemon, the configuration sidecar.
OTHER_PROGRAMS = frozenset({"gpu-feature-discovery", "mps-control-daemon", "config-manager"})
# What of a Pod template the DaemonSet controller places its Pods by.
PLACEMENT_FIELDS = ("nodeSelector", "affinity", "tolerations", "hostNetwork")


@dataclass(frozen=True, slots=True)
class SeenDaemonSet:
    """What a draft keeps of a DaemonSet: its names, its Pod template's placement
    (``PLACEMENT_FIELDS``), its status's desired and ready counts, and why it runs NVIDIA's
    device plugin (None: nothing says it does)."""

    namespace: str
    name: str
    placement: Mapping[str, Any]
    desired: int = 0
    ready: int = 0
    device_plugin: str | None = None

    @property
    def named(self) -> DaemonSetName:
        return DaemonSetName(self.namespace, self.name)

    def tolerates_every_taint(self) -> bool:
        """A toleration with ``operator: Exists`` and no key: its Pods land on every node,
        GPU nodes whatever their taints."""
        tolerations = self.placement.get("tolerations")
        return any(
            isinstance(t, Mapping) and t.get("operator") == "Exists" and not t.get("key")
            for t in (tolerations if isinstance(tolerations, list) else ())
        )

    def as_read(self) -> Mapping[str, Any]:
        """What ``cluster check`` reads of it, in the DaemonSet's own shape."""
        return {
            "metadata": {"namespace": self.namespace, "name": self.name},
            "spec": {"template": {"spec": self.placement}},
            "status": {"desiredNumberScheduled": self.desired, "numberReady": self.ready},
        }


def seen_daemonset(obj: Mapping[str, Any]) -> SeenDaemonSet:
    """What a draft keeps of a DaemonSet object as the API server sent it (malformed parts
    are left out)."""
    metadata = _mapping(obj.get("metadata"))
    name = str(metadata.get("name") or "")
    template = _mapping(_mapping(_mapping(obj.get("spec")).get("template")).get("spec"))
    status = _mapping(obj.get("status"))
    return SeenDaemonSet(
        str(metadata.get("namespace") or ""),
        name,
        {key: template[key] for key in PLACEMENT_FIELDS if key in template},
        _count(status.get("desiredNumberScheduled")),
        _count(status.get("numberReady")),
        device_plugin_evidence(str(metadata.get("namespace") or ""), name, template),
    )


def device_plugin_evidence(namespace: str, name: str, template: Mapping[str, Any]) -> str | None:
    """Why the DaemonSet of this namespace, name and Pod template runs NVIDIA's device plugin
    (see the module's docstring); None when nothing says it does."""
    if name == GPU_OPERATOR_DEVICE_PLUGIN:
        return "its name is the one the GPU Operator gives its device plugin"
    if namespace == "kube-system" and (
        name == GKE_DEVICE_PLUGIN or name.startswith(f"{GKE_DEVICE_PLUGIN}-")
    ):
        return "its name and namespace are those GKE gives its device plugin"
    containers = template.get("containers")
    for container in containers if isinstance(containers, list) else ():
        if not isinstance(container, Mapping):
            continue
        image = container.get("image")
        if not isinstance(image, str):
            continue
        if _repository(image).rpartition("/")[2] == GKE_DEVICE_PLUGIN:
            return f"its container {container.get('name')} runs {image} (GKE's device plugin)"
        if _repository(image) != DEVICE_PLUGIN_IMAGE:
            continue
        command = container.get("command")
        program = str(command[0]) if isinstance(command, list) and command else ""
        if program.rpartition("/")[2] in OTHER_PROGRAMS:
            continue
        return f"its container {container.get('name')} runs {image}"
    return None


def _repository(image: str) -> str:
    """An image reference without its digest and tag."""
    named = image.partition("@")[0]
    path, colon, tag = named.rpartition(":")
    return path if colon and "/" not in tag else named


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
