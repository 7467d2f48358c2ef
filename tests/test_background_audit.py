"""The background audit (manifests/background-audit and the chart's backgroundAudit values):
a CronJob that runs a valid `gpu-admission audit` invocation with the webhook's own policy,
under a ClusterRole that reads exactly the judged kinds and writes exactly the reports."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.kube import kustomize
from tests.support.paths import REPO
from tests.test_chart import render as render_chart
from webhook.cli.main import build_parser
from webhook.policy.load import default_policy_path, load_policy
from webhook.policy.workloads import read_rules

READ_RULES = read_rules(load_policy(default_policy_path()).workloads.values())
REPORT_RULE = {
    "apiGroups": ["wgpolicyk8s.io"],
    "resources": ["policyreports", "clusterpolicyreports"],
    "verbs": ["list", "create", "patch", "delete"],
}


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = [o for o in objs if o["kind"] == kind]
    return found


def check_audit_objects(objs: list[dict[str, Any]], report_rule: dict, policy_configmap: str):
    """What both installs must hold: the command parses, the policy is the webhook's, the
    role is exactly read + reports, and it is bound to the CronJob's service account."""
    cronjob = one(objs, "CronJob")
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    args = build_parser().parse_args(container["args"])
    assert (args.cluster, args.all_namespaces, args.output, args.apply) == (
        True,
        True,
        "policyreport",
        True,
    )
    [mount] = container["volumeMounts"]
    assert args.policy == f"{mount['mountPath']}/policy.yaml"
    assert pod["volumes"] == [{"name": mount["name"], "configMap": {"name": policy_configmap}}]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    role = one(objs, "ClusterRole")
    assert role["rules"] == [*READ_RULES, report_rule]
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = one(objs, "ServiceAccount")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": binding["subjects"][0]["namespace"],
        }
    ]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


def test_the_kustomize_background_audit_is_valid_and_least_privilege() -> None:
    objs = kustomize("manifests/background-audit")
    for obj in objs:
        kubernetes_validate.validate(obj, "1.32", strict=True)
    assert {o["kind"] for o in objs} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "CronJob",
    }
    check_audit_objects(objs, REPORT_RULE, "gpu-admission-policy")
    assert all(o["metadata"].get("namespace") in (None, "gpu-admission") for o in objs)
    # The same image as the server.
    server = one(kustomize("manifests/base"), "Deployment")
    image = server["spec"]["template"]["spec"]["containers"][0]["image"]
    pod = one(objs, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == image


@pytest.mark.parametrize("api", ["wgpolicyk8s", "openreports"])
def test_the_chart_background_audit_matches(api: str) -> None:
    objs = render_chart({"backgroundAudit": {"enabled": True, "reportAPI": api}})
    ours = [
        o
        for o in objs
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
        == "background-audit"
    ]
    rule = REPORT_RULE
    if api == "openreports":
        rule = {
            **REPORT_RULE,
            "apiGroups": ["openreports.io"],
            "resources": ["reports", "clusterreports"],
        }
    check_audit_objects(ours, rule, "gpu-admission-policy")
    assert not [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    args = one(ours, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert args[0]["args"][args[0]["args"].index("--report-api") + 1] == api


def test_the_chart_installs_the_report_crds_only_on_request() -> None:
    assert not [o for o in render_chart({}) if o["kind"] in ("CronJob", "CustomResourceDefinition")]
    for api, group in (("wgpolicyk8s", "wgpolicyk8s.io"), ("openreports", "openreports.io")):
        objs = render_chart({"backgroundAudit": {"installCRDs": True, "reportAPI": api}})
        crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
        vendored = [
            yaml.safe_load(path.read_text("utf-8"))
            for path in sorted((REPO / "manifests/crds").glob(f"{group}_*.yaml"))
        ]
        assert sorted(crds, key=lambda c: c["metadata"]["name"]) == sorted(
            vendored, key=lambda c: c["metadata"]["name"]
        )
        assert len(crds) == 2
