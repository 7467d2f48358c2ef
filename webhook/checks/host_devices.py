"""No host paths, devices or mounts from the node except the data directories the policy allows.

Restricted, in Pods that can reach a GPU node, for hostPath volumes (and host paths an operator
mounts from a field of its own), judged canonical (``//``, ``/./``, ``..``, a trailing ``/``;
``/var/run`` read as ``/run``):

- node-control paths, always, at, below or above them: ``/`` itself, devices, processes,
  configuration, programs, homes, the kubelet's and the container runtimes' state and sockets,
  wherever a distribution keeps them (``/var/home`` on Fedora CoreOS and RHCOS, ``/sysroot``
  and ``/ostree`` on ostree hosts, ``/local`` on Bottlerocket, ``/system`` on Talos,
  ``/mnt/k8s-disks`` on EKS, ``/mnt/aks`` on AKS, ``/opt/containerd`` wherever containerd
  runs; ``webhook.policy.hostpaths.NODE_CONTROL`` lists each with its source); relative paths;
  the paths the policy adds (``hostDevices.paths``);
- other tenants' data (local-volume provisioners' directories, cloud local SSDs) unless the
  allow-list names it;
- any other path not on the policy's ``hostDevices.allowedPaths`` nor the namespace's
  ``hostPaths`` grants: warned, not refused, when the policy lists no allowed paths and its
  ``newChecks`` is Warn;
- annotations that have the node inject host devices or mounts (containerd NRI's
  ``devices.``/``mounts.noderesource.dev``, older ``*.nri.io``; GKE's ``devices.gke.io``),
  unless a tenant grant names the key.

Allowed: the data directories the allow-list and grants name (``/data``, ``/mnt/datasets``).
The kubelet follows symlinks on the node, which no admission webhook sees: a Pod that may write
to an allowed host directory can plant one there.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core import advice, injection
from webhook.core.findings import Violation, quote
from webhook.core.hostpaths import refusal
from webhook.core.pods import PodView, grants_of
from webhook.policy.hostpaths import canonical
from webhook.policy.model import Policy

RULE = "host-devices"
BASELINE = "Pod Security baseline: HostPath Volumes"


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
    yield from injection.refused(view, policy, RULE) if view.annotations else ()


def _judge(
    view: PodView, policy: Policy, raw: str, field_path: str, subject: str
) -> Iterator[Violation]:
    found = refusal(raw, policy, grants_of(view, policy))
    if found is None:
        return
    path = canonical(raw)
    mounts = f"{subject} mounts " + (
        f"{quote(raw)} (that is {quote(path)})" if path != raw else quote(raw)
    )
    if found.kind == "unlisted":
        listed = ", ".join(found.listed)
        yield Violation(
            rule=RULE,
            path=field_path,
            value=raw,
            message=f"{mounts}, {found.reason} ({listed or 'none are listed'}) ({BASELINE})",
            hint=advice.fix(
                view,
                policy,
                (f"mount one of {listed}, or have" if listed else "have")
                + " the platform team list it in spec.hostDevices.allowedPaths (or the "
                "namespace's spec.tenants[].grants.hostPaths)",
            ),
            subject=subject,
            field="volumes.hostPath.path",
            # Warned at most where the policy lists no allowed paths while newChecks is Warn:
            # an upgrade must not break GPU Pods that mount a dataset.
            advisory=policy.host_path_allow_list is None and policy.new_checks_advisory,
        )
        return
    tenant_data = found.kind == "tenant-data"
    yield Violation(
        rule=RULE,
        path=field_path,
        value=raw,
        message=f"{mounts}, which "
        + ("holds other tenants' data: " if tenant_data else "exposes ")
        + advice.why(view, policy, found.reason)
        + f" ({BASELINE})",
        hint=advice.fix(
            view,
            policy,
            "mount a directory of your own, or have the platform team name this one in "
            "spec.hostDevices.allowedPaths"
            if tenant_data
            else "remove the volume, or mount a data directory the policy allows instead",
            # Only for the device trees: a GPU is asked for, not mounted.
            gpu="request GPUs in resources.limits: the device plugin mounts the allocated devices"
            if path.startswith(("/dev", "/sys", "/proc", "/run/nvidia"))
            else "",
        ),
        subject=subject,
        field="volumes.hostPath.path",
    )
