"""The mutation planner: what a GPU Pod needs from its pool, as ``add`` operations.

Tolerations for the pool's taints that the Pod does not already tolerate; the pool's labels as
required node affinity, ANDed into every existing nodeSelectorTerm (or a new term), and so the
products its tenant is entitled to (``webhook.core.products``); the pool's
preferred terms when absent; optionally ``NVIDIA_VISIBLE_DEVICES=void`` in containers that
request no GPU (in every Pod that can reach a GPU node); the policy's GPU defaults for Pods
(``webhook.admission.gpu_defaults``); and an annotation recording what was injected. Every
operation is guarded by what the Pod already has, so mutating the mutated Pod plans nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.admission import gpu_defaults, patch
from webhook.core.pods import PodView, ephemeral_container_names
from webhook.core.pools import Selection, confining_expressions
from webhook.core.products import product_expression, product_reach, product_tenant
from webhook.core.scheduling import tolerates, toleration_for
from webhook.core.scope import surely_gets_gpu
from webhook.policy.model import INJECTED_ANNOTATION, Policy

REQUIRED = ("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
PREFERRED = ("spec", "affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution")


def plan(
    pod: Mapping[str, Any],
    view: PodView,
    selection: Selection,
    policy: Policy,
    *,
    inject_void: bool,
    confine_products: bool,
) -> tuple[dict[str, Any], ...]:
    """The ``add`` operations that give the Pod what its pool needs; none when it has it all.
    ``inject_void``: add ``NVIDIA_VISIBLE_DEVICES=void`` to every container that requests no
    GPU (the caller decides: the policy asks for it and the Pod can reach GPU nodes).
    ``confine_products``: keep a GPU Pod to its tenant's products (the caller decides: the
    rule that requires it would deny it)."""
    planned = patch.Planned(pod)
    injected: list[str] = []  # what was added, for the annotation

    tolerations = view.tolerations()
    missing = []
    for taint in selection.taints:
        if not (tolerations and any(tolerates(t, taint) for t in tolerations)):
            missing.append(toleration_for(taint))
    if missing:
        planned.add(patch.append(planned.working, ("spec", "tolerations"), missing))
        injected.append(f"tolerations={len(missing)}")

    confining = confining_expressions(view, selection)
    if confining:
        required = _required_operations(planned.working, confining)
        if required:
            planned.add(required)
            injected.append(f"required-affinity={'+'.join(p.name for p in selection.pools)}")
    tenant = product_tenant(view, policy) if confine_products else None
    if tenant is not None and tenant.entitlements is not None and not view.spec.get("nodeName"):
        reach = product_reach(view, policy, tenant.entitlements.product_values)
        # A Pod that names a product it may not use is left to the pool-access rule: an In
        # requirement beside its own would only make it pend forever.
        if not reach.confined and not reach.named:
            products = _required_operations(planned.working, (product_expression(tenant),))
            if products:
                planned.add(products)
                injected.append(f"product-affinity=tenants[{tenant.index}]")
    preferences: list[Any] = []
    for pool in selection.pools:
        preferences += [t for t in pool.preferred_affinity if t not in preferences]
    preferred, added = _preferred_operations(planned.working, tuple(preferences))
    if preferred:
        planned.add(preferred)
        injected.append(f"preferred-affinity={added}")

    if inject_void:
        voided = _add_void(planned, view, ("initContainers", "containers"), set())
        if voided:
            injected.append(f"visible-devices-void={voided}")
    injected += gpu_defaults.pod_defaults(planned, view, policy)

    if planned.operations:
        note = ",".join(injected)
        # The last operation: nothing reads the Pod it leaves, so it is not applied to it.
        annotation = patch.add(
            planned.working, ("metadata", "annotations", INJECTED_ANNOTATION), note
        )
        return (*planned.operations, *(annotation or ()))
    return ()


def void_added_ephemeral(
    pod: Mapping[str, Any], view: PodView, old: Mapping[str, Any]
) -> tuple[dict[str, Any], ...]:
    """``NVIDIA_VISIBLE_DEVICES=void`` for the ephemeral containers an update adds (kubectl
    debug), by name: the API server keeps only ephemeral container changes from such a request,
    so nothing else is patched."""
    planned = patch.Planned(pod)
    _add_void(planned, view, ("ephemeralContainers",), ephemeral_container_names(old))
    return tuple(planned.operations)


def _add_void(planned: patch.Planned, view: PodView, lists: tuple[str, ...], skip: set[Any]) -> int:
    """Append the void entry to each container of ``lists`` (but ``skip``'s names) that requests
    no GPU and sets no NVIDIA_VISIBLE_DEVICES; how many were voided."""
    voided = 0
    for container in view.containers:
        if container.list_name not in lists or container.name in skip:
            continue
        if surely_gets_gpu(container):
            continue
        env = container.spec.get("env")
        names = [v.get("name") for v in env if isinstance(v, dict)] if isinstance(env, list) else []
        if "NVIDIA_VISIBLE_DEVICES" in names:
            continue
        ops = patch.append(
            planned.working,
            ("spec", container.list_name, container.index, "env"),
            [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        )
        if ops:
            planned.add(ops)
            voided += 1
    return voided


def _has(term: Mapping[str, Any], expr: Mapping[str, Any]) -> bool:
    existing = term.get("matchExpressions")
    return isinstance(existing, list) and any(
        isinstance(e, dict)
        and e.get("key") == expr["key"]
        and e.get("operator") == expr["operator"]
        and e.get("values") == expr["values"]
        for e in existing
    )


def _required_operations(
    pod: Mapping[str, Any], wanted: tuple[dict[str, Any], ...]
) -> list[dict[str, Any]]:
    terms_path = (*REQUIRED, "nodeSelectorTerms")
    terms = patch.lookup(pod, terms_path)
    if not isinstance(terms, list) or not terms:
        return patch.append(pod, terms_path, [{"matchExpressions": list(wanted)}]) or []
    operations: list[dict[str, Any]] = []
    for index, term in enumerate(terms):
        if not isinstance(term, dict):
            continue
        missing = [e for e in wanted if not _has(term, e)]
        operations += patch.append(pod, (*terms_path, index, "matchExpressions"), missing) or []
    return operations


def _preferred_operations(
    pod: Mapping[str, Any], preferences: tuple[Any, ...]
) -> tuple[list[dict[str, Any]], int]:
    """The operations that add the missing preferred terms, and how many terms they add."""
    if not preferences:
        return [], 0
    node = patch.lookup(pod, PREFERRED)
    existing = node if isinstance(node, list) else []
    missing = []
    for preference in preferences:
        term = {
            "weight": preference["weight"],
            "preference": {
                "matchExpressions": [
                    dict(e, values=list(e["values"])) if "values" in e else dict(e)
                    for e in preference["matchExpressions"]
                ]
            },
        }
        if term not in existing:
            missing.append(term)
    return patch.append(pod, PREFERRED, missing) or [], len(missing)
