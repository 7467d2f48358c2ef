"""The lint of how a policy judges who: rule modes that deny more than they seem to,
exceptions that lift more than they seem to, entitlements to names it does not declare, queue
requirements that ask every controller's Pods again or ask nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.policy.lines import LineFinder
from webhook.policy.mig import GPU_PRODUCT, catalogued_as, gfd_product
from webhook.policy.model import SECURITY_RULES, Policy, RuleSet
from webhook.policy.tenants import Tenant

# What product names start with in GPU feature discovery's label (the driver's name).
_MAKERS = ("NVIDIA-", "TESLA-", "QUADRO-")

Report = Callable[[list[Any], str], None]


def reachable_pods_warnings(policy: Policy, lines: LineFinder, warn: Report) -> None:
    """An unset ``reachablePods`` follows ``gpuPods``: where a policy writes ``gpuPods:
    Enforce`` for a security rule (or its default) and never names ``reachablePods``, node
    agents (DaemonSets that reach every node through a wildcard toleration: CNI, CSI,
    node-exporter, logging) are denied on GPU nodes, which examples copied without a thought
    do. Said once for the policy's rules, and for a namespace override only where the
    policy's own do not say it already. (A policy that writes no modes gets the built-in
    ones, which deny there too, and says nothing it could have meant otherwise.) A tenants
    entry's ``rules`` are a namespace override too."""
    layers: list[tuple[list[Any], RuleSet]] = [(["spec", "rules"], policy.rules)]
    layers += [
        ([*override.path, "rules"], override.rules) for override in policy.namespace_overrides
    ]
    said: set[str] = set()
    for path, rules in layers:
        following = sorted(
            rule
            for rule in SECURITY_RULES
            if rules[rule].reachable_pods is None
            and rules[rule].gpu_pods == "Enforce"
            and (lines.has([*path, "default", "gpuPods"]) or lines.has([*path, rule, "gpuPods"]))
        )
        if not following or said.issuperset(following):
            continue
        said.update(following)
        warn(
            path,
            "reachablePods is unset, so it follows gpuPods: Pods that reach GPU nodes only "
            "through a wildcard toleration, as node agents' DaemonSets do (CNI, CSI, "
            f"node-exporter, logging), are denied by {_rules_named(following)} unless their "
            "namespaces are exempt; set reachablePods: Warn (as the default policy does), or "
            "Enforce to say that is meant",
        )


def _rules_named(rules: list[str]) -> str:
    return "every security rule" if set(rules) == SECURITY_RULES else ", ".join(rules)


def exception_notes(policy: Policy, inform: Report) -> None:
    """An exception that lifts a security rule lifts all of it: say what that gives."""
    for i, exception in enumerate(policy.exceptions):
        lifted = sorted(exception.rules & SECURITY_RULES)
        if lifted:
            inform(
                ["spec", "exceptions", i],
                f"exception {exception.name!r} lifts {', '.join(lifted)} whole for what it "
                f"matches in namespace {exception.namespace!r}: those Pods may do all these "
                "rules refuse (privileged, host paths, node-control paths) on the GPU nodes "
                "they reach, until it expires; it trusts whoever may create Pods there with "
                "those names or labels",
            )


def entitlement_warnings(policy: Policy, warn: Report) -> None:
    """An entitlement that lists a name the policy does not declare entitles to nothing: the
    entitlement rule judges declared GPU resources only. A product written with a suffix
    feature discovery adds names one form of it (and its own forms), not the product."""
    for tenant in policy.tenants:
        entitled = tenant.entitlements
        for name in sorted(entitled.resources or ()) if entitled is not None else ():
            if name not in policy.declared_names:
                warn(
                    ["spec", "tenants", tenant.index, "entitlements", "resources"],
                    f"{name} is not a GPU resource this policy declares, so no Pod is "
                    "entitled to it by this entry: declare it (resources, a pool, the MIG "
                    "catalogue) or correct the name",
                )
        for product in entitled.products or () if entitled is not None else ():
            bare = gfd_product(product)
            # The catalogue's own names (H100-80GB) are not labels: the driver's names are.
            entry = catalogued_as(bare, None, policy.mig_catalogue)
            labelled = entry is not None and entry.upper() != bare.name.upper()
            if not labelled and not product.upper().startswith(_MAKERS):
                warn(
                    ["spec", "tenants", tenant.index, "entitlements", "products"],
                    f"{product} does not look like a product GPU feature discovery labels "
                    "(NVIDIA-H100-80GB-HBM3; A100-SXM4-40GB from drivers before R470): a name "
                    "no node carries keeps the tenant's GPU Pods pending; see kubectl get "
                    "nodes -L nvidia.com/gpu.product",
                )
            elif bare.name != product:
                warn(
                    ["spec", "tenants", tenant.index, "entitlements", "products"],
                    f"{product} is a form of {bare.name} (GPU feature discovery adds "
                    "-MIG-<profile> and -SHARED to the product label): name the product, "
                    f"{bare.name}, and every form of it is allowed",
                )
        _lint_pools_of_other_products(policy, tenant, warn)


def _lint_pools_of_other_products(policy: Policy, tenant: Tenant, warn: Report) -> None:
    """A pool the entry prefers or reserves for itself that selects another product by its
    label: its Pods are sent there and kept to their products, and pend forever."""
    entitled = tenant.entitlements
    if entitled is None or entitled.products is None:
        return
    named = dict.fromkeys((*tenant.pool_preference, *tenant.reserved_pools))
    for pool in policy.pools:
        selected = pool.node_selector.get(GPU_PRODUCT)
        if pool.name in named and selected is not None and selected not in entitled.product_values:
            warn(
                ["spec", "tenants", tenant.index, "entitlements", "products"],
                f"pool {pool.name!r}, which this entry prefers or reserves, selects "
                f"{GPU_PRODUCT}={selected}, not one of these products: the Pods sent there "
                "are also kept to these products and can never be scheduled; add the pool's "
                "product, or send the tenant to another pool",
            )


# The Job controller's identities: with neither a controller, a Job's Pods are asked again.
_JOB_CONTROLLER = (
    "system:serviceaccount:kube-system:job-controller",
    "system:kube-controller-manager",
)


# Groups every user, or every service account, is in.
_EVERYONE = frozenset({"system:authenticated", "system:unauthenticated", "system:serviceaccounts"})


def queue_warnings(policy: Policy, warn: Report) -> None:
    """A queue requirement without kube-controller-manager among the controllers refuses the
    Pods of every queued Job (they do not carry the Job's label); one that accepts
    ``default-scheduler`` asks nothing of a Pod that names no scheduler."""
    if not policy.requires_queues:
        return
    if not any(policy.controllers.include(name, None) for name in _JOB_CONTROLLER):
        warn(
            ["spec", "controllers"],
            "kube-controller-manager is no controller here, so the Pods it creates from a "
            "queued Job or Deployment are asked for a queue again and refused (they do not "
            "carry their workload's label): list system:serviceaccount:kube-system:job-controller "
            "and the other controllers' accounts, or leave includeDefaults true",
        )
    for group in sorted(policy.controllers.groups & _EVERYONE):
        warn(
            ["spec", "controllers", "groups"],
            f"every user in {group} would be a controller, so nothing they create is asked "
            "for a queue: list the controllers' own service accounts instead",
        )
    for tenant in policy.tenants:
        names = sorted(tenant.queue.scheduler_names) if tenant.queue is not None else []
        if "default-scheduler" in names:
            warn(
                ["spec", "tenants", tenant.index, "requirements", "queue", "schedulerNames"],
                "default-scheduler schedules every Pod that names no scheduler and queues "
                "none: with it listed, the requirement asks nothing; list only batch schedulers "
                "that queue Pods (kai-scheduler, volcano)",
            )
