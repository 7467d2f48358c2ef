"""The chart's values for where the webhook runs, its replicas and disruption budget, the inline
policy refused at render time, and the check-policy hook (manifests/chart), rendered and linted
by Helm's own engine as tests/test_chart.py does."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from tests.support.paths import REPO
from tests.test_chart import CHART, K8S_VERSION, NAMESPACE, RELEASE, is_hook, one, render
from tests.test_manifests import selector_matches
from webhook.admission.objects import decide_object
from webhook.cli.main import main as cli_main
from webhook.policy.load import load_policy

SELECTOR = {"app.kubernetes.io/name": "gpu-admission", "app.kubernetes.io/component": "webhook"}
SYSTEM_NODES = {"node-role.kubernetes.io/system": "true"}
SYSTEM_TOLERATION = {"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoSchedule"}
NODE_AFFINITY = {
    "requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                ]
            }
        ]
    }
}
HOST_SPREAD = {
    "maxSkew": 1,
    "topologyKey": "kubernetes.io/hostname",
    "whenUnsatisfiable": "DoNotSchedule",
}
PLACEMENT = {
    "nodeSelector": SYSTEM_NODES,
    "tolerations": [SYSTEM_TOLERATION],
    "affinity": {"nodeAffinity": NODE_AFFINITY},
    "topologySpreadConstraints": [HOST_SPREAD],
    "podAnnotations": {"example.com/scrape": "true"},
    "podLabels": {"team": "platform"},
}
FIXED_REPLICAS = {
    "autoscaling": {"enabled": False},
    "replicaCount": 4,
    "podDisruptionBudget": {"minAvailable": "50%"},
}
NO_PDB_NO_CHECK = {
    "podDisruptionBudget": {"enabled": False},
    "policyValidation": {"enabled": False},
}
VALUE_SETS = [PLACEMENT, FIXED_REPLICAS, NO_PDB_NO_CHECK, {**PLACEMENT, **FIXED_REPLICAS}]
VALUE_SET_IDS = ["placement", "fixed-replicas", "no-pdb-no-check", "placement-fixed-replicas"]
CHECK_POLICY = f"{RELEASE}-check-policy"
HOOK_POLICY = f"{RELEASE}-policy-check"
RELEASE_POLICY = f"{RELEASE}-policy"


def pod_template(objs: list[dict[str, Any]]) -> dict[str, Any]:
    template: dict[str, Any] = one(objs, "Deployment")["spec"]["template"]
    return template


# ------------------------------------------------------------------ lint and schemas


@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_SET_IDS)
def test_the_new_values_lint_clean(values: dict[str, Any]) -> None:
    report = helm.lint(str(CHART), values, strict=True, kube_version="v1.30.0")
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] > 1] == []


@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_SET_IDS)
def test_the_new_values_render_valid_objects(values: dict[str, Any]) -> None:
    errors = []
    for obj in render(values):
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert errors == []


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"nodeSelector": {"zone": 1}}, "'/nodeSelector/zone'"),
        ({"tolerations": SYSTEM_TOLERATION}, "'/tolerations'"),
        ({"affinity": {"nodeAfinity": NODE_AFFINITY}}, "'/affinity'"),
        (
            {"topologySpreadConstraints": [{"topologyKey": "zone"}]},
            "'/topologySpreadConstraints/0'",
        ),
        ({"podLabels": {"team": True}}, "'/podLabels/team'"),
        ({"replicaCount": 1}, "'/replicaCount'"),
        (
            {"podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": 1}},
            "'/podDisruptionBudget': 'not' failed",
        ),
        ({"podDisruptionBudget": {"maxUnavailable": 0}}, "'/podDisruptionBudget/maxUnavailable'"),
        (
            {"podDisruptionBudget": {"maxUnavailable": "0%"}},
            "'/podDisruptionBudget/maxUnavailable'",
        ),
        ({"podDisruptionBudget": {"minAvailable": "100%"}}, "'/podDisruptionBudget/minAvailable'"),
        ({"policyValidation": {"enable": False}}, "'/policyValidation'"),
        ({"nodeSelectors": SYSTEM_NODES}, "'nodeSelectors' not allowed"),
    ],
    ids=[
        "label-not-a-string",
        "tolerations-not-a-list",
        "misspelt-affinity",
        "incomplete-constraint",
        "pod-label-not-a-string",
        "one-replica",
        "both-budgets",
        "no-disruption",
        "no-disruption-percent",
        "no-disruption-min",
        "misspelt-toggle",
        "misspelt-top-level",
    ],
)
def test_the_schema_refuses_misshapen_values(values: dict[str, Any], error: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=error):
        render(values)


# ------------------------------------------------------------------ where the webhook runs


def test_placement_values_reach_the_webhooks_pods() -> None:
    objs = render(PLACEMENT)
    template = pod_template(objs)
    spec = template["spec"]
    assert spec["nodeSelector"] == SYSTEM_NODES
    assert spec["tolerations"] == [SYSTEM_TOLERATION]
    assert template["metadata"]["annotations"] == {"example.com/scrape": "true"}
    assert template["metadata"]["labels"] == {**SELECTOR, "team": "platform"}
    # Added to the chart's affinity and spread, which still keep replicas apart.
    assert spec["affinity"]["nodeAffinity"] == NODE_AFFINITY
    assert (
        spec["affinity"]["podAntiAffinity"]
        == pod_template(render())["spec"]["affinity"]["podAntiAffinity"]
    )
    zone, host = spec["topologySpreadConstraints"]
    assert zone == pod_template(render())["spec"]["topologySpreadConstraints"][0]
    assert host == {**HOST_SPREAD, "labelSelector": {"matchLabels": SELECTOR}}
    # Whatever selects the webhook's Pods still does.
    labels = template["metadata"]["labels"]
    assert one(objs, "Deployment")["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert one(objs, "Service")["spec"]["selector"] == SELECTOR
    assert selector_matches(one(objs, "PodDisruptionBudget")["spec"]["selector"], labels)
    assert selector_matches(one(objs, "NetworkPolicy")["spec"]["podSelector"], labels)


def test_the_defaults_render_no_placement() -> None:
    template = pod_template(render())
    assert "annotations" not in template["metadata"]
    assert template["metadata"]["labels"] == SELECTOR
    assert not {"nodeSelector", "tolerations"} & set(template["spec"])
    assert set(template["spec"]["affinity"]) == {"podAntiAffinity"}
    for job in (o for o in render() if o["kind"] == "Job"):
        assert not {"nodeSelector", "tolerations"} & set(job["spec"]["template"]["spec"])


def test_the_hook_jobs_run_where_the_webhook_may() -> None:
    """An install or upgrade waits on its hook Jobs: on a cluster whose only untainted nodes
    run GPUs, they need the webhook's node selector and tolerations too (not its spread)."""
    jobs = [o for o in render(PLACEMENT) if o["kind"] == "Job"]
    assert len(jobs) == 4
    for job in jobs:
        spec = job["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == SYSTEM_NODES
        assert spec["tolerations"] == [SYSTEM_TOLERATION]
        assert "affinity" not in spec and "topologySpreadConstraints" not in spec


def test_the_background_audit_runs_where_the_webhook_may() -> None:
    values = {**PLACEMENT, "backgroundAudit": {"enabled": True}}
    [cronjob] = [o for o in render(values) if o["kind"] == "CronJob"]
    spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == SYSTEM_NODES
    assert spec["tolerations"] == [SYSTEM_TOLERATION]
    [cronjob] = [
        o for o in render({"backgroundAudit": {"enabled": True}}) if o["kind"] == "CronJob"
    ]
    assert not {"nodeSelector", "tolerations"} & set(
        cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    )


def test_an_affinity_key_of_the_values_replaces_the_charts() -> None:
    required = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": SELECTOR}}
        ]
    }
    affinity = pod_template(render({"affinity": {"podAntiAffinity": required}}))["spec"]["affinity"]
    assert affinity == {"podAntiAffinity": required}


def test_a_zone_constraint_of_the_values_replaces_the_charts() -> None:
    zone = {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "gpu-admission"}},
    }
    spec = pod_template(render({"topologySpreadConstraints": [zone, HOST_SPREAD]}))["spec"]
    # Two constraints on one key and one whenUnsatisfiable are invalid; the value's selector kept.
    assert spec["topologySpreadConstraints"] == [
        zone,
        {**HOST_SPREAD, "labelSelector": {"matchLabels": SELECTOR}},
    ]


@pytest.mark.parametrize("key", sorted(SELECTOR))
def test_pod_labels_cannot_change_the_selector_labels(key: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=f"podLabels: {key} selects the webhook's Pods"):
        render({"podLabels": {key: "other"}})
    # Its own value is harmless.
    labels = pod_template(render({"podLabels": {key: SELECTOR[key]}}))["metadata"]["labels"]
    assert labels == SELECTOR


# ------------------------------------------------------------------ replicas and disruptions


def test_replica_count_is_used_when_autoscaling_is_off() -> None:
    objs = render({"autoscaling": {"enabled": False}, "replicaCount": 5})
    assert one(objs, "Deployment")["spec"]["replicas"] == 5
    assert not [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    # With the autoscaler, it alone owns the count: replicaCount is not rendered.
    objs = render({"replicaCount": 5})
    assert "replicas" not in one(objs, "Deployment")["spec"]
    assert one(objs, "HorizontalPodAutoscaler")["spec"]["minReplicas"] == 3


@pytest.mark.parametrize(
    ("budget", "spec"),
    [
        ({}, {"maxUnavailable": 1}),
        ({"maxUnavailable": 2}, {"maxUnavailable": 2}),
        ({"maxUnavailable": "25%"}, {"maxUnavailable": "25%"}),
        ({"minAvailable": 2}, {"minAvailable": 2}),
        ({"minAvailable": "50%"}, {"minAvailable": "50%"}),
    ],
    ids=["default", "max", "max-percent", "min", "min-percent"],
)
def test_the_disruption_budget_takes_one_of_its_bounds(
    budget: dict[str, Any], spec: dict[str, Any]
) -> None:
    pdb = one(render({"podDisruptionBudget": budget}), "PodDisruptionBudget")
    bounds = {k: v for k, v in pdb["spec"].items() if k in ("minAvailable", "maxUnavailable")}
    assert bounds == spec
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_a_disruption_budget_that_blocks_every_drain_is_refused() -> None:
    with pytest.raises(helm.HelmRenderError, match="minAvailable 3 leaves no replica of 3"):
        render({"podDisruptionBudget": {"minAvailable": 3}})
    fixed = {"autoscaling": {"enabled": False}, "replicaCount": 2}
    with pytest.raises(helm.HelmRenderError, match="minAvailable 2 leaves no replica of 2"):
        render({**fixed, "podDisruptionBudget": {"minAvailable": 2}})
    pdb = one(render({**fixed, "podDisruptionBudget": {"minAvailable": 1}}), "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1


def test_the_disruption_budget_can_be_left_out() -> None:
    objs = render({"podDisruptionBudget": {"enabled": False}})
    assert not [o for o in objs if o["kind"] == "PodDisruptionBudget"]


# ------------------------------------------------------------------ the inline policy


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("apiVersion: gpu-admission.io/v1alpha1\nkind: [GPUAdmissionPolicy\n", "is not valid YAML"),
        ("spec:\n  pools:\n - name: a\n", "is not valid YAML"),
        ("- apiVersion: gpu-admission.io/v1alpha1\n", "is YAML but not a mapping"),
        ("GPUAdmissionPolicy\n", "is YAML but not a mapping"),
        ("# the policy goes here\n", r"is not a GPUAdmissionPolicy \(kind: none\)"),
        (
            "apiVersion: v1\nkind: ConfigMap\ndata:\n  policy.yaml: ''\n",
            r"is not a GPUAdmissionPolicy \(kind: ConfigMap\)",
        ),
    ],
    ids=["unclosed-list", "bad-indent", "a-list", "a-scalar", "only-a-comment", "a-config-map"],
)
def test_an_inline_policy_that_is_not_a_policy_mapping_fails_the_render(
    text: str, message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=f"policy.inline {message}") as raised:
        render({"policy": {"inline": text}})
    assert "--set-file policy.inline=policy.yaml" in str(raised.value)
    assert "gpu-admission policy validate" in str(raised.value)


def test_an_inline_policy_beside_an_existing_config_map_fails_the_render() -> None:
    """The webhook would serve the ConfigMap's policy, and the inline text would only have
    added its kinds' webhook rules: one of the two, and the values that send an existing
    policy's kinds are named."""
    inline = (
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\nmetadata: {name: x}\n"
    )
    with pytest.raises(helm.HelmRenderError, match="are both set") as raised:
        render({"policy": {"inline": inline, "existingConfigMap": "mine"}})
    assert "webhooks.customResources.extraRules" in str(raised.value)
    assert "webhooks.mutating.extraWorkloadRules" in str(raised.value)


# ------------------------------------------------------------------ the check-policy hook


def hook_annotations(obj: dict[str, Any]) -> dict[str, str]:
    annotations = obj["metadata"]["annotations"]
    return {k: v for k, v in annotations.items() if k.startswith("helm.sh/hook")}


def test_the_check_policy_job_and_its_config_map_run_before_anything_changes() -> None:
    objs = render()
    config_map = one(objs, "ConfigMap", HOOK_POLICY)
    job = one(objs, "Job", CHECK_POLICY)
    service_account = one(objs, "ServiceAccount", f"{RELEASE}-hooks")
    delete = "before-hook-creation,hook-succeeded"
    assert hook_annotations(config_map) == {
        "helm.sh/hook": "pre-install,pre-upgrade",
        "helm.sh/hook-weight": "-10",
        "helm.sh/hook-delete-policy": delete,
    }
    assert hook_annotations(job) == {
        "helm.sh/hook": "pre-install,pre-upgrade",
        "helm.sh/hook-weight": "-5",
        "helm.sh/hook-delete-policy": delete,
    }

    def weight(obj: dict[str, Any]) -> int:
        return int(obj["metadata"]["annotations"]["helm.sh/hook-weight"])

    # Its copy of the policy and the account it runs as exist before it; it runs before the
    # bootstrap hook, the first to change anything.
    assert weight(config_map) < weight(job) and weight(service_account) < weight(job)
    assert weight(job) < weight(one(objs, "Job", f"{RELEASE}-bootstrap"))
    # The release's own ConfigMap is no hook: it does not exist yet at pre-install.
    assert not is_hook(one(objs, "ConfigMap", RELEASE_POLICY))


def test_the_check_policy_job_needs_no_rights() -> None:
    spec = one(render(), "Job", CHECK_POLICY)["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    [container] = spec["containers"]
    assert container["args"][:2] == ["policy", "validate"]
    assert "--cluster" not in container["args"] and "--manifests" not in container["args"]
    # The webhook's restrictive security settings, as every Pod of the chart.
    webhook = pod_template(render())["spec"]
    assert spec["securityContext"] == webhook["securityContext"]
    assert container["securityContext"] == webhook["containers"][0]["securityContext"]


def validated_text(objs: list[dict[str, Any]]) -> str:
    """The text the check-policy Job's command reads: the file its args name, in the volume
    mounted there, from the ConfigMap that volume holds."""
    spec = one(objs, "Job", CHECK_POLICY)["spec"]["template"]["spec"]
    [container] = spec["containers"]
    path = Path(container["args"][2])
    [mount] = [m for m in container["volumeMounts"] if path.parent == Path(m["mountPath"])]
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    config_map = one(objs, "ConfigMap", volume["configMap"]["name"])
    text: str = config_map["data"][path.name]
    return text


OWN_POLICY = (REPO / "policies" / "examples" / "strict.yaml").read_text()


@pytest.mark.parametrize(
    "values",
    [{}, {"auditOnly": True}, {"policy": {"inline": OWN_POLICY}}],
    ids=["packaged", "audit-only", "inline"],
)
def test_the_check_policy_job_validates_the_text_the_release_mounts(
    values: dict[str, Any], tmp_path: Path
) -> None:
    objs = render(values)
    text = validated_text(objs)
    assert text == one(objs, "ConfigMap", RELEASE_POLICY)["data"]["policy.yaml"]
    # The Job's command, run on that text, passes.
    (tmp_path / "policy.yaml").write_text(text)
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli_main(["policy", "validate", str(tmp_path / "policy.yaml")]) == 0


def test_the_check_policy_job_refuses_a_policy_the_server_would(tmp_path: Path) -> None:
    """Valid YAML of the right kind renders; the hook's `policy validate` is what stops it."""
    broken = yaml.safe_load(OWN_POLICY)
    broken["spec"]["hostDevices"]["allowedPaths"] = ["/mnt"]  # holds node-control paths
    text = yaml.safe_dump(broken)
    (tmp_path / "policy.yaml").write_text(validated_text(render({"policy": {"inline": text}})))
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        assert cli_main(["policy", "validate", str(tmp_path / "policy.yaml")]) != 0
    assert "/mnt" in output.getvalue()


def test_the_check_policy_hook_can_be_turned_off() -> None:
    objs = render({"policyValidation": {"enabled": False}})
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert ("Job", CHECK_POLICY) not in names and ("ConfigMap", HOOK_POLICY) not in names
    assert ("ConfigMap", RELEASE_POLICY) in names and ("Job", f"{RELEASE}-bootstrap") in names


@pytest.mark.parametrize(
    "policy_file", ["webhook/policy/data/default.yaml", "policies/examples/strict.yaml"]
)
@pytest.mark.parametrize("namespace", [NAMESPACE, "gpu-system"])
def test_the_check_policy_job_is_admissible_on_upgrade(policy_file: str, namespace: str) -> None:
    """On an upgrade the webhook is live: the Job runs in the release's namespace, which no
    entry of either configuration sends; and were it sent, the Job and its Pod pass."""
    objs = render(namespace=namespace)
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        for entry in one(objs, kind)["webhooks"]:
            namespace_labels = {"kubernetes.io/metadata.name": namespace}
            assert not selector_matches(entry["namespaceSelector"], namespace_labels), entry["name"]
    job = one(objs, "Job", CHECK_POLICY)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**job["spec"]["template"]["metadata"], "namespace": namespace},
        "spec": job["spec"]["template"]["spec"],
    }
    policy = load_policy(REPO / policy_file)
    for obj in (job, pod):
        outcome = decide_object(obj, policy, namespace, mutate=True)
        assert outcome.allowed and list(outcome.findings) == [], (obj["kind"], outcome.findings)
