"""The pools a cluster's GPU nodes make: what ``policy init --from-cluster`` declares.

GPU nodes (those ``cluster check`` counts as GPU nodes: a vendor resource in their capacity, or
GPU feature discovery's ``nvidia.com/gpu.present=true``) are grouped by what a pool must state
alike for all its nodes: the product GPU feature discovery labelled (``nvidia.com/gpu.product``,
with its ``-MIG-<profile>`` and ``-SHARED`` forms), the taints, the sharing the device plugin
runs (``nvidia.com/gpu.sharing-strategy``, ``nvidia.com/gpu.replicas``) and the MIG strategy.
Each group gets the node selector that selects its nodes and no other node: the product label,
then, where that selects other nodes too, labels every node of the group carries and those
others do not (a label named like one of its taints first, then GPU feature discovery's sharing
labels, then any other). Groups no label tells apart become one pool, on the taints all their
nodes carry. Each resource gets the sharing mode the nodes' labels say it has; what cannot be
read from a node (``failRequestsGreaterThanOne``) is guessed and said so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from webhook.core.inventory import (
    GPU_REPLICAS,
    NodeInfo,
    Taint,
    gpu_product,
    is_gpu_node,
    time_sliced,
)
from webhook.core.node_lifecycle import is_lifecycle_taint
from webhook.core.wording import count, names
from webhook.policy.mig import GPU_PRODUCT, MIG_PREFIX

SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"
MIG_STRATEGY = "nvidia.com/mig.strategy"
GPU_COUNT = "nvidia.com/gpu.count"
# A managed cluster's own labels where GPU feature discovery does not run: GKE's accelerator
# (nvidia-l4), sharing (time-sharing, mps; the clients per GPU) and MIG partition (1g.5gb), and
# EKS's accelerator.
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
GKE_SHARING = "cloud.google.com/gke-gpu-sharing-strategy"
GKE_CLIENTS = "cloud.google.com/gke-max-shared-clients-per-gpu"
GKE_PARTITION = "cloud.google.com/gke-gpu-partition-size"
EKS_ACCELERATOR = "k8s.amazonaws.com/accelerator"
# The labels that name a node's GPU product, GPU feature discovery's first.
PRODUCT_LABELS = (GPU_PRODUCT, GKE_ACCELERATOR, EKS_ACCELERATOR)
# The labels that tell nodes of one product apart by how they share.
SHARING_LABELS = (
    SHARING_STRATEGY,
    MIG_STRATEGY,
    GPU_REPLICAS,
    GKE_SHARING,
    GKE_CLIENTS,
    GKE_PARTITION,
)
# Labels that never make a pool: one node's own, its place, its software's versions.
UNFIT_LABEL_PREFIXES = (
    "kubernetes.io/hostname",
    "topology.kubernetes.io/",
    "failure-domain.beta.kubernetes.io/",
    "topology.",
    "beta.kubernetes.io/",
    "kubernetes.io/",
    "feature.node.kubernetes.io/",
    "nvidia.com/gpu.deploy.",
    "nvidia.com/cuda.",
    "nvidia.com/gfd.",
    "nvidia.com/gpu.compute.",
    "nvidia.com/gpu.family",
    "nvidia.com/gpu.machine",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.present",
    "nvidia.com/mig.capable",
    "nvidia.com/mig.config",
    "nvidia.com/mps.capable",
    "nvidia.com/vgpu.",
)
_NAME_UNFIT = re.compile(r"[^a-z0-9]+")
_MAKERS = ("nvidia-", "tesla-")


@dataclass(frozen=True, slots=True)
class DraftResource:
    name: str
    sharing: str
    # Replicas of a shared GPU: the device plugin's option, which no node shows (guessed true).
    fail_requests_greater_than_one: bool


@dataclass(slots=True, eq=False)  # one draft is itself: compared and hashed by identity
class PoolDraft:
    """One pool as drafted: its nodes, what selects them, their taints and resources, and
    what was seen (``found``) or guessed (``guesses``), for the comments above it."""

    name: str
    nodes: list[NodeInfo]
    product: str | None  # the value of product_label
    taints: tuple[Taint, ...]
    product_label: str = GPU_PRODUCT
    selector: dict[str, str] = field(default_factory=dict)
    resources: list[DraftResource] = field(default_factory=list)
    gpus_per_node: int | None = None
    guesses: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """The pools, the GPU nodes no pool could take (with why), and the vendor resources that
    are no GPU (``companionResources``)."""

    pools: tuple[PoolDraft, ...]
    unpooled: tuple[tuple[NodeInfo, str], ...]
    companions: tuple[str, ...]


def is_gpu_resource(name: str) -> bool:
    """A vendor resource that hands out a GPU: ``gpu``, ``gpu.shared``, a renamed ``gpu-*``,
    a MIG instance ``mig-<profile>``; anything else under the domain (the network operator's
    ``hostdev``, ``rdma_shared_device_a``) goes beside GPUs. By the name's shape, since no
    policy says yet: ``core.inventory.is_gpu_resource`` reads ``companionResources``, which is
    what this drafts."""
    short = name.partition("/")[2]
    return short.startswith("gpu") or short.startswith(MIG_PREFIX)


def pool_taints(node: NodeInfo) -> tuple[Taint, ...]:
    """The node's taints less those it carries only for a while (its health or maintenance:
    ``webhook.core.node_lifecycle``), sorted."""
    return tuple(
        sorted(
            (t for t in node.taints if not is_lifecycle_taint(t.key)),
            key=lambda t: (t.key, t.value, t.effect),
        )
    )


def node_sharing(node: NodeInfo) -> str | None:
    """How the device plugin shares the node's GPUs, as GPU feature discovery labels it: MPS,
    TimeSlicing, or None (not shared)."""
    strategy = node.labels.get(SHARING_STRATEGY)
    gke = node.labels.get(GKE_SHARING)
    if strategy == "mps" or gke == "mps":
        return "MPS"
    if strategy == "time-slicing" or gke == "time-sharing" or time_sliced(node):
        return "TimeSlicing"
    return None


def resource_sharing(name: str, node: NodeInfo) -> str:
    """The sharing mode of one vendor GPU resource on ``node``."""
    short = name.partition("/")[2]
    sharing = node_sharing(node)
    product = gpu_product(node)
    if short.startswith(MIG_PREFIX):
        return "MIGTimeSlicing" if short.endswith(".shared") or sharing else "MIG"
    if (product is not None and product.mig_profile is not None) or GKE_PARTITION in node.labels:
        # The single MIG strategy, or GKE's partitions: each nvidia.com/gpu is a MIG instance.
        return "MIGTimeSlicing" if sharing else "MIG"
    if short.endswith(".shared"):
        return sharing or "TimeSlicing"
    return sharing or "Exclusive"


def plan_pools(nodes: Iterable[NodeInfo]) -> PoolPlan:
    """The pools of the GPU nodes among ``nodes`` (see the module's docstring)."""
    every = sorted(nodes, key=lambda n: n.name)
    gpu_nodes = [n for n in every if is_gpu_node(n)]
    companions = sorted({r for n in every for r in n.vendor_resources() if not is_gpu_resource(r)})
    unpooled: list[tuple[NodeInfo, str]] = []
    groups: dict[tuple[str, str | None, tuple[Taint, ...], str | None, str | None], list[NodeInfo]]
    groups = {}
    for node in gpu_nodes:
        if not any(is_gpu_resource(r) for r in node.vendor_resources()) and node.vendor_resources():
            unpooled.append(
                (
                    node,
                    f"advertises only {', '.join(node.vendor_resources())}, no GPU resource",
                )
            )
            continue
        label = next((k for k in PRODUCT_LABELS if k in node.labels), GPU_PRODUCT)
        key = (
            label,
            node.labels.get(label),
            pool_taints(node),
            node_sharing(node),
            node.labels.get(MIG_STRATEGY) or node.labels.get(GKE_PARTITION),
        )
        groups.setdefault(key, []).append(node)
    drafts = [PoolDraft("", members, key[1], key[2], key[0]) for key, members in groups.items()]
    drafts = _separate(drafts, every, unpooled)
    for draft in drafts:
        _describe(draft)
    _name(drafts)
    return PoolPlan(tuple(drafts), tuple(unpooled), tuple(companions))


def _separate(
    drafts: list[PoolDraft], every: list[NodeInfo], unpooled: list[tuple[NodeInfo, str]]
) -> list[PoolDraft]:
    """Give each draft a selector that selects its nodes only; merge drafts no label tells
    apart, and leave out (into ``unpooled``) the nodes no label tells from a node outside
    every draft."""
    while True:
        owner = {n.name: d for d in drafts for n in d.nodes}
        for draft in drafts:
            mine = {n.name for n in draft.nodes}
            others = [n for n in every if n.name not in mine]
            selector, overlapping = _selector(draft, others)
            draft.selector = selector
            if not overlapping and selector:
                continue
            partners = [owner[n.name] for n in overlapping if n.name in owner]
            if partners and len(partners) == len(overlapping):
                merged = _merge([draft, *dict.fromkeys(partners)])
                drafts = [d for d in drafts if d is not draft and d not in partners] + [merged]
                break  # selectors again, with the merged draft
            why = (
                f"no label tells {'it' if len(draft.nodes) == 1 else 'them'} apart from "
                f"{names(sorted(n.name for n in overlapping))}"
                if overlapping
                else "no label of it fits a pool's node selector"
            )
            unpooled.extend((node, why) for node in draft.nodes)
            drafts = [d for d in drafts if d is not draft]
            break
        else:
            return sorted(drafts, key=lambda d: (d.product or "~", d.nodes[0].name))


def _selector(draft: PoolDraft, others: list[NodeInfo]) -> tuple[dict[str, str], list[NodeInfo]]:
    """The labels that select the draft's nodes, and the other nodes they select too."""
    selector: dict[str, str] = {}
    if draft.product is not None:
        selector[draft.product_label] = draft.product
    common = dict(draft.nodes[0].labels)
    for node in draft.nodes[1:]:
        common = {k: v for k, v in common.items() if node.labels.get(k) == v}
    taint_keys = {(t.key, t.value) for t in draft.taints}

    def rank(item: tuple[str, str]) -> tuple[int, str]:
        if item in taint_keys:
            return 0, item[0]
        return (1 if item[0] in SHARING_LABELS else 2), item[0]

    candidates = sorted(
        (
            (k, v)
            for k, v in common.items()
            if k != draft.product_label and not k.startswith(UNFIT_LABEL_PREFIXES)
        ),
        key=rank,
    )
    selected = [n for n in others if _matches(n, selector)]
    while selected or not selector:
        useful = [
            (k, v)
            for k, v in candidates
            if k not in selector and (not selector or _excludes(k, v, selected))
        ]
        if not useful:
            break
        key, value = useful[0]
        if selector:
            # The candidate that tells most of them apart, of the best rank.
            best = min(rank(c)[0] for c in useful)
            key, value = max(
                (c for c in useful if rank(c)[0] == best),
                key=lambda c: sum(1 for n in selected if n.labels.get(c[0]) != c[1]),
            )
        selector[key] = value
        selected = [n for n in others if _matches(n, selector)]
    return selector, selected


def _excludes(key: str, value: str, nodes: list[NodeInfo]) -> bool:
    return any(n.labels.get(key) != value for n in nodes)


def _matches(node: NodeInfo, selector: Mapping[str, str]) -> bool:
    return bool(selector) and all(node.labels.get(k) == v for k, v in selector.items())


def _merge(drafts: list[PoolDraft]) -> PoolDraft:
    nodes = sorted((n for d in drafts for n in d.nodes), key=lambda n: n.name)
    taints = tuple(t for t in drafts[0].taints if all(t in d.taints for d in drafts[1:]))
    merged = PoolDraft("", nodes, drafts[0].product, taints, drafts[0].product_label)
    differing = sorted({t for d in drafts for t in d.taints} - set(taints), key=str)
    for taint in differing:
        on = [n.name for n in nodes if taint in pool_taints(n)]
        merged.guesses.append(
            f"no label tells its nodes apart, but only {names(on)} "
            f"{'carries' if len(on) == 1 else 'carry'} {taint_text(taint)}: the pool declares "
            "the taints all its nodes carry; label those nodes (kubectl label nodes NODE "
            "KEY=VALUE) and draft again to make them a pool of their own"
        )
    return merged


def _describe(draft: PoolDraft) -> None:
    """The draft's resources, with their sharing, and its GPUs per node."""
    modes: dict[str, list[str]] = {}
    for node in draft.nodes:
        for name in node.vendor_resources():
            if is_gpu_resource(name):
                mode = resource_sharing(name, node)
                if mode not in modes.setdefault(name, []):
                    modes[name].append(mode)
    if not modes:
        # GPU feature discovery's label, nothing advertised yet (the device plugin is not up).
        modes["nvidia.com/gpu"] = [resource_sharing("nvidia.com/gpu", draft.nodes[0])]
        draft.guesses.append(
            "its nodes advertise no GPU resource yet (is the device plugin running?): "
            "nvidia.com/gpu declared"
        )
    for name in sorted(modes):
        found = modes[name]
        # Several modes in one pool (merged nodes): the shared one, which refuses less.
        sharing = next((m for m in found if m != "Exclusive"), found[0])
        if len(found) > 1:
            draft.guesses.append(
                f"{name} is {' on some nodes, '.join(found)} on others: declared {sharing}"
            )
        shared = sharing not in ("Exclusive", "MIG")
        draft.resources.append(DraftResource(name, sharing, shared))
    counts = [node.labels.get(GPU_COUNT, "") for node in draft.nodes]
    if all(c.isdigit() and int(c) > 0 for c in counts):
        draft.gpus_per_node = max(int(c) for c in counts)


def _name(drafts: list[PoolDraft]) -> None:
    """Pool names from the product (less the maker), then the other labels that select it."""
    taken: set[str] = set()
    for draft in drafts:
        parts = [draft.product] if draft.product else []
        parts += [v for k, v in draft.selector.items() if k != draft.product_label]
        words = "-".join(parts).lower() or "gpu"
        for maker in _MAKERS:  # nvidia-tesla-a100: a100
            words = words.removeprefix(maker)
        base = _NAME_UNFIT.sub("-", words).strip("-")[:56].strip("-") or "gpu"
        name, suffix = base, 2
        while name in taken:
            name, suffix = f"{base}-{suffix}", suffix + 1
        taken.add(name)
        draft.name = name


def taint_text(taint: Taint) -> str:
    return f"{taint.key}{'=' + taint.value if taint.value else ''}:{taint.effect}"


def seen_text(draft: PoolDraft) -> str:
    """What the pool was drafted from: "3 nodes labelled ... and tainted ...: a, b, c"."""
    labels = ", ".join(f"{k}={v}" for k, v in draft.selector.items())
    taints = ", ".join(taint_text(t) for t in draft.taints)
    tainted = f" and tainted {taints}" if taints else " and not tainted"
    listed = names([n.name for n in draft.nodes])
    return f"{count(draft.nodes, 'node')} labelled {labels}{tainted}: {listed}"
