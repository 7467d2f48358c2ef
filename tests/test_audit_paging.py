"""The cluster audit judges page by page (``webhook.audit.cluster``): kinds are listed owners
first, an object whose owner comes later waits and gets the answer a whole listing gives, a
loop of controllers or a forged reference hides nothing, and no listed object is held once
judged. Against the fake API server of tests/kubeapi.py."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import webhook
from tests.kubeapi import FakeKubeAPI
from tests.samples import failing_on
from tests.support.cluster import (
    owner_reference,
    pod,
    seed,
    serve_report_kinds,
    serve_workload_kinds,
)
from webhook.audit.cluster import _Judging
from webhook.audit.judging import Audit
from webhook.audit.reports import REPORT_APIS, apply_reports, iter_policy_reports
from webhook.cluster import listing

POLICY = webhook.load_policy(webhook.default_policy_path())
REPLICA_SPECS = {
    "PyTorchJob": ("pytorchReplicaSpecs", "pytorchjobs"),
    "TFJob": ("tfReplicaSpecs", "tfjobs"),
}


@pytest.fixture
def api(kube_api: FakeKubeAPI) -> FakeKubeAPI:
    serve_workload_kinds(kube_api)
    return kube_api


@pytest.fixture
def connection(api: FakeKubeAPI, kube_api_kubeconfig: Path) -> Iterator[webhook.Cluster]:
    with webhook.connect(str(kube_api_kubeconfig), timeout=10) as cluster:
        yield cluster


def training_job(kind: str, name: str, *, owner: dict | None = None) -> dict[str, Any]:
    """A Kubeflow job whose one worker template is ``pod()``'s spec."""
    field, _ = REPLICA_SPECS[kind]
    metadata: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}"}
    if owner is not None:
        metadata["ownerReferences"] = [owner_reference(owner)]
    worker = {"replicas": 1, "template": {"spec": pod("x", "ml")["spec"]}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": kind,
        "metadata": metadata,
        "spec": {field: {"Worker": worker}},
    }


def add(api: FakeKubeAPI, *objects: dict[str, Any]) -> None:
    for obj in objects:
        api.add(obj, plural=REPLICA_SPECS.get(obj["kind"], (None, None))[1])


def claimed(obj: dict[str, Any], api_version: str, kind: str, name: str) -> dict[str, Any]:
    """The object with a controller reference to ``kind/name`` (uid ``uid-<name>``)."""
    reference = {"apiVersion": api_version, "kind": kind, "name": name, "controller": True}
    obj["metadata"]["ownerReferences"] = [{**reference, "uid": f"uid-{name}"}]
    return obj


def listed(audit: Audit) -> list[tuple[str, list[str]]]:
    return [(str(item.ref), [str(r) for r in item.owned]) for item in audit.items]


def list_order(api: FakeKubeAPI) -> list[str]:
    paths = [r.path for r in api.requests_to("GET") if r.path != "/apis"]
    return list(dict.fromkeys(paths))


def test_owners_kinds_are_listed_before_the_kinds_they_own(
    api: FakeKubeAPI, connection: webhook.Cluster
) -> None:
    seed(api)
    webhook.audit_cluster(POLICY, connection, None)
    order = list_order(api)
    assert order.index("/apis/kubeflow.org/v1/pytorchjobs") < order.index(
        "/apis/apps/v1/deployments"
    )
    assert order.index("/apis/apps/v1/deployments") < order.index("/apis/apps/v1/replicasets")
    assert order.index("/apis/batch/v1/cronjobs") < order.index("/apis/batch/v1/jobs")
    assert order[-1] == "/api/v1/pods"


def test_an_owner_listed_after_what_it_owns_still_owns_it(
    api: FakeKubeAPI, connection: webhook.Cluster
) -> None:
    # PyTorchJobs are listed before TFJobs: the PyTorchJob and its Pod wait for their TFJob.
    outer = training_job("TFJob", "outer")
    inner = training_job("PyTorchJob", "inner", owner=outer)
    add(api, outer, inner, pod("inner-worker-0", "ml", owner=inner), pod("web", "ml"))
    audit = webhook.audit_cluster(POLICY, connection, None)
    order = list_order(api)
    assert order.index("/apis/kubeflow.org/v1/pytorchjobs") < order.index(
        "/apis/kubeflow.org/v1/tfjobs"
    )
    assert listed(audit) == [
        ("ml/TFJob/outer", ["ml/PyTorchJob/inner", "ml/Pod/inner-worker-0"]),
        ("ml/Pod/web", []),
    ]
    assert not audit.problems
    # The pre-flight's two audits over one listing place them alike.
    result = webhook.preflight_cluster(POLICY, POLICY, connection, None)
    assert listed(result.new) == listed(result.old) == listed(audit)
    assert result.changes == []


def test_an_owner_never_listed_leaves_a_root(api: FakeKubeAPI, connection: webhook.Cluster) -> None:
    """A controller that is no listed object (a mirror Pod's Node, a forged uid) makes nothing:
    the object is judged as a root, in its place in the listing."""
    mirror = claimed(pod("etcd-node-1", "kube-system"), "v1", "Node", "node-1")
    forged = claimed(pod("forged", "ml"), "apps/v1", "ReplicaSet", "gone")
    # A PyTorchJob that is not there either: the kind is listed before Pods.
    waiting = claimed(pod("waiting", "ml"), "kubeflow.org/v1", "PyTorchJob", "x")
    add(api, mirror, forged, waiting, pod("z-last", "ml"))
    audit = webhook.audit_cluster(POLICY, connection, None)
    assert listed(audit) == [
        ("kube-system/Pod/etcd-node-1", []),
        ("ml/Pod/forged", []),
        ("ml/Pod/waiting", []),
        ("ml/Pod/z-last", []),
    ]


def test_a_forged_reference_to_a_real_owner_covers_only_what_its_template_has(
    api: FakeKubeAPI, connection: webhook.Cluster
) -> None:
    job = training_job("PyTorchJob", "job")
    alike = pod("alike", "ml", owner=job)  # the worker template's Pod
    unlike = pod("unlike", "ml", privileged=True, owner=job)  # what the template does not have
    add(api, job, alike, unlike)
    audit = webhook.audit_cluster(POLICY, connection, None)
    assert listed(audit) == [("ml/PyTorchJob/job", ["ml/Pod/alike"]), ("ml/Pod/unlike", [])]
    assert not audit.items[1].outcome.allowed


def test_a_loop_of_controllers_hides_nothing(api: FakeKubeAPI, connection: webhook.Cluster) -> None:
    """Controllers that own each other are the API's bug: no controller made them, and each of
    them, and what they own, is judged alone."""
    first = training_job("PyTorchJob", "first")
    second = training_job("PyTorchJob", "second", owner=first)
    first["metadata"]["ownerReferences"] = [owner_reference(second)]
    add(api, first, second, pod("first-worker-0", "ml", owner=first))
    audit = webhook.audit_cluster(POLICY, connection, None)
    assert listed(audit) == [
        ("ml/PyTorchJob/first", []),
        ("ml/PyTorchJob/second", []),
        ("ml/Pod/first-worker-0", []),
    ]
    assert not audit.problems


def test_what_a_waiting_owner_that_cannot_be_judged_owns_is_not_judged_alone(
    api: FakeKubeAPI, connection: webhook.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in ("webhook.audit.judging", "webhook.audit.cluster"):
        monkeypatch.setattr(f"{module}.decide_object", failing_on("outer"))
    outer = training_job("TFJob", "outer")
    inner = training_job("PyTorchJob", "inner", owner=outer)
    add(api, outer, inner, pod("inner-worker-0", "ml", owner=inner))
    audit = webhook.audit_cluster(POLICY, connection, None)
    assert audit.items == []
    assert [p.source for p in audit.problems] == ["ml/TFJob/outer"]


class Listed(dict):  # type: ignore[type-arg]
    """A listed object that a weak reference can follow (a plain dict cannot)."""


def test_no_listed_object_is_held_once_judged(
    api: FakeKubeAPI, connection: webhook.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(api)  # roots with mutations and findings, owned objects, a bare privileged Pod
    outer = training_job("TFJob", "outer")
    inner = training_job("PyTorchJob", "inner", owner=outer)
    add(api, outer, inner)  # and one that waits for its owner
    references: list[weakref.ref[Listed]] = []
    loads = listing._loads

    def tracked(data: bytes) -> Any:
        body = loads(data)
        if isinstance(body, dict) and isinstance(body.get("items"), list):
            body["items"] = [Listed(item) for item in body["items"]]
            references.extend(weakref.ref(item) for item in body["items"])
        return body

    monkeypatch.setattr(listing, "_loads", tracked)
    audit = webhook.audit_cluster(POLICY, connection, None)
    gc.collect()
    assert len(references) == 10
    assert [ref() for ref in references if ref() is not None] == []
    for item in audit.items:  # what is kept: apiVersion, kind and names
        for obj in (item.document.obj, item.outcome.obj):
            assert set(obj) == {"apiVersion", "kind", "metadata"}
            assert set(obj["metadata"]) <= {"name", "generateName", "namespace", "uid"}
    web = next(i for i in audit.items if str(i.ref) == "default/Pod/web")
    (mutation,) = web.outcome.mutations
    assert mutation.mutated["spec"]["tolerations"]  # the mutated Pod is kept for -o json
    # Where nothing prints it (tables, reports, the background audit), only the patch is.
    lean = webhook.audit_cluster(POLICY, connection, None, keep_mutated=False)
    web = next(i for i in lean.items if str(i.ref) == "default/Pod/web")
    (lean_mutation,) = web.outcome.mutations
    assert set(lean_mutation.mutated) == {"apiVersion", "kind", "metadata"}
    assert lean_mutation.operations == mutation.operations


def test_reports_are_written_as_they_are_built(
    api: FakeKubeAPI, connection: webhook.Cluster
) -> None:
    seed(api)
    serve_report_kinds(api)
    audit = webhook.audit_cluster(POLICY, connection, None, respect_modes=True)
    report_api = REPORT_APIS["wgpolicyk8s"]
    built = 0

    def one_at_a_time() -> Iterator[dict[str, Any]]:
        nonlocal built
        for report in iter_policy_reports(audit.policy, audit.items, report_api):
            assert len(api.requests_to("PATCH")) == built  # each one before is written
            built += 1
            yield report

    applied = apply_reports(connection, report_api, one_at_a_time(), None)
    assert built == applied.created == 2


def test_what_waits_for_its_owner_is_placed_when_the_owner_is() -> None:
    """Held whole only until the owner comes: the Pods listed after it wait for nothing."""
    audit = Audit(POLICY, True)
    judging = _Judging(
        [audit], ["PyTorchJob", "TFJob", "Pod"], raise_errors=True, keep_mutated=False
    )
    outer = training_job("TFJob", "outer")
    inner = training_job("PyTorchJob", "inner", owner=outer)
    judging.place(inner)
    judging.listed("PyTorchJob")
    assert list(judging.pending.values()) == [inner]
    judging.place(outer)
    assert judging.pending == {} and judging.waiting == {}
    judging.listed("TFJob")
    judging.place(pod("inner-worker-0", "ml", owner=inner))
    assert judging.pending == {}
    judging.listed("Pod")
    judging.finish()
    assert listed(audit) == [("ml/TFJob/outer", ["ml/PyTorchJob/inner", "ml/Pod/inner-worker-0"])]


def test_a_version_that_stops_serving_midway_gives_each_object_once(
    api: FakeKubeAPI, connection: webhook.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listing, "PAGE_SIZE", 1)
    for version in ("v1", "v2beta1"):  # one CRD serving both versions
        for name in ("a", "b"):
            job = training_job("PyTorchJob", name)
            job["apiVersion"] = f"kubeflow.org/{version}"
            api.add(job, plural="pytorchjobs")
    api.fail("/apis/kubeflow.org/v1/pytorchjobs", 404, only_with_continue=True)
    audit = webhook.audit_cluster(POLICY, connection, None)
    assert listed(audit) == [("ml/PyTorchJob/a", []), ("ml/PyTorchJob/b", [])]
    assert [i.outcome.obj["apiVersion"] for i in audit.items] == [
        "kubeflow.org/v1",
        "kubeflow.org/v2beta1",
    ]
    assert not audit.problems
