"""A tenant's pool preference: where several pools its namespaces may use offer what a Pod asks
for, the first preferred one is the Pod's pool, before the choice is found ambiguous; the
Pod's own choice (annotation, nodeSelector, node affinity) still comes first."""

from __future__ import annotations

import base64
import json
from functools import cache

import webhook
from tests.patching import apply_jsonpatch
from tests.support.admission import (
    POOL_LABEL,
    assert_allowed_clean,
    container,
    denied,
    mutate,
    pod,
    policy,
    validate,
)

# The device plugin's default: time-sliced replicas keep the name nvidia.com/gpu.
SPEC = f"""
pools:
  - name: h100
    nodeSelector: {{{POOL_LABEL}: h100}}
    taints: [{{key: nvidia.com/gpu, value: present, effect: NoSchedule}}]
    resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
  - name: l4
    nodeSelector: {{{POOL_LABEL}: l4}}
    taints: [{{key: nvidia.com/gpu, value: present, effect: NoSchedule}}]
    resources: [{{name: nvidia.com/gpu, sharing: TimeSlicing}}]
tenants:
  - namespaces: [inference-*]
    poolPreference: [l4, h100]
  - namespaces: [ml]
    poolPreference: [h100]
"""


@cache
def preferring() -> webhook.Policy:
    return policy(SPEC, name="preferring")


def patch_of(decision: webhook.Decision) -> list[dict]:
    return json.loads(base64.b64decode(decision.response["response"]["patch"]))


def affinity_values(operations: list[dict]) -> list[str]:
    text = json.dumps(operations)
    return [pool for pool in ("h100", "l4") if f'"{pool}"' in text]


def test_the_preferred_pool_is_the_pods_and_it_is_confined_there() -> None:
    for namespace, chosen in (("ml", "h100"), ("inference-chat", "l4")):
        gpu_pod = pod(container(gpu=1))
        assert affinity_values(patch_of(mutate(gpu_pod, preferring(), namespace=namespace))) == [
            chosen
        ]
        assert validate(gpu_pod, preferring(), namespace=namespace).allowed


def test_without_a_preference_the_pool_choice_is_ambiguous_as_before() -> None:
    decision = validate(pod(container(gpu=1)), preferring(), namespace="web")
    assert denied(decision) == [
        ("pool-access", "spec.containers[0].resources.limits[nvidia.com/gpu]")
    ]


def test_the_pods_own_choice_comes_first() -> None:
    pinned = pod(container(gpu=1), node_selector={POOL_LABEL: "l4"})
    # Its nodeSelector names the pool already: no affinity added, and none for h100.
    assert affinity_values(patch_of(mutate(pinned, preferring(), namespace="ml"))) == []
    annotated = pod(container(gpu=1), annotations={"gpu-admission.io/pool": "l4"})
    assert affinity_values(patch_of(mutate(annotated, preferring(), namespace="ml"))) == ["l4"]
    tolerated = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert_allowed_clean(
        validate(
            pod(container(gpu=1), node_selector={POOL_LABEL: "l4"}, tolerations=tolerated),
            preferring(),
            namespace="ml",
        )
    )


def test_a_tenants_block_of_preferences_keeps_the_default_grants() -> None:
    """IPC_LOCK, SYS_NICE and SYS_RESOURCE stay granted while no entry states grants."""
    assert (
        preferring().grants("ml").capabilities
        == policy("vendorDomains: [nvidia.com]", name="plain").grants("ml").capabilities
    )


def test_without_the_mutation_a_pod_that_can_land_in_the_pool_passed_over_is_refused() -> None:
    """The mutating webhook confines a Pod to its tenant's pool; where it did not run (timed
    out, Record mode), a Pod that tolerates both pools could land where its GPU is shared."""
    roaming = pod(container(gpu=1), tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    decision = validate(roaming, preferring(), namespace="ml")
    assert denied(decision) == [("pool-access", "spec.affinity.nodeAffinity")]
    assert 'can land in pool "l4"' in decision.response["response"]["status"]["message"]
    confined = mutate(roaming, preferring(), namespace="ml")
    assert validate(
        apply_jsonpatch(roaming, patch_of(confined)), preferring(), namespace="ml"
    ).allowed
