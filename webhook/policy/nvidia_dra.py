"""TEMPORARY STUB (helper dra-params writes the real one)."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

GPU_DRIVER = "gpu.nvidia.com"
COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"
PARAMETERS_API_VERSION = "resource.nvidia.com/v1beta1"


@dataclass(frozen=True, slots=True)
class DeviceClassInfo:
    name: str
    driver: str
    device_type: Literal["gpu", "mig", "vfio", "channel", "daemon"]
    gpu: bool
    extended_resource_name: str | None
    config_kinds: tuple[str, ...]


DEVICE_CLASSES = MappingProxyType(
    {
        "gpu.nvidia.com": DeviceClassInfo(
            "gpu.nvidia.com", GPU_DRIVER, "gpu", True, "nvidia.com/gpu", ("GpuConfig",)
        ),
        "mig.nvidia.com": DeviceClassInfo(
            "mig.nvidia.com", GPU_DRIVER, "mig", True, None, ("MigDeviceConfig",)
        ),
        "vfio.gpu.nvidia.com": DeviceClassInfo(
            "vfio.gpu.nvidia.com", GPU_DRIVER, "vfio", True, None, ("VfioDeviceConfig",)
        ),
        "compute-domain-daemon.nvidia.com": DeviceClassInfo(
            "compute-domain-daemon.nvidia.com",
            COMPUTE_DOMAIN_DRIVER,
            "daemon",
            False,
            None,
            ("ComputeDomainDaemonConfig",),
        ),
        "compute-domain-default-channel.nvidia.com": DeviceClassInfo(
            "compute-domain-default-channel.nvidia.com",
            COMPUTE_DOMAIN_DRIVER,
            "channel",
            False,
            None,
            ("ComputeDomainChannelConfig",),
        ),
    }
)
FEATURE_GATES = MappingProxyType({"TimeSlicingSettings": False, "MPSSupport": False})


def catalogue_profile(attribute_value: str) -> str | None:
    return attribute_value.replace("+", ".")
