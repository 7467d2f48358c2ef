"""Which GPU products a Pod can land on, against the products its tenant is entitled to.

A ``nvidia.com/gpu`` request names no product: only the Pod's node selection does, through
GPU feature discovery's product label. A tenant entitled to some products
(``tenants[].entitlements.products``) is confined to them the way a reserved pool is: the
mutating webhook adds ``nvidia.com/gpu.product In [their label values]`` to every required
nodeSelectorTerm, and the pool-access rule (a product is a place, like a pool: never lifted by
an exception) requires that confinement of the final Pod. This module says what a Pod's own
selection already does, for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from webhook.core.inventory import named_node
from webhook.core.pods import PodView
from webhook.core.scheduling import required_terms
from webhook.policy.mig import GPU_PRODUCT
from webhook.policy.model import Policy
from webhook.policy.tenants import Tenant


class ProductReach(NamedTuple):
    """What a Pod's node selection says of the products it can land on. ``confined``: only
    products in the allowed values; ``named``: the values its selection names that are not
    allowed (a nodeSelector or In requirement on the product label, or the named node's
    label), sorted."""

    confined: bool
    named: tuple[str, ...]


def product_tenant(view: PodView, policy: Policy) -> Tenant | None:
    """The tenant whose product entitlement binds the Pod: the entitled tenant of its
    namespace, where that entitlement names products and the Pod asks for a vendor resource
    other than a companion one (a name the policy does not declare too: an undeclared name
    is still a device on some product), or surely claims a GPU through DRA (a claim the
    node inventory read: one that cannot be read may be a NIC's, which a GPU product label
    would keep from every node). None otherwise."""
    tenant = policy.entitled_tenant(view.namespace, view.namespace_labels)
    if tenant is None or tenant.entitlements is None or tenant.entitlements.products is None:
        return None
    if all(name in policy.companion_names for name in view.requested_gpu_names) and not any(
        c.surely_claims_gpu for c in view.containers
    ):
        return None
    return tenant


def product_reach(view: PodView, policy: Policy, allowed: frozenset[str]) -> ProductReach:
    """Whether the Pod's ``nodeName`` (the inventory's label of that node), ``nodeSelector``
    or required node affinity keep it to the ``allowed`` product label values. A requirement
    on the label other than ``In`` (``NotIn``, ``Exists``) confines to nothing named."""
    node_name = view.spec.get("nodeName")
    if node_name:
        node = named_node(view.nodes, node_name, policy)
        label = node.labels.get(GPU_PRODUCT) if node is not None else None
        if label is None:
            return ProductReach(False, ())  # a node the webhook cannot tell the product of
        return ProductReach(label in allowed, () if label in allowed else (label,))
    selected = view.node_selector().get(GPU_PRODUCT)
    if selected is not None:
        value = str(selected)
        return ProductReach(value in allowed, () if value in allowed else (value,))
    terms = required_terms(view.spec)
    if not terms:
        return ProductReach(False, ())
    named: set[str] = set()
    confined = True
    for term in terms:
        values = [_in_values(expr) for expr in _expressions(term)]
        kept = [v for v in values if v is not None]
        named.update(value for v in kept for value in v if value not in allowed)
        if not any(v <= allowed for v in kept):
            confined = False
    return ProductReach(confined, tuple(sorted(named)))


def product_expression(tenant: Tenant) -> dict[str, Any]:
    """The requirement that confines a Pod to its tenant's products: In on the product label,
    with every value their nodes' label takes."""
    assert tenant.entitlements is not None
    values = sorted(tenant.entitlements.product_values)
    return {"key": GPU_PRODUCT, "operator": "In", "values": values}


def _expressions(term: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    expressions = term.get("matchExpressions")
    if not isinstance(expressions, list):
        return []
    return [e for e in expressions if isinstance(e, Mapping) and e.get("key") == GPU_PRODUCT]


def _in_values(expression: Mapping[str, Any]) -> frozenset[str] | None:
    """The values an ``In`` requirement on the product label admits; None for another
    operator (it confines to nothing named)."""
    values = expression.get("values")
    if expression.get("operator") != "In" or not isinstance(values, list):
        return None
    return frozenset(str(value) for value in values)
