"""The opt-in node inventory in the real server (``serve --inventory``), against the fake API
server: Nodes listed and then watched by the worker, changes seen within 2 s, reviews answered
and readiness kept while the API server fails, and nothing asked of it without the option."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.checks import test_inventory_decisions as decisions
from tests.kubeapi import FakeKubeAPI
from tests.serving import (
    Server,
    fixture_bytes,
    make_certificates,
    metric_value,
    post_json,
    wait_until,
)
from tests.support.admission import admission, container, pod
from tests.test_server import tls_server

GPU_POD = fixture_bytes("admission-review-gpu-pod.json")
SEEN_WITHIN = 2.0


class _AnyUid(str):
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str)

    __hash__ = str.__hash__


ANY_UID = _AnyUid()


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
    assert len(lists) == 1 and lists[0].query["limit"] == ["100"]
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


def feed_pids(server: Server) -> list[int]:
    """The worker's inventory processes (``webhook.cli.node_feed``) that are running."""
    found = []
    for worker in server.child_pids():
        for task in Path(f"/proc/{worker}/task").iterdir():
            for child in (task / "children").read_text().split():
                if (
                    running(int(child))
                    and b"node_feed" in Path(f"/proc/{child}/cmdline").read_bytes()
                ):
                    found.append(int(child))
    return found


def running(pid: int) -> bool:
    """Whether a process exists and has not ended (a zombie has)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_the_inventory_process_is_started_again_and_ends_with_the_worker(
    server: Server, api: FakeKubeAPI
) -> None:
    wait_until(lambda: nodes_known(server) == 3, timeout=10, what="the first list")
    [first] = feed_pids(server)
    os.kill(first, signal.SIGKILL)
    wait_until(
        lambda: [p for p in feed_pids(server) if p != first], timeout=10, what="a new process"
    )
    assert nodes_known(server) == 3  # decisions keep the last snapshot meanwhile
    assert server.get("/readyz").status == 200
    wait_until(
        lambda: metric_value(server.metrics(), "gpu_admission_inventory_watch_restarts_total") >= 1,
        timeout=10,
        what="the restart counted",
    )
    api.add(gpu_node("gpu-7"))
    wait_until(lambda: nodes_known(server) == 4, timeout=10, what="news from the new process")
    [second] = feed_pids(server)
    [worker] = server.child_pids()
    os.kill(int(worker), signal.SIGKILL)
    wait_until(lambda: not running(second), timeout=10, what="the process ended with its worker")
    # The arbiter's new worker starts its own. (Stopping the server while a worker boots
    # would wait for gunicorn's graceful timeout: a SIGTERM before the worker has its own
    # handlers is lost.)
    wait_until(
        lambda: server.child_pids() not in ([], [worker]) and feed_pids(server),
        timeout=10,
        what="the new worker's process",
    )
    wait_until(lambda: nodes_known(server) == 4, timeout=10, what="the new worker's list")


def test_decisions_stop_reading_a_stale_snapshot_or_that_of_an_ended_process() -> None:
    """The API server not heard from for STALE_SECONDS, or the serving process ended: the
    decisions are what they are without an inventory until it is current again."""
    from types import SimpleNamespace

    from webhook.core.inventory import NodeFields, NodeSnapshot
    from webhook.server.inventory import STALE_SECONDS, NodeInventory

    now = [1000.0]
    inventory = NodeInventory(lambda: None, clock=lambda: now[0])
    snapshot = NodeSnapshot({}, NodeFields(frozenset(), ("nvidia.com",)))
    feed = SimpleNamespace(snapshot=snapshot, ended=False, heard_at=now[0])
    inventory._serving = (feed, 0)  # type: ignore[assignment]
    assert inventory.snapshot() is snapshot
    now[0] += STALE_SECONDS + 1
    assert inventory.snapshot() is None
    feed.heard_at = now[0]
    assert inventory.snapshot() is snapshot
    feed.ended = True
    assert inventory.snapshot() is None


@pytest.mark.parametrize(
    "command",
    [
        ("/nonexistent/python",),
        (sys.executable, "-c", "print('not a message'); import time; time.sleep(60)"),
    ],
    ids=["cannot start", "garbled"],
)
def test_a_process_that_cannot_start_or_speaks_garbage_is_started_again(
    command: tuple[str, ...],
) -> None:
    from webhook import parse_policy
    from webhook.server.inventory import NodeInventory

    plain = parse_policy(
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: plain}\nspec:\n  vendorDomains: [nvidia.com]\n"
    )
    inventory = NodeInventory(lambda: plain, command=command)
    running = inventory.start()
    try:
        wait_until(lambda: inventory.figures()[2] >= 1, timeout=10, what="started again")
        assert inventory.snapshot() is None and inventory.figures()[0] == 0
    finally:
        inventory.close()
        running.join(timeout=10)
    assert not running.is_alive()


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
    api: FakeKubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process: the inventory (and its own process) with a policy provider that
    switches policies."""
    from webhook import parse_policy
    from webhook.server.inventory import NodeInventory

    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
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
    inventory = NodeInventory(lambda: policies[-1])
    running = inventory.start()
    try:
        check_policy_changes(inventory, policies, plain, pools, api)
    finally:
        inventory.close()
        running.join(timeout=10)
    assert _feed_processes() == []


def check_policy_changes(
    inventory: Any, policies: list[Any], plain: Any, pools: Any, api: FakeKubeAPI
) -> None:
    """The policy switches what is kept: listed again, served meanwhile, one process left."""

    def labels() -> dict[str, str]:
        return dict(inventory.nodes()["gpu-0"].labels)

    wait_until(lambda: inventory.nodes(), timeout=10, what="the first list")
    assert "example.com/pool" not in labels()
    snapshot = inventory.snapshot()
    assert snapshot is not None and snapshot.node("gpu-0") is not None
    assert snapshot.covers(plain)
    assert not snapshot.covers(pools)  # kept without the pool's label key
    restarts = [inventory.figures()[2]]
    policies.append(pools)
    wait_until(
        lambda: labels().get("example.com/pool") == "training",
        timeout=10,
        what="the Nodes listed again for the pool's label",
    )
    restarts.append(inventory.figures()[2])
    assert restarts[1] >= restarts[0] + 1  # the replaced process counts, never goes down
    assert len([r for r in api.requests_to("GET", "/api/v1/nodes") if "watch" not in r.query]) == 2
    # The replaced process has ended; the serving one ends when its input does.
    processes = _feed_processes()
    assert len(processes) == 1
    policies.append(plain)
    wait_until(
        lambda: len(_feed_processes()) == 1 and _feed_processes() != processes,
        timeout=10,
        what="one process again",
    )


def _feed_processes() -> list[int]:
    """The inventory processes this test process started, by pid."""
    import os

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = next(line for line in status.splitlines() if line.startswith("PPid:"))
        if int(parent.split()[1]) == os.getpid() and b"webhook.cli.node_feed" in command:
            found.append(int(entry.name))
    return sorted(found)


# ------------------------------------------------------------------ decisions with it


def decisions_server(tmp_path: Path, api: FakeKubeAPI) -> Server:
    """The real server, its policy ``test_inventory_decisions``' (pools reserved and not), its
    cluster the fake API server, with the inventory on."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: inventory}\nspec:\n" + textwrap.indent(decisions.SPEC, "  ")
    )
    pki = make_certificates(tmp_path / "pki")
    return Server(
        policy=policy,
        cert=pki.tls_cert,
        key=pki.tls_key,
        ca=pki.ca_cert,
        log_path=tmp_path / "server.log",
        extra_args=["--inventory"],
        env={"KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig"))},
    )


def answer(server: Server, obj: dict[str, Any], namespace: str = "ml") -> dict[str, Any]:
    body = json.dumps(admission(obj, namespace=namespace)).encode()
    conn = server.connection()
    try:
        reply = post_json(conn, "/validate", body)
        assert reply.status == 200
        return json.loads(reply.body)["response"]
    finally:
        conn.close()


def test_decisions_read_the_inventory_through_the_real_server(
    tmp_path: Path, api: FakeKubeAPI
) -> None:
    api.add_all(decisions.CLUSTER)
    privileged_on = decisions.on(decisions.PRIVILEGED, "cpu-1")
    with decisions_server(tmp_path, api) as server:
        wait_until(lambda: nodes_known(server) == len(decisions.CLUSTER), timeout=10, what="list")
        # A MIG name no node advertises and the policy does not declare: warned, with the
        # names nodes advertise.
        mig = answer(server, pod(container(gpu=1, resource="nvidia.com/mig-1g.11gb")))
        assert mig["allowed"] is True
        [warning] = mig["warnings"]
        assert "no node advertises it" in warning and "nvidia.com/mig-1g.10gb" in warning
        # A name a pool declares, with no nodes: admitted without a warning.
        declared = pod(
            container(gpu=1, resource="nvidia.com/mig-3g.20gb"),
            tolerations=[{"key": decisions.POOL, "operator": "Equal", "value": "inference"}],
            node_selector={decisions.POOL: "inference"},
        )
        assert answer(server, declared) == {"uid": ANY_UID, "allowed": True}
        # nodeName on a CPU node: a privileged Pod asking for no GPU is out of GPU scope.
        assert answer(server, privileged_on)["allowed"] is True
        # nodeName on a node with nvidia.com/gpu.present and nothing advertised yet: in reach.
        starting = answer(server, decisions.on(decisions.PRIVILEGED, "starting-1"))
        assert starting["allowed"] is False and "privileged" in starting["status"]["message"]
        # nodeName on a reserved pool's node, from a namespace the pool is closed to.
        reserved = answer(server, decisions.on(pod(container(gpu=1)), "reserved-1"))
        assert reserved["allowed"] is False
        assert 'node "reserved-1" is in pool "reserved"' in reserved["status"]["message"]
        assert answer(server, decisions.on(pod(container(gpu=1)), "reserved-1"), "research")[
            "allowed"
        ]

        # Changes to the nodes are seen by decisions within 2 s: re-tainted ...
        tainted = decisions.node("cpu-1", taints=[decisions.GPU_TAINT])
        api.replace(tainted)
        wait_until(
            lambda: not answer(server, privileged_on)["allowed"],
            timeout=SEEN_WITHIN,
            what="the taint seen",
        )
        # ... relabelled into the reserved pool ...
        pooled = decisions.node("cpu-1", labels={decisions.POOL: "reserved"})
        api.replace(pooled)
        on_cpu_1 = decisions.on(pod(container()), "cpu-1")
        wait_until(
            lambda: "is in pool" in answer(server, on_cpu_1).get("status", {}).get("message", ""),
            timeout=SEEN_WITHIN,
            what="the label seen",
        )
        # ... deleted (unknown: judged as without an inventory) ...
        api.remove("/api/v1/nodes/cpu-1")
        wait_until(
            lambda: "cannot tell" in answer(server, on_cpu_1).get("status", {}).get("message", ""),
            timeout=SEEN_WITHIN,
            what="the deletion seen",
        )
        # ... and added again as a CPU node.
        api.add(decisions.node("cpu-1"))
        wait_until(
            lambda: answer(server, privileged_on)["allowed"],
            timeout=SEEN_WITHIN,
            what="the node added",
        )


def test_before_the_first_list_decisions_are_todays(tmp_path: Path, api: FakeKubeAPI) -> None:
    api.add_all(decisions.CLUSTER)
    api.fail("/api/v1/nodes", 503, times=None)
    with decisions_server(tmp_path, api) as server:
        wait_until(
            lambda: (
                metric_value(server.metrics(), "gpu_admission_inventory_watch_restarts_total") >= 1
            ),
            timeout=10,
            what="a failed list",
        )
        refused = answer(server, decisions.on(decisions.PRIVILEGED, "cpu-1"))
        assert refused["allowed"] is False
        assert answer(server, pod(container(gpu=1, resource="nvidia.com/fpga"))).get(
            "warnings"
        ) == [
            'spec.containers[0].resources.limits[nvidia.com/fpga]: "nvidia.com/fpga" is not a '
            "GPU resource this policy declares; check the spelling against the node's capacity, "
            "or declare the resource in the policy"
        ]


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def test_namespaces_are_watched_only_for_a_policy_that_selects_them_by_label(
    api: FakeKubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inventory's process watches Namespaces, keeping only the label keys tenants select
    by, when the policy has such a tenant; relabelled and deleted Namespaces reach decisions;
    a policy without one asks nothing of the API server about Namespaces."""
    from webhook import parse_policy

    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    api.add(gpu_node("gpu-0"))
    api.add(namespace("vision", **{"example.com/tier": "inference", "team": "vision"}))
    api.add(namespace("batch"))
    head = (
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: %s}\nspec:\n  vendorDomains: [nvidia.com]\n"
    )
    plain = parse_policy(head % "plain")
    with running_inventory(plain) as inventory:
        snapshot = inventory.snapshot()
        assert snapshot is not None and snapshot.covers(plain)
        assert snapshot.namespace_labels("vision") is None
    assert api.requests_to("GET", "/api/v1/namespaces") == []

    selecting = parse_policy(
        head
        % "selecting"
        + "  tenants:\n    - namespaceSelector: {matchLabels: {example.com/tier: inference}}\n"
        "      entitlements: {maxGPUsPerPod: 1}\n"
    )
    with running_inventory(selecting) as inventory:

        def labels(name: str) -> dict[str, str] | None:
            snapshot = inventory.snapshot()
            found = snapshot.namespace_labels(name) if snapshot is not None else None
            return dict(found) if found is not None else None

        wait_until(lambda: labels("batch") == {}, timeout=10, what="the Namespaces")
        assert labels("vision") == {"example.com/tier": "inference"}
        api.replace(namespace("vision", team="vision"))
        api.remove("/api/v1/namespaces/batch")
        wait_until(
            lambda: labels("vision") == {} and labels("batch") is None,
            timeout=SEEN_WITHIN + 2,
            what="the relabelled and deleted Namespaces",
        )
    listed = [r for r in api.requests_to("GET", "/api/v1/namespaces") if "watch" not in r.query]
    assert len(listed) == 1


@contextlib.contextmanager
def running_inventory(policy: Any) -> Iterator[Any]:
    """The node inventory, in this process, serving ``policy``, once it has listed."""
    from webhook.server.inventory import NodeInventory

    inventory = NodeInventory(lambda: policy)
    running = inventory.start()
    try:
        wait_until(lambda: inventory.snapshot() is not None, timeout=10, what="the first list")
        yield inventory
    finally:
        inventory.close()
        running.join(timeout=10)


def test_a_refused_namespace_watch_keeps_the_inventory_from_serving(
    api: FakeKubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the policy selects namespaces by label, a Namespace list the API server refuses
    (RBAC not updated) leaves the inventory unlisted, as a refused Node list would: decisions
    go on without it and its age grows (the stale-inventory alert), instead of tenants
    selected by label silently losing their entitlements. Allowed again, it lists."""
    import time

    from webhook import parse_policy
    from webhook.server.inventory import NodeInventory

    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    api.add(gpu_node("gpu-0"))
    api.add(namespace("vision", **{"example.com/tier": "inference"}))
    api.forbid("/api/v1/namespaces")
    selecting = parse_policy(
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: selecting}\nspec:\n  vendorDomains: [nvidia.com]\n"
        "  tenants:\n    - namespaceSelector: {matchLabels: {example.com/tier: inference}}\n"
        "      entitlements: {maxGPUsPerPod: 1}\n"
    )
    inventory = NodeInventory(lambda: selecting)
    running = inventory.start()
    try:
        wait_until(
            lambda: len(api.requests_to("GET", "/api/v1/namespaces")) >= 2,
            timeout=10,
            what="the refused Namespace list, tried again",
        )
        time.sleep(1)
        assert inventory.snapshot() is None
        assert inventory.figures()[0] == 0
        api.clear_failures()
        wait_until(
            lambda: (
                (snapshot := inventory.snapshot()) is not None
                and snapshot.namespace_labels("vision") is not None
            ),
            timeout=10,
            what="the Namespaces listed once allowed",
        )
    finally:
        inventory.close()
        running.join(timeout=10)
