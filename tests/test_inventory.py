"""The opt-in node inventory in the real server (``serve --inventory``), against the fake API
server: Nodes listed and then watched by the worker, changes seen within 2 s, reviews answered
and readiness kept while the API server fails, and nothing asked of it without the option."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubeapi import FakeKubeAPI
from tests.serving import (
    Server,
    fixture_bytes,
    make_certificates,
    metric_value,
    post_json,
    wait_until,
)
from tests.test_server import tls_server

GPU_POD = fixture_bytes("admission-review-gpu-pod.json")
SEEN_WITHIN = 2.0


def gpu_node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
        "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}},
    }


def serve(tmp_path: Path, kube_api: FakeKubeAPI, *extra: str) -> Server:
    """The server over TLS (``tls_server``), its cluster the fake API server."""
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    pki = make_certificates(tmp_path / "pki")
    return tls_server(tmp_path, pki, extra_args=extra, env={"KUBECONFIG": str(kubeconfig)})


@pytest.fixture
def api(kube_api: FakeKubeAPI) -> FakeKubeAPI:
    kube_api.bookmark_seconds = 0.2
    return kube_api


@pytest.fixture
def server(tmp_path: Path, api: FakeKubeAPI) -> Iterator[Server]:
    for index in range(3):
        api.add(gpu_node(f"gpu-{index}"))
    with serve(tmp_path, api, "--inventory") as running:
        yield running


def nodes_known(server: Server) -> float:
    return metric_value(server.metrics(), "gpu_admission_inventory_nodes")


def test_nodes_are_listed_then_watched_by_the_worker(server: Server, api: FakeKubeAPI) -> None:
    wait_until(lambda: nodes_known(server) == 3, timeout=10, what="the first list")
    api.add(gpu_node("gpu-3"))
    wait_until(lambda: nodes_known(server) == 4, timeout=SEEN_WITHIN, what="a node added")
    api.remove("/api/v1/nodes/gpu-0")
    wait_until(lambda: nodes_known(server) == 3, timeout=SEEN_WITHIN, what="a node deleted")
    text = server.metrics()
    assert metric_value(text, "gpu_admission_inventory_age_seconds") < SEEN_WITHIN
    assert metric_value(text, "gpu_admission_inventory_watch_restarts_total") == 0
    lists = [r for r in api.requests_to("GET", "/api/v1/nodes") if "watch" not in r.query]
    assert len(lists) == 1 and lists[0].query["limit"] == ["50"]
    wait_until(
        lambda: "node inventory listed" in [r.get("message") for r in server.log_records()],
        timeout=SEEN_WITHIN,
        what="the first list logged",
    )


def test_while_the_api_server_fails_reviews_are_answered_and_the_age_grows(
    server: Server, api: FakeKubeAPI
) -> None:
    wait_until(lambda: nodes_known(server) == 3, timeout=10, what="the first list")
    api.fail("/api/v1/nodes", 503, times=None)
    api.close_watches()
    wait_until(
        lambda: metric_value(server.metrics(), "gpu_admission_inventory_age_seconds") > 1.5,
        timeout=10,
        what="the inventory growing old",
    )
    conn = server.connection()
    try:
        for _ in range(5):
            assert post_json(conn, "/validate", GPU_POD).status == 200
    finally:
        conn.close()
    assert server.get("/readyz").status == 200
    text = server.metrics()
    assert metric_value(text, "gpu_admission_inventory_watch_restarts_total") >= 1
    assert nodes_known(server) == 3  # the last snapshot stays
    wait_until(
        lambda: any(
            "cannot reach the API server" in r["message"]
            for r in server.log_records()
            if r.get("logger") == "webhook.inventory"
        ),
        timeout=SEEN_WITHIN,
        what="the failure logged",
    )

    api.clear_failures()
    api.add(gpu_node("gpu-9"))
    wait_until(lambda: nodes_known(server) == 4, timeout=10, what="the inventory current again")
    assert metric_value(server.metrics(), "gpu_admission_inventory_age_seconds") < SEEN_WITHIN


def test_without_the_option_nothing_is_asked_of_the_api_server(
    tmp_path: Path, api: FakeKubeAPI
) -> None:
    with serve(tmp_path, api) as server:
        conn = server.connection()
        try:
            assert post_json(conn, "/validate", GPU_POD).status == 200
        finally:
            conn.close()
        assert "gpu_admission_inventory" not in server.metrics()
    assert api.requests == []


def test_a_policy_that_changes_what_is_kept_lists_again_and_keeps_serving_meanwhile(
    api: FakeKubeAPI,
) -> None:
    """In one process: the inventory with a policy provider that switches policies."""
    from webhook import parse_policy
    from webhook.cluster.connection import Cluster
    from webhook.server.inventory import NodeInventory

    pooled = gpu_node("gpu-0")
    pooled["metadata"]["labels"]["example.com/pool"] = "training"
    api.add(pooled)
    plain = parse_policy(
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: plain}\nspec:\n  vendorDomains: [nvidia.com]\n"
    )
    pools = parse_policy(
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: pools}\nspec:\n  vendorDomains: [nvidia.com]\n  pools:\n"
        "    - name: training\n      nodeSelector: {example.com/pool: training}\n"
        "      resources: [{name: nvidia.com/gpu, sharing: Exclusive}]\n"
    )
    policies = [plain]
    client = api.api_client()
    inventory = NodeInventory(
        lambda: Cluster(api_client=client, namespace="default", timeout=5),
        lambda: policies[-1],
    )
    inventory.start()
    try:

        def labels() -> dict[str, str]:
            return dict(inventory.nodes()[("", "gpu-0")].labels)

        wait_until(lambda: inventory.nodes(), timeout=10, what="the first list")
        assert "example.com/pool" not in labels()
        restarts = [inventory.figures()[2]]
        policies.append(pools)
        wait_until(
            lambda: labels().get("example.com/pool") == "training",
            timeout=10,
            what="the Nodes listed again for the pool's label",
        )
        restarts.append(inventory.figures()[2])
        assert restarts[1] >= restarts[0] + 1  # the replaced cache counts, never goes down
        assert (
            len([r for r in api.requests_to("GET", "/api/v1/nodes") if "watch" not in r.query]) == 2
        )
    finally:
        client.close()
