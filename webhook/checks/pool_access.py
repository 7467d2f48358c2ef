"""The Pod's GPU pool is unambiguous, open to its namespace, and the only place it can land.

Restricted: a Pod whose resources mean different sharing modes in the pools it could land in,
with nothing (pool annotation, nodeSelector, node affinity) to say which; a Pod whose pools
are closed to its namespace; a pool annotation naming no pool. Where pools are reserved for
namespaces, a Pod (not a template: the mutating webhook confines the Pods a workload creates)
that asks for a GPU and could still land in a pool closed to its namespace — its required node
selection does not exclude the pool and it tolerates the pool's taints — or that sets
``nodeName`` outside a binder namespace (the webhook cannot tell which pool a node is in).
Allowed: a Pod with exactly one possible sharing mode, kept to pools its namespace may use.
This is the decision the mutating webhook takes when it injects tolerations and affinity
(``webhook.core.pools``), checked again on the final Pod, so a reserved pool stays reserved
when the mutating webhook timed out, only recorded its patch or was told not to require
affinity.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView
from webhook.core.pools import reachable_closed_pools, select_pool
from webhook.policy.model import Policy

RULE = "pool-access"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    selection = select_pool(view, policy)
    if selection.violations:  # mostly none: no generator made for them
        yield from (v for v in selection.violations if v.rule == RULE)
    if not policy.has_reserved_pools or view.kind != "Pod" or view.spec_path != "spec":
        return
    if not selection.requested:
        return
    node = view.spec.get("nodeName")
    if node and not policy.is_binder(view.namespace):
        yield Violation(
            rule=RULE,
            path=f"{view.spec_path}.nodeName",
            value=node,
            message="a GPU Pod that names its node skips the scheduler, and the webhook cannot "
            "tell whether the node is in a pool reserved for other namespaces",
            hint="remove nodeName and let the scheduler place the Pod, or declare the "
            "namespace in the policy's binderNamespaces",
            subject="spec",
            field="nodeName",
        )
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
