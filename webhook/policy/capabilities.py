"""Linux capabilities as the policy and the checks name them.

Pod Security baseline (kubernetes/pod-security-admission ``policy/check_capabilities_baseline.go``,
v1.37) admits only the thirteen capabilities of :data:`BASELINE`, compared exactly as written
(``chown`` and ``CAP_CHOWN`` are refused). The container runtimes read a name upper-cased and
with one leading ``CAP_`` removed (:func:`capability_name`), so grants and the privileged-
equivalent list are compared that way: ``cap_sys_admin`` is ``SYS_ADMIN``.
"""

from __future__ import annotations

BASELINE = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)

# Capabilities that reach past the container, whatever else the Pod does: refused by the
# host-access rule, and never granted.
PRIVILEGED_EQUIVALENT = {
    "SYS_ADMIN": "mounts, namespaces and device administration: the usual way out of a container",
    "SYS_MODULE": "loads kernel modules",
    "SYS_RAWIO": "raw I/O to devices and memory",
    "DAC_READ_SEARCH": "reads any file by handle, past the container's mounts",
    "BPF": "loads BPF programs into the host kernel",
    "SYS_BOOT": "reboots the node",
    "ALL": "every capability",
}

# Judged by the host-access rule (the others beyond BASELINE by pod-security): each capability
# is reported by one rule.
HOST_ACCESS_CAPABILITIES = frozenset({*PRIVILEGED_EQUIVALENT, "SYS_PTRACE"})

# With hostNetwork, these act on the node's own network: never together, granted or not.
HOST_NETWORK_ADMIN = ("NET_ADMIN", "NET_RAW")


def capability_name(raw: object) -> str:
    """``cap_sys_admin`` and ``SYS_ADMIN`` are one capability, as the container runtimes read
    them (upper case, one leading ``CAP_`` removed)."""
    name = str(raw).upper()
    return name[len("CAP_") :] if name.startswith("CAP_") else name
