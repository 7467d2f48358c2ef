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

from webhook.core import advice, injection
from webhook.core.findings import Violation, quote
from webhook.core.pods import ContainerView, PodView
from webhook.policy.capabilities import (
    BASELINE,
    HOST_ACCESS_CAPABILITIES,
    HOST_NETWORK_ADMIN,
    capability_name,
)
from webhook.policy.model import Grants, Policy

RULE = "pod-security"

SELINUX_TYPES = frozenset(
    {"container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
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
APPARMOR_TYPES = ("RuntimeDefault", "Localhost")
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
HANDLERS = ("postStart", "preStop")
# The container fields the baseline restricts something in.
_JUDGED_FIELDS = frozenset({"ports", "securityContext", "lifecycle", *PROBES})


def _control(name: str) -> str:
    return f"(Pod Security baseline: {name})"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    spec = view.spec
    host_network = spec.get("hostNetwork") is True
    if host_network:
        yield from _host_network(view, policy, policy.grants(view.namespace))
    context = spec.get("securityContext")
    if isinstance(context, dict):
        yield from _contexts(view, policy, context, view.field_path("securityContext"), "spec")
        sysctls = context.get("sysctls")
        for index, sysctl in enumerate(sysctls if isinstance(sysctls, list) else ()):
            name = sysctl.get("name") if isinstance(sysctl, dict) else sysctl
            if not isinstance(name, str) or name not in SAFE_SYSCTLS:
                yield _finding(
                    f"{view.field_path('securityContext')}.sysctls[{index}].name",
                    name,
                    f"the sysctl {quote(name)} is not one Pod Security baseline counts safe: it "
                    "can reach past the Pod's own namespaces " + _control("Sysctls"),
                    "remove it, or use one of the safe sysctls (net.ipv4.tcp_keepalive_time...)",
                    "spec",
                    f"sysctls[{name}]",
                )
    user_namespace = spec.get("hostUsers") is False
    for container in view.containers:
        # Most containers set none of what the baseline restricts: no generator for them.
        if not _JUDGED_FIELDS.isdisjoint(container.spec):
            yield from _container(view, policy, container, host_network, user_namespace)
    for key, value in view.annotations.items():
        if isinstance(key, str) and key.startswith(APPARMOR_ANNOTATION):
            if value in ("", "runtime/default") or (
                isinstance(value, str) and value.startswith("localhost/")
            ):
                continue
            yield _finding(
                f"{view.metadata_path}.annotations[{key}]",
                value,
                f"the AppArmor profile {quote(value)} lifts the container's confinement "
                + _control("AppArmor"),
                "use runtime/default or a localhost/ profile, or remove the annotation",
                "annotations",
                f"annotations[{key}]",
            )
    yield from injection.refused(view, policy, RULE) if view.annotations else ()


def _host_network(view: PodView, policy: Policy, grants: Grants) -> Iterator[Violation]:
    path = view.field_path("hostNetwork")
    if not grants.host_network:
        yield _finding(
            path,
            True,
            "hostNetwork puts the Pod in the node's network namespace: "
            + advice.why(
                view,
                policy,
                "node-local services (DCGM's host engine, Fabric Manager, the kubelet's ports, "
                "the cloud metadata endpoint) answer it as the node",
            )
            + " "
            + _control("Host Namespaces"),
            advice.fix(
                view,
                policy,
                "remove hostNetwork",
                gpu="multi-node training reaches its peers through the Pod network or RDMA "
                "devices; a fabric that needs hostNetwork is granted it per namespace "
                "(spec.tenants[].grants.hostNetwork)",
            ),
            "spec",
            "hostNetwork",
        )
        return
    # Granted: never together with the capabilities that act on the node's own network.
    for container in view.containers:
        context = container.spec.get("securityContext")
        capabilities = context.get("capabilities") if isinstance(context, dict) else None
        added = capabilities.get("add") if isinstance(capabilities, dict) else None
        for index, raw in enumerate(added if isinstance(added, list) else ()):
            name = capability_name(raw)
            if name in HOST_NETWORK_ADMIN:
                yield _finding(
                    f"{container.path}.securityContext.capabilities.add[{index}]",
                    raw,
                    f"container {quote(container.name)} adds {name} in a hostNetwork Pod: it "
                    "acts on the node's own interfaces, routes and packets "
                    + _control("Host Namespaces"),
                    f"remove {name} or hostNetwork: a grant of hostNetwork never covers "
                    f"{', '.join(HOST_NETWORK_ADMIN)}",
                    container.name,
                    f"{container.list_name}.capabilities.add[{name}]+hostNetwork",
                )


def _contexts(
    view: PodView, policy: Policy, context: Mapping, path: str, subject: str
) -> Iterator[Violation]:
    """SELinux, seccomp and AppArmor of one securityContext (the Pod's or a container's)."""
    selinux = context.get("seLinuxOptions")
    if isinstance(selinux, dict):
        kind = selinux.get("type")
        if kind not in (None, "") and not (isinstance(kind, str) and kind in SELINUX_TYPES):
            yield _finding(
                f"{path}.seLinuxOptions.type",
                kind,
                f"the SELinux type {quote(kind)} is not a container type: it lifts or changes "
                "the container's confinement " + _control("SELinux"),
                f"remove seLinuxOptions.type, or use one of {', '.join(sorted(SELINUX_TYPES))}",
                subject,
                "seLinuxOptions.type",
            )
        for field in ("user", "role"):
            if selinux.get(field) not in (None, ""):
                yield _finding(
                    f"{path}.seLinuxOptions.{field}",
                    selinux[field],
                    f"a custom SELinux {field} changes the container's confinement "
                    + _control("SELinux"),
                    f"remove seLinuxOptions.{field}",
                    subject,
                    f"seLinuxOptions.{field}",
                )
    seccomp = context.get("seccompProfile")
    if isinstance(seccomp, dict) and seccomp.get("type") == "Unconfined":
        yield _finding(
            f"{path}.seccompProfile.type",
            "Unconfined",
            "an Unconfined seccomp profile opens every system call to the host kernel "
            + _control("Seccomp"),
            "use type RuntimeDefault (or Localhost), or remove seccompProfile",
            subject,
            "seccompProfile.type",
        )
    apparmor = context.get("appArmorProfile")
    if isinstance(apparmor, dict) and apparmor.get("type") not in APPARMOR_TYPES:
        yield _finding(
            f"{path}.appArmorProfile.type",
            apparmor.get("type"),
            "an AppArmor profile other than RuntimeDefault or Localhost lifts the container's "
            "confinement " + _control("AppArmor"),
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
        yield _finding(
            f"{container.path}.ports[{index}].hostPort",
            host_port,
            f"container {quote(name)} listens on the node's port {host_port}, beside the "
            "node's own services " + _control("Host Ports"),
            "remove hostPort and reach the container through a Service",
            name,
            f"{container.list_name}.ports[{host_port}].hostPort",
        )
    context = spec.get("securityContext")
    if isinstance(context, dict):
        yield from _contexts(view, policy, context, f"{container.path}.securityContext", name)
        proc_mount = context.get("procMount")
        if proc_mount not in (None, "Default") and not user_namespace:
            yield _finding(
                f"{container.path}.securityContext.procMount",
                proc_mount,
                f"container {quote(name)} unmasks /proc, exposing the host's kernel "
                "interfaces it masks " + _control("/proc Mount Type"),
                "remove procMount (or set hostUsers: false to run the Pod in a user namespace)",
                name,
                f"{container.list_name}.securityContext.procMount",
            )
        capabilities = context.get("capabilities")
        added = capabilities.get("add") if isinstance(capabilities, dict) else None
        for index, raw in enumerate(added if isinstance(added, list) else ()):
            if isinstance(raw, str) and raw in BASELINE:
                continue
            capability = capability_name(raw)
            if capability in BASELINE:
                yield _finding(
                    f"{container.path}.securityContext.capabilities.add[{index}]",
                    raw,
                    f"container {quote(name)} adds {quote(raw)}, which Pod Security compares "
                    f"as written " + _control("Capabilities"),
                    f"write it as {capability}",
                    name,
                    f"{container.list_name}.capabilities.add[{capability}]",
                )
            elif capability in HOST_ACCESS_CAPABILITIES:
                continue  # host-access's
            elif not policy.grants(view.namespace).allows_capability(capability, name):
                yield _finding(
                    f"{container.path}.securityContext.capabilities.add[{index}]",
                    raw,
                    f"container {quote(name)} adds the capability {capability}, beyond Pod "
                    "Security baseline's " + _control("Capabilities"),
                    f"remove {capability}, or have the platform team grant it to the namespace "
                    "(spec.tenants[].grants.capabilities, optionally for named containers)",
                    name,
                    f"{container.list_name}.capabilities.add[{capability}]",
                )
    for probe in PROBES:
        handler = spec.get(probe)
        if isinstance(handler, dict):  # most containers have none: no generator for them
            yield from _hosts(view, container, handler, probe)
    lifecycle = spec.get("lifecycle")
    if isinstance(lifecycle, dict):
        for name in HANDLERS:
            handler = lifecycle.get(name)
            if isinstance(handler, dict):
                yield from _hosts(view, container, handler, f"lifecycle.{name}")


def _hosts(
    view: PodView, container: ContainerView, handler: Mapping, where: str
) -> Iterator[Violation]:
    for action in ("httpGet", "tcpSocket"):
        target = handler.get(action)
        host = target.get("host") if isinstance(target, dict) else None
        if host in (None, ""):
            continue
        yield _finding(
            f"{container.path}.{where}.{action}.host",
            host,
            f"container {quote(container.name)} has the kubelet connect to {quote(host)} from "
            "the node, past network policy " + _control("Host Probes / Lifecycle Hooks"),
            f"remove {where}.{action}.host: the kubelet then connects to the Pod's own address",
            container.name,
            f"{container.list_name}.{where}.{action}.host",
        )


def _finding(
    path: str, value: object, message: str, hint: str, subject: str, field: str
) -> Violation:
    return Violation(
        rule=RULE, path=path, value=value, message=message, hint=hint, subject=subject, field=field
    )
