"""The Pod's GPU pool is unambiguous, open to its namespace, and the only place it can land.

Restricted: a Pod whose resources mean different sharing modes in the pools it could land in,
with nothing (pool annotation, nodeSelector, node affinity) to say which; a Pod whose pools
are closed to its namespace; a pool annotation naming no pool. Where pools are reserved for
namespaces, a Pod (not a template: the mutating webhook confines the Pods a workload creates)
that could still land in a pool closed to its namespace, GPU or not: one that asks for a GPU
the pool offers, or asks for none and tolerates the pool's NoSchedule and NoExecute taints by
key (it would take the reserved nodes' CPU and memory), when its required node selection does
not exclude the pool and it tolerates the pool's taints; and a Pod that sets ``nodeName``
outside a binder namespace (``tenants[].binder``) to a node of a pool closed to it, or to a
node the node inventory cannot place (without one, the webhook cannot tell which pool a node
is in). A Pod that reaches a closed pool only through a wildcard toleration (node agents'
DaemonSets) is warned, never denied. Allowed: a Pod with exactly one possible sharing mode,
kept to pools its namespace may use. This is the decision the mutating webhook takes when it
injects tolerations and affinity (``webhook.core.pools``), checked again on the final Pod, so
a reserved pool stays reserved when the mutating webhook timed out, only recorded its patch
or was told not to require affinity. Products are places too: where a tenant may use some GPU
products only (``tenants[].entitlements.products``), a GPU Pod whose node selection does not
keep it to them (``webhook.core.products``; new in this release: warned while ``newChecks`` is
Warn). Like a pool, a product is never lifted by an exception.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from webhook.core.findings import Violation, quote
from webhook.core.inventory import pools_of
from webhook.core.pods import PodView
from webhook.core.pools import (
    Ambiguous,
    ClosedToNamespace,
    PoolClosed,
    Problem,
    UnknownPool,
    closed_pools_tolerated,
    named_node_pools,
    reachable_closed_pools,
    reachable_passed_over_pools,
    select_pool,
)
from webhook.core.products import product_expression, product_reach, product_tenant
from webhook.core.queues import flavor_hint
from webhook.policy.model import POOL_ANNOTATION, Policy, Pool

RULE = "pool-access"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    selection = select_pool(view, policy)
    for problem in selection.problems:
        found = _problem(view, policy, problem)
        if found is not None:
            yield found
    yield from _products(view, policy)
    if view.kind != "Pod" or view.spec_path != "spec":
        return
    if selection.passed_over and not view.spec.get("nodeName"):
        yield from _passed_over(view, policy, selection.pools)
    if not policy.has_reserved_pools:
        return
    node_name = view.spec.get("nodeName")
    if node_name and not policy.is_binder(view.namespace):
        yield from _named_node(view, policy, node_name, bool(selection.requested))
        return
    if not selection.requested:
        yield from _tolerated_pools(view, policy)
        return
    for pool in reachable_closed_pools(view, policy):
        yield _can_land(
            view,
            pool,
            f"which namespace {quote(view.namespace)} may not use",
            "an expression that excludes the pool, e.g. {exclusion} (the mutating webhook "
            "adds it when it runs)",
        )


def _passed_over(view: PodView, policy: Policy, chosen: tuple[Pool, ...]) -> Iterator[Violation]:
    """A Pod its tenant's preference sent to one pool that can still land in another it may
    use, where its resources mean another sharing mode (the mutating webhook confines it when
    it runs; this holds when it did not)."""
    preferred = chosen[0].name if chosen else ""
    for pool in reachable_passed_over_pools(view, policy):
        yield _can_land(
            view,
            pool,
            f"where what it asks for is shared differently than in pool {quote(preferred)}, "
            "which its tenant prefers",
            f"{{exclusion}}, or choose the pool with the {POOL_ANNOTATION} annotation (the "
            "mutating webhook confines the Pod to its tenant's pool when it runs)",
        )


def _can_land(view: PodView, pool: Pool, why: str, fix: str) -> Violation:
    """The Pod's final spec lets it land in a pool it must be kept off: ``why`` it must,
    and ``fix``, where ``{exclusion}`` stands for a node affinity expression that excludes the
    pool."""
    label, exclusion = _labels(pool)
    return Violation(
        rule=RULE,
        path=f"{view.spec_path}.affinity.nodeAffinity",
        value=pool.name,
        message=f"the Pod can land in pool {quote(pool.name)} ({label}), {why}: neither its "
        "required node affinity nor its tolerations keep it off those nodes",
        hint="add to every requiredDuringSchedulingIgnoredDuringExecution nodeSelectorTerm "
        + fix.format(exclusion=exclusion),
        error_type="Forbidden",
        subject=pool.name,
        field="pool-confinement",
    )


def _named_node(
    view: PodView, policy: Policy, node_name: Any, asks_gpu: bool
) -> Iterator[Violation]:
    """A Pod that names its node skips the scheduler and every taint: refused when the node
    is in a pool closed to its namespace (any of its pools, whatever the annotation says), or
    when the node inventory cannot place it (``named_node_pools``); allowed on a CPU node and
    on a node of pools open to the namespace."""
    path = f"{view.spec_path}.nodeName"
    placed = named_node_pools(view, policy)
    if placed is None:
        yield Violation(
            rule=RULE,
            path=path,
            value=node_name,
            message=("a GPU Pod" if asks_gpu else "a Pod")
            + " that names its node skips the scheduler and every taint, and the webhook "
            "cannot tell whether the node is in a pool reserved for other namespaces",
            hint="remove nodeName and let the scheduler place the Pod, or make the namespace a "
            "binder in the policy (spec.tenants[].binder)",
            subject="spec",
            field="nodeName",
        )
        return
    node = placed[0]
    for pool in pools_of(node, policy):
        if policy.may_use(pool, view.namespace):
            continue
        label, _ = _labels(pool)
        yield Violation(
            rule=RULE,
            path=path,
            value=node_name,
            message=f"node {quote(node.name)} is in pool {quote(pool.name)} ({label}), which "
            f"namespace {quote(view.namespace)} may not use: nodeName skips the scheduler and "
            "the pool's taints",
            hint="remove nodeName and let the scheduler place the Pod in a pool the namespace "
            "may use, or ask the platform team for access to the pool",
            error_type="Forbidden",
            subject=pool.name,
            field="nodeName",
        )


def _open_pools(view: PodView, policy: Policy, requested: tuple[str, ...]) -> tuple[Pool, ...]:
    """The pools the namespace may use that offer everything the Pod asks for."""
    return tuple(
        p
        for p in policy.pools
        if policy.may_use(p, view.namespace) and all(map(p.offers, requested))
    )


def _labels(pool: Pool) -> tuple[str, str]:
    """The pool's labels as a message shows them, and a node affinity expression that keeps a
    Pod off its nodes."""
    label = ", ".join(f"{k}={v}" for k, v in sorted(pool.node_selector.items()))
    key = min(pool.node_selector)
    return label, f"{{key: {key}, operator: NotIn, values: [{pool.node_selector[key]}]}}"


def _tolerated_pools(view: PodView, policy: Policy) -> Iterator[Violation]:
    """A Pod that asks for no GPU, on the nodes of a pool closed to its namespace."""
    for pool, by_wildcard in closed_pools_tolerated(view, policy):
        label, exclusion = _labels(pool)
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
            f"{exclusion}"
            + (" (a node agent that must run there: exempt its namespace)" if by_wildcard else ""),
            error_type="Forbidden",
            subject=pool.name,
            field="pool-confinement",
            # Node agents reach every node through a wildcard toleration: warned, never denied.
            advisory=by_wildcard,
        )


def _problem(view: PodView, policy: Policy, problem: Problem) -> Violation | None:
    """The finding of a pool choice's problem this rule owns (sharing-mode owns the others)."""
    if isinstance(problem, ClosedToNamespace):
        requested = problem.requested
        names = ", ".join(p.name for p in problem.candidates)
        return Violation(
            rule=RULE,
            path=view.first_request_path(requested[0]),
            value=requested[0],
            message=f"namespace {quote(view.namespace)} may not use the pool(s) that offer "
            f"{', '.join(requested)} ({names})",
            hint="ask the platform team to reserve the pool for the namespace too "
            "(spec.tenants[].reservedPools), or request a GPU resource of a pool the namespace "
            "may use" + flavor_hint(view, _open_pools(view, policy, requested)),
            subject=requested[0],
            field="pool",
        )
    if isinstance(problem, Ambiguous):
        name = problem.resource
        described = ", ".join(f"{mode} in pool {pool}" for pool, mode in problem.modes)
        return Violation(
            rule=RULE,
            path=view.first_request_path(name),
            value=name,
            message=f"ambiguous pool: {name} is {described}, and the Pod does not say which",
            hint=f'set the annotation {POOL_ANNOTATION}: "<pool>" or a nodeSelector on the '
            "pool's labels",
            subject=name,
            field="pool",
        )
    annotation = f"{view.metadata_path}.annotations[{POOL_ANNOTATION}]"
    if isinstance(problem, UnknownPool):
        return Violation(
            rule=RULE,
            path=annotation,
            value=problem.name,
            message=f"no GPU pool is named {quote(problem.name)}",
            hint="use one of: " + ", ".join(p.name for p in policy.pools),
            error_type="Unsupported value",
            subject="pool-annotation",
        )
    if isinstance(problem, PoolClosed):
        name = problem.pool.name
        return Violation(
            rule=RULE,
            path=annotation,
            value=name,
            message=f"namespace {quote(view.namespace)} may not use pool {quote(name)}",
            hint="choose a pool the namespace may use, or ask the platform team for access",
            error_type="Forbidden",
            subject="pool-annotation",
        )
    return None


def _products(view: PodView, policy: Policy) -> Iterator[Violation]:
    """A GPU Pod that can land on GPUs of a product its tenant is not entitled to
    (``tenants[].entitlements.products``): its node selection names one, or does not keep it
    to theirs (the mutating webhook adds that confinement). A template is told only when it
    names another product: every Pod made from it would be refused, and the mutation confines
    the others. New in this release: advisory while ``newChecks`` is Warn. Like a pool, a
    product is never excepted."""
    tenant = product_tenant(view, policy)
    if tenant is None or tenant.entitlements is None or tenant.entitlements.products is None:
        return
    reach = product_reach(view, policy, tenant.entitlements.product_values)
    is_pod = view.kind == "Pod" and view.spec_path == "spec"
    if reach.confined and not reach.named or not is_pod and not reach.named:
        return
    setting = tenant.setting("entitlements")
    products = ", ".join(tenant.entitlements.products)
    node_name = view.spec.get("nodeName")
    if reach.named:
        named = ", ".join(quote(name) for name in reach.named)
        message = f"namespace {quote(view.namespace)} may not use {named}: {setting} allows "
        message += f"the products {products}"
        hint = f"select one of those (nvidia.com/gpu.product), or {tenant.ask} to be entitled"
    elif node_name:
        message = (
            f"the Pod names its node, whose GPU product the webhook cannot tell (no node "
            f"inventory, a node it does not know, or no nvidia.com/gpu.product label), and "
            f"{setting} allows only {products}"
        )
        hint = "remove nodeName and let the scheduler place the Pod (its node affinity then "
        hint += "keeps it to those products)"
    else:
        message = (
            f"the Pod can land on GPUs of any product, and {setting} allows only {products}: "
            "its node selection must keep it to them"
        )
        hint = (
            f"add the requirement {json.dumps(product_expression(tenant))} to every term of "
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution (the "
            "mutating webhook adds it when it runs)"
        )
    yield Violation(
        rule=RULE,
        path=f"{view.spec_path}.nodeName"
        if node_name
        else f"{view.spec_path}.affinity.nodeAffinity",
        value=reach.named[0] if reach.named else None,
        message=message,
        hint=hint,
        error_type="Forbidden",
        subject="pod",
        field="products",
        advisory=policy.new_checks_advisory,
    )
