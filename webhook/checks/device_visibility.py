"""No device-visibility tricks: a container sees only the GPUs the scheduler allocated to it.

Restricted, in every container of a Pod that can reach a GPU node:

- ``NVIDIA_VISIBLE_DEVICES`` with any value but ``void`` or ``none`` (a ``valueFrom`` cannot
  be checked, so it is refused too), even in a container that requests a GPU: the kubelet
  puts the device plugin's variables first and the container's own after them, so with the
  ``envvar`` device-list strategy and a toolkit that accepts the variable from unprivileged
  containers, the container's value wins;
- ``NVIDIA_MIG_CONFIG_DEVICES``, ``NVIDIA_MIG_MONITOR_DEVICES`` and ``NVIDIA_IMEX_CHANNELS``;
- a volume mount at or under ``/var/run/nvidia-container-devices`` (or ``/run/...``), which the
  toolkit reads as device requests with the ``volume-mounts`` strategy;
- the toolkit's other variables (``NVIDIA_DRIVER_CAPABILITIES``, ``NVIDIA_REQUIRE_*``,
  ``NVIDIA_DISABLE_REQUIRE``, ``NVIDIA_GDRCOPY``, ``NVIDIA_GDS``, ``NVIDIA_MOFED``,
  ``NVIDIA_NVSWITCH``) in a container that requests no GPU;
- the node-shared device variables (``NVIDIA_MOFED``, ``NVIDIA_NVSWITCH``, ``NVIDIA_GDRCOPY``,
  ``NVIDIA_GDS``) in a container that requests a GPU, unless a tenant grant names them: they add
  devices the node shares between its GPU Pods (warned while the policy's ``newChecks`` is
  Warn; the device plugin sets ``NVIDIA_MOFED``, ``NVIDIA_GDS`` and ``NVIDIA_GDRCOPY`` itself
  where it is told to);
- ``CUDA_VERSION`` in a container that requests no GPU and sets neither ``NVIDIA_REQUIRE_CUDA``
  nor ``NVIDIA_VISIBLE_DEVICES``: the toolkit takes the image for a legacy CUDA image and exposes
  every GPU (as ``NVIDIA_VISIBLE_DEVICES=all`` would);
- CDI annotations (``cdi.k8s.io/*``, ``nvidia.cdi.k8s.io/*``), which ask the runtime for devices
  directly, and containerd NRI's ``cdi-devices.noderesource.dev`` (older ``cdi-devices.nri.io``)
  unless a tenant grant names the key;
- with ``deviceVisibility.injectVoid``, a Pod (not a template) that can reach a GPU node, whose
  containers that request no GPU lack ``NVIDIA_VISIBLE_DEVICES=void`` (a Pod that reaches GPU
  nodes only through a wildcard toleration is warned).

Warned: ``envFrom``, which may set a variable unseen, in a container without an explicit
``NVIDIA_VISIBLE_DEVICES=void``. Allowed: the tuning variables in containers that request a
GPU; ``NVIDIA_VISIBLE_DEVICES=void``; ``NVIDIA_*`` names the toolkit does not read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from webhook.core import advice, injection
from webhook.core.findings import Violation, quote
from webhook.core.hostpaths import in_device_list_dir
from webhook.core.pods import CUDA_VERSION, ContainerView, PodView, grants_of, is_cdi_annotation
from webhook.core.scope import (
    NO_DEVICES,
    NODE_SHARED_VARIABLES,
    VISIBLE_DEVICES,
    WIDENING_VARIABLES,
    reach,
    requests_gpu,
    surely_gets_gpu,
    toolkit_env,
)
from webhook.policy.model import Policy

RULE = "device-visibility"
VOID_ENTRY = f"{VISIBLE_DEVICES}=void"
REQUIRE_CUDA = "NVIDIA_REQUIRE_CUDA"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    require_void = _void_requirement(view, policy) if policy.inject_void else None
    for container in view.containers:
        gpu = requests_gpu(container)
        surely = surely_gets_gpu(container)
        voided = requires_cuda = sets_visibility = False
        for index, var in toolkit_env(container) if container.nvidia_env else ():
            name = var["name"]
            value = var.get("value", "")
            requires_cuda = requires_cuda or name == REQUIRE_CUDA
            sets_visibility = sets_visibility or name == VISIBLE_DEVICES
            # Exactly as the toolkit compares it: " VOID " is a device list it cannot resolve.
            if name == VISIBLE_DEVICES and "valueFrom" not in var and value in NO_DEVICES:
                voided = True
                continue
            if name not in WIDENING_VARIABLES and gpu:
                if name in NODE_SHARED_VARIABLES and (
                    name not in grants_of(view, policy).toolkit_variables
                ):
                    yield _node_shared(container, index, var, policy)
                continue  # tunes the GPU the container was given
            yield _variable(view, policy, container, index, var, gpu)
        # Only where the toolkit would default to every GPU: a value of its own is judged above.
        legacy = not (surely or requires_cuda or sets_visibility)
        if legacy and container.cuda_version_index >= 0:
            yield _legacy_cuda(view, policy, container)
        mounts = container.spec.get("volumeMounts")
        for index, mount in enumerate(mounts if isinstance(mounts, list) else ()):
            path = mount.get("mountPath") if isinstance(mount, dict) else None
            if isinstance(path, str) and in_device_list_dir(path):
                yield Violation(
                    rule=RULE,
                    path=f"{container.path}.volumeMounts[{index}].mountPath",
                    value=path,
                    message=f"container {quote(container.name)} mounts {quote(path)}, which the "
                    "container toolkit reads as a list of devices to expose",
                    hint=advice.fix(
                        view,
                        policy,
                        "mount the volume elsewhere",
                        gpu="request GPUs in resources.limits",
                    ),
                    subject=container.name,
                    field=f"{container.list_name}.volumeMounts[{path}]",
                )
        if voided:
            continue
        if container.spec.get("envFrom"):
            # An explicit env entry overrides envFrom, so NVIDIA_VISIBLE_DEVICES=void settles it.
            yield Violation(
                rule=RULE,
                path=f"{container.path}.envFrom",
                value=None,
                message=f"container {quote(container.name)} takes variables from envFrom, which "
                f"may set {VISIBLE_DEVICES} unseen",
                hint="set the variables it needs in env"
                if gpu
                else f"set {VOID_ENTRY} in env (it overrides envFrom), or enable "
                "deviceVisibility.injectVoid in the policy",
                error_type="Forbidden",
                subject=container.name,
                field=f"{container.list_name}.envFrom",
                advisory=True,
            )
        if require_void is not None and not surely and not _sets_visibility(container):
            yield Violation(
                rule=RULE,
                path=f"{container.path}.env",
                value=None,
                message=f"container {quote(container.name)} {_no_gpu(container)} and lacks "
                f"{VOID_ENTRY}, which the policy requires in every such container of a Pod that "
                "can reach GPU nodes: without it, an image's own NVIDIA_VISIBLE_DEVICES decides "
                "which GPUs it sees",
                hint=f"add {{name: {VISIBLE_DEVICES}, value: void}} to env"
                + (
                    " (kubectl debug --env NVIDIA_VISIBLE_DEVICES=void)"
                    if container.list_name == "ephemeralContainers"
                    else " (the mutating webhook adds it when it reaches the Pod)"
                ),
                error_type="Required value",
                subject=container.name,
                field=f"{container.list_name}.env[{VISIBLE_DEVICES}]",
                advisory=require_void,
            )
    yield from injection.refused(view, policy, RULE) if view.annotations else ()
    for key in view.annotations:
        if is_cdi_annotation(key):
            yield Violation(
                rule=RULE,
                path=f"{view.metadata_path}.annotations[{key}]",
                value=view.annotations[key],
                message="CDI annotations request devices from the runtime directly, past the "
                "scheduler and the device plugin",
                hint=advice.fix(
                    view,
                    policy,
                    "remove the annotation",
                    gpu="request GPUs in resources.limits, or run in a namespace the policy "
                    "exempts",
                ),
                subject="annotations",
                field=f"annotations[{key}]",
            )


def _variable(
    view: PodView,
    policy: Policy,
    container: ContainerView,
    index: int,
    var: dict[str, Any],
    gpu: bool,
) -> Violation:
    name = var["name"]
    field = f"{container.list_name}.env[{name}]"
    if "valueFrom" in var:
        return Violation(
            rule=RULE,
            path=f"{container.path}.env[{index}].valueFrom",
            value=name,
            message=f"container {quote(container.name)} sets {name} from valueFrom, which cannot "
            "be checked and can expose GPUs the scheduler never allocated to it",
            hint=advice.fix(
                view,
                policy,
                "remove the variable",
                gpu="the device plugin sets the devices of the GPUs it allocates",
            ),
            error_type="Forbidden",
            subject=container.name,
            field=field,
        )
    if gpu:
        why = (
            f"a container's own {name} can override the devices the device plugin allocated "
            "(the kubelet puts the container's variables after the plugin's)"
        )
        remedy = "remove the variable: the device plugin sets the devices of the GPUs it allocates"
    elif name in WIDENING_VARIABLES:
        why = f"{name} can expose GPUs the scheduler never allocated"
        remedy = "remove the variable" + (
            f" or set {VOID_ENTRY}" if name == VISIBLE_DEVICES else ""
        )
    else:
        why = f"{name} only means something to a container that is given a GPU"
        remedy = "remove the variable"
    return Violation(
        rule=RULE,
        path=f"{container.path}.env[{index}].value",
        value=var.get("value", ""),
        message=f"container {quote(container.name)} must not set {name}: "
        + advice.why(view, policy, why),
        hint=advice.fix(view, policy, remedy),
        subject=container.name,
        field=field,
    )


def _node_shared(
    container: ContainerView, index: int, var: dict[str, Any], policy: Policy
) -> Violation:
    name = var["name"]
    return Violation(
        rule=RULE,
        path=f"{container.path}.env[{index}].value",
        value=var.get("value", ""),
        message=f"container {quote(container.name)} sets {name}, which adds devices its node "
        "shares between GPU Pods (RDMA, NVSwitch, GPUDirect), past the device plugin's "
        "allocation",
        hint="remove the variable (the device plugin sets NVIDIA_MOFED, NVIDIA_GDS and "
        "NVIDIA_GDRCOPY where it is told to), or have the platform team grant it to the "
        "namespace (spec.tenants[].grants.toolkitVariables)",
        subject=container.name,
        field=f"{container.list_name}.env[{name}]",
        # New in this release: warned at most while the policy's newChecks is Warn.
        advisory=policy.new_checks_advisory,
    )


def _no_gpu(container: ContainerView) -> str:
    """Why the container is not known to be handed a GPU, for messages."""
    if container.may_claim_gpu:
        return "uses a DRA claim the webhook cannot read as a GPU"
    return "requests no GPU"


def _legacy_cuda(view: PodView, policy: Policy, container: ContainerView) -> Violation:
    index = container.cuda_version_index
    return Violation(
        rule=RULE,
        path=f"{container.path}.env[{index}].name",
        value=CUDA_VERSION,
        message=f"container {quote(container.name)} {_no_gpu(container)} and sets {CUDA_VERSION} "
        f"without {VISIBLE_DEVICES}: "
        + advice.why(
            view,
            policy,
            "the container toolkit takes it for a legacy CUDA image and exposes every GPU of "
            f"the node, as {VISIBLE_DEVICES}=all would",
        ),
        hint=advice.fix(
            view,
            policy,
            f"add {{name: {VISIBLE_DEVICES}, value: void}} to env, or remove {CUDA_VERSION}",
        ),
        subject=container.name,
        field=f"{container.list_name}.env[{CUDA_VERSION}]",
    )


def _sets_visibility(container: ContainerView) -> bool:
    return any(var["name"] == VISIBLE_DEVICES for _, var in container.nvidia_env)


def _void_requirement(view: PodView, policy: Policy) -> bool | None:
    """None: not required; False: required (denied when missing); True: advisory (warned)."""
    if not policy.inject_void or view.kind != "Pod" or view.spec_path != "spec":
        return None
    scope = reach(view, policy).scope
    if scope == "gpuPods":
        return False
    return True if scope == "reachablePods" else None
