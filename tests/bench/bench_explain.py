"""What ``explain`` costs per Pending Pod at scale, as ``inspect`` runs it for every Pending
GPU Pod: N GPU nodes of one pool (one bound Pod each, 7 of 8 GPUs used), M Pending GPU Pods of
eight scheduling shapes (4 or 8 GPUs, one of four zones) with their FailedScheduling events,
read through the real client from the fake API server; then every Pod explained.

Run with ``python -m tests.bench.bench_explain [--nodes 5000] [--pending 1000]``. Not part of
``make test``: it prints times, it asserts none.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.kubeapi import FakeKubeAPI
from tests.support.cluster_objects import failed_scheduling, node
from webhook import parse_policy
from webhook.cluster.connection import connect
from webhook.operations.cluster_facts import pending_pods, read_cluster_facts
from webhook.operations.explain import explain_pod

POLICY = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUAdmissionPolicy
metadata: {name: bench-explain}
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
"""
NAMESPACE = "ml"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
ZONE = "topology.kubernetes.io/zone"


def gpu_node(index: int) -> dict[str, Any]:
    return node(
        f"gpu-{index:05d}",
        labels={
            "example.com/pool": "training",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            ZONE: f"zone-{index % 3}",
        },
        taints=(GPU_TAINT,),
        gpus={"nvidia.com/gpu": "8", "nvidia.com/hostdev": "8"},
    )


def gpu_pod(name: str, gpus: int, *, node_name: str = "", zone: str = "") -> dict[str, Any]:
    selector = {"example.com/pool": "training", **({ZONE: zone} if zone else {})}
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
        ],
        "tolerations": [GPU_TOLERATION],
        "nodeSelector": selector,
        **({"nodeName": node_name} if node_name else {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}"},
        "spec": spec,
        "status": {"phase": "Running" if node_name else "Pending"},
    }


def measure(nodes: int, pending: int) -> None:
    message = f"0/{nodes} nodes are available: {nodes} Insufficient nvidia.com/gpu."
    with FakeKubeAPI() as api, tempfile.TemporaryDirectory() as tmp:
        api.register("", "v1", "events", "Event")
        api.add_all(gpu_node(index) for index in range(nodes))
        api.add_all(
            gpu_pod(f"busy-{index}", 7, node_name=f"gpu-{index:05d}") for index in range(nodes)
        )
        waiting = [f"wait-{index}" for index in range(pending)]
        api.add_all(
            gpu_pod(name, 8 if index % 2 else 4, zone=f"zone-{index % 4}")
            for index, name in enumerate(waiting)
        )
        api.add_all(
            failed_scheduling(NAMESPACE, name, message, last_seen="2026-12-05T10:00:00Z")
            for name in waiting
        )
        policy = parse_policy(POLICY)
        kubeconfig = api.write_kubeconfig(Path(tmp) / "kubeconfig")
        with connect(str(kubeconfig)) as cluster:
            started = time.perf_counter()
            pods = list(pending_pods(cluster, None))
            facts = read_cluster_facts(cluster, policy, pods, all_namespaces=True)
            read = time.perf_counter()
            explained = [explain_pod(pod, facts, policy) for pod in pods]
            done = time.perf_counter()
    first = sorted({e.causes[0].kind for e in explained if e.causes})
    print(
        f"{nodes} GPU nodes, {len(pods)} Pending GPU Pods: read {read - started:.2f} s "
        f"(allocations when first needed, below), explained {done - read:.2f} s, "
        f"{(done - read) / max(len(pods), 1) * 1000:.1f} ms per Pod; first causes {first}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_explain", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pending", type=int, default=1000)
    args = parser.parse_args(argv)
    measure(args.nodes, args.pending)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
