"""What a policy knows about Dynamic Resource Allocation: the device classes whose claims hand a
container a GPU (NVIDIA's, built in from ``webhook.policy.nvidia_dra``, and the policy's
``dra.deviceClasses``), the NVIDIA driver's feature gates as the cluster sets them, and the
largest ComputeDomain the racks hold.

A class is known by its name only: a DeviceClass's selectors can pick any devices, but the
classes NVIDIA's chart creates pick what their names say, and a class the policy declares is
declared for what it gives. With the node inventory, a class the cluster has whose selectors pin
NVIDIA's GPU driver is read as a GPU class too (``webhook.core.dra.known_class``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from webhook.policy import nvidia_dra
from webhook.policy.names import within_one_edit

# The sharing mode of a device of each of NVIDIA's device types when no configuration shares
# it (the sharing-mode rule's words); channels and daemons are no GPU.
_TYPE_SHARING = {"gpu": "Exclusive", "mig": "MIG", "vfio": "VFIO"}


@dataclass(frozen=True, slots=True)
class KnownClass:
    """A device class the policy knows. ``sharing``: the sharing mode of its devices where no
    opaque configuration changes it (None: it hands out no GPU). ``device_type``: NVIDIA's
    device type (``gpu``, ``mig``, ``vfio``, ``channel``, ``daemon``) for the NVIDIA driver's
    classes, which says which opaque configuration kinds apply; None for another driver's."""

    name: str
    gpu: bool
    sharing: str | None
    device_type: str | None = None


def _built_in() -> dict[str, KnownClass]:
    return {
        name: KnownClass(name, info.gpu, _TYPE_SHARING.get(info.device_type), info.device_type)
        for name, info in nvidia_dra.DEVICE_CLASSES.items()
    }


@dataclass(frozen=True, slots=True)
class DraSettings:
    """The policy's ``dra`` block, compiled. ``feature_gates``: every gate of NVIDIA's driver,
    as the policy sets it or at the driver's default."""

    classes: MappingProxyType[str, KnownClass] = field(
        default_factory=lambda: MappingProxyType(_built_in())
    )
    feature_gates: MappingProxyType[str, bool] = field(
        default_factory=lambda: MappingProxyType(dict(nvidia_dra.FEATURE_GATES))
    )
    max_compute_domain_nodes: int | None = None

    def near_miss(self, name: str) -> str | None:
        """The known class ``name`` is a near miss of (another case, another separator, one
        letter added, changed, dropped or two swapped), if any: ``gpu.nvidia.con``."""
        return near_miss(name, self.classes)


# The extended resource name of a DeviceClass without an extendedResourceName of its own
# (KEP-5004, DRAExtendedResource): this prefix, then the class's name. A Pod that asks for it
# gets devices of the class through a claim the scheduler makes.
DEVICE_CLASS_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
DEVICE_CLASS_RESOURCE_DOMAIN = DEVICE_CLASS_RESOURCE_PREFIX.rstrip("/")


def implicit_resources(settings: DraSettings) -> dict[str, str]:
    """The extended resource name of each GPU class the policy knows, with the sharing mode of
    its devices (as a resource declaration writes it; a VFIO GPU is a whole one)."""
    return {
        f"{DEVICE_CLASS_RESOURCE_PREFIX}{name}": "Exclusive"
        if known.sharing in (None, "VFIO")
        else known.sharing
        for name, known in settings.classes.items()
        if known.gpu
    }


def near_miss(name: str, known: Iterable[str]) -> str | None:
    """The first of ``known`` (in sorted order) that ``name`` is a near miss of, if any. The
    lists compared are short (a policy's device classes, a kind's fields)."""
    candidates = sorted(known)
    if name in candidates:
        return None
    folded = _fold(name)
    lowered = name.lower()
    for candidate in candidates:
        other = candidate.lower()
        if (
            _fold(candidate) == folded
            or within_one_edit(lowered, other)
            or _one_swap(lowered, other)
        ):
            return candidate
    return None


def _fold(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "").replace(".", "")


def _one_swap(a: str, b: str) -> bool:
    """Whether swapping two neighbouring letters turns ``a`` into ``b``."""
    if len(a) != len(b) or a == b:
        return False
    apart = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    return (
        len(apart) == 2
        and apart[1] == apart[0] + 1
        and a[apart[0]] == b[apart[1]]
        and (a[apart[1]] == b[apart[0]])
    )


def compile_dra(raw: Mapping[str, Any]) -> DraSettings:
    """The ``spec.dra`` block (validated by the schema) compiled."""
    classes = _built_in()
    for entry in raw.get("deviceClasses", ()):
        gpu = entry.get("gpu", True)
        built_in = classes.get(entry["name"])
        # Declaring a built-in class keeps its mode unless the entry says another.
        default = built_in.sharing if built_in is not None else "Exclusive"
        classes[entry["name"]] = KnownClass(
            entry["name"],
            gpu,
            entry.get("sharing", default) if gpu else None,
            built_in.device_type if built_in is not None else None,
        )
    gates = dict(nvidia_dra.FEATURE_GATES)
    gates.update(raw.get("nvidiaDriver", {}).get("featureGates", {}))
    return DraSettings(
        MappingProxyType(classes),
        MappingProxyType(gates),
        raw.get("computeDomains", {}).get("maxNodes"),
    )


NO_DRA_SETTINGS = DraSettings()

# Who creates the ResourceClaims of Pods (``request.userInfo.username``): the resource-claim
# controller, from a Pod's templates (its own service account with
# --use-service-account-credentials, else the controller manager's identity), and the
# scheduler, for the extended resources a DeviceClass serves (DRAExtendedResource). Such a
# claim is judged through its template or its Pod, never on its own: a denial there would
# leave the Pod pending with no word to its owner. The annotations such claims carry
# (resource.kubernetes.io/pod-claim-name, .../extended-resource-claim) prove nothing: anyone
# who creates a claim can write them.
CLAIM_MAKERS = frozenset(
    {
        "system:serviceaccount:kube-system:resource-claim-controller",
        "system:kube-controller-manager",
        "system:kube-scheduler",
    }
)
