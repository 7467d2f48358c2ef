"""No privileged-equivalent access to the host from a Pod that can reach a GPU node.

Restricted: ``hostPID`` (every process of the node, other tenants' GPU processes included;
MPS through the device plugin does not need it); Windows ``hostProcess`` (Pod or container
``windowsOptions``); added capabilities ``SYS_ADMIN``, ``SYS_MODULE``, ``SYS_RAWIO``,
``DAC_READ_SEARCH``, ``BPF``, ``SYS_BOOT`` and ``ALL``, compared after upper-casing and
removing one leading ``CAP_``. Warned: ``hostIPC`` (some MPS setups share the host's IPC
namespace) and ``SYS_PTRACE`` (profilers need it; reaching other tenants' processes also needs
``hostPID``, which is refused). Allowed: ``hostNetwork`` (multi-node training uses it),
``IPC_LOCK``, ``SYS_NICE``, ``SYS_RESOURCE`` (RDMA and NCCL need them) and every other
capability. Warned too: a field of a workload that can set any of these in ways nothing can
judge before the Pod exists (Argo's ``podSpecPatch``); the Pod is judged when it is created.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core import advice
from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView
from webhook.policy.model import Policy

RULE = "host-access"
REFUSED_CAPABILITIES = {
    "SYS_ADMIN": "mounts, namespaces and device administration: the usual way out of a container",
    "SYS_MODULE": "loads kernel modules",
    "SYS_RAWIO": "raw I/O to devices and memory",
    "DAC_READ_SEARCH": "reads any file by handle, past the container's mounts",
    "BPF": "loads BPF programs into the host kernel",
    "SYS_BOOT": "reboots the node",
    "ALL": "every capability",
}
WARNED_CAPABILITIES = {"SYS_PTRACE": "traces processes it can see"}


def capability_name(raw: object) -> str:
    """``cap_sys_admin`` and ``SYS_ADMIN`` are one capability."""
    name = str(raw).upper()
    return name[len("CAP_") :] if name.startswith("CAP_") else name


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    spec = view.spec
    for path, value in view.unjudged:
        yield Violation(
            rule=RULE,
            path=path,
            value=value,
            message=f"{path.rpartition('.')[2]} can give the Pod any field, host access "
            "included, and cannot be judged before the Pod exists: its Pod is judged when it "
            "is created, and denied there if the patch breaks the policy",
            hint="write the fields into the template itself, where they are judged now",
            # Forbidden: printed without its value, which can be long and hold anything.
            error_type="Forbidden",
            subject="spec",
            field=path.rpartition(".")[2],
            advisory=True,
        )
    if spec.get("hostPID") is True:
        yield Violation(
            rule=RULE,
            path=view.field_path("hostPID"),
            value=True,
            message="hostPID shares the node's process namespace: "
            + advice.why(
                view,
                policy,
                "the Pod sees every process of the node, GPU jobs of other tenants included",
            ),
            hint=advice.fix(
                view, policy, "remove hostPID", gpu="MPS through the device plugin does not need it"
            ),
            subject="spec",
            field="hostPID",
        )
    if spec.get("hostIPC") is True:
        yield Violation(
            rule=RULE,
            path=view.field_path("hostIPC"),
            value=True,
            message="hostIPC shares the node's IPC namespace with the Pod",
            hint="remove hostIPC unless an MPS setup needs it",
            subject="spec",
            field="hostIPC",
            advisory=True,
        )
    # Only a securityContext with windowsOptions can ask for a HostProcess container.
    context = spec.get("securityContext")
    if isinstance(context, dict) and "windowsOptions" in context:
        yield from _host_process(view, policy, context, view.field_path("securityContext"), "spec")
    for container in view.containers:
        context = container.spec.get("securityContext")
        if not isinstance(context, dict):
            continue
        if "windowsOptions" in context:
            path = f"{container.path}.securityContext"
            yield from _host_process(view, policy, context, path, container.name)
        capabilities = context.get("capabilities")
        added = capabilities.get("add") if isinstance(capabilities, dict) else None
        for index, raw in enumerate(added if isinstance(added, list) else ()):
            name = capability_name(raw)
            refused = name in REFUSED_CAPABILITIES
            if not refused and name not in WARNED_CAPABILITIES:
                continue
            what = REFUSED_CAPABILITIES.get(name) or WARNED_CAPABILITIES[name]
            yield Violation(
                rule=RULE,
                path=f"{container.path}.securityContext.capabilities.add[{index}]",
                value=raw,
                message=f"container {quote(container.name)} adds the capability {name} ({what})"
                + (
                    ": " + advice.why(view, policy, "it reaches past the container")
                    if refused
                    else ""
                ),
                hint=advice.fix(view, policy, f"remove {name} from capabilities.add")
                if refused
                else f"remove {name} unless a profiler needs it",
                subject=container.name,
                field=f"{container.list_name}.capabilities.add[{name}]",
                advisory=not refused,
            )


def _host_process(
    view: PodView, policy: Policy, context: dict, path: str, subject: str
) -> Iterator[Violation]:
    windows = context.get("windowsOptions")
    if isinstance(windows, dict) and windows.get("hostProcess") is True:
        yield Violation(
            rule=RULE,
            path=f"{path}.windowsOptions.hostProcess",
            value=True,
            message="a Windows HostProcess container runs as a process on the node, with its "
            "devices and filesystem",
            hint=advice.fix(view, policy, "remove windowsOptions.hostProcess"),
            subject=subject,
            field="windowsOptions.hostProcess",
        )
