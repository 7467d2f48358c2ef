"""Sharing modes across both paths (issue 35): a Pod mixing exclusive, MIG, time-sliced and
MPS devices, through extended resources and the claims its templates make, is refused as on
the extended-resource path. Templates are read from the node inventory's snapshot (real
records, built from real objects by the inventory's own functions); without it, or for a
claim used through ``resourceClaimName``, the check is skipped with a warning."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import webhook
from tests.checks.test_dra_claims import claiming_pod, claims, request, template
from tests.kubeapi import FakeKubeAPI
from tests.patching import apply_both, validate_pod
from tests.serving import answers, policy_text, tls_server, wait_until
from tests.support.admission import (
    admission,
    assert_allowed_clean,
    container,
    denied,
    policy,
    status_message,
    warnings,
)
from webhook.core.dra_inventory import DraObjects, claim_template_record, device_class_record
from webhook.core.inventory import NodeFields, NodeSnapshot

NAMESPACE = "ml"
API = "resource.nvidia.com/v1beta1"
SHARING_GATES = "dra: {nvidiaDriver: {featureGates: {TimeSlicingSettings: true, MPSSupport: true}}}"
# The policy the real server runs: the gates on, nvidia.com/gpu declared exclusive.
SERVED_SPEC = policy_text(
    f"  newChecks: Enforce\n  {SHARING_GATES}\n"
    "  resources: [{name: nvidia.com/gpu, sharing: Exclusive}]\n",
    name="dra",
)


@cache
def enforcing() -> webhook.Policy:
    return policy(
        f"""
        newChecks: Enforce
        gpuNodeTaints: [{{key: nvidia.com/gpu, value: present, effect: NoSchedule}}]
        resources:
          - {{name: nvidia.com/gpu, sharing: Exclusive}}
        {SHARING_GATES}
        """,
        name="dra-sharing",
    )


def shared(strategy: str, kind: str = "GpuConfig") -> dict:
    return {
        "opaque": {
            "driver": "gpu.nvidia.com",
            "parameters": {"apiVersion": API, "kind": kind, "sharing": {"strategy": strategy}},
        }
    }


def mps_template(name: str = "mps") -> dict:
    return template(request(), config=[shared("MPS")], name=name)


def mig_template(strategy: str | None = None, name: str = "mig") -> dict:
    config = [shared(strategy, "MigDeviceConfig")] if strategy else None
    return template(request(deviceClassName="mig.nvidia.com"), config=config, name=name)


def device_class(name: str, **spec: Any) -> dict:
    """A DeviceClass whose selector pins NVIDIA's GPU driver, with more ``spec`` fields."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}],
            **spec,
        },
    }


def snapshot(
    *templates: dict, classes: tuple[dict, ...] = (), for_policy: webhook.Policy | None = None
) -> NodeSnapshot:
    """The inventory's snapshot holding these templates (in ``ml``) and DeviceClasses, kept
    for ``for_policy``'s label keys (``enforcing()``'s by default)."""
    kept = {(NAMESPACE, t["metadata"]["name"]): claim_template_record(t) for t in templates}
    known = {c["metadata"]["name"]: device_class_record(c) for c in classes}
    dra = DraObjects(known, kept, knows_device_classes=True, knows_claim_templates=True)
    return NodeSnapshot({}, NodeFields.of(for_policy or enforcing()), dra=dra)


def decide(obj: dict, nodes: NodeSnapshot | None, policy_: webhook.Policy | None = None):
    return webhook.decide(
        admission(obj, namespace=NAMESPACE), policy_ or enforcing(), mutate=False, nodes=nodes
    )


def two_claims(first: str, second: str) -> dict:
    pod = claiming_pod(claims(container("a"), "one"), claims(container("b"), "two"))
    pod["spec"]["resourceClaims"] = [
        {"name": "one", "resourceClaimTemplateName": first},
        {"name": "two", "resourceClaimTemplateName": second},
    ]
    return pod


def test_an_exclusive_gpu_and_an_mps_claim_in_one_pod_are_refused() -> None:
    pod = claiming_pod(
        container("train", gpu=1), claims(container("infer"), "gpu"), template_name="mps"
    )
    decision = decide(pod, snapshot(mps_template()))
    assert denied(decision) == [("sharing-mode", "spec.containers[1].resources.claims[0]")]
    message = status_message(decision)
    assert (
        "mixes GPU sharing modes in one Pod: request gpu of ResourceClaimTemplate mps is MPS"
        in message
    )
    assert (
        "spec.spec.devices.config[0].opaque.parameters.sharing.strategy in the template" in message
    )
    assert "nvidia.com/gpu (spec.containers[0]) is Exclusive" in message
    assert "split the work into several Pods" in message


def test_a_mig_claim_and_a_time_sliced_claim_are_refused() -> None:
    ts = template(request(), config=[shared("TimeSlicing")], name="ts")
    decision = decide(two_claims("mig", "ts"), snapshot(mig_template(), ts))
    assert denied(decision) == [("sharing-mode", "spec.containers[1].resources.claims[0]")]
    assert "ResourceClaimTemplate ts is TimeSlicing" in status_message(decision)
    assert (
        "request gpu of ResourceClaimTemplate mig (spec.containers[0].resources.claims[0]) is MIG"
        in status_message(decision)
    )


def test_one_mode_through_both_paths_is_admitted() -> None:
    pod = claiming_pod(
        container("train", gpu=1), claims(container("more"), "gpu"), template_name="whole"
    )
    assert_allowed_clean(decide(pod, snapshot(template(request(), name="whole"))))
    assert_allowed_clean(
        decide(two_claims("mig", "mig2"), snapshot(mig_template(), mig_template(name="mig2")))
    )


def test_a_template_mixing_modes_is_refused_when_it_is_written() -> None:
    mixed = template(
        request("ts"),
        request("mps"),
        config=[
            {"requests": ["ts"], **shared("TimeSlicing")},
            {"requests": ["mps"], **shared("MPS")},
        ],
    )
    decision = decide(mixed, None)
    assert denied(decision) == [
        ("sharing-mode", "spec.spec.devices.config[1].opaque.parameters.sharing.strategy")
    ]
    assert 'mixes GPU sharing modes in one claim: request "mps" is MPS, while request "ts"' in (
        status_message(decision)
    )


def test_first_available_alternatives_count_only_when_they_share_a_mode() -> None:
    either = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "whole", "deviceClassName": "gpu.nvidia.com"},
            {"name": "slice", "deviceClassName": "mig.nvidia.com"},
        ],
    }
    pod = claiming_pod(
        container("train", gpu=1), claims(container("more"), "gpu"), template_name="either"
    )
    # Either mode may be allocated: not a certain mix, so not refused.
    assert_allowed_clean(decide(pod, snapshot(template(either, name="either"))))


def test_a_template_missing_from_the_cache_is_warned_and_admitted() -> None:
    pod = claiming_pod(
        container("train", gpu=1), claims(container("more"), "gpu"), template_name="later"
    )
    decision = decide(pod, snapshot())
    assert decision.allowed
    assert [f.rule for f in decision.findings] == ["dra-claims"]
    [warning] = warnings(decision)
    assert 'no ResourceClaimTemplate "later" in the node inventory' in warning
    assert "its sharing mode is not checked" in warning


def test_without_the_inventory_the_sharing_check_is_skipped_with_a_warning() -> None:
    pod = claiming_pod(
        container("train", gpu=1), claims(container("more"), "gpu"), template_name="mps"
    )
    decision = decide(pod, None)
    assert decision.allowed
    [warning] = warnings(decision)
    assert warning.startswith(
        "spec.resourceClaims[0]: sharing modes not checked: templates are read from the node "
        "inventory, which this server does not run"
    )


def test_a_resource_claim_is_never_read_and_a_lone_claim_is_not_warned() -> None:
    pod = claiming_pod(container("train", gpu=1), claims(container("more"), "gpu"))
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared"}]
    [warning] = warnings(decide(pod, snapshot()))
    assert "sharing modes not checked: ResourceClaims are not watched, templates are" in warning
    alone = claiming_pod(claims(container("only"), "gpu"))
    alone["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared"}]
    assert_allowed_clean(decide(alone, snapshot()))


def test_a_device_class_the_cluster_does_not_have_is_warned() -> None:
    nodes = snapshot(classes=(device_class("gpu.nvidia.com"),))
    assert_allowed_clean(decide(template(request()), nodes))
    decision = decide(template(request(deviceClassName="mig.nvidia.com")), nodes)
    assert decision.allowed
    assert any('the cluster has no DeviceClass "mig.nvidia.com"' in w for w in warnings(decision))


def test_an_inventory_class_of_nvidias_driver_gives_a_gpu() -> None:
    # A class the cluster has whose selectors pin NVIDIA's GPU driver hands out GPUs: its
    # container may tune them (NVIDIA_DRIVER_CAPABILITIES is refused where no GPU is requested).
    custom = device_class("a100.example.com")
    tuned = claims(container("t", env={"NVIDIA_DRIVER_CAPABILITIES": "compute"}), "gpu")
    nodes = snapshot(
        template(request(deviceClassName="a100.example.com"), name="a100"), classes=(custom,)
    )
    assert_allowed_clean(decide(claiming_pod(tuned, template_name="a100"), nodes))
    # Another driver's class, known from the inventory: no GPU, the variable is refused.
    nic = template(request(deviceClassName="nic.example.com"), name="nic")
    assert denied(decide(claiming_pod(tuned, template_name="nic"), snapshot(nic)))


def test_the_real_server_refuses_an_mps_claim_beside_an_exclusive_gpu(tmp_path: Path) -> None:
    # Without the inventory the server cannot read the template: it warns, and refuses the
    # template that mixes modes when it is written.
    mixed = template(
        request("ts"),
        request("mps"),
        config=[
            {"requests": ["ts"], **shared("TimeSlicing")},
            {"requests": ["mps"], **shared("MPS")},
        ],
    )
    pod = claiming_pod(
        container("train", gpu=1), claims(container("infer"), "gpu"), template_name="mps"
    )
    with tls_server(tmp_path, policy_text=SERVED_SPEC) as server:
        refused, warned = answers(server, [admission(obj) for obj in (mixed, pod)])
    assert refused["allowed"] is False
    assert "mixes GPU sharing modes in one claim" in refused["status"]["message"]
    assert warned["allowed"] is True
    assert any("sharing modes not checked" in w for w in warned["warnings"])


def test_with_inject_void_a_read_gpu_claim_is_not_asked_for_void() -> None:
    voiding = policy(
        """
        gpuNodeTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
        deviceVisibility: {injectVoid: true}
        """,
        name="void-inventory",
    )
    pod = claiming_pod(
        claims(container("main"), "gpu"), container("sidecar"), template_name="whole"
    )
    nodes = snapshot(template(request(), name="whole"))
    decision = decide(pod, nodes, voiding)
    # The sidecar requests no GPU and is asked for void; the GPU's container is not.
    assert [path for _, path in denied(decision)] == ["spec.containers[1].env"]
    # A request that may fall back to a NIC is voided.
    either = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "gpu", "deviceClassName": "gpu.nvidia.com"},
            {"name": "nic", "deviceClassName": "nic.example.com"},
        ],
    }
    nodes = snapshot(template(either, name="whole"))
    assert [path for _, path in denied(decide(pod, nodes, voiding))] == [
        "spec.containers[0].env",
        "spec.containers[1].env",
    ]


def test_a_device_classs_own_config_sets_the_mode_of_its_claims() -> None:
    # An admin's DeviceClass that shares every GPU it hands out through MPS.
    mps_class = device_class("gpu.nvidia.com", config=[shared("MPS")])
    pod = claiming_pod(
        container("train", gpu=1), claims(container("infer"), "gpu"), template_name="whole"
    )
    decision = decide(pod, snapshot(template(request(), name="whole"), classes=(mps_class,)))
    assert denied(decision) == [("sharing-mode", "spec.containers[1].resources.claims[0]")]
    assert "is MPS (DeviceClass gpu.nvidia.com's config)" in status_message(decision)


def test_the_real_server_with_the_inventory_reads_the_pods_templates(
    tmp_path: Path, kube_api: FakeKubeAPI
) -> None:
    # The whole path: the inventory's process lists the templates from the (fake) API server,
    # the worker keeps them, and the Pod that mixes an exclusive GPU with an MPS claim is
    # refused; one whose template is not there yet is warned and admitted; a claim-only GPU
    # container may tune its GPU.
    kube_api.bookmark_seconds = 0.2
    kube_api.add(gpu_node())
    mps = mps_template()
    mps["metadata"]["namespace"] = NAMESPACE
    kube_api.add(mps)
    mixed = claiming_pod(
        container("train", gpu=1), claims(container("infer"), "gpu"), template_name="mps"
    )
    later = claiming_pod(
        container("train", gpu=1), claims(container("infer"), "gpu"), template_name="later"
    )
    tuned = claiming_pod(
        claims(container("t", env={"NVIDIA_DRIVER_CAPABILITIES": "compute"}), "gpu"),
        template_name="mps",
    )
    with tls_server(
        tmp_path,
        {"KUBECONFIG": str(kube_api.write_kubeconfig(tmp_path / "kubeconfig"))},
        policy_text=SERVED_SPEC
        + "  gpuNodeTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]\n",
        extra_args=["--inventory"],
    ) as server:

        def answer(obj: dict) -> dict:
            [response] = answers(server, [admission(obj, namespace=NAMESPACE)])
            return response

        wait_until(
            lambda: not answer(mixed)["allowed"], timeout=10, what="the template in the inventory"
        )
        refused = answer(mixed)
        assert "mixes GPU sharing modes in one Pod" in refused["status"]["message"]
        assert "ResourceClaimTemplate mps is MPS" in refused["status"]["message"]
        waiting = answer(later)
        assert waiting["allowed"] is True
        assert any('no ResourceClaimTemplate "later"' in w for w in waiting["warnings"])
        admitted = answer(tuned)
        assert admitted["allowed"] is True and "warnings" not in admitted


def gpu_node() -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.present": "true"}},
        "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}},
    }


def test_an_extended_resource_a_gpu_class_serves_is_followed() -> None:
    # DRAExtendedResource: a DeviceClass of NVIDIA's driver serving example.com/gpu. With the
    # inventory's classes, a container asking for it surely gets a GPU: it may tune it, and
    # injectVoid spares it.
    served = device_class("a100.example.com", extendedResourceName="example.com/gpu")
    voiding = policy(
        """
        gpuNodeTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
        deviceVisibility: {injectVoid: true}
        """,
        name="void-extended",
    )
    asks = container(
        "main", limits={"example.com/gpu": 1}, env={"NVIDIA_DRIVER_CAPABILITIES": "compute"}
    )
    pod = claiming_pod(asks)
    del pod["spec"]["resourceClaims"]
    assert_allowed_clean(decide(pod, snapshot(classes=(served,)), voiding))
    # Without the class, nothing says it is a GPU: the variable is refused, void required.
    assert denied(decide(pod, snapshot(), voiding))


@cache
def pooled() -> webhook.Policy:
    return policy(
        """
        newChecks: Enforce
        pools:
          - name: h100
            nodeSelector: {pool: h100}
            taints: [{key: pool, value: h100, effect: NoSchedule}]
            resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
            deviceClasses: [gpu.nvidia.com]
          - name: a100-mig
            nodeSelector: {pool: a100-mig}
            taints: [{key: pool, value: a100-mig, effect: NoSchedule}]
            resources: [{name: nvidia.com/mig-1g.10gb, sharing: MIG}]
            deviceClasses: [mig.nvidia.com]
        tenants:
          - namespaces: [ml]
            reservedPools: [h100]
        """,
        name="dra-pools",
    )


def test_a_claimed_class_chooses_and_confines_to_its_pool() -> None:
    nodes = snapshot(mig_template(), for_policy=pooled())
    pod = claiming_pod(claims(container("app"), "gpu"), template_name="mig")
    pod["spec"]["tolerations"] = []
    mutated = webhook.decide(
        admission(pod, namespace=NAMESPACE), pooled(), mutate=True, nodes=nodes
    )
    patched = apply_both(pod, list(mutated.patch))
    validate_pod(patched)
    assert {"key": "pool", "operator": "Equal", "value": "a100-mig", "effect": "NoSchedule"} in (
        patched["spec"]["tolerations"]
    )
    [term] = patched["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert {"key": "pool", "operator": "In", "values": ["a100-mig"]} in term["matchExpressions"]
    assert_allowed_clean(decide(patched, nodes, pooled()))


def test_a_claimed_class_of_a_pool_closed_to_the_namespace_is_refused() -> None:
    nodes = snapshot(template(request(), name="whole"), for_policy=pooled())
    pod = claiming_pod(claims(container("app"), "gpu"), template_name="whole")
    pod["spec"]["tolerations"] = [{"key": "pool", "operator": "Exists"}]
    decision = decide(pod, nodes, pooled())
    assert decision.allowed  # ml may use h100 (reserved for it)
    closed = webhook.decide(
        admission(pod, namespace="research"), pooled(), mutate=False, nodes=nodes
    )
    assert "pool-access" in {rule for rule, _ in denied(closed)}
