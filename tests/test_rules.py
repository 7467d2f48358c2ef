"""One declaration per rule (``webhook.policy.rules``): everything that names the rules reads
it. A throwaway rule, declared beside the real ones, is found in the registry, the policy
schema, the reports' severities and the README's table; without its check module, the
registry refuses to load."""

from __future__ import annotations

import types

import pytest

from tests.support.paths import REPO
from tools import sync_data
from webhook.audit import reports
from webhook.checks import registry
from webhook.cli import sarif
from webhook.policy.model import RULE_IDS, SECURITY_RULES
from webhook.policy.rules import BY_ID, RULES, Rule

THROWAWAY = Rule(
    id="throwaway-rule",
    title="A rule that exists only in this test.",
    severity="low",
    security=False,
    restricts="nothing at all",
)


def _module(rule_id: str) -> types.ModuleType:
    module = types.ModuleType(f"webhook.checks.{rule_id.replace('-', '_')}")
    module.RULE = rule_id  # type: ignore[attr-defined]
    module.check = lambda view, policy: iter(())  # type: ignore[attr-defined]
    return module


def test_the_model_and_the_registry_read_the_declarations():
    assert RULE_IDS == tuple(rule.id for rule in RULES)
    assert SECURITY_RULES == {rule.id for rule in RULES if rule.security}
    assert [(c.rule, c.summary) for c in registry.CHECKS] == [(r.id, r.title) for r in RULES]


def test_a_declared_rule_is_found_in_every_place_that_names_rules():
    rules = (*RULES, THROWAWAY)

    def load(name: str) -> types.ModuleType:
        if name == registry.module_name(THROWAWAY):
            return _module(THROWAWAY.id)
        return registry.importlib.import_module(name)

    checks = registry.build(rules, load)
    assert checks[-1].rule == THROWAWAY.id and checks[-1].summary == THROWAWAY.title
    schema = sync_data.with_rule_names(
        (REPO / "webhook/policy/data/policy.schema.json").read_text("utf-8"), rules
    )
    assert f'"{THROWAWAY.id}": {{' in schema and f'"{THROWAWAY.id}"\n' in schema
    table = sync_data.rule_table(rules)
    assert table[-1] == f"| `{THROWAWAY.id}` | GPU Pods | low | nothing at all |"


def test_a_declared_rule_without_its_module_refuses_to_load():
    with pytest.raises(RuntimeError, match="throwaway-rule.* is declared but .*missing"):
        registry.build((*RULES, THROWAWAY))


def test_a_module_naming_another_rule_refuses_to_load():
    def load(name: str) -> types.ModuleType:
        return _module("something-else") if name.endswith("throwaway_rule") else __import__(name)

    with pytest.raises(RuntimeError, match="must say RULE = 'throwaway-rule'"):
        registry.build((THROWAWAY,), load)


def test_without_its_declaration_a_rule_is_in_no_generated_place():
    rules = tuple(r for r in RULES if r.id != "topology")
    schema = sync_data.with_rule_names(
        (REPO / "webhook/policy/data/policy.schema.json").read_text("utf-8"), rules
    )
    assert '"topology"' not in schema
    assert not [line for line in sync_data.rule_table(rules) if "`topology`" in line]
    assert [c.rule for c in registry.build(rules)] == [r.id for r in rules]


def test_reports_take_the_severity_from_the_declaration(monkeypatch):
    from webhook.core.findings import Finding, Violation
    from webhook.policy.load import default_policy_path, load_policy

    monkeypatch.setitem(BY_ID, THROWAWAY.id, THROWAWAY)
    subject = types.SimpleNamespace(reference=lambda: {"kind": "Pod", "name": "p"})
    finding = Finding(Violation(THROWAWAY.id, "spec", None, "m"), "Warn")
    result = reports._result(load_policy(default_policy_path()), subject, finding)
    assert (result["rule"], result["severity"], result["category"]) == (
        THROWAWAY.id,
        "low",
        "GPU scheduling",
    )
    assert sarif.BY_RULE["pod-security"].summary == BY_ID["pod-security"].title
