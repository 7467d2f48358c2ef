"""The tenants a starting policy drafts (``policy init --from-cluster``): a poolPreference for
every namespace where pools offer a resource in different sharing modes, and, commented out, the
node agents' namespaces as an exemption and a tenant to start from."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from webhook.core.inventory import gpu_product
from webhook.operations.daemonset_drafts import SeenDaemonSet
from webhook.operations.draft_text import comment, flow, yaml_scalar
from webhook.operations.pool_drafts import PoolDraft, PoolPlan
from webhook.policy.model import Policy

AGENT_REASON = "Node agents that run on every node, GPU nodes included."

# The order a Pod that chooses no pool is placed in, where pools share a resource differently:
# whole GPUs first.
SHARING_ORDER = ("Exclusive", "MIG", "MPS", "TimeSlicing", "MIGTimeSlicing")


def preference(plan: PoolPlan) -> str:
    """A tenant of every namespace whose poolPreference places a Pod that chooses no pool,
    where pools offer what it asks for in different sharing modes (a Pod would otherwise be
    denied as ambiguous): whole GPUs first, the pool of most nodes first among alike."""
    offering: dict[str, list[tuple[str, PoolDraft]]] = {}
    for draft in plan.pools:
        for resource in draft.resources:
            offering.setdefault(resource.name, []).append((resource.sharing, draft))
    ambiguous = {
        draft
        for found in offering.values()
        if len({mode for mode, _ in found}) > 1
        for _, draft in found
    }
    # A pool tainted beyond what every pool carries is dedicated: never a Pod's by default.
    shared_taints = set(plan.pools[0].taints) if plan.pools else set()
    for draft in plan.pools[1:]:
        shared_taints &= set(draft.taints)
    ambiguous = {d for d in ambiguous if set(d.taints) <= shared_taints}
    if not ambiguous:
        return ""

    def rank(draft: PoolDraft) -> tuple[int, int, str]:
        best = min(SHARING_ORDER.index(r.sharing) for r in draft.resources)
        return best, -len(draft.nodes), draft.name

    ordered = sorted(ambiguous, key=rank)
    shared = sorted(
        name for name, found in offering.items() if len({mode for mode, _ in found}) > 1
    )
    lines = comment(
        f"Guessed: pools offer {', '.join(shared)} in different sharing modes, so a Pod that "
        "asks for it and chooses no pool (nodeSelector, node affinity, the gpu-admission.io/pool "
        f"annotation) would be denied as ambiguous: it goes to pool {ordered[0].name} (whole "
        "GPUs first, then the pool of most nodes), the first of this preference that offers "
        "it. Reorder it, or give tenants a poolPreference of their own above this entry.",
        4,
    )
    lines += '    - namespaces: ["*"]\n'
    lines += f"      poolPreference: {flow([d.name for d in ordered])}\n"
    return lines


def tenant_example(plan: PoolPlan) -> str:
    """A tenant to start from, commented out: a team kept to the first pool's product (to its
    pool where the policy cannot name the product)."""
    if not plan.pools:
        return comment(
            "Tenants are yours to write: who may use which GPUs, whom they ask "
            "(entitlements, reservedPools once pools are declared).",
            4,
        )
    first = next((p for p in plan.pools if gpu_product(p.nodes[0]) is not None), plan.pools[0])
    resource = first.resources[0].name
    lines = comment(
        "Tenants are yours to write: who may use which GPUs, whom they ask. For example, a team "
        f"kept to the GPUs of pool {first.name}:",
        4,
    )
    lines += "    # - namespaces: [team-a-*]\n"
    lines += '    #   contact: "#team-a-gpus"\n'
    lines += "    #   entitlements:\n"
    product = gpu_product(first.nodes[0])
    if product is not None:
        lines += f"    #     products: [{yaml_scalar(product.name)}]\n"
    lines += f"    #     maxGPUs: {{{yaml_scalar(resource)}: 8}}\n"
    lines += f"    #   reservedPools: {flow([first.name])}\n"
    return lines


def agents_block(agents: Sequence[SeenDaemonSet], base: Policy) -> str:
    """The namespaces of the DaemonSets that tolerate every taint: those the policy exempts
    already named, the others proposed as an exemption, commented out."""
    by_namespace: dict[str, list[str]] = {}
    for agent in sorted(agents, key=lambda a: (a.namespace, a.name)):
        by_namespace.setdefault(agent.namespace, []).append(agent.name)
    exempt = {
        ns
        for ns in by_namespace
        if any(
            e.namespaces.matches(ns) and e.rules is None and e.service_accounts is None
            for e in base.exemptions
        )
    }
    proposed = [ns for ns in by_namespace if ns not in exempt]

    def listed(namespaces: Iterable[str]) -> str:
        return "; ".join(f"{ns} ({', '.join(by_namespace[ns])})" for ns in namespaces)

    if not by_namespace:
        return comment(
            "Found: no DaemonSet that tolerates every taint (operator: Exists without a key): "
            "no node agent to exempt.",
            4,
        )
    said = (
        "Found: DaemonSets that tolerate every taint (operator: Exists without a key), whose "
        "Pods run on GPU nodes too."
    )
    if exempt:
        said += f" Exempt above already: {listed(sorted(exempt))}."
    if not proposed:
        return comment(said, 4)
    said += (
        f" Not exempt, and warned (not denied) under this policy: {listed(proposed)}. An "
        "exemption trusts everyone who may create Pods in its namespaces: uncomment it "
        "knowingly."
    )
    lines = comment(said, 4)
    lines += "    # - namespaces:\n"
    lines += "".join(f"    #     - {yaml_scalar(ns)}\n" for ns in proposed)
    lines += f"    #   exemptions:\n    #     - reason: {AGENT_REASON}\n"
    return lines
