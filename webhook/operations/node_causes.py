"""The causes a Pending GPU Pod's blocked nodes show (``webhook.operations.pending`` finds,
per node that offers what the Pod asks for, what keeps the Pod off it): not enough free GPUs,
nodes out of use (NotReady, cordoned, being removed), untolerated taints, node selection that
fails, each named with its nodes, what the
scheduler said of it, and the fix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.core.node_lifecycle import is_lifecycle_taint, node_state
from webhook.core.pods import PodView
from webhook.core.scheduling import expression_matches, required_terms, toleration_for, untolerated
from webhook.core.wording import names, number, plain_number
from webhook.operations.causes import Cause
from webhook.operations.cluster_facts import GpuNode
from webhook.operations.namespace_causes import whom_to_ask
from webhook.operations.scheduler_message import SchedulerReason
from webhook.policy.model import Policy
from webhook.policy.quantity import Quantity

# Lines of nodes a cause lists before it says how many more.
NODES_LISTED = 5
# Values of a label a cause lists before it says how many more.
VALUES_LISTED = 8


def node_causes(
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
    whom = whom_to_ask(policy, view.namespace)
    causes = []

    def scheduler_said(*kinds: str) -> tuple[str, ...]:
        return tuple(f'the scheduler: "{said[kind]}"' for kind in kinds if kind in said)

    # The scheduler gives each node the first filter it fails: the free GPUs of a node
    # something else blocks are not what keeps the Pod off it.
    short = [n for n in offering if blocked[n] == ["insufficient"]]
    if short:
        causes.append(_insufficient(view, requests, short, scheduler_said("insufficient"), whom))
    tolerations = view.tolerations()
    by_taint: dict[tuple[str, str, str], list[str]] = {}
    for node in offering:
        if "taint" not in blocked[node]:
            continue
        for taint in untolerated(tolerations, node.taints):
            if is_lifecycle_taint(str(taint["key"])):
                continue
            written = (str(taint["key"]), str(taint["value"]), str(taint["effect"]))
            by_taint.setdefault(written, []).append(node.name)
    unavailable = [n for n in offering if "unavailable" in blocked[n]]
    if unavailable:
        # The scheduler counts a lifecycle taint among the untolerated ones: its words are
        # this cause's where no other taint is.
        kinds = ("unschedulable",) if by_taint else ("unschedulable", "taint")
        causes.append(_unavailable(view, asked, unavailable, scheduler_said(*kinds)))
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
    # Node selection is a cause only where it rules out every node offering what the Pod
    # asks for: where some match, it chose them, and what keeps the Pod off those is told.
    excluded = [n for n in offering if "affinity" in blocked[n]]
    if excluded and len(excluded) == len(offering):
        causes.append(_affinity(view, asked, excluded, scheduler_said("affinity")))
    return causes


def _unavailable(
    view: PodView, asked: str, nodes: Sequence[GpuNode], said: tuple[str, ...]
) -> Cause:
    """GPU nodes out of use by their health or maintenance (``webhook.core.node_lifecycle``):
    nothing in the Pod to change, no toleration to write."""
    tolerations = view.tolerations()
    by_state: dict[str, list[str]] = {}
    for node in nodes:
        state = node_state(tolerations, node.taints, node.unschedulable, node.ready)
        by_state.setdefault(state, []).append(node.name)
    states = " / ".join(
        f"{state} ({names(listed, NODES_LISTED)})" for state, listed in by_state.items()
    )
    return Cause(
        "unavailable-nodes",
        f"{number(len(nodes), 'GPU node')} offering {asked} "
        f"{'is' if len(nodes) == 1 else 'are'} {states}",
        "node health or maintenance, nothing to change in the Pod (no toleration: the Pod "
        "would land on a node that cannot run it): ask the cluster's administrators to "
        f"repair, uncordon or replace {'it' if len(nodes) == 1 else 'them'} "
        f"(`kubectl describe node {nodes[0].name}`)",
        said,
    )


def _insufficient(
    view: PodView,
    requests: Mapping[str, Quantity],
    short: Sequence[GpuNode],
    said: tuple[str, ...],
    whom: str,
) -> Cause:
    """Not enough free GPUs on the nodes nothing else blocks (``short``): the fixes in the
    guide's order, each cause before more nodes."""
    lacking = [
        name for name, quantity in requests.items() if any(n.free(name) < quantity for n in short)
    ]
    name = lacking[0] if lacking else next(iter(requests))
    asked = requests[name]
    most_free = max(n.free(name) for n in short)
    largest = max(n.allocatable.get(name, 0) for n in short)
    largest_capacity = max(n.capacity.get(name, 0) for n in short)
    gaps = [n for n in short if n.capacity.get(name, 0) > n.allocatable.get(name, 0)]
    details = [_node_line(n, name) for n in short[:NODES_LISTED]]
    if len(short) > NODES_LISTED:
        details.append(f"and {number(len(short) - NODES_LISTED, 'more node')}")
    fixes = []
    if asked <= largest:
        fixes.append("wait for GPU Pods on these nodes to finish")
        if 0 < most_free < asked:
            fixes.append(f"ask for {plain_number(most_free)} or fewer (the most free on one node)")
    if gaps:
        fixes.append(
            f"{names([n.name for n in gaps])}: {name} capacity above allocatable, its device "
            "plugin is down or reports GPUs unhealthy: ask the cluster's administrators to "
            f"repair {'it' if len(gaps) == 1 else 'them'} "
            f"(`kubectl describe node {gaps[0].name}`, the device plugin Pod's logs)"
        )
    if asked > largest_capacity and largest_capacity > 0:
        fixes.append(
            f"no node has {plain_number(asked)} {name} in all (the largest has "
            f"{plain_number(largest_capacity)}): ask for at most "
            f"{plain_number(largest_capacity)} per Pod and split the work across Pods"
        )
    fixes.append(f"add GPU nodes ({whom})")
    one = len(short) == 1
    return Cause(
        "insufficient-gpus",
        f"not enough free {name}: it asks for {plain_number(asked)} on one node "
        f"({_asking(view, name)}); {number(len(short), 'GPU node')} offering it that nothing "
        f"else blocks {'has' if one else 'have'} {'' if one else 'at most '}"
        f"{plain_number(most_free)} free",
        "; or ".join(fixes),
        (*said, *details),
    )


def _node_line(node: GpuNode, name: str) -> str:
    capacity = node.capacity.get(name, 0)
    allocatable = node.allocatable.get(name, 0)
    gap = f"{plain_number(capacity)} capacity but " if capacity > allocatable else ""
    return (
        f"{node.name}: {gap}{plain_number(allocatable)} allocatable, "
        f"{plain_number(node.allocated.get(name, 0))} allocated, "
        f"{plain_number(node.free(name))} free"
    )


def _asking(view: PodView, name: str) -> str:
    """The containers whose asks make the Pod's request of ``name`` (the scheduler's count,
    ``webhook.core.requests``): the init container whose ask is the peak, else the app
    containers (and sidecars) together."""
    peak: tuple[Quantity, str] | None = None
    sidecars: list[tuple[Quantity, str]] = []
    apps: list[tuple[Quantity, str]] = []
    for container in view.containers:
        quantity = container.gpu_quantity.get(name)
        if quantity is None or quantity <= 0:
            continue
        if container.list_name == "initContainers" and not container.is_sidecar:
            running = quantity + sum((q for q, _ in sidecars), start=0)
            if peak is None or running > peak[0]:
                peak = (running, container.path)
        elif container.is_sidecar:
            sidecars.append((quantity, container.path))
        else:
            apps.append((quantity, container.path))
    together = [*sidecars, *apps]
    total = sum((q for q, _ in together), start=0)
    if peak is not None and peak[0] > total:
        return peak[1]
    if len(together) == 1:
        return together[0][1]
    return " + ".join(f"{path} {plain_number(q)}" for q, path in together)


def _affinity(
    view: PodView, asked: str, excluded: Sequence[GpuNode], said: tuple[str, ...]
) -> Cause:
    """Which requirement of the Pod's node selection the nodes fail, with the values they
    have: the user picks the hardware, explain names what there is."""
    details: list[str] = []
    fixes: list[str] = []
    for key, value in view.node_selector().items():
        have = _values(excluded, str(key))
        if str(value) not in have:
            where = f"{view.field_path('nodeSelector')}[{key}]: {value}"
            details.append(f"{where}: {_having(str(key), have)}")
            fixes.append(_relabel(f"nodeSelector {key}", have))
    for index, term in enumerate(required_terms(view.spec) or ()):
        for expr in _list(term.get("matchExpressions")):
            if not isinstance(expr, Mapping):
                continue
            key = str(expr.get("key"))
            if any(expression_matches(expr, n.info.labels.get(key)) for n in excluded):
                continue
            have = _values(excluded, key)
            values = expr.get("values")
            written = f"{key} {expr.get('operator')}" + (f" {values}" if values else "")
            details.append(f"nodeSelectorTerms[{index}]: {written}: {_having(key, have)}")
            fixes.append(_relabel(f"the requirement on {key}", have))
    nodes = [n.name for n in excluded]
    fix = (
        "; ".join(fixes) + " (in the workload's pod template)"
        if fixes
        else "make its nodeSelector and required node affinity match the GPU nodes' labels"
    )
    return Cause(
        "node-affinity",
        f"its node selector or required node affinity matches none of the "
        f"{number(len(nodes), 'GPU node')} offering {asked} ({names(nodes)})",
        fix,
        (*said, *details),
    )


def _relabel(written: str, have: list[str]) -> str:
    """The fix of one requirement: the values are listed in the details, the hardware is the
    user's to pick."""
    if not have:
        return f"remove {written}"
    return f"change {written} to one of the values the GPU nodes have (above), or remove it"


def _values(nodes: Sequence[GpuNode], key: str) -> list[str]:
    """The values the nodes have of a label, sorted ("" left out)."""
    return sorted({n.info.labels.get(key, "") for n in nodes} - {""})


def _having(key: str, values: list[str]) -> str:
    if not values:
        return f"no GPU node offering it has the label {key}"
    return f"the GPU nodes have {key}={names(values, VALUES_LISTED)}"


def _flow(mapping: Mapping[str, Any]) -> str:
    """A mapping as YAML flow text: ``{key: a, operator: Exists, effect: NoSchedule}``."""
    return "{" + ", ".join(f"{k}: {v}" for k, v in mapping.items()) + "}"


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
