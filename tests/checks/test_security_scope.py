"""The bypass catalogue: a tenant who may create Pods and workloads in their own namespace tries
every way around the security rules (privileged, host-devices, device-visibility, host-access)
under the default policy, and every one is denied; beside them, what a real cluster needs and
must keep: multi-node training, GPU tuning variables, finalizer removal, mirror Pods, node
agents (warned at most), and Pods that cannot reach a GPU node (audited).
"""

from __future__ import annotations

import copy
import json

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conformance.corpus import documents, requires_corpus
from tests.support.admission import (
    BASE_SPEC,
    KIND_IDS,
    KINDS,
    assert_allowed_clean,
    by_mode,
    container,
    default_policy,
    denied_rules,
    host_path,
    mutate,
    pod,
    policy,
    status_message,
    template,
    validate,
    with_spec,
)

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
STRICT = policy(
    BASE_SPEC
    + """
deviceVisibility: {injectVoid: true}
hostDevices: {allowedPaths: [/data, /scratch]}
rules: {default: {gpuPods: Enforce, reachablePods: Enforce, otherPods: Enforce}}
""",
    name="strict",
)
PRIVILEGED = container("app", privileged=True)
DEPLOYMENT = KINDS[KIND_IDS.index("Deployment")]


# --- 1. The tenant does not choose whether the rules apply ---------------------------------

WAYS_ONTO_GPU_NODES = {
    "nodeName": lambda o: with_spec(o, nodeName="gpu-node-1"),
    "toleration-exists": lambda o: with_spec(o, tolerations=[GPU_TOLERATION]),
    "toleration-equal": lambda o: with_spec(
        o, tolerations=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    ),
    "toleration-any-effect": lambda o: with_spec(
        o, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]
    ),
    "toleration-empty-operator": lambda o: with_spec(
        o, tolerations=[{"key": "nvidia.com/gpu", "operator": "", "value": "present"}]
    ),
    "zero-gpus": lambda o: _add_container(o, container("asks", gpu=0)),
    "misspelt-resource": lambda o: _add_container(
        o, container("asks", limits={"nvidia.com/gpus": 1})
    ),
    "undeclared-gpu-resource": lambda o: _add_container(
        o, container("asks", limits={"nvidia.com/gpu-h100": 1})
    ),
    "retired-resource": lambda o: _add_container(
        o, container("asks", limits={"alpha.kubernetes.io/nvidia-gpu": 1})
    ),
    "toolkit-variable": lambda o: _add_container(
        o, container("asks", env={"NVIDIA_VISIBLE_DEVICES": "void"})
    ),
    "gpu-device-hostpath": lambda o: with_spec(
        o, volumes=[*o["spec"].get("volumes", []), host_path("/dev/nvidia0", name="gpu0")]
    ),
    "dra-pod-claim": lambda o: with_spec(
        o, resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    ),
    "dra-container-claim": lambda o: _add_container(
        o, container("asks", resources={"claims": [{"name": "gpu"}]})
    ),
    "dra-claim-on-the-first-container": lambda o: _claim_first(o),
    "cdi-annotation": lambda o: _annotate(o, "cdi.k8s.io/gpu", "nvidia.com/gpu=all"),
    "nvidia-cdi-annotation": lambda o: _annotate(
        o, "nvidia.cdi.k8s.io/container.app", "nvidia.com/gpu=all"
    ),
}


def _add_container(obj: dict, extra: dict) -> dict:
    obj = copy.deepcopy(obj)
    obj["spec"]["containers"].append(extra)
    return obj


def _claim_first(obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    first = obj["spec"]["containers"][0]
    first.setdefault("resources", {})["claims"] = [{"name": "gpu"}]
    return obj


def _annotate(obj: dict, key: str, value: str) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"].setdefault("annotations", {})[key] = value
    return obj


@pytest.mark.parametrize("way", WAYS_ONTO_GPU_NODES)
def test_a_privileged_pod_with_a_way_onto_gpu_nodes_is_denied(way):
    obj = WAYS_ONTO_GPU_NODES[way](pod(PRIVILEGED))
    assert "privileged" in denied_rules(validate(obj))


@pytest.mark.parametrize("way", WAYS_ONTO_GPU_NODES)
def test_a_host_root_with_a_way_onto_gpu_nodes_is_denied(way):
    obj = WAYS_ONTO_GPU_NODES[way](pod(container(), volumes=[host_path("/", name="root")]))
    assert "host-devices" in denied_rules(validate(obj))


def test_the_same_pod_without_a_way_onto_gpu_nodes_is_only_audited():
    decision = validate(pod(PRIVILEGED, volumes=[host_path("/")]))
    assert decision.allowed
    assert {f.mode for f in decision.findings} == {"Audit"}


def test_a_network_device_under_the_gpu_vendor_domain_is_no_way_onto_gpu_nodes():
    # The network operator's SR-IOV and RDMA resources are nvidia.com/* too; a DPDK Pod that
    # asks for one and tolerates no GPU taint cannot land on a GPU node.
    nic = container(
        "dpdk",
        limits={"nvidia.com/cx6_sriov_netdevice": 1},
        securityContext={"capabilities": {"add": ["SYS_ADMIN"]}},
    )
    decision = validate(pod(nic, volumes=[host_path("/sys", "sys")]))
    assert decision.allowed
    assert {f.mode for f in decision.findings if f.rule != "resource-name"} == {"Audit"}


def test_node_selection_is_no_way_onto_tainted_gpu_nodes():
    selected = pod(
        PRIVILEGED,
        node_selector={"kubernetes.io/hostname": "gpu-node-1", "nvidia.com/gpu.present": "true"},
    )
    assert by_mode(validate(selected), "Audit") == [
        ("privileged", "spec.containers[0].securityContext.privileged")
    ]


def test_untainted_gpu_nodes_put_every_pod_in_reach():
    untainted = policy(
        "resources: [{name: nvidia.com/gpu, sharing: Exclusive}]\ngpuNodesTainted: false"
    )
    assert "privileged" in denied_rules(validate(pod(PRIVILEGED), untainted))


def test_a_pool_without_a_hard_taint_puts_every_pod_in_reach():
    soft = policy(
        """
pools:
  - name: a100
    nodeSelector: {gpu: a100}
    taints: [{key: gpu, value: a100, effect: PreferNoSchedule}]
    resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
"""
    )
    assert soft.every_pod_reaches_gpu_nodes
    assert "privileged" in denied_rules(validate(pod(PRIVILEGED), soft))


def test_a_pool_taint_tolerated_by_key_is_a_way_onto_its_nodes():
    pools = policy(
        """
pools:
  - name: a100
    nodeSelector: {gpu: a100}
    taints:
      - {key: gpu, value: a100, effect: NoSchedule}
      - {key: dedicated, value: ml, effect: NoExecute}
    resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
"""
    )
    one = pod(PRIVILEGED, tolerations=[{"key": "gpu", "operator": "Exists"}])
    assert validate(one, pools).allowed  # one of two taints: still kept off
    both = pod(
        PRIVILEGED,
        tolerations=[{"key": "gpu", "operator": "Exists"}, {"key": "dedicated", "value": "ml"}],
    )
    assert "privileged" in denied_rules(validate(both, pools))


# --- 2. A GPU container may not widen its own view ----------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1,2,3,4,5,6,7"}],
        [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},  # the last one wins
        ],
        [
            {
                "name": "NVIDIA_VISIBLE_DEVICES",
                "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "all"}},
            }
        ],
        [{"name": "NVIDIA_IMEX_CHANNELS", "value": "all"}],
        [{"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"}],
        [{"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}],
    ],
    ids=["all", "indexes", "void-then-all", "value-from", "imex", "mig-config", "mig-monitor"],
)
@pytest.mark.parametrize("where", ["containers", "initContainers"])
def test_a_gpu_container_may_not_widen_its_view(env, where):
    gpu = container("train", gpu=1, env=env)
    obj = pod(container("main", gpu=1), init=[gpu]) if where == "initContainers" else pod(gpu)
    assert denied_rules(validate(obj)) == {"device-visibility"}
    assert denied_rules(validate(obj, STRICT)) == {"device-visibility"}


# --- 3. An UPDATE is judged on what it changes --------------------------------------------


def test_an_update_that_makes_a_template_gpu_relevant_is_denied():
    old = DEPLOYMENT.wrap(template(PRIVILEGED))
    assert validate(old).allowed  # audited: it cannot reach a GPU node
    new = DEPLOYMENT.wrap(template(container("app", gpu=1, privileged=True)))
    decision = validate(new, operation="UPDATE", old=old)
    assert denied_rules(decision) == {"privileged"}


def test_an_enforced_finding_is_not_forgiven_when_the_template_comes_to_reach_gpu_nodes():
    old = DEPLOYMENT.wrap(template(PRIVILEGED))
    assert denied_rules(validate(old, STRICT)) == {"privileged"}  # admitted before the policy
    for new in (
        DEPLOYMENT.wrap(template(container("app", gpu=1, privileged=True))),
        DEPLOYMENT.wrap(template(PRIVILEGED, tolerations=[GPU_TOLERATION])),
        DEPLOYMENT.wrap(template(PRIVILEGED, tolerations=[{"operator": "Exists"}])),
    ):
        assert "privileged" in denied_rules(validate(new, STRICT, operation="UPDATE", old=old))
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"team": "b"}
    decision = validate(relabelled, STRICT, operation="UPDATE", old=old)
    assert decision.allowed and by_mode(decision, "Warn")


def test_a_host_path_changed_under_the_same_name_is_judged_anew():
    old = DEPLOYMENT.wrap(template(container(gpu=1), volumes=[host_path("/var/log", "logs")]))
    new = DEPLOYMENT.wrap(template(container(gpu=1), volumes=[host_path("/", "logs")]))
    assert denied_rules(validate(new, operation="UPDATE", old=old)) == {"host-devices"}
    # Even when the old value was already refused: another value is another finding.
    older = DEPLOYMENT.wrap(template(container(gpu=1), volumes=[host_path("/etc", "logs")]))
    assert denied_rules(validate(new, operation="UPDATE", old=older)) == {"host-devices"}


def test_an_enforced_finding_the_workload_already_had_is_forgiven_on_scale():
    old = DEPLOYMENT.wrap(template(container(gpu=1, privileged=True)))
    new = copy.deepcopy(old)
    new["spec"]["replicas"] = 3
    decision = validate(new, operation="UPDATE", old=old)
    assert decision.allowed
    assert by_mode(decision, "Warn") == [
        ("privileged", "spec.template.spec.containers[0].securityContext.privileged")
    ]


def test_a_gated_pod_may_not_gain_a_way_onto_gpu_nodes():
    gated = with_spec(pod(PRIVILEGED), schedulingGates=[{"name": "example.com/queue"}])
    assert validate(gated).allowed
    aimed = with_spec(
        gated,
        tolerations=[GPU_TOLERATION],
        nodeSelector={"nvidia.com/gpu.present": "true"},
    )
    assert "privileged" in denied_rules(validate(aimed, operation="UPDATE", old=gated))
    released = with_spec(aimed, schedulingGates=[])
    assert "privileged" in denied_rules(validate(released, operation="UPDATE", old=aimed))


def test_a_cdi_annotation_added_to_a_running_pod_is_denied():
    running = with_spec(pod(container()), nodeName="cpu-node-1")
    annotated = _annotate(running, "cdi.k8s.io/gpu", "nvidia.com/gpu=all")
    decision = validate(annotated, operation="UPDATE", old=running)
    assert denied_rules(decision) == {"device-visibility"}


def test_a_privileged_ephemeral_container_is_denied_on_its_own():
    gpu_pod = with_spec(pod(container("train", gpu=1)), nodeName="gpu-node-1")
    debug = {"name": "debug", "image": "busybox", "securityContext": {"privileged": True}}
    debugged = with_spec(gpu_pod, ephemeralContainers=[debug])
    decision = validate(
        debugged, operation="UPDATE", old=gpu_pod, sub_resource="ephemeralcontainers"
    )
    assert denied_rules(decision) == {"privileged"}


# --- 4. Host paths by what they are, not by the name written -----------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/proc/1/root",
        "/proc/self/root/dev",
        "/dev/char/195:0",
        "/dev/block",
        "//dev//nvidia0",
        "/var/run",
        "/var/run/containerd/containerd.sock",
        "/var/lib/kubelet/pod-resources",
        "/run/k3s/containerd/containerd.sock",
        "/run/systemd/private",
        "/usr/local/nvidia/toolkit",
        "var/lib/kubelet",
    ],
)
def test_host_paths_are_judged_by_what_they_reach(path):
    assert denied_rules(validate(pod(container(gpu=1), volumes=[host_path(path)]))) == {
        "host-devices"
    }


def test_a_forged_device_list_mount_is_denied():
    mounts = [{"name": "null", "mountPath": "/var/run/nvidia-container-devices/all"}]
    obj = pod(container("app", volumeMounts=mounts), volumes=[host_path("/dev/null", "null")])
    assert denied_rules(validate(obj)) == {"device-visibility", "host-devices"}


# --- 5. Privileged-equivalent settings ----------------------------------------------------


@pytest.mark.parametrize(
    "capability",
    [
        "SYS_ADMIN",
        "CAP_SYS_ADMIN",
        "sys_admin",
        "ALL",
        "all",
        "CAP_BPF",
        "SYS_MODULE",
        "SYS_RAWIO",
        "DAC_READ_SEARCH",
        "SYS_BOOT",
    ],
)
def test_privileged_equivalent_capabilities_are_denied(capability):
    app = container(gpu=1, securityContext={"capabilities": {"add": [capability]}})
    assert denied_rules(validate(pod(app))) == {"host-access"}


def test_host_pid_and_windows_host_process_are_denied():
    assert denied_rules(validate(with_spec(pod(container(gpu=1)), hostPID=True))) == {"host-access"}
    host_process = {"windowsOptions": {"hostProcess": True}}
    assert denied_rules(
        validate(with_spec(pod(container(gpu=1)), securityContext=host_process))
    ) == {"host-access"}
    in_container = container(gpu=1, securityContext=host_process)
    assert denied_rules(validate(pod(in_container))) == {"host-access"}


def test_host_ipc_and_ptrace_are_warned():
    app = container(gpu=1, securityContext={"capabilities": {"add": ["SYS_PTRACE"]}})
    decision = validate(with_spec(pod(app), hostIPC=True))
    assert decision.allowed
    assert {f.rule for f in decision.findings if f.mode == "Warn"} == {"host-access"}
    assert len(decision.findings) == 2


# --- 6. injectVoid does not rest on the fail-open mutating webhook ------------------------


def test_the_void_requirement_binds_every_pod_that_can_reach_gpu_nodes():
    pinned = with_spec(
        pod(container("cuda", image="nvidia/cuda:12.4.0-base-ubuntu22.04")), nodeName="gpu-1"
    )
    assert denied_rules(validate(pinned, STRICT)) == {"device-visibility"}
    patched = jsonpatch.apply_patch(pinned, list(mutate(pinned, STRICT).patch))
    assert_allowed_clean(validate(patched, STRICT))


def test_a_dra_claim_is_a_gpu_request_for_the_void_requirement():
    # A container that uses a claim may get a GPU (issue 35): it may tune it, and
    # may tune the GPU it gets; a claim it does not use gives it nothing.
    # Without the node inventory its template cannot be read: voided all the same (a NIC's
    # claim would hand it nothing, and an image's own variables every GPU).
    claimed = container("sim", resources={"claims": [{"name": "gpu"}]})
    obj = with_spec(
        pod(claimed), resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    )
    assert denied_rules(validate(obj, STRICT)) == {"device-visibility"}
    voided = with_spec(
        pod(
            container(
                "sim",
                resources={"claims": [{"name": "gpu"}]},
                env={"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_DRIVER_CAPABILITIES": "compute"},
            )
        ),
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
    )
    assert_allowed_clean(validate(voided, STRICT))
    unused = with_spec(
        pod(container("sim")),
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
    )
    assert denied_rules(validate(unused, STRICT)) == {"device-visibility"}
    tuned = with_spec(
        pod(
            container("sim", resources={"claims": [{"name": "gpu"}]}, env={"NVIDIA_GDS": "enabled"})
        ),
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
    )
    # The node-shared variables in a GPU container: granted only (warned while newChecks is
    # Warn), no longer refused as in a container that requests no GPU.
    decision = validate(tuned)
    assert decision.allowed and {f.rule for f in decision.findings} == {"device-visibility"}


def test_the_void_requirement_does_not_need_the_mutating_webhook():
    sidecar = pod(container("train", gpu=1), container("logs"))
    assert denied_rules(validate(sidecar, STRICT)) == {"device-visibility"}
    patched = jsonpatch.apply_patch(sidecar, list(mutate(sidecar, STRICT).patch))
    assert_allowed_clean(validate(patched, STRICT))


def test_kubectl_debug_gets_void_from_the_mutating_webhook():
    gpu_pod = with_spec(pod(container("train", gpu=1)), nodeName="gpu-node-1")
    gpu_pod = jsonpatch.apply_patch(gpu_pod, list(mutate(gpu_pod, STRICT).patch))
    first = {"name": "debugger-1", "image": "busybox"}
    debugged = with_spec(gpu_pod, ephemeralContainers=[first])
    ephemeral = {"operation": "UPDATE", "old": gpu_pod, "sub_resource": "ephemeralcontainers"}
    assert denied_rules(validate(debugged, STRICT, **ephemeral)) == {"device-visibility"}
    operations = list(mutate(debugged, STRICT, **ephemeral).patch)
    assert operations == [
        {
            "op": "add",
            "path": "/spec/ephemeralContainers/0/env",
            "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        }
    ]
    patched = jsonpatch.apply_patch(debugged, operations)
    assert_allowed_clean(validate(patched, STRICT, **ephemeral))
    # A second debug container: only the new one is patched.
    second = with_spec(
        patched,
        ephemeralContainers=[
            *patched["spec"]["ephemeralContainers"],
            {"name": "debugger-2", "image": "busybox"},
        ],
    )
    again = {"operation": "UPDATE", "old": patched, "sub_resource": "ephemeralcontainers"}
    assert [op["path"] for op in mutate(second, STRICT, **again).patch] == [
        "/spec/ephemeralContainers/1/env"
    ]


def test_mutation_and_validation_agree_on_what_requests_a_gpu():
    # An undeclared vendor resource is no GPU: the container gets void, and must have it.
    obj = pod(container("train", gpu=1), container("rdma", limits={"nvidia.com/hostdev": 1}))
    decision = validate(obj, STRICT)
    assert ("device-visibility", "spec.containers[1].env") in [
        (f.rule, f.path) for f in decision.findings
    ]
    patched = jsonpatch.apply_patch(obj, list(mutate(obj, STRICT).patch))
    assert patched["spec"]["containers"][1]["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    ]
    assert "device-visibility" not in denied_rules(validate(patched, STRICT))


# --- 7. Advice for the Pod's audience ------------------------------------------------------


def test_a_pod_without_a_gpu_gets_no_gpu_advice():
    decision = validate(with_spec(pod(PRIVILEGED), nodeName="gpu-node-1"))
    message = status_message(decision)
    assert "request GPUs" not in message
    assert "spec.nodeName skips the scheduler's taint checks" in message
    assert "exempt its namespace (spec.tenants[].exemptions)" in message


def test_a_gpu_pod_is_told_how_to_ask_for_a_gpu():
    message = status_message(validate(pod(container(gpu=1, privileged=True))))
    assert "request GPUs in resources.limits (e.g. nvidia.com/gpu: 1)" in message
    assert "spec.exemptions" not in message


# --- 8. Records and quoting ---------------------------------------------------------------


def test_the_recorded_patch_stays_valid_json_when_clipped():
    record = policy(BASE_SPEC + "deviceVisibility: {injectVoid: true}\nmutation: {mode: Record}")
    many = pod(container("train", gpu=1), *[container(f"side-{i:03}") for i in range(120)])
    response = mutate(many, record).response["response"]
    operations = json.loads(response["auditAnnotations"]["would-patch"])
    *kept, tail = operations
    assert tail == {"omitted": 122 - len(kept)}  # 120 voids, the toleration, the annotation
    assert all(op["op"] == "add" for op in kept)
    assert len(response["auditAnnotations"]["would-patch"]) <= 8192


def test_host_path_messages_quote_as_the_api_server_does():
    message = status_message(validate(pod(container(gpu=1), volumes=[host_path("/dev", "d")])))
    assert 'hostPath volume "d" mounts "/dev"' in message
    assert "'/dev'" not in message and "'d'" not in message


# --- What must stay allowed ---------------------------------------------------------------


def test_multi_node_training_is_allowed():
    trainer = container(
        "trainer",
        gpu=8,
        securityContext={"capabilities": {"add": ["IPC_LOCK", "SYS_RESOURCE", "SYS_NICE"]}},
        env={"NVIDIA_DRIVER_CAPABILITIES": "compute,utility", "NCCL_DEBUG": "INFO"},
    )
    obj = with_spec(
        pod(trainer, volumes=[host_path("/data/datasets", "data")]),
        hostNetwork=True,
        tolerations=[GPU_TOLERATION],
    )
    granted = policy(
        BASE_SPEC
        + """
hostDevices: {allowedPaths: [/data]}
tenants:
  - namespaces: ["*"]
    grants: {capabilities: [IPC_LOCK, SYS_NICE, SYS_RESOURCE]}
  - namespaces: [ml]
    grants: {hostNetwork: true}
"""
    )
    assert_allowed_clean(validate(obj, granted))
    # Under the default policy: warned (hostNetwork beyond baseline, a path no allow-list names).
    decision = validate(obj)
    assert decision.allowed
    assert by_mode(decision, "Warn") == [
        ("host-devices", "spec.volumes[0].hostPath.path"),
        ("pod-security", "spec.hostNetwork"),
    ]


def test_void_in_a_sidecar_is_allowed():
    obj = pod(container("train", gpu=1), container("side", env={"NVIDIA_VISIBLE_DEVICES": "void"}))
    assert_allowed_clean(validate(obj))
    assert_allowed_clean(validate(obj, STRICT))


def test_a_finalizer_removal_and_a_label_edit_on_a_pod_with_findings_are_allowed():
    old = with_spec(pod(container(gpu=1, privileged=True)), nodeName="gpu-node-1")
    old["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
    finalized = copy.deepcopy(old)
    finalized["metadata"]["finalizers"] = []
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"]["team"] = "b"
    for new in (finalized, relabelled):
        decision = validate(new, operation="UPDATE", old=old)
        assert decision.allowed
        assert by_mode(decision, "Warn") == [
            ("privileged", "spec.containers[0].securityContext.privileged")
        ]


def test_a_mirror_pod_is_audited_never_denied():
    mirror = with_spec(pod(container(gpu=1, privileged=True)), nodeName="gpu-node-1")
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "0123abcd"}
    decision = validate(mirror, STRICT)
    assert decision.allowed
    assert {f.mode for f in decision.findings} == {"Audit"}


# --- Real node agents ---------------------------------------------------------------------

NODE_AGENTS = {
    "kube-prometheus__node-exporter-daemonset.yaml": "monitoring",
    "cilium__quick-install-v1.6.0-agent-daemonset.yaml": "cilium",
    "calico__calico-node-daemonset.yaml": "calico-system",
    "aws-ebs-csi-driver__node-daemonset.yaml": "storage",
    "fluent-bit-kubernetes-logging__elasticsearch-daemonset.yaml": "logging",
    "falco-deploy-kubernetes__falco-daemonset.yaml": "falco",
}


@requires_corpus
@pytest.mark.parametrize("name", NODE_AGENTS)
def test_node_agents_outside_kube_system_are_warned_at_most(name):
    from webhook.admission.objects import decide_object

    for obj in documents(name):
        outcome = decide_object(obj, default_policy(), NODE_AGENTS[name], override=True)
        assert outcome.allowed, name
        assert not outcome.denied


@requires_corpus
def test_the_device_plugin_outside_its_namespace_is_denied_with_the_exemption_hint():
    from webhook.admission.objects import decide_object

    (plugin,) = [
        d
        for d in documents("nvidia-k8s-device-plugin__static-daemonset-v0.20.0.yaml")
        if d.get("kind") == "DaemonSet"
    ]
    outcome = decide_object(plugin, default_policy(), "gpu-plugins", override=True)
    assert not outcome.allowed
    assert all("exempt its namespace" in f.violation.hint for f in outcome.denied)
    assert decide_object(plugin, default_policy(), "nvidia-device-plugin", override=True).allowed


def test_a_standalone_dcgm_exporter_that_sees_every_gpu_is_denied_with_the_hint():
    exporter = DEPLOYMENT.wrap(
        template(
            container(
                "dcgm-exporter",
                env={"NVIDIA_VISIBLE_DEVICES": "all", "DCGM_EXPORTER_KUBERNETES": "true"},
                securityContext={"capabilities": {"add": ["SYS_ADMIN"]}},
            ),
            volumes=[host_path("/var/lib/kubelet/pod-resources", "pod-gpu-resources")],
            tolerations=[GPU_TOLERATION],
        )
    )
    decision = validate(exporter, namespace="monitoring")
    assert denied_rules(decision) == {"device-visibility", "host-access", "host-devices"}
    assert all("exempt its namespace" in f.violation.hint for f in decision.findings)
    assert_allowed_clean(validate(exporter, namespace="gpu-operator"))


def kai_fractional_pod() -> dict:
    """A Pod asking KAI for half a GPU, as KAI's admission webhook leaves it: the devices come
    from a ConfigMap its binder writes (pkg/binder/common/gpu_access.go)."""
    config = "train-7xk2p9q-shared-gpu-0"
    env = [
        {"name": name, "valueFrom": {"configMapKeyRef": {"name": config, "key": name}}}
        for name in ("NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS", "GPU_PORTION")
    ]
    obj = pod(container("train", env=env, envFrom=[{"configMapRef": {"name": f"{config}-evar"}}]))
    obj["metadata"]["annotations"] = {
        "gpu-fraction": "0.5",
        "runai/shared-gpu-configmap": config[: -len("-0")],
    }
    obj["spec"]["schedulerName"] = "kai-scheduler"
    return obj


def test_a_kai_fractional_pod_after_its_mutation_is_denied_unless_exempted_knowingly():
    decision = validate(kai_fractional_pod())
    assert denied_rules(decision) == {"device-visibility"}
    assert "exempt its namespace" in status_message(decision)
    kai = policy(BASE_SPEC + "exemptions: [{namespaces: [ml], rules: [device-visibility]}]")
    assert validate(kai_fractional_pod(), kai).allowed


# --- Property: a way onto GPU nodes never turns a denial into an admission ----------------

# Mostly harmless values, so that many Pods start allowed (warned or audited) and the property
# is about the step from there.
_VALUES = st.sampled_from(["all", "void", "void", "none"])
_ENV_NAMES = st.sampled_from(
    ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_IMEX_CHANNELS", "LANG", "LANG"]
)
_PATHS = st.sampled_from(["/data", "/dev", "/", "/var/log", "/etc", "/scratch", "/data/x"])
_CAPS = st.sampled_from(["SYS_ADMIN", "IPC_LOCK", "SYS_PTRACE", "NET_ADMIN", "ALL", "SYS_NICE"])


@st.composite
def _containers(draw, index: int) -> dict:
    spec: dict = {"name": f"c{index}", "image": "example.com/app:1"}
    if draw(st.booleans()):
        spec["resources"] = {"limits": {"nvidia.com/gpu": draw(st.sampled_from([0, 1, 2]))}}
    env = draw(st.lists(st.tuples(_ENV_NAMES, _VALUES), max_size=2))
    if env:
        spec["env"] = [{"name": n, "value": v} for n, v in env]
    context: dict = {}
    if draw(st.integers(0, 3)) == 0:
        context["privileged"] = draw(st.booleans())
    caps = draw(st.lists(_CAPS, max_size=1))
    if caps:
        context["capabilities"] = {"add": caps}
    if context:
        spec["securityContext"] = context
    return spec


@st.composite
def _pods(draw) -> dict:
    count = draw(st.integers(1, 3))
    containers = [draw(_containers(i)) for i in range(count)]
    paths = draw(st.lists(_PATHS, max_size=2, unique=True))
    obj = pod(*containers, volumes=[host_path(p, f"v{i}") for i, p in enumerate(paths)])
    if draw(st.booleans()):
        obj["spec"]["hostPID"] = True
    if draw(st.booleans()):
        obj["spec"]["tolerations"] = [{"operator": "Exists"}]
    return obj


@settings(
    derandomize=True,
    database=None,
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(obj=_pods(), way=st.sampled_from(sorted(WAYS_ONTO_GPU_NODES)), strict=st.booleans())
def test_a_way_onto_gpu_nodes_never_turns_a_denial_into_an_admission(obj, way, strict):
    chosen = STRICT if strict else default_policy()
    before = validate(obj, chosen)
    after = validate(WAYS_ONTO_GPU_NODES[way](obj), chosen)
    if not before.allowed:
        assert not after.allowed, (way, before.findings, after.findings)
    assert denied_rules(before) <= denied_rules(after)
