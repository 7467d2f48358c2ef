"""No device-visibility tricks.

Restricted: a container that requests no GPU yet sets ``NVIDIA_VISIBLE_DEVICES`` (other than
``void`` or ``none``) or ``NVIDIA_DRIVER_CAPABILITIES``: where the node's container toolkit
honours the variable for unprivileged containers, it hands over GPUs the scheduler never
allocated. A value from ``valueFrom`` cannot be checked, so it is denied; ``envFrom`` cannot be
seen at all, so it is warned. ``cdi.k8s.io/*`` annotations, which ask the runtime for devices
directly, are denied. Allowed: the variables in containers that request a GPU (the device
plugin overrides them), and ``NVIDIA_VISIBLE_DEVICES=void``.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core.findings import Violation, quote
from webhook.core.pods import CDI_PREFIX, PodView
from webhook.policy.model import Policy

RULE = "device-visibility"
HARMLESS = ("void", "none")


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    for container in view.containers:
        if container.requests_declared_gpu(policy):
            continue
        env = container.spec.get("env")
        voided = False
        for index, var in enumerate(env if isinstance(env, list) else ()):
            if not isinstance(var, dict):
                continue
            name = var.get("name")
            if name not in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"):
                continue
            field = f"{container.list_name}.env[{name}]"
            if "valueFrom" in var:
                yield Violation(
                    rule=RULE,
                    path=f"{container.path}.env[{index}].valueFrom",
                    value=name,
                    message=f"{name} from valueFrom cannot be checked, in container "
                    f"{quote(container.name)} that requests no GPU",
                    hint="remove the variable, or request the GPU in resources.limits",
                    error_type="Forbidden",
                    subject=container.name,
                    field=field,
                )
                continue
            value = var.get("value", "")
            if name == "NVIDIA_VISIBLE_DEVICES" and str(value).strip().lower() in HARMLESS:
                voided = True
                continue
            yield Violation(
                rule=RULE,
                path=f"{container.path}.env[{index}].value",
                value=value,
                message=f"container {quote(container.name)} requests no GPU but sets {name}, which "
                "can expose GPUs the scheduler never allocated",
                hint="remove the variable and request GPUs in resources.limits "
                "(NVIDIA_VISIBLE_DEVICES=void is allowed)",
                subject=container.name,
                field=field,
            )
        # An explicit env entry overrides envFrom, so NVIDIA_VISIBLE_DEVICES=void settles it.
        if container.spec.get("envFrom") and not voided:
            yield Violation(
                rule=RULE,
                path=f"{container.path}.envFrom",
                value=None,
                message=f"container {quote(container.name)} requests no GPU and takes variables "
                "from envFrom, which may set NVIDIA_VISIBLE_DEVICES unseen",
                hint="set NVIDIA_VISIBLE_DEVICES=void in env (it overrides envFrom), or "
                "enable deviceVisibility.injectVoid in the policy",
                error_type="Forbidden",
                subject=container.name,
                field=f"{container.list_name}.envFrom",
                advisory=True,
            )
    for key in view.annotations:
        if isinstance(key, str) and key.startswith(CDI_PREFIX):
            yield Violation(
                rule=RULE,
                path=f"{view.metadata_path}.annotations[{key}]",
                value=view.annotations[key],
                message="CDI annotations request devices from the runtime directly, past the "
                "scheduler and the device plugin",
                hint="request GPUs in resources.limits, or run in a namespace the policy exempts",
                subject="annotations",
                field=f"annotations[{key}]",
            )
