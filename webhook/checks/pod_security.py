"""Pod Security baseline, with the grants GPU workloads need, for Pods that reach GPU nodes.

The controls of the baseline profile as kubernetes/pod-security-admission defines them at
v1.37 (``policy/check_*.go``), in every container, init container and ephemeral container:

- Host Namespaces: ``hostNetwork`` (node-local services such as DCGM's host engine and Fabric
  Manager, the kubelet's ports, the cloud metadata endpoint), unless a tenant grant allows it,
  and never with ``NET_ADMIN`` or ``NET_RAW`` added (the node's own routes and packets);
- Host Ports: ``ports[].hostPort`` other than 0 (in a ``hostNetwork`` Pod the API server sets
  each to its ``containerPort``: those are the hostNetwork finding, not another);
- Capabilities: ``capabilities.add`` beyond ``AUDIT_WRITE``, ``CHOWN``, ``DAC_OVERRIDE``,
  ``FOWNER``, ``FSETID``, ``KILL``, ``MKNOD``, ``NET_BIND_SERVICE``, ``SETFCAP``, ``SETGID``,
  ``SETPCAP``, ``SETUID``, ``SYS_CHROOT``, compared as written (``chown`` is not one), unless a
  tenant grant names it for the container; ``SYS_PTRACE`` and the privileged-equivalent ones
  are the ``host-access`` rule's;
- SELinux: a type other than ``container_t``, ``container_init_t``, ``container_kvm_t``,
  ``container_engine_t`` (``spc_t`` and ``super_t`` are unconfined), or any user or role;
- Seccomp: ``seccompProfile.type: Unconfined`` (Pod or container);
- AppArmor: ``appArmorProfile.type`` other than ``RuntimeDefault`` or ``Localhost``, and the
  ``container.apparmor.security.beta.kubernetes.io/*`` annotation other than
  ``runtime/default`` or ``localhost/*``;
- /proc Mount Type: ``procMount`` other than ``Default``, unless ``hostUsers: false``;
- Sysctls: ``securityContext.sysctls`` outside the safe set;
- Host Probes / Lifecycle Hooks: a ``host`` in a probe's or lifecycle handler's ``httpGet`` or
  ``tcpSocket`` (the kubelet connects from the node, past network policy).

Also: containerd NRI annotations that move a host interface into the Pod, set sysctls or
otherwise change the container on the node (``network-devices.``, ``sysctl.``, ...
``.noderesource.dev``), unless a tenant grant names the key.

Privileged containers, ``hostPID``, ``hostIPC``, Windows HostProcess and host paths are the
``privileged``, ``host-access`` and ``host-devices`` rules'.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from webhook.checks.host_access import HOST_ACCESS_CAPABILITIES
from webhook.core import advice, injection
from webhook.core.findings import Violation, quote
from webhook.core.pods import ContainerView, PodView, grants_of
from webhook.policy.capabilities import capability_name
from webhook.policy.model import Policy

RULE = "pod-security"

# kubernetes/pod-security-admission policy/check_capabilities_baseline.go, compared as written.
BASELINE_CAPABILITIES = frozenset(
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
# With hostNetwork, these act on the node's own network: never together, granted or not.
HOST_NETWORK_ADMIN = ("NET_ADMIN", "NET_RAW")
# check_seLinuxOptions.go (container_engine_t since 1.31).
SELINUX_TYPES = frozenset(
    {"container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
# check_sysctls.go at v1.37.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
        "net.ipv4.tcp_slow_start_after_idle",
        "net.ipv4.tcp_notsent_lowat",
    }
)
# check_appArmorProfile.go.
APPARMOR_TYPES = ("RuntimeDefault", "Localhost")
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
HANDLERS = ("postStart", "preStop")


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    spec = view.spec
    host_network = spec.get("hostNetwork") is True
    if host_network:
        yield from _host_network(view, policy)
    context = spec.get("securityContext")
    if isinstance(context, dict):
        path = view.field_path("securityContext")
        yield from _contexts(view, policy, context, path, "spec", "the Pod")
        sysctls = context.get("sysctls")
        for index, sysctl in enumerate(sysctls if isinstance(sysctls, list) else ()):
            name = sysctl.get("name") if isinstance(sysctl, dict) else sysctl
            if not isinstance(name, str) or name not in SAFE_SYSCTLS:
                # Its value too: an update that changes only the value is a new finding.
                value = sysctl.get("value") if isinstance(sysctl, dict) else None
                yield _violation(
                    view,
                    policy,
                    f"{path}.sysctls[{index}].name",
                    f"{name}={value}",
                    f"the sysctl {quote(name)} is not one of the baseline's safe sysctls",
                    "it can reach past the Pod's own namespaces",
                    "Sysctls",
                    "remove it, or use a safe one (net.ipv4.tcp_keepalive_time, "
                    "net.ipv4.ip_local_port_range...)",
                    "spec",
                    f"sysctls[{name}]",
                )
    user_namespace = spec.get("hostUsers") is False
    for container in view.containers:
        yield from _container(view, policy, container, host_network, user_namespace)
    if not view.annotations:
        return
    for key, value in view.annotations.items():
        if isinstance(key, str) and key.startswith(APPARMOR_ANNOTATION):
            if value in ("", "runtime/default") or (
                isinstance(value, str) and value.startswith("localhost/")
            ):
                continue
            yield _violation(
                view,
                policy,
                f"{view.metadata_path}.annotations[{key}]",
                value,
                f"the AppArmor profile {quote(value)}",
                "it lifts the container's confinement",
                "AppArmor",
                "use runtime/default or a localhost/ profile, or remove the annotation",
                "annotations",
                f"annotations[{key}]",
            )
    yield from injection.refused(view, policy, RULE, advisory=policy.new_checks_advisory)


def _host_network(view: PodView, policy: Policy) -> Iterator[Violation]:
    if not grants_of(view, policy).host_network:
        yield _violation(
            view,
            policy,
            view.field_path("hostNetwork"),
            True,
            "hostNetwork puts the Pod in the node's network namespace",
            "node-local services (DCGM's host engine, Fabric Manager, the kubelet's ports, the "
            "cloud metadata endpoint) answer it as the node",
            "Host Namespaces",
            "remove hostNetwork",
            "spec",
            "hostNetwork",
            gpu="multi-node training reaches its peers through the Pod network or RDMA "
            "devices; a fabric that needs hostNetwork is granted it per namespace "
            "(spec.tenants[].grants.hostNetwork)",
        )
    # Never together, granted or not: a finding of its own, so that forgiving a hostNetwork
    # an old object had never forgives a capability added beside it.
    for container in view.containers:
        for index, raw, name in _added(container):
            if name in HOST_NETWORK_ADMIN:
                yield _violation(
                    view,
                    policy,
                    f"{container.path}.securityContext.capabilities.add[{index}]",
                    raw,
                    f"container {quote(container.name)} adds {name} in a hostNetwork Pod",
                    "it acts on the node's own interfaces, routes and packets",
                    "Host Namespaces",
                    f"remove {name} or hostNetwork: a grant of hostNetwork never covers "
                    f"{' or '.join(HOST_NETWORK_ADMIN)}",
                    container.name,
                    f"{container.list_name}.capabilities.add[{name}]+hostNetwork",
                )


def _added(container: ContainerView) -> Iterator[tuple[int, object, str]]:
    """The capabilities a container adds: (index, as written, normalised)."""
    context = container.spec.get("securityContext")
    capabilities = context.get("capabilities") if isinstance(context, dict) else None
    added = capabilities.get("add") if isinstance(capabilities, dict) else None
    for index, raw in enumerate(added if isinstance(added, list) else ()):
        yield index, raw, capability_name(raw)


def _contexts(
    view: PodView, policy: Policy, context: Mapping[str, Any], path: str, subject: str, who: str
) -> Iterator[Violation]:
    """SELinux, seccomp and AppArmor of one securityContext (the Pod's or a container's)."""
    selinux = context.get("seLinuxOptions")
    if isinstance(selinux, dict):
        kind = selinux.get("type")
        if kind not in (None, "") and not (isinstance(kind, str) and kind in SELINUX_TYPES):
            yield _violation(
                view,
                policy,
                f"{path}.seLinuxOptions.type",
                kind,
                f"{who} runs with the SELinux type {quote(kind)}, not a container type",
                "it lifts or changes the container's confinement",
                "SELinux",
                f"remove seLinuxOptions.type, or use one of {', '.join(sorted(SELINUX_TYPES))}",
                subject,
                "seLinuxOptions.type",
            )
        for field in ("user", "role"):
            if selinux.get(field) not in (None, ""):
                yield _violation(
                    view,
                    policy,
                    f"{path}.seLinuxOptions.{field}",
                    selinux[field],
                    f"{who} sets a custom SELinux {field}",
                    "it changes the container's confinement",
                    "SELinux",
                    f"remove seLinuxOptions.{field}",
                    subject,
                    f"seLinuxOptions.{field}",
                )
    seccomp = context.get("seccompProfile")
    if isinstance(seccomp, dict) and seccomp.get("type") == "Unconfined":
        yield _violation(
            view,
            policy,
            f"{path}.seccompProfile.type",
            "Unconfined",
            f"{who} runs without a seccomp profile",
            "every system call reaches the host kernel",
            "Seccomp",
            "use type RuntimeDefault (or Localhost), or remove seccompProfile",
            subject,
            "seccompProfile.type",
        )
    apparmor = context.get("appArmorProfile")
    if isinstance(apparmor, dict) and apparmor.get("type") not in APPARMOR_TYPES:
        yield _violation(
            view,
            policy,
            f"{path}.appArmorProfile.type",
            apparmor.get("type"),
            f"{who} asks for an AppArmor profile other than RuntimeDefault or Localhost",
            "it lifts the container's confinement",
            "AppArmor",
            "use type RuntimeDefault or Localhost, or remove appArmorProfile",
            subject,
            "appArmorProfile.type",
        )


def _container(
    view: PodView,
    policy: Policy,
    container: ContainerView,
    host_network: bool,
    user_namespace: bool,
) -> Iterator[Violation]:
    spec = container.spec
    name = container.name
    ports = spec.get("ports")
    for index, port in enumerate(ports if isinstance(ports, list) else ()):
        host_port = port.get("hostPort") if isinstance(port, dict) else None
        if host_port in (None, 0):
            continue
        if host_network and host_port == port.get("containerPort"):
            continue  # the API server sets them so: the hostNetwork finding covers them
        yield _violation(
            view,
            policy,
            f"{container.path}.ports[{index}].hostPort",
            host_port,
            f"container {quote(name)} listens on the node's port {host_port}",
            "it sits beside the node's own services, on the node's addresses",
            "Host Ports",
            "remove hostPort and reach the container through a Service",
            name,
            f"{container.list_name}.ports[{host_port}].hostPort",
        )
    context = spec.get("securityContext")
    if isinstance(context, dict):
        path = f"{container.path}.securityContext"
        yield from _contexts(view, policy, context, path, name, f"container {quote(name)}")
        proc_mount = context.get("procMount")
        if proc_mount not in (None, "Default") and not user_namespace:
            yield _violation(
                view,
                policy,
                f"{path}.procMount",
                proc_mount,
                f"container {quote(name)} unmasks /proc",
                "it exposes the kernel interfaces the runtime masks",
                "/proc Mount Type",
                "remove procMount (or set hostUsers: false to run the Pod in a user namespace)",
                name,
                f"{container.list_name}.securityContext.procMount",
            )
        for index, raw, capability in _added(container):
            if isinstance(raw, str) and raw in BASELINE_CAPABILITIES:
                continue
            if capability in BASELINE_CAPABILITIES:
                yield _violation(
                    view,
                    policy,
                    f"{path}.capabilities.add[{index}]",
                    raw,
                    f"container {quote(name)} adds {quote(raw)}",
                    "Pod Security compares capabilities as written",
                    "Capabilities",
                    f"write it as {capability}",
                    name,
                    f"{container.list_name}.capabilities.add[{capability}]",
                )
            elif capability in HOST_ACCESS_CAPABILITIES:
                continue  # host-access's
            elif host_network and capability in HOST_NETWORK_ADMIN:
                continue  # reported with the hostNetwork it comes with
            elif not grants_of(view, policy).allows_capability(capability, name):
                yield _violation(
                    view,
                    policy,
                    f"{path}.capabilities.add[{index}]",
                    raw,
                    f"container {quote(name)} adds the capability {capability}, which is not on "
                    "the baseline's list",
                    "it reaches past what a container needs",
                    "Capabilities",
                    f"remove {capability}, or have the platform team grant it to the namespace "
                    "(spec.tenants[].grants.capabilities, optionally for named containers)",
                    name,
                    f"{container.list_name}.capabilities.add[{capability}]",
                )
    for probe in PROBES:
        handler = spec.get(probe)
        if isinstance(handler, dict):  # most containers have none: no generator for them
            yield from _hosts(view, policy, container, handler, probe)
    lifecycle = spec.get("lifecycle")
    if isinstance(lifecycle, dict):
        for event in HANDLERS:
            handler = lifecycle.get(event)
            if isinstance(handler, dict):
                yield from _hosts(view, policy, container, handler, f"lifecycle.{event}")


def _hosts(
    view: PodView, policy: Policy, container: ContainerView, handler: Mapping[str, Any], where: str
) -> Iterator[Violation]:
    for action in ("httpGet", "tcpSocket"):
        target = handler.get(action)
        host = target.get("host") if isinstance(target, dict) else None
        if host in (None, ""):
            continue
        yield _violation(
            view,
            policy,
            f"{container.path}.{where}.{action}.host",
            host,
            f"container {quote(container.name)} has the kubelet connect to {quote(host)}",
            "the kubelet connects from the node, past network policy",
            "Host Probes / Lifecycle Hooks",
            f"remove {where}.{action}.host: the kubelet then connects to the Pod's own address",
            container.name,
            f"{container.list_name}.{where}.{action}.host",
        )


def _violation(
    view: PodView,
    policy: Policy,
    path: str,
    value: object,
    what: str,
    danger: str,
    control: str,
    remedy: str,
    subject: str,
    field: str,
    *,
    gpu: str = "",
) -> Violation:
    """A finding: what the Pod does, why it is dangerous for this Pod, the baseline control it
    breaks, and the remedy for its audience (a node agent is told about exemptions)."""
    return Violation(
        rule=RULE,
        path=path,
        value=value,
        message=f"{what}: {advice.why(view, policy, danger)} (Pod Security baseline: {control})",
        hint=advice.fix(view, policy, remedy, gpu=gpu),
        subject=subject,
        field=field,
        # New in this release: warned at most while the policy's newChecks is Warn.
        advisory=policy.new_checks_advisory,
    )
