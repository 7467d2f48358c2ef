"""The lint of what a policy allows beyond Pod Security baseline: its tenants' grants and its
allowed host paths. A grant of what no grant may cover is an error; an allowed host path that
can never be allowed is an error too, but one the server survives (``policy validate`` refuses
it; at load it is dropped, so that a replica does not crash-loop on a policy that was valid
yesterday); an allowed path that holds other tenants' data is a warning."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.policy.annotations import classify
from webhook.policy.capabilities import PRIVILEGED_EQUIVALENT, capability_name
from webhook.policy.hostpaths import TENANT_DATA, canonical, relation, touched, unsafe_to_allow
from webhook.policy.lines import LineFinder, render_path
from webhook.policy.model import PolicyWarning


def grant_errors(
    grants: dict[str, Any], path: list[Any], err: Callable[[list[Any], str], None]
) -> None:
    """Errors in one tenant's ``grants`` (at ``path``): keys that are no injection annotation,
    privileged-equivalent capabilities."""
    for j, annotation in enumerate(grants.get("annotations", [])):
        key = annotation["key"]
        if classify(key) is None:
            err(
                [*path, "annotations", j, "key"],
                f"{key!r} is not an annotation that has the node inject devices, mounts or "
                "settings (containerd NRI's *.noderesource.dev, *.nri.io, *.nri.containerd.io; "
                "GKE's devices.gke.io): nothing to grant",
            )
    for j, item in enumerate(grants.get("capabilities", [])):
        name = capability_name(item if isinstance(item, str) else item["name"])
        if name in PRIVILEGED_EQUIVALENT:
            err(
                [*path, "capabilities", j],
                f"{name} is privileged-equivalent ({PRIVILEGED_EQUIVALENT[name]}): no grant "
                "covers it; a namespace that needs it must be exempted, knowingly",
            )


def host_path_findings(doc: dict[str, Any], lines: LineFinder) -> list[PolicyWarning]:
    """The allowed host paths (``hostDevices.allowedPaths``, tenants' ``hostPaths``) that can
    never be allowed, as errors (``policy validate`` refuses them; at load they are dropped,
    so that a replica does not crash-loop on a policy that was valid yesterday), and those
    that hold other tenants' local volumes, as warnings."""
    spec = doc["spec"]
    listed = [
        (["spec", "hostDevices", "allowedPaths", i], raw, "hostDevices.allowedPaths")
        for i, raw in enumerate(spec.get("hostDevices", {}).get("allowedPaths", []))
    ]
    for i, tenant in enumerate(spec.get("tenants", [])):
        listed += [
            (["spec", "tenants", i, "grants", "hostPaths", j], raw, "hostPaths")
            for j, raw in enumerate(tenant.get("grants", {}).get("hostPaths", []))
        ]
    found: list[PolicyWarning] = []
    for path, raw, where in listed:
        unsafe = unsafe_to_allow(raw)
        if unsafe is not None:
            message = (
                f"{raw!r} can never be allowed: {unsafe}; list the data directories themselves "
                f"(e.g. /mnt/datasets). Until then it is dropped from {where}, and the paths it "
                "would have covered are refused"
            )
            found.append(PolicyWarning(lines.line(path), render_path(path), message, "error"))
            continue
        data = touched(canonical(raw), TENANT_DATA)
        if data is not None:
            message = (
                f"{raw!r} allows other tenants' data: {relation(canonical(raw), data)}; any Pod "
                "that may mount it reads and writes the local volumes of every other Pod on the "
                "node"
            )
            found.append(PolicyWarning(lines.line(path), render_path(path), message))
    return found
