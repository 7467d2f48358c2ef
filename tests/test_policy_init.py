"""``gpu-admission policy init --from-cluster``: on a scripted cluster in the fake API server
(H100 nodes in two pools told apart by taints and a label, time-sliced L4s, MPS-shared A10Gs,
A100s in MIG instances with the mixed and the single strategy, an A800 the MIG catalogue does
not know, CPU nodes, node agents tolerating every taint in kube-system, gpu-operator and
monitoring), the policy written validates, ``cluster check`` finds it agrees with the same
cluster, a GPU Pod asking for each product is sent to that product's nodes only, and the
comments say what was seen and guessed; the node agents' namespaces are proposed as exemptions,
commented out. A cluster without GPU nodes is told so; an existing file is not overwritten
without --force."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import webhook
from tests.kubeapi import FakeKubeAPI
from tests.patching import (
    admits_node,
    apply_both,
    decide,
    decode_patch,
    tolerated,
    validate_pod,
)
from tests.test_cluster_check import GPU_TAINT, node, plugin_pod
from webhook.cli.main import main
from webhook.cluster.connection import connect
from webhook.core.inventory import NodeInfo, Taint, node_info
from webhook.operations import policy_init
from webhook.operations.daemonset_drafts import device_plugin_evidence, seen_daemonset
from webhook.operations.draft_text import yaml_scalar
from webhook.operations.policy_init import (
    AGENTS_END,
    DEFAULT_HEADER,
    HOST_PATHS,
    DefaultPolicyChanged,
    anchor_problems,
    draft_policy,
)
from webhook.operations.policy_init_reading import read_cluster

TRAINING_TAINT = {"key": "example.com/pool", "value": "training", "effect": "NoSchedule"}
H100 = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/mig.capable": "true",
}
L4 = {
    "nvidia.com/gpu.product": "NVIDIA-L4-SHARED",
    "nvidia.com/gpu.count": "2",
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
    "nvidia.com/mig.capable": "false",
}
A10G = {  # MPS, with the device plugin renaming its replicas (no -SHARED suffix)
    "nvidia.com/gpu.product": "NVIDIA-A10G",
    "nvidia.com/gpu.count": "4",
    "nvidia.com/gpu.replicas": "2",
    "nvidia.com/gpu.sharing-strategy": "mps",
}
A100_MIXED = {
    "nvidia.com/gpu.product": "NVIDIA-A100-80GB-PCIe",
    "nvidia.com/gpu.memory": "81920",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "mixed",
}
A100_SINGLE = {
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
    "nvidia.com/gpu.memory": "4864",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "single",
}
A800 = {
    "nvidia.com/gpu.product": "NVIDIA-A800-SXM4-80GB",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "mixed",
}


def cluster_nodes() -> list[dict[str, Any]]:
    """The scripted nodes: the GPU Operator's device plugin is to run on all GPU nodes but the
    A10G, which a device plugin installed with Helm serves."""
    return [{**n, "metadata": deploy_plugin(n["metadata"])} for n in scripted_nodes()]


def deploy_plugin(metadata: dict[str, Any]) -> dict[str, Any]:
    labels = metadata["labels"]
    if "nvidia.com/gpu.product" not in labels or labels.get(SHARING) == "mps":
        return metadata
    return {**metadata, "labels": {**labels, **DEPLOY_PLUGIN}}


def scripted_nodes() -> list[dict[str, Any]]:
    training = {**H100, "example.com/pool": "training"}
    general = {**H100, "example.com/pool": "general"}
    return [
        node("cpu-1"),
        node("cpu-2", labels={"example.com/pool": "general"}),  # a CPU node in a CPU pool
        node(
            "train-1",
            labels=training,
            taints=(GPU_TAINT, TRAINING_TAINT),
            gpus={"nvidia.com/gpu": "8", "nvidia.com/hostdev": "8"},
        ),
        node(
            "train-2",
            labels=training,
            taints=(GPU_TAINT, TRAINING_TAINT),
            gpus={"nvidia.com/gpu": "8", "nvidia.com/hostdev": "8"},
        ),
        node("h100-1", labels=general, taints=(GPU_TAINT,), gpus={"nvidia.com/gpu": "8"}),
        node("l4-1", labels=L4, taints=(GPU_TAINT,), gpus={"nvidia.com/gpu": "8"}),
        node("l4-2", labels=L4, taints=(GPU_TAINT,), gpus={"nvidia.com/gpu": "8"}),
        node("a10g-1", labels=A10G, taints=(GPU_TAINT,), gpus={"nvidia.com/gpu.shared": "8"}),
        node(
            "mig-mixed-1",
            labels=A100_MIXED,
            taints=(GPU_TAINT,),
            gpus={
                "nvidia.com/gpu": "2",
                "nvidia.com/mig-1g.10gb": "14",
                "nvidia.com/mig-3g.40gb": "4",
            },
        ),
        node(
            "mig-single-1", labels=A100_SINGLE, taints=(GPU_TAINT,), gpus={"nvidia.com/gpu": "56"}
        ),
        node("a800-1", labels=A800, taints=(GPU_TAINT,), gpus={"nvidia.com/mig-1g.10gb": "56"}),
    ]


def daemonset(
    namespace: str,
    name: str,
    tolerations: list[dict[str, str]],
    *,
    container: dict[str, Any] | None = None,
    node_selector: dict[str, str] | None = None,
    desired: int | None = None,
) -> dict[str, Any]:
    """A DaemonSet; with ``desired``, its status says that many Pods are wanted and ready."""
    labels = {"app": name}
    spec: dict[str, Any] = {
        "tolerations": tolerations,
        "containers": [container or {"name": name, "image": f"example.com/{name}:1"}],
    }
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    found: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }
    if desired is not None:
        found["status"] = {"desiredNumberScheduled": desired, "numberReady": desired}
    return found


EVERY_TAINT = [{"operator": "Exists"}]
GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


SHARING = "nvidia.com/gpu.sharing-strategy"
DEPLOY_PLUGIN = {"nvidia.com/gpu.deploy.device-plugin": "true"}
PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"


def plugin_container(name: str, command: str | None = None) -> dict[str, Any]:
    """A container of NVIDIA's device plugin image, running ``command`` (the image's
    entrypoint, the device plugin, without one)."""
    return {"name": name, "image": PLUGIN_IMAGE, **({"command": [command]} if command else {})}


def device_plugins(operator_desired: int = 8) -> list[dict[str, Any]]:
    """The GPU Operator's device plugin on the nodes it labelled (its image from a mirror: it is
    known by its name), and a Helm install of the device plugin for the MPS nodes, with GPU
    feature discovery and the MPS control daemon in DaemonSets of their own, from the same
    image."""
    mps = {SHARING: "mps"}
    helm = "nvidia-device-plugin"
    return [
        daemonset(
            "gpu-operator",
            "nvidia-device-plugin-daemonset",
            [*GPU_TOLERATION, *EVERY_TAINT],
            container={"name": "plugin", "image": "registry.example.com/k8s-device-plugin:v0.17.0"},
            node_selector=DEPLOY_PLUGIN,
            desired=operator_desired,
        ),
        daemonset(
            helm,
            "nvdp-nvidia-device-plugin",
            GPU_TOLERATION,
            container=plugin_container("nvidia-device-plugin-ctr", "nvidia-device-plugin"),
            node_selector=mps,
            desired=1,
        ),
        daemonset(
            helm,
            "nvdp-nvidia-device-plugin-gpu-feature-discovery",
            GPU_TOLERATION,
            container=plugin_container("gpu-feature-discovery-ctr", "gpu-feature-discovery"),
            node_selector=mps,
            desired=1,
        ),
        daemonset(
            helm,
            "nvdp-nvidia-device-plugin-mps-control-daemon",
            GPU_TOLERATION,
            container=plugin_container("mps-control-daemon-ctr", "/usr/bin/mps-control-daemon"),
            node_selector=mps,
            desired=1,
        ),
    ]


def node_agents() -> list[dict[str, Any]]:
    return [
        daemonset("kube-system", "kube-proxy", EVERY_TAINT),
        *device_plugins(),
        daemonset("monitoring", "node-exporter", EVERY_TAINT),
        daemonset(  # by key: not every taint
            "monitoring",
            "dcgm-exporter",
            GPU_TOLERATION,
            container={"name": "exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3"},
        ),
        daemonset("logging", "fluent-bit", [{"operator": "Exists", "effect": "NoSchedule"}]),
        daemonset("web", "cache", []),
    ]


@pytest.fixture
def scripted(kube_api: FakeKubeAPI, tmp_path: Path) -> Path:
    """The scripted cluster in the fake API server; its kubeconfig."""
    kube_api.add_all(cluster_nodes())
    kube_api.add_all(node_agents())
    return kube_api.write_kubeconfig(tmp_path / "kubeconfig")


def init(kubeconfig: Path, *args: str) -> int:
    return main(["policy", "init", "--from-cluster", "--kubeconfig", str(kubeconfig), *args])


def comments(text: str) -> str:
    """The comments of a policy text, each one line (as wrapped, joined)."""
    said = [line.strip()[2:] for line in text.splitlines() if line.strip().startswith("# ")]
    return re.sub(r"\s+", " ", " ".join(said))


def test_the_policy_drafted_validates_and_agrees_with_the_cluster(
    scripted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    assert init(scripted, "-o", str(policy)) == 0
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.startswith(f"gpu-admission: wrote {policy}: 7 pools for 9 GPU nodes of the ")
    assert "in no pool" not in said.err and "will report" not in said.err

    assert main(["policy", "validate", str(policy)]) == 0
    validated = capsys.readouterr().out
    assert validated.splitlines()[-1].startswith(f"{policy}: valid")
    # nvidia.com/gpu is a full card, a time-slice and a MIG instance in different pools: the
    # drafted poolPreference says which, so validate has no ambiguity to warn of.
    assert "denied as ambiguous" not in validated and "warning" not in validated

    checked = main(["cluster", "check", "--policy", str(policy), "--kubeconfig", str(scripted)])
    out = capsys.readouterr().out
    assert checked == 0, out
    assert out.endswith("the policy and the cluster agree\n"), out


def test_pools_follow_products_taints_and_sharing(scripted: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    assert init(scripted, "-o", str(policy)) == 0
    spec = yaml.safe_load(policy.read_text())["spec"]
    pools = {
        p["name"]: (
            p["nodeSelector"],
            [
                (r["name"], r["sharing"], r.get("failRequestsGreaterThanOne", False))
                for r in p["resources"]
            ],
            [f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in p.get("taints", [])],
            p.get("gpusPerNode"),
        )
        for p in spec["pools"]
    }
    gpu = "nvidia.com/gpu=present:NoSchedule"
    product = "nvidia.com/gpu.product"
    assert pools == {
        "a10g": ({product: "NVIDIA-A10G"}, [("nvidia.com/gpu.shared", "MPS", True)], [gpu], 4),
        "a100-80gb-pcie": (
            {product: "NVIDIA-A100-80GB-PCIe"},
            [
                ("nvidia.com/gpu", "Exclusive", False),
                ("nvidia.com/mig-1g.10gb", "MIG", False),
                ("nvidia.com/mig-3g.40gb", "MIG", False),
            ],
            [gpu],
            8,
        ),
        "a100-sxm4-40gb-mig-1g-5gb": (
            {product: "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"},
            [("nvidia.com/gpu", "MIG", False)],
            [gpu],
            8,
        ),
        "a800-sxm4-80gb": (
            {product: "NVIDIA-A800-SXM4-80GB"},
            [("nvidia.com/mig-1g.10gb", "MIG", False)],
            [gpu],
            8,
        ),
        "h100-80gb-hbm3-general": (
            {product: "NVIDIA-H100-80GB-HBM3", "example.com/pool": "general"},
            [("nvidia.com/gpu", "Exclusive", False)],
            [gpu],
            8,
        ),
        "h100-80gb-hbm3-training": (
            {product: "NVIDIA-H100-80GB-HBM3", "example.com/pool": "training"},
            [("nvidia.com/gpu", "Exclusive", False)],
            ["example.com/pool=training:NoSchedule", gpu],
            8,
        ),
        "l4-shared": (
            {product: "NVIDIA-L4-SHARED"},
            [("nvidia.com/gpu", "TimeSlicing", True)],
            [gpu],
            2,
        ),
    }
    assert spec["companionResources"] == ["nvidia.com/hostdev"]
    assert spec["migCatalogue"]["products"] == [
        "A100-40GB",
        "A100-80GB",
        "H100-80GB",
        "NVIDIA-A800-SXM4-80GB",
    ]
    assert spec["migCatalogue"]["customProducts"] == [
        {"name": "NVIDIA-A800-SXM4-80GB", "profiles": ["1g.10gb"]}
    ]
    # The default policy's settings stay as shipped, but for a preference among the pools that
    # share nvidia.com/gpu differently (whole GPUs first; the dedicated training pool left out).
    default = yaml.safe_load(webhook.default_policy_path().read_text())["spec"]
    for key in ("resources", "gpuNodeTaints", "rules", "newChecks", "mutation"):
        assert spec[key] == default[key], key
    *tenants, preference = spec["tenants"]
    assert tenants == default["tenants"]
    assert preference == {
        "namespaces": ["*"],
        "poolPreference": [
            "a100-80gb-pcie",
            "h100-80gb-hbm3-general",
            "a100-sxm4-40gb-mig-1g-5gb",
            "l4-shared",
        ],
    }


# A GPU Pod that asks for each product (nodeSelector on GPU feature discovery's label) and one
# of the resources its nodes advertise; and the nodes it must land on.
PRODUCT_PODS = [
    # The drafted poolPreference places it on the H100 pool that is not dedicated (tainted
    # example.com/pool=training): a Pod that wants those nodes says so (the pool annotation).
    ("NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu", {"h100-1"}),
    ("NVIDIA-L4-SHARED", "nvidia.com/gpu", {"l4-1", "l4-2"}),
    ("NVIDIA-A10G", "nvidia.com/gpu.shared", {"a10g-1"}),
    ("NVIDIA-A100-80GB-PCIe", "nvidia.com/mig-3g.40gb", {"mig-mixed-1"}),
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/gpu", {"mig-single-1"}),
    ("NVIDIA-A800-SXM4-80GB", "nvidia.com/mig-1g.10gb", {"a800-1"}),
]


def gpu_pod(product: str, resource: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "work", "namespace": "ml"},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": product},
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                    "resources": {"limits": {resource: "1"}},
                }
            ],
        },
    }


def landing_nodes(pod: dict[str, Any]) -> set[str]:
    """The scripted nodes the scheduler may place the Pod on, by labels and taints (room aside)."""
    return {
        n["metadata"]["name"]
        for n in cluster_nodes()
        if admits_node(pod, n["metadata"]["labels"])
        and all(
            tolerated(pod, t)
            for t in n["spec"].get("taints", [])
            if t["effect"] != "PreferNoSchedule"
        )
    }


@pytest.mark.parametrize(("product", "resource", "expected"), PRODUCT_PODS)
def test_a_gpu_pod_asking_for_a_product_lands_on_its_nodes(
    scripted: Path, tmp_path: Path, product: str, resource: str, expected: set[str]
) -> None:
    path = tmp_path / "policy.yaml"
    assert init(scripted, "-o", str(path)) == 0
    policy = webhook.load_policy(path)
    pod = gpu_pod(product, resource)
    assert landing_nodes(pod) == set()  # no toleration for the GPU taint: it would pend
    decision = decide(pod, policy)
    assert decision.allowed, decision.response
    mutated = apply_both(pod, decode_patch(decision))
    validate_pod(mutated)
    assert landing_nodes(mutated) == expected
    assert decide(mutated, policy, mutate=False).allowed


def test_comments_say_what_was_seen_and_guessed_and_propose_exemptions(
    scripted: Path, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    assert init(scripted, "-o", str(path)) == 0
    text = path.read_text()
    said = comments(text)
    assert (
        "Found: 2 nodes labelled nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3, "
        "example.com/pool=training and tainted example.com/pool=training:NoSchedule, "
        "nvidia.com/gpu=present:NoSchedule: train-1, train-2." in said
    )
    assert (
        "Found: nvidia.com/gpu.sharing-strategy=time-slicing, nvidia.com/gpu.replicas=4 "
        "(GPU feature discovery): declared nvidia.com/gpu TimeSlicing." in said
    )
    assert "Found: nvidia.com/gpu.sharing-strategy=mps, nvidia.com/gpu.replicas=2" in said
    assert "Found: nvidia.com/mig.strategy=mixed (GPU feature discovery)" in said
    assert "Found: the single MIG strategy (product label ...-MIG-1g.5gb)" in said
    assert "Guessed: failRequestsGreaterThanOne on the shared resources" in said
    assert "Guessed: NVIDIA-A800-SXM4-80GB is not in the catalogue" in said
    assert "Found: nvidia.com/hostdev in the nodes' capacity" in said
    # Node agents: those exempt already named, the others proposed, commented out. A key-less
    # Exists of one effect tolerates every GPU taint of it; a toleration by key does not.
    assert (
        "Exempt above already: gpu-operator (nvidia-device-plugin-daemonset); kube-system "
        "(kube-proxy). Not exempt, and warned (not denied) under this policy: logging "
        "(fluent-bit); monitoring (node-exporter)." in said
    )
    assert "dcgm-exporter" not in said
    assert (
        "    # - namespaces:\n"
        "    #     - logging\n"
        "    #     - monitoring\n"
        "    #   exemptions:\n"
        "    #     - reason: Node agents that run on every node, GPU nodes included.\n" in text
    )
    tenants = yaml.safe_load(text)["spec"]["tenants"]
    assert not any("monitoring" in t["namespaces"] for t in tenants)
    # A tenant to start from, commented out, with a product found.
    assert "    #   entitlements:\n    #     products: [NVIDIA-A100-80GB-PCIe]\n" in text
    # Uncommented, the proposals are a policy that loads, exempts and entitles.
    proposals = [
        "    # - namespaces:\n",
        "    #     - logging\n",
        "    #     - monitoring\n",
        "    #   exemptions:\n",
        "    #     - reason: Node agents",
        "    # - namespaces: [team-a-*]\n",
        "    #   contact:",
        "    #   entitlements:\n",
        "    #     products:",
        "    #     maxGPUs:",
        "    #   reservedPools:",
    ]
    for line in proposals:
        text = text.replace(line, line.replace("    # ", "    ", 1))
    uncommented = webhook.parse_policy(text)
    assert uncommented.entitled_tenant("team-a-vision", None) is not None
    assert any(e.namespaces.matches("monitoring") for e in uncommented.exemptions)


def test_to_stdout_without_output(scripted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert init(scripted) == 0
    said = capsys.readouterr()
    assert webhook.parse_policy(said.out).pools
    assert said.err.startswith("gpu-admission: the policy: 7 pools")


def test_a_cluster_without_gpu_nodes_is_told_so(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kube_api.add_all([node("cpu-1"), node("cpu-2")])
    kube_api.add_all(node_agents())
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    path = tmp_path / "policy.yaml"
    assert init(kubeconfig, "-o", str(path)) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "gpu-admission: error: no GPU node among the 2 nodes of https://127.0.0.1:"
    )
    assert "nvidia.com/gpu.present=true" in line
    assert not path.exists()


def test_an_existing_file_is_overwritten_only_with_force(
    scripted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("mine\n")
    assert init(scripted, "-o", str(path)) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"gpu-admission: error: {path}: exists; pass --force to overwrite it"
    assert path.read_text() == "mine\n"
    assert init(scripted, "-o", str(path), "--force") == 0
    assert webhook.load_policy(path).pools


def gpu_node(name: str, labels: dict[str, str], taints: tuple[Taint, ...] = ()) -> NodeInfo:
    return NodeInfo(name, labels, False, taints, {"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "8"})


def test_nodes_no_label_tells_apart_make_one_pool_on_the_taints_they_share() -> None:
    gpu = Taint("nvidia.com/gpu", "present", "NoSchedule")
    reserved = Taint("example.com/reserved", "", "NoSchedule")
    product = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    nodes = [
        gpu_node("h100-1", product, (gpu, reserved)),
        gpu_node("h100-2", product, (gpu,)),
        gpu_node("bare-1", {}, ()),  # no label, no taint: nothing selects it alone
    ]
    draft = draft_policy(nodes, [], source="test")
    [pool] = draft.policy.pools
    assert pool.taints == ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},)
    said = comments(draft.text)
    assert (
        "Guessed: no label tells its nodes apart, but only h100-1 carries "
        "example.com/reserved:NoSchedule" in said
    )
    assert draft.unpooled == ("bare-1: no label of it fits a pool's node selector",)
    assert [d.kind for d in draft.drift] == ["gpu-node-in-no-pool", "gpu-node-missing-taint"]


def test_untainted_gpu_nodes_are_said_to_be_reachable_by_every_pod() -> None:
    nodes = [gpu_node("l4-1", {"nvidia.com/gpu.product": "NVIDIA-L4"})]
    draft = draft_policy(nodes, [], source="test")
    assert draft.policy.every_pod_reaches_gpu_nodes
    assert "Found: no GPU node carries a NoSchedule or NoExecute taint" in comments(draft.text)
    assert draft.drift == ()


def test_a_refused_list_exits_2_with_one_line(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kube_api.add_all(cluster_nodes())
    kube_api.forbid("/apis/apps/v1/daemonsets")
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    path = tmp_path / "policy.yaml"
    assert init(kubeconfig, "-o", str(path)) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("gpu-admission: error: cannot list daemonsets (HTTP 403)")
    assert "gpu-admission-auditor" in line
    assert not path.exists()


def test_nodes_are_read_as_the_inventory_keeps_them_with_every_label(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    labels = {
        "example.com/rack": "r7",  # no pool's key, no GPU label: kept for the draft only
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    }
    gpus = {"nvidia.com/gpu": "8", "example.com/fpga": "2"}
    raw = node("gpu-1", labels=labels, taints=(GPU_TAINT,), gpus=gpus)
    kube_api.add_all([raw])
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    default = webhook.default_policy_path().read_text()
    assert "  vendorDomains: [nvidia.com]\n" in default
    fpga = webhook.parse_policy(
        default.replace(
            "  vendorDomains: [nvidia.com]\n", "  vendorDomains: [nvidia.com, example.com]\n"
        )
    )
    with connect(str(kubeconfig)) as cluster:
        [as_default] = read_cluster(cluster).nodes
        [as_fpga] = read_cluster(cluster, fpga).nodes
    assert dict(as_default.labels) == {"kubernetes.io/os": "linux", **labels}
    # Nothing else differs from what the inventory keeps: the PCI label says it has a GPU.
    inventory = node_info(raw, webhook.parse_policy(default))
    assert as_default.gpu_labelled and inventory.gpu_labelled
    assert (as_default.name, as_default.taints) == (inventory.name, inventory.taints)
    assert dict(as_default.capacity) == dict(inventory.capacity) == {"nvidia.com/gpu": "8"}
    # The vendor resources are those of the policy drafted on.
    assert dict(as_fpga.capacity) == dict(as_fpga.allocatable) == gpus


def test_every_place_the_draft_is_written_at_is_in_the_shipped_default() -> None:
    assert anchor_problems(webhook.default_policy_path().read_text()) == []


def test_a_changed_default_policy_fails_naming_each_anchor_and_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    text = webhook.default_policy_path().read_text()
    changed = tmp_path / "default.yaml"
    # Comments reworded and one repeated: the policy still loads, the draft has no place.
    changed.write_text(
        text.replace(DEFAULT_HEADER, "# gpu-admission's default policy:")
        .replace(AGENTS_END, "    #     - reason: Node agents.\n")
        .replace(HOST_PATHS, HOST_PATHS + " see below.\n" + HOST_PATHS)
    )
    webhook.load_policy(changed)
    monkeypatch.setattr(policy_init, "default_policy_path", lambda: changed)
    nodes = [gpu_node("l4-1", {"nvidia.com/gpu.product": "NVIDIA-L4"})]
    with pytest.raises(DefaultPolicyChanged) as raised:
        draft_policy(nodes, [], source="test")
    assert str(raised.value) == (
        f"{changed}: policy init cannot draft on it: "
        "'# The default gpu-admission policy:' is there 0 times, not once; "
        "'  # Host paths:' is there 2 times, not once; "
        "no '    #     - reason: Node agents that run on every node, GPU nodes included.\\n' "
        "after '    # Node agents that must mount host paths' "
        "(the default policy changed without the anchors of webhook/operations/policy_init.py)"
    )


def test_the_device_plugin_daemonsets_found_are_named_with_why(
    scripted: Path, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    assert init(scripted, "-o", str(path)) == 0
    text = path.read_text()
    # GPU feature discovery and the MPS control daemon run from the same image: not named.
    assert yaml.safe_load(text)["spec"]["devicePluginDaemonSets"] == [
        {"namespace": "gpu-operator", "name": "nvidia-device-plugin-daemonset"},
        {"namespace": "nvidia-device-plugin", "name": "nvdp-nvidia-device-plugin"},
    ]
    said = comments(text)
    assert (
        "Found: gpu-operator/nvidia-device-plugin-daemonset runs NVIDIA's device plugin (its "
        "name is the one the GPU Operator gives its device plugin): 8 Pods desired, 8 ready."
        in said
    )
    assert (
        "Found: nvidia-device-plugin/nvdp-nvidia-device-plugin runs NVIDIA's device plugin (its "
        "container nvidia-device-plugin-ctr runs nvcr.io/nvidia/k8s-device-plugin:v0.17.0): "
        "1 Pod desired, 1 ready." in said
    )


def test_cluster_check_compares_the_device_plugins_drafted(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The GPU Operator's device plugin wants 7 Pods where 8 GPU nodes admit it: a800-1 has
    none. The draft says cluster check will report it, and cluster check names the node."""
    operator, *helm = device_plugins(operator_desired=7)
    operator["metadata"]["uid"] = "ds-uid"
    labelled = [n["metadata"] for n in cluster_nodes()]
    served = [m["name"] for m in labelled if DEPLOY_PLUGIN.items() <= m["labels"].items()]
    assert len(served) == 8 and "a800-1" in served
    pods = [plugin_pod(operator, name) for name in served if name != "a800-1"]
    kube_api.add_all(cluster_nodes())
    kube_api.add_all([operator, *helm, *pods])
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    policy = tmp_path / "policy.yaml"
    assert init(kubeconfig, "-o", str(policy)) == 0
    [warned] = [line for line in capsys.readouterr().err.splitlines() if "will report" in line]
    assert warned.startswith(
        "gpu-admission: cluster check will report device-plugin-desired-mismatch: DaemonSet "
        "gpu-operator/nvidia-device-plugin-daemonset would run 7 Pods "
        "(status.desiredNumberScheduled; 7 ready) where 8 GPU nodes admit it"
    )
    checked = main(
        ["cluster", "check", "--policy", str(policy), "--kubeconfig", str(kubeconfig), "-o", "json"]
    )
    assert checked == 1
    [drift] = json.loads(capsys.readouterr().out)["drift"]
    assert (drift["kind"], drift["nodes"]) == ("device-plugin-desired-mismatch", ["a800-1"])
    assert "1 GPU node it admits has no Pod of it" in drift["message"]


@pytest.mark.parametrize(
    ("name", "container", "evidence"),
    [
        (
            "nvidia-device-plugin-daemonset",
            {"name": "c", "image": "mirror.example.com/plugin:1", "command": ["/bin/sh", "-c"]},
            "its name is the one the GPU Operator gives its device plugin",
        ),
        (
            "nvdp",
            {"name": "c", "image": f"{PLUGIN_IMAGE}@sha256:{'0' * 64}"},
            f"its container c runs {PLUGIN_IMAGE}@sha256:{'0' * 64}",
        ),
        (
            "nvdp",
            {"name": "c", "image": "nvcr.io/nvidia/k8s-device-plugin"},
            "its container c runs nvcr.io/nvidia/k8s-device-plugin",
        ),
        ("gfd", plugin_container("c", "gpu-feature-discovery"), None),
        ("nvdp-config", plugin_container("c", "config-manager"), None),
        ("mirrored", {"name": "c", "image": "mirror.example.com/k8s-device-plugin:v0.17.0"}, None),
        ("dcgm", {"name": "c", "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3"}, None),
        (
            "gpu-plugin",
            {"name": "c", "image": f"gke.gcr.io/nvidia-gpu-device-plugin@sha256:{'1' * 64}"},
            f"its container c runs gke.gcr.io/nvidia-gpu-device-plugin@sha256:{'1' * 64} "
            "(GKE's device plugin)",
        ),
        (
            "nvidia-gpu-device-plugin-small-cos",
            {"name": "c", "image": "i"},
            None,
        ),  # not kube-system
    ],
)
def test_a_device_plugin_is_known_by_its_image_or_the_operators_name(
    name: str, container: dict[str, Any], evidence: str | None
) -> None:
    assert device_plugin_evidence("tools", name, {"containers": [container]}) == evidence


def test_without_a_device_plugin_found_the_setting_is_left_to_fill_in() -> None:
    gpu = Taint("nvidia.com/gpu", "present", "NoSchedule")
    nodes = [gpu_node("l4-1", {"nvidia.com/gpu.product": "NVIDIA-L4"}, (gpu,))]
    # The device plugin's image in an init container only: no device plugin runs.
    probe = daemonset("tools", "probe", GPU_TOLERATION, container={"name": "x", "image": "sh:1"})
    probe["spec"]["template"]["spec"]["initContainers"] = [plugin_container("init")]
    draft = draft_policy(nodes, [seen_daemonset(probe)], source="test")
    assert draft.policy.device_plugin_daemonsets == ()
    assert "  # devicePluginDaemonSets:\n  #   - {namespace: NAMESPACE, name: NAME}\n" in draft.text
    assert (
        "Found: no DaemonSet that runs NVIDIA's device plugin (image "
        "nvcr.io/nvidia/k8s-device-plugin, the GPU Operator's nvidia-device-plugin-daemonset, "
        "or GKE's kube-system/nvidia-gpu-device-plugin*)" in comments(draft.text)
    )


# What the API server accepts as a label value (and a taint's value): up to 63 characters.
LABEL_VALUE = st.from_regex(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", fullmatch=True).filter(
    lambda value: len(value) <= 63
)


def drafted_with(value: str) -> tuple[dict[str, str], Any]:
    """A draft on two GPU nodes of the product ``value``, one labelled and tainted ``value``
    where the other is not: its pool selects on ``value`` and declares it as the taint's."""
    other = "other" if value != "other" else "another"
    labelled = {"nvidia.com/gpu.product": value, "example.com/pool": value}
    taint = Taint("example.com/dedicated", value, "NoSchedule")
    nodes = [
        gpu_node("gpu-1", labelled, (taint,)),
        gpu_node("gpu-2", {"nvidia.com/gpu.product": value, "example.com/pool": other}),
    ]
    return labelled, draft_policy(nodes, [], source="test")


@pytest.mark.parametrize(
    "value",
    ["true", "yes", "on", "Off", "null", "1", "1.0", "1e3", "0x1", "0o7", "1_000", "2001-12-14"],
)
def test_a_label_value_yaml_reads_otherwise_is_written_as_the_same_string(value: str) -> None:
    labelled, draft = drafted_with(value)
    pool = next(p for p in draft.policy.pools if p.taints)
    assert dict(pool.node_selector) == labelled
    assert [dict(t) for t in pool.taints] == [
        {"key": "example.com/dedicated", "value": value, "effect": "NoSchedule"}
    ]
    assert f'nvidia.com/gpu.product: "{value}"\n' in draft.text


@pytest.mark.parametrize("value", ["~", "*x", "a: b", "-a", "#x", "&a", "!x", "[a]", "a #b", '"'])
def test_yaml_syntax_in_cluster_data_is_quoted(value: str) -> None:
    """Values the API server refuses in a label, but a scalar the draft writes may hold."""
    assert yaml.safe_load(f"k: {yaml_scalar(value)}") == {"k": value}
    assert yaml.safe_load(f"[{yaml_scalar(value)}]") == [value]


@settings(derandomize=True, max_examples=25, deadline=None)
@given(LABEL_VALUE)
def test_any_label_value_round_trips_through_the_draft(value: str) -> None:
    labelled, draft = drafted_with(value)
    loaded = webhook.parse_policy(draft.text)  # as the webhook loads it
    pool = next(p for p in loaded.pools if p.taints)
    assert dict(pool.node_selector) == labelled
    assert [t.get("value", "") for t in pool.taints] == [value]
    # The tenant to start from (commented out) names the product as labelled (an empty
    # product label names none).
    products = re.findall(r"^    #     products: (.*)$", draft.text, re.MULTILINE)
    assert [yaml.safe_load(p) for p in products] == ([[value]] if value else [])


def gke_node(name: str, accelerator: str, extra: dict[str, str]) -> dict[str, Any]:
    labels = {
        "cloud.google.com/gke-nodepool": f"{name.rpartition('-')[0]}-pool",
        "cloud.google.com/gke-accelerator": accelerator,
        **extra,
    }
    return node(name, labels=labels, taints=(GPU_TAINT,), gpus={"nvidia.com/gpu": "4"})


def test_gke_nodes_without_feature_discovery_make_pools_from_gkes_labels(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    time_sharing = {
        "cloud.google.com/gke-gpu-sharing-strategy": "time-sharing",
        "cloud.google.com/gke-max-shared-clients-per-gpu": "4",
    }
    mig = {"cloud.google.com/gke-gpu-partition-size": "1g.5gb"}
    kube_api.add_all(
        [
            gke_node("a3-1", "nvidia-h100-80gb", {}),
            gke_node("a3-2", "nvidia-h100-80gb", {}),
            gke_node("l4ts-1", "nvidia-l4", time_sharing),
            gke_node("mig-1", "nvidia-tesla-a100", mig),
            node("cpu-1", labels={"cloud.google.com/gke-nodepool": "default-pool"}),
            daemonset(
                "kube-system",
                "nvidia-gpu-device-plugin-small-cos",
                EVERY_TAINT,
                container={"name": "c", "image": "gke.gcr.io/nvidia-gpu-device-plugin:v1"},
                desired=4,
            ),
        ]
    )
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    path = tmp_path / "policy.yaml"
    assert init(kubeconfig, "-o", str(path)) == 0
    capsys.readouterr()
    spec = yaml.safe_load(path.read_text())["spec"]
    assert {p["name"]: (p["nodeSelector"], p["resources"]) for p in spec["pools"]} == {
        "h100-80gb": (
            {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
            [{"name": "nvidia.com/gpu", "sharing": "Exclusive"}],
        ),
        "l4": (
            {"cloud.google.com/gke-accelerator": "nvidia-l4"},
            [
                {
                    "name": "nvidia.com/gpu",
                    "sharing": "TimeSlicing",
                    "failRequestsGreaterThanOne": True,
                }
            ],
        ),
        "a100": (
            {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"},
            [{"name": "nvidia.com/gpu", "sharing": "MIG"}],
        ),
    }
    assert spec["devicePluginDaemonSets"] == [
        {"namespace": "kube-system", "name": "nvidia-gpu-device-plugin-small-cos"}
    ]
    said = comments(path.read_text())
    assert "GKE refuses a container that asks for more than one shared GPU" in said
    assert "Found: GKE's MIG partitions (cloud.google.com/gke-gpu-partition-size)" in said
    assert "keep tenants to this pool by reservedPools instead" in said
    checked = main(["cluster", "check", "--policy", str(path), "--kubeconfig", str(kubeconfig)])
    assert checked == 0, capsys.readouterr().out


def test_gpu_nodes_no_pool_can_take_give_a_draft_without_pools() -> None:
    gpu = Taint("nvidia.com/gpu", "", "NoSchedule")
    nodes = [gpu_node("bare-1", {}, (gpu,)), gpu_node("bare-2", {}, (gpu,))]
    draft = draft_policy(nodes, [], source="test")
    assert draft.pools == () and draft.policy.pools == ()
    assert len(draft.unpooled) == 2
    assert "Found: no pool could be drafted" in comments(draft.text)


EKS_TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}  # EKS' GPU node taint, no value


def eks_mix() -> list[dict[str, Any]]:
    """H100s and H200s, a MIG single-strategy A100 and time-sliced L4s, all offering
    nvidia.com/gpu, tainted as EKS taints GPU node groups."""
    shared = {"nvidia.com/gpu.replicas": "4", SHARING: "time-slicing"}
    made = [
        ("h100-1", {**H100}),
        ("h100-2", {**H100}),
        ("h200-1", {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "8"}),
        ("mig-1", {**A100_SINGLE}),
        ("l4-1", {"nvidia.com/gpu.product": "NVIDIA-L4-SHARED", **shared}),
    ]
    return [
        node(name, labels=labels, taints=(EKS_TAINT,), gpus={"nvidia.com/gpu": "8"})
        for name, labels in made
    ] + [node("cpu-1")]


def test_a_plain_gpu_pod_is_admitted_on_the_eks_mix_and_lands_on_whole_gpus() -> None:
    raw = eks_mix()
    default = webhook.parse_policy(webhook.default_policy_path().read_text())
    draft = draft_policy([node_info(n, default, every_label=True) for n in raw], [], source="t")
    assert draft.warnings == ()  # policy validate has nothing to say of it
    said = comments(draft.text)
    assert "Guessed: pools offer nvidia.com/gpu in different sharing modes" in said
    assert "it goes to pool h100-80gb-hbm3 (whole GPUs first" in said
    # gpuNodeTaints are the nodes' own, without the default's value.
    assert [dict(t) for t in draft.policy.gpu_node_taints] == [EKS_TAINT]
    assert "Found: every GPU node carries nvidia.com/gpu:NoSchedule" in said

    pod = gpu_pod("", "nvidia.com/gpu")
    del pod["spec"]["nodeSelector"]
    decision = decide(pod, draft.policy)
    assert decision.allowed, decision.response
    mutated = apply_both(pod, decode_patch(decision))
    validate_pod(mutated)
    landing = {
        n["metadata"]["name"]
        for n in raw
        if admits_node(mutated, n["metadata"]["labels"])
        and all(tolerated(mutated, t) for t in n["spec"].get("taints", []))
    }
    assert landing == {"h100-1", "h100-2"}
    assert decide(mutated, draft.policy, mutate=False).allowed
    # Its tolerations tolerate each GPU node's taints.
    for gpu_node_ in raw[:-1]:
        assert all(tolerated(mutated, t) for t in gpu_node_["spec"]["taints"])
