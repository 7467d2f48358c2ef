"""``gpu-admission explain``: why a GPU Pod is Pending, or runs and cannot see its GPU
(``webhook.operations.explain``), live from the cluster or offline from a file."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from webhook.audit.documents import Document
from webhook.cli.common import (
    add_cluster_arguments,
    add_command,
    add_filename_arguments,
    add_policy_argument,
    error,
    policy_from,
    read_documents,
)
from webhook.cluster.connection import connect
from webhook.core.wording import number, plain_number
from webhook.operations.cluster_facts import read_cluster_facts, read_pod
from webhook.operations.explain import Explanation, explain_pod, policy_named
from webhook.policy.model import Policy

EXAMPLES = """\
examples:
  gpu-admission explain pod trainer-0 -n ml          # why is it Pending?
  kubectl gpu-admission explain pod trainer-0 -n ml  # the same, as a kubectl plugin
  gpu-admission explain pod/trainer-0 -n ml -o json | jq -r '.[0].causes[0].fix'
  gpu-admission explain -f pod.yaml --policy my-policy.yaml   # offline: verdict and spec
  gpu-admission explain -f pods/ -R -n ml      # every Pod of a tree, judged in namespace ml

Live, it reads the Pod, its FailedScheduling events, the Nodes and the Pods bound to them
(allocated GPUs), the ResourceQuotas of its namespace and, for a Pod that claims devices,
ResourceClaims, DeviceClasses and ResourceSlices. Offline (-f, read as review reads it:
files, directories, - and -R) it judges each Pod with the policy and reads what its spec
shows; causes in the cluster need the live form. Objects that are not Pods (workloads, their
Pod templates included) are skipped with a note: review -f judges them. -o json is a list,
one element per Pod.

exit status: 0 nothing blocks it, 1 causes found, 2 could not run (or a file could not be
read: the Pods of the others are still explained).
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
    add_filename_arguments(parser, parser)
    parser.add_argument(
        "-n",
        "--namespace",
        help="the Pod's namespace (default: the kubeconfig context's); with -f, the namespace "
        "to judge the Pods in, as review -n: it wins over a Pod's own (default: the Pod's, "
        "else default)",
    )
    add_policy_argument(parser)
    add_cluster_arguments(parser, condition="without -f")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    name = _pod_name(args)
    if name is None:
        return 2
    policy = policy_from(args)
    explained: list[tuple[Document | None, Explanation]]  # the file's document of an offline Pod
    unreadable = 0
    if args.files:
        offline = _offline(args, policy)
        if offline is None:
            return 2
        explained, unreadable = offline
    else:
        with connect(args.kubeconfig, args.context) as cluster:
            namespace = args.namespace or cluster.namespace
            pod = read_pod(cluster, namespace, name)
            facts = read_cluster_facts(cluster, policy, [pod])
            # Inside: the facts read the allocations when the explanation first needs them.
            explained = [(None, explain_pod(pod, facts, policy))]
    judged_by = policy_named(args.policy)
    if args.output == "json":
        print(json.dumps([_record(e, d) | {"policy": judged_by} for d, e in explained], indent=2))
    else:
        print("\n\n".join(render(e, d, judged_by) for d, e in explained))
    if unreadable:
        return 2
    return 1 if any(e.blocked for _, e in explained) else 0


def _record(explanation: Explanation, document: Document | None) -> dict[str, Any]:
    """The explanation for JSON; of an offline Pod, first where it is (as review's records)."""
    if document is None:
        return explanation.as_record()
    where = {"source": document.source, "document": document.number, "line": document.line}
    return where | explanation.as_record()


def _pod_name(args: argparse.Namespace) -> str | None:
    """The Pod's name from ``pod NAME`` or ``pod/NAME`` ("" with -f); None, reported, when
    the arguments say neither or both, or -R without -f."""
    kind, name = args.kind, args.name
    if kind and "/" in kind and name is None:
        kind, _, name = kind.partition("/")
    if args.files:
        if kind or name:
            error("explain: give either pod NAME (live) or -f PATH (offline), not both")
            return None
        return ""
    if args.recursive:
        error("explain: -R reads the directories given with -f: pod NAME reads one Pod")
        return None
    if kind is None or name is None or kind.lower() not in POD_KINDS or not name:
        error("explain: name a Pod (explain pod NAME -n NAMESPACE) or files (explain -f PATH)")
        return None
    return str(name)


def _offline(
    args: argparse.Namespace, policy: Policy
) -> tuple[list[tuple[Document | None, Explanation]], int] | None:
    """Each Pod of the files ``-f`` names, with its explanation, and how many files could not
    be read (reported); None when there is no Pod to explain (the error said why). What is no
    Pod is skipped with a note: a workload's Pod templates are review's to judge."""
    read = read_documents(args)
    if read is None:
        return None
    documents, unreadable = read
    explained: list[tuple[Document | None, Explanation]] = []
    for document in documents:
        if not (document.is_kubernetes_object and document.obj.get("kind") == "Pod"):
            print(
                f"gpu-admission: note: {document.where}: {document.describe()} is not a Pod, "
                "skipped: explain reads Pods (`gpu-admission review -f` judges workloads)",
                file=sys.stderr,
            )
            continue
        pod = dict(document.obj)
        metadata = dict(pod.get("metadata") or {})
        # As review -n: the namespace given wins over the Pod's own, as the API server's
        # request namespace does (`kubectl apply -n` refuses a mismatch).
        metadata["namespace"] = args.namespace or metadata.get("namespace") or "default"
        pod["metadata"] = metadata
        explained.append((document, explain_pod(pod, None, policy)))
    if not explained:
        if not unreadable:
            error(f"no Pod in {', '.join(args.files)}: explain reads Pods")
        return None
    return explained, unreadable


def render(explanation: Explanation, document: Document | None = None, judged_by: str = "") -> str:
    """The explanation as text for a terminal: the Pod and what was read, then the causes,
    each with its fix, then the notes; ``document``: where an offline Pod was read;
    ``judged_by``: which policy judged (``policy_named``)."""
    lines = [f"Pod {explanation.pod}: {_state(explanation, document)}"]
    if judged_by:
        lines.append(f"  policy: {judged_by}")
    if explanation.scheduled_condition:
        lines.append(f"  PodScheduled: {explanation.scheduled_condition}")
    if explanation.scheduler_message:
        lines.append(f"  scheduler: {explanation.scheduler_message}")
    verdict = explanation.verdict
    said = "allowed" if verdict.allowed else f"denied ({number(len(verdict.denied), 'finding')})"
    if verdict.warned:
        said += f", {number(len(verdict.warned), 'warning')}"
    lines.append(f"  verdict: {said}")
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


def _state(explanation: Explanation, document: Document | None) -> str:
    if explanation.state == "offline":
        where = f"{document.source}:{document.line}" if document else "a file"
        return f"from {where} (offline)"
    phase = explanation.phase or "no phase"
    if explanation.state == "unscheduled":
        return f"{phase}, on no node"
    if explanation.node:
        return f"{phase} on node {explanation.node}"
    return phase
