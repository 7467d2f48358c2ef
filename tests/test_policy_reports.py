"""``audit --cluster -o policyreport --apply`` against the fake API server (tests/kubeapi.py)
with the real kubernetes client: reports are created, updated and pruned, say what ``review``
says of the same objects, validate against the vendored CRD schemas, and a rerun over an
unchanged cluster changes nothing."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.kubeapi import FakeKubeAPI
from tests.support.cluster import serve_report_kinds
from webhook.admission.objects import decide_object
from webhook.audit.reports import REPORT_APIS
from webhook.cli.main import main
from webhook.policy.load import default_policy_path, load_policy

SCHEMAS = Path(__file__).resolve().parent / "schemas"
POLICY = load_policy(default_policy_path())
GPU = "nvidia.com/gpu"


def container(name: str, gpu: Any = 1, **extra: Any) -> dict:
    return {"name": name, "image": "cuda", "resources": {"limits": {GPU: gpu}}, **extra}


def template(*containers: dict, **spec: Any) -> dict:
    return {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": list(containers), **spec}}


def privileged_deployment() -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer", "namespace": "team-a", "uid": "uid-deploy"},
        "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "template": template(
                container("cuda", securityContext={"privileged": True}),
            ),
        },
    }


def owned_pod() -> dict:
    """A Pod of the Deployment (through its ReplicaSet): reported under the Deployment."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "trainer-abc-1",
            "namespace": "team-a",
            "uid": "uid-pod",
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "trainer-abc",
                    "uid": "uid-rs",
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [container("cuda", securityContext={"privileged": True})]},
    }


def replica_set() -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": "trainer-abc",
            "namespace": "team-a",
            "uid": "uid-rs",
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": "trainer",
                    "uid": "uid-deploy",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "template": template(container("cuda", securityContext={"privileged": True})),
        },
    }


def pytorch_job(gpu: Any = "0.5") -> dict:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "mnist", "namespace": "team-a", "uid": "uid-ptj"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template(container("torch", gpu))}
            }
        },
    }


def clean_deployment() -> dict:
    obj = privileged_deployment()
    obj["metadata"] = {"name": "clean", "namespace": "team-a", "uid": "uid-clean"}
    obj["spec"]["template"] = template(container("cuda"))
    return obj


def volcano_job() -> dict:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "fractional", "namespace": "team-b", "uid": "uid-vcjob"},
        "spec": {"tasks": [{"name": "w", "template": template(container("w", 0.4))}]},
    }


def host_path_pod() -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "peek", "namespace": "team-b", "uid": "uid-peek"},
        "spec": {
            "containers": [
                container(
                    "c", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "secret-looking-value"}]
                )
            ],
            "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}],
        },
    }


def training_runtime() -> dict:
    """Cluster-scoped: its report is a ClusterPolicyReport."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch-distributed", "uid": "uid-ctr"},
        "spec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {"spec": {"template": template(container("n", "1.5"))}},
                        }
                    ]
                }
            }
        },
    }


SERVED = {
    "apps": ["v1"],
    "batch": ["v1"],
    "kubeflow.org": ["v1"],
    "batch.volcano.sh": ["v1alpha1"],
    "trainer.kubeflow.org": ["v1alpha1"],
}


@pytest.fixture
def cluster(kube_api: FakeKubeAPI, kube_api_kubeconfig: Path):
    for obj in (
        privileged_deployment(),
        replica_set(),
        owned_pod(),
        pytorch_job(),
        clean_deployment(),
        volcano_job(),
        host_path_pod(),
    ):
        kube_api.add(obj)
    kube_api.add(training_runtime(), plural="clustertrainingruntimes")
    kube_api.register("", "v1", "replicationcontrollers", "ReplicationController")
    serve_report_kinds(kube_api)
    kube_api.serve_discovery(SERVED)
    return kube_api, kube_api_kubeconfig


def run(capsys, kubeconfig: Path, *extra: str) -> tuple[int, str]:
    argv = [
        "audit",
        "--cluster",
        "-o",
        "policyreport",
        "--apply",
        "--kubeconfig",
        str(kubeconfig),
        *extra,
    ]
    code = main(argv if "-n" in extra else [*argv, "-A"])
    out, err = capsys.readouterr()
    assert code != 2 or not err, err
    return code, out.strip()


def reports(
    api: FakeKubeAPI,
    group: str = "wgpolicyk8s.io",
    version: str = "v1alpha2",
    plurals: tuple[str, str] = ("policyreports", "clusterpolicyreports"),
) -> dict:
    found = {}
    for plural in plurals:
        for item in api.items(f"/apis/{group}/{version}/{plural}"):
            found[(item["metadata"].get("namespace", ""), item["metadata"]["name"])] = item
    return found


def schema(group: str, kind: str, version: str) -> dict:
    return json.loads((SCHEMAS / f"{group}_{kind}_{version}.json").read_text())


def test_reports_are_created_match_review_and_validate(cluster, capsys) -> None:
    api, kubeconfig = cluster
    code, out = run(capsys, kubeconfig)
    assert code == 0
    assert out == "reports (wgpolicyk8s.io/v1alpha2): 5 created, 0 updated, 0 unchanged, 0 pruned"
    stored = reports(api)
    scopes = sorted((r["scope"]["kind"], r["scope"]["name"]) for r in stored.values())
    # The Deployment's ReplicaSet and Pod are reported under it; the clean Deployment has none.
    assert scopes == [
        ("ClusterTrainingRuntime", "torch-distributed"),
        ("Deployment", "trainer"),
        ("Job", "fractional"),
        ("Pod", "peek"),
        ("PyTorchJob", "mnist"),
    ]
    for report in stored.values():
        kind = report["kind"]
        validator = jsonschema.Draft7Validator(schema("wgpolicyk8s.io", kind, "v1alpha2"))
        clean = {k: v for k, v in report.items() if k != "metadata"}
        assert list(validator.iter_errors(clean)) == []
        assert report["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-admission"
        # Results say what review says of the same object, finding for finding.
        scope = report["scope"]
        obj = api.get(_path_of(scope))
        outcome = decide_object(obj, POLICY, scope.get("namespace", "default"))
        expected = sorted(
            (f.rule, {"Enforce": "fail", "Audit": "fail", "Warn": "warn"}[f.mode], f.path)
            for f in outcome.findings
        )
        got = sorted((r["rule"], r["result"], r["properties"]["field"]) for r in report["results"])
        assert got == expected
        assert report["summary"]["fail"] == sum(1 for e in expected if e[1] == "fail")
    cluster_report = next(r for r in stored.values() if r["kind"] == "ClusterPolicyReport")
    assert "namespace" not in cluster_report["metadata"]
    # The environment variable's value is never copied into a report.
    assert "secret-looking-value" not in json.dumps(list(stored.values()))


def _path_of(scope: dict) -> str:
    group, _, version = scope["apiVersion"].rpartition("/")
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    plural = {
        "Deployment": "deployments",
        "Pod": "pods",
        "Job": "jobs",
        "PyTorchJob": "pytorchjobs",
        "ClusterTrainingRuntime": "clustertrainingruntimes",
    }[scope["kind"]]
    namespace = f"/namespaces/{scope['namespace']}" if scope.get("namespace") else ""
    return f"{base}{namespace}/{plural}/{scope['name']}"


def test_a_rerun_changes_nothing_then_fixes_and_deletions_are_pruned(cluster, capsys) -> None:
    api, kubeconfig = cluster
    run(capsys, kubeconfig)
    before = {k: r["metadata"]["resourceVersion"] for k, r in reports(api).items()}
    code, out = run(capsys, kubeconfig)
    assert (code, out) == (
        0,
        "reports (wgpolicyk8s.io/v1alpha2): 0 created, 0 updated, 5 unchanged, 0 pruned",
    )
    assert {k: r["metadata"]["resourceVersion"] for k, r in reports(api).items()} == before

    # The PyTorchJob is fixed, the Volcano Job goes away, the Pod gains a finding.
    api.replace(pytorch_job(gpu=1))
    api.remove("/apis/batch.volcano.sh/v1alpha1/namespaces/team-b/jobs/fractional")
    pod = host_path_pod()
    pod["spec"]["hostPID"] = True
    api.replace(pod)
    code, out = run(capsys, kubeconfig)
    assert (code, out) == (
        0,
        "reports (wgpolicyk8s.io/v1alpha2): 0 created, 1 updated, 2 unchanged, 2 pruned",
    )
    scopes = sorted(r["scope"]["name"] for r in reports(api).values())
    assert scopes == ["peek", "torch-distributed", "trainer"]
    peek = next(r for r in reports(api).values() if r["scope"]["name"] == "peek")
    assert "host-access" in {r["rule"] for r in peek["results"]}


def test_a_namespace_audit_prunes_only_its_namespace(cluster, capsys) -> None:
    api, kubeconfig = cluster
    run(capsys, kubeconfig)
    api.remove("/apis/batch.volcano.sh/v1alpha1/namespaces/team-b/jobs/fractional")
    api.remove("/api/v1/namespaces/team-a/pods/trainer-abc-1")
    code, out = run(capsys, kubeconfig, "-n", "team-a")
    assert (code, out) == (
        0,
        "reports (wgpolicyk8s.io/v1alpha2): 0 created, 0 updated, 2 unchanged, 0 pruned",
    )
    # team-b's stale report and the cluster report stay: that audit did not look there.
    assert len(reports(api)) == 5


def test_openreports_on_request(cluster, capsys) -> None:
    api, kubeconfig = cluster
    code, out = run(capsys, kubeconfig, "--report-api", "openreports")
    assert code == 0
    assert out == "reports (openreports.io/v1alpha1): 5 created, 0 updated, 0 unchanged, 0 pruned"
    stored = reports(api, "openreports.io", "v1alpha1", ("reports", "clusterreports"))
    for report in stored.values():
        validator = jsonschema.Draft7Validator(schema("openreports.io", report["kind"], "v1alpha1"))
        clean = {k: v for k, v in report.items() if k != "metadata"}
        assert list(validator.iter_errors(clean)) == []
        assert report["source"] == "gpu-admission"


def test_a_missing_report_crd_is_reported_not_fatal(
    kube_api: FakeKubeAPI, kube_api_kubeconfig: Path, capsys
) -> None:
    kube_api.add(volcano_job())
    kube_api.register("", "v1", "replicationcontrollers", "ReplicationController")
    kube_api.serve_discovery(SERVED)
    code, out = run(capsys, kube_api_kubeconfig)
    assert code == 0
    assert out.startswith("reports: none written: PolicyReport.wgpolicyk8s.io is not served")
    assert not kube_api.requests_to("PATCH")


def test_apply_is_refused_without_cluster_and_policyreport(tmp_path: Path, capsys) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(json.dumps(volcano_job()))
    assert main(["audit", "-f", str(manifest), "--apply"]) == 2
    assert "--apply writes reports to a cluster" in capsys.readouterr().err


def test_report_names_are_stable_distinct_and_short_enough() -> None:
    from webhook.audit.reports import Subject, report_name

    batch = Subject("batch/v1", "Job", "team-a", "train")
    volcano = Subject("batch.volcano.sh/v1alpha1", "Job", "team-a", "train")
    assert report_name(batch) == report_name(copy.copy(batch))
    assert report_name(batch) != report_name(volcano)
    assert report_name(batch).startswith("gpu-admission-job-train-")
    long = Subject("v1", "Pod", "team-a", "p" * 253)
    assert len(report_name(long)) <= 253
    assert set(REPORT_APIS) == {"wgpolicyk8s", "openreports"}


# ------------------------------------------------------ what a tenant's object must not do


def argo_workflow(patch: str, templates: int = 1) -> dict:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "big", "namespace": "team-b", "uid": "uid-wf"},
        "spec": {
            "templates": [
                {
                    "name": f"t{i}",
                    "podSpecPatch": patch,
                    "container": {"image": "x", "resources": {"limits": {GPU: 1}}},
                }
                for i in range(templates)
            ]
        },
    }


def test_a_report_quotes_no_patch_and_stays_small() -> None:
    """A podSpecPatch may carry a token and be as long as the object: never copied."""
    from webhook.audit.reports import MAX_RESULTS, Subject, build_report

    patch = '{"containers":[{"name":"m","env":[{"name":"HF_TOKEN","value":"hf_SECRET"}]}]}'
    obj = argo_workflow(patch + " " * 200_000, templates=300)
    outcome = decide_object(obj, POLICY, "team-b")
    subject = Subject("argoproj.io/v1alpha1", "Workflow", "team-b", "big")
    report = build_report(REPORT_APIS["wgpolicyk8s"], POLICY, subject, outcome.findings)
    text = json.dumps(report)
    assert "hf_SECRET" not in text
    assert len(text) < 1_000_000
    assert len(report["results"]) == MAX_RESULTS + 1
    assert report["results"][-1]["rule"] == "report-truncated"
    assert report["summary"]["warn"] == len(outcome.findings)


def test_a_forged_owner_reference_does_not_hide_a_pod(cluster, capsys) -> None:
    """A Pod that claims a clean Deployment as its controller is still reported: what its
    owner's template accounts for is all an owner may cover."""
    api, kubeconfig = cluster
    forged = host_path_pod()
    forged["metadata"]["namespace"] = "team-a"
    forged["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "clean",
            "uid": "uid-clean",
            "controller": True,
        }
    ]
    api.add(forged)
    run(capsys, kubeconfig)
    pods = [r for r in reports(api).values() if r["scope"]["kind"] == "Pod"]
    assert sorted((r["scope"]["namespace"], r["scope"]["name"]) for r in pods) == [
        ("team-a", "peek"),
        ("team-b", "peek"),
    ]


def test_an_incomplete_listing_prunes_nothing(cluster, capsys) -> None:
    api, kubeconfig = cluster
    run(capsys, kubeconfig)
    api.fail("/api/v1/pods", 500, times=None)
    code = main(
        [
            "audit",
            "--cluster",
            "-A",
            "-o",
            "policyreport",
            "--apply",
            "--kubeconfig",
            str(kubeconfig),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2 and "cannot list pods" in err
    assert out.strip().endswith("(pruning skipped: the audit could not read or judge everything)")
    assert len(reports(api)) == 5  # the Pod's report stays
