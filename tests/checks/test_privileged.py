"""privileged: no privileged containers (of any type, in any workload kind)."""

from __future__ import annotations

import pytest

from tests.support.admission import (
    BASE_SPEC,
    CONTAINER_LISTS,
    KIND_IDS,
    KINDS,
    assert_allowed_clean,
    audit_records,
    by_mode,
    container,
    denied,
    place,
    pod,
    policy,
    status_message,
    validate,
)

ENFORCE_EVERYWHERE = policy(BASE_SPEC + "rules: {privileged: {otherPods: Enforce}}")


@pytest.mark.parametrize("flag", [False, None])
def test_unprivileged_gpu_pod_is_allowed(flag):
    assert_allowed_clean(validate(pod(container(gpu=1, privileged=flag))))


def test_privileged_gpu_pod_is_denied():
    decision = validate(pod(container("train", gpu=1, privileged=True)))
    path = "spec.containers[0].securityContext.privileged"
    assert not decision.allowed
    assert denied(decision) == [("privileged", path)]
    assert status_message(decision).startswith(
        f'{path}: Invalid value: true: container "train" must not be privileged'
    )
    status = decision.response["response"]["status"]
    assert status["code"] == 403
    assert status["reason"] == "Forbidden"
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": status["details"]["causes"][0]["message"],
            "field": path,
        }
    ]


def test_only_a_literal_true_is_privileged():
    # The API server only stores booleans; anything else is not ``privileged: true``.
    tricky = container(gpu=1, securityContext={"privileged": "true"})
    assert "privileged" not in {f.rule for f in validate(pod(tricky)).findings}


def test_privileged_non_gpu_container_in_a_gpu_pod_is_denied():
    decision = validate(pod(container("gpu", gpu=1), container("helper", privileged=True)))
    assert denied(decision) == [("privileged", "spec.containers[1].securityContext.privileged")]


def test_privileged_non_gpu_pod_is_only_audited_by_default():
    decision = validate(pod(container("cni", privileged=True)))
    assert decision.allowed
    assert by_mode(decision, "Audit") == [
        ("privileged", "spec.containers[0].securityContext.privileged")
    ]
    (record,) = audit_records(decision)
    assert record["rule"] == "privileged"
    assert record["mode"] == "Audit"
    assert record["path"] == "spec.containers[0].securityContext.privileged"
    assert record["value"] is True
    assert "warnings" not in decision.response["response"]


def test_privileged_non_gpu_pod_is_denied_when_other_pods_enforce():
    decision = validate(pod(container("cni", privileged=True)), ENFORCE_EVERYWHERE)
    assert denied(decision) == [("privileged", "spec.containers[0].securityContext.privileged")]


def test_every_privileged_container_is_reported():
    decision = validate(
        pod(
            container("a", gpu=1, privileged=True),
            container("b", privileged=True),
            init=[container("setup", privileged=True)],
            ephemeral=[container("debug", privileged=True)],
        )
    )
    assert denied(decision) == [
        ("privileged", "spec.initContainers[0].securityContext.privileged"),
        ("privileged", "spec.containers[0].securityContext.privileged"),
        ("privileged", "spec.containers[1].securityContext.privileged"),
        ("privileged", "spec.ephemeralContainers[0].securityContext.privileged"),
    ]


@pytest.mark.parametrize("where", CONTAINER_LISTS)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_every_kind_and_container_list_in_gpu_scope(kind, where):
    good = validate(kind.wrap(place(container("x", gpu=1, privileged=False), where)))
    assert good.allowed
    assert "privileged" not in {f.rule for f in good.findings}

    decision = validate(kind.wrap(place(container("x", gpu=1, privileged=True), where)))
    path = f"{kind.prefix}spec.{where}[0].securityContext.privileged"
    assert not decision.allowed
    assert denied(decision) == [("privileged", path)]
    assert status_message(decision).startswith(f'{path}: Invalid value: true: container "x"')


@pytest.mark.parametrize("where", CONTAINER_LISTS)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_every_kind_and_container_list_in_other_scope(kind, where):
    obj = kind.wrap(place(container("x", privileged=True), where))
    path = f"{kind.prefix}spec.{where}[0].securityContext.privileged"

    audited = validate(obj)
    assert audited.allowed
    assert by_mode(audited, "Audit") == [("privileged", path)]
    assert [r["path"] for r in audit_records(audited)] == [path]

    enforced = validate(obj, ENFORCE_EVERYWHERE)
    assert denied(enforced) == [("privileged", path)]


def test_exempt_namespace_of_the_default_policy_allows_it():
    assert_allowed_clean(
        validate(pod(container("plugin", gpu=1, privileged=True)), namespace="gpu-operator")
    )
