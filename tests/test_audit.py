"""``webhook.audit`` called from Python, as a controller or a notebook would: files and a live
cluster (the fake API server of tests/kubeapi.py), the pre-flight and the reports, with typed
parameters, nothing printed, and the same findings as ``gpu-admission audit``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import webhook
from tests.kubeapi import FakeKubeAPI
from tests.samples import CONFIG_MAP, GPU_DEPLOYMENT, GPU_POD, PRIVILEGED_PLAIN_POD
from tests.support.cluster import seed, serve_report_kinds, serve_workload_kinds
from tests.support.paths import REPO
from webhook.audit.documents import SubdirectoriesNotRead
from webhook.audit.judging import Audit
from webhook.audit.reports import REPORT_APIS, apply_reports, policy_reports
from webhook.cli.main import main

POLICY = webhook.load_policy(webhook.default_policy_path())
STRICT = webhook.load_policy(REPO / "policies" / "examples" / "strict.yaml")
CATALOGUE = REPO / "tests" / "fixtures" / "catalogue"


def cli_records(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[Any]]:
    code = main(["audit", *args, "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


def findings(audit: Audit) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """Each judged object's name, verdict and findings (rule, field, mode), in order."""
    return [
        (
            item.document.describe(),
            "allowed" if item.outcome.allowed else "denied",
            [(f.rule, f.path, f.mode) for f in item.outcome.findings],
        )
        for item in audit.items
        if item.outcome.judged
    ]


def cli_findings(records: list[Any]) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    return [
        (
            f"{r['kind']}/{r['name']}",
            r["verdict"],
            [(v["rule"], v["path"], v["mode"]) for v in r["violations"]],
        )
        for r in records
        if "verdict" in r and r["verdict"] != "skipped"
    ]


def test_audit_files_finds_what_the_command_finds_and_prints_nothing(capsys) -> None:
    audit = webhook.audit_files(POLICY, [str(CATALOGUE)])
    assert capsys.readouterr() == ("", "")
    assert audit.items and audit.denies and not audit.problems
    assert not audit.respect_modes  # every rule the policy turns on is enforced
    code, records = cli_records(capsys, "-f", str(CATALOGUE))
    assert code == 1
    assert findings(audit) == cli_findings(records)


def test_audit_files_keeps_the_policy_modes_on_request(tmp_path: Path, capsys) -> None:
    # Not GPU-relevant: the default policy only audits a privileged plain Pod.
    plain = tmp_path / "cni.yaml"
    plain.write_text(PRIVILEGED_PLAIN_POD, encoding="utf-8")
    respected = webhook.audit_files(POLICY, [str(plain)], respect_modes=True)
    enforced = webhook.audit_files(POLICY, [str(plain)])
    assert [f.mode for item in respected.items for f in item.outcome.findings] == ["Audit"]
    assert [f.mode for item in enforced.items for f in item.outcome.findings] == ["Enforce"]
    assert not respected.denies and enforced.denies
    code, records = cli_records(capsys, "-f", str(plain), "--respect-modes")
    assert code == 0
    assert findings(respected) == cli_findings(records)


def test_standard_input_is_text_the_caller_gives(tmp_path: Path, capsys) -> None:
    text = GPU_POD + "---\n" + CONFIG_MAP + "---\nnot: a kubernetes object\n"
    audit = webhook.audit_files(POLICY, ["-"], namespace="ml", stdin=text)
    assert capsys.readouterr() == ("", "")
    assert [(i.document.source, i.outcome.namespace) for i in audit.items] == [
        ("-", "ml"),
        ("-", "ml"),
    ]
    assert audit.notes == [
        "- document 3: not a Kubernetes object (no apiVersion and kind), skipped"
    ]
    # Without the text, standard input is a problem of the audit, not a read of sys.stdin.
    unread = webhook.audit_files(POLICY, ["-"])
    assert [p.message for p in unread.problems] == ["-: standard input was not given"]


def test_one_path_is_one_path_and_standard_input_is_read_once_at_most(
    tmp_path: Path,
) -> None:
    pod = tmp_path / "train.yaml"
    pod.write_text(GPU_POD, encoding="utf-8")
    for one in (str(pod), pod):
        audit = webhook.audit_files(POLICY, one)
        assert [i.document.source for i in audit.items] == [str(pod)]
    # Standard input is read once at most: a second "-" is the same input, not read again.
    twice = webhook.audit_files(POLICY, ["-", "-"], stdin=GPU_POD)
    assert [i.document.describe() for i in twice.items] == ["Pod/train"]
    assert twice.notes == []


def test_unreadable_files_and_engine_failures_are_problems(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "ok.yaml").write_text(GPU_DEPLOYMENT, encoding="utf-8")
    (tmp_path / "broken.yaml").write_text("a: [\n", encoding="utf-8")
    audit = webhook.audit_files(POLICY, [str(tmp_path), str(tmp_path / "missing.yaml")])
    assert [p.stage for p in audit.problems] == ["read", "read"]
    assert [i.document.describe() for i in audit.items] == ["Deployment/trainer"]

    def failing(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the engine broke")

    monkeypatch.setattr("webhook.audit.judging.decide_object", failing)
    failed = webhook.audit_files(POLICY, [str(tmp_path / "ok.yaml")])
    assert [p.stage for p in failed.problems] == ["judge"]
    with pytest.raises(RuntimeError, match="the engine broke"):
        webhook.audit_files(POLICY, [str(tmp_path / "ok.yaml")], raise_errors=True)


def test_directories_are_read_as_the_command_reads_them(tmp_path: Path, capsys) -> None:
    # Before: audit_files(policy, ["dir/"]) recursed while `audit -f dir/` refused without -R.
    (tmp_path / "train.yaml").write_text(GPU_POD, encoding="utf-8")
    nested = tmp_path / "team" / "debug.yaml"
    nested.parent.mkdir()
    nested.write_text(PRIVILEGED_PLAIN_POD, encoding="utf-8")
    for read in (
        lambda **kw: webhook.audit_files(POLICY, tmp_path, **kw),
        lambda **kw: webhook.preflight_files(STRICT, POLICY, tmp_path, **kw).new,
    ):
        with pytest.raises(SubdirectoriesNotRead) as refused:
            read()
        assert refused.value.left_out == [nested]
        recursed = read(recursive=True)
        sources = [i.document.source for i in recursed.items]
        assert sources == [str(nested), str(tmp_path / "train.yaml")]
    assert main(["audit", "-f", str(tmp_path), "-o", "json"]) == 2
    assert "add -R to read them" in capsys.readouterr().err
    code, records = cli_records(capsys, "-f", str(tmp_path), "-R")
    assert code == 1
    assert [r["source"] for r in records[:-1]] == sources


def test_preflight_files_matches_the_command(tmp_path: Path, capsys) -> None:
    (tmp_path / "cni.yaml").write_text(PRIVILEGED_PLAIN_POD, encoding="utf-8")
    (tmp_path / "train.yaml").write_text(GPU_POD, encoding="utf-8")
    result = webhook.preflight_files(STRICT, POLICY, [str(tmp_path)])
    assert capsys.readouterr() == ("", "")
    assert result.changes and result.starts_denying
    code = main(
        [
            "audit",
            "-f",
            str(tmp_path),
            "--policy",
            str(REPO / "policies" / "examples" / "strict.yaml"),
            "--against",
            str(webhook.default_policy_path()),
            "-o",
            "json",
        ]
    )
    assert code == 1
    assert [c.record() for c in result.changes] == json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------------------- cluster


@pytest.fixture
def cluster(kube_api: FakeKubeAPI, kube_api_kubeconfig: Path) -> webhook.Cluster:
    serve_workload_kinds(kube_api)
    seed(kube_api)
    with webhook.connect(str(kube_api_kubeconfig), timeout=10) as connection:
        yield connection


def test_audit_cluster_finds_what_the_command_finds_and_prints_nothing(
    cluster: webhook.Cluster, kube_api_kubeconfig: Path, capsys
) -> None:
    audit = webhook.audit_cluster(POLICY, cluster, None)
    assert capsys.readouterr() == ("", "")
    # In the order listed: owners' kinds first, Pods last.
    assert [(str(i.ref), [str(r) for r in i.owned]) for i in audit.items] == [
        ("ml/PyTorchJob/mnist", ["ml/Pod/mnist-master-0"]),
        (
            "ml/Deployment/trainer",
            ["ml/ReplicaSet/trainer-5d4f", "ml/Pod/trainer-5d4f-a", "ml/Pod/trainer-5d4f-b"],
        ),
        ("default/Pod/web", []),
        ("ml/Pod/debug", []),
    ]
    assert audit.denies and not audit.problems
    assert audit.notes  # the custom kinds this cluster does not serve
    code, records = cli_records(capsys, "--cluster", "-A", "--kubeconfig", str(kube_api_kubeconfig))
    assert code == 1
    assert findings(audit) == cli_findings(records)
    # One namespace: the context's is the connection's default.
    assert cluster.namespace == "default"
    in_default = webhook.audit_cluster(POLICY, cluster, cluster.namespace)
    assert [str(i.ref) for i in in_default.items] == ["default/Pod/web"]


def test_preflight_cluster_lists_once_and_judges_twice(cluster: webhook.Cluster) -> None:
    result = webhook.preflight_cluster(STRICT, POLICY, cluster, None)
    assert [str(i.ref) for i in result.new.items] == [str(i.ref) for i in result.old.items]
    assert result.old.notes == [] and result.new.notes  # said once, by the new audit
    assert all(c.verdict != "stops denying" for c in result.changes)


def test_reports_are_applied_and_pruned_from_python(
    cluster: webhook.Cluster, kube_api: FakeKubeAPI, capsys
) -> None:
    serve_report_kinds(kube_api)
    api = REPORT_APIS["wgpolicyk8s"]
    audit = webhook.audit_cluster(POLICY, cluster, None, respect_modes=True)
    reports = policy_reports(audit.policy, audit.items, api)
    applied = apply_reports(cluster, api, reports, None)
    assert (applied.created, applied.updated, applied.pruned, applied.failed) == (
        len(reports),
        0,
        0,
        [],
    )
    again = apply_reports(cluster, api, reports, None)
    assert (again.created, again.unchanged) == (0, len(reports))
    pruned = apply_reports(cluster, api, reports[1:], None)
    assert pruned.pruned == 1
    assert capsys.readouterr() == ("", "")


def test_reports_that_cannot_be_listed_are_a_cluster_error(
    cluster: webhook.Cluster, kube_api: FakeKubeAPI
) -> None:
    serve_report_kinds(kube_api)
    kube_api.forbid("/apis/wgpolicyk8s.io/*")
    api = REPORT_APIS["wgpolicyk8s"]
    with pytest.raises(webhook.ClusterError) as raised:
        apply_reports(cluster, api, [], None)
    message = str(raised.value)
    assert message.startswith(
        "cannot list the policyreports.wgpolicyk8s.io this tool wrote (HTTP 403): "
    )
    assert "\n" not in message


def test_an_unreachable_cluster_is_a_cluster_error(tmp_path: Path) -> None:
    with pytest.raises(webhook.ClusterError, match="does not exist"):
        webhook.connect(str(tmp_path / "missing"))
