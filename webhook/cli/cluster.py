"""``gpu-admission cluster check``: where the policy and the live cluster disagree
(``webhook.audit.drift``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from webhook.audit.admin_access import ADMIN_ACCESS_KINDS
from webhook.audit.class_drift import CLASS_DRIFT_KINDS
from webhook.audit.cluster_check import check_policy_drift
from webhook.audit.drift import DRIFT_KINDS
from webhook.audit.drift_finding import Drift
from webhook.audit.quota_drift import QUOTA_DRIFT_KINDS
from webhook.cli.common import (
    add_cluster_arguments,
    add_command,
    add_command_group,
    add_policy_argument,
    policy_from,
)
from webhook.cluster.connection import connect
from webhook.cluster.listing import AUDITOR_ROLE
from webhook.core.wording import number

_EPILOG = """\
examples:
  gpu-admission cluster check --policy my-policy.yaml
  gpu-admission cluster check --context prod -o json | jq '.drift[].kind'

exit status: 0 the policy and the cluster agree (notes marked info do not count), 1 drift
found, 2 could not run.
"""


def add_subcommands(commands: argparse._SubParsersAction[Any]) -> None:
    group = add_command_group(
        commands,
        "cluster",
        summary="compare the policy with the live cluster",
        description="Commands that read the cluster the policy guards.",
        epilog=_EPILOG,
    )
    check = add_command(
        group,
        "check",
        summary="list where the policy and the cluster's nodes disagree",
        description="Read every Node (and the DaemonSets the policy's devicePluginDaemonSets "
        "names; without it, device plugins are not compared) and, where tenants state "
        "entitlements, the Namespaces and ResourceQuotas, and compare them with the policy: "
        + "; ".join(DRIFT_KINDS + QUOTA_DRIFT_KINDS + CLASS_DRIFT_KINDS + ADMIN_ACCESS_KINDS)
        + ". Each disagreement once, with the nodes or namespaces concerned. Needs list on "
        "nodes and pods, get on daemonsets and, for entitlements, list on namespaces and "
        "resourcequotas, and for GPU defaults get on runtimeclasses and priorityclasses "
        f"({AUDITOR_ROLE} has them).",
        epilog=_EPILOG,
    )
    add_policy_argument(check)
    add_cluster_arguments(check)
    check.add_argument("-o", "--output", choices=("text", "json"), default="text")
    check.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    policy = policy_from(args)
    with connect(args.kubeconfig, args.context) as cluster:
        checked = check_policy_drift(cluster, policy)
    drift, nodes, quotas = checked.drift, checked.nodes, checked.quotas
    disagreements = [d for d in drift if d.level == "drift"]
    daemonsets = [str(named) for named in policy.device_plugin_daemonsets]
    if args.output == "json":
        document = {
            "policy": policy.source,
            "nodes": nodes,
            "devicePluginDaemonSets": daemonsets,
            "namespacesWithEntitlements": quotas.namespaces,
            "resourceQuotas": quotas.quotas,
            "drift": [
                {
                    "kind": d.kind,
                    "level": d.level,
                    "subject": d.subject,
                    "nodes": list(d.nodes),
                    "namespaces": list(d.namespaces),
                    "message": d.message,
                }
                for d in drift
            ],
        }
        print(json.dumps(document, indent=2))
    else:
        for found in drift:
            print(f"{found.kind}{' (info)' if found.level == 'info' else ''}: {found.message}")
        print(_summary(nodes, daemonsets, quotas.namespaces, quotas.quotas, drift))
    return 1 if disagreements else 0


def _summary(
    nodes: int, daemonsets: list[str], namespaces: int, quotas: int, drift: list[Drift]
) -> str:
    read = number(nodes, "node")
    if daemonsets:
        read += f" and {number(len(daemonsets), 'device plugin DaemonSet')}"
    if namespaces:
        read += f", {number(quotas, 'GPU ResourceQuota')} in "
        read += f"{number(namespaces, 'namespace')} with entitlements"
    read += " read"
    if not daemonsets:
        read += " (no devicePluginDaemonSets: device plugins not compared)"
    disagreements = sum(1 for d in drift if d.level == "drift")
    notes = len(drift) - disagreements
    said = (
        number(disagreements, "disagreement")
        if disagreements
        else "the policy and the cluster agree"
    )
    return f"{read}; {said}" + (f" ({number(notes, 'note')})" if notes else "")
