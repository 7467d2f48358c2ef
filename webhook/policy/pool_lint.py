"""The lint of a policy's pools as one tenant meets them: pools whose nodes can overlap yet
give a resource different sharing modes (a node runs one device-plugin configuration), and
pools one tenant may use that offer a resource in different modes with nothing to say which
(every Pod asking for it would be denied as ambiguous)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.policy.model import Policy, Pool

Report = Callable[[list[Any], str], None]


def pool_warnings(policy: Policy, warn: Report) -> None:
    """Both lints of the pools, as ``webhook.policy.lint.warnings`` reports them."""
    _lint_pool_overlap(policy, warn)
    _lint_unresolved_sharing(policy, warn)


def _lint_pool_overlap(policy: Policy, warn: Report) -> None:
    pools = policy.pools
    for j, later in enumerate(pools):
        for earlier in pools[:j]:
            a, b = set(earlier.node_selector.items()), set(later.node_selector.items())
            if not (a <= b or b <= a):
                continue  # some label has different values in the two: no node has both
            overlap = (
                "equal nodeSelectors"
                if a == b
                else f"every node of pool {later.name!r} also matches pool {earlier.name!r}"
                if a <= b
                else f"every node of pool {earlier.name!r} also matches pool {later.name!r}"
            )
            for k, (name, spec) in enumerate(later.resources.items()):
                other = earlier.resources.get(name)
                if other is not None and other.sharing != spec.sharing:
                    warn(
                        ["spec", "pools", j, "resources", k, "sharing"],
                        f"pools {earlier.name!r} and {later.name!r} can select the same nodes "
                        f"({overlap}) but declare {name} as {other.sharing} and {spec.sharing}: "
                        "a node runs one device-plugin configuration, so one of them is wrong "
                        "for it; make the nodeSelectors exclusive (one label key with "
                        "different values)",
                    )


# Stands for a namespace no pattern of the policy names (no namespace is called this).
_ANY_OTHER_NAMESPACE = "\x00"


def _lint_unresolved_sharing(policy: Policy, warn: Report) -> None:
    """Pools one tenant may use that offer a resource with different sharing modes, with no
    preference to say which: every Pod that asks for it and does not choose a pool itself is
    denied as ambiguous (the device plugin's own nvidia.com/gpu on a time-sliced pool beside
    an exclusive one). Pools whose nodes can overlap are ``_lint_pool_overlap``'s."""
    probes: dict[str, None] = {_ANY_OTHER_NAMESPACE: None}
    for matcher in [p.namespaces for p in policy.pools] + [t.namespaces for t in policy.tenants]:
        for pattern in matcher.patterns if matcher is not None else ():
            probes.setdefault(pattern, None)
    unresolved: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for namespace in probes:
        allowed = [p for p in policy.pools if policy.may_use(p, namespace)]
        preference = set(policy.pool_preference(namespace))
        for name in dict.fromkeys(n for p in allowed for n in p.resources):
            offering = [p for p in allowed if name in p.resources]
            if len({p.resources[name].sharing for p in offering}) < 2:
                continue
            if preference & {p.name for p in offering} or _nodes_overlap(offering):
                continue
            label = "every namespace" if namespace == _ANY_OTHER_NAMESPACE else namespace
            unresolved.setdefault((name, tuple(p.name for p in offering)), []).append(label)
    for (name, pool_names), who in unresolved.items():
        pools = [p for p in policy.pools if p.name in pool_names]
        last = policy.pools.index(pools[-1])
        described = ", ".join(f"{p.name} ({p.resources[name].sharing})" for p in pools)
        warn(
            ["spec", "pools", last, "resources", list(pools[-1].resources).index(name)],
            f"pools {described} all offer {name} to {', '.join(who)}, and nothing says which: "
            "every Pod that asks for it without a pool annotation, nodeSelector or node "
            "affinity of its own is denied as ambiguous; give the tenants a poolPreference, or "
            "have the shared pool's device plugin rename its replicas (nvidia.com/gpu.shared)",
        )


def _nodes_overlap(pools: list[Pool]) -> bool:
    """Whether some two of the pools can select the same node (one's labels within the
    other's)."""
    labels = [set(p.node_selector.items()) for p in pools]
    return any(a <= b or b <= a for i, a in enumerate(labels) for b in labels[i + 1 :])
