"""``policy validate --manifests DIR``: whether the deployment's webhook configurations send
what the policy needs: every kind it judges to the validating webhook (DRA's claim kinds on
CREATE, and ResourceClaims only to an entry that fails open), every Pod it requires
NVIDIA_VISIBLE_DEVICES=void in to the mutating one, and, where it sets GPU defaults for
workloads, every kind with a pod template to the mutating webhook's entry for workloads."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webhook.audit.documents import Document, DocumentError, discover, parse, read_text
from webhook.core.wording import names
from webhook.policy.model import Policy
from webhook.policy.workloads import (
    CLAIM_OPERATIONS,
    CLAIMS_RESOURCE,
    CLAIMS_WEBHOOK,
    DRA_GROUP,
    LEGACY_GROUPS,
    WORKLOADS_MUTATING_WEBHOOK,
)

KUSTOMIZATIONS = ("kustomization.yaml", "kustomization.yml", "Kustomization")


class ManifestsError(ValueError):
    """--manifests DIR cannot be read or rendered."""


@dataclass(frozen=True)
class WebhookManifests:
    """What ``--manifests`` checks the policy against: the validating webhooks' rules, the
    matchConditions of the mutating webhooks sent Pods (CEL expressions, ANDed per webhook),
    the mutating webhooks' rules, and the validating webhooks that fail closed (each one's
    name and rules)."""

    rules: list[dict[str, Any]]
    mutating_conditions: list[str]
    mutating_rules: list[dict[str, Any]] = field(default_factory=list)
    fail_closed: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)


def webhook_manifests(directory: Path) -> WebhookManifests:
    """The webhook configurations in the manifests under ``directory``."""
    if not directory.is_dir():
        raise ManifestsError(f"{directory}: not a directory")
    if any((directory / name).is_file() for name in KUSTOMIZATIONS):
        documents = _kustomize(directory)
    else:
        try:
            documents = [d for f in discover([str(directory)]) for d in parse(read_text(f), f)]
        except DocumentError as exc:
            raise ManifestsError(str(exc)) from None
    kinds: dict[str, list[dict[str, Any]]] = {}
    for d in documents:
        if d.is_kubernetes_object:
            kinds.setdefault(d.obj["kind"], []).append(d.obj)
    configs = kinds.get("ValidatingWebhookConfiguration", [])
    if not configs:
        raise ManifestsError(
            f"{directory}: no ValidatingWebhookConfiguration found (the shipped ones are in "
            "manifests/webhooks, the second step of an install)"
        )
    mutating = [
        hook
        for config in kinds.get("MutatingWebhookConfiguration", [])
        for hook in _dicts(config.get("webhooks"))
    ]
    validating = [hook for config in configs for hook in _dicts(config.get("webhooks"))]
    return WebhookManifests(
        rules=[rule for hook in validating for rule in _dicts(hook.get("rules"))],
        mutating_conditions=[
            str(condition.get("expression", ""))
            for hook in mutating
            if any(rule_covers(r, "", "pods", "CREATE") for r in _dicts(hook.get("rules")))
            for condition in _dicts(hook.get("matchConditions"))
        ],
        mutating_rules=[rule for hook in mutating for rule in _dicts(hook.get("rules"))],
        # The API server's default failure policy is Fail.
        fail_closed=[
            (str(hook.get("name", "")), _dicts(hook.get("rules")))
            for hook in validating
            if hook.get("failurePolicy", "Fail") != "Ignore"
        ],
    )


def match_condition_errors(
    policy: Policy, document: Document, hooks: WebhookManifests, manifests: str
) -> list[str]:
    """An error when the mutating webhook's matchConditions cannot send every Pod the policy
    requires NVIDIA_VISIBLE_DEVICES=void in: the shipped ones assume tainted GPU nodes and the
    nvidia.com domain."""
    if not policy.inject_void or not hooks.mutating_conditions:
        return []
    reasons = []
    if policy.every_pod_reaches_gpu_nodes:
        reasons.append("every Pod can reach a GPU node under this policy")
    expressions = " ".join(hooks.mutating_conditions)
    missing = [d for d in policy.vendor_domains if f"'{d}/" not in expressions]
    if missing:
        reasons.append(f"they never look at resources under {', '.join(missing)}")
    if not reasons:
        return []
    path = "spec.deviceVisibility.injectVoid"
    return [
        f"{document.source}:{document.line_of(path)}: {path}: the matchConditions of the "
        f"MutatingWebhookConfiguration in {manifests} do not send every Pod this policy requires "
        f"NVIDIA_VISIBLE_DEVICES=void in ({'; '.join(reasons)}), so the validating webhook "
        "would deny Pods the mutating webhook never saw; delete the matchConditions (every Pod "
        "is then sent) or widen them"
    ]


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _kustomize(directory: Path) -> list[Document]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise ManifestsError(
            f"{directory} is a kustomization and kubectl is not installed to render it"
        )
    try:
        result = subprocess.run(
            [kubectl, "kustomize", str(directory)],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        raise ManifestsError(f"kubectl kustomize {directory}: timed out") from None
    if result.returncode != 0:
        problem = (result.stderr.strip().splitlines() or ["failed"])[-1]
        raise ManifestsError(f"kubectl kustomize {directory}: {problem}")
    try:
        return parse(result.stdout, f"kubectl kustomize {directory}")
    except DocumentError as exc:
        raise ManifestsError(str(exc)) from None


def rule_covers(rule: dict[str, Any], group: str, resource: str, operation: str) -> bool:
    """Whether one webhook rule sends ``operation`` on ``resource`` of ``group`` (apiserver
    matching: ``*`` is every resource, ``*/*`` every resource and subresource)."""
    parent, _, sub = resource.partition("/")
    names = {resource, "*/*"} | ({f"{parent}/*", f"*/{sub}"} if sub else {"*"})
    return (
        bool({group, "*"} & set(rule.get("apiGroups") or []))
        and bool(names & set(rule.get("resources") or []))
        and bool({operation, "*"} & set(rule.get("operations") or []))
    )


def coverage_errors(
    policy: Policy, document: Document, rules: list[dict[str, Any]], manifests: str
) -> list[str]:
    """An error for each judged kind the validating webhook is not sent."""
    raw_workloads = (document.obj.get("spec") or {}).get("workloads") or []
    wanted: list[tuple[str, str, str, tuple[str, ...], str]] = [
        (
            w.group,
            w.kind,
            w.resource,
            CLAIM_OPERATIONS if w.claims else ("CREATE", "UPDATE"),
            f"no {w.kind} is ever reviewed",
        )
        for w in policy.workloads.values()
        if w.group not in LEGACY_GROUPS
    ]
    if ("", "Pod") in policy.workloads:
        # The engine judges ephemeral containers added to a running Pod (kubectl debug).
        consequence = "ephemeral containers added to running Pods (kubectl debug) are not reviewed"
        wanted.append(("", "Pod", "pods/ephemeralcontainers", ("UPDATE",), consequence))
    errors: list[str] = []
    for group, kind, resource, operations, consequence in wanted:
        missing = [
            op for op in operations if not any(rule_covers(r, group, resource, op) for r in rules)
        ]
        if not missing:
            continue
        name = f"{resource}.{group}" if group else resource
        source = (
            f"manifests/webhooks has them: {CLAIMS_RESOURCE} in its {CLAIMS_WEBHOOK} entry, "
            "which fails open, the others in its first entry"
            if group == DRA_GROUP
            else "`gpu-admission webhooks rules` prints the rules of every custom kind"
        )
        message = (
            f"{name} is not sent to the validating webhook on {', '.join(missing)}: no rule of "
            f"the ValidatingWebhookConfiguration(s) in {manifests} covers it, so {consequence}; "
            f"add a rule with apiGroups [{json.dumps(group)}], resources [{resource}], "
            f"operations [{', '.join(operations)}] ({source})"
        )
        index = next(
            (
                i
                for i, w in enumerate(raw_workloads)
                if isinstance(w, dict) and (w.get("group"), w.get("kind")) == (group, kind)
            ),
            None,
        )
        if index is None:
            origin = "catalogued" if policy.workloads[(group, kind)].catalogued else "built-in"
            errors.append(f"{document.source}: {origin} kind {kind}: {message}")
        else:
            path = f"spec.workloads[{index}]"
            errors.append(f"{document.source}:{document.line_of(path)}: {path}: {message}")
    return errors


def claims_failing_closed_errors(
    document: Document, hooks: WebhookManifests, manifests: str
) -> list[str]:
    """An error for each validating webhook that fails closed and is sent ResourceClaims: the
    resource-claim controller creates the claims of Pods, and a denial or a timeout there
    leaves a Pod pending with no word to anyone (the guarantee is the Pod's and the
    template's)."""
    return [
        f"{document.source}: {CLAIMS_RESOURCE}.{DRA_GROUP} is sent to the validating webhook "
        f"{name} in {manifests}, which fails closed: a claim the control plane creates for a "
        "Pod that it denies or does not answer in time leaves the Pod pending with no word to "
        f"anyone; send {CLAIMS_RESOURCE} to an entry with failurePolicy: Ignore (the "
        f"{CLAIMS_WEBHOOK} entry of manifests/webhooks)"
        for name, rules in hooks.fail_closed
        if any(rule_covers(r, DRA_GROUP, CLAIMS_RESOURCE, "CREATE") for r in rules)
    ]


def defaults_coverage_errors(
    policy: Policy, document: Document, hooks: WebhookManifests, manifests: str
) -> list[str]:
    """An error where the policy gives workload templates GPU defaults that no mutating
    webhook is sent: the kinds with a pod template no rule sends on CREATE."""
    if not policy.gpu_defaults.for_workloads:
        return []
    missing = [
        f"{w.resource}.{w.group}" if w.group else w.resource
        for w in policy.workloads.values()
        if w.kind != "Pod"
        and w.group not in LEGACY_GROUPS
        and any(t.shape == "template" for t in w.targets)
        and not any(rule_covers(r, w.group, w.resource, "CREATE") for r in hooks.mutating_rules)
    ]
    if not missing:
        return []
    spec = document.obj.get("spec") if isinstance(document.obj, dict) else None
    mutation = spec.get("mutation") if isinstance(spec, dict) else None
    written = isinstance(mutation, dict) and "gpuDefaults" in mutation
    path = "spec.mutation.gpuDefaults" if written else "spec.pools"
    shown = names(missing, 8)
    return [
        f"{document.source}:{document.line_of(path)}: {path}: the policy gives GPU workload "
        f"templates defaults (runtimeClassName, priorityClassName, a Job's deadline), but no "
        f"MutatingWebhookConfiguration in {manifests} is sent {shown} on CREATE, so they never "
        f"get them; add the {WORKLOADS_MUTATING_WEBHOOK} entry of manifests/webhooks "
        "(`gpu-admission webhooks rules --mutating` prints the rules of the custom kinds)"
    ]
