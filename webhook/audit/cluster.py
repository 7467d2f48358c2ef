"""Auditing the workloads of a live cluster: list every kind the policy judges (paged), and
judge each object that no other listed object owns; what it owns is listed under it.

Objects are judged page by page as they arrive, so that memory follows the findings, not the
cluster (150,000 Pods held whole took about 24 KB each). Kinds are listed owners first (custom
kinds, then the built-in controllers, then ReplicaSets and Jobs, then Pods), so an owned object
finds its owner judged already. Kept are one uid -> root uid record per listed object, and per
judged object what the reports print (``Audited`` with a stub for the object); whole are kept
only the objects whose controller may still be listed, until it is (or no kind left can list
it): memory follows the objects listed before their owners, few with this order.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

from webhook.admission.objects import decide_object, enforce_everything
from webhook.audit.documents import Document
from webhook.audit.judging import Audit, Audited, judge
from webhook.audit.quota_drift import check_quotas
from webhook.cluster.connection import Cluster
from webhook.cluster.listing import Lister, Problem, RequestRefused
from webhook.cluster.ownership import controller_of, meta, ref_of
from webhook.policy.model import Policy, WorkloadKind
from webhook.policy.workloads import DRA_GROUP, LEGACY_GROUPS

# The order of the kinds listed, lowest first: custom kinds (0) own built-in ones (a JobSet
# its Jobs, a LeaderWorkerSet its StatefulSets, an InferenceService or a NIMService its
# Deployments), the built-in controllers (1) own ReplicaSets and Jobs (2), and all of them
# own Pods (3), by far the most objects. A custom kind owning another is listed in the
# policy's order and may wait (pending) for its owner: there are few of those.
_LISTED_LATE = {("apps", "ReplicaSet"): 2, ("batch", "Job"): 2, ("", "Pod"): 3}


def audit_cluster(
    policy: Policy,
    cluster: Cluster,
    namespace: str | None,
    *,
    respect_modes: bool = False,
    raise_errors: bool = False,
    keep_mutated: bool = True,
    compare_quotas: bool = False,
) -> Audit:
    """Judge the workloads of ``namespace`` (None: every namespace and the cluster-scoped
    kinds). Modes as in :func:`~webhook.audit.files.audit_files`. A resource that cannot be
    listed is a problem of the audit; an unreachable server raises ``ClusterError``. Without
    ``keep_mutated``, a mutation keeps its patch but not the Pod as mutated (a whole Pod per
    bare GPU Pod: only ``-o json`` prints it). With ``compare_quotas``, the ResourceQuotas
    that contradict the tenants' entitlements are notes of the audit (a quota is no workload:
    it has no verdict; ``cluster check`` reports the same as drift)."""
    audit = Audit(policy if respect_modes else enforce_everything(policy), respect_modes)
    judge_cluster([audit], cluster, namespace, raise_errors=raise_errors, keep_mutated=keep_mutated)
    if compare_quotas:
        try:
            quotas = check_quotas(cluster, policy, namespace)
        except RequestRefused as exc:
            audit.problems.append(Problem("resourcequotas", str(exc)))
        else:
            audit.notes += [f"{d.kind}: {d.message}" for d in quotas.drift]
    return audit


def judge_cluster(
    audits: Sequence[Audit],
    cluster: Cluster,
    namespace: str | None,
    *,
    raise_errors: bool,
    keep_mutated: bool,
) -> None:
    """One listing, judged into every audit with its policy as it is (the kinds of all their
    policies are listed). What the listing skipped is noted in the first audit, and what it
    could not read is a problem of the first audit, before the objects it could not judge."""
    lister = Lister(cluster, namespace)
    kinds = {key: w for audit in reversed(audits) for key, w in audit.policy.workloads.items()}
    listed = sorted(
        (
            workload
            for workload in kinds.values()
            if workload.group not in LEGACY_GROUPS
            and (namespace is None or workload.scope == "Namespaced")
        ),
        key=_listing_rank,
    )
    judging = _Judging(
        audits,
        [workload.kind for workload in listed],
        raise_errors=raise_errors,
        keep_mutated=keep_mutated,
    )
    for workload in listed:
        for page in lister.object_pages(workload):
            for obj in page:
                judging.place(obj)
        judging.listed(workload.kind)
    judging.finish()
    first = audits[0]
    first.problems[:0] = lister.problems
    dra = [resource for resource, _ in lister.not_served if resource.endswith(f".{DRA_GROUP}")]
    if dra:
        first.notes.append(
            f"this cluster does not serve {DRA_GROUP}/v1 (Kubernetes 1.34+): no DRA claim or "
            "claim template to judge"
        )
    declared = [
        resource
        for resource, catalogued in lister.not_served
        if not catalogued and resource not in dra
    ]
    if declared:
        first.notes.append(
            "not served by this cluster (CRD not installed), skipped: " + ", ".join(declared)
        )
    catalogued = len(lister.not_served) - len(declared) - len(dra)
    if catalogued:
        first.notes.append(
            f"{catalogued} catalogued GPU workload kind(s) not installed in this cluster "
            "(`gpu-admission policy workloads` lists the catalogue)"
        )


def _listing_rank(workload: WorkloadKind) -> int:
    if not workload.built_in:
        return 0
    return _LISTED_LATE.get((workload.group, workload.kind), 1)


class _Judging:
    """Listed objects, judged into every audit as they come.

    ``roots``: each placed object's uid -> the uid of its root (the top listed controller, or
    itself). ``judged``: per audit, a root's uid -> its ``Audited`` (None: the engine failed on
    it, a problem already). ``waiting``: objects whose controller is not placed yet but may
    be (a kind still to list names it, or it waits itself), whole, by that controller's uid:
    each is placed when its controller is, or made a root once no kind left can bring it.
    """

    def __init__(
        self,
        audits: Sequence[Audit],
        kinds: list[str],
        *,
        raise_errors: bool,
        keep_mutated: bool,
    ) -> None:
        self.audits = audits
        self.raise_errors = raise_errors
        self.keep_mutated = keep_mutated
        # By kind alone: an owner reference's apiVersion may name a version or an old group.
        self.to_list = Counter(kinds)
        self.roots: dict[str, str] = {}
        self.judged: list[dict[str, Audited | None]] = [{} for _ in audits]
        self.waiting: dict[str, list[dict[str, Any]]] = {}
        self.pending: dict[int, dict[str, Any]] = {}  # every waiting object, in listing order
        self.pending_uids: set[str] = set()

    def place(self, obj: dict[str, Any]) -> None:
        uid = _uid(obj)
        owner = controller_of(obj) or {}
        owner_uid = owner.get("uid")
        if not owner_uid or owner_uid == uid:
            self._judge_root(obj, uid)
        elif owner_uid in self.roots:
            self._place_owned(obj, uid, self.roots[owner_uid])
        elif owner_uid in self.pending_uids or self.to_list[str(owner.get("kind"))] > 0:
            self.waiting.setdefault(owner_uid, []).append(obj)
            self.pending[id(obj)] = obj
            if uid:
                self.pending_uids.add(uid)
            return
        else:  # its owner is no listed kind (a mirror Pod's Node, a controller not judged)
            self._judge_root(obj, uid)
        self._release(uid)

    def listed(self, kind: str) -> None:
        """Every object of a kind has been placed: what waits for a controller that no kind
        left to list can bring (none that waits itself) is a root."""
        self.to_list[kind] -= 1
        for owner_uid in [uid for uid in self.waiting if uid not in self.pending_uids]:
            still = []
            for obj in self.waiting.pop(owner_uid, []):
                if self.to_list[str((controller_of(obj) or {}).get("kind"))] > 0:
                    still.append(obj)
                    continue
                uid = self._unpend(obj)
                self._judge_root(obj, uid)
                self._release(uid)
            if still:
                self.waiting[owner_uid] = still

    def finish(self) -> None:
        """Once every kind is listed, what still waits waits for itself: its controllers loop
        (the API's bug), so no controller made it, and it is judged alone."""
        for obj in self.pending.values():
            for audit in self.audits:
                self._judge(audit, obj)
        self.waiting, self.pending, self.pending_uids = {}, {}, set()

    def _release(self, uid: str) -> None:
        """Place what waited for an object just placed, and what waited for those: each is
        owned by its root (compared with it as any other owned object)."""
        placed = [uid]
        while placed:
            owner_uid = placed.pop()
            for obj in self.waiting.pop(owner_uid, []) if owner_uid else []:
                obj_uid = self._unpend(obj)
                self._place_owned(obj, obj_uid, self.roots[owner_uid])
                placed.append(obj_uid)

    def _unpend(self, obj: dict[str, Any]) -> str:
        del self.pending[id(obj)]
        uid = _uid(obj)
        self.pending_uids.discard(uid)
        return uid

    def _judge_root(self, obj: dict[str, Any], uid: str) -> None:
        if uid:
            self.roots[uid] = uid
        for audit, judged in zip(self.audits, self.judged, strict=True):
            item = self._judge(audit, obj)
            if uid:
                judged[uid] = item

    def _place_owned(self, obj: dict[str, Any], uid: str, root: str) -> None:
        if uid:
            self.roots[uid] = root
        ref = ref_of(obj)
        for audit, judged in zip(self.audits, self.judged, strict=True):
            owner = judged.get(root)
            if owner is None:  # the owner could not be judged, and is a problem
                continue
            # An owned object is listed under its owner only when the owner's template
            # accounts for everything found in it: a forged owner reference, ephemeral
            # containers added later or a Pod shaped by what no template shows (Argo's
            # podSpecPatch) make it an object of its own.
            try:
                extra = _findings_beyond(audit, obj, ref.namespace or "default", owner)
            except Exception:  # the engine failing on it: judged alone below, as a problem
                extra = True
            if extra:
                self._judge(audit, obj, made_by_controller=True)
            else:
                owner.owned.append(ref)

    def _judge(
        self, audit: Audit, obj: dict[str, Any], *, made_by_controller: bool = False
    ) -> Audited | None:
        ref = ref_of(obj)
        document = Document(str(ref), 1, 1, obj)
        namespace = ref.namespace or "default"
        item = judge(
            audit,
            document,
            str(ref),
            namespace,
            ref=ref,
            raise_errors=self.raise_errors,
            made_by_controller=made_by_controller,
        )
        if item is not None:
            _drop_object(item, self.keep_mutated)
        return item


def _uid(obj: dict[str, Any]) -> str:
    return str(meta(obj).get("uid") or "")


def _drop_object(item: Audited, keep_mutated: bool) -> None:
    """Keep of a judged live object only what is printed of it: its apiVersion, kind and
    names, in the document and the outcome, and of each mutation the Pod as mutated where
    ``keep_mutated`` (``-o json`` prints it), not the Pod it was made from (``review``'s diff
    is its only reader). The verdict, findings and patches are kept as they are."""
    obj = item.outcome.obj  # a live object: a dict, as listed
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    names = ("name", "generateName", "namespace", "uid")
    stub: dict[str, Any] = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {key: metadata[key] for key in names if key in metadata},
    }
    item.document = Document(item.document.source, 1, 1, stub)
    item.outcome = dataclasses.replace(
        item.outcome,
        obj=stub,
        mutations=tuple(
            dataclasses.replace(m, original=stub, mutated=m.mutated if keep_mutated else stub)
            for m in item.outcome.mutations
        ),
    )


def _findings_beyond(audit: Audit, obj: dict[str, Any], namespace: str, owner: Audited) -> bool:
    """Whether an owned object has a finding its owner's verdict does not already carry."""
    known = {f.violation.key for f in owner.outcome.findings}
    # Listed under a controller that the audit found: what the controller made is not asked
    # for a queue again (its owner was).
    outcome = decide_object(obj, audit.policy, namespace, made_by_controller=True)
    return any(f.violation.key not in known for f in outcome.findings)
