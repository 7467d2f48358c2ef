"""A cluster's workloads on the fake API server, as the audits read them: the API groups it
serves, and a seeded set of owners and the objects they own."""

from __future__ import annotations

from tests.kubeapi import FakeKubeAPI

KUBEFLOW = "kubeflow.org"


def serve_workload_kinds(api: FakeKubeAPI) -> None:
    """API group discovery (GET /apis), which the fake API server does not serve by itself:
    kubeflow.org is installed with its PyTorchJob; ray.io is a group that serves none of the
    kinds the policy names; no other custom group is installed."""
    api.serve_discovery(
        {"apps": ["v1"], "batch": ["v1"], KUBEFLOW: ["v1", "v2beta1"], "ray.io": ["v1"]}
    )
    # Every cluster serves ReplicationControllers; the fake one does not know them by itself.
    api.register("", "v1", "replicationcontrollers", "ReplicationController")


def serve_report_kinds(api: FakeKubeAPI) -> None:
    """The report CRDs (wgpolicyk8s.io and openreports.io), as Kyverno or Policy Reporter
    installs them: namespaced reports and cluster reports."""
    api.register("wgpolicyk8s.io", "v1alpha2", "policyreports", "PolicyReport")
    api.register(
        "wgpolicyk8s.io",
        "v1alpha2",
        "clusterpolicyreports",
        "ClusterPolicyReport",
        namespaced=False,
    )
    api.register("openreports.io", "v1alpha1", "reports", "Report")
    api.register("openreports.io", "v1alpha1", "clusterreports", "ClusterReport", namespaced=False)


def pod(name: str, namespace: str, *, privileged: bool = False, owner: dict | None = None) -> dict:
    container: dict = {
        "name": "main",
        "image": "cuda",
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    if privileged:
        container["securityContext"] = {"privileged": True}
    metadata: dict = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"}
    if owner is not None:
        metadata["ownerReferences"] = [owner_reference(owner)]
    spec = {"containers": [container]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def owner_reference(owner: dict) -> dict:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def seed(api: FakeKubeAPI) -> None:
    """A standalone privileged GPU Pod, a Deployment with its ReplicaSet and two Pods, a
    PyTorchJob with its Pod, and a plain Pod in another namespace."""
    template = {
        "metadata": {"labels": {"app": "trainer"}},
        "spec": pod("x", "ml")["spec"],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer", "namespace": "ml", "uid": "uid-deployment"},
        "spec": {"selector": {"matchLabels": {"app": "trainer"}}, "template": template},
    }
    replica_set = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": "trainer-5d4f",
            "namespace": "ml",
            "uid": "uid-replicaset",
            "ownerReferences": [owner_reference(deployment)],
        },
        "spec": {"selector": {"matchLabels": {"app": "trainer"}}, "template": template},
    }
    job = {
        "apiVersion": f"{KUBEFLOW}/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "mnist", "namespace": "ml", "uid": "uid-pytorchjob"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": {"spec": pod("x", "ml")["spec"]}},
                "Worker": {
                    "replicas": 1,
                    "template": {"spec": pod("x", "ml", privileged=True)["spec"]},
                },
            }
        },
    }
    api.add_all([deployment, replica_set])
    api.add(job, plural="pytorchjobs")
    api.add_all(
        [
            pod("debug", "ml", privileged=True),
            pod("trainer-5d4f-a", "ml", owner=replica_set),
            pod("trainer-5d4f-b", "ml", owner=replica_set),
            pod("mnist-master-0", "ml", owner=job),
            pod("web", "default"),
        ]
    )
