"""Policy exceptions: named rules stop denying one workload (by name, or by its Pods' labels)
in one namespace until the exception expires; every decision one changes says so, and an
expired one applies no more."""

from __future__ import annotations

import datetime
import json
import logging
from functools import cache
from pathlib import Path

import pytest

import webhook
from tests.support.admission import (
    admission,
    container,
    denied,
    pod,
    policy,
    template,
    warnings,
)
from webhook.server.app import create_app
from webhook.server.logs import JsonFormatter
from webhook.server.metrics import Metrics
from webhook.server.store import PolicyStore

SPEC = """
resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
gpuNodeTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
exceptions:
  - name: llama-debug
    owner: ml-platform@example.com
    expires: "2027-01-31"
    reason: profiling with nsys needs a privileged sidecar until the driver upgrade
    namespace: ml
    match:
      selector: {matchLabels: {app: llama}}
    rules: [privileged]
  - name: trainer-hostpid
    owner: ml-platform@example.com
    expires: "2027-01-15T12:00:00Z"
    namespace: ml
    match:
      names: [trainer]
    rules: [host-access, pod-security]
"""
BEFORE = datetime.datetime(2027, 1, 31, 23, 59, 59, tzinfo=datetime.UTC).timestamp()
AFTER = datetime.datetime(2027, 2, 1, tzinfo=datetime.UTC).timestamp()


@cache
def excepting() -> webhook.Policy:
    return policy(SPEC, name="excepting")


def privileged_llama(**labels: str) -> dict:
    obj = pod(container(gpu=1, privileged=True))
    obj["metadata"]["labels"] = labels or {"app": "llama"}
    return obj


def judge(obj: dict, now: float, namespace: str = "ml") -> webhook.Decision:
    return webhook.decide(admission(obj, namespace=namespace), excepting(), mutate=False, now=now)


def test_its_workload_is_admitted_with_a_warning_that_names_it_until_it_expires() -> None:
    decision = judge(privileged_llama(), BEFORE)
    assert decision.allowed
    [warning] = warnings(decision)
    assert warning.startswith(
        "spec.containers[0].securityContext.privileged: allowed by exception 'llama-debug' "
        "(owner ml-platform@example.com, until 2027-01-31): "
    )
    [finding] = decision.findings
    assert (finding.rule, finding.mode, finding.exception) == (
        "privileged",
        "Warn",
        "exception 'llama-debug' (owner ml-platform@example.com, until 2027-01-31)",
    )
    assert [r for r, _ in denied(judge(privileged_llama(), AFTER))] == ["privileged"]


@pytest.mark.parametrize(
    "obj, namespace",
    [
        (privileged_llama(app="other"), "ml"),  # another workload
        (privileged_llama(), "research"),  # another namespace
    ],
    ids=["other labels", "other namespace"],
)
def test_nothing_else_is_excepted(obj: dict, namespace: str) -> None:
    assert [r for r, _ in denied(judge(obj, BEFORE, namespace))] == ["privileged"]


def test_only_its_rules_are_lifted() -> None:
    obj = privileged_llama()
    obj["spec"]["hostPID"] = True
    decision = judge(obj, BEFORE)
    assert not decision.allowed
    assert "privileged" not in {r for r, _ in denied(decision)}
    assert {r for r, _ in denied(decision)} & {"host-access", "pod-security"}


def test_by_name_a_workload_and_every_template_it_holds() -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer"},
        "spec": {"template": template(container(gpu=1))},
    }
    deployment["spec"]["template"]["spec"]["hostPID"] = True
    early = datetime.datetime(2027, 1, 15, 11, 59, tzinfo=datetime.UTC).timestamp()
    late = datetime.datetime(2027, 1, 15, 12, 0, tzinfo=datetime.UTC).timestamp()
    assert judge(deployment, early).allowed
    assert not judge(deployment, late).allowed
    deployment["metadata"]["name"] = "trainer-2"
    assert not judge(deployment, early).allowed


def test_what_is_not_a_denial_is_left_as_it_is() -> None:
    """A finding already a warning or an audit record is not the exception's doing."""
    obj = privileged_llama()
    warned = policy(SPEC + "rules: {privileged: {gpuPods: Warn}}\n", name="warned")
    decision = webhook.decide(admission(obj, namespace="ml"), warned, mutate=False, now=BEFORE)
    [finding] = decision.findings
    assert (finding.mode, finding.exception) == ("Warn", "")


def test_without_exceptions_no_clock_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    def no_clock() -> float:
        raise AssertionError("the clock was read")

    monkeypatch.setattr(time, "time", no_clock)
    plain = policy("resources: [{name: nvidia.com/gpu, sharing: Exclusive}]\n", name="plain")
    webhook.decide(admission(privileged_llama(), namespace="ml"), plain, mutate=False)


def test_the_decision_log_line_names_the_exception(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = (
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: excepting}\nspec:\n"
        + SPEC.replace('"2027-01-31"', '"2999-01-31"').replace("\n", "\n  ")
    )
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    client = create_app(PolicyStore(path, metrics=Metrics()), metrics=Metrics()).test_client()
    with caplog.at_level(logging.INFO, logger="webhook.decisions"):
        reply = client.post(
            "/validate",
            data=json.dumps(admission(privileged_llama(), namespace="ml")),
            content_type="application/json",
        )
    assert reply.json["response"]["allowed"] is True
    [record] = [r for r in caplog.records if r.name == "webhook.decisions"]
    entry = json.loads(JsonFormatter().format(record))
    assert entry["exceptions"] == [
        "exception 'llama-debug' (owner ml-platform@example.com, until 2999-01-31)"
    ]
    assert (entry["rules"], entry["modes"]) == (["privileged"], ["Warn"])


RESERVED = f"""
gpuNodeTaints: [{{key: nvidia.com/gpu, value: present, effect: NoSchedule}}]
pools:
  - name: team
    nodeSelector: {{example.com/pool: team}}
    taints: [{{key: example.com/pool, value: team, effect: NoSchedule}}]
    namespaces: [team-a]
    resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
{SPEC.split("exceptions:")[0].split("gpuNodeTaints")[0]}exceptions:{SPEC.split("exceptions:")[1]}"""


def test_no_exception_is_carried_onto_a_pool_closed_to_its_namespace() -> None:
    """A wildcard toleration, which pool-access only warns about (node agents), would take
    the excepted privileged Pod onto another tenant's reserved nodes: nothing is lifted."""
    reserved = policy(RESERVED, name="reserved")
    roaming = privileged_llama()
    roaming["spec"]["containers"][0]["resources"] = {}
    roaming["spec"]["tolerations"] = [{"operator": "Exists"}]
    decision = webhook.decide(
        admission(roaming, namespace="ml"), reserved, mutate=False, now=BEFORE
    )
    assert "privileged" in {r for r, _ in denied(decision)}
    kept_home = privileged_llama()
    kept_home["spec"]["containers"][0]["resources"] = {}
    decision = webhook.decide(
        admission(kept_home, namespace="ml"), reserved, mutate=False, now=BEFORE
    )
    assert decision.allowed


def test_kubectl_debug_is_not_covered() -> None:
    old = privileged_llama()
    new = privileged_llama()
    new["spec"]["ephemeralContainers"] = [
        {"name": "debug", "image": "busybox", "securityContext": {"privileged": True}}
    ]
    review = admission(new, operation="UPDATE", namespace="ml", old=old)
    review["request"]["subResource"] = "ephemeralcontainers"
    decision = webhook.decide(review, excepting(), mutate=False, now=BEFORE)
    assert not decision.allowed


def test_the_api_servers_audit_log_records_the_exception() -> None:
    annotations = judge(privileged_llama(), BEFORE).response["response"]["auditAnnotations"]
    assert json.loads(annotations["exceptions"]) == [
        "exception 'llama-debug' (owner ml-platform@example.com, until 2027-01-31)"
    ]


def test_a_pod_naming_its_node_is_lifted_nothing_where_pools_are_reserved() -> None:
    """Without the node inventory the webhook cannot tell whose node it is."""
    reserved = policy(RESERVED, name="reserved")
    bound = privileged_llama()
    bound["spec"]["containers"][0]["resources"] = {}
    bound["spec"]["nodeName"] = "gpu-7"
    decision = webhook.decide(admission(bound, namespace="ml"), reserved, mutate=False, now=BEFORE)
    assert "privileged" in {r for r, _ in denied(decision)}
