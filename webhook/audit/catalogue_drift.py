"""Where the GPU products the cluster's nodes carry and the policy disagree: part of what
``gpu-admission cluster check`` reports (``webhook.audit.drift`` gathers it). Where GPU feature
discovery labelled the product (``nvidia.com/gpu.product``):

- ``mig-product-not-catalogued``: a MIG-capable product that the MIG catalogue (built in, and
  ``migCatalogue.customProducts``) does not know (its profiles cannot be checked), or that
  ``migCatalogue.products`` leaves out while its nodes are in MIG instances (their profiles are
  not the policy's). Products that cannot be partitioned (L4, T4) and nodes without feature
  discovery's labels are not compared;
- ``mig-profile-not-catalogued``: a MIG profile a node is partitioned into (advertised as
  ``nvidia.com/mig-<profile>``, or the single strategy's in the product label) that the
  catalogue does not list for the node's product.

And where it did not:

- ``gpu-node-without-product-label``: where a tenant may use some GPU products only
  (``tenants[].entitlements.products``), a GPU node without feature discovery's product label:
  its GPU Pods, confined by that label, cannot land there (GKE without feature discovery).
"""

from __future__ import annotations

from webhook.audit.drift_finding import Drift
from webhook.core.inventory import (
    NodeInfo,
    gpu_memory_mib,
    gpu_product,
    is_gpu_node,
    mig_capable,
    mig_profiles,
)
from webhook.core.wording import count, names, them
from webhook.policy.mig import GPU_PRODUCT, catalogued_as
from webhook.policy.model import Policy


def find_catalogue_drift(policy: Policy, nodes: list[NodeInfo]) -> list[Drift]:
    """The MIG-capable products the policy's catalogue does not know, those in MIG instances
    that its products leave out, then the profiles it does not list for a product it knows;
    nodes without feature discovery's product label are not compared."""
    catalogue = policy.mig_catalogue
    every_product = "*" in policy.mig_products
    unknown: dict[str, list[str]] = {}  # the product as labelled -> nodes
    left_out: dict[str, list[str]] = {}  # a catalogued product not in products -> nodes
    unlisted: dict[tuple[str, str], list[str]] = {}  # (catalogued product, profile) -> nodes
    for node in nodes:
        product = gpu_product(node)
        if product is None or not mig_capable(node):
            continue
        entry = catalogued_as(product, gpu_memory_mib(node), catalogue)
        if entry is None:
            unknown.setdefault(product.name, []).append(node.name)
            continue
        profiles = mig_profiles(node)
        if profiles and not every_product and entry not in policy.mig_products:
            left_out.setdefault(entry, []).append(node.name)
        for profile in sorted(profiles - catalogue[entry]):
            unlisted.setdefault((entry, profile), []).append(node.name)

    found: list[Drift] = []
    also = "" if every_product else " and to migCatalogue.products"
    for labelled, listed in sorted(unknown.items()):
        found.append(
            Drift(
                "mig-product-not-catalogued",
                labelled,
                tuple(listed),
                f"{count(listed, 'node')} with the MIG-capable GPU {labelled} "
                f"(nvidia.com/gpu.product), which the MIG catalogue does not know: "
                f"{names(listed)}; the MIG profiles of such nodes cannot be checked. Add it to "
                f"migCatalogue.customProducts (name: {labelled}, profiles: those nvidia-smi mig "
                f"-lgip lists on one of them){also}",
            )
        )
    for entry, listed in sorted(left_out.items()):
        found.append(
            Drift(
                "mig-product-not-catalogued",
                entry,
                tuple(listed),
                f"{count(listed, 'node')} with {entry} GPUs in MIG instances, a catalogued "
                f"product that migCatalogue.products leaves out: {names(listed)}; the policy "
                "accepts their profiles only where a listed product offers them too: add "
                f"{entry} to migCatalogue.products",
            )
        )
    for (entry, profile), listed in sorted(unlisted.items()):
        offered = ", ".join(sorted(catalogue[entry]))
        found.append(
            Drift(
                "mig-profile-not-catalogued",
                f"{entry}: {profile}",
                tuple(listed),
                f"{count(listed, 'node')} with {entry} GPUs "
                f"{'is' if len(listed) == 1 else 'are'} partitioned into MIG profile {profile}, "
                f"which the catalogue does not list for {entry} ({offered}): {names(listed)}; "
                "correct the nodes' MIG configuration (nvidia.com/mig.config) or their product, "
                f"or, if {entry} does offer {profile}, declare {entry} in "
                "migCatalogue.customProducts with every profile it offers",
            )
        )
    return found


def find_product_label_drift(policy: Policy, nodes: list[NodeInfo]) -> list[Drift]:
    """GPU nodes a product entitlement cannot reach: they lack the label it confines by."""
    entitled = [
        f"tenants[{t.index}] ({t.named})"
        for t in policy.tenants
        if t.entitlements is not None and t.entitlements.products is not None
    ]
    unlabelled = tuple(n.name for n in nodes if is_gpu_node(n) and GPU_PRODUCT not in n.labels)
    if not entitled or not unlabelled:
        return []
    return [
        Drift(
            "gpu-node-without-product-label",
            "",
            unlabelled,
            f"{count(unlabelled, 'GPU node')} without GPU feature discovery's product label "
            f"({GPU_PRODUCT}): {names(unlabelled)}; the GPU Pods of tenants that may use some "
            f"products only ({'; '.join(entitled)}) are confined by that label and cannot land "
            f"there: run GPU feature discovery (the GPU Operator runs it), or label "
            f"{them(unlabelled)} with {'its' if len(unlabelled) == 1 else 'their'} product "
            f"(kubectl label nodes NODE {GPU_PRODUCT}=PRODUCT)",
        )
    ]
