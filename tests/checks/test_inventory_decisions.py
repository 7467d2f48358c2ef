"""What the node inventory adds to decisions (``decide(..., nodes=)``): resource names no node
advertises, topology from the nodes' observed sizes, and ``spec.nodeName`` judged by the node
it names. Every finding from the inventory alone is a warning; without a snapshot, decisions
are exactly what they were."""

from __future__ import annotations

import base64
import json
from functools import cache
from typing import Any

import pytest

import webhook
from tests.support.admission import (
    admission,
    assert_allowed_clean,
    container,
    denied,
    pod,
    policy,
    status_message,
    warnings,
    with_spec,
)
from webhook.core.inventory import NodeFields, NodeSnapshot, node_info

POOL = "example.com/pool"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
RESERVED_TAINT = {"key": POOL, "value": "reserved", "effect": "NoSchedule"}
SPEC = f"""
gpuNodeTaints: [{{key: nvidia.com/gpu, value: present, effect: NoSchedule}}]
pools:
  - name: reserved
    nodeSelector: {{{POOL}: reserved}}
    taints: [{{key: {POOL}, value: reserved, effect: NoSchedule}}]
    namespaces: [research]
    gpusPerNode: 4
    resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
  - name: inference
    nodeSelector: {{{POOL}: inference}}
    taints: [{{key: {POOL}, value: inference, effect: NoSchedule}}]
    resources: [{{name: nvidia.com/mig-3g.20gb, sharing: MIG}}]
  - name: open
    nodeSelector: {{{POOL}: open}}
    taints: [{{key: {POOL}, value: open, effect: NoSchedule}}]
    resources: [{{name: nvidia.com/gpu.shared, sharing: TimeSlicing}}]
"""


@cache
def inventory_policy(switches: str = "") -> webhook.Policy:
    return policy(SPEC + switches, name="inventory")


def node(
    name: str,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    capacity: dict[str, str] | None = None,
) -> dict[str, Any]:
    resources = {"cpu": "64", "memory": "256Gi", **(capacity or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints or []},
        "status": {"capacity": resources, "allocatable": resources},
    }


CLUSTER = [
    node("cpu-1"),
    node(
        "reserved-1",
        {POOL: "reserved", "nvidia.com/gpu.present": "true"},
        [RESERVED_TAINT],
        {"nvidia.com/gpu": "8"},
    ),
    node(
        "mig-1",
        {"nvidia.com/gpu.present": "true"},
        [GPU_TAINT],
        {"nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-2g.20gb": "6", "nvidia.com/gpu": "0"},
    ),
    # A GPU node whose device plugin is not up yet: nothing advertised, GFD's label only.
    node("starting-1", {"nvidia.com/gpu.present": "true"}),
    node("open-1", {POOL: "open"}, [{"key": POOL, "value": "open", "effect": "NoSchedule"}]),
]


def snapshot(nodes: list[dict[str, Any]] = CLUSTER, policy_: webhook.Policy | None = None):
    policy_ = policy_ or inventory_policy()
    kept = {n["metadata"]["name"]: node_info(n, policy_) for n in nodes}
    return NodeSnapshot(kept, NodeFields.of(policy_))


def same(a: webhook.Decision, b: webhook.Decision) -> bool:
    """The same answer, but for the request's uid."""
    return {**a.response["response"], "uid": ""} == {**b.response["response"], "uid": ""}


def judge(obj: dict, nodes: NodeSnapshot | None, policy_: webhook.Policy | None = None, **kw):
    return webhook.decide(
        admission(obj, **kw), policy_ or inventory_policy(), mutate=False, nodes=nodes
    )


# --------------------------------------------------------------------- advertised names


def test_an_undeclared_mig_name_no_node_advertises_is_warned_with_the_advertised_names() -> None:
    obj = pod(container(gpu=1, resource="nvidia.com/mig-1g.11gb"))
    without = judge(obj, None)
    decision = judge(obj, snapshot())
    assert decision.allowed
    [warning] = warnings(decision)
    assert "no node advertises it" in warning
    assert "nodes advertise nvidia.com/mig-1g.10gb" in warning
    assert "nvidia.com/mig-2g.20gb" in warning
    assert [f.rule for f in decision.findings] == [f.rule for f in without.findings]


def test_an_undeclared_name_is_warned_even_where_unknown_resources_are_allowed() -> None:
    lenient = policy(SPEC + "unknownResources: Allow\n", name="lenient")
    obj = pod(container(gpu=1, resource="nvidia.com/fpga"))
    assert_allowed_clean(judge(obj, None, lenient))
    decision = judge(obj, snapshot(policy_=lenient), lenient)
    assert decision.allowed
    [warning] = warnings(decision)
    assert 'no node advertises "nvidia.com/fpga"' in warning
    assert "nodes advertise nvidia.com/gpu" in warning


def test_a_name_some_node_advertises_is_judged_as_without_an_inventory() -> None:
    obj = pod(container(gpu=1, resource="nvidia.com/mig-2g.20gb"))
    assert same(judge(obj, snapshot()), judge(obj, None))


def test_a_name_a_pool_declares_is_admitted_without_a_warning_though_no_node_has_it() -> None:
    obj = pod(
        container(gpu=1, resource="nvidia.com/mig-3g.20gb"),
        tolerations=[{"key": POOL, "operator": "Equal", "value": "inference"}],
        node_selector={POOL: "inference"},
    )
    assert_allowed_clean(judge(obj, snapshot()))


def test_a_near_miss_stays_the_policys_denial() -> None:
    obj = pod(container(gpu=1, resource="nvidia.com/GPU"))
    decision = judge(obj, snapshot())
    assert same(decision, judge(obj, None))
    assert denied(decision) == [
        ("resource-name", "spec.containers[0].resources.limits[nvidia.com/GPU]")
    ]


def test_with_no_node_advertising_anything_the_warning_says_so() -> None:
    obj = pod(container(gpu=1, resource="nvidia.com/mig-1g.11gb"))
    [warning] = warnings(judge(obj, snapshot([node("cpu-1")])))
    assert "no node advertises any resource under nvidia.com now" in warning


def test_the_switch_turns_it_off() -> None:
    off = inventory_policy("nodeInventory: {advertisedNames: false}\n")
    obj = pod(container(gpu=1, resource="nvidia.com/mig-1g.11gb"))
    assert same(judge(obj, snapshot(policy_=off), off), judge(obj, None, off))


# --------------------------------------------------------------------------- topology

RESERVED_POD = {
    "tolerations": [{"key": POOL, "operator": "Equal", "value": "reserved"}],
    "node_selector": {POOL: "reserved"},
}


def test_a_pool_larger_than_declared_admits_what_fits_its_largest_node() -> None:
    obj = pod(container(gpu=8), **RESERVED_POD)
    assert [r for r, _ in denied(judge(obj, None, namespace="research"))] == ["topology"]
    assert_allowed_clean(judge(obj, snapshot(), namespace="research"))


def test_beyond_both_the_declared_and_the_observed_size_is_still_denied() -> None:
    decision = judge(pod(container(gpu=16), **RESERVED_POD), snapshot(), namespace="research")
    assert denied(decision) == [("topology", "spec.containers[0].resources.limits[nvidia.com/gpu]")]
    assert 'node "reserved-1", the largest of pool "reserved" offers 8' in status_message(decision)


def test_a_size_only_the_inventory_knows_gives_a_warning() -> None:
    obj = pod(container(gpu=16))  # nvidia.com/gpu outside the pools: the unpooled GPU nodes
    unpooled = policy(
        "resources: [{name: nvidia.com/gpu, sharing: Exclusive}]\n"
        "gpuNodeTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]\n",
        name="unpooled",
    )
    nodes = snapshot([node("big", {}, [GPU_TAINT], {"nvidia.com/gpu": "8"})], unpooled)
    assert_allowed_clean(judge(obj, None, unpooled))
    decision = judge(obj, nodes, unpooled)
    assert decision.allowed
    [warning] = warnings(decision)
    assert 'node "big", the largest of the cluster offers 8' in warning


def test_a_node_that_does_not_list_a_resource_tells_nothing_of_its_size() -> None:
    obj = pod(container(gpu=16), **RESERVED_POD)
    listed_nothing = node("reserved-2", {POOL: "reserved"}, [RESERVED_TAINT])
    decision = judge(obj, snapshot([listed_nothing]), namespace="research")
    assert same(decision, judge(obj, None, namespace="research"))


# --------------------------------------------------------------------------- nodeName

PRIVILEGED = pod(container(privileged=True))


def on(obj: dict, node_name: str) -> dict:
    return with_spec(obj, nodeName=node_name)


def test_a_cpu_node_takes_a_pod_out_of_gpu_reach() -> None:
    obj = on(PRIVILEGED, "cpu-1")
    assert "privileged" in {r for r, _ in denied(judge(obj, None))}
    decision = judge(obj, snapshot())
    assert decision.allowed and denied(decision) == []
    # Judged as a Pod that cannot reach a GPU node: the otherPods mode (Audit by default).
    assert [(f.rule, f.mode, f.scope) for f in decision.findings] == [
        ("privileged", "Audit", "otherPods")
    ]


@pytest.mark.parametrize("node_name", ["starting-1", "mig-1", "reserved-1", "open-1", "unknown"])
def test_a_node_with_any_sign_of_a_gpu_or_unknown_keeps_the_pod_in_reach(node_name: str) -> None:
    decision = judge(on(PRIVILEGED, node_name), snapshot(), namespace="research")
    assert "privileged" in {r for r, _ in denied(decision)}


@pytest.mark.parametrize(
    "sign",
    [
        {"labels": {"feature.node.kubernetes.io/pci-0302_10de.present": "true"}},
        {"labels": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
        {"labels": {POOL: "somewhere"}},
        {"taints": [{"key": "nvidia.com/gpu", "value": "other", "effect": "PreferNoSchedule"}]},
        {"capacity": {"nvidia.com/gpu": "0"}},
    ],
)
def test_each_sign_of_a_gpu_makes_a_node_no_cpu_node(sign: dict) -> None:
    nodes = snapshot([node("n", **sign)])
    assert "privileged" in {r for r, _ in denied(judge(on(PRIVILEGED, "n"), nodes))}


def test_where_gpu_nodes_are_untainted_node_name_never_takes_a_pod_out_of_reach() -> None:
    untainted = policy("gpuNodesTainted: false\n", name="untainted")
    decision = judge(on(PRIVILEGED, "cpu-1"), snapshot(policy_=untainted), untainted)
    assert "privileged" in {r for r, _ in denied(decision)}


def test_a_reserved_pools_node_is_refused_to_a_closed_namespace() -> None:
    for obj in (on(pod(container(gpu=1)), "reserved-1"), on(pod(container()), "reserved-1")):
        decision = judge(obj, snapshot())
        assert denied(decision) == [("pool-access", "spec.nodeName")]
        message = status_message(decision)
        assert 'node "reserved-1" is in pool "reserved"' in message
        assert "nodeName skips the scheduler and the pool's taints" in message


def test_a_reserved_pools_node_is_open_to_its_namespace() -> None:
    assert_allowed_clean(
        judge(on(pod(container(gpu=1)), "reserved-1"), snapshot(), namespace="research")
    )


def test_a_cpu_node_breaches_no_reservation_and_a_gpu_node_in_no_pool_is_not_placed() -> None:
    assert_allowed_clean(judge(on(pod(container()), "cpu-1"), snapshot()))
    # A GPU node no pool selects may be a reserved pool's, its label on its way.
    decision = judge(on(pod(container()), "mig-1"), snapshot())
    assert denied(decision) == [("pool-access", "spec.nodeName")]
    assert "cannot tell whether the node is in a pool" in status_message(decision)


def test_an_unknown_node_is_judged_as_without_an_inventory() -> None:
    obj = on(pod(container(gpu=1)), "nowhere")
    assert same(judge(obj, snapshot()), judge(obj, None))
    assert ("pool-access", "spec.nodeName") in denied(judge(obj, snapshot()))


def test_a_pools_node_lacking_the_resource_is_warned() -> None:
    obj = on(pod(container(gpu=1, resource="nvidia.com/gpu.shared")), "reserved-1")
    decision = judge(obj, snapshot(), namespace="research")
    assert decision.allowed
    [warning] = warnings(decision)
    assert 'node "reserved-1" is in pool "reserved", which does not offer' in warning


def test_the_switch_turns_node_name_resolution_off() -> None:
    off = inventory_policy("nodeInventory: {nodeName: false}\n")
    obj = on(PRIVILEGED, "cpu-1")
    assert same(judge(obj, snapshot(policy_=off), off), judge(obj, None, off))


@pytest.mark.parametrize(
    "fields",
    [
        NodeFields(frozenset({"other/label"}), ("nvidia.com",)),
        NodeFields(frozenset({POOL}), ("example.com",)),
    ],
    ids=["other pool label keys", "other vendor domains"],
)
def test_a_snapshot_kept_for_other_fields_is_not_trusted_for_node_name(
    fields: NodeFields,
) -> None:
    other = NodeSnapshot({"cpu-1": node_info(node("cpu-1"), fields)}, fields)
    obj = on(PRIVILEGED, "cpu-1")
    assert same(judge(obj, other), judge(obj, None))


def test_the_mutation_confines_a_bound_pod_to_its_nodes_pool() -> None:
    obj = on(pod(container(gpu=1)), "reserved-1")
    decision = webhook.decide(
        admission(obj, namespace="research"), inventory_policy(), mutate=True, nodes=snapshot()
    )
    patch = decision.response["response"].get("patch")
    assert patch is not None
    operations = json.loads(base64.b64decode(patch))
    text = json.dumps(operations)
    assert '"reserved"' in text and "inference" not in text


# ------------------------------------------------------ what the inventory cannot place


def test_a_gpu_node_whose_pool_label_is_not_there_yet_is_judged_as_unknown() -> None:
    """Its taint and GPU say it is a GPU node; no pool selects it (yet): a closed namespace
    must not get the reserved pool's GPUs by naming it."""
    unlabelled = node(
        "gpu-9", {"nvidia.com/gpu.present": "true"}, [GPU_TAINT], {"nvidia.com/gpu": "8"}
    )
    obj = on(pod(container(gpu=4)), "gpu-9")
    decision = judge(obj, snapshot([unlabelled]))
    assert same(decision, judge(obj, None))
    assert ("pool-access", "spec.nodeName") in denied(decision)


@pytest.mark.parametrize(
    "sign",
    [
        {"labels": {"feature.node.kubernetes.io/pci-10de.present": "true"}},
        {"labels": {"feature.node.kubernetes.io/pci-0300_10de_2330.present": "true"}},
        {"labels": {"nvidia.com/gpu.deploy.driver": "true"}},
        {"labels": {"cloud.google.com/gke-accelerator": "nvidia-l4"}},
        {"labels": {"karpenter.k8s.aws/instance-gpu-count": "8"}},
        {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
        {"taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true",
                     "effect": "NoSchedule"}]},
    ],
)  # fmt: skip
def test_labels_the_gpu_operator_nfd_and_clouds_write_and_a_starting_node_are_no_cpu_node(
    sign: dict,
) -> None:
    nodes = snapshot([node("n", **sign)])
    assert "privileged" in {r for r, _ in denied(judge(on(PRIVILEGED, "n"), nodes))}


OVERLAPPING = f"""
gpuNodeTaints: [{{key: nvidia.com/gpu, value: present, effect: NoSchedule}}]
pools:
  - name: a100
    nodeSelector: {{{POOL}: shared}}
    resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
  - name: batch
    nodeSelector: {{{POOL}: shared}}
    resources: [{{name: nvidia.com/gpu, sharing: TimeSlicing}}]
"""


def test_pools_a_node_shares_never_make_the_inventory_deny() -> None:
    overlapping = policy(OVERLAPPING, name="overlapping")
    nodes = snapshot([node("gpu-1", {POOL: "shared"}, [GPU_TAINT])], overlapping)
    plain = on(pod(container(gpu=1)), "gpu-1")
    annotated = on(pod(container(gpu=1), annotations={"gpu-admission.io/pool": "a100"}), "gpu-1")
    for obj in (plain, annotated):
        without = judge(obj, None, overlapping)
        assert {r for r, _ in denied(judge(obj, nodes, overlapping))} <= {
            r for r, _ in denied(without)
        }
    assert judge(annotated, nodes, overlapping).allowed


def test_a_template_naming_a_closed_pools_node_is_refused_when_it_is_written() -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "work"},
        "spec": {
            "selector": {"matchLabels": {"app": "work"}},
            "template": with_spec(pod(container(gpu=1)), nodeName="reserved-1"),
        },
    }
    del deployment["spec"]["template"]["apiVersion"], deployment["spec"]["template"]["kind"]
    decision = judge(deployment, snapshot())
    assert [r for r, _ in denied(decision)] == ["pool-access"]
    assert "may not use the pool(s) that offer nvidia.com/gpu (reserved)" in status_message(
        decision
    )
    assert judge(deployment, snapshot(), namespace="research").allowed


def test_only_the_first_names_of_a_template_are_ranked_by_likeness() -> None:
    names = [f"nvidia.com/mig-{i}g.99gb" for i in range(1, 11)]
    obj = pod(container(limits={n: 1 for n in names}))
    found = judge(obj, snapshot()).findings
    hints = [f.violation.hint for f in found if f.rule == "resource-name"]
    assert len(hints) == 10
    alphabetical = "nodes advertise nvidia.com/gpu, nvidia.com/mig-1g.10gb, nvidia.com/mig-2g.20gb"
    assert not hints[0].startswith(alphabetical)  # ranked: the MIG names first
    assert all(h.startswith(alphabetical) for h in hints[8:])
    long_name = "nvidia.com/mig-" + "x" * 100
    [hint] = [
        f.violation.hint
        for f in judge(pod(container(limits={long_name: 1})), snapshot()).findings
        if f.rule == "resource-name"
    ]
    assert hint.startswith(alphabetical) or "malformed" in hint or "write" in hint
