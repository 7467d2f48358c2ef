"""``gpu-admission cluster check``: where the policy and the live cluster disagree
(``webhook.audit.drift``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from webhook.audit.drift import DRIFT_KINDS, check_cluster
from webhook.cli.common import add_command, add_command_group, add_policy_argument, policy_from
from webhook.cluster.connection import connect
from webhook.cluster.listing import AUDITOR_ROLE

_EPILOG = """\
examples:
  gpu-admission cluster check --policy my-policy.yaml
  gpu-admission cluster check --context prod -o json | jq '.drift[].kind'

exit status: 0 the policy and the cluster agree, 1 drift found, 2 could not run.
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
        "names; without it, device plugins are not compared) and compare them with the policy: "
        + "; ".join(DRIFT_KINDS)
        + ". Each disagreement once, with the nodes concerned. Needs list on nodes and pods "
        f"and get on daemonsets ({AUDITOR_ROLE} has them).",
        epilog=_EPILOG,
    )
    add_policy_argument(check)
    check.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="default: $KUBECONFIG, then in-cluster, then ~/.kube/config",
    )
    check.add_argument("--context")
    check.add_argument("-o", "--output", choices=("text", "json"), default="text")
    check.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    policy = policy_from(args)
    with connect(args.kubeconfig, args.context) as cluster:
        drift, nodes = check_cluster(cluster, policy)
    daemonsets = [str(named) for named in policy.device_plugin_daemonsets]
    if args.output == "json":
        document = {
            "policy": policy.source,
            "nodes": nodes,
            "devicePluginDaemonSets": daemonsets,
            "drift": [
                {"kind": d.kind, "subject": d.subject, "nodes": list(d.nodes), "message": d.message}
                for d in drift
            ],
        }
        print(json.dumps(document, indent=2))
    else:
        for found in drift:
            print(f"{found.kind}: {found.message}")
        read = f"{nodes} node{'' if nodes == 1 else 's'}"
        if daemonsets:
            read += f" and {len(daemonsets)} device plugin DaemonSet"
            read += f"{'' if len(daemonsets) == 1 else 's'} read"
        else:
            read += " read (no devicePluginDaemonSets: device plugins not compared)"
        if drift:
            print(f"{read}; {len(drift)} disagreement{'' if len(drift) == 1 else 's'}")
        else:
            print(f"{read}; the policy and the cluster agree")
    return 1 if drift else 0
