"""Every DRA claim and claim template that asks for admin access, with what allowed it: what
``gpu-admission cluster check`` adds to its report (issue 35).

Admin access sees and manages devices other Pods use. The API server allows it only in
namespaces labelled ``resource.kubernetes.io/admin-access: "true"``; the policy narrows that to
tenants granted ``draAdminAccess`` (the ``dra-admin-access`` rule). Objects created before
either changed keep their admin access, so the report lists each one:

- ``dra-admin-access`` (info): granted, and allowed by the namespace's label;
- ``dra-admin-access-ungranted`` (drift): no tenant grant covers its namespace (the rule would
  refuse it now), or its namespace no longer carries the label (new claims there are refused
  by the API server, and this one keeps what it has).

Claims and templates are listed with the auditor role's list on them (the judged kinds'); the
namespaces with the label by a label selector (its list on namespaces).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from webhook.audit.drift_finding import Drift
from webhook.cluster.connection import Cluster, ClusterError
from webhook.cluster.listing import Lister, RequestRefused
from webhook.core.claims import read_claim_spec
from webhook.core.paths import walk_path
from webhook.policy.model import Policy

ADMIN_ACCESS_KINDS = ("dra-admin-access", "dra-admin-access-ungranted")
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"


def check_admin_access(cluster: Cluster, policy: Policy) -> list[Drift]:
    """The claims and templates of the cluster that ask for admin access. A list refused
    raises ``RequestRefused`` (a ``ClusterError``)."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    lister = Lister(cluster, None)
    objects: list[Mapping[str, Any]] = []
    for workload in policy.workloads.values():
        if workload.claims:
            for page in lister.object_pages(workload):
                objects += [obj for obj, _ in _asking(policy, page)]
    if lister.problems:
        raise ClusterError(lister.problems[0].message)
    if not objects:
        return []  # (no namespace is read)
    core = k8s.CoreV1Api(cluster.api_client)
    try:
        labelled = {
            str((item.get("metadata") or {}).get("name"))
            for page in lister.pages(
                lambda **kwargs: core.list_namespace(
                    label_selector=f"{ADMIN_ACCESS_LABEL}=true", **kwargs
                )
            )
            for item in page.get("items") or ()
            if isinstance(item, dict)
        }
    except ApiException as exc:
        raise RequestRefused("cannot list namespaces", exc) from None
    return find_admin_access(policy, objects, labelled)


def find_admin_access(
    policy: Policy, objects: Iterable[Mapping[str, Any]], labelled: set[str]
) -> list[Drift]:
    """Each object of ``objects`` (ResourceClaims and templates) that asks for admin access,
    in the order given, with the label and grant that allowed it."""
    found: list[Drift] = []
    for obj, classes in _asking(policy, objects):
        metadata = obj.get("metadata") or {}
        namespace = str(metadata.get("namespace") or "")
        ref = f"{obj.get('kind')} {namespace}/{metadata.get('name')}"
        granting = next(
            (
                t
                for t in policy.tenants
                if t.grants.dra_admin_access and t.namespaces.matches(namespace)
            ),
            None,
        )
        what = f"{ref} asks for admin access to {', '.join(classes)} devices"
        if granting is not None and namespace in labelled:
            found.append(
                Drift(
                    "dra-admin-access",
                    ref,
                    (),
                    f"{what}: allowed by the namespace label {ADMIN_ACCESS_LABEL}=true and "
                    f"tenants[{granting.index}].grants.draAdminAccess ({granting.named})",
                    (namespace,),
                    level="info",
                )
            )
            continue
        missing = []
        if granting is None:
            missing.append("no tenant grants draAdminAccess to its namespace")
        if namespace not in labelled:
            missing.append(f"its namespace is no longer labelled {ADMIN_ACCESS_LABEL}=true")
        found.append(
            Drift(
                "dra-admin-access-ungranted",
                ref,
                (),
                f"{what}, but {' and '.join(missing)}: delete it, or grant it knowingly",
                (namespace,),
            )
        )
    return found


def _asking(
    policy: Policy, objects: Iterable[Mapping[str, Any]]
) -> Iterator[tuple[Mapping[str, Any], list[str]]]:
    """Each object that asks for admin access, with the classes it asks it of: its claim
    specs found where its kind keeps them (``webhook.policy.workloads.CLAIM_KINDS``)."""
    for obj in objects:
        group = str(obj.get("apiVersion", "")).rpartition("/")[0]
        workload = policy.workloads.get((group, str(obj.get("kind", ""))))
        if workload is None:
            continue
        classes = sorted(
            {
                str(ask.device_class)
                for target in workload.targets
                for path, _, spec in walk_path(obj, target.path)
                for ask in read_claim_spec(spec, path).asks
                if ask.admin_access
            }
        )
        if classes:
            yield obj, classes
