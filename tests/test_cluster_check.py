"""``gpu-admission cluster check``: a scripted cluster of 12 nodes in the fake API server, one
node or pool for each kind of drift, reported once each with the right nodes (exit 1); the same
cluster put right agrees with the policy (exit 0); an unreachable or forbidding API server is
exit 2 with one line."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kubeapi import FakeKubeAPI
from tests.support.paths import REPO
from webhook import parse_policy
from webhook.audit.drift import DRIFT_KINDS, find_drift
from webhook.core.inventory import node_info

POLICY = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUAdmissionPolicy
metadata: {name: drift}
spec:
  vendorDomains: [nvidia.com]
  companionResources: [nvidia.com/hostdev]
  gpuNodeTaints:
    - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
  resources:
    - {name: nvidia.com/gpu, sharing: Exclusive}
  pools:
    - name: training
      nodeSelector: {example.com/pool: training}
      resources:
        - {name: nvidia.com/gpu, sharing: Exclusive}
      taints:
        - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
        - {key: example.com/pool, value: training, effect: NoSchedule}
    - name: inference
      nodeSelector: {example.com/pool: inference}
      resources:
        - {name: nvidia.com/gpu.shared, sharing: TimeSlicing}
      taints:
        - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
    - name: reserved
      nodeSelector: {example.com/pool: reserved}
      resources:
        - {name: nvidia.com/gpu, sharing: Exclusive}
"""

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TRAINING_TAINT = {"key": "example.com/pool", "value": "training", "effect": "NoSchedule"}


def node(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    taints: tuple[dict[str, str], ...] = (),
    gpus: dict[str, str] | None = None,
) -> dict[str, Any]:
    capacity = {"cpu": "64", "memory": "512Gi", **(gpus or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux", **(labels or {})}},
        "spec": {"taints": list(taints)} if taints else {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def training(name: str, **changes: Any) -> dict[str, Any]:
    return node(
        name,
        labels={"example.com/pool": "training", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        taints=(GPU_TAINT, TRAINING_TAINT),
        gpus={"nvidia.com/gpu": "8", "nvidia.com/hostdev": "8"},
        **changes,
    )


def inference(name: str, **changes: Any) -> dict[str, Any]:
    return node(
        name,
        labels={
            "example.com/pool": "inference",
            "nvidia.com/gpu.product": "NVIDIA-L4-SHARED",
            "nvidia.com/gpu.replicas": "4",
        },
        taints=(GPU_TAINT,),
        gpus={"nvidia.com/gpu.shared": "8"},
        **changes,
    )


def clean_cluster() -> list[dict[str, Any]]:
    """Twelve nodes that agree with POLICY: CPU nodes (one in a pool of CPU nodes the policy
    does not know), training's, inference's (time-sliced, as that pool declares) and
    reserved's (GKE-style: no GPU feature-discovery labels, no GPU taint)."""
    return [
        node("cpu-1"),
        node("cpu-2"),
        node("cpu-3", labels={"example.com/pool": "batch"}),  # a CPU pool the policy ignores
        training("train-1"),
        training("train-2"),
        training("train-3"),
        inference("infer-1"),
        inference("infer-2"),
        node(
            "reserved-1",
            labels={"example.com/pool": "reserved", "cloud.google.com/gke-accelerator": "h100"},
            gpus={"nvidia.com/gpu": "8"},
        ),
        node(
            "reserved-2",
            labels={"example.com/pool": "reserved", "cloud.google.com/gke-accelerator": "h100"},
            gpus={"nvidia.com/gpu": "8"},
        ),
        node("cpu-4"),
        node("cpu-5"),
    ]


def drifting_cluster() -> list[dict[str, Any]]:
    """The clean cluster with one of each kind of drift (and reserved's nodes gone)."""
    nodes = [n for n in clean_cluster() if not n["metadata"]["name"].startswith("reserved")]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    # gpu-node-in-no-pool (and gpu-node-missing-taint for one of them): two GPU nodes that no
    # pool selects, one by its capacity, one by GPU feature discovery's label only.
    nodes.append(node("stray-1", taints=(GPU_TAINT,), gpus={"nvidia.com/gpu": "4"}))
    nodes.append(node("stray-2", labels={"nvidia.com/gpu.present": "true"}))
    # pool-node-missing-taint: train-2 lost the pool's own taint.
    by_name["train-2"]["spec"]["taints"] = [GPU_TAINT]
    # pool-node-undeclared-resource: train-3 was re-partitioned into MIG instances.
    by_name["train-3"]["status"]["capacity"]["nvidia.com/mig-1g.10gb"] = "56"
    # time-sliced-node-in-exclusive-pool: train-1 runs the time-slicing configuration.
    by_name["train-1"]["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "4"
    return nodes


def write_policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


def check(kube_api: FakeKubeAPI, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    command = [sys.executable, "-m", "webhook.cli", "cluster", "check"]
    command += ["--policy", str(write_policy(tmp_path)), "--kubeconfig", str(kubeconfig)]
    return subprocess.run(
        command + list(args), cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_each_kind_of_drift_is_reported_once_with_its_nodes(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    kube_api.add_all(drifting_cluster())
    result = check(kube_api, tmp_path, "-o", "json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["nodes"] == 12
    found = [(d["kind"], d["subject"], d["nodes"]) for d in report["drift"]]
    assert found == [
        ("pool-without-nodes", "reserved", []),
        ("gpu-node-in-no-pool", "", ["stray-1", "stray-2"]),
        (
            "pool-node-missing-taint",
            "training: example.com/pool=training:NoSchedule",
            ["train-2"],
        ),
        ("pool-node-undeclared-resource", "training: nvidia.com/mig-1g.10gb", ["train-3"]),
        ("time-sliced-node-in-exclusive-pool", "training", ["train-1"]),
        ("gpu-node-missing-taint", "nvidia.com/gpu=present:NoSchedule", ["stray-2"]),
    ]
    assert [kind for kind, _, _ in found] == list(DRIFT_KINDS)
    messages = {d["kind"]: d["message"] for d in report["drift"]}
    assert "example.com/pool=reserved" in messages["pool-without-nodes"]
    assert (
        "kubectl taint nodes NODE example.com/pool=training:NoSchedule"
        in (messages["pool-node-missing-taint"])
    )

    text = check(kube_api, tmp_path)
    assert text.returncode == 1
    lines = text.stdout.splitlines()
    assert len(lines) == len(DRIFT_KINDS) + 1
    assert lines[-1] == "12 nodes read; 6 disagreements"


def test_a_cluster_that_agrees_with_the_policy_exits_0(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    kube_api.add_all(clean_cluster())
    result = check(kube_api, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "12 nodes read; the policy and the cluster agree\n"


def test_nodes_are_read_in_pages(kube_api: FakeKubeAPI, tmp_path: Path) -> None:
    for index in range(1200):
        kube_api.add(training(f"train-{index:04d}"))
    kube_api.add_all(n for n in clean_cluster() if n["metadata"]["name"].startswith(("inf", "res")))
    result = check(kube_api, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(kube_api.requests_to("GET", "/api/v1/nodes")) == 3


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (403, "cannot list nodes (HTTP 403): nodes is forbidden"),
        (503, "cannot list nodes (HTTP 503): injected failure (503)"),
    ],
)
def test_a_check_that_cannot_read_the_nodes_exits_2_with_one_line(
    kube_api: FakeKubeAPI, tmp_path: Path, code: int, expected: str
) -> None:
    if code == 403:
        kube_api.forbid("/api/v1/nodes")
    else:
        kube_api.fail("/api/v1/nodes", code, times=None)
    result = check(kube_api, tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert expected in line, line
    assert ("gpu-admission-auditor" in line) == (code == 403)


def test_what_is_kept_of_a_node_is_what_the_checks_read() -> None:
    policy = parse_policy(POLICY)
    full = copy.deepcopy(training("train-1"))
    full["metadata"]["labels"].update(
        {
            "feature.node.kubernetes.io/pci-0302_10de.present": "true",
            "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
            "topology.kubernetes.io/zone": "a",
        }
    )
    full["status"]["images"] = [{"names": ["x" * 100], "sizeBytes": 1}] * 50
    kept = node_info(full, policy)
    assert dict(kept.labels) == {
        "example.com/pool": "training",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    }
    assert kept.nvidia_pci is True
    assert dict(kept.capacity) == {"nvidia.com/gpu": "8", "nvidia.com/hostdev": "8"}
    assert kept.vendor_resources() == ("nvidia.com/gpu", "nvidia.com/hostdev")
    assert [t.key for t in kept.taints] == ["nvidia.com/gpu", "example.com/pool"]
    # Labels under GPU feature discovery's prefixes that no check reads are not kept: whoever
    # can label a node cannot make the inventory grow.
    flooded = copy.deepcopy(full)
    flooded["metadata"]["labels"].update({f"nvidia.com/gpu.x{i}": "v" * 63 for i in range(500)})
    assert node_info(flooded, policy).labels == kept.labels
    # A malformed Node is kept as far as it is well formed.
    broken = node_info({"metadata": {"name": "x", "labels": []}, "spec": {"taints": [1]}}, policy)
    assert (broken.name, dict(broken.labels), broken.taints) == ("x", {}, ())


def test_find_drift_without_pools_reports_only_untainted_gpu_nodes() -> None:
    policy = parse_policy(POLICY.split("  pools:")[0])
    nodes = [
        node_info(n, policy)
        for n in (
            node("gpu-a", taints=(GPU_TAINT,), gpus={"nvidia.com/gpu": "8"}),
            node("gpu-b", gpus={"nvidia.com/gpu": "8"}),
            node("gpu-c", gpus={"nvidia.com/gpu": "0"}),  # nothing advertised (yet)
            node("cpu"),
        )
    ]
    assert [(d.kind, d.nodes) for d in find_drift(policy, nodes)] == [
        ("gpu-node-missing-taint", ("gpu-b",))
    ]
