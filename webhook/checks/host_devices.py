"""No hostPath volumes that expose GPU device nodes.

Restricted: hostPath volumes whose normalised path is ``/``, ``/dev``, or ``/dev/nvidia*``
(``/dev/nvidia0``, ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-caps/...``), plus the
paths the policy adds (e.g. ``/dev/dri``) and everything below them. ``//``, ``/./``, ``..``
and a trailing ``/`` are normalised away first, so ``//dev/./nvidia0/`` is caught. Allowed:
any other hostPath (other policies may restrict those).
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView
from webhook.policy.model import Policy
from webhook.policy.names import normalise_host_path as normalise

RULE = "host-devices"


def exposes_gpu(path: str, extra: tuple[str, ...]) -> bool:
    if path in ("/", "/dev") or path.startswith("/dev/nvidia"):
        return True
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in extra)


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    volumes = view.spec.get("volumes")
    if not isinstance(volumes, list):
        return
    extra = policy.host_device_paths  # normalised when the policy was compiled
    for index, volume in enumerate(volumes):
        host_path = volume.get("hostPath") if isinstance(volume, dict) else None
        if not isinstance(host_path, dict) or not isinstance(host_path.get("path"), str):
            continue
        raw = host_path["path"]
        path = normalise(raw)
        if exposes_gpu(path, extra):
            name = str(volume.get("name", f"#{index}"))
            shown = f"{quote(raw)} (that is {quote(path)})" if path != raw else repr(raw)
            yield Violation(
                rule=RULE,
                path=f"{view.spec_path}.volumes[{index}].hostPath.path",
                value=raw,
                message=f"hostPath volume {quote(name)} mounts {shown}, which exposes GPU device "
                "nodes and bypasses the device plugin",
                hint="remove the volume and request GPUs in resources.limits; the device "
                "plugin mounts the allocated devices",
                subject=name,
                field="volumes.hostPath.path",
            )
