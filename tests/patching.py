"""Shared helpers for the mutation tests.

Build AdmissionReviews, decode the JSON Patch of a response, apply it with the ``jsonpatch``
library and with ``kubectl patch --local`` (the API server's own Go JSON-Patch code, offline),
and check the patched Pod: the Kubernetes 1.32 schema (``kubernetes_validate``) plus the
semantic rules of the API server's validation that a schema cannot express.
"""

from __future__ import annotations

import atexit
import base64
import copy
import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonpatch
import jsonschema
import kubernetes_validate
import pytest
import yaml

import webhook
from webhook.core.pods import build_view
from webhook.core.pools import Selection, select_pool
from webhook.core.scope import reach
from webhook.policy.model import Policy

K8S_VERSION = "1.32"
KUBECTL = shutil.which("kubectl")
NO_KUBECTL = "kubectl is not installed"

TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
FIELD_OPERATORS = ("In", "NotIn")

KINDS = {
    "Pod": ("", "v1", "pods"),
    "Deployment": ("apps", "v1", "deployments"),
    "Job": ("batch", "v1", "jobs"),
    "CronJob": ("batch", "v1", "cronjobs"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "DaemonSet": ("apps", "v1", "daemonsets"),
    "ReplicaSet": ("apps", "v1", "replicasets"),
    "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "ConfigMap": ("", "v1", "configmaps"),
    "Workflow": ("argoproj.io", "v1alpha1", "workflows"),
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
}


# --- Policies -----------------------------------------------------------------------------

POOL_KEY = "accelerator.example.com/pool"
GENERATION_KEY = "accelerator.example.com/generation"

DEFAULT_DOC = yaml.safe_load(webhook.default_policy_path().read_text("utf-8"))


def _taint(key: str, value: str | None = None, effect: str = "NoSchedule") -> dict:
    return {"key": key, "effect": effect} | ({"value": value} if value is not None else {})


def _pool(name: str, resources: list, *, taints: list | None = None, **extra: Any) -> dict:
    return {
        "name": name,
        "nodeSelector": {POOL_KEY: name},
        "resources": resources,
        "taints": [_taint(POOL_KEY, name)] if taints is None else taints,
        **extra,
    }


def preferred(generation: str, weight: int = 50) -> dict:
    return {
        "weight": weight,
        "matchExpressions": [{"key": GENERATION_KEY, "operator": "In", "values": [generation]}],
    }


# A policy with node pools, as the guide lays them out: each pool selected by the
# accelerator.example.com/pool label, tainted with it, preferring a GPU generation.
POOLS_DOC = {
    "apiVersion": "gpu-admission.io/v1alpha1",
    "kind": "GPUAdmissionPolicy",
    "metadata": {"name": "pools"},
    "spec": {
        "vendorDomains": ["nvidia.com"],
        "pools": [
            _pool(
                "training",
                [{"name": "nvidia.com/gpu", "sharing": "Exclusive"}],
                taints=[_taint(POOL_KEY, "training"), _taint("nvidia.com/gpu")],
                preferredAffinity=[preferred("hopper")],
            ),
            _pool(
                "shared",
                [
                    {"name": "nvidia.com/gpu.shared", "sharing": "TimeSlicing"},
                    {"name": "nvidia.com/mig-1g.10gb.shared", "sharing": "MIGTimeSlicing"},
                ],
            ),
            _pool("mps", [{"name": "nvidia.com/gpu.shared", "sharing": "MPS"}]),
            _pool(
                "mig",
                [
                    {"name": "nvidia.com/mig-1g.10gb", "sharing": "MIG"},
                    {"name": "nvidia.com/mig-3g.40gb", "sharing": "MIG"},
                ],
                preferredAffinity=[preferred("ampere")],
            ),
            _pool(
                "restricted",
                [
                    {"name": "nvidia.com/mig-7g.80gb", "sharing": "MIG"},
                    {"name": "nvidia.com/mig-1g.10gb", "sharing": "MIG"},
                ],
                namespaces=["research"],
            ),
        ],
        "mutation": {"enabled": True, "mode": "Apply"},
    },
}


def policy_from(doc: dict, **spec: Any) -> webhook.Policy:
    doc = copy.deepcopy(doc)
    doc["spec"].update(spec)
    return webhook.parse_policy(yaml.safe_dump(doc), source="<test>")


# --- AdmissionReviews ---------------------------------------------------------------------


def review(
    obj: Mapping,
    *,
    operation: str = "CREATE",
    namespace: str = "ml",
    kind: str = "Pod",
    sub_resource: str | None = None,
    old: Mapping | None = None,
) -> dict:
    group, version, resource = KINDS[kind]
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": resource}
    request: dict[str, Any] = {
        "uid": "0b7c3d2e-1f4a-4c5b-9d6e-7f8a9b0c1d2e",
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": (obj.get("metadata") or {}).get("name", ""),
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": copy.deepcopy(obj),
        "oldObject": copy.deepcopy(old) if old is not None else None,
        "dryRun": False,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def decide(obj: Mapping, policy: Policy, *, mutate: bool = True, **kwargs: Any):
    """``webhook.decide`` on a review of ``obj``; the object itself is never modified."""
    before = copy.deepcopy(obj)
    decision = webhook.decide(review(obj, **kwargs), policy, mutate=mutate)
    assert obj == before, "decide() modified the object it was given"
    return decision


def decode_patch(decision_or_response: Any) -> list[dict]:
    """The operations of a response's ``patch`` (base64 JSON); [] when there is none."""
    response = getattr(decision_or_response, "response", decision_or_response)["response"]
    if "patch" not in response:
        assert "patchType" not in response, "patchType without a patch"
        return []
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"], validate=True))
    assert isinstance(ops, list) and ops, "an empty patch must be omitted"
    return ops


def assert_add_only(ops: Sequence[Mapping]) -> None:
    for op in ops:
        assert set(op) == {"op", "path", "value"}, op
        assert op["op"] == "add", op
        assert op["path"].startswith("/"), op


# --- Applying patches ---------------------------------------------------------------------


def apply_jsonpatch(obj: Mapping, ops: Sequence[Mapping]) -> dict:
    return jsonpatch.apply_patch(copy.deepcopy(obj), list(ops))


@functools.cache
def _kubectl_env() -> dict[str, str]:
    """kubectl patch --local needs no cluster, but keep it away from any real kubeconfig."""
    home = tempfile.mkdtemp(prefix="kubectl-home-")
    atexit.register(shutil.rmtree, home, True)
    kubeconfig = Path(home) / "kubeconfig"
    kubeconfig.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env.update(KUBECONFIG=str(kubeconfig), HOME=home)
    return env


def apply_kubectl(obj: Mapping, ops: Sequence[Mapping]) -> dict:
    """The patch applied by ``kubectl patch --local --type=json`` (Go's evanphx/json-patch)."""
    if KUBECTL is None:
        pytest.skip(NO_KUBECTL)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(obj, handle)
    try:
        result = subprocess.run(
            [
                KUBECTL,
                "patch",
                "-f",
                handle.name,
                "--local",
                "--type=json",
                "-p",
                json.dumps(list(ops)),
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            env=_kubectl_env(),
            timeout=60,
            check=False,
        )
    finally:
        os.unlink(handle.name)
    if result.returncode != 0:
        raise AssertionError(f"kubectl patch failed: {result.stderr.strip()}\nops: {ops}")
    return json.loads(result.stdout)


def apply_both(obj: Mapping, ops: Sequence[Mapping]) -> dict:
    """Apply with jsonpatch and kubectl; both must agree. Returns the patched object."""
    ours = apply_jsonpatch(obj, ops)
    theirs = apply_kubectl(obj, ops)
    assert ours == theirs, f"jsonpatch and kubectl disagree\nops: {ops}"
    return ours


# --- Validating Pods ----------------------------------------------------------------------


def validate_pod(pod: Mapping) -> None:
    """The Kubernetes 1.32 schema, strictly, and the API server's semantic rules we rely on."""
    try:
        kubernetes_validate.validate(copy.deepcopy(pod), K8S_VERSION, strict=True)
    except jsonschema.ValidationError as err:  # the full schema in the message is unreadable
        where = ".".join(str(p) for p in err.absolute_path) or "(object)"
        raise AssertionError(f"not a valid {K8S_VERSION} Pod: {where}: {err.message}") from None
    problems = semantic_problems(pod)
    assert not problems, "\n".join(problems)


def semantic_problems(pod: Mapping) -> list[str]:
    """Rules of the API server's Pod validation (``ValidatePodSpec``) that the schema misses."""
    problems: list[str] = []
    spec = pod.get("spec") or {}
    for i, toleration in enumerate(spec.get("tolerations") or []):
        where = f"spec.tolerations[{i}]"
        if not isinstance(toleration, dict):
            problems.append(f"{where}: not an object")
            continue
        operator = toleration.get("operator") or "Equal"
        if operator not in TOLERATION_OPERATORS:
            problems.append(f"{where}.operator: {operator!r}")
        if operator == "Exists" and toleration.get("value"):
            problems.append(f"{where}.value: must be empty when operator is Exists")
        if operator == "Equal" and not toleration.get("key"):
            problems.append(f"{where}.key: required when operator is Equal")
        effect = toleration.get("effect")
        if effect and effect not in TAINT_EFFECTS:
            problems.append(f"{where}.effect: {effect!r}")
        if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
            problems.append(f"{where}.tolerationSeconds: only with effect NoExecute")
    node = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None:
        terms = required.get("nodeSelectorTerms")
        if not isinstance(terms, list) or not terms:
            problems.append("nodeSelectorTerms: must have at least one node selector term")
        for t, term in enumerate(terms or []):
            where = f"nodeSelectorTerms[{t}]"
            if not isinstance(term, dict):
                problems.append(f"{where}: not an object")
                continue
            problems += _requirement_problems(where, term)
    for p, weighted in enumerate(preferred_terms(pod)):
        where = f"preferredDuringSchedulingIgnoredDuringExecution[{p}]"
        if not 1 <= weighted.get("weight", 0) <= 100:
            problems.append(f"{where}.weight: must be in 1..100")
        problems += _requirement_problems(f"{where}.preference", weighted.get("preference") or {})
    for list_name in ("initContainers", "containers"):
        for c, container in enumerate(spec.get(list_name) or []):
            names = [v.get("name") for v in container.get("env") or []]
            if any(not n for n in names):
                problems.append(f"spec.{list_name}[{c}].env: a variable without a name")
    annotations = (pod.get("metadata") or {}).get("annotations")
    if annotations is not None and not all(isinstance(v, str) for v in annotations.values()):
        problems.append("metadata.annotations: values must be strings")
    return problems


def _requirement_problems(where: str, term: Mapping) -> list[str]:
    problems: list[str] = []
    for field, operators in (
        ("matchExpressions", SELECTOR_OPERATORS),
        ("matchFields", FIELD_OPERATORS),
    ):
        for e, expr in enumerate(term.get(field) or []):
            at = f"{where}.{field}[{e}]"
            operator, values = expr.get("operator"), expr.get("values") or []
            if not expr.get("key"):
                problems.append(f"{at}.key: required")
            if operator not in operators:
                problems.append(f"{at}.operator: {operator!r}")
            if operator in ("In", "NotIn") and not values:
                problems.append(f"{at}.values: required for {operator}")
            if operator in ("Exists", "DoesNotExist") and values:
                problems.append(f"{at}.values: must be empty for {operator}")
    return problems


# --- The engine's own pool choice ---------------------------------------------------------


def pool_selection(pod: Mapping, policy: Policy, namespace: str) -> Selection:
    """What ``webhook.core.pools`` chooses for a Pod (to know what its patch must contain)."""
    view = build_view("Pod", "", pod, namespace, policy)
    assert view is not None
    return select_pool(view, policy)


def can_reach_gpu_nodes(pod: Mapping, policy: Policy, namespace: str) -> bool:
    """Whether ``webhook.core.scope`` finds the Pod able to reach a GPU node."""
    view = build_view("Pod", "", pod, namespace, policy)
    assert view is not None
    return reach(view, policy).reachable


# --- Scheduler semantics, written independently of webhook.core.scheduling ---------------------


def tolerates(toleration: Mapping, taint: Mapping) -> bool:
    """``v1.Toleration.ToleratesTaint`` from k8s.io/api/core/v1/toleration.go."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        if not toleration.get("key"):
            return False  # rejected by validation; never tolerates
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def tolerated(pod: Mapping, taint: Mapping) -> bool:
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    return any(isinstance(t, dict) and tolerates(t, taint) for t in tolerations)


def required_terms(pod: Mapping) -> list | None:
    """The Pod's nodeSelectorTerms, or None without required node affinity."""
    node = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    return None if required is None else required.get("nodeSelectorTerms")


def preferred_terms(pod: Mapping) -> list:
    node = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    return node.get("preferredDuringSchedulingIgnoredDuringExecution") or []


def term_requires(term: Mapping, labels: Mapping[str, str]) -> bool:
    """Whether a nodeSelectorTerm contains ``key In [value]`` for every label."""
    expressions = term.get("matchExpressions") or []
    return all(
        any(
            e.get("key") == k and e.get("operator") == "In" and e.get("values") == [v]
            for e in expressions
        )
        for k, v in labels.items()
    )


def confined_to(pod: Mapping, labels: Mapping[str, str]) -> bool:
    """Whether the Pod can only be scheduled onto nodes that carry these labels."""
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    if all(selector.get(k) == v for k, v in labels.items()):
        return True
    terms = required_terms(pod)
    return bool(terms) and all(term_requires(t, labels) for t in terms)


def admits_node(pod: Mapping, labels: Mapping[str, str]) -> bool:
    """Whether the scheduler's node selection lets the Pod onto a node with exactly these
    labels: ``nodeSelector`` ANDed with the required nodeSelectorTerms, which are ORed; an
    empty term matches no node (``k8s.io/component-helpers/scheduling/corev1/nodeaffinity``).
    Written here, apart from ``webhook.core.scheduling``, as the tests' oracle."""
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    terms = required_terms(pod)
    if terms is None:
        return True
    return any(_term_matches(term, labels) for term in terms)


def _term_matches(term: Mapping, labels: Mapping[str, str]) -> bool:
    expressions = term.get("matchExpressions") or []
    if not expressions and not term.get("matchFields"):
        return False
    if term.get("matchFields"):
        return False  # metadata.name: no node of a pool is named in advance
    return all(_requirement(e, labels) for e in expressions)


def _requirement(expression: Mapping, labels: Mapping[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = expression.get("values") or []
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present:
        try:
            left, right = int(labels[key]), int(values[0])
        except (ValueError, IndexError):
            return False
        return left > right if operator == "Gt" else left < right
    return False
