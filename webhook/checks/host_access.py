"""No privileged-equivalent access to the host from a Pod that can reach a GPU node.

Restricted: ``hostPID`` (every process of the node, other tenants' GPU processes included;
MPS through the device plugin does not need it); Windows ``hostProcess`` (Pod or container
``windowsOptions``); added capabilities ``SYS_ADMIN``, ``SYS_MODULE``, ``SYS_RAWIO``,
``DAC_READ_SEARCH``, ``BPF``, ``SYS_BOOT`` and ``ALL``, compared after upper-casing and
removing one leading ``CAP_``, which no grant covers; ``hostIPC`` (some MPS setups share the
host's IPC namespace) and ``SYS_PTRACE`` (profilers need it), unless a tenant grant names them:
both were warnings before this release, so they stay warnings while the policy's ``newChecks``
is Warn. Every other capability beyond Pod Security baseline's list is the ``pod-security``
rule's, so that each capability is reported by one rule. Warned too: a field of a workload that
can set any of these in ways nothing can judge before the Pod exists (Argo's ``podSpecPatch``);
the Pod is judged when it is created.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from webhook.core import advice
from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView, grants_of
from webhook.policy.capabilities import PRIVILEGED_EQUIVALENT, capability_name
from webhook.policy.model import Policy

RULE = "host-access"
# The capabilities this rule judges; pod-security judges the others beyond the baseline's list,
# so that each capability is reported by one rule.
HOST_ACCESS_CAPABILITIES = frozenset({*PRIVILEGED_EQUIVALENT, "SYS_PTRACE"})
HOST_NAMESPACES = "Pod Security baseline: Host Namespaces"


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
            )
            + f" ({HOST_NAMESPACES})",
            hint=advice.fix(
                view, policy, "remove hostPID", gpu="MPS through the device plugin does not need it"
            ),
            subject="spec",
            field="hostPID",
        )
    if spec.get("hostIPC") is True and not grants_of(view, policy).host_ipc:
        yield Violation(
            rule=RULE,
            path=view.field_path("hostIPC"),
            value=True,
            message="hostIPC shares the node's IPC namespace with the Pod: its shared memory "
            f"and semaphores, other tenants' included ({HOST_NAMESPACES})",
            hint=advice.fix(
                view,
                policy,
                "remove hostIPC, or for an MPS setup that needs it have the platform team grant "
                "it (spec.tenants[].grants.hostIPC)",
            ),
            subject="spec",
            field="hostIPC",
            advisory=policy.new_checks_advisory,
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
            if name not in HOST_ACCESS_CAPABILITIES:
                continue  # pod-security's
            path = f"{container.path}.securityContext.capabilities.add[{index}]"
            field = f"{container.list_name}.capabilities.add[{name}]"
            if name in PRIVILEGED_EQUIVALENT:
                yield Violation(
                    rule=RULE,
                    path=path,
                    value=raw,
                    message=f"container {quote(container.name)} adds the capability {name} "
                    f"({PRIVILEGED_EQUIVALENT[name]}): "
                    + advice.why(view, policy, "it reaches past the container")
                    + " (Pod Security baseline: Capabilities)",
                    hint=advice.fix(view, policy, f"remove {name} from capabilities.add"),
                    subject=container.name,
                    field=field,
                )
            elif not grants_of(view, policy).allows_capability(name, container.name):
                yield Violation(
                    rule=RULE,
                    path=path,
                    value=raw,
                    message=f"container {quote(container.name)} adds the capability {name} "
                    "(traces the processes it can see) (Pod Security baseline: Capabilities)",
                    hint=advice.fix(
                        view,
                        policy,
                        f"remove {name}, or for a profiler have the platform team grant it "
                        "(spec.tenants[].grants.capabilities)",
                    ),
                    subject=container.name,
                    field=field,
                    advisory=policy.new_checks_advisory,
                )


def _host_process(
    view: PodView, policy: Policy, context: dict[str, Any], path: str, subject: str
) -> Iterator[Violation]:
    windows = context.get("windowsOptions")
    if isinstance(windows, dict) and windows.get("hostProcess") is True:
        yield Violation(
            rule=RULE,
            path=f"{path}.windowsOptions.hostProcess",
            value=True,
            message="a Windows HostProcess container runs as a process on the node, with its "
            "devices and filesystem (Pod Security baseline: HostProcess)",
            hint=advice.fix(view, policy, "remove windowsOptions.hostProcess"),
            subject=subject,
            field="windowsOptions.hostProcess",
        )
