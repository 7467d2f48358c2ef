"""No hostPath volumes that expose the node's devices or control paths.

Restricted, after normalisation (``//``, ``/./``, ``..``, a trailing ``/``; ``/var/run`` read
as ``/run``): ``/`` itself; ``/dev``, ``/proc`` and ``/sys`` and everything under them (device
nodes also live under ``/dev/char``, and ``/proc/1/root`` is the host's ``/``); ``/etc``,
``/boot``, ``/root``; the container runtimes' and the kubelet's state and sockets
(containerd, CRI-O, Docker, cri-dockerd, k3s, k0s, Podman, MicroK8s, ``/var/lib/kubelet``);
NRI and CDI (``/run/nri``, ``/opt/nri``, ``/run/cdi``); the node's logs (``/var/log``, which
the kubelet reads as root); the system D-Bus and systemd sockets; the host's programs and
libraries (``/usr``, ``/bin``, ``/sbin``, ``/lib``, ``/opt/cni``); the GPU driver root
``/run/nvidia``; the paths the policy adds; a parent of any of them (``/var/run`` exposes the
runtime sockets); relative paths. With ``hostDevices.allowedPaths``, only the listed paths
and what is below them may be mounted. Allowed: data directories such as ``/data``,
``/mnt/...`` or ``/scratch``. The kubelet follows symlinks on the node, which no admission
webhook sees: a Pod that may write to an allowed host directory can plant one there.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core import advice
from webhook.core.findings import Violation, quote
from webhook.core.hostpaths import canonical, refusal
from webhook.core.pods import PodView
from webhook.policy.model import Policy

RULE = "host-devices"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    volumes = view.spec.get("volumes")
    if not isinstance(volumes, list):
        return
    for index, volume in enumerate(volumes):
        host_path = volume.get("hostPath") if isinstance(volume, dict) else None
        if not isinstance(host_path, dict) or not isinstance(host_path.get("path"), str):
            continue
        raw = host_path["path"]
        reason = refusal(raw, policy)
        if reason is None:
            continue
        path = canonical(raw)
        name = str(volume.get("name", f"#{index}"))
        shown = f"{quote(raw)} (that is {quote(path)})" if path != raw else quote(raw)
        yield Violation(
            rule=RULE,
            path=f"{view.spec_path}.volumes[{index}].hostPath.path",
            value=raw,
            message=f"hostPath volume {quote(name)} mounts {shown}, which exposes "
            + advice.why(view, policy, reason),
            hint=advice.fix(
                view,
                policy,
                "remove the volume, or mount a data directory (e.g. /data) instead",
                gpu="request GPUs in resources.limits: the device plugin mounts the allocated "
                "devices",
            ),
            subject=name,
            field="volumes.hostPath.path",
        )
