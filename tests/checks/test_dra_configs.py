"""NVIDIA's opaque parameters in claims (issue 35), through ``decide()`` and the real server:
each example of the issue is refused with its field and the fix, every problem of a claim is
listed, an unknown field is only warned, and the policy's feature gates decide the sharing
strategies. The parameters' own rules, case by case and against the driver's table, are in
``tests/test_dra_parameters.py``."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

import webhook
from tests.checks.test_dra_claims import request, template
from tests.serving import answers, policy_text, tls_server
from tests.support.admission import (
    admission,
    assert_allowed_clean,
    denied,
    policy,
    status_message,
    validate,
    warnings,
)

API = "resource.nvidia.com/v1beta1"
PARAMETERS = "spec.spec.devices.config[0].opaque.parameters"


@cache
def gated(time_slicing: bool = True, mps: bool = True) -> webhook.Policy:
    return policy(
        f"""
        newChecks: Enforce
        dra:
          nvidiaDriver:
            featureGates: {{TimeSlicingSettings: {str(time_slicing).lower()},
                            MPSSupport: {str(mps).lower()}}}
        """,
        name=f"dra-gates-{time_slicing}-{mps}",
    )


def configured(parameters: dict, device_class: str = "gpu.nvidia.com") -> dict:
    config = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}}]
    return template(request(deviceClassName=device_class), config=config)


def gpu_config(**sharing: Any) -> dict:
    return {"apiVersion": API, "kind": "GpuConfig", "sharing": sharing}


@pytest.mark.parametrize(
    "parameters, device_class, path, wanted",
    [
        (
            gpu_config(strategy="MPS", timeSlicingConfig={"interval": "Long"}),
            "gpu.nvidia.com",
            f"{PARAMETERS}.sharing.timeSlicingConfig",
            "timeSlicingConfig",
        ),
        (
            gpu_config(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 150}),
            "gpu.nvidia.com",
            f"{PARAMETERS}.sharing.mpsConfig.defaultActiveThreadPercentage",
            "150",
        ),
        (
            gpu_config(strategy="Timeslicing"),
            "gpu.nvidia.com",
            f"{PARAMETERS}.sharing.strategy",
            "did you mean TimeSlicing",
        ),
        (
            {"apiVersion": API, "kind": "GPUConfig", "sharing": {"strategy": "MPS"}},
            "gpu.nvidia.com",
            f"{PARAMETERS}.kind",
            "did you mean GpuConfig",
        ),
        (
            {
                "apiVersion": API,
                "kind": "MigDeviceConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
            },
            "mig.nvidia.com",
            f"{PARAMETERS}.sharing.timeSlicingConfig",
            "timeSlicingConfig",
        ),
    ],
    ids=["mps-with-time-slicing", "percentage-150", "strategy-case", "kind-case", "mig-ts"],
)
def test_each_example_of_the_issue_is_refused_with_its_field_and_fix(
    parameters: dict, device_class: str, path: str, wanted: str
) -> None:
    decision = validate(configured(parameters, device_class), gated())
    assert ("dra-claims", path) in denied(decision), status_message(decision)
    assert wanted in status_message(decision)


@pytest.mark.parametrize("strategy, gate", [("TimeSlicing", "time_slicing"), ("MPS", "mps")])
def test_a_strategy_is_refused_while_its_gate_is_off_and_admitted_once_on(
    strategy: str, gate: str
) -> None:
    off = gated(**{gate: False})
    decision = validate(configured(gpu_config(strategy=strategy)), off)
    assert denied(decision) == [("dra-claims", f"{PARAMETERS}.sharing.strategy")]
    assert "dra.nvidiaDriver.featureGates" in status_message(decision)
    assert_allowed_clean(validate(configured(gpu_config(strategy=strategy)), gated()))


def test_the_default_policy_runs_the_drivers_defaults_and_only_warns() -> None:
    decision = validate(configured(gpu_config(strategy="MPS")))
    assert decision.allowed
    assert any('"MPSSupport" feature gate is not enabled' in w for w in warnings(decision))


def test_every_problem_of_a_claim_is_listed() -> None:
    bad = gpu_config(
        strategy="MPS",
        timeSlicingConfig={"interval": "Long"},
        mpsConfig={"defaultActiveThreadPercentage": 150},
    )
    decision = validate(configured(bad), gated())
    assert {path for _, path in denied(decision)} >= {
        f"{PARAMETERS}.sharing.timeSlicingConfig",
        f"{PARAMETERS}.sharing.mpsConfig.defaultActiveThreadPercentage",
    }


def test_an_unknown_field_is_only_warned() -> None:
    decision = validate(configured(gpu_config(strategy="MPS", futureField=1)), gated())
    assert decision.allowed
    assert any("futureField" in w for w in warnings(decision))


def test_an_opaque_driver_near_miss_is_refused() -> None:
    config = [{"opaque": {"driver": "gpu.nvidia.co", "parameters": gpu_config(strategy="MPS")}}]
    decision = validate(template(request(), config=config), gated())
    assert denied(decision) == [("dra-claims", "spec.spec.devices.config[0].opaque.driver")]
    assert "did you mean gpu.nvidia.com?" in status_message(decision)


def test_another_drivers_parameters_are_its_own() -> None:
    config = [
        {
            "opaque": {
                "driver": "gpu.example.com",
                "parameters": {"apiVersion": "gpu.resource.example.com/v1alpha1", "kind": "X"},
            }
        }
    ]
    assert_allowed_clean(validate(template(request(), config=config), gated()))


def test_a_config_for_a_request_of_another_type_is_refused_only_where_it_names_it() -> None:
    mig = {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}
    named = template(
        request("gpu"),
        config=[{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": mig}}],
    )
    assert denied(validate(named, gated()))
    # Naming no request, the driver applies it to the MIG devices only (none here).
    unnamed = template(
        request("gpu"), config=[{"opaque": {"driver": "gpu.nvidia.com", "parameters": mig}}]
    )
    assert validate(unnamed, gated()).allowed


def test_the_real_server_lists_every_problem_of_a_claim(tmp_path: Path) -> None:
    claim = configured(
        gpu_config(
            strategy="MPS",
            timeSlicingConfig={"interval": "Long"},
            mpsConfig={"defaultActiveThreadPercentage": 150},
        )
    )
    claim["kind"] = "ResourceClaim"
    claim["spec"] = claim["spec"]["spec"]
    gates = "  dra: {nvidiaDriver: {featureGates: {TimeSlicingSettings: true, MPSSupport: true}}}\n"
    spec = "  newChecks: Enforce\n" + gates
    with tls_server(tmp_path, policy_text=policy_text(spec)) as server:
        [answer] = answers(server, [admission(claim)])
    assert answer["allowed"] is False
    fields = {cause["field"] for cause in answer["status"]["details"]["causes"]}
    assert fields >= {
        "spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig",
        "spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage",
    }
