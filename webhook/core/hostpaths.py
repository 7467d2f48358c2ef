"""What a host path exposes to a Pod that can reach a GPU node, in three classes.

(a) Node-control paths (``webhook.policy.hostpaths.NODE_CONTROL``): always refused, at, below
or above them (mounting ``/var/run`` exposes ``/var/run/containerd/containerd.sock``), whatever
the policy allows. (b) Other tenants' data (``TENANT_DATA``: local-volume provisioners'
directories, cloud local SSDs): refused unless the policy's allow-list names them. (c)
Everything else: by the policy's ``hostDevices.allowedPaths`` and the namespace's ``hostPaths``
grants; a path on neither is refused, or only warned when the policy lists no allowed paths
and its ``newChecks`` is Warn (an upgrade must not break GPU Pods that mount a dataset).
Paths are judged canonical: normalised, ``/var/run`` read as ``/run``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from webhook.policy.hostpaths import (
    TENANT_DATA,
    at_or_under,
    canonical,
    exposure,
    node_control,
    touched,
    touches,
)
from webhook.policy.model import Policy
from webhook.policy.tenants import Grants

RefusalKind = Literal["node-control", "tenant-data", "unlisted"]


class Refusal(NamedTuple):
    """Why a Pod may not mount a host path: what it exposes, and which class it is in
    (``unlisted``: only because no allow-list names it, which the policy may only warn
    about); ``listed``: the allowed paths there are, for the message."""

    reason: str
    kind: RefusalKind
    listed: tuple[str, ...] = ()


# Mounts the container toolkit reads as device requests (volume-mounts device-list strategy).
DEVICE_LIST_DIRS = ("/run/nvidia-container-devices",)
# The last component of every one of them: normalising a path only drops components, so a
# path without it is not at or under any (checked before the costlier normalising).
DEVICE_LIST_DIR_NAME = "nvidia-container-devices"
# GPU device nodes and the driver's view of them: mounting one is aiming at a GPU (a reachability
# signal). Mounting /dev, /proc or / is refused on GPU nodes too, but node agents do it on every
# node, so it is a finding, not a signal: it does not bring a Pod onto a GPU node.
GPU_DEVICE_ROOTS = ("/dev/char", "/dev/dri", "/proc/driver/nvidia")
GPU_DEVICE_PREFIX = "/dev/nvidia"


def refusal(raw: str, policy: Policy, grants: Grants) -> Refusal | None:
    """Why a Pod of a namespace with these grants, able to reach a GPU node, may not mount
    this host path; None when it may."""
    path = canonical(raw)
    reason = node_control(path)
    if reason is not None:
        return Refusal(reason, "node-control")
    for root in policy.host_device_paths:
        if touches(path, root):
            return Refusal(f"{root}, which the policy lists as a host device path", "node-control")
    listed = (*(policy.host_path_allow_list or ()), *grants.host_paths)
    if any(at_or_under(path, p) for p in listed):
        return None
    entry = touched(path, TENANT_DATA)
    if entry is not None:
        return Refusal(exposure(path, entry), "tenant-data")
    return Refusal("a path not on the policy's allowed host paths", "unlisted", listed)


def is_gpu_device_path(raw: str, policy: Policy) -> bool:
    """A hostPath at or under a GPU device node (``/dev/nvidia*``, ``/dev/char``, ``/dev/dri``,
    ``/proc/driver/nvidia``) or a path the policy lists."""
    path = canonical(raw)
    return path.startswith(GPU_DEVICE_PREFIX) or any(
        at_or_under(path, root) for root in (*GPU_DEVICE_ROOTS, *policy.host_device_paths)
    )


def in_device_list_dir(mount_path: str) -> bool:
    """A container mount the toolkit would read as a device request (a relative mount path
    is resolved against the container's root). Compared as the toolkit compares it, by string
    prefix: ``/var/run/nvidia-container-devicesall`` is the device ``all`` to it."""
    if DEVICE_LIST_DIR_NAME not in mount_path:
        return False
    path = canonical(mount_path if mount_path.startswith("/") else f"/{mount_path}")
    return any(path.startswith(d) for d in DEVICE_LIST_DIRS)
