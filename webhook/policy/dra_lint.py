"""The lint of the policy's ``dra`` block and of the tenants' DRA entitlements: names that
cannot mean what they say.

Errors (the policy is refused): a feature gate NVIDIA's driver does not have (a near miss
names the gate meant), and a combination of gates the driver refuses to start with
(``nvidia_dra.GATES_REQUIRED``, ``GATES_EXCLUSIVE``): the policy would describe a driver that
cannot run. Warnings: a device class an entitlement lists that the policy does not know as a
GPU class (without the node inventory its claims are never refused, so the list limits
nothing of it), and likewise a device class a pool declares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.policy import nvidia_dra
from webhook.policy.dra import near_miss
from webhook.policy.model import Policy

Report = Callable[[list[Any], str], None]
GATES = ["spec", "dra", "nvidiaDriver", "featureGates"]


def dra_errors(spec: dict[str, Any], err: Report) -> None:
    gates = spec.get("dra", {}).get("nvidiaDriver", {}).get("featureGates", {})
    for name in gates:
        if name not in nvidia_dra.FEATURE_GATES:
            meant = near_miss(name, nvidia_dra.FEATURE_GATES)
            err(
                [*GATES, name],
                f"NVIDIA's DRA driver has no feature gate {name!r}"
                + (f" (did you mean {meant!r}?)" if meant else "")
                + f"; its gates: {', '.join(sorted(nvidia_dra.FEATURE_GATES))}",
            )
    enabled = {**nvidia_dra.FEATURE_GATES, **gates}
    for gate, needs in nvidia_dra.GATES_REQUIRED:
        if enabled.get(gate) and not enabled.get(needs):
            err([*GATES, gate], f"the driver does not start with {gate} on and {needs} off")
    for first, second in nvidia_dra.GATES_EXCLUSIVE:
        if enabled.get(first) and enabled.get(second):
            err([*GATES, second], f"the driver does not start with both {first} and {second} on")


def dra_warnings(policy: Policy, warn: Report) -> None:
    gpu_classes = {name for name, known in policy.dra.classes.items() if known.gpu}
    for index, pool in enumerate(policy.pools):
        for name in sorted(pool.device_classes - gpu_classes):
            meant = near_miss(name, gpu_classes)
            warn(
                ["spec", "pools", index, "deviceClasses"],
                f"{name!r} is not a GPU device class this policy knows, so no claim chooses "
                f"pool {pool.name!r} by it: declare it in dra.deviceClasses"
                + (f" (or did you mean {meant!r}?)" if meant else ""),
            )
    for tenant in policy.tenants:
        entitled = tenant.entitlements
        if entitled is None or entitled.device_classes is None:
            continue
        for name in sorted(entitled.device_classes - gpu_classes):
            warn(
                ["spec", "tenants", tenant.index, "entitlements", "deviceClasses"],
                f"{name!r} is not a GPU device class this policy knows, so listing it limits "
                "nothing: declare it in dra.deviceClasses"
                + (
                    f" (or did you mean {meant!r}?)"
                    if (meant := near_miss(name, gpu_classes))
                    else ""
                ),
            )
