"""The lint of the GPU defaults the mutating webhook adds (``spec.mutation.gpuDefaults``, the
pools' classes): settings that cannot mean what they say (a priority class no cluster can
have, a shared memory size in millibytes), that do nothing (mutation disabled), or that refuse
every Pod they reach if the cluster lacks what they name (a RuntimeClass: a note)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.policy.model import Policy
from webhook.policy.quantity import parse_quantity

Report = Callable[[list[Any], str], None]

GPU_DEFAULTS = ["spec", "mutation", "gpuDefaults"]
# The API server's own PriorityClasses: the only ones whose names may start with "system-".
SYSTEM_PRIORITY_CLASSES = ("system-node-critical", "system-cluster-critical")
# A container's own /dev/shm (the container runtimes' default): a smaller volume shrinks it.
RUNTIME_SHM_BYTES = 64 * 2**20


def _priority_classes(spec: dict[str, Any]) -> list[tuple[list[Any], str]]:
    """Every priority class the policy document names, with its path."""
    found: list[tuple[list[Any], str]] = []
    defaults = spec.get("mutation", {}).get("gpuDefaults", {})
    if "priorityClassName" in defaults:
        found.append(([*GPU_DEFAULTS, "priorityClassName"], defaults["priorityClassName"]))
    for i, pool in enumerate(spec.get("pools", [])):
        if "priorityClassName" in pool:
            found.append((["spec", "pools", i, "priorityClassName"], pool["priorityClassName"]))
    return found


def mutation_errors(spec: dict[str, Any], err: Report) -> None:
    """What the schema cannot refuse: a reserved priority class name, a shared memory size
    that is no whole, positive number of bytes."""
    for path, name in _priority_classes(spec):
        if name.startswith("system-") and name not in SYSTEM_PRIORITY_CLASSES:
            err(
                path,
                f"{name!r}: the API server refuses PriorityClasses named system-* other than "
                f"its own ({', '.join(SYSTEM_PRIORITY_CLASSES)}), so no cluster has it and "
                "every Pod given it would be refused; choose another name",
            )
    shared_memory = spec.get("mutation", {}).get("gpuDefaults", {}).get("sharedMemory", {})
    if "sizeLimit" not in shared_memory:
        return
    size = shared_memory["sizeLimit"]
    path = [*GPU_DEFAULTS, "sharedMemory", "sizeLimit"]
    quantity = parse_quantity(size)
    if quantity is None or quantity <= 0:
        err(path, f"{size!r} is no size: write a positive quantity of bytes, e.g. 16Gi")
    elif quantity != int(quantity):
        err(
            path,
            f"{size!r} is not a whole number of bytes ({float(quantity):g}: m means milli); "
            "write Mi or Gi, e.g. 16Gi",
        )


def mutation_warnings(policy: Policy, warn: Report, inform: Report) -> None:
    """Defaults that do nothing, priority classes that outrank the cluster's own components,
    and (a note) the RuntimeClasses every GPU workload would need."""
    defaults = policy.gpu_defaults
    runtime_classes = _classes(policy, "runtime_class", "runtimeClassName")
    priority_classes = _classes(policy, "priority_class", "priorityClassName")
    policy_wide = (
        defaults.runtime_class
        or defaults.priority_class
        or defaults.job_deadline
        or defaults.bare_pod_deadline
        or defaults.shared_memory
    )
    if not policy.mutation_enabled and (policy_wide or runtime_classes or priority_classes):
        warn(
            GPU_DEFAULTS if policy_wide else (runtime_classes or priority_classes)[0][0],
            "the GPU defaults do nothing while spec.mutation.enabled is false: the mutating "
            "webhook adds nothing; enable it (mode: Record to see what it would add first)",
        )
    for path, name in priority_classes:
        if name in SYSTEM_PRIORITY_CLASSES:
            warn(
                path,
                f"{name!r} is the priority of the cluster's own components: GPU workloads "
                "given it would preempt node agents and cluster services when nodes are full; "
                "create a PriorityClass for GPU work instead",
            )
    for path, name in runtime_classes:
        inform(
            path,
            f"GPU workload templates are given runtimeClassName {name!r}: a RuntimeClass that "
            f"does not exist gets every one of their Pods refused; check it with `kubectl get "
            f"runtimeclass {name}` (the GPU Operator's CDI class is nvidia-cdi)",
        )
    size = defaults.shared_memory_size
    if defaults.shared_memory and size is None:
        warn(
            [*GPU_DEFAULTS, "sharedMemory"],
            "shared memory without a sizeLimit can grow to the Pod's memory limit, or with "
            "none to the node's allocatable memory: set sizeLimit (what NCCL needs, several "
            "Gi for a multi-GPU job)",
        )
    quantity = parse_quantity(size) if size is not None else None
    if quantity is not None and 0 < quantity < RUNTIME_SHM_BYTES:
        warn(
            [*GPU_DEFAULTS, "sharedMemory", "sizeLimit"],
            f"{size!r} is less than the 64Mi /dev/shm a container has without it: the volume "
            "would shrink it; write what NCCL needs (several Gi for a multi-GPU job)",
        )


def _classes(policy: Policy, attribute: str, field: str) -> list[tuple[list[Any], str]]:
    """The classes (``attribute`` of the defaults and the pools) the policy names, with the
    path of each (``field``)."""
    found: list[tuple[list[Any], str]] = []
    name = getattr(policy.gpu_defaults, attribute)
    if name:
        found.append(([*GPU_DEFAULTS, field], name))
    for i, pool in enumerate(policy.pools):
        name = getattr(pool, attribute)
        if name:
            found.append((["spec", "pools", i, field], name))
    return found
