"""entitlement: where the policy states a tenant's entitlements, its Pods request only the GPU
resources listed and no more GPU devices per container and per Pod than allowed; warned while
newChecks is Warn, denied with Enforce; namespaces without entitlements are not limited."""

from __future__ import annotations

from functools import cache

import pytest

import webhook
from tests.support.admission import (
    assert_allowed_clean,
    container,
    denied,
    pod,
    policy,
    status_message,
    validate,
    warnings,
)

SPEC = """
newChecks: {new_checks}
gpuNodeTaints: [{{key: nvidia.com/gpu, value: present, effect: NoSchedule}}]
resources:
  - {{name: nvidia.com/gpu, sharing: Exclusive}}
  - {{name: nvidia.com/mig-1g.10gb, sharing: MIG}}
companionResources: [nvidia.com/hostdev]
tenants:
  - namespaces: [inference-*]
    contact: "#gpu-platform on Slack"
    entitlements:
      resources: [nvidia.com/mig-1g.10gb]
      maxGPUsPerContainer: 2
      maxGPUsPerPod: 3
  - namespaces: ["*"]
    grants: {{capabilities: [IPC_LOCK]}}
"""


@cache
def entitled(new_checks: str = "Enforce") -> webhook.Policy:
    return policy(SPEC.format(new_checks=new_checks), name=f"entitled-{new_checks}")


MIG = "nvidia.com/mig-1g.10gb"


def test_a_resource_not_listed_is_refused_naming_the_setting_and_whom_to_ask() -> None:
    decision = validate(pod(container(gpu=1)), entitled(), namespace="inference-chat")
    assert denied(decision) == [
        ("entitlement", "spec.containers[0].resources.limits[nvidia.com/gpu]")
    ]
    message = status_message(decision)
    assert 'namespace "inference-chat" may not use nvidia.com/gpu' in message
    assert "tenants[0].entitlements (inference-*) lists nvidia.com/mig-1g.10gb" in message
    assert "ask #gpu-platform on Slack" in message


def test_listed_resources_within_the_maxima_are_admitted() -> None:
    obj = pod(container(gpu=2, resource=MIG), container("side", gpu=1, resource=MIG))
    assert_allowed_clean(validate(obj, entitled(), namespace="inference-chat"))


def test_companion_resources_are_not_gpus() -> None:
    obj = pod(container(gpu=2, resource=MIG, limits={"nvidia.com/hostdev": 4}))
    assert_allowed_clean(validate(obj, entitled(), namespace="inference-chat"))


@pytest.mark.parametrize(
    "obj, path, says",
    [
        (
            pod(container(gpu=3, resource=MIG)),
            "spec.containers[0].resources",
            'container "app" requests 3 GPU devices in all, above the 2 per container',
        ),
        (
            pod(container(gpu=2, resource=MIG), container("b", gpu=2, resource=MIG)),
            "spec.containers[0].resources.limits[nvidia.com/mig-1g.10gb]",
            "the Pod requests 4 GPU devices in all, above the 3 per Pod",
        ),
    ],
    ids=["per container", "per Pod"],
)
def test_more_devices_than_allowed_are_refused(obj: dict, path: str, says: str) -> None:
    decision = validate(obj, entitled(), namespace="inference-chat")
    assert denied(decision) == [("entitlement", path)]
    assert says in status_message(decision)


def test_namespaces_without_entitlements_are_not_limited() -> None:
    assert validate(pod(container(gpu=8)), entitled(), namespace="training").allowed


def test_it_is_a_warning_while_new_checks_is_warn() -> None:
    decision = validate(pod(container(gpu=1)), entitled("Warn"), namespace="inference-chat")
    assert decision.allowed
    [warning] = warnings(decision)
    assert "may not use nvidia.com/gpu" in warning


def test_an_entitlement_to_an_undeclared_name_is_warned() -> None:
    text = SPEC.format(new_checks="Warn").replace(
        "resources: [nvidia.com/mig-1g.10gb]",
        "resources: [nvidia.com/mig-1g.10gb, nvidia.com/gpus]",
    )
    found = [
        w.message for w in policy(text, name="typo").warnings if "nvidia.com/gpus" in w.message
    ]
    assert found == [
        "nvidia.com/gpus is not a GPU resource this policy declares, so no Pod is entitled to it "
        "by this entry: declare it (resources, a pool, the MIG catalogue) or correct the name"
    ]


@pytest.mark.parametrize("first", ["nvidia.com/gpu", MIG])
def test_a_pod_above_its_maximum_points_at_its_first_request_in_every_process(first: str) -> None:
    """The Pod's total is over two resources: the finding points at the first container's,
    in container order (a set's order varies with the process's hash seed)."""
    text = SPEC.format(new_checks="Enforce").replace(
        "resources: [nvidia.com/mig-1g.10gb]", "resources: [nvidia.com/mig-1g.10gb, nvidia.com/gpu]"
    )
    second = MIG if first == "nvidia.com/gpu" else "nvidia.com/gpu"
    obj = pod(container(gpu=2, resource=first), container("b", gpu=2, resource=second))
    decision = validate(obj, policy(text, name="two-resources"), namespace="inference-chat")
    found = [path for rule, path in denied(decision) if rule == "entitlement"]
    assert found == [f"spec.containers[0].resources.limits[{first}]"]
