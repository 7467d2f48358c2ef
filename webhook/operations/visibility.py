"""Why a Pod that runs cannot see its GPU, as far as the API shows it: the guide's common
reasons that are written in the Pod (no GPU limit or claim, the wrong runtime class, a
privileged container that bypasses the device plugin's injection, variables that override
the devices the device plugin gave). A driver-library mismatch or a stale MIG or
time-slicing configuration are on the node, not in the API: the explanation says where to
look for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.checks.device_visibility import RULE as VISIBILITY_RULE
from webhook.checks.privileged import RULE as PRIVILEGED_RULE
from webhook.core.inventory import pools_of
from webhook.core.pods import ContainerView, PodView
from webhook.core.pools import select_pool
from webhook.core.wording import names
from webhook.operations.causes import Cause
from webhook.operations.cluster_facts import GpuNode
from webhook.policy.model import Policy

# What the device plugin sets (NVIDIA_VISIBLE_DEVICES) and what CUDA reads after it: a value
# the container writes replaces the GPUs it was given.
OVERRIDDEN_VARIABLES = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
NOT_IN_THE_API = (
    "what the API does not show: exec into the container and run `nvidia-smi -L` and "
    "`echo $CUDA_VISIBLE_DEVICES`; check the device plugin's logs and the kubelet's allocation "
    "messages on its node (a driver-library mismatch, a stale MIG or time-slicing configuration)"
)


def visibility_causes(
    view: PodView, policy: Policy, node: GpuNode | None, told: frozenset[str]
) -> tuple[list[Cause], list[str]]:
    """The causes the Pod shows, and notes (containers without a GPU, where else to look).
    ``told``: the rules whose findings the caller reports itself (the verdict's denials):
    a privileged container (rule ``privileged``) or overriding variables (``device-visibility``)
    they judged are left to it, said once."""
    causes: list[Cause] = []
    notes: list[str] = []
    gpu_containers = [c for c in view.containers if _asks_gpu(c)]
    if not gpu_containers:
        causes.append(_no_gpu(view, policy))
    else:
        without = [c.name for c in view.containers if c not in gpu_containers]
        if without:
            notes.append(f"containers that ask for no GPU and see none: {names(without)}")
    # Without a GPU the class changes nothing it sees.
    runtime = _runtime_class(view, policy, node) if gpu_containers else None
    if runtime is not None:
        causes.append(runtime)
    privileged = [c for c in view.containers if _privileged(c.spec)]
    if privileged and PRIVILEGED_RULE not in told:
        listed = names([c.name for c in privileged])
        causes.append(
            Cause(
                "privileged-container",
                f"privileged container {listed}: it sees the host's device nodes outside the "
                "device plugin's allocation, and the runtime's injection of the GPU and its "
                "driver libraries does not follow the GPUs it was given",
                f"remove securityContext.privileged from {listed} and ask for the GPU through "
                "resources.limits; add only the capabilities it needs",
                tuple(f"{c.path}.securityContext.privileged: true" for c in privileged),
            )
        )
    overrides = [
        (container, entry)
        for container in (gpu_containers or view.containers)
        for entry in _env(container.spec)
        if entry.get("name") in OVERRIDDEN_VARIABLES
    ]
    if overrides and VISIBILITY_RULE not in told:
        details = tuple(_override(container, entry) for container, entry in overrides)
        causes.append(
            Cause(
                "visible-devices-override",
                "the container sets the variables that say which GPUs it sees: they replace "
                "the ones the device plugin gave",
                "remove "
                + "; ".join(
                    f"env {' and '.join(variables)} from {container}"
                    for container, variables in _by_container(overrides).items()
                )
                + " (the device plugin sets NVIDIA_VISIBLE_DEVICES to the GPUs it allocated)",
                details,
            )
        )
    notes.append(NOT_IN_THE_API)
    return causes, notes


def _by_container(
    overrides: list[tuple[ContainerView, Mapping[str, Any]]],
) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for container, entry in overrides:
        found.setdefault(container.name, []).append(str(entry.get("name")))
    return found


def _asks_gpu(container: ContainerView) -> bool:
    asked = any(q is None or q > 0 for q in container.gpu_quantity.values())
    claims = container.resources.get("claims") if isinstance(container.resources, Mapping) else None
    return asked or bool(claims)


def _no_gpu(view: PodView, policy: Policy) -> Cause:
    resource = next((name for pool in policy.pools for name in pool.resources), "nvidia.com/gpu")
    return Cause(
        "no-gpu-requested",
        "no container asks for a GPU (no GPU resource in resources.limits, no resource "
        "claim): the device plugin gives it none",
        f"set resources.limits[{resource}]: 1 on the container that uses the GPU (in the "
        "workload's pod template), or claim a device through spec.resourceClaims",
    )


def _runtime_class(view: PodView, policy: Policy, node: GpuNode | None) -> Cause | None:
    """The class its GPU Pods run with here (its node's pool's, the policy's default), where
    the Pod names another or none."""
    pools = pools_of(node.info, policy) if node is not None else select_pool(view, policy).pools
    classes = {p.runtime_class for p in pools if p.runtime_class}
    if len(classes) == 1:
        expected = next(iter(classes))
        setting = next(
            f"pools[{i}].runtimeClassName ({p.name})"
            for i, p in enumerate(policy.pools)
            if p.runtime_class == expected and p in pools
        )
    elif not classes and policy.gpu_defaults.runtime_class:
        expected = policy.gpu_defaults.runtime_class
        setting = "spec.mutation.gpuDefaults.runtimeClassName"
    else:
        return None
    actual = view.spec.get("runtimeClassName")
    if actual == expected:
        return None
    written = f'"{actual}"' if actual else "not set"
    return Cause(
        "runtime-class",
        f"spec.runtimeClassName is {written}; GPU Pods here run with RuntimeClass "
        f'"{expected}" ({setting})',
        f"set spec.runtimeClassName: {expected} in the workload's pod template (a Pod's "
        "class cannot change once it exists: recreate it)",
    )


def _privileged(container: Mapping[str, Any]) -> bool:
    context = container.get("securityContext")
    return isinstance(context, Mapping) and context.get("privileged") is True


def _env(container: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    env = container.get("env")
    return [e for e in env if isinstance(e, Mapping)] if isinstance(env, list) else []


def _override(container: ContainerView, entry: Mapping[str, Any]) -> str:
    name = entry.get("name")
    if "valueFrom" in entry:
        return f"{container.name}: {name} is set from valueFrom (a value not known here)"
    value = str(entry.get("value") or "")
    if name == "NVIDIA_VISIBLE_DEVICES" and value in ("void", "none", ""):
        effect = "the runtime gives it no GPU"
    elif name == "CUDA_VISIBLE_DEVICES" and value in ("", "-1"):
        effect = "CUDA sees no GPU"
    else:
        effect = "it names devices of its own choosing"
    return f'{container.name}: {name}="{value}": {effect}'
