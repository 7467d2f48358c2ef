"""Why a GPU Pod is Pending, from what the cluster shows: the scheduler's reasons (its
``FailedScheduling`` message) checked against the GPU nodes the Pod could use, with which
taint, which label, how many free GPUs, which quota and which claim, and the fix for each.

It does not re-implement the scheduler: the nodes are held against the three filters of the
guide's typical message (free GPUs, taints, node affinity and selector) and cordons, only to
name what blocks; what the scheduler says beyond them is reported in its own words.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.core.inventory import pools_of
from webhook.core.pods import PodView, effective_requests
from webhook.core.pools import select_pool
from webhook.core.scheduling import (
    admits,
    expression_matches,
    required_terms,
    toleration_for,
    untolerated,
)
from webhook.core.wording import names, number, plain_number
from webhook.operations.causes import Cause
from webhook.operations.cluster_facts import (
    ClusterFacts,
    GpuNode,
)
from webhook.operations.namespace_causes import claim_causes, quota_causes, whom_to_ask
from webhook.operations.scheduler_message import SchedulerMessage, SchedulerReason
from webhook.policy.dra import DEVICE_CLASS_RESOURCE_PREFIX
from webhook.policy.model import Policy, Pool
from webhook.policy.quantity import Quantity, parse_quantity

DEFAULT_SCHEDULER = "default-scheduler"
# Lines of nodes a cause lists before it says how many more.
NODES_LISTED = 5


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """The GPU nodes of one pool the Pod can reach (``pool`` "" for GPU nodes in no declared
    pool), with their allocatable and allocated totals of each resource the Pod asks for."""

    pool: str
    nodes: tuple[str, ...]
    allocatable: Mapping[str, Quantity]
    allocated: Mapping[str, Quantity]

    def as_record(self) -> dict[str, Any]:
        return {
            "pool": self.pool or None,
            "nodes": list(self.nodes),
            "allocatable": {k: plain_number(v) for k, v in self.allocatable.items()},
            "allocated": {k: plain_number(v) for k, v in self.allocated.items()},
        }


@dataclass(frozen=True, slots=True)
class PendingFindings:
    causes: tuple[Cause, ...]
    notes: tuple[str, ...]
    pools: tuple[PoolCapacity, ...]


def gpu_requests(view: PodView) -> dict[str, Quantity]:
    """What the Pod asks of each GPU resource a node advertises in its capacity (DRA's
    extended resources, served through claims, left out)."""
    return {
        name: quantity
        for name, quantity in effective_requests(view).items()
        if not name.startswith(DEVICE_CLASS_RESOURCE_PREFIX)
    }


def pending_causes(
    pod: Mapping[str, Any],
    view: PodView,
    facts: ClusterFacts,
    policy: Policy,
    message: SchedulerMessage | None,
) -> PendingFindings:
    """The causes that keep an unscheduled Pod Pending (see the module's docstring)."""
    causes: list[Cause] = []
    notes: list[str] = []
    spec = view.spec
    requests = gpu_requests(view)
    reach = _reachable(view, facts, policy)
    pools = _capacities(reach, requests, policy)
    reasons = list(message.reasons) if message is not None else []
    found_kinds: set[str] = set()

    missing = [name for name in requests if name not in facts.advertised()]
    if missing:
        causes.append(_unadvertised(view, missing, facts))
        found_kinds.add("insufficient")
    elif requests or view.spec.get("resourceClaims"):
        offering = [n for n in reach if all(n.info.advertises(r) for r in requests)]
        if requests and not offering:
            causes.append(_offered_nowhere(view, requests, reach))
            found_kinds.add("insufficient")
        elif offering:
            blocked = _blockers(spec, offering, requests)
            if all(blocked.values()):
                found = _node_causes(view, policy, requests, offering, blocked, reasons)
                causes += found
                found_kinds.update(_REASON_OF[c.kind] for c in found)
            else:
                fitting = [n.name for n, b in blocked.items() if not b]
                said = [str(r) for r in reasons if r.kind in _NODE_REASONS]
                if said:
                    notes.append(
                        f"{number(len(fitting), 'GPU node')} can take it now ({names(fitting)}): "
                        f'the scheduler\'s last attempt ("{", ".join(said)}") is older than '
                        "that, and it tries again"
                    )
                found_kinds.update(_NODE_REASONS)
    claims = claim_causes(pod, view, facts)
    causes += claims
    if claims:
        found_kinds.add("claims")
    causes += quota_causes(pod, view, facts, policy, requests)
    for reason in reasons:
        gpu_reason = reason.kind != "insufficient" or policy.is_vendor_resource(reason.resource)
        if reason.kind in found_kinds and gpu_reason:
            continue
        cause = _scheduler_reason(reason, policy)
        if cause is not None:
            causes.append(cause)
        else:
            notes.append(
                f'the scheduler also said "{reason}": not on a GPU node this Pod can use, '
                "nothing to change for it"
            )
    scheduler = str(spec.get("schedulerName") or DEFAULT_SCHEDULER)
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
    return PendingFindings(tuple(causes), tuple(notes), pools)


# The scheduler's reasons about nodes, which the GPU nodes' facts confirm or not.
_NODE_REASONS = frozenset({"insufficient", "taint", "affinity", "unschedulable"})
# The scheduler's reason kind each node cause confirms.
_REASON_OF = {
    "insufficient-gpus": "insufficient",
    "cordoned-nodes": "unschedulable",
    "untolerated-taint": "taint",
    "node-affinity": "affinity",
}


def _reachable(view: PodView, facts: ClusterFacts, policy: Policy) -> list[GpuNode]:
    """The GPU nodes of the pools the Pod may land in, or every GPU node where no declared
    pool applies."""
    chosen = {pool.name for pool in select_pool(view, policy).pools}
    if not chosen:
        return list(facts.nodes)
    return [
        node for node in facts.nodes if any(pool.name in chosen for pool in _pools_of(node, policy))
    ]


def _pools_of(node: GpuNode, policy: Policy) -> tuple[Pool, ...]:
    return pools_of(node.info, policy)


def _capacities(
    reach: Sequence[GpuNode], requests: Mapping[str, Quantity], policy: Policy
) -> tuple[PoolCapacity, ...]:
    by_pool: dict[str, list[GpuNode]] = {}
    for node in reach:
        for pool in _pools_of(node, policy) or (None,):
            by_pool.setdefault(pool.name if pool is not None else "", []).append(node)
    found = []
    for pool_name, nodes in sorted(by_pool.items()):
        allocatable: dict[str, Quantity] = {}
        allocated: dict[str, Quantity] = {}
        advertised = {name for n in nodes for name in n.info.vendor_resources()}
        # What the Pod asks for that the nodes advertise, else what they advertise.
        resources = [r for r in requests if r in advertised] or sorted(advertised)
        for resource in resources:
            allocatable[resource] = sum(
                (_quantity(n.info.allocatable.get(resource)) for n in nodes), start=0
            )
            allocated[resource] = sum((n.allocated.get(resource, 0) for n in nodes), start=0)
        found.append(PoolCapacity(pool_name, tuple(n.name for n in nodes), allocatable, allocated))
    return tuple(found)


def _quantity(value: str | None) -> Quantity:
    return (parse_quantity(value) if value is not None else None) or 0


def _unadvertised(view: PodView, missing: list[str], facts: ClusterFacts) -> Cause:
    advertised = sorted(facts.advertised())
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


def _offered_nowhere(
    view: PodView, requests: Mapping[str, Quantity], reach: Sequence[GpuNode]
) -> Cause:
    return Cause(
        "unadvertised-resource",
        f"no GPU node it can reach advertises all of {names(list(requests))} together",
        "ask for resources one node offers together (a Pod runs on one node), or split the "
        "work into Pods that each ask for one kind",
        tuple(f"{n.name}: {', '.join(n.info.vendor_resources()) or 'nothing'}" for n in reach)[
            :NODES_LISTED
        ],
    )


def _blockers(
    spec: Mapping[str, Any], offering: Sequence[GpuNode], requests: Mapping[str, Quantity]
) -> dict[GpuNode, list[str]]:
    """Per node that offers what the Pod asks for, what keeps the Pod off it: ``cordoned``,
    ``taint``, ``affinity``, ``insufficient`` (none: it fits)."""
    tolerations = [t for t in spec.get("tolerations") or () if isinstance(t, Mapping)]
    found: dict[GpuNode, list[str]] = {}
    for node in offering:
        blockers = []
        if node.unschedulable:
            blockers.append("cordoned")
        taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in node.info.taints]
        if untolerated(tolerations, taints):
            blockers.append("taint")
        if not admits(spec, node.info.labels, node.name):
            blockers.append("affinity")
        if any(node.free(name) < quantity for name, quantity in requests.items()):
            blockers.append("insufficient")
        found[node] = blockers
    return found


def _node_causes(
    view: PodView,
    policy: Policy,
    requests: Mapping[str, Quantity],
    offering: Sequence[GpuNode],
    blocked: Mapping[GpuNode, list[str]],
    reasons: Sequence[SchedulerReason],
) -> list[Cause]:
    """A cause per kind of blocker found on the nodes that offer what the Pod asks for."""
    said = {reason.kind: str(reason) for reason in reasons}
    asked = names(list(requests)) or "its claims' devices"
    causes = []

    def scheduler_said(kind: str) -> tuple[str, ...]:
        return (f'the scheduler: "{said[kind]}"',) if kind in said else ()

    short = [n for n in offering if "insufficient" in blocked[n]]
    if short:
        whom = whom_to_ask(policy, view.namespace)
        causes.append(
            _insufficient(requests, offering, short, scheduler_said("insufficient"), whom)
        )
    cordoned = [n.name for n in offering if "cordoned" in blocked[n]]
    if cordoned:
        causes.append(
            Cause(
                "cordoned-nodes",
                f"{number(len(cordoned), 'GPU node')} offering {asked} "
                f"{'is' if len(cordoned) == 1 else 'are'} cordoned ({names(cordoned)})",
                f"uncordon {'it' if len(cordoned) == 1 else 'them'} when maintenance is over "
                f"(kubectl uncordon {cordoned[0]}); ask the cluster's administrators",
                scheduler_said("unschedulable"),
            )
        )
    tolerations = view.tolerations()
    by_taint: dict[tuple[str, str, str], list[str]] = {}
    for node in offering:
        if "taint" not in blocked[node]:
            continue
        taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in node.info.taints]
        for taint in untolerated(tolerations, taints):
            written = (str(taint["key"]), str(taint["value"]), str(taint["effect"]))
            by_taint.setdefault(written, []).append(node.name)
    for (key, value, effect), nodes in by_taint.items():
        shown = f"{key}={value}:{effect}" if value else f"{key}:{effect}"
        toleration = toleration_for({"key": key, "value": value, "effect": effect})
        causes.append(
            Cause(
                "untolerated-taint",
                f"taint {shown} on {number(len(nodes), 'GPU node')} offering {asked} is not "
                f"tolerated ({names(nodes)})",
                f"add to {view.field_path('tolerations')} (in the workload's pod template): "
                + _flow(toleration),
                scheduler_said("taint"),
            )
        )
    excluded = [n for n in offering if "affinity" in blocked[n]]
    if excluded:
        causes.append(_affinity(view, asked, excluded, scheduler_said("affinity")))
    return causes


def _insufficient(
    requests: Mapping[str, Quantity],
    offering: Sequence[GpuNode],
    short: Sequence[GpuNode],
    said: tuple[str, ...],
    whom: str,
) -> Cause:
    lacking = [
        name for name, quantity in requests.items() if any(n.free(name) < quantity for n in short)
    ]
    name = lacking[0] if lacking else next(iter(requests))
    asked = requests[name]
    most_free = max(n.free(name) for n in offering)
    largest = max(_quantity(n.info.allocatable.get(name)) for n in offering)
    details = [
        f"{n.name}: {plain_number(_quantity(n.info.allocatable.get(name)))} allocatable, "
        f"{plain_number(n.allocated.get(name, 0))} allocated, {plain_number(n.free(name))} free"
        for n in short[:NODES_LISTED]
    ]
    if len(short) > NODES_LISTED:
        details.append(f"and {number(len(short) - NODES_LISTED, 'more node')}")
    if asked > largest:
        fix = (
            f"no node has {plain_number(asked)} {name} in all (the largest has "
            f"{plain_number(largest)}): ask for at most {plain_number(largest)} per Pod and "
            "split the work across Pods"
        )
    else:
        fix = (
            f"wait for GPU Pods on these nodes to finish, ask for {plain_number(most_free)} or "
            f"fewer (the most free on one node), or add GPU nodes ({whom})"
        )
    return Cause(
        "insufficient-gpus",
        f"not enough free {name}: it asks for {plain_number(asked)} on one node; "
        f"{number(len(offering), 'GPU node')} offering it have at most "
        f"{plain_number(most_free)} free",
        fix,
        (*said, *details),
    )


def _affinity(
    view: PodView, asked: str, excluded: Sequence[GpuNode], said: tuple[str, ...]
) -> Cause:
    """Which requirement of the Pod's node selection the excluded nodes fail, with the values
    they have."""
    details: list[str] = []
    fixes: list[str] = []
    for key, value in view.node_selector().items():
        have = _values(excluded, str(key))
        if str(value) not in have:
            where = f"{view.field_path('nodeSelector')}[{key}]: {value}"
            details.append(f"{where}: {_having(str(key), have)}")
            fixes.append(
                f"write nodeSelector {key}: {have[0]}" if have else f"remove nodeSelector {key}"
            )
    for index, term in enumerate(required_terms(view.spec) or ()):
        for expr in term.get("matchExpressions") or ():
            if not isinstance(expr, Mapping):
                continue
            key = str(expr.get("key"))
            if any(expression_matches(expr, n.info.labels.get(key)) for n in excluded):
                continue
            have = _values(excluded, key)
            values = expr.get("values")
            written = f"{key} {expr.get('operator')}" + (f" {values}" if values else "")
            details.append(f"nodeSelectorTerms[{index}]: {written}: {_having(key, have)}")
            fixes.append(
                f"write a requirement on {key} the GPU nodes meet ({key}={have[0]})"
                if have
                else f"remove the requirement on {key}"
            )
    nodes = [n.name for n in excluded]
    return Cause(
        "node-affinity",
        f"its node selector or required node affinity matches none of the "
        f"{number(len(nodes), 'GPU node')} offering {asked} ({names(nodes)})",
        "; ".join(fixes) + " (in the workload's pod template)"
        if fixes
        else "make its nodeSelector and required node affinity match the GPU nodes' labels",
        (*said, *details),
    )


def _values(nodes: Sequence[GpuNode], key: str) -> list[str]:
    """The values the nodes have of a label, sorted ("" left out)."""
    return sorted({n.info.labels.get(key, "") for n in nodes} - {""})


def _having(key: str, values: list[str]) -> str:
    if not values:
        return f"no GPU node offering it has the label {key}"
    return f"the GPU nodes have {key}={', '.join(values)}"


def _scheduler_reason(reason: SchedulerReason, policy: Policy) -> Cause | None:
    """A cause for a reason of the scheduler the nodes did not confirm: its own words; None
    for a taint, affinity or cordon reason, which concerns nodes this Pod cannot use."""
    if reason.kind in ("taint", "affinity", "unschedulable"):
        return None
    if reason.kind == "insufficient" and policy.is_vendor_resource(reason.resource):
        return None
    if reason.kind == "insufficient":
        fix = f"ask for less {reason.resource}, or wait for nodes to free it"
    elif reason.kind == "claims":
        fix = "check the Pod's ResourceClaims: `kubectl get resourceclaims -n NAMESPACE`"
    else:
        fix = "not a GPU setting this tool reads: see `kubectl describe pod` for the details"
    return Cause("scheduler-reason", f'the scheduler: "{reason}"', fix)


def _flow(mapping: Mapping[str, Any]) -> str:
    """A mapping as YAML flow text: ``{key: a, operator: Exists, effect: NoSchedule}``."""
    return "{" + ", ".join(f"{k}: {v}" for k, v in mapping.items()) + "}"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
