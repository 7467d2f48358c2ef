"""No hostPath volumes that expose the node's devices or control paths.

Restricted, after normalisation (``//``, ``/./``, ``..``, a trailing ``/``; ``/var/run`` read
as ``/run``): ``/`` itself; ``/dev``, ``/proc`` and ``/sys`` and everything under them (device
nodes also live under ``/dev/char``, and ``/proc/1/root`` is the host's ``/``); ``/etc``,
``/boot``, ``/root``, ``/home``; ``/run`` (every service's socket: container runtimes,
systemd, D-Bus, udev, NRI, CDI, the GPU driver root ``/run/nvidia``); ``/var/lib`` (the
kubelet's and the runtimes' state), ``/var/log`` (which the kubelet reads as root),
``/var/spool``, ``/var/snap``; the host's programs and libraries (``/usr``, ``/bin``,
``/sbin``, ``/lib``, ``/opt/bin``, ``/opt/cni``, ``/opt/nri``); GKE's
``/mnt/stateful_partition``; the paths the policy adds; a parent of any of them (``/var``
exposes ``/var/lib``); relative paths. The list names what is known to hand over a node; with
``hostDevices.allowedPaths``, only the listed paths and what is below them may be mounted.
Allowed: data directories such as ``/data``, ``/mnt/...`` or ``/scratch``. The kubelet follows
symlinks on the node, which no admission webhook sees: a Pod that may write to an allowed host
directory can plant one there.
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
    for index, volume in enumerate(volumes if isinstance(volumes, list) else ()):
        host_path = volume.get("hostPath") if isinstance(volume, dict) else None
        if not isinstance(host_path, dict) or not isinstance(host_path.get("path"), str):
            continue
        name = str(volume.get("name", f"#{index}"))
        path = f"{view.field_path('volumes')}[{index}].hostPath.path"
        yield from _judge(view, policy, host_path["path"], path, f"hostPath volume {quote(name)}")
    for path, raw in view.host_paths:
        field = path.rpartition(".")[2]
        yield from _judge(view, policy, raw, path, f"{field} (a hostPath volume of the Pod)")


def _judge(
    view: PodView, policy: Policy, raw: str, field_path: str, subject: str
) -> Iterator[Violation]:
    reason = refusal(raw, policy)
    if reason is None:
        return
    path = canonical(raw)
    shown = f"{quote(raw)} (that is {quote(path)})" if path != raw else quote(raw)
    yield Violation(
        rule=RULE,
        path=field_path,
        value=raw,
        message=f"{subject} mounts {shown}, which exposes " + advice.why(view, policy, reason),
        hint=advice.fix(
            view,
            policy,
            "remove the volume, or mount a data directory (e.g. /data) instead",
            gpu="request GPUs in resources.limits: the device plugin mounts the allocated devices",
        ),
        subject=subject,
        field="volumes.hostPath.path",
    )
