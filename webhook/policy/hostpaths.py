"""The host paths a policy can never allow, and the host paths that hold other tenants' data.

Two catalogues, each entry with what it exposes and where that comes from:

- :data:`NODE_CONTROL` (class a): paths that hand over the node: its devices, processes,
  configuration, programs, the kubelet's and the container runtimes' state and sockets,
  wherever a distribution keeps them (``/var/home`` is ``/home`` on Fedora CoreOS and RHCOS,
  ``/mnt/k8s-disks/0`` holds the kubelet's directory on EKS nodes with instance-store RAID0).
  A Pod that can reach a GPU node may not mount one, below one, or a parent of one, whatever
  the policy allows; an allowed path that touches one is a policy error.
- :data:`TENANT_DATA` (class b): the data directories of local-volume provisioners and cloud
  local-SSD mounts, where every other Pod's local volumes are. Refused unless the policy's
  allow-list names them.

Everything else (class c) is judged by the policy's ``hostDevices.allowedPaths`` and the
tenants' ``hostPaths`` grants (``webhook.core.hostpaths``).

Paths are compared after normalisation (``//``, ``/./``, ``..``, a trailing ``/``) with
``/var/run`` read as ``/run`` and ``/var/lock`` as ``/run/lock``, which they are symlinks to on
every current distribution. The
kubelet follows other symlinks on the node, which no webhook sees; this is why relocations
are listed by both their names where a distribution has two (``/home`` and ``/var/home``).
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.policy.names import normalise_host_path


@dataclass(frozen=True, slots=True)
class HostPath:
    """A catalogued host path: what mounting it (or anything below it) exposes, and the
    documentation or source that says the path holds it."""

    path: str
    exposes: str
    source: str


def _top(path: str) -> str:
    """A canonical path's first component: ``var`` for ``/var/lib``."""
    return path[1:].partition("/")[0]


class Catalogue(tuple[HostPath, ...]):
    """Catalogued host paths, in order, indexed by their first component: a path can only be,
    lie under or hold one with the same first component, so a host path is compared with the
    few entries that can touch it, not with all of them (an Argo Workflow's inherited volumes
    are judged once for each of its hundreds of templates)."""

    by_top: dict[str, tuple[HostPath, ...]]

    def __new__(cls, entries: tuple[HostPath, ...]) -> Catalogue:
        catalogue = super().__new__(cls, entries)
        index: dict[str, list[HostPath]] = {}
        for entry in entries:
            index.setdefault(_top(entry.path), []).append(entry)
        catalogue.by_top = {top: tuple(found) for top, found in index.items()}
        return catalogue


_PROGRAMS = "the host's programs, run by the host as root"
_RUNTIME = "start any container on the node"

# Ordered so that the most specific explanation comes first (``/run/containerd`` before
# ``/run``): a path is explained by the first entry it touches.
_NODE_CONTROL: tuple[HostPath, ...] = (
    HostPath("/dev", "the node's device nodes (every GPU, also under /dev/char)", "Linux FHS"),
    HostPath(
        "/proc",
        "the host's processes and, through /proc/<pid>/root, their filesystems",
        "proc(5)",
    ),
    HostPath("/sys", "the kernel's device interfaces (PCI resources of every GPU)", "sysfs(5)"),
    HostPath("/etc", "the node's configuration and credentials", "Linux FHS"),
    HostPath("/boot", "the node's kernel and boot files", "Linux FHS"),
    HostPath("/root", "the host root user's home", "Linux FHS"),
    HostPath("/home", "users' homes and SSH keys (and GKE's Kubernetes binaries)", "Linux FHS"),
    HostPath(
        "/run/containerd",
        f"containerd's socket and state ({_RUNTIME})",
        "containerd docs/ops.md",
    ),
    HostPath("/run/crio", f"CRI-O's socket and state ({_RUNTIME})", "cri-o crio.conf(5)"),
    HostPath("/run/docker.sock", f"the Docker socket ({_RUNTIME})", "Docker daemon docs"),
    HostPath("/run/cri-dockerd.sock", f"cri-dockerd's socket ({_RUNTIME})", "Mirantis/cri-dockerd"),
    HostPath(
        "/run/nvidia",
        "the GPU driver root, the container toolkit and MPS control pipes",
        "NVIDIA GPU Operator (driver container root)",
    ),
    HostPath(
        "/run/nri",
        "the NRI socket (a plugin there edits every container's devices and mounts)",
        "containerd/nri README",
    ),
    HostPath(
        "/run/cdi",
        "CDI specs, whose device edits and hooks the runtime applies on the host",
        "cncf-tags/container-device-interface SPEC.md",
    ),
    HostPath("/run/systemd", "systemd's private socket (start units on the host)", "systemd(1)"),
    HostPath("/run/dbus", "the system D-Bus (start systemd units on the host)", "dbus-daemon(1)"),
    HostPath(
        "/run",
        "the sockets and runtime state of the node's services (container runtimes, systemd, "
        "udev, k3s)",
        "Linux FHS",
    ),
    HostPath(
        "/var/lib/kubelet",
        "the kubelet's state: device-plugin and pod-resources sockets and other Pods' volumes",
        "kubelet --root-dir default",
    ),
    HostPath(
        "/var/lib/containerd",
        "containerd's state and every container's filesystem",
        "containerd docs/ops.md",
    ),
    HostPath("/var/lib/docker", "Docker's state and every container's filesystem", "dockerd(8)"),
    HostPath(
        "/var/lib",
        "the state of the node's services (kubelet, container runtimes, k3s and RKE2, "
        "cloud-init, local volumes)",
        "Linux FHS",
    ),
    HostPath(
        "/var/log",
        "the node's logs, which the kubelet reads as root, symlinks and all",
        "Linux FHS",
    ),
    HostPath("/var/spool", "the node's cron and mail spools, run as root", "Linux FHS"),
    HostPath(
        "/var/backups",
        "the node's copies of /etc/shadow and /etc/passwd (Debian, Ubuntu)",
        "Debian cron.daily/dpkg (passwd and shadow backups)",
    ),
    HostPath("/efi", "the EFI system partition: the node's boot loader", "file-hierarchy(7)"),
    HostPath("/var/snap", "snaps' state, MicroK8s' containerd included", "MicroK8s docs"),
    HostPath("/usr", _PROGRAMS, "Linux FHS"),
    HostPath("/bin", _PROGRAMS, "Linux FHS"),
    HostPath("/sbin", _PROGRAMS, "Linux FHS"),
    HostPath("/lib", "the host's libraries and kernel modules", "Linux FHS"),
    HostPath("/lib64", "the host's libraries", "Linux FHS"),
    HostPath(
        "/opt/containerd",
        "containerd's opt directory, whose bin/ comes first on the shims' PATH (a planted runc "
        "runs as host root at the next container start)",
        "containerd/containerd plugins/services/opt/path_unix.go (defaultPath) and service.go "
        "(PATH and LD_LIBRARY_PATH prepended)",
    ),
    HostPath("/opt/bin", "the node's Kubernetes binaries (Flatcar)", "Flatcar docs"),
    HostPath(
        "/opt/cni",
        "the CNI plugins, run by the container runtime as root",
        "containerd/containerd internal/cri/config/config_unix.go (bin dir /opt/cni/bin)",
    ),
    HostPath("/opt/nri", "NRI plugins, run by the container runtime", "containerd/nri README"),
    HostPath(
        "/opt/azure",
        "AKS' node scripts, the kubelet's start script among them (run by systemd as root)",
        "Azure/AgentBaker kubelet.service (ExecStart=/opt/azure/containers/start-kubelet.sh)",
    ),
    HostPath(
        "/opt/rke2",
        "RKE2's binaries where /usr/local is read-only",
        "rancher/rke2 install.sh (INSTALL_RKE2_TAR_PREFIX)",
    ),
    HostPath(
        "/var/home",
        "users' homes and SSH keys: /home on Fedora CoreOS, RHCOS and bootc hosts",
        "coreos/rpm-ostree rust/src/composepost.rs (TOPLEVEL_SYMLINKS: /home -> var/home)",
    ),
    HostPath(
        "/var/roothome",
        "the host root user's home: /root on Fedora CoreOS, RHCOS and bootc hosts",
        "coreos/rpm-ostree rust/src/composepost.rs (TOPLEVEL_SYMLINKS: /root -> var/roothome)",
    ),
    HostPath(
        "/var/usrlocal",
        "/usr/local on Fedora CoreOS and RHCOS: programs run by the host as root",
        "coreos/rpm-ostree (/usr/local -> ../var/usrlocal on ostree hosts)",
    ),
    HostPath(
        "/var/opt/containerd",
        "/opt/containerd on ostree hosts (/opt -> var/opt)",
        "coreos/rpm-ostree rust/src/composepost.rs (/opt -> var/opt)",
    ),
    HostPath(
        "/var/opt/bin",
        "/opt/bin on ostree hosts",
        "coreos/rpm-ostree rust/src/composepost.rs (/opt -> var/opt)",
    ),
    HostPath(
        "/var/opt/cni",
        "/opt/cni on ostree hosts",
        "coreos/rpm-ostree rust/src/composepost.rs (/opt -> var/opt)",
    ),
    HostPath(
        "/var/opt/nri",
        "/opt/nri on ostree hosts",
        "coreos/rpm-ostree rust/src/composepost.rs (/opt -> var/opt)",
    ),
    HostPath(
        "/sysroot",
        "the physical root of an ostree host (Fedora CoreOS, RHCOS, bootc): every deployment's "
        "/etc and /var, the kubelet's included",
        "ostreedev.github.io/ostree/deployment (the physical root mounted at /sysroot)",
    ),
    HostPath(
        "/ostree",
        "ostree deployments: /ostree/deploy/<os>/var is the host's /var, the kubelet's included",
        "ostreedev.github.io/ostree/deployment (/ostree/deploy/$stateroot/var bound onto /var)",
    ),
    HostPath(
        "/local",
        "Bottlerocket's data partition: /local/var, /local/opt and /local/mnt are the host's "
        "/var, /opt and /mnt, the kubelet's and containerd's state included",
        "bottlerocket-os/bottlerocket-core-kit packages/release/local.mount, var.mount, "
        "opt.mount, mnt.mount",
    ),
    HostPath(
        "/system",
        "Talos' system services: their containerd socket (/system/run/containerd), the STATE "
        "partition (/system/state), secrets and the kubelet's configuration",
        "siderolabs/talos pkg/machinery/constants/constants.go (SystemPath, SystemRunPath, "
        "StateMountPoint)",
    ),
    HostPath(
        "/mnt/k8s-disks",
        "the instance-store RAID0 of EKS nodes, onto which the kubelet's, containerd's and "
        "the Pods' log directories are bound",
        "awslabs/amazon-eks-ami templates/al2023/runtime/bin/setup-local-disks (MNT_DIR)",
    ),
    HostPath(
        "/mnt/.ephemeral",
        "Bottlerocket's ephemeral-storage mount (EKS Auto Mode), onto which the kubelet's "
        "and containerd's directories are bound",
        "bottlerocket-os/bottlerocket-core-kit sources/api/apiserver/src/server/"
        "ephemeral_storage.rs",
    ),
    HostPath(
        "/mnt/aks",
        "AKS' kubelet directory on the temporary disk (kubeletDiskType: Temporary), bound "
        "onto /var/lib/kubelet",
        "Azure/AgentBaker parts/linux/cloud-init/artifacts/bind-mount.sh (MOUNT_POINT)",
    ),
    HostPath(
        "/mnt/stateful_partition",
        "the node's writable state on GKE's Container-Optimized OS: its ephemeral local SSD "
        "holds the kubelet's and containerd's directories",
        "kubernetes/kubernetes cluster/gce/gci/configure-helper.sh (kube-ephemeral-ssd binds)",
    ),
)

NODE_CONTROL = Catalogue(_NODE_CONTROL)

# Other tenants' data (class b): refused unless the policy's allow-list names it.
_TENANT_DATA: tuple[HostPath, ...] = (
    HostPath(
        "/opt/local-path-provisioner",
        "every Pod's local-path volumes (Rancher's local-path-provisioner)",
        "rancher/local-path-provisioner deploy/local-path-storage.yaml (nodePathMap)",
    ),
    HostPath(
        "/var/openebs",
        "every Pod's OpenEBS LocalPV hostpath volumes",
        "openebs/dynamic-localpv-provisioner cmd/provisioner-localpv/app/env.go "
        "(defaultBasePath /var/openebs/local)",
    ),
    HostPath(
        "/mnt/disks",
        "local SSDs and the local PersistentVolumes made from them (GKE, "
        "sig-storage-local-static-provisioner)",
        "kubernetes/kubernetes cluster/gce/gci/configure-helper.sh (/mnt/disks/ssd<N>), "
        "sig-storage-local-static-provisioner docs/getting-started.md",
    ),
    HostPath(
        "/mnt/fast-disks",
        "local PersistentVolumes of sig-storage-local-static-provisioner",
        "kubernetes-sigs/sig-storage-local-static-provisioner helm/provisioner/values.yaml",
    ),
    HostPath(
        "/mnt/local-storage",
        "local PersistentVolumes of OpenShift's Local Storage Operator",
        "openshift/local-storage-operator pkg/common/provisioner_utils.go",
    ),
    # On ostree hosts (Fedora CoreOS, RHCOS) /mnt is var/mnt and /opt is var/opt: the same
    # directories under their other names. Both are listed, since elsewhere they differ.
    *(
        HostPath(f"/var{entry}", f"{exposes} (/var{entry} is {entry} on ostree hosts)", source)
        for entry, exposes, source in (
            (
                "/opt/local-path-provisioner",
                "every Pod's local-path volumes",
                "coreos/rpm-ostree rust/src/composepost.rs (/opt -> var/opt)",
            ),
            (
                "/mnt/disks",
                "local PersistentVolumes",
                "coreos/rpm-ostree rust/src/composepost.rs (/mnt -> var/mnt)",
            ),
            (
                "/mnt/fast-disks",
                "local PersistentVolumes",
                "coreos/rpm-ostree rust/src/composepost.rs (/mnt -> var/mnt)",
            ),
            (
                "/mnt/local-storage",
                "local PersistentVolumes of OpenShift's Local Storage Operator",
                "coreos/rpm-ostree rust/src/composepost.rs (/mnt -> var/mnt)",
            ),
        )
    ),
)
TENANT_DATA = Catalogue(_TENANT_DATA)


# Symlinks into /run on every current distribution (systemd's tmpfiles, the FHS 3.0).
_RUN_ALIASES = {"/var/run": "/run", "/var/lock": "/run/lock"}


def canonical(path: str) -> str:
    """The path as the kubelet mounts it, ``/var/run`` read as ``/run`` and ``/var/lock`` as
    ``/run/lock``."""
    normal = normalise_host_path(path)
    for alias, target in _RUN_ALIASES.items():
        if normal == alias or normal.startswith(alias + "/"):
            return target + normal[len(alias) :]
    return normal


def at_or_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def touches(path: str, root: str) -> bool:
    """``path`` is ``root``, below it, or a parent of it: mounting it exposes ``root``."""
    return at_or_under(path, root) or at_or_under(root, path)


def touched(path: str, catalogue: Catalogue) -> HostPath | None:
    """The first entry of ``catalogue`` that ``path`` (canonical) is, lies under or holds."""
    for entry in catalogue.by_top.get(_top(path), ()):
        if touches(path, entry.path):
            return entry
    return None


def exposure(path: str, entry: HostPath) -> str:
    """What mounting ``path`` exposes through ``entry``: its words where ``path`` is at or below
    it, ``<entry>: <its words>`` where ``path`` holds it."""
    return entry.exposes if at_or_under(path, entry.path) else f"{entry.path}: {entry.exposes}"


def node_control(path: str) -> str | None:
    """What a canonical host path exposes of the node's control, or None: the whole filesystem,
    anything a relative path resolves to, or a node-control path it is at, under or above."""
    if not path.startswith("/"):
        return "a relative path, which the kubelet resolves against its own working directory"
    if path == "/":
        return WHOLE_FILESYSTEM
    entry = touched(path, NODE_CONTROL)
    return exposure(path, entry) if entry is not None else None


WHOLE_FILESYSTEM = "the host's whole filesystem"


def relation(path: str, entry: HostPath) -> str:
    """How ``path`` touches ``entry``, for the lint: ``/mnt contains /mnt/k8s-disks, which
    exposes ...``."""
    if path == entry.path:
        return f"{path} exposes {entry.exposes}"
    if at_or_under(path, entry.path):
        return f"{path} lies under {entry.path}, which exposes {entry.exposes}"
    return f"{path} contains {entry.path}, which exposes {entry.exposes}"


def unsafe_to_allow(raw: str) -> str | None:
    """Why a host path can never be allowed (a policy error); None when it can be."""
    path = canonical(raw)
    if path == "/":
        return f"/ exposes {WHOLE_FILESYSTEM}"
    entry = touched(path, NODE_CONTROL)
    return relation(path, entry) if entry is not None else None
