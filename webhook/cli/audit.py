"""``gpu-admission audit``: what would this policy deny, warn about and change, in manifests on
disk (``-f``) or in the workloads already running in a cluster (``--cluster``).

Unlike ``review``, which answers for one admission request, ``audit`` sweeps: it scans
directories, keeps going past files it cannot read (and says so), and by default evaluates
every rule as Enforce, because the question before switching a policy on is what it would
block. ``--respect-modes`` keeps the policy's own modes. The work is ``webhook.audit``'s; this
module parses the arguments, prints and picks the exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from webhook.audit.cluster import audit_cluster
from webhook.audit.documents import SubdirectoriesNotRead
from webhook.audit.files import audit_files
from webhook.audit.judging import Audit
from webhook.audit.preflight import Change, Preflight, preflight_cluster, preflight_files
from webhook.audit.reports import (
    REPORT_APIS,
    ReportAPI,
    apply_reports,
    iter_policy_reports,
    with_report_namespace,
)
from webhook.cli import junit, output, sarif, tables
from webhook.cli.common import (
    add_cluster_arguments,
    add_command,
    add_filename_arguments,
    add_policy_argument,
    error,
    expired_message,
    policy_from,
    subdirectories_not_read,
)
from webhook.cluster.connection import ClusterError, connect
from webhook.cluster.listing import Problem
from webhook.policy.load import load_policy
from webhook.policy.model import Policy

EXAMPLES = """\
examples:
  gpu-admission audit -f manifests/ -R                 # every YAML and JSON file, recursively
  gpu-admission audit -f pod.yaml deploy.yaml          # several files after one -f
  gpu-admission audit -f deploy/ -R -o sarif > audit.sarif   # annotate a pull request
  gpu-admission audit -f charts/rendered.yaml -o junit > audit.xml
  gpu-admission audit -f manifests/ -R --policy policy.yaml --respect-modes
  gpu-admission audit --cluster -A                     # every namespace of the current context
  gpu-admission audit --cluster -n ml --context prod -o json
  gpu-admission audit --cluster -A -o policyreport --apply   # reports for Policy Reporter
  gpu-admission audit -f manifests/ -R --policy new.yaml --against old.yaml   # pre-flight

By default every rule the policy turns on is evaluated as Enforce: the report answers "what
would this policy block?". --respect-modes keeps the policy's Enforce/Warn/Audit modes.

--cluster lists the policy's custom workload kinds, the built-in ones and Pods (pages of 500,
each judged as it arrives, owners' kinds first). What a reported workload owns (a
Deployment's ReplicaSets and Pods, a CronJob's Jobs, a PyTorchJob's Pods) is listed under it,
not judged again. It needs list on them: the gpu-admission-auditor ClusterRole in
manifests/base grants it. Where tenants state entitlements, the ResourceQuotas that contradict
them are noted too (as cluster check reports them; not with -o policyreport), which needs list
on namespaces (with -A) and resourcequotas.

exit status: 0 when nothing would be denied, 1 when something would, 2 on usage, policy or
connection errors and when an input could not be read or an object could not be judged (the
report covers the rest).
"""


def add_subcommands(commands: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(
        commands,
        "audit",
        summary="report what a policy would deny, warn about and change",
        description="Audit manifests (files and directories) or the workloads of a live "
        "cluster against a gpu-admission policy: what it would deny, warn about, audit and "
        "mutate.",
        epilog=EXAMPLES,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    add_filename_arguments(source, parser)
    source.add_argument(
        "--cluster", action="store_true", help="audit the workloads of a live cluster"
    )
    add_policy_argument(parser)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        help="with -f: the namespace to judge objects in, as review -n and kubectl apply -n: it "
        "wins over an object's own (default: the object's, else default); with --cluster: the "
        "namespace to audit (default: the context's)",
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="with --cluster: audit every namespace",
    )
    parser.add_argument(
        "--respect-modes",
        action="store_true",
        help="use the policy's Enforce/Warn/Audit modes instead of enforcing every rule",
    )
    add_cluster_arguments(parser, condition="with --cluster")
    parser.add_argument(
        "--request-timeout",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="with --cluster: give up on an API request after this long (default: 30)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "wide", "json", "junit", "sarif", "policyreport"),
        default="table",
        help="table: one line per object, clipped to the terminal; wide: every message and "
        "mutation; policyreport: one report per workload with findings, judged with the policy's "
        "own modes (as the webhook judges), as YAML (default: table)",
    )
    parser.add_argument(
        "--sarif-root",
        metavar="DIR",
        help="with -o sarif: the directory file locations are relative to (default: the git "
        "top-level above the working directory, else the working directory)",
    )
    parser.add_argument(
        "--report-api",
        choices=tuple(REPORT_APIS),
        default="wgpolicyk8s",
        help="with -o policyreport: wgpolicyk8s.io/v1alpha2 PolicyReports (default) or "
        "openreports.io/v1alpha1 Reports",
    )
    parser.add_argument(
        "--against",
        metavar="OLD_POLICY",
        help="pre-flight of a policy change: list the objects that --policy would start "
        "denying, stop denying or warn about differently than OLD_POLICY, each with its own "
        "modes (-o table or json); exit 1 when something would start being denied",
    )
    parser.add_argument(
        "--apply",
        action="store_true",
        help="with --cluster -o policyreport: write the reports with server-side apply and "
        "delete the ones of workloads now clean or gone; print one summary line",
    )
    parser.set_defaults(func=run)


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:  # the client takes 0 for "no timeout": a hang is what this prevents
        raise argparse.ArgumentTypeError(f"{text}: must be more than 0 seconds")
    return value


def run(args: argparse.Namespace) -> int:
    usage = _usage_error(args)
    if usage:
        print(f"gpu-admission audit: error: {usage}", file=sys.stderr)
        return 2
    policy = policy_from(args)
    try:
        return _audit(policy, args)
    except SubdirectoriesNotRead as exc:  # raised before any file is read
        error(subdirectories_not_read(exc))
        return 2


def _audit(policy: Policy, args: argparse.Namespace) -> int:
    _notes([expired_message(e) for _, e in policy.expired_exceptions(time.time())])
    if args.against:
        return _preflight(policy, args)
    # A policy report says what the webhook would do: the policy's own modes.
    respect = args.respect_modes or args.output == "policyreport"
    problems: list[Problem]
    if args.cluster:
        try:
            with connect(args.kubeconfig, args.context, timeout=args.request_timeout) as cluster:
                namespace = None if args.all_namespaces else (args.namespace or cluster.namespace)
                audit = audit_cluster(
                    policy,
                    cluster,
                    namespace,
                    respect_modes=respect,
                    raise_errors=args.debug,
                    # Only -o json prints the Pods as mutated: a whole Pod per bare GPU Pod.
                    keep_mutated=args.output == "json",
                    # Policy reports are per workload: a quota has no place in them.
                    compare_quotas=args.output != "policyreport",
                )
                _notes(audit.notes)
                problems = list(audit.problems)
                if args.apply:
                    api = REPORT_APIS[args.report_api]
                    reports = iter_policy_reports(audit.policy, audit.items, api)
                    applied = apply_reports(cluster, api, reports, namespace, prune=not problems)
                    print(applied.line(api))
                    problems += [Problem("reports", f"report {f}") for f in applied.failed]
                    for problem in problems:
                        error(problem.message)
                    # The findings are in the reports: only what could not be read, judged
                    # or written fails.
                    return 2 if problems else 0
        except ClusterError as exc:
            error(str(exc))
            return 2
    else:
        audit = audit_files(
            policy,
            args.files,
            recursive=args.recursive,
            namespace=args.namespace or "default",
            respect_modes=respect,
            stdin=_stdin(args.files),
            raise_errors=args.debug,
            override=args.namespace is not None,
        )
        _notes(audit.notes)
        if args.output == "policyreport":
            audit.items, unplaced = with_report_namespace(audit.policy, audit.items)
            audit.problems += unplaced
        problems = audit.problems
    for problem in problems:
        error(problem.message)
    render(audit, args.output, sys.stdout, REPORT_APIS[args.report_api], args.sarif_root)
    if problems:
        return 2
    return 1 if audit.denies else 0


def _preflight(policy: Policy, args: argparse.Namespace) -> int:
    old_policy = load_policy(args.against)
    result: Preflight
    if args.cluster:
        try:
            with connect(args.kubeconfig, args.context, timeout=args.request_timeout) as cluster:
                namespace = None if args.all_namespaces else (args.namespace or cluster.namespace)
                result = preflight_cluster(
                    policy, old_policy, cluster, namespace, raise_errors=args.debug
                )
        except ClusterError as exc:
            error(str(exc))
            return 2
    else:
        result = preflight_files(
            policy,
            old_policy,
            args.files,
            recursive=args.recursive,
            namespace=args.namespace or "default",
            stdin=_stdin(args.files),
            raise_errors=args.debug,
            override=args.namespace is not None,
        )
    _notes(result.new.notes + result.old.notes)
    problems = result.new.problems + result.old.problems
    for problem in problems:
        error(problem.message)
    render_changes(result.changes, result.old.policy.name, result.new.policy.name, args.output)
    if problems:
        return 2
    return 1 if result.starts_denying else 0


def _stdin(paths: list[str]) -> str | None:
    """Standard input, read once when a path is ``-``."""
    return sys.stdin.read() if "-" in paths else None


def _notes(notes: list[str]) -> None:
    for note in notes:
        print(f"gpu-admission: note: {note}", file=sys.stderr)


def _usage_error(args: argparse.Namespace) -> str | None:
    if args.against and (args.output not in ("table", "json") or args.apply):
        return "--against compares two policies: use -o table or json, without --apply"
    if args.sarif_root and args.output != "sarif":
        return "--sarif-root says where -o sarif's file locations start: use it with -o sarif"
    if args.apply and not (args.cluster and args.output == "policyreport"):
        return "--apply writes reports to a cluster: use it with --cluster -o policyreport"
    if args.cluster:
        if args.recursive:
            return "-R reads the directories given with -f: with --cluster there are none"
        if args.output == "sarif":
            return "-o sarif points at files; with --cluster use -o table, json or junit"
        return None
    if args.all_namespaces:
        return "-A is for --cluster; with -f, -n names the namespace objects are judged in"
    for option in ("kubeconfig", "context"):
        if getattr(args, option):
            return f"--{option} is for --cluster"
    return None


# ------------------------------------------------------------------------------ rendering


def render(
    audit: Audit, fmt: str, stream: TextIO, report_api: ReportAPI, sarif_root: str | None = None
) -> None:
    if fmt == "policyreport":
        for report in iter_policy_reports(audit.policy, audit.items, report_api):
            stream.write("---\n" + output.to_yaml(report))
    elif fmt in ("table", "wide"):
        tables.audit_table(audit, stream, wide=fmt == "wide")
    elif fmt == "json":
        output.dump(records(audit), "json", stream)
    elif fmt == "junit":
        stream.write(junit.report(audit.items, audit.problems))
    else:
        rows = [(i.document, i.outcome) for i in audit.items]
        errors = [(p.source, p.message) for p in audit.problems]
        root = Path(sarif_root) if sarif_root else None
        json.dump(sarif.log(rows, errors, root), stream, indent=2)
        stream.write("\n")


def records(audit: Audit) -> list[dict[str, Any]]:
    """review's records, with every mutation, then one ``{source, error}`` per problem."""
    out = []
    for item in audit.items:
        record = output.outcome_record(item.document, item.outcome, with_mutation=True)
        if item.ref is not None:
            # A live object has no file, document or line: it is named by its reference.
            for key in ("source", "document", "line"):
                del record[key]
            for violation in record["violations"]:
                del violation["line"]
            record = {**item.ref.record(), **record, "owned": [r.record() for r in item.owned]}
        out.append(record)
    out.extend({"source": p.source, "error": p.message} for p in audit.problems)
    unread = sum(1 for p in audit.problems if p.stage == "read")
    summary = tables.summary_record(
        [i.outcome for i in audit.items],
        unreadable=unread,
        failed=len(audit.problems) - unread,
    )
    out.append(summary)
    return out


def render_changes(changes: list[Change], old_name: str, new_name: str, fmt: str) -> None:
    stream = sys.stdout
    if fmt == "json":
        json.dump([c.record() for c in changes], stream, indent=2)
        stream.write("\n")
        return
    for change in changes:
        stream.write(f"{(change.verdict or 'changed').upper()}  {change.subject}\n")
        for label, lines in (
            ("+ deny", change.denials_added),
            ("- deny", change.denials_removed),
            ("+ warn", change.warnings_added),
            ("- warn", change.warnings_removed),
        ):
            for line in lines:
                stream.write(f"  {label}  {line}\n")
    stream.write(changes_summary(changes, old_name, new_name) + "\n")


def changes_summary(changes: list[Change], old_name: str, new_name: str) -> str:
    starts = sum(1 for c in changes if c.verdict == "starts denying")
    stops = sum(1 for c in changes if c.verdict == "stops denying")
    other = len(changes) - starts - stops
    return (
        f"policy {new_name} against {old_name}: {starts} object(s) would start being denied, "
        f"{stops} would stop being denied, {other} judged differently with the same verdict"
    )
