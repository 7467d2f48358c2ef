"""``gpu-admission inspect``: the daily GPU inspection as one report
(``webhook.operations.inspect``)."""

from __future__ import annotations

import argparse
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from webhook.cli.common import (
    add_cluster_arguments,
    add_command,
    add_policy_argument,
    error,
    policy_from,
)
from webhook.cli.inspect_output import MAX_ROWS, render_markdown, render_table
from webhook.cluster.connection import connect
from webhook.operations.inspect import PENDING_AFTER_SECONDS, inspect_cluster
from webhook.operations.inspect_changes import NotAReport, check_previous
from webhook.operations.inspect_report import report_document
from webhook.operations.refusals import INSPECTOR_ROLE

_EPILOG = f"""\
examples:
  gpu-admission inspect --policy my-policy.yaml
  gpu-admission inspect -o json > inspect-$(date +%F).json
  gpu-admission inspect --since inspect-2025-06-01.json -o markdown > ticket.md

exit status: 0 nothing to act on, 1 findings (a GPU Pod Pending longer than --pending-after
with a cause, a GPU node without a Ready device plugin Pod, a GPU quota used up, drift between the
policy and the cluster), 2 could not run. Pods held by scheduling gates wait for their queue:
listed, never a finding.

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
        "--pending-after",
        metavar="DURATION",
        default=f"{PENDING_AFTER_SECONDS // 60}m",
        help="a Pending GPU Pod is a finding once it has waited this long with a cause "
        "(30s, 5m, 2h, 1h30m; default: %(default)s): younger ones are the scheduler's churn",
    )
    inspect.add_argument(
        "--max-rows",
        metavar="N",
        type=int,
        help=f"rows per table for table and markdown (default {MAX_ROWS}; 0: all), with a "
        "line saying how many were left out; json is always complete",
    )
    inspect.add_argument(
        "--nodes",
        action="store_true",
        help="list every GPU node in table and markdown (default: those that need attention: "
        "NotReady, cordoned, being removed, capacity above allocatable, a failed MIG "
        "configuration, no Ready device plugin Pod); json always lists all",
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


def now() -> datetime:
    """The clock the report is made at (the tests set their own)."""
    return datetime.now(UTC)


def run(args: argparse.Namespace) -> int:
    pending_after = duration_seconds(args.pending_after)
    if pending_after is None:
        error(f"--pending-after {args.pending_after}: not a duration (e.g. 30s, 5m, 2h, 1h30m)")
        return 2
    if args.max_rows is not None and args.max_rows < 0:
        error(f"--max-rows {args.max_rows}: give a number of rows, 0 for all")
        return 2
    max_rows = None if args.max_rows == 0 else args.max_rows or MAX_ROWS
    policy = policy_from(args)
    previous = None
    if args.since is not None:
        path = Path(args.since)
        try:
            previous = check_previous(json.loads(path.read_text("utf-8")), f"--since {path}")
        except (OSError, ValueError) as exc:
            reason = (
                exc
                if isinstance(exc, NotAReport)
                else f"--since {path}: cannot read a JSON report ({exc})"
            )
            error(str(reason))
            return 2
    with connect(args.kubeconfig, args.context) as cluster:
        report = inspect_cluster(cluster, policy, now(), previous, pending_after, args.policy)
    if args.output == "json":
        print(json.dumps(report_document(report), indent=2))
    elif args.output == "markdown":
        print(render_markdown(report, max_rows, args.nodes), end="")
    else:
        print(render_table(report, max_rows, args.nodes), end="")
    return 0 if report.clean() else 1


_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def duration_seconds(text: str) -> int | None:
    """A duration as kubectl writes one (``90s``, ``5m``, ``1h30m``) in seconds; None for
    anything else."""
    match = _DURATION.match(text.strip())
    if match is None or not any(match.groups()):
        return None
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds
