"""A tenant's DRA device classes (issue 35): ``entitlements.deviceClasses`` limits the GPU
device classes its claims and claim templates ask for (the entitlement rule), and
``gpu-admission quota`` writes the per-class ResourceQuota lines a cluster counts claims by."""

from __future__ import annotations

from functools import cache

import kubernetes_validate

import webhook
from tests.checks.test_dra_claims import claiming_pod, claims, request, template
from tests.patching import K8S_VERSION, apply_both, validate_pod
from tests.support.admission import (
    admission,
    assert_allowed_clean,
    container,
    denied,
    policy,
    validate,
    warnings,
)
from webhook.audit.quotas import implied_quotas
from webhook.core.dra_inventory import DraObjects, claim_template_record
from webhook.core.inventory import NodeFields, NodeSnapshot

SPEC = """
newChecks: {new_checks}
tenants:
  - namespaces: [team-a]
    contact: "#gpu-platform"
    entitlements:
      resources: [nvidia.com/gpu]
      deviceClasses: [gpu.nvidia.com]
      maxGPUs: {{nvidia.com/gpu: 8, gpu.nvidia.com: 4}}
"""


@cache
def entitled(new_checks: str = "Enforce") -> webhook.Policy:
    return policy(SPEC.format(new_checks=new_checks), name=f"dra-entitled-{new_checks}")


def test_a_class_the_tenant_may_not_claim_is_refused_with_the_setting_and_whom_to_ask() -> None:
    decision = validate(
        template(request(deviceClassName="mig.nvidia.com")), entitled(), namespace="team-a"
    )
    assert denied(decision) == [
        ("entitlement", "spec.spec.devices.requests[0].exactly.deviceClassName")
    ]
    message = decision.response["response"]["status"]["message"]
    assert (
        "may not claim mig.nvidia.com devices: tenants[0].entitlements (team-a) lists "
        "device classes gpu.nvidia.com" in message
    )
    assert "#gpu-platform" in message


def test_the_listed_class_other_namespaces_and_other_drivers_classes_are_not_limited() -> None:
    assert_allowed_clean(validate(template(request()), entitled(), namespace="team-a"))
    assert_allowed_clean(
        validate(
            template(request(deviceClassName="mig.nvidia.com")), entitled(), namespace="team-b"
        )
    )
    assert_allowed_clean(
        validate(template(request(deviceClassName="gpu.intel.com")), entitled(), namespace="team-a")
    )


def test_under_new_checks_warn_it_is_a_warning() -> None:
    decision = validate(
        template(request(deviceClassName="mig.nvidia.com")), entitled("Warn"), namespace="team-a"
    )
    assert decision.allowed
    assert any("may not claim mig.nvidia.com devices" in w for w in warnings(decision))


def test_the_quota_holds_each_gpu_class_at_its_limit_or_zero() -> None:
    [quota] = implied_quotas(entitled(), ["team-a"])
    assert quota["spec"]["hard"] == {
        "requests.nvidia.com/gpu": "8",
        "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "4",
        "mig.nvidia.com.deviceclass.resource.k8s.io/devices": "0",
        "vfio.gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "0",
    }
    kubernetes_validate.validate(quota, K8S_VERSION, strict=True)


def test_a_pod_whose_gpu_comes_from_a_read_claim_is_confined_to_the_tenants_products() -> None:
    # With the node inventory's template, the claim surely hands over a GPU: the mutating
    # webhook adds the product affinity, and the patched Pod is admitted (a claim that cannot
    # be read may be a NIC's, which a GPU product label would keep from every node: not
    # confined).
    products = policy(
        """
        newChecks: Enforce
        gpuNodeTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
        tenants:
          - namespaces: [team-a]
            entitlements: {products: [NVIDIA-L4]}
        """,
        name="dra-products",
    )
    whole = template(request(), name="whole")
    whole["metadata"]["namespace"] = "team-a"
    kept = {("team-a", "whole"): claim_template_record(whole)}
    nodes = NodeSnapshot({}, NodeFields.of(products), dra=DraObjects({}, kept, True, True))
    pod = claiming_pod(claims(container("app"), "gpu"), template_name="whole")
    mutated = webhook.decide(admission(pod, namespace="team-a"), products, mutate=True, nodes=nodes)
    patched = apply_both(pod, list(mutated.patch))
    validate_pod(patched)
    [term] = patched["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert {
        "key": "nvidia.com/gpu.product",
        "operator": "In",
        "values": ["NVIDIA-L4", "NVIDIA-L4-SHARED"],
    } in term["matchExpressions"]
    review = admission(patched, namespace="team-a")
    assert webhook.decide(review, products, mutate=False, nodes=nodes).allowed
    unconfined = webhook.decide(
        admission(pod, namespace="team-a"), products, mutate=False, nodes=nodes
    )
    assert "pool-access" in {rule for rule, _ in denied(unconfined)}
