"""The conformance corpus (real manifests in ../shared/conformance/manifests) and its table.

``expectations.yaml`` says, per file, the namespace it is reviewed in and the expected verdict
and rule ids under each policy. The engine tests and the CLI tests both read it.
``governance.yaml`` says the same of the Kueue and KAI manifests of
../shared/conformance/governance, under the default policy and under one that requires a queue
(``policies/examples/queues.yaml``); ``dra.yaml`` of the DRA manifests of
../shared/conformance/dra, under the default and strict policies.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import pytest
import yaml

import webhook
from tests.support.paths import REPO, SHARED
from webhook.admission.objects import decide_object

CORPUS = SHARED / "conformance" / "manifests"
TABLE = Path(__file__).with_name("expectations.yaml")
# The corpus lies beside the repository in development and CI, not in a bare clone: there
# its tests are skipped, and `make test` still passes. CI always has it, so under CI a missing
# corpus fails these tests instead of skipping them.
requires_corpus = pytest.mark.skipif(
    not CORPUS.is_dir() and not os.environ.get("CI"),
    reason=f"the conformance corpus is not at {CORPUS}",
)
POLICIES = {
    "default": REPO / "policies" / "default.yaml",
    "strict": REPO / "policies" / "examples" / "strict.yaml",
}
GOVERNANCE = SHARED / "conformance" / "governance"
GOVERNANCE_TABLE = Path(__file__).with_name("governance.yaml")
GOVERNANCE_POLICIES = {
    "default": POLICIES["default"],
    "queues": REPO / "policies" / "examples" / "queues.yaml",
}
# The governance corpus' Kueue and KAI manifests (its RuntimeClasses, quotas and Volcano
# queues are other tables').
GOVERNANCE_SOURCES = ("kueue__", "kai-scheduler__")
DRA = SHARED / "conformance" / "dra"
DRA_TABLE = Path(__file__).with_name("dra.yaml")
requires_dra = pytest.mark.skipif(
    not DRA.is_dir() and not os.environ.get("CI"),
    reason=f"the DRA corpus is not at {DRA}",
)
requires_governance = pytest.mark.skipif(
    not GOVERNANCE.is_dir() and not os.environ.get("CI"),
    reason=f"the governance corpus is not at {GOVERNANCE}",
)


@cache
def policy(name: str) -> webhook.Policy:
    return webhook.load_policy({**POLICIES, **GOVERNANCE_POLICIES}[name])


def load_table(path: Path = TABLE) -> dict:
    return yaml.safe_load(path.read_text("utf-8"))


def dra_files() -> list[str]:
    return sorted(p.name for p in DRA.iterdir() if p.suffix in (".yaml", ".yml"))


def governance_files() -> list[str]:
    return sorted(p.name for p in GOVERNANCE.iterdir() if p.name.startswith(GOVERNANCE_SOURCES))


def documents(file_name: str, corpus: Path = CORPUS) -> list[dict]:
    return [d for d in yaml.safe_load_all((corpus / file_name).read_text("utf-8")) if d]


def admission_review(obj: dict, namespace: str, uid: str = "conformance") -> dict:
    group, _, version = obj.get("apiVersion", "").rpartition("/")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": obj.get("kind", "")},
            "operation": "CREATE",
            "namespace": namespace,
            "object": obj,
        },
    }


def judge(file_name: str, namespace: str, policy_name: str, corpus: Path = CORPUS) -> dict:
    """The verdict on a file: denied if any document is, with the rule ids by mode. A Pod is
    judged as the API server would pass it to the validating webhook: mutated; as a file, it
    was sent by a user (no controller)."""
    outcome: dict[str, set[str]] = {"denied": set(), "warned": set(), "audited": set()}
    allowed = True
    for obj in documents(file_name, corpus):
        decision = decide_object(obj, policy(policy_name), namespace, override=True)
        allowed = allowed and decision.allowed
        for finding in decision.findings:
            bucket = {"Enforce": "denied", "Warn": "warned", "Audit": "audited"}[finding.mode]
            outcome[bucket].add(finding.rule)
    result: dict = {"verdict": "allowed" if allowed else "denied"}
    result.update({k: sorted(v) for k, v in outcome.items() if v})
    return result
