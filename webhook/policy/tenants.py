"""What the policy says of each tenant: the namespaces it names (:class:`NamespaceMatcher`), what
they are granted beyond Pod Security baseline (:class:`Grants`) and entitled to
(:class:`Entitlements`). Compiled once by ``webhook.policy.compile``; the request path reads them
through ``webhook.policy.model.Policy``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from webhook.policy.queues import QueueRequirement
from webhook.policy.selectors import LabelSelector


@dataclass(frozen=True, slots=True)
class NamespaceMatcher:
    """Namespace names and fnmatch globs: the plain names as a set, the globs compiled to one
    regular expression (None without a glob). Matched for every template judged: a set
    lookup is a tenth of a regular expression's cost."""

    patterns: tuple[str, ...]
    names: frozenset[str]
    regex: re.Pattern[str] | None = field(compare=False)

    def matches(self, namespace: str) -> bool:
        if namespace in self.names:
            return True
        return self.regex is not None and self.regex.match(namespace) is not None


# Granted to every namespace when a policy has no ``tenants`` block, as they were allowed before
# grants existed: RDMA and NCCL need them (pinned memory, scheduling priority, resource limits).
DEFAULT_GRANTED_CAPABILITIES = ("IPC_LOCK", "SYS_NICE", "SYS_RESOURCE")


@dataclass(frozen=True, slots=True)
class Grants:
    """What a tenant's Pods may do beyond Pod Security baseline on GPU nodes. Never
    ``privileged``, ``hostPID`` or a node-control host path: the policy has no field for the
    first two, and the third is dropped at load (``policy validate`` refuses it).

    ``capabilities``: capability name (upper case, no ``CAP_``) -> the containers it is granted
    to (None: every container). ``annotations``: injection annotation key (NRI, GKE) -> the
    exact values admitted (the value is what the node injects). ``toolkit_variables``: the
    container toolkit's node-shared device variables (``NVIDIA_MOFED``...). ``host_paths``:
    host paths (and below) its Pods may mount. ``dra_admin_access``: its DRA claims may ask
    for admin access to devices (which sees devices other Pods use)."""

    capabilities: MappingProxyType[str, frozenset[str] | None] = field(
        default_factory=lambda: MappingProxyType({})
    )
    host_network: bool = False
    host_ipc: bool = False
    annotations: MappingProxyType[str, frozenset[str]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    toolkit_variables: frozenset[str] = frozenset()
    host_paths: tuple[str, ...] = ()
    dra_admin_access: bool = False

    def allows_annotation(self, key: str, value: object) -> bool:
        """Whether the annotation ``key`` is granted with this exact value."""
        return isinstance(value, str) and value in self.annotations.get(key, ())

    def allows_capability(self, name: str, container: str) -> bool:
        """Whether capability ``name`` (normalised) is granted to ``container``."""
        if name not in self.capabilities:
            return False
        containers = self.capabilities[name]
        return containers is None or container in containers

    def merged(self, other: Grants) -> Grants:
        """Both grants: a namespace that several tenants match gets what each grants."""
        capabilities = dict(self.capabilities)
        for name, containers in other.capabilities.items():
            mine = capabilities.get(name, frozenset())
            if name in capabilities and mine is None or containers is None:
                capabilities[name] = None  # every container
            else:
                capabilities[name] = (mine or frozenset()) | containers
        return Grants(
            MappingProxyType(capabilities),
            self.host_network or other.host_network,
            self.host_ipc or other.host_ipc,
            MappingProxyType(_union_values(self.annotations, other.annotations)),
            self.toolkit_variables | other.toolkit_variables,
            tuple(dict.fromkeys(self.host_paths + other.host_paths)),
            self.dra_admin_access or other.dra_admin_access,
        )


def _union_values(
    mine: Mapping[str, frozenset[str]], theirs: Mapping[str, frozenset[str]]
) -> dict[str, frozenset[str]]:
    merged = dict(mine)
    for key, values in theirs.items():
        merged[key] = merged.get(key, frozenset()) | values
    return merged


NO_GRANTS = Grants()


@dataclass(frozen=True, slots=True)
class Entitlements:
    """What a tenant may use: the declared GPU resources (None: any), the most GPU devices
    per container and per Pod (None: no limit), and the GPU products (None: any)."""

    resources: frozenset[str] | None
    max_per_container: int | None
    max_per_pod: int | None
    # The most of each resource a namespace requests at once: a ResourceQuota's to hold.
    max_gpus: Mapping[str, int] = field(default_factory=dict)
    # The products as the policy names them, and every value the product label takes on
    # their nodes (``webhook.policy.mig.product_label_values``): what a GPU Pod is confined to.
    products: tuple[str, ...] | None = None
    product_values: frozenset[str] = frozenset()
    # The DRA device classes handing out GPUs its claims may ask for (None: any).
    device_classes: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Tenant:
    """A ``tenants`` entry: the namespaces (names or globs), what they are granted, the pools
    they prefer (in order), what they are entitled to, and whom they ask; ``index`` is its
    place in ``spec.tenants``, for messages (-1 for the default grants' entry); ``queue``:
    the queue its GPU workloads must go through (``requirements.queue``). What else an entry
    states is compiled where the request path reads it: the pools it reserves into each
    ``Pool.namespaces`` (``reserved_pools`` stays for the lint), ``binder`` into
    ``Policy.binder_namespaces``, its exemptions and rules into ``Policy.exemptions`` and
    ``Policy.namespace_overrides``."""

    namespaces: NamespaceMatcher  # none named where ``selector`` selects them
    grants: Grants
    pool_preference: tuple[str, ...] = ()
    entitlements: Entitlements | None = None
    contact: str = ""
    index: int = -1
    # ``namespaceSelector``: the namespaces by their labels, as the node inventory's watch on
    # Namespaces knows them (entitlements and requirements only: never grants or exemptions).
    selector: LabelSelector | None = None
    queue: QueueRequirement | None = None
    reserved_pools: tuple[str, ...] = ()

    def matches(self, namespace: str, labels: Mapping[str, str] | None) -> bool:
        """Whether the entry names the namespace, or selects it by ``labels`` (None: not
        known, and then no selector matches it)."""
        if self.selector is not None:
            return labels is not None and self.selector.matches(labels)
        return self.namespaces.matches(namespace)

    def setting(self, field: str) -> str:
        """How a message names one of its settings: ``tenants[2].entitlements (team-*)``."""
        return f"tenants[{self.index}].{field} ({self.named})"

    @property
    def ask(self) -> str:
        """Whom a message tells its users to ask: its ``contact``, else the platform team."""
        return f"ask {self.contact}" if self.contact else "ask the platform team"

    @property
    def named(self) -> str:
        """The namespaces as the entry names them, for messages."""
        if self.selector is not None:
            return f"namespaces selected by {self.selector}"
        return ", ".join(self.namespaces.patterns)
