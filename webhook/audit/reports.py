"""Policy reports of an audit: one report per judged workload with findings, in the format
that Kyverno, Kubewarden and Policy Reporter read (``wgpolicyk8s.io/v1alpha2``, or its
successor ``openreports.io/v1alpha1``), written with server-side apply and pruned by label.

A report's scope is the workload as written (a Deployment, a PyTorchJob), not each Pod it owns:
what owners create is listed under them by the audit and judged again at creation. A workload
without findings has no report: applying deletes the one it had. Reports carry no result
timestamps, so that a rerun over an unchanged cluster changes nothing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from webhook.audit.judging import Audited
from webhook.cluster.connection import Cluster, ClusterError
from webhook.cluster.listing import Lister, Problem, status_message
from webhook.core.findings import Finding, Violation
from webhook.policy.model import SECURITY_RULES, Policy
from webhook.policy.rules import BY_ID

if TYPE_CHECKING:
    from kubernetes.client import CustomObjectsApi

MANAGER = "gpu-admission"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
SELECTOR = f"{MANAGED_BY_LABEL}={MANAGER}"
SOURCE = "gpu-admission"


@dataclass(frozen=True, slots=True)
class ReportAPI:
    """One report API: its group and version, and the kinds and resources of its namespaced
    and cluster-scoped reports."""

    group: str
    version: str
    kind: str
    plural: str
    cluster_kind: str
    cluster_plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


REPORT_APIS = {
    "wgpolicyk8s": ReportAPI(
        "wgpolicyk8s.io",
        "v1alpha2",
        "PolicyReport",
        "policyreports",
        "ClusterPolicyReport",
        "clusterpolicyreports",
    ),
    "openreports": ReportAPI(
        "openreports.io", "v1alpha1", "Report", "reports", "ClusterReport", "clusterreports"
    ),
}

# How much a finding of a rule weighs: the security rules keep tenants off the node; the GPU
# rules keep Pods schedulable and on their pools; the last two are hygiene.
RESULT = {"Enforce": "fail", "Audit": "fail", "Warn": "warn"}
# Bounds that keep one object from making a report the API server refuses (its request limit
# is 3 MiB): a value is quoted up to this many characters, a message is cut at this length,
# and a report lists this many results, then one that counts the rest.
MAX_QUOTED_VALUE = 256
MAX_MESSAGE = 2048
MAX_RESULTS = 200
# A namespace's name as the API server takes it: an RFC 1123 label.
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class Subject:
    """The judged workload a report is about."""

    api_version: str
    kind: str
    namespace: str  # "" for a cluster-scoped object
    name: str
    uid: str = ""

    def reference(self) -> dict[str, str]:
        ref = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        return ref


def report_name(subject: Subject) -> str:
    """``gpu-admission-<kind>-<name>-<hash>``: stable across runs, readable, and distinct for
    kinds of one name in different groups (a batch Job and a Volcano Job). At most 253
    characters, the limit of a custom object's name."""
    group = subject.api_version.rpartition("/")[0]
    digest = hashlib.sha256(
        f"{group}/{subject.kind}/{subject.namespace}/{subject.name}".encode()
    ).hexdigest()[:8]
    stem = f"{MANAGER}-{subject.kind.lower()}-{subject.name}"[: 253 - 9]
    return f"{stem.rstrip('-.')}-{digest}"


def build_report(
    api: ReportAPI, policy: Policy, subject: Subject, findings: Iterable[Finding]
) -> dict[str, Any] | None:
    """The report of one workload's findings, or None when it has none."""
    results = [_result(policy, subject, finding) for finding in findings]
    if not results:
        return None
    summary = {key: 0 for key in ("pass", "fail", "warn", "error", "skip")}
    for result in results:
        summary[result["result"]] += 1
    if len(results) > MAX_RESULTS:
        left_out = len(results) - MAX_RESULTS
        results = results[:MAX_RESULTS]
        results.append(
            {
                "source": SOURCE,
                "policy": policy.name,
                "rule": "report-truncated",
                "result": "warn",
                "severity": "info",
                "scored": False,
                "message": f"{left_out} more finding(s) not listed (the summary counts them): "
                "`gpu-admission review` of the object lists every one",
                "resources": [subject.reference()],
            }
        )
    metadata: dict[str, Any] = {
        "name": report_name(subject),
        "labels": {MANAGED_BY_LABEL: MANAGER, "gpu-admission.io/policy": policy.name[:63]},
    }
    if subject.namespace:
        metadata["namespace"] = subject.namespace
    report: dict[str, Any] = {
        "apiVersion": api.api_version,
        "kind": api.kind if subject.namespace else api.cluster_kind,
        "metadata": metadata,
        "scope": subject.reference(),
        "summary": summary,
        "results": results,
    }
    if api.group == "openreports.io":
        report["source"] = SOURCE
    return report


def _result(policy: Policy, subject: Subject, finding: Finding) -> dict[str, Any]:
    violation = finding.violation
    properties = {"mode": finding.mode, "field": violation.path}
    if finding.template:
        properties["template"] = finding.template
    if finding.scope:
        properties["scope"] = finding.scope
    return {
        "source": SOURCE,
        "policy": policy.name,
        "rule": finding.rule,
        "category": "GPU security" if finding.rule in SECURITY_RULES else "GPU scheduling",
        "severity": BY_ID[finding.rule].severity,
        "result": RESULT[finding.mode],
        "scored": True,
        "message": _message(violation),
        "resources": [subject.reference()],
        "properties": properties,
    }


def _message(violation: Violation) -> str:
    """The violation as review prints it, without values that may carry secrets or bulk: an
    environment variable's (set from a Secret, or a token written inline), any long string,
    any structured value. A report is read by everyone who may view its namespace, and Policy
    Reporter forwards results out of the cluster."""
    value = violation.value
    quoted = (
        isinstance(value, int | float | bool)
        or isinstance(value, str)
        and len(value) <= MAX_QUOTED_VALUE
        and ".env[" not in violation.path
        and ".envFrom[" not in violation.path
    )
    if violation.error_type in ("Forbidden", "Required value") or quoted:
        message = violation.render()
    else:
        message = f"{violation.path}: {violation.error_type}: {violation.detail()}"
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    return message


def policy_reports(
    policy: Policy, items: Iterable[Audited], api: ReportAPI
) -> list[dict[str, Any]]:
    """One report per judged object with findings, in the order they were judged."""
    return list(iter_policy_reports(policy, items, api))


def iter_policy_reports(
    policy: Policy, items: Iterable[Audited], api: ReportAPI
) -> Iterator[dict[str, Any]]:
    """The reports of :func:`policy_reports`, each built when it is asked for: a cluster's
    reports are written or printed one at a time, never all held at once."""
    for item in items:
        obj = item.document.obj
        if not item.outcome.judged or not isinstance(obj, dict):
            continue
        group = str(obj.get("apiVersion", "")).rpartition("/")[0]
        workload = policy.workloads.get((group, str(obj.get("kind", ""))))
        cluster_scoped = workload is not None and workload.scope == "Cluster"
        metadata = obj.get("metadata") or {}
        subject = Subject(
            str(obj.get("apiVersion", "")),
            str(obj.get("kind", "")),
            "" if cluster_scoped else item.outcome.namespace,
            str(metadata.get("name", "")),
            str(metadata.get("uid", "")),
        )
        report = build_report(api, policy, subject, item.outcome.findings)
        if report is not None:
            yield report


def with_report_namespace(
    policy: Policy, items: Iterable[Audited]
) -> tuple[list[Audited], list[Problem]]:
    """``(kept, problems)``: the items whose reports have a namespace to go in, in their
    order (live objects, objects not judged and cluster-scoped kinds included), and one
    problem for each file's object left out. A report is written to the namespace the object
    was judged in (``-n``, else its own, else ``default``), and a manifest's ``namespace``
    that is no namespace name (a template's placeholder) would make a report no API server
    takes."""
    kept: list[Audited] = []
    problems: list[Problem] = []
    for item in items:
        obj = item.document.obj
        if item.outcome.judged and isinstance(obj, dict) and item.ref is None:
            group = str(obj.get("apiVersion", "")).rpartition("/")[0]
            workload = policy.workloads.get((group, str(obj.get("kind", ""))))
            namespaced = workload is None or workload.scope != "Cluster"
            if namespaced and not NAMESPACE_NAME.fullmatch(item.outcome.namespace):
                problems.append(
                    Problem(
                        item.document.source,
                        f"{item.document.where}: no report for {item.document.describe()}: its "
                        f"namespace {item.outcome.namespace!r} is no namespace name; give the "
                        "namespace it is applied to with -n",
                        stage="judge",
                    )
                )
                continue
        kept.append(item)
    return kept, problems


@dataclass(slots=True)
class Applied:
    """What :func:`apply_reports` did; ``line`` says it in one line."""

    created: int = 0
    updated: int = 0
    unchanged: int = 0
    pruned: int = 0
    missing_crd: str = ""  # the report kind whose CRD is not installed: nothing written
    failed: list[str] = field(default_factory=list)  # one line per report not written
    prune_skipped: bool = False  # the audit was incomplete: nothing stale can be told apart

    def line(self, api: ReportAPI) -> str:
        if self.missing_crd:
            return (
                f"reports: none written: {self.missing_crd} is not served by this cluster "
                f"(install the {api.group} CRDs, or use the chart's value that does)"
            )
        line = (
            f"reports ({api.api_version}): {self.created} created, {self.updated} updated, "
            f"{self.unchanged} unchanged, {self.pruned} pruned"
        )
        if self.failed:
            line += f", {len(self.failed)} not written"
        if self.prune_skipped:
            line += " (pruning skipped: the audit could not read or judge everything)"
        return line


def apply_reports(
    cluster: Cluster,
    api: ReportAPI,
    reports: Iterable[dict[str, Any]],
    namespace: str | None,
    *,
    prune: bool = True,
) -> Applied:
    """Write ``reports`` with server-side apply, then delete the reports this tool wrote
    before that are no longer among them (their workloads became clean or went away): in
    ``namespace``, or with None in every namespace and at cluster scope. A report the API
    server refuses is counted and the others are written; ``prune`` false (an incomplete
    audit, where a missing report does not mean a clean workload) deletes nothing. Reports
    that cannot be listed or deleted end the work: :class:`ClusterError`.

    ``reports`` is read once, one report at a time (:func:`iter_policy_reports` builds each
    when asked): of a written report only its namespace and name are kept, for the prune."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    lister = Lister(cluster, namespace)
    custom = k8s.CustomObjectsApi(cluster.api_client)
    applied = Applied()
    try:
        existing = _existing(lister, custom, api, namespace)
    except ApiException as exc:
        raise ClusterError(
            f"cannot list the {api.plural}.{api.group} this tool wrote (HTTP {exc.status}): "
            f"{status_message(exc)}"
        ) from None
    if existing is None:
        applied.missing_crd = f"{api.kind}.{api.group}"
        return applied
    wanted: set[tuple[str, str]] = set()
    for report in reports:
        meta = report["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        wanted.add(key)
        before = existing.get(key)
        try:
            after = lister.call(_apply_call(custom, api, meta), body=report)
        except ApiException as exc:
            if exc.status == 404:
                applied.missing_crd = f"{report['kind']}.{api.group}"
                return applied
            where = f"{meta.get('namespace', '')}/{meta['name']}"
            applied.failed.append(f"{where}: HTTP {exc.status}")
            continue
        if before is None:
            applied.created += 1
        elif after["metadata"].get("resourceVersion") != before:
            applied.updated += 1
        else:
            applied.unchanged += 1
    if not prune or applied.failed:
        applied.prune_skipped = True
        return applied
    for report_namespace, name in sorted(set(existing) - wanted):
        if report_namespace:
            delete: Any = custom.delete_namespaced_custom_object
            args: tuple[Any, ...] = (api.group, api.version, report_namespace, api.plural, name)
        else:
            delete = custom.delete_cluster_custom_object
            args = (api.group, api.version, api.cluster_plural, name)
        try:
            lister.call(partial(delete, *args))
        except ApiException as exc:
            if exc.status != 404:  # gone already: as good as pruned
                raise ClusterError(
                    f"cannot delete the stale report {report_namespace}/{name} "
                    f"(HTTP {exc.status}): {status_message(exc)}"
                ) from None
        applied.pruned += 1
    return applied


def _apply_call(
    custom: CustomObjectsApi, api: ReportAPI, meta: dict[str, Any]
) -> Callable[..., Any]:
    """A server-side apply of one report (``application/apply-patch+yaml``; JSON is YAML)."""
    options: dict[str, Any] = {
        "field_manager": MANAGER,
        "force": True,
        "_content_type": "application/apply-patch+yaml",
    }
    if "namespace" in meta:
        return lambda body, **kw: custom.patch_namespaced_custom_object(
            api.group,
            api.version,
            meta["namespace"],
            api.plural,
            meta["name"],
            body,
            **options,
            **kw,
        )
    return lambda body, **kw: custom.patch_cluster_custom_object(
        api.group, api.version, api.cluster_plural, meta["name"], body, **options, **kw
    )


def _existing(
    lister: Lister, custom: CustomObjectsApi, api: ReportAPI, namespace: str | None
) -> dict[tuple[str, str], str] | None:
    """(namespace, name) -> resourceVersion of the reports this tool wrote; None when the
    report CRD is not installed."""
    from kubernetes.client.exceptions import ApiException

    pages: list[Callable[..., Any]] = []
    if namespace:
        pages.append(
            lambda **kw: custom.list_namespaced_custom_object(
                api.group, api.version, namespace, api.plural, label_selector=SELECTOR, **kw
            )
        )
    else:
        pages.append(
            lambda **kw: custom.list_cluster_custom_object(
                api.group, api.version, api.plural, label_selector=SELECTOR, **kw
            )
        )
        pages.append(
            lambda **kw: custom.list_cluster_custom_object(
                api.group, api.version, api.cluster_plural, label_selector=SELECTOR, **kw
            )
        )
    found: dict[tuple[str, str], str] = {}
    for index, list_page in enumerate(pages):
        try:
            items = lister.paginate(list_page).items
        except ApiException as exc:
            if exc.status == 404:
                if index == 0:
                    return None
                continue  # the cluster report kind alone missing: namespaced reports only
            raise
        for item in items:
            meta = item.get("metadata") or {}
            found[(meta.get("namespace", ""), meta["name"])] = meta.get("resourceVersion", "")
    return found
