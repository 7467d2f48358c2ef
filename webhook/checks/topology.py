"""A Pod must fit on one node.

Restricted: a Pod whose effective request of a GPU resource exceeds what the largest node of
its pool offers, or the policy's per-Pod maximum. The largest node is the larger of the
declared size (``gpusPerNode``, ``perNode``) and, with the node inventory, the largest capacity
a node of the pool lists; a size the inventory alone knows gives a warning at most. The
effective request is what the scheduler reserves: the larger of the largest init container
(plus the sidecars started before it) and the sum of the app containers and sidecar init
containers (``restartPolicy: Always``). The scheduler never splits a request across nodes, so
such a Pod pends forever. Allowed: requests within both bounds, and resources whose bounds the
policy does not know.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView, effective_requests
from webhook.core.pools import resource_spec, select_pool
from webhook.policy import mig
from webhook.policy.model import Policy
from webhook.policy.quantity import Quantity

RULE = "topology"


def _node_capacity(view: PodView, policy: Policy, name: str) -> tuple[Quantity, str, bool] | None:
    """The most of ``name`` one node of the Pod's candidate pools offers: (capacity, which
    node, whether only the node inventory knows it). The larger of the declared and the
    observed size; a node that does not list the resource tells nothing."""
    selection = select_pool(view, policy)
    nodes = view.nodes if policy.node_inventory.observed_node_sizes else None
    best: tuple[Quantity, str] | None = None
    declared_any = False
    for pool in selection.pools:
        spec = pool.resources.get(name)
        if spec is None:
            continue
        capacity = spec.per_node
        if capacity is None and pool.gpus_per_node is not None:
            short = name.partition("/")[2]
            if spec.sharing == "Exclusive":
                capacity = pool.gpus_per_node
            elif spec.sharing == "MIG" and short.startswith(mig.MIG_PREFIX):
                profile = mig.base_profile(short[len(mig.MIG_PREFIX) :])
                per_gpu = policy.mig_profile_counts.get(profile)
                capacity = per_gpu * pool.gpus_per_node if per_gpu else None
        if capacity is not None:
            declared_any = True
            if best is None or capacity > best[0]:
                best = (capacity, f"the largest node of pool {quote(pool.name)}")
        seen = nodes.largest(policy, pool, name) if nodes is not None else None
        if seen is not None and (best is None or seen[0] > best[0]):
            best = (seen[0], f"node {quote(seen[1])}, the largest of pool {quote(pool.name)}")
    if not selection.pools:
        spec = policy.resources.get(name)
        if spec is not None and spec.per_node is not None:
            declared_any = True
            best = (spec.per_node, "the largest node")
        seen = nodes.largest(policy, None, name) if nodes is not None else None
        if seen is not None and (best is None or seen[0] > best[0]):
            where = "in no pool" if policy.pools else "of the cluster"
            best = (seen[0], f"node {quote(seen[1])}, the largest {where}")
    return (best[0], best[1], not declared_any) if best is not None else None


def _show(total: Quantity) -> int | str:
    """A whole total as a number; a fractional one (already a gpu-quantity violation) exactly."""
    if total.denominator == 1:
        return int(total)
    return str(Decimal(total.numerator) / Decimal(total.denominator))


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    for name, total in effective_requests(view).items():
        spec = resource_spec(view, policy, name)
        if spec is not None and spec.max_per_pod is not None and total > spec.max_per_pod:
            shown = _show(total)
            yield Violation(
                rule=RULE,
                path=view.first_request_path(name),
                value=shown,
                message=f"the Pod requests {shown} {name} in all, above the policy's maximum "
                f"of {spec.max_per_pod} per Pod",
                hint="use several Pods, or a training controller (PyTorchJob, MPIJob, JobSet) "
                "that spreads the work over nodes",
                subject="pod",
                field=f"total[{name}]",
            )
            continue
        capacity = _node_capacity(view, policy, name)
        if capacity is not None and total > capacity[0]:
            shown = _show(total)
            yield Violation(
                rule=RULE,
                path=view.first_request_path(name),
                value=shown,
                message=f"the Pod requests {shown} {name} in all, but {capacity[1]} offers "
                f"{_show(capacity[0])}: a Pod must fit on one node",
                hint="use several Pods or a training controller",
                subject="pod",
                field=f"total[{name}]",
                # Sized by the node inventory alone: nodes may be larger once they are up.
                advisory=capacity[2],
            )
