"""The lint of the policy's DRA settings (issue 35): NVIDIA's driver gates by their names and
the combinations it starts with, and entitlements that name no GPU class."""

from __future__ import annotations

import pytest

from tests.support.admission import policy
from webhook.policy.load import PolicyError


def errors(spec: str) -> list[str]:
    with pytest.raises(PolicyError) as raised:
        policy(spec)
    return raised.value.errors


def test_a_gate_the_driver_does_not_have_is_refused_with_the_one_meant() -> None:
    [error] = errors("dra: {nvidiaDriver: {featureGates: {MpsSupport: true}}}")
    assert "spec.dra.nvidiaDriver.featureGates.MpsSupport: NVIDIA's DRA driver has no feature" in (
        error
    )
    assert "(did you mean 'MPSSupport'?)" in error


def test_gates_the_driver_refuses_to_start_with_are_refused() -> None:
    [error] = errors("dra: {nvidiaDriver: {featureGates: {DynamicMIG: true, MPSSupport: true}}}")
    assert "the driver does not start with both DynamicMIG and MPSSupport on" in error


def test_the_sharing_gates_load() -> None:
    loaded = policy("dra: {nvidiaDriver: {featureGates: {TimeSlicingSettings: true}}}")
    assert loaded.dra.feature_gates["TimeSlicingSettings"] is True
    assert loaded.dra.feature_gates["MPSSupport"] is False  # the driver's default


def test_an_entitlement_naming_no_gpu_class_is_warned() -> None:
    loaded = policy(
        """
        tenants:
          - namespaces: [team-a]
            entitlements: {deviceClasses: [gpu.nvidia.con, gpu.intel.com]}
        """
    )
    messages = [w.message for w in loaded.warnings if w.level == "warning"]
    assert any(
        "'gpu.nvidia.con' is not a GPU device class this policy knows" in m
        and "did you mean 'gpu.nvidia.com'?" in m
        for m in messages
    )
    assert any("'gpu.intel.com' is not a GPU device class" in m for m in messages)
    declared = policy(
        """
        dra: {deviceClasses: [{name: gpu.intel.com}]}
        tenants:
          - namespaces: [team-a]
            entitlements: {deviceClasses: [gpu.intel.com]}
        """
    )
    assert not [w for w in declared.warnings if "device class" in w.message]


def test_a_pool_declaring_no_gpu_class_is_warned() -> None:
    loaded = policy(
        """
        pools:
          - name: h100
            nodeSelector: {pool: h100}
            resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
            deviceClasses: [gpu.nvidia.con]
        """
    )
    assert any(
        "'gpu.nvidia.con' is not a GPU device class this policy knows, so no claim chooses "
        "pool 'h100' by it"
        in w.message
        and "did you mean 'gpu.nvidia.com'?" in w.message
        for w in loaded.warnings
    )
