"""Host paths that no Pod able to reach a GPU node may mount, and why each one matters.

A path is judged after normalisation (``//``, ``/./``, ``..`` and trailing ``/`` removed) and
with ``/var/run`` read as ``/run``, which it is a symlink to on every current distribution. A
path is refused when it is one of the roots below or lies under one, and also when it is a
parent of one: mounting ``/var/run`` exposes ``/var/run/containerd/containerd.sock``.
"""

from __future__ import annotations

from webhook.policy.model import Policy
from webhook.policy.names import normalise_host_path

# Root -> what mounting it (or anything below it) hands the container. Ordered so that the
# most specific explanation comes first (``/run/containerd`` before ``/run``). The list names
# what is known to hand over the node; ``hostDevices.allowedPaths`` is the complete answer.
REFUSED_ROOTS: dict[str, str] = {
    "/dev": "the node's device nodes (every GPU, also under /dev/char)",
    "/proc": "the host's processes and, through /proc/<pid>/root, their filesystems",
    "/sys": "the kernel's device interfaces (PCI resources of every GPU)",
    "/etc": "the node's configuration and credentials",
    "/boot": "the node's kernel and boot files",
    "/root": "the host root user's home",
    "/home": "users' homes and SSH keys (and GKE's Kubernetes binaries)",
    "/run/containerd": "containerd's socket and state (start any container on the node)",
    "/run/crio": "CRI-O's socket and state (start any container on the node)",
    "/run/docker.sock": "the Docker socket (start any container on the node)",
    "/run/cri-dockerd.sock": "cri-dockerd's socket (start any container on the node)",
    "/run/nvidia": "the GPU driver root, the container toolkit and MPS control pipes",
    "/run/nri": "the NRI socket (a plugin there edits every container's devices and mounts)",
    "/run/cdi": "CDI specs, whose device edits and hooks the runtime applies on the host",
    "/run/systemd": "systemd's private socket (start units on the host)",
    "/run/dbus": "the system D-Bus (start systemd units on the host)",
    "/run": "the sockets and runtime state of the node's services (container runtimes, "
    "systemd, udev)",
    "/var/lib/kubelet": "the kubelet's state: device-plugin and pod-resources sockets and "
    "other Pods' volumes",
    "/var/lib/containerd": "containerd's state and every container's filesystem",
    "/var/lib/docker": "Docker's state and every container's filesystem",
    "/var/lib": "the state of the node's services (kubelet, container runtimes, cloud-init)",
    "/var/log": "the node's logs, which the kubelet reads as root, symlinks and all",
    "/var/spool": "the node's cron and mail spools, run as root",
    "/var/snap": "snaps' state, MicroK8s' containerd included",
    "/usr": "the host's programs, run by the host as root",
    "/bin": "the host's programs, run by the host as root",
    "/sbin": "the host's programs, run by the host as root",
    "/lib": "the host's libraries and kernel modules",
    "/lib64": "the host's libraries",
    "/opt/bin": "the node's Kubernetes binaries (Flatcar)",
    "/opt/cni": "the CNI plugins, run by the kubelet as root",
    "/opt/nri": "NRI plugins, run by the container runtime",
    "/mnt/stateful_partition": "the node's /home and /var under another name (GKE's "
    "Container-Optimized OS)",
}
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


def canonical(path: str) -> str:
    """The path as the kubelet mounts it, ``/var/run`` read as ``/run``."""
    normal = normalise_host_path(path)
    if normal == "/var/run" or normal.startswith("/var/run/"):
        return normal[len("/var") :]
    return normal


def _at_or_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def touches(path: str, root: str) -> bool:
    """``path`` is ``root``, below it, or a parent of it: mounting it exposes ``root``."""
    return _at_or_under(path, root) or _at_or_under(root, path)


def refusal(raw: str, policy: Policy) -> str | None:
    """Why a reachable Pod may not mount this host path; None when it may."""
    path = canonical(raw)
    if not path.startswith("/"):
        return "a relative path, which the kubelet resolves against its own working directory"
    if path == "/":
        return "the host's whole filesystem"
    for root, reason in REFUSED_ROOTS.items():
        if touches(path, root):
            return reason if _at_or_under(path, root) else f"{root}: {reason}"
    for root in policy.host_device_paths:
        if touches(path, root):
            return f"{root}, which the policy lists as a host device path"
    allowed = policy.host_path_allow_list
    if allowed is not None and not any(_at_or_under(path, p) for p in allowed):
        shown = ", ".join(allowed) if allowed else "none"
        return f"a path outside the policy's allowed host paths ({shown})"
    return None


def is_gpu_device_path(raw: str, policy: Policy) -> bool:
    """A hostPath at or under a GPU device node (``/dev/nvidia*``, ``/dev/char``, ``/dev/dri``,
    ``/proc/driver/nvidia``) or a path the policy lists."""
    path = canonical(raw)
    return path.startswith(GPU_DEVICE_PREFIX) or any(
        _at_or_under(path, root) for root in (*GPU_DEVICE_ROOTS, *policy.host_device_paths)
    )


def in_device_list_dir(mount_path: str) -> bool:
    """A container mount the toolkit would read as a device request (a relative mount path
    is resolved against the container's root)."""
    if DEVICE_LIST_DIR_NAME not in mount_path:
        return False
    path = canonical(mount_path if mount_path.startswith("/") else f"/{mount_path}")
    return any(_at_or_under(path, d) for d in DEVICE_LIST_DIRS)
