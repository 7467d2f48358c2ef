"""Pod templates as the checks see them: built once per template, read by every check.

A ``PodView`` wraps one PodSpec (a Pod's own, or a template inside a workload) with its field
path, its containers of every type and what each container requests under the GPU vendor
domains, so that no check walks resources again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from webhook.policy.model import (
    EachItem,
    EachValue,
    FieldStep,
    Policy,
    TemplatePath,
    WorkloadKind,
)
from webhook.policy.quantity import Quantity, parse_quantity

CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
VISIBILITY_ENV = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")
CDI_DOMAIN = "cdi.k8s.io"
Memoized = TypeVar("Memoized")


@dataclass(slots=True)
class ContainerView:
    list_name: str
    index: int
    spec: Mapping
    name: str
    path: str
    # Vendor-domain resources this container asks for: name -> (value, where it is set).
    # The value is the limit when there is one (the scheduler's request then), else the request.
    gpu: dict[str, tuple[Any, str]]
    # Parsed quantities of ``gpu``; None where the quantity is not one the API server accepts.
    gpu_quantity: dict[str, Quantity | None]
    # Asks for a GPU the policy knows (not e.g. the network operator's nvidia.com/hostdev), in
    # any quantity but a clean zero: read through ``webhook.core.scope.requests_gpu``.
    requests_declared_gpu: bool = False

    @property
    def asks_for_vendor_resource(self) -> bool:
        """Asks for some vendor resource, GPU or not: any quantity but a clean zero (a negative
        or unparsable one is an attempt, and is judged as one). GPU-relevance for the GPU
        rules; the security rules use ``webhook.core.scope`` instead."""
        return any(q is None or q != 0 for q in self.gpu_quantity.values())

    @property
    def is_sidecar(self) -> bool:
        return self.list_name == "initContainers" and self.spec.get("restartPolicy") == "Always"

    def resource_path(self, name: str) -> str:
        return f"{self.path}.resources.{self.gpu[name][1]}[{name}]"


@dataclass(slots=True)
class PodView:
    kind: str
    spec_path: str
    metadata_path: str
    spec: Mapping
    metadata: Mapping
    containers: tuple[ContainerView, ...]
    namespace: str
    service_account: str
    identity: str = ""  # the template's place, with list items named (see walk_templates)
    gpu_relevant: bool = False
    _memo: dict = field(default_factory=dict, repr=False)

    def memo(self, compute: Callable[[PodView, Policy], Memoized], policy: Policy) -> Memoized:
        """``compute(self, policy)``, computed once per view: several checks read the same
        derived facts (the pool choice) and a view is built for one policy."""
        try:
            return self._memo[compute]
        except KeyError:
            value = self._memo[compute] = compute(self, policy)
            return value

    @property
    def annotations(self) -> Mapping:
        annotations = self.metadata.get("annotations")
        return annotations if isinstance(annotations, dict) else {}

    def gpu_containers(self) -> Iterator[ContainerView]:
        return (c for c in self.containers if c.gpu)

    def requested_gpu_names(self) -> list[str]:
        """Vendor resources some container asks for (quantity above zero), in first-seen order."""
        names: dict[str, None] = {}
        for container in self.containers:
            for name, quantity in container.gpu_quantity.items():
                if quantity is None or quantity > 0:
                    names[name] = None
        return list(names)

    def first_request_path(self, name: str) -> str:
        for container in self.containers:
            if name in container.gpu:
                return container.resource_path(name)
        return f"{self.spec_path}.containers"

    def node_selector(self) -> Mapping:
        selector = self.spec.get("nodeSelector")
        return selector if isinstance(selector, dict) else {}

    def required_terms(self) -> list:
        terms = _dig(
            self.spec,
            "affinity",
            "nodeAffinity",
            "requiredDuringSchedulingIgnoredDuringExecution",
            "nodeSelectorTerms",
        )
        return [t for t in terms if isinstance(t, dict)] if isinstance(terms, list) else []

    def tolerations(self) -> list:
        tolerations = self.spec.get("tolerations")
        return (
            [t for t in tolerations if isinstance(t, dict)] if isinstance(tolerations, list) else []
        )


def ephemeral_container_names(pod: Mapping) -> set[str]:
    """The names of a Pod's ephemeral containers (an UPDATE adds them by name)."""
    spec = pod.get("spec")
    items = spec.get("ephemeralContainers") if isinstance(spec, dict) else None
    if not isinstance(items, list):
        return set()
    return {c["name"] for c in items if isinstance(c, dict) and isinstance(c.get("name"), str)}


def is_cdi_annotation(key: object) -> bool:
    """An annotation that asks the runtime for CDI devices: ``cdi.k8s.io/<name>``, and any
    subdomain of it (the GPU Operator's NRI plugin reads ``nvidia.cdi.k8s.io/<name>``)."""
    if not isinstance(key, str):
        return False
    prefix, slash, _ = key.partition("/")
    return bool(slash) and (prefix == CDI_DOMAIN or prefix.endswith("." + CDI_DOMAIN))


def _dig(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _container_gpu(container: Mapping, policy: Policy) -> dict[str, tuple[Any, str]]:
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return {}
    found: dict[str, tuple[Any, str]] = {}
    for where in ("requests", "limits"):  # limits last: they win, as for the scheduler
        values = resources.get(where)
        if isinstance(values, dict):
            for name, value in values.items():
                if isinstance(name, str) and policy.is_vendor_resource(name):
                    found[name] = (value, where)
    return found


def build_view(
    kind: str,
    template_path: str,
    template: Mapping,
    namespace: str,
    policy: Policy,
    identity: str = "",
) -> PodView | None:
    """A view of one PodTemplateSpec (or of a Pod, whose template is the object itself)."""
    spec = template.get("spec")
    if not isinstance(spec, dict):
        return None
    prefix = f"{template_path}." if template_path else ""
    metadata = template.get("metadata")
    spec_path = f"{prefix}spec"
    containers: list[ContainerView] = []
    declared = policy.declared_names
    for list_name in CONTAINER_LISTS:
        items = spec.get(list_name)
        if not isinstance(items, list):
            continue
        for index, container in enumerate(items):
            if not isinstance(container, dict):
                continue
            gpu = _container_gpu(container, policy)
            quantities = {n: parse_quantity(v) for n, (v, _) in gpu.items()} if gpu else {}
            containers.append(
                ContainerView(
                    list_name=list_name,
                    index=index,
                    spec=container,
                    name=str(container.get("name", f"#{index}")),
                    path=f"{spec_path}.{list_name}[{index}]",
                    gpu=gpu,
                    gpu_quantity=quantities,
                    requests_declared_gpu=any(
                        (q is None or q != 0) and (n in declared or n in policy.retired)
                        for n, q in quantities.items()
                    ),
                )
            )
    service_account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    view = PodView(
        kind=kind,
        spec_path=spec_path,
        metadata_path=f"{prefix}metadata",
        spec=spec,
        metadata=metadata if isinstance(metadata, dict) else {},
        containers=tuple(containers),
        namespace=namespace,
        service_account=str(service_account),
        identity=identity,
    )
    view.gpu_relevant = _gpu_relevant(view, policy)
    return view


def _gpu_relevant(view: PodView, policy: Policy) -> bool:
    """GPU-relevant: asks for a GPU, fiddles with GPU visibility, or aims at GPU nodes."""
    for container in view.containers:
        if container.asks_for_vendor_resource:
            return True
        env = container.spec.get("env")
        if isinstance(env, list):
            for var in env:
                if isinstance(var, dict) and var.get("name") in VISIBILITY_ENV:
                    return True
    if any(is_cdi_annotation(k) for k in view.annotations):
        return True
    gpu_label_keys = policy.gpu_label_keys
    for key in view.node_selector():
        if not isinstance(key, str):
            continue
        if key in gpu_label_keys or policy.is_vendor_resource(str(key)):
            return True
    for term in view.required_terms():
        expressions = term.get("matchExpressions")
        for expr in expressions if isinstance(expressions, list) else ():
            key = expr.get("key") if isinstance(expr, dict) else None
            if isinstance(key, str) and (key in gpu_label_keys or policy.is_vendor_resource(key)):
                return True
    return any(
        isinstance(t.get("key"), str) and t["key"] in policy.gpu_taint_keys
        for t in view.tolerations()
    )


def walk_templates(obj: Mapping, workload: WorkloadKind) -> Iterator[tuple[str, str, Mapping]]:
    """Every (field path, identity, PodTemplateSpec) that the workload kind declares in the
    object. The identity names list items by their ``name`` (JobSet's replicatedJobs, Ray's
    workerGroupSpecs by ``groupName``) instead of their position, so that an UPDATE that
    reorders or inserts items is matched by name."""
    for template in workload.templates:
        yield from _walk(obj, template, 0, "", "")


def _walk(
    node: Any, template: TemplatePath, step: int, path: str, identity: str
) -> Iterator[tuple[str, str, Mapping]]:
    if step == len(template.steps):
        if isinstance(node, dict):
            yield path, identity, node
        return
    kind = template.steps[step]
    if isinstance(kind, FieldStep):
        if isinstance(node, dict) and kind.name in node:
            child = f"{path}.{kind.name}" if path else kind.name
            child_identity = f"{identity}.{kind.name}" if identity else kind.name
            yield from _walk(node[kind.name], template, step + 1, child, child_identity)
    elif isinstance(kind, EachValue):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from _walk(value, template, step + 1, f"{path}[{key}]", f"{identity}[{key}]")
    elif isinstance(kind, EachItem) and isinstance(node, list):
        for index, value in enumerate(node):
            name = _item_name(value)
            item = f"[name={name}]" if name is not None else f"[{index}]"
            yield from _walk(value, template, step + 1, f"{path}[{index}]", identity + item)


def _item_name(item: Any) -> str | None:
    if isinstance(item, dict):
        for key in ("name", "groupName"):
            if isinstance(item.get(key), str):
                return item[key]
    return None
