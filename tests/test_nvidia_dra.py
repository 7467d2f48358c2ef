"""NVIDIA's DRA driver as data (``webhook.policy.nvidia_dra``): its device classes against the
selectors its chart writes, its gates, and the two spellings of a MIG profile."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.support.paths import SHARED
from webhook.policy import mig
from webhook.policy.nvidia_dra import (
    COMPUTE_DOMAIN_DRIVER,
    CONFIG_KINDS,
    DEVICE_CLASSES,
    FEATURE_GATES,
    GATES_EXCLUSIVE,
    GATES_REQUIRED,
    GPU_DRIVER,
    STRATEGY_GATES,
    attribute_profile,
    catalogue_profile,
)

# The CEL selector of each DeviceClass template in deployments/helm/dra-driver-nvidia-gpu/
# templates/deviceclass-*.yaml of kubernetes-sigs/dra-driver-nvidia-gpu at
# 95932046683719c43b6a0dd9613c2e5aad5d6703 (the channel class also selects channel id 0).
CHART_SELECTORS = {
    "gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && "
    "device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "mig.nvidia.com": "device.driver == 'gpu.nvidia.com' && "
    "device.attributes['gpu.nvidia.com'].type == 'mig'",
    "vfio.gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && "
    "device.attributes['gpu.nvidia.com'].type == 'vfio'",
    "compute-domain-daemon.nvidia.com": "device.driver == 'compute-domain.nvidia.com' && "
    "device.attributes['compute-domain.nvidia.com'].type == 'daemon'",
    "compute-domain-default-channel.nvidia.com": "device.driver == 'compute-domain.nvidia.com' "
    "&& device.attributes['compute-domain.nvidia.com'].type == 'channel' && "
    "device.attributes['compute-domain.nvidia.com'].id == 0",
}
SELECTOR = re.compile(
    r"device\.driver == '(?P<driver>[^']+)' && "
    r"device\.attributes\['(?P=driver)'\]\.type == '(?P<type>[a-z]+)'"
)


def test_each_device_class_is_the_charts_with_its_driver_and_device_type() -> None:
    assert set(DEVICE_CLASSES) == set(CHART_SELECTORS)
    for name, expression in CHART_SELECTORS.items():
        match = SELECTOR.match(expression)
        assert match is not None
        info = DEVICE_CLASSES[name]
        assert (info.name, info.driver, info.device_type) == (name, match["driver"], match["type"])
        assert info.config_kinds == tuple(
            k for k, t in CONFIG_KINDS.items() if t == info.device_type
        )
        assert info.gpu == (info.driver == GPU_DRIVER)
    assert {c.driver for c in DEVICE_CLASSES.values()} == {GPU_DRIVER, COMPUTE_DOMAIN_DRIVER}
    # Only the GPU class serves an extended resource (on resource.k8s.io/v1).
    assert {
        n: c.extended_resource_name for n, c in DEVICE_CLASSES.items() if c.extended_resource_name
    } == {"gpu.nvidia.com": "nvidia.com/gpu"}


GOLDEN = (
    SHARED / "conformance" / "dra" / "nvidia-gpu-operator__golden-deviceclass-gpu-nvidia-com.yaml"
)


@pytest.mark.skipif(not GOLDEN.is_file(), reason=f"the DRA corpus is not at {GOLDEN.parent}")
def test_the_gpu_operators_rendered_gpu_class_is_the_same() -> None:
    device_class = yaml.safe_load(GOLDEN.read_text("utf-8"))
    assert device_class["metadata"]["name"] == "gpu.nvidia.com"
    expression = device_class["spec"]["selectors"][0]["cel"]["expression"]
    assert " ".join(expression.split()) == CHART_SELECTORS["gpu.nvidia.com"]


def test_the_sharing_gates_are_off_by_default_and_every_gate_named_is_defined() -> None:
    assert {gate: FEATURE_GATES[gate] for gate in STRATEGY_GATES.values()} == {
        "TimeSlicingSettings": False,
        "MPSSupport": False,
    }
    assert len(FEATURE_GATES) == 13
    named = {gate for pair in (*GATES_REQUIRED, *GATES_EXCLUSIVE) for gate in pair}
    assert named <= set(FEATURE_GATES)
    # The defaults satisfy the driver's own start-up check.
    assert all(FEATURE_GATES[b] for a, b in GATES_REQUIRED if FEATURE_GATES[a])
    assert not any(FEATURE_GATES[a] and FEATURE_GATES[b] for a, b in GATES_EXCLUSIVE)


@pytest.mark.parametrize(
    ("attribute", "catalogued"),
    [
        ("1g.10gb", "1g.10gb"),
        ("7g.80gb", "7g.80gb"),
        ("1g.10gb+me", "1g.10gb.me"),
        ("1g.24gb+me.all", "1g.24gb.me.all"),
        ("1g.24gb+gfx", "1g.24gb.gfx"),
        ("4g.96gb+gfx", "4g.96gb.gfx"),
        ("1g.24gb-me", "1g.24gb-me"),
        # Not what the driver publishes.
        ("1g.10gb.me", None),  # the catalogue's spelling
        ("1c.2g.20gb", None),  # a compute-instance profile: the plugin skips them
        ("1g.10gb+me,gfx", None),
        ("1g.10gb+ME", None),
        ("1G.10GB", None),
        ("1g10gb", None),
        ("mig-1g.10gb", None),
        ("1g.10gb.shared", None),
        ("0g.10gb", None),
        (" 1g.10gb", None),
        ("", None),
    ],
)
def test_a_profile_attribute_has_its_catalogue_name(attribute: str, catalogued: str | None) -> None:
    assert catalogue_profile(attribute) == catalogued
    if catalogued is not None:
        assert attribute_profile(catalogued) == attribute


def test_every_catalogued_profile_has_the_attribute_the_driver_gives_it() -> None:
    profiles = {profile for product in mig.CATALOGUE.values() for profile in product}
    assert any("-me" in p for p in profiles) and any(".me.all" in p for p in profiles)
    for profile in profiles:
        attribute = attribute_profile(profile)
        assert attribute is not None and catalogue_profile(attribute) == profile
    assert attribute_profile("1g.10gb.shared") is None  # a device plugin replica
    assert attribute_profile("1g.10gb+me") is None
