"""The fake API server (tests/kubeapi.py) through the real ``kubernetes`` client: server-side
apply, custom resources (list by label across namespaces, pagination, delete), the 404 of
a resource type no CRD serves, watches (chunked events, bookmarks, 410 Expired), and the
built-in DRA types (``resource.k8s.io/v1``), served or not."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.kubeapi import APPLY, NOT_FOUND_TEXT, FakeKubeAPI

GROUP, VERSION = "wgpolicyk8s.io", "v1alpha2"
MANAGER = "gpu-admission"


def report(name: str = "trainer", namespace: str | None = "ml", **labels: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {"app": "gpu-admission", **labels}}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PolicyReport" if namespace else "ClusterPolicyReport",
        "metadata": metadata,
        "summary": {"pass": 0, "fail": 1},
        "results": [{"policy": "gpu-admission", "rule": "host-access", "result": "fail"}],
    }


@pytest.fixture
def custom(kube_api: FakeKubeAPI, kube_api_client: Any) -> k8s.CustomObjectsApi:
    kube_api.register(GROUP, VERSION, "policyreports", "PolicyReport")
    kube_api.register(
        GROUP, VERSION, "clusterpolicyreports", "ClusterPolicyReport", namespaced=False
    )
    return k8s.CustomObjectsApi(kube_api_client)


def apply(
    custom: k8s.CustomObjectsApi, body: Any, name: str = "trainer", **options: Any
) -> tuple[dict[str, Any], int]:
    """The call of the tests/kubeapi.py docstring; the stored object and the HTTP status."""
    options = {"field_manager": MANAGER, "force": True, **options}
    response = custom.patch_namespaced_custom_object(
        GROUP, VERSION, "ml", "policyreports", name, body,
        _content_type=APPLY, _preload_content=False, **options,
    )  # fmt: skip
    return json.loads(response.data), response.status


def apply_yaml(custom: k8s.CustomObjectsApi, text: str) -> dict[str, Any]:
    """Apply YAML text (the generated methods take dict bodies only)."""
    request = custom.api_client.param_serialize(
        "PATCH",
        "/apis/wgpolicyk8s.io/v1alpha2/namespaces/ml/policyreports/trainer",
        query_params=[("fieldManager", MANAGER)],
        header_params={"Content-Type": APPLY, "Accept": "application/json"},
        body=text,
        auth_settings=["BearerToken"],
    )
    response = custom.api_client.call_api(*request)
    response.read()
    assert response.status == 200, response.data
    return json.loads(response.data)


def error(exc: ApiException) -> dict[str, Any]:
    return json.loads(exc.body)


# ------------------------------------------------------------------ server-side apply


def test_apply_creates_then_an_identical_apply_changes_nothing(kube_api, custom) -> None:
    obj, code = apply(custom, report())
    assert code == 201  # as kube-apiserver: patch.go answers 201 when it created the object
    assert obj["summary"] == {"pass": 0, "fail": 1}
    assert (obj["metadata"]["namespace"], obj["metadata"]["generation"]) == ("ml", 1)
    [entry] = obj["metadata"]["managedFields"]
    assert {k: entry[k] for k in ("manager", "operation", "apiVersion", "fieldsType")} == {
        "manager": MANAGER,
        "operation": "Apply",
        "apiVersion": f"{GROUP}/{VERSION}",
        "fieldsType": "FieldsV1",
    }
    assert entry["fieldsV1"] == {
        "f:metadata": {"f:labels": {"f:app": {}}},
        "f:results": {},  # a list is owned whole
        "f:summary": {"f:fail": {}, "f:pass": {}},
    }
    [request] = kube_api.requests_to("PATCH")
    assert request.content_type == APPLY
    assert request.query == {"fieldManager": [MANAGER], "force": ["true"]}
    assert request.body == report()

    assert apply(custom, report()) == (obj, 200)  # the same resourceVersion and entry time


def test_apply_as_yaml_text_updates_and_drops_what_it_no_longer_applies(kube_api, custom) -> None:
    first, _ = apply(custom, report(team="ml"))
    changed = report()
    del changed["summary"]["pass"]
    changed["results"][0]["result"] = "pass"
    second = apply_yaml(custom, yaml.safe_dump(changed))
    assert second["metadata"]["labels"] == {"app": "gpu-admission"}  # "team" dropped
    assert second["summary"] == {"fail": 1}
    assert second["results"] == changed["results"]
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    assert second["metadata"]["generation"] == 2
    assert kube_api.get("/apis/wgpolicyk8s.io/v1alpha2/namespaces/ml/policyreports/trainer") == (
        second
    )
    assert kube_api.requests_to("PATCH")[-1].body == changed  # the YAML, parsed


def test_fields_of_other_managers_are_kept_or_conflict(custom) -> None:
    apply(custom, report())
    other = {**report(), "summary": {"skip": 2}}
    other["metadata"] = {"name": "trainer", "labels": {"owner": "ops"}}
    del other["results"]
    apply(custom, other, field_manager="ops")
    # gpu-admission no longer applies its labels; "owner" is not its to remove.
    mine = report()
    del mine["metadata"]["labels"]
    obj, _ = apply(custom, mine)
    assert obj["metadata"]["labels"] == {"owner": "ops"}
    assert obj["summary"] == {"pass": 0, "fail": 1, "skip": 2}
    assert [e["manager"] for e in obj["metadata"]["managedFields"]] == [MANAGER, "ops"]

    # A different value for a field another manager owns: 409 unless forced.
    mine["summary"]["skip"] = 3
    with pytest.raises(ApiException) as caught:
        apply(custom, mine, force=None)
    assert caught.value.status == 409
    assert error(caught.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Apply failed with 1 conflict: conflict with "ops": .summary.skip',
        "reason": "Conflict",
        "details": {
            "causes": [
                {
                    "reason": "FieldManagerConflict",
                    "message": 'conflict with "ops"',
                    "field": ".summary.skip",
                }
            ]
        },
        "code": 409,
    }
    forced, _ = apply(custom, mine)
    assert forced["summary"]["skip"] == 3
    ops = [e for e in forced["metadata"]["managedFields"] if e["manager"] == "ops"]
    assert ops[0]["fieldsV1"] == {"f:metadata": {"f:labels": {"f:owner": {}}}}


def test_apply_refuses_what_the_real_server_refuses(custom) -> None:
    def refused(body: Any, name: str = "trainer", **options: Any) -> tuple[int, dict]:
        with pytest.raises(ApiException) as caught:
            apply(custom, body, name, **options)
        return caught.value.status, error(caught.value)

    code, body = refused(report(), field_manager=None)
    assert (code, body["reason"]) == (422, "Invalid")
    assert body["message"] == (
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required '
        "for apply patch"
    )
    assert body["details"] == {
        "group": "meta.k8s.io",
        "kind": "PatchOptions",
        "causes": [
            {
                "reason": "FieldValueRequired",
                "message": "Required value: is required for apply patch",
                "field": "fieldManager",
            }
        ],
    }
    wrong_version = {**report(), "apiVersion": f"{GROUP}/v1beta1"}
    assert refused(wrong_version)[1]["message"] == (
        "invalid object type: wgpolicyk8s.io/v1beta1, Kind=PolicyReport"
    )
    wrong_kind = {**report(), "kind": "ClusterPolicyReport"}
    assert refused(wrong_kind)[1]["message"] == (
        "invalid object type: wgpolicyk8s.io/v1alpha2, Kind=ClusterPolicyReport"
    )
    assert refused(report(name="other"))[1]["message"] == (
        "the name of the object (other) does not match the name on the URL (trainer)"
    )
    assert refused(report(namespace="default"))[0] == 400
    # Forgetting the apply content type sends a merge patch, and force is then refused.
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, "ml", "policyreports", "trainer", report(), force=True
        )
    assert (caught.value.status, error(caught.value)["message"]) == (
        422,
        'PatchOptions.meta.k8s.io "" is invalid: force: Forbidden: may not be specified for '
        "non-apply patch",
    )


def test_apply_of_a_cluster_scoped_report(custom) -> None:
    body = report("cluster", namespace=None)
    options = {"field_manager": MANAGER, "force": True, "_content_type": APPLY}
    call = custom.patch_cluster_custom_object
    # Without _preload_content=False, the client has no body for the 201 of a creation.
    assert call(GROUP, VERSION, "clusterpolicyreports", "cluster", body, **options) is None
    updated = call(GROUP, VERSION, "clusterpolicyreports", "cluster", body, **options)
    assert "namespace" not in updated["metadata"]
    assert updated["metadata"]["managedFields"][0]["manager"] == MANAGER


# ------------------------------------------------------------------ lists and delete


def test_list_by_label_across_namespaces_in_pages_and_delete(kube_api, custom) -> None:
    for namespace in ("a", "b", "c"):
        for name in ("one", "two"):
            kube_api.add({**report(name, namespace, pool="gpu"), "kind": "PolicyReport"})
    kube_api.add(report("other", "a", pool="cpu"))
    kube_api.add(report("cluster", None, pool="gpu"), plural="clusterpolicyreports")

    listed, token, pages = [], None, 0
    while True:
        page = custom.list_cluster_custom_object(
            GROUP, VERSION, "policyreports", label_selector="pool=gpu", limit=4, _continue=token
        )
        pages += 1
        assert page["kind"] == "PolicyReportList"
        listed += [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in page["items"]]
        token = page["metadata"].get("continue")
        if not token:
            break
    assert pages == 2
    assert listed == [(ns, n) for ns in ("a", "b", "c") for n in ("one", "two")]
    cluster = custom.list_cluster_custom_object(
        GROUP, VERSION, "clusterpolicyreports", label_selector="pool in (gpu)"
    )
    assert [o["metadata"]["name"] for o in cluster["items"]] == ["cluster"]

    uid = kube_api.get("/apis/wgpolicyk8s.io/v1alpha2/namespaces/b/policyreports/one")
    deleted = custom.delete_namespaced_custom_object(GROUP, VERSION, "b", "policyreports", "one")
    assert deleted == {  # the generic registry's answer for a custom resource
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {
            "name": "one",
            "group": GROUP,
            "kind": "policyreports",
            "uid": uid["metadata"]["uid"],
        },
    }
    custom.delete_cluster_custom_object(GROUP, VERSION, "clusterpolicyreports", "cluster")
    with pytest.raises(ApiException) as caught:
        custom.delete_namespaced_custom_object(GROUP, VERSION, "b", "policyreports", "one")
    assert caught.value.status == 404
    assert error(caught.value)["message"] == 'policyreports.wgpolicyk8s.io "one" not found'
    remaining = custom.list_namespaced_custom_object(GROUP, VERSION, "b", "policyreports")
    assert [o["metadata"]["name"] for o in remaining["items"]] == ["two"]
    cluster = custom.list_cluster_custom_object(GROUP, VERSION, "clusterpolicyreports")
    assert cluster["items"] == []


# ------------------------------------------------------------------ CRD not installed


def unserved_calls(custom: k8s.CustomObjectsApi) -> dict[str, Any]:
    group, version, plural = "openreports.io", "v1alpha1", "reports"
    body = {"apiVersion": f"{group}/{version}", "kind": "Report", "metadata": {"name": "r"}}
    return {
        "apply": lambda: custom.patch_namespaced_custom_object(
            group,
            version,
            "ml",
            plural,
            "r",
            body,
            field_manager=MANAGER,
            force=True,
            _content_type=APPLY,
        ),  # fmt: skip
        "list": lambda: custom.list_cluster_custom_object(group, version, plural),
        "list in a namespace": lambda: custom.list_namespaced_custom_object(
            group, version, "ml", plural
        ),
        "get": lambda: custom.get_namespaced_custom_object(group, version, "ml", plural, "r"),
        "create": lambda: custom.create_namespaced_custom_object(
            group, version, "ml", plural, body
        ),
        "delete": lambda: custom.delete_namespaced_custom_object(group, version, "ml", plural, "r"),
    }


def test_a_crd_that_is_not_installed_answers_as_released_api_servers_do(custom) -> None:
    for what, call in unserved_calls(custom).items():
        with pytest.raises(ApiException) as caught:
            call()
        exc = caught.value
        assert (exc.status, exc.reason, exc.body) == (404, "Not Found", NOT_FOUND_TEXT), what
        assert exc.headers["Content-Type"] == "text/plain; charset=utf-8", what


def test_a_crd_that_is_not_installed_answers_a_status_after_kubernetes_138219() -> None:
    with FakeKubeAPI(json_not_found=True) as api, api.api_client() as api_client:
        for what, call in unserved_calls(k8s.CustomObjectsApi(api_client)).items():
            with pytest.raises(ApiException) as caught:
                call()
            assert caught.value.status == 404, what
            assert error(caught.value) == {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "the server could not find the requested resource",
                "reason": "NotFound",
                "code": 404,
            }, what


def test_an_unknown_resource_of_a_built_in_group_is_a_status_with_empty_details(
    kube_api_client,
) -> None:
    with pytest.raises(ApiException) as caught:
        k8s.CustomObjectsApi(kube_api_client).list_cluster_custom_object("apps", "v1", "widgets")
    assert caught.value.status == 404
    assert error(caught.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "the server could not find the requested resource",
        "reason": "NotFound",
        "details": {},
        "code": 404,
    }


# ------------------------------------------------------------------ watches


def watch_events(kube_api_client: Any, **query: Any) -> list[dict[str, Any]]:
    """Every event of one watch of Nodes, read as the client reads a chunked stream, until
    the stream ends (``timeout_seconds`` keeps that short)."""
    response = k8s.CoreV1Api(kube_api_client).list_node(watch=True, _preload_content=False, **query)
    try:
        assert response.status == 200
        assert response.headers["Transfer-Encoding"] == "chunked"
        data = b"".join(response.stream(decode_content=False))
    finally:
        response.release_conn()
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def a_node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def test_a_watch_streams_each_change_after_its_resource_version_in_order(
    kube_api: FakeKubeAPI, kube_api_client: Any
) -> None:
    first = kube_api.add(a_node("a", pool="h100"))
    since = first["metadata"]["resourceVersion"]
    kube_api.add(a_node("b"))
    kube_api.replace({**a_node("a", pool="l4")})
    kube_api.remove("/api/v1/nodes/b")
    events = watch_events(kube_api_client, resource_version=since, timeout_seconds=1)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(since)
    # Objects in events carry apiVersion and kind, built-in ones too (unlike list items).
    assert {(e["object"]["apiVersion"], e["object"]["kind"]) for e in events} == {("v1", "Node")}
    # From 0: every object, as ADDED, then the changes that follow.
    assert [
        (e["type"], e["object"]["metadata"]["name"])
        for e in watch_events(kube_api_client, resource_version="0", timeout_seconds=1)
    ] == [("ADDED", "a")]


def test_a_watch_sends_bookmarks_and_filters_by_label(
    kube_api: FakeKubeAPI, kube_api_client: Any
) -> None:
    kube_api.bookmark_seconds = 0.2
    since = kube_api.add(a_node("a", pool="h100"))["metadata"]["resourceVersion"]
    kube_api.add(a_node("b", pool="l4"))
    events = watch_events(
        kube_api_client,
        resource_version=since,
        allow_watch_bookmarks=True,
        label_selector="pool=l4",
        timeout_seconds=1,
    )
    assert (events[0]["type"], events[0]["object"]["metadata"]["name"]) == ("ADDED", "b")
    bookmarks = events[1:]
    assert bookmarks and {e["type"] for e in bookmarks} == {"BOOKMARK"}
    assert bookmarks[0]["object"] == {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": events[0]["object"]["metadata"]["resourceVersion"]},
    }
    # Without asking for them, none.
    assert [
        e["type"] for e in watch_events(kube_api_client, resource_version=since, timeout_seconds=1)
    ] == ["ADDED"]


def test_a_watch_from_a_compacted_resource_version_is_one_410_expired_event(
    kube_api: FakeKubeAPI, kube_api_client: Any
) -> None:
    since = kube_api.add(a_node("a"))["metadata"]["resourceVersion"]
    kube_api.add(a_node("b"))
    kube_api.compact()
    [event] = watch_events(kube_api_client, resource_version=since, timeout_seconds=5)
    assert event["type"] == "ERROR"
    assert event["object"]["kind"] == "Status"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
    assert event["object"]["message"].startswith(f"too old resource version: {since} (")


def test_closing_the_watches_ends_the_stream_at_once(
    kube_api: FakeKubeAPI, kube_api_client: Any
) -> None:
    since = kube_api.add(a_node("a"))["metadata"]["resourceVersion"]
    threading.Timer(0.3, kube_api.close_watches).start()
    started = time.monotonic()
    assert watch_events(kube_api_client, resource_version=since, timeout_seconds=30) == []
    assert time.monotonic() - started < 5


# ------------------------------------------------------------------ Dynamic Resource Allocation


def a_claim_template(namespace: str, name: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def test_dra_objects_are_built_in_listed_in_pages_and_watched(
    kube_api: FakeKubeAPI, kube_api_client: Any
) -> None:
    """resource.k8s.io/v1 (Kubernetes 1.34): the client's ResourceV1Api reads the lists into
    its models; the items carry no apiVersion and kind, the events do."""
    kube_api.add(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
        }
    )
    for namespace, name in [("ml", "a"), ("ml", "b"), ("vision", "c")]:
        kube_api.add(a_claim_template(namespace, name))
    resources = k8s.ResourceV1Api(kube_api_client)
    [device_class] = resources.list_device_class().items
    assert device_class.spec.selectors[0].cel.expression == "device.driver == 'gpu.nvidia.com'"
    first = resources.list_resource_claim_template_for_all_namespaces(limit=2)
    assert [t.metadata.name for t in first.items] == ["a", "b"]
    assert first.metadata.remaining_item_count == 1
    rest = resources.list_resource_claim_template_for_all_namespaces(
        limit=2, _continue=first.metadata._continue
    )
    assert [t.metadata.name for t in rest.items] == ["c"] and not rest.metadata._continue
    assert rest.items[0].spec.spec.devices.requests[0].exactly.device_class_name == (
        "gpu.nvidia.com"
    )
    raw = json.loads(
        resources.list_namespaced_resource_claim_template("vision", _preload_content=False).data
    )
    assert raw["kind"] == "ResourceClaimTemplateList" and raw["metadata"]["resourceVersion"]
    assert [set(item) for item in raw["items"]] == [{"metadata", "spec"}]
    since = raw["metadata"]["resourceVersion"]
    kube_api.remove("/apis/resource.k8s.io/v1/namespaces/ml/resourceclaimtemplates/a")
    response = resources.list_resource_claim_template_for_all_namespaces(
        watch=True, resource_version=since, timeout_seconds=1, _preload_content=False
    )
    [event] = [json.loads(line) for line in response.data.splitlines() if line.strip()]
    assert event["type"] == "DELETED"
    assert (event["object"]["apiVersion"], event["object"]["kind"]) == (
        "resource.k8s.io/v1",
        "ResourceClaimTemplate",
    )


def test_a_group_version_not_served_answers_as_one_not_installed(
    kube_api: FakeKubeAPI, kube_api_client: Any
) -> None:
    """``set_served``: resource.k8s.io/v1 before Kubernetes 1.34. Its lists and watches
    answer the 404 of a path nothing serves; its objects are there once it is served."""
    kube_api.add(a_claim_template("ml", "a"))
    kube_api.set_served("resource.k8s.io", "v1", False)
    resources = k8s.ResourceV1Api(kube_api_client)
    calls = {
        "list": lambda: resources.list_device_class(),
        "list all": lambda: resources.list_resource_claim_template_for_all_namespaces(),
        "watch": lambda: resources.list_resource_claim_template_for_all_namespaces(
            watch=True, _preload_content=False
        ),
        "read": lambda: resources.read_namespaced_resource_claim_template("a", "ml"),
    }
    for what, call in calls.items():
        with pytest.raises(ApiException) as caught:
            call()
        exc = caught.value
        assert (exc.status, exc.reason, exc.body) == (404, "Not Found", NOT_FOUND_TEXT), what
    assert k8s.CoreV1Api(kube_api_client).list_node().items == []  # others are served
    kube_api.set_served("resource.k8s.io", "v1", True)
    [template] = resources.list_resource_claim_template_for_all_namespaces().items
    assert template.metadata.name == "a"
