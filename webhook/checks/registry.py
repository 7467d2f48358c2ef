"""The one place where checks are registered. Rule ids are unique and stable: they appear in
policies, metrics, logs and tests, so they never change once released."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from webhook.checks import (
    daemonset_tolerations,
    device_visibility,
    gpu_quantity,
    host_access,
    host_devices,
    pod_security,
    pool_access,
    privileged,
    resource_name,
    sharing_mode,
    topology,
)
from webhook.core.findings import Violation
from webhook.core.pods import PodView
from webhook.policy.model import RULE_IDS, Policy

CheckFunction = Callable[[PodView, Policy], Iterable[Violation]]


@dataclass(frozen=True, slots=True)
class Check:
    rule: str
    summary: str
    run: CheckFunction


def _register(*modules) -> tuple[Check, ...]:
    checks: list[Check] = []
    for module in modules:
        if any(c.rule == module.RULE for c in checks):
            raise RuntimeError(f"duplicate check id {module.RULE!r}")
        checks.append(Check(module.RULE, module.__doc__.strip().splitlines()[0], module.check))
    if tuple(c.rule for c in checks) != RULE_IDS:
        raise RuntimeError("the registered checks and model.RULE_IDS disagree")
    return tuple(checks)


CHECKS: tuple[Check, ...] = _register(
    gpu_quantity,
    resource_name,
    privileged,
    host_devices,
    device_visibility,
    host_access,
    pod_security,
    sharing_mode,
    pool_access,
    topology,
    daemonset_tolerations,
)
BY_RULE = {check.rule: check for check in CHECKS}
