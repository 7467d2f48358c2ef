"""The checks, one per declared rule (``webhook.policy.rules``), in the declarations' order.

A rule's check is the module of this package named after its id (``pod-security`` is
``webhook.checks.pod_security``), which says ``RULE = "<id>"`` and defines
``check(view, policy)``. A declared rule without its module, or a module that names another
rule, refuses to load: nothing is registered twice or left out.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType

from webhook.core.findings import Violation
from webhook.core.pods import PodView
from webhook.policy.model import Policy
from webhook.policy.rules import RULES, Rule

CheckFunction = Callable[[PodView, Policy], Iterable[Violation]]


@dataclass(frozen=True, slots=True)
class Check:
    rule: str
    summary: str
    run: CheckFunction


def module_name(rule: Rule) -> str:
    return f"{__package__}.{rule.id.replace('-', '_')}"


def build(
    rules: Iterable[Rule], load: Callable[[str], ModuleType] = importlib.import_module
) -> tuple[Check, ...]:
    """The checks of ``rules``, each from its module (``load`` imports one by name)."""
    checks: list[Check] = []
    for rule in rules:
        if any(c.rule == rule.id for c in checks):
            raise RuntimeError(f"rule {rule.id!r} is declared twice")
        name = module_name(rule)
        try:
            module = load(name)
        except ModuleNotFoundError:
            raise RuntimeError(f"rule {rule.id!r} is declared but {name} is missing") from None
        if getattr(module, "RULE", None) != rule.id:
            raise RuntimeError(f"{name} must say RULE = {rule.id!r}")
        checks.append(Check(rule.id, rule.title, module.check))
    return tuple(checks)


CHECKS: tuple[Check, ...] = build(RULES)
BY_RULE = {check.rule: check for check in CHECKS}
