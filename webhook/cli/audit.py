"""``gpu-admission audit``: what would this policy deny, warn about and change, in manifests on
disk (``-f``) or in the workloads already running in a cluster (``--cluster``).

Unlike ``review``, which answers for one admission request, ``audit`` sweeps: it scans
directories, keeps going past files it cannot read (and says so), and by default evaluates
every rule as Enforce, because the question before switching a policy on is what it would
block. ``--respect-modes`` keeps the policy's own modes.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TextIO

from webhook.admission.objects import Outcome, decide_object, enforce_everything
from webhook.cli import junit, output, preflight, sarif
from webhook.cli.cluster import (
    ClusterError,
    Lister,
    ObjectRef,
    Problem,
    connect,
    meta,
    ref_of,
    root_of,
)
from webhook.cli.common import add_command, add_policy_argument, error, policy_from
from webhook.cli.documents import Document, DocumentError, discover, parse, read_text
from webhook.cli.reports import (
    REPORT_APIS,
    Applied,
    ReportAPI,
    apply_reports,
    policy_reports,
)
from webhook.policy.load import load_policy
from webhook.policy.model import Policy
from webhook.policy.workloads import LEGACY_GROUPS

EXAMPLES = """\
examples:
  gpu-admission audit -f manifests/                    # every YAML and JSON file, recursively
  gpu-admission audit -f deploy/ -o sarif > audit.sarif   # annotate a pull request
  gpu-admission audit -f charts/rendered.yaml -o junit > audit.xml
  gpu-admission audit -f manifests/ --policy policy.yaml --respect-modes
  gpu-admission audit --cluster -A                     # every namespace of the current context
  gpu-admission audit --cluster -n ml --context prod -o json
  gpu-admission audit --cluster -A -o policyreport --apply   # reports for Policy Reporter
  gpu-admission audit -f manifests/ --policy new.yaml --against old.yaml   # policy pre-flight

By default every rule the policy turns on is evaluated as Enforce: the report answers "what
would this policy block?". --respect-modes keeps the policy's Enforce/Warn/Audit modes.

--cluster lists Pods, the built-in workload kinds and the policy's custom workload kinds
(pages of 500). What a reported workload owns (a Deployment's ReplicaSets and Pods, a
CronJob's Jobs, a PyTorchJob's Pods) is listed under it, not judged again. It needs list on
them: the gpu-admission-auditor ClusterRole in manifests/base grants it.

exit status: 0 when nothing would be denied, 1 when something would, 2 on usage, policy or
connection errors and when an input could not be read or an object could not be judged (the
report covers the rest).
"""


@dataclass(slots=True)
class Audited:
    """One judged object: a document from a file, or a live object with what it owns."""

    document: Document
    outcome: Outcome
    ref: ObjectRef | None = None
    owned: list[ObjectRef] = field(default_factory=list)

    @property
    def location(self) -> str:
        return f"uid {self.ref.uid}" if self.ref else f"{self.document.source}:{self.document.line}"

    def line_of(self, path: str) -> int | None:
        return None if self.ref else self.document.line_of(path)


@dataclass(slots=True)
class Audit:
    policy: Policy
    respect_modes: bool
    items: list[Audited] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    applied: Applied | None = None  # what --apply did

    @property
    def exit_code(self) -> int:
        if self.problems:
            return 2
        return 1 if any(not i.outcome.allowed for i in self.items) else 0


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
    source.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        metavar="PATH",
        help="a manifest file or a directory (scanned recursively for YAML and JSON), or - "
        "for standard input; repeatable",
    )
    source.add_argument(
        "--cluster", action="store_true", help="audit the workloads of a live cluster"
    )
    add_policy_argument(parser)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        help="with -f: the namespace of objects that have none (default: default); with "
        "--cluster: the namespace to audit (default: the context's)",
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
    parser.add_argument("--kubeconfig", metavar="FILE", help="with --cluster: the kubeconfig")
    parser.add_argument("--context", help="with --cluster: the kubeconfig context")
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
        choices=("table", "json", "junit", "sarif", "policyreport"),
        default="table",
        help="policyreport: one report per workload with findings, judged with the policy's "
        "own modes (as the webhook judges), as YAML (default: table)",
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
    if args.against:
        return _preflight(policy, args)
    respect = args.respect_modes or args.output == "policyreport"
    audit = Audit(policy if respect else enforce_everything(policy), respect)
    if args.cluster:
        try:
            audit_cluster(audit, args)
        except ClusterError as exc:
            error(str(exc))
            return 2
    else:
        audit_files(audit, args.files, args.namespace or "default", debug=args.debug)
    for problem in audit.problems:
        error(problem.message)
    if args.apply:
        # The findings are in the reports: only what could not be read or judged fails.
        return 2 if audit.problems or audit.applied is None else 0
    render(audit, args.output, sys.stdout, REPORT_APIS[args.report_api])
    return audit.exit_code


def _preflight(policy: Policy, args: argparse.Namespace) -> int:
    new, old = Audit(policy, True), Audit(load_policy(args.against), True)
    if args.cluster:
        try:
            audit_cluster(new, args, against=old)
        except ClusterError as exc:
            error(str(exc))
            return 2
    else:
        # Standard input is read once and given to both audits.
        stdin = sys.stdin.read() if "-" in args.files else ""
        for audit in (new, old):
            sys.stdin = io.StringIO(stdin) if stdin else sys.stdin
            audit_files(audit, args.files, args.namespace or "default", debug=args.debug)
    for problem in new.problems + old.problems:
        error(problem.message)
    changes = preflight.compare(old.items, new.items)
    preflight.render(changes, old.policy.name, new.policy.name, args.output, sys.stdout)
    if new.problems or old.problems:
        return 2
    return 1 if any(c.verdict == "starts denying" for c in changes) else 0


def _usage_error(args: argparse.Namespace) -> str | None:
    if args.against and (args.output not in ("table", "json") or args.apply):
        return "--against compares two policies: use -o table or json, without --apply"
    if args.apply and not (args.cluster and args.output == "policyreport"):
        return "--apply writes reports to a cluster: use it with --cluster -o policyreport"
    if args.cluster:
        if args.output == "sarif":
            return "-o sarif points at files; with --cluster use -o table, json or junit"
        return None
    if args.all_namespaces:
        return "-A is for --cluster; with -f, -n names the namespace of objects that have none"
    for option in ("kubeconfig", "context"):
        if getattr(args, option):
            return f"--{option} is for --cluster"
    return None


# ---------------------------------------------------------------------------------- files


def audit_files(audit: Audit, paths: list[str], namespace: str, *, debug: bool = False) -> None:
    """Decide every object of every file; unreadable files and objects the engine fails on
    become problems, not crashes (with ``debug``, the engine's exception is raised)."""
    for source in discover(paths):
        try:
            documents = parse(read_text(source), source)
        except DocumentError as exc:
            audit.problems.append(Problem(source, str(exc)))
            continue
        if not documents:
            _note(f"{source}: no Kubernetes objects, skipped")
        for document in documents:
            if not document.is_kubernetes_object:
                where = f"{source} document {document.number}" if len(documents) > 1 else source
                _note(f"{where}: not a Kubernetes object (no apiVersion and kind), skipped")
                continue
            _decide_into(audit, Audited, document, document.where, namespace, debug=debug)


def _decide_into(
    audit: Audit,
    make: Callable[[Document, Outcome], Audited],
    document: Document,
    where: str,
    namespace: str,
    *,
    debug: bool,
) -> Audited | None:
    """Decide one object into the audit; the engine failing on it is that object's problem,
    and the audit goes on: one malformed object must not hide every other verdict."""
    try:
        outcome = decide_object(document.obj, audit.policy, namespace, mutate=True)
    except Exception as exc:
        if debug:
            raise
        message = output.judging_failure(where, document, exc)
        audit.problems.append(Problem(document.source, message, stage="judge"))
        return None
    item = make(document, outcome)
    audit.items.append(item)
    return item


def _note(message: str) -> None:
    print(f"gpu-admission: note: {message}", file=sys.stderr)


# -------------------------------------------------------------------------------- cluster


def audit_cluster(audit: Audit, args: argparse.Namespace, against: Audit | None = None) -> None:
    """List the policy's workload kinds in the cluster and decide every object that no other
    reported object owns; the owned ones are listed under their owner. With ``against``, the
    same objects (one listing) are decided by its policy too."""
    api_client, default_namespace = connect(args.kubeconfig, args.context)
    try:
        namespace = None if args.all_namespaces else (args.namespace or default_namespace)
        lister = Lister(api_client, namespace, args.request_timeout, audit.problems)
        _judge_cluster([audit] if against is None else [audit, against], lister, namespace, args)
        if args.apply:
            api = REPORT_APIS[args.report_api]
            reports = policy_reports(audit.policy, audit.items, api)
            audit.applied = apply_reports(lister, api, reports, namespace, prune=not audit.problems)
            print(audit.applied.line(api))
            audit.problems += [Problem("reports", f"report {f}") for f in audit.applied.failed]
    finally:
        api_client.close()


def _judge_cluster(
    audits: list[Audit], lister: Lister, namespace: str | None, args: argparse.Namespace
) -> None:
    kinds = {key: w for audit in reversed(audits) for key, w in audit.policy.workloads.items()}
    objects = [
        obj
        for workload in kinds.values()
        if workload.group not in LEGACY_GROUPS
        and (namespace is None or workload.scope == "Namespaced")
        for obj in lister.objects(workload)
    ]
    declared = [resource for resource, catalogued in lister.not_served if not catalogued]
    if declared:
        _note("not served by this cluster (CRD not installed), skipped: " + ", ".join(declared))
    catalogued = len(lister.not_served) - len(declared)
    if catalogued:
        _note(
            f"{catalogued} catalogued GPU workload kind(s) not installed in this cluster "
            "(`gpu-admission policy workloads` lists the catalogue)"
        )
    by_uid = {meta(o)["uid"]: o for o in objects if meta(o).get("uid")}
    for audit in audits:
        _decide_roots(audit, objects, by_uid, debug=args.debug)


def _decide_roots(
    audit: Audit, objects: list[dict[str, Any]], by_uid: dict[str, dict[str, Any]], *, debug: bool
) -> None:
    audited: dict[int, Audited] = {}  # by id() of the root object
    owned: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for obj in objects:
        root = root_of(obj, by_uid)
        if root is obj:
            ref = ref_of(obj)
            item = _decide_into(
                audit,
                partial(Audited, ref=ref),
                Document(str(ref), 1, 1, obj),
                str(ref),
                ref.namespace or "default",
                debug=debug,
            )
            if item is not None:
                audited[id(obj)] = item
        else:
            owned.append((root, obj))
    for root, obj in owned:
        item = audited.get(id(root))
        if item is None:  # the owner could not be judged, and is a problem
            continue
        # An owned object is listed under its owner only when the owner's template accounts
        # for everything found in it: a forged owner reference, ephemeral containers added
        # later or a Pod shaped by what no template shows (Argo's podSpecPatch) make it an
        # object of its own.
        ref = ref_of(obj)
        try:
            extra = _findings_beyond(audit, obj, ref.namespace or "default", item)
        except Exception:  # the engine failing on it: judged alone below, as a problem
            extra = True
        if not extra:
            item.owned.append(ref)
            continue
        _decide_into(
            audit,
            partial(Audited, ref=ref),
            Document(str(ref), 1, 1, obj),
            str(ref),
            ref.namespace or "default",
            debug=debug,
        )


def _findings_beyond(audit: Audit, obj: dict[str, Any], namespace: str, owner: Audited) -> bool:
    """Whether an owned object has a finding its owner's verdict does not already carry."""
    known = {f.violation.key for f in owner.outcome.findings}
    outcome = decide_object(obj, audit.policy, namespace)
    return any(f.violation.key not in known for f in outcome.findings)


# ------------------------------------------------------------------------------ rendering


def render(audit: Audit, fmt: str, stream: TextIO, report_api: ReportAPI) -> None:
    if fmt == "policyreport":
        for report in policy_reports(audit.policy, audit.items, report_api):
            stream.write("---\n" + output.to_yaml(report))
    elif fmt == "table":
        table(audit, stream)
    elif fmt == "json":
        output.dump(records(audit), "json", stream)
    elif fmt == "junit":
        stream.write(junit.report(audit.items, audit.problems))
    else:
        rows = [(i.document, i.outcome) for i in audit.items]
        errors = [(p.source, p.message) for p in audit.problems]
        json.dump(sarif.log(rows, errors), stream, indent=2)
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
    return out


def table(audit: Audit, stream: TextIO) -> None:
    colour = output.use_colour(stream)
    for item in audit.items:
        outcome = item.outcome
        if not outcome.judged:
            stream.write(
                f"SKIPPED  {item.document.describe()}  ({item.location}): {outcome.skipped}\n"
            )
            continue
        shade = "red" if not outcome.allowed else ("yellow" if outcome.findings else "green")
        stream.write(
            f"{output.paint(output.VERDICT[outcome.allowed].upper(), shade, colour)}  "
            f"{item.document.describe()}  (namespace {outcome.namespace}, {item.location})\n"
        )
        for finding in outcome.findings:
            line = item.line_of(finding.path)
            word = output.MODE_WORD[finding.mode]
            stream.write(
                f"  {word:<5} [{finding.rule}] {finding.violation.render()}"
                + (f"  (line {line})" if line is not None else "")
                + "\n"
            )
        for mutation in outcome.mutations:
            target = f" Pods of {mutation.template_path}" if mutation.template_path else ""
            stream.write(f"  mutate{target}:\n")
            for operation in mutation.operations:
                value = json.dumps(operation["value"], separators=(", ", ": "))
                stream.write(f"    add {operation['path']}: {value}\n")
        if item.owned:
            stream.write(f"  owns {', '.join(f'{r.kind}/{r.name}' for r in item.owned)}\n")
    stream.write(summary(audit) + "\n")


def summary(audit: Audit) -> str:
    judged = [i.outcome for i in audit.items if i.outcome.judged]
    denied = sum(1 for o in judged if not o.allowed)
    warned = sum(1 for o in judged if o.allowed and o.warned)
    mutated = sum(1 for o in judged if o.mutations)
    skipped = len(audit.items) - len(judged)
    modes = "its own modes" if audit.respect_modes else "every rule enforced"
    parts = [
        f"{len(judged)} object(s) audited with policy {audit.policy.name} ({modes}): "
        f"{denied} would be denied, {len(judged) - denied} allowed ({warned} with warnings); "
        f"{mutated} would be mutated"
    ]
    if skipped:
        parts.append(f"{skipped} not a Pod or workload, skipped")
    unread = sum(1 for p in audit.problems if p.stage == "read")
    if unread:
        parts.append(f"{unread} could not be read (see the errors above)")
    if len(audit.problems) > unread:
        parts.append(f"{len(audit.problems) - unread} could not be judged (see the errors above)")
    return "; ".join(parts)
