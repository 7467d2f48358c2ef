"""``gpu-admission audit``: what would this policy deny, warn about and change, in manifests on
disk (``-f``) or in the workloads already running in a cluster (``--cluster``).

Unlike ``review``, which answers for one admission request, ``audit`` sweeps: it scans
directories, keeps going past files it cannot read (and says so), and by default evaluates
every rule as Enforce, because the question before switching a policy on is what it would
block. ``--respect-modes`` keeps the policy's own modes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from webhook import reports, sarif
from webhook.cli import KUBECONFIG_ERRORS, error, not_a_kubeconfig
from webhook.cli_review import add_policy_argument, policy_from
from webhook.documents import Document, DocumentError, discover, parse, read_text
from webhook.judge import Outcome, enforce_everything, judge
from webhook.model import Policy, WorkloadKind
from webhook.violations import Finding

EXAMPLES = """\
examples:
  gpu-admission audit -f manifests/                    # every YAML and JSON file, recursively
  gpu-admission audit -f deploy/ -o sarif > audit.sarif   # annotate a pull request
  gpu-admission audit -f charts/rendered.yaml -o junit > audit.xml
  gpu-admission audit -f manifests/ --policy policy.yaml --respect-modes
  gpu-admission audit --cluster -A                     # every namespace of the current context
  gpu-admission audit --cluster -n ml --context prod -o json

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

PAGE_SIZE = 500
AUDITOR_ROLE = "the gpu-admission-auditor ClusterRole (manifests/base/auditor-clusterrole.yaml)"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# The typed client of each built-in workload kind: (API class, the snake_case kind in its
# method names). Everything else is a custom resource, listed through CustomObjectsApi.
BUILTIN_LISTS: dict[tuple[str, str], tuple[str, str]] = {
    ("", "Pod"): ("CoreV1Api", "pod"),
    ("", "ReplicationController"): ("CoreV1Api", "replication_controller"),
    ("apps", "Deployment"): ("AppsV1Api", "deployment"),
    ("apps", "ReplicaSet"): ("AppsV1Api", "replica_set"),
    ("apps", "StatefulSet"): ("AppsV1Api", "stateful_set"),
    ("apps", "DaemonSet"): ("AppsV1Api", "daemon_set"),
    ("batch", "Job"): ("BatchV1Api", "job"),
    ("batch", "CronJob"): ("BatchV1Api", "cron_job"),
}
# Old manifests still say extensions/v1beta1; no cluster this webhook supports serves it.
LEGACY_GROUPS = frozenset({"extensions"})
MODE_WORD = {"Enforce": "deny", "Warn": "warn", "Audit": "audit"}


class ClusterError(Exception):
    """The audit of a cluster cannot go on (no configuration, server unreachable)."""


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Where a live object is: ``namespace/Kind/name`` and its uid."""

    namespace: str
    kind: str
    name: str
    uid: str

    def __str__(self) -> str:
        return "/".join(p for p in (self.namespace, self.kind, self.name) if p)

    def record(self) -> dict[str, str]:
        return {"ref": str(self), "uid": self.uid}


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


@dataclass(frozen=True, slots=True)
class Problem:
    """Something the audit could not read (a file, a resource it could not list) or judge
    (an object the engine failed on)."""

    source: str
    message: str  # one line that names the source
    stage: str = "read"  # "read" or "judge"


@dataclass(slots=True)
class Audit:
    policy: Policy
    respect_modes: bool
    items: list[Audited] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.problems:
            return 2
        return 1 if any(not i.outcome.allowed for i in self.items) else 0


def add_subcommands(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "audit",
        help="report what a policy would deny, warn about and change",
        description="Audit manifests (files and directories) or the workloads of a live "
        "cluster against a gpu-admission policy: what it would deny, warn about, audit and "
        "mutate.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        "-o", "--output", choices=("table", "json", "junit", "sarif"), default="table"
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
    audit = Audit(policy if args.respect_modes else enforce_everything(policy), args.respect_modes)
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
    render(audit, args.output, sys.stdout)
    return audit.exit_code


def _usage_error(args: argparse.Namespace) -> str | None:
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
    """Judge every object of every file; unreadable files and objects the engine fails on
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
            _judge_into(audit, Audited, document, document.where, namespace, debug=debug)


def _judge_into(
    audit: Audit,
    make: Callable[[Document, Outcome], Audited],
    document: Document,
    where: str,
    namespace: str,
    *,
    debug: bool,
) -> Audited | None:
    """Judge one object into the audit; the engine failing on it is that object's problem,
    and the audit goes on: one malformed object must not hide every other verdict."""
    try:
        outcome = judge(document.obj, audit.policy, namespace, mutate=True)
    except Exception as exc:
        if debug:
            raise
        message = reports.judging_failure(where, document, exc)
        audit.problems.append(Problem(document.source, message, stage="judge"))
        return None
    item = make(document, outcome)
    audit.items.append(item)
    return item


def _note(message: str) -> None:
    print(f"gpu-admission: note: {message}", file=sys.stderr)


# -------------------------------------------------------------------------------- cluster


def audit_cluster(audit: Audit, args: argparse.Namespace) -> None:
    """List the policy's workload kinds in the cluster and judge every object that no other
    reported object owns; the owned ones are listed under their owner."""
    api_client, default_namespace = _connect(args.kubeconfig, args.context)
    namespace = None if args.all_namespaces else (args.namespace or default_namespace)
    lister = _Lister(api_client, namespace, args.request_timeout, audit.problems)
    try:
        objects = [
            obj
            for workload in audit.policy.workloads.values()
            if workload.group not in LEGACY_GROUPS
            for obj in lister.objects(workload)
        ]
    finally:
        api_client.close()
    if lister.not_served:
        _note(
            "not served by this cluster (CRD not installed), skipped: "
            + ", ".join(lister.not_served)
        )
    by_uid = {_meta(o)["uid"]: o for o in objects if _meta(o).get("uid")}
    audited: dict[int, Audited] = {}  # by id() of the root object
    owned: list[tuple[dict, dict]] = []
    for obj in objects:
        root = _root(obj, by_uid)
        if root is obj:
            ref = _ref(obj)
            item = _judge_into(
                audit,
                partial(Audited, ref=ref),
                Document(str(ref), 1, 1, obj),
                str(ref),
                ref.namespace or "default",
                debug=args.debug,
            )
            if item is not None:
                audited[id(obj)] = item
        else:
            owned.append((root, obj))
    for root, obj in owned:
        if id(root) in audited:  # else the owner could not be judged, and is a problem
            audited[id(root)].owned.append(_ref(obj))


def _connect(kubeconfig: str | None, context: str | None) -> tuple[Any, str]:
    """A client and the default namespace: from the kubeconfig (--kubeconfig, $KUBECONFIG or
    ~/.kube/config) as kubectl finds it, else from the in-cluster service account."""
    from kubernetes import client as k8s
    from kubernetes import config

    if kubeconfig is not None and not Path(kubeconfig).is_file():
        raise ClusterError(f"kubeconfig {kubeconfig} does not exist")
    kubeconfig = kubeconfig or _default_kubeconfig()
    configuration = k8s.Configuration()
    try:
        if kubeconfig is None:
            if context is not None:
                raise ClusterError(f"--context {context}: no kubeconfig found")
            config.load_incluster_config(client_configuration=configuration)
            namespace = _service_account_namespace()
        else:
            config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
            namespace = _context_namespace(kubeconfig, context)
    except config.ConfigException as exc:
        where = kubeconfig or "in-cluster configuration (no kubeconfig found)"
        raise ClusterError(
            f"cannot load Kubernetes configuration from {where}: {_one_line(exc)}"
        ) from None
    except KUBECONFIG_ERRORS as exc:
        raise ClusterError(not_a_kubeconfig(kubeconfig, exc)) from None
    return k8s.ApiClient(configuration), namespace


def _default_kubeconfig() -> str | None:
    # Read at run time (the client reads $KUBECONFIG once, at import); it may list several
    # files, which the client merges.
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    home = Path("~/.kube/config").expanduser()
    return str(home) if home.is_file() else None


def _context_namespace(kubeconfig: str, context: str | None) -> str:
    from kubernetes import config

    contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = next((c for c in contexts if c["name"] == context), current) if context else current
    return ((chosen or {}).get("context") or {}).get("namespace") or "default"


def _service_account_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text("utf-8").strip() or "default"
    except OSError:
        return "default"


class _Lister:
    """Paginated lists of one namespace or all. Failures to list one resource become problems
    and the audit goes on; an unreachable server or refused credentials end it."""

    def __init__(
        self, api_client: Any, namespace: str | None, timeout: float, problems: list[Problem]
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.timeout = timeout
        self.problems = problems
        self.not_served: list[str] = []  # custom resources whose CRD is not installed
        self._groups: dict[str, list[str]] | None = None  # discovered API group -> versions
        self._discovery_failed = False

    def objects(self, workload: WorkloadKind) -> list[dict]:
        """Every object of a workload kind, each with its apiVersion and kind."""
        from kubernetes.client.exceptions import ApiException

        resource = f"{workload.resource}.{workload.group}" if workload.group else workload.resource
        builtin = (workload.group, workload.kind) in BUILTIN_LISTS
        for list_page in self._list_functions(workload):
            try:
                items, api_version = self._paginate(list_page)
            except ApiException as exc:
                if exc.status == 404 and not builtin:
                    continue  # this version does not serve the kind; try the group's next
                self.problems.append(Problem(resource, self._failure(exc, workload, resource)))
                return []
            for item in items:
                # Lists of built-in kinds leave apiVersion and kind out of their items.
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", workload.kind)
            return items
        if not self._discovery_failed:  # that is reported once, as a problem
            self.not_served.append(resource)
        return []

    def _list_functions(self, workload: WorkloadKind) -> Iterator[Callable[..., Any]]:
        from kubernetes import client as k8s

        builtin = BUILTIN_LISTS.get((workload.group, workload.kind))
        if builtin is not None:
            api_class, name = builtin
            api = getattr(k8s, api_class)(self.api_client)
            if self.namespace:
                yield partial(getattr(api, f"list_namespaced_{name}"), self.namespace)
            else:
                yield getattr(api, f"list_{name}_for_all_namespaces")
            return
        custom = k8s.CustomObjectsApi(self.api_client)
        for version in self._versions(workload.group):
            if self.namespace:
                yield partial(
                    custom.list_namespaced_custom_object,
                    workload.group,
                    version,
                    self.namespace,
                    workload.resource,
                )
            else:
                yield partial(
                    custom.list_cluster_custom_object, workload.group, version, workload.resource
                )

    def _versions(self, group: str) -> list[str]:
        """The versions the cluster serves of an API group, the preferred one first: the
        policy names custom kinds without a version, and CRDs move from v1alpha1 to v1."""
        from kubernetes import client as k8s
        from kubernetes.client.exceptions import ApiException

        if self._groups is None:
            self._groups = {}
            try:
                discovery = self._call(k8s.ApisApi(self.api_client).get_api_versions)
            except ApiException as exc:
                self._discovery_failed = True
                self.problems.append(
                    Problem(
                        "/apis",
                        f"cannot discover the API groups (HTTP {exc.status}): "
                        f"{_status_message(exc)}; custom workload kinds not audited",
                    )
                )
                return []
            for entry in discovery.get("groups") or []:
                preferred = (entry.get("preferredVersion") or {}).get("version")
                versions = [v["version"] for v in entry.get("versions") or []]
                self._groups[entry["name"]] = sorted(versions, key=lambda v: v != preferred)
        return self._groups.get(group, [])

    def _paginate(self, list_page: Callable[..., Any]) -> tuple[list[dict], str]:
        from kubernetes.client.exceptions import ApiException

        items: list[dict] = []
        token: str | None = None
        restarted = False
        while True:
            try:
                page = self._call(list_page, limit=PAGE_SIZE, _continue=token)
            except ApiException as exc:
                if exc.status == 410 and token and not restarted:
                    # The continue token outlived the API server's snapshot (410 Expired).
                    # Start over once for a consistent list rather than mixing snapshots.
                    items, token, restarted = [], None, True
                    continue
                raise
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items, page.get("apiVersion", "")

    def _call(self, function: Callable[..., Any], **kwargs: Any) -> dict:
        """One request, its JSON body as sent (no model round trip that drops fields)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        host = self.api_client.configuration.host
        try:
            response = function(
                _request_timeout=(self.timeout, self.timeout),  # (connect, read)
                _preload_content=False,
                **kwargs,
            )
        except HTTPError as exc:  # refused, unresolvable, timed out
            reason = getattr(exc, "reason", None) or exc
            raise ClusterError(
                f"cannot reach the Kubernetes API server at {host}: {_one_line(reason)}"
            ) from None
        except ApiException as exc:
            if not exc.status:  # the client reports TLS failures as status 0
                raise ClusterError(
                    f"cannot reach the Kubernetes API server at {host}: {_one_line(exc.reason)}"
                ) from None
            if exc.status == 401:
                raise ClusterError(
                    f"the Kubernetes API server at {host} refused the credentials (HTTP 401): "
                    f"{_status_message(exc)}"
                ) from None
            raise
        try:
            body = json.loads(response.data)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            # A proxy or a web server at the kubeconfig's address answers 200 with HTML.
            raise ClusterError(
                f"the server at {host} did not answer as a Kubernetes API server (the body "
                f"of a {response.status} answer is not a JSON object): check the kubeconfig's "
                "server address"
            ) from None
        return body

    def _failure(self, exc: Any, workload: WorkloadKind, resource: str) -> str:
        scope = f'in namespace "{self.namespace}"' if self.namespace else "in all namespaces"
        message = _status_message(exc)
        if exc.status == 403:
            return (
                f"cannot list {resource} {scope}: forbidden (HTTP 403): {message}; the audit "
                f'needs the "list" permission on {workload.resource} in API group '
                f'"{workload.group}": bind {AUDITOR_ROLE}'
            )
        return f"cannot list {resource} {scope}: HTTP {exc.status} {exc.reason}: {message}"


def _status_message(exc: Any) -> str:
    """The API server's own words from the Status body, else the HTTP reason."""
    try:
        return _one_line(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return _one_line(exc.reason)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _meta(obj: dict) -> dict:
    return obj.get("metadata") or {}


def _ref(obj: dict) -> ObjectRef:
    meta = _meta(obj)
    return ObjectRef(
        meta.get("namespace", ""), obj.get("kind", ""), meta.get("name", ""), meta.get("uid", "")
    )


def _root(obj: dict, by_uid: dict[str, dict]) -> dict:
    """The top reported controller of an object (Pod -> ReplicaSet -> Deployment, Pod -> Job
    -> CronJob, a PyTorchJob's Pods -> the PyTorchJob), or the object itself. Only the
    controller counts: its template is what made the object."""
    seen = {_meta(obj).get("uid")}
    while True:
        owner = next(
            (r for r in _meta(obj).get("ownerReferences") or [] if r.get("controller")), None
        )
        parent = by_uid.get(owner.get("uid")) if owner else None
        if parent is None or _meta(parent).get("uid") in seen:  # a cycle is the API's bug
            return obj
        seen.add(_meta(parent).get("uid"))
        obj = parent


# ------------------------------------------------------------------------------ rendering


def render(audit: Audit, fmt: str, stream: TextIO) -> None:
    if fmt == "table":
        table(audit, stream)
    elif fmt == "json":
        reports.dump(records(audit), "json", stream)
    elif fmt == "junit":
        stream.write(junit(audit))
    else:
        rows = [(i.document, i.outcome) for i in audit.items]
        errors = [(p.source, p.message) for p in audit.problems]
        json.dump(sarif.log(rows, errors), stream, indent=2)
        stream.write("\n")


def records(audit: Audit) -> list[dict[str, Any]]:
    """review's records, with every mutation, then one ``{source, error}`` per problem."""
    out = []
    for item in audit.items:
        record = reports.outcome_record(item.document, item.outcome, with_mutation=True)
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
    colour = reports.use_colour(stream)
    for item in audit.items:
        outcome = item.outcome
        if not outcome.judged:
            continue
        shade = "red" if not outcome.allowed else ("yellow" if outcome.findings else "green")
        stream.write(
            f"{reports.paint(reports.VERDICT[outcome.allowed].upper(), shade, colour)}  "
            f"{item.document.describe()}  (namespace {outcome.namespace}, {item.location})\n"
        )
        for finding in outcome.findings:
            line = item.line_of(finding.path)
            stream.write(
                f"  {MODE_WORD[finding.mode]:<5} [{finding.rule}] {finding.violation.render()}"
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


def junit(audit: Audit) -> str:
    """One testsuite, one testcase per judged object, a failure per object that would be
    denied; inputs that could not be read and objects that could not be judged are errors."""
    judged = [i for i in audit.items if i.outcome.judged]
    suite = ET.Element(
        "testsuite",
        name="gpu-admission audit",
        tests=str(len(judged) + len(audit.problems)),
        failures=str(sum(1 for i in judged if not i.outcome.allowed)),
        errors=str(len(audit.problems)),
        skipped="0",
    )
    for item in judged:
        classname = item.ref.namespace if item.ref else item.document.source
        case = ET.SubElement(
            suite, "testcase", classname=classname or "cluster", name=item.document.describe()
        )
        if not item.outcome.allowed:
            denied = item.outcome.denied
            rules = sorted({f.rule for f in denied})
            failure = ET.SubElement(
                case,
                "failure",
                type="denied",
                message=f"would be denied: {len(denied)} violation(s) of {', '.join(rules)}",
            )
            failure.text = "\n".join(_finding_line(item, f) for f in denied)
        others = [f for f in item.outcome.findings if f.mode != "Enforce"]
        if others:
            ET.SubElement(case, "system-out").text = "\n".join(
                _finding_line(item, f) for f in others
            )
    for problem in audit.problems:
        case = ET.SubElement(suite, "testcase", classname=problem.source, name=problem.stage)
        kind = "unreadable" if problem.stage == "read" else "unjudgeable"
        ET.SubElement(case, "error", type=kind, message=problem.message)
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, "unicode") + "\n"


def _finding_line(item: Audited, finding: Finding) -> str:
    line = item.line_of(finding.path)
    where = f" (line {line})" if line is not None else ""
    return f"{MODE_WORD[finding.mode]} [{finding.rule}] {finding.violation.render()}{where}"
