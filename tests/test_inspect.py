"""``gpu-admission inspect``: the daily GPU inspection of a scripted cluster in the fake API
server, through the command line's ``main``.

The cluster is ``cluster check``'s twelve nodes (CPU nodes; an H100 training pool, one of whose
nodes now carries an H200: a mixed pool; time-sliced L4s; GKE-style reserved nodes; A100s in MIG
instances, mixed and single strategy) with the GPU Operator's and GKE's device plugins, one GPU
node without a device plugin Pod, Pods holding GPUs, two Pending GPU Pods (one the scheduler
found no room for, one asking for a resource no node advertises), and a GPU quota at its limit.
Every section prints in the table and in Markdown; the JSON validates against its schema; a
second report ``--since`` the first names the node that lost GPUs, the node gone and the new
product; the inspector ClusterRole grants every request inspect and explain make; a refused
list is one line and exit 2.
"""

from __future__ import annotations

import fnmatch
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.kubeapi import FakeKubeAPI, RecordedRequest
from tests.support.cluster_objects import failed_scheduling as scheduler_event
from tests.support.cluster_objects import node, plugin_pod
from tests.support.paths import REPO
from tests.test_cluster_check import POLICY, clean_cluster, gke_plugin, operator_plugin
from webhook.cli import inspect as inspect_command
from webhook.cli.main import main
from webhook.operations.inspect_report import report_schema
from webhook.operations.refusals import INSPECTOR_ROLE

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
TRAINING_TOLERATION = {"key": "example.com/pool", "operator": "Exists", "effect": "NoSchedule"}
SCHEDULER_MESSAGE = (
    "0/12 nodes are available: 3 Insufficient nvidia.com/gpu, 9 node(s) didn't match Pod's "
    "node affinity/selector. preemption: 0/12 nodes are available: 12 No preemption victims "
    "found for incoming pod."
)
# The GPU nodes the GPU Operator's device plugin admits, less mig-2 (its Pod is gone).
OPERATOR_PLUGIN_NODES = ("train-1", "train-2", "train-3", "infer-1", "infer-2", "mig-1")


# The clock every report of these tests is made at (the command's, set by a fixture).
NOW = datetime(2026, 6, 2, 7, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inspect_command, "now", lambda: NOW)


def created(ago: timedelta) -> str:
    return (NOW - ago).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_pod(
    name: str,
    namespace: str,
    limits: dict[str, str],
    *,
    node_name: str | None = None,
    phase: str = "Pending",
    age: timedelta = timedelta(minutes=5),
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "registry.example/train:1", "resources": {"limits": limits}}
        ],
        "tolerations": [GPU_TOLERATION, TRAINING_TOLERATION],
        "nodeSelector": {"example.com/pool": "training"},
    }
    if node_name is not None:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "creationTimestamp": created(age),
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def failed_scheduling(pod: dict[str, Any], message: str) -> dict[str, Any]:
    metadata = pod["metadata"]
    return scheduler_event(
        metadata["namespace"],
        metadata["name"],
        message,
        last_seen=created(timedelta(minutes=1)),
        count=12,
    )


def quota(namespace: str, hard: int, used: int) -> dict[str, Any]:
    entries = {"requests.nvidia.com/gpu": str(hard)}
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus", "namespace": namespace},
        "spec": {"hard": entries},
        "status": {"hard": entries, "used": {"requests.nvidia.com/gpu": str(used)}},
    }


def scripted_nodes() -> list[dict[str, Any]]:
    """``cluster check``'s twelve nodes, train-3 re-boarded with H200s (a mixed pool), mig-1
    laid out by the MIG manager's ``all-balanced``."""
    nodes = {n["metadata"]["name"]: n for n in clean_cluster()}
    nodes["train-3"]["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H200"
    nodes["train-3"]["metadata"]["labels"]["nvidia.com/gpu.memory"] = "143771"
    nodes["mig-1"]["metadata"]["labels"]["nvidia.com/mig.config"] = "all-balanced"
    return list(nodes.values())


def scripted(kube_api: FakeKubeAPI, nodes: list[dict[str, Any]] | None = None) -> None:
    kube_api.add_all(nodes if nodes is not None else scripted_nodes())
    # The GPU Operator's device plugin: desired on its 7 GPU nodes, 6 Pods (mig-2 has none).
    operator = kube_api.add(operator_plugin(desired=7))
    operator["status"]["numberReady"] = 6
    kube_api.replace(operator)
    kube_api.add_all(plugin_pod(operator, name) for name in OPERATOR_PLUGIN_NODES)
    gke = kube_api.add(gke_plugin(desired=2))
    kube_api.add_all(plugin_pod(gke, name) for name in ("reserved-1", "reserved-2"))
    # GPUs in use: 8 on train-1, 4 on train-2 (and 4 of a Pod starting there, below), 4 on
    # train-3 (where a finished Pod holds none), 3 MIG instances on mig-1.
    kube_api.add(
        gpu_pod("busy-1", "team-a", {"nvidia.com/gpu": "8"}, node_name="train-1", phase="Running")
    )
    kube_api.add(
        gpu_pod("busy-2", "team-b", {"nvidia.com/gpu": "4"}, node_name="train-2", phase="Running")
    )
    kube_api.add(
        gpu_pod(
            "slices", "team-b", {"nvidia.com/mig-1g.10gb": "3"}, node_name="mig-1", phase="Running"
        )
    )
    kube_api.add(
        gpu_pod("half", "team-b", {"nvidia.com/gpu": "4"}, node_name="train-3", phase="Running")
    )
    kube_api.add(
        gpu_pod("done", "team-b", {"nvidia.com/gpu": "8"}, node_name="train-3", phase="Succeeded")
    )
    # Pending: 8 GPUs the training pool cannot give now, 3 hours old; a resource no node
    # advertises, 10 minutes old.
    waiting = gpu_pod(
        "train-big", "team-a", {"nvidia.com/gpu": "8"}, age=timedelta(hours=3, seconds=20)
    )
    kube_api.add(waiting)
    kube_api.add(failed_scheduling(waiting, SCHEDULER_MESSAGE))
    typo = gpu_pod("typo", "team-b", {"nvidia.com/gpus": "1"}, age=timedelta(minutes=10, seconds=5))
    kube_api.add(typo)
    kube_api.add(
        failed_scheduling(typo, "0/12 nodes are available: 12 Insufficient nvidia.com/gpus.")
    )
    # A Pod being set up on its node is not waiting for one.
    kube_api.add(gpu_pod("starting", "team-b", {"nvidia.com/gpu": "4"}, node_name="train-2"))
    # team-a's quota is used up (train-big, were it placed, would be refused anyway).
    kube_api.add(quota("team-a", hard=8, used=8))
    kube_api.add(quota("team-b", hard=16, used=7))


def inspect(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    status = main(["inspect", "--policy", str(policy), "--kubeconfig", str(kubeconfig), *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_the_table_prints_every_section(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted(kube_api)
    status, out, err = inspect(kube_api, tmp_path, capsys, "--nodes")
    assert (status, err) == (1, "")
    lines = out.splitlines()
    assert lines[0].endswith("12 nodes read, 9 GPU nodes")
    for title in (
        "GPU NODES (9)",
        "PENDING GPU PODS (2)",
        "DEVICE PLUGINS (9 GPU NODES TO COVER)",
        "GPU QUOTAS (2)",
        "MIXED HARDWARE POOLS (1)",
    ):
        assert title in lines, title
    assert any(line.startswith("POLICY DRIFT (") for line in lines)

    # Per node: allocatable and allocated by resource, product, MIG layout, replicas.
    def row(*cells: str) -> list[str]:
        return next(line.split() for line in lines if line.split()[: len(cells)] == list(cells))

    assert row("train-1") == [
        "train-1", "training", "NVIDIA-H100-80GB-HBM3", "-", "-", "-", "nvidia.com/gpu", "8", "8",
        "-",
    ]  # fmt: skip
    assert row("train-2")[-4:-1] == ["nvidia.com/gpu", "8", "8"]  # the Pod still starting counts
    assert row("train-3")[-4:-1] == ["nvidia.com/gpu", "8", "4"]  # the finished one does not
    assert row("infer-1")[1:] == [
        "inference", "NVIDIA-L4-SHARED", "-", "-", "4", "nvidia.com/gpu.shared", "8", "0", "-"
    ]  # fmt: skip
    assert row("mig-1")[3:] == [
        "all-balanced", "1g.10gb,2g.20gb", "-", "nvidia.com/mig-1g.10gb", "8", "3", "-"
    ]  # fmt: skip
    assert row("mig-2")[2:5] == ["NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "-", "1g.5gb"]
    # Whole GPUs (3×8 + 2×8 on GKE) and mig-2's 56 MIG instances are not added together.
    assert "nvidia.com/gpu (whole): 40 allocatable, 20 allocated (5 nodes)" in out
    assert "nvidia.com/gpu (MIG): 56 allocatable, 0 allocated (1 node)" in out
    # Pending, oldest first, each with its age and explain's first cause.
    pending = [line.split()[:3] for line in lines if line.startswith("team-")][:2]
    assert pending == [["team-a", "train-big", "3h"], ["team-b", "typo", "10m"]]
    assert row("team-a", "train-big")[4:6] == ["yes", "insufficient-gpus:"]
    assert row("team-b", "typo")[4:6] == ["yes", "unadvertised-resource:"]
    # Device plugins: desired and ready, and the GPU node without a Pod.
    assert row("gpu-operator/nvidia-device-plugin-daemonset") == [
        "gpu-operator/nvidia-device-plugin-daemonset", "7", "6", "(not", "all", "ready)", "6"
    ]  # fmt: skip
    assert row("kube-system/nvidia-gpu-device-plugin")[1:] == ["2", "2", "2"]
    assert (
        "1 GPU node without a Ready device plugin Pod, whose GPUs no Pod can be given: mig-2" in out
    )
    # Quotas: team-a's used up.
    assert row("team-a", "gpus")[2:] == ["requests.nvidia.com/gpu", "8", "8", "USED", "UP"]
    assert row("team-b", "gpus")[-1] == "ok"
    # The mixed pools: training's H200 among H100s. Partitioned's two A100 boards offer
    # different MIG profiles: a Pod asks for one or the other, it does not get either.
    assert (
        "pool training mixes 2 products offering nvidia.com/gpu (NVIDIA-H100-80GB-HBM3: "
        "train-1, train-2; NVIDIA-H200: train-3)" in out
    )
    assert "pool partitioned mixes" not in out
    assert lines[-1].startswith(
        "to act on: 2 GPU Pods Pending over 5m with a cause, 1 GPU node without a Ready "
        "device plugin Pod, "
        "1 GPU quota used up, "
    )


def test_markdown_has_a_heading_and_a_table_per_section(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted(kube_api)
    status, out, err = inspect(kube_api, tmp_path, capsys, "-o", "markdown")
    assert (status, err) == (1, "")
    headings = [line for line in out.splitlines() if line.startswith("#")]
    assert headings[0].startswith("# GPU inspection at ")
    assert [h.split(" (")[0] for h in headings[1:]] == [
        "## GPU pools",
        "## GPU nodes needing attention",
        "## Pending GPU Pods",
        "## Gated GPU Pods",
        "## Device plugins",
        "## GPU quotas",
        "## Policy drift",
        "## Mixed hardware pools",
    ]
    assert "| NODE | POOLS | PRODUCT | MIG CONFIG | MIG PROFILES | REPLICAS |" in out
    assert "| team-a | train-big | 3h | nvidia.com/gpu=8 | yes | insufficient-gpus: " in out
    assert "| team-a | gpus | requests.nvidia.com/gpu | 8 | 8 | USED UP |" in out
    assert (
        "- 1 GPU node without a Ready device plugin Pod, whose GPUs no Pod can be given: mig-2"
        in out
    )


def test_json_validates_and_since_reports_lost_gpus_gone_nodes_and_new_products(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted(kube_api)
    status, out, err = inspect(kube_api, tmp_path, capsys, "-o", "json")
    assert (status, err) == (1, "")
    first = json.loads(out)
    jsonschema.Draft202012Validator(report_schema()).validate(first)
    assert first["findings"]["pendingGpuPods"] == 2
    assert first["findings"]["uncoveredGpuNodes"] == 1
    assert first["findings"]["exhaustedQuotas"] == 1
    assert first["devicePlugins"]["uncoveredNodes"] == ["mig-2"]
    assert first["changes"] is None
    previous = tmp_path / "yesterday.json"
    previous.write_text(out)

    # A day later: train-2 lost two GPUs, infer-2 is gone, a B200 node joined; mig-1 was
    # re-partitioned (its 1g.10gb and 2g.20gb instances became two 3g.40gb), train-1
    # re-boarded with H200s under the same name.
    train_2 = kube_api.get("/api/v1/nodes/train-2")
    assert train_2 is not None
    train_2["status"]["allocatable"]["nvidia.com/gpu"] = "6"
    kube_api.replace(train_2)
    mig_1 = kube_api.get("/api/v1/nodes/mig-1")
    assert mig_1 is not None
    for part in ("capacity", "allocatable"):
        del mig_1["status"][part]["nvidia.com/mig-1g.10gb"]
        del mig_1["status"][part]["nvidia.com/mig-2g.20gb"]
        mig_1["status"][part]["nvidia.com/mig-3g.40gb"] = "2"
    kube_api.replace(mig_1)
    train_1 = kube_api.get("/api/v1/nodes/train-1")
    assert train_1 is not None
    train_1["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H200"
    kube_api.replace(train_1)
    kube_api.remove("/api/v1/nodes/infer-2")
    kube_api.add(
        node(
            "train-4",
            labels={"example.com/pool": "training", "nvidia.com/gpu.product": "NVIDIA-B200"},
            gpus={"nvidia.com/gpu": "8"},
        )
    )
    status, out, err = inspect(kube_api, tmp_path, capsys, "-o", "json", "--since", str(previous))
    assert err == ""
    second = json.loads(out)
    jsonschema.Draft202012Validator(report_schema()).validate(second)
    assert second["changes"] == {
        "since": first["generatedAt"],
        "nodesGone": ["infer-2"],
        "nodesAdded": ["train-4"],
        "gpusLost": [{"node": "train-2", "resource": "nvidia.com/gpu", "before": 8, "after": 6}],
        "newProducts": ["NVIDIA-B200"],
        "gpusGained": [],
        # Before: reported as 8 and 6 instances lost, without the gain.
        "reshaped": [
            {
                "node": "mig-1",
                "before": {"nvidia.com/mig-1g.10gb": 8, "nvidia.com/mig-2g.20gb": 6},
                "after": {"nvidia.com/mig-3g.40gb": 2},
            }
        ],
        "productsChanged": [
            {"node": "train-1", "before": "NVIDIA-H100-80GB-HBM3", "after": "NVIDIA-H200"}
        ],
        "net": [
            net("inference", "NVIDIA-L4-SHARED", "nvidia.com/gpu.shared", 16, 8),
            net("partitioned", "NVIDIA-A100-80GB-PCIe", "nvidia.com/mig-1g.10gb", 8, 0),
            net("partitioned", "NVIDIA-A100-80GB-PCIe", "nvidia.com/mig-2g.20gb", 6, 0),
            net("partitioned", "NVIDIA-A100-80GB-PCIe", "nvidia.com/mig-3g.40gb", 0, 2),
            net("training", "NVIDIA-B200", "nvidia.com/gpu", 0, 8),
            net("training", "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu", 16, 6),
            net("training", "NVIDIA-H200", "nvidia.com/gpu", 8, 16),
        ],
    }
    status, out, err = inspect(kube_api, tmp_path, capsys, "--since", str(previous))
    lines = out.splitlines()
    changes = lines[lines.index(f"CHANGES SINCE {first['generatedAt']}") + 1 :]
    assert changes[0].split() == ["NODE", "RESOURCE", "BEFORE", "NOW"]
    assert changes[1].split() == ["train-2", "nvidia.com/gpu", "8", "6"]
    assert "GPU nodes gone (1): infer-2" in out
    assert "new products (1): NVIDIA-B200" in out
    assert (
        "re-shaped, not lost (a MIG re-partition or a rename), 1 node: nvidia.com/mig-1g.10gb 8, "
        "nvidia.com/mig-2g.20gb 6 -> nvidia.com/mig-3g.40gb 2: mig-1"
    ) in out
    assert (
        "product changed (re-boarded), 1 node: NVIDIA-H100-80GB-HBM3 -> NVIDIA-H200: train-1"
    ) in out
    assert changes[2] == "1 node lost GPUs (allocatable went down): " + (
        "check nvidia-smi and the kernel log for Xid errors there"
    )


def net(pool: str, product: str, resource: str, before: int, after: int) -> dict[str, Any]:
    return {
        "pool": pool,
        "product": product,
        "resource": resource,
        "before": before,
        "after": after,
    }


def test_since_refuses_a_file_that_is_no_report(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "check.json"
    other.write_text(json.dumps({"nodes": 12, "drift": []}))
    status, out, err = inspect(kube_api, tmp_path, capsys, "--since", str(other))
    assert (status, out) == (2, "")
    assert err.startswith(f"gpu-admission: error: --since {other} is not a report of ")
    assert kube_api.requests == []  # refused before anything is read


def test_a_healthy_cluster_is_clean(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 0: the device plugins cover every GPU node, no GPU Pod waits, no GPU quota is used
    up, and the policy agrees with the cluster (cluster check's clean cluster)."""
    kube_api.add_all(clean_cluster())
    operator = kube_api.add(operator_plugin(desired=7))
    kube_api.add_all(plugin_pod(operator, name) for name in (*OPERATOR_PLUGIN_NODES, "mig-2"))
    gke = kube_api.add(gke_plugin(desired=2))
    kube_api.add_all(plugin_pod(gke, name) for name in ("reserved-1", "reserved-2"))
    kube_api.add(quota("team-b", hard=16, used=7))
    status, out, err = inspect(kube_api, tmp_path, capsys)
    assert (status, err) == (0, ""), out
    assert out.splitlines()[-1] == (
        "nothing to act on: 0 GPU Pods Pending over 5m with a cause, 0 GPU nodes without a "
        "Ready device plugin Pod, 0 GPU quotas used up, 0 drift findings"
    )
    assert "every GPU node has a Ready device plugin Pod" in out
    assert "no GPU Pod waits for a node" in out


# --- RBAC ---------------------------------------------------------------------------------


def inspector_rules() -> list[dict[str, Any]]:
    role = yaml.safe_load((REPO / "manifests/base/inspector-clusterrole.yaml").read_text("utf-8"))
    return list(role["rules"])


def permission(request: RecordedRequest) -> tuple[str, str, str]:
    """(API group, resource, verb) a request needs, as the API server's authorizer asks."""
    parts = request.path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    verb = "get" if len(rest) > 1 else "list"
    assert request.method == "GET", request
    return group, rest[0], verb


def allowed(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule["apiGroups"]
        and any(fnmatch.fnmatchcase(resource, r) for r in rule["resources"])
        and verb in rule["verbs"]
        for rule in rules
    )


def claiming_pod() -> dict[str, Any]:
    """A Pending Pod whose GPU comes from a DRA claim not yet allocated: explain and inspect
    read the claims, DeviceClasses and ResourceSlices for it."""
    pod = gpu_pod("claims-1", "team-b", {})
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "one-gpu"}]
    return pod


def one_gpu_claim() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "one-gpu", "namespace": "team-b"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
            }
        },
    }


def test_the_inspector_role_grants_every_request_inspect_and_explain_make(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted(kube_api)
    kube_api.add(claiming_pod())
    kube_api.add(one_gpu_claim())
    status, _, err = inspect(kube_api, tmp_path, capsys)
    assert (status, err) == (1, "")
    kubeconfig = str(tmp_path / "kubeconfig")  # written by inspect()
    policy = str(tmp_path / "policy.yaml")
    for namespace, name in (("team-a", "train-big"), ("team-b", "claims-1")):
        status = main(
            [
                "explain",
                "pod",
                name,
                "-n",
                namespace,
                "--policy",
                policy,
                "--kubeconfig",
                kubeconfig,
            ]
        )
        assert status == 1, capsys.readouterr()
    asked = {permission(request) for request in kube_api.requests}
    rules = inspector_rules()
    assert {p for p in asked if not allowed(rules, *p)} == set()
    # What this scripted cluster makes them read: nodes, one Pod by name, Pending and bound
    # Pods, events, quotas, the named DaemonSets and their Pods, claims, classes and slices.
    assert {
        ("", "nodes", "list"),
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "events", "list"),
        ("", "resourcequotas", "list"),
        ("apps", "daemonsets", "get"),
        ("resource.k8s.io", "resourceclaims", "list"),
        ("resource.k8s.io", "deviceclasses", "list"),
        ("resource.k8s.io", "resourceslices", "list"),
    } <= asked


def test_the_inspector_role_is_read_only_and_the_charts_is_the_same() -> None:
    from tests.test_chart import one, render

    rules = inspector_rules()
    assert {verb for rule in rules for verb in rule["verbs"]} <= {"get", "list"}
    assert not allowed(rules, "", "secrets", "get")
    chart = one(render(), "ClusterRole", "gpu-admission-inspector")
    assert chart["rules"] == rules
    # Bound to no one, like the auditor role.
    assert not [
        o
        for o in render()
        if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and o["roleRef"]["name"] == "gpu-admission-inspector"
    ]
    kustomization = yaml.safe_load((REPO / "manifests/base/kustomization.yaml").read_text())
    assert "inspector-clusterrole.yaml" in kustomization["resources"]


def test_a_refused_list_is_one_line_and_exit_2(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted(kube_api)
    kube_api.forbid("/api/v1/events")
    status, out, err = inspect(kube_api, tmp_path, capsys)
    assert (status, out) == (2, "")
    assert err.startswith("gpu-admission: error: cannot list events in all namespaces (HTTP 403)")
    assert err.rstrip().endswith(
        "bind the gpu-admission-inspector ClusterRole (manifests/base/inspector-clusterrole.yaml)"
    )
    assert len(err.splitlines()) == 1


def test_a_refused_read_of_cluster_checks_readers_names_the_inspector_role(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The device plugin DaemonSets are read by cluster check's readers, which name the
    # audits' role on their own: inspect's users hold the inspector's.
    scripted(kube_api)
    kube_api.forbid("/apis/apps/v1/namespaces/*/daemonsets*")
    status, out, err = inspect(kube_api, tmp_path, capsys)
    assert (status, out) == (2, "")
    assert "(HTTP 403)" in err
    assert err.rstrip().endswith(": bind " + INSPECTOR_ROLE)
    assert "auditor" not in err


def test_normal_churn_gated_pods_nics_and_forbidding_quotas_are_no_findings(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The healthy cluster with what a busy day adds and a daily CronJob must not alert on:
    a GPU Pod Pending for two minutes (the scheduler's churn), one Pending an hour that the
    scheduler has not tried yet (nothing blocks it), one Kueue holds by its scheduling gate,
    a Pod asking only for a NIC (a companion resource, no GPU), and a quota of hard 0 (the
    tenant is not entitled: no shortage)."""
    kube_api.add_all(clean_cluster())
    operator = kube_api.add(operator_plugin(desired=7))
    kube_api.add_all(plugin_pod(operator, name) for name in (*OPERATOR_PLUGIN_NODES, "mig-2"))
    gke = kube_api.add(gke_plugin(desired=2))
    kube_api.add_all(plugin_pod(gke, name) for name in ("reserved-1", "reserved-2"))
    young = gpu_pod("young", "team-a", {"nvidia.com/gpu": "16"}, age=timedelta(minutes=2))
    kube_api.add(young)
    kube_api.add(
        failed_scheduling(young, "0/13 nodes are available: 13 Insufficient nvidia.com/gpu.")
    )
    kube_api.add(gpu_pod("untried", "team-a", {"nvidia.com/gpu": "1"}, age=timedelta(hours=1)))
    gated = gpu_pod("queued", "team-a", {"nvidia.com/gpu": "8"}, age=timedelta(days=1))
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    kube_api.add(gated)
    kube_api.add(gpu_pod("nic-only", "team-a", {"nvidia.com/hostdev": "1"}, age=timedelta(hours=2)))
    kube_api.add(quota("team-c", hard=0, used=0))

    status, out, err = inspect(kube_api, tmp_path, capsys, "-o", "json")
    document = json.loads(out)
    jsonschema.Draft202012Validator(report_schema()).validate(document)
    assert document["drift"] == [], document["drift"]
    assert document["findings"] == {
        "pendingGpuPods": 0,
        "uncoveredGpuNodes": 0,
        "exhaustedQuotas": 0,
        "drift": 0,
    }
    assert (status, err) == (0, "")
    assert document["pendingAfterSeconds"] == 300
    pending = {
        p["name"]: (p["cause"] and p["cause"]["kind"], p["finding"])
        for p in document["pendingPods"]
    }
    assert pending == {"untried": (None, False), "young": ("insufficient-gpus", False)}
    assert document["gatedPods"] == [
        {
            "namespace": "team-a",
            "name": "queued",
            "ageSeconds": 86400,
            "requests": {"nvidia.com/gpu": 8},
            "gates": ["kueue.x-k8s.io/admission"],
        }
    ]
    [forbidding] = document["quotas"]
    assert (forbidding["exhausted"], forbidding["forbids"]) == (False, True)

    # The young Pod is a finding once it has waited --pending-after.
    status, out, err = inspect(kube_api, tmp_path, capsys, "--pending-after", "90s")
    assert (status, err) == (1, "")
    lines = out.splitlines()
    assert "GATED GPU PODS (1)" in lines
    assert any(line.split()[:2] == ["team-a", "queued"] for line in lines)
    assert lines[-1].startswith("to act on: 1 GPU Pod Pending over 1m30s with a cause, ")
    assert "forbids (hard 0)" in out


def test_a_bad_pending_after_or_max_rows_or_since_file_is_one_line_and_exit_2(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    for args, said in (
        (("--pending-after", "five minutes"), "--pending-after five minutes: not a duration"),
        (("--max-rows", "-1"), "--max-rows -1: give a number of rows"),
        (("--since", str(broken)), f"--since {broken}: cannot read a JSON report"),
    ):
        status, out, err = inspect(kube_api, tmp_path, capsys, *args)
        assert (status, out) == (2, "")
        assert err.startswith(f"gpu-admission: error: {said}")
        assert len(err.splitlines()) == 1
    assert kube_api.requests == []


def test_a_large_cluster_prints_a_summary_per_pool_and_at_most_max_rows_rows(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = scripted_nodes() + [
        node(
            f"train-x{index:02d}",
            labels={
                "example.com/pool": "training",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            },
            gpus={"nvidia.com/gpu": "8"},
        )
        for index in range(60)
    ]
    scripted(kube_api, nodes)
    status, out, err = inspect(kube_api, tmp_path, capsys)
    lines = out.splitlines()
    pools = lines[lines.index("GPU POOLS") + 1 :]
    assert pools[0].split() == [
        "POOL", "PRODUCT", "RESOURCE", "SHARING", "NODES", "ALLOCATABLE", "ALLOCATED", "FREE",
        "OUT", "OF", "USE",
    ]  # fmt: skip
    assert [line.split() for line in pools if line.startswith("training")] == [
        ["training", "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu", "whole", "62", "496", "16",
         "480", "-"],
        ["training", "NVIDIA-H200", "nvidia.com/gpu", "whole", "1", "8", "4", "4", "-"],
    ]  # fmt: skip
    # The 60 new nodes have no device plugin Pod: they need attention, with mig-2.
    node_rows = lines[lines.index("GPU NODES NEEDING ATTENTION (61 OF 69)") + 1 :]
    assert node_rows[51] == (
        "... 11 more rows left out (of 61): see them all with --max-rows 0, or -o json"
    )
    status, out, err = inspect(kube_api, tmp_path, capsys, "--max-rows", "0")
    assert "left out" not in out
    assert any(line.split()[:1] == ["train-x59"] for line in out.splitlines())
    status, out, err = inspect(kube_api, tmp_path, capsys, "-o", "json")
    assert len(json.loads(out)["nodes"]) == 69


def test_a_node_that_advertises_only_companion_resources_is_no_gpu_node(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The policy's companionResources (nvidia.com/hostdev, a NIC's) hand out no GPU: a node
    advertising only them is neither listed as a GPU node nor one a device plugin must cover."""
    scripted(kube_api)
    kube_api.add(node("nic-1", gpus={"nvidia.com/hostdev": "4"}))
    status, out, err = inspect(kube_api, tmp_path, capsys, "-o", "json")
    document = json.loads(out)
    assert "nic-1" not in [n["name"] for n in document["nodes"]]
    assert document["devicePlugins"]["uncoveredNodes"] == ["mig-2"]
    assert document["devicePlugins"]["gpuNodes"] == 9
    # train-1's NICs are not among its GPU resources.
    [train_1] = [n for n in document["nodes"] if n["name"] == "train-1"]
    assert [r["name"] for r in train_1["resources"]] == ["nvidia.com/gpu"]
    # Before: cluster check's drift counted it a GPU node in no pool, without the GPU taint.
    assert not [d["kind"] for d in document["drift"] if "nic-1" in d["nodes"]]


def test_the_policy_that_judged_is_named_in_every_form(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted(kube_api)
    kubeconfig = str(kube_api.write_kubeconfig(tmp_path / "kubeconfig"))
    default = "the packaged default (pass --policy with the deployed one)"
    main(["inspect", "--kubeconfig", kubeconfig, "-o", "markdown"])
    assert f"policy: {default};" in capsys.readouterr().out.splitlines()[0]
    main(["inspect", "--kubeconfig", kubeconfig, "-o", "json"])
    assert json.loads(capsys.readouterr().out)["policy"] == default
    _, out, _ = inspect(kube_api, tmp_path, capsys)
    assert f"policy: {tmp_path / 'policy.yaml'};" in out.splitlines()[0]


def test_a_crash_looping_plugin_pod_covers_nothing_and_the_well_known_plugins_are_found(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: a crash-looping plugin Pod counted as covering its node; without
    # devicePluginDaemonSets, the section said "not compared".
    scripted(kube_api)
    crashing = kube_api.get(
        "/api/v1/namespaces/gpu-operator/pods/nvidia-device-plugin-daemonset-train-2"
    )
    assert crashing is not None
    crashing["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    kube_api.replace(crashing)
    status, out, _ = inspect(kube_api, tmp_path, capsys, "-o", "json")
    plugins = json.loads(out)["devicePlugins"]
    assert (plugins["uncoveredNodes"], plugins["notReadyNodes"]) == (
        ["mig-2", "train-2"],
        ["train-2"],
    )
    unnamed = POLICY.split("  devicePluginDaemonSets:")[0]
    policy = tmp_path / "unnamed.yaml"
    policy.write_text(unnamed)
    kubeconfig = str(kube_api.write_kubeconfig(tmp_path / "kubeconfig"))
    main(["inspect", "--policy", str(policy), "--kubeconfig", kubeconfig, "-o", "json"])
    plugins = json.loads(capsys.readouterr().out)["devicePlugins"]
    assert (plugins["compared"], plugins["discovered"]) == (True, True)
    assert {(ds["name"], ds["foundBy"]) for ds in plugins["daemonSets"]} == {
        (
            "nvidia-device-plugin-daemonset",
            "its name is the one the GPU Operator gives its device plugin",
        ),
        (
            "nvidia-gpu-device-plugin",
            "its name and namespace are those GKE gives its device plugin",
        ),
    }
    assert plugins["uncoveredNodes"] == ["mig-2", "train-2"]
    main(["inspect", "--policy", str(policy), "--kubeconfig", kubeconfig])
    out = capsys.readouterr().out
    assert "the policy names no devicePluginDaemonSets: these were found by name or image (" in out
    assert "of these, 1 node has a plugin Pod that is not Ready (crash-looping?): train-2" in out


def test_out_of_use_nodes_are_counted_apart_and_only_nodes_needing_attention_are_listed(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: every node listed (1,816 lines at 2,000 nodes), a cordoned or NotReady node's
    # GPUs counted as usable, whole GPUs and MIG instances added into one number.
    nodes = {n["metadata"]["name"]: n for n in scripted_nodes()}
    nodes["train-2"]["spec"]["unschedulable"] = True
    nodes["train-2"]["spec"].setdefault("taints", []).append(
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    )
    nodes["train-3"]["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    nodes["infer-1"]["status"]["allocatable"]["nvidia.com/gpu.shared"] = "4"
    nodes["mig-1"]["metadata"]["labels"]["nvidia.com/mig.config.state"] = "failed"
    scripted(kube_api, list(nodes.values()))
    status, out, err = inspect(kube_api, tmp_path, capsys)
    lines = out.splitlines()
    pools = [line.split() for line in lines if line.startswith("training ")]
    assert pools == [
        ["training", "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu", "whole", "1", "8", "8", "0",
         "1", "node,", "8"],
        ["training", "NVIDIA-H200", "nvidia.com/gpu", "whole", "0", "0", "0", "0", "1",
         "node,", "8"],
    ]  # fmt: skip
    title = "GPU NODES NEEDING ATTENTION (5 OF 9)"
    listed = lines[lines.index(title) + 2 : lines.index(title) + 8]
    attention = {line.split()[0]: line for line in listed if line and not line[0].isspace()}
    assert sorted(attention) == ["infer-1", "mig-1", "mig-2", "train-2", "train-3"]
    assert attention["train-2"].endswith("cordoned")
    assert attention["train-3"].endswith("NotReady")
    assert attention["infer-1"].endswith("capacity above allocatable (nvidia.com/gpu.shared)")
    assert attention["mig-1"].endswith(
        "MIG configuration failed (nvidia.com/mig.config.state=failed)"
    )
    assert "train-1" not in attention
    assert "nvidia.com/gpu (out of use): 16 allocatable, 12 allocated (2 nodes)" in out
    assert "nvidia.com/gpu (whole): 24 allocatable, 8 allocated (3 nodes)" in out
    status, out, err = inspect(kube_api, tmp_path, capsys, "-o", "json")
    document = json.loads(out)
    assert len(document["nodes"]) == 9
    [train_2] = [n for n in document["nodes"] if n["name"] == "train-2"]
    assert (train_2["state"], train_2["sharing"]) == ("cordoned", "whole")


def test_since_a_time_slicing_rename_is_one_change_and_replaced_nodes_net_to_nothing(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: a rename was a "16 -> 0 lost" row per node, and an autoscaler's replacement
    # nodes a list gone and a list added with no net.
    scripted(kube_api)
    status, out, err = inspect(kube_api, tmp_path, capsys, "-o", "json")
    previous = tmp_path / "day-1.json"
    previous.write_text(out)
    infer_1 = kube_api.get("/api/v1/nodes/infer-1")
    assert infer_1 is not None
    for part in ("capacity", "allocatable"):
        infer_1["status"][part]["nvidia.com/gpu"] = infer_1["status"][part].pop(
            "nvidia.com/gpu.shared"
        )
    kube_api.replace(infer_1)
    replacement = kube_api.get("/api/v1/nodes/reserved-2")
    assert replacement is not None
    kube_api.remove("/api/v1/nodes/reserved-2")
    replacement["metadata"]["name"] = "reserved-3"
    kube_api.add(replacement)
    status, out, err = inspect(kube_api, tmp_path, capsys, "--since", str(previous))
    lines = out.splitlines()
    changes = lines[lines.index(next(line for line in lines if line.startswith("CHANGES"))) + 1 :]
    assert changes[0] == (
        "re-shaped, not lost (a MIG re-partition or a rename), 1 node: nvidia.com/gpu.shared 8 "
        "-> nvidia.com/gpu 8: infer-1"
    )
    assert "GPU nodes gone (1): reserved-2" in out and "GPU nodes added (1): reserved-3" in out
    net = next(line for line in changes if line.startswith("net allocatable"))
    assert net == (
        "net allocatable per pool and product: inference/NVIDIA-L4-SHARED nvidia.com/gpu 0 -> 8, "
        "inference/NVIDIA-L4-SHARED nvidia.com/gpu.shared 16 -> 8"
    )
