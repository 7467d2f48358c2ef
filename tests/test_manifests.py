"""The Kubernetes manifests under manifests/: every kustomization renders, every object is
valid against the Kubernetes 1.32 schema, and the deployment has the properties the webhook
relies on (availability, hardening, hot-reloadable policy, webhook wiring)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.kube import kustomize
from tests.support.paths import REPO
from webhook.cli.webhook_coverage import rule_covers
from webhook.policy.dra import CLAIM_MAKERS
from webhook.policy.load import default_policy_path, load_policy
from webhook.policy.workloads import (
    CLAIM_KINDS,
    CLAIMS_RESOURCE,
    CLAIMS_WEBHOOK,
    CLASSES_READ_RULES,
    DRA_GROUP,
    NODES_READ_RULE,
    NOT_CONTROLLED,
    NOT_MADE_BY_THE_CONTROL_PLANE,
    QUOTAS_READ_RULE,
    SPEC_CHANGED,
    WORKLOADS_MUTATING_WEBHOOK,
    WORKLOADS_WEBHOOK,
    custom_resource_rules,
    read_rules,
)
from webhook.server.gunicorn import STOP_MARGIN_SECONDS
from webhook.server.settings import GRACEFUL_TIMEOUT

MANIFESTS = REPO / "manifests"
K8S_VERSION = "1.32"

NAMESPACE = "gpu-admission"
OPT_OUT_LABEL = "gpu-admission.io/ignore"
POLICY_CONFIGMAP = "gpu-admission-policy"
TLS_SECRET = "gpu-admission-tls"
POLICY_MOUNT = "/etc/gpu-admission/policy"
TLS_MOUNT = "/etc/gpu-admission/tls"
CERT_MANAGER_GROUP = "cert-manager.io"

# Every install a user may make, by a short name: its two steps, the server and, once that is
# Ready, its webhook configurations (docs/installing.md).
INSTALLS = {
    "root": (MANIFESTS, MANIFESTS / "webhooks"),
    "base": (MANIFESTS / "base", MANIFESTS / "webhooks"),
    "audit": (MANIFESTS / "overlays" / "audit", MANIFESTS / "overlays" / "audit" / "webhooks"),
    "cert-manager": (
        MANIFESTS / "overlays" / "cert-manager",
        MANIFESTS / "overlays" / "cert-manager" / "webhooks",
    ),
    "inventory": (MANIFESTS / "overlays" / "inventory", MANIFESTS / "webhooks"),
}
WEBHOOK_KINDS = {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}
# The validating webhook fails closed everywhere except in the audit overlay.
VALIDATING_FAILURE_POLICY = {
    "root": "Fail",
    "base": "Fail",
    "audit": "Ignore",
    "cert-manager": "Fail",
    "inventory": "Fail",
}

BUILT_IN_VALIDATING_RESOURCES = {
    ("", "pods"),
    ("", "pods/ephemeralcontainers"),
    ("", "replicationcontrollers"),
    ("apps", "deployments"),
    ("apps", "replicasets"),
    ("apps", "statefulsets"),
    ("apps", "daemonsets"),
    ("batch", "jobs"),
    ("batch", "cronjobs"),
}
# The custom kinds come from the default policy (its catalogue): generated, not listed here.
DEFAULT_POLICY = load_policy(default_policy_path())
EXPECTED_VALIDATING_RESOURCES = BUILT_IN_VALIDATING_RESOURCES | {
    (w.group, w.resource) for w in DEFAULT_POLICY.workloads.values() if not w.built_in
}
BUILTIN_GROUPS = {"", "apps", "batch"}


# ---------------------------------------------------------------------------- helpers


@functools.cache
def render(name: str) -> tuple[dict[str, Any], ...]:
    """Both steps of one of INSTALLS, rendered: what the cluster holds once it is done."""
    server, webhooks = INSTALLS[name]
    return render_dir(server) + render_dir(webhooks)


@functools.cache
def render_dir(directory: Path) -> tuple[dict[str, Any], ...]:
    """`kubectl kustomize` a directory, parsed into a tuple of objects."""
    return tuple(kustomize(directory))


def objects_of(objs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") == kind]


def one(objs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects_of(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected exactly one {kind} {name or ''}, found {len(found)}"
    return found[0]


def api_group(obj: dict[str, Any]) -> str:
    api_version = obj["apiVersion"]
    return api_version.split("/", 1)[0] if "/" in api_version else ""


def validating_rule_resources(rendered_objects: Iterable[dict[str, Any]]) -> set[tuple[str, str]]:
    """Every (API group, resource) pair the ValidatingWebhookConfigurations intercept.

    The core group is "" and subresources keep their "pods/ephemeralcontainers" form, e.g.
    {("", "pods"), ("apps", "deployments"), ("kubeflow.org", "pytorchjobs"), ...}.
    """
    pairs: set[tuple[str, str]] = set()
    for config in objects_of(rendered_objects, "ValidatingWebhookConfiguration"):
        for webhook in config.get("webhooks", []):
            for rule in webhook.get("rules", []):
                for group in rule.get("apiGroups", []):
                    for resource in rule.get("resources", []):
                        pairs.add((group, resource))
    return pairs


def deployment(objs) -> dict[str, Any]:
    return one(objs, "Deployment", "gpu-admission")


def pod_spec(objs) -> dict[str, Any]:
    return deployment(objs)["spec"]["template"]["spec"]


def container(objs) -> dict[str, Any]:
    containers = pod_spec(objs)["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(ctr: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in ctr.get("env", [])}


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """metav1.LabelSelector semantics (matchLabels and matchExpressions, ANDed)."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# The entries of each configuration, in order: the first (Pods and the built-in kinds, with
# DRA's claim templates in the validating one), then the validating one's for custom workload
# kinds and for DRA's ResourceClaims, the mutating one's for the GPU defaults of workloads.
ENTRIES = {
    "ValidatingWebhookConfiguration": [
        "validate.gpu-admission.io",
        WORKLOADS_WEBHOOK,
        CLAIMS_WEBHOOK,
    ],
    "MutatingWebhookConfiguration": ["mutate.gpu-admission.io", WORKLOADS_MUTATING_WEBHOOK],
}


def webhook(objs, kind: str, name: str | None = None) -> dict[str, Any]:
    """A webhook of the configuration: the first, or by name (``ENTRIES``)."""
    webhooks = one(objs, kind, "gpu-admission")["webhooks"]
    assert [h["name"] for h in webhooks] == ENTRIES[kind]
    if name is None:
        return webhooks[0]
    [hook] = [h for h in webhooks if h["name"] == name]
    return hook


def validate_cert_manager(obj: dict[str, Any]) -> list[str]:
    """kubernetes-validate does not know CRDs: check cert-manager objects by hand."""
    errors = []
    where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    if obj["apiVersion"] != "cert-manager.io/v1":
        errors.append(f"{where}: apiVersion {obj['apiVersion']} is not cert-manager.io/v1")
    if not obj.get("metadata", {}).get("name") or obj["metadata"].get("namespace") != NAMESPACE:
        errors.append(f"{where}: needs a name and namespace {NAMESPACE}")
    spec = obj.get("spec") or {}
    if obj["kind"] == "Issuer":
        types = [t for t in ("selfSigned", "ca", "acme", "vault", "venafi") if t in spec]
        if len(types) != 1:
            errors.append(f"{where}: exactly one issuer type required, found {types}")
        if "ca" in spec and not spec["ca"].get("secretName"):
            errors.append(f"{where}: spec.ca.secretName is required")
    elif obj["kind"] == "Certificate":
        if not spec.get("secretName"):
            errors.append(f"{where}: spec.secretName is required")
        if not (spec.get("issuerRef") or {}).get("name"):
            errors.append(f"{where}: spec.issuerRef.name is required")
        if not (spec.get("commonName") or spec.get("dnsNames")):
            errors.append(f"{where}: a commonName or dnsNames is required")
    else:
        errors.append(f"{where}: unexpected cert-manager kind")
    return errors


all_renders = pytest.mark.parametrize("name", list(INSTALLS))


# ---------------------------------------------------------------------------- rendering


@all_renders
def test_renders_and_every_object_is_valid(name):
    objs = render(name)
    assert objs, f"{name} rendered nothing"
    errors = []
    for obj in objs:
        if api_group(obj) == CERT_MANAGER_GROUP:
            errors.extend(validate_cert_manager(obj))
            continue
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata'].get('name')}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_root_kustomization_is_the_base():
    assert render("root") == render("base")


@all_renders
def test_the_server_step_has_no_webhook_and_the_webhook_step_nothing_else(name):
    server, webhooks = INSTALLS[name]
    assert not [o for o in render_dir(server) if o["kind"] in WEBHOOK_KINDS]
    assert {o["kind"] for o in render_dir(webhooks)} == WEBHOOK_KINDS


@all_renders
def test_no_secret_and_no_rbac_binding(name):
    objs = render(name)
    kinds = {o["kind"] for o in objs}
    # The TLS Secret comes from `gpu-admission certs install` or cert-manager.
    assert "Secret" not in kinds
    # The server makes no API calls (the auditor ClusterRole is deliberately unbound), but
    # for the inventory overlay's, which reads Nodes (tested below).
    bindings = [o["metadata"]["name"] for o in objs if o["kind"] == "ClusterRoleBinding"]
    assert bindings == (["gpu-admission-inventory"] if name == "inventory" else [])
    assert not kinds & {"RoleBinding", "Role"}


@all_renders
def test_everything_namespaced_lives_in_the_webhook_namespace(name):
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    }
    for obj in render(name):
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"].get("namespace") == NAMESPACE, obj["metadata"]["name"]


def test_namespace_opts_out_of_its_own_webhook():
    namespace = one(render("base"), "Namespace", NAMESPACE)
    assert OPT_OUT_LABEL in namespace["metadata"]["labels"]


def test_service_account_has_no_token():
    objs = render("base")
    sa = one(objs, "ServiceAccount", "gpu-admission")
    assert sa["automountServiceAccountToken"] is False
    spec = pod_spec(objs)
    assert spec["serviceAccountName"] == "gpu-admission"
    assert spec.get("automountServiceAccountToken", False) is False


def test_auditor_cluster_role_is_read_only_and_covers_the_validated_kinds():
    objs = render("base")
    role = one(objs, "ClusterRole", "gpu-admission-auditor")
    readable = set()
    for rule in role["rules"]:
        assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
        readable |= {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
    validated = {(g, r) for g, r in validating_rule_resources(objs) if "/" not in r}
    assert validated <= readable, validated - readable


# ---------------------------------------------------------------------------- availability


def test_replicas_are_owned_by_the_hpa():
    objs = render("base")
    # No spec.replicas: re-applying must not reset a scaled-out Deployment
    # (see the note in manifests/base/kustomization.yaml).
    assert "replicas" not in deployment(objs)["spec"]
    hpa = one(objs, "HorizontalPodAutoscaler", "gpu-admission")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "gpu-admission",
    }
    assert hpa["spec"]["minReplicas"] == 3
    assert hpa["spec"]["maxReplicas"] == 10
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource"
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"


def test_rollout_never_reduces_ready_replicas():
    strategy = deployment(render("base"))["spec"]["strategy"]
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0


def test_pods_spread_across_nodes_and_zones():
    objs = render("base")
    pod_labels = deployment(objs)["spec"]["template"]["metadata"]["labels"]
    spec = pod_spec(objs)
    anti = spec["affinity"]["podAntiAffinity"]
    # Preferred, so that small clusters still schedule every replica.
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
    terms = [t["podAffinityTerm"] for t in anti["preferredDuringSchedulingIgnoredDuringExecution"]]
    assert any(
        t["topologyKey"] == "kubernetes.io/hostname"
        and selector_matches(t["labelSelector"], pod_labels)
        for t in terms
    )
    constraints = spec["topologySpreadConstraints"]
    assert constraints
    assert all(selector_matches(c["labelSelector"], pod_labels) for c in constraints)


def test_pdb_allows_one_voluntary_disruption_at_the_minimum_scale():
    objs = render("base")
    pdb = one(objs, "PodDisruptionBudget", "gpu-admission")
    pod_labels = deployment(objs)["spec"]["template"]["metadata"]["labels"]
    assert selector_matches(pdb["spec"]["selector"], pod_labels)
    spec = pdb["spec"]
    assert ("maxUnavailable" in spec) != ("minAvailable" in spec)
    assert spec.get("maxUnavailable") == 1 or spec.get("minAvailable") == 2
    min_replicas = one(objs, "HorizontalPodAutoscaler")["spec"]["minReplicas"]
    allowed = spec.get("maxUnavailable") or min_replicas - spec["minAvailable"]
    assert 1 <= allowed < min_replicas


def test_critical_priority_is_admitted_by_a_quota():
    objs = render("base")
    assert pod_spec(objs)["priorityClassName"] == "system-cluster-critical"
    quotas = [
        q
        for q in objects_of(objs, "ResourceQuota")
        for e in q["spec"].get("scopeSelector", {}).get("matchExpressions", [])
        if e["scopeName"] == "PriorityClass"
        and e["operator"] == "In"
        and "system-cluster-critical" in e["values"]
    ]
    assert quotas, "no ResourceQuota scoped to the system-cluster-critical priority class"
    hpa_max = one(objs, "HorizontalPodAutoscaler")["spec"]["maxReplicas"]
    assert int(quotas[0]["spec"]["hard"]["pods"]) > hpa_max


# ---------------------------------------------------------------------------- the container


def test_container_image_args_and_port():
    ctr = container(render("base"))
    assert ctr["image"] == "ghcr.io/example/gpu-admission:0.1.0"
    assert ctr["args"] == [
        "serve",
        "--policy",
        f"{POLICY_MOUNT}/policy.yaml",
        "--cert",
        f"{TLS_MOUNT}/tls.crt",
        "--key",
        f"{TLS_MOUNT}/tls.key",
        "--bind",
        "0.0.0.0:8443",
    ]
    assert {"name": "https", "containerPort": 8443, "protocol": "TCP"} in ctr["ports"]


@pytest.mark.parametrize(
    ("probe", "path"), [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")]
)
def test_probes_use_https(probe, path):
    ctr = container(render("base"))
    get = ctr[probe]["httpGet"]
    assert get["scheme"] == "HTTPS"
    assert get["path"] == path
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    assert ports.get(get["port"], get["port"]) == 8443


def test_resources_have_requests_and_limits():
    resources = container(render("base"))["resources"]
    for section in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[section]), section


def test_container_is_hardened():
    objs = render("base")
    pod_ctx = pod_spec(objs).get("securityContext", {})
    ctx = {**pod_ctx, **container(objs)["securityContext"]}  # container settings win
    assert ctx["runAsNonRoot"] is True
    assert ctx["runAsUser"] == 10001
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert "add" not in ctx["capabilities"]
    assert ctx["seccompProfile"]["type"] == "RuntimeDefault"
    assert not container(objs)["securityContext"].get("privileged", False)


def test_writable_dirs_are_memory_backed():
    objs = render("base")
    ctr = container(objs)
    volumes = {v["name"]: v for v in pod_spec(objs)["volumes"]}
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    assert volumes[mounts["/tmp"]["name"]]["emptyDir"]["medium"] == "Memory"
    assert "PROMETHEUS_MULTIPROC_DIR" not in env_of(ctr)  # one worker: no metrics files


def test_drain_fits_in_the_termination_grace_period():
    objs = render("base")
    drain = int(env_of(container(objs))["GPU_ADMISSION_DRAIN_SECONDS"])
    grace = pod_spec(objs)["terminationGracePeriodSeconds"]
    assert drain == 15
    assert grace == 40
    # Room after the drain for the worker to finish in-flight requests (each bounded by the
    # validating webhook's timeout), and for the arbiter to wait for it before the kubelet's
    # SIGKILL.
    timeout = webhook(objs, "ValidatingWebhookConfiguration")["timeoutSeconds"]
    assert timeout <= GRACEFUL_TIMEOUT
    assert drain + GRACEFUL_TIMEOUT + STOP_MARGIN_SECONDS <= grace


def test_policy_configmap_is_mounted_as_a_directory():
    objs = render("base")
    ctr = container(objs)
    configmap = one(objs, "ConfigMap", POLICY_CONFIGMAP)  # stable name: no hash suffix
    assert set(configmap["data"]) == {"policy.yaml"}
    volumes = {v["name"]: v for v in pod_spec(objs)["volumes"]}
    [mount] = [
        m
        for m in ctr["volumeMounts"]
        if volumes[m["name"]].get("configMap", {}).get("name") == POLICY_CONFIGMAP
    ]
    # subPath mounts are never updated, which would defeat the hot reload.
    assert "subPath" not in mount and "subPathExpr" not in mount
    assert mount["mountPath"] == POLICY_MOUNT
    assert mount["readOnly"] is True
    assert "items" not in volumes[mount["name"]]["configMap"]
    policy_arg = ctr["args"][ctr["args"].index("--policy") + 1]
    assert policy_arg == f"{mount['mountPath']}/policy.yaml"


def test_tls_secret_is_mounted():
    objs = render("base")
    ctr = container(objs)
    volumes = {v["name"]: v for v in pod_spec(objs)["volumes"]}
    [mount] = [
        m
        for m in ctr["volumeMounts"]
        if volumes[m["name"]].get("secret", {}).get("secretName") == TLS_SECRET
    ]
    assert mount["mountPath"] == TLS_MOUNT
    assert "subPath" not in mount  # the rotated certificate must reach the Pod


def test_service_maps_443_to_8443():
    objs = render("base")
    service = one(objs, "Service", "gpu-admission")
    [port] = service["spec"]["ports"]
    assert port["port"] == 443
    assert port["targetPort"] == 8443
    pod_labels = deployment(objs)["spec"]["template"]["metadata"]["labels"]
    assert selector_matches({"matchLabels": service["spec"]["selector"]}, pod_labels)


# ---------------------------------------------------------------------------- webhooks


@all_renders
@pytest.mark.parametrize(
    ("kind", "hook_name", "path", "timeout"),
    [
        ("ValidatingWebhookConfiguration", "validate.gpu-admission.io", "/validate", 5),
        ("ValidatingWebhookConfiguration", WORKLOADS_WEBHOOK, "/validate", 5),
        ("ValidatingWebhookConfiguration", CLAIMS_WEBHOOK, "/validate", 5),
        ("MutatingWebhookConfiguration", "mutate.gpu-admission.io", "/mutate", 3),
        ("MutatingWebhookConfiguration", WORKLOADS_MUTATING_WEBHOOK, "/mutate", 3),
    ],
)
def test_webhook_common_fields(name, kind, hook_name, path, timeout):
    objs = render(name)
    hook = webhook(objs, kind, hook_name)
    assert hook["name"] == hook_name
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None"
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["timeoutSeconds"] == timeout
    client = hook["clientConfig"]
    assert "url" not in client
    assert client["service"] == {
        "namespace": NAMESPACE,
        "name": "gpu-admission",
        "path": path,
        "port": 443,
    }
    # Filled by `certs install` or cert-manager's cainjector, never shipped.
    assert client.get("caBundle", "") == ""
    service = one(objs, "Service", client["service"]["name"])
    assert client["service"]["port"] in {p["port"] for p in service["spec"]["ports"]}


@all_renders
@pytest.mark.parametrize("kind", ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"])
def test_webhook_namespace_selector(name, kind):
    objs = render(name)
    selectors = [h["namespaceSelector"] for h in one(objs, kind, "gpu-admission")["webhooks"]]
    for selector in selectors:
        check_namespace_selector(name, objs, selector)


def check_namespace_selector(name: str, objs: list, selector: dict) -> None:
    expressions = selector["matchExpressions"]
    # cert-manager's namespace only where cert-manager issues the certificate: elsewhere it
    # would be a namespace anyone allowed to create one could use to be judged by nothing.
    excluded = ["kube-system", "gpu-admission"] + (
        ["cert-manager"] if name == "cert-manager" else []
    )
    assert {
        "key": "kubernetes.io/metadata.name",
        "operator": "NotIn",
        "values": excluded,
    } in expressions
    assert {"key": OPT_OUT_LABEL, "operator": "DoesNotExist"} in expressions

    def judged(ns: str, labels: dict[str, str] | None = None) -> bool:
        return selector_matches(selector, {"kubernetes.io/metadata.name": ns, **(labels or {})})

    assert judged("team-a")
    assert not judged("kube-system")
    # With cert-manager, so that it can recreate its Pods while the webhook waits for it.
    assert judged("cert-manager") is (name != "cert-manager")
    assert not judged(NAMESPACE)
    assert not judged("team-b", {OPT_OUT_LABEL: "true"})
    own = one(objs, "Namespace", NAMESPACE)["metadata"]["labels"]
    assert not selector_matches(selector, {"kubernetes.io/metadata.name": NAMESPACE, **own})


@all_renders
def test_failure_policies(name):
    objs = render(name)
    expected = VALIDATING_FAILURE_POLICY[name]
    assert webhook(objs, "ValidatingWebhookConfiguration")["failurePolicy"] == expected
    assert webhook(objs, "MutatingWebhookConfiguration")["failurePolicy"] == "Ignore"
    # Custom workload kinds fail open: their Pods are judged fail-closed when created.
    hook = webhook(objs, "ValidatingWebhookConfiguration", WORKLOADS_WEBHOOK)
    assert hook["failurePolicy"] == "Ignore"
    # ResourceClaims fail open in every install: a controller creates the claims of Pods.
    hook = webhook(objs, "ValidatingWebhookConfiguration", CLAIMS_WEBHOOK)
    assert hook["failurePolicy"] == "Ignore"
    # Defaults only: a workload the webhook could not answer for is created without them.
    hook = webhook(objs, "MutatingWebhookConfiguration", WORKLOADS_MUTATING_WEBHOOK)
    assert hook["failurePolicy"] == "Ignore"


@all_renders
def test_validating_rules(name):
    objs = render(name)
    assert validating_rule_resources(objs) == EXPECTED_VALIDATING_RESOURCES
    assert {
        r
        for rule in webhook(objs, "ValidatingWebhookConfiguration")["rules"]
        for r in rule["apiGroups"]
    } <= BUILTIN_GROUPS | {DRA_GROUP}
    for rule in webhook(objs, "ValidatingWebhookConfiguration", WORKLOADS_WEBHOOK)["rules"]:
        assert not set(rule["apiGroups"]) & (BUILTIN_GROUPS | {DRA_GROUP}), "custom kinds only"
        assert rule["apiVersions"] == ["*"] and rule["scope"] == "*", rule
    for rule in webhook(objs, "ValidatingWebhookConfiguration")["rules"]:
        assert rule.get("scope", "*") in {"Namespaced", "*"}
        groups = set(rule["apiGroups"])
        assert rule["apiVersions"] == ["v1"], rule
        if groups <= BUILTIN_GROUPS:
            assert sorted(rule["operations"]) == ["CREATE", "UPDATE"], rule
        else:
            # A claim template's spec is immutable.
            assert groups == {DRA_GROUP} and rule["operations"] == ["CREATE"], rule


@all_renders
def test_custom_kind_rules_are_generated_from_the_policy(name):
    """The shipped rules for custom kinds are exactly what `gpu-admission webhooks rules`
    generates from the default policy: no kind judged but never sent, none sent for nothing."""
    hook = webhook(render(name), "ValidatingWebhookConfiguration", WORKLOADS_WEBHOOK)
    assert hook["rules"] == custom_resource_rules(DEFAULT_POLICY.workloads.values())
    assert hook["matchConditions"] == [{"name": "spec-changed", "expression": SPEC_CHANGED}]


def test_the_chart_reads_the_generated_rules():
    files = yaml.safe_load((REPO / "manifests/chart/files/webhooks.yaml").read_text("utf-8"))
    assert files["workloads"]["rules"] == custom_resource_rules(DEFAULT_POLICY.workloads.values())
    assert files["auditorRules"] == [
        *read_rules(DEFAULT_POLICY.workloads.values()),
        NODES_READ_RULE,
        QUOTAS_READ_RULE,
        *CLASSES_READ_RULES,
    ]
    assert files["backgroundAuditRules"] == read_rules(DEFAULT_POLICY.workloads.values())


# ---------------------------------------------------------------------------- DRA's kinds


def claim_entries(objs) -> dict[str, dict[str, Any]]:
    """Each validating entry that is sent a DRA claim kind on CREATE, by the kind's resource."""
    config = one(objs, "ValidatingWebhookConfiguration", "gpu-admission")
    return {
        resource: hook
        for _, resource, _ in CLAIM_KINDS
        for hook in config["webhooks"]
        if any(rule_covers(r, DRA_GROUP, resource, "CREATE") for r in hook["rules"])
    }


@all_renders
def test_every_claim_kind_the_engine_judges_is_sent_once_on_create(name):
    """Derived from the kinds the engine judges: ResourceClaims to the claims entry (failing
    open), every other (ResourceClaimTemplates) to the first entry (failing closed, like a
    Pod; the audit overlay's fails open), each to one entry, and never on UPDATE (their specs
    are immutable) or their status."""
    objs = render(name)
    config = one(objs, "ValidatingWebhookConfiguration", "gpu-admission")
    entries = claim_entries(objs)
    for kind, resource, _ in CLAIM_KINDS:
        expected = CLAIMS_WEBHOOK if resource == CLAIMS_RESOURCE else "validate.gpu-admission.io"
        assert entries.get(resource, {}).get("name") == expected, f"{kind} is not sent"
        sending = [
            hook["name"]
            for hook in config["webhooks"]
            for operation in ("CREATE", "UPDATE")
            for sent in (resource, f"{resource}/status")
            if any(rule_covers(r, DRA_GROUP, sent, operation) for r in hook["rules"])
        ]
        assert sending == [expected], (kind, sending)
        hook = entries[resource]
        failure_policy = (
            "Ignore" if resource == CLAIMS_RESOURCE else VALIDATING_FAILURE_POLICY[name]
        )
        assert hook["failurePolicy"] == failure_policy, kind
        assert hook["matchPolicy"] == "Equivalent", kind
    claims = webhook(objs, "ValidatingWebhookConfiguration", CLAIMS_WEBHOOK)
    assert claims["rules"] == [
        {
            "apiGroups": [DRA_GROUP],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": [CLAIMS_RESOURCE],
            "scope": "Namespaced",
        }
    ]


def test_the_claims_match_condition_is_generated_from_the_claim_makers():
    expected = (
        "!has(request.userInfo.username) || ("
        + " && ".join(
            f"request.userInfo.username != '{username}'" for username in sorted(CLAIM_MAKERS)
        )
        + ")"
    )
    assert NOT_MADE_BY_THE_CONTROL_PLANE == expected
    for name in INSTALLS:
        hook = webhook(render(name), "ValidatingWebhookConfiguration", CLAIMS_WEBHOOK)
        assert hook["matchConditions"] == [
            {"name": "not-made-by-the-control-plane", "expression": expected}
        ]


CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {
        "name": "train-gpu-x7k2p",
        # What the resource-claim controller writes: anyone who creates a claim can too.
        "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
    },
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
}


@pytest.mark.parametrize(
    ("user_info", "sent"),
    [
        *[
            ({"username": maker, "groups": ["system:authenticated"]}, False)
            for maker in CLAIM_MAKERS
        ],
        ({"username": "alice", "groups": ["team-a"]}, True),
        ({"username": "system:serviceaccount:team-a:resource-claim-controller"}, True),
        ({"username": "system:kube-scheduler-extra"}, True),
        ({}, True),
    ],
)
def test_claims_the_control_plane_creates_are_not_sent(user_info, sent):
    [condition] = webhook(render("base"), "ValidatingWebhookConfiguration", CLAIMS_WEBHOOK)[
        "matchConditions"
    ]
    variables = {
        "object": CLAIM,
        "oldObject": None,
        "request": {"operation": "CREATE", "userInfo": user_info},
    }
    assert cel_eval(condition["expression"], variables) is sent


def test_the_chart_reads_the_generated_claims_entry():
    files = yaml.safe_load((REPO / "manifests/chart/files/webhooks.yaml").read_text("utf-8"))
    hook = webhook(render("base"), "ValidatingWebhookConfiguration", CLAIMS_WEBHOOK)
    assert files["claims"] == {"rules": hook["rules"], "matchConditions": hook["matchConditions"]}
    assert (
        files["validating"]["rules"]
        == webhook(render("base"), "ValidatingWebhookConfiguration")["rules"]
    )


def test_the_auditor_role_reads_exactly_the_judged_kinds():
    role = one(render("base"), "ClusterRole", "gpu-admission-auditor")
    assert role["rules"] == [
        *read_rules(DEFAULT_POLICY.workloads.values()),
        NODES_READ_RULE,
        QUOTAS_READ_RULE,
        *CLASSES_READ_RULES,
    ]


def test_the_auditor_role_reads_what_cluster_check_reads():
    """Nodes, the device plugin DaemonSets a policy names and their Pods (whatever kinds it
    judges: the built-in kinds, DaemonSet and Pod among them, are always judged), and the
    Namespaces and ResourceQuotas it compares with the tenants' entitlements."""
    role = one(render("base"), "ClusterRole", "gpu-admission-auditor")

    def allowed(group: str, resource: str, verb: str) -> bool:
        return any(
            group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
            for rule in role["rules"]
        )

    assert allowed("", "nodes", "list")
    assert allowed("apps", "daemonsets", "get")
    assert allowed("", "pods", "list")
    assert allowed("", "namespaces", "list")
    assert allowed("", "resourcequotas", "list")
    assert allowed("node.k8s.io", "runtimeclasses", "get")
    assert allowed("scheduling.k8s.io", "priorityclasses", "get")


def test_validating_rule_resources_helper():
    assert validating_rule_resources([]) == set()
    assert ("apps", "deployments") in validating_rule_resources(render("base"))


@all_renders
def test_mutating_webhook(name):
    hook = webhook(render(name), "MutatingWebhookConfiguration")
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        },
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["pods/ephemeralcontainers"],
            "scope": "Namespaced",
        },
    ]
    conditions = hook["matchConditions"]
    assert 1 <= len(conditions) <= 3
    for condition in conditions:
        assert "nvidia.com/" in condition["expression"]
        assert "has(" in condition["expression"]
        assert "tolerations" in condition["expression"]


BUILT_IN_TEMPLATE_KINDS = [
    ("", ["replicationcontrollers"]),
    ("apps", ["deployments", "replicasets", "statefulsets", "daemonsets"]),
    ("batch", ["jobs", "cronjobs"]),
]


@all_renders
def test_mutating_webhook_for_workloads(name):
    """The GPU defaults go on workload templates when they are created: every built-in kind
    with a pod template and the catalogue's kinds with one (generated), on CREATE only, and
    only objects no controller owns."""
    hook = webhook(render(name), "MutatingWebhookConfiguration", WORKLOADS_MUTATING_WEBHOOK)
    assert hook["reinvocationPolicy"] == "Never"
    assert hook["matchConditions"] == [{"name": "not-controlled", "expression": NOT_CONTROLLED}]
    built_in = [
        {
            "apiGroups": [group],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": resources,
            "scope": "Namespaced",
        }
        for group, resources in BUILT_IN_TEMPLATE_KINDS
    ]
    custom = custom_resource_rules(DEFAULT_POLICY.workloads.values(), mutating=True)
    assert hook["rules"] == built_in + custom
    sent = {(g, r) for rule in hook["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    templated = {
        (w.group, w.resource)
        for w in DEFAULT_POLICY.workloads.values()
        if any(t.shape == "template" for t in w.targets)
        and w.kind != "Pod"
        and w.group != "extensions"  # no longer served
    }
    # Exactly the judged kinds with a pod template: InferenceServices and Argo Workflows write
    # their Pods' fields inline, where an operator may not pass a class on.
    assert sent == templated
    assert ("serving.kserve.io", "inferenceservices") not in sent


def test_the_chart_reads_the_generated_mutating_rules():
    files = yaml.safe_load((REPO / "manifests/chart/files/webhooks.yaml").read_text("utf-8"))
    hook = webhook(render("base"), "MutatingWebhookConfiguration", WORKLOADS_MUTATING_WEBHOOK)
    assert files["workloadsMutating"] == {
        "rules": hook["rules"],
        "matchConditions": hook["matchConditions"],
    }


OWNER = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "train", "uid": "u-1"}


@pytest.mark.parametrize(
    ("case", "metadata", "sent"),
    [
        ("no owner", {"name": "train"}, True),
        ("empty owners", {"name": "train", "ownerReferences": []}, True),
        ("an owner that is no controller", {"ownerReferences": [OWNER]}, True),
        ("controller false", {"ownerReferences": [{**OWNER, "controller": False}]}, True),
        ("a controller", {"ownerReferences": [{**OWNER, "controller": True}]}, False),
        (
            "a controller among owners",
            {"ownerReferences": [OWNER, {**OWNER, "uid": "u-2", "controller": True}]},
            False,
        ),
    ],
)
def test_workloads_a_controller_owns_are_not_sent_for_defaults(case, metadata, sent):
    [condition] = webhook(
        render("base"), "MutatingWebhookConfiguration", WORKLOADS_MUTATING_WEBHOOK
    )["matchConditions"]
    obj = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": metadata, "spec": {}}
    variables = {"object": obj, "oldObject": None, "request": {"operation": "CREATE"}}
    assert cel_eval(condition["expression"], variables) is sent, case


# ---------------------------------------------------------------------------- the CEL

# A tiny evaluator for the CEL subset the matchConditions use (member access, has(),
# .exists(), .startsWith(), .contains(), &&, ||, !, !=, string literals), with CEL's
# strictness about absent fields: reading a missing field is an error, which the API server
# would count as a webhook failure. Short-circuiting is stricter than CEL's error absorption,
# so an expression that passes here also evaluates cleanly in the API server.

_TOKEN = re.compile(r"\s*(?:(&&|\|\||!=|[().,!])|'([^'\\]*)'|([A-Za-z_][A-Za-z0-9_]*))")


class CelError(Exception):
    pass


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(text.rstrip()):
        match = _TOKEN.match(text, pos)
        if not match:
            raise CelError(f"cannot parse CEL at: {text[pos : pos + 30]!r}")
        op, string, ident = match.groups()
        tokens.append(
            ("op", op) if op else ("str", string) if string is not None else ("id", ident)
        )
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokenize(text)
        self.pos = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (value is not None and token[1] != value):
            raise CelError(f"expected {value!r}, got {token!r}")
        self.pos += 1
        return token

    def parse(self):
        node = self.or_()
        if self.peek() is not None:
            raise CelError(f"trailing tokens from {self.peek()!r}")
        return node

    def or_(self):
        node = self.and_()
        while self.peek() == ("op", "||"):
            self.take()
            node = ("or", node, self.and_())
        return node

    def and_(self):
        node = self.comparison()
        while self.peek() == ("op", "&&"):
            self.take()
            node = ("and", node, self.comparison())
        return node

    def comparison(self):
        node = self.unary()
        if self.peek() == ("op", "!="):
            self.take()
            node = ("ne", node, self.unary())
        return node

    def unary(self):
        if self.peek() == ("op", "!"):
            self.take()
            return ("not", self.unary())
        return self.postfix(self.primary())

    def primary(self):
        kind, value = self.take()
        if (kind, value) == ("op", "("):
            node = self.or_()
            self.take(")")
            return node
        if kind == "str":
            return ("lit", value)
        if kind == "id" and value == "has":
            self.take("(")
            arg = self.postfix(self.primary())
            self.take(")")
            if arg[0] != "field":
                raise CelError("has() needs a field selection")
            return ("has", arg[1], arg[2])
        if kind == "id":
            return ("var", value)
        raise CelError(f"unexpected {value!r}")

    def postfix(self, node):
        while self.peek() == ("op", "."):
            self.take()
            _, name = self.take()
            if self.peek() != ("op", "("):
                node = ("field", node, name)
                continue
            self.take("(")
            if name == "exists":
                _, var = self.take()
                self.take(",")
                node = ("exists", node, var, self.or_())
            elif name in ("startsWith", "contains"):
                node = (name, node, self.or_())
            else:
                raise CelError(f"unsupported function {name}")
            self.take(")")
        return node


def cel_eval(expression: str, variables: dict[str, Any]) -> Any:
    def ev(node, env):
        op = node[0]
        if op == "lit":
            return node[1]
        if op == "var":
            return env[node[1]]
        if op == "field":
            target = ev(node[1], env)
            if not isinstance(target, dict) or node[2] not in target:
                raise CelError(f"no such key: {node[2]}")
            return target[node[2]]
        if op == "has":
            target = ev(node[1], env)
            if not isinstance(target, dict):
                raise CelError("has() on a non-map")
            return node[2] in target
        if op == "exists":
            items = ev(node[1], env)
            if not isinstance(items, list | dict):
                raise CelError("exists() on a non-list")
            return any(ev(node[3], {**env, node[2]: item}) for item in items)
        if op == "startsWith":
            return ev(node[1], env).startswith(ev(node[2], env))
        if op == "contains":
            return ev(node[2], env) in ev(node[1], env)
        if op == "ne":
            return ev(node[1], env) != ev(node[2], env)
        if op == "and":
            return _bool(ev(node[1], env)) and _bool(ev(node[2], env))
        if op == "or":
            return _bool(ev(node[1], env)) or _bool(ev(node[2], env))
        if op == "not":
            return not _bool(ev(node[1], env))
        raise CelError(op)

    return ev(_Parser(expression).parse(), variables)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise CelError(f"expected a bool, got {value!r}")
    return value


def _pod(containers, init_containers=None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers}
    if init_containers is not None:
        spec["initContainers"] = init_containers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


GPU = {"nvidia.com/gpu": "1"}
DEFAULT_TOLERATIONS = [
    {"key": k, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    for k in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
]


def _with(pod: dict, **spec: Any) -> dict:
    return {**pod, "spec": {**pod["spec"], **spec}}


CPU_POD = _with(_pod([{"name": "a"}]), tolerations=DEFAULT_TOLERATIONS)
CEL_CASES = [
    ("no resources", _pod([{"name": "a"}]), False),
    ("empty resources", _pod([{"name": "a", "resources": {}}]), False),
    ("cpu only", _pod([{"name": "a", "resources": {"limits": {"cpu": "1"}}}]), False),
    ("other vendor", _pod([{"name": "a", "resources": {"limits": {"amd.com/gpu": "1"}}}]), False),
    ("empty init list", _pod([{"name": "a"}], []), False),
    ("init without resources", _pod([{"name": "a"}], [{"name": "i"}]), False),
    ("default tolerations only", CPU_POD, False),
    ("other env", _pod([{"name": "a", "env": [{"name": "LANG", "value": "C"}]}]), False),
    ("empty volumes", _with(CPU_POD, volumes=[{"name": "v", "emptyDir": {}}]), False),
    (
        "other annotation",
        {**CPU_POD, "metadata": {"name": "p", "annotations": {"a/b": "c"}}},
        False,
    ),
    ("gpu limit", _pod([{"name": "a", "resources": {"limits": GPU}}]), True),
    ("gpu request", _pod([{"name": "a", "resources": {"requests": GPU}}]), True),
    (
        "mig request in second container",
        _pod(
            [
                {"name": "a"},
                {"name": "b", "resources": {"requests": {"nvidia.com/mig-1g.5gb": "1"}}},
            ]
        ),
        True,
    ),
    (
        "gpu in init container",
        _pod([{"name": "a"}], [{"name": "i", "resources": {"limits": GPU}}]),
        True,
    ),
    (
        "dra claim in a container",
        _pod([{"name": "a", "resources": {"claims": [{"name": "g"}]}}]),
        True,
    ),
    ("dra claim of the pod", _with(CPU_POD, resourceClaims=[{"name": "g"}]), True),
    (
        "toolkit variable",
        _pod([{"name": "a", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]),
        True,
    ),
    ("node name", _with(CPU_POD, nodeName="gpu-1"), True),
    (
        "gpu taint toleration",
        _with(CPU_POD, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]),
        True,
    ),
    ("pool taint toleration", _with(CPU_POD, tolerations=[{"key": "pool", "value": "a100"}]), True),
    ("wildcard toleration", _with(CPU_POD, tolerations=[{"operator": "Exists"}]), True),
    ("host path", _with(CPU_POD, volumes=[{"name": "v", "hostPath": {"path": "/dev"}}]), True),
    (
        "cdi annotation",
        {**CPU_POD, "metadata": {"name": "p", "annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=0"}}},
        True,
    ),
    (
        "nvidia cdi annotation",
        {**CPU_POD, "metadata": {"name": "p", "annotations": {"nvidia.cdi.k8s.io/c": "all"}}},
        True,
    ),
]


@pytest.mark.parametrize(("case", "pod", "expected"), CEL_CASES, ids=[c[0] for c in CEL_CASES])
def test_mutating_match_conditions_select_the_pods_that_might_reach_gpu_nodes(case, pod, expected):
    conditions = webhook(render("base"), "MutatingWebhookConfiguration")["matchConditions"]
    variables = {"object": pod, "oldObject": None, "request": {"operation": "CREATE"}}
    # matchConditions are ANDed; each must evaluate without error (has() guards).
    results = [cel_eval(c["expression"], variables) for c in conditions]
    assert all(isinstance(r, bool) for r in results)
    assert all(results) is expected, case


def test_match_conditions_send_every_pod_the_engine_finds_reachable():
    """Whatever webhook.core.scope finds able to reach a GPU node, the API server sends: else
    the validating webhook would require NVIDIA_VISIBLE_DEVICES=void that nobody injected."""
    import webhook as engine
    from webhook.core.pods import build_view
    from webhook.core.scope import reach

    conditions = webhook(render("base"), "MutatingWebhookConfiguration")["matchConditions"]
    strict = engine.load_policy(REPO / "policies" / "examples" / "strict.yaml")
    for case, pod, _ in CEL_CASES:
        view = build_view("Pod", "", pod, "ml", strict)
        if reach(view, strict).reachable:
            variables = {"object": pod, "oldObject": None, "request": {"operation": "CREATE"}}
            assert all(cel_eval(c["expression"], variables) for c in conditions), case


def test_cel_evaluator_rejects_unguarded_access():
    with pytest.raises(CelError):
        cel_eval("object.spec.initContainers.exists(c, true)", {"object": _pod([]), "true": True})


# ---------------------------------------------------------------------------- overlays


def test_audit_overlay_records_mutations_and_replaces_the_policy():
    audit, base = render("audit"), render("base")
    assert env_of(container(audit)).get("GPU_ADMISSION_MUTATION") == "record"
    assert env_of(container(base)).get("GPU_ADMISSION_MUTATION", "apply") != "record"
    configmap = one(audit, "ConfigMap", POLICY_CONFIGMAP)  # replaced, not added
    audit_policy = (MANIFESTS / "overlays" / "audit" / "policy.yaml").read_text()
    assert configmap["data"] == {"policy.yaml": audit_policy}
    assert configmap["data"] != one(base, "ConfigMap", POLICY_CONFIGMAP)["data"]
    # Everything else about the Deployment is untouched.
    assert pod_spec(audit)["volumes"] == pod_spec(base)["volumes"]


def test_cert_manager_overlay_issues_the_serving_certificate():
    objs = render("cert-manager")
    issuers = {o["metadata"]["name"]: o for o in objects_of(objs, "Issuer")}
    certificates = {o["metadata"]["name"]: o for o in objects_of(objs, "Certificate")}

    serving = certificates["gpu-admission"]["spec"]
    assert serving["secretName"] == TLS_SECRET
    service = one(objs, "Service", "gpu-admission")["metadata"]
    svc = f"{service['name']}.{service['namespace']}.svc"
    assert svc in serving["dnsNames"]
    assert f"{svc}.cluster.local" in serving["dnsNames"]

    # Issuer chain: self-signed -> CA certificate -> CA issuer -> serving certificate.
    ca_issuer = issuers[serving["issuerRef"]["name"]]
    assert serving["issuerRef"]["kind"] == "Issuer"
    [ca_cert] = [c for c in certificates.values() if c["spec"].get("isCA")]
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_cert["spec"]["secretName"]
    assert "selfSigned" in issuers[ca_cert["spec"]["issuerRef"]["name"]]["spec"]

    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        annotations = one(objs, kind, "gpu-admission")["metadata"]["annotations"]
        namespace, name = annotations["cert-manager.io/inject-ca-from"].split("/")
        assert namespace == NAMESPACE and name in certificates
        assert certificates[name]["spec"]["secretName"] == TLS_SECRET


def test_base_has_no_cert_manager_objects():
    assert not [o for o in render("base") if api_group(o) == CERT_MANAGER_GROUP]
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        meta = one(render("base"), kind)["metadata"]
        assert "cert-manager.io/inject-ca-from" not in meta.get("annotations", {})


def test_every_kind_the_default_policy_declares_is_in_the_validating_rules():
    import webhook

    policy = webhook.load_policy(REPO / "policies" / "default.yaml")
    declared = {(w.group, w.resource) for w in policy.workloads.values() if w.group != "extensions"}
    for name in INSTALLS:
        covered = validating_rule_resources(render(name))
        assert declared - covered == set(), f"{name}: not intercepted: {declared - covered}"
        assert ("", "pods/ephemeralcontainers") in covered


# ---------------------------------------------------------------------------- network policy


@all_renders
def test_a_network_policy_keeps_the_webhook_reachable_from_anywhere(name):
    objs = render(name)
    policy = one(objs, "NetworkPolicy", "gpu-admission")
    deployment = one(objs, "Deployment", "gpu-admission")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= labels.items(), "it must select the webhook's Pods"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert "from" not in rule, "a default-deny namespace must never cut the API server off"
    ports = {p["containerPort"] for p in container(objs)["ports"] if p["name"] == "https"}
    service = one(objs, "Service", "gpu-admission")["spec"]["ports"][0]
    assert ports == {service["targetPort"]} == {p["port"] for p in rule["ports"]}
    assert {p["protocol"] for p in rule["ports"]} == {"TCP"}


def test_the_inventory_overlay_reads_nodes_namespaces_and_dra_objects_and_nothing_else():
    objs = render("inventory")
    role = one(objs, "ClusterRole", "gpu-admission-inventory")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes", "namespaces"], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["deviceclasses", "resourceclaimtemplates"],
            "verbs": ["list", "watch"],
        },
    ]
    binding = one(objs, "ClusterRoleBinding", "gpu-admission-inventory")
    assert binding["roleRef"]["name"] == "gpu-admission-inventory"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-admission", "namespace": "gpu-admission"}
    ]
    spec = pod_spec(objs)
    assert spec["automountServiceAccountToken"] is True
    assert env_of(container(objs))["GPU_ADMISSION_INVENTORY"] == "true"
    # Everything else is the base install's.
    base = {(o["kind"], o["metadata"]["name"]) for o in render("base")}
    added = {(o["kind"], o["metadata"]["name"]) for o in objs} - base
    assert added == {
        ("ClusterRole", "gpu-admission-inventory"),
        ("ClusterRoleBinding", "gpu-admission-inventory"),
    }
