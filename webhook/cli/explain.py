"""``gpu-admission explain``: why a GPU Pod is Pending, or runs and cannot see its GPU
(``webhook.operations.explain``), live from the cluster or offline from a file."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from webhook.audit.documents import Document, DocumentError, parse, read_text
from webhook.cli.common import add_command, add_policy_argument, error, policy_from
from webhook.cluster.connection import connect
from webhook.core.wording import number, plain_number
from webhook.operations.cluster_facts import read_cluster_facts, read_pod
from webhook.operations.explain import Explanation, explain_pod

EXAMPLES = """\
examples:
  gpu-admission explain pod trainer-0 -n ml          # why is it Pending?
  kubectl gpu-admission explain pod trainer-0 -n ml  # the same, as a kubectl plugin
  gpu-admission explain pod/trainer-0 -n ml -o json | jq -r '.causes[0].fix'
  gpu-admission explain -f pod.yaml --policy my-policy.yaml   # offline: verdict and spec

Live, it reads the Pod, its FailedScheduling events, the Nodes and the Pods bound to them
(allocated GPUs), the ResourceQuotas of its namespace and, for a Pod that claims devices,
ResourceClaims, DeviceClasses and ResourceSlices. Offline (-f) it judges the file with the
policy and reads what the Pod spec shows; causes in the cluster need the live form.

exit status: 0 nothing blocks it, 1 causes found, 2 could not run.
"""
POD_KINDS = ("pod", "pods", "po")


def add_subcommands(commands: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(
        commands,
        "explain",
        summary="say why a GPU Pod is Pending or cannot see its GPU, and the fix",
        description="Explain one GPU Pod: for a Pending Pod, the scheduler's reasons checked "
        "against the GPU nodes it can use (free GPUs, taints, node labels), resource names no "
        "node advertises, exhausted GPU quotas, unallocatable claims and the policy's verdict; "
        "for a running Pod, what in it keeps its containers from their GPU. Each cause with "
        "its fix, in the order to address them.",
        epilog=EXAMPLES,
    )
    parser.add_argument("kind", nargs="?", metavar="pod", help="pod (or pod/NAME)")
    parser.add_argument("name", nargs="?", metavar="NAME", help="the Pod's name")
    parser.add_argument(
        "-f",
        "--filename",
        metavar="FILE",
        help="explain the Pods of a manifest file (- for standard input) offline",
    )
    parser.add_argument(
        "-n",
        "--namespace",
        help="the Pod's namespace (default: the kubeconfig context's; with -f, for Pods that "
        "name none: default)",
    )
    add_policy_argument(parser)
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="default: $KUBECONFIG, then in-cluster, then ~/.kube/config",
    )
    parser.add_argument("--context")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    name = _pod_name(args)
    if name is None:
        return 2
    policy = policy_from(args)
    if args.filename:
        explanations = _offline(args, policy)
        if explanations is None:
            return 2
    else:
        with connect(args.kubeconfig, args.context) as cluster:
            namespace = args.namespace or cluster.namespace
            pod = read_pod(cluster, namespace, name)
            facts = read_cluster_facts(cluster, policy, [pod])
            # Inside: the facts read the allocations when the explanation first needs them.
            explanations = [explain_pod(pod, facts, policy)]
    if args.output == "json":
        document: Any = [e.as_record() for e in explanations]
        print(json.dumps(document[0] if len(document) == 1 else document, indent=2))
    else:
        print("\n\n".join(render(e) for e in explanations))
    return 1 if any(e.blocked for e in explanations) else 0


def _pod_name(args: argparse.Namespace) -> str | None:
    """The Pod's name from ``pod NAME`` or ``pod/NAME`` ("" with -f); None, reported, when
    the arguments say neither or both."""
    kind, name = args.kind, args.name
    if kind and "/" in kind and name is None:
        kind, _, name = kind.partition("/")
    if args.filename:
        if kind or name:
            error("explain: give either pod NAME (live) or -f FILE (offline), not both")
            return None
        return ""
    if kind is None or name is None or kind.lower() not in POD_KINDS or not name:
        error("explain: name a Pod (explain pod NAME -n NAMESPACE) or a file (explain -f FILE)")
        return None
    return str(name)


def _offline(args: argparse.Namespace, policy: Any) -> list[Explanation] | None:
    stdin = sys.stdin.read() if args.filename == "-" else None
    try:
        documents = parse(read_text(args.filename, stdin), args.filename)
    except DocumentError as exc:
        error(str(exc))
        return None
    pods: list[Document] = []
    for document in documents:
        if document.is_kubernetes_object and document.obj.get("kind") == "Pod":
            pods.append(document)
        else:
            error(
                f"{document.where}: {document.describe()} is not a Pod: explain reads Pods "
                "(`gpu-admission review -f` judges workloads)"
            )
    if not pods:
        if not documents:
            error(f"{args.filename}: no Pod in it")
        return None
    explanations = []
    for document in pods:
        pod = dict(document.obj)
        metadata = dict(pod.get("metadata") or {})
        metadata.setdefault("namespace", args.namespace or "default")
        pod["metadata"] = metadata
        explanations.append(explain_pod(pod, None, policy))
    return explanations


def render(explanation: Explanation) -> str:
    """The explanation as text for a terminal: the Pod and what was read, then the causes,
    each with its fix, then the notes."""
    lines = [f"Pod {explanation.pod}: {_state(explanation)}"]
    if explanation.scheduled_condition:
        lines.append(f"  PodScheduled: {explanation.scheduled_condition}")
    if explanation.scheduler_message:
        lines.append(f"  scheduler: {explanation.scheduler_message}")
    verdict = explanation.verdict
    said = "allowed" if verdict.allowed else f"denied ({number(len(verdict.denied), 'finding')})"
    if verdict.warned:
        said += f", {number(len(verdict.warned), 'warning')}"
    lines.append(f"  policy: {said}")
    lines += [f"    denied: {line}" for line in verdict.denied]
    lines += [f"    warning: {line}" for line in verdict.warned]
    if explanation.pools:
        lines.append("  GPU nodes it can reach:")
        for pool in explanation.pools:
            allocated = pool.allocated
            totals = ", ".join(
                f"{name} {plain_number(pool.allocatable[name])} allocatable"
                + (
                    f", {plain_number(allocated.get(name, 0))} allocated"
                    if allocated is not None
                    else ""
                )
                for name in pool.allocatable
            )
            where = f"pool {pool.pool}" if pool.pool else "in no pool"
            lines.append(
                f"    {where}: {number(len(pool.nodes), 'node')}"
                + (f"; {totals}" if totals else "")
            )
    if explanation.causes:
        lines.append("causes, in the order to address them:")
        for index, cause in enumerate(explanation.causes, 1):
            lines.append(f"  {index}. {cause.summary}")
            lines += [f"     - {detail}" for detail in cause.details]
            lines.append(f"     fix: {cause.fix}")
    else:
        lines.append(explanation.headline)
    if explanation.notes:
        lines.append("notes:")
        lines += [f"  - {note}" for note in explanation.notes]
    return "\n".join(lines)


def _state(explanation: Explanation) -> str:
    if explanation.state == "offline":
        return "from a file (offline)"
    phase = explanation.phase or "no phase"
    if explanation.state == "unscheduled":
        return f"{phase}, on no node"
    if explanation.node:
        return f"{phase} on node {explanation.node}"
    return phase
