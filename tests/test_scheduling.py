"""The scheduler's node selection as ``webhook.core.scheduling`` decides it for a Pod spec that
is known whole (``cluster check``'s DaemonSets): node selector, required node affinity, taints."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.core.scheduling import (
    admits,
    assigned_node,
    daemon_pod_fits,
    selected_label_keys,
    term_matches,
    untolerated,
)

GPU = {"nvidia.com/gpu.present": "true", "pool": "a"}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


@pytest.mark.parametrize(
    ("term", "matches"),
    [
        ({"matchExpressions": [expr("pool", "In", "a", "b")]}, True),
        ({"matchExpressions": [expr("pool", "NotIn", "a")]}, False),
        # A key the node lacks: Exists fails, DoesNotExist and NotIn hold.
        ({"matchExpressions": [expr("zone", "Exists")]}, False),
        ({"matchExpressions": [expr("zone", "DoesNotExist")]}, True),
        ({"matchExpressions": [expr("zone", "NotIn", "x")]}, True),
        # Every requirement of a term holds.
        ({"matchExpressions": [expr("pool", "In", "a"), expr("zone", "Exists")]}, False),
        ({"matchFields": [expr("metadata.name", "In", "gpu-1")]}, True),
        ({"matchFields": [expr("metadata.name", "NotIn", "gpu-1")]}, False),
        ({"matchFields": [expr("spec.unschedulable", "In", "gpu-1")]}, False),
        ({}, False),  # a term with no requirement selects no node
    ],
)
def test_a_term_matches_a_node_as_the_scheduler_decides(
    term: dict[str, Any], matches: bool
) -> None:
    assert term_matches(term, GPU, "gpu-1") is matches


@pytest.mark.parametrize(
    ("spec", "allowed"),
    [
        ({}, True),
        ({"nodeSelector": {"pool": "a"}}, True),
        ({"nodeSelector": {"pool": "a", "zone": "x"}}, False),
        (required({"matchExpressions": [expr("pool", "In", "b")]}), False),
        # Terms are alternatives.
        (
            required(
                {"matchExpressions": [expr("pool", "In", "b")]},
                {"matchExpressions": [expr("nvidia.com/gpu.present", "Exists")]},
            ),
            True,
        ),
        ({"nodeSelector": {"pool": "b"}, **required({"matchFields": []})}, False),
    ],
)
def test_node_selector_and_required_affinity_both_admit(
    spec: dict[str, Any], allowed: bool
) -> None:
    assert admits(spec, GPU, "gpu-1") is allowed


def test_the_label_keys_a_spec_selects_by() -> None:
    spec = {
        "nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"},
        **required({"matchExpressions": [expr("zone", "Exists")], "matchFields": []}),
    }
    assert selected_label_keys(spec) == {"nvidia.com/gpu.deploy.device-plugin", "zone"}


def test_only_hard_taints_that_nothing_tolerates_keep_a_pod_off() -> None:
    taints = [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "pool", "value": "a", "effect": "NoExecute"},
        {"key": "spot", "value": "", "effect": "PreferNoSchedule"},
    ]
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert untolerated([gpu], taints) == [taints[1]]
    assert untolerated([{"operator": "Exists"}], taints) == []


def test_a_daemonset_pod_tolerates_what_its_controller_adds() -> None:
    cordoned = [
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
    ]
    assert daemon_pod_fits({}, GPU, "gpu-1", cordoned)
    network = [{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]
    assert not daemon_pod_fits({}, GPU, "gpu-1", network)
    assert daemon_pod_fits({"hostNetwork": True}, GPU, "gpu-1", network)
    assert not daemon_pod_fits({"nodeSelector": {"pool": "b"}}, GPU, "gpu-1", [])


def test_the_node_a_pod_is_on_or_bound_for() -> None:
    assert assigned_node({"nodeName": "gpu-1"}) == "gpu-1"
    bound = required({"matchFields": [expr("metadata.name", "In", "gpu-2")]})
    assert assigned_node(bound) == "gpu-2"
    assert assigned_node(required({"matchExpressions": [expr("pool", "In", "a")]})) is None
