"""A starting policy for a cluster: ``gpu-admission policy init --from-cluster``.

Nodes and DaemonSets in, policy text out: the default policy as shipped (its settings and its
comments), plus what the cluster shows (``webhook.operations.pool_drafts``): a pool for each
kind of GPU node, the MIG-capable products (``migCatalogue.products``; a product the catalogue
does not know, with the profiles its nodes are partitioned into), the vendor resources that are
no GPU (``companionResources``), the DaemonSets that run NVIDIA's device plugin
(``devicePluginDaemonSets``, ``webhook.operations.daemonset_drafts``), and, commented out for
the author to decide, the namespaces of the DaemonSets that tolerate every taint as exemptions
and a tenant with the products found. Every comment that starts with ``Found:`` says what was
seen, every ``Guessed:`` what was inferred. The text is loaded as the webhook loads it before
it is given back, and compared with the nodes and the device plugin DaemonSets as ``cluster
check`` compares them: what would still disagree is returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from webhook.audit.drift import find_drift
from webhook.audit.drift_finding import Drift
from webhook.core.inventory import (
    NodeInfo,
    Taint,
    gpu_memory_mib,
    gpu_product,
    is_gpu_node,
    mig_capable,
    mig_profiles,
)
from webhook.core.wording import count, names, number
from webhook.operations.daemonset_drafts import (
    DEVICE_PLUGIN_IMAGE,
    GKE_DEVICE_PLUGIN,
    GPU_OPERATOR_DEVICE_PLUGIN,
    SeenDaemonSet,
)
from webhook.operations.draft_text import comment, flow, yaml_scalar
from webhook.operations.pool_drafts import (
    GKE_PARTITION,
    GPU_COUNT,
    SHARING_LABELS,
    DraftResource,
    PoolDraft,
    PoolPlan,
    plan_pools,
    pool_taints,
    seen_text,
    taint_text,
)
from webhook.operations.tenant_drafts import agents_block, preference, tenant_example
from webhook.policy.load import default_policy_path, parse_policy
from webhook.policy.mig import CATALOGUE, GPU_PRODUCT, catalogued_as
from webhook.policy.model import Policy

# Where the default policy's text takes what is drafted: each start once in it, with its end
# (the first after it) where the text from the start to the end is replaced.
METADATA = "metadata:\n  name: default\n  description:"
MIG_PRODUCTS = '    products: ["*"]\n'
MIG_CATALOGUE = "  migCatalogue:\n"
HOST_PATHS = "  # Host paths:"
DEFAULT_HEADER = "# The default gpu-admission policy:"
HEADER_END = "#\n"
AGENTS_START = "    # Node agents that must mount host paths"
AGENTS_END = "    #     - reason: Node agents that run on every node, GPU nodes included.\n"
GPU_NODE_TAINTS = "  gpuNodeTaints:\n"
GPU_NODE_TAINTS_END = "      effect: NoSchedule\n"
ANCHORS: tuple[tuple[str, str | None], ...] = (
    (GPU_NODE_TAINTS, GPU_NODE_TAINTS_END),
    (METADATA, "\n"),
    (DEFAULT_HEADER, HEADER_END),
    (MIG_CATALOGUE, None),
    (MIG_PRODUCTS, None),
    (HOST_PATHS, None),
    (AGENTS_START, AGENTS_END),
)


@dataclass(frozen=True, slots=True)
class Draft:
    """The policy text, its pools, the nodes it was drafted from, the GPU nodes no pool takes
    (with why), and where ``cluster check`` would still find the policy and the nodes (or a
    device plugin DaemonSet) disagree (none on a cluster whose GPU nodes label apart as they
    are tainted apart, and whose device plugins run on every GPU node they admit)."""

    text: str
    policy: Policy
    pools: tuple[str, ...]
    nodes: int
    gpu_nodes: int
    unpooled: tuple[str, ...]
    drift: tuple[Drift, ...]
    warnings: tuple[str, ...]  # what policy validate warns of it, "path: message"


class NoGpuNodes(Exception):
    """The cluster has no GPU node to draft pools from."""


class DefaultPolicyChanged(ValueError):
    """The default policy's text lacks a place the draft is written at (``ANCHORS``): it was
    changed without this module (a bug, which ``tests/test_policy_init.py`` catches)."""

    def __init__(self, where: str, problems: Sequence[str]) -> None:
        super().__init__(
            f"{where}: policy init cannot draft on it: {'; '.join(problems)} "
            "(the default policy changed without the anchors of "
            "webhook/operations/policy_init.py)"
        )


def draft_policy(
    nodes: Sequence[NodeInfo],
    daemonsets: Iterable[SeenDaemonSet],
    *,
    source: str,
    base: str | None = None,
) -> Draft:
    """The starting policy for ``nodes`` and ``daemonsets`` read from ``source`` (the API
    server's address), on ``base`` (the default policy's text). ``NoGpuNodes`` when no node
    is a GPU node; ``DefaultPolicyChanged`` when the base text lacks a place the draft is
    written at, ``PolicyError`` if the text drafted does not load (both bugs)."""
    where = "the base policy" if base is not None else str(default_policy_path())
    text = base if base is not None else default_policy_path().read_text("utf-8")
    problems = anchor_problems(text)
    if problems:
        raise DefaultPolicyChanged(where, problems)
    base_policy = parse_policy(text, "default policy")
    gpu_nodes = [n for n in nodes if is_gpu_node(n)]
    if not gpu_nodes:
        raise NoGpuNodes(
            f"no GPU node among the {count(nodes, 'node')} of {source}: none advertises a "
            f"resource under {' or '.join(base_policy.vendor_domains)} or carries GPU feature "
            "discovery's nvidia.com/gpu.present=true, so there is no pool to draft. Check that "
            "the NVIDIA device plugin runs (kubectl get nodes -L nvidia.com/gpu.present,"
            "nvidia.com/gpu.product), or start from policies/default.yaml"
        )
    plan = plan_pools(nodes)
    seen = list(daemonsets)
    agents = [d for d in seen if d.tolerates_every_taint()]
    plugins = sorted((d for d in seen if d.device_plugin), key=lambda d: (d.namespace, d.name))
    text = _edit(text, where, _metadata(len(gpu_nodes)), METADATA, "\n")
    text = _edit(text, where, _header(nodes, gpu_nodes, plan, source), DEFAULT_HEADER, HEADER_END)
    drafted = _pools_block(plan) + _device_plugins(plugins)
    text = _edit(text, where, drafted + MIG_CATALOGUE, MIG_CATALOGUE)
    text = _edit(text, where, _mig_products(gpu_nodes), MIG_PRODUCTS)
    common = [t for t in pool_taints(gpu_nodes[0]) if all(t in pool_taints(n) for n in gpu_nodes)]
    if common:
        text = _edit(text, where, _gpu_node_taints(common), GPU_NODE_TAINTS, GPU_NODE_TAINTS_END)
    if not any(t.effect in ("NoSchedule", "NoExecute") for n in gpu_nodes for t in n.taints):
        text = _edit(text, where, _untainted() + HOST_PATHS, HOST_PATHS)
    tenants = agents_block(agents, base_policy) + tenant_example(plan) + preference(plan)
    text = _edit(text, where, tenants, AGENTS_START, AGENTS_END)
    policy = parse_policy(text, "drafted policy")
    warned = tuple(f"{w.path}: {w.message}" for w in policy.warnings if w.level != "info")
    if warned:
        said = "policy validate warns of this draft (fix each before you serve it):\n"
        text = comment(said + "\n".join(f"- {w}" for w in warned), 0) + "#\n" + text
        policy = parse_policy(text, "drafted policy")
    compared = {plugin.named: plugin.as_read() for plugin in plugins}
    return Draft(
        text,
        policy,
        tuple(p.name for p in plan.pools),
        len(nodes),
        len(gpu_nodes),
        tuple(f"{node.name}: {why}" for node, why in plan.unpooled),
        tuple(d for d in find_drift(policy, nodes, compared) if d.level == "drift"),
        warned,
    )


def anchor_problems(text: str) -> list[str]:
    """What of ``ANCHORS`` the text lacks, one line each: none in the default policy."""
    return [p for start, end in ANCHORS if isinstance(p := _locate(text, start, end), str)]


def _edit(text: str, where: str, replacement: str, start: str, end: str | None = None) -> str:
    """``text`` with the part from ``start`` to the first ``end`` after it (``start`` alone
    without one) replaced; ``DefaultPolicyChanged`` naming ``where`` when it is not there."""
    located = _locate(text, start, end)
    if isinstance(located, str):
        raise DefaultPolicyChanged(where, [located])
    return text[: located[0]] + replacement + text[located[1] :]


def _locate(text: str, start: str, end: str | None) -> tuple[int, int] | str:
    """Where the part from ``start`` (there once) to the first ``end`` after it is, or what
    of it is not there."""
    found = text.count(start)
    if found != 1:
        return f"{start!r} is there {found} times, not once"
    at = text.find(start)
    if end is None:
        return at, at + len(start)
    stop = text.find(end, at + len(start))
    if stop < 0:
        return f"no {end!r} after {start!r}"
    return at, stop + len(end)


def _header(
    nodes: Sequence[NodeInfo], gpu_nodes: Sequence[NodeInfo], plan: PoolPlan, source: str
) -> str:
    pools = count(plan.pools, "pool")
    said = (
        f"A starting policy drafted by `gpu-admission policy init --from-cluster` from the "
        f"{count(nodes, 'node')} of {source} ({len(gpu_nodes)} with GPUs): the default policy "
        f"below, with {pools} for the GPU nodes, the MIG-capable products and the device plugin "
        "DaemonSets found and, commented out, the node agents' namespaces to exempt and a "
        "tenant to start from. Comments that start with Found: say what was seen in the "
        "cluster, Guessed: what was inferred: check "
        "each, then:\n"
        "  gpu-admission policy validate FILE && gpu-admission cluster check --policy FILE\n"
    )
    return comment(said, 0) + "#\n# Its modes are the default policy's:\n"


def _metadata(gpu_nodes: int) -> str:
    return (
        "metadata:\n  name: from-cluster\n"
        f"  description: Drafted from the cluster's {gpu_nodes} GPU nodes; the default policy's "
        "modes.\n"
    )


def _pools_block(plan: PoolPlan) -> str:
    lines = ""
    if plan.companions:
        lines += comment(
            f"Found: {', '.join(plan.companions)} in the nodes' capacity: vendor resources that "
            "hand out no GPU (a NIC's, a companion of the GPUs): they go beside GPUs in any pool "
            "and choose none.",
            2,
        )
        lines += f"  companionResources: {flow(plan.companions)}\n"
    lines += comment(
        "One pool per kind of GPU node found: a GPU Pod goes to the pool that offers what it "
        "asks for, and gets the pool's tolerations and required node affinity. Where several "
        "pools offer it (nvidia.com/gpu on nodes of several products), the Pod chooses by its "
        "nodeSelector (nvidia.com/gpu.product) or the gpu-admission.io/pool annotation; where "
        "those pools share it differently, a Pod that does not choose is denied as ambiguous "
        "(or its tenant states a poolPreference). Rename the pools as you like.",
        2,
    )
    if plan.unpooled:
        lines += comment(
            "Found: GPU nodes no pool could take (cluster check names them as in no pool): "
            + "; ".join(f"{node.name}: {why}" for node, why in plan.unpooled)
            + ". Label them apart and declare a pool for them.",
            2,
        )
    if not plan.pools:
        return lines + comment(
            "Found: no pool could be drafted: every GPU node is in no pool (above). They get "
            "the tolerations of gpuNodeTaints below; declare pools once they are labelled apart.",
            2,
        )
    lines += "  pools:\n"
    for draft in plan.pools:
        lines += _pool(draft)
    return lines


def _pool(draft: PoolDraft) -> str:
    said = [f"Found: {seen_text(draft)}."]
    said += _sharing_found(draft)
    said += [f"Guessed: {guess}." for guess in draft.guesses]
    lines = "".join(comment(s, 4) for s in said)
    lines += f"    - name: {yaml_scalar(draft.name)}\n      nodeSelector:\n"
    lines += "".join(
        f"        {yaml_scalar(k)}: {yaml_scalar(v)}\n" for k, v in draft.selector.items()
    )
    if draft.gpus_per_node is not None:
        lines += f"      gpusPerNode: {draft.gpus_per_node}\n"
    lines += "      resources:\n"
    lines += "".join(f"        - {_resource(r)}\n" for r in draft.resources)
    if draft.taints:
        lines += "      taints:\n"
        for taint in draft.taints:
            value = f"value: {yaml_scalar(taint.value)}, " if taint.value else ""
            lines += f"        - {{key: {yaml_scalar(taint.key)}, {value}effect: {taint.effect}}}\n"
    return lines


def _resource(resource: DraftResource) -> str:
    extra = ", failRequestsGreaterThanOne: true" if resource.fail_requests_greater_than_one else ""
    return f"{{name: {yaml_scalar(resource.name)}, sharing: {resource.sharing}{extra}}}"


def _sharing_found(draft: PoolDraft) -> list[str]:
    """What the nodes' labels say of the pool's sharing and size."""
    said: list[str] = []
    labels = draft.nodes[0].labels
    shown = [f"{key}={labels[key]}" for key in SHARING_LABELS if key in labels]
    modes = {r.sharing for r in draft.resources}
    gke = any(key.startswith("cloud.google.com/") for key in SHARING_LABELS if key in labels)
    if shown:
        said.append(
            f"Found: {', '.join(shown)} ({'GKE' if gke else 'GPU feature discovery'}): declared "
            f"{', '.join(f'{r.name} {r.sharing}' for r in draft.resources)}."
        )
    product = gpu_product(draft.nodes[0])
    if product is not None and product.mig_profile is not None:
        said.append(
            f"Found: the single MIG strategy (product label ...-MIG-{product.mig_profile}): "
            "each nvidia.com/gpu is one MIG instance."
        )
    if GKE_PARTITION in labels:
        said.append(
            f"Found: GKE's MIG partitions ({GKE_PARTITION}): each nvidia.com/gpu is one MIG "
            "instance."
        )
    if modes - {"Exclusive", "MIG"} and gke:
        said.append(
            "Found: failRequestsGreaterThanOne on the shared resources: GKE refuses a container "
            "that asks for more than one shared GPU."
        )
    elif modes - {"Exclusive", "MIG"}:
        said.append(
            "Guessed: failRequestsGreaterThanOne on the shared resources, as the guide sets "
            "the device plugin's option of that name; no node shows it. Delete it if your "
            "sharing configuration lets a container take several replicas."
        )
    if draft.product_label != GPU_PRODUCT:
        said.append(
            f"Found: no GPU feature discovery labels: the product is the cloud's "
            f"{draft.product_label}. The policy names products (a tenant's entitlements.products) "
            f"as {GPU_PRODUCT} spells them, which these nodes lack: keep tenants to this pool "
            "by reservedPools instead, or deploy GPU feature discovery and draft again."
        )
    if draft.gpus_per_node is not None:
        counts = sorted({int(n.labels[GPU_COUNT]) for n in draft.nodes})
        seen = f"{counts[0]} to {counts[-1]}" if len(counts) > 1 else str(counts[0])
        said.append(f"Found: {GPU_COUNT}={seen} on its nodes: gpusPerNode {draft.gpus_per_node}.")
    return said


def _device_plugins(plugins: Sequence[SeenDaemonSet]) -> str:
    """``devicePluginDaemonSets``: the DaemonSets found running NVIDIA's device plugin, each
    with why; a commented-out entry to fill in where none is."""
    if not plugins:
        return comment(
            f"Found: no DaemonSet that runs NVIDIA's device plugin (image {DEVICE_PLUGIN_IMAGE}, "
            f"the GPU Operator's {GPU_OPERATOR_DEVICE_PLUGIN}, or GKE's kube-system/"
            f"{GKE_DEVICE_PLUGIN}*): cluster check compares no "
            "device plugin with the GPU nodes. Name yours:",
            2,
        ) + ("  # devicePluginDaemonSets:\n  #   - {namespace: NAMESPACE, name: NAME}\n")
    lines = comment(
        "The DaemonSets that run the device plugin: cluster check compares the Pods each "
        "wants with the GPU nodes its node selector, node affinity and tolerations admit.",
        2,
    )
    lines += "  devicePluginDaemonSets:\n"
    for plugin in plugins:
        lines += comment(
            f"Found: {plugin.named} runs NVIDIA's device plugin ({plugin.device_plugin}): "
            f"{number(plugin.desired, 'Pod')} desired, {plugin.ready} ready.",
            4,
        )
        namespace, name = yaml_scalar(plugin.namespace), yaml_scalar(plugin.name)
        lines += f"    - {{namespace: {namespace}, name: {name}}}\n"
    return lines


def _mig_products(gpu_nodes: Sequence[NodeInfo]) -> str:
    """``migCatalogue.products`` (and ``customProducts``) for the MIG-capable GPUs found;
    every catalogued product where none is."""
    entries: dict[str, list[str]] = {}  # catalogue entry -> nodes
    labelled: dict[str, str] = {}  # catalogue entry -> the product as labelled
    custom: dict[str, set[str]] = {}  # an uncatalogued product, as labelled -> its profiles
    unknown: dict[str, list[str]] = {}  # uncatalogued and not partitioned -> nodes
    for node in gpu_nodes:
        product = gpu_product(node)
        if product is None or not mig_capable(node):
            continue
        entry = catalogued_as(product, gpu_memory_mib(node), CATALOGUE)
        if entry is not None:
            entries.setdefault(entry, []).append(node.name)
            labelled.setdefault(entry, product.name)
        elif mig_profiles(node):
            custom.setdefault(product.name, set()).update(mig_profiles(node))
            entries.setdefault(product.name, []).append(node.name)
        else:
            unknown.setdefault(product.name, []).append(node.name)
    if not entries:
        return comment("Found: no MIG-capable GPU: every catalogued product's profiles.", 4) + (
            MIG_PRODUCTS
        )
    found = "; ".join(
        f"{labelled.get(e, e)} ({'not catalogued' if e in custom else e}) on "
        f"{count(listed, 'node')}"
        for e, listed in sorted(entries.items())
    )
    lines = comment(
        f"Found: the MIG-capable GPUs {found}. Only their products' MIG profiles are accepted; "
        '["*"] accepts every catalogued product\'s.',
        4,
    )
    lines += f"    products: {flow(sorted(entries))}\n"
    for name, listed in sorted(unknown.items()):
        lines += comment(
            f"Found: {name}, MIG-capable and not in the catalogue, on {names(listed)}, not "
            "partitioned: add it to customProducts with the profiles nvidia-smi mig -lgip lists "
            "on one of them (cluster check names it until then).",
            4,
        )
    if custom:
        lines += "    customProducts:\n"
        for name, profiles in sorted(custom.items()):
            lines += comment(
                f"Guessed: {name} is not in the catalogue; its profiles are those its nodes "
                "are partitioned into. Add every profile nvidia-smi mig -lgip lists.",
                6,
            )
            lines += f"      - {{name: {yaml_scalar(name)}, profiles: {flow(sorted(profiles))}}}\n"
    return lines


def _gpu_node_taints(taints: Sequence[Taint]) -> str:
    """``gpuNodeTaints``: the taints every GPU node carries, as they carry them."""
    lines = comment(
        f"Found: every GPU node carries {', '.join(taint_text(t) for t in taints)}: the "
        "tolerations added to GPU Pods match them.",
        2,
    )
    lines += GPU_NODE_TAINTS
    for taint in taints:
        lines += f"    - key: {yaml_scalar(taint.key)}\n"
        if taint.value:
            lines += f"      value: {yaml_scalar(taint.value)}\n"
        lines += f"      effect: {taint.effect}\n"
    return lines


def _untainted() -> str:
    return comment(
        "Found: no GPU node carries a NoSchedule or NoExecute taint, so any Pod can land on "
        "one: the security rules judge every Pod as able to reach a GPU node. Taint them "
        "(kubectl taint nodes NODE nvidia.com/gpu=present:NoSchedule), add the taint to the "
        "pools and delete this setting.",
        2,
    ) + ("  gpuNodesTainted: false\n")
