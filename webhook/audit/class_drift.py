"""The RuntimeClasses and PriorityClasses the policy's GPU defaults give workloads, against the
cluster's: what ``gpu-admission cluster check`` adds where the policy names classes.

A class the mutating webhook writes into a workload's Pod template that the cluster does not
have gets every Pod of that workload refused by the API server, while the workload itself is
accepted: the only sign is an event on its ReplicaSet or Job. Each class named in
``mutation.gpuDefaults`` or a pool (``runtimeClassName``, ``priorityClassName``) is read by
name (get on runtimeclasses and priorityclasses: the auditor role's), once:

- ``runtime-class-missing``: a RuntimeClass the policy names that the cluster does not have;
- ``priority-class-missing``: a PriorityClass the policy names that the cluster does not have.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from webhook.audit.drift_finding import Drift
from webhook.cluster.connection import Cluster
from webhook.cluster.listing import Lister, RequestRefused
from webhook.policy.model import Policy

CLASS_DRIFT_KINDS = ("runtime-class-missing", "priority-class-missing")


def named_classes(policy: Policy, field: str) -> dict[str, list[str]]:
    """Each class of ``field`` (``runtimeClassName`` or ``priorityClassName``) the policy
    names, with the settings that name it, in the policy's order."""
    attribute = "runtime_class" if field == "runtimeClassName" else "priority_class"
    named: dict[str, list[str]] = {}
    default = getattr(policy.gpu_defaults, attribute)
    if default is not None:
        named.setdefault(default, []).append(f"mutation.gpuDefaults.{field}")
    for index, pool in enumerate(policy.pools):
        value = getattr(pool, attribute)
        if value is not None:
            named.setdefault(value, []).append(f"pools[{index}].{field} ({pool.name})")
    return named


def check_classes(cluster: Cluster, policy: Policy) -> list[Drift]:
    """The classes the policy names that the cluster does not have. A read refused for
    another reason than not found raises ``RequestRefused`` (a ``ClusterError``)."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    lister = Lister(cluster, None)
    runtime = k8s.NodeV1Api(cluster.api_client).read_runtime_class
    priority = k8s.SchedulingV1Api(cluster.api_client).read_priority_class

    def exists(read: Callable[..., object], what: str, name: str) -> bool:
        try:
            lister.call(partial(read, name))
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise RequestRefused(f"cannot read {what} {name}", exc) from None
        return True

    return find_class_drift(
        policy,
        partial(exists, runtime, "RuntimeClass"),
        partial(exists, priority, "PriorityClass"),
    )


def find_class_drift(
    policy: Policy,
    runtime_class_exists: Callable[[str], bool],
    priority_class_exists: Callable[[str], bool],
) -> list[Drift]:
    """The named classes that do not exist, RuntimeClasses first, each asked about once."""
    found: list[Drift] = []
    for kind, field, exists, what in (
        ("runtime-class-missing", "runtimeClassName", runtime_class_exists, "RuntimeClass"),
        ("priority-class-missing", "priorityClassName", priority_class_exists, "PriorityClass"),
    ):
        for name, settings in named_classes(policy, field).items():
            if exists(name):
                continue
            found.append(
                Drift(
                    kind,
                    name,
                    (),
                    f"{what} {name!r} ({', '.join(settings)}) does not exist: the API server "
                    "refuses every Pod of the GPU workloads the mutating webhook gives it, "
                    f"while the workloads themselves are accepted; create the {what} (kubectl "
                    f"get {what.lower()}), or correct the name in the policy",
                )
            )
    return found
