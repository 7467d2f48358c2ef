"""The mutate path: ``webhook.decide(review, policy, mutate=True)``.

Every patch a test gets is decoded from the response, checked to be add-only, applied with the
``jsonpatch`` library AND with ``kubectl patch --local`` (the API server's Go JSON-Patch code),
the two results compared, the result validated against the Kubernetes 1.32 schema and the
API server's semantic rules, and mutated again, which must plan nothing (idempotence).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

import webhook
from tests.patching import (
    DEFAULT_DOC,
    GENERATION_KEY,
    POOL_KEY,
    POOLS_DOC,
    apply_both,
    apply_jsonpatch,
    assert_add_only,
    decide,
    decode_patch,
    policy_from,
    preferred,
    preferred_terms,
    required_terms,
    validate_pod,
)
from webhook.policy.model import INJECTED_ANNOTATION, POOL_ANNOTATION

DEFAULT = webhook.load_policy(webhook.default_policy_path())
POOLS = policy_from(POOLS_DOC)
DEFAULT_VOID = policy_from(DEFAULT_DOC, deviceVisibility={"injectVoid": True})
POOLS_VOID = policy_from(POOLS_DOC, deviceVisibility={"injectVoid": True})

GPU_TOLERATION = {
    "key": "nvidia.com/gpu",
    "operator": "Equal",
    "value": "present",
    "effect": "NoSchedule",
}
TRAINING_TOLERATIONS = [
    {"key": POOL_KEY, "operator": "Equal", "value": "training", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
]
TRAINING_EXPRESSION = {"key": POOL_KEY, "operator": "In", "values": ["training"]}
HOPPER = {
    "weight": 50,
    "preference": {
        "matchExpressions": [{"key": GENERATION_KEY, "operator": "In", "values": ["hopper"]}]
    },
}
NAME_FIELD = {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
ZONE_EXPRESSION = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}

# --- Helpers ------------------------------------------------------------------------------


def pod(
    resources: dict | None = None,
    *,
    spec: dict | None = None,
    metadata: dict | None = None,
    containers: list | None = None,
) -> dict:
    """A Pod with one container whose limits are ``resources`` ({"nvidia.com/gpu": "1"})."""
    if containers is None:
        limits = {"nvidia.com/gpu": "1"} if resources is None else resources
        container = {"name": "main", "image": "registry.example.com/train:1"}
        if limits:
            container["resources"] = {"limits": limits}
        containers = [container]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml"} | (metadata or {}),
        "spec": {"restartPolicy": "Never", "containers": containers} | (spec or {}),
    }


def container(name: str, gpu: str | None = None, **fields: Any) -> dict:
    out = {"name": name, "image": "registry.example.com/app:1", **fields}
    if gpu:
        out["resources"] = {"limits": {gpu: "1"}}
    return out


def mutate(obj: dict, policy: webhook.Policy, **kwargs: Any) -> tuple[list[dict], dict]:
    """The mutate path's patch for ``obj`` and the patched object, after every check."""
    if obj.get("kind") == "Pod" and _valid_input(obj):
        validate_pod(obj)  # the tests start from Pods the API server would accept
    decision = decide(obj, policy, **kwargs)
    assert decision.allowed, decision.response
    ops = decode_patch(decision)
    if not ops:
        assert not decision.patch_applied
        return [], obj
    assert_add_only(ops)
    assert ops == json.loads(json.dumps(list(decision.patch)))
    assert decision.patch_applied and not decision.patch_recorded
    patched = apply_both(obj, ops)
    validate_pod(patched)
    again = decide(patched, policy, **kwargs)
    assert again.allowed
    assert decode_patch(again) == [], "mutating the mutated Pod must plan nothing"
    return ops, patched


def _valid_input(obj: dict) -> bool:
    # nodeSelectorTerms: [] is something the API server rejects, but the planner repairs.
    return required_terms(obj) != []


def no_patch(obj: dict, policy: webhook.Policy, **kwargs: Any) -> webhook.Decision:
    decision = decide(obj, policy, **kwargs)
    assert decision.allowed
    assert decode_patch(decision) == []
    assert "patchType" not in decision.response["response"]
    assert not decision.patch and not decision.patch_applied and not decision.patch_recorded
    return decision


def injected(patched: dict) -> str:
    return patched["metadata"]["annotations"][INJECTED_ANNOTATION]


def redundant_ops(obj: dict, ops: list[dict]) -> list[dict]:
    """Operations that do not change the document they are applied to."""
    out, doc = [], copy.deepcopy(obj)
    for op in ops:
        after = apply_jsonpatch(doc, [op])
        if after == doc:
            out.append(op)
        doc = after
    return out


def affinity(required: list | None = None, preferred: list | None = None) -> dict:
    node: dict = {}
    if required is not None:
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": required}
    if preferred is not None:
        node["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    return {"nodeAffinity": node}


# --- Default policy: the GPU node taint ---------------------------------------------------


def test_default_policy_adds_the_gpu_toleration_and_the_record():
    ops, patched = mutate(pod(), DEFAULT)
    assert ops == [
        {"op": "add", "path": "/spec/tolerations", "value": [GPU_TOLERATION]},
        {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {INJECTED_ANNOTATION: "tolerations=1"},
        },
    ]
    assert patched["spec"]["tolerations"] == [GPU_TOLERATION]
    assert "affinity" not in patched["spec"]  # the default policy declares no pools


@pytest.mark.parametrize(
    ("tolerations", "path"),
    [
        (None, "/spec/tolerations"),
        ([], "/spec/tolerations/-"),
        (
            [{"key": "example.com/spot", "operator": "Exists", "effect": "NoSchedule"}],
            "/spec/tolerations/-",
        ),
    ],
    ids=["null", "empty", "other"],
)
def test_default_policy_toleration_with_existing_tolerations(tolerations, path):
    ops, patched = mutate(pod(spec={"tolerations": tolerations}), DEFAULT)
    assert ops[0] == {
        "op": "add",
        "path": path,
        "value": [GPU_TOLERATION] if tolerations is None else GPU_TOLERATION,
    }
    assert patched["spec"]["tolerations"] == (tolerations or []) + [GPU_TOLERATION]


@pytest.mark.parametrize(
    "toleration",
    [
        GPU_TOLERATION,
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},  # Equal implied
        {"key": "nvidia.com/gpu", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"operator": "Exists"},
        {"operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"},
    ],
    ids=[
        "exact",
        "operator-omitted",
        "key-exists",
        "key-exists-effect",
        "exists-all",
        "exists-all-effect",
        "no-effect",
    ],
)
def test_default_policy_already_tolerated_means_no_patch(toleration):
    other = {"key": "example.com/spot", "operator": "Exists"}
    no_patch(pod(spec={"tolerations": [other, toleration]}), DEFAULT)


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"},
        {"key": "nvidia.com/gpu", "operator": "Equal", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu.shared", "operator": "Exists"},
        {"operator": "Exists", "effect": "PreferNoSchedule"},
    ],
    ids=["other-effect", "other-value", "no-value", "other-key", "exists-other-effect"],
)
def test_default_policy_a_toleration_that_does_not_match_is_kept_and_ours_appended(toleration):
    ops, patched = mutate(pod(spec={"tolerations": [toleration]}), DEFAULT)
    assert ops[0] == {"op": "add", "path": "/spec/tolerations/-", "value": GPU_TOLERATION}
    assert patched["spec"]["tolerations"] == [toleration, GPU_TOLERATION]


@pytest.mark.parametrize(
    "resource",
    [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-2g.20gb.shared",
    ],
)
def test_default_policy_tolerates_for_every_gpu_family(resource):
    ops, patched = mutate(pod({resource: "1"}), DEFAULT)
    assert patched["spec"]["tolerations"] == [GPU_TOLERATION]


def test_an_undeclared_vendor_resource_chooses_no_gpu_nodes():
    # Only declared GPU resources take part in selection; nvidia.com/hostdev is a NIC.
    no_patch(pod({"nvidia.com/hostdev": "1"}), DEFAULT)


@pytest.mark.parametrize(
    "resources",
    [{}, {"cpu": "1"}, {"nvidia.com/gpu": "0"}, {"example.com/fpga": "1"}],
    ids=["none", "cpu", "zero-gpus", "other-vendor"],
)
def test_no_gpu_means_no_patch(resources):
    no_patch(pod(resources), DEFAULT)
    no_patch(pod(resources), POOLS)


def test_gpu_in_an_init_container_counts():
    containers = [container("app")]
    spec = {"initContainers": [container("warmup", "nvidia.com/gpu")]}
    _, patched = mutate(pod(containers=containers, spec=spec), DEFAULT)
    assert patched["spec"]["tolerations"] == [GPU_TOLERATION]


# --- Annotations: pointer escaping and the record of what was injected --------------------


def test_metadata_without_annotations_gets_the_map():
    ops, patched = mutate(pod(), DEFAULT)
    assert ops[-1] == {
        "op": "add",
        "path": "/metadata/annotations",
        "value": {INJECTED_ANNOTATION: "tolerations=1"},
    }


def test_null_annotations_are_replaced_by_the_map():
    ops, patched = mutate(pod(metadata={"annotations": None}), DEFAULT)
    assert ops[-1]["path"] == "/metadata/annotations"
    assert patched["metadata"]["annotations"] == {INJECTED_ANNOTATION: "tolerations=1"}


def test_annotation_keys_with_slash_and_tilde_are_escaped_and_kept():
    annotations = {
        "example.com/team": "ml",
        "example.com/a~b": "tilde",
        "c~1d": "looks-escaped",
        "e~0f/g": "both",
    }
    ops, patched = mutate(pod(metadata={"annotations": dict(annotations)}), DEFAULT)
    assert ops[-1] == {
        "op": "add",
        "path": "/metadata/annotations/gpu-admission.io~1injected",
        "value": "tolerations=1",
    }
    assert patched["metadata"]["annotations"] == annotations | {
        INJECTED_ANNOTATION: "tolerations=1"
    }


def test_the_record_names_everything_injected_by_a_pool():
    _, patched = mutate(pod(), POOLS)
    assert injected(patched) == "tolerations=2,required-affinity=training,preferred-affinity=1"


def test_the_record_is_only_added_when_something_else_is():
    no_patch(pod(spec={"tolerations": [GPU_TOLERATION]}), DEFAULT)


def test_the_record_counts_preferred_terms_not_operations():
    doc = copy.deepcopy(POOLS_DOC)
    doc["spec"]["pools"][0]["preferredAffinity"].append(preferred("blackwell", weight=10))
    policy = policy_from(doc)
    _, patched = mutate(pod(), policy)
    assert len(preferred_terms(patched)) == 2
    assert "preferred-affinity=2" in injected(patched).split(",")


# --- What the mutate path leaves alone ----------------------------------------------------


def test_mirror_pods_are_not_patched():
    mirror = pod(metadata={"annotations": {"kubernetes.io/config.mirror": "abc123"}})
    no_patch(mirror, DEFAULT)
    no_patch(mirror, POOLS)


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_create_is_patched(operation):
    obj = pod()
    no_patch(obj, DEFAULT, operation=operation, old=obj)
    no_patch(obj, POOLS, operation=operation, old=obj)


def test_a_subresource_is_not_patched():
    no_patch(pod(), DEFAULT, operation="UPDATE", sub_resource="ephemeralcontainers", old=pod())


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_workloads_other_than_pods_are_not_patched(kind):
    template = {"metadata": {"labels": {"app": "train"}}, "spec": pod()["spec"]}
    spec: dict = {"template": template}
    if kind == "Deployment":
        spec["selector"] = {"matchLabels": {"app": "train"}}
        template["spec"]["restartPolicy"] = "Always"
    group = {"Deployment": "apps/v1", "Job": "batch/v1"}[kind]
    obj = {"apiVersion": group, "kind": kind, "metadata": {"name": "train"}, "spec": spec}
    no_patch(obj, DEFAULT, kind=kind)
    no_patch(obj, POOLS, kind=kind)


def test_objects_that_are_not_workloads_are_not_patched():
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c"},
        "data": {"nvidia.com/gpu": "1"},
    }
    no_patch(configmap, DEFAULT, kind="ConfigMap")


def test_mutation_disabled_means_no_patch():
    no_patch(pod(), policy_from(DEFAULT_DOC, mutation={"enabled": False}))


# --- Denials on the mutate path: only what the API server rejects anyway ------------------


@pytest.mark.parametrize("quantity", ["0.5", "500m", 0.5])
def test_fractional_gpu_is_denied_on_the_mutate_path_with_the_quantity_message(quantity):
    obj = pod({"nvidia.com/gpu": quantity})
    decision = decide(obj, DEFAULT)
    response = decision.response["response"]
    assert response["allowed"] is False
    assert "patch" not in response and "patchType" not in response
    assert response["status"]["code"] == 403
    assert [f.rule for f in decision.findings] == ["gpu-quantity"]
    message = response["status"]["message"]
    assert message.startswith("spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value")
    assert "must be a whole number" in message
    # The same words the validate path would give, for the same field.
    validated = decide(obj, DEFAULT, mutate=False).response["response"]["status"]["message"]
    assert message in validated
    # Also with a pool policy (the quantity rule comes before any pool choice).
    assert decide(obj, POOLS).allowed is False


def test_privileged_gpu_pod_is_not_denied_on_the_mutate_path():
    obj = pod()
    obj["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    ops, patched = mutate(obj, DEFAULT)
    assert patched["spec"]["tolerations"] == [GPU_TOLERATION]
    validated = decide(obj, DEFAULT, mutate=False)
    assert not validated.allowed
    assert {f.rule for f in validated.findings} == {"privileged"}


# --- Record mode --------------------------------------------------------------------------


@pytest.mark.parametrize("base", [DEFAULT_DOC, POOLS_DOC], ids=["default", "pools"])
def test_record_mode_returns_the_patch_for_the_audit_log_only(base):
    policy = policy_from(base, mutation={"enabled": True, "mode": "Record"})
    obj = pod()
    decision = decide(obj, policy)
    response = decision.response["response"]
    assert response["allowed"] is True
    assert "patch" not in response and "patchType" not in response
    assert decision.patch_recorded and not decision.patch_applied
    recorded = json.loads(response["auditAnnotations"]["would-patch"])
    assert recorded == json.loads(json.dumps(list(decision.patch)))
    assert_add_only(recorded)
    # What would have been applied is what Apply mode applies.
    applied = decode_patch(decide(obj, policy_from(base)))
    assert recorded == applied
    validate_pod(apply_both(obj, recorded))


def test_record_mode_records_nothing_when_nothing_is_missing():
    policy = policy_from(DEFAULT_DOC, mutation={"enabled": True, "mode": "Record"})
    decision = no_patch(pod(spec={"tolerations": [{"operator": "Exists"}]}), policy)
    assert "auditAnnotations" not in decision.response["response"]


# --- deviceVisibility.injectVoid ----------------------------------------------------------

VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
OTHER_ENV = {"name": "LOG_LEVEL", "value": "debug"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ("absent", [VOID]),
        (None, [VOID]),
        ([], [VOID]),
        ([OTHER_ENV], [OTHER_ENV, VOID]),
        (
            [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}],
            [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}],
        ),
        ([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, OTHER_ENV], [VOID, OTHER_ENV]),
    ],
    ids=["absent", "null", "empty", "other", "already-set", "already-void"],
)
@pytest.mark.parametrize("policy", [DEFAULT_VOID, POOLS_VOID], ids=["default", "pools"])
def test_inject_void_into_a_container_without_a_gpu(policy, env, expected):
    sidecar = container("sidecar")
    if env != "absent":
        sidecar["env"] = copy.deepcopy(env)
    gpu = container("train", "nvidia.com/gpu", env=[OTHER_ENV])
    ops, patched = mutate(pod(containers=[gpu, sidecar]), policy)
    containers = patched["spec"]["containers"]
    assert [c["name"] for c in containers] == ["train", "sidecar"]
    assert containers[0]["env"] == [OTHER_ENV], "a GPU container is never voided"
    assert containers[1]["env"] == expected
    voided = expected != env
    assert ("visible-devices-void=1" in injected(patched).split(",")) == voided


def test_inject_void_into_every_container_without_a_gpu():
    containers = [
        container("a"),
        container("train", "nvidia.com/gpu"),
        container("b", env=[OTHER_ENV]),
        container("c", env=None),
    ]
    spec = {"initContainers": [container("init")]}
    ops, patched = mutate(pod(containers=containers, spec=spec), DEFAULT_VOID)
    names = [c["name"] for c in patched["spec"]["containers"]]
    assert names == ["a", "train", "b", "c"]
    assert patched["spec"]["initContainers"][0]["env"] == [VOID]
    envs = [c.get("env") for c in patched["spec"]["containers"]]
    assert envs == [[VOID], None, [OTHER_ENV, VOID], [VOID]]
    assert "visible-devices-void=4" in injected(patched).split(",")


def test_inject_void_into_init_containers_with_env():
    spec = {"initContainers": [container("init", env=[OTHER_ENV])]}
    ops, patched = mutate(pod(spec=spec), DEFAULT_VOID)
    assert {"op": "add", "path": "/spec/initContainers/0/env/-", "value": VOID} in ops
    assert patched["spec"]["initContainers"][0]["env"] == [OTHER_ENV, VOID]


def test_inject_void_treats_a_zero_gpu_container_as_gpu_less():
    zero = container("zero", env=[])
    zero["resources"] = {"limits": {"nvidia.com/gpu": "0"}}
    _, patched = mutate(pod(containers=[container("train", "nvidia.com/gpu"), zero]), DEFAULT_VOID)
    assert patched["spec"]["containers"][1]["env"] == [VOID]


def test_inject_void_leaves_gpu_containers_and_gpu_less_pods_alone():
    gpus = [container("a", "nvidia.com/gpu", env=[]), container("b", "nvidia.com/gpu", env=[])]
    _, patched = mutate(pod(containers=gpus), DEFAULT_VOID)
    assert [c["env"] for c in patched["spec"]["containers"]] == [[], []]
    assert "visible-devices-void" not in injected(patched)
    no_patch(pod(containers=[container("a", env=[]), container("b", env=[])]), DEFAULT_VOID)


def test_without_inject_void_nothing_is_voided():
    ops, patched = mutate(
        pod(containers=[container("t", "nvidia.com/gpu"), container("s", env=[])]), DEFAULT
    )
    assert patched["spec"]["containers"][1]["env"] == []


# --- Pool policy: tolerations -------------------------------------------------------------


def test_pool_basic_patch():
    ops, patched = mutate(pod(), POOLS)
    assert patched["spec"]["tolerations"] == TRAINING_TOLERATIONS
    assert patched["spec"]["affinity"] == affinity(
        [{"matchExpressions": [TRAINING_EXPRESSION]}], [HOPPER]
    )


@pytest.mark.parametrize(
    "spec",
    [{}, {"affinity": None}, {"affinity": {}}, {"affinity": {"nodeAffinity": None}}],
    ids=["absent", "null", "empty", "node-null"],
)
def test_pool_patch_has_no_redundant_operation(spec):
    obj = pod(spec=spec)
    ops, _ = mutate(obj, POOLS)
    assert redundant_ops(obj, ops) == []


@pytest.mark.parametrize(
    ("tolerations", "added"),
    [
        ([{"key": POOL_KEY, "operator": "Exists"}], [TRAINING_TOLERATIONS[1]]),
        ([{"key": "nvidia.com/gpu", "operator": "Exists"}], [TRAINING_TOLERATIONS[0]]),
        (
            [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}],
            TRAINING_TOLERATIONS,
        ),
        ([TRAINING_TOLERATIONS[0]], [TRAINING_TOLERATIONS[1]]),
        ([{"key": POOL_KEY, "operator": "Equal", "value": "mig"}], TRAINING_TOLERATIONS),
        ([{"operator": "Exists"}], []),
        (TRAINING_TOLERATIONS, []),
    ],
    ids=[
        "pool-key-exists",
        "gpu-key-exists",
        "other-effect",
        "one-exact",
        "other-pool",
        "exists-all",
        "both-exact",
    ],
)
def test_pool_tolerations_only_for_what_is_not_tolerated(tolerations, added):
    ops, patched = mutate(pod(spec={"tolerations": copy.deepcopy(tolerations)}), POOLS)
    assert patched["spec"]["tolerations"] == tolerations + added
    assert any(op["path"].startswith("/spec/tolerations") for op in ops) == bool(added)
    record = injected(patched).split(",")
    assert (f"tolerations={len(added)}" in record) == bool(added)


# --- Pool policy: required node affinity --------------------------------------------------


def test_pool_affinity_with_no_terms_yet_adds_one():
    obj = pod(spec={"affinity": affinity([])})
    ops, patched = mutate(obj, POOLS)
    assert {
        "op": "add",
        "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
        "/nodeSelectorTerms/-",
        "value": {"matchExpressions": [TRAINING_EXPRESSION]},
    } in ops
    assert required_terms(patched) == [{"matchExpressions": [TRAINING_EXPRESSION]}]


@pytest.mark.parametrize(
    "spec",
    [
        {"affinity": None},
        {"affinity": {}},
        {"affinity": {"nodeAffinity": None}},
        {"affinity": {"nodeAffinity": {}}},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": None}}},
        {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
    ],
    ids=[
        "affinity-null",
        "affinity-empty",
        "node-null",
        "node-empty",
        "required-null",
        "pod-anti-affinity",
    ],
)
def test_pool_affinity_created_from_nothing(spec):
    _, patched = mutate(pod(spec=copy.deepcopy(spec)), POOLS)
    node = patched["spec"]["affinity"]["nodeAffinity"]
    assert node == affinity([{"matchExpressions": [TRAINING_EXPRESSION]}], [HOPPER])["nodeAffinity"]
    if "podAntiAffinity" in (spec.get("affinity") or {}):
        assert patched["spec"]["affinity"]["podAntiAffinity"] == spec["affinity"]["podAntiAffinity"]


TERMS_PATH = (
    "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
)


def test_pool_affinity_is_anded_into_a_single_term():
    terms = [{"matchExpressions": [ZONE_EXPRESSION]}]
    ops, patched = mutate(pod(spec={"affinity": affinity(copy.deepcopy(terms))}), POOLS)
    assert {
        "op": "add",
        "path": f"{TERMS_PATH}/0/matchExpressions/-",
        "value": TRAINING_EXPRESSION,
    } in ops
    assert required_terms(patched) == [{"matchExpressions": [ZONE_EXPRESSION, TRAINING_EXPRESSION]}]


def test_pool_affinity_is_anded_into_every_term():
    terms = [
        {"matchExpressions": [ZONE_EXPRESSION]},
        {
            "matchExpressions": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
            ],
            "matchFields": [NAME_FIELD],
        },
    ]
    ops, patched = mutate(pod(spec={"affinity": affinity(copy.deepcopy(terms))}), POOLS)
    paths = [op["path"] for op in ops if op["path"].startswith(TERMS_PATH)]
    assert paths == [f"{TERMS_PATH}/0/matchExpressions/-", f"{TERMS_PATH}/1/matchExpressions/-"]
    after = required_terms(patched)
    assert len(after) == 2
    for before, term in zip(terms, after, strict=True):
        assert term["matchExpressions"] == before["matchExpressions"] + [TRAINING_EXPRESSION]
        assert term.get("matchFields") == before.get("matchFields")


def test_pool_affinity_skips_a_term_that_already_has_it():
    terms = [{"matchExpressions": [TRAINING_EXPRESSION]}, {"matchExpressions": [ZONE_EXPRESSION]}]
    ops, patched = mutate(pod(spec={"affinity": affinity(copy.deepcopy(terms))}), POOLS)
    paths = [op["path"] for op in ops if op["path"].startswith(TERMS_PATH)]
    assert paths == [f"{TERMS_PATH}/1/matchExpressions/-"]
    assert required_terms(patched) == [
        {"matchExpressions": [TRAINING_EXPRESSION]},
        {"matchExpressions": [ZONE_EXPRESSION, TRAINING_EXPRESSION]},
    ]


def test_pool_affinity_into_a_term_with_empty_match_expressions():
    terms = [{"matchExpressions": [], "matchFields": [NAME_FIELD]}]
    _, patched = mutate(pod(spec={"affinity": affinity(copy.deepcopy(terms))}), POOLS)
    assert required_terms(patched) == [
        {"matchExpressions": [TRAINING_EXPRESSION], "matchFields": [NAME_FIELD]}
    ]


@pytest.mark.parametrize(
    "terms",
    [
        [{"matchFields": [NAME_FIELD]}],
        [{"matchFields": [NAME_FIELD], "matchExpressions": None}],
        [{"matchExpressions": [ZONE_EXPRESSION]}, {"matchFields": [NAME_FIELD]}],
    ],
    ids=["match-fields-only", "match-expressions-null", "second-term-match-fields-only"],
)
def test_pool_affinity_into_a_term_without_match_expressions(terms):
    _, patched = mutate(pod(spec={"affinity": affinity(copy.deepcopy(terms))}), POOLS)
    after = required_terms(patched)
    assert len(after) == len(terms)
    for before, term in zip(terms, after, strict=True):
        assert TRAINING_EXPRESSION in term["matchExpressions"]
        assert term.get("matchFields") == before.get("matchFields")


def test_pool_affinity_keeps_a_wider_expression_and_adds_the_exact_one():
    wider = {"key": POOL_KEY, "operator": "In", "values": ["training", "mig"]}
    _, patched = mutate(pod(spec={"affinity": affinity([{"matchExpressions": [wider]}])}), POOLS)
    assert required_terms(patched) == [{"matchExpressions": [wider, TRAINING_EXPRESSION]}]


@pytest.mark.parametrize(
    "node_selector",
    [{POOL_KEY: "training"}, {POOL_KEY: "training", "kubernetes.io/arch": "amd64"}],
)
def test_pool_pinned_by_node_selector_needs_no_required_affinity(node_selector):
    _, patched = mutate(pod(spec={"nodeSelector": dict(node_selector)}), POOLS)
    assert patched["spec"]["nodeSelector"] == node_selector
    assert required_terms(patched) is None
    assert preferred_terms(patched) == [HOPPER]
    assert patched["spec"]["tolerations"] == TRAINING_TOLERATIONS
    assert "required-affinity" not in injected(patched)


def test_pool_without_require_node_affinity():
    doc = copy.deepcopy(POOLS_DOC)
    doc["spec"]["pools"][0]["requireNodeAffinity"] = False
    _, patched = mutate(pod(), policy_from(doc))
    assert required_terms(patched) is None
    assert preferred_terms(patched) == [HOPPER]


def test_pool_with_two_labels_requires_both_in_every_term():
    doc = copy.deepcopy(POOLS_DOC)
    doc["spec"]["pools"][0]["nodeSelector"] = {POOL_KEY: "training", GENERATION_KEY: "hopper"}
    policy = policy_from(doc)
    both = [
        {"key": GENERATION_KEY, "operator": "In", "values": ["hopper"]},
        TRAINING_EXPRESSION,
    ]
    terms = [{"matchExpressions": [ZONE_EXPRESSION]}, {"matchExpressions": [TRAINING_EXPRESSION]}]
    _, patched = mutate(pod(spec={"affinity": affinity(copy.deepcopy(terms))}), policy)
    assert required_terms(patched) == [
        {"matchExpressions": [ZONE_EXPRESSION, *both]},
        {"matchExpressions": [TRAINING_EXPRESSION, both[0]]},
    ]
    # A nodeSelector with only one of the labels does not pin the pool.
    _, patched = mutate(pod(spec={"nodeSelector": {POOL_KEY: "training"}}), policy)
    assert required_terms(patched) == [{"matchExpressions": both}]


# --- Pool policy: preferred node affinity -------------------------------------------------


@pytest.mark.parametrize(
    ("preferred", "expected"),
    [
        (None, [HOPPER]),
        ([], [HOPPER]),
        (
            [{"weight": 5, "preference": {"matchExpressions": [ZONE_EXPRESSION]}}],
            [{"weight": 5, "preference": {"matchExpressions": [ZONE_EXPRESSION]}}, HOPPER],
        ),
        ([HOPPER], [HOPPER]),
        (
            [{"weight": 10, "preference": HOPPER["preference"]}],
            [{"weight": 10, "preference": HOPPER["preference"]}, HOPPER],
        ),
    ],
    ids=["null", "empty", "other", "ours", "ours-other-weight"],
)
def test_pool_preferred_affinity_appended_only_when_absent(preferred, expected):
    obj = pod(
        spec={
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": copy.deepcopy(preferred)
                }
            }
        }
    )
    ops, patched = mutate(obj, POOLS)
    assert preferred_terms(patched) == expected
    added = preferred != [HOPPER]
    assert ("preferred-affinity" in injected(patched)) == added


# --- Pool policy: which pool --------------------------------------------------------------


def test_pool_chosen_by_annotation():
    obj = pod({"nvidia.com/mig-1g.10gb": "1"}, metadata={"annotations": {POOL_ANNOTATION: "mig"}})
    _, patched = mutate(obj, POOLS)
    expression = {"key": POOL_KEY, "operator": "In", "values": ["mig"]}
    assert required_terms(patched) == [{"matchExpressions": [expression]}]
    assert patched["spec"]["tolerations"] == [
        {"key": POOL_KEY, "operator": "Equal", "value": "mig", "effect": "NoSchedule"}
    ]
    assert patched["metadata"]["annotations"][POOL_ANNOTATION] == "mig"


def test_several_pools_get_every_toleration_and_are_confined_to_them():
    # nvidia.com/mig-1g.10gb is MIG in both "mig" and "restricted"; research may use both.
    _, patched = mutate(pod({"nvidia.com/mig-1g.10gb": "1"}), POOLS, namespace="research")
    assert patched["spec"]["tolerations"] == [
        {"key": POOL_KEY, "operator": "Equal", "value": name, "effect": "NoSchedule"}
        for name in ("mig", "restricted")
    ]
    assert required_terms(patched) == [
        {"matchExpressions": [{"key": POOL_KEY, "operator": "In", "values": ["mig", "restricted"]}]}
    ]


def test_a_pool_reserved_for_others_is_excluded_when_several_offer_the_resource():
    # ml may use "mig" but not "restricted", which offers the same profile.
    _, patched = mutate(pod({"nvidia.com/mig-1g.10gb": "1"}), POOLS, namespace="ml")
    assert patched["spec"]["tolerations"] == [
        {"key": POOL_KEY, "operator": "Equal", "value": "mig", "effect": "NoSchedule"}
    ]
    assert required_terms(patched) == [
        {"matchExpressions": [{"key": POOL_KEY, "operator": "In", "values": ["mig"]}]}
    ]
    assert decide(patched, POOLS, mutate=False, namespace="ml").allowed


def test_ambiguous_pool_is_confined_to_its_candidates_and_the_validate_path_denies():
    obj = pod({"nvidia.com/gpu.shared": "1"})  # TimeSlicing in "shared", MPS in "mps"
    _, patched = mutate(obj, POOLS)
    assert required_terms(patched) == [
        {"matchExpressions": [{"key": POOL_KEY, "operator": "In", "values": ["mps", "shared"]}]}
    ]
    validated = decide(obj, POOLS, mutate=False)
    assert not validated.allowed
    assert "ambiguous pool" in validated.response["response"]["status"]["message"]


@pytest.mark.parametrize("pin", ["nodeSelector", "annotation", "affinity"])
def test_ambiguous_pool_pinned_is_patched(pin):
    metadata, spec = {}, {}
    if pin == "nodeSelector":
        spec["nodeSelector"] = {POOL_KEY: "shared"}
    elif pin == "annotation":
        metadata["annotations"] = {POOL_ANNOTATION: "shared"}
    else:
        spec["affinity"] = affinity(
            [{"matchExpressions": [{"key": POOL_KEY, "operator": "In", "values": ["shared"]}]}]
        )
    _, patched = mutate(pod({"nvidia.com/gpu.shared": "1"}, metadata=metadata, spec=spec), POOLS)
    assert patched["spec"]["tolerations"] == [
        {"key": POOL_KEY, "operator": "Equal", "value": "shared", "effect": "NoSchedule"}
    ]
    assert decide(patched, POOLS, mutate=False).allowed


def test_forbidden_pool_is_still_confined_and_the_validate_path_denies():
    # Selection does not depend on modes: were pool-access only warned, the Pod would still
    # need its pool's toleration and affinity.
    obj = pod({"nvidia.com/mig-7g.80gb": "1"})
    _, patched = mutate(obj, POOLS, namespace="ml")
    assert required_terms(patched) == [
        {"matchExpressions": [{"key": POOL_KEY, "operator": "In", "values": ["restricted"]}]}
    ]
    validated = decide(obj, POOLS, mutate=False, namespace="ml")
    assert not validated.allowed
    assert {f.rule for f in validated.findings if f.mode == "Enforce"} == {"pool-access"}
    _, patched = mutate(obj, POOLS, namespace="research")
    assert required_terms(patched) == [
        {"matchExpressions": [{"key": POOL_KEY, "operator": "In", "values": ["restricted"]}]}
    ]


@pytest.mark.parametrize(
    ("metadata", "spec"),
    [
        ({}, {"nodeSelector": {POOL_KEY: "mig"}}),
        ({"annotations": {POOL_ANNOTATION: "mig"}}, {}),
        ({"annotations": {POOL_ANNOTATION: "nope"}}, {}),
    ],
    ids=["selector-excludes", "annotation-wrong-pool", "annotation-unknown-pool"],
)
def test_impossible_pool_is_not_patched_and_the_validate_path_denies(metadata, spec):
    obj = pod(metadata=metadata, spec=spec)
    no_patch(obj, POOLS)
    assert not decide(obj, POOLS, mutate=False).allowed


def test_unknown_gpu_resource_under_a_pool_policy_without_node_taints():
    no_patch(pod({"nvidia.com/gpu.undeclared": "1"}), POOLS)


def test_everything_together_is_idempotent_and_valid():
    obj = pod(
        metadata={"annotations": {"example.com/a~b/c": "x"}},
        spec={
            "tolerations": [{"key": "example.com/spot", "operator": "Exists"}],
            "affinity": affinity(
                [
                    {"matchExpressions": [ZONE_EXPRESSION]},
                    {"matchExpressions": [ZONE_EXPRESSION], "matchFields": [NAME_FIELD]},
                ],
                [{"weight": 1, "preference": {"matchExpressions": [ZONE_EXPRESSION]}}],
            ),
            "initContainers": [container("init", env=[OTHER_ENV])],
        },
    )
    ops, patched = mutate(obj, POOLS_VOID)
    assert injected(patched) == (
        "tolerations=2,required-affinity=training,preferred-affinity=1,visible-devices-void=1"
    )
    assert all(TRAINING_EXPRESSION in t["matchExpressions"] for t in required_terms(patched))
