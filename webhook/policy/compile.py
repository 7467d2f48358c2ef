"""Compiling a checked policy document into ``webhook.policy.model``: done once per load, so that
the request path never parses, validates or looks anything up twice."""

from __future__ import annotations

import datetime
import fnmatch
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from webhook.policy import mig
from webhook.policy.capabilities import capability_name
from webhook.policy.dra import compile_dra, implicit_resources
from webhook.policy.exceptions import PolicyException
from webhook.policy.hostpaths import canonical, unsafe_to_allow
from webhook.policy.model import (
    RULE_IDS,
    DaemonSetName,
    Exemption,
    GpuDefaults,
    NamespaceOverride,
    NodeInventorySwitches,
    Path,
    Policy,
    Pool,
    ResourceSpec,
    RuleMode,
    RuleModes,
    RuleSet,
)
from webhook.policy.names import NearMisses, normalise_host_path
from webhook.policy.queues import (
    DEFAULT_CONTROLLER_USERNAMES,
    KUEUE_QUEUE_LABEL,
    Controllers,
    QueueRequirement,
)
from webhook.policy.selectors import compile_selector
from webhook.policy.tenants import (
    DEFAULT_GRANTED_CAPABILITIES,
    NO_GRANTS,
    Entitlements,
    Grants,
    NamespaceMatcher,
    Tenant,
)
from webhook.policy.workloads import compile_workloads

DEFAULT_RULE_MODES: dict[str, RuleMode] = {"gpuPods": "Enforce", "otherPods": "Audit"}
# --- Compilation ------------------------------------------------------------------------


# What makes an fnmatch pattern more than a plain name.
_GLOB = re.compile(r"[*?\[]")


def _namespaces(patterns: list[str]) -> NamespaceMatcher:
    names = frozenset(p for p in patterns if not _GLOB.search(p))
    globs = [p for p in patterns if p not in names]
    regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in globs)) if globs else None
    return NamespaceMatcher(patterns=tuple(patterns), names=names, regex=regex)


def _resource(raw: dict[str, Any], defaults: ResourceSpec | None = None) -> ResourceSpec:
    """A resource declaration; a pool's inherits the cluster-wide one's per-Pod limits."""
    return ResourceSpec(
        name=raw["name"],
        sharing=raw["sharing"],
        per_node=raw.get("perNode"),
        max_per_pod=raw.get("maxPerPod", defaults.max_per_pod if defaults else None),
        fail_requests_greater_than_one=raw.get(
            "failRequestsGreaterThanOne",
            defaults.fail_requests_greater_than_one if defaults else False,
        ),
    )


def _rule_modes(base: Mapping[str, RuleModes], ruleset: dict[str, Any]) -> RuleSet:
    """``ruleset``'s modes over ``base``. Its ``default`` changes the mode of rules that are
    on; a rule (or scope) that is Off in ``base`` comes back only where ``ruleset`` names it,
    so a namespace override's default never re-enables what the policy turned off."""
    default = ruleset.get("default", {})
    out: dict[str, RuleModes] = {}
    for rule in RULE_IDS:
        current = base[rule]
        named = ruleset.get(rule, {})
        entry = {**default, **named}
        if entry.get("enabled") is False:
            out[rule] = RuleModes("Off", "Off", "Off")
            continue
        out[rule] = RuleModes(
            _scope_mode(entry, named, "gpuPods", current.gpu_pods) or current.gpu_pods,
            _scope_mode(entry, named, "otherPods", current.other_pods) or current.other_pods,
            _scope_mode(entry, named, "reachablePods", current.reachable_pods),
        )
    return RuleSet(out)


def allowed_host_paths(paths: list[str]) -> tuple[str, ...]:
    """The allowed host paths a policy lists, canonical, without those that touch a
    node-control path (``policy validate`` refuses them; at load they are dropped, and the
    paths they would have covered are refused)."""
    return tuple(canonical(p) for p in paths if unsafe_to_allow(p) is None)


def _grants(raw: dict[str, Any]) -> Grants:
    capabilities: dict[str, frozenset[str] | None] = {}
    for item in raw.get("capabilities", []):
        if isinstance(item, str):
            capabilities[capability_name(item)] = None
        else:
            name = capability_name(item["name"])
            earlier = capabilities.get(name, frozenset())
            if earlier is not None:
                capabilities[name] = earlier | frozenset(item["containers"])
    return Grants(
        capabilities=MappingProxyType(capabilities),
        host_network=raw.get("hostNetwork", False),
        host_ipc=raw.get("hostIPC", False),
        annotations=MappingProxyType(
            {a["key"]: frozenset(a["values"]) for a in raw.get("annotations", [])}
        ),
        toolkit_variables=frozenset(raw.get("toolkitVariables", [])),
        host_paths=allowed_host_paths(raw.get("hostPaths", [])),
        dra_admin_access=raw.get("draAdminAccess", False),
    )


def _exception(raw: dict[str, Any]) -> PolicyException:
    selector = raw["match"].get("selector")
    return PolicyException(
        name=raw["name"],
        owner=raw["owner"],
        expires=expiry(raw["expires"]),
        expires_text=raw["expires"],
        namespace=raw["namespace"],
        names=frozenset(raw["match"].get("names", ())),
        selector=compile_selector(selector) if selector is not None else None,
        rules=frozenset(raw["rules"]),
        reason=raw.get("reason", ""),
    )


def expiry(text: str) -> float:
    """When an exception's ``expires`` ends it (seconds since the epoch): a date lasts
    through that day, UTC. ``ValueError`` for one that is no date (the schema checks only
    its shape: month 13)."""
    if "T" not in text:
        day = datetime.date.fromisoformat(text)
        return datetime.datetime.combine(
            day + datetime.timedelta(days=1), datetime.time(), tzinfo=datetime.UTC
        ).timestamp()
    return datetime.datetime.fromisoformat(text).timestamp()


def _entitlements(raw: dict[str, Any], catalogue: Mapping[str, Any]) -> Entitlements:
    products = raw.get("products")
    return Entitlements(
        frozenset(raw["resources"]) if "resources" in raw else None,
        raw.get("maxGPUsPerContainer"),
        raw.get("maxGPUsPerPod"),
        MappingProxyType(dict(raw.get("maxGPUs", {}))),
        tuple(products) if products is not None else None,
        frozenset(
            value
            for product in products or ()
            for value in mig.product_label_values(product, catalogue)
        ),
        frozenset(raw["deviceClasses"]) if "deviceClasses" in raw else None,
    )


def _queue(raw: dict[str, Any]) -> QueueRequirement:
    return QueueRequirement(
        raw.get("label", KUEUE_QUEUE_LABEL),
        frozenset(raw["queues"]) if "queues" in raw else None,
        frozenset(raw.get("schedulerNames", ())),
    )


def _controllers(raw: dict[str, Any]) -> Controllers:
    """``spec.controllers``: its users and groups, with the built-in ones unless
    ``includeDefaults`` is false."""
    defaults = DEFAULT_CONTROLLER_USERNAMES if raw.get("includeDefaults", True) else ()
    return Controllers(
        frozenset((*defaults, *raw.get("usernames", ()))), frozenset(raw.get("groups", ()))
    )


def _tenants(
    spec: dict[str, Any], catalogue: Mapping[str, Any], matchers: list[NamespaceMatcher]
) -> tuple[Tenant, ...]:
    """The tenants entries; while none of them states grants, every namespace keeps the
    default grants (a tenants block written for pool preferences takes nothing away). An
    empty block grants nothing: that is how the defaults are taken away."""
    tenants = tuple(
        Tenant(
            matchers[i],
            _grants(t["grants"]) if "grants" in t else NO_GRANTS,
            tuple(t.get("poolPreference", ())),
            _entitlements(t["entitlements"], catalogue) if "entitlements" in t else None,
            t.get("contact", ""),
            i,
            compile_selector(t["namespaceSelector"]) if "namespaceSelector" in t else None,
            queue=_queue(t["requirements"]["queue"])
            if "queue" in t.get("requirements", {})
            else None,
            reserved_pools=tuple(t.get("reservedPools", ())),
        )
        for i, t in enumerate(spec.get("tenants", ()))
    )
    if spec.get("tenants") == [] or any("grants" in t for t in spec.get("tenants", ())):
        return tenants
    default = {"capabilities": list(DEFAULT_GRANTED_CAPABILITIES)}
    return (*tenants, Tenant(_namespaces(["*"]), _grants(default)))


def _pool_namespaces(
    pool: dict[str, Any], spec: dict[str, Any], matchers: list[NamespaceMatcher]
) -> NamespaceMatcher | None:
    """The namespaces a pool is reserved for: its own ``namespaces`` (the field before
    ``tenants[].reservedPools``) and those of every tenants entry that names it; None (open to
    every namespace) where nothing reserves it."""
    patterns = list(pool.get("namespaces", ()))
    for i, tenant in enumerate(spec.get("tenants", ())):
        if pool["name"] in tenant.get("reservedPools", ()):
            patterns += matchers[i].patterns
    return _namespaces(list(dict.fromkeys(patterns))) if patterns else None


def _binder_namespaces(
    spec: dict[str, Any], matchers: list[NamespaceMatcher]
) -> NamespaceMatcher | None:
    """``binderNamespaces`` (the field before ``tenants[].binder``) and the namespaces of every
    tenants entry with ``binder: true``."""
    patterns = list(spec.get("binderNamespaces", ()))
    for i, tenant in enumerate(spec.get("tenants", ())):
        if tenant.get("binder"):
            patterns += matchers[i].patterns
    return _namespaces(list(dict.fromkeys(patterns))) if patterns else None


def _overrides(
    spec: dict[str, Any], rules: RuleSet, matchers: list[NamespaceMatcher]
) -> tuple[NamespaceOverride, ...]:
    """The rule modes per namespace, in the order they are consulted (the first match wins):
    ``namespaceOverrides`` (the field before ``tenants[].rules``), then the tenants entries
    that state rules."""
    overrides = [
        NamespaceOverride(
            _namespaces(o["namespaces"]),
            _rule_modes(rules, o["rules"]),
            ("spec", "namespaceOverrides", i),
        )
        for i, o in enumerate(spec.get("namespaceOverrides", ()))
    ]
    overrides += [
        NamespaceOverride(matchers[i], _rule_modes(rules, t["rules"]), ("spec", "tenants", i))
        for i, t in enumerate(spec.get("tenants", ()))
        if "rules" in t
    ]
    return tuple(overrides)


def _exemption(raw: dict[str, Any], namespaces: NamespaceMatcher, path: Path) -> Exemption:
    return Exemption(
        namespaces=namespaces,
        service_accounts=frozenset(raw["serviceAccounts"]) if "serviceAccounts" in raw else None,
        rules=frozenset(raw["rules"]) if "rules" in raw else None,
        path=path,
    )


def _exemptions(spec: dict[str, Any], matchers: list[NamespaceMatcher]) -> tuple[Exemption, ...]:
    """``exemptions`` (the field before ``tenants[].exemptions``), then the tenants'."""
    exemptions = [
        _exemption(e, _namespaces(e["namespaces"]), ("spec", "exemptions", i))
        for i, e in enumerate(spec.get("exemptions", ()))
    ]
    exemptions += [
        _exemption(e, matchers[i], ("spec", "tenants", i, "exemptions", j))
        for i, t in enumerate(spec.get("tenants", ()))
        for j, e in enumerate(t.get("exemptions", ()))
    ]
    return tuple(exemptions)


def _gpu_defaults(raw: dict[str, Any], pools: tuple[Pool, ...]) -> GpuDefaults:
    deadlines = raw.get("activeDeadlineSeconds", {})
    shared_memory = raw.get("sharedMemory", {})
    runtime_class = raw.get("runtimeClassName")
    priority_class = raw.get("priorityClassName")
    job_deadline = deadlines.get("jobs")
    return GpuDefaults(
        runtime_class=runtime_class,
        priority_class=priority_class,
        bare_pod_deadline=deadlines.get("barePods"),
        job_deadline=job_deadline,
        shared_memory=shared_memory.get("enabled", False),
        shared_memory_size=shared_memory.get("sizeLimit"),
        for_workloads=bool(
            runtime_class
            or priority_class
            or job_deadline
            or any(p.runtime_class or p.priority_class for p in pools)
        ),
    )


def _scope_mode(
    entry: dict[str, Any], named: dict[str, Any], key: str, current: RuleMode | None
) -> RuleMode | None:
    """One scope's mode: ``entry``'s over ``current``, but Off stays Off unless named."""
    if current == "Off" and key not in named:
        return "Off"
    return entry.get(key, current)


def _hard_taints(taints: list[Any]) -> tuple[MappingProxyType[str, Any], ...]:
    """The taints that keep Pods off a node: PreferNoSchedule only discourages."""
    return tuple(_frozen(t) for t in taints if t["effect"] in ("NoSchedule", "NoExecute"))


def _frozen(mapping: dict[str, Any]) -> MappingProxyType[str, Any]:
    return MappingProxyType({k: tuple(v) if isinstance(v, list) else v for k, v in mapping.items()})


def compile_policy(doc: dict[str, Any], source: str, digest: str) -> Policy:
    """The compiled policy of a document that passed the schema and the lint."""
    spec = doc["spec"]
    mig_spec = spec.get("migCatalogue", {})
    catalogue = mig.catalogue_with(mig_spec.get("customProducts", []))
    products = mig_spec.get("products", ["*"])
    # Each tenants entry's namespaces, compiled once for what it states (none named where a
    # namespaceSelector selects them: such an entry states nothing compiled with these).
    matchers = [_namespaces(t.get("namespaces", [])) for t in spec.get("tenants", ())]
    tenants = _tenants(spec, catalogue, matchers)
    profile_counts = mig.catalogued_profiles(catalogue, products)

    resources_ = {r["name"]: _resource(r) for r in spec.get("resources", [])}
    dra = compile_dra(spec.get("dra", {}))
    # DRA's extended resources of the GPU classes (deviceclass.resource.kubernetes.io/<class>)
    # are GPU resources like the device plugin's: declared, counted and given their sharing.
    for name, sharing in implicit_resources(dra).items():
        resources_.setdefault(name, ResourceSpec(name, sharing))  # type: ignore[arg-type]
    pools = tuple(
        Pool(
            name=p["name"],
            node_selector=MappingProxyType(dict(p["nodeSelector"])),
            resources=MappingProxyType(
                {r["name"]: _resource(r, resources_.get(r["name"])) for r in p["resources"]}
            ),
            gpus_per_node=p.get("gpusPerNode"),
            taints=tuple(_frozen(t) for t in p.get("taints", [])),
            preferred_affinity=tuple(
                MappingProxyType(
                    {
                        "weight": a["weight"],
                        "matchExpressions": tuple(_frozen(e) for e in a["matchExpressions"]),
                    }
                )
                for a in p.get("preferredAffinity", [])
            ),
            require_node_affinity=p.get("requireNodeAffinity", True),
            namespaces=_pool_namespaces(p, spec, matchers),
            runtime_class=p.get("runtimeClassName"),
            priority_class=p.get("priorityClassName"),
            device_classes=frozenset(p.get("deviceClasses", ())),
        )
        for p in spec.get("pools", [])
    )
    builtin = {
        r: RuleModes(DEFAULT_RULE_MODES["gpuPods"], DEFAULT_RULE_MODES["otherPods"])
        for r in RULE_IDS
    }
    rules = _rule_modes(builtin, spec.get("rules", {}))
    overrides = _overrides(spec, rules, matchers)
    exemptions = _exemptions(spec, matchers)
    workloads = compile_workloads(spec)
    domains = tuple(spec.get("vendorDomains", ["nvidia.com"]))
    declared = set(resources_)
    for pool in pools:
        declared.update(pool.resources)
    for domain in domains:
        for profile in profile_counts:
            declared.add(f"{domain}/mig-{profile}")
            declared.add(f"{domain}/mig-{profile}.shared")
    mutation = spec.get("mutation", {})
    classes = [_hard_taints(spec.get("gpuNodeTaints", []))] if spec.get("gpuNodeTaints") else []
    classes += [_hard_taints(p.get("taints", [])) for p in spec.get("pools", [])]
    # Sound by default: with no GPU node taint declared, nothing keeps any Pod off GPU nodes.
    every_pod_reaches = not spec.get("gpuNodesTainted", True) or not classes or not all(classes)
    host_devices = spec.get("hostDevices", {})
    inventory_use = spec.get("nodeInventory", {})
    exceptions = tuple(_exception(e) for e in spec.get("exceptions", []))
    return Policy(
        name=doc["metadata"]["name"],
        source=source,
        sha256=digest,
        vendor_domains=domains,
        resources=MappingProxyType(resources_),
        unknown_resources=spec.get("unknownResources", "Warn"),
        mig_products=tuple(products),
        mig_profiles=frozenset(profile_counts),
        mig_catalogue=MappingProxyType(
            {product: frozenset(profiles) for product, profiles in catalogue.items()}
        ),
        mig_profile_counts=MappingProxyType(profile_counts),
        mig_sizes=mig.plain_sizes(frozenset(profile_counts)),
        uncatalogued_mig=mig_spec.get("uncataloguedProfiles", "Warn"),
        pools=pools,
        gpu_node_taints=tuple(_frozen(t) for t in spec.get("gpuNodeTaints", [])),
        gpu_node_classes=() if every_pod_reaches else tuple(classes),
        every_pod_reaches_gpu_nodes=every_pod_reaches,
        gpu_nodes_tainted=spec.get("gpuNodesTainted", True),
        host_device_paths=tuple(normalise_host_path(p) for p in host_devices.get("paths", [])),
        host_path_allow_list=allowed_host_paths(host_devices["allowedPaths"])
        if "allowedPaths" in host_devices
        else None,
        inject_void=spec.get("deviceVisibility", {}).get("injectVoid", False),
        mutation_enabled=mutation.get("enabled", True),
        mutation_mode=mutation.get("mode", "Apply"),
        rules=rules,
        namespace_overrides=overrides,
        exemptions=exemptions,
        workloads=workloads,
        declared_names=frozenset(declared),
        companion_names=frozenset(spec.get("companionResources", [])),
        near_misses=NearMisses(declared),
        binder_namespaces=_binder_namespaces(spec, matchers),
        gpu_label_keys=frozenset(k for pool in pools for k in pool.node_selector),
        gpu_taint_keys=frozenset(
            [t["key"] for t in spec.get("gpuNodeTaints", [])]
            + [t["key"] for pool in pools for t in pool.taints]
        ),
        pooled_names=frozenset(
            name for pool in pools for name in (*pool.resources, *pool.device_classes)
        ),
        has_reserved_pools=any(pool.namespaces is not None for pool in pools),
        exempted_names=frozenset(name for e in exemptions for name in e.namespaces.names),
        exempts_by_glob=any(e.namespaces.regex is not None for e in exemptions),
        tenants=tenants,
        namespace_label_keys=frozenset(
            key
            for tenant in tenants
            if tenant.selector is not None
            for key in tenant.selector.keys()
        ),
        requires_queues=any(t.queue is not None for t in tenants),
        controllers=_controllers(spec.get("controllers", {})),
        new_checks=spec.get("newChecks", "Warn"),
        exceptions=exceptions,
        excepted_namespaces=frozenset(e.namespace for e in exceptions),
        node_inventory=NodeInventorySwitches(
            advertised_names=inventory_use.get("advertisedNames", True),
            observed_node_sizes=inventory_use.get("observedNodeSizes", True),
            node_name=inventory_use.get("nodeName", True),
        ),
        gpu_defaults=_gpu_defaults(mutation.get("gpuDefaults", {}), pools),
        dra=dra,
        device_plugin_daemonsets=tuple(
            DaemonSetName(d["namespace"], d["name"]) for d in spec.get("devicePluginDaemonSets", [])
        ),
        retired=MappingProxyType(
            {
                r["name"]: (r["replacement"], r.get("reason", ""))
                for r in spec.get("retiredResources", [])
            }
        ),
    )
