"""What NVIDIA's DRA driver accepts, as data: its drivers, device classes, feature gates, the
opaque configuration API and the spelling of its MIG profile attribute.

Source: kubernetes-sigs/dra-driver-nvidia-gpu (formerly NVIDIA/k8s-dra-driver-gpu) at commit
``95932046683719c43b6a0dd9613c2e5aad5d6703``. What was read there:

- ``api/nvidia.com/resource/v1beta1/``: ``api.go`` (the group, version and kinds; the strict
  decoder: one scheme holding ``resource.nvidia.com/v1beta1`` only, so no other apiVersion
  decodes; it also knows ``ComputeDomain``, ``ComputeDomainClique`` and, through
  ``metav1.AddToGroupVersion``, ``WatchEvent`` and the ``*Options`` kinds, none of which is a
  device configuration), ``gpuconfig.go``, ``migconfig.go``, ``vfiodeviceconfig.go``,
  ``iommu.go``, ``computedomainconfig.go``, ``computedomain.go`` (channel allocation modes),
  ``sharing.go`` (fields, ``GetTimeSlicingConfig``/``GetMpsConfig``, pinned memory limits in
  whole MiB) and ``validate.go`` (strategies, their gates, intervals, the thread percentage).
- ``pkg/featuregates/featuregates.go``: every gate, its default and ``ValidateFeatureGates``.
- ``deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-*.yaml`` (five classes; only
  ``gpu.nvidia.com`` sets ``extendedResourceName: nvidia.com/gpu``, and only when the chart
  renders ``resource.k8s.io/v1``; ``compute-domain-daemon.nvidia.com`` is left out with
  host-managed IMEX) and ``values.yaml`` (``featureGates: {}``: the binary's defaults hold;
  ``webhook.enabled: false``).
- ``cmd/webhook/main.go`` (the driver's own webhook, disabled by default: strict decode,
  Normalize, Validate; it refuses ``VfioDeviceConfig``, which the kubelet plugin accepts),
  ``cmd/gpu-kubelet-plugin/device_state.go`` (NodePrepareResources: the same decode,
  Normalize and Validate, a config's kind against its device's type, then the sharing
  getters), ``cmd/compute-domain-kubelet-plugin/device_state.go``,
  ``cmd/gpu-kubelet-plugin/mig.go`` and ``nvlib.go`` with the vendored
  ``github.com/NVIDIA/go-nvlib/pkg/nvlib/device/mig_profile.go`` (the ``profile`` attribute).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

DRIVER_COMMIT = "95932046683719c43b6a0dd9613c2e5aad5d6703"

GPU_DRIVER = "gpu.nvidia.com"
COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"
# The only apiVersion the driver's decoder knows (api.go registers one GroupVersion).
PARAMETERS_API_VERSION = "resource.nvidia.com/v1beta1"

DeviceType = Literal["gpu", "mig", "vfio", "channel", "daemon"]

# Each configuration kind and the one device type the kubelet plugins apply it to: a config
# naming a request of another type fails NodePrepareResources ("cannot apply GpuConfig to
# device ..."); one naming no request is applied to the devices of its type only.
CONFIG_KINDS: Mapping[str, DeviceType] = MappingProxyType(
    {
        "GpuConfig": "gpu",
        "MigDeviceConfig": "mig",
        "VfioDeviceConfig": "vfio",
        "ComputeDomainChannelConfig": "channel",
        "ComputeDomainDaemonConfig": "daemon",
    }
)
# Kinds the decoder knows that are no device configuration: both plugins refuse them.
OTHER_KINDS = frozenset(
    {
        "ComputeDomain",
        "ComputeDomainClique",
        "WatchEvent",
        "ListOptions",
        "GetOptions",
        "DeleteOptions",
        "CreateOptions",
        "UpdateOptions",
        "PatchOptions",
    }
)

# The JSON fields of each object of the API (TypeMeta gives every kind apiVersion and kind).
# The decoder is strict and case-sensitive: any other key fails the decode.
FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "TypeMeta": ("apiVersion", "kind"),
        "GpuConfig": ("apiVersion", "kind", "sharing"),
        "MigDeviceConfig": ("apiVersion", "kind", "sharing"),
        "VfioDeviceConfig": ("apiVersion", "kind", "iommu"),
        "ComputeDomainChannelConfig": ("apiVersion", "kind", "domainID", "allocationMode"),
        "ComputeDomainDaemonConfig": ("apiVersion", "kind", "domainID"),
        "GpuSharing": ("strategy", "timeSlicingConfig", "mpsConfig"),
        "MigDeviceSharing": ("strategy", "mpsConfig"),
        "TimeSlicingConfig": ("interval",),
        "MpsConfig": (
            "defaultActiveThreadPercentage",
            "defaultPinnedDeviceMemoryLimit",
            "defaultPerDevicePinnedMemoryLimit",
            "multiUser",
        ),
        "IOMMUConfig": ("backendPolicy", "enableAPIDevice"),
    }
)

TIME_SLICING = "TimeSlicing"
MPS = "MPS"
SHARING_STRATEGIES = (TIME_SLICING, MPS)
# The gate each strategy needs: validateSharingStrategy refuses the strategy without it.
STRATEGY_GATES: Mapping[str, str] = MappingProxyType(
    {TIME_SLICING: "TimeSlicingSettings", MPS: "MPSSupport"}
)
TIME_SLICE_INTERVALS = ("Default", "Short", "Medium", "Long")
IOMMU_BACKEND_POLICIES = ("LegacyOnly", "PreferIommuFD")
# The plugin compares allocationMode with "All" only; anything else gets one channel.
CHANNEL_ALLOCATION_MODES = ("Single", "All")
ACTIVE_THREAD_PERCENTAGE = (0, 100)  # inclusive bounds (MpsConfig.Validate)
# Pinned memory limits are passed to MPS in whole MiB (value / 1024 / 1024); a limit that
# comes to 0 MiB is refused ("value set too low").
MIN_PINNED_MEMORY_BYTES = 1 << 20

# Every gate the driver defines (pkg/featuregates), with the binary's default; the chart
# passes none unless featureGates is set. The registry also holds Kubernetes' logging gates
# (ContextualLogging, LoggingAlphaOptions, LoggingBetaOptions), which are no driver feature.
FEATURE_GATES: Mapping[str, bool] = MappingProxyType(
    {
        "TimeSlicingSettings": False,  # strategy TimeSlicing and its timeSlicingConfig
        "MPSSupport": False,  # strategy MPS and its mpsConfig
        "IMEXDaemonsWithDNSNames": True,
        "PassthroughSupport": False,  # publishes vfio devices (vfio.gpu.nvidia.com)
        "DynamicMIG": False,
        "NVMLDeviceHealthCheck": False,
        "ComputeDomainCliques": True,
        "CrashOnNVLinkFabricErrors": True,
        "DeviceMetadata": False,
        "FabricManagerPartitioning": False,
        "HostManagedIMEXDaemon": False,
        "DRAListTypeAttributes": False,
        # With the plugin's --consumable-shares flag set, MPS fails NodePrepareResources.
        "ConsumableShares": False,
    }
)
# ValidateFeatureGates: the driver does not start with these settings.
GATES_REQUIRED: tuple[tuple[str, str], ...] = (
    ("ComputeDomainCliques", "IMEXDaemonsWithDNSNames"),
    ("DeviceMetadata", "PassthroughSupport"),
)
GATES_EXCLUSIVE: tuple[tuple[str, str], ...] = (
    ("DynamicMIG", "PassthroughSupport"),
    ("DynamicMIG", "NVMLDeviceHealthCheck"),
    ("DynamicMIG", "MPSSupport"),
    ("PassthroughSupport", "NVMLDeviceHealthCheck"),
)


@dataclass(frozen=True, slots=True)
class DeviceClassInfo:
    """A DeviceClass the driver's chart creates. ``gpu``: a device of the class hands the
    container a GPU (a whole one, a MIG instance, or one bound to vfio-pci for a VM);
    ``extended_resource_name``: the extended resource the class serves through DRA;
    ``config_kinds``: the opaque configuration kinds valid for its devices."""

    name: str
    driver: str
    device_type: DeviceType
    gpu: bool
    extended_resource_name: str | None
    config_kinds: tuple[str, ...]


def _device_class(
    name: str, driver: str, device_type: DeviceType, gpu: bool, extended: str | None = None
) -> DeviceClassInfo:
    kinds = tuple(kind for kind, kind_type in CONFIG_KINDS.items() if kind_type == device_type)
    return DeviceClassInfo(name, driver, device_type, gpu, extended, kinds)


DEVICE_CLASSES: Mapping[str, DeviceClassInfo] = MappingProxyType(
    {
        c.name: c
        for c in (
            _device_class("gpu.nvidia.com", GPU_DRIVER, "gpu", True, "nvidia.com/gpu"),
            _device_class("mig.nvidia.com", GPU_DRIVER, "mig", True),
            _device_class("vfio.gpu.nvidia.com", GPU_DRIVER, "vfio", True),
            _device_class(
                "compute-domain-daemon.nvidia.com", COMPUTE_DOMAIN_DRIVER, "daemon", False
            ),
            _device_class(
                "compute-domain-default-channel.nvidia.com",
                COMPUTE_DOMAIN_DRIVER,
                "channel",
                False,
            ),
        )
    }
)

# The ``profile`` attribute of a MIG device: go-nvlib's MigProfileInfo.String() of a profile
# whose compute and GPU slices are equal (the plugin publishes no other), ``<g>g.<GB>gb``
# followed by ``+me``, ``+me.all``, ``+gfx`` (an attribute) or ``-me`` (one taken away).
_DRIVER_PROFILE = re.compile(
    r"(?P<base>[1-9][0-9]?g\.[1-9][0-9]{0,3}gb)(?P<attr>\+me\.all|\+me|\+gfx|-me)?\Z"
)
# The catalogue (webhook/policy/mig.py) writes the device plugin's resource-name spelling.
_CATALOGUE_PROFILE = re.compile(
    r"(?P<base>[1-9][0-9]?g\.[1-9][0-9]{0,3}gb)(?P<attr>\.me\.all|\.me|\.gfx|-me)?\Z"
)


def catalogue_profile(attribute_value: str) -> str | None:
    """The catalogue's name of a profile as the driver publishes it (``1g.10gb+me`` is
    ``1g.10gb.me``, ``1g.24gb-me`` stays), or None when it is no profile the driver forms:
    the catalogue's own spelling (``1g.10gb.me``) matches no device's attribute."""
    match = _DRIVER_PROFILE.match(attribute_value)
    if match is None:
        return None
    return match["base"] + (match["attr"] or "").replace("+", ".")


def attribute_profile(catalogued: str) -> str | None:
    """The ``profile`` attribute a catalogued profile has on the driver's devices
    (``1g.10gb.me`` is ``1g.10gb+me``), or None for a name the driver never publishes
    (``.shared`` replicas are the device plugin's)."""
    match = _CATALOGUE_PROFILE.match(catalogued)
    if match is None:
        return None
    attribute = match["attr"] or ""
    return match["base"] + ("+" + attribute[1:] if attribute.startswith(".") else attribute)
