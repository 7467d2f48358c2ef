"""``gpu-admission explain``: a scripted cluster of six nodes (two training GPU nodes, one
MIG node, three CPU nodes) in the fake API server, read through the real client; one test per
cause of the guide's typical event message (insufficient GPUs, an untolerated taint, node
affinity), a resource name no node advertises, an exhausted quota, an unallocatable claim,
each named with its fix; a schedulable Pod gets "nothing blocks it"; the offline ``-f`` form;
a running Pod that cannot see its GPU (each cause); a refused read (403) is one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.kubeapi import FakeKubeAPI
from webhook.cli.main import main
from webhook.operations.scheduler_message import parse_scheduler_message

POLICY = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUAdmissionPolicy
metadata: {name: explain}
spec:
  vendorDomains: [nvidia.com]
  newChecks: Warn
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
      runtimeClassName: nvidia
    - name: partitioned
      nodeSelector: {example.com/pool: partitioned}
      resources:
        - {name: nvidia.com/mig-1g.12gb, sharing: MIG}
      taints:
        - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
  tenants:
    - namespaces: [ml]
      contact: "#ml-platform"
      entitlements: {maxGPUsPerContainer: 8}
"""
NAMESPACE = "ml"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SCHEDULER_MESSAGE = (
    "0/6 nodes are available: 2 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint "
    "{nvidia.com/gpu: present}, 3 node(s) didn't match Pod's node affinity/selector. "
    "preemption: 0/6 nodes are available: 2 No preemption victims found for incoming pod, "
    "4 Preemption is not helpful for scheduling."
)


def node(
    name: str,
    labels: dict[str, str] | None = None,
    gpus: dict[str, str] | None = None,
    taints: tuple[dict[str, str], ...] = (),
) -> dict[str, Any]:
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", **(gpus or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux", **(labels or {})}},
        "spec": {"taints": list(taints)} if taints else {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def training_node(name: str) -> dict[str, Any]:
    labels = {"example.com/pool": "training", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    return node(name, labels, {"nvidia.com/gpu": "8"}, (GPU_TAINT,))


def cluster_nodes() -> list[dict[str, Any]]:
    mig = node(
        "mig-1",
        {"example.com/pool": "partitioned", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        {"nvidia.com/mig-1g.12gb": "7"},
        (GPU_TAINT,),
    )
    return [
        training_node("gpu-1"),
        training_node("gpu-2"),
        mig,
        node("cpu-1"),
        node("cpu-2"),
        node("cpu-3"),
    ]


def pod(
    name: str,
    gpus: int | None = 4,
    *,
    resource: str = "nvidia.com/gpu",
    namespace: str = NAMESPACE,
    node_name: str | None = None,
    phase: str = "Pending",
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.example/train:1"}
    if gpus is not None:
        container["resources"] = {"limits": {resource: str(gpus)}}
    body: dict[str, Any] = {
        "containers": [container],
        "tolerations": [GPU_TOLERATION],
        "nodeSelector": {"example.com/pool": "training"},
        **spec,
    }
    if node_name:
        body["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": body,
        "status": {"phase": phase},
    }


def running(name: str, node_name: str, gpus: int) -> dict[str, Any]:
    return pod(name, gpus, namespace="other", node_name=node_name, phase="Running")


def failed_scheduling(pod_name: str, message: str = SCHEDULER_MESSAGE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod_name}.17f0", "namespace": NAMESPACE},
        "involvedObject": {
            "kind": "Pod",
            "namespace": NAMESPACE,
            "name": pod_name,
            "uid": f"uid-{pod_name}",
        },
        "reason": "FailedScheduling",
        "message": message,
        "type": "Warning",
        "count": 3,
        "lastTimestamp": "2026-12-05T10:00:00Z",
        "source": {"component": "default-scheduler"},
    }


def scripted(kube_api: FakeKubeAPI, *objects: dict[str, Any]) -> None:
    """The six nodes, one finished and one running Pod of 4 GPUs on gpu-1, and ``objects``."""
    kube_api.add_all(cluster_nodes())
    kube_api.add(running("busy-1", "gpu-1", 4))
    finished = running("done-1", "gpu-2", 8)
    finished["status"]["phase"] = "Succeeded"
    kube_api.add(finished)
    kube_api.add_all(objects)


def explain(
    kube_api: FakeKubeAPI,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    *args: str,
    policy: str = POLICY,
) -> tuple[int, str, str]:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(policy)
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    status = main(["explain", *args, "--policy", str(policy_file), "--kubeconfig", str(kubeconfig)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def explain_json(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> tuple[int, dict[str, Any]]:
    status, out, err = explain(
        kube_api, tmp_path, capsys, "pod", name, "-n", NAMESPACE, "-o", "json"
    )
    assert err == ""
    return status, json.loads(out)


def kinds(record: dict[str, Any]) -> list[str]:
    return [cause["kind"] for cause in record["causes"]]


# --- Pending: each cause of the guide's event message ------------------------------------


def test_insufficient_gpus_names_the_nodes_their_allocations_and_the_fix(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = (
        "0/6 nodes are available: 2 Insufficient nvidia.com/gpu, 4 node(s) didn't match Pod's "
        "node affinity/selector."
    )
    scripted(
        kube_api,
        running("busy-2", "gpu-2", 6),
        pod("trainer", 6),
        failed_scheduling("trainer", message),
    )
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert kinds(record) == ["insufficient-gpus"]
    [cause] = record["causes"]
    assert cause["summary"] == (
        "not enough free nvidia.com/gpu: it asks for 6 on one node; 2 GPU nodes offering it "
        "have at most 4 free"
    )
    assert cause["details"] == [
        'the scheduler: "2 Insufficient nvidia.com/gpu"',
        "gpu-1: 8 allocatable, 4 allocated, 4 free",
        "gpu-2: 8 allocatable, 6 allocated, 2 free",
    ]
    assert "ask for 4 or fewer" in cause["fix"]
    # The affinity reason concerns the CPU and MIG nodes: nothing to change for this Pod.
    assert any("didn't match Pod's node affinity/selector" in n for n in record["notes"])
    assert record["pools"] == [
        {
            "pool": "training",
            "nodes": ["gpu-1", "gpu-2"],
            "allocatable": {"nvidia.com/gpu": 16},
            "allocated": {"nvidia.com/gpu": 10},
        }
    ]
    assert record["scheduler"]["reasons"][0] == {
        "count": 2,
        "reason": "Insufficient nvidia.com/gpu",
        "kind": "insufficient",
    }


# --- The scheduler's message, in the wordings of several releases -------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            SCHEDULER_MESSAGE,
            [
                (2, "insufficient", "Insufficient nvidia.com/gpu"),
                (1, "taint", "node(s) had untolerated taint {nvidia.com/gpu: present}"),
                (3, "affinity", "node(s) didn't match Pod's node affinity/selector"),
            ],
        ),
        (  # before 1.25: the taint's older wording, with a comma of its own
            "0/3 nodes are available: 1 node(s) had taint {node-role.kubernetes.io/master: }, "
            "that the pod didn't tolerate, 2 node(s) didn't match node selector.",
            [
                (
                    1,
                    "taint",
                    "node(s) had taint {node-role.kubernetes.io/master: }, that the pod didn't "
                    "tolerate",
                ),
                (2, "affinity", "node(s) didn't match node selector"),
            ],
        ),
        (  # newer releases keep the taint to themselves
            "0/4 nodes are available: 1 node(s) were unschedulable, 3 node(s) had untolerated "
            "taint(s). preemption: not eligible due to preemptionPolicy=Never.",
            [
                (1, "unschedulable", "node(s) were unschedulable"),
                (3, "taint", "node(s) had untolerated taint(s)"),
            ],
        ),
        (
            "0/2 nodes are available: 2 cannot allocate all claims. preemption: 0/2 nodes are "
            "available: 2 Preemption is not helpful for scheduling.",
            [(2, "claims", "cannot allocate all claims")],
        ),
        (
            "no nodes available to schedule pods",
            [(0, "other", "no nodes available to schedule pods")],
        ),
    ],
)
def test_the_schedulers_reasons_are_read_in_every_wording(
    message: str, expected: list[tuple[int, str, str]]
) -> None:
    parsed = parse_scheduler_message(message)
    assert [(r.count, r.kind, r.text) for r in parsed.reasons] == expected
