"""One source for every data file: the copies outside the package are what ``make sync-data``
generates from ``webhook/policy/data``, and every ``$schema`` comment points at a real file."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import webhook
from tests.support.paths import REPO
from tools import sync_data

SCHEMA_COMMENT = re.compile(r"^# yaml-language-server: \$schema=(\S+)$", re.M)
SKIPPED_DIRS = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache"}


def test_every_copy_is_what_the_generator_makes() -> None:
    assert sync_data.drifted() == [], "run `make sync-data` and commit the result"


def test_the_check_fails_on_a_copy_edited_by_hand(tmp_path: Path) -> None:
    for path in sync_data.expected_files():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / path, target)
    assert sync_data.drifted(tmp_path) == []
    assert (tmp_path / "policies/default.yaml").read_bytes() == (
        webhook.default_policy_path().read_bytes()
    )
    edited = tmp_path / "manifests/base/policy.yaml"
    edited.write_text(edited.read_text().replace("maxPerPod: 8", "maxPerPod: 4"))
    (tmp_path / "policies/policy.schema.json").unlink()
    assert sync_data.drifted(tmp_path) == [
        Path("policies/policy.schema.json"),
        Path("manifests/base/policy.yaml"),
    ]


def test_the_check_command_exits_zero_on_this_tree() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tools.sync_data", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (result.returncode, result.stderr) == (0, "")


def test_copies_of_the_default_policy_are_the_packaged_policy() -> None:
    packaged = yaml.safe_load(webhook.default_policy_path().read_text())
    for copy in ("policies/default.yaml", "manifests/base/policy.yaml"):
        assert yaml.safe_load((REPO / copy).read_text()) == packaged, copy


def test_the_audit_rollout_differs_from_the_default_only_where_it_says() -> None:
    default = yaml.safe_load(webhook.default_policy_path().read_text())
    for copy in ("policies/examples/audit-rollout.yaml", "manifests/overlays/audit/policy.yaml"):
        audit = yaml.safe_load((REPO / copy).read_text())
        assert audit["metadata"]["name"] == "audit-rollout"
        assert audit["spec"].pop("mutation") == {"enabled": True, "mode": "Record"}
        assert audit["spec"].pop("rules") == {
            "default": {"gpuPods": "Audit", "reachablePods": "Audit", "otherPods": "Audit"}
        }
        expected = dict(default["spec"])
        del expected["mutation"], expected["rules"]
        assert audit["spec"] == expected, copy
        policy = webhook.load_policy(REPO / copy)
        assert {modes.gpu_pods for modes in policy.rules.values()} == {"Audit"}
        assert {modes.for_scope("reachablePods") for modes in policy.rules.values()} == {"Audit"}


def test_a_long_override_value_stays_whole_on_one_line() -> None:
    description = " and ".join(["a description longer than the width PyYAML folds at"] * 3)
    override = sync_data.Override("# header\n", "long", description, {})
    derived = sync_data.derive(webhook.default_policy_path().read_text(), override)
    assert yaml.safe_load(derived)["metadata"]["description"] == description
    assert f"  description: {description}\n" in derived


def test_an_override_of_a_missing_field_is_refused() -> None:
    override = sync_data.Override("# header\n", "x", "y", {("spec", "nowhere"): "z"})
    with pytest.raises(sync_data.SyncError, match="spec.nowhere: not in the source policy"):
        sync_data.derive(webhook.default_policy_path().read_text(), override)


def _yaml_files() -> list[Path]:
    found = []
    for path in REPO.rglob("*"):
        if SKIPPED_DIRS & set(path.relative_to(REPO).parts):
            continue
        if path.suffix in (".yaml", ".yml") and path.is_file():
            found.append(path)
    return found


def test_every_schema_comment_points_at_a_real_file() -> None:
    pointing = {}
    for path in _yaml_files():
        match = SCHEMA_COMMENT.search(path.read_text("utf-8"))
        if match:
            pointing[path.relative_to(REPO)] = match[1]
    assert Path("manifests/base/policy.yaml") in pointing
    broken = {p: s for p, s in pointing.items() if not (REPO / p).parent.joinpath(s).is_file()}
    assert broken == {}


def test_the_schema_names_exactly_the_registered_rules() -> None:
    # Rule ids live in RULE_IDS (and the registry refuses checks that disagree with it); the
    # schema repeats them for editors, in the rules map and in exemptions' rule lists.
    from webhook.checks.registry import CHECKS
    from webhook.policy.load import schema
    from webhook.policy.model import RULE_IDS

    policy_schema = schema()
    spec = policy_schema["properties"]["spec"]["properties"]
    assert spec["rules"] == {"$ref": "#/$defs/ruleSet"}
    rule_map = policy_schema["$defs"]["ruleSet"]["properties"]
    exemption_rules = spec["exemptions"]["items"]["properties"]["rules"]["items"]["enum"]
    assert tuple(c.rule for c in CHECKS) == RULE_IDS
    assert set(rule_map) - {"default"} == set(RULE_IDS)
    assert exemption_rules == list(RULE_IDS)
