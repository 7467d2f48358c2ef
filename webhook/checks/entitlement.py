"""A tenant uses the GPU resources and counts it is entitled to.

Restricted, where the policy states a tenant's entitlements (the first ``tenants`` entry that
matches the namespace and states them): a GPU resource the policy declares that they do not
list; and more GPU devices (full cards, MIG instances and shared replicas alike) in one
container, or in one Pod as the scheduler counts them, than they allow. (Their products are
where a Pod may land: the pool-access rule's.) Allowed: namespaces
no entry states entitlements for; companion resources (NICs beside GPUs); names the policy
does not declare (the resource-name rule's). New in this release: warned while ``newChecks``
is Warn. A ResourceQuota limits how many GPUs a namespace requests in all, not which kind nor
how many one Pod asks for: this is the per-Pod side.

Warned, never denied: a template whose kind counts its Pods (``replicas`` in the workload
catalogue: a Deployment's replicas, a JobSet's replicated Jobs times their parallelism) and
whose Pods at once ask for more of a resource than the tenant's ``maxGPUs`` allows the
namespace: its quota refuses the Pods beyond. A warning only, since the count changes through
``/scale`` (``kubectl scale``, autoscalers), which no webhook sees; each template is counted on
its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from typing import NamedTuple

from webhook.core.dra import known_class
from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView, effective_requests
from webhook.core.replicas import Replicas, replicas_of
from webhook.core.wording import plain_number
from webhook.policy.dra import DEVICE_CLASS_RESOURCE_PREFIX
from webhook.policy.model import Policy
from webhook.policy.quantity import Quantity

RULE = "entitlement"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    tenant = policy.entitled_tenant(view.namespace, view.namespace_labels)
    if tenant is None or tenant.entitlements is None:
        return
    entitled = tenant.entitlements
    said = _Said(tenant.setting("entitlements"), tenant.ask, policy.new_checks_advisory)
    if view.claim_object:
        yield from _claimed_classes(view, policy, entitled.device_classes, said)
        return
    for container in view.gpu_containers:
        devices: Quantity = 0
        for name, quantity in container.gpu_quantity.items():
            if quantity is None or quantity <= 0 or name not in policy.declared_names:
                continue
            devices += quantity
            if name.startswith(DEVICE_CLASS_RESOURCE_PREFIX):
                # DRA's extended resource of a GPU class: held to the tenant's device classes.
                device_class = name[len(DEVICE_CLASS_RESOURCE_PREFIX) :]
                if entitled.device_classes is not None and (
                    device_class not in entitled.device_classes
                ):
                    yield Violation(
                        rule=RULE,
                        path=container.resource_path(name),
                        value=name,
                        message=f"namespace {quote(view.namespace)} may not claim "
                        f"{device_class} devices: {said.setting} lists device classes "
                        f"{', '.join(sorted(entitled.device_classes))}",
                        hint=f"ask for one of those, or {said.ask} to be entitled to "
                        f"{device_class}",
                        error_type="Forbidden",
                        subject=container.name,
                        field=f"{container.list_name}.resources[{name}]",
                        advisory=said.advisory,
                    )
                continue
            if entitled.resources is not None and name not in entitled.resources:
                yield Violation(
                    rule=RULE,
                    path=container.resource_path(name),
                    value=name,
                    message=f"namespace {quote(view.namespace)} may not use {name}: "
                    f"{said.setting} lists {', '.join(sorted(entitled.resources))}",
                    hint=f"request one of those, or {said.ask} to be entitled to {name}",
                    error_type="Forbidden",
                    subject=container.name,
                    field=f"{container.list_name}.resources[{name}]",
                    advisory=said.advisory,
                )
        limit = entitled.max_per_container
        if limit is not None and devices > limit:
            yield said.too_many(
                f"{container.path}.{container.resources_field}",
                f"container {quote(container.name)}",
                devices,
                limit,
                "container",
                container.name,
            )
    totals = effective_requests(view) if entitled.max_per_pod is not None else {}
    if entitled.max_per_pod is not None:
        counted = [name for name in totals if name in policy.declared_names]
        devices = sum((totals[name] for name in counted), Fraction(0))
        if devices > entitled.max_per_pod:
            yield said.too_many(
                view.first_request_path(counted[0]),
                "the Pod",
                devices,
                entitled.max_per_pod,
                "Pod",
                "pod",
            )
    replicas = replicas_of(view.counted) if view.counted and entitled.max_gpus else None
    if replicas is not None:
        totals = totals or effective_requests(view)
        for name, most in sorted(entitled.max_gpus.items()):
            per_pod = totals.get(name)
            if per_pod and replicas.pods * per_pod > most:
                yield said.too_many_at_once(replicas, name, per_pod, most)


def _claimed_classes(
    view: PodView, policy: Policy, classes: frozenset[str] | None, said: _Said
) -> Iterator[Violation]:
    """A claim's requests of GPU device classes the tenant does not list."""
    if classes is None:
        return
    for spec in view.claim_specs:
        for ask in spec.asks:
            known = known_class(ask.device_class, policy, view.nodes)
            if known is None or not known.gpu or known.name in classes:
                continue
            yield Violation(
                rule=RULE,
                path=ask.class_path,
                value=known.name,
                message=f"namespace {quote(view.namespace)} may not claim {known.name} "
                f"devices: {said.setting} lists device classes {', '.join(sorted(classes))}",
                hint=f"ask for one of those, or {said.ask} to be entitled to {known.name}",
                error_type="Forbidden",
                subject=ask.reference,
                field="deviceClassName",
                advisory=said.advisory,
            )


class _Said(NamedTuple):
    """What every finding of one tenant's entitlements says: the setting, whom to ask, and
    whether it is a warning at most (a check new in this release)."""

    setting: str
    ask: str
    advisory: bool

    def too_many(
        self, path: str, who: str, devices: Quantity, limit: int, per: str, subject: str
    ) -> Violation:
        shown = plain_number(devices)
        return Violation(
            rule=RULE,
            path=path,
            value=shown,
            message=f"{who} requests {shown} GPU devices in all, above the {limit} per {per} "
            f"that {self.setting} allows",
            hint=f"request at most {limit} (more Pods, or a training controller), or "
            f"{self.ask} for more",
            error_type="Forbidden",
            subject=subject,
            field=f"maxGPUsPer{per.capitalize()}",
            advisory=self.advisory,
        )

    def too_many_at_once(
        self, replicas: Replicas, name: str, per_pod: Quantity, most: int
    ) -> Violation:
        """Always a warning: the count changes through /scale, which no webhook sees."""
        total, each = plain_number(replicas.pods * per_pod), plain_number(per_pod)
        fit = int(most // per_pod)
        fix = (
            f"{fit} of these Pods fit at once: run at most {fit}"
            if fit
            else f"not one of these Pods fits: request at most {most} {name} in each"
        )
        return Violation(
            rule=RULE,
            path=replicas.path,
            value=replicas.pods,
            message=f"{replicas.shown} × {each} {name} per Pod = {total}, above the {most} that "
            f"{self.setting} allows this namespace at once (its ResourceQuota refuses the Pods "
            "beyond it: they are not created, and their controller reports FailedCreate)",
            hint=f"{fix}, or {self.ask} for a larger maxGPUs",
            subject="replicas",
            field=f"replicas[{name}]",
            advisory=True,
        )
