"""The causes a Pending GPU Pod's blocked nodes show (``webhook.operations.pending`` finds,
per node that offers what the Pod asks for, what keeps the Pod off it): not enough free GPUs,
cordons, untolerated taints, node selection that fails, each named with its nodes, what the
scheduler said of it, and the fix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
        for taint in untolerated(tolerations, node.taints):
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
    largest = max(n.allocatable.get(name, 0) for n in offering)
    details = [
        f"{n.name}: {plain_number(n.allocatable.get(name, 0))} allocatable, "
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


def _flow(mapping: Mapping[str, Any]) -> str:
    """A mapping as YAML flow text: ``{key: a, operator: Exists, effect: NoSchedule}``."""
    return "{" + ", ".join(f"{k}: {v}" for k, v in mapping.items()) + "}"


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
