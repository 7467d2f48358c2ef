"""The compiled policy: plain immutable objects, built once at load time.

Nothing here parses YAML or validates a schema; ``webhook.policy.load`` does that and
``webhook.policy.compile`` builds these objects, which the request path only reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from webhook.policy.dra import DEVICE_CLASS_RESOURCE_DOMAIN, NO_DRA_SETTINGS, DraSettings
from webhook.policy.exceptions import PolicyException
from webhook.policy.names import NearMisses
from webhook.policy.queues import DEFAULT_CONTROLLERS, Controllers
from webhook.policy.rules import RULES
from webhook.policy.tenants import NO_GRANTS, Grants, NamespaceMatcher, Tenant

RuleMode = Literal["Enforce", "Warn", "Audit", "Off"]
# The mode of a rule that is on: what a finding is reported in.
Mode = Literal["Enforce", "Warn", "Audit"]
Sharing = Literal["Exclusive", "TimeSlicing", "MPS", "MIG", "MIGTimeSlicing"]

RULE_IDS: tuple[str, ...] = tuple(rule.id for rule in RULES)

# The rules that keep a tenant from the node's devices and host: they bind every Pod that can
# reach a GPU node (``webhook.core.scope``), not only the Pods that ask for a GPU.
SECURITY_RULES = frozenset(rule.id for rule in RULES if rule.security)
# The rules run on a DRA claim or claim template (no Pod).
CLAIM_RULES = frozenset(rule.id for rule in RULES if rule.claims)
# Where a rule's mode is looked up: the policy's ``gpuPods``, ``reachablePods`` or ``otherPods``.
Scope = Literal["gpuPods", "reachablePods", "otherPods"]
SCOPES: tuple[Scope, ...] = ("gpuPods", "reachablePods", "otherPods")

# Where a setting is in the policy document: ("spec", "tenants", 2, "exemptions", 0).
Path = tuple[str | int, ...]

SOFTWARE_SHARING = frozenset({"TimeSlicing", "MPS", "MIGTimeSlicing"})
POOL_ANNOTATION = "gpu-admission.io/pool"
INJECTED_ANNOTATION = "gpu-admission.io/injected"


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    name: str
    sharing: Sharing
    per_node: int | None = None
    max_per_pod: int | None = None
    fail_requests_greater_than_one: bool = False


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    node_selector: MappingProxyType[str, str]
    resources: MappingProxyType[str, ResourceSpec]
    gpus_per_node: int | None
    taints: tuple[MappingProxyType[str, Any], ...]
    preferred_affinity: tuple[MappingProxyType[str, Any], ...]
    require_node_affinity: bool
    namespaces: NamespaceMatcher | None
    # The classes the mutating webhook gives GPU workload templates whose Pods land here.
    runtime_class: str | None = None
    priority_class: str | None = None
    # The DRA device classes its nodes publish devices of: a claim of one chooses the pool.
    device_classes: frozenset[str] = frozenset()

    def offers(self, name: str) -> bool:
        """Whether it offers a resource, or devices of a DRA class, of that name."""
        return name in self.resources or name in self.device_classes

    def allows_namespace(self, namespace: str) -> bool:
        return self.namespaces is None or self.namespaces.matches(namespace)


@dataclass(frozen=True, slots=True)
class GpuDefaults:
    """What the mutating webhook adds to GPU workloads that set none (``spec.mutation.
    gpuDefaults``), each None (or False) where the policy does not set it.

    ``runtime_class``, ``priority_class``: of workload templates that request a GPU (a pool's
    own class wins for the templates whose Pods land in it); ``bare_pod_deadline``: a bare GPU
    Pod's ``activeDeadlineSeconds``; ``job_deadline``: a GPU Job's (a CronJob's job template's);
    ``shared_memory``: a memory-backed ``/dev/shm`` for Pods of more than one whole GPU or MIG
    instance (none where an MPS-shared resource is asked: ``webhook.admission.gpu_defaults``), of
    ``shared_memory_size`` (as written) when set. ``for_workloads``: some default goes on
    workload objects (here or in a pool), so that they are planned for at all."""

    runtime_class: str | None = None
    priority_class: str | None = None
    bare_pod_deadline: int | None = None
    job_deadline: int | None = None
    shared_memory: bool = False
    shared_memory_size: str | int | None = None
    for_workloads: bool = False


@dataclass(frozen=True, slots=True)
class RuleModes:
    """A rule's mode for each scope. ``reachable_pods`` (Pods that reach GPU nodes only through
    a wildcard toleration, as node agents do) is None where no policy layer names it: it then
    follows ``gpu_pods``, so a policy that never heard of it is not loosened."""

    gpu_pods: RuleMode
    other_pods: RuleMode
    reachable_pods: RuleMode | None = None

    def for_scope(self, scope: Scope) -> RuleMode:
        if scope == "gpuPods":
            return self.gpu_pods
        if scope == "otherPods":
            return self.other_pods
        return self.gpu_pods if self.reachable_pods is None else self.reachable_pods


# What runs on a template: (rule id, its mode, the scope a security rule reports or None).
RuleStep = tuple[str, Mode, "Scope | None"]


class RuleSet(Mapping[str, RuleModes]):
    """Every rule's modes (rule id -> :class:`RuleModes`, read-only), and what follows from
    them for a template, compiled once: for its GPU-relevance (``gpuPods`` or ``otherPods``,
    the scope of the other rules) and its reach (the scope of the security rules; None to
    leave them out), the rules that are on, in ``RULE_IDS`` order, with their modes.
    Judging a template then looks up one tuple instead of a mode per rule."""

    __slots__ = ("_modes", "steps", "needs_reach")

    def __init__(self, modes: Mapping[str, RuleModes]) -> None:
        self._modes = dict(modes)
        # Whether judging a template needs its reach: a security rule that is on in some scope.
        self.needs_reach = any(
            self._modes[rule].for_scope(scope) != "Off"
            for rule in SECURITY_RULES
            for scope in SCOPES
        )
        # (relevance, reach) -> the rules that run on such a template (None: no security
        # rule), with their modes, in RULE_IDS order. Read-only; a dict, read once per template.
        self.steps: dict[tuple[Scope, Scope | None], tuple[RuleStep, ...]] = {}
        for relevance in ("gpuPods", "otherPods"):
            for reach in (*SCOPES, None):
                self.steps[relevance, reach] = tuple(self._compile(relevance, reach))

    def _compile(self, relevance: Scope, reach: Scope | None) -> Iterator[RuleStep]:
        for rule in RULE_IDS:
            if rule not in SECURITY_RULES:
                mode, reported = self._modes[rule].for_scope(relevance), None
            elif reach is not None:
                mode, reported = self._modes[rule].for_scope(reach), reach
            else:
                continue  # security rules left out
            if mode != "Off":
                yield rule, mode, reported

    def __getitem__(self, rule: str) -> RuleModes:
        return self._modes[rule]

    def __iter__(self) -> Iterator[str]:
        return iter(self._modes)

    def __len__(self) -> int:
        return len(self._modes)

    def __repr__(self) -> str:
        return f"RuleSet({self._modes!r})"


@dataclass(frozen=True, slots=True)
class NamespaceOverride:
    """Rule modes for some namespaces: a ``tenants`` entry's ``rules`` (``path`` is the entry's)
    or a ``namespaceOverrides`` entry, the field before it."""

    namespaces: NamespaceMatcher
    rules: RuleSet  # already merged over the policy's
    path: Path


@dataclass(frozen=True, slots=True)
class Exemption:
    """An exemption: a ``tenants`` entry's (``path`` is ``("spec", "tenants", i, "exemptions",
    j)``, ``namespaces`` the entry's) or a ``spec.exemptions`` entry, the field before it."""

    namespaces: NamespaceMatcher
    service_accounts: frozenset[str] | None
    rules: frozenset[str] | None  # None: every rule
    path: Path

    def applies(self, namespace: str, service_account: str) -> bool:
        """Whether the exemption covers a template (for its ``rules``, or every rule)."""
        return self.namespaces.matches(namespace) and (
            self.service_accounts is None or service_account in self.service_accounts
        )


@dataclass(frozen=True, slots=True)
class FieldStep:
    """Into the field ``name`` of an object."""

    name: str


@dataclass(frozen=True, slots=True)
class EachValue:
    """Into every value of a map (``*`` in a template path)."""


@dataclass(frozen=True, slots=True)
class EachItem:
    """Into every item of a list (``[*]`` in a template path)."""


TemplateStep = FieldStep | EachValue | EachItem


@dataclass(frozen=True, slots=True)
class TemplatePath:
    """A compiled template path: ``spec.replicatedJobs[*].template`` as its steps."""

    text: str
    steps: tuple[TemplateStep, ...]


TargetShape = Literal["template", "podSpec", "container", "resources", "claim", "computeDomain"]


@dataclass(frozen=True, slots=True)
class CountField:
    """A field that counts a target's Pods, found from the target's match: ``prefix`` the
    steps its path shares with the target's (walked to the match's ancestor: the same map
    entry, the same list item), then ``fields`` below it. ``text``: the path as written."""

    text: str
    prefix: TemplatePath
    fields: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReplicaFactor:
    """One factor of how many Pods of a target run at once: the integer ``count`` field
    (``default`` where it is absent; None: the count is then unknown), raised to
    ``at_least``'s value and capped by ``at_most``'s where those are written, less one where
    ``less_one_with`` is written (a LeaderWorkerSet's size counts the leader, whose Pod its
    leaderTemplate makes when written)."""

    count: CountField
    default: int | None = None
    at_least: CountField | None = None
    at_most: CountField | None = None
    less_one_with: CountField | None = None


@dataclass(frozen=True, slots=True)
class PodTarget:
    """Where a workload kind keeps one kind of pod definition, in one of four shapes:

    - ``template``: a PodTemplateSpec (``metadata`` and ``spec``);
    - ``podSpec``: a PodSpec inline at ``path`` (KServe's predictor), with ``containers``
      (fields of it holding one container each), ``container_lists`` (more lists of them),
      ``inherit`` (objects, nearest first, whose pod-level fields every match gets too: an Argo
      Workflow's templateDefaults, then its
      ``spec`` for its templates) and ``unjudged`` (fields that change the Pod in ways nothing
      can judge before it exists: Argo's ``podSpecPatch``);
    - ``container``: one container, without pod-level fields;
    - ``claim``: a ResourceClaimSpec (a ResourceClaim's ``spec``, a template's
      ``spec.spec``): no Pod, judged by the rules that judge claims;
    - ``computeDomain``: NVIDIA's ComputeDomain ``spec`` (IMEX across a rack's nodes): no
      Pod either, judged by the ``dra-claims`` rule;
    - ``resources``: ResourceRequirements inside a container-like object (its parent, whose
      env and security context are judged too), with ``pod_fields`` the paths of the objects
      holding the pod-level fields of the same Pods (Trainer's TrainJob: ``resourcesPerNode``
      and its overrides, whose field moved between releases). Paths that share list items
      with ``path`` pair by them (a NIMPipeline service's resources with that service's spec).
    """

    shape: TargetShape
    path: TemplatePath
    containers: tuple[str, ...] = ()
    container_lists: tuple[tuple[str, ...], ...] = ()
    inherit: tuple[TemplatePath, ...] = ()  # nearest first
    unjudged: tuple[str, ...] = ()
    pod_fields: tuple[TemplatePath, ...] = ()
    # Fields (of the match, or of each pod-fields match) holding a host path that the
    # operator mounts into the Pod: judged as hostPath volumes.
    host_paths: tuple[tuple[str, ...], ...] = ()
    # Where the Pods' annotations and labels are, relative to the match (() for the match
    # itself): ``metadata`` unless the kind writes them elsewhere.
    pod_metadata: tuple[str, ...] = ("metadata",)
    # How many Pods of each match run at once: the product of these (none: not counted).
    replicas: tuple[ReplicaFactor, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkloadKind:
    group: str
    kind: str
    resource: str
    targets: tuple[PodTarget, ...]
    scope: Literal["Namespaced", "Cluster"] = "Namespaced"
    catalogued: bool = False  # from the built-in catalogue of GPU workload kinds

    @property
    def built_in(self) -> bool:
        """A kind of the Kubernetes API itself (its webhook rules fail closed)."""
        return self.group in ("", "apps", "batch", "extensions")

    @property
    def claims(self) -> bool:
        """A DRA claim or claim template: no Pod of its own, only claim specs
        (``webhook.policy.workloads``). A workload that embeds claim specs beside its Pods'
        (NIM's ``draResources``) is none."""
        return bool(self.targets) and all(t.shape == "claim" for t in self.targets)


@dataclass(frozen=True, slots=True)
class PolicyWarning:
    """A lint warning: the policy loads, but part of it cannot mean what it says. An ``info``
    note says what a valid setting implies (an exemption trusts a namespace's Pod creators)."""

    line: int
    path: str  # the field path, ``spec.pools[1].resources[0].sharing``
    message: str
    # "error": an entry dropped at load (the policy serves without it; ``policy validate``
    # refuses it), so that a replica does not crash-loop on a policy valid yesterday.
    level: Literal["warning", "info", "error"] = "warning"


@dataclass(frozen=True, slots=True)
class NodeInventorySwitches:
    """What the node inventory (``serve --inventory``) may add to decisions: the policy's
    ``nodeInventory`` switches, each on by default."""

    advertised_names: bool = True
    observed_node_sizes: bool = True
    node_name: bool = True


@dataclass(frozen=True, slots=True)
class DaemonSetName:
    """A DaemonSet the policy names (``devicePluginDaemonSets``)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True, eq=False)
class Policy:
    name: str
    source: str
    sha256: str
    vendor_domains: tuple[str, ...]
    resources: MappingProxyType[str, ResourceSpec]  # cluster-wide declared resources
    unknown_resources: Literal["Allow", "Warn", "Deny"]
    mig_products: tuple[str, ...]
    mig_profiles: frozenset[str]  # catalogued profiles of the declared products (no .shared)
    # Every product the catalogue knows, built in or the policy's customProducts, with its
    # profiles: what cluster check compares the nodes' products and MIG profiles with.
    mig_catalogue: MappingProxyType[str, frozenset[str]]
    mig_profile_counts: MappingProxyType[str, int]  # profile -> most instances on one GPU
    mig_sizes: tuple[tuple[int, int, str], ...]  # mig.plain_sizes of mig_profiles
    uncatalogued_mig: Literal["Warn", "Deny"]
    pools: tuple[Pool, ...]
    gpu_node_taints: tuple[
        MappingProxyType[str, Any], ...
    ]  # taints of GPU nodes outside declared pools
    # The NoSchedule/NoExecute taints of each class of GPU node (gpuNodeTaints, each pool): a
    # Pod that tolerates every taint of one class can land there. Empty when every Pod can
    # (GPU nodes declared untainted, or a class without such a taint).
    gpu_node_classes: tuple[tuple[MappingProxyType[str, Any], ...], ...]
    every_pod_reaches_gpu_nodes: bool
    gpu_nodes_tainted: bool  # the policy's gpuNodesTainted
    host_device_paths: tuple[str, ...]
    # With ``hostDevices.allowedPaths``: the only host paths (and below) a reachable Pod may
    # mount, entries that touch a node-control path dropped (``webhook.policy.hostpaths``).
    host_path_allow_list: tuple[str, ...] | None
    inject_void: bool
    mutation_enabled: bool
    mutation_mode: Literal["Apply", "Record"]
    rules: RuleSet
    namespace_overrides: tuple[NamespaceOverride, ...]
    exemptions: tuple[Exemption, ...]
    workloads: MappingProxyType[tuple[str, str], WorkloadKind]  # by (group, kind)
    declared_names: frozenset[str]  # every GPU resource name the policy knows
    # Vendor resources that go beside GPUs in any pool (HAMi's nvidia.com/gpumem, NICs): known
    # to the resource-name rule, no part of pool selection, no GPU request.
    companion_names: frozenset[str]
    near_misses: NearMisses  # near_miss_key(name) -> declared name, indexed
    retired: MappingProxyType[str, tuple[str, str]]  # name -> (replacement, reason)
    # Namespaces open to every pool whose Pods may set nodeName (a gang scheduler's binder).
    binder_namespaces: NamespaceMatcher | None
    gpu_label_keys: frozenset[str]  # node labels that select a GPU pool
    gpu_taint_keys: frozenset[str]  # taint keys of GPU nodes (pools' and gpuNodeTaints)
    pooled_names: frozenset[str]  # the GPU resources some pool offers
    has_reserved_pools: bool  # some pool is open to some namespaces only
    # The namespaces some exemption names, and whether one names namespaces by a glob: a
    # template's exemptions are looked for only when it could have one.
    exempted_names: frozenset[str]
    exempts_by_glob: bool
    tenants: tuple[Tenant, ...] = ()
    requires_queues: bool = False  # some tenants entry states requirements.queue
    # Whose requests create objects from workloads already judged: not asked for a queue again.
    controllers: Controllers = DEFAULT_CONTROLLERS
    # The namespace label keys tenants select by: what the node inventory keeps of Namespaces
    # (none: it watches no Namespace).
    namespace_label_keys: frozenset[str] = frozenset()
    # The checks added or tightened in this release (the pod-security rule; unlisted host paths,
    # hostIPC, SYS_PTRACE, the node-shared toolkit variables): Warn reports them as warnings at
    # most, whatever their rule's mode (an upgrade warns before it denies); Enforce gives them
    # their rule's mode. Each such check marks its violations advisory by it.
    new_checks: Literal["Warn", "Enforce"] = "Warn"
    node_inventory: NodeInventorySwitches = NodeInventorySwitches()
    exceptions: tuple[PolicyException, ...] = ()
    excepted_namespaces: frozenset[str] = frozenset()  # where some exception applies
    # The device plugin DaemonSets cluster check compares with the GPU nodes (none: not compared).
    device_plugin_daemonsets: tuple[DaemonSetName, ...] = ()
    gpu_defaults: GpuDefaults = GpuDefaults()
    dra: DraSettings = NO_DRA_SETTINGS
    warnings: tuple[PolicyWarning, ...] = ()  # whole-policy lints, in line order

    def rule_modes(self, namespace: str) -> RuleSet:
        """The rule modes in force in a namespace: the first matching override wins."""
        for override in self.namespace_overrides:
            if override.namespaces.matches(namespace):
                return override.rules
        return self.rules

    @property
    def new_checks_advisory(self) -> bool:
        """Whether the checks new in this release are warnings at most."""
        return self.new_checks == "Warn"

    def grants(self, namespace: str) -> Grants:
        """What the tenants block grants the namespace: every matching entry's grants."""
        found = NO_GRANTS
        for tenant in self.tenants:
            if tenant.grants is not NO_GRANTS and tenant.namespaces.matches(namespace):
                found = tenant.grants if found is NO_GRANTS else found.merged(tenant.grants)
        return found

    def expired_exceptions(self, now: float) -> list[tuple[int, PolicyException]]:
        """The exceptions that apply no more at ``now`` (seconds since the epoch), with their
        index in ``spec.exceptions``."""
        return [(i, e) for i, e in enumerate(self.exceptions) if now >= e.expires]

    def entitled_tenant(
        self, namespace: str, labels: Mapping[str, str] | None = None
    ) -> Tenant | None:
        """The first ``tenants`` entry that matches the namespace (by name, or by its
        ``labels`` where the node inventory knows them) and states entitlements."""
        for tenant in self.tenants:
            if tenant.entitlements is not None and tenant.matches(namespace, labels):
                return tenant
        return None

    def queue_tenant(
        self, namespace: str, labels: Mapping[str, str] | None = None
    ) -> Tenant | None:
        """The first ``tenants`` entry that matches the namespace (by name, or by its
        ``labels`` where the node inventory knows them) and states a queue requirement."""
        for tenant in self.tenants:
            if tenant.queue is not None and tenant.matches(namespace, labels):
                return tenant
        return None

    def pool_preference(self, namespace: str) -> tuple[str, ...]:
        """The pools the namespace's tenant prefers, in order: the first matching ``tenants``
        entry that states a preference."""
        for tenant in self.tenants:
            if tenant.pool_preference and tenant.namespaces.matches(namespace):
                return tenant.pool_preference
        return ()

    def may_use(self, pool: Pool, namespace: str) -> bool:
        """Whether Pods of the namespace may land in the pool."""
        return pool.allows_namespace(namespace) or self.is_binder(namespace)

    def is_binder(self, namespace: str) -> bool:
        return self.binder_namespaces is not None and self.binder_namespaces.matches(namespace)

    def is_vendor_resource(self, name: str) -> bool:
        """A GPU resource: under a vendor domain, a retired GPU resource name, or DRA's
        extended resource of a GPU class the policy knows (or of a near miss of one)."""
        domain, sep, short = name.partition("/")
        if domain == DEVICE_CLASS_RESOURCE_DOMAIN:
            return name in self.resources or self.dra.near_miss(short) is not None
        return bool(sep) and domain in self.vendor_domains or name in self.retired

    @property
    def mutation_applies(self) -> bool:
        """Whether the mutating webhook returns its patch (else it only records it)."""
        return self.mutation_enabled and self.mutation_mode == "Apply"
