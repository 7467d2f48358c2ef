"""Objects of a scripted cluster as the API server sends them, shared by the tests of
``cluster check``, ``explain`` and ``inspect``: Nodes, the Pods of a DaemonSet, the
scheduler's FailedScheduling events."""

from __future__ import annotations

from typing import Any


def node(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    taints: tuple[dict[str, str], ...] = (),
    gpus: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Node with ``gpus`` (extended resources) in its capacity and allocatable."""
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", **(gpus or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux", **(labels or {})}},
        "spec": {"taints": list(taints)} if taints else {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def plugin_pod(
    daemonset: dict[str, Any], node_name: str, *, owner: str | None = None, ready: bool = True
) -> dict[str, Any]:
    """A running Pod of the DaemonSet (selected by ``app: NAME``) on a node, Ready unless
    ``ready`` is false (crash-looping); ``owner``: the uid of another controller instead."""
    name = daemonset["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{node_name}",
            "namespace": daemonset["metadata"]["namespace"],
            "labels": {"app": name},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": name,
                    "uid": owner or daemonset["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {"nodeName": node_name, "containers": [{"name": "plugin", "image": "x"}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def failed_scheduling(
    namespace: str, pod_name: str, message: str, *, last_seen: str, count: int = 3
) -> dict[str, Any]:
    """The default scheduler's FailedScheduling event about the Pod of uid ``uid-NAME``."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod_name}.17f0", "namespace": namespace},
        "involvedObject": {
            "kind": "Pod",
            "namespace": namespace,
            "name": pod_name,
            "uid": f"uid-{pod_name}",
        },
        "reason": "FailedScheduling",
        "message": message,
        "type": "Warning",
        "count": count,
        "lastTimestamp": last_seen,
        "source": {"component": "default-scheduler"},
    }
