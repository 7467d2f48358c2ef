"""The Helm chart (manifests/chart), rendered and linted by Helm's own engine (Helm's Go library,
through the helm-python-sdk wheel): it lints clean, its default render is the kustomize install
after a stated normalisation, every object is valid, and each value does what it says."""

from __future__ import annotations

import copy
import functools
import tomllib
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from tests.support.kube import kustomize
from tests.support.paths import REPO

CHART = REPO / "manifests" / "chart"
RELEASE = "gpu-admission"
NAMESPACE = "gpu-admission"
K8S_VERSION = "1.32"
# What Helm and the chart add to every object's labels, and kustomize does not.
HELM_LABELS = (
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)
CUSTOM_GROUPS = ("cert-manager.io", "monitoring.coreos.com")

helm.disable_logging()


@functools.cache
def _render(values_yaml: str, release: str, namespace: str) -> tuple[dict[str, Any], ...]:
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values=yaml.safe_load(values_yaml), name=release, namespace=namespace)
    return tuple(
        doc
        for path, text in sorted(out.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    )


def render(
    values: dict[str, Any] | None = None, release: str = RELEASE, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    return copy.deepcopy(list(_render(yaml.safe_dump(values or {}), release, namespace)))


def is_hook(obj: dict[str, Any]) -> bool:
    return "helm.sh/hook" in (obj["metadata"].get("annotations") or {})


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in found])
    return found[0]


def keyed(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


# ------------------------------------------------------------------ lint


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"certificates": {"source": "certManager"}, "serviceMonitor": {"enabled": True}},
        {"certificates": {"source": "existingSecret", "secretName": "mine"}},
        {"auditOnly": True, "networkPolicy": {"enabled": False}},
        {"policy": {"existingConfigMap": "my-policy"}},
        {"backgroundAudit": {"enabled": True, "installCRDs": True, "reportAPI": "openreports"}},
    ],
    ids=[
        "defaults",
        "cert-manager",
        "existing-secret",
        "audit-only",
        "existing-policy",
        "background-audit",
    ],
)
def test_the_chart_lints_clean_with_helms_own_linter(values: dict[str, Any]) -> None:
    report = helm.lint(str(CHART), values, strict=True, kube_version="v1.30.0")
    assert report["errors"] == [], report
    # Only Helm's "icon is recommended" note is left.
    assert [m for m in report["messages"] if m["severity"] > 1] == []


def test_values_outside_the_schema_are_refused() -> None:
    with pytest.raises(helm.HelmValuesError, match="certificates/source"):
        render({"certificates": {"source": "letsencrypt"}})
    with pytest.raises(helm.HelmValuesError):
        render({"replicas": 3})  # a typo of a value is an error, not silently nothing


def test_chart_image_and_wheel_share_one_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["version"] == chart["appVersion"] == version
    deployment = one(render(), "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/example/gpu-admission:{version}"


# ------------------------------------------------------------------ the same as kustomize


def normalised_chart(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The chart's objects as kustomize writes them. Stated normalisation:
    - hooks (the bootstrap, activation and deactivation Jobs and their RBAC) are the chart's
      way to order an install; kustomize's is the install guide's two steps: left out;
    - Helm's labels (instance, version, managed-by, chart) are removed;
    - the validating webhook's failure policy is the one the activation hook sets (the chart
      installs it as Ignore until the server is Ready);
    - the policy ConfigMap's text is compared as YAML (the generated copies' header comments
      name their own paths)."""
    result = {}
    for obj in objs:
        if is_hook(obj):
            continue
        labels = obj["metadata"].get("labels", {})
        for label in HELM_LABELS:
            labels.pop(label, None)
        if obj["kind"] == "ValidatingWebhookConfiguration":
            obj["webhooks"][0]["failurePolicy"] = "Fail"
        if obj["kind"] == "ConfigMap":
            obj["data"] = {k: yaml.safe_load(v) for k, v in obj["data"].items()}
        result[(obj["kind"], obj["metadata"]["name"])] = obj
    return result


def normalised_kustomize(server: str = "manifests") -> dict[tuple[str, str], dict[str, Any]]:
    """The kustomize install (both steps; ``server``: the first step's directory). The
    Namespace is left out: Helm keeps its release in the namespace, so the install guide's Helm
    commands create it (with its labels) before the chart."""
    result = {}
    for obj in kustomize(server) + kustomize("manifests/webhooks"):
        if obj["kind"] == "Namespace":
            continue
        if obj["kind"] == "ConfigMap":
            obj["data"] = {k: yaml.safe_load(v) for k, v in obj["data"].items()}
        result[(obj["kind"], obj["metadata"]["name"])] = obj
    return result


def test_the_default_render_is_the_kustomize_install() -> None:
    chart, kustomized = normalised_chart(render()), normalised_kustomize()
    assert sorted(chart) == sorted(kustomized)
    for key, obj in kustomized.items():
        assert chart[key] == obj, key


def test_the_inventory_value_renders_the_inventory_overlay() -> None:
    chart = normalised_chart(render({"inventory": {"enabled": True}}))
    kustomized = normalised_kustomize("manifests/overlays/inventory")
    assert sorted(chart) == sorted(kustomized)
    for key, obj in kustomized.items():
        if obj["kind"] == "Deployment":  # the same variables, in another order
            for ctr in (obj, chart[key]):
                env = ctr["spec"]["template"]["spec"]["containers"][0]["env"]
                env.sort(key=lambda variable: variable["name"])
        assert chart[key] == obj, key


def test_another_release_name_prefixes_every_name_and_reference() -> None:
    objs = render(release="webhooks", namespace="gpu-system")
    assert {o["metadata"]["name"] for o in objs if not is_hook(o)} >= {
        "webhooks-gpu-admission",
        "webhooks-gpu-admission-policy",
    }
    hook = one(objs, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert hook["clientConfig"]["service"] == {
        "namespace": "gpu-system",
        "name": "webhooks-gpu-admission",
        "path": "/validate",
        "port": 443,
    }
    assert "gpu-system" in hook["namespaceSelector"]["matchExpressions"][0]["values"]
    volumes = one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "policy", "configMap": {"name": "webhooks-gpu-admission-policy"}} in volumes


# ------------------------------------------------------------------ every object valid


CRD_SCHEMAS = REPO / "tests" / "schemas"


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"certificates": {"source": "certManager"}, "serviceMonitor": {"enabled": True}},
        {"backgroundAudit": {"enabled": True, "installCRDs": True}},
        {"inventory": {"enabled": True}},
    ],
    ids=["defaults", "cert-manager-and-servicemonitor", "background-audit", "inventory"],
)
def test_every_object_is_valid_against_its_schema(values: dict[str, Any]) -> None:
    import json

    import jsonschema

    errors = []
    for obj in render(values):
        group = obj["apiVersion"].split("/")[0]
        if group in CUSTOM_GROUPS:
            schema_file = CRD_SCHEMAS / f"{group}_{obj['kind']}_v1.json"
            schema = json.loads(schema_file.read_text())
            where = f"{obj['kind']}/{obj['metadata']['name']}"
            for error in jsonschema.Draft7Validator(schema).iter_errors(obj):
                errors.append(f"{where}: {error.message}")
            errors += [f"{where}: {path}: not in the schema" for path in undeclared(obj, schema)]
            continue
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert errors == []


def undeclared(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields of ``value`` its CRD schema does not declare (a misspelt field would otherwise be
    pruned by the API server without a word). ``metadata`` is the API server's own."""
    if isinstance(value, dict) and "properties" in schema:
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return []
        found = []
        for key, item in value.items():
            if path == "" and key == "metadata":
                continue
            if key not in schema["properties"]:
                found.append(f"{path}.{key}".lstrip("."))
            else:
                found += undeclared(item, schema["properties"][key], f"{path}.{key}")
        return found
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [
            p
            for i, item in enumerate(value)
            for p in undeclared(item, schema["items"], f"{path}[{i}]")
        ]
    return []


def test_a_misspelt_custom_resource_field_is_caught() -> None:
    import json

    schema = json.loads((CRD_SCHEMAS / "cert-manager.io_Certificate_v1.json").read_text())
    certificate = one(render({"certificates": {"source": "certManager"}}), "Certificate", RELEASE)
    assert undeclared(certificate, schema) == []
    certificate["spec"]["dnsName"] = ["x"]
    certificate["spec"]["privateKey"]["algoritm"] = "ECDSA"
    assert sorted(undeclared(certificate, schema)) == ["spec.dnsName", "spec.privateKey.algoritm"]


# ------------------------------------------------------------------ what each value does


def test_hooks_order_the_install_and_run_the_chart_image() -> None:
    objs = render()
    jobs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Job"}
    assert set(jobs) == {
        "gpu-admission-check-policy",
        "gpu-admission-bootstrap",
        "gpu-admission-activate",
        "gpu-admission-deactivate",
    }
    events = {name: job["metadata"]["annotations"]["helm.sh/hook"] for name, job in jobs.items()}
    assert events == {
        "gpu-admission-check-policy": "pre-install,pre-upgrade",
        "gpu-admission-bootstrap": "pre-install,pre-upgrade",
        "gpu-admission-activate": "post-install,post-upgrade,post-rollback",
        "gpu-admission-deactivate": "pre-delete,pre-rollback",
    }
    image = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    for job in jobs.values():
        [container] = job["spec"]["template"]["spec"]["containers"]
        assert container["image"] == image
        assert container["args"][0] == (
            "policy" if "check-policy" in container["name"] else "webhooks"
        )
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        # A pre-install hook runs before the quota that admits system-cluster-critical Pods.
        assert "priorityClassName" not in job["spec"]["template"]["spec"]
    activate = jobs["gpu-admission-activate"]["spec"]["template"]["spec"]["containers"][0]
    assert activate["args"][activate["args"].index("--failure-policy") + 1] == "Fail"
    # Installed failing open: the activation hook tightens it once the server is Ready.
    assert one(objs, "ValidatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Ignore"
    # The hooks' rights: only the TLS Secrets and the two webhook configurations.
    cluster_role = one([o for o in objs if is_hook(o)], "ClusterRole")
    assert cluster_role["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
            "resourceNames": ["gpu-admission"],
            "verbs": ["get", "patch"],
        }
    ]


def test_cert_manager_issues_the_secret_and_injects_the_ca() -> None:
    objs = render({"certificates": {"source": "certManager"}})
    assert "gpu-admission-bootstrap" not in {o["metadata"]["name"] for o in objs}
    certificate = one(objs, "Certificate", "gpu-admission")
    assert certificate["spec"]["secretName"] == "gpu-admission-tls"
    assert "gpu-admission.gpu-admission.svc" in certificate["spec"]["dnsNames"]
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        annotations = one(objs, kind)["metadata"]["annotations"]
        assert annotations == {"cert-manager.io/inject-ca-from": "gpu-admission/gpu-admission"}


def test_an_existing_secret_is_used_as_it_is() -> None:
    objs = render({"certificates": {"source": "existingSecret", "secretName": "mine"}})
    assert not [o for o in objs if o["kind"] in ("Certificate", "Issuer")]
    assert "gpu-admission-bootstrap" not in {o["metadata"]["name"] for o in objs}
    volumes = one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert any(v.get("secret", {}).get("secretName") == "mine" for v in volumes)
    activate = one(objs, "Job", "gpu-admission-activate")["spec"]["template"]["spec"]
    args = activate["containers"][0]["args"]
    assert args[args.index("--secret") + 1] == "mine"


def test_audit_only_records_mutations_and_fails_open() -> None:
    objs = render({"auditOnly": True})
    env = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "GPU_ADMISSION_MUTATION", "value": "record"} in env
    policy = yaml.safe_load(one(objs, "ConfigMap", "gpu-admission-policy")["data"]["policy.yaml"])
    audit = yaml.safe_load((REPO / "policies" / "examples" / "audit-rollout.yaml").read_text())
    assert policy == audit
    args = one(objs, "Job", "gpu-admission-activate")["spec"]["template"]["spec"]["containers"][0]
    assert args["args"][args["args"].index("--failure-policy") + 1] == "Ignore"


def test_the_policy_can_be_inline_or_an_existing_config_map() -> None:
    inline = "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
    objs = render({"policy": {"inline": inline}})
    # The release's ConfigMap, and the pre-install check's copy of it.
    for name in ("gpu-admission-policy", "gpu-admission-policy-check"):
        assert one(objs, "ConfigMap", name)["data"]["policy.yaml"].strip() == inline.strip()
    objs = render({"policy": {"existingConfigMap": "my-policy"}})
    assert not [o for o in objs if o["kind"] == "ConfigMap"]
    volumes = one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "policy", "configMap": {"name": "my-policy"}} in volumes
    check = one(objs, "Job", "gpu-admission-check-policy")["spec"]["template"]["spec"]
    assert {"name": "policy", "configMap": {"name": "my-policy"}} in check["volumes"]


def test_scope_values_reach_the_webhooks() -> None:
    objs = render(
        {
            "webhooks": {
                "validating": {"timeoutSeconds": 10},
                "certificateProviderNamespace": "",
                "extraExcludedNamespaces": ["monitoring"],
            }
        }
    )
    # Every validating entry: Pods, custom kinds, DRA's claims.
    hooks = one(objs, "ValidatingWebhookConfiguration")["webhooks"]
    assert len(hooks) == 3
    for hook in hooks:
        assert hook["timeoutSeconds"] == 10
        excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
        assert excluded == ["kube-system", "gpu-admission", "monitoring"]


def test_the_service_monitor_scrapes_over_verified_tls() -> None:
    monitor = one(render({"serviceMonitor": {"enabled": True}}), "ServiceMonitor")
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["path"] == "/metrics"
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": "gpu-admission-tls", "key": "ca.crt"}}
    assert endpoint["tlsConfig"]["serverName"] == "gpu-admission.gpu-admission.svc"


def test_nothing_of_the_live_cluster_is_rendered_into_the_release() -> None:
    # A rollback re-applies a stored revision without rendering it again: a caBundle or a
    # failure policy looked up from the cluster at upgrade time would come back stale.
    for template in (CHART / "templates").iterdir():
        assert "lookup" not in template.read_text(), template.name
    hook = one(render(), "ValidatingWebhookConfiguration")["webhooks"][0]
    assert hook["failurePolicy"] == "Ignore" and "caBundle" not in hook["clientConfig"]


def test_the_certificate_providers_namespace_is_excluded_only_with_cert_manager() -> None:
    def excluded(values: dict[str, Any]) -> list[str]:
        hooks = one(render(values), "ValidatingWebhookConfiguration")["webhooks"]
        assert len({str(hook["namespaceSelector"]) for hook in hooks}) == 1  # every entry's
        return hooks[0]["namespaceSelector"]["matchExpressions"][0]["values"]

    assert excluded({}) == ["kube-system", "gpu-admission"]
    assert excluded({"certificates": {"source": "certManager"}})[-1] == "cert-manager"
    assert excluded({"webhooks": {"extraExcludedNamespaces": None}}) == [
        "kube-system",
        "gpu-admission",
    ]


def test_audit_only_with_a_policy_of_ones_own_is_refused() -> None:
    with pytest.raises(helm.HelmRenderError, match="auditOnly"):
        render({"auditOnly": True, "policy": {"inline": "kind: GPUAdmissionPolicy"}})


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"auditOnly": True},
        {"webhooks": {"customResources": {"failurePolicy": "Fail"}}},
        {"certificates": {"source": "certManager"}},
    ],
    ids=["defaults", "audit-only", "custom-resources-fail", "cert-manager"],
)
def test_every_claim_kind_the_engine_judges_is_sent_and_claims_fail_open(
    values: dict[str, Any],
) -> None:
    """Derived from the kinds the engine judges: each is sent on CREATE, ResourceClaims to the
    claims entry, which fails open whatever the values (the activation hook leaves it so:
    tests/test_activation.py), the others to the first entry."""
    from webhook.cli.webhook_coverage import rule_covers
    from webhook.policy.workloads import (
        CLAIM_KINDS,
        CLAIMS_RESOURCE,
        CLAIMS_WEBHOOK,
        DRA_GROUP,
        NOT_MADE_BY_THE_CONTROL_PLANE,
    )

    hooks = one(render(values), "ValidatingWebhookConfiguration")["webhooks"]
    for kind, resource, _ in CLAIM_KINDS:
        sending = [
            hook["name"]
            for hook in hooks
            if any(rule_covers(r, DRA_GROUP, resource, "CREATE") for r in hook["rules"])
        ]
        expected = CLAIMS_WEBHOOK if resource == CLAIMS_RESOURCE else "validate.gpu-admission.io"
        assert sending == [expected], kind
    [claims] = [hook for hook in hooks if hook["name"] == CLAIMS_WEBHOOK]
    assert claims["failurePolicy"] == "Ignore"
    assert claims["matchConditions"] == [
        {"name": "not-made-by-the-control-plane", "expression": NOT_MADE_BY_THE_CONTROL_PLANE}
    ]


def test_the_custom_kinds_entry_covers_exactly_what_an_inline_policy_judges(tmp_path) -> None:
    """Both directions: every custom kind the inline policy judges is sent, and nothing else
    (the packaged rules come from the catalogue, the rest from the policy's workloads)."""
    from webhook.policy.load import load_policy
    from webhook.policy.workloads import WORKLOADS_WEBHOOK, custom_resource_rules

    inline = (
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: own}\nspec:\n  workloads:\n"
        "    - {group: example.com, kind: TrainingRun, templates: [spec.template]}\n"
        "    - {group: example.com, kind: Sweep, resource: sweepz, containers: [spec.c]}\n"
    )
    (tmp_path / "policy.yaml").write_text(inline)

    def covered(rules: list[dict]) -> set[tuple[str, str]]:
        return {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}

    expected = covered(
        custom_resource_rules(load_policy(tmp_path / "policy.yaml").workloads.values())
    )
    config = one(render({"policy": {"inline": inline}}), "ValidatingWebhookConfiguration")
    [hook] = [h for h in config["webhooks"] if h["name"] == WORKLOADS_WEBHOOK]
    assert covered(hook["rules"]) == expected
    assert ("example.com", "sweepz") in expected
    extra = {
        "apiGroups": ["example.org"],
        "apiVersions": ["*"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["runs"],
        "scope": "*",
    }
    values = {
        "policy": {"existingConfigMap": "mine"},
        "webhooks": {"customResources": {"extraRules": [extra]}},
    }
    config = one(render(values), "ValidatingWebhookConfiguration")
    [hook] = [h for h in config["webhooks"] if h["name"] == WORKLOADS_WEBHOOK]
    assert hook["rules"][-1] == extra
    auditor = one(render(values), "ClusterRole", "gpu-admission-auditor")
    assert {"apiGroups": ["example.org"], "resources": ["runs"], "verbs": ["get", "list"]} in (
        auditor["rules"]
    )


def test_the_workloads_mutating_entry_sends_an_inline_policys_template_kinds() -> None:
    """The GPU defaults go in pod templates: an inline policy's own kinds with templates are
    sent to the mutating webhook on CREATE (a kind with only containers is not), and so are
    the extra rules given for a policy in an existing ConfigMap."""
    from webhook.policy.workloads import WORKLOADS_MUTATING_WEBHOOK

    inline = (
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: own}\nspec:\n  workloads:\n"
        "    - {group: example.com, kind: TrainingRun, templates: [spec.template]}\n"
        "    - {group: example.com, kind: Sweep, resource: sweepz, containers: [spec.c]}\n"
    )

    def hook(values: dict[str, Any]) -> dict[str, Any]:
        config = one(render(values), "MutatingWebhookConfiguration")
        [found] = [h for h in config["webhooks"] if h["name"] == WORKLOADS_MUTATING_WEBHOOK]
        return found

    packaged = hook({})["rules"]
    own = hook({"policy": {"inline": inline}})["rules"]
    assert own[: len(packaged)] == packaged
    assert own[len(packaged) :] == [
        {
            "apiGroups": ["example.com"],
            "apiVersions": ["*"],
            "operations": ["CREATE"],
            "resources": ["trainingruns"],
            "scope": "*",
        }
    ]
    extra = {
        "apiGroups": ["example.org"],
        "apiVersions": ["*"],
        "operations": ["CREATE"],
        "resources": ["runs"],
        "scope": "*",
    }
    values = {
        "policy": {"existingConfigMap": "mine"},
        "webhooks": {"mutating": {"extraWorkloadRules": [extra]}},
    }
    assert hook(values)["rules"] == [*packaged, extra]
