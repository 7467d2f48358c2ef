"""What an UPDATE is judged on: what it can change, not what the object already had.

- ``pods/ephemeralcontainers``: the API server keeps only the ephemeral containers from such a
  request, so only the ones it adds are judged, each on its own: ``kubectl debug`` is not
  refused for the Pod's other containers.
- A Pod: its spec is all but frozen, so findings the old Pod already had are forgiven (a Job
  controller must always be able to remove its finalizer) — unless the update changes where the
  Pod can land (tolerations, scheduling gates, node selection, before it is scheduled) or adds
  or changes an annotation that has the node inject devices or mounts (CDI, NRI, GKE's): the
  Pod is then judged anew, with its new reachability.
- A workload: a finding is forgiven only if the old object had the same finding, with the same
  value, in Enforce mode under the policy in force (it was admitted some other way: before the
  policy, or under an exemption since withdrawn), and, for the security rules, its template
  reached GPU nodes as directly before; an update that changes only metadata forgives whatever
  the old object had. A finding that was only warned or audited before is enforced once the
  update makes it enforceable: turning a template into a GPU template is the update's doing.

Forgiven findings stay visible as warnings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from webhook.core.findings import Finding, render_value
from webhook.core.pods import ephemeral_container_names, is_cdi_annotation
from webhook.policy.annotations import classify
from webhook.policy.model import SECURITY_RULES, Scope, WorkloadKind

SCHEDULING_FIELDS = ("tolerations", "schedulingGates", "nodeSelector", "affinity")
# A template that comes to reach GPU nodes more directly is judged anew by the security rules.
REACH_RANK: dict[Scope, int] = {"otherPods": 0, "reachablePods": 1, "gpuPods": 2}
EPHEMERAL = "ephemeralcontainers"


Forgiver = Callable[[list[Finding]], list[Finding]]


def forgiver(
    old_findings: Callable[[frozenset[str]], list[Finding]],
    request: Mapping[str, Any],
    obj: Mapping[str, Any],
    old: Mapping[str, Any],
    workload: WorkloadKind,
) -> Forgiver:
    """What judges an UPDATE's findings, batch after batch: each batch comes back with what
    the update did not bring forgiven (Enforce to Warn). ``old_findings(rules)`` judges the
    old object by those rules; it is asked only for the rules of denials not yet asked about,
    so the old object is judged by each rule at most once however many batches there are."""
    if workload.kind == "Pod":
        if request.get("subResource") == EPHEMERAL:
            prefixes = _added_ephemeral_paths(obj, old)
            return lambda findings: [f for f in findings if _under(f.path, prefixes)]
        if _moves_pod(obj, old):
            return lambda findings: findings
        only_metadata = True  # the rest of a Pod's spec is frozen
    else:
        only_metadata = _without_metadata(obj) == _without_metadata(old)
    old_by_print: dict[tuple[Any, ...], Finding] = {}
    judged_rules: set[str] = set()

    def forgiven(finding: Finding) -> bool:
        before = old_by_print.get(_fingerprint(finding))
        if before is None:
            return False
        return only_metadata or (before.mode == "Enforce" and not _reaches_further(finding, before))

    def forgive(findings: list[Finding]) -> list[Finding]:
        rules = frozenset(f.rule for f in findings if f.mode == "Enforce") - judged_rules
        if rules:
            judged_rules.update(rules)
            for before in old_findings(rules):
                old_by_print[_fingerprint(before)] = before
        return [
            Finding(f.violation, "Warn", f.template, f.scope)
            if f.mode == "Enforce" and forgiven(f)
            else f
            for f in findings
        ]

    return forgive


def _reaches_further(finding: Finding, before: Finding) -> bool:
    """A security finding whose template now reaches GPU nodes more directly than before."""
    if finding.rule not in SECURITY_RULES or finding.scope is None or before.scope is None:
        return False
    return REACH_RANK[finding.scope] > REACH_RANK[before.scope]


def _fingerprint(finding: Finding) -> tuple[Any, ...]:
    return (*finding.key, render_value(finding.violation.value))


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def _injecting(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The annotations that have the node inject devices or mounts: CDI's, NRI's, GKE's."""
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if not isinstance(annotations, dict):
        return {}
    return {k: v for k, v in annotations.items() if is_cdi_annotation(k) or classify(k) is not None}


def _moves_pod(pod: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Whether the update can change where the Pod lands or which devices it is given."""
    added, before = _injecting(pod), _injecting(old)
    if any(before.get(k) != v for k, v in added.items()):
        return True
    spec, old_spec = _spec(pod), _spec(old)
    if old_spec.get("nodeName"):
        return False  # scheduled: it stays where it is
    return any(spec.get(name) != old_spec.get(name) for name in SCHEDULING_FIELDS)


def _name(container: Mapping[str, Any]) -> str | None:
    name = container.get("name")
    return name if isinstance(name, str) else None


def _without_metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _added_ephemeral_paths(pod: Mapping[str, Any], old: Mapping[str, Any]) -> tuple[str, ...]:
    """Where the ephemeral containers this request adds (by name) are."""
    old_names = ephemeral_container_names(old)
    containers = _spec(pod).get("ephemeralContainers")
    return tuple(
        f"spec.ephemeralContainers[{index}]"
        for index, container in enumerate(containers if isinstance(containers, list) else ())
        if isinstance(container, dict) and _name(container) not in old_names
    )


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith((p + ".", p + "[")) for p in prefixes)
