"""The vendored policy-report CRDs (manifests/crds) and their schemas (tests/schemas): both
copies are the same schema, each CRD is a valid CRD naming its source, and a minimal report
of each kind is valid against it (Draft 7, as tests/test_chart.py validates custom resources)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.support.paths import REPO
from tests.test_chart import CRD_SCHEMAS, K8S_VERSION, undeclared

CRDS = REPO / "manifests" / "crds"
SOURCE_LINE = re.compile(
    r"^# Vendored unchanged from (?P<repo>github\.com/\S+) (?P<path>\S+)"
    r" at (?P<commit>[0-9a-f]{40})"
)
# (CRD file, group, Kind, version, namespaced)
REPORTS = [
    ("wgpolicyk8s.io_policyreports.yaml", "wgpolicyk8s.io", "PolicyReport", "v1alpha2", True),
    (
        "wgpolicyk8s.io_clusterpolicyreports.yaml",
        "wgpolicyk8s.io",
        "ClusterPolicyReport",
        "v1alpha2",
        False,
    ),
    ("openreports.io_reports.yaml", "openreports.io", "Report", "v1alpha1", True),
    ("openreports.io_clusterreports.yaml", "openreports.io", "ClusterReport", "v1alpha1", False),
]
IDS = [kind for _, _, kind, _, _ in REPORTS]


def crd(file: str) -> dict[str, Any]:
    [document] = [d for d in yaml.safe_load_all((CRDS / file).read_text("utf-8")) if d]
    return document


def schema_file(group: str, kind: str, version: str) -> Path:
    return CRD_SCHEMAS / f"{group}_{kind}_{version}.json"


def minimal_report(group: str, kind: str, version: str, namespaced: bool) -> dict[str, Any]:
    metadata = {"name": "gpu-admission-trainer"}
    scope = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "trainer"}
    if namespaced:
        metadata["namespace"] = scope["namespace"] = "ml"
    return {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": metadata,
        "scope": scope,
        "summary": {"pass": 0, "fail": 1, "warn": 0, "error": 0, "skip": 0},
        "results": [
            {
                "policy": "gpu-admission",
                "rule": "host-access",
                "result": "fail",
                "severity": "high",
                "source": "gpu-admission",
                "message": "privileged containers may reach every GPU on the node",
                "scored": True,
                "timestamp": {"seconds": 1767225600, "nanos": 0},
                "properties": {"path": "spec.template.spec.containers[0].securityContext"},
            }
        ],
    }


@pytest.mark.parametrize(("file", "group", "kind", "version", "namespaced"), REPORTS, ids=IDS)
def test_the_vendored_crd_is_valid_and_serves_one_version(
    file: str, group: str, kind: str, version: str, namespaced: bool
) -> None:
    definition = crd(file)
    kubernetes_validate.validate(definition, K8S_VERSION, strict=True)
    spec = definition["spec"]
    assert (spec["group"], spec["names"]["kind"]) == (group, kind)
    assert spec["scope"] == ("Namespaced" if namespaced else "Cluster")
    served = [(v["name"], v["storage"]) for v in spec["versions"] if v["served"]]
    assert served == [(version, True)]


@pytest.mark.parametrize(("file", "group", "kind", "version", "namespaced"), REPORTS, ids=IDS)
def test_the_vendored_schema_is_the_one_in_the_crd(
    file: str, group: str, kind: str, version: str, namespaced: bool
) -> None:
    [served] = [v for v in crd(file)["spec"]["versions"] if v["name"] == version]
    path = schema_file(group, kind, version)
    vendored = json.loads(path.read_text("utf-8"))
    assert vendored == served["schema"]["openAPIV3Schema"]
    # ... and in the format of tests/schemas (SOURCES.md), byte for byte.
    assert path.read_text("utf-8") == json.dumps(vendored, indent=1, sort_keys=True) + "\n"


@pytest.mark.parametrize(("file", "group", "kind", "version", "namespaced"), REPORTS, ids=IDS)
def test_the_first_line_of_the_crd_and_sources_md_name_the_same_source(
    file: str, group: str, kind: str, version: str, namespaced: bool
) -> None:
    match = SOURCE_LINE.match((CRDS / file).read_text("utf-8"))
    assert match, "the first line names the repository, path and commit"
    row = f"| {schema_file(group, kind, version).name} | {match['repo']} | {match['path']} | "
    rows = (CRD_SCHEMAS / "SOURCES.md").read_text("utf-8").splitlines()
    assert any(r.startswith(row + match["commit"]) for r in rows), row


@pytest.mark.parametrize(("file", "group", "kind", "version", "namespaced"), REPORTS, ids=IDS)
def test_a_minimal_report_is_valid_and_a_broken_one_is_not(
    file: str, group: str, kind: str, version: str, namespaced: bool
) -> None:
    schema = json.loads(schema_file(group, kind, version).read_text("utf-8"))
    report = minimal_report(group, kind, version, namespaced)
    validator = jsonschema.Draft7Validator(schema)
    assert [e.message for e in validator.iter_errors(report)] == []
    assert undeclared(report, schema) == []

    broken = copy.deepcopy(report)
    del broken["results"][0]["policy"]
    broken["results"][0]["result"] = "failed"
    broken["results"][0]["resultz"] = "typo"
    assert sorted(e.message for e in validator.iter_errors(broken)) == [
        "'failed' is not one of ['pass', 'fail', 'warn', 'error', 'skip']",
        "'policy' is a required property",
    ]
    assert undeclared(broken, schema) == ["results[0].resultz"]
