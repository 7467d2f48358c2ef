"""The lint of settings per namespace where they now live, in ``tenants``: rule modes an
earlier match or an exemption keeps from applying, redundant exemptions, pools reserved only
for exempt namespaces, a reservation of a pool that does not exist or cannot be kept, node
agents denied by a tenant's rules; each names the tenants setting (and, across the old and
the new fields, both)."""

from __future__ import annotations

import pytest

from tests.support.admission import policy
from webhook.policy.load import PolicyError

TAINTED = "gpuNodeTaints: [{key: gpu, effect: NoSchedule}]\n"
POOLS = """
pools:
  - name: h100
    nodeSelector: {pool: h100}
    taints: [{key: pool, value: h100, effect: NoSchedule}]
    resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
  - name: l4
    nodeSelector: {pool: l4}
    taints: [{key: pool, value: l4, effect: NoSchedule}]
    resources: [{name: nvidia.com/gpu.shared, sharing: TimeSlicing}]
"""


def warned(spec: str) -> list[tuple[str, str]]:
    """(path, message) of each warning (not information) of a policy, but those of the old
    fields a test writes beside the new ones, which tests/test_policy_migrate.py checks."""
    return [
        (w.path, w.message)
        for w in policy(spec).warnings
        if w.level == "warning" and "moves into tenants" not in w.message
    ]


def test_tenant_rules_after_a_broader_entry_are_unreachable() -> None:
    found = warned(
        TAINTED
        + """
tenants:
  - namespaces: ["ml-*"]
    rules: {default: {gpuPods: Warn}}
  - namespaces: [ml-train]
    rules: {default: {gpuPods: Audit}}
    binder: true
"""
    )
    assert found == [
        (
            "spec.tenants[1].rules",
            "unreachable override, its rule modes never apply: tenants[0] ('ml-*') matches "
            "'ml-train' first, and the first match wins",
        )
    ]


def test_an_old_override_shadows_tenant_rules() -> None:
    found = warned(
        TAINTED
        + """
namespaceOverrides: [{namespaces: ["*"], rules: {default: {gpuPods: Warn}}}]
tenants: [{namespaces: [web, ml], rules: {default: {gpuPods: Audit}}}]
"""
    )
    assert [path for path, _ in found] == ["spec.tenants[0].rules"]
    assert "namespaceOverrides[0] ('*') matches 'web' first" in found[0][1]


def test_rules_of_namespaces_exempt_from_every_rule_are_unreachable() -> None:
    found = warned(
        TAINTED
        + """
tenants:
  - namespaces: [kube-system]
    exemptions: [{reason: the control plane}]
  - namespaces: [kube-system, web]
    rules: {default: {gpuPods: Audit}}
"""
    )
    assert found == [
        (
            "spec.tenants[1].namespaces[0]",
            "this pattern never reaches the override: tenants[0].exemptions[0] ('kube-system') "
            "exempts 'kube-system' from every rule",
        )
    ]


def test_redundant_exemptions_across_the_old_and_the_new_field() -> None:
    found = warned(
        TAINTED
        + """
exemptions: [{namespaces: ["gpu-*"]}]
tenants:
  - namespaces: [gpu-operator]
    exemptions: [{rules: [privileged], reason: the validator}]
"""
    )
    assert found == [
        (
            "spec.tenants[0].exemptions[0]",
            "redundant exemption: exemptions[0] already exempts every namespace it names "
            "(gpu-operator) from every rule, for every service account",
        )
    ]


def test_a_pool_reserved_only_for_exempt_namespaces_is_warned_where_reserved() -> None:
    found = warned(
        POOLS
        + """
tenants:
  - namespaces: [kube-system]
    reservedPools: [l4, h100]
    exemptions: [{rules: [pool-access], reason: node agents}]
"""
    )
    assert [path for path, _ in found] == [
        "spec.tenants[0].reservedPools[1]",
        "spec.tenants[0].reservedPools[0]",
    ]
    assert found[0][1].startswith("pool 'h100' is reserved only for namespaces exempt")


def test_tenant_rules_that_deny_node_agents_are_warned() -> None:
    found = warned(
        TAINTED
        + """
rules: {default: {gpuPods: Warn}}
tenants: [{namespaces: [a], rules: {default: {gpuPods: Enforce}}}]
"""
    )
    [(path, message)] = found
    assert path == "spec.tenants[0].rules"
    assert message.startswith("reachablePods is unset, so it follows gpuPods")


def test_each_exemption_says_whom_it_trusts() -> None:
    notes = [
        (w.path, w.message)
        for w in policy(
            TAINTED
            + """
tenants:
  - namespaces: [monitoring]
    exemptions: [{serviceAccounts: [node-exporter], rules: [host-devices], reason: x}]
"""
        ).warnings
        if w.level == "info"
    ]
    assert notes == [
        (
            "spec.tenants[0].exemptions[0]",
            "exempts namespaces monitoring from host-devices: it trusts everyone who may create "
            "Pods there that run as node-exporter; delete the names you do not use and keep "
            "tenants from creating namespaces with these names",
        )
    ]


def test_a_reservation_of_no_pool_is_refused_with_the_closest_name() -> None:
    with pytest.raises(PolicyError) as raised:
        policy(POOLS + "tenants: [{namespaces: [ml], reservedPools: [h10]}]\n")
    [error] = raised.value.errors
    assert error.endswith(
        "spec.tenants[0].reservedPools[0]: no pool is named 'h10' (did you mean 'h100'?); "
        "declared pools: h100, l4"
    )


def test_a_pool_reserved_in_tenants_needs_a_label_of_its_own() -> None:
    same_labels = POOLS.replace("nodeSelector: {pool: l4}", "nodeSelector: {pool: h100}")
    with pytest.raises(PolicyError) as raised:
        policy(same_labels + "tenants: [{namespaces: [ml], reservedPools: [l4]}]\n")
    [error] = raised.value.errors
    assert "spec.pools[1].nodeSelector: pool 'l4' is reserved for some namespaces" in error


@pytest.mark.parametrize(
    "setting",
    [
        "reservedPools: [h100]",
        "binder: true",
        "exemptions: [{reason: agents}]",
        "rules: {default: {gpuPods: Warn}}",
    ],
)
def test_what_opens_something_is_never_selected_by_namespace_label(setting: str) -> None:
    """Whoever may label a namespace would give it a pool, node binding, an exemption or
    looser rule modes: these need the namespaces named."""
    field = setting.split(":")[0]
    with pytest.raises(PolicyError) as raised:
        policy(POOLS + f"tenants: [{{namespaceSelector: {{matchLabels: {{a: b}}}}, {setting}}}]\n")
    [error] = raised.value.errors
    assert f"spec.tenants[0].{field}: {field} needs namespaces named (namespaces)" in error
