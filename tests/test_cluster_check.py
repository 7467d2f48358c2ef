"""``gpu-admission cluster check``: a scripted cluster of 12 nodes and its device plugin
DaemonSets in the fake API server, one node, pool or DaemonSet for each kind of drift, reported
once each with the right nodes (exit 1); the same cluster put right agrees with the policy (exit
0), its GKE-style nodes (no GPU feature-discovery labels) compared with no product; an
unreachable or forbidding API server is exit 2 with one line; GPU nodes without the product
label drift only where a tenant is kept to products."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kubeapi import FakeKubeAPI
from tests.support.cluster_objects import node, plugin_pod
from tests.support.paths import REPO
from webhook import parse_policy
from webhook.audit.drift import DRIFT_KINDS, find_drift
from webhook.audit.drift_finding import Drift
from webhook.cluster.listing import selector_text
from webhook.core.inventory import NodeFields, node_info
from webhook.policy.model import DaemonSetName

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
    - name: partitioned
      nodeSelector: {example.com/pool: partitioned}
      resources:
        - {name: nvidia.com/gpu, sharing: Exclusive}
        - {name: nvidia.com/mig-1g.10gb, sharing: MIG}
        - {name: nvidia.com/mig-2g.20gb, sharing: MIG}
      taints:
        - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
  devicePluginDaemonSets:
    - {namespace: gpu-operator, name: nvidia-device-plugin-daemonset}
    - {namespace: kube-system, name: nvidia-gpu-device-plugin}
"""

# The policy with a tenant kept to a product: GPU nodes without the product label drift.
PRODUCTS_POLICY = POLICY.replace(
    "  devicePluginDaemonSets:",
    "  tenants:\n"
    "    - namespaces: [vision-*]\n"
    "      entitlements: {products: [NVIDIA-H100-80GB-HBM3]}\n"
    "  devicePluginDaemonSets:",
)
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TRAINING_TAINT = {"key": "example.com/pool", "value": "training", "effect": "NoSchedule"}
# The GPU Operator labels the nodes its device plugin is to run on.
DEPLOY_PLUGIN = {"nvidia.com/gpu.deploy.device-plugin": "true"}


def training(name: str, **changes: Any) -> dict[str, Any]:
    return node(
        name,
        labels={
            "example.com/pool": "training",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.memory": "81559",
            "nvidia.com/mig.capable": "true",  # not partitioned: no profile to compare
            **DEPLOY_PLUGIN,
        },
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
            "nvidia.com/mig.capable": "false",
            **DEPLOY_PLUGIN,
        },
        taints=(GPU_TAINT,),
        gpus={"nvidia.com/gpu.shared": "8"},
        **changes,
    )


def partitioned(name: str, labels: dict[str, str], gpus: dict[str, str]) -> dict[str, Any]:
    return node(
        name,
        labels={
            "example.com/pool": "partitioned",
            "nvidia.com/mig.capable": "true",
            **DEPLOY_PLUGIN,
            **labels,
        },
        taints=(GPU_TAINT,),
        gpus=gpus,
    )


def gke(name: str) -> dict[str, Any]:
    """A GKE node: its own device plugin, no GPU feature discovery's labels."""
    return node(
        name,
        labels={"example.com/pool": "reserved", "cloud.google.com/gke-accelerator": "h100"},
        gpus={"nvidia.com/gpu": "8"},
    )


def clean_cluster() -> list[dict[str, Any]]:
    """Twelve nodes that agree with POLICY: CPU nodes (one in a pool of CPU nodes the policy
    does not know), training's, inference's (time-sliced, as that pool declares), reserved's
    (GKE-style: no GPU feature-discovery labels, no GPU taint) and partitioned's (A100s in MIG
    instances, one with the mixed strategy, one with the single)."""
    return [
        node("cpu-1"),
        node("cpu-2"),
        node("cpu-3", labels={"example.com/pool": "batch"}),  # a CPU pool the policy ignores
        training("train-1"),
        training("train-2"),
        training("train-3"),
        inference("infer-1"),
        inference("infer-2"),
        gke("reserved-1"),
        gke("reserved-2"),
        partitioned(
            "mig-1",
            {
                "nvidia.com/gpu.product": "NVIDIA-A100-80GB-PCIe",
                "nvidia.com/gpu.memory": "81920",
                "nvidia.com/mig.strategy": "mixed",
            },
            {"nvidia.com/mig-1g.10gb": "8", "nvidia.com/mig-2g.20gb": "6"},
        ),
        partitioned(
            "mig-2",
            {
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
                "nvidia.com/gpu.memory": "4864",  # one instance's
                "nvidia.com/mig.strategy": "single",
            },
            {"nvidia.com/gpu": "56"},
        ),
    ]


def daemonset(namespace: str, name: str, template: dict[str, Any], desired: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": template},
        },
        "status": {"desiredNumberScheduled": desired, "numberReady": desired},
    }


def operator_plugin(desired: int) -> dict[str, Any]:
    """The GPU Operator's device plugin: on the nodes it labelled, tolerating the GPU taint
    (and here the pools' own)."""
    template = {
        "nodeSelector": dict(DEPLOY_PLUGIN),
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "example.com/pool", "operator": "Exists"},
        ],
        "containers": [{"name": "plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}],
    }
    return daemonset("gpu-operator", "nvidia-device-plugin-daemonset", template, desired)


def gke_plugin(desired: int) -> dict[str, Any]:
    """GKE's device plugin: on the nodes with an accelerator, tolerating every taint."""
    accelerator = {"key": "cloud.google.com/gke-accelerator", "operator": "Exists"}
    template = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [accelerator]}]
                }
            }
        },
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "plugin", "image": "gke.gcr.io/nvidia-gpu-device-plugin"}],
    }
    return daemonset("kube-system", "nvidia-gpu-device-plugin", template, desired)


def drifting_cluster() -> list[dict[str, Any]]:
    """The clean cluster with one of each kind of drift (and reserved's nodes and GKE's
    device plugin gone)."""
    nodes = [n for n in clean_cluster() if not n["metadata"]["name"].startswith("reserved")]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    # gpu-node-in-no-pool (and gpu-node-missing-taint for one of them): two GPU nodes that no
    # pool selects, one by its capacity, one by GPU feature discovery's label only.
    # mig-product-not-catalogued: the first is a MIG-capable A800, which no catalogue lists.
    a800 = {"nvidia.com/gpu.product": "NVIDIA-A800-SXM4-80GB", "nvidia.com/mig.capable": "true"}
    nodes.append(node("stray-1", labels=a800, taints=(GPU_TAINT,), gpus={"nvidia.com/gpu": "4"}))
    nodes.append(node("stray-2", labels={"nvidia.com/gpu.present": "true"}))
    # pool-node-missing-taint: train-2 lost the pool's own taint.
    by_name["train-2"]["spec"]["taints"] = [GPU_TAINT]
    # pool-node-undeclared-resource: train-3 was re-partitioned into MIG instances (which its
    # H100 80GB offers: no profile drift).
    by_name["train-3"]["status"]["capacity"]["nvidia.com/mig-1g.10gb"] = "56"
    # time-sliced-node-in-exclusive-pool: train-1 runs the time-slicing configuration.
    by_name["train-1"]["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "4"
    # mig-profile-not-catalogued: mig-1's board is now a 40 GB A100, whose 2g profile is
    # 2g.10gb, and it still advertises 2g.20gb (its 1g.10gb is a 40 GB A100's too).
    by_name["mig-1"]["metadata"]["labels"].update(
        {"nvidia.com/gpu.product": "NVIDIA-A100-PCIE-40GB", "nvidia.com/gpu.memory": "40960"}
    )
    # device-plugin-desired-mismatch: a CPU node labelled for the device plugin by mistake.
    by_name["cpu-3"]["metadata"]["labels"].update(DEPLOY_PLUGIN)
    return nodes


def write_policy(tmp_path: Path, text: str = POLICY) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def check(
    kube_api: FakeKubeAPI, tmp_path: Path, *args: str, policy: str = POLICY
) -> subprocess.CompletedProcess[str]:
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    command = [sys.executable, "-m", "webhook.cli", "cluster", "check"]
    command += ["--policy", str(write_policy(tmp_path, policy)), "--kubeconfig", str(kubeconfig)]
    return subprocess.run(
        command + list(args), cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_each_kind_of_drift_is_reported_once_with_its_nodes(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    kube_api.add_all(drifting_cluster())
    # The GPU Operator's plugin covers 7 GPU nodes, and runs on cpu-3 too; GKE's is gone.
    kube_api.add(operator_plugin(desired=8))
    result = check(kube_api, tmp_path, "-o", "json", policy=PRODUCTS_POLICY)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["nodes"] == 12
    assert report["devicePluginDaemonSets"] == [
        "gpu-operator/nvidia-device-plugin-daemonset",
        "kube-system/nvidia-gpu-device-plugin",
    ]
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
        ("mig-product-not-catalogued", "NVIDIA-A800-SXM4-80GB", ["stray-1"]),
        ("mig-profile-not-catalogued", "A100-40GB: 2g.20gb", ["mig-1"]),
        ("device-plugin-daemonset-missing", "kube-system/nvidia-gpu-device-plugin", []),
        (
            "device-plugin-desired-mismatch",
            "gpu-operator/nvidia-device-plugin-daemonset",
            ["cpu-3"],
        ),
        ("gpu-node-without-product-label", "", ["stray-2"]),
    ]
    assert [kind for kind, _, _ in found] == list(DRIFT_KINDS)
    messages = {d["kind"]: d["message"] for d in report["drift"]}
    assert "example.com/pool=reserved" in messages["pool-without-nodes"]
    assert (
        "kubectl taint nodes NODE example.com/pool=training:NoSchedule"
        in (messages["pool-node-missing-taint"])
    )
    assert (
        "migCatalogue.customProducts (name: NVIDIA-A800-SXM4-80GB"
        in (messages["mig-product-not-catalogued"])
    )
    assert (
        "does not list for A100-40GB (1g.10gb, 1g.5gb, " in (messages["mig-profile-not-catalogued"])
    )
    assert (
        "would run 8 Pods (status.desiredNumberScheduled; 8 ready) where 7 GPU nodes admit it"
        in messages["device-plugin-desired-mismatch"]
    )
    assert "runs on 1 node without GPUs: cpu-3" in messages["device-plugin-desired-mismatch"]

    text = check(kube_api, tmp_path, policy=PRODUCTS_POLICY)
    assert text.returncode == 1
    lines = text.stdout.splitlines()
    assert len(lines) == len(DRIFT_KINDS) + 1
    assert lines[-1] == "12 nodes and 2 device plugin DaemonSets read; 11 disagreements"


def test_a_cluster_that_agrees_with_the_policy_exits_0(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    kube_api.add_all(clean_cluster())
    kube_api.add_all([operator_plugin(desired=7), gke_plugin(desired=2)])
    result = check(kube_api, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == (
        "12 nodes and 2 device plugin DaemonSets read; the policy and the cluster agree\n"
    )


def test_without_device_plugin_daemonsets_none_is_read_and_the_summary_says_so(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    kube_api.add_all(clean_cluster())
    policy = POLICY.split("  devicePluginDaemonSets:")[0]
    result = check(kube_api, tmp_path, policy=policy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == (
        "12 nodes read (no devicePluginDaemonSets: device plugins not compared); "
        "the policy and the cluster agree\n"
    )
    assert kube_api.requests_to("GET", "/apis/apps/*") == []


def test_nodes_are_read_in_pages(kube_api: FakeKubeAPI, tmp_path: Path) -> None:
    for index in range(1200):
        kube_api.add(training(f"train-{index:04d}"))
    pools = ("inf", "res", "mig")
    kube_api.add_all(n for n in clean_cluster() if n["metadata"]["name"].startswith(pools))
    kube_api.add_all([operator_plugin(desired=1204), gke_plugin(desired=2)])
    result = check(kube_api, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(kube_api.requests_to("GET", "/api/v1/nodes")) == 3


OPERATOR_PLUGIN = "/apis/apps/v1/namespaces/gpu-operator/daemonsets/nvidia-device-plugin-daemonset"


@pytest.mark.parametrize(
    ("path", "code", "expected"),
    [
        ("/api/v1/nodes", 403, "cannot list nodes (HTTP 403): nodes is forbidden"),
        ("/api/v1/nodes", 503, "cannot list nodes (HTTP 503): injected failure (503)"),
        (
            OPERATOR_PLUGIN,
            403,
            "cannot read DaemonSet gpu-operator/nvidia-device-plugin-daemonset (HTTP 403): "
            'daemonsets.apps "nvidia-device-plugin-daemonset" is forbidden',
        ),
        (
            OPERATOR_PLUGIN,
            500,
            "cannot read DaemonSet gpu-operator/nvidia-device-plugin-daemonset (HTTP 500)",
        ),
    ],
)
def test_a_check_that_cannot_read_the_cluster_exits_2_with_one_line(
    kube_api: FakeKubeAPI, tmp_path: Path, path: str, code: int, expected: str
) -> None:
    kube_api.add_all(clean_cluster())
    if code == 403:
        kube_api.forbid(path)
    else:
        kube_api.fail(path, code, times=None)
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
    # The device plugin's label is kept only where a DaemonSet selects by it (check_cluster).
    assert dict(kept.labels) == {
        "example.com/pool": "training",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/mig.capable": "true",
    }
    assert kept.gpu_labelled is True
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


# The kinds these tests add to what the six before compare.
NEW_KINDS = DRIFT_KINDS[6:]


def compared(
    policy: Any, nodes: list[Any], daemonsets: Any = None, placed: Any = None
) -> list[Drift]:
    """The drift of the kinds that compare products, profiles and device plugins."""
    return [d for d in find_drift(policy, nodes, daemonsets, placed) if d.kind in NEW_KINDS]


def test_nodes_without_feature_discovery_labels_are_compared_with_no_product() -> None:
    """GKE's nodes carry its own labels and device plugin: no nvidia.com/gpu.product, so no
    product or profile of theirs is compared, whatever they advertise."""
    policy = parse_policy(POLICY)
    partitioned_gke = gke("reserved-1")
    partitioned_gke["metadata"]["labels"]["cloud.google.com/gke-gpu-partition-size"] = "1g.5gb"
    partitioned_gke["status"]["capacity"]["nvidia.com/mig-1g.5gb"] = "7"
    nodes = [node_info(n, policy) for n in (partitioned_gke, gke("reserved-2"))]
    assert compared(policy, nodes) == []


def test_products_that_cannot_be_partitioned_are_not_compared() -> None:
    policy = parse_policy(POLICY)
    t4 = inference("infer-t4")
    t4["metadata"]["labels"]["nvidia.com/gpu.product"] = "Tesla-T4"
    nodes = [node_info(n, policy) for n in (t4, inference("infer-l4"))]
    assert compared(policy, nodes) == []


def test_a_single_strategy_profile_and_a_product_left_out_of_the_products() -> None:
    text = POLICY.replace(
        "  devicePluginDaemonSets:",
        "  migCatalogue: {products: [A100-40GB, A100-80GB]}\n  devicePluginDaemonSets:",
    )
    policy = parse_policy(text)
    single = clean_cluster()[-1]  # mig-2: NVIDIA-A100-SXM4-40GB-MIG-1g.5gb
    single["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-40GB-MIG-1g.6gb"
    h100 = training("train-3")
    h100["status"]["capacity"]["nvidia.com/mig-3g.40gb.shared"] = "8"
    # train-1's H100s are not in MIG instances: that the products leave them out is no drift.
    nodes = [node_info(n, policy) for n in (single, h100, training("train-1"))]
    drift = compared(policy, nodes)
    assert [(d.kind, d.subject, d.nodes) for d in drift] == [
        ("mig-product-not-catalogued", "H100-80GB", ("train-3",)),
        ("mig-profile-not-catalogued", "A100-40GB: 1g.6gb", ("mig-2",)),
    ]
    assert "add H100-80GB to migCatalogue.products" in drift[0].message


def plugin_nodes(policy: Any, nodes: list[dict[str, Any]] | None = None) -> list[Any]:
    """The nodes (the clean cluster's but GKE's) as check_cluster keeps them for the GPU
    Operator's device plugin."""
    kept = NodeFields(policy.gpu_label_keys | set(DEPLOY_PLUGIN), policy.vendor_domains)
    if nodes is None:
        nodes = [n for n in clean_cluster() if not n["metadata"]["name"].startswith("res")]
    return [node_info(n, kept) for n in nodes]


def test_a_device_plugin_covers_the_nodes_whose_taints_it_tolerates() -> None:
    policy = parse_policy(POLICY)
    named = DaemonSetName("gpu-operator", "nvidia-device-plugin-daemonset")
    nodes = plugin_nodes(policy)
    assert compared(policy, nodes, {named: operator_plugin(desired=7)}) == []
    # Without the pools' toleration, training's nodes are not its: 4 GPU nodes admit it.
    narrow = operator_plugin(desired=7)
    del narrow["spec"]["template"]["spec"]["tolerations"][1]
    [drift] = compared(policy, nodes, {named: narrow})
    assert (drift.kind, drift.nodes) == ("device-plugin-desired-mismatch", ())
    assert "would run 7 Pods (status.desiredNumberScheduled; 7 ready) where 4 GPU nodes" in (
        drift.message
    )
    # A cordoned or starting node keeps its Pod: the DaemonSet controller tolerates that.
    cordoned = copy.deepcopy(training("train-1"))
    cordoned["spec"]["taints"].append(
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    )
    cordoned["spec"]["taints"].append(
        {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}
    )
    assert nodes[3].name == "train-1"
    nodes[3] = plugin_nodes(policy, [cordoned])[0]
    assert compared(policy, nodes, {named: operator_plugin(desired=7)}) == []


def test_a_device_plugin_selects_nodes_as_the_scheduler_does() -> None:
    policy = parse_policy(POLICY)
    named = DaemonSetName("kube-system", "nvidia-gpu-device-plugin")
    kept = NodeFields(
        policy.gpu_label_keys | {"cloud.google.com/gke-accelerator"}, policy.vendor_domains
    )
    nodes = [node_info(n, kept) for n in (gke("reserved-1"), gke("reserved-2"), node("cpu-1"))]
    assert compared(policy, nodes, {named: gke_plugin(desired=2)}) == []
    # A term on the node's name (matchFields) narrows it to one node.
    one = gke_plugin(desired=2)
    terms = one["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    terms[0]["matchFields"] = [
        {"key": "metadata.name", "operator": "NotIn", "values": ["reserved-2"]}
    ]
    [drift] = compared(policy, nodes, {named: one})
    assert "where 1 GPU node admits it" in drift.message
    # A status without counts (a DaemonSet just created) wants none.
    del one["status"]
    assert "would run 0 Pods (status.desiredNumberScheduled; 0 ready)" in (
        compared(policy, nodes, {named: one})[0].message
    )


def test_a_device_plugin_short_of_pods_names_the_gpu_nodes_without_one(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    kube_api.add_all(clean_cluster())
    operator = operator_plugin(desired=5)
    operator["metadata"]["uid"] = "ds-uid"
    gpu_nodes = ["train-1", "train-2", "train-3", "infer-1", "infer-2"]
    pods = [plugin_pod(operator, name) for name in gpu_nodes]
    # A Pod not yet scheduled is bound to its node by a term on metadata.name.
    del pods[-1]["spec"]["nodeName"]
    pods[-1]["spec"]["affinity"] = required_on("infer-2")
    # The selector matches a Pod of another controller on mig-1: not the DaemonSet's.
    pods.append(plugin_pod(operator, "mig-1", owner="another-uid"))
    kube_api.add_all([operator, gke_plugin(desired=2), *pods])
    result = check(kube_api, tmp_path, "-o", "json")
    assert result.returncode == 1, result.stderr
    [drift] = json.loads(result.stdout)["drift"]
    assert (drift["kind"], drift["nodes"]) == ("device-plugin-desired-mismatch", ["mig-1", "mig-2"])
    assert "where 7 GPU nodes admit it" in drift["message"]
    assert "2 GPU nodes it admits have no Pod of it" in drift["message"]
    [listed] = kube_api.requests_to("GET", "/api/v1/namespaces/gpu-operator/pods")
    assert listed.query["labelSelector"] == ["app=nvidia-device-plugin-daemonset"]


def required_on(node_name: str) -> dict[str, Any]:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def test_a_device_plugin_whose_every_node_has_a_pod_is_a_stale_count() -> None:
    policy = parse_policy(POLICY)
    named = DaemonSetName("gpu-operator", "nvidia-device-plugin-daemonset")
    nodes = plugin_nodes(policy)
    everywhere = frozenset(node.name for node in nodes)
    [drift] = compared(policy, nodes, {named: operator_plugin(desired=6)}, lambda _: everywhere)
    assert drift.nodes == ()
    assert "its status is stale" in drift.message


def test_pods_that_cannot_be_listed_exit_2_with_one_line(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    kube_api.add_all([*clean_cluster(), operator_plugin(desired=5), gke_plugin(desired=2)])
    kube_api.forbid("/api/v1/namespaces/gpu-operator/pods")
    result = check(kube_api, tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    [line] = result.stderr.splitlines()
    assert (
        "cannot list the Pods of DaemonSet gpu-operator/nvidia-device-plugin-daemonset "
        "(HTTP 403)" in line
    )
    assert line.endswith(
        "bind the gpu-admission-auditor ClusterRole (manifests/base/auditor-clusterrole.yaml)"
    )


@pytest.mark.parametrize(
    ("selector", "text"),
    [
        ({"matchLabels": {"app": "x", "tier": "gpu"}}, "app=x,tier=gpu"),
        (
            {
                "matchLabels": {"app": "x"},
                "matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a", "b"]},
                    {"key": "old", "operator": "NotIn", "values": ["1"]},
                    {"key": "gpu", "operator": "Exists"},
                    {"key": "gone", "operator": "DoesNotExist"},
                ],
            },
            "app=x,zone in (a,b),old notin (1),gpu,!gone",
        ),
        (None, ""),
    ],
)
def test_a_daemonsets_selector_is_sent_as_a_label_selector(selector: Any, text: str) -> None:
    assert selector_text(selector) == text


def test_gpu_nodes_without_a_product_label_are_named_where_a_tenant_is_kept_to_products() -> None:
    """GKE's nodes lack feature discovery's product label: a tenant kept to products cannot
    reach them, and cluster check names them; without such a tenant it says nothing."""
    for text, expected in ((POLICY, []), (PRODUCTS_POLICY, [("reserved-1", "reserved-2")])):
        policy = parse_policy(text)
        nodes = [
            node_info(n, policy)
            for n in (gke("reserved-1"), gke("reserved-2"), training("train-1"), node("cpu"))
        ]
        found = [d for d in find_drift(policy, nodes) if d.kind == "gpu-node-without-product-label"]
        assert [d.nodes for d in found] == expected
    assert found[0].message == (
        "2 GPU nodes without GPU feature discovery's product label (nvidia.com/gpu.product): "
        "reserved-1, reserved-2; the GPU Pods of tenants that may use some products only "
        "(tenants[0] (vision-*)) are confined by that label and cannot land there: run GPU "
        "feature discovery (the GPU Operator runs it), or label them with their product "
        "(kubectl label nodes NODE nvidia.com/gpu.product=PRODUCT)"
    )


def test_classes_the_gpu_defaults_name_must_exist(kube_api: FakeKubeAPI, tmp_path: Path) -> None:
    """A RuntimeClass or PriorityClass the mutating webhook writes into GPU workloads that the
    cluster does not have gets every Pod of them refused: cluster check reads each by name."""
    text = POLICY.replace(
        "  devicePluginDaemonSets:",
        "  mutation:\n"
        "    enabled: true\n"
        "    gpuDefaults: {runtimeClassName: nvidia-cdi, priorityClassName: gpu-batch}\n"
        "  devicePluginDaemonSets:",
    ).replace(
        "    - name: inference\n",
        "    - name: inference\n      priorityClassName: gpu-inference\n",
    )
    kube_api.add_all(clean_cluster())
    kube_api.add_all([operator_plugin(desired=7), gke_plugin(desired=2)])
    kube_api.add(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia-cdi"},
            "handler": "nvidia-cdi",
        }
    )
    kube_api.add(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "gpu-batch"},
            "value": 1000,
        }
    )
    result = check(kube_api, tmp_path, "-o", "json", policy=text)
    assert result.returncode == 1, result.stderr
    [drift] = json.loads(result.stdout)["drift"]
    assert (drift["kind"], drift["subject"]) == ("priority-class-missing", "gpu-inference")
    assert drift["message"].startswith(
        "PriorityClass 'gpu-inference' (pools[1].priorityClassName (inference)) does not exist"
    )
    kube_api.add(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "gpu-inference"},
            "value": 2000,
        }
    )
    assert check(kube_api, tmp_path, policy=text).returncode == 0
    kube_api.forbid("/apis/node.k8s.io/v1/runtimeclasses/*")
    refused = check(kube_api, tmp_path, policy=text)
    assert refused.returncode == 2
    assert "cannot read RuntimeClass nvidia-cdi (HTTP 403)" in refused.stderr


def admin_claim_template(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "all-gpus", "namespace": namespace, "uid": f"uid-{namespace}"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {
                                "deviceClassName": "gpu.nvidia.com",
                                "allocationMode": "All",
                                "adminAccess": True,
                            },
                        }
                    ]
                }
            }
        },
    }


def test_every_claim_with_admin_access_is_reported_with_what_allowed_it(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    kube_api.add_all(clean_cluster())
    kube_api.add_all([operator_plugin(desired=7), gke_plugin(desired=2)])
    label = {"resource.kubernetes.io/admin-access": "true"}
    for name, labels in (("monitoring", label), ("team-a", label), ("team-b", {})):
        kube_api.add(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
        )
        kube_api.add(admin_claim_template(name))
    granted = POLICY.replace(
        "spec:\n",
        "spec:\n  tenants:\n    - namespaces: [monitoring]\n      grants: {draAdminAccess: true}\n",
        1,
    )
    result = check(kube_api, tmp_path, "-o", "json", policy=granted)
    assert result.returncode == 1, result.stderr
    found = [
        (d["kind"], d["level"], d["namespaces"], d["message"])
        for d in json.loads(result.stdout)["drift"]
        if d["kind"].startswith("dra-admin-access")
    ]
    assert [(kind, level, namespaces) for kind, level, namespaces, _ in found] == [
        ("dra-admin-access", "info", ["monitoring"]),
        ("dra-admin-access-ungranted", "drift", ["team-a"]),
        ("dra-admin-access-ungranted", "drift", ["team-b"]),
    ]
    assert found[0][3] == (
        "ResourceClaimTemplate monitoring/all-gpus asks for admin access to gpu.nvidia.com "
        "devices: allowed by the namespace label resource.kubernetes.io/admin-access=true and "
        "tenants[0].grants.draAdminAccess (monitoring)"
    )
    assert "no tenant grants draAdminAccess to its namespace" in found[1][3]
    assert "no longer labelled resource.kubernetes.io/admin-access=true" in found[2][3]
