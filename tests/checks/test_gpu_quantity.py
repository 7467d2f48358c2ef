"""gpu-quantity: GPU quantities are whole, non-negative numbers set in limits."""

from __future__ import annotations

import pytest

from tests.support.admission import (
    CONTAINER_LISTS,
    KIND_IDS,
    KINDS,
    assert_allowed_clean,
    container,
    denied,
    mutate,
    place,
    pod,
    status_message,
    validate,
)

LIMIT = "spec.containers[0].resources.limits[nvidia.com/gpu]"
REQUEST = "spec.containers[0].resources.requests[nvidia.com/gpu]"


@pytest.mark.parametrize("value", [1, 2, "1", "1000m", "2e0", 2.0, "+1", 0, "0"])
def test_whole_numbers_are_allowed(value):
    assert_allowed_clean(validate(pod(container(gpu=value))))


@pytest.mark.parametrize(
    ("value", "shown", "fragment"),
    [
        (0.5, "0.5", "must be a whole number: nvidia.com/gpu counts whole devices; request 1;"),
        ("500m", '"500m"', "must be a whole number"),
        (1.5, "1.5", "request 1 or 2"),
        ("1100m", '"1100m"', "request 1 or 2"),
        pytest.param(-1, "-1", "must be greater than or equal to 0"),
        pytest.param("-2", '"-2"', "must be greater than or equal to 0"),
        ("NaN", '"NaN"', "must be a Kubernetes quantity"),
        ("Infinity", '"Infinity"', "must be a Kubernetes quantity"),
        ("1 Gi", '"1 Gi"', "must be a Kubernetes quantity"),
        ("0x10", '"0x10"', "must be a Kubernetes quantity"),
        (True, "true", "must be a Kubernetes quantity"),
        ([1], "[1]", "must be a Kubernetes quantity"),
        ({"n": 1}, '{"n": 1}', "must be a Kubernetes quantity"),
    ],
    ids=repr,
)
def test_bad_quantities_are_denied_without_raising(value, shown, fragment):
    decision = validate(pod(container(gpu=value)))
    assert not decision.allowed
    assert denied(decision) == [("gpu-quantity", LIMIT)]
    assert status_message(decision).startswith(f"{LIMIT}: Invalid value: {shown}: ")
    assert fragment in status_message(decision)


def test_string_values_are_quoted_and_numbers_bare():
    quoted = status_message(validate(pod(container(gpu="0.5"))))
    bare = status_message(validate(pod(container(gpu=0.5))))
    assert quoted.startswith(f'{LIMIT}: Invalid value: "0.5": must be a whole number')
    assert bare.startswith(f"{LIMIT}: Invalid value: 0.5: must be a whole number")


def test_fraction_below_one_suggests_shared_or_mig():
    message = status_message(validate(pod(container(gpu="0.5"))))
    assert "nvidia.com/gpu.shared" in message
    assert "nvidia.com/mig-1g.10gb" in message


def test_negative_quantity_beside_a_real_gpu_is_denied():
    decision = validate(pod(container("a", gpu=1), container("b", gpu=-1)))
    assert denied(decision) == [
        ("gpu-quantity", "spec.containers[1].resources.limits[nvidia.com/gpu]")
    ]
    assert "Invalid value: -1: must be greater than or equal to 0" in status_message(decision)


def test_requests_without_limits_are_denied():
    decision = validate(pod(container(requests={"nvidia.com/gpu": 1})))
    assert denied(decision) == [("gpu-quantity", LIMIT)]
    assert status_message(decision) == (
        f"{LIMIT}: Required value: nvidia.com/gpu must be set in limits: the API server and "
        "the device plugin count GPUs from limits; add resources.limits[nvidia.com/gpu]: 1"
    )
    cause = decision.response["response"]["status"]["details"]["causes"][0]
    assert cause == {
        "reason": "FieldValueRequired",
        "message": cause["message"],
        "field": LIMIT,
    }
    assert cause["message"].startswith("Required value: nvidia.com/gpu must be set in limits")


def test_requests_different_from_limits_are_denied():
    decision = validate(pod(container(gpu=2, requests={"nvidia.com/gpu": 1})))
    assert denied(decision) == [("gpu-quantity", REQUEST)]
    assert status_message(decision).startswith(
        f"{REQUEST}: Invalid value: 1: must equal the limit (2): GPUs cannot be overcommitted"
    )


@pytest.mark.parametrize(("request_", "limit"), [(1, 1), ("1", 1), ("1000m", "1"), (2, "2e0")])
def test_requests_equal_to_limits_are_allowed(request_, limit):
    assert_allowed_clean(validate(pod(container(gpu=limit, requests={"nvidia.com/gpu": request_}))))


def test_a_bad_request_beside_a_good_limit_is_denied_at_the_request():
    decision = validate(pod(container(gpu=1, requests={"nvidia.com/gpu": "abc"})))
    assert denied(decision) == [("gpu-quantity", REQUEST)]
    assert status_message(decision).startswith(
        f'{REQUEST}: Invalid value: "abc": must be a Kubernetes quantity'
    )


def test_other_vendor_resources_are_judged_too():
    decision = validate(pod(container(gpu="500m", resource="nvidia.com/mig-1g.10gb")))
    assert denied(decision) == [
        ("gpu-quantity", "spec.containers[0].resources.limits[nvidia.com/mig-1g.10gb]")
    ]


def test_non_vendor_fractions_are_not_judged():
    assert_allowed_clean(
        validate(pod(container(limits={"cpu": "500m", "example.com/fpga": "0.5"})))
    )


@pytest.mark.parametrize("where", CONTAINER_LISTS)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_every_kind_and_container_list(kind, where):
    good = validate(kind.wrap(place(container("gpu", gpu=1), where)))
    assert good.allowed
    assert "gpu-quantity" not in {f.rule for f in good.findings}

    decision = validate(kind.wrap(place(container("gpu", gpu="0.5"), where)))
    assert not decision.allowed
    path = f"{kind.prefix}spec.{where}[0].resources.limits[nvidia.com/gpu]"
    assert denied(decision) == [("gpu-quantity", path)]
    assert status_message(decision).startswith(f'{path}: Invalid value: "0.5": ')


# --- The mutate path denies exactly these, so the user sees the policy's message ----------


def test_mutate_path_denies_fractions_with_the_same_message():
    obj = pod(container(gpu="0.5"))
    assert status_message(mutate(obj)) == status_message(validate(obj))
    assert denied(mutate(obj)) == [("gpu-quantity", LIMIT)]


def test_mutate_path_denies_negative_quantities():
    assert denied(mutate(pod(container(gpu=-1)))) == [("gpu-quantity", LIMIT)]


def test_mutate_path_leaves_other_rules_to_the_validate_path():
    decision = mutate(pod(container(gpu=1, privileged=True)))
    assert decision.allowed
    assert denied(decision) == []
