"""Deciding plain objects (manifests, live objects) outside the API server: the same engine, fed
AdmissionReviews built from the objects, plus the mutation each workload's Pods would get.

Nothing here adds to a verdict: ``webhook.admission.engine.decide`` decides, exactly as in the
webhook.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.admission import patch
from webhook.admission.engine import decide
from webhook.admission.lifting import (
    EVERY_RULE,
    covering_exemptions,
    lifted_rules,
    may_be_exempt,
)
from webhook.admission.wire import API_VERSION
from webhook.core.findings import Finding
from webhook.core.targets import walk_templates, walk_views
from webhook.policy.model import Exemption, Policy, RuleModes, RuleSet, WorkloadKind


@dataclass(frozen=True, slots=True)
class Mutation:
    """What the mutating webhook would do to a Pod (for a workload, to a Pod of a template),
    or with ``workload`` to the workload object itself (the policy's GPU defaults)."""

    template_path: str  # "" for a Pod or the workload itself, else the template's field path
    operations: tuple[dict[str, Any], ...]
    original: dict[str, Any]  # for review's diff; an audit of a live cluster keeps a stub
    mutated: dict[str, Any]
    workload: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """The verdict on one object, its findings, and with ``mutate`` its Pods' mutations."""

    obj: Any
    namespace: str
    judged: bool  # False for objects that are not Pods or declared workloads
    allowed: bool
    findings: tuple[Finding, ...] = ()
    mutations: tuple[Mutation, ...] = ()
    skipped: str = ""  # why an object was not judged, for the reports that name it
    # The exemptions that cover some of its templates; with ``exempt``, every template is
    # exempt from every rule: nothing was judged, which a clean verdict must not pass for.
    exemptions: tuple[Exemption, ...] = ()
    exempt: bool = False

    @property
    def denied(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.mode == "Enforce")

    @property
    def warned(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.mode == "Warn")

    @property
    def audited(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.mode == "Audit")


def enforce_everything(policy: Policy) -> Policy:
    """The policy with every rule that is on turned to Enforce, in every scope and in every
    namespace override: the question "what would this policy block?". Exemptions stay."""

    def promote(rules: RuleSet) -> RuleSet:
        return RuleSet(
            {
                rule: RuleModes(
                    "Off" if modes.gpu_pods == "Off" else "Enforce",
                    "Off" if modes.other_pods == "Off" else "Enforce",
                    "Off" if modes.for_scope("reachablePods") == "Off" else "Enforce",
                )
                for rule, modes in rules.items()
            }
        )

    return dataclasses.replace(
        policy,
        rules=promote(policy.rules),
        namespace_overrides=tuple(
            dataclasses.replace(o, rules=promote(o.rules)) for o in policy.namespace_overrides
        ),
    )


def admission_review(
    obj: dict[str, Any],
    namespace: str,
    *,
    operation: str = "CREATE",
    uid: str = "gpu-admission-cli",
) -> dict[str, Any]:
    """The AdmissionReview the API server would send for ``operation`` on the object."""
    group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": obj.get("kind", "")},
            "operation": operation,
            "namespace": namespace,
            "name": (obj.get("metadata") or {}).get("name", ""),
            "object": obj,
        },
    }


NOT_AN_OBJECT = "not a Kubernetes object"
# API groups of the Kubernetes API itself: a kind of these that the policy does not judge runs
# no Pods of its own (a ConfigMap, a Service, a Role).
_BUILT_IN_GROUPS = ("", "apps", "batch", "policy", "autoscaling", "networking.k8s.io")


def _not_judged(group: str, kind: Any) -> str:
    """Why an object of ``group``/``kind`` is not judged."""
    if group in _BUILT_IN_GROUPS or group.endswith(".k8s.io"):
        return f"a {kind} runs no Pods of its own: nothing to judge"
    return (
        f"{kind} ({group}) is not a workload this policy declares: add it to spec.workloads "
        "(its group, kind and pod template paths) to judge the Pods it creates before they exist"
    )


def decide_object(
    obj: Any,
    policy: Policy,
    namespace: str,
    *,
    mutate: bool = False,
    override: bool = False,
    made_by_controller: bool = False,
) -> Outcome:
    """Verdict and findings for one object, and with ``mutate`` the Pods' mutations.

    ``namespace`` is for objects that name none; with ``override`` it wins over the object's
    own, as the request namespace does in the webhook (``review -n`` given explicitly).
    An object is judged as sent by a user (a file is judged as its author wrote it), unless
    ``made_by_controller``: the caller knows that its controller made it.
    """
    if not isinstance(obj, dict):
        return Outcome(obj, namespace, judged=False, allowed=True, skipped=NOT_AN_OBJECT)
    metadata = obj.get("metadata")
    meta = metadata if isinstance(metadata, dict) else {}
    if not override:
        namespace = str(meta.get("namespace") or namespace)
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    workload = policy.workloads.get((group, str(obj.get("kind", ""))))
    if workload is None:
        return Outcome(
            obj, namespace, judged=False, allowed=True, skipped=_not_judged(group, obj.get("kind"))
        )
    # The API server validates what the mutating webhook returned: a Pod is judged patched.
    judges_patched = workload.kind == "Pod" and policy.mutation_applies
    mutations: tuple[Mutation, ...] = ()
    if mutate or judges_patched:
        mutations = tuple(_mutations(obj, workload, namespace, policy))
    judged = mutations[0].mutated if judges_patched and mutations else obj
    decision = decide(
        admission_review(judged, namespace),
        policy,
        mutate=False,
        made_by_controller=made_by_controller,
    )
    exemptions, exempt = _exemptions(judged, workload, namespace, policy)
    return Outcome(
        obj,
        namespace,
        True,
        decision.allowed,
        decision.findings,
        mutations if mutate else (),
        exemptions=exemptions,
        exempt=exempt and decision.allowed and not decision.findings,
    )


def _exemptions(
    obj: dict[str, Any], workload: WorkloadKind, namespace: str, policy: Policy
) -> tuple[tuple[Exemption, ...], bool]:
    """The exemptions that cover the object's templates, and whether every template is exempt
    from every rule. Worked out here, for reports, and not by the engine: the webhook's
    requests do not pay for it. The templates are walked again only in a namespace an
    exemption may cover."""
    if not may_be_exempt(policy, namespace):
        return (), False
    found: dict[Exemption, None] = {}
    every_rule = True
    views = list(walk_views(obj, workload, namespace, policy))
    for view in views:
        covering = covering_exemptions(policy, view)
        found.update(dict.fromkeys(covering))
        every_rule = every_rule and lifted_rules(covering) >= EVERY_RULE
    return tuple(found), every_rule and bool(views)


def _mutations(
    obj: dict[str, Any], workload: WorkloadKind, namespace: str, policy: Policy
) -> Iterator[Mutation]:
    if workload.kind == "Pod":
        pods = [("", obj)]
    else:
        # The workload's own defaults first: its controller makes its Pods from the templates
        # as they leave them.
        own = _mutated(obj, namespace, policy)
        if own is not None:
            yield dataclasses.replace(own, workload=True)
            obj = own.mutated
        owner = _controller_reference(obj)
        pods = [
            (path, _pod_from_template(template, namespace, owner))
            for path, _, template in walk_templates(obj, workload)
        ]
    for path, pod in pods:
        mutation = _mutated(pod, namespace, policy, path)
        if mutation is not None:
            yield mutation


def _mutated(
    obj: dict[str, Any], namespace: str, policy: Policy, template_path: str = ""
) -> Mutation | None:
    """What the mutating webhook does to the object on CREATE; None for nothing."""
    decision = decide(admission_review(obj, namespace), policy, mutate=True)
    if not decision.patch:
        return None
    mutated = copy.deepcopy(obj)
    for operation in decision.patch:
        patch.apply_add(mutated, operation)
    return Mutation(template_path, decision.patch, obj, mutated)


def _controller_reference(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The owner reference a controller's Pods carry (to the workload, here: its ReplicaSet's
    or Job's does the same): what makes them no bare Pods to the mutating webhook."""
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    reference = {
        "apiVersion": obj.get("apiVersion", ""),
        "kind": obj.get("kind", ""),
        "name": metadata.get("name") or metadata.get("generateName") or "",
        "controller": True,
    }
    if metadata.get("uid"):
        reference["uid"] = metadata["uid"]
    return reference


def _pod_from_template(
    template: Mapping[str, Any], namespace: str, owner: dict[str, Any]
) -> dict[str, Any]:
    """The Pod a controller would create from a template (what the mutating webhook sees)."""
    metadata = copy.deepcopy(template.get("metadata") or {})
    metadata["namespace"] = namespace
    metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": copy.deepcopy(template.get("spec") or {}),
    }
