"""The GPU baseline no tenant can talk around: the ways onto a GPU node's host that a tenant
review found admitted (host paths that distributions relocate, Pod Security baseline's
controls, a reserved pool's nodes without a GPU, a legacy CUDA image's every-GPU default,
injection annotations), each a case: a Pod, a policy, the verdict and the field. Judged by
``decide()`` here, and by the real server over TLS in ``test_the_real_server_agrees``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import webhook
from tests.serving import Server, make_certificates, post_json
from tests.support.admission import REPO, admission, container, default_policy, host_path, pod

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
STRICT_FILE = REPO / "policies" / "examples" / "strict.yaml"
# strict.yaml as version 0.1.0 shipped it: /mnt on its allow-list, no newChecks, no tenants.
YESTERDAYS_STRICT = (REPO / "tests" / "fixtures" / "strict-0.1.0.yaml").read_text("utf-8")
POOL_LABEL = "accelerator.example.com/pool"
# strict.yaml with a pool reserved for team-a: its nodes are tainted and labelled.
RESERVED_POOL = STRICT_FILE.read_text("utf-8").replace(
    "  gpuNodeTaints:",
    f"""  pools:
    - name: reserved
      nodeSelector: {{{POOL_LABEL}: reserved}}
      taints: [{{key: {POOL_LABEL}, value: reserved, effect: NoSchedule}}]
      resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
      namespaces: [team-a]
  gpuNodeTaints:""",
)
POLICY_TEXTS = {
    "default": (REPO / "policies" / "default.yaml").read_text("utf-8"),
    "strict": STRICT_FILE.read_text("utf-8"),
    "yesterdays-strict": YESTERDAYS_STRICT,
    "reserved-pool": RESERVED_POOL,
}


def policy_named(name: str) -> webhook.Policy:
    if name == "default":
        return default_policy()
    return webhook.parse_policy(POLICY_TEXTS[name], source=name)


def gpu_pod(*, volumes: list | None = None, annotations: dict | None = None, **fields: Any):
    """A Pod asking for one GPU, with the GPU taint's toleration (as the mutating webhook
    gives it), and ``fields`` set in its spec."""
    obj = pod(
        container("cuda", gpu=1, **fields.pop("container", {})),
        *fields.pop("more", ()),
        volumes=volumes,
        annotations=annotations,
        tolerations=[GPU_TOLERATION],
    )
    obj["spec"].update(fields)
    return obj


def mounting(path: str) -> dict:
    return gpu_pod(volumes=[host_path(path)])


def security(**context: Any) -> dict:
    return gpu_pod(container={"securityContext": context})


@dataclass(frozen=True)
class Case:
    """A way in, the policy it was admitted under, and what is said now."""

    id: str
    policy: str
    obj: dict
    verdict: str  # "denied" or "warned"
    rule: str
    path: str
    namespace: str = "ml"


VOLUME = "spec.volumes[0].hostPath.path"
CAPABILITY = "spec.containers[0].securityContext.capabilities.add[0]"
RESERVED_TOLERATIONS = [{"key": POOL_LABEL, "operator": "Exists", "effect": "NoSchedule"}]

CASES = [
    # Host paths that distributions relocate, admitted under the default policy.
    Case(
        "opt-containerd",
        "default",
        mounting("/opt/containerd/bin"),
        "denied",
        "host-devices",
        VOLUME,
    ),
    Case("var-home", "default", mounting("/var/home/core/.ssh"), "denied", "host-devices", VOLUME),
    Case("var-roothome", "default", mounting("/var/roothome"), "denied", "host-devices", VOLUME),
    Case("sysroot", "default", mounting("/sysroot"), "denied", "host-devices", VOLUME),
    Case(
        "ostree-kubelet",
        "default",
        mounting("/ostree/deploy/rhcos/var/lib/kubelet"),
        "denied",
        "host-devices",
        VOLUME,
    ),
    Case("bottlerocket-local", "default", mounting("/local"), "denied", "host-devices", VOLUME),
    Case("talos-system-run", "default", mounting("/system/run"), "denied", "host-devices", VOLUME),
    Case(
        "local-path-provisioner",
        "default",
        mounting("/opt/local-path-provisioner/pvc-1f2e_team-b_data"),
        "denied",
        "host-devices",
        VOLUME,
    ),
    # Found by the review of this change: the ostree spelling of a provisioner's directory,
    # AKS' kubelet start script, a device-list mount the toolkit reads by string prefix.
    Case(
        "ostree-local-storage",
        "default",
        mounting("/var/mnt/local-storage"),
        "denied",
        "host-devices",
        VOLUME,
    ),
    Case(
        "aks-start-kubelet",
        "default",
        mounting("/opt/azure/containers"),
        "denied",
        "host-devices",
        VOLUME,
    ),
    Case(
        "device-list-prefix",
        "default",
        gpu_pod(
            more=[
                container(
                    "side",
                    volumeMounts=[
                        {"name": "v", "mountPath": "/var/run/nvidia-container-devicesall"}
                    ],
                )
            ]
        ),
        "denied",
        "device-visibility",
        "spec.containers[1].volumeMounts[0].mountPath",
    ),
    # Admitted under strict.yaml's old allow-list, which held /mnt.
    Case(
        "eks-k8s-disks",
        "yesterdays-strict",
        mounting("/mnt/k8s-disks/0"),
        "denied",
        "host-devices",
        VOLUME,
    ),
    Case(
        "ephemeral",
        "yesterdays-strict",
        mounting("/mnt/.ephemeral"),
        "denied",
        "host-devices",
        VOLUME,
    ),
    Case(
        "aks-kubelet",
        "yesterdays-strict",
        mounting("/mnt/aks/kubelet"),
        "denied",
        "host-devices",
        VOLUME,
    ),
    Case(
        "gke-local-ssd",
        "yesterdays-strict",
        mounting("/mnt/disks/ssd0"),
        "denied",
        "host-devices",
        VOLUME,
    ),
    # Pod Security baseline's other controls, admitted under strict.yaml.
    Case(
        "host-network",
        "strict",
        gpu_pod(hostNetwork=True),
        "denied",
        "pod-security",
        "spec.hostNetwork",
    ),
    Case(
        "host-network-net-admin",
        "strict",
        gpu_pod(
            hostNetwork=True,
            container={"securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}},
        ),
        "denied",
        "pod-security",
        CAPABILITY,
    ),
    Case(
        "kubelet-host-port",
        "strict",
        gpu_pod(container={"ports": [{"containerPort": 8080, "hostPort": 10250}]}),
        "denied",
        "pod-security",
        "spec.containers[0].ports[0].hostPort",
    ),
    Case(
        "selinux-spc_t",
        "strict",
        security(seLinuxOptions={"type": "spc_t"}),
        "denied",
        "pod-security",
        "spec.containers[0].securityContext.seLinuxOptions.type",
    ),
    Case(
        "selinux-super_t",
        "strict",
        gpu_pod(securityContext={"seLinuxOptions": {"type": "super_t"}}),
        "denied",
        "pod-security",
        "spec.securityContext.seLinuxOptions.type",
    ),
    Case(
        "seccomp-unconfined",
        "strict",
        security(seccompProfile={"type": "Unconfined"}),
        "denied",
        "pod-security",
        "spec.containers[0].securityContext.seccompProfile.type",
    ),
    Case(
        "apparmor-unconfined",
        "strict",
        security(appArmorProfile={"type": "Unconfined"}),
        "denied",
        "pod-security",
        "spec.containers[0].securityContext.appArmorProfile.type",
    ),
    Case(
        "apparmor-annotation",
        "strict",
        gpu_pod(annotations={"container.apparmor.security.beta.kubernetes.io/cuda": "unconfined"}),
        "denied",
        "pod-security",
        "metadata.annotations[container.apparmor.security.beta.kubernetes.io/cuda]",
    ),
    *(
        Case(
            f"capability-{name}",
            "strict",
            security(capabilities={"add": [name]}),
            "denied",
            "pod-security",
            CAPABILITY,
        )
        for name in ("PERFMON", "SYS_TIME", "SYSLOG")
    ),
    Case(
        "proc-unmasked",
        "strict",
        security(procMount="Unmasked"),
        "denied",
        "pod-security",
        "spec.containers[0].securityContext.procMount",
    ),
    Case(
        "unsafe-sysctl",
        "strict",
        gpu_pod(securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}),
        "denied",
        "pod-security",
        "spec.securityContext.sysctls[0].name",
    ),
    Case(
        "probe-host",
        "strict",
        gpu_pod(container={"livenessProbe": {"httpGet": {"host": "169.254.169.254", "port": 80}}}),
        "denied",
        "pod-security",
        "spec.containers[0].livenessProbe.httpGet.host",
    ),
    # Under the default policy the same controls warn for this release (newChecks: Warn).
    Case(
        "host-network-default",
        "default",
        gpu_pod(hostNetwork=True),
        "warned",
        "pod-security",
        "spec.hostNetwork",
    ),
    # A reserved pool's nodes, from a namespace it is closed to, without asking for a GPU.
    Case(
        "reserved-pool-without-gpu",
        "reserved-pool",
        pod(
            container("cpu-hog"),
            node_selector={POOL_LABEL: "reserved"},
            tolerations=RESERVED_TOLERATIONS,
        ),
        "denied",
        "pool-access",
        "spec.tolerations",
    ),
    # A legacy CUDA image's default: every GPU of the node.
    Case(
        "legacy-cuda-version",
        "default",
        gpu_pod(more=[container("sidecar", env={"CUDA_VERSION": "11.0"})]),
        "denied",
        "device-visibility",
        "spec.containers[1].env[0].name",
    ),
    # Injection by annotation, other than CDI's.
    Case(
        "nri-devices",
        "default",
        gpu_pod(annotations={"devices.noderesource.dev/container.cuda": "- path: /dev/nvidia1"}),
        "denied",
        "host-devices",
        "metadata.annotations[devices.noderesource.dev/container.cuda]",
    ),
    Case(
        "nri-mounts-old-spelling",
        "default",
        gpu_pod(annotations={"mounts.nri.io/pod": "- {source: /var/lib/kubelet, destination: /k}"}),
        "denied",
        "host-devices",
        "metadata.annotations[mounts.nri.io/pod]",
    ),
    Case(
        "nri-cdi-devices",
        "default",
        gpu_pod(annotations={"cdi-devices.noderesource.dev/pod": "- nvidia.com/gpu=all"}),
        "denied",
        "device-visibility",
        "metadata.annotations[cdi-devices.noderesource.dev/pod]",
    ),
    Case(
        "nri-network-devices",
        "strict",
        gpu_pod(annotations={"network-devices.noderesource.dev/pod": "- {hostIf: eth0}"}),
        "denied",
        "pod-security",
        "metadata.annotations[network-devices.noderesource.dev/pod]",
    ),
    Case(
        "nri-sysctl",
        "strict",
        gpu_pod(annotations={"sysctl.noderesource.dev": "kernel.msgmax: '65536'"}),
        "denied",
        "pod-security",
        "metadata.annotations[sysctl.noderesource.dev]",
    ),
    Case(
        "gke-devices",
        "default",
        gpu_pod(annotations={"devices.gke.io/container.cuda": "- path: /dev/nvidia1"}),
        "denied",
        "host-devices",
        "metadata.annotations[devices.gke.io/container.cuda]",
    ),
]


def outcome(decision_response: dict) -> tuple[bool, list[str]]:
    return decision_response["response"]["allowed"], decision_response["response"].get(
        "warnings", []
    )


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_way_in_is_closed(case: Case):
    decision = webhook.decide(
        admission(case.obj, namespace=case.namespace), policy_named(case.policy), mutate=False
    )
    found = [(f.rule, f.path) for f in decision.findings]
    mode = "Enforce" if case.verdict == "denied" else "Warn"
    assert (case.rule, case.path) in [
        (f.rule, f.path) for f in decision.findings if f.mode == mode
    ], found
    assert decision.allowed is (case.verdict == "warned")


def test_the_real_server_agrees(tmp_path: Path):
    """Every case, as real AdmissionReview JSON over TLS to the real server, one server per
    policy: the same verdict, and the field named in the denial or the warning."""
    certificates = make_certificates(tmp_path / "pki")
    for name in sorted({case.policy for case in CASES}):
        policy_file = tmp_path / f"{name}.yaml"
        policy_file.write_text(POLICY_TEXTS[name])
        server = Server(
            policy=policy_file,
            cert=certificates.tls_cert,
            key=certificates.tls_key,
            ca=certificates.ca_cert,
            log_path=tmp_path / f"{name}.log",
        )
        with server.start():
            conn = server.connection()
            for case in (c for c in CASES if c.policy == name):
                body = json.dumps(admission(case.obj, namespace=case.namespace)).encode()
                reply = post_json(conn, "/validate", body)
                assert reply.status == 200, case.id
                allowed, warnings = outcome(reply.json())
                assert allowed is (case.verdict == "warned"), case.id
                said = (
                    " ".join(warnings) if allowed else reply.json()["response"]["status"]["message"]
                )
                assert case.path in said, (case.id, said)


# --- Reserved pools confine every Pod that can land in them ---------------------------------


def daemonset_pod(tolerations: list) -> dict:
    """A Pod as the DaemonSet controller makes it: bound to its node by a matchFields term."""
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["node-7"]}
                        ]
                    }
                ]
            }
        }
    }
    return pod(container("agent"), tolerations=tolerations, affinity=affinity)


def reserved(obj: dict, namespace: str) -> webhook.Decision:
    return webhook.decide(
        admission(obj, namespace=namespace), policy_named("reserved-pool"), mutate=False
    )


def test_a_node_agent_on_a_reserved_pool_through_a_wildcard_is_warned_not_denied():
    decision = reserved(daemonset_pod([{"operator": "Exists"}]), "monitoring")
    assert decision.allowed
    assert [(f.rule, f.mode) for f in decision.findings if f.rule == "pool-access"] == [
        ("pool-access", "Warn")
    ]
    assert "exempt its namespace" in decision.findings[-1].violation.hint


def test_the_same_pod_tolerating_the_pool_taint_by_key_is_denied():
    decision = reserved(daemonset_pod(RESERVED_TOLERATIONS), "monitoring")
    assert not decision.allowed
    assert [(f.path, f.mode) for f in decision.findings if f.rule == "pool-access"] == [
        ("spec.tolerations", "Enforce")
    ]


def test_the_pools_own_namespaces_and_pods_kept_off_it_are_not_confined():
    decision = reserved(daemonset_pod(RESERVED_TOLERATIONS), "team-a")
    assert "pool-access" not in {f.rule for f in decision.findings}
    away = pod(
        container("agent"),
        tolerations=RESERVED_TOLERATIONS,
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": POOL_LABEL, "operator": "NotIn", "values": ["reserved"]}
                            ]
                        }
                    ]
                }
            }
        },
    )
    decision = reserved(away, "monitoring")
    assert "pool-access" not in {f.rule for f in decision.findings}


def test_a_pod_naming_its_node_is_denied_outside_binder_namespaces():
    obj = pod(container("debug"))
    obj["spec"]["nodeName"] = "node-7"
    decision = reserved(obj, "ml")
    assert not decision.allowed
    assert ("pool-access", "spec.nodeName") in [(f.rule, f.path) for f in decision.findings]
    assert any(
        "a Pod that names its node skips the scheduler" in f.message for f in decision.findings
    )


def test_an_update_that_adds_an_injection_annotation_is_judged_anew():
    old = gpu_pod()
    old["spec"]["nodeName"] = "gpu-node-1"
    old["metadata"]["finalizers"] = ["example.com/keep"]
    new = json.loads(json.dumps(old))
    new["metadata"]["annotations"] = {
        "mounts.noderesource.dev/pod": "- {source: /, destination: /h}"
    }
    decision = webhook.decide(
        admission(new, operation="UPDATE", old=old), default_policy(), mutate=False
    )
    assert not decision.allowed
    assert [(f.rule, f.mode) for f in decision.findings] == [("host-devices", "Enforce")]
    # The same annotation already there: a finalizer removal is never denied for it.
    finalized = json.loads(json.dumps(new))
    finalized["metadata"]["finalizers"] = []
    decision = webhook.decide(
        admission(finalized, operation="UPDATE", old=new), default_policy(), mutate=False
    )
    assert decision.allowed
