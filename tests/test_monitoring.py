"""The alerts and the dashboard (manifests/monitoring): every expression parses with a real
PromQL parser, every metric it reads is exposed by gpu-admission itself (checked against the
server's own exposition), the DCGM exporter or kube-state-metrics (names vendored below, with
their source), and the chart's copies are the same."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import promql_parser
import pytest
import yaml

from tests.support.kube import kustomize
from tests.support.paths import REPO
from webhook.server.metrics import Metrics

MONITORING = REPO / "manifests" / "monitoring"
RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"

# NVIDIA dcgm-exporter, etc/default-counters.csv at d5e5f510a1b6b393f39a43293ccd9dc985defc79
# (github.com/NVIDIA/dcgm-exporter): the counters it exports by default.
DCGM_METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": "gauge, GPU utilization (in %)",
    "DCGM_FI_DEV_XID_ERRORS": "gauge, value of the last XID error encountered",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge, ratio of time the graphics engine is active",
}
# kube-state-metrics, docs/metrics/workload/daemonset-metrics.md at
# c92fe0c5ce02d3b52abf54490e00db6c706f2ba5 (github.com/kubernetes/kube-state-metrics), STABLE.
KUBE_STATE_METRICS = {"kube_daemonset_status_number_unavailable": "gauge"}


def ours() -> set[str]:
    """Every series name the server exposes, read off its own exposition once each labelled
    metric has a sample (as in a server that has answered a review)."""
    metrics = Metrics()
    metrics.set_policy("0" * 64)
    metrics.decision_seconds.labels("validate").observe(0.001)
    metrics.violations.labels("privileged", "Enforce").inc()
    metrics.watch_inventory(lambda: (5000, 1.5, 0))  # as a server with --inventory
    text = metrics.render()[0].decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] not in "#"}


def rule_expressions() -> list[tuple[str, str]]:
    rule = yaml.safe_load(RULE.read_text())
    return [(r["alert"], r["expr"]) for g in rule["spec"]["groups"] for r in g["rules"]]


def dashboard_expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


EXPRESSIONS = rule_expressions() + dashboard_expressions()


def selectors(node: Any) -> Iterator[Any]:
    """Every VectorSelector in a parsed expression."""
    if isinstance(node, promql_parser.VectorSelector):
        yield node
        return
    for attribute in ("lhs", "rhs", "expr", "param", "vector_selector"):
        child = getattr(node, attribute, None)
        if child is not None:
            yield from selectors(child)
    for argument in getattr(node, "args", None) or ():
        yield from selectors(argument)


@pytest.mark.parametrize(("name", "expr"), EXPRESSIONS, ids=[n for n, _ in EXPRESSIONS])
def test_every_expression_parses_and_reads_only_exposed_metrics(name: str, expr: str) -> None:
    parsed = promql_parser.parse(expr)
    names = {s.name for s in selectors(parsed)}
    assert names, f"{name}: reads no metric"
    exposed = ours() | set(DCGM_METRICS) | set(KUBE_STATE_METRICS)
    assert names <= exposed, names - exposed


def test_the_parser_refuses_a_broken_expression() -> None:
    with pytest.raises(ValueError):
        promql_parser.parse("sum(rate(gpu_admission_requests_total[5m])")


def test_our_metrics_are_queried_by_labels_they_have() -> None:
    labels = {
        "gpu_admission_requests_total": {"endpoint", "verdict"},
        "gpu_admission_violations_total": {"rule", "mode"},
        "gpu_admission_mutations_total": {"outcome"},
        "gpu_admission_decision_seconds_bucket": {"endpoint", "le"},
        "gpu_admission_policy_info": {"sha256"},
    }
    for name, expr in EXPRESSIONS:
        for selector in selectors(promql_parser.parse(expr)):
            used = {m.name for m in selector.matchers.matchers}
            assert used <= labels.get(selector.name, used), (name, selector.name, used)


def test_every_alert_says_how_bad_and_what_to_do() -> None:
    rule = yaml.safe_load(RULE.read_text())
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert {a["alert"] for a in alerts} >= {
        "GPUAdmissionErrors",
        "GPUAdmissionSlowDecisions",
        "GPUAdmissionPolicyReloadFailing",
        "GPUAdmissionCertificateExpiresSoon",
        "GPULowUtilisation",
        "GPUXidError",
        "GPUDevicePluginNotReady",
    }
    for alert in alerts:
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), alert["alert"]
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]


def test_the_xid_alert_fires_on_a_change_and_utilisation_covers_mig() -> None:
    expressions = dict(rule_expressions())
    assert "changes(DCGM_FI_DEV_XID_ERRORS" in expressions["GPUXidError"]
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in expressions["GPULowUtilisation"]


def test_the_slow_decision_alert_can_fire_below_the_timeout() -> None:
    # histogram_quantile cannot go past the highest finite bucket: the buckets reach the
    # webhook's 5 s timeout, so a threshold of 2.5 s can be crossed.
    from webhook.server.metrics import DECISION_BUCKETS

    threshold = float(dict(rule_expressions())["GPUAdmissionSlowDecisions"].split(">")[-1])
    assert max(DECISION_BUCKETS) >= 5.0 > threshold


def test_the_rule_is_a_valid_prometheus_rule() -> None:
    from tests.test_chart import undeclared

    rule = yaml.safe_load(RULE.read_text())
    schema = json.loads(
        (REPO / "tests" / "schemas" / "monitoring.coreos.com_PrometheusRule_v1.json").read_text()
    )
    assert list(jsonschema.Draft7Validator(schema).iter_errors(rule)) == []
    assert undeclared(rule, schema) == []


def test_the_dashboard_is_one_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["templating"]["list"][0]["type"] == "datasource"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"]


def test_kustomize_and_the_chart_ship_the_same_alerts_and_dashboard() -> None:
    import helm_python as helm

    kustomized = {d["kind"]: d for d in kustomize(MONITORING)}
    with helm.Chart.load(str(REPO / "manifests" / "chart")) as chart:
        out = chart.render(
            values={"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
            name="gpu-admission",
            namespace="gpu-admission",
        )
    charted = {
        d["kind"]: d
        for path, text in out.items()
        if path.endswith(("prometheusrule.yaml", "grafana-dashboard.yaml"))
        for d in yaml.safe_load_all(text)
        if d
    }
    assert charted["PrometheusRule"]["spec"] == kustomized["PrometheusRule"]["spec"]
    assert json.loads(charted["ConfigMap"]["data"]["grafana-dashboard.json"]) == json.loads(
        kustomized["ConfigMap"]["data"]["grafana-dashboard.json"]
    )
    assert charted["ConfigMap"]["metadata"]["labels"]["grafana_dashboard"] == "1"
