"""Rule modes (Enforce, Warn, Audit, Off), scopes (GPU Pods and the rest), namespace overrides,
exemptions, and how findings are reported in the AdmissionReview response."""

from __future__ import annotations

import json

import pytest

import webhook
from tests.support.admission import (
    BASE_SPEC,
    KINDS,
    POOL_LABEL,
    admission,
    assert_allowed_clean,
    audit_records,
    by_mode,
    container,
    default_policy,
    denied,
    host_path,
    mutate,
    pod,
    policy,
    pools_policy,
    rules_in,
    status_message,
    template,
    validate,
    warnings,
)

PRIVILEGED = "spec.containers[0].securityContext.privileged"
DAEMONSET = next(k for k in KINDS if k.name == "DaemonSet")


def privileged_gpu_pod(**kwargs) -> dict:
    return pod(container("train", gpu=1, privileged=True), **kwargs)


def check_audit_annotations(decision: webhook.Decision) -> dict:
    annotations = decision.response["response"]["auditAnnotations"]
    for key, value in annotations.items():
        assert "/" not in key, key
        assert 0 < len(key) <= 63, key
        assert isinstance(value, str)
    return annotations


# --- Modes --------------------------------------------------------------------------------


def test_enforce_denies():
    decision = validate(privileged_gpu_pod())
    assert decision.allowed is False
    assert denied(decision) == [("privileged", PRIVILEGED)]


def test_warn_allows_with_warnings():
    warn = policy(BASE_SPEC + "rules: {privileged: {gpuPods: Warn}}")
    decision = validate(privileged_gpu_pod(), warn)
    response = decision.response["response"]
    assert response["allowed"] is True
    assert "status" not in response
    assert "auditAnnotations" not in response
    (warning,) = response["warnings"]
    assert warning.startswith(f'{PRIVILEGED}: container "train" must not be privileged')
    assert not warning.lower().startswith("warning")
    assert len(warning) <= 256


def test_warnings_are_capped_in_number_and_length():
    warn = policy(BASE_SPEC + "rules: {privileged: {gpuPods: Warn}}")
    many = pod(*[container(f"c{i}", gpu=1 if i == 0 else None, privileged=True) for i in range(20)])
    decision = validate(many, warn)
    assert decision.allowed
    listed = warnings(decision)
    assert len(listed) == 16
    assert all(len(w) <= 256 for w in listed)
    assert sum(len(w) for w in listed) <= 4096
    assert listed[-1] == "and 5 more GPU policy warning(s)"
    assert not any(w.startswith("Warning") for w in listed)
    # The findings themselves are all there, for logs and metrics.
    assert len(by_mode(decision, "Warn")) == 20


def test_audit_allows_with_audit_annotations():
    audit = policy(BASE_SPEC + "rules: {default: {gpuPods: Audit}}")
    obj = privileged_gpu_pod(volumes=[host_path("/dev")])
    decision = validate(obj, audit)
    response = decision.response["response"]
    assert response["allowed"] is True
    assert "warnings" not in response
    assert "status" not in response
    annotations = check_audit_annotations(decision)
    assert set(annotations) == {"violations", "rules"}
    assert annotations["rules"] == "host-devices,privileged"
    records = json.loads(annotations["violations"])
    assert [(r["rule"], r["mode"], r["path"]) for r in records] == [
        ("privileged", "Audit", PRIVILEGED),
        ("host-devices", "Audit", "spec.volumes[0].hostPath.path"),
    ]
    assert records[0]["value"] is True
    assert records[1]["value"] == "/dev"
    assert all(r["message"] and r["hint"] for r in records)


@pytest.mark.parametrize(
    "rules",
    ['{privileged: {gpuPods: "Off"}}', "{privileged: {enabled: false}}"],
    ids=["gpuPods-Off", "enabled-false"],
)
def test_off_says_nothing(rules):
    off = policy(BASE_SPEC + f"rules: {rules}")
    assert_allowed_clean(validate(privileged_gpu_pod(), off))


def test_enabled_false_turns_the_rule_off_for_other_pods_too():
    off = policy(BASE_SPEC + "rules: {privileged: {enabled: false}}")
    assert_allowed_clean(validate(pod(container("cni", privileged=True)), off))


def test_modes_combine_in_one_response():
    mixed = policy(
        BASE_SPEC
        + """
rules:
  privileged: {gpuPods: Enforce}
  host-devices: {gpuPods: Warn}
  device-visibility: {gpuPods: Audit}
"""
    )
    obj = pod(
        container("train", gpu=1, privileged=True),
        container("side", env={"NVIDIA_VISIBLE_DEVICES": "all"}),
        volumes=[host_path("/dev/nvidia0")],
    )
    decision = validate(obj, mixed)
    response = decision.response["response"]
    assert response["allowed"] is False
    assert denied(decision) == [("privileged", PRIVILEGED)]
    assert [w.split(":")[0] for w in response["warnings"]] == ["spec.volumes[0].hostPath.path"]
    assert [r["rule"] for r in audit_records(decision)] == ["device-visibility"]
    check_audit_annotations(decision)


def test_audit_annotation_keys_of_a_recorded_patch():
    record = policy(BASE_SPEC + "mutation: {mode: Record}")
    decision = mutate(pod(container(gpu=1)), record)
    assert decision.allowed
    annotations = check_audit_annotations(decision)
    assert set(annotations) == {"would-patch"}
    assert json.loads(annotations["would-patch"])
    assert "patch" not in decision.response["response"]


# --- Every violation is listed ------------------------------------------------------------


def test_five_problems_give_five_causes_and_an_aggregate_message():
    obj = pod(
        container("train", gpu="0.5", privileged=True),
        container("side", env={"NVIDIA_VISIBLE_DEVICES": "all"}),
        volumes=[host_path("/dev")],
        annotations={"cdi.k8s.io/x": "nvidia.com/gpu=all"},
    )
    decision = validate(obj)
    expected = [
        ("gpu-quantity", "spec.containers[0].resources.limits[nvidia.com/gpu]"),
        ("privileged", PRIVILEGED),
        ("host-devices", "spec.volumes[0].hostPath.path"),
        ("device-visibility", "spec.containers[1].env[0].value"),
        ("device-visibility", "metadata.annotations[cdi.k8s.io/x]"),
    ]
    assert denied(decision) == expected
    status = decision.response["response"]["status"]
    causes = status["details"]["causes"]
    assert [c["field"] for c in causes] == [path for _, path in expected]
    assert all(c["reason"] == "FieldValueInvalid" for c in causes)
    message = status["message"]
    assert message.startswith("[spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid ")
    assert message.endswith("]")
    for finding in decision.findings:
        assert finding.violation.render() in message
    assert message == "[" + ", ".join(f.violation.render() for f in decision.findings) + "]"


def test_one_problem_is_not_bracketed():
    message = status_message(validate(privileged_gpu_pod()))
    assert message.startswith(f"{PRIVILEGED}: Invalid value: true: ")
    assert not message.startswith("[")


# --- Scopes: GPU-relevant Pods and the rest -----------------------------------------------


def test_privileged_cni_daemonset_with_a_wildcard_toleration_is_warned_by_default():
    cni = DAEMONSET.wrap(
        template(
            container("kube-flannel", privileged=True),
            volumes=[host_path("/run/flannel"), host_path("/dev", name="dev")],
            tolerations=[{"operator": "Exists", "effect": "NoSchedule"}],
            service_account="flannel",
        )
    )
    decision = validate(cni, namespace="kube-flannel")
    assert decision.allowed
    assert by_mode(decision, "Warn") == [
        ("privileged", "spec.template.spec.containers[0].securityContext.privileged"),
        ("host-devices", "spec.template.spec.volumes[0].hostPath.path"),
        ("host-devices", "spec.template.spec.volumes[1].hostPath.path"),
    ]
    message = decision.findings[0].message
    assert "the Pod can reach GPU nodes (a wildcard toleration tolerates nvidia.com/gpu)" in message
    assert warnings(decision)[0].endswith(
        "or, for a node agent, exempt its namespace (spec.tenants[].exemptions)"
    )


def test_privileged_daemonset_that_cannot_reach_gpu_nodes_is_audited_by_default():
    agent = DAEMONSET.wrap(
        template(
            container("agent", privileged=True),
            volumes=[host_path("/dev", name="dev")],
            tolerations=[{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
        )
    )
    decision = validate(agent, namespace="agents")
    assert decision.allowed
    assert "warnings" not in decision.response["response"]
    annotations = check_audit_annotations(decision)
    assert annotations["rules"] == "host-devices,privileged"
    assert [(r["rule"], r["path"]) for r in json.loads(annotations["violations"])] == [
        ("privileged", "spec.template.spec.containers[0].securityContext.privileged"),
        ("host-devices", "spec.template.spec.volumes[0].hostPath.path"),
    ]


@pytest.mark.parametrize(
    "relevance",
    [
        {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        {"tolerations": [{"key": "nvidia.com/gpu", "value": "present"}]},
        {"annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}},
    ],
    ids=["toleration-exists", "toleration-equal", "cdi-annotation"],
)
def test_gpu_relevance_without_a_gpu_request(relevance):
    decision = validate(pod(container("x", privileged=True), **relevance))
    assert ("privileged", PRIVILEGED) in denied(decision)


def test_node_selection_alone_does_not_reach_gpu_nodes():
    # A label narrows where a Pod may go; without a toleration it still cannot land there.
    decision = validate(
        pod(container("x", privileged=True), node_selector={"nvidia.com/gpu.present": "true"})
    )
    assert decision.allowed
    assert by_mode(decision, "Audit") == [("privileged", PRIVILEGED)]


@pytest.mark.parametrize("value", ["all", "void"])
def test_gpu_relevance_via_visible_devices_env(value):
    obj = pod(container("x", privileged=True, env={"NVIDIA_VISIBLE_DEVICES": value}))
    assert ("privileged", PRIVILEGED) in denied(validate(obj))


@pytest.mark.parametrize(
    "relevance",
    [
        {"node_selector": {POOL_LABEL: "a100"}},
        {"tolerations": [{"key": POOL_LABEL, "operator": "Exists"}]},
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": POOL_LABEL, "operator": "Exists"}]}
                        ]
                    }
                }
            }
        },
    ],
    ids=["pool-node-selector", "pool-taint-toleration", "pool-node-affinity"],
)
def test_gpu_relevance_via_a_pool(relevance):
    obj = pod(container("x", privileged=True), **relevance)
    decision = validate(obj, pools_policy())
    if "tolerations" in relevance:
        # Tolerating every pool's taint by key also lands it on t4-shared, reserved for team-*.
        assert denied(decision) == [("privileged", PRIVILEGED), ("pool-access", "spec.tolerations")]
    else:  # selecting the pool's nodes does not get the Pod past their taint
        assert by_mode(decision, "Audit") == [("privileged", PRIVILEGED)]
    # Under the default policy the pool label means nothing.
    if "node_selector" in relevance or "affinity" in relevance:
        assert validate(obj).allowed


@pytest.mark.parametrize(
    "unrelated",
    [
        {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]},
        {"node_selector": {"kubernetes.io/os": "linux"}},
        {"annotations": {"example.com/gpu": "yes"}},
    ],
    ids=["other-toleration", "other-node-label", "other-annotation"],
)
def test_not_gpu_relevant(unrelated):
    decision = validate(pod(container("x", privileged=True, limits={"cpu": "1"}), **unrelated))
    assert decision.allowed
    assert rules_in(decision, "Audit") == {"privileged"}


def test_scope_is_decided_per_template():
    head = template(container("ray-head", privileged=True), name="head")
    worker = template(container("ray-worker", gpu=1, privileged=True), name="worker")
    cluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc"},
        "spec": {"headGroupSpec": {"template": head}, "workerGroupSpecs": [{"template": worker}]},
    }
    decision = validate(cluster)
    assert by_mode(decision, "Audit") == [
        ("privileged", "spec.headGroupSpec.template.spec.containers[0].securityContext.privileged")
    ]
    assert denied(decision) == [
        (
            "privileged",
            "spec.workerGroupSpecs[0].template.spec.containers[0].securityContext.privileged",
        )
    ]


def test_other_pods_mode_can_be_enforce():
    strict = policy(BASE_SPEC + "rules: {default: {otherPods: Enforce}}")
    decision = validate(pod(container("cni", privileged=True)), strict)
    assert denied(decision) == [("privileged", PRIVILEGED)]


# --- Namespace overrides ------------------------------------------------------------------

OVERRIDES_SPEC = (
    BASE_SPEC
    + """
namespaceOverrides:
  - namespaces: [team-*]
    rules: {privileged: {gpuPods: Warn}}
  - namespaces: [team-x, "lab-?"]
    rules: {default: {gpuPods: "Off"}}
"""
)
OVERRIDES = policy(OVERRIDES_SPEC, name="overrides")


def bad_gpu_pod() -> dict:
    return privileged_gpu_pod(volumes=[host_path("/dev")])


def test_namespace_without_override_uses_the_policy_modes():
    decision = validate(bad_gpu_pod(), OVERRIDES, namespace="ml")
    assert denied(decision) == [
        ("privileged", PRIVILEGED),
        ("host-devices", "spec.volumes[0].hostPath.path"),
    ]


@pytest.mark.parametrize("namespace", ["team-a", "team-research", "team-x"])
def test_glob_override_changes_only_the_rules_it_names(namespace):
    # team-x matches both overrides: the first one wins.
    decision = validate(bad_gpu_pod(), OVERRIDES, namespace=namespace)
    assert by_mode(decision, "Warn") == [("privileged", PRIVILEGED)]
    assert denied(decision) == [("host-devices", "spec.volumes[0].hostPath.path")]


@pytest.mark.parametrize("namespace", ["lab-1", "lab-z"])
def test_question_mark_glob_matches_one_character(namespace):
    assert_allowed_clean(validate(bad_gpu_pod(), OVERRIDES, namespace=namespace))


@pytest.mark.parametrize("namespace", ["lab-12", "lab-", "teamx", "my-team-a"])
def test_globs_match_whole_names(namespace):
    decision = validate(bad_gpu_pod(), OVERRIDES, namespace=namespace)
    assert rules_in(decision, "Enforce") == {"privileged", "host-devices"}


# --- Exemptions ---------------------------------------------------------------------------

EXEMPTIONS_SPEC = (
    BASE_SPEC
    + """
exemptions:
  - namespaces: [kube-flannel]
    serviceAccounts: [flannel]
  - namespaces: [monitoring]
    rules: [host-devices]
  - namespaces: ["sandbox-*"]
"""
)
EXEMPTIONS = policy(EXEMPTIONS_SPEC, name="exemptions")


def test_exemption_by_namespace_glob():
    assert_allowed_clean(validate(bad_gpu_pod(), EXEMPTIONS, namespace="sandbox-alice"))


@pytest.mark.parametrize("field", ["serviceAccountName", "serviceAccount"])
def test_exemption_narrowed_to_service_accounts(field):
    obj = bad_gpu_pod()
    obj["spec"][field] = "flannel"
    assert_allowed_clean(validate(obj, EXEMPTIONS, namespace="kube-flannel"))


@pytest.mark.parametrize("service_account", [None, "default", "intruder"])
def test_exemption_does_not_cover_other_service_accounts(service_account):
    obj = privileged_gpu_pod(service_account=service_account)
    decision = validate(obj, EXEMPTIONS, namespace="kube-flannel")
    assert denied(decision) == [("privileged", PRIVILEGED)]


def test_exemption_narrowed_to_service_accounts_in_a_workload_template():
    exempt = DAEMONSET.wrap(
        template(container("x", gpu=1, privileged=True), service_account="flannel")
    )
    other = DAEMONSET.wrap(template(container("x", gpu=1, privileged=True), service_account="x"))
    assert validate(exempt, EXEMPTIONS, namespace="kube-flannel").allowed
    assert not validate(other, EXEMPTIONS, namespace="kube-flannel").allowed


def test_exemption_limited_to_rules():
    decision = validate(bad_gpu_pod(), EXEMPTIONS, namespace="monitoring")
    assert denied(decision) == [("privileged", PRIVILEGED)]


def test_exemptions_are_looked_for_only_where_one_could_apply():
    # The judging loop looks at the exemptions only for a namespace one of them names, or when
    # one names namespaces by a glob: the precheck must never skip an exemption that applies.
    named = policy(BASE_SPEC + "exemptions:\n  - namespaces: [monitoring]\n", name="named")
    assert named.exempted_names == {"monitoring"} and not named.exempts_by_glob
    assert EXEMPTIONS.exempted_names == {"kube-flannel", "monitoring"}
    assert EXEMPTIONS.exempts_by_glob
    assert_allowed_clean(validate(bad_gpu_pod(), named, namespace="monitoring"))
    for namespace in ("monitorin", "monitoring-x", "default"):
        assert not validate(bad_gpu_pod(), named, namespace=namespace).allowed


def test_exemption_does_not_leak_to_other_namespaces():
    decision = validate(bad_gpu_pod(), EXEMPTIONS, namespace="kube-system")
    assert rules_in(decision, "Enforce") == {"privileged", "host-devices"}


@pytest.mark.parametrize(
    "namespace",
    [
        "kube-system",
        "gpu-operator",
        "nvidia-gpu-operator",
        "nvidia-device-plugin",
        "nvidia-network-operator",
    ],
)
def test_default_policy_exempts_the_operators(namespace):
    assert_allowed_clean(validate(bad_gpu_pod(), namespace=namespace))


def test_namespace_falls_back_to_the_objects_metadata():
    obj = bad_gpu_pod()
    obj["metadata"]["namespace"] = "gpu-operator"
    assert_allowed_clean(validate(obj, namespace=None))


# --- The response envelope ----------------------------------------------------------------


def test_review_returns_the_decisions_response():
    review = admission(privileged_gpu_pod(), uid="abc-123")
    response = webhook.review(review, default_policy(), mutate=False)
    assert response == webhook.decide(review, default_policy(), mutate=False).response
    assert response["apiVersion"] == "admission.k8s.io/v1"
    assert response["kind"] == "AdmissionReview"
    assert response["response"]["uid"] == "abc-123"
    assert response["response"]["allowed"] is False


def test_decide_does_not_modify_the_review():
    review = admission(bad_gpu_pod())
    before = json.dumps(review, sort_keys=True)
    webhook.decide(review, default_policy(), mutate=False)
    webhook.decide(review, default_policy(), mutate=True)
    assert json.dumps(review, sort_keys=True) == before
