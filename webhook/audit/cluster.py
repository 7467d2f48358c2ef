"""Auditing the workloads of a live cluster: list every kind the policy judges (paged), and
judge each object that no other listed object owns; what it owns is listed under it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from webhook.admission.objects import decide_object, enforce_everything
from webhook.audit.documents import Document
from webhook.audit.judging import Audit, Audited, judge
from webhook.cluster.connection import Cluster
from webhook.cluster.listing import Lister
from webhook.cluster.ownership import meta, ref_of, root_of
from webhook.policy.model import Policy
from webhook.policy.workloads import LEGACY_GROUPS


def audit_cluster(
    policy: Policy,
    cluster: Cluster,
    namespace: str | None,
    *,
    respect_modes: bool = False,
    raise_errors: bool = False,
) -> Audit:
    """Judge the workloads of ``namespace`` (None: every namespace and the cluster-scoped
    kinds). Modes as in :func:`~webhook.audit.files.audit_files`. A resource that cannot be
    listed is a problem of the audit; an unreachable server raises ``ClusterError``."""
    audit = Audit(policy if respect_modes else enforce_everything(policy), respect_modes)
    judge_cluster([audit], cluster, namespace, raise_errors=raise_errors)
    return audit


def judge_cluster(
    audits: Sequence[Audit], cluster: Cluster, namespace: str | None, *, raise_errors: bool
) -> None:
    """One listing, judged into every audit with its policy as it is (the kinds of all their
    policies are listed). What the listing skipped is noted in the first audit, and what it
    could not read is a problem of the first audit."""
    lister = Lister(cluster, namespace)
    kinds = {key: w for audit in reversed(audits) for key, w in audit.policy.workloads.items()}
    objects = [
        obj
        for workload in kinds.values()
        if workload.group not in LEGACY_GROUPS
        and (namespace is None or workload.scope == "Namespaced")
        for obj in lister.objects(workload)
    ]
    first = audits[0]
    first.problems.extend(lister.problems)
    declared = [resource for resource, catalogued in lister.not_served if not catalogued]
    if declared:
        first.notes.append(
            "not served by this cluster (CRD not installed), skipped: " + ", ".join(declared)
        )
    catalogued = len(lister.not_served) - len(declared)
    if catalogued:
        first.notes.append(
            f"{catalogued} catalogued GPU workload kind(s) not installed in this cluster "
            "(`gpu-admission policy workloads` lists the catalogue)"
        )
    by_uid = {meta(o)["uid"]: o for o in objects if meta(o).get("uid")}
    for audit in audits:
        _judge_roots(audit, objects, by_uid, raise_errors=raise_errors)


def _judge_roots(
    audit: Audit,
    objects: list[dict[str, Any]],
    by_uid: dict[str, dict[str, Any]],
    *,
    raise_errors: bool,
) -> None:
    audited: dict[int, Audited] = {}  # by id() of the root object
    owned: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for obj in objects:
        root = root_of(obj, by_uid)
        if root is obj:
            item = _judge_live(audit, obj, raise_errors=raise_errors)
            if item is not None:
                audited[id(obj)] = item
        else:
            owned.append((root, obj))
    for root, obj in owned:
        owner = audited.get(id(root))
        if owner is None:  # the owner could not be judged, and is a problem
            continue
        # An owned object is listed under its owner only when the owner's template accounts
        # for everything found in it: a forged owner reference, ephemeral containers added
        # later or a Pod shaped by what no template shows (Argo's podSpecPatch) make it an
        # object of its own.
        ref = ref_of(obj)
        try:
            extra = _findings_beyond(audit, obj, ref.namespace or "default", owner)
        except Exception:  # the engine failing on it: judged alone below, as a problem
            extra = True
        if extra:
            _judge_live(audit, obj, raise_errors=raise_errors)
        else:
            owner.owned.append(ref)


def _judge_live(audit: Audit, obj: dict[str, Any], *, raise_errors: bool) -> Audited | None:
    ref = ref_of(obj)
    document = Document(str(ref), 1, 1, obj)
    namespace = ref.namespace or "default"
    return judge(audit, document, str(ref), namespace, ref=ref, raise_errors=raise_errors)


def _findings_beyond(audit: Audit, obj: dict[str, Any], namespace: str, owner: Audited) -> bool:
    """Whether an owned object has a finding its owner's verdict does not already carry."""
    known = {f.violation.key for f in owner.outcome.findings}
    outcome = decide_object(obj, audit.policy, namespace)
    return any(f.violation.key not in known for f in outcome.findings)
