"""Linux capabilities as the policy names them: the privileged-equivalent ones, which no grant
covers (the lint refuses a grant of one; the host-access rule refuses them), and the spelling
the container runtimes read (:func:`capability_name`: ``cap_sys_admin`` is ``SYS_ADMIN``).
Pod Security baseline's own list, compared as written, is the pod-security rule's.
"""

from __future__ import annotations

PRIVILEGED_EQUIVALENT = {
    "SYS_ADMIN": "mounts, namespaces and device administration: the usual way out of a container",
    "SYS_MODULE": "loads kernel modules",
    "SYS_RAWIO": "raw I/O to devices and memory",
    "DAC_READ_SEARCH": "reads any file by handle, past the container's mounts",
    "BPF": "loads BPF programs into the host kernel",
    "SYS_BOOT": "reboots the node",
    "ALL": "every capability",
}


def capability_name(raw: object) -> str:
    """``cap_sys_admin`` and ``SYS_ADMIN`` are one capability, as the container runtimes read
    them (upper case, one leading ``CAP_`` removed)."""
    name = str(raw).upper()
    return name[len("CAP_") :] if name.startswith("CAP_") else name
