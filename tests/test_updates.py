"""Operations, subresources, UPDATE against oldObject, unknown kinds and malformed reviews."""

from __future__ import annotations

import copy

import pytest

import webhook
from tests.support.admission import (
    KINDS,
    admission,
    assert_allowed_clean,
    by_mode,
    container,
    default_policy,
    denied,
    denied_rules,
    pod,
    status_message,
    template,
    validate,
    warnings,
)
from tests.support.paths import REPO

POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}


def privileged_at(index: int, where: str = "containers") -> str:
    return f"spec.{where}[{index}].securityContext.privileged"


# --- UPDATE: what the object already had is not the update's doing --------------------------


def test_update_keeping_a_privileged_container_is_allowed_with_a_warning():
    old = pod(container("train", gpu=1, privileged=True))
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["touched"] = "yes"
    decision = validate(new, operation="UPDATE", old=old)
    assert decision.allowed
    assert denied(decision) == []
    assert by_mode(decision, "Warn") == [("privileged", privileged_at(0))]
    assert warnings(decision)[0].startswith(f'{privileged_at(0)}: container "train"')


def test_update_adding_privileged_to_another_container_is_denied_naming_only_it():
    old = pod(container("train", gpu=1, privileged=True), container("side"))
    new = pod(container("train", gpu=1, privileged=True), container("side", privileged=True))
    decision = validate(new, operation="UPDATE", old=old)
    assert not decision.allowed
    assert denied(decision) == [("privileged", privileged_at(1))]
    message = status_message(decision)
    assert 'container "side"' in message
    assert 'container "train"' not in message
    assert by_mode(decision, "Warn") == [("privileged", privileged_at(0))]


def test_reordered_containers_are_matched_by_name():
    old = pod(container("train", gpu=1, privileged=True), container("side"))
    new = pod(container("side"), container("train", gpu=1, privileged=True))
    decision = validate(new, operation="UPDATE", old=old)
    assert decision.allowed
    assert by_mode(decision, "Warn") == [("privileged", privileged_at(1))]


def test_a_renamed_container_is_new():
    old = pod(container("train", gpu=1, privileged=True))
    new = pod(container("trainer", gpu=1, privileged=True))
    assert denied(validate(new, operation="UPDATE", old=old)) == [("privileged", privileged_at(0))]


def test_same_name_in_another_container_list_is_new():
    old = pod(container("train", gpu=1), init=[container("setup", privileged=True)])
    new = pod(
        container("setup", gpu=1, privileged=True), init=[container("setup", privileged=True)]
    )
    decision = validate(new, operation="UPDATE", old=old)
    assert denied(decision) == [("privileged", privileged_at(0))]


def test_update_fixing_the_problem_is_clean():
    old = pod(container("train", gpu=1, privileged=True))
    new = pod(container("train", gpu=1))
    assert_allowed_clean(validate(new, operation="UPDATE", old=old))


def test_update_without_old_object_is_judged_like_a_create():
    new = pod(container("train", gpu=1, privileged=True))
    assert denied(validate(new, operation="UPDATE", old=None)) == [("privileged", privileged_at(0))]


def test_update_of_a_deployment_template():
    deployment = next(k for k in KINDS if k.name == "Deployment")
    old = deployment.wrap(template(container("train", gpu=1, privileged=True)))
    scaled = copy.deepcopy(old)
    scaled["spec"]["replicas"] = 3
    assert validate(scaled, operation="UPDATE", old=old).allowed

    worse = copy.deepcopy(old)
    worse["spec"]["template"]["spec"]["containers"].append(container("side", privileged=True))
    decision = validate(worse, operation="UPDATE", old=old)
    assert denied(decision) == [
        ("privileged", "spec.template.spec.containers[1].securityContext.privileged")
    ]


def test_update_adding_a_problem_to_another_template_is_denied():
    def job(worker_privileged):
        return {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "train"},
            "spec": {
                "pytorchReplicaSpecs": {
                    "Master": {"template": template(container("pytorch", gpu=1, privileged=True))},
                    "Worker": {
                        "template": template(
                            container("pytorch", gpu=1, privileged=worker_privileged)
                        )
                    },
                }
            },
        }

    decision = validate(job(True), operation="UPDATE", old=job(None))
    assert denied(decision) == [
        (
            "privileged",
            "spec.pytorchReplicaSpecs[Worker].template.spec.containers[0]"
            ".securityContext.privileged",
        )
    ]


# --- pods/ephemeralcontainers -------------------------------------------------------------


def debug(privileged: bool | None) -> dict:
    return container("debug", privileged=privileged, stdin=True, tty=True)


def test_adding_a_privileged_ephemeral_container_is_denied():
    old = pod(container("train", gpu=1))
    new = pod(container("train", gpu=1), ephemeral=[debug(True)])
    decision = validate(new, operation="UPDATE", old=old, sub_resource="ephemeralcontainers")
    assert not decision.allowed
    assert denied(decision) == [("privileged", privileged_at(0, "ephemeralContainers"))]
    assert 'container "debug"' in status_message(decision)


def test_adding_a_harmless_ephemeral_container_to_a_pod_with_old_problems_is_allowed():
    old = pod(container("train", gpu=1, privileged=True))
    new = pod(container("train", gpu=1, privileged=True), ephemeral=[debug(None)])
    decision = validate(new, operation="UPDATE", old=old, sub_resource="ephemeralcontainers")
    # Each added ephemeral container is judged on its own: the Pod's others are not its doing.
    assert_allowed_clean(decision)


def test_ephemeral_container_in_a_non_gpu_pod_is_audited():
    old = pod(container("web"))
    new = pod(container("web"), ephemeral=[debug(True)])
    decision = validate(new, operation="UPDATE", old=old, sub_resource="ephemeralcontainers")
    assert decision.allowed
    assert by_mode(decision, "Audit") == [("privileged", privileged_at(0, "ephemeralContainers"))]


# --- Operations and subresources that are not judged --------------------------------------


@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
def test_delete_and_connect_are_allowed(operation):
    bad = pod(container("train", gpu=1, privileged=True))
    review = admission(None, operation=operation, old=bad, kind=POD_KIND)
    response = webhook.review(review, default_policy(), mutate=False)
    assert response["response"] == {"uid": review["request"]["uid"], "allowed": True}


def test_delete_with_the_object_in_old_object_is_allowed():
    bad = pod(container("train", gpu=1, privileged=True))
    assert_allowed_clean(validate(None, operation="DELETE", old=bad))


@pytest.mark.parametrize("sub_resource", ["status", "binding", "eviction", "exec", "log"])
def test_other_subresources_are_ignored(sub_resource):
    bad = pod(container("train", gpu=1, privileged=True))
    decision = validate(bad, operation="UPDATE", old=bad, sub_resource=sub_resource)
    assert_allowed_clean(decision)


def test_dry_run_is_judged_like_a_real_request():
    bad = pod(container("train", gpu=1, privileged=True))
    real = validate(bad)
    dry = validate(bad, dry_run=True)
    assert not dry.allowed
    assert denied(dry) == denied(real) == [("privileged", privileged_at(0))]
    assert status_message(dry) == status_message(real)


@pytest.mark.parametrize(
    "obj",
    [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {}},
        {
            "apiVersion": "example.com/v1",
            "kind": "Trainer",
            "metadata": {"name": "t"},
            "spec": {"template": template(container(gpu="0.5", privileged=True))},
        },
    ],
    ids=["ConfigMap", "Service", "undeclared-custom-kind"],
)
def test_unknown_kinds_are_allowed(obj):
    assert_allowed_clean(validate(obj))


def test_the_request_kind_decides_not_the_object():
    bad = pod(container("train", gpu=1, privileged=True))
    cm_kind = {"group": "", "version": "v1", "kind": "ConfigMap"}
    assert_allowed_clean(validate(bad, kind=cm_kind))


def test_legacy_extensions_group_is_judged():
    legacy = {
        "apiVersion": "extensions/v1beta1",
        "kind": "DaemonSet",
        "metadata": {"name": "d"},
        "spec": {"template": template(container("x", gpu=1, privileged=True))},
    }
    assert denied(validate(legacy)) == [
        ("privileged", "spec.template.spec.containers[0].securityContext.privileged")
    ]


def test_workload_without_a_template_is_allowed():
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {},
    }
    assert_allowed_clean(validate(deployment))


def test_pod_without_containers_is_allowed():
    assert_allowed_clean(validate({"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}}))


# --- Malformed reviews --------------------------------------------------------------------


def good_review() -> dict:
    return admission(pod(container("train", gpu=1)))


def malformed(change) -> dict:
    review = good_review()
    change(review)
    return review


MALFORMED = {
    "not-a-dict": lambda: ["AdmissionReview"],
    "a-string": lambda: "AdmissionReview",
    "none": lambda: None,
    "missing-request": lambda: malformed(lambda r: r.pop("request")),
    "request-not-a-dict": lambda: malformed(lambda r: r.update(request="x")),
    "missing-uid": lambda: malformed(lambda r: r["request"].pop("uid")),
    "empty-uid": lambda: malformed(lambda r: r["request"].update(uid="")),
    "uid-not-a-string": lambda: malformed(lambda r: r["request"].update(uid=42)),
    "wrong-apiVersion": lambda: malformed(
        lambda r: r.update(apiVersion="admission.k8s.io/v1beta1")
    ),
    "missing-apiVersion": lambda: malformed(lambda r: r.pop("apiVersion")),
    "wrong-kind": lambda: malformed(lambda r: r.update(kind="AdmissionRequest")),
    "missing-kind": lambda: malformed(lambda r: r.pop("kind")),
    "object-missing-on-create": lambda: malformed(lambda r: r["request"].pop("object")),
    "object-null-on-create": lambda: malformed(lambda r: r["request"].update(object=None)),
    "object-a-list-on-create": lambda: malformed(lambda r: r["request"].update(object=[])),
    "object-a-string-on-update": lambda: malformed(
        lambda r: r["request"].update(operation="UPDATE", object="{}")
    ),
}


@pytest.mark.parametrize("mutate_", [False, True], ids=["validate", "mutate"])
@pytest.mark.parametrize("build", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_reviews_raise_request_error(build, mutate_):
    with pytest.raises(webhook.RequestError):
        webhook.decide(build(), default_policy(), mutate=mutate_)


def test_request_error_is_a_value_error_with_a_useful_message():
    review = malformed(lambda r: r.update(apiVersion="admission.k8s.io/v1beta1"))
    with pytest.raises(ValueError, match="admissionReviewVersions"):
        webhook.review(review, default_policy(), mutate=False)


def test_a_good_review_does_not_raise():
    assert webhook.decide(good_review(), default_policy(), mutate=False).allowed


def _jobset(*jobs: tuple[str, dict]) -> dict:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js", "namespace": "ml"},
        "spec": {
            "replicatedJobs": [
                {"name": name, "template": {"spec": {"template": tmpl}}} for name, tmpl in jobs
            ]
        },
    }


def test_a_replicated_job_inserted_before_an_old_problem_is_matched_by_name():
    bad = template(container("train", gpu=1, privileged=True))
    good = template(container("train", gpu=1))
    old = _jobset(("a", bad))
    new = _jobset(("b", good), ("a", bad))
    decision = validate(new, operation="UPDATE", old=old)
    assert decision.allowed
    assert [w for w in warnings(decision) if "replicatedJobs[1]" in w]


def test_a_new_replicated_job_with_a_problem_is_denied():
    bad = template(container("train", gpu=1, privileged=True))
    old = _jobset(("a", bad))
    new = _jobset(("a", bad), ("b", bad))
    decision = validate(new, operation="UPDATE", old=old)
    assert not decision.allowed
    assert [path for _, path in denied(decision)] == [
        "spec.replicatedJobs[1].template.spec.template.spec.containers[0].securityContext.privileged"
    ]


def test_a_container_inserted_before_an_old_pool_problem_does_not_make_it_new():
    labelled = webhook.load_policy(REPO / "policies" / "examples" / "labelled-pools.yaml")
    old = pod(container("g", gpu=1))
    assert denied_rules(validate(old, labelled, namespace="web")) == {"pool-access"}
    new = pod(container("sidecar"), container("g", gpu=1))
    decision = validate(new, labelled, operation="UPDATE", old=old, namespace="web")
    assert decision.allowed
    assert by_mode(decision, "Warn") == [
        ("pool-access", "spec.containers[1].resources.limits[nvidia.com/gpu]")
    ]


def test_the_mutate_path_leaves_updates_to_the_validate_path():
    old = pod(container("train", gpu="0.5"))
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["touched"] = "yes"
    review = admission(new, operation="UPDATE", old=old)
    assert webhook.decide(review, default_policy(), mutate=True).allowed
    assert validate(new, operation="UPDATE", old=old).allowed


# --- bounded work: a review with thousands of violations is judged until the verdict is sure --


def many_privileged(count: int) -> list[dict]:
    """A GPU container and ``count - 1`` others, all privileged."""
    return [container(f"c{i}", gpu=1 if i == 0 else 0, privileged=True) for i in range(count)]


def test_judging_stops_once_the_denial_message_is_full_and_says_so():
    decision = validate(pod(*many_privileged(2000)))
    assert not decision.allowed
    assert len(decision.findings) == webhook.admission.engine.STOP_AFTER_DENIALS
    message = status_message(decision)
    assert 'container "c49"' in message and 'container "c50"' not in message
    assert message.endswith(
        "and more: judging stopped after 51 violations, fix these and apply again to see the rest]"
    )


def test_a_review_with_fewer_violations_than_the_limit_is_judged_whole():
    decision = validate(pod(*many_privileged(30)))
    assert len(decision.findings) == 30
    assert "judging stopped" not in status_message(decision)


def test_when_every_denial_before_the_stop_is_forgiven_the_rest_is_judged():
    old = pod(*many_privileged(80))
    new = pod(*many_privileged(80), container("added", privileged=True))
    decision = validate(new, operation="UPDATE", old=old)
    assert not decision.allowed
    assert denied(decision) == [("privileged", privileged_at(80))]
    assert "judging stopped" not in status_message(decision)
    assert len(by_mode(decision, "Warn")) == 80


def test_an_update_that_keeps_thousands_of_old_violations_is_allowed():
    old = pod(*many_privileged(500))
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["touched"] = "yes"
    decision = validate(new, operation="UPDATE", old=old)
    assert decision.allowed
    assert len(by_mode(decision, "Warn")) == 500


def test_the_old_object_is_judged_by_each_rule_once_however_many_batches(monkeypatch):
    """Judging goes on batch by batch while every denial is forgiven; the old object is
    judged only for the rules of new denials, never twice for one rule."""
    asked: list[tuple[str, ...]] = []
    run_checks = webhook.admission.engine.run_checks

    def recording(views, policy, rules=None):
        asked.append(tuple(sorted(rules or ())))
        return run_checks(views, policy, rules)

    monkeypatch.setattr(webhook.admission.engine, "run_checks", recording)
    old = pod(*many_privileged(300))
    added = container("added", env={"NVIDIA_VISIBLE_DEVICES": "all"})
    new = pod(*many_privileged(300), added)
    decision = validate(new, operation="UPDATE", old=old)
    assert not decision.allowed
    assert [rule for rule, _ in denied(decision)] == ["device-visibility"]
    assert len(by_mode(decision, "Warn")) == 300
    assert asked == [("privileged",), ("device-visibility",)]


def test_names_added_past_the_limit_of_undeclared_names_are_not_forgiven():
    """A workload admitted with more than 100 undeclared names (under an older release): an
    UPDATE that adds a near miss past them is denied, not forgiven with the old denial."""
    from webhook.checks.resource_name import MAX_UNDECLARED_NAMES

    deployment = next(k for k in KINDS if k.name == "Deployment")
    names = {f"nvidia.com/rail{i}": 1 for i in range(MAX_UNDECLARED_NAMES + 1)}
    old = deployment.wrap(template(container(limits={"nvidia.com/gpu": 1, **names})))
    unchanged = validate(copy.deepcopy(old), operation="UPDATE", old=old)
    assert unchanged.allowed
    added = {"nvidia.com/gpu": 1, **names, "nvidia.com/gpus": 1}
    new = deployment.wrap(template(container(limits=added)))
    decision = validate(new, operation="UPDATE", old=old)
    assert not decision.allowed
    assert [rule for rule, _ in denied(decision)] == ["resource-name"]
