"""Tenants selected by namespace label (issue 34): with the node inventory's watch on
Namespaces, ``tenants[].namespaceSelector`` gives the namespaces it selects entitlements (and
requirements); a namespace the inventory does not know, or a decision without an inventory, is
judged by the entries that name namespaces only; grants and pool preferences need namespaces
named (whoever may label a namespace would take them)."""

from __future__ import annotations

from typing import Any

import pytest

import webhook
from tests.support.admission import admission, container, pod, policy, status_message
from webhook.core.inventory import NodeFields, NodeSnapshot
from webhook.policy.load import PolicyError

MIG = "nvidia.com/mig-1g.10gb"
SPEC = """
newChecks: Enforce
gpuNodeTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
resources:
  - {name: nvidia.com/gpu, sharing: Exclusive}
  - {name: nvidia.com/mig-1g.10gb, sharing: MIG}
tenants:
  - namespaceSelector:
      matchLabels: {example.com/gpu-tier: inference}
      matchExpressions: [{key: example.com/legacy, operator: DoesNotExist}]
    contact: "#gpu-platform"
    entitlements: {resources: [nvidia.com/mig-1g.10gb]}
  - namespaces: [batch-*]
    entitlements: {maxGPUsPerPod: 1}
"""
SELECTED = policy(SPEC, name="selected")


def snapshot(namespaces: dict[str, dict[str, str]], fields: NodeFields | None = None):
    return NodeSnapshot({}, fields or NodeFields.of(SELECTED), namespaces)


def judge(obj: dict, namespace: str, nodes: NodeSnapshot | None) -> webhook.Decision:
    return webhook.decide(admission(obj, namespace=namespace), SELECTED, mutate=False, nodes=nodes)


INFERENCE = {"example.com/gpu-tier": "inference"}


def test_the_policy_keeps_the_label_keys_its_tenants_select_by() -> None:
    assert SELECTED.namespace_label_keys == {"example.com/gpu-tier", "example.com/legacy"}
    assert NodeFields.of(SELECTED).namespace_label_keys == SELECTED.namespace_label_keys


def test_a_namespace_selected_by_its_labels_gets_the_entitlements() -> None:
    decision = judge(pod(container(gpu=1)), "vision", snapshot({"vision": INFERENCE}))
    assert not decision.allowed
    message = status_message(decision)
    assert 'namespace "vision" may not use nvidia.com/gpu' in message
    assert (
        "tenants[0].entitlements (namespaces selected by "
        "example.com/gpu-tier=inference,!example.com/legacy)" in message
    )
    assert judge(pod(container(gpu=1, resource=MIG)), "vision", snapshot({"vision": INFERENCE}))


@pytest.mark.parametrize(
    "namespaces",
    [
        {"vision": {"example.com/gpu-tier": "training"}},
        {"vision": {**INFERENCE, "example.com/legacy": "true"}},
        {},
    ],
    ids=["another label", "an expression fails", "not known"],
)
def test_a_namespace_not_selected_or_not_known_is_judged_by_name(
    namespaces: dict[str, Any],
) -> None:
    assert judge(pod(container(gpu=1)), "vision", snapshot(namespaces)).allowed


def test_without_an_inventory_only_named_entries_apply() -> None:
    assert judge(pod(container(gpu=1)), "vision", None).allowed
    assert not judge(pod(container(gpu=2)), "batch-1", None).allowed


def test_a_snapshot_kept_without_the_namespace_label_keys_is_not_read() -> None:
    fields = NodeFields(frozenset(), ("nvidia.com",))
    stale = snapshot({"vision": INFERENCE}, fields)
    assert not stale.covers(SELECTED)
    assert judge(pod(container(gpu=1)), "vision", stale).allowed


@pytest.mark.parametrize(
    "entry, says",
    [
        (
            "{namespaceSelector: {matchLabels: {a: b}}, grants: {hostIPC: true}}",
            "grants needs namespaces named (namespaces), not selected by label",
        ),
        (
            "{namespaceSelector: {matchLabels: {a: b}}, poolPreference: [p]}",
            "poolPreference needs namespaces named",
        ),
        (
            "{namespaces: [a], namespaceSelector: {matchLabels: {a: b}}, contact: x, "
            "entitlements: {maxGPUsPerPod: 1}}",
            "give namespaces or namespaceSelector, not both",
        ),
        (
            "{contact: x, entitlements: {maxGPUsPerPod: 1}}",
            "an entry needs namespaces (names or globs) or a namespaceSelector",
        ),
        (
            "{namespaceSelector: {matchExpressions: [{key: a, operator: In}]}, "
            "entitlements: {maxGPUsPerPod: 1}}",
            "operator In needs at least one value",
        ),
        (
            "{namespaceSelector: {matchLabels: {}}, entitlements: {maxGPUsPerPod: 1}}",
            "this selector reads no label",
        ),
    ],
    ids=["grants", "pool preference", "both", "neither", "bad expression", "no label"],
)
def test_what_a_selected_entry_may_not_say_is_refused(entry: str, says: str) -> None:
    text = (
        "pools: [{name: p, nodeSelector: {pool: p}, "
        "resources: [{name: nvidia.com/gpu, sharing: Exclusive}]}]\n"
        f"tenants:\n  - {entry}\n"
    )
    with pytest.raises(PolicyError) as raised:
        policy(text, name="refused")
    assert says in str(raised.value)
