"""daemonset-tolerations: GPU DaemonSets tolerate their nodes' taints in the template."""

from __future__ import annotations

import pytest

from tests.support.admission import (
    BASE_SPEC,
    KINDS,
    POOL_LABEL,
    assert_allowed_clean,
    audit_records,
    by_mode,
    container,
    pod,
    policy,
    pools_policy,
    template,
    validate,
    warnings,
)

DAEMONSET = next(k for k in KINDS if k.name == "DaemonSet")
OTHER_KINDS = [k for k in KINDS if k is not DAEMONSET]
PATH = "spec.template.spec.tolerations"


def gpu_daemonset(tolerations=None, **kwargs) -> dict:
    return DAEMONSET.wrap(template(container("exporter", gpu=1), tolerations=tolerations, **kwargs))


def test_gpu_daemonset_without_the_toleration_is_warned():
    decision = validate(gpu_daemonset())
    assert decision.allowed
    assert by_mode(decision, "Warn") == [("daemonset-tolerations", PATH)]
    (warning,) = warnings(decision)
    assert warning.startswith(
        f"{PATH}: the DaemonSet requests nvidia.com/gpu but does not tolerate the GPU nodes' "
        "taint nvidia.com/gpu=present:NoSchedule"
    )
    # Past kubectl's 256 characters the message is shortened, never what to write instead.
    assert warning.endswith(
        "add to the template: tolerations: "
        "[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]"
    )
    assert len(warning) <= 256


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "value": "present"},
        {"operator": "Exists"},
    ],
    ids=["exists-effect", "exists", "equal", "default-operator", "tolerate-everything"],
)
def test_gpu_daemonset_with_the_toleration_is_clean(toleration):
    assert_allowed_clean(validate(gpu_daemonset([toleration])))


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
        {"key": "nvidia.com/other", "operator": "Exists"},
    ],
    ids=["wrong-value", "wrong-effect", "wrong-key"],
)
def test_gpu_daemonset_with_a_toleration_that_does_not_match_is_warned(toleration):
    decision = validate(gpu_daemonset([toleration]))
    assert decision.allowed
    assert by_mode(decision, "Warn") == [("daemonset-tolerations", PATH)]


def test_non_gpu_daemonset_is_not_judged():
    assert_allowed_clean(validate(DAEMONSET.wrap(template(container("agent")))))


@pytest.mark.parametrize("kind", OTHER_KINDS, ids=lambda k: k.name)
def test_other_kinds_with_the_same_template_are_not_warned(kind):
    assert_allowed_clean(validate(kind.wrap(template(container("exporter", gpu=1)))))


def test_pool_taints_are_the_ones_to_tolerate():
    decision = validate(gpu_daemonset(), pools_policy())
    assert by_mode(decision, "Warn") == [("daemonset-tolerations", PATH)]
    assert f"tolerations: [{{key: {POOL_LABEL}, operator: Exists" in warnings(decision)[0]

    tolerated = gpu_daemonset([{"key": POOL_LABEL, "operator": "Exists"}])
    assert_allowed_clean(validate(tolerated, pools_policy()))


def test_every_untolerated_taint_is_warned():
    two_taints = policy(
        """
resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
gpuNodeTaints:
  - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
  - {key: dedicated, value: gpu, effect: NoExecute}
"""
    )
    decision = validate(gpu_daemonset(), two_taints)
    assert by_mode(decision, "Warn") == [
        ("daemonset-tolerations", PATH),
        ("daemonset-tolerations", PATH),
    ]
    assert "dedicated=gpu:NoExecute" in warnings(decision)[1]


def test_it_never_denies_even_when_enforced():
    # An advisory finding is at most a warning.
    assert validate(gpu_daemonset()).allowed


def test_audit_mode_records_it():
    audited = policy(BASE_SPEC + "rules: {daemonset-tolerations: {gpuPods: Audit}}")
    decision = validate(gpu_daemonset(), audited)
    assert decision.allowed
    assert "warnings" not in decision.response["response"]
    (record,) = audit_records(decision)
    assert record["rule"] == "daemonset-tolerations"
    assert record["path"] == PATH


def test_a_pod_is_not_a_daemonset():
    assert_allowed_clean(validate(pod(container("exporter", gpu=1))))
