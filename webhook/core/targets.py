"""Finding a workload's Pods in its object: the views of every ``PodTarget`` of its kind.

A target is a path (``spec.templates[*]``) and a shape (``webhook.policy.model.PodTarget``).
Each match becomes one ``PodView``, with field paths into the object as written, so that a
finding names the field to change whichever shape the kind uses.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from webhook.core.claims import read_claim_spec
from webhook.core.dra import claim_view_relevant
from webhook.core.paths import Match, walk_paired, walk_path
from webhook.core.pods import (
    ContainerSource,
    PodView,
    build_view,
    listed_containers,
    view_of,
)
from webhook.core.replicas import Counted
from webhook.policy.model import (
    FieldStep,
    PodTarget,
    Policy,
    TemplatePath,
    WorkloadKind,
)

# The pod-level fields of a PodSpec (core/v1): what an ``inherit`` object passes on. The
# container lists are not among them: an inherited object's containers are not the Pod's.
POD_LEVEL_FIELDS = frozenset(
    {
        "activeDeadlineSeconds",
        "affinity",
        "automountServiceAccountToken",
        "dnsConfig",
        "dnsPolicy",
        "enableServiceLinks",
        "hostAliases",
        "hostIPC",
        "hostNetwork",
        "hostPID",
        "hostUsers",
        "hostname",
        "imagePullSecrets",
        "nodeName",
        "nodeSelector",
        "os",
        "priorityClassName",
        "resourceClaims",
        "runtimeClassName",
        "schedulerName",
        "schedulingGates",
        "securityContext",
        "serviceAccount",
        "serviceAccountName",
        "shareProcessNamespace",
        "tolerations",
        "topologySpreadConstraints",
        "volumes",
    }
)


def walk_templates(obj: Mapping[str, Any], workload: WorkloadKind) -> Iterator[Match]:
    """Every (field path, identity, PodTemplateSpec) of the kind's template targets: the Pods a
    controller would create from them as written (what the mutating webhook would see)."""
    for target in workload.targets:
        if target.shape == "template":
            yield from walk_path(obj, target.path)


def walk_views(
    obj: Mapping[str, Any], workload: WorkloadKind, namespace: str, policy: Policy
) -> Iterator[PodView]:
    """A view of every Pod definition the kind declares in the object."""
    kind = workload.kind
    for target in workload.targets:
        if target.shape == "template":
            for path, identity, template in walk_path(obj, target.path):
                view = build_view(kind, path, template, namespace, policy, identity)
                if view is not None:
                    yield _counted(view, obj, target, path)
        elif target.shape == "podSpec":
            for view in _pod_spec_views(obj, kind, target, namespace, policy):
                yield _counted(view, obj, target, view.spec_path)
        elif target.shape == "claim":
            for path, identity, spec in walk_path(obj, target.path):
                yield _claim_view(obj, kind, path, spec, namespace, policy, identity)
        elif target.shape == "computeDomain":
            for path, identity, spec in walk_path(obj, target.path):
                view = _claim_view(obj, kind, path, {}, namespace, policy, identity)
                view.compute_domain = spec
                view.gpu_relevant = True
                yield view
        elif target.shape == "container":
            for path, identity, container in walk_path(obj, target.path):
                parent, _, name = path.rpartition(".")
                source = ContainerSource(name, 0, container, path, fallback_name=name)
                yield view_of(kind, {}, parent, {}, parent, [source], namespace, policy, identity)
        else:
            yield from _resources_views(obj, kind, target, namespace, policy)


def _claim_view(
    obj: Mapping[str, Any],
    kind: str,
    path: str,
    spec: Mapping[str, Any],
    namespace: str,
    policy: Policy,
    identity: str,
) -> PodView:
    """A view of a claim or claim template: its claim spec and metadata, no Pod."""
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    view = view_of(kind, {}, path, metadata, "metadata", [], namespace, policy, identity)
    claim = read_claim_spec(spec, path)
    view.claim_specs = (claim,)
    view.claim_object = True
    view.gpu_relevant = claim_view_relevant(claim, policy)
    return view


def _counted(view: PodView, obj: Mapping[str, Any], target: PodTarget, where: str) -> PodView:
    """The view with where to count its Pods run at once, where its kind counts them and it
    asks for a GPU resource (only the entitlement rule reads it, and only for a maxGPUs)."""
    if target.replicas and view.requested_gpu_names:
        view.counted = Counted(obj, target.replicas, where)
    return view


def _pod_spec_views(
    obj: Mapping[str, Any], kind: str, target: PodTarget, namespace: str, policy: Policy
) -> Iterator[PodView]:
    # The objects whose pod-level fields each match inherits, nearest first.
    layers = [
        layer
        for inherit in target.inherit
        if (layer := next(((p, o) for p, _, o in walk_path(obj, inherit)), None)) is not None
    ]
    for path, identity, spec in walk_path(obj, target.path):
        sources = list(listed_containers(spec, path, target.container_lists))
        for name in target.containers:
            container = spec.get(name)
            if isinstance(container, dict):
                sources.append(
                    ContainerSource(name, 0, container, f"{path}.{name}", fallback_name=name)
                )
        unjudged = [(f"{path}.{f}", spec[f]) for f in target.unjudged if spec.get(f)]
        merged: Mapping[str, Any] = spec
        from_elsewhere: dict[str, str] = {}
        if target.inherit:
            if not sources:
                continue  # an Argo steps or dag template: it runs no Pod of its own
            for where, fields in layers:
                if fields is spec:
                    continue  # templateDefaults judged as itself
                merged, inherited = _inherit(fields, where, merged)
                from_elsewhere = {**inherited, **from_elsewhere}
                unjudged += [(f"{where}.{f}", fields[f]) for f in target.unjudged if fields.get(f)]
        metadata, metadata_path = _metadata(spec, path, target)
        yield view_of(
            kind,
            merged,
            path,
            metadata,
            metadata_path,
            sources,
            namespace,
            policy,
            identity,
            tuple(unjudged),
            from_elsewhere,
            _host_paths(spec, path, target),
        )


def _inherit(
    fields: Mapping[str, Any], where: str, own: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """``own`` with the pod-level fields it does not set taken from ``fields`` (at ``where``),
    and the paths of those. Volumes of both are kept (a Workflow's volumes are every
    template's), numbered after the template's own."""
    merged = dict(own)
    paths: dict[str, str] = {}
    for name in POD_LEVEL_FIELDS.intersection(fields):
        if name not in own:
            merged[name] = fields[name]
            paths[name] = f"{where}.{name}"
        elif name == "volumes" and isinstance(own[name], list) and isinstance(fields[name], list):
            merged[name] = [*own[name], *fields[name]]
    return merged, paths


def _resources_views(
    obj: Mapping[str, Any], kind: str, target: PodTarget, namespace: str, policy: Policy
) -> Iterator[PodView]:
    field = target.path.steps[-1]
    assert isinstance(field, FieldStep)  # compile_workload refuses anything else
    holder = TemplatePath(target.path.text.rpartition(".")[0], target.path.steps[:-1])
    holders: dict[str, tuple[str, Mapping[str, Any]]] = {}
    pods: dict[str, list[Match]] = {}
    for path, identity, container in walk_path(obj, holder):
        holders[path] = (identity, container)
        pods[path] = []
    if not holders:
        # No container-like object written (a TrainJob whose GPUs come from its runtime):
        # the pod-level fields are judged on their own.
        for pod_fields in target.pod_fields:
            for pod_path, pod_identity, pod in walk_path(obj, pod_fields):
                yield _pod_fields_view(
                    kind, pod, pod_path, pod_identity, [], namespace, policy, target
                )
        return
    for pod_fields in target.pod_fields:
        for holder_path, paired in walk_paired(obj, holder, pod_fields):
            if holder_path in pods:
                pods[holder_path].append(paired)
    for path, (identity, container) in holders.items():
        name = path.rpartition(".")[2] or kind
        source = ContainerSource(
            name, 0, container, path, resources_field=field.name, fallback_name=name
        )
        where = f"{path}.{field.name}" if path else field.name  # the target's match
        if not pods[path]:  # no pod-level fields written: the resources alone
            view = view_of(kind, {}, path, {}, path, [source], namespace, policy, identity)
            yield _counted(view, obj, target, where)
        for pod_path, pod_identity, pod in pods[path]:
            view = _pod_fields_view(
                kind,
                pod,
                pod_path,
                f"{identity}@{pod_identity}",
                [source] if pod is container else [source, *listed_containers(pod, pod_path)],
                namespace,
                policy,
                target,
            )
            yield _counted(view, obj, target, where)


def _pod_fields_view(
    kind: str,
    pod: Mapping[str, Any],
    pod_path: str,
    identity: str,
    sources: list[ContainerSource],
    namespace: str,
    policy: Policy,
    target: PodTarget,
) -> PodView:
    """A view of a pod-fields object, with its own containers after ``sources``."""
    if not sources:
        sources = list(listed_containers(pod, pod_path))
    metadata, metadata_path = _metadata(pod, pod_path, target)
    return view_of(
        kind,
        pod,
        pod_path,
        metadata,
        metadata_path,
        sources,
        namespace,
        policy,
        identity,
        host_paths=_host_paths(pod, pod_path, target),
    )


def _metadata(
    node: Mapping[str, Any], where: str, target: PodTarget
) -> tuple[Mapping[str, Any], str]:
    """The Pods' metadata (annotations, labels) as the kind writes them, and its path."""
    value: Any = node
    for name in target.pod_metadata:
        value = value.get(name) if isinstance(value, dict) else None
    path = ".".join((where, *target.pod_metadata)) if where else ".".join(target.pod_metadata)
    return (value if isinstance(value, dict) else {}), path


def _host_paths(
    node: Mapping[str, Any], where: str, target: PodTarget
) -> tuple[tuple[str, str], ...]:
    found = []
    for fields in target.host_paths:
        value: Any = node
        for name in fields:
            value = value.get(name) if isinstance(value, dict) else None
        if isinstance(value, str) and value:
            found.append((f"{where}.{'.'.join(fields)}", value))
    return tuple(found)
