"""Every real manifest of the conformance corpus, reviewed under the default and strict policies,
gets the verdict and rule ids the conformance table writes down for it; the Kueue and KAI
manifests of the governance corpus likewise under the default policy and one that requires a
queue (the governance table); the DRA manifests under the default and strict policies (the DRA
table)."""

from __future__ import annotations

import pytest

import webhook
from tests.conformance.corpus import (
    CORPUS,
    DRA,
    DRA_TABLE,
    GOVERNANCE,
    GOVERNANCE_POLICIES,
    GOVERNANCE_TABLE,
    POLICIES,
    admission_review,
    documents,
    dra_files,
    governance_files,
    judge,
    load_table,
    policy,
    requires_corpus,
    requires_dra,
    requires_governance,
)
from webhook.admission.objects import decide_object

TABLE = load_table()["files"]
GOVERNED = load_table(GOVERNANCE_TABLE)["files"]
DRA_ROWS = load_table(DRA_TABLE)["files"]


@requires_corpus
def test_the_table_covers_every_file_of_the_corpus() -> None:
    assert CORPUS.is_dir(), f"conformance corpus missing at {CORPUS}"
    assert sorted(TABLE) == sorted(
        p.name for p in CORPUS.iterdir() if p.suffix in (".yaml", ".yml")
    )


@requires_corpus
@pytest.mark.parametrize("policy_name", sorted(POLICIES))
@pytest.mark.parametrize("file_name", sorted(TABLE))
def test_verdict_and_rules_match_the_table(file_name: str, policy_name: str) -> None:
    row = TABLE[file_name]
    assert judge(file_name, row["namespace"], policy_name) == row[policy_name], row["why"]


@requires_corpus
@pytest.mark.parametrize("file_name", sorted(TABLE))
def test_the_mutate_path_handles_every_file(file_name: str) -> None:
    policy = webhook.load_policy(POLICIES["default"])
    for obj in documents(file_name):
        response = webhook.review(
            admission_review(obj, TABLE[file_name]["namespace"]), policy, mutate=True
        )["response"]
        assert response["uid"] == "conformance"
        # The mutate path only ever denies what the API server would reject anyway.
        if not response["allowed"]:
            assert "gpu-quantity" in TABLE[file_name]["default"].get("denied", [])


@requires_dra
def test_the_dra_table_covers_every_file_of_the_dra_corpus() -> None:
    assert DRA.is_dir(), f"DRA corpus missing at {DRA}"
    assert sorted(DRA_ROWS) == dra_files()


@requires_dra
@pytest.mark.parametrize("policy_name", sorted(POLICIES))
@pytest.mark.parametrize("file_name", sorted(DRA_ROWS))
def test_dra_verdicts_match_the_table(file_name: str, policy_name: str) -> None:
    row = DRA_ROWS[file_name]
    assert judge(file_name, row["namespace"], policy_name, DRA) == row[policy_name], row["why"]


def test_nvidias_quickstarts_are_admitted_under_the_default_policy_or_say_why_not() -> None:
    for name, row in DRA_ROWS.items():
        if name.startswith("dra-driver-nvidia-gpu__quickstart") and row["default"].get("denied"):
            assert "denied" in row["why"], name


@requires_governance
def test_the_governance_table_covers_every_kueue_and_kai_manifest() -> None:
    assert GOVERNANCE.is_dir(), f"governance corpus missing at {GOVERNANCE}"
    assert sorted(GOVERNED) == governance_files()


@requires_governance
@pytest.mark.parametrize("policy_name", sorted(GOVERNANCE_POLICIES))
@pytest.mark.parametrize("file_name", sorted(GOVERNED))
def test_governance_verdicts_match_the_table(file_name: str, policy_name: str) -> None:
    row = GOVERNED[file_name]
    assert judge(file_name, row["namespace"], policy_name, GOVERNANCE) == row[policy_name], row[
        "why"
    ]


def _found(outcome: dict) -> set[tuple[str, str]]:
    return {
        (mode, rule) for mode in ("denied", "warned", "audited") for rule in outcome.get(mode, [])
    }


def test_the_queue_policy_adds_only_queue_findings_to_the_default_verdicts() -> None:
    for row in GOVERNED.values():
        assert "queue" not in {rule for _, rule in _found(row["default"])}, row["why"]
        added = _found(row["queues"]) - _found(row["default"])
        assert {rule for _, rule in added} <= {"queue"}, row["why"]
    assert any(("denied", "queue") in _found(row["queues"]) for row in GOVERNED.values())


@requires_corpus
def test_the_queue_policy_asks_the_corpus_gpu_workloads_and_never_node_agents() -> None:
    # Every file reviewed in a namespace whose tenant must queue its GPU workloads: the real
    # GPU workloads without a queue are asked, a DaemonSet never (its Pods run on every node),
    # and nothing a controller made.
    queues = policy("queues")
    asked: set[str] = set()
    for name in TABLE:
        for obj in documents(name):
            outcome = decide_object(obj, queues, "ml", override=True)
            if "queue" in {f.rule for f in outcome.findings}:
                asked.add(obj["kind"])
            made = decide_object(obj, queues, "ml", override=True, made_by_controller=True)
            assert "queue" not in {f.rule for f in made.findings}, name
    assert "DaemonSet" not in asked
    assert {"Pod", "Job", "Deployment", "PyTorchJob", "LeaderWorkerSet", "RayJob"} <= asked
