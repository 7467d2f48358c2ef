"""``gpu-admission explain``: a scripted cluster of six nodes (two training GPU nodes, one
MIG node, three CPU nodes) in the fake API server, read through the real client; one test per
cause of the guide's typical event message (insufficient GPUs, an untolerated taint, node
affinity), a resource name no node advertises, an exhausted quota, an unallocatable claim,
each named with its fix; a schedulable Pod gets "nothing blocks it"; the offline ``-f`` form
(files, directories, ``-`` and ``-R`` as review reads them, ``-n`` as review's);
a running Pod that cannot see its GPU (each cause); a refused read (403) is one line."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.kubeapi import FakeKubeAPI
from tests.support.cluster_objects import failed_scheduling as scheduler_event
from tests.support.cluster_objects import node
from webhook import parse_policy
from webhook.cli.main import main
from webhook.cluster.connection import connect
from webhook.operations.cluster_facts import pending_pods, read_cluster_facts
from webhook.operations.explain import explain_pod
from webhook.operations.refusals import INSPECTOR_ROLE
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


def training_node(name: str) -> dict[str, Any]:
    labels = {"example.com/pool": "training", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    return node(name, labels=labels, gpus={"nvidia.com/gpu": "8"}, taints=(GPU_TAINT,))


def cluster_nodes() -> list[dict[str, Any]]:
    mig = node(
        "mig-1",
        labels={
            "example.com/pool": "partitioned",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        },
        gpus={"nvidia.com/mig-1g.12gb": "7"},
        taints=(GPU_TAINT,),
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
    return scheduler_event(NAMESPACE, pod_name, message, last_seen="2026-12-05T10:00:00Z")


def scripted(kube_api: FakeKubeAPI, *objects: dict[str, Any]) -> None:
    """The six nodes, one finished and one running Pod of 4 GPUs on gpu-1, and ``objects``."""
    kube_api.register("", "v1", "events", "Event")  # served by every API server
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
    records = json.loads(out)
    assert isinstance(records, list) and len(records) == 1  # a list, one element per Pod
    return status, records[0]


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
        "not enough free nvidia.com/gpu: it asks for 6 on one node (spec.containers[0]); "
        "2 GPU nodes offering it that nothing else blocks have at most 4 free"
    )
    assert cause["details"] == [
        'the scheduler: "2 Insufficient nvidia.com/gpu"',
        "gpu-1: 8 allocatable, 4 allocated, 4 free",
        "gpu-2: 8 allocatable, 6 allocated, 2 free",
    ]
    assert cause["fix"] == (
        "wait for GPU Pods on these nodes to finish; or ask for 4 or fewer (the most free on "
        "one node); or add GPU nodes (ask #ml-platform)"
    )
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
        (  # 1.34 on: the DRA plugin's post-filter sentence comes before preemption's
            "0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 4 node(s) didn't match "
            "Pod's node affinity/selector. no new claims to deallocate, preemption: 0/5 nodes "
            "are available: 1 No preemption victims found for incoming pod, 4 Preemption is "
            "not helpful for scheduling.",
            [
                (1, "insufficient", "Insufficient nvidia.com/gpu"),
                (4, "affinity", "node(s) didn't match Pod's node affinity/selector"),
            ],
        ),
        (  # a post-filter sentence without preemption's
            "0/3 nodes are available: 3 node(s) were unschedulable. no new claims to deallocate.",
            [(3, "unschedulable", "node(s) were unschedulable")],
        ),
        (  # a pre-filter's rejection is a sentence of its own, before any count
            "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. "
            "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.",
            [(0, "other", "pod has unbound immediate PersistentVolumeClaims")],
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


def test_an_untolerated_gpu_taint_names_the_taint_and_the_toleration_to_write(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = (
        "0/6 nodes are available: 3 node(s) didn't match Pod's node affinity/selector, "
        "3 node(s) had untolerated taint {nvidia.com/gpu: present}."
    )
    scripted(kube_api, pod("trainer", tolerations=[]), failed_scheduling("trainer", message))
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert kinds(record) == ["untolerated-taint"]
    [cause] = record["causes"]
    assert cause["summary"] == (
        "taint nvidia.com/gpu=present:NoSchedule on 2 GPU nodes offering nvidia.com/gpu is not "
        "tolerated (gpu-1, gpu-2)"
    )
    assert cause["fix"] == (
        "add to spec.tolerations (in the workload's pod template): "
        "{key: nvidia.com/gpu, operator: Equal, value: present, effect: NoSchedule}"
    )
    assert cause["details"] == [
        'the scheduler: "3 node(s) had untolerated taint {nvidia.com/gpu: present}"'
    ]


def test_a_node_selector_no_gpu_node_matches_names_the_label_and_the_values_they_have(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = "0/6 nodes are available: 6 node(s) didn't match Pod's node affinity/selector."
    trainer = pod(
        "trainer",
        nodeSelector={"example.com/pool": "training", "nvidia.com/gpu.product": "NVIDIA-B200"},
    )
    scripted(kube_api, trainer, failed_scheduling("trainer", message))
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert kinds(record) == ["node-affinity"]
    [cause] = record["causes"]
    assert cause["summary"] == (
        "its node selector or required node affinity matches none of the 2 GPU nodes offering "
        "nvidia.com/gpu (gpu-1, gpu-2)"
    )
    assert cause["details"] == [
        "the scheduler: \"6 node(s) didn't match Pod's node affinity/selector\"",
        "spec.nodeSelector[nvidia.com/gpu.product]: NVIDIA-B200: the GPU nodes have "
        "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
    ]
    # The values are named; which hardware to run on is the user's to pick.
    assert cause["fix"] == (
        "change nodeSelector nvidia.com/gpu.product to one of the values the GPU nodes have "
        "(above), or remove it (in the workload's pod template)"
    )


def test_a_required_node_affinity_no_gpu_node_meets_is_named_by_its_term(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "example.com/zone", "operator": "In", "values": ["eu-1"]}
                        ]
                    }
                ]
            }
        }
    }
    scripted(kube_api, pod("trainer", affinity=affinity))
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert kinds(record) == ["node-affinity"]
    [cause] = record["causes"]
    assert cause["details"] == [
        "nodeSelectorTerms[0]: example.com/zone In ['eu-1']: no GPU node offering it has the "
        "label example.com/zone"
    ]
    assert (
        cause["fix"]
        == "remove the requirement on example.com/zone (in the workload's pod template)"
    )
    # No FailedScheduling event (expired, or the scheduler not yet at it): the nodes tell.
    assert "the scheduler has written no FailedScheduling event about it" in record["notes"]


def test_a_resource_name_no_node_advertises_gets_a_did_you_mean(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = "0/6 nodes are available: 6 Insufficient nvidia.com/mig-1g.10gb."
    mig = pod("notebook", 1, resource="nvidia.com/mig-1g.10gb", nodeSelector={})
    scripted(kube_api, mig, failed_scheduling("notebook", message))
    status, out, err = explain(kube_api, tmp_path, capsys, "pod", "notebook", "-n", NAMESPACE)
    assert (status, err) == (1, "")
    assert (
        "causes, in the order to address them:\n  1. no node advertises nvidia.com/mig-1g.10gb"
        in out
    )
    assert (
        "     - spec.containers[0].resources.limits[nvidia.com/mig-1g.10gb]: "
        "nvidia.com/mig-1g.10gb is advertised by no node; did you mean nvidia.com/mig-1g.12gb?"
    ) in out
    assert (
        "     fix: write nvidia.com/mig-1g.12gb instead of nvidia.com/mig-1g.10gb in "
        "resources.limits"
    ) in out
    # The scheduler's "Insufficient" is that same cause: not told twice.
    assert out.count("nvidia.com/mig-1g.10gb is advertised by no node") == 1
    assert "notes:" not in out.split("causes,")[1].split("fix:")[0]


def gpu_quota(name: str, hard: int, used: int, **spec: Any) -> dict[str, Any]:
    entry = "requests.nvidia.com/gpu"
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"hard": {entry: str(hard), "pods": "50"}, **spec},
        "status": {
            "hard": {entry: str(hard), "pods": "50"},
            "used": {entry: str(used), "pods": "3"},
        },
    }


def test_an_exhausted_gpu_quota_is_named_with_its_fix_as_a_note_on_the_next_pods(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A quota is checked when a Pod is created: it cannot hold a Pod that exists. Before,
    "ResourceQuota ... used up" was cause #1 of a Pod that fits, and a quota scoped to
    PriorityClass high, which does not count the Pod, was cause #2."""
    high = {
        "scopeSelector": {
            "matchExpressions": [
                {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}
            ]
        }
    }
    scripted(
        kube_api,
        gpu_quota("gpus", 8, 8),
        gpu_quota("high-gpus", 8, 8, **high),
        gpu_quota("roomy", 16, 4),
        pod("trainer", 2),
    )
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert (status, record["causes"], record["headline"]) == (0, [], "nothing blocks it")
    quota_notes = [n for n in record["notes"] if "ResourceQuota" in n]
    assert quota_notes == [
        "ResourceQuota gpus in ml: requests.nvidia.com/gpu is used up (8 of 8): it does not "
        "hold this Pod (a quota is checked when a Pod is created), but the next Pod asking for "
        "it is refused at creation; free GPUs in ml (delete GPU Pods that are done or idle), or "
        "raise spec.hard[requests.nvidia.com/gpu] of ResourceQuota gpus (ask #ml-platform)"
    ]
    # The same Pod at priority high is counted by the scoped quota too.
    kube_api.add(pod("urgent", 2, priorityClassName="high"))
    _, urgent = explain_json(kube_api, tmp_path, capsys, "urgent")
    assert [n.split(":")[0] for n in urgent["notes"] if "ResourceQuota" in n] == [
        "ResourceQuota gpus in ml",
        "ResourceQuota high-gpus in ml",
    ]


@pytest.mark.parametrize(
    ("scope", "spec", "counted"),
    [
        ({"scopes": ["BestEffort"]}, {}, "yes"),
        ({"scopes": ["NotBestEffort"]}, {}, "no"),
        ({"scopes": ["Terminating"]}, {"activeDeadlineSeconds": 600}, "yes"),
        ({"scopes": ["NotTerminating"]}, {"activeDeadlineSeconds": 600}, "no"),
        (
            {
                "scopeSelector": {
                    "matchExpressions": [{"scopeName": "PriorityClass", "operator": "Exists"}]
                }
            },
            {},
            "no",
        ),
        ({"scopes": ["CrossNamespacePodAffinity"]}, {}, "may"),
    ],
)
def test_a_quotas_scopes_say_whether_it_counts_the_pod(
    kube_api: FakeKubeAPI,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    scope: dict[str, Any],
    spec: dict[str, Any],
    counted: str,
) -> None:
    scripted(kube_api, gpu_quota("scoped", 4, 4, **scope), pod("trainer", 2, **spec))
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 0
    notes = [n for n in record["notes"] if "ResourceQuota scoped" in n]
    assert len(notes) == (0 if counted == "no" else 1)
    if counted == "may":
        assert notes[0].startswith(
            "ResourceQuota scoped in ml (its scope CrossNamespacePodAffinity is not read here: "
            "it may apply): "
        )


def test_a_quota_of_hard_0_forbids_the_resource_and_the_fix_is_an_entitlement(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0 of 0 is no shortage to wait out: the namespace may not have the resource at all. The
    controller's next Pods are refused; this one exists, and the nodes say why it pends."""
    trainer = pod("trainer", 2)
    trainer["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u", "controller": True}
    ]
    scripted(kube_api, gpu_quota("no-gpus", 0, 0), trainer)
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert (status, record["causes"]) == (0, [])
    assert (
        "ResourceQuota no-gpus in ml forbids requests.nvidia.com/gpu (hard 0): it does not hold "
        "this Pod (a quota is checked when a Pod is created), but its controller's next Pods "
        "are refused (FailedCreate events on the controller); the namespace is not entitled to "
        "it: ask for an entitlement (ask #ml-platform), which raises "
        "spec.hard[requests.nvidia.com/gpu] of ResourceQuota no-gpus, or ask for a GPU resource "
        "the namespace may use"
    ) in record["notes"]


BOUND_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


@pytest.mark.parametrize(
    ("changes", "first"),
    [
        ({"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}, "scheduling-gated"),
        ({"resource": "nvidia.com/gpus"}, "unadvertised-resource"),
    ],
)
def test_the_pods_bound_to_nodes_are_not_read_where_free_gpus_are_not_compared(
    kube_api: FakeKubeAPI,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    changes: dict[str, Any],
    first: str,
) -> None:
    """Every bound Pod of the cluster is the largest read: a gated Pod (its free GPUs are
    those of when its gates go) and one asking for a name no node advertises need none."""
    scripted(kube_api, pod("trainer", 4, **changes))
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert record["causes"][0]["kind"] == first
    selectors = [r.query.get("fieldSelector", [""])[0] for r in kube_api.requests_to("GET")]
    assert BOUND_PODS not in selectors
    assert all(p["allocated"] is None for p in record["pools"])


def claimed_gpu_cluster(kube_api: FakeKubeAPI) -> None:
    """The six nodes, a DeviceClass whose driver publishes no device, and a Pending Pod whose
    claim (made from its template) is not allocated."""
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "trainer-gpu-x7k2p", "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
            }
        },
        "status": {},
    }
    trainer = pod(
        "trainer",
        None,
        nodeSelector={},
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
    )
    trainer["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    trainer["status"]["resourceClaimStatuses"] = [
        {"name": "gpu", "resourceClaimName": "trainer-gpu-x7k2p"}
    ]
    message = "0/6 nodes are available: 6 cannot allocate all claims."
    scripted(kube_api, device_class, claim, trainer, failed_scheduling("trainer", message))


def test_an_unallocatable_claim_names_the_class_no_driver_publishes(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claimed_gpu_cluster(kube_api)
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert kinds(record) == ["unallocatable-claim"]
    [cause] = record["causes"]
    assert cause["summary"] == (
        'claim gpu: ResourceClaim "trainer-gpu-x7k2p" is not allocated (asks for gpu.nvidia.com)'
    )
    assert cause["details"] == [
        'no ResourceSlice publishes devices of driver gpu.nvidia.com (DeviceClass "gpu.nvidia.com")'
    ]
    assert cause["fix"].startswith("install the DRA driver whose kubelet plugin publishes")


def test_a_refused_dra_read_names_the_permission_and_an_unserved_one_is_a_note(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claimed_gpu_cluster(kube_api)
    kube_api.forbid("/apis/resource.k8s.io/v1/deviceclasses")
    status, out, err = explain(kube_api, tmp_path, capsys, "pod", "trainer", "-n", NAMESPACE)
    assert (status, out) == (2, "")
    [line] = err.splitlines()
    assert line.startswith("gpu-admission: error: cannot list deviceclasses (HTTP 403): ")
    assert line.endswith(
        ': grant "list" on deviceclasses.resource.k8s.io, or bind ' + INSPECTOR_ROLE
    )
    kube_api.clear_failures()
    kube_api.set_served("resource.k8s.io", "v1", False)  # a cluster before Kubernetes 1.34
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert (
        "this cluster does not serve resource.k8s.io/v1 (Kubernetes 1.34+): claims not read"
        in (record["notes"])
    )
    # The scheduler's own words stand for the claim.
    assert (status, kinds(record)) == (1, ["scheduler-reason"])


def test_a_schedulable_pod_gets_nothing_blocks_it(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted(kube_api, pod("trainer", 4))
    status, out, err = explain(kube_api, tmp_path, capsys, "pod/trainer", "-n", NAMESPACE)
    assert (status, err) == (0, "")
    assert "\nnothing blocks it\n" in out
    assert "    pool training: 2 nodes; nvidia.com/gpu 16 allocatable, 4 allocated" in out
    # One Pod: its own events only, and its namespace's quotas.
    [events] = kube_api.requests_to("GET", "/api/v1/namespaces/ml/events")
    assert events.query["fieldSelector"] == [
        "reason=FailedScheduling,involvedObject.kind=Pod,involvedObject.name=trainer"
    ]
    assert kube_api.requests_to("GET", "/api/v1/namespaces/ml/resourcequotas")


def test_a_refused_read_is_one_line_naming_what_was_refused(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted(kube_api, pod("trainer", 4))
    kube_api.forbid("/api/v1/nodes")
    status, out, err = explain(kube_api, tmp_path, capsys, "pod", "trainer", "-n", NAMESPACE)
    assert (status, out) == (2, "")
    [line] = err.splitlines()
    assert line.startswith("gpu-admission: error: cannot list nodes (HTTP 403): ")
    assert "nodes is forbidden" in line
    assert line.endswith(': grant "list" on nodes, or bind ' + INSPECTOR_ROLE)


def test_a_pod_that_does_not_exist_is_one_line(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted(kube_api)
    status, out, err = explain(kube_api, tmp_path, capsys, "pod", "ghost", "-n", NAMESPACE)
    assert (status, out) == (2, "")
    assert err == 'gpu-admission: error: pod "ghost" not found in namespace "ml"\n'


# --- Pending: what holds a Pod before the nodes, and cordoned nodes ------------------------


def test_scheduling_gates_come_first_and_cordoned_gpu_nodes_are_named(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gated = pod("trainer", 4, schedulingGates=[{"name": "kueue.x-k8s.io/admission"}])
    scripted(kube_api, gated)
    for name in ("gpu-1", "gpu-2"):
        stored = kube_api.get(f"/api/v1/nodes/{name}")
        assert stored is not None
        stored["spec"]["unschedulable"] = True
        kube_api.replace(stored)
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert kinds(record) == ["scheduling-gated", "unavailable-nodes"]
    assert record["headline"] == (
        "scheduling gates hold it before any node is considered: kueue.x-k8s.io/admission "
        "(and 1 more cause)"
    )
    assert record["causes"][1]["summary"] == (
        "2 GPU nodes offering nvidia.com/gpu are cordoned (gpu-1, gpu-2)"
    )
    # Node maintenance: the cluster's administrators, never a toleration of the cordon.
    assert record["causes"][1]["fix"].startswith(
        "node health or maintenance, nothing to change in the Pod"
    )
    assert "ask the cluster's administrators" in record["causes"][1]["fix"]
    assert "tolerations" not in record["causes"][1]["fix"]


def test_a_pod_for_a_custom_scheduler_that_said_nothing_names_the_scheduler(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted(kube_api, pod("trainer", 4, schedulerName="volcano"))
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert kinds(record) == ["custom-scheduler"]
    assert record["causes"][0]["summary"] == (
        'spec.schedulerName is "volcano" and that scheduler has reported nothing about it'
    )


# --- A running Pod that cannot see its GPU ------------------------------------------------


def _no_gpu(spec: dict[str, Any]) -> None:
    del spec["containers"][0]["resources"]


def _no_runtime_class(spec: dict[str, Any]) -> None:
    del spec["runtimeClassName"]


def _privileged(spec: dict[str, Any]) -> None:
    spec["containers"][0]["securityContext"] = {"privileged": True}


def _visible_devices(spec: dict[str, Any]) -> None:
    spec["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": ""},
    ]


@pytest.mark.parametrize(
    ("change", "kind", "summary", "fix"),
    [
        (
            _no_gpu,
            "no-gpu-requested",
            "no container asks for a GPU (no GPU resource in resources.limits, no resource "
            "claim): the device plugin gives it none",
            "set resources.limits[nvidia.com/gpu]: 1 on the container that uses the GPU",
        ),
        (
            _no_runtime_class,
            "runtime-class",
            'spec.runtimeClassName is not set; GPU Pods here run with RuntimeClass "nvidia" '
            "(pools[0].runtimeClassName (training))",
            "set spec.runtimeClassName: nvidia in the workload's pod template",
        ),
        (
            _privileged,
            "privileged-container",
            "privileged container main: it sees the host's device nodes outside the device "
            "plugin's allocation, and the runtime's injection of the GPU and its driver "
            "libraries does not follow the GPUs it was given",
            "remove securityContext.privileged from main",
        ),
        (
            _visible_devices,
            "visible-devices-override",
            "the container sets the variables that say which GPUs it sees: they replace the "
            "ones the device plugin gave",
            "remove env NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES from main",
        ),
    ],
)
def test_a_running_pod_that_cannot_see_its_gpu_is_told_why(
    kube_api: FakeKubeAPI,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: Any,
    kind: str,
    summary: str,
    fix: str,
) -> None:
    trainer = pod("trainer", 4, node_name="gpu-1", phase="Running", runtimeClassName="nvidia")
    change(trainer["spec"])
    scripted(kube_api, trainer)
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert record["state"] == "scheduled"
    assert kinds(record) == [kind]
    [cause] = record["causes"]
    assert cause["summary"] == summary
    assert cause["fix"].startswith(fix)
    assert any("nvidia-smi -L" in note for note in record["notes"])


def test_the_overriding_values_are_named_with_what_they_do(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = pod("trainer", 4, node_name="gpu-1", phase="Running", runtimeClassName="nvidia")
    _visible_devices(trainer["spec"])
    scripted(kube_api, trainer)
    _, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert record["causes"][0]["details"] == [
        'main: NVIDIA_VISIBLE_DEVICES="all": it names devices of its own choosing',
        'main: CUDA_VISIBLE_DEVICES="": CUDA sees no GPU',
    ]


def test_a_running_pod_with_its_gpu_in_order_gets_nothing_blocks_it(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = pod("trainer", 4, node_name="gpu-1", phase="Running", runtimeClassName="nvidia")
    scripted(kube_api, trainer)
    status, out, _ = explain(kube_api, tmp_path, capsys, "pod", "trainer", "-n", NAMESPACE)
    assert status == 0
    assert out.startswith("Pod ml/trainer: Running on node gpu-1\n")
    assert "\nnothing blocks it\n" in out


# --- Offline: a Pod from a file ----------------------------------------------------------


def test_offline_a_pod_file_gets_the_policys_verdict_and_what_its_spec_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    trainer = pod("trainer", 4, runtimeClassName="nvidia")
    trainer["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    del trainer["status"]
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(json.dumps(trainer))
    status = main(["explain", "-f", str(manifest), "--policy", str(policy_file), "-o", "json"])
    [record] = json.loads(capsys.readouterr().out)
    assert status == 1
    assert (record["source"], record["document"], record["line"]) == (str(manifest), 1, 1)
    assert record["state"] == "offline"
    # The privileged container is said once: by the policy's denial that judged it.
    assert kinds(record) == ["policy-denies"]
    assert record["verdict"]["allowed"] is False
    assert any(line.startswith("privileged: ") for line in record["verdict"]["denied"])
    assert record["causes"][0]["summary"].startswith("the policy denies it (privileged")
    assert record["notes"][-1].startswith("offline: the policy's verdict and what the Pod spec")
    assert "gpu-admission explain pod NAME -n NAMESPACE" in record["notes"][-1]


def test_offline_a_clean_pod_gets_nothing_blocks_it_and_the_live_form(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(json.dumps(pod("trainer", 4, runtimeClassName="nvidia")))
    status = main(["explain", "-f", str(manifest), "--policy", str(policy_file)])
    out = capsys.readouterr().out
    assert status == 0
    assert out.startswith(f"Pod ml/trainer: from {manifest}:1 (offline)\n")
    assert "\nnothing blocks it\n" in out
    assert "need the live form: gpu-admission explain pod NAME -n NAMESPACE" in out


def test_a_name_and_a_file_together_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["explain", "pod", "trainer", "-f", str(tmp_path / "pod.yaml")])
    assert status == 2
    assert capsys.readouterr().err == (
        "gpu-admission: error: explain: give either pod NAME (live) or -f PATH (offline), "
        "not both\n"
    )


def explain_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, list[dict[str, Any]] | str, str]:
    """``explain`` offline with the test's policy: the status, the JSON records (with
    ``-o json``) or the text, and stderr."""
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    status = main(["explain", *args, "--policy", str(policy_file)])
    captured = capsys.readouterr()
    out = json.loads(captured.out) if "json" in args and captured.out else captured.out
    return status, out, captured.err


def test_offline_reads_files_directories_standard_input_and_r_as_review_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: -f took one FILE; a directory, a second path or -R were usage errors.
    pods = tmp_path / "pods"
    (pods / "team").mkdir(parents=True)
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}}
    (pods / "a.yaml").write_text(
        json.dumps(pod("first", 4, runtimeClassName="nvidia")) + "\n---\n" + json.dumps(config)
    )
    (pods / "team" / "b.json").write_text(json.dumps(pod("second", 4, runtimeClassName="nvidia")))
    (tmp_path / "c.yaml").write_text(json.dumps(pod("third", 4, runtimeClassName="nvidia")))
    piped = pod("piped", 2, runtimeClassName="nvidia")
    piped["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(piped)))

    status, out, err = explain_files(tmp_path, capsys, "-f", str(pods))
    assert (status, out) == (2, "")
    assert err == (
        "gpu-admission: error: 1 manifest file(s) in subdirectories were not read (such as "
        f"{pods / 'team' / 'b.json'}): add -R to read them (or name the files)\n"
    )

    status, records, err = explain_files(
        tmp_path, capsys, "-f", str(pods), "-R", "-f", "-", str(tmp_path / "c.yaml"), "-o", "json"
    )
    assert status == 1  # the piped Pod is privileged: the policy denies it
    assert [(r["source"], r["document"], r["pod"]) for r in records] == [
        (str(pods / "a.yaml"), 1, "ml/first"),
        (str(pods / "team" / "b.json"), 1, "ml/second"),
        ("-", 1, "ml/piped"),
        (str(tmp_path / "c.yaml"), 1, "ml/third"),
    ]
    assert [r["verdict"]["allowed"] for r in records] == [True, True, False, True]
    # What is no Pod is skipped, and said so: its Pods are review's to judge.
    assert err == (
        f"gpu-admission: note: {pods / 'a.yaml'} document 2 (line 3): ConfigMap/settings is not "
        "a Pod, skipped: explain reads Pods (`gpu-admission review -f` judges workloads)\n"
    )


def test_offline_n_wins_over_the_pods_own_namespace_as_review_n(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: explain's -n filled in only Pods that named no namespace, unlike review -n.
    manifest = tmp_path / "pods.yaml"
    elsewhere = pod("trainer", 4, namespace="elsewhere", runtimeClassName="nvidia")
    unnamed = pod("helper", 4, runtimeClassName="nvidia")
    del unnamed["metadata"]["namespace"]
    manifest.write_text(json.dumps(elsewhere) + "\n---\n" + json.dumps(unnamed))
    _, records, _ = explain_files(tmp_path, capsys, "-f", str(manifest), "-o", "json")
    assert [r["pod"] for r in records] == ["elsewhere/trainer", "default/helper"]
    _, records, _ = explain_files(tmp_path, capsys, "-f", str(manifest), "-n", "ml", "-o", "json")
    assert [r["pod"] for r in records] == ["ml/trainer", "ml/helper"]
    assert main(["review", "-f", str(manifest), "-n", "ml", "-o", "json"]) in (0, 1)
    reviewed = json.loads(capsys.readouterr().out)
    assert [r["namespace"] for r in reviewed if "namespace" in r] == ["ml", "ml"]


def test_offline_an_unreadable_file_is_an_error_and_the_others_are_explained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(json.dumps(pod("trainer", 4, runtimeClassName="nvidia")))
    missing = tmp_path / "missing.yaml"
    status, out, err = explain_files(tmp_path, capsys, "-f", str(manifest), str(missing))
    assert status == 2
    assert isinstance(out, str) and out.startswith(f"Pod ml/trainer: from {manifest}:1")
    assert err.startswith(f"gpu-admission: error: {missing}: ")
    assert err.count("\n") == 1


def test_offline_files_without_a_pod_are_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "deploy.yaml"
    manifest.write_text(json.dumps({"apiVersion": "apps/v1", "kind": "Deployment"}))
    status, out, err = explain_files(tmp_path, capsys, "-f", str(manifest), "-o", "json")
    assert (status, out) == (2, "")
    assert err.splitlines() == [
        f"gpu-admission: note: {manifest} document 1 (line 1): Deployment/? is not a Pod, "
        "skipped: explain reads Pods (`gpu-admission review -f` judges workloads)",
        f"gpu-admission: error: no Pod in {manifest}: explain reads Pods",
    ]


def test_r_without_f_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "pod", "trainer", "-R"]) == 2
    assert capsys.readouterr().err == (
        "gpu-admission: error: explain: -R reads the directories given with -f: pod NAME reads "
        "one Pod\n"
    )


# --- Many Pods from one reading, as `inspect` reads them -----------------------------------


def test_one_reading_explains_every_pending_pod_through_paged_narrowed_lists(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    vision = pod("detector", 2, namespace="vision")
    scripted(
        kube_api,
        running("busy-2", "gpu-2", 6),
        pod("trainer", 6),
        vision,
        failed_scheduling("trainer"),
        # An event of an earlier Pod of the same name (another uid) is not this Pod's.
        failed_scheduling("detector")
        | {
            "metadata": {"name": "detector.1", "namespace": "vision"},
            "involvedObject": {
                "kind": "Pod",
                "namespace": "vision",
                "name": "detector",
                "uid": "old",
            },
        },
    )
    policy = parse_policy(POLICY)
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    with connect(str(kubeconfig)) as cluster:
        pods = list(pending_pods(cluster, None))
        facts = read_cluster_facts(cluster, policy, pods, all_namespaces=True)
        first = {
            e.pod: e.causes[0].kind if e.causes else ""
            for e in (explain_pod(p, facts, policy) for p in pods)
        }
    assert [p["metadata"]["name"] for p in pods] == ["trainer", "detector"]
    assert (facts.node_count, [n.name for n in facts.nodes]) == (6, ["gpu-1", "gpu-2", "mig-1"])
    assert first == {"ml/trainer": "insufficient-gpus", "vision/detector": ""}
    assert set(facts.events) == {("ml", "trainer")}
    # Every list paged, and narrowed by field selectors where the API server offers them.
    lists = [
        (r.path, r.query.get("fieldSelector", [""])[0], r.query.get("limit", [""])[0])
        for r in kube_api.requests_to("GET")
    ]
    assert lists == [
        ("/api/v1/pods", "status.phase=Pending", "500"),
        ("/api/v1/nodes", "", "500"),
        ("/api/v1/events", "reason=FailedScheduling,involvedObject.kind=Pod", "500"),
        ("/api/v1/resourcequotas", "", "500"),
        # The allocations: read once the first Pod's free GPUs are compared.
        ("/api/v1/pods", "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed", "500"),
    ]


@pytest.mark.parametrize(
    "field",
    ["schedulingGates", "tolerations", "resourceClaims", "nodeSelector", "affinity", "containers"],
)
@pytest.mark.parametrize("value", [7, "x", {"a": 1}, [1, "x", None], None])
def test_offline_a_malformed_field_is_explained_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any
) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    trainer = pod("trainer", 4, runtimeClassName="nvidia")
    trainer["spec"][field] = value
    trainer["status"] = {"conditions": value, "resourceClaimStatuses": value}
    manifest = tmp_path / "pod.json"
    manifest.write_text(json.dumps(trainer))
    status = main(["explain", "-f", str(manifest), "--policy", str(policy_file), "-o", "json"])
    captured = capsys.readouterr()
    assert status in (0, 1), captured.err
    assert [r["pod"] for r in json.loads(captured.out)] == ["ml/trainer"]


def test_once_the_event_has_expired_the_schedulers_words_come_from_the_pod_condition(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = pod("trainer", 6)
    trainer["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/6 nodes are available: 2 Insufficient nvidia.com/gpu, 4 node(s) "
            "didn't match Pod's node affinity/selector.",
        }
    ]
    scripted(kube_api, running("busy-2", "gpu-2", 6), trainer)
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert record["podScheduled"].startswith("False Unschedulable: 0/6 nodes are available")
    assert record["scheduler"]["message"] == record["podScheduled"].split(": ", 1)[1]
    assert kinds(record) == ["insufficient-gpus"]
    assert record["causes"][0]["details"][0] == 'the scheduler: "2 Insufficient nvidia.com/gpu"'
    assert "the scheduler has written no FailedScheduling event about it" not in record["notes"]


def test_a_pod_that_asks_for_no_gpu_gets_the_schedulers_reasons_as_causes(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = (
        "0/6 nodes are available: 3 node(s) had untolerated taint {nvidia.com/gpu: present}, "
        "3 Insufficient cpu."
    )
    scripted(
        kube_api,
        pod("web", None, tolerations=[], nodeSelector={}),
        failed_scheduling("web", message),
    )
    status, record = explain_json(kube_api, tmp_path, capsys, "web")
    assert status == 1
    # The scheduler lists its reasons alphabetically: they are told in the guide's order,
    # resources before taints.
    assert [c["summary"] for c in record["causes"]] == [
        'the scheduler: "3 Insufficient cpu"',
        'the scheduler: "3 node(s) had untolerated taint {nvidia.com/gpu: present}"',
    ]
    assert (
        "it asks for no GPU: the scheduler's reasons are told in the guide's order"
        in record["notes"]
    )


# --- Answers an on-call engineer can trust: node health, the Pod's own hardware, free GPUs -


def test_notready_cordoned_and_removed_gpu_nodes_send_to_the_admins_not_to_a_toleration(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "add to spec.tolerations: {key: node.kubernetes.io/unschedulable...}" and, for
    # a NotReady node, "add toleration node.kubernetes.io/not-ready".
    cordoned = training_node("gpu-1")
    cordoned["spec"]["unschedulable"] = True
    cordoned["spec"]["taints"].append(
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    )
    not_ready = training_node("gpu-2")
    not_ready["spec"]["taints"].append(
        {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    )
    not_ready["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    removed = training_node("gpu-3")
    removed["spec"]["taints"].append(
        {"key": "ToBeDeletedByClusterAutoscaler", "value": "1733400000", "effect": "NoSchedule"}
    )
    message = (
        "0/7 nodes are available: 1 node(s) were unschedulable, 2 node(s) had untolerated "
        "taint(s), 4 node(s) didn't match Pod's node affinity/selector."
    )
    kube_api.register("", "v1", "events", "Event")
    kube_api.add_all([cordoned, not_ready, removed, node("cpu-1")])
    kube_api.add_all([pod("trainer", 4), failed_scheduling("trainer", message)])
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert kinds(record) == ["unavailable-nodes"]
    [cause] = record["causes"]
    assert cause["summary"] == (
        "3 GPU nodes offering nvidia.com/gpu are cordoned (gpu-1) / NotReady (gpu-2) / being "
        "removed (gpu-3)"
    )
    assert "ask the cluster's administrators" in cause["fix"]
    assert "add to" not in cause["fix"] and "node.kubernetes.io" not in cause["fix"]
    assert cause["details"] == [
        'the scheduler: "1 node(s) were unschedulable"',
        'the scheduler: "2 node(s) had untolerated taint(s)"',
    ]


def test_a_selector_some_gpu_nodes_match_is_no_cause_and_none_picks_no_hardware(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the H100 nodes full, "its node selector matches none of the GPU nodes" and
    # "write nodeSelector ...: NVIDIA-A100-SXM4-80GB" (the first value alphabetically).
    a100 = training_node("a100-1")
    a100["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-80GB"
    h100 = {"example.com/pool": "training", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    message = (
        "0/7 nodes are available: 2 Insufficient nvidia.com/gpu, 5 node(s) didn't match Pod's "
        "node affinity/selector."
    )
    scripted(
        kube_api,
        a100,
        running("busy-2", "gpu-2", 8),
        pod("trainer", 8, nodeSelector=h100),
        failed_scheduling("trainer", message),
    )
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert kinds(record) == ["insufficient-gpus"]
    [cause] = record["causes"]
    assert cause["details"][1:] == [
        "gpu-1: 8 allocatable, 4 allocated, 4 free",
        "gpu-2: 8 allocatable, 8 allocated, 0 free",
    ]
    assert "A100" not in json.dumps(record["causes"])


def test_free_gpus_come_from_usable_nodes_and_the_fix_never_asks_for_0(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "have at most 8 free" (the 8 of a cordoned node) and "ask for 0 or fewer".
    message = (
        "0/6 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable."
    )
    scripted(
        kube_api,
        running("busy-2", "gpu-2", 8),
        pod("trainer", 4),
        failed_scheduling("trainer", message),
    )
    stored = kube_api.get("/api/v1/nodes/gpu-1")
    assert stored is not None
    stored["spec"]["unschedulable"] = True
    kube_api.replace(stored)
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert kinds(record) == ["insufficient-gpus", "unavailable-nodes"]
    short = record["causes"][0]
    assert short["summary"] == (
        "not enough free nvidia.com/gpu: it asks for 4 on one node (spec.containers[0]); 1 GPU "
        "node offering it that nothing else blocks has 0 free"
    )
    assert short["fix"] == (
        "wait for GPU Pods on these nodes to finish; or add GPU nodes (ask #ml-platform)"
    )


def test_a_node_whose_gpus_are_not_allocatable_is_named_and_the_init_container_that_asks(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "ask for at most 0 per Pod" where a node has capacity 8, allocatable 0.
    broken = training_node("gpu-1")
    broken["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    setup = {
        "name": "fetch",
        "image": "registry.example/fetch:1",
        "resources": {"limits": {"nvidia.com/gpu": "2"}},
    }
    kube_api.register("", "v1", "events", "Event")
    kube_api.add_all([broken, node("cpu-1")])
    kube_api.add_all(
        [
            pod("trainer", 1, initContainers=[setup]),
            failed_scheduling("trainer", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."),
        ]
    )
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    [cause] = record["causes"]
    assert cause["summary"] == (
        "not enough free nvidia.com/gpu: it asks for 2 on one node (spec.initContainers[0]); "
        "1 GPU node offering it that nothing else blocks has 0 free"
    )
    assert cause["details"][1] == "gpu-1: 8 capacity but 0 allocatable, 0 allocated, 0 free"
    assert cause["fix"] == (
        "gpu-1: nvidia.com/gpu capacity above allocatable, its device plugin is down or reports "
        "GPUs unhealthy: ask the cluster's administrators to repair it (`kubectl describe node "
        "gpu-1`, the device plugin Pod's logs); or add GPU nodes (ask #ml-platform)"
    )
    assert "at most 0" not in cause["fix"]


def test_nodes_that_pass_explains_checks_are_not_said_to_take_the_pod(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "2 GPU nodes can take it now ... the scheduler's last attempt is older", where
    # topology spread (which explain does not read) kept it off them.
    message = (
        "0/6 nodes are available: 2 node(s) didn't match pod topology spread constraints, "
        "4 node(s) didn't match Pod's node affinity/selector."
    )
    scripted(kube_api, pod("trainer", 2), failed_scheduling("trainer", message))
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert [c["summary"] for c in record["causes"]] == [
        'the scheduler: "2 node(s) didn\'t match pod topology spread constraints"'
    ]
    [note] = [n for n in record["notes"] if "checks explain makes" in n]
    assert note.startswith(
        "2 GPU nodes (gpu-1, gpu-2) pass the checks explain makes (resources, taints, selector, "
        "affinity); the scheduler's reasons"
    )
    assert "can take it" not in json.dumps(record)


# --- Pods spec.nodeName binds: the kubelet's word ------------------------------------------


def test_a_pod_nodename_pins_to_a_cpu_node_rejected_out_of_gpus_is_no_nothing_blocks_it(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "nothing blocks it", exit 0, for a Pod the kubelet rejected.
    rejected = pod("trainer", 1, node_name="cpu-1", phase="Failed")
    rejected["status"].update(
        reason="OutOfnvidia.com/gpu",
        message="Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, "
        "requested: 1, used: 0, capacity: 0",
    )
    scripted(kube_api, rejected)
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    [cause] = record["causes"]
    assert cause["kind"] == "kubelet-rejected"
    assert cause["summary"] == (
        "the kubelet of node cpu-1 rejected it, out of nvidia.com/gpu: node cpu-1 has no "
        "nvidia.com/gpu (it is no GPU node), and spec.nodeName put it there without the "
        "scheduler"
    )
    assert cause["fix"].startswith("remove spec.nodeName and let the scheduler choose a node")
    assert cause["details"][0].startswith("status.reason OutOfnvidia.com/gpu: Pod was rejected")


def test_a_pending_pod_nodename_binds_to_a_full_gpu_node_is_told_the_free_gpus(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # runtimeClassName as the training pool wants: only the GPUs are wrong.
    scripted(
        kube_api,
        running("busy-2", "gpu-2", 6),
        pod("trainer", 4, node_name="gpu-2", runtimeClassName="nvidia"),
    )
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    [cause] = record["causes"]
    assert (cause["kind"], cause["details"]) == (
        "kubelet-rejected",
        [
            "nvidia.com/gpu: it asks for 4, the node has 8 allocatable, 6 taken by other Pods, "
            "2 free"
        ],
    )
    # On gpu-1 (4 of 8 taken, its own 4 among the allocations read) it fits.
    kube_api.add(pod("fits", 4, node_name="gpu-1", runtimeClassName="nvidia"))
    status, record = explain_json(kube_api, tmp_path, capsys, "fits")
    assert (status, record["causes"]) == (0, [])


def test_a_claims_nodes_are_those_publishing_its_devices_and_the_fix_counts_them(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: with no vendor request, every GPU node counted as offering the claim's devices,
    # so the taint cause named gpu-1 and mig-1, which publish no ResourceSlice.
    claimed_gpu_cluster(kube_api)
    published = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "gpu-2-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "gpu-2",
            "pool": {"name": "gpu-2", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}],
        },
    }
    claim = kube_api.get("/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/trainer-gpu-x7k2p")
    assert claim is not None
    claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = 4
    kube_api.replace(claim)
    trainer = kube_api.get("/api/v1/namespaces/ml/pods/trainer")
    assert trainer is not None
    trainer["spec"]["tolerations"] = []
    kube_api.replace(trainer)
    kube_api.add(published)
    status, record = explain_json(kube_api, tmp_path, capsys, "trainer")
    assert status == 1
    assert kinds(record) == ["untolerated-taint", "unallocatable-claim"]
    assert record["causes"][0]["summary"] == (
        "taint nvidia.com/gpu=present:NoSchedule on 1 GPU node offering its claims' devices is "
        "not tolerated (gpu-2)"
    )
    assert record["causes"][1]["fix"].startswith(
        "it asks for 4 devices; the cluster's ResourceSlices publish 2 of driver gpu.nvidia.com "
        "in all: free devices of its classes, or ask for fewer"
    )


def test_the_policy_that_judged_is_named_and_the_packaged_default_says_so(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: without --policy, the packaged default judged in silence (pools "in no pool",
    # no tenant contacts).
    scripted(kube_api, pod("trainer", 4))
    kubeconfig = str(kube_api.write_kubeconfig(tmp_path / "kubeconfig"))
    main(["explain", "pod", "trainer", "-n", NAMESPACE, "--kubeconfig", kubeconfig])
    out = capsys.readouterr().out
    assert out.splitlines()[1] == (
        "  policy: the packaged default (pass --policy with the deployed one)"
    )
    main(["explain", "pod", "trainer", "-n", NAMESPACE, "--kubeconfig", kubeconfig, "-o", "json"])
    [record] = json.loads(capsys.readouterr().out)
    assert record["policy"] == "the packaged default (pass --policy with the deployed one)"
    status, out, _ = explain(kube_api, tmp_path, capsys, "pod", "trainer", "-n", NAMESPACE)
    assert out.splitlines()[1] == f"  policy: {tmp_path / 'policy.yaml'}"
