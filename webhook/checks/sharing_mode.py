"""One sharing mode per Pod, on a pool that offers it.

Restricted: a Pod whose GPU resources belong to more than one sharing mode (full cards,
time-slicing replicas, MPS, MIG instances, time-sliced MIG instances), even where one pool
offers several: a Pod gets one kind of GPU. A Pod whose nodeSelector, required node affinity
or pool annotation admits only pools that do not offer its resources (it would pend forever).
A request above 1 of a time-sliced or MPS replica where the pool (or the resource's
declaration) sets ``failRequestsGreaterThanOne``: replicas share one GPU, so two of them are
not twice the GPU. Allowed: one mode, reachable.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core.dra import ClaimedMode, PodClaim, claim_modes, container_claims, pod_claims
from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView
from webhook.core.pools import PendsForever, PoolLacks, resource_spec, select_pool
from webhook.core.queues import flavor_hint
from webhook.policy import mig
from webhook.policy.model import POOL_ANNOTATION, Policy

RULE = "sharing-mode"


def _mig_sharing(name: str) -> str | None:
    """The sharing mode a MIG resource name means, for one the policy does not declare."""
    short = name.partition("/")[2]
    if short.startswith(mig.MIG_PREFIX) and mig.is_well_formed(short[len(mig.MIG_PREFIX) :]):
        return "MIGTimeSlicing" if short.endswith(".shared") else "MIG"
    return None


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    if view.claim_object:
        for claim_spec in view.claim_specs:
            yield from _mixed_in_claim(claim_modes(claim_spec, policy, view.nodes), policy)
        return
    for problem in select_pool(view, policy).problems:
        if isinstance(problem, PendsForever):
            yield _pends_forever(view, policy, problem)
        elif isinstance(problem, PoolLacks):
            yield _pool_lacks(view, policy, problem)
    first: tuple[str, str, str] | None = None  # (mode, resource, container path)
    reported: set[str] = set()
    for container in view.containers:
        for name, quantity in container.gpu_quantity.items():
            if quantity is None or quantity <= 0:
                continue
            spec = resource_spec(view, policy, name)
            mode = spec.sharing if spec is not None else _mig_sharing(name)
            if mode is None:
                continue
            if spec is not None and spec.fail_requests_greater_than_one and quantity > 1:
                yield Violation(
                    rule=RULE,
                    path=container.resource_path(name),
                    value=container.gpu[name][0],
                    message=f"{name} is a {mode} replica of a shared GPU: requests above 1 "
                    "are refused (failRequestsGreaterThanOne), since replicas share one GPU's "
                    "memory and compute",
                    hint=f"request 1 {name}; for more capacity use a pool of exclusive full GPUs",
                    subject=container.name,
                    field=f"{container.list_name}.resources[{name}]",
                )
            if first is None:
                first = (mode, name, container.path)
            elif mode != first[0] and name not in reported:
                reported.add(name)
                yield Violation(
                    rule=RULE,
                    path=container.resource_path(name),
                    value=name,
                    message=f"mixes GPU sharing modes in one Pod: {name} is {mode}, while "
                    f"{first[1]} ({first[2]}) is {first[0]}",
                    hint="request one kind of GPU per Pod; split the work into several Pods",
                    subject=container.name,
                    field=f"{container.list_name}.resources[{name}]",
                )
    if view.pod_claims is not None and view.pod_claims.by_name:
        yield from _mixed_with_claims(view, policy, first, reported)


def _mixed_in_claim(modes: list[ClaimedMode], policy: Policy) -> Iterator[Violation]:
    """Requests of one claim in different sharing modes: one Pod gets them all."""
    for claimed in modes[1:]:
        if claimed.mode != modes[0].mode:
            yield Violation(
                rule=RULE,
                path=claimed.where,
                value=claimed.mode,
                message=f"mixes GPU sharing modes in one claim: request "
                f"{quote(claimed.ask.request)} is {claimed.mode}, while request "
                f"{quote(modes[0].ask.request)} ({modes[0].where}) is {modes[0].mode}",
                hint="ask for one kind of GPU per claim and Pod; split the work into Pods "
                "with claims of their own",
                subject=claimed.ask.request,
                field="sharing",
                advisory=policy.new_checks_advisory,
            )


def _mixed_with_claims(
    view: PodView, policy: Policy, first: tuple[str, str, str] | None, reported: set[str]
) -> Iterator[Violation]:
    """The Pod's claimed GPUs against its extended resources and one another: through the
    node inventory's templates. A claim whose spec cannot be read is warned once, where the
    Pod has something to compare it with."""
    claims = pod_claims(view)
    unread: dict[str, PodClaim] = {}
    sources = 1 if first is not None else 0
    for container in view.containers:
        for name, request, path in container_claims(container):
            claim = claims.by_name.get(name)
            if claim is None:
                continue
            if claim.spec is None:
                if claim.template is None or not claims.templates_known:
                    unread.setdefault(name, claim)  # (a template not found: dra-claims says)
                continue
            for claimed in claim_modes(claim.spec, policy, view.nodes):
                if request and claimed.ask.request != request:
                    continue
                sources += 1
                label = f"request {claimed.ask.request} of {claim.source}"
                if first is None:
                    first = (claimed.mode, label, path)
                elif claimed.mode != first[0] and label not in reported:
                    reported.add(label)
                    where = claimed.where
                    if not where.startswith("DeviceClass "):
                        where += " in the template"
                    yield Violation(
                        rule=RULE,
                        path=path,
                        value=name,
                        message=f"mixes GPU sharing modes in one Pod: {label} is "
                        f"{claimed.mode} ({where}), while {first[1]} "
                        f"({first[2]}) is {first[0]}",
                        hint="request one kind of GPU per Pod; split the work into several Pods",
                        subject=container.name,
                        field=f"{container.list_name}.resources.claims[{name}]",
                        advisory=policy.new_checks_advisory,
                    )
    if unread and sources + len(unread) > 1:
        claim = next(iter(unread.values()))
        if claim.template is not None and view.nodes is None:
            why = "templates are read from the node inventory, which this server does not run"
        elif claim.template is not None:
            why = "the node inventory does not know the templates now (its DRA watch failed)"
        else:
            why = "ResourceClaims are not watched, templates are"
        yield Violation(
            rule=RULE,
            path=claim.path,
            value=claim.name,
            message=f"sharing modes not checked: {why}, so what {claim.source} asks for is unknown",
            hint="use one kind of GPU per Pod",
            subject="resourceClaims",
            field=f"resourceClaims[{claim.name}]",
            advisory=True,
        )


def _pends_forever(view: PodView, policy: Policy, problem: PendsForever) -> Violation:
    wanted = ", ".join(problem.requested)
    where = ", ".join(p.name for p in problem.offering) or (
        "GPU nodes outside the declared pools" if problem.unpooled else "no single pool"
    )
    kueue = ""
    if problem.pinned:
        if problem.compatible:
            reachable = ", ".join(
                f"pool {quote(p.name)} (it offers {', '.join(p.resources)})"
                for p in problem.compatible
            )
            message = (
                f"the Pod's node selection admits only {reachable}, which does not offer "
                f"all of {wanted}: it would pend forever"
            )
        else:
            message = (
                "the Pod's node selection excludes every declared GPU pool, so no node offers "
                f"{wanted}: it would pend forever"
            )
        affinity = view.field_path("affinity")
        path = (
            view.field_path("nodeSelector")
            if view.node_selector()
            else f"{affinity}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        )
        value: object = dict(view.node_selector()) or "nodeSelectorTerms"
        usable = tuple(p for p in problem.offering if policy.may_use(p, view.namespace))
        kueue = flavor_hint(view, usable or problem.offering)
    else:
        message = f"no pool offers all of {wanted} together: it would pend forever"
        path = view.first_request_path(problem.requested[-1])
        value = problem.requested[-1]
    return Violation(
        rule=RULE,
        path=path,
        value=value,
        message=message,
        hint=f"{wanted} offered by: {where}; select one of those pools or request its resources"
        + kueue,
        subject="node-selection",
        field="pool",
    )


def _pool_lacks(view: PodView, policy: Policy, problem: PoolLacks) -> Violation:
    name = problem.pool.name
    if problem.node:
        # Known from the node inventory alone: a warning (its labels may be changing).
        return Violation(
            rule=RULE,
            path=f"{view.spec_path}.nodeName",
            value=problem.node,
            message=f"node {quote(problem.node)} is in pool {quote(name)}, which does not "
            f"offer {', '.join(problem.missing)} (it offers {', '.join(problem.pool.resources)})"
            ": the kubelet would refuse the Pod",
            hint="name a node that offers what the Pod requests, or remove nodeName and let "
            "the scheduler place the Pod" + _offered_by(policy, problem.requested),
            subject="nodeName",
            advisory=True,
        )
    reason = (
        f"pool {quote(name)} does not offer {', '.join(problem.missing)} "
        f"(it offers {', '.join(problem.pool.resources)})"
        if problem.missing
        else f"the Pod's nodeSelector or node affinity excludes the nodes of pool {quote(name)}"
    )
    return Violation(
        rule=RULE,
        path=f"{view.metadata_path}.annotations[{POOL_ANNOTATION}]",
        value=name,
        message=f"{reason}: the Pod would pend forever",
        hint="request a resource the pool offers, or choose another pool"
        + _offered_by(policy, problem.requested)
        + ("" if problem.missing else flavor_hint(view, (problem.pool,))),
        subject="pool-annotation",
    )


def _offered_by(policy: Policy, requested: tuple[str, ...]) -> str:
    """``; nvidia.com/x is offered by pools a, b`` for each requested resource some pool has."""
    parts = []
    for name in requested:
        pools = [p.name for p in policy.pools if p.offers(name)]
        if pools:
            parts.append(f"{name} is offered by pool(s) {', '.join(pools)}")
    return "; " + "; ".join(parts) if parts else ""
