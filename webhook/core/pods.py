"""Pod templates as the checks see them: built once per template, read by every check.

A ``PodView`` wraps one PodSpec (a Pod's own, or a template inside a workload) with its field
path, its containers of every type and what each container requests under the GPU vendor
domains, so that no check walks resources again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any, NamedTuple

from webhook.core.claims import ClaimSpec
from webhook.core.dra import PodClaims, claim_view_relevant, has_claims, mark_claimed_gpus
from webhook.core.inventory import NodeSnapshot, bound_to_cpu_node
from webhook.core.replicas import Counted
from webhook.core.requests import ContainerAsk, scheduled_requests
from webhook.policy.annotations import Injection
from webhook.policy.model import Policy
from webhook.policy.quantity import Quantity, parse_quantity
from webhook.policy.tenants import Grants

if TYPE_CHECKING:
    # For the memo fields' types only: pools and scope work on views, so importing them at
    # run time would be a cycle.
    from webhook.core.pools import Selection
    from webhook.core.queues import Submission
    from webhook.core.scope import Reach

CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
_CONTAINER_FIELDS = tuple((name,) for name in CONTAINER_LISTS)
VISIBILITY_ENV = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")
# Every variable the container toolkit reads starts with it, but one:
TOOLKIT_PREFIX = "NVIDIA_"
# Set without NVIDIA_REQUIRE_CUDA, it makes the image a legacy CUDA image to the toolkit, which
# then exposes every GPU when NVIDIA_VISIBLE_DEVICES is unset (nvidia-container-toolkit
# internal/config/image/cuda_image.go: IsLegacy, devicesFromEnvvars).
CUDA_VERSION = "CUDA_VERSION"
CDI_DOMAIN = "cdi.k8s.io"


@dataclass(slots=True)
class ContainerView:
    list_name: str
    index: int
    spec: Mapping[str, Any]
    name: str
    path: str
    # Vendor-domain resources this container asks for: name -> (value, where it is set).
    # The value is the limit when there is one (the scheduler's request then), else the request.
    gpu: dict[str, tuple[Any, str]]
    # Parsed quantities of ``gpu``; None where the quantity is not one the API server accepts.
    gpu_quantity: dict[str, Quantity | None]
    # Asks for a GPU the policy knows (not e.g. the network operator's nvidia.com/hostdev), in
    # any quantity but a clean zero: read through ``webhook.core.scope.requests_gpu`` and
    # ``surely_gets_gpu``, with the DRA claims below.
    requests_declared_gpu: bool = False
    # The field of ``spec`` with the ResourceRequirements: ``resources`` but in a catalogued
    # container-like object (Trainer's ``resourcesPerNode``).
    resources_field: str = "resources"
    # Through DRA (``webhook.core.dra``): it uses a claim that may hand it a GPU (one of a GPU
    # class, or one whose spec cannot be read), and one that surely does (read, and every
    # alternative of the request a GPU class).
    may_claim_gpu: bool = False
    surely_claims_gpu: bool = False
    _nvidia_env: tuple[tuple[int, dict[str, Any]], ...] | None = None
    _cuda_version: int | None = None  # the index of a CUDA_VERSION entry; -1 for none

    @property
    def nvidia_env(self) -> tuple[tuple[int, dict[str, Any]], ...]:
        """The env entries whose names start with ``NVIDIA_`` (index, entry): found in one
        pass on first use, since an environment can hold hundreds of variables, several
        checks read only these, and the mutation reads none."""
        found = self._nvidia_env
        if found is None:
            found = self._scan_env()
        return found

    @property
    def cuda_version_index(self) -> int:
        """The index of the env entry that sets ``CUDA_VERSION`` (which makes an image without
        ``NVIDIA_REQUIRE_CUDA`` a legacy CUDA image to the container toolkit); -1 for none."""
        if self._cuda_version is None:
            self._scan_env()
        return self._cuda_version  # type: ignore[return-value]

    def _scan_env(self) -> tuple[tuple[int, dict[str, Any]], ...]:
        env = self.spec.get("env")
        found: tuple[tuple[int, dict[str, Any]], ...] = ()
        cuda_version = -1
        if isinstance(env, list) and env:
            try:
                # The common case, looped in C: every entry an object with a string name, and
                # no name holding the prefix (a name that starts with it holds it).
                names = "\n".join(map(dict.get, env, repeat("name")))  # type: ignore[arg-type]
                holds_prefix = TOOLKIT_PREFIX in names
                holds_cuda = CUDA_VERSION in names
            except TypeError:
                # An entry not an object, or a name not a string: one by one.
                holds_prefix = holds_cuda = True
            if holds_prefix:
                found = tuple(
                    [
                        (index, var)
                        for index, var in enumerate(env)
                        if isinstance(var, dict)
                        and isinstance(name := var.get("name"), str)
                        and name.startswith(TOOLKIT_PREFIX)
                    ]
                )
            if holds_cuda:
                cuda_version = next(
                    (
                        index
                        for index, var in enumerate(env)
                        if isinstance(var, dict) and var.get("name") == CUDA_VERSION
                    ),
                    -1,
                )
        self._nvidia_env = found
        self._cuda_version = cuda_version
        return found

    @property
    def resources(self) -> Mapping[str, Any]:
        resources = self.spec.get(self.resources_field)
        return resources if isinstance(resources, dict) else {}

    @property
    def is_sidecar(self) -> bool:
        return self.list_name == "initContainers" and self.spec.get("restartPolicy") == "Always"

    def resource_path(self, name: str) -> str:
        return f"{self.path}.{self.resources_field}.{self.gpu[name][1]}[{name}]"


@dataclass(slots=True)
class PodView:
    kind: str
    spec_path: str
    metadata_path: str
    spec: Mapping[str, Any]
    metadata: Mapping[str, Any]
    containers: tuple[ContainerView, ...]
    namespace: str
    service_account: str
    identity: str = ""  # the template's place, with list items named (see walk_templates)
    gpu_relevant: bool = False
    # The containers that ask for some vendor-domain resource (any quantity), in order.
    gpu_containers: tuple[ContainerView, ...] = ()
    # The vendor resources some container asks for (a quantity above zero, or not a quantity),
    # in first-seen order.
    requested_gpu_names: tuple[str, ...] = ()
    # Fields that change the Pod in ways nothing can judge before it exists: (path, value).
    unjudged: tuple[tuple[str, Any], ...] = ()
    # Host paths an operator mounts from a field of its own (NIMService's storage.hostPath):
    # (field path, the path on the host).
    host_paths: tuple[tuple[str, str], ...] = ()
    # The template's metadata.annotations (empty when it has none, or not an object).
    annotations: Mapping[str, Any] = field(default_factory=dict)
    # Pod-level fields taken from another object (an Argo Workflow's spec): field -> its path.
    inherited: Mapping[str, str] = field(default_factory=dict)
    # Where the count of the template's Pods run at once is read, where its kind counts them
    # and it asks for a GPU resource (``webhook.core.replicas.replicas_of``); None otherwise.
    counted: Counted | None = None
    # Facts several checks read, worked out on first use by the functions that own them:
    # ``webhook.core.pools.select_pool``'s Selection, ``webhook.core.scope.reach``'s Reach,
    # ``webhook.core.scope.asks_for_gpu``'s answer, ``webhook.core.injection.injections``'
    # annotations and ``grants_of``'s grants. None until then. They hold for the policy the
    # view was built with (``view_of``'s): a view is built per request, never shared between
    # policies.
    selection: Selection | None = field(default=None, repr=False)
    reach: Reach | None = field(default=None, repr=False)
    asks_gpu: bool | None = field(default=None, repr=False)
    injections: tuple[Injection, ...] | None = field(default=None, repr=False)
    grants: Grants | None = field(default=None, repr=False)
    # The node inventory's snapshot the template is judged with (``serve --inventory``);
    # None without one.
    nodes: NodeSnapshot | None = field(default=None, repr=False)
    # The object under review and who sent it (``webhook.core.queues``), set by the engine.
    submission: Submission | None = field(default=None, repr=False)
    # DRA (``webhook.core.dra``): the claim specs a claim or claim template is (a view of one
    # has no Pod, ``claim_object``); a Pod's claims as read on first use; and whether it is
    # GPU-relevant only through the GPUs its containers claim (judged so for the first time
    # in this release: warned while ``newChecks`` is Warn).
    claim_specs: tuple[ClaimSpec, ...] = ()
    claim_object: bool = False
    compute_domain: Mapping[str, Any] | None = None  # a ComputeDomain's spec
    pod_claims: PodClaims | None = field(default=None, repr=False)
    relevant_by_claims: bool = False

    def field_path(self, name: str) -> str:
        """The path of a pod-level field, in the object it was written in."""
        return self.inherited.get(name) or f"{self.spec_path}.{name}"

    def first_request_path(self, name: str) -> str:
        for container in self.containers:
            if name in container.gpu:
                return container.resource_path(name)
        return f"{self.spec_path}.containers"

    @property
    def namespace_labels(self) -> Mapping[str, str] | None:
        """Its namespace's labels as the node inventory knows them (None: unknown)."""
        return self.nodes.namespace_labels(self.namespace) if self.nodes is not None else None

    def node_selector(self) -> Mapping[str, Any]:
        selector = self.spec.get("nodeSelector")
        return selector if isinstance(selector, dict) else {}

    def required_terms(self) -> list[Any]:
        terms = _dig(
            self.spec,
            "affinity",
            "nodeAffinity",
            "requiredDuringSchedulingIgnoredDuringExecution",
            "nodeSelectorTerms",
        )
        return [t for t in terms if isinstance(t, dict)] if isinstance(terms, list) else []

    def tolerations(self) -> list[Any]:
        tolerations = self.spec.get("tolerations")
        return (
            [t for t in tolerations if isinstance(t, dict)] if isinstance(tolerations, list) else []
        )


def attach_nodes(view: PodView, nodes: NodeSnapshot, policy: Policy) -> None:
    """Have the view judged with the node inventory's snapshot, before any check reads it:
    the node its ``nodeName`` names can change whether it is GPU-relevant."""
    view.nodes = nodes
    if view.spec.get("nodeName") and not any(
        quantity is None or quantity != 0
        for container in view.gpu_containers
        for quantity in container.gpu_quantity.values()
    ):
        view.gpu_relevant = _gpu_relevant(view, policy)
        view.relevant_by_claims = False
    if view.claim_object:
        # The inventory's DeviceClasses may say a class is a GPU's.
        view.gpu_relevant = view.compute_domain is not None or any(
            claim_view_relevant(spec, policy, nodes) for spec in view.claim_specs
        )
    elif has_claims(view):
        # The inventory's templates say what the claims ask for.
        mark_claimed_gpus(view, policy)


def effective_requests(view: PodView) -> dict[str, Quantity]:
    """The scheduler's view of the Pod's request of each vendor resource."""
    return scheduled_requests(
        ContainerAsk(c.list_name, c.is_sidecar, c.gpu_quantity) for c in view.containers
    )


def grants_of(view: PodView, policy: Policy) -> Grants:
    """What the policy's tenants block grants the template's namespace; looked up once per
    view, and only by a check that found something a grant could cover."""
    found = view.grants
    if found is None:
        found = view.grants = policy.grants(view.namespace)
    return found


def ephemeral_container_names(pod: Mapping[str, Any]) -> set[str]:
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


class ContainerSource(NamedTuple):
    """Where a container of a view is: its list (or field) name, index, object and path. A
    tuple: a 1,000-container Pod makes 1,000 of them per review."""

    list_name: str
    position: int  # in its list (``index`` is tuple's own method)
    spec: Mapping[str, Any]
    path: str
    resources_field: str = "resources"
    fallback_name: str = ""  # for a container object without a name (Trainer's trainer)


def build_view(
    kind: str,
    template_path: str,
    template: Mapping[str, Any],
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
    return view_of(
        kind,
        spec,
        f"{prefix}spec",
        metadata if isinstance(metadata, dict) else {},
        f"{prefix}metadata",
        list(listed_containers(spec, f"{prefix}spec")),
        namespace,
        policy,
        identity,
    )


def listed_containers(
    spec: Mapping[str, Any], spec_path: str, lists: tuple[tuple[str, ...], ...] = ()
) -> Iterator[ContainerSource]:
    """The containers of a PodSpec's lists, and of more lists at ``lists`` (field paths)."""
    for fields in (*_CONTAINER_FIELDS, *lists) if lists else _CONTAINER_FIELDS:
        items: Any = spec
        for name in fields:
            items = items.get(name) if isinstance(items, dict) else None
        if not isinstance(items, list):
            continue
        list_name = ".".join(fields)
        for index, container in enumerate(items):
            if isinstance(container, dict):
                path = f"{spec_path}.{list_name}[{index}]"
                yield ContainerSource(list_name, index, container, path)


def view_of(
    kind: str,
    spec: Mapping[str, Any],
    spec_path: str,
    metadata: Mapping[str, Any],
    metadata_path: str,
    sources: list[ContainerSource],
    namespace: str,
    policy: Policy,
    identity: str = "",
    unjudged: tuple[tuple[str, Any], ...] = (),
    inherited: Mapping[str, str] | None = None,
    host_paths: tuple[tuple[str, str], ...] = (),
) -> PodView:
    """A view of pod-level fields and containers, wherever in an object they are written
    (``inherited``: the pod-level fields taken from another object, and their paths)."""
    containers: list[ContainerView] = []
    gpu_containers: list[ContainerView] = []
    requested: dict[str, None] = {}
    asks_vendor_resource = False
    declared = policy.declared_names
    retired = policy.retired
    # One pass over the containers works out every fact the checks read about their
    # resources, so that no check walks them again.
    for list_name, index, container, path, resources_field, fallback_name in sources:
        # Vendor-domain resources: name -> (value, where), the limit winning over the request
        # as for the scheduler.
        gpu: dict[str, tuple[Any, str]] = {}
        resources = container.get(resources_field)
        for where in ("requests", "limits"):
            values = resources.get(where) if isinstance(resources, dict) else None
            if isinstance(values, dict):
                for name, value in values.items():
                    # Without a domain only a retired name is one (cpu and memory are in
                    # every Pod).
                    if (
                        isinstance(name, str)
                        and ("/" in name or name in retired)
                        and policy.is_vendor_resource(name)
                    ):
                        gpu[name] = (value, where)
        quantities: dict[str, Quantity | None] = {}
        requests_declared = False
        for name, (value, _) in gpu.items():
            quantity = quantities[name] = parse_quantity(value)
            # Any quantity but a clean zero is an ask (a negative or unparsable one is an
            # attempt, and is judged as one): of some vendor resource, GPU or not, it makes the
            # template GPU-relevant (the GPU rules' scope; the security rules use reach).
            if quantity is None or quantity != 0:
                asks_vendor_resource = True
                if name in declared or name in retired:
                    requests_declared = True
                if quantity is None or quantity > 0:
                    requested[name] = None
        container_view = ContainerView(
            list_name,
            index,
            container,
            str(container.get("name") or fallback_name or f"#{index}"),
            path,
            gpu,
            quantities,
            requests_declared,
            resources_field,
        )
        containers.append(container_view)
        if gpu:
            gpu_containers.append(container_view)
    service_account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    view = PodView(
        kind,
        spec_path,
        metadata_path,
        spec,
        metadata,
        tuple(containers),
        namespace,
        str(service_account),
        identity,
        asks_vendor_resource,  # gpu_relevant, for another reason set below
        tuple(gpu_containers),
        tuple(requested),
        unjudged,
        host_paths,
    )
    if inherited:
        view.inherited = inherited
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict):
        view.annotations = annotations
    if not asks_vendor_resource:
        view.gpu_relevant = _gpu_relevant(view, policy)
    if has_claims(view):
        mark_claimed_gpus(view, policy)
    return view


def _gpu_relevant(view: PodView, policy: Policy) -> bool:
    """GPU-relevant for a template that asks for no vendor resource (see view_of): it fiddles
    with GPU visibility, or aims at GPU nodes (by label, by a GPU taint's toleration, or by
    naming its node where pools are reserved)."""
    for container in view.containers:
        env = container.nvidia_env
        if env and any(var["name"] in VISIBILITY_ENV for _, var in env):
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
            expression_key = expr.get("key") if isinstance(expr, dict) else None
            if isinstance(expression_key, str) and (
                expression_key in gpu_label_keys or policy.is_vendor_resource(expression_key)
            ):
                return True
    if policy.has_reserved_pools and view.spec.get("nodeName"):
        # It may be a reserved pool's node (the pool-access rule); a CPU node is not.
        if not bound_to_cpu_node(view.nodes, view.spec["nodeName"], policy):
            return True
    return any(
        isinstance(t.get("key"), str) and t["key"] in policy.gpu_taint_keys
        for t in view.tolerations()
    )
