"""Shared helpers for the check suites: AdmissionReview builders, object builders, policies.

The suites read like policy tests: build an object, wrap it in an AdmissionReview, decide it
against a policy, and compare the outcome (allowed or not, rule ids, field paths, messages).
"""

from __future__ import annotations

import copy
import itertools
import json
import textwrap
from dataclasses import dataclass
from functools import cache
from typing import Any

import webhook
from tests.support.paths import REPO

DEFAULT_POLICY_FILE = REPO / "policies" / "default.yaml"

_uids = itertools.count(1)

# --- Policies -------------------------------------------------------------------------------


@cache
def default_policy() -> webhook.Policy:
    return webhook.load_policy(DEFAULT_POLICY_FILE)


def policy(spec_yaml: str, name: str = "test") -> webhook.Policy:
    """A policy from the YAML text of its ``spec`` (indented freely)."""
    body = textwrap.indent(textwrap.dedent(spec_yaml).strip("\n"), "  ")
    text = (
        "apiVersion: gpu-admission.io/v1alpha1\n"
        "kind: GPUAdmissionPolicy\n"
        f"metadata:\n  name: {name}\n"
        f"spec:\n{body}\n"
    )
    return webhook.parse_policy(text, source=f"<{name}>")


# The custom workload kinds the suites wrap templates in (as the default policy declares them).
WORKLOADS_SPEC = """
workloads:
  - {group: kubeflow.org, kind: PyTorchJob, templates: ["spec.pytorchReplicaSpecs.*.template"]}
  - group: ray.io
    kind: RayCluster
    templates: [spec.headGroupSpec.template, "spec.workerGroupSpecs[*].template"]
  - group: jobset.x-k8s.io
    kind: JobSet
    templates: ["spec.replicatedJobs[*].template.spec.template"]
  - {group: batch.volcano.sh, kind: Job, templates: ["spec.tasks[*].template"]}
"""

# The default policy's cluster-wide resources, the GPU node taint and the custom workload kinds,
# for inline policies that change one thing.
BASE_SPEC = (
    """
resources:
  - {name: nvidia.com/gpu, sharing: Exclusive, maxPerPod: 8}
  - {name: nvidia.com/gpu.shared, sharing: TimeSlicing, failRequestsGreaterThanOne: true}
gpuNodeTaints:
  - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
"""
    + WORKLOADS_SPEC
)

POOL_LABEL = "accelerator.example.com/pool"

# Two pools: full cards and MIG on A100 nodes, time-sliced replicas on T4 nodes (team-* only).
POOLS_SPEC = (
    f"""
resources:
  - {{name: nvidia.com/gpu, sharing: Exclusive, maxPerPod: 8}}
pools:
  - name: a100
    nodeSelector: {{{POOL_LABEL}: a100}}
    gpusPerNode: 4
    taints:
      - {{key: {POOL_LABEL}, value: a100, effect: NoSchedule}}
    resources:
      - {{name: nvidia.com/gpu, sharing: Exclusive}}
      - {{name: nvidia.com/mig-1g.10gb, sharing: MIG}}
  - name: t4-shared
    nodeSelector: {{{POOL_LABEL}: t4-shared}}
    taints:
      - {{key: {POOL_LABEL}, value: t4-shared, effect: NoSchedule}}
    resources:
      - {{name: nvidia.com/gpu.shared, sharing: TimeSlicing, failRequestsGreaterThanOne: true}}
    namespaces: [team-*]
"""
    + WORKLOADS_SPEC
)


@cache
def pools_policy() -> webhook.Policy:
    return policy(POOLS_SPEC, name="pools")


# --- Objects --------------------------------------------------------------------------------


def container(
    name: str = "app",
    *,
    gpu: Any = None,
    resource: str = "nvidia.com/gpu",
    limits: dict | None = None,
    requests: dict | None = None,
    privileged: bool | None = None,
    env: dict | list | None = None,
    **extra: Any,
) -> dict:
    """A container; ``gpu=1`` puts ``resource: 1`` in limits."""
    spec: dict[str, Any] = {"name": name, "image": "registry.example.com/app:1"}
    resources: dict[str, dict] = {}
    if gpu is not None:
        resources.setdefault("limits", {})[resource] = gpu
    if limits:
        resources.setdefault("limits", {}).update(limits)
    if requests:
        resources["requests"] = dict(requests)
    if resources:
        spec["resources"] = resources
    if privileged is not None:
        spec["securityContext"] = {"privileged": privileged}
    if env is not None:
        spec["env"] = (
            [{"name": k, "value": v} for k, v in env.items()] if isinstance(env, dict) else env
        )
    spec.update(extra)
    return spec


def template(
    *containers: dict,
    init: tuple | list = (),
    ephemeral: tuple | list = (),
    volumes: list | None = None,
    annotations: dict | None = None,
    node_selector: dict | None = None,
    tolerations: list | None = None,
    affinity: dict | None = None,
    service_account: str | None = None,
    name: str = "work",
) -> dict:
    """A PodTemplateSpec (metadata and spec); a Pod is the same plus apiVersion and kind."""
    spec: dict[str, Any] = {"containers": list(containers) or [container()]}
    if init:
        spec["initContainers"] = list(init)
    if ephemeral:
        spec["ephemeralContainers"] = list(ephemeral)
    if volumes is not None:
        spec["volumes"] = volumes
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if affinity is not None:
        spec["affinity"] = affinity
    if service_account is not None:
        spec["serviceAccountName"] = service_account
    metadata: dict[str, Any] = {"name": name, "labels": {"app": name}}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"metadata": metadata, "spec": spec}


def pod(*containers: dict, **kwargs: Any) -> dict:
    """A Pod: the same arguments as ``template``."""
    return {"apiVersion": "v1", "kind": "Pod", **template(*containers, **kwargs)}


def with_spec(obj: dict, **fields: Any) -> dict:
    """A copy of ``obj`` with these fields set in its spec."""
    obj = copy.deepcopy(obj)
    obj["spec"].update(fields)
    return obj


def host_path(path: str, name: str = "host") -> dict:
    return {"name": name, "hostPath": {"path": path}}


# --- Workload kinds -------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A workload kind and where it embeds a pod template (``prefix`` of the template's paths)."""

    name: str
    api_version: str
    kind: str
    prefix: str

    def wrap(self, tmpl: dict) -> dict:
        tmpl = copy.deepcopy(tmpl)
        meta = {"name": "work"}
        if self.name == "Pod":
            return {"apiVersion": self.api_version, "kind": self.kind, **tmpl}
        if self.name == "CronJob":
            spec = {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": tmpl}}}
        elif self.name == "PyTorchJob":
            spec = {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": tmpl}}}
        elif self.name == "JobSet":
            spec = {
                "replicatedJobs": [
                    {"name": "workers", "replicas": 1, "template": {"spec": {"template": tmpl}}}
                ]
            }
        elif self.name == "RayCluster":
            head = template(container("ray-head"), name="head")
            spec = {
                "headGroupSpec": {"template": head},
                "workerGroupSpecs": [{"groupName": "gpu", "replicas": 1, "template": tmpl}],
            }
        elif self.name == "VolcanoJob":
            spec = {"tasks": [{"name": "task", "replicas": 1, "template": tmpl}]}
        else:
            spec = {"template": tmpl}
            if self.name in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"):
                spec["selector"] = {"matchLabels": {"app": "work"}}
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": meta, "spec": spec}


KINDS: tuple[Kind, ...] = (
    Kind("Pod", "v1", "Pod", ""),
    Kind("Deployment", "apps/v1", "Deployment", "spec.template."),
    Kind("ReplicaSet", "apps/v1", "ReplicaSet", "spec.template."),
    Kind("StatefulSet", "apps/v1", "StatefulSet", "spec.template."),
    Kind("DaemonSet", "apps/v1", "DaemonSet", "spec.template."),
    Kind("Job", "batch/v1", "Job", "spec.template."),
    Kind("CronJob", "batch/v1", "CronJob", "spec.jobTemplate.spec.template."),
    Kind("ReplicationController", "v1", "ReplicationController", "spec.template."),
    Kind(
        "PyTorchJob", "kubeflow.org/v1", "PyTorchJob", "spec.pytorchReplicaSpecs[Master].template."
    ),
    Kind(
        "JobSet",
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        "spec.replicatedJobs[0].template.spec.template.",
    ),
    Kind("RayCluster", "ray.io/v1", "RayCluster", "spec.workerGroupSpecs[0].template."),
    Kind("VolcanoJob", "batch.volcano.sh/v1alpha1", "Job", "spec.tasks[0].template."),
)
KIND_IDS = [k.name for k in KINDS]
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def place(c: dict, where: str, **template_kwargs: Any) -> dict:
    """A template whose only interesting container ``c`` sits in the ``where`` list."""
    if where == "containers":
        return template(c, **template_kwargs)
    if where == "initContainers":
        return template(container("main"), init=[c], **template_kwargs)
    return template(container("main"), ephemeral=[c], **template_kwargs)


# --- AdmissionReviews -----------------------------------------------------------------------


def _gvk(obj: Any) -> dict:
    api_version = str(obj.get("apiVersion", "")) if isinstance(obj, dict) else ""
    group, _, version = api_version.rpartition("/")
    return {"group": group, "version": version, "kind": obj.get("kind", "")}


def admission(
    obj: Any,
    operation: str = "CREATE",
    namespace: str | None = "ml",
    old: Any = None,
    kind: dict | None = None,
    *,
    sub_resource: str | None = None,
    dry_run: bool = False,
    uid: str | None = None,
) -> dict:
    """An ``admission.k8s.io/v1`` AdmissionReview for ``obj`` (kind derived from apiVersion)."""
    source = obj if isinstance(obj, dict) else (old if isinstance(old, dict) else {})
    gvk = kind or _gvk(source)
    request: dict[str, Any] = {
        "uid": uid or f"uid-{next(_uids)}",
        "kind": gvk,
        "resource": {
            "group": gvk["group"],
            "version": gvk["version"],
            "resource": gvk["kind"].lower() + "s",
        },
        "name": (source.get("metadata") or {}).get("name", "work"),
        "operation": operation,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
    }
    if namespace is not None:
        request["namespace"] = namespace
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def validate(
    obj: Any, policy_: webhook.Policy | None = None, **admission_kwargs: Any
) -> webhook.Decision:
    """The validating webhook's decision on ``obj``."""
    return webhook.decide(
        admission(obj, **admission_kwargs), policy_ or default_policy(), mutate=False
    )


def mutate(
    obj: Any, policy_: webhook.Policy | None = None, **admission_kwargs: Any
) -> webhook.Decision:
    """The mutating webhook's decision on ``obj``."""
    return webhook.decide(
        admission(obj, **admission_kwargs), policy_ or default_policy(), mutate=True
    )


# --- Outcomes -------------------------------------------------------------------------------


def denied(decision: webhook.Decision) -> list[tuple[str, str]]:
    """(rule, path) of every denial, in order."""
    return [(f.rule, f.path) for f in decision.findings if f.mode == "Enforce"]


def denied_rules(decision: webhook.Decision) -> set[str]:
    return {f.rule for f in decision.findings if f.mode == "Enforce"}


def by_mode(decision: webhook.Decision, mode: str) -> list[tuple[str, str]]:
    return [(f.rule, f.path) for f in decision.findings if f.mode == mode]


def rules_in(decision: webhook.Decision, mode: str) -> set[str]:
    return {f.rule for f in decision.findings if f.mode == mode}


def status_message(decision: webhook.Decision) -> str:
    return decision.response["response"].get("status", {}).get("message", "")


def warnings(decision: webhook.Decision) -> list[str]:
    return decision.response["response"].get("warnings", [])


def audit_records(decision: webhook.Decision) -> list[dict]:
    annotations = decision.response["response"].get("auditAnnotations", {})
    return json.loads(annotations["violations"]) if "violations" in annotations else []


def assert_allowed_clean(decision: webhook.Decision) -> None:
    """Allowed with nothing to say: no findings, warnings or audit annotations."""
    response = decision.response["response"]
    assert response["allowed"] is True, status_message(decision)
    assert decision.findings == ()
    assert "warnings" not in response
    assert "auditAnnotations" not in response
