"""``gpu-admission inspect``: the daily GPU inspection as one report
(``webhook.operations.inspect``)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from webhook.cli.common import add_cluster_arguments, add_command, add_policy_argument, policy_from
from webhook.cli.inspect_output import render_markdown, render_table
from webhook.cluster.connection import connect
from webhook.operations.inspect import inspect_cluster
from webhook.operations.inspect_changes import check_previous
from webhook.operations.inspect_report import report_document
from webhook.operations.refusals import INSPECTOR_ROLE

_EPILOG = f"""\
examples:
  gpu-admission inspect --policy my-policy.yaml
  gpu-admission inspect -o json > inspect-$(date +%F).json
  gpu-admission inspect --since inspect-2025-06-01.json -o markdown > ticket.md

exit status: 0 nothing to act on, 1 findings (a Pending GPU Pod, a GPU node without a device
plugin Pod, a GPU quota used up, drift between the policy and the cluster), 2 could not run.

Reads nodes, pods, events, resourcequotas, namespaces, daemonsets, resource claims and
classes, and what cluster check reads: {INSPECTOR_ROLE} grants it.
"""


def add_subcommands(commands: argparse._SubParsersAction[Any]) -> None:
    inspect = add_command(
        commands,
        "inspect",
        summary="the daily GPU inspection of a live cluster",
        description="One report of the guide's daily GPU inspection: per GPU node the "
        "allocatable and allocated GPUs by resource, its product and MIG layout; the "
        "Pending GPU Pods with their age and the first cause explain finds; the device "
        "plugin DaemonSets the policy names (devicePluginDaemonSets) against the GPU nodes; "
        "the GPU quotas, used and hard; the drift cluster check finds; pools that mix GPU "
        "products; and, with --since, what changed since a previous report (GPUs lost, "
        "nodes gone or added, new products).",
        epilog=_EPILOG,
    )
    add_policy_argument(inspect)
    add_cluster_arguments(inspect)
    inspect.add_argument(
        "--since",
        metavar="FILE",
        help="a previous report (inspect -o json): say what changed since",
    )
    inspect.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "markdown"),
        default="table",
        help="table for a terminal (default), json (with a schema: inspect.schema.json), "
        "markdown for a ticket",
    )
    inspect.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    policy = policy_from(args)
    previous = None
    if args.since is not None:
        path = Path(args.since)
        try:
            document = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--since {path}: cannot read a JSON report ({exc})") from None
        previous = check_previous(document, f"--since {path}")
    with connect(args.kubeconfig, args.context) as cluster:
        report = inspect_cluster(cluster, policy, datetime.now(UTC), previous)
    if args.output == "json":
        print(json.dumps(report_document(report), indent=2))
    elif args.output == "markdown":
        print(render_markdown(report), end="")
    else:
        print(render_table(report), end="")
    return 0 if report.clean() else 1
