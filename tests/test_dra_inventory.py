"""What the node inventory keeps of the DRA objects (``webhook.core.dra_inventory``) and how it
travels from its process to the worker (``webhook.server.node_feed``): DeviceClasses and
ResourceClaimTemplates of the DRA corpus (../shared/conformance/dra) pruned to what the DRA
checks read, the drivers a class's CEL selectors pin, and the JSON records of the feed."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kubeapi import FakeKubeAPI
from tests.serving import wait_until
from tests.support.paths import SHARED
from tests.test_inventory import SEEN_WITHIN, gpu_node, running_inventory
from webhook import parse_policy
from webhook.cluster.watching import CacheState
from webhook.core.dra_inventory import (
    NO_DRA_OBJECTS,
    DeviceClassRecord,
    DraObjects,
    claim_template_record,
    device_class_record,
    pinned_drivers,
)
from webhook.core.inventory import NodeFields, NodeSnapshot
from webhook.server.dra_feed import (
    DRA_OPTIONS,
    STALE_SECONDS,
    SharedTemplates,
    claim_template_from_json,
    claim_template_json,
    device_class_from_json,
    device_class_json,
    dra_known,
    template_json,
)
from webhook.server.inventory import INVENTORY_LOGGER

DRA_CORPUS = SHARED / "conformance" / "dra"
requires_dra_corpus = pytest.mark.skipif(
    not DRA_CORPUS.is_dir() and not os.environ.get("CI"),
    reason=f"the DRA conformance corpus is not at {DRA_CORPUS}",
)
GPU_CONFIG = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
}


def corpus_objects(name: str, kind: str) -> list[dict[str, Any]]:
    """The objects of a kind in one file of the DRA corpus."""
    documents = yaml.safe_load_all((DRA_CORPUS / name).read_text(encoding="utf-8"))
    return [d for d in documents if isinstance(d, dict) and d.get("kind") == kind]


def device_class(name: str, *expressions: str, **spec: Any) -> dict[str, Any]:
    selectors = [{"cel": {"expression": e}} for e in expressions]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "uid": "1", "resourceVersion": "7", "generation": 2},
        "spec": {"selectors": selectors, **spec},
    }


# ------------------------------------------------------------------ DeviceClasses


@requires_dra_corpus
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "nvidia-gpu-operator__golden-deviceclass-gpu-nvidia-com.yaml",
            DeviceClassRecord("gpu.nvidia.com", None, ("gpu.nvidia.com",), ()),
        ),
        (
            "dra-driver-nvidia-gpu__extended-resources-mig-1g-12gb.yaml",
            DeviceClassRecord(
                "mig-1g-12gb.gpu.nvidia.com", "nvidia.com/mig-1g.12gb", ("gpu.nvidia.com",), ()
            ),
        ),
        (
            "k8s-website__dra-deviceclass-v1beta2.yaml",
            DeviceClassRecord("example-device-class", None, ("driver.example.com",), ()),
        ),
    ],
    ids=["gpu-operator", "extended-resource", "website"],
)
def test_the_corpus_device_classes_are_kept_as_the_checks_read_them(
    source: str, expected: DeviceClassRecord
) -> None:
    [obj] = corpus_objects(source, "DeviceClass")
    assert device_class_record(obj) == expected


@pytest.mark.parametrize(
    ("expression", "drivers"),
    [
        ('device.driver == "gpu.nvidia.com"', ("gpu.nvidia.com",)),
        ("device.driver=='gpu.nvidia.com'", ("gpu.nvidia.com",)),
        ("'gpu.nvidia.com' == device.driver", ("gpu.nvidia.com",)),
        (
            "device.attributes['gpu.nvidia.com'].type == 'mig' &&\n  device.driver == 'a' "
            "&& device.driver == 'b' && device.driver == 'a'",
            ("a", "b"),
        ),
        # A && inside a string, a comment or brackets is no conjunction's.
        ('device.attributes["x && y"].z == "w" && device.driver == "q"', ("q",)),
        ('device.driver == "a" && (device.x || device.y)', ("a",)),
        ('device.?x.hasValue() && device.driver == "o"', ("o",)),
        ('true // a comment: && device.driver == "evil"', ()),
        ('true // "\n&& device.driver == "x"', ("x",)),
        ('"""x" && device.driver == "evil" && "y""" == "z"', ()),
        # Anything else pins nothing.
        ('device.driver == "a" || device.driver == "b"', ()),
        ('device.driver == "a" ? true : false', ()),
        ('(device.driver == "a")', ()),
        ('!(device.driver == "a")', ()),
        ('device.driver in ["a"]', ()),
        ('device.driver == "a\\x2e"', ()),
        ('device.driver == r"a\\" && true', ()),
        ('device.driver == b"a"', ()),
        ('device.driver.startsWith("gpu")', ()),
        ("", ()),
    ],
)
def test_the_drivers_a_selector_pins(expression: str, drivers: tuple[str, ...]) -> None:
    assert pinned_drivers(expression) == drivers


def test_only_what_the_checks_read_is_kept_of_a_device_class() -> None:
    """A class's NVIDIA GPU config entries (only their opaque driver and parameters), the
    drivers of every selector (all must match), its extended resource; nothing else of it,
    and nothing of a malformed part."""
    obj = device_class(
        "gpu.nvidia.com",
        "device.driver == 'gpu.nvidia.com'",
        "device.attributes['gpu.nvidia.com'].type == 'gpu'",
        "device.driver == 'other.example.com'",
        extendedResourceName="nvidia.com/gpu",
        config=[
            {"opaque": {"driver": "gpu.nvidia.com", "parameters": GPU_CONFIG, "extra": 1}},
            {"opaque": {"driver": "gpu.example.com", "parameters": {"kind": "GpuConfig"}}},
            "not an entry",
            {"opaque": None},
        ],
    )
    obj["status"] = {"anything": "else"}
    record = device_class_record(obj)
    assert record == DeviceClassRecord(
        "gpu.nvidia.com",
        "nvidia.com/gpu",
        ("gpu.nvidia.com", "other.example.com"),
        ({"opaque": {"driver": "gpu.nvidia.com", "parameters": GPU_CONFIG}},),
    )
    [entry] = record.config
    assert set(entry) == {"opaque"} and set(entry["opaque"]) == {"driver", "parameters"}
    malformed = {"metadata": {"name": "m"}, "spec": {"selectors": "x", "config": {"a": 1}}}
    assert device_class_record(malformed) == DeviceClassRecord("m", None, (), ())
    assert device_class_record({}) == DeviceClassRecord("", None, (), ())
    odd = device_class("x", extendedResourceName=7, selectors=[{"cel": {"expression": 1}}])
    assert device_class_record(odd) == DeviceClassRecord("x", None, (), ())


# ------------------------------------------------------------------ claim templates


@requires_dra_corpus
def test_the_corpus_claim_templates_keep_their_requests_and_config_only() -> None:
    [sharing] = corpus_objects(
        "dra-driver-nvidia-gpu__quickstart-v1-gpu-test5-timeslicing-mps.yaml",
        "ResourceClaimTemplate",
    )
    kept = claim_template_record(sharing)
    assert set(kept) == {"requests", "config"}
    devices = sharing["spec"]["spec"]["devices"]
    assert kept == {"requests": devices["requests"], "config": devices["config"]}
    assert [c["opaque"]["parameters"]["sharing"]["strategy"] for c in kept["config"]] == [
        "TimeSlicing",
        "MPS",
    ]
    [mig] = corpus_objects(
        "dra-driver-nvidia-gpu__quickstart-v1-gpu-test4-mig.yaml", "ResourceClaimTemplate"
    )
    kept = claim_template_record(mig)
    assert set(kept) == {"requests"}  # no config; its constraints are not read
    assert [r["name"] for r in kept["requests"]] == [
        "mig-1g-5gb-0",
        "mig-1g-5gb-1",
        "mig-2g-10gb",
        "mig-3g-20gb",
    ]


def test_a_claim_template_keeps_only_lists_of_requests_and_config() -> None:
    obj = {"spec": {"spec": {"devices": {"requests": {"not": "a list"}, "config": []}}}}
    assert claim_template_record(obj) == {"config": []}
    assert claim_template_record({"spec": "x"}) == {}


# ------------------------------------------------------------------ the feed's records


def test_records_travel_from_the_process_to_the_worker_as_they_were_kept() -> None:
    obj = device_class(
        "gpu.nvidia.com",
        "device.driver == 'gpu.nvidia.com'",
        extendedResourceName="nvidia.com/gpu",
        config=[{"opaque": {"driver": "gpu.nvidia.com", "parameters": GPU_CONFIG}}],
    )
    record = device_class_record(obj)
    line = json.dumps(device_class_json(record))
    assert device_class_from_json(json.loads(line)) == record
    shared = SharedTemplates()
    template = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
    sent = json.loads(json.dumps(["ml", "one-gpu", template]))
    assert claim_template_from_json(sent, shared) == (("ml", "one-gpu"), template)
    # Not of the protocol's shape: left out, never a failure.
    for garbled in (None, "x", ["n"], ["n", None, "d", []], ["n", None, [], [{"no": "opaque"}]]):
        assert device_class_from_json(garbled) is None
    for garbled in (None, ["ml", "t"], ["ml", "t", []]):
        assert claim_template_from_json(garbled, shared) is None
    odd = ["ml", "t", {"requests": 1, "constraints": []}]
    assert claim_template_from_json(odd, shared) == (("ml", "t"), {})


def sent(obj: dict[str, Any]) -> list[Any]:
    """A template's record as the process sends it, as the worker reads it."""
    metadata = obj["metadata"]
    record = [metadata["namespace"], metadata["name"], template_json(claim_template_json(obj))]
    return json.loads(json.dumps(record))


def test_templates_that_differ_in_their_names_only_are_kept_once_by_the_worker() -> None:
    """One chart's template in many namespaces: one copy of what is kept; a template with
    other content is its own; past the limit, it starts over."""
    shared = SharedTemplates(limit=2)

    def kept(obj: dict[str, Any]) -> Any:
        read = claim_template_from_json(sent(obj), shared)
        assert read is not None
        return read[1]

    first = [kept(claim_template(namespace, "job")) for namespace in ("a", "b", "c")]
    assert first[0] is first[1] is first[2]
    assert first[0] == claim_template_record(claim_template("a", "job"))
    other = kept(claim_template("a", "job", strategy="MPS"))
    assert other is not first[0] and other != first[0]
    third = kept(claim_template("a", "x", strategy="Other"))  # a third: it starts over
    assert kept(claim_template("e", "job")) is not first[0]
    assert kept(claim_template("f", "x", strategy="Other")) == third


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def deep_template(namespace: str, name: str) -> dict[str, Any]:
    """A template whose parameters nest 300 levels deep: within what the API server stores
    (10 KiB of opaque parameters), past what orjson writes (254)."""
    template = claim_template(namespace, name)
    template["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["x"] = nested(300)
    return template


def test_a_template_the_worker_could_not_read_is_never_sent() -> None:
    """Free-form parameters: an integer past 64 bits travels as a float, a template nested
    deeper than the worker's JSON reader goes travels as null (as not cached), and a class's
    config entry that deep is left out."""
    huge = claim_template("ml", "huge")
    parameters = huge["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    parameters["big"] = [2**70, -(2**64), 10**400]
    [config] = sent(huge)[2]["config"]
    assert config["opaque"]["parameters"]["big"] == [float(2**70), float(-(2**64)), None]
    deep = deep_template("ml", "deep")
    assert claim_template_json(deep) is None
    assert sent(deep) == ["ml", "deep", None]
    assert claim_template_from_json(sent(deep), SharedTemplates()) == (("ml", "deep"), None)
    too_deep = {"driver": "gpu.nvidia.com", "parameters": {"x": nested(300)}}
    record = device_class_record(gpu_class(config=[{"opaque": too_deep}]))
    assert device_class_json(record)[3] == []
    ordinary = device_class_record(
        gpu_class(config=[{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"n": 2**64}}}])
    )
    assert device_class_json(ordinary)[3] == [
        {"opaque": {"driver": "gpu.nvidia.com", "parameters": {"n": float(2**64)}}}
    ]


def test_a_dra_kind_is_known_once_listed_or_not_served_and_while_heard_from() -> None:
    def state(listed: bool, heard_at: float | None, served: bool = True) -> CacheState[Any]:
        return CacheState({}, "5", listed, heard_at, 0, None, served)

    now = 1000.0
    assert dra_known(state(True, now - 1), now)
    assert not dra_known(state(False, None), now)  # refused or failing before its first list
    assert not dra_known(state(True, now - STALE_SECONDS - 1), now)  # its watch silent
    assert dra_known(state(True, now - 250, served=False), now)  # asked again every 300 s


def test_the_snapshot_finds_dra_objects_only_where_they_are_known() -> None:
    record = DeviceClassRecord("gpu.nvidia.com", None, ("gpu.nvidia.com",), ())
    template = {"requests": []}
    nodes = NodeSnapshot({}, NodeFields(frozenset(), ("nvidia.com",)))
    assert not nodes.knows_device_classes and not nodes.knows_claim_templates
    assert nodes.device_class("gpu.nvidia.com") is None
    known = DraObjects({"gpu.nvidia.com": record}, {("ml", "t"): template}, True, True)
    snapshot = nodes.with_dra(known)
    assert snapshot.device_class("gpu.nvidia.com") is record
    assert snapshot.device_class("gpu.nvidia.con") is None
    assert snapshot.claim_template("ml", "t") is template
    assert snapshot.claim_template("other", "t") is None
    assert snapshot.nodes is nodes.nodes and snapshot.fields is nodes.fields
    unknown = DraObjects({"gpu.nvidia.com": record}, {("ml", "t"): template}, False, False)
    assert snapshot.with_dra(unknown).device_class("gpu.nvidia.com") is None
    assert snapshot.with_dra(unknown).claim_template("ml", "t") is None
    assert snapshot.with_dra(NO_DRA_OBJECTS).dra is NO_DRA_OBJECTS


# ------------------------------------------------------------------ the inventory, end to end

DRA = "/apis/resource.k8s.io/v1"
PLAIN_POLICY = (
    "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
    "metadata: {name: plain}\nspec:\n  vendorDomains: [nvidia.com]\n"
)
MIG_CLASS = device_class(
    "mig.nvidia.com",
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
)


def claim_template(namespace: str, name: str, strategy: str = "TimeSlicing") -> dict[str, Any]:
    """A template as NVIDIA's quickstarts write one (gpu-test5), with what is not kept."""
    sharing: dict[str, Any] = {"strategy": strategy}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "demo"}},
        "spec": {
            "metadata": {"labels": {"claim": "yes"}},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                    "config": [
                        {
                            "requests": ["gpu"],
                            "opaque": {
                                "driver": "gpu.nvidia.com",
                                "parameters": {**GPU_CONFIG, "sharing": sharing},
                            },
                        }
                    ],
                    "constraints": [{"requests": [], "matchAttribute": "gpu.nvidia.com/uuid"}],
                }
            },
        },
    }


def gpu_class(**spec: Any) -> dict[str, Any]:
    return device_class(
        "gpu.nvidia.com",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        **spec,
    )


def dra_lists(api: FakeKubeAPI, plural: str) -> list[Any]:
    return [r for r in api.requests_to("GET", f"{DRA}/{plural}") if "watch" not in r.query]


def known_snapshot(inventory: Any) -> NodeSnapshot | None:
    """The snapshot, once both DRA kinds are known."""
    snapshot = inventory.snapshot()
    if snapshot is None or not (snapshot.knows_device_classes and snapshot.knows_claim_templates):
        return None
    return snapshot


@pytest.fixture
def inventory_api(
    kube_api: FakeKubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> FakeKubeAPI:
    """The fake API server as the inventory's cluster (its process finds it by KUBECONFIG),
    with one GPU node."""
    kube_api.bookmark_seconds = 0.2
    monkeypatch.setenv("KUBECONFIG", str(kube_api.write_kubeconfig(tmp_path / "kubeconfig")))
    kube_api.add(gpu_node("gpu-0"))
    return kube_api


def test_classes_and_templates_are_listed_in_pages_then_watched(inventory_api: FakeKubeAPI) -> None:
    """Every class and template reaches the snapshot, pruned (a template's requests and
    config only); then added, changed and deleted ones within 2 s."""
    api = inventory_api
    api.add_all([gpu_class(), MIG_CLASS])
    namespaces = [f"team-{index}" for index in range(7)]
    page = DRA_OPTIONS.page_size
    for index in range(2 * page + 50):  # three pages
        api.add(claim_template(namespaces[index % 7], f"job-{index}"))
    with running_inventory(parse_policy(PLAIN_POLICY)) as inventory:
        snapshot = wait_until(lambda: known_snapshot(inventory), timeout=20, what="DRA listed")
        assert snapshot.device_class("gpu.nvidia.com") == DeviceClassRecord(
            "gpu.nvidia.com", None, ("gpu.nvidia.com",), ()
        )
        assert len(snapshot.dra.claim_templates) == 2 * page + 50
        kept = snapshot.claim_template("team-3", "job-3")
        devices = claim_template("team-3", "job-3")["spec"]["spec"]["devices"]
        assert kept == {"requests": devices["requests"], "config": devices["config"]}
        assert set(kept) == {"requests", "config"}  # no metadata, no constraints
        assert snapshot.claim_template("team-4", "job-3") is None
        pages = dra_lists(api, "resourceclaimtemplates")
        assert [p.query["limit"] for p in pages] == [[str(page)]] * 3
        assert [bool(p.query.get("continue")) for p in pages] == [False, True, True]
        assert len(dra_lists(api, "deviceclasses")) == 1

        api.add(deep_template("vision", "deep"))  # never sent (as not cached), seen before:
        api.add(claim_template("vision", "serve", strategy="MPS"))
        api.replace(gpu_class(extendedResourceName="nvidia.com/gpu"))
        api.remove(f"{DRA}/deviceclasses/mig.nvidia.com")
        api.remove(f"{DRA}/namespaces/team-0/resourceclaimtemplates/job-0")

        def changed() -> bool:
            now = inventory.snapshot()
            record = now.device_class("gpu.nvidia.com")
            template = now.claim_template("vision", "serve")
            return (
                record.extended_resource_name == "nvidia.com/gpu"
                and now.device_class("mig.nvidia.com") is None
                and now.claim_template("team-0", "job-0") is None
                and template is not None
                and template["config"][0]["opaque"]["parameters"]["sharing"]["strategy"] == "MPS"
            )

        wait_until(changed, timeout=SEEN_WITHIN, what="the added, changed and deleted objects")
        assert inventory.snapshot().nodes is snapshot.nodes  # no Node changed: not copied
        assert inventory.snapshot().claim_template("vision", "deep") is None
        assert inventory.figures()[2] == 0  # nothing started again
    assert len(dra_lists(api, "resourceclaimtemplates")) == 3  # watched since, never listed


def test_a_watch_from_a_compacted_resource_version_lists_the_dra_objects_again(
    inventory_api: FakeKubeAPI,
) -> None:
    api = inventory_api
    api.add_all([gpu_class(), MIG_CLASS, claim_template("ml", "one")])
    with running_inventory(parse_policy(PLAIN_POLICY)) as inventory:
        wait_until(lambda: known_snapshot(inventory), timeout=20, what="DRA listed")
        lists = len(dra_lists(api, "resourceclaimtemplates"))
        # While the watches are down (refused until the changes are compacted away), the
        # objects change.
        api.bookmark_seconds = 60  # no bookmark brings a watch's resourceVersion forward
        refused = len(api.requests_to("GET", f"{DRA}/*"))
        api.fail(f"{DRA}/*", 503, times=None)
        api.close_watches()
        wait_until(
            lambda: len(api.requests_to("GET", f"{DRA}/*")) >= refused + 2,
            timeout=10,
            what="the watches refused",
        )
        api.add(claim_template("ml", "two"))
        api.remove(f"{DRA}/namespaces/ml/resourceclaimtemplates/one")
        api.remove(f"{DRA}/deviceclasses/mig.nvidia.com")
        api.compact()
        api.clear_failures()
        wait_until(
            lambda: (
                (now := known_snapshot(inventory)) is not None
                and now.claim_template("ml", "two") is not None
                and now.claim_template("ml", "one") is None
                and now.device_class("mig.nvidia.com") is None
                and now.device_class("gpu.nvidia.com") is not None
            ),
            timeout=15,
            what="the changes, listed again",
        )
        assert len(dra_lists(api, "resourceclaimtemplates")) > lists


def test_a_cluster_that_does_not_serve_dra_has_none_of_its_objects(
    inventory_api: FakeKubeAPI,
) -> None:
    """Before Kubernetes 1.34 (or with resource.k8s.io/v1 switched off) the lists answer 404:
    both kinds are known and empty, with no error and no restart."""
    api = inventory_api
    api.add(gpu_class())
    api.set_served("resource.k8s.io", "v1", False)
    with running_inventory(parse_policy(PLAIN_POLICY)) as inventory:
        snapshot = wait_until(lambda: known_snapshot(inventory), timeout=20, what="known")
        assert snapshot.node("gpu-0") is not None
        assert snapshot.device_class("gpu.nvidia.com") is None
        assert len(snapshot.dra.device_classes) == len(snapshot.dra.claim_templates) == 0
        time.sleep(1)
        assert inventory.figures()[2] == 0
        assert inventory._serving[0].dra_error is None
    # One list each, no watch: listed again only after UNSERVED_RELIST_SECONDS.
    assert len(api.requests_to("GET", f"{DRA}/*")) == 2


def test_a_refused_dra_list_leaves_them_unknown_while_the_nodes_serve(
    inventory_api: FakeKubeAPI, caplog: pytest.LogCaptureFixture
) -> None:
    """RBAC not updated for DRA (403): decisions read no DRA object (as without an
    inventory: the DRA checks warn), the Nodes serve, the failure is logged once and its
    retries counted; allowed again, the DRA objects are listed."""
    caplog.set_level(logging.INFO, logger=INVENTORY_LOGGER)
    api = inventory_api
    api.add_all([gpu_class(), claim_template("ml", "one")])
    api.forbid(f"{DRA}/*")
    with running_inventory(parse_policy(PLAIN_POLICY)) as inventory:
        wait_until(
            lambda: len(api.requests_to("GET", f"{DRA}/*")) >= 4,
            timeout=10,
            what="the refused lists, tried again",
        )
        snapshot = inventory.snapshot()
        assert snapshot is not None and snapshot.node("gpu-0") is not None
        assert not snapshot.knows_device_classes and not snapshot.knows_claim_templates
        assert snapshot.device_class("gpu.nvidia.com") is None
        assert snapshot.claim_template("ml", "one") is None

        def warnings() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "DRA objects" in r.getMessage()]

        wait_until(warnings, timeout=5, what="the failure logged")
        wait_until(lambda: inventory.figures()[2] >= 4, timeout=10, what="more retries")
        # Logged as it starts (the first kind refused, then the other's first), not per retry.
        assert 1 <= len(warnings()) <= 2
        for warning in warnings():
            assert warning.levelno == logging.WARNING
            error = warning.fields["error"]  # type: ignore[attr-defined]
            assert error.startswith("watching ") and "HTTP 403" in error and "forbidden" in error
        api.clear_failures()
        snapshot = wait_until(lambda: known_snapshot(inventory), timeout=15, what="allowed")
        assert snapshot.claim_template("ml", "one") is not None
        wait_until(
            lambda: any("lists DRA objects again" in r.getMessage() for r in caplog.records),
            timeout=5,
            what="the recovery logged",
        )


def test_the_worker_keeps_what_its_process_sends_and_replaces_only_the_dra_part(
    tmp_path: Path,
) -> None:
    """The worker's side of the protocol, from a process that says what a feed would: DRA
    records before and after the Nodes are listed, one kind known and the other not,
    records not of the protocol's shape left out, a DRA change that leaves the Nodes as
    they were (not copied)."""
    from webhook.core.inventory import NodeInfo
    from webhook.server.inventory import NodeInventory
    from webhook.server.node_feed import node_record

    node = node_record(NodeInfo("gpu-0", {}, True, (), {}, {}))
    gpu = device_class_json(device_class_record(gpu_class()))
    template = {"requests": [{"name": "gpu"}]}

    def state(classes: bool, templates: bool, dra_error: str | None) -> dict[str, Any]:
        return {
            "state": {
                "listed": True,
                "heard_ago": 0,
                "restarts": 0,
                "last_error": None,
                "device_classes_known": classes,
                "claim_templates_known": templates,
                "dra_error": dra_error,
            }
        }

    refused = "watching ResourceClaimTemplates: HTTP 403: forbidden"
    first = [
        {"deviceClasses": [gpu, ["garbled"]]},
        {"claimTemplates": [["ml", "t", template], "garbled"]},
        {"put": [node]},
        state(True, False, refused),
    ]
    then = [
        {"deviceClassesGone": ["gpu.nvidia.com"]},
        {"claimTemplates": [["ml", "u", template]], "claimTemplatesGone": [["ml", "t"], "x"]},
        state(True, True, None),
    ]
    go = tmp_path / "go"
    script = (
        "import json, os, sys, time\n"
        "def send(lines):\n"
        "    for line in lines: sys.stdout.write(json.dumps(line) + '\\n')\n"
        "    sys.stdout.flush()\n"
        f"send({first!r})\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        f"send({then!r})\n"
        "sys.stdin.read()  # until the worker closes it\n"
    )
    inventory = NodeInventory(
        lambda: parse_policy(PLAIN_POLICY), command=(sys.executable, "-c", script)
    )
    running = inventory.start()
    try:
        before = wait_until(inventory.snapshot, timeout=10, what="the first list")
        assert before.node("gpu-0") is not None
        assert before.knows_device_classes and not before.knows_claim_templates
        assert before.device_class("gpu.nvidia.com") == device_class_record(gpu_class())
        assert before.claim_template("ml", "t") is None  # not known: nothing found
        assert inventory._serving[0].dra_error == refused
        go.touch()
        after = wait_until(
            lambda: known_snapshot(inventory), timeout=10, what="the templates known"
        )
        assert after.device_class("gpu.nvidia.com") is None
        assert after.claim_template("ml", "t") is None
        assert after.claim_template("ml", "u") == template
        assert after.nodes is before.nodes
        assert inventory._serving[0].dra_error is None
    finally:
        inventory.close()
        running.join(timeout=10)
