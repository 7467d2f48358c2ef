"""``gpu-admission review``: the conformance corpus through the CLI agrees with the conformance
table, and every input form (multi-document, List, JSON, stdin, AdmissionReview) and output
(table, json, yaml, --mutate, --diff) works, with one clear line for a bad input."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from tests.conformance.corpus import CORPUS, POLICIES, load_table, requires_corpus
from tests.samples import CONFIG_MAP, GPU_DEPLOYMENT, GPU_POD, PRIVILEGED_GPU_POD, failing_on
from webhook.cli.main import main

TABLE = load_table()["files"]
FIXTURES = Path(__file__).with_name("fixtures")
BUCKET = {"Enforce": "denied", "Warn": "warned", "Audit": "audited"}


def review(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["review", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def review_json(capsys, *args: str) -> tuple[int, list[dict]]:
    """The records of the objects, without the summary that closes the list."""
    code, out, err = review(capsys, *args, "-o", "json")
    assert code in (0, 1), err
    *records, summary = json.loads(out)
    assert list(summary) == ["summary"]
    return code, records


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def verdict_of(records: list[dict]) -> dict:
    """The conformance table's shape: the verdict on the file and the rule ids by mode."""
    rules: dict[str, set[str]] = {"denied": set(), "warned": set(), "audited": set()}
    for record in records:
        for violation in record["violations"]:
            rules[BUCKET[violation["mode"]]].add(violation["rule"])
    denied = any(r["verdict"] == "denied" for r in records)
    result: dict = {"verdict": "denied" if denied else "allowed"}
    result.update({k: sorted(v) for k, v in rules.items() if v})
    return result


# --------------------------------------------------------------------------- the corpus


# The GPU operator's DaemonSets say `namespace: FILLED BY THE OPERATOR`: an explicit -n wins
# over an object's own namespace, as the request namespace does in the webhook.
@requires_corpus
@pytest.mark.parametrize("policy_name", sorted(POLICIES))
@pytest.mark.parametrize("file_name", sorted(TABLE))
def test_corpus_file_agrees_with_the_conformance_table(
    capsys, file_name: str, policy_name: str
) -> None:
    row = TABLE[file_name]
    args = ["-f", str(CORPUS / file_name), "-n", row["namespace"]]
    if policy_name != "default":
        args += ["--policy", str(POLICIES[policy_name])]
    code, records = review_json(capsys, *args)
    expected = row[policy_name]
    assert verdict_of(records) == expected, row["why"]
    assert code == (1 if expected["verdict"] == "denied" else 0)


# ------------------------------------------------------------------------ exit codes


def test_exit_0_when_allowed_1_when_denied(tmp_path: Path, capsys) -> None:
    code, out, _ = review(capsys, "-f", write(tmp_path, "ok.yaml", GPU_POD))
    assert code == 0
    assert out.startswith("ALLOWED  Pod/default/train  ")
    bad = write(tmp_path, "bad.yaml", PRIVILEGED_GPU_POD)
    code, out, _ = review(capsys, "-f", bad, "-o", "wide")
    assert code == 1
    assert "DENIED  Pod/debug" in out
    assert "deny  [privileged] spec.containers[0].securityContext.privileged" in out
    assert "(line 10)" in out  # the line of `privileged: true`


def test_exit_2_on_a_missing_file(tmp_path: Path, capsys) -> None:
    code, out, err = review(capsys, "-f", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert "nope.yaml: no such file or directory" in err


def test_exit_2_on_a_bad_policy(tmp_path: Path, capsys) -> None:
    policy = write(tmp_path, "policy.yaml", "apiVersion: gpu-admission.io/v1alpha1\nkind: X\n")
    code, out, err = review(capsys, "-f", write(tmp_path, "p.yaml", GPU_POD), "--policy", policy)
    assert code == 2
    assert out == ""
    # One line per error, each naming the file and line: no header, no indented lines.
    lines = err.splitlines()
    assert len(lines) == 3  # metadata and spec missing, kind wrong
    assert all(line.startswith(f"gpu-admission: error: {policy}:") for line in lines)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            # (documents before a broken one are judged: see the unreadable-files test)
            b"kind: Pod\n  bad: indentation\n",
            "document 1 line 2: not valid YAML: mapping values are not allowed here",
        ),
        (b'{"apiVersion": "v1", "kind": ', "line 1: not valid JSON: Expecting value"),
        (b"\xff\xfe\x00", "not UTF-8 text"),
    ],
    ids=["yaml", "json", "binary"],
)
def test_malformed_input_is_one_clear_line_naming_file_and_document(
    tmp_path: Path, capsys, data: bytes, message: str
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_bytes(data)
    code, out, err = review(capsys, "-f", str(path))
    assert code == 2
    assert out == ""
    assert err == f"gpu-admission: error: {path}: {message}\n"


# ------------------------------------------------------------------------ input forms


def test_multi_document_input_judges_each_document(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, "all.yaml", "\n---\n".join([GPU_POD, CONFIG_MAP, PRIVILEGED_GPU_POD]))
    code, records = review_json(capsys, "-f", path)
    assert code == 1
    assert [(r["document"], r["kind"], r["judged"], r["verdict"]) for r in records] == [
        (1, "Pod", True, "allowed"),
        (2, "ConfigMap", False, "allowed"),
        (3, "Pod", True, "denied"),
    ]
    # Lines count from the top of the file, not of the document.
    lines = Path(path).read_text().splitlines()
    assert [lines[r["line"] - 1] for r in records] == ["apiVersion: v1"] * 3
    assert [r["line"] for r in records] == [1, 14, 22]
    assert lines[records[2]["violations"][0]["line"] - 1].strip() == "privileged: true"


def test_kind_list_input_is_expanded(tmp_path: Path, capsys) -> None:
    items = [yaml.safe_load(GPU_POD), yaml.safe_load(PRIVILEGED_GPU_POD)]
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}, sort_keys=False)
    code, records = review_json(capsys, "-f", write(tmp_path, "list.yaml", text))
    assert code == 1
    assert [(r["name"], r["verdict"]) for r in records] == [
        ("train", "allowed"),
        ("debug", "denied"),
    ]
    privileged = records[1]["violations"][0]
    assert text.splitlines()[privileged["line"] - 1].strip() == "privileged: true"


def test_json_input(tmp_path: Path, capsys) -> None:
    text = json.dumps(yaml.safe_load(PRIVILEGED_GPU_POD), indent=2)
    code, records = review_json(capsys, "-f", write(tmp_path, "pod.json", text))
    assert code == 1
    assert records[0]["name"] == "debug"
    assert [v["rule"] for v in records[0]["violations"]] == ["privileged"]


def test_standard_input(monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(PRIVILEGED_GPU_POD))
    code, records = review_json(capsys, "-f", "-", "-n", "ml")
    assert code == 1
    assert records[0]["source"] == "-"
    assert records[0]["namespace"] == "ml"


def test_an_admission_review_is_answered_with_the_response(capsys) -> None:
    request = json.loads((FIXTURES / "admission-review-privileged-gpu-pod.json").read_text())
    code, out, _ = review(capsys, "-f", str(FIXTURES / "admission-review-privileged-gpu-pod.json"))
    answer = json.loads(out)
    assert code == 1
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == request["request"]["uid"]
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 403
    code, out, _ = review(capsys, "-f", str(FIXTURES / "admission-review-gpu-pod.json"))
    assert code == 0
    assert json.loads(out)["response"]["allowed"] is True


# ---------------------------------------------------------------------------- outputs


def test_mutate_gives_the_patch_of_a_gpu_pod(tmp_path: Path, capsys) -> None:
    code, records = review_json(capsys, "-f", write(tmp_path, "p.yaml", GPU_POD), "--mutate")
    assert code == 0
    (mutation,) = records[0]["mutations"]
    assert mutation["template"] is None
    paths = [op["path"] for op in mutation["patch"]]
    assert "/spec/tolerations" in paths
    assert {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}.items() <= (
        mutation["mutated"]["spec"]["tolerations"][0].items()
    )


def test_mutate_of_a_deployment_patches_its_template_pod(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, "d.yaml", GPU_DEPLOYMENT)
    code, records = review_json(capsys, "-f", path, "--mutate", "-n", "ml")
    assert code == 0
    (mutation,) = records[0]["mutations"]
    assert mutation["template"] == "spec.template"
    # The patch is for the Pod the ReplicaSet creates, not for the Deployment.
    assert all(op["path"].startswith(("/spec/", "/metadata/")) for op in mutation["patch"])
    assert mutation["mutated"]["kind"] == "Pod"
    assert mutation["mutated"]["metadata"]["namespace"] == "ml"
    assert mutation["mutated"]["spec"]["containers"][0]["name"] == "main"
    assert mutation["mutated"]["spec"]["tolerations"]

    code, out, _ = review(capsys, "-f", path, "--mutate", "-o", "wide")
    assert "  mutate Pods of spec.template:\n    add /spec/tolerations: " in out
    assert "--- mutated Deployment/trainer (spec.template)\n" in out
    mutated = yaml.safe_load(out.split("(spec.template)\n", 1)[1])
    assert mutated["kind"] == "Pod"


def test_mutate_diff(tmp_path: Path, capsys) -> None:
    code, out, _ = review(capsys, "-f", write(tmp_path, "p.yaml", GPU_POD), "--mutate", "--diff")
    assert code == 0
    assert "--- Pod/train (before)\n+++ Pod/train (mutated)\n" in out
    assert "+  tolerations:\n" in out
    assert "--- mutated" not in out  # the diff replaces the whole object


def test_yaml_output(tmp_path: Path, capsys) -> None:
    code, out, _ = review(capsys, "-f", write(tmp_path, "p.yaml", PRIVILEGED_GPU_POD), "-o", "yaml")
    assert code == 1
    record, summary = yaml.safe_load(out)
    assert record["verdict"] == "denied"
    assert summary["summary"]["rules"] == {
        "privileged": {"denials": 1, "warnings": 0, "audits": 0, "objects": 1}
    }
    assert record["violations"][0]["rule"] == "privileged"


def test_table_summary_counts_and_skips(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, "all.yaml", "\n---\n".join([GPU_POD, CONFIG_MAP]))
    code, out, _ = review(capsys, "-f", path)
    assert code == 0
    assert out.splitlines()[-1] == (
        "1 object(s) judged: 0 denied, 1 allowed; 1 not a Pod or workload, skipped"
    )
    assert "\033[" not in out  # not a terminal: no colours


# -------------------------------------------------------- objects the engine fails on


def test_an_object_that_cannot_be_judged_is_an_error_and_the_rest_is_reported(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("webhook.cli.review.decide_object", failing_on("train"))
    both = write(tmp_path, "both.yaml", PRIVILEGED_GPU_POD + "---\n" + GPU_POD)
    code, out, err = review(capsys, "-f", both)
    assert code == 2
    assert err == (
        f"gpu-admission: error: {both} document 2 (line 15): cannot judge Pod/train: "
        "RuntimeError: the engine broke on two lines\n"
    )
    assert f"DENIED  Pod/default/debug  {both}:1  deny: privileged\n" in out
    assert out.splitlines()[-1] == (
        "1 object(s) judged: 1 denied, 0 allowed; 1 could not be judged (see the errors above)"
    )

    code, out, _ = review(capsys, "-f", both, "-o", "json")
    assert code == 2
    debug, train, summary = json.loads(out)
    assert (summary["summary"]["judged"], summary["summary"]["failed"]) == (1, 1)
    assert debug["verdict"] == "denied"
    assert train == {
        "source": both,
        "document": 2,
        "line": 15,
        "error": f"{both} document 2 (line 15): cannot judge Pod/train: RuntimeError: the engine "
        "broke on two lines",
    }


def test_debug_before_or_after_the_command_shows_the_traceback(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("webhook.cli.review.decide_object", failing_on("train"))
    pod = write(tmp_path, "p.yaml", GPU_POD)
    for argv in (["--debug", "review", "-f", pod], ["review", "-f", pod, "--debug"]):
        with pytest.raises(RuntimeError, match="the engine broke"):
            main(argv)
    assert main(["review", "-f", pod]) == 2


def test_an_admission_review_that_cannot_be_answered_leaves_the_others_answered(
    tmp_path: Path, capsys
) -> None:
    broken = write(tmp_path, "broken.json", json.dumps({"kind": "AdmissionReview"}))
    good = str(FIXTURES / "admission-review-gpu-pod.json")
    code, out, err = review(capsys, "-f", broken, "-f", good)
    assert code == 2
    assert err.startswith(f"gpu-admission: error: {broken} document 1 (line 1): ")
    assert err.count("\n") == 1
    (answer,) = json.loads(out)
    assert answer["response"]["allowed"] is True


# ----------------------------------------------------------------------- misuse


def test_admission_reviews_and_plain_objects_are_not_mixed(tmp_path: Path, capsys) -> None:
    review_file = str(FIXTURES / "admission-review-gpu-pod.json")
    pod = write(tmp_path, "p.yaml", GPU_POD)
    code, out, err = review(capsys, "-f", review_file, "-f", pod)
    assert code == 2
    assert out == ""
    assert err == (
        f"gpu-admission: error: {pod} document 1 (line 1) is not an AdmissionReview but "
        f"{review_file} document 1 (line 1) is: review AdmissionReviews and plain manifests "
        "in separate runs\n"
    )


def test_diff_without_mutate_is_a_usage_error(tmp_path: Path, capsys) -> None:
    code, out, err = review(capsys, "-f", write(tmp_path, "p.yaml", GPU_POD), "--diff")
    assert code == 2
    assert out == ""
    assert err == "gpu-admission review: error: --diff needs --mutate\n"


# ---------------------------------------------------------------------------- YAML


def test_mutate_yaml_has_no_anchors_or_aliases(tmp_path: Path, capsys) -> None:
    # The patch's values are the objects put into the mutated Pod: a plain dump would write
    # them once with &id001 and refer to them with *id001.
    pod = write(tmp_path, "p.yaml", GPU_POD)
    code, out, _ = review(capsys, "-f", pod, "--mutate", "-o", "yaml")
    assert code == 0
    assert "&id" not in out and "*id" not in out
    _, records = review_json(capsys, "-f", pod, "--mutate")
    assert yaml.safe_load(out)[:-1] == records


# ------------------------------------------------------------------ the whole CLI


@pytest.mark.parametrize(
    ("argv", "examples"),
    [
        ([], ["gpu-admission review -f pod.yaml"]),
        (["serve"], ["gpu-admission serve --cert certs/tls.crt --key certs/tls.key"]),
        (
            ["review"],
            [
                "gpu-admission review -f pod.yaml",
                "kubectl get pods -A -o yaml | gpu-admission review -f - -o json\n",
            ],
        ),
        (["audit"], ["gpu-admission audit --cluster -A ", "\nexit status:"]),
    ],
    ids=["gpu-admission", "serve", "review", "audit"],
)
def test_help_has_examples_as_written(capsys, argv: list[str], examples: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "\nexamples:\n" in text
    for example in examples:
        # As written, one example a line: the epilog is not re-wrapped.
        assert f"\n  {example}" in text or example.startswith("\n") and example in text


def test_every_readable_file_is_judged_and_each_unreadable_one_reported(
    tmp_path: Path, capsys
) -> None:
    good = write(tmp_path, "good.yaml", PRIVILEGED_GPU_POD)
    broken = write(tmp_path, "broken.yaml", "kind: [\n")
    missing = str(tmp_path / "missing.yaml")
    # A stream broken half-way: the documents before the break are still judged.
    partial = write(tmp_path, "partial.yaml", PRIVILEGED_GPU_POD + "---\nkind: [\n")
    code, out, err = review(capsys, "-f", good, "-f", broken, "-f", missing, "-f", partial)
    assert code == 2  # only after judging the rest
    assert out.count("DENIED  Pod/default/debug") == 2, out
    assert "2 object(s) judged: 2 denied, 0 allowed; 3 file(s) could not be read" in out
    lines = err.splitlines()
    assert len(lines) == 3, err
    assert lines[0].startswith(f"gpu-admission: error: {broken}: document 1 line 2: not valid YAML")
    assert lines[1] == f"gpu-admission: error: {missing}: no such file or directory"
    assert lines[2].startswith(f"gpu-admission: error: {partial}: document 2")


def test_a_missing_file_is_worded_the_same_by_every_command(tmp_path: Path, capsys) -> None:
    missing = str(tmp_path / "missing.yaml")
    expected = f"{missing}: no such file or directory"
    for argv in (
        ["review", "-f", missing],
        ["review", "-f", write(tmp_path, "pod.yaml", GPU_POD), "--policy", missing],
        ["audit", "-f", missing],
        ["policy", "validate", missing],
        ["policy", "test", missing],
        ["certs", "generate", "--out", str(tmp_path / "c"), "--bundle-old-ca", missing],
    ):
        main(argv)
        err = capsys.readouterr().err
        assert expected in err, (argv, err)


UNDECLARED_CUSTOM_RESOURCE = """\
apiVersion: serving.example.io/v1
kind: ModelServer
metadata:
  name: llm
spec:
  template:
    spec:
      containers:
        - name: main
          image: vllm
          resources: {limits: {nvidia.com/gpu: "0.5"}}
"""


def test_every_skipped_object_is_named_with_why(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, "all.yaml", "\n---\n".join([CONFIG_MAP, UNDECLARED_CUSTOM_RESOURCE]))
    code, out, _ = review(capsys, "-f", path)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("SKIPPED  ConfigMap/") and "runs no Pods of its own" in lines[0]
    assert lines[1].startswith(f"SKIPPED  ModelServer/llm     {path}:")
    assert "not a workload this policy declares: add it to spec.workloads" in lines[1]
    assert lines[-1].endswith("2 not a Pod or workload, skipped")
    _, records = review_json(capsys, "-f", path)
    assert [r["judged"] for r in records] == [False, False]
    assert "spec.workloads" in records[1]["skipped"]
