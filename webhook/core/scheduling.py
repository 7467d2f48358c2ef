"""Small pieces of the scheduler's semantics: tolerations, taints and node selector terms."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# What the DaemonSet controller adds to every DaemonSet Pod (and counts in its desired number),
# so that node agents run on nodes that are starting, short of resources or cordoned: the
# Kubernetes documentation's DaemonSet page, "Taints and tolerations". Host-network Pods also
# tolerate node.kubernetes.io/network-unavailable (_DAEMONSET_HOST_NETWORK_TOLERATION).
_DAEMONSET_TOLERATIONS: tuple[Mapping[str, str], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
_DAEMONSET_HOST_NETWORK_TOLERATION: Mapping[str, str] = {
    "key": "node.kubernetes.io/network-unavailable",
    "operator": "Exists",
    "effect": "NoSchedule",
}


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether a toleration tolerates a taint, as the scheduler decides it."""
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    operator = toleration.get("operator") or "Equal"
    key = toleration.get("key")
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def toleration_for(taint: Mapping[str, Any]) -> dict[str, Any]:
    """The narrowest toleration for a taint: what we inject."""
    toleration = {"key": taint["key"]}
    if taint.get("value"):
        toleration.update(operator="Equal", value=taint["value"])
    else:
        toleration["operator"] = "Exists"
    toleration["effect"] = taint["effect"]
    return toleration


def expression_matches(expr: Mapping[str, Any], value: str | None) -> bool:
    """A node selector requirement against one label value (None: the label is absent)."""
    operator = expr.get("operator")
    values = expr.get("values") or []
    if not isinstance(values, list):
        return False  # malformed: the API server rejects it; it matches nothing meanwhile
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            left, right = int(value), int(values[0])
        except (TypeError, ValueError):
            return False
        return left > right if operator == "Gt" else left < right
    return False


def term_allows_labels(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a nodeSelectorTerm can match a node with these labels.

    Only the keys we know (``labels``) are judged; requirements on other keys may hold on
    the pool's nodes, so they never rule a pool out.
    """
    expressions = term.get("matchExpressions")
    for expr in expressions if isinstance(expressions, list) else ():
        if isinstance(expr, dict) and isinstance(expr.get("key"), str) and expr["key"] in labels:
            if not expression_matches(expr, labels[expr["key"]]):
                return False
    return True


def term_matches(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    """Whether a nodeSelectorTerm selects a node, as the scheduler decides it: every
    ``matchExpressions`` requirement holds of its labels and every ``matchFields`` one of its
    name (``metadata.name``, the only field the API accepts). Unlike
    :func:`term_allows_labels`, a key the labels lack is absent; a term with no requirement
    selects no node."""
    expressions = _list(term.get("matchExpressions"))
    fields = _list(term.get("matchFields"))
    if not expressions and not fields:
        return False
    return all(
        isinstance(expr, Mapping) and expression_matches(expr, labels.get(str(expr.get("key"))))
        for expr in expressions
    ) and all(
        isinstance(expr, Mapping)
        and expr.get("key") == "metadata.name"
        and expression_matches(expr, name)
        for expr in fields
    )


def required_terms(pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """A Pod spec's required node selector terms (alternatives); None without a requirement."""
    affinity = _mapping(_mapping(pod_spec.get("affinity")).get("nodeAffinity"))
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(required, Mapping):
        return None
    return [term for term in _list(required.get("nodeSelectorTerms")) if isinstance(term, Mapping)]


def admits(pod_spec: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    """Whether a Pod spec's ``nodeSelector`` and required node affinity let it onto a node
    with these labels and name (taints aside: :func:`untolerated`)."""
    selector = pod_spec.get("nodeSelector")
    if isinstance(selector, Mapping) and any(
        labels.get(str(key)) != str(value) for key, value in selector.items()
    ):
        return False
    terms = required_terms(pod_spec)
    return terms is None or any(term_matches(term, labels, name) for term in terms)


def selected_label_keys(pod_spec: Mapping[str, Any]) -> frozenset[str]:
    """The node label keys a Pod spec's ``nodeSelector`` and required node affinity name."""
    keys = {str(key) for key in _mapping(pod_spec.get("nodeSelector"))}
    for term in required_terms(pod_spec) or ():
        for expr in _list(term.get("matchExpressions")):
            if isinstance(expr, Mapping) and isinstance(expr.get("key"), str):
                keys.add(expr["key"])
    return frozenset(keys)


def untolerated(
    tolerations: Iterable[Mapping[str, Any]], taints: Iterable[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The NoSchedule and NoExecute taints no toleration tolerates: those that keep a Pod off
    the node (PreferNoSchedule only discourages)."""
    listed = [t for t in tolerations if isinstance(t, Mapping)]
    return [
        taint
        for taint in taints
        if taint.get("effect") in ("NoSchedule", "NoExecute")
        and not any(tolerates(toleration, taint) for toleration in listed)
    ]


def daemon_pod_fits(
    pod_spec: Mapping[str, Any],
    labels: Mapping[str, str],
    name: str,
    taints: Iterable[Mapping[str, Any]],
) -> bool:
    """Whether the DaemonSet controller places a Pod of this template on a node with these
    labels, name and taints: :func:`admits` it, and its tolerations, with those the controller
    adds, tolerate every NoSchedule and NoExecute taint."""
    if not admits(pod_spec, labels, name):
        return False
    tolerations = [t for t in _list(pod_spec.get("tolerations")) if isinstance(t, Mapping)]
    tolerations += _DAEMONSET_TOLERATIONS
    if pod_spec.get("hostNetwork") is True:
        tolerations.append(_DAEMONSET_HOST_NETWORK_TOLERATION)
    return not untolerated(tolerations, taints)


def assigned_node(pod_spec: Mapping[str, Any]) -> str | None:
    """The node a Pod runs on (``nodeName``), or the one a DaemonSet Pod not yet scheduled is
    bound for: the DaemonSet controller gives each Pod a required term on ``metadata.name``."""
    node_name = pod_spec.get("nodeName")
    if isinstance(node_name, str) and node_name:
        return node_name
    for term in required_terms(pod_spec) or ():
        for field in _list(term.get("matchFields")):
            if isinstance(field, Mapping) and field.get("key") == "metadata.name":
                values = _list(field.get("values"))
                if values:
                    return str(values[0])
    return None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
