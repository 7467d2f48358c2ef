"""The workload kinds a policy judges: the built-in Kubernetes kinds, the catalogue of GPU
workload kinds (``data/catalogue.yaml``), and a policy's own ``spec.workloads``, each compiled
to the places (``PodTarget``) where its Pods are defined."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

import yaml

from webhook.policy import schemas
from webhook.policy.dra import CLAIM_MAKERS
from webhook.policy.model import (
    CountField,
    EachItem,
    EachValue,
    FieldStep,
    PodTarget,
    ReplicaFactor,
    TemplatePath,
    TemplateStep,
    WorkloadKind,
)

EACH_VALUE = EachValue()
EACH_ITEM = EachItem()

# Old manifests still carry the apps kinds under "extensions", but no API a supported cluster
# serves has it: judged in files, never listed in a cluster or sent by a webhook rule.
LEGACY_GROUPS = frozenset({"extensions"})

# Built-in kinds whose pod templates are judged. "extensions" is the group that old manifests
# (and `kubectl get` output of old clusters) still carry for the apps kinds.
BUILTIN_WORKLOADS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("", "Pod", "pods", ("",)),
    ("", "ReplicationController", "replicationcontrollers", ("spec.template",)),
    ("apps", "Deployment", "deployments", ("spec.template",)),
    ("apps", "ReplicaSet", "replicasets", ("spec.template",)),
    ("apps", "StatefulSet", "statefulsets", ("spec.template",)),
    ("apps", "DaemonSet", "daemonsets", ("spec.template",)),
    ("extensions", "Deployment", "deployments", ("spec.template",)),
    ("extensions", "ReplicaSet", "replicasets", ("spec.template",)),
    ("extensions", "DaemonSet", "daemonsets", ("spec.template",)),
    ("batch", "Job", "jobs", ("spec.template",)),
    ("batch", "CronJob", "cronjobs", ("spec.jobTemplate.spec.template",)),
)

# The DRA kinds judged on their own (the claim specs a Pod's devices come from), in every
# served version (the review's kind names the group, not the version): where each keeps its
# ResourceClaimSpec.
DRA_GROUP = "resource.k8s.io"
# NVIDIA's DRA driver's ComputeDomain (IMEX channels across the nodes of an NVLink domain): a
# custom resource, sent to the custom kinds' entry.
COMPUTE_DOMAIN_GROUP = "resource.nvidia.com"
CLAIM_KINDS: tuple[tuple[str, str, str], ...] = (
    ("ResourceClaimTemplate", "resourceclaimtemplates", "spec.spec"),
    ("ResourceClaim", "resourceclaims", "spec"),
)

# How many Pods of the built-in kinds' templates run at once, in the catalogue's ``replicas``
# shape (apps and extensions alike): a Job runs ``parallelism`` Pods, fewer when fewer
# ``completions`` remain; a DaemonSet's count is its nodes', and a Pod is one.
_SPEC_REPLICAS = ({"target": "spec.template", "count": [{"path": "spec.replicas", "default": 1}]},)
BUILTIN_REPLICAS: dict[str, tuple[dict[str, Any], ...]] = {
    "ReplicationController": _SPEC_REPLICAS,
    "Deployment": _SPEC_REPLICAS,
    "ReplicaSet": _SPEC_REPLICAS,
    "StatefulSet": _SPEC_REPLICAS,
    "Job": (
        {
            "target": "spec.template",
            "count": [{"path": "spec.parallelism", "default": 1, "atMost": "spec.completions"}],
        },
    ),
    "CronJob": (
        {
            "target": "spec.jobTemplate.spec.template",
            "count": [
                {
                    "path": "spec.jobTemplate.spec.parallelism",
                    "default": 1,
                    "atMost": "spec.jobTemplate.spec.completions",
                }
            ],
        },
    ),
}
# The fields of a ``replicas`` count that are paths.
COUNT_PATHS = ("path", "atLeast", "atMost", "lessOneWith")

# A field name (or ``*``), then ``[*]`` once per level of nested lists (Argo's steps).
_SEGMENT = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*|\*)(?P<items>(?:\[\*\])*)\Z")


class TemplatePathError(ValueError):
    """A workload's path that is not ``field.field``, ``*`` and ``[*]``."""


class CatalogueError(Exception):
    """The packaged catalogue does not load: a packaging defect, not a user error."""


def compile_template_path(text: str) -> TemplatePath:
    """``spec.replicatedJobs[*].template.spec.template`` to steps; "" is the object itself."""
    steps: list[TemplateStep] = []
    if text:
        for segment in text.split("."):
            match = _SEGMENT.match(segment)
            if match is None:
                raise TemplatePathError(
                    f"invalid path {text!r} at {segment!r}: use field names joined by "
                    "'.', '*' for every value of a map and '[*]' for every item of a list"
                )
            steps.append(EACH_VALUE if match["name"] == "*" else FieldStep(match["name"]))
            steps.extend([EACH_ITEM] * (len(match["items"]) // 3))
    return TemplatePath(text=text, steps=tuple(steps))


def entry_paths(entry: Mapping[str, Any]) -> Iterable[tuple[tuple[str | int, ...], str]]:
    """Every path a ``spec.workloads`` entry names, with where it is (for the lint)."""
    for i, text in enumerate(entry.get("templates", ())):
        yield ("templates", i), text
    for i, text in enumerate(entry.get("containers", ())):
        yield ("containers", i), text
    for i, target in enumerate(entry.get("podSpecs", ())):
        yield ("podSpecs", i, "path"), target["path"]
        for j, text in enumerate(_listed(target.get("inherit", []))):
            yield ("podSpecs", i, "inherit", j), text
    for i, target in enumerate(entry.get("resources", ())):
        yield ("resources", i, "path"), target["path"]
        for j, text in enumerate(_pod_fields(target)):
            yield ("resources", i, "podFields", j), text
    for i, text in enumerate(entry.get("claims", ())):
        yield ("claims", i), text
    for i, counted in enumerate(entry.get("replicas", ())):
        yield ("replicas", i, "target"), counted["target"]
        for j, factor in enumerate(counted["count"]):
            for key in COUNT_PATHS:
                if key in factor:
                    yield ("replicas", i, "count", j, key), factor[key]


def replica_errors(entry: Mapping[str, Any]) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """What is wrong with an entry's ``replicas`` beyond a path's syntax (``entry_paths``'):
    a target that is none of its templates, podSpecs or resources, and a count that is not a
    field beside the target's match (in the same map entry or list item, or above them)."""
    countable = [
        *entry.get("templates", ()),
        *(target["path"] for target in entry.get("podSpecs", ())),
        *(target["path"] for target in entry.get("resources", ())),
    ]
    for i, counted in enumerate(entry.get("replicas", ())):
        try:
            target = compile_template_path(counted["target"])
        except TemplatePathError:
            continue  # entry_paths names it
        if counted["target"] not in countable:
            yield (
                ("replicas", i, "target"),
                (
                    f"{counted['target']!r} is none of this entry's templates, podSpecs or "
                    "resources paths: nothing to count"
                ),
            )
            continue
        for j, factor in enumerate(counted["count"]):
            for key in COUNT_PATHS:
                try:
                    if key in factor:
                        count_field(factor[key], target)
                except TemplatePathError as exc:
                    yield ("replicas", i, "count", j, key), str(exc)


def count_field(text: str, target: TemplatePath) -> CountField:
    """A ``replicas`` path, found from the target's match: the steps it shares with the
    target's path, then fields only (else ``TemplatePathError``)."""
    path = compile_template_path(text)
    shared = 0
    for mine, theirs in zip(path.steps, target.steps, strict=False):
        if mine != theirs:
            break
        shared += 1
    fields = [step.name for step in path.steps[shared:] if isinstance(step, FieldStep)]
    if not fields or len(fields) < len(path.steps) - shared:
        raise TemplatePathError(
            f"invalid replicas path {text!r}: below what it shares with {target.text!r} it "
            "must name a field, without '*' or '[*]' (a count in the same map entry or list "
            "item as the target's, or above them)"
        )
    return CountField(text, TemplatePath("", path.steps[:shared]), tuple(fields))


def _counted(entries: Iterable[Mapping[str, Any]], targets: list[PodTarget]) -> list[PodTarget]:
    """The targets with the replica counts ``entries`` declare for their paths."""
    counts = {entry["target"]: entry["count"] for entry in entries}
    return [
        dataclasses.replace(
            target,
            replicas=tuple(_factor(f, target.path) for f in counts[target.path.text]),
        )
        if target.path.text in counts and target.shape != "container"
        else target
        for target in targets
    ]


def _factor(raw: Mapping[str, Any], target: TemplatePath) -> ReplicaFactor:
    def optional(key: str) -> CountField | None:
        return count_field(raw[key], target) if key in raw else None

    return ReplicaFactor(
        count_field(raw["path"], target),
        raw.get("default"),
        optional("atLeast"),
        optional("atMost"),
        optional("lessOneWith"),
    )


def compile_workload(entry: Mapping[str, Any], *, catalogued: bool = False) -> WorkloadKind:
    """A ``spec.workloads`` entry (or a catalogue entry) that passed the schema and the lint."""
    targets = [PodTarget("template", compile_template_path(p)) for p in entry.get("templates", ())]
    for target in entry.get("podSpecs", ()):
        targets.append(
            PodTarget(
                "podSpec",
                compile_template_path(target["path"]),
                containers=tuple(target.get("containers", ())),
                container_lists=tuple(
                    tuple(p.split(".")) for p in target.get("containerLists", ())
                ),
                inherit=tuple(compile_template_path(p) for p in _listed(target.get("inherit", []))),
                unjudged=tuple(target.get("unjudged", ())),
                host_paths=_host_paths(target),
                pod_metadata=_pod_metadata(target),
            )
        )
    targets += [
        PodTarget("container", compile_template_path(p)) for p in entry.get("containers", ())
    ]
    for target in entry.get("resources", ()):
        path = compile_template_path(target["path"])
        if not path.steps or not isinstance(path.steps[-1], FieldStep):
            raise TemplatePathError(
                f"invalid resources path {target['path']!r}: it must end in the field that holds "
                "the ResourceRequirements"
            )
        targets.append(
            PodTarget(
                "resources",
                path,
                pod_fields=tuple(compile_template_path(p) for p in _pod_fields(target)),
                host_paths=_host_paths(target),
                pod_metadata=_pod_metadata(target),
            )
        )
    targets += [PodTarget("claim", compile_template_path(p)) for p in entry.get("claims", ())]
    for where, message in replica_errors(entry):  # the lint's for a policy's own entries
        raise TemplatePathError(f"replicas at {where}: {message}")
    return WorkloadKind(
        entry["group"],
        entry["kind"],
        entry.get("resource", entry["kind"].lower() + "s"),
        tuple(_counted(entry.get("replicas", ()), targets)),
        scope=entry.get("scope", "Namespaced"),
        catalogued=catalogued,
    )


def _pod_metadata(target: Mapping[str, Any]) -> tuple[str, ...]:
    where = target.get("podMetadata", "metadata")
    return () if where == "." else tuple(where.split("."))


def _host_paths(target: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(p.split(".")) for p in target.get("hostPaths", ()))


def _pod_fields(target: Mapping[str, Any]) -> list[str]:
    """``podFields``: one path, or several (a kind whose field moved between releases)."""
    return _listed(target.get("podFields", []))


def _listed(value: str | list[str]) -> list[str]:
    """A field that takes one path or a list of them."""
    return [value] if isinstance(value, str) else list(value)


@cache
def catalogue() -> tuple[dict[str, Any], ...]:
    """The catalogue's entries, checked once against the policy schema's workload shape."""
    text = resources.files("webhook.policy").joinpath("data/catalogue.yaml").read_text("utf-8")
    entries = yaml.safe_load(text)["workloads"]
    schema = schemas.load("policy.schema.json")
    validator = schemas.validator("policy.schema.json").evolve(
        schema={**schema["$defs"]["workload"], "$defs": schema["$defs"]}
    )
    for entry in entries:
        errors = sorted(validator.iter_errors(entry), key=str)
        if errors:
            raise CatalogueError(f"catalogue entry {entry.get('kind')!r}: {errors[0].message}")
    return tuple(entries)


def catalogued_kinds() -> frozenset[tuple[str, str]]:
    return frozenset((e["group"], e["kind"]) for e in catalogue())


def compile_workloads(
    spec: Mapping[str, Any],
) -> MappingProxyType[tuple[str, str], WorkloadKind]:
    """(group, kind) -> WorkloadKind: the built-in kinds, the catalogue without the kinds the
    policy switches off, and the policy's own (which win over the catalogue's of one kind)."""
    workloads: dict[tuple[str, str], WorkloadKind] = {}
    for group, kind, resource, paths in BUILTIN_WORKLOADS:
        targets = [PodTarget("template", compile_template_path(p)) for p in paths]
        workloads[(group, kind)] = WorkloadKind(
            group, kind, resource, tuple(_counted(BUILTIN_REPLICAS.get(kind, ()), targets))
        )
    for kind, resource, path in CLAIM_KINDS:
        target = PodTarget("claim", compile_template_path(path))
        workloads[(DRA_GROUP, kind)] = WorkloadKind(DRA_GROUP, kind, resource, (target,))
    domain = PodTarget("computeDomain", compile_template_path("spec"))
    # Counted with the catalogue's kinds (a cluster without NVIDIA's DRA driver has none).
    workloads[(COMPUTE_DOMAIN_GROUP, "ComputeDomain")] = WorkloadKind(
        COMPUTE_DOMAIN_GROUP, "ComputeDomain", "computedomains", (domain,), catalogued=True
    )
    disabled = {(d["group"], d["kind"]) for d in spec.get("catalogue", {}).get("disabled", ())}
    for entry in catalogue():
        if (entry["group"], entry["kind"]) not in disabled:
            workloads[(entry["group"], entry["kind"])] = compile_workload(entry, catalogued=True)
    for entry in spec.get("workloads", ()):
        workloads[(entry["group"], entry["kind"])] = compile_workload(entry)
    return MappingProxyType(workloads)


# The validating webhook's entry for custom resources (manifests/webhooks): its rules are
# generated from the policy (``gpu-admission webhooks rules``) and checked for drift by a test.
WORKLOADS_WEBHOOK = "workloads.validate.gpu-admission.io"
# Sent on CREATE, and on UPDATE only when the spec changed: an operator's status updates never
# wait on the webhook. Objects without a spec (never the catalogue's kinds) are sent.
SPEC_CHANGED = (
    "request.operation != 'UPDATE' || !has(object.spec) || !has(oldObject.spec) "
    "|| object.spec != oldObject.spec"
)


# The validating webhook's entry for ResourceClaims (manifests/webhooks; ResourceClaimTemplates
# are in its first entry, failing closed like Pods): it fails open always, whatever the
# activation sets on the others. The resource-claim controller creates a Pod's claims from its
# templates, and a denial or a timeout there would leave the Pod pending with no word to
# anyone; the guarantee is the Pod's and the template's.
CLAIMS_WEBHOOK = "claims.validate.gpu-admission.io"
# What it sends: the resource of the ResourceClaim kind (the other CLAIM_KINDS fail closed).
CLAIMS_RESOURCE = "resourceclaims"
# A claim's spec and a template's are immutable: sent on CREATE only.
CLAIM_OPERATIONS = ("CREATE",)
# The claims entry's match condition: the claims the control plane creates for Pods
# (``CLAIM_MAKERS``) are never sent; the engine skips them too (a file or an audit has no
# userInfo). An absent username (none the API server sends) is sent: has() keeps it from
# being an evaluation error.
NOT_MADE_BY_THE_CONTROL_PLANE = (
    "!has(request.userInfo.username) || ("
    + " && ".join(f"request.userInfo.username != '{username}'" for username in sorted(CLAIM_MAKERS))
    + ")"
)


# The mutating webhook's entry for workloads: the policy's GPU defaults for their templates
# (``spec.mutation.gpuDefaults``), on CREATE, for every kind with a pod template.
WORKLOADS_MUTATING_WEBHOOK = "workloads.mutate.gpu-admission.io"
# Objects a controller owns are their owner's to default (``webhook.admission.gpu_defaults``):
# not sent, so the ReplicaSets a Deployment makes cost no round trip.
NOT_CONTROLLED = (
    "!has(object.metadata.ownerReferences) || "
    "!object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller)"
)


def custom_resource_rules(
    workloads: Iterable[WorkloadKind], *, mutating: bool = False
) -> list[dict[str, Any]]:
    """The webhook rules of the custom workload kinds: one per API group, in first-seen order,
    resources sorted, every version (operators serve several), either scope. ``mutating``:
    the mutating webhook's, on CREATE, for the kinds with a pod template only (the only
    shape the GPU defaults go in)."""
    by_group: dict[str, set[str]] = {}
    for workload in workloads:
        # DRA's kinds have entries of their own (manifests/webhooks): a template fails
        # closed like a Pod, a claim fails open.
        if workload.built_in or workload.claims:
            continue
        if mutating and not any(t.shape == "template" for t in workload.targets):
            continue
        by_group.setdefault(workload.group, set()).add(workload.resource)
    return [
        {
            "apiGroups": [group],
            "apiVersions": ["*"],
            "operations": ["CREATE"] if mutating else ["CREATE", "UPDATE"],
            "resources": sorted(resources),
            "scope": "*",
        }
        for group, resources in by_group.items()
    ]


# What ``cluster check`` needs besides the judged kinds' rules (whose get on daemonsets and list
# on pods, built-in kinds, read the device plugins it compares): the auditor role has them, the
# background audit not. Namespaces and ResourceQuotas are compared with the tenants'
# entitlements (``audit --cluster`` notes the same, but not with ``-o policyreport``).
NODES_READ_RULE: dict[str, Any] = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}
QUOTAS_READ_RULE: dict[str, Any] = {
    "apiGroups": [""],
    "resources": ["namespaces", "resourcequotas"],
    "verbs": ["list"],
}
# The RuntimeClasses and PriorityClasses the policy's GPU defaults name are read by name.
CLASSES_READ_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"], "verbs": ["get"]},
    {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": ["get"]},
)
CLUSTER_CHECK_RULES = (NODES_READ_RULE, QUOTAS_READ_RULE, *CLASSES_READ_RULES)


def read_rules(workloads: Iterable[WorkloadKind]) -> list[dict[str, Any]]:
    """RBAC rules to get and list every kind the policy judges (``audit --cluster``), one per
    API group in first-seen order; the legacy group is never served."""
    by_group: dict[str, set[str]] = {}
    for workload in workloads:
        if workload.group not in LEGACY_GROUPS:
            by_group.setdefault(workload.group, set()).add(workload.resource)
    return [
        {"apiGroups": [group], "resources": sorted(resources), "verbs": ["get", "list"]}
        for group, resources in by_group.items()
    ]
