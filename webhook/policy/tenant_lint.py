"""Errors in what the policy says of tenants and of exceptions for one workload: what the
schema cannot see (a duplicate exception name, a date past what the policy can hold, a
selector that matches every unlabelled Pod, a preference for a pool that does not exist).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from webhook.policy.compile import expiry

Report = Callable[[list[Any], str], None]

# Rules no exception may lift, and why.
UNEXCEPTED_RULES = {
    "gpu-quantity": "cannot be excepted: the API server refuses those quantities itself",
    "pool-access": "cannot be excepted: a pool reserved for other namespaces stays theirs "
    "(grant the namespace access to the pool instead)",
}


def tenant_errors(spec: dict[str, Any], err: Report) -> None:
    exception_names: set[str] = set()
    for i, exception in enumerate(spec.get("exceptions", [])):
        path = ["spec", "exceptions", i]
        if exception["name"] in exception_names:
            err([*path, "name"], f"duplicate exception {exception['name']!r}")
        exception_names.add(exception["name"])
        try:
            expiry(exception["expires"])
        except (ValueError, OverflowError) as exc:
            err([*path, "expires"], f"not a date or time this policy can hold: {exc}")
        _lint_exception_match(exception["match"], [*path, "match"], err)
        for rule, why in UNEXCEPTED_RULES.items():
            if rule in exception["rules"]:
                err([*path, "rules", exception["rules"].index(rule)], f"{rule} {why}")

    pool_names = [pool["name"] for pool in spec.get("pools", [])]
    for i, tenant in enumerate(spec.get("tenants", [])):
        _lint_namespaces(tenant, ["spec", "tenants", i], err)
        for j, name in enumerate(tenant.get("poolPreference", [])):
            if name not in pool_names:
                close = difflib.get_close_matches(name, pool_names, 1, 0.5)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                err(
                    ["spec", "tenants", i, "poolPreference", j],
                    f"no pool is named {name!r}{hint}; declared pools: "
                    + (", ".join(pool_names) or "none"),
                )


# What only an entry that names its namespaces may say: each opens something (a grant, a pool,
# an exemption), and whoever may label a namespace would open it for themselves.
NAMED_ONLY = ("grants", "poolPreference")


def _lint_namespaces(tenant: dict[str, Any], path: list[Any], err: Report) -> None:
    """An entry names its namespaces or selects them by label, one of the two; selected ones
    are given entitlements and requirements only."""
    if "namespaces" in tenant and "namespaceSelector" in tenant:
        err([*path, "namespaceSelector"], "give namespaces or namespaceSelector, not both")
    elif "namespaces" not in tenant and "namespaceSelector" not in tenant:
        err(path, "an entry needs namespaces (names or globs) or a namespaceSelector")
    if "namespaceSelector" not in tenant:
        return
    for key in NAMED_ONLY:
        if key in tenant:
            err(
                [*path, key],
                f"{key} needs namespaces named (namespaces), not selected by label: whoever "
                "may label a namespace would give it to themselves; a namespaceSelector "
                "selects entitlements and requirements only",
            )
    selector = tenant["namespaceSelector"]
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        err(
            [*path, "namespaceSelector"],
            "this selector reads no label, so the inventory keeps none and it selects no "
            "namespace; name every namespace with namespaces: ['*'] instead",
        )
    for k, expr in enumerate(selector.get("matchExpressions", [])):
        lint_expression(expr, [*path, "namespaceSelector", "matchExpressions", k], err)


def _lint_exception_match(match: dict[str, Any], path: list[Any], err: Report) -> None:
    """An exception's selector says as Kubernetes would which labels it needs, and needs one:
    a selector that matches Pods without labels (empty, only NotIn or DoesNotExist) would
    except every unlabelled Pod of the namespace, an exemption in disguise."""
    selector = match.get("selector")
    if selector is None:
        return
    expressions = selector.get("matchExpressions", [])
    for k, expr in enumerate(expressions):
        lint_expression(expr, [*path, "selector", "matchExpressions", k], err)
    if not selector.get("matchLabels") and not any(
        e["operator"] in ("In", "Exists") for e in expressions
    ):
        err(
            [*path, "selector"],
            "this selector matches Pods that carry no label at all, so it would except every "
            "such Pod of the namespace: require a label (matchLabels, In or Exists), or use an "
            "exemption if the whole namespace is meant",
        )


def lint_expression(expr: dict[str, Any], path: list[Any], err: Report) -> None:
    operator, values = expr["operator"], expr.get("values")
    if operator in ("In", "NotIn") and not values:
        err(path, f"operator {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        err(path, f"operator {operator} takes no values")
    if operator in ("Gt", "Lt") and (not values or len(values) != 1 or not values[0].isdigit()):
        err(path, f"operator {operator} takes exactly one integer value")
