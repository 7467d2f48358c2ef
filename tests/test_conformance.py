"""Every real manifest of the conformance corpus, reviewed under the default and strict policies,
gets the verdict and rule ids the conformance table writes down for it."""

from __future__ import annotations

import pytest

import webhook
from tests.conformance.corpus import (
    CORPUS,
    POLICIES,
    admission_review,
    documents,
    judge,
    load_table,
    requires_corpus,
)

pytestmark = requires_corpus

TABLE = load_table()["files"]


def test_the_table_covers_every_file_of_the_corpus() -> None:
    assert CORPUS.is_dir(), f"conformance corpus missing at {CORPUS}"
    assert sorted(TABLE) == sorted(
        p.name for p in CORPUS.iterdir() if p.suffix in (".yaml", ".yml")
    )


@pytest.mark.parametrize("policy_name", sorted(POLICIES))
@pytest.mark.parametrize("file_name", sorted(TABLE))
def test_verdict_and_rules_match_the_table(file_name: str, policy_name: str) -> None:
    row = TABLE[file_name]
    assert judge(file_name, row["namespace"], policy_name) == row[policy_name], row["why"]


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
