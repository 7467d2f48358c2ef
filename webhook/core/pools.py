"""Which GPU pool a Pod lands in: one decision shared by the validate and the mutate path.

The mutating webhook injects what the chosen pool needs; the validating webhook re-derives
the same choice on the final object and denies a Pod whose choice is impossible (pinned to a
pool that does not offer its resources), ambiguous (its resources mean different sharing modes
in the pools it could land in) or forbidden (its namespace may not use those pools).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView
from webhook.core.scheduling import term_allows_labels
from webhook.policy.model import POOL_ANNOTATION, Policy, Pool, ResourceSpec


@dataclass(frozen=True, slots=True)
class Selection:
    """``pools``: where the Pod may land (empty when no declared pool applies).

    ``taints``: what it must tolerate there; ``violations``: why the choice is impossible.
    """

    pools: tuple[Pool, ...]
    taints: tuple[Mapping, ...]
    violations: tuple[Violation, ...]
    requested: tuple[str, ...]


NO_GPU = Selection((), (), (), ())


def select_pool(view: PodView, policy: Policy) -> Selection:
    """Where the Pod may land and what it must tolerate there; decided once per view."""
    return view.memo(_select, policy)


def _select(view: PodView, policy: Policy) -> Selection:
    requested = tuple(view.requested_gpu_names())
    if not requested:
        return NO_GPU
    annotation = view.annotations.get(POOL_ANNOTATION)
    if annotation is not None and policy.pools:
        declared = [name for name in requested if name in policy.declared_names]
        return _explicit(view, policy, str(annotation), declared, requested)
    pool_names = {name for pool in policy.pools for name in pool.resources}
    known = [name for name in requested if name in pool_names]
    if not known:
        return Selection((), policy.gpu_node_taints, (), requested)

    offering = [p for p in policy.pools if all(n in p.resources for n in known)]
    compatible = [p for p in policy.pools if _compatible(view, p)]
    pinned = len(compatible) < len(policy.pools)
    candidates = [p for p in offering if p in compatible]
    if not candidates:
        return Selection(
            (), (), (_pend_forever(view, known, compatible, offering, pinned),), requested
        )

    allowed = [p for p in candidates if p.allows_namespace(view.namespace)]
    if not allowed:
        names = ", ".join(p.name for p in candidates)
        violation = Violation(
            rule="pool-access",
            path=view.first_request_path(known[0]),
            value=known[0],
            message=f"namespace {quote(view.namespace)} may not use the pool(s) that offer "
            f"{', '.join(known)} ({names})",
            hint="ask the platform team to grant the namespace access in the policy's pool "
            "namespaces, or request a GPU resource of a pool the namespace may use",
            subject=known[0],
            field="pool",
        )
        return Selection((), (), (violation,), requested)

    conflict = _mode_conflict(allowed, known)
    if conflict is not None:
        name, modes = conflict
        described = ", ".join(f"{mode} in pool {pool}" for pool, mode in modes)
        violation = Violation(
            rule="pool-access",
            path=view.first_request_path(name),
            value=name,
            message=f"ambiguous pool: {name} is {described}, and the Pod does not say which",
            hint=f'set the annotation {POOL_ANNOTATION}: "<pool>" or a nodeSelector on the '
            "pool's labels",
            subject=name,
            field="pool",
        )
        return Selection((), (), (violation,), requested)
    taints = _union_taints(allowed)
    return Selection(tuple(allowed), taints, (), requested)


def _explicit(
    view: PodView, policy: Policy, name: str, known: list[str], requested: tuple[str, ...]
) -> Selection:
    path = f"{view.metadata_path}.annotations[{POOL_ANNOTATION}]"
    pool = next((p for p in policy.pools if p.name == name), None)
    if pool is None:
        violation = Violation(
            rule="pool-access",
            path=path,
            value=name,
            message=f"no GPU pool is named {quote(name)}",
            hint="use one of: " + ", ".join(p.name for p in policy.pools),
            error_type="Unsupported value",
            subject="pool-annotation",
        )
        return Selection((), (), (violation,), requested)
    missing = [n for n in known if n not in pool.resources]
    if missing or not _compatible(view, pool):
        offered = ", ".join(pool.resources)
        reason = (
            f"pool {quote(name)} does not offer {', '.join(missing)} (it offers {offered})"
            if missing
            else f"the Pod's nodeSelector or node affinity excludes the nodes of pool {quote(name)}"
        )
        violation = Violation(
            rule="sharing-mode",
            path=path,
            value=name,
            message=f"{reason}: the Pod would pend forever",
            hint="request a resource the pool offers, or choose another pool",
            subject="pool-annotation",
        )
        return Selection((), (), (violation,), requested)
    if not pool.allows_namespace(view.namespace):
        violation = Violation(
            rule="pool-access",
            path=path,
            value=name,
            message=f"namespace {quote(view.namespace)} may not use pool {quote(name)}",
            hint="choose a pool the namespace may use, or ask the platform team for access",
            error_type="Forbidden",
            subject="pool-annotation",
        )
        return Selection((), (), (violation,), requested)
    return Selection((pool,), pool.taints, (), requested)


def _compatible(view: PodView, pool: Pool) -> bool:
    """Whether the Pod's own nodeSelector and required node affinity admit the pool's nodes."""
    labels = pool.node_selector
    for key, value in view.node_selector().items():
        if key in labels and labels[key] != value:
            return False
    terms = view.required_terms()
    return not terms or any(term_allows_labels(term, labels) for term in terms)


def _pend_forever(
    view: PodView, known: list[str], compatible: list[Pool], offering: list[Pool], pinned: bool
) -> Violation:
    wanted = ", ".join(known)
    where = ", ".join(p.name for p in offering) or "no single pool"
    if pinned:
        if compatible:
            reachable = ", ".join(f"pool {quote(p.name)}" for p in compatible)
            message = (
                f"the Pod's node selection admits only {reachable}, which does not offer "
                f"{wanted}: it would pend forever"
            )
        else:
            message = (
                "the Pod's node selection excludes every declared GPU pool, so no node offers "
                f"{wanted}: it would pend forever"
            )
        path = (
            f"{view.spec_path}.nodeSelector"
            if view.node_selector()
            else (
                f"{view.spec_path}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            )
        )
        value: object = dict(view.node_selector()) or "nodeSelectorTerms"
    else:
        message = f"no pool offers all of {wanted} together: it would pend forever"
        path = view.first_request_path(known[-1])
        value = known[-1]
    return Violation(
        rule="sharing-mode",
        path=path,
        value=value,
        message=message,
        hint=f"{wanted} offered by: {where}; select one of those pools or request its resources",
        subject="node-selection",
        field="pool",
    )


def _mode_conflict(pools: list[Pool], names: list[str]) -> tuple[str, list] | None:
    for name in names:
        modes = [(p.name, p.resources[name].sharing) for p in pools]
        if len({mode for _, mode in modes}) > 1:
            return name, modes
    return None


def _union_taints(pools: list[Pool]) -> tuple[Mapping, ...]:
    taints: list[Mapping] = []
    for pool in pools:
        for taint in pool.taints:
            if taint not in taints:
                taints.append(taint)
    return tuple(taints)


def resource_spec(view: PodView, policy: Policy, name: str) -> ResourceSpec | None:
    """The declaration of a resource for this Pod: its pool's, else the cluster-wide one."""
    selection = select_pool(view, policy)
    for pool in selection.pools:
        if name in pool.resources:
            return pool.resources[name]
    return policy.resources.get(name)
