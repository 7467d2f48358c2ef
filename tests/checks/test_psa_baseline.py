"""Kubernetes' own Pod Security baseline fixtures (v1.37, kubernetes/pod-security-admission
``test/testdata/baseline/v1.37``, copied verbatim into ../shared/conformance/psa-baseline with
their SOURCES.md), each given the GPU taint's toleration so that it can reach a GPU node, and
judged under strict.yaml with its grants and allow-list emptied: every Pod the baseline refuses
has a finding of pod-security, privileged, host-access or host-devices that names the
baseline's control, and every Pod it admits has none from those rules.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import pytest
import yaml

import webhook
from tests.support.admission import REPO, admission

FIXTURES = REPO.parent / "shared" / "conformance" / "psa-baseline" / "v1.37"
requires_fixtures = pytest.mark.skipif(
    not FIXTURES.is_dir() and not os.environ.get("CI"),
    reason=f"the Pod Security fixtures are not at {FIXTURES}",
)
BASELINE_RULES = {"pod-security", "privileged", "host-access", "host-devices"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# The fixture's name, before its number, and the control the baseline names it by.
CONTROLS = {
    "apparmorprofile": "AppArmor",
    "capabilities_baseline": "Capabilities",
    "hostnamespaces": "Host Namespaces",
    "hostpathvolumes": "HostPath Volumes",
    "hostports": "Host Ports",
    "hostprobesandhostlifecycle": "Host Probes / Lifecycle Hooks",
    "privileged": "Privileged Containers",
    "procmount": "/proc Mount Type",
    "seccompprofile_baseline": "Seccomp",
    "selinuxoptions": "SELinux",
    "sysctls": "Sysctls",
    "windowshostprocess": "HostProcess",
}


@cache
def strict_without_grants() -> webhook.Policy:
    text = (REPO / "policies" / "examples" / "strict.yaml").read_text("utf-8")
    document = yaml.safe_load(text)
    document["spec"]["tenants"] = []
    document["spec"]["hostDevices"]["allowedPaths"] = []
    return webhook.parse_policy(yaml.safe_dump(document), source="strict-without-grants")


def fixtures(outcome: str) -> list[Path]:
    return sorted((FIXTURES / outcome).glob("*.yaml")) if FIXTURES.is_dir() else []


def judged(path: Path) -> webhook.Decision:
    obj = yaml.safe_load(path.read_text("utf-8"))
    obj["spec"].setdefault("tolerations", []).append(GPU_TOLERATION)
    review = admission(obj, namespace="tenant")
    return webhook.decide(review, strict_without_grants(), mutate=False)


@requires_fixtures
def test_the_fixtures_are_there():
    assert len(fixtures("fail")) == 34 and len(fixtures("pass")) == 15


@requires_fixtures
@pytest.mark.parametrize("path", fixtures("fail"), ids=lambda p: p.stem)
def test_every_pod_the_baseline_refuses_has_a_finding_naming_its_control(path: Path):
    control = CONTROLS[path.stem.rstrip("0123456789")]
    findings = [f for f in judged(path).findings if f.rule in BASELINE_RULES]
    assert findings, path.name
    named = [f for f in findings if f"(Pod Security baseline: {control})" in f.violation.message]
    assert named, [f.violation.message for f in findings]
    assert all(f.mode == "Enforce" for f in named)


@requires_fixtures
@pytest.mark.parametrize("path", fixtures("pass"), ids=lambda p: p.stem)
def test_every_pod_the_baseline_admits_has_no_finding_of_its_rules(path: Path):
    findings = [f for f in judged(path).findings if f.rule in BASELINE_RULES]
    assert findings == [], [f.violation.render() for f in findings]
