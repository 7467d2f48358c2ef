"""Pools hold under a scheduling model with an independent oracle (hypothesis, derandomized).

The oracle is the tests' own reading of the scheduler (``tests.patching``: toleration
matching and required node affinity, written apart from ``webhook.core.scheduling``), first
checked against a fixed table of Kubernetes' semantics. Then, for generated pool policies and
Pods, with one node built from each pool (its labels, its taints, its resources):

- after the mutation, the Pod fits only nodes of pools its namespace may use that offer every
  declared GPU resource it asks for, and at least one node where such a pool admits it;
- without the mutation, the validate path denies every Pod that fits a node of a pool closed
  to its namespace.
"""

from __future__ import annotations

import copy

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import webhook
from tests.patching import admits_node, tolerates

KEY = "accelerator.example.com/pool"
ZONE = "topology.kubernetes.io/zone"
NAMESPACES = ("team-a", "team-b", "ml")
HARD = ("NoSchedule", "NoExecute")

# --- The oracle, checked against Kubernetes' semantics -------------------------------------

TAINT = {"key": "gpu", "value": "a100", "effect": "NoSchedule"}
TOLERATION_CASES = [
    ({"operator": "Exists"}, TAINT, True),  # empty key with Exists: every taint
    ({"operator": "Exists", "effect": "NoExecute"}, TAINT, False),
    ({"key": "gpu", "operator": "Exists"}, TAINT, True),  # empty effect: every effect
    ({"key": "gpu", "operator": "Equal", "value": "a100"}, TAINT, True),
    ({"key": "gpu", "value": "a100"}, TAINT, True),  # operator defaults to Equal
    ({"key": "gpu", "operator": "Equal", "value": ""}, TAINT, False),
    ({"key": "gpu", "operator": "Equal"}, {**TAINT, "value": ""}, True),  # Equal, empty value
    (
        {"key": "gpu", "value": "a100", "effect": "NoSchedule"},
        {**TAINT, "effect": "NoExecute"},
        False,
    ),
    (
        {"key": "gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
        {**TAINT, "effect": "NoExecute"},
        True,
    ),
    ({"key": "other", "operator": "Exists"}, TAINT, False),
]


def _pod(selector=None, terms=None) -> dict:
    spec: dict = {"containers": [{"name": "c"}]}
    if selector is not None:
        spec["nodeSelector"] = selector
    if terms is not None:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }
    return {"spec": spec}


def _expr(key: str, operator: str, *values: str) -> dict:
    expression = {"key": key, "operator": operator}
    if values:
        expression["values"] = list(values)
    return expression


LABELS = {KEY: "a", ZONE: "west"}
AFFINITY_CASES = [
    (_pod(), True),
    (_pod(selector={KEY: "a"}), True),
    (_pod(selector={KEY: "a", ZONE: "east"}), False),  # nodeSelector keys are ANDed
    (_pod(terms=[{"matchExpressions": [_expr(KEY, "In", "a", "b")]}]), True),
    (_pod(terms=[{"matchExpressions": [_expr(KEY, "NotIn", "a")]}]), False),
    (_pod(terms=[{"matchExpressions": [_expr("missing", "NotIn", "a")]}]), True),
    (_pod(terms=[{"matchExpressions": [_expr(KEY, "Exists")]}]), True),
    (_pod(terms=[{"matchExpressions": [_expr(KEY, "DoesNotExist")]}]), False),
    (
        _pod(
            terms=[
                {"matchExpressions": [_expr(KEY, "In", "b")]},
                {"matchExpressions": [_expr(ZONE, "In", "west")]},
            ]
        ),
        True,
    ),  # terms are ORed
    (_pod(terms=[{"matchExpressions": [_expr(KEY, "In", "a"), _expr(ZONE, "In", "east")]}]), False),
    (_pod(terms=[{}]), False),  # an empty term matches no node
    (_pod(selector={KEY: "a"}, terms=[{"matchExpressions": [_expr(ZONE, "In", "east")]}]), False),
]


@pytest.mark.parametrize(("toleration", "taint", "expected"), TOLERATION_CASES)
def test_the_oracle_tolerates_as_kubernetes_does(toleration, taint, expected):
    assert tolerates(toleration, taint) is expected


@pytest.mark.parametrize(("pod", "expected"), AFFINITY_CASES)
def test_the_oracle_selects_nodes_as_kubernetes_does(pod, expected):
    assert admits_node(pod, LABELS) is expected


def fits(pod: dict, node: dict) -> bool:
    """Whether the scheduler may place the Pod on the node: ``nodeName``, node selection,
    NoSchedule/NoExecute taints, and the extended resources the Pod asks for."""
    spec = pod["spec"]
    if spec.get("nodeName"):
        return spec["nodeName"] == node["name"]
    if not admits_node(pod, node["labels"]):
        return False
    tolerations = spec.get("tolerations") or []
    if any(
        taint["effect"] in HARD and not any(tolerates(t, taint) for t in tolerations)
        for taint in node["taints"]
    ):
        return False
    asked = {
        name
        for container in spec["containers"]
        for name in (container.get("resources") or {}).get("limits") or {}
    }
    return asked <= node["resources"]


def test_fits_needs_every_resource_and_a_tolerated_taint():
    node = {"name": "n", "labels": LABELS, "taints": [TAINT], "resources": {"nvidia.com/gpu"}}
    pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    assert not fits(pod, node)
    pod["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    assert fits(pod, node)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = 1
    assert not fits(pod, node)


# --- Generated pools and Pods -------------------------------------------------------------

OFFERS = [
    [("nvidia.com/gpu", "Exclusive")],
    [("nvidia.com/gpu", "Exclusive"), ("nvidia.com/mig-1g.10gb", "MIG")],
    [("nvidia.com/mig-1g.10gb", "MIG")],
    [("nvidia.com/gpu.shared", "TimeSlicing")],
]
NAMES = sorted({name for offer in OFFERS for name, _ in offer})


@st.composite
def pool_policies(draw) -> tuple[webhook.Policy, list[dict]]:
    count = draw(st.integers(1, 4))
    pools, nodes = [], []
    for index in range(count):
        name = f"p{index}"
        labels = {KEY: name}
        if draw(st.booleans()):
            labels[ZONE] = draw(st.sampled_from(["west", "east"]))
        offer = draw(st.sampled_from(OFFERS))
        taints = []
        if draw(st.integers(0, 3)):
            taints.append({"key": KEY, "value": name, "effect": draw(st.sampled_from(HARD))})
        reserved = draw(st.lists(st.sampled_from(NAMESPACES[:2]), max_size=2, unique=True))
        lines = [
            f"  - name: {name}",
            f"    nodeSelector: {{{', '.join(f'{k}: {v}' for k, v in labels.items())}}}",
            "    resources: [" + ", ".join(f"{{name: {n}, sharing: {m}}}" for n, m in offer) + "]",
        ]
        if taints:
            lines.append(
                "    taints: ["
                + ", ".join(
                    f"{{key: {t['key']}, value: {t['value']}, effect: {t['effect']}}}"
                    for t in taints
                )
                + "]"
            )
        if reserved:
            lines.append(f"    namespaces: [{', '.join(reserved)}]")
        if draw(st.integers(0, 4)) == 0:
            lines.append("    requireNodeAffinity: false")
        pools.append("\n".join(lines))
        nodes.append(
            {
                "name": f"node-{name}",
                "pool": name,
                "labels": labels,
                "taints": taints,
                "resources": {n for n, _ in offer},
            }
        )
    text = (
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: generated}\nspec:\n  pools:\n" + "\n".join(pools) + "\n"
    )
    return webhook.parse_policy(text, source="<generated>"), nodes


@st.composite
def pods(draw) -> tuple[dict, str]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True))
    spec: dict = {
        "containers": [
            {
                "name": "c",
                "image": "example.com/app:1",
                "resources": {"limits": {n: 1 for n in names}},
            }
        ]
    }
    if draw(st.integers(0, 3)) == 0:
        spec["nodeSelector"] = {KEY: f"p{draw(st.integers(0, 3))}"}
    choice = draw(st.integers(0, 4))
    if choice == 0:
        spec["tolerations"] = [{"operator": "Exists"}]
    elif choice == 1:
        spec["tolerations"] = [{"key": KEY, "operator": "Exists"}]
    if draw(st.integers(0, 4)) == 0:
        values = sorted(draw(st.sets(st.sampled_from(["p0", "p1", "p2", "p3"]), min_size=1)))
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": KEY, "operator": "In", "values": values}]}
                    ]
                }
            }
        }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}
    return pod, draw(st.sampled_from(NAMESPACES))


def review(pod: dict, namespace: str) -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": namespace,
            "object": pod,
        },
    }


def pool_of(policy: webhook.Policy, name: str):
    return next(p for p in policy.pools if p.name == name)


SETTINGS = settings(
    derandomize=True,
    database=None,
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@SETTINGS
@given(generated=pool_policies(), pod_and_namespace=pods())
def test_a_mutated_pod_fits_only_nodes_of_pools_its_namespace_may_use(generated, pod_and_namespace):
    policy, nodes = generated
    pod, namespace = pod_and_namespace
    decision = webhook.decide(review(pod, namespace), policy, mutate=True)
    if not decision.allowed:
        return
    patched = jsonpatch.apply_patch(copy.deepcopy(pod), list(decision.patch))
    if not webhook.decide(review(patched, namespace), policy, mutate=False).allowed:
        return  # denied: it lands nowhere
    asked = set(pod["spec"]["containers"][0]["resources"]["limits"])
    for node in nodes:
        if fits(patched, node):
            pool = pool_of(policy, node["pool"])
            assert policy.may_use(pool, namespace), (node["pool"], namespace)
            assert asked <= node["resources"]
    usable = [
        node
        for node in nodes
        if policy.may_use(pool_of(policy, node["pool"]), namespace)
        and asked <= node["resources"]
        and admits_node(pod, node["labels"])
    ]
    if usable:
        assert any(fits(patched, node) for node in nodes), "admitted, yet it fits no node"


@SETTINGS
@given(generated=pool_policies(), pod_and_namespace=pods())
def test_without_the_mutation_a_pod_that_fits_a_closed_pool_is_denied(generated, pod_and_namespace):
    policy, nodes = generated
    pod, namespace = pod_and_namespace
    closed = [
        node
        for node in nodes
        if not policy.may_use(pool_of(policy, node["pool"]), namespace) and fits(pod, node)
    ]
    if closed:
        assert not webhook.decide(review(pod, namespace), policy, mutate=False).allowed
