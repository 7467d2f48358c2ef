"""The Pod's GPU pool is unambiguous, open to its namespace, and the only place it can land.

Restricted: a Pod whose resources mean different sharing modes in the pools it could land in,
with nothing (pool annotation, nodeSelector, node affinity) to say which; a Pod whose pools
are closed to its namespace; a pool annotation naming no pool. Where pools are reserved for
namespaces, a Pod (not a template: the mutating webhook confines the Pods a workload creates)
that could still land in a pool closed to its namespace, GPU or not: one that asks for a GPU
the pool offers, or asks for none and tolerates the pool's NoSchedule and NoExecute taints by
key (it would take the reserved nodes' CPU and memory), when its required node selection does
not exclude the pool and it tolerates the pool's taints; and a Pod that sets ``nodeName``
outside a binder namespace (the webhook cannot tell which pool a node is in). A Pod that
reaches a closed pool only through a wildcard toleration (node agents' DaemonSets) is warned,
never denied. Allowed: a Pod with exactly one possible sharing mode, kept to pools its
namespace may use. This is the decision the mutating webhook takes when it injects
tolerations and affinity (``webhook.core.pools``), checked again on the final Pod, so a
reserved pool stays reserved when the mutating webhook timed out, only recorded its patch or
was told not to require affinity.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView
from webhook.core.pools import closed_pools_tolerated, reachable_closed_pools, select_pool
from webhook.policy.model import Policy

RULE = "pool-access"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    selection = select_pool(view, policy)
    if selection.violations:  # mostly none: no generator made for them
        yield from (v for v in selection.violations if v.rule == RULE)
    if not policy.has_reserved_pools or view.kind != "Pod" or view.spec_path != "spec":
        return
    node = view.spec.get("nodeName")
    if node and not policy.is_binder(view.namespace):
        yield Violation(
            rule=RULE,
            path=f"{view.spec_path}.nodeName",
            value=node,
            message=("a GPU Pod" if selection.requested else "a Pod")
            + " that names its node skips the scheduler and every taint, and the webhook "
            "cannot tell whether the node is in a pool reserved for other namespaces",
            hint="remove nodeName and let the scheduler place the Pod, or declare the "
            "namespace in the policy's binderNamespaces",
            subject="spec",
            field="nodeName",
        )
        return
    if not selection.requested:
        yield from _tolerated_pools(view, policy)
        return
    for pool in reachable_closed_pools(view, policy):
        label = ", ".join(f"{k}={v}" for k, v in sorted(pool.node_selector.items()))
        key = min(pool.node_selector)
        yield Violation(
            rule=RULE,
            path=f"{view.spec_path}.affinity.nodeAffinity",
            value=pool.name,
            message=f"the Pod can land in pool {quote(pool.name)} ({label}), which namespace "
            f"{quote(view.namespace)} may not use: neither its required node affinity nor its "
            "tolerations keep it off those nodes",
            hint="add to every requiredDuringSchedulingIgnoredDuringExecution nodeSelectorTerm "
            f"an expression that excludes the pool, e.g. {{key: {key}, operator: "
            f"NotIn, values: [{pool.node_selector[key]}]}} (the mutating webhook adds "
            "it when it runs)",
            error_type="Forbidden",
            subject=pool.name,
            field="pool-confinement",
        )


def _tolerated_pools(view: PodView, policy: Policy) -> Iterator[Violation]:
    """A Pod that asks for no GPU, on the nodes of a pool closed to its namespace."""
    for pool, by_wildcard in closed_pools_tolerated(view, policy):
        label = ", ".join(f"{k}={v}" for k, v in sorted(pool.node_selector.items()))
        key = min(pool.node_selector)
        how = "a wildcard toleration tolerates" if by_wildcard else "its tolerations tolerate"
        yield Violation(
            rule=RULE,
            path=f"{view.spec_path}.tolerations",
            value=pool.name,
            message=f"the Pod can land in pool {quote(pool.name)} ({label}), which namespace "
            f"{quote(view.namespace)} may not use: {how} the pool's taints and its "
            "required node affinity does not exclude those nodes, whose CPU and memory are "
            "reserved for the pool's namespaces",
            hint="remove the tolerations of the pool's taints, or add to every "
            "requiredDuringSchedulingIgnoredDuringExecution nodeSelectorTerm "
            f"{{key: {key}, operator: NotIn, values: [{pool.node_selector[key]}]}}"
            + (" (a node agent that must run there: exempt its namespace)" if by_wildcard else ""),
            error_type="Forbidden",
            subject=pool.name,
            field="pool-confinement",
            # Node agents reach every node through a wildcard toleration: warned, never denied.
            advisory=by_wildcard,
        )
