"""Which GPU pool a Pod lands in: one decision shared by the validate and the mutate path.

The mutating webhook injects what the chosen pool needs; the validating webhook re-derives
the same choice on the final object and denies a Pod whose choice is impossible (pinned to a
pool that does not offer its resources), ambiguous (its resources mean different sharing modes
in the pools it could land in) or forbidden (its namespace may not use those pools).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from webhook.core.dra import claimed_classes
from webhook.core.inventory import NodeInfo, bound_to_cpu_node, named_node, pools_of
from webhook.core.pods import PodView
from webhook.core.scheduling import expression_matches, term_allows_labels, tolerates
from webhook.policy.dra import DEVICE_CLASS_RESOURCE_PREFIX
from webhook.policy.model import POOL_ANNOTATION, Policy, Pool, ResourceSpec


class PendsForever(NamedTuple):
    """No pool its node selection admits offers everything the Pod asks for (``sharing-mode``):
    ``compatible``, the pools its node selection admits, ``offering`` those that offer all of
    it; ``pinned``, its node selection excludes some pool; ``unpooled``, what it asks for is
    offered outside every pool only."""

    requested: tuple[str, ...]
    compatible: tuple[Pool, ...]
    offering: tuple[Pool, ...]
    pinned: bool
    unpooled: bool = False


class ClosedToNamespace(NamedTuple):
    """Every pool that offers what the Pod asks for is closed to its namespace
    (``pool-access``)."""

    requested: tuple[str, ...]
    candidates: tuple[Pool, ...]


class Ambiguous(NamedTuple):
    """The Pod's pools give ``resource`` different sharing modes (``pool-access``):
    (pool name, mode) for each."""

    resource: str
    modes: tuple[tuple[str, str], ...]


class UnknownPool(NamedTuple):
    """The pool annotation names no declared pool (``pool-access``)."""

    name: str


class PoolLacks(NamedTuple):
    """The pool the annotation names does not offer ``missing``, or (none missing) the Pod's
    node selection excludes its nodes (``sharing-mode``); with ``node``, the pool of the node
    the Pod's ``nodeName`` names, as the node inventory knows it."""

    pool: Pool
    missing: tuple[str, ...]
    requested: tuple[str, ...]
    node: str = ""


class PoolClosed(NamedTuple):
    """The pool the annotation names is closed to the namespace (``pool-access``)."""

    pool: Pool


# Why a Pod's pool choice is impossible, forbidden or ambiguous: facts, which the sharing-mode
# and pool-access checks turn into their findings.
Problem = PendsForever | ClosedToNamespace | Ambiguous | UnknownPool | PoolLacks | PoolClosed


class Selection(NamedTuple):
    """``pools``: where the Pod may land, the candidates its namespace may use (or, when it may
    use none, every candidate: a Pod admitted anyway still gets a place); empty when no
    declared pool applies. ``taints``: what it must tolerate there; ``problems``: why the
    choice is impossible, forbidden or ambiguous; ``requested``: the declared GPU resources it
    asks for; ``closed``: candidates its namespace may not use, which it must be kept off;
    ``passed_over``: candidates it may use that its tenant's preference did not choose and that
    give its resources another sharing mode, which it must be kept off too.
    """

    pools: tuple[Pool, ...]
    taints: tuple[Mapping[str, Any], ...]
    problems: tuple[Problem, ...]
    requested: tuple[str, ...]
    closed: tuple[Pool, ...] = ()
    passed_over: tuple[Pool, ...] = ()


NO_GPU = Selection((), (), (), ())


def _pooled_requests(view: PodView, policy: Policy) -> tuple[str, ...]:
    """What the Pod asks for that chooses a pool: the declared GPU resources, not DRA's
    extended resources (``deviceclass.resource.kubernetes.io/<class>``: pools declare the
    classes, below); undeclared vendor resources are the resource-name rule's
    (unknownResources), companion resources go with any pool. Then the DRA device classes
    its claims surely ask for (read from the inventory's templates) that some pool declares
    (``pools[].deviceClasses``): a class no pool names chooses none."""
    requested = tuple(
        name
        for name in view.requested_gpu_names
        if name in policy.declared_names and not name.startswith(DEVICE_CLASS_RESOURCE_PREFIX)
    )
    if view.pod_claims is None or not view.pod_claims.by_name:
        return requested
    classes = tuple(c for c in claimed_classes(view, policy) if c in policy.pooled_names)
    return requested + classes


def select_pool(view: PodView, policy: Policy) -> Selection:
    """Where the Pod may land and what it must tolerate there; decided once per view."""
    selection = view.selection
    if selection is None:
        selection = view.selection = _select(view, policy)
    return selection


def _select(view: PodView, policy: Policy) -> Selection:
    requested = _pooled_requests(view, policy)
    if not requested:
        return NO_GPU
    placed = named_node_pools(view, policy)
    if placed is not None and placed[1]:
        return _on_node(view, policy, *placed, requested)
    annotation = view.annotations.get(POOL_ANNOTATION)
    if annotation is not None and policy.pools:
        return _explicit(view, policy, str(annotation), requested)
    if policy.pooled_names.isdisjoint(requested):
        # Offered outside every declared pool only: the GPU nodes of gpuNodeTaints, which
        # carry none of the pools' labels.
        if policy.pools and not _admits_unpooled(view, policy):
            compatible = tuple(p for p in policy.pools if _compatible(view, p))
            problem = PendsForever(requested, compatible, (), True, unpooled=True)
            return Selection((), (), (problem,), requested)
        return Selection((), policy.gpu_node_taints, (), requested)

    offering = tuple(p for p in policy.pools if all(map(p.offers, requested)))
    compatible = tuple(p for p in policy.pools if _compatible(view, p))
    pinned = len(compatible) < len(policy.pools)
    candidates = tuple(p for p in offering if p in compatible)
    if not candidates:
        problem = PendsForever(requested, compatible, offering, pinned)
        return Selection((), (), (problem,), requested)
    allowed = tuple(p for p in candidates if policy.may_use(p, view.namespace))
    closed = tuple(p for p in candidates if not policy.may_use(p, view.namespace))
    passed_over: tuple[Pool, ...] = ()
    if len(allowed) > 1:
        # The tenant's preferred pool decides among those it may use, before the Pod is found
        # ambiguous or confined to all of them.
        preference = policy.pool_preference(view.namespace)
        preferred = next((p for name in preference for p in allowed if p.name == name), None)
        if preferred is not None:
            passed_over = tuple(
                p
                for p in allowed
                if p is not preferred and _mode_conflict((preferred, p), requested) is not None
            )
            allowed = (preferred,)
    problems: list[Problem] = []
    if not allowed:
        problems.append(ClosedToNamespace(requested, candidates))
    # Selection does not depend on how its findings are reported: a Pod admitted despite them
    # (Warn, Audit, an exemption) still gets a place, the candidates, and is confined to them.
    chosen = allowed or candidates
    conflict = _mode_conflict(chosen, requested)
    if conflict is not None:
        problems.append(conflict)
    return Selection(
        chosen,
        _union_taints(chosen),
        tuple(problems),
        requested,
        closed if allowed else (),
        passed_over,
    )


def _explicit(view: PodView, policy: Policy, name: str, requested: tuple[str, ...]) -> Selection:
    pool = next((p for p in policy.pools if p.name == name), None)
    if pool is None:
        return Selection((), (), (UnknownPool(name),), requested)
    missing = tuple(n for n in requested if not pool.offers(n))
    if missing or not _compatible(view, pool):
        return Selection((), (), (PoolLacks(pool, missing, requested),), requested)
    if policy.may_use(pool, view.namespace):
        return Selection((pool,), pool.taints, (), requested)
    return Selection((pool,), pool.taints, (PoolClosed(pool),), requested)


def named_node_pools(view: PodView, policy: Policy) -> tuple[NodeInfo, tuple[Pool, ...]] | None:
    """Where ``spec.nodeName`` puts the Pod, as far as the node inventory can tell: the node
    and its pools, narrowed by the Pod's pool annotation (none for a CPU node). None where it
    cannot tell, and the Pod is judged as without the inventory: no inventory or a node it
    does not know, a GPU node no pool selects (its pool label may be on its way), a pool
    annotation naming none of the node's pools, pools that give the Pod's GPU resources
    different sharing modes. The one answer for pool selection and the pool-access rule."""
    name = view.spec.get("nodeName")
    node = named_node(view.nodes, name, policy)
    if node is None:
        return None
    pools = pools_of(node, policy)
    if not pools:
        return (node, ()) if bound_to_cpu_node(view.nodes, name, policy) else None
    annotation = view.annotations.get(POOL_ANNOTATION)
    if annotation is not None:
        pools = tuple(p for p in pools if p.name == str(annotation))
        if not pools:
            return None
    requested = _pooled_requests(view, policy)
    offering = tuple(p for p in pools if all(map(p.offers, requested)))
    if requested and _mode_conflict(offering, requested) is not None:
        return None
    return node, pools


def _on_node(
    view: PodView,
    policy: Policy,
    node: NodeInfo,
    pools: tuple[Pool, ...],
    requested: tuple[str, ...],
) -> Selection:
    """The selection of a Pod that ``nodeName`` puts in ``pools`` (``named_node_pools``):
    those that offer what it asks for, or a warning that none does. Whether the namespace may
    use them is the pool-access rule's ``nodeName`` finding for a Pod; a template, whose Pods
    that finding will refuse, is told now."""
    offering = tuple(p for p in pools if all(map(p.offers, requested)))
    if not offering:
        missing = tuple(n for n in requested if not pools[0].offers(n))
        problem = PoolLacks(pools[0], missing, requested, node.name)
        return Selection((), (), (problem,), requested)
    problems: tuple[Problem, ...] = ()
    is_pod = view.kind == "Pod" and view.spec_path == "spec"
    if not is_pod and not any(policy.may_use(p, view.namespace) for p in offering):
        problems = (ClosedToNamespace(requested, offering),)
    return Selection(offering, _union_taints(offering), problems, requested)


def _compatible(view: PodView, pool: Pool) -> bool:
    """Whether the Pod's own nodeSelector and required node affinity admit the pool's nodes."""
    labels = pool.node_selector
    for key, value in view.node_selector().items():
        if key in labels and labels[key] != value:
            return False
    terms = view.required_terms()
    return not terms or any(term_allows_labels(term, labels) for term in terms)


def _admits_unpooled(view: PodView, policy: Policy) -> bool:
    """Whether the Pod's node selection admits a GPU node outside every pool: one that carries
    no pool's label keys (absent labels are judged as the scheduler judges them)."""
    keys = policy.gpu_label_keys
    if any(key in keys for key in view.node_selector()):
        return False
    terms = view.required_terms()
    return not terms or any(
        all(
            expression_matches(e, None)
            for e in (term.get("matchExpressions") or [])
            if isinstance(e, dict) and e.get("key") in keys
        )
        for term in terms
    )


def _mode_conflict(pools: tuple[Pool, ...], names: tuple[str, ...]) -> Ambiguous | None:
    """Ambiguity: the pools the Pod may land in give one of its resources different sharing
    modes, so where it lands decides what it gets. Otherwise it is confined to all of them."""
    for name in names:
        modes = tuple((p.name, p.resources[name].sharing) for p in pools if name in p.resources)
        if len({mode for _, mode in modes}) > 1:
            return Ambiguous(name, modes)
    return None


def _union_taints(pools: tuple[Pool, ...]) -> tuple[Mapping[str, Any], ...]:
    taints: list[Mapping[str, Any]] = []
    for pool in pools:
        for taint in pool.taints:
            if taint not in taints:
                taints.append(taint)
    return tuple(taints)


# --- Confinement ------------------------------------------------------------------------


def confining_expressions(view: PodView, selection: Selection) -> tuple[dict[str, Any], ...]:
    """The matchExpressions to add to every required nodeSelectorTerm of the Pod so that it can
    land only in ``selection.pools``: the chosen pool's labels (``key In [value]``), or for
    several pools their shared label key (``key In [values]``); then ``key NotIn [value]`` for
    each closed pool those do not already exclude. Add-only: the Pod's own terms stay."""
    chosen = selection.pools
    if not chosen:
        return ()
    expressions: list[dict[str, Any]] = []
    if all(p.require_node_affinity for p in chosen) and not _pinned(view, chosen):
        if len(chosen) == 1:
            labels = chosen[0].node_selector
            expressions = [
                {"key": k, "operator": "In", "values": [labels[k]]} for k in sorted(labels)
            ]
        else:
            key = _shared_key(chosen, selection.closed)
            if key is not None:
                values = sorted({p.node_selector[key] for p in chosen})
                expressions = [{"key": key, "operator": "In", "values": values}]
    for pool in selection.closed:
        if any(_excludes(e, pool) for e in expressions) or not _compatible(view, pool):
            continue
        label = _identifying_label(pool, chosen)
        if label is not None:
            expressions.append({"key": label[0], "operator": "NotIn", "values": [label[1]]})
    return tuple(expressions)


def _pinned(view: PodView, pools: tuple[Pool, ...]) -> bool:
    """The Pod's nodeSelector already names every label of one of the pools."""
    selector = view.node_selector()
    return any(all(selector.get(k) == v for k, v in p.node_selector.items()) for p in pools)


def _shared_key(chosen: tuple[Pool, ...], closed: tuple[Pool, ...]) -> str | None:
    """A label key every chosen and closed pool sets, whose values tell them apart."""
    keys = set.intersection(*(set(p.node_selector) for p in (*chosen, *closed)))
    for key in sorted(keys):
        if not {p.node_selector[key] for p in chosen} & {p.node_selector[key] for p in closed}:
            return key
    return None


def _excludes(expression: Mapping[str, Any], pool: Pool) -> bool:
    return not expression_matches(expression, pool.node_selector.get(expression["key"]))


def _identifying_label(pool: Pool, others: tuple[Pool, ...]) -> tuple[str, str] | None:
    """A label of ``pool`` that none of ``others`` carries with the same value."""
    for key in sorted(pool.node_selector):
        value = pool.node_selector[key]
        if all(other.node_selector.get(key) != value for other in others):
            return key, value
    return None


def reachable_closed_pools(view: PodView, policy: Policy) -> list[Pool]:
    """Pools closed to the Pod's namespace that offer what it asks for and that its final spec
    does not keep it off (``_can_land``)."""
    requested = select_pool(view, policy).requested
    if not requested:
        return []
    return [
        pool
        for pool in policy.pools
        if not policy.may_use(pool, view.namespace)
        and all(map(pool.offers, requested))
        and _can_land(view, pool)
    ]


def reachable_passed_over_pools(view: PodView, policy: Policy) -> list[Pool]:
    """Pools its tenant's preference passed over (``Selection.passed_over``) that the Pod's
    final spec does not keep it off: there its resources would mean another sharing mode."""
    return [pool for pool in select_pool(view, policy).passed_over if _can_land(view, pool)]


def _can_land(view: PodView, pool: Pool) -> bool:
    """Whether the Pod's final spec lets it land in the pool: its required node selection
    admits the pool's nodes and it tolerates their NoSchedule and NoExecute taints."""
    if not _compatible(view, pool):
        return False
    tolerations = view.tolerations()
    return not any(
        t["effect"] in ("NoSchedule", "NoExecute")
        and not any(tolerates(tol, t) for tol in tolerations)
        for t in pool.taints
    )


def closed_pools_tolerated(view: PodView, policy: Policy) -> list[tuple[Pool, bool]]:
    """Pools closed to the Pod's namespace that a Pod asking for no GPU could still land in,
    with whether only a wildcard toleration gets it there: the pool has a NoSchedule or
    NoExecute taint (an untainted pool keeps no Pod off), the Pod's tolerations tolerate every
    such taint and its required node selection does not exclude the pool."""
    tolerations = view.tolerations()
    if not tolerations:
        return []
    keyed = [t for t in tolerations if t.get("key")]
    found = []
    for pool in policy.pools:
        hard = [t for t in pool.taints if t["effect"] in ("NoSchedule", "NoExecute")]
        if not hard or policy.may_use(pool, view.namespace) or not _compatible(view, pool):
            continue
        if all(any(tolerates(tol, t) for tol in keyed) for t in hard):
            found.append((pool, False))
        elif all(any(tolerates(tol, t) for tol in tolerations) for t in hard):
            found.append((pool, True))
    return found


def resource_spec(view: PodView, policy: Policy, name: str) -> ResourceSpec | None:
    """The declaration of a resource for this Pod: its pool's, else the cluster-wide one."""
    selection = select_pool(view, policy)
    for pool in selection.pools:
        if name in pool.resources:
            return pool.resources[name]
    return policy.resources.get(name)
