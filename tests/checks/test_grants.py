"""Tenant grants: each admits exactly what it names, where it names it, and none admits
``privileged``, ``hostPID`` or a node-control host path."""

from __future__ import annotations

import pytest

import webhook
from tests.support.admission import (
    BASE_SPEC,
    assert_allowed_clean,
    container,
    denied,
    host_path,
    pod,
    policy,
    validate,
)

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
ENFORCED = BASE_SPEC + "newChecks: Enforce\n"
NO_GRANTS = policy(ENFORCED + "tenants: []\n")
GRANTED = policy(
    ENFORCED
    + """
hostDevices: {allowedPaths: [/data]}
tenants:
  - namespaces: ["*"]
    grants: {capabilities: [IPC_LOCK, SYS_NICE, SYS_RESOURCE]}
  - namespaces: [ml]
    reason: the fabric runs NCCL over the host network
    grants:
      hostNetwork: true
      hostIPC: true
      capabilities: [PERFMON, {name: NET_ADMIN, containers: [rxdm]}, cap_sys_ptrace]
      annotations:
        - key: devices.noderesource.dev/container.cuda
          values: ["- path: /dev/infiniband/uverbs0"]
      toolkitVariables: [NVIDIA_MOFED]
      hostPaths: [/raid/datasets]
  - namespaces: [team-*]
    grants: {capabilities: [SYSLOG]}
"""
)


def gpu_pod(*containers: dict, **spec) -> dict:
    obj = pod(*(containers or (container("cuda", gpu=1),)), tolerations=[GPU_TOLERATION])
    obj["spec"].update(spec)
    return obj


def adding(*capabilities: str, name: str = "cuda") -> dict:
    return container(name, gpu=1, securityContext={"capabilities": {"add": list(capabilities)}})


CAP0 = "spec.containers[0].securityContext.capabilities.add[0]"


# --- Capabilities ---------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["IPC_LOCK", "ipc_lock", "CAP_IPC_LOCK", "SYS_NICE"])
def test_the_default_grant_admits_what_rdma_and_nccl_need(spelling):
    assert_allowed_clean(validate(gpu_pod(adding(spelling)), policy(ENFORCED)))


def test_without_a_tenants_block_only_those_three_are_granted():
    assert denied(validate(gpu_pod(adding("PERFMON")), policy(ENFORCED))) == [
        ("pod-security", CAP0)
    ]


def test_an_empty_tenants_block_grants_nothing():
    assert denied(validate(gpu_pod(adding("IPC_LOCK")), NO_GRANTS)) == [("pod-security", CAP0)]


def test_a_capability_grant_admits_the_named_capability_in_its_namespace_only():
    assert_allowed_clean(validate(gpu_pod(adding("PERFMON")), GRANTED))
    assert denied(validate(gpu_pod(adding("PERFMON")), GRANTED, namespace="other")) == [
        ("pod-security", CAP0)
    ]
    assert denied(validate(gpu_pod(adding("SYS_TIME")), GRANTED)) == [("pod-security", CAP0)]


def test_a_capability_granted_to_named_containers_is_refused_in_the_others():
    sidecar = "spec.containers[1].securityContext.capabilities.add[0]"
    obj = gpu_pod(container("cuda", gpu=1), adding("NET_ADMIN", name="rxdm"))
    assert_allowed_clean(validate(obj, GRANTED))
    obj = gpu_pod(container("cuda", gpu=1), adding("NET_ADMIN", name="other"))
    assert denied(validate(obj, GRANTED)) == [("pod-security", sidecar)]


def test_grants_of_every_matching_tenant_add_up_and_globs_match():
    assert_allowed_clean(
        validate(gpu_pod(adding("SYSLOG", "IPC_LOCK")), GRANTED, namespace="team-a")
    )
    assert denied(validate(gpu_pod(adding("SYSLOG")), GRANTED)) == [("pod-security", CAP0)]


def test_sys_ptrace_is_granted_like_any_other_capability():
    assert_allowed_clean(validate(gpu_pod(adding("SYS_PTRACE")), GRANTED))
    assert denied(validate(gpu_pod(adding("SYS_PTRACE")), GRANTED, namespace="other")) == [
        ("host-access", CAP0)
    ]


@pytest.mark.parametrize("name", ["SYS_ADMIN", "sys_module", "CAP_BPF", "ALL"])
def test_no_grant_covers_a_privileged_equivalent_capability(name):
    with pytest.raises(webhook.PolicyError, match="privileged-equivalent"):
        policy(ENFORCED + f"tenants: [{{namespaces: [ml], grants: {{capabilities: [{name}]}}}}]")
    assert denied(validate(gpu_pod(adding(name)), GRANTED)) == [("host-access", CAP0)]


# --- hostNetwork and hostIPC ----------------------------------------------------------------


def test_a_host_network_grant_admits_host_network_in_its_namespace_only():
    assert_allowed_clean(validate(gpu_pod(hostNetwork=True), GRANTED))
    assert denied(validate(gpu_pod(hostNetwork=True), GRANTED, namespace="other")) == [
        ("pod-security", "spec.hostNetwork")
    ]


@pytest.mark.parametrize("name", ["NET_ADMIN", "NET_RAW", "cap_net_raw"])
def test_a_host_network_grant_never_comes_with_net_admin_or_net_raw(name):
    # NET_ADMIN is granted to rxdm, yet not together with hostNetwork: reported once.
    obj = gpu_pod(container("cuda", gpu=1), adding(name, name="rxdm"), hostNetwork=True)
    decision = validate(obj, GRANTED)
    path = "spec.containers[1].securityContext.capabilities.add[0]"
    assert denied(decision) == [("pod-security", path)]
    assert (
        "a grant of hostNetwork never covers NET_ADMIN or NET_RAW" in decision.findings[0].message
    )


def test_net_admin_beside_a_forgiven_host_network_is_still_denied():
    """A workload admitted with hostNetwork before the policy: an update that adds NET_ADMIN
    is judged on the pair, which the old object did not have."""
    from tests.support.admission import template

    def deployment(*containers: dict) -> dict:
        spec = template(*containers, tolerations=[GPU_TOLERATION])
        spec["spec"]["hostNetwork"] = True
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {"selector": {"matchLabels": {"app": "work"}}, "template": spec},
        }

    old = deployment(container("cuda", gpu=1), container("rxdm"))
    new = deployment(container("cuda", gpu=1), adding("NET_ADMIN", name="rxdm"))
    decision = validate(new, GRANTED, operation="UPDATE", namespace="team-b", old=old)
    assert (
        "pod-security",
        "spec.template.spec.containers[1].securityContext.capabilities.add[0]",
    ) in denied(decision)


def test_host_ports_of_a_host_network_pod_are_its_container_ports():
    ports = [{"containerPort": 29500, "hostPort": 29500}]
    assert_allowed_clean(
        validate(gpu_pod(container("cuda", gpu=1, ports=ports), hostNetwork=True), GRANTED)
    )
    ports = [{"containerPort": 29500, "hostPort": 29500}]
    assert denied(validate(gpu_pod(container("cuda", gpu=1, ports=ports)), GRANTED)) == [
        ("pod-security", "spec.containers[0].ports[0].hostPort")
    ]


def test_a_host_ipc_grant_admits_host_ipc():
    assert_allowed_clean(validate(gpu_pod(hostIPC=True), GRANTED))
    assert denied(validate(gpu_pod(hostIPC=True), GRANTED, namespace="other")) == [
        ("host-access", "spec.hostIPC")
    ]


# --- Annotations, toolkit variables, host paths ---------------------------------------------


def annotated(key: str, value: str) -> dict:
    obj = gpu_pod()
    obj["metadata"]["annotations"] = {key: value}
    return obj


GRANTED_KEY = "devices.noderesource.dev/container.cuda"


def test_an_annotation_grant_admits_exactly_that_key_with_that_value():
    assert_allowed_clean(
        validate(annotated(GRANTED_KEY, "- path: /dev/infiniband/uverbs0"), GRANTED)
    )
    # The value is what the node injects: another is not granted (other GPUs, the host's disks).
    for value in ("- path: /dev/nvidia3", "- path: /dev/sda", "- path: /dev/infiniband/uverbs0\n"):
        assert denied(validate(annotated(GRANTED_KEY, value), GRANTED)) == [
            ("host-devices", f"metadata.annotations[{GRANTED_KEY}]")
        ], value
    # Nor is another key, the /pod one that reaches every container included.
    key = "devices.noderesource.dev/pod"
    assert denied(validate(annotated(key, "- path: /dev/infiniband/uverbs0"), GRANTED)) == [
        ("host-devices", f"metadata.annotations[{key}]")
    ]


@pytest.mark.parametrize(
    "key",
    [
        "devices.noderesource.dev",
        "sysctl.noderesource.dev",
        "netdevices.nri.containerd.io/pod",
        "ulimits.noderesource.dev/container.cuda",
        "devices.gke.io/container.cuda",
        "cdi-devices.nri.io/pod",
    ],
)
def test_every_key_the_checks_refuse_can_be_granted(key):
    from webhook.policy.annotations import classify

    assert classify(key) is not None
    granted = policy(
        ENFORCED
        + "tenants: [{namespaces: [ml], grants: {annotations: "
        + f"[{{key: '{key}', values: [v]}}]}}}}]"
    )
    assert_allowed_clean(validate(annotated(key, "v"), granted))


def test_a_grant_of_a_key_no_node_reads_is_refused():
    with pytest.raises(webhook.PolicyError, match="nothing to grant"):
        policy(
            ENFORCED
            + "tenants: [{namespaces: [ml], grants: "
            + "{annotations: [{key: cdi.k8s.io/x, values: [v]}]}}]"
        )


def test_a_toolkit_variable_grant_admits_that_variable_only():
    env = {"NVIDIA_MOFED": "enabled", "NVIDIA_GDS": "enabled"}
    decision = validate(gpu_pod(container("cuda", gpu=1, env=env)), GRANTED)
    assert denied(decision) == [("device-visibility", "spec.containers[0].env[1].value")]


def test_a_host_path_grant_admits_the_path_and_below_in_its_namespace_only():
    for path in ("/raid/datasets", "/raid/datasets/imagenet"):
        assert_allowed_clean(validate(gpu_pod(volumes=[host_path(path)]), GRANTED))
    volume = "spec.volumes[0].hostPath.path"
    assert denied(validate(gpu_pod(volumes=[host_path("/raid")]), GRANTED)) == [
        ("host-devices", volume)
    ]
    decision = validate(gpu_pod(volumes=[host_path("/raid/datasets")]), GRANTED, namespace="x")
    assert denied(decision) == [("host-devices", volume)]


def test_a_host_path_grant_of_a_node_control_path_is_dropped():
    text = (
        ENFORCED + "tenants: [{namespaces: [ml], grants: {hostPaths: [/var/lib/kubelet, /data]}}]"
    )
    loaded = policy(text)
    assert [w.level for w in loaded.warnings if "can never be allowed" in w.message] == ["error"]
    volume = "spec.volumes[0].hostPath.path"
    decision = validate(gpu_pod(volumes=[host_path("/var/lib/kubelet/pods")]), loaded)
    assert denied(decision) == [("host-devices", volume)]
    assert_allowed_clean(validate(gpu_pod(volumes=[host_path("/data/x")]), loaded))


# --- What no grant covers -------------------------------------------------------------------


EVERYTHING = policy(
    ENFORCED
    + """
tenants:
  - namespaces: ["*"]
    grants:
      hostNetwork: true
      hostIPC: true
      capabilities: [PERFMON, SYS_PTRACE, NET_ADMIN]
      hostPaths: [/data]
"""
)


def test_no_grant_admits_privileged_host_pid_or_a_node_control_path():
    assert denied(validate(gpu_pod(container("cuda", gpu=1, privileged=True)), EVERYTHING)) == [
        ("privileged", "spec.containers[0].securityContext.privileged")
    ]
    assert denied(validate(gpu_pod(hostPID=True), EVERYTHING)) == [("host-access", "spec.hostPID")]
    for path in ("/var/lib/kubelet", "/sysroot", "/", "/mnt/k8s-disks/0"):
        decision = validate(gpu_pod(volumes=[host_path(path)]), EVERYTHING)
        assert denied(decision) == [("host-devices", "spec.volumes[0].hostPath.path")], path


@pytest.mark.parametrize("field", ["privileged", "hostPID", "hostPaths: [/]"])
def test_the_grants_schema_has_no_field_for_privileged_or_host_pid(field):
    grant = f"{{{field}: true}}" if ":" not in field else f"{{{field}}}"
    text = ENFORCED + f"tenants: [{{namespaces: [ml], grants: {grant}}}]"
    if field.startswith("hostPaths"):
        assert [w.level for w in policy(text).warnings if "can never be allowed" in w.message] == [
            "error"
        ]
    else:
        with pytest.raises(webhook.PolicyError, match="unknown field"):
            policy(text)
