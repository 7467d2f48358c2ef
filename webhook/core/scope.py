"""Who the security rules bind: every Pod that can reach a GPU node, whatever it asks for.

GPU-relevance read from what a Pod asks for is the tenant's to choose, so the security rules
(privileged, host-devices, device-visibility, host-access) are scoped by *reachability*:

- ``gpuPods``: the Pod asks for a GPU resource (typos and zero quantities included; not a
  network device under the same vendor domain), sets a
  container-toolkit variable, mounts a GPU device node or the toolkit's device-list directory,
  carries a DRA claim or a CDI annotation; or it sets ``spec.nodeName`` (the scheduler, and
  with it every NoSchedule taint, is skipped) to a node the node inventory does not know to
  be a CPU node (``webhook.core.inventory.surely_cpu_node``; never where GPU nodes are
  untainted); or its keyed tolerations tolerate every NoSchedule and NoExecute taint of one
  class of GPU node; or the policy says GPU nodes are not tainted.
- ``reachablePods``: only a wildcard toleration (no key) gets it onto a GPU node, as node agents
  (CNI, CSI, node-exporter, logging) do on every node.
- ``otherPods``: nothing gets it onto a GPU node; a Pod bound by ``nodeName`` to a CPU node
  with no signal of its own.

Node selection by label, hostname or ``matchFields`` only narrows where a Pod may go, so it
is no reachability signal (it stays a GPU-relevance signal for the scheduling rules).

This module also owns the one answer to "does this container request a GPU", which the
device-visibility rule and the ``injectVoid`` mutation share.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from webhook.core.hostpaths import in_device_list_dir, is_gpu_device_path
from webhook.core.inventory import bound_to_cpu_node
from webhook.core.pods import TOOLKIT_PREFIX, ContainerView, PodView, is_cdi_annotation
from webhook.core.scheduling import tolerates
from webhook.policy.model import Policy, Scope
from webhook.policy.names import near_miss_key

# The container toolkit's variables: a closed list. These four widen what a container sees
# whatever it requested; the others only tune a GPU the container was given.
WIDENING_VARIABLES = (
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "NVIDIA_IMEX_CHANNELS",
)
TUNING_VARIABLES = (
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_DISABLE_REQUIRE",
    "NVIDIA_GDRCOPY",
    "NVIDIA_GDS",
    "NVIDIA_MOFED",
    "NVIDIA_NVSWITCH",
)
# The tuning variables that add devices a node shares between its GPU Pods (MOFED, NVSwitch,
# GPUDirect RDMA and Storage): a GPU container sets them only where a tenant grant says so.
NODE_SHARED_VARIABLES = ("NVIDIA_MOFED", "NVIDIA_NVSWITCH", "NVIDIA_GDRCOPY", "NVIDIA_GDS")
REQUIRE_PREFIX = "NVIDIA_REQUIRE_"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# Values of NVIDIA_VISIBLE_DEVICES that expose no GPU.
NO_DEVICES = ("void", "none")


_TOOLKIT_NAMES = frozenset(WIDENING_VARIABLES + TUNING_VARIABLES)


def is_toolkit_variable(name: object) -> bool:
    return (
        isinstance(name, str)
        and name.startswith(TOOLKIT_PREFIX)
        and (name in _TOOLKIT_NAMES or name.startswith(REQUIRE_PREFIX))
    )


# The answers to "does this container request a GPU", decided when the view was built against
# its policy (and with the node inventory's templates). Not an undeclared vendor resource such
# as ``nvidia.com/hostdev``, nor a claim of another class (a NIC's).
def requests_gpu(container: ContainerView) -> bool:
    """It asks for a GPU: a declared (or retired) GPU resource in any quantity but a clean
    zero, or a DRA claim that may hand it one (``webhook.core.dra``: a GPU class's, or one
    whose spec cannot be read). What every rule that asks means: the toolkit's tuning
    variables are allowed in it, and it counts for queues, defaults and relevance."""
    return container.requests_declared_gpu or container.may_claim_gpu


def surely_gets_gpu(container: ContainerView) -> bool:
    """It is surely handed a GPU by the device plugin or NVIDIA's DRA driver, which set the
    devices it sees (the driver's CDI spec voids NVIDIA_VISIBLE_DEVICES): a declared GPU
    resource, or a claim read from the inventory whose request is a GPU class in every
    alternative. Only these are spared ``NVIDIA_VISIBLE_DEVICES=void`` (``injectVoid``) and
    the legacy ``CUDA_VERSION`` refusal: a claim that cannot be read may give nothing (a NIC's
    claim), and an image's own variables would then expose every GPU of the node."""
    return container.requests_declared_gpu or container.surely_claims_gpu


def toolkit_env(container: ContainerView) -> list[tuple[int, dict[str, Any]]]:
    """The container's env entries that set a variable the container toolkit reads."""
    env = container.nvidia_env
    if not env:  # the common case, without making a list
        return []
    return [(i, var) for i, var in env if is_toolkit_variable(var["name"])]


class Reach(NamedTuple):
    """How a Pod can reach GPU nodes, and why (for messages)."""

    scope: Scope
    reason: str  # "spec.nodeName skips ..."; empty for otherPods

    @property
    def reachable(self) -> bool:
        return self.scope != "otherPods"


def reach(view: PodView, policy: Policy) -> Reach:
    """How this Pod (or template) can reach GPU nodes; decided once per view."""
    found = view.reach
    if found is None:
        found = view.reach = _reach(view, policy)
    return found


def asks_for_gpu(view: PodView, policy: Policy) -> bool:
    """Whether a container asks for a GPU resource, misspelt ones included (for advice).
    Computed once per view: every finding's advice asks it, and a Pod with thousands of
    containers and findings would otherwise pay their product."""
    asks = view.asks_gpu
    if asks is None:
        asks = view.asks_gpu = _asks_for_gpu(view, policy)
    return asks


def _asks_for_gpu(view: PodView, policy: Policy) -> bool:
    return any(
        _is_gpu_ask(name, policy) and (quantity is None or quantity != 0)
        for container in view.containers
        for name, quantity in container.gpu_quantity.items()
    )


def _reach(view: PodView, policy: Policy) -> Reach:
    reason = _own_signal(view, policy)
    if reason is not None:
        return Reach("gpuPods", reason)
    if isinstance(view.spec.get("nodeName"), str) and view.spec["nodeName"]:
        if not bound_to_cpu_node(view.nodes, view.spec["nodeName"], policy):
            return Reach("gpuPods", "spec.nodeName skips the scheduler's taint checks")
        # Bound to a node with no sign of a GPU: its tolerations take it nowhere else.
        return Reach("otherPods", "")
    tolerations = view.tolerations()
    if tolerations:
        by_key = _tolerated_class([t for t in tolerations if t.get("key")], policy)
        if by_key is not None:
            return Reach("gpuPods", f"it tolerates {by_key}")
    if policy.every_pod_reaches_gpu_nodes:
        return Reach("gpuPods", "the policy's GPU nodes are not tainted")
    wildcard = _tolerated_class(tolerations, policy)
    if wildcard is not None:
        return Reach("reachablePods", f"a wildcard toleration tolerates {wildcard}")
    return Reach("otherPods", "")


def _own_signal(view: PodView, policy: Policy) -> str | None:
    """A signal in the Pod's own resources, environment, volumes or annotations."""
    for container in view.containers:
        for name in container.gpu:
            # A declared GPU name is an ask; another vendor name may still name a GPU.
            if name in policy.declared_names or _is_gpu_ask(name, policy):
                return f"it asks for {name}"
        if container.resources.get("claims"):
            return "it has a DRA resource claim"
        for _, var in toolkit_env(container):
            return f"it sets {var['name']}"
        mounts = container.spec.get("volumeMounts")
        for mount in mounts if isinstance(mounts, list) else ():
            path = mount.get("mountPath") if isinstance(mount, dict) else None
            if isinstance(path, str) and in_device_list_dir(path):
                return f"it mounts {path}"
    if view.spec.get("resourceClaims"):
        return "it has a DRA resource claim"
    if any(is_cdi_annotation(k) for k in view.annotations):
        return "it has a CDI annotation"
    volumes = view.spec.get("volumes")
    for volume in volumes if isinstance(volumes, list) else ():
        host = volume.get("hostPath") if isinstance(volume, dict) else None
        path = host.get("path") if isinstance(host, dict) else None
        if isinstance(path, str) and is_gpu_device_path(path, policy):
            return f"it mounts the host's {path}"
    return None


def _is_gpu_ask(name: str, policy: Policy) -> bool:
    """A vendor resource that means a GPU: declared, retired, a near miss of a declared name
    or GPU-like (``gpu``, ``mig-``); not a NIC the network operator advertises under the same
    domain (``nvidia.com/hostdev``, ``nvidia.com/cx6_sriov_netdevice``)."""
    if name in policy.declared_names or name in policy.retired:
        return True
    short = name.partition("/")[2].lower()
    return "gpu" in short or short.startswith("mig") or near_miss_key(name) in policy.near_misses


def _tolerated_class(tolerations: list[Any], policy: Policy) -> str | None:
    """The taint keys of the first GPU node class whose every taint the tolerations tolerate."""
    if not tolerations:
        return None
    for taints in policy.gpu_node_classes:
        if all(any(tolerates(t, taint) for t in tolerations) for taint in taints):
            return ", ".join(dict.fromkeys(str(taint["key"]) for taint in taints))
    return None
