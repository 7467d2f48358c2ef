"""pool-access: the Pod's GPU pool is unambiguous and open to its namespace."""

from __future__ import annotations

from functools import cache

import pytest

from tests.support.admission import (
    KIND_IDS,
    KINDS,
    POOL_LABEL,
    WORKLOADS_SPEC,
    assert_allowed_clean,
    container,
    denied,
    pod,
    policy,
    pools_policy,
    status_message,
    template,
    validate,
)

POOL_ANNOTATION = "gpu-admission.io/pool"
GPU_LIMIT = "spec.containers[0].resources.limits[nvidia.com/gpu]"
SHARED = "nvidia.com/gpu.shared"


@cache
def ambiguous_policy():
    """nvidia.com/gpu means a full card in pool a and a time-sliced replica in pool b."""
    return policy(
        f"""
pools:
  - name: a
    nodeSelector: {{{POOL_LABEL}: a}}
    resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
  - name: b
    nodeSelector: {{{POOL_LABEL}: b}}
    resources: [{{name: nvidia.com/gpu, sharing: TimeSlicing}}]
"""
        + WORKLOADS_SPEC,
        name="ambiguous",
    )


# --- Ambiguous pools ----------------------------------------------------------------------


def test_ambiguous_sharing_mode_is_denied():
    decision = validate(pod(container(gpu=1)), ambiguous_policy())
    assert denied(decision) == [("pool-access", GPU_LIMIT)]
    assert status_message(decision) == (
        f'{GPU_LIMIT}: Invalid value: "nvidia.com/gpu": ambiguous pool: nvidia.com/gpu is '
        "Exclusive in pool a, TimeSlicing in pool b, and the Pod does not say which; set the "
        f'annotation {POOL_ANNOTATION}: "<pool>" or a nodeSelector on the pool\'s labels'
    )


@pytest.mark.parametrize(
    "pin",
    [
        {"node_selector": {POOL_LABEL: "a"}},
        {"node_selector": {POOL_LABEL: "b"}},
        {"annotations": {POOL_ANNOTATION: "a"}},
        {"annotations": {POOL_ANNOTATION: "b"}},
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": POOL_LABEL, "operator": "In", "values": ["b"]}
                                ]
                            }
                        ]
                    }
                }
            }
        },
    ],
    ids=["nodeSelector-a", "nodeSelector-b", "annotation-a", "annotation-b", "affinity-b"],
)
def test_pinned_pod_is_allowed(pin):
    assert_allowed_clean(validate(pod(container(gpu=1), **pin), ambiguous_policy()))


def test_unrelated_node_selector_does_not_pin():
    obj = pod(container(gpu=1), node_selector={"kubernetes.io/arch": "amd64"})
    assert denied(validate(obj, ambiguous_policy())) == [("pool-access", GPU_LIMIT)]


def test_same_mode_in_every_pool_is_not_ambiguous():
    same = policy(
        f"""
pools:
  - name: a
    nodeSelector: {{{POOL_LABEL}: a}}
    resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
  - name: b
    nodeSelector: {{{POOL_LABEL}: b}}
    resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
"""
    )
    assert_allowed_clean(validate(pod(container(gpu=1)), same))


# --- Namespaces ---------------------------------------------------------------------------


@pytest.mark.parametrize("namespace", ["ml", "default", "teams", "team"])
def test_namespace_outside_the_pool_namespaces_is_denied(namespace):
    decision = validate(pod(container(gpu=1, resource=SHARED)), pools_policy(), namespace=namespace)
    path = f"spec.containers[0].resources.limits[{SHARED}]"
    assert denied(decision) == [("pool-access", path)]
    assert status_message(decision).startswith(
        f'{path}: Invalid value: "{SHARED}": namespace "{namespace}" may not use the pool(s) '
        f"that offer {SHARED} (t4-shared)"
    )


@pytest.mark.parametrize("namespace", ["team-a", "team-research"])
def test_namespace_inside_the_pool_namespaces_is_allowed(namespace):
    obj = pod(container(gpu=1, resource=SHARED))
    assert_allowed_clean(validate(obj, pools_policy(), namespace=namespace))


def test_pool_annotation_for_a_closed_pool_is_forbidden():
    obj = pod(container(gpu=1, resource=SHARED), annotations={POOL_ANNOTATION: "t4-shared"})
    decision = validate(obj, pools_policy(), namespace="ml")
    path = f"metadata.annotations[{POOL_ANNOTATION}]"
    assert denied(decision) == [("pool-access", path)]
    assert status_message(decision) == (
        f'{path}: Forbidden: namespace "ml" may not use pool "t4-shared"; choose a pool the '
        "namespace may use, or ask the platform team for access"
    )


def test_pools_without_namespaces_are_open_to_all():
    assert_allowed_clean(validate(pod(container(gpu=1)), pools_policy(), namespace="anything"))


# --- The pool annotation ------------------------------------------------------------------


def test_pool_annotation_naming_no_pool_is_denied():
    obj = pod(container(gpu=1), annotations={POOL_ANNOTATION: "h100"})
    decision = validate(obj, pools_policy())
    path = f"metadata.annotations[{POOL_ANNOTATION}]"
    assert denied(decision) == [("pool-access", path)]
    assert status_message(decision) == (
        f'{path}: Unsupported value: "h100": no GPU pool is named "h100"; '
        "use one of: a100, t4-shared"
    )
    cause = decision.response["response"]["status"]["details"]["causes"][0]
    assert cause["reason"] == "FieldValueNotSupported"
    assert cause["field"] == path


def test_pool_annotation_naming_no_pool_is_denied_for_unpooled_resources():
    mixed = policy(
        f"""
resources:
  - {{name: {SHARED}, sharing: TimeSlicing}}
pools:
  - name: a100
    nodeSelector: {{{POOL_LABEL}: a100}}
    resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
"""
    )
    obj = pod(container(gpu=1, resource=SHARED), annotations={POOL_ANNOTATION: "h100"})
    decision = validate(obj, mixed)
    assert denied(decision) == [("pool-access", f"metadata.annotations[{POOL_ANNOTATION}]")]


def test_pools_do_not_judge_a_pod_without_gpus():
    obj = pod(container(), annotations={POOL_ANNOTATION: "a100"})
    assert_allowed_clean(validate(obj, pools_policy()))


def test_no_pool_rules_under_the_default_policy():
    obj = pod(container(gpu=1), annotations={POOL_ANNOTATION: "anything"})
    assert_allowed_clean(validate(obj))


# --- Every kind ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_every_kind(kind):
    pinned = kind.wrap(template(container(gpu=1), node_selector={POOL_LABEL: "a"}))
    assert "pool-access" not in {f.rule for f in validate(pinned, ambiguous_policy()).findings}

    decision = validate(kind.wrap(template(container(gpu=1))), ambiguous_policy())
    assert denied(decision) == [("pool-access", f"{kind.prefix}{GPU_LIMIT}")]


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_closed_pool_in_every_kind(kind):
    obj = kind.wrap(template(container(gpu=1, resource=SHARED)))
    decision = validate(obj, pools_policy(), namespace="ml")
    path = f"{kind.prefix}spec.containers[0].resources.limits[{SHARED}]"
    assert denied(decision) == [("pool-access", path)]
