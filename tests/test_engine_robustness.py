"""The engine never raises on a malformed object inside a well-formed AdmissionReview.

The API server validates built-in objects before validating webhooks see them, but custom
resources, the mutate path (before validation) and the CLI see anything. A malformed envelope
raises ``RequestError`` (HTTP 400); a malformed object is judged, never a crash (HTTP 500).
"""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import webhook
from tests.support.paths import REPO

POLICIES = [
    webhook.load_policy(REPO / "policies" / "default.yaml"),
    webhook.load_policy(REPO / "policies" / "examples" / "strict.yaml"),
    webhook.load_policy(REPO / "policies" / "examples" / "labelled-pools.yaml"),
]

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "annotations": {"a": "b", "gpu-admission.io/pool": "training"}},
    "spec": {
        "nodeSelector": {"accelerator.example.com/pool": "training"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "accelerator.example.com/pool",
                                    "operator": "In",
                                    "values": ["training"],
                                }
                            ]
                        }
                    ]
                },
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": []}}
                ],
            }
        },
        "initContainers": [
            {
                "name": "side",
                "image": "i",
                "restartPolicy": "Always",
                "resources": {"limits": {"nvidia.com/gpu": 1}},
            }
        ],
        "containers": [
            {
                "name": "c",
                "image": "i",
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                "envFrom": [{"configMapRef": {"name": "x"}}],
                "securityContext": {"privileged": True},
                "resources": {
                    "limits": {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": 1},
                    "requests": {"nvidia.com/gpu": "2"},
                },
            },
            {"name": "d", "image": "i"},
        ],
        "volumes": [{"name": "v", "hostPath": {"path": "/dev/nvidia0"}}],
    },
}

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)


def field_paths(node: object, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON value, the value itself first (``()``)."""
    paths = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            paths += field_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            paths += field_paths(value, (*prefix, index))
    return paths


PATHS = field_paths(POD)[1:]


def _replace(obj: dict, path: tuple, value: object) -> dict:
    obj = copy.deepcopy(obj)
    node = obj
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return obj


def _review(obj: object, operation: str = "CREATE", old: object = None) -> dict:
    request = {
        "uid": "u",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": operation,
        "namespace": "ml-train",
        "object": obj,
    }
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def _decide_everywhere(obj: object, old: object = None) -> None:
    for policy in POLICIES:
        for mutate in (False, True):
            for operation in ("CREATE", "UPDATE"):
                response = webhook.review(
                    _review(obj, operation, old if operation == "UPDATE" else None),
                    policy,
                    mutate=mutate,
                )
                json.dumps(response)  # the response is always serialisable
                assert response["response"]["uid"] == "u"


def test_the_seed_pod_is_judged() -> None:
    _decide_everywhere(POD, POD)


@settings(
    derandomize=True,
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(path=st.sampled_from(PATHS), value=JSON_VALUES, data=st.data())
def test_any_field_replaced_by_any_json_value_is_judged(path, value, data) -> None:
    mutated = _replace(POD, path, value)
    second = data.draw(st.sampled_from(PATHS))
    try:
        mutated = _replace(mutated, second, data.draw(JSON_VALUES))
    except (KeyError, IndexError, TypeError):
        pass  # the first replacement removed the second path
    _decide_everywhere(mutated, POD)


@pytest.mark.parametrize(
    "kind",
    [{"group": "", "version": "v1", "kind": ["Pod"]}, "Pod", {"group": 1, "kind": "Pod"}],
)
def test_a_malformed_request_kind_is_a_request_error(kind) -> None:
    review = _review(POD)
    review["request"]["kind"] = kind
    with pytest.raises(webhook.RequestError):
        webhook.review(review, POLICIES[0], mutate=False)


@pytest.mark.parametrize("operation", [None, "EXPLODE", "create", 5, ["CREATE"], ""])
@pytest.mark.parametrize("mutate", [False, True], ids=["validate", "mutate"])
def test_an_operation_the_api_server_never_sends_is_a_request_error(operation, mutate) -> None:
    # Allowing it for want of a verdict would let a forged review pass a privileged Pod.
    privileged = copy.deepcopy(POD)
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    review = _review(privileged)
    if operation is None:
        del review["request"]["operation"]
    else:
        review["request"]["operation"] = operation
    with pytest.raises(webhook.RequestError, match="request.operation must be one of"):
        webhook.review(review, POLICIES[0], mutate=mutate)


def test_an_object_kind_that_is_not_a_string_is_not_judged() -> None:
    review = _review({**POD, "kind": {"a": 1}})
    del review["request"]["kind"]
    assert webhook.review(review, POLICIES[0], mutate=False)["response"]["allowed"]
