"""Why a Pod bound to a node by ``spec.nodeName`` cannot run there: ``spec.nodeName`` skips
the scheduler, so no node is filtered and no FailedScheduling is written; the node's kubelet
admits the Pod or rejects it (``status.reason``: ``OutOf<resource>``, ``NodeAffinity``,
``UnexpectedAdmissionError``, and the Pod is Failed for good), or it waits Pending on a node
whose GPUs are taken."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.pods import PodView
from webhook.core.wording import plain_number
from webhook.operations.causes import Cause
from webhook.operations.cluster_facts import ClusterFacts, GpuNode
from webhook.operations.namespace_causes import whom_to_ask
from webhook.operations.pending import gpu_requests
from webhook.policy.model import Policy

OUT_OF = "OutOf"
_NODE_NAME_FIX = (
    "remove spec.nodeName and let the scheduler choose a node (a nodeSelector on "
    "kubernetes.io/hostname keeps it on that node, and the scheduler then waits for room)"
)


def kubelet_rejection(
    view: PodView | None,
    status: Mapping[str, Any],
    node_name: str,
    facts: ClusterFacts | None,
    policy: Policy,
) -> Cause | None:
    """The kubelet's admission failure of a Failed Pod (None: it ran and ended)."""
    reason = str(status.get("reason") or "")
    message = " ".join(str(status.get("message") or "").split())
    if not (reason.startswith(OUT_OF) or reason in ("NodeAffinity", "UnexpectedAdmissionError")):
        return None
    node = f"node {node_name}" if node_name else "its node"
    said = (f"status.reason {reason}: {message}",) if message else (f"status.reason {reason}",)
    recreate = "; the Pod stays Failed: delete it (its controller, if any, makes another)"
    if reason.startswith(OUT_OF):
        resource = reason.removeprefix(OUT_OF)
        gpu_node = _gpu_node(facts, node_name)
        offers = (
            f"{plain_number(gpu_node.allocatable.get(resource, 0))} {resource} allocatable"
            if gpu_node is not None
            else f"no {resource} (it is no GPU node)"
            if facts is not None
            else f"too little {resource}"
        )
        return Cause(
            "kubelet-rejected",
            f"the kubelet of {node} rejected it, out of {resource}: {node} has {offers}, and "
            "spec.nodeName put it there without the scheduler",
            _NODE_NAME_FIX + recreate,
            said,
        )
    if reason == "NodeAffinity":
        return Cause(
            "kubelet-rejected",
            f"the kubelet of {node} rejected it: its nodeSelector or node affinity does not "
            "match the node spec.nodeName names",
            _NODE_NAME_FIX + ", or make its node selection match that node" + recreate,
            said,
        )
    whom = whom_to_ask(policy, view.namespace) if view is not None else "ask the platform team"
    return Cause(
        "kubelet-rejected",
        f"the kubelet of {node} failed to admit it (its device plugin could not hand over the "
        "devices)",
        f"the device plugin on {node} is failing: the cluster's administrators check its Pod's "
        f"logs ({whom}){recreate}",
        said,
    )


def bound_short(view: PodView, node_name: str, node: GpuNode | None, policy: Policy) -> list[Cause]:
    """A Pending Pod bound to a node that has fewer free GPUs than it asks for (its own
    request is among the node's allocations, and left out of them here)."""
    requests = gpu_requests(view, policy)
    lines = []
    for name, asked in requests.items():
        if node is None:
            lines.append(f"{name}: it asks for {plain_number(asked)}, the node offers none")
            continue
        others = max(node.allocated.get(name, 0) - asked, 0)
        free = max(node.allocatable.get(name, 0) - others, 0)
        if free < asked:
            lines.append(
                f"{name}: it asks for {plain_number(asked)}, the node has "
                f"{plain_number(node.allocatable.get(name, 0))} allocatable, "
                f"{plain_number(others)} taken by other Pods, {plain_number(free)} free"
            )
    if not lines:
        return []
    return [
        Cause(
            "kubelet-rejected",
            f"spec.nodeName binds it to node {node_name}, which lacks the GPUs it asks for: "
            "its kubelet rejects it (OutOf<resource>) or it waits",
            _NODE_NAME_FIX,
            tuple(lines),
        )
    ]


def _gpu_node(facts: ClusterFacts | None, name: str) -> GpuNode | None:
    if facts is None:
        return None
    return next((n for n in facts.nodes if n.name == name), None)
