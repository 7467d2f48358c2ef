"""Why a GPU Pod is Pending, from what the cluster shows: the scheduler's reasons (its
``FailedScheduling`` message) checked against the GPU nodes the Pod could use, with which
taint, which label, how many free GPUs, which quota and which claim, and the fix for each.

It does not re-implement the scheduler: the nodes are held against the three filters of the
guide's typical message (free GPUs, taints, node affinity and selector) and cordons, only to
name what blocks; what the scheduler says beyond them is reported in its own words.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.core.inventory import is_gpu_resource
from webhook.core.node_lifecycle import is_lifecycle_taint, node_state
from webhook.core.pods import PodView, effective_requests
from webhook.core.pools import select_pool
from webhook.core.queues import DEFAULT_SCHEDULER
from webhook.core.scheduling import (
    admits,
    untolerated,
)
from webhook.core.wording import names, number, plain_number
from webhook.operations.causes import Cause
from webhook.operations.cluster_facts import ClusterFacts, GpuNode
from webhook.operations.namespace_causes import claim_causes, pod_claims, quota_notes
from webhook.operations.node_causes import NODES_LISTED, node_causes
from webhook.operations.scheduler_message import SchedulerMessage, SchedulerReason
from webhook.policy.dra import DEVICE_CLASS_RESOURCE_PREFIX
from webhook.policy.model import POOL_ANNOTATION, Policy
from webhook.policy.quantity import Quantity

# The Pod fields that choose nodes and pools, part of its scheduling shape.
SHAPE_FIELDS = (
    "schedulingGates",
    "tolerations",
    "nodeSelector",
    "affinity",
    "nodeName",
    "resourceClaims",
)


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """The GPU nodes of one pool the Pod can reach (``pool`` "" for GPU nodes in no declared
    pool), with their allocatable and allocated totals of each resource the Pod asks for
    (``allocated`` None where its free GPUs were not compared, and the allocations not read:
    a gated Pod, or one that asks for a name no node advertises)."""

    pool: str
    nodes: tuple[str, ...]
    allocatable: Mapping[str, Quantity]
    allocated: Mapping[str, Quantity] | None

    def as_record(self) -> dict[str, Any]:
        allocated = self.allocated
        return {
            "pool": self.pool or None,
            "nodes": list(self.nodes),
            "allocatable": {k: plain_number(v) for k, v in self.allocatable.items()},
            "allocated": None
            if allocated is None
            else {k: plain_number(v) for k, v in allocated.items()},
        }


@dataclass(frozen=True, slots=True)
class PendingFindings:
    causes: tuple[Cause, ...]
    notes: tuple[str, ...]
    pools: tuple[PoolCapacity, ...]


@dataclass(frozen=True, slots=True)
class NodeFindings:
    """What the GPU nodes say of one scheduling shape of Pod: the causes and notes, the
    pools it reaches, and the scheduler's reason kinds they confirm."""

    causes: tuple[Cause, ...]
    notes: tuple[str, ...]
    pools: tuple[PoolCapacity, ...]
    confirmed: frozenset[str]


def gpu_requests(view: PodView, policy: Policy) -> dict[str, Quantity]:
    """What the Pod asks of each GPU resource (``webhook.core.inventory.is_gpu_resource``)
    a node advertises in its capacity (DRA's extended resources, served through claims, left
    out)."""
    return {
        name: quantity
        for name, quantity in effective_requests(view).items()
        if not name.startswith(DEVICE_CLASS_RESOURCE_PREFIX) and is_gpu_resource(name, policy)
    }


def pending_causes(
    pod: Mapping[str, Any],
    view: PodView,
    facts: ClusterFacts,
    policy: Policy,
    message: SchedulerMessage | None,
) -> PendingFindings:
    """The causes that keep an unscheduled Pod Pending (see the module's docstring)."""
    requests = gpu_requests(view, policy)
    reasons = message.reasons if message is not None else ()
    classes = claimed_classes_of(pod, view, facts)
    on_nodes = node_findings(view, facts, policy, requests, reasons, classes)
    causes = list(on_nodes.causes)
    notes = list(on_nodes.notes)
    found_kinds = set(on_nodes.confirmed)
    claims = claim_causes(pod, view, facts)
    causes += claims
    if claims:
        found_kinds.add("claims")
    notes += quota_notes(pod, view, facts, policy, requests)
    gpu_pod = bool(requests or view.spec.get("resourceClaims"))
    if not gpu_pod:
        notes.append("it asks for no GPU: the scheduler's reasons are told in the guide's order")
    # The scheduler lists its reasons alphabetically; they are told in the guide's order.
    for reason in sorted(reasons, key=lambda r: _GUIDE_ORDER.index(r.kind)):
        gpu_reason = reason.kind != "insufficient" or is_gpu_resource(reason.resource, policy)
        if reason.kind in found_kinds and gpu_reason:
            continue
        cause = _scheduler_reason(reason, policy, gpu_pod)
        if cause is not None:
            causes.append(cause)
        else:
            notes.append(
                f'the scheduler also said "{reason}": not on a GPU node this Pod can use, '
                "nothing to change for it"
            )
    scheduler = str(view.spec.get("schedulerName") or DEFAULT_SCHEDULER)
    if not reasons and not causes and scheduler != DEFAULT_SCHEDULER:
        causes.append(
            Cause(
                "custom-scheduler",
                f'spec.schedulerName is "{scheduler}" and that scheduler has reported nothing '
                "about it",
                f'check that "{scheduler}" runs and watches this namespace, or remove '
                "spec.schedulerName for the default scheduler",
            )
        )
    return PendingFindings(tuple(causes), tuple(notes), on_nodes.pools)


def node_findings(
    view: PodView,
    facts: ClusterFacts,
    policy: Policy,
    requests: Mapping[str, Quantity],
    reasons: tuple[SchedulerReason, ...],
    classes: tuple[str, ...] = (),
) -> NodeFindings:
    """What the GPU nodes say of the Pod: worked out once per scheduling shape (see
    :func:`scheduling_shape`, with the device classes its claims ask for) and kept in
    ``facts.shapes`` for the next Pod of that shape."""
    shape = (scheduling_shape(view, requests, reasons), classes)
    found = facts.shapes.get(shape)
    if not isinstance(found, NodeFindings):
        found = facts.shapes[shape] = _on_nodes(view, facts, policy, requests, reasons, classes)
    return found


def claimed_classes_of(
    pod: Mapping[str, Any], view: PodView, facts: ClusterFacts
) -> tuple[str, ...]:
    """The device classes the Pod's ResourceClaims ask for, as read (none without DRA)."""
    if facts.dra is None:
        return ()
    found: list[str] = []
    for _, claim_name, _ in pod_claims(pod):
        claim = facts.dra.claims.get((view.namespace, claim_name))
        for device_class in claim.device_classes if claim is not None else ():
            if device_class not in found:
                found.append(device_class)
    return tuple(found)


def scheduling_shape(
    view: PodView, requests: Mapping[str, Quantity], reasons: tuple[SchedulerReason, ...]
) -> Hashable:
    """Everything of a Pod the nodes' answer depends on: its namespace (pools open to it,
    whom to ask), what it asks for and where (the paths a cause names), the fields that
    choose nodes and pools, its scheduling gates, and the scheduler's reasons."""
    spec = view.spec
    written = json.dumps(
        [
            [spec.get(key) for key in SHAPE_FIELDS],
            view.annotations.get(POOL_ANNOTATION),
        ],
        sort_keys=True,
        default=str,
    )
    return (
        view.namespace,
        tuple(requests.items()),
        tuple(view.first_request_path(name) for name in requests),
        tuple(view.requested_gpu_names),
        written,
        reasons,
    )


def _on_nodes(
    view: PodView,
    facts: ClusterFacts,
    policy: Policy,
    requests: Mapping[str, Quantity],
    reasons: Sequence[SchedulerReason],
    classes: tuple[str, ...],
) -> NodeFindings:
    causes: list[Cause] = []
    notes: list[str] = []
    reach = _reachable(view, facts, policy)
    confirmed: set[str] = set()
    # A gated Pod is considered by no scheduler until its gates go: its free GPUs then are
    # not those of now, and the allocations are not read for it.
    compare_free = not view.spec.get("schedulingGates")
    missing = [name for name in requests if name not in facts.advertised]
    if missing:
        causes.append(_unadvertised(view, missing, facts))
        confirmed.add("insufficient")
        compare_free = False
    elif requests or view.spec.get("resourceClaims"):
        offering = [n for n in reach if all(n.info.advertises(r) for r in requests)]
        if not requests and facts.dra is not None:
            # Its claims' devices: on the nodes whose ResourceSlices publish them, where known.
            for device_class in classes:
                published = facts.dra.nodes_of(device_class)
                if published is not None:
                    offering = [n for n in offering if n.name in published]
        if requests and not offering:
            causes.append(_offered_nowhere(requests, reach))
            confirmed.add("insufficient")
        elif offering:
            blocked = _blockers(view, offering, requests, compare_free)
            if all(blocked.values()):
                found = node_causes(view, policy, requests, offering, blocked, reasons)
                causes += found
                confirmed.update(_REASON_OF[c.kind] for c in found)
                if any(c.kind == "unavailable-nodes" for c in found):
                    # The scheduler counts a lifecycle taint among the untolerated taints.
                    confirmed.add("taint")
            else:
                fitting = [n.name for n, b in blocked.items() if not b]
                said = [str(r) for r in reasons if r.kind in _NODE_REASONS]
                if said:
                    notes.append(
                        f"{number(len(fitting), 'GPU node')} "
                        f"({names(fitting)}) {'passes' if len(fitting) == 1 else 'pass'} the "
                        "checks explain makes (resources, taints, selector, affinity); the "
                        f'scheduler\'s reasons ("{", ".join(said)}") are what it saw: what '
                        "explain does not read (pod affinity or anti-affinity, topology spread, "
                        "volumes, host ports) may keep it off them, or its last attempt is older "
                        "than a change (`kubectl describe pod` shows the latest)"
                    )
                confirmed.update(_NODE_REASONS)
    if not compare_free and not missing:
        notes.append("gated: free GPUs not compared, they change before its gates are removed")
    pools = _capacities(reach, requests, with_allocated=compare_free)
    return NodeFindings(tuple(causes), tuple(notes), pools, frozenset(confirmed))


# The scheduler's reason kinds in the guide's order (``webhook.operations.causes``).
_GUIDE_ORDER = ("insufficient", "unschedulable", "taint", "affinity", "claims", "other")
# The scheduler's reasons about nodes, which the GPU nodes' facts confirm or not.
_NODE_REASONS = frozenset({"insufficient", "taint", "affinity", "unschedulable"})
# The scheduler's reason kind each node cause confirms.
_REASON_OF = {
    "insufficient-gpus": "insufficient",
    "unavailable-nodes": "unschedulable",
    "untolerated-taint": "taint",
    "node-affinity": "affinity",
}


def _reachable(view: PodView, facts: ClusterFacts, policy: Policy) -> list[GpuNode]:
    """The GPU nodes of the pools the Pod may land in, or every GPU node where no declared
    pool applies."""
    chosen = {pool.name for pool in select_pool(view, policy).pools}
    if not chosen:
        return list(facts.nodes)
    return [node for node in facts.nodes if any(pool.name in chosen for pool in node.pools)]


def _capacities(
    reach: Sequence[GpuNode], requests: Mapping[str, Quantity], *, with_allocated: bool
) -> tuple[PoolCapacity, ...]:
    by_pool: dict[str, list[GpuNode]] = {}
    for node in reach:
        for pool in node.pools or (None,):
            by_pool.setdefault(pool.name if pool is not None else "", []).append(node)
    found = []
    for pool_name, nodes in sorted(by_pool.items()):
        advertised = {name for n in nodes for name in n.resources}
        # What the Pod asks for that the nodes advertise, else what they advertise.
        resources = [r for r in requests if r in advertised] or sorted(advertised)
        allocatable = {r: sum((n.allocatable.get(r, 0) for n in nodes), start=0) for r in resources}
        allocated = (
            {r: sum((n.allocated.get(r, 0) for n in nodes), start=0) for r in resources}
            if with_allocated
            else None
        )
        found.append(PoolCapacity(pool_name, tuple(n.name for n in nodes), allocatable, allocated))
    return tuple(found)


def _unadvertised(view: PodView, missing: list[str], facts: ClusterFacts) -> Cause:
    advertised = sorted(facts.advertised)
    details = []
    suggestions = []
    for name in missing:
        close = difflib.get_close_matches(name, advertised, n=1, cutoff=0.6)
        where = view.first_request_path(name)
        if close:
            details.append(f"{where}: {name} is advertised by no node; did you mean {close[0]}?")
            suggestions.append(f"{close[0]} instead of {name}")
        else:
            details.append(f"{where}: {name} is advertised by no node")
    offered = names(advertised) if advertised else "none (no GPU node advertises anything)"
    fix = (
        f"write {', '.join(suggestions)} in resources.limits"
        if suggestions
        else f"ask for a resource the GPU nodes advertise: {offered}"
    )
    return Cause(
        "unadvertised-resource",
        f"no node advertises {names(missing)}: the scheduler has nowhere to put it "
        f"(the GPU nodes advertise {offered})",
        fix,
        tuple(details),
    )


def _offered_nowhere(requests: Mapping[str, Quantity], reach: Sequence[GpuNode]) -> Cause:
    return Cause(
        "unadvertised-resource",
        f"no GPU node it can reach advertises all of {names(list(requests))} together",
        "ask for resources one node offers together (a Pod runs on one node), or split the "
        "work into Pods that each ask for one kind",
        tuple(f"{n.name}: {', '.join(n.resources) or 'nothing'}" for n in reach)[:NODES_LISTED],
    )


def _blockers(
    view: PodView,
    offering: Sequence[GpuNode],
    requests: Mapping[str, Quantity],
    compare_free: bool,
) -> dict[GpuNode, list[str]]:
    """Per node that offers what the Pod asks for, what keeps the Pod off it, in the
    scheduler's order of filters: ``unavailable`` (NotReady, cordoned, being removed:
    ``webhook.core.node_lifecycle``), ``taint`` (another untolerated taint), ``affinity``,
    ``insufficient`` (with ``compare_free``; none: it fits)."""
    tolerations = view.tolerations()
    found: dict[GpuNode, list[str]] = {}
    for node in offering:
        blockers = []
        if node_state(tolerations, node.taints, node.unschedulable, node.ready):
            blockers.append("unavailable")
        if any(
            not is_lifecycle_taint(str(taint.get("key")))
            for taint in untolerated(tolerations, node.taints)
        ):
            blockers.append("taint")
        if not admits(view.spec, node.info.labels, node.name):
            blockers.append("affinity")
        if compare_free and any(node.free(name) < q for name, q in requests.items()):
            blockers.append("insufficient")
        found[node] = blockers
    return found


def _scheduler_reason(reason: SchedulerReason, policy: Policy, gpu_pod: bool) -> Cause | None:
    """A cause for a reason of the scheduler the GPU nodes did not confirm, in its own words;
    None, for a GPU Pod, where the reason concerns nodes it has no use for (a taint, affinity
    or cordon reason, or GPUs short on nodes that do not offer what it asks for)."""
    about_nodes = reason.kind in ("taint", "affinity", "unschedulable")
    short_of_gpus = reason.kind == "insufficient" and is_gpu_resource(reason.resource, policy)
    if gpu_pod and (about_nodes or short_of_gpus):
        return None
    if reason.kind == "insufficient":
        fix = f"ask for less {reason.resource}, or wait for nodes to free it"
    elif about_nodes:
        fix = "make its tolerations, nodeSelector and node affinity fit the nodes it should run on"
    elif reason.kind == "claims":
        fix = "check the Pod's ResourceClaims: `kubectl get resourceclaims -n NAMESPACE`"
    else:
        fix = "not a GPU setting this tool reads: see `kubectl describe pod` for the details"
    return Cause("scheduler-reason", f'the scheduler: "{reason}"', fix)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
