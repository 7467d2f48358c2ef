"""A tenant's GPU workloads go through its queue.

Restricted, where the policy requires a tenant's queue (the first ``tenants`` entry that matches
the namespace and states ``requirements``): a workload or a bare Pod whose Pods request a GPU
without the queue label where the queueing system reads it (Kueue's
``kueue.x-k8s.io/queue-name`` by default, on the workload itself for the kinds Kueue manages
whole, on the Pods for the others: ``webhook.core.queues``), or naming a queue the tenant may
not use, unless its Pods are scheduled by one of the batch schedulers the tenant may use
(KAI's ``kai-scheduler``, Volcano's ``volcano``), which queue them themselves; with KAI, its
queue (``kai.scheduler/queue``, KAI's ``default-queue`` where none is named) is one the tenant
may use. Allowed: objects a controller creates (``request.userInfo`` among the policy's
``controllers``: a Job's Pods, a JobSet's Jobs, Kueue's own updates), asked when their workload
was; a DaemonSet's Pods; templates a workload refers to (a TrainingRuntime); templates that
request no GPU; namespaces no entry requires a queue of. A tenant that writes
``ownerReferences`` is asked all the same: only the API server's word on who sent a request
counts. Files judged offline are judged as their author wrote them, a user's. New in this
release: warned while ``newChecks`` is Warn. Kueue's ``manageJobsWithoutQueueName`` is the
cluster's side of it: it holds what arrives without a queue instead of refusing it.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView
from webhook.core.queues import (
    KAI_DEFAULT_QUEUE,
    KAI_QUEUE_LABEL,
    KAI_SCHEDULER,
    NOT_QUEUED,
    Submission,
    kai_queue,
    kueue_label_place,
    kueue_took,
    scheduler_name,
)
from webhook.policy.model import Policy
from webhook.policy.queues import KUEUE_QUEUE_LABEL, QueueRequirement
from webhook.policy.tenants import Tenant

RULE = "queue"
DAEMONSETS = frozenset({("apps", "DaemonSet"), ("extensions", "DaemonSet")})


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    submission = view.submission
    if (
        not policy.requires_queues
        or submission is None
        or submission.by_controller
        or submission.key in NOT_QUEUED
        or not any(template is view for template in submission.gpu_templates)
    ):
        return
    tenant = policy.queue_tenant(view.namespace, view.namespace_labels)
    if tenant is None or tenant.queue is None:
        return
    requirement = tenant.queue
    advisory = policy.new_checks_advisory
    if submission.key in DAEMONSETS:
        yield _daemonset(view, tenant, advisory)
        return
    if view.kind == "Pod" and view.spec_path == "spec" and view.spec.get("nodeName"):
        yield _named_node(view, tenant, advisory)
        return
    label = _asked(view, submission, requirement)
    if label != requirement.label and requirement.queues is not None:
        # Kueue takes what carries its label whatever the scheduler: its queue is asked too.
        kueue = kueue_label_place(view, submission, KUEUE_QUEUE_LABEL)
        if kueue.value is not None and kueue.value not in requirement.queues:
            if not kueue.shared or submission.gpu_templates[0] is view:
                yield _not_allowed(
                    view, tenant, requirement, KUEUE_QUEUE_LABEL, kueue.value, kueue.path, advisory
                )
    if label is None:
        return  # an allowed scheduler queues the Pods, and names no queue to check
    if label == KAI_QUEUE_LABEL:
        place = kai_queue(view, submission)
        queue = KAI_DEFAULT_QUEUE if place.value is None else place.value
    else:
        place = kueue_label_place(view, submission, label)
        queue = place.value
    if place.shared and _first_asked(submission, requirement, label) is not view:
        return  # a label on the workload itself is asked for once, not per template
    if not isinstance(queue, str) or queue == "":
        # A label value the API server would refuse on a built-in kind (a list in a custom
        # resource's podMetadata) names no queue either.
        yield _no_queue(view, tenant, requirement, place.path, advisory)
    elif requirement.queues is not None and queue not in requirement.queues:
        yield _not_allowed(view, tenant, requirement, label, queue, place.path, advisory)
    elif label == KUEUE_QUEUE_LABEL:
        took = kueue_took(view, submission)
        if took is not None and not took[0]:
            yield _not_taken(view, tenant, took[1], advisory)


def _asked(view: PodView, submission: Submission, requirement: QueueRequirement) -> str | None:
    """The label that names the view's queue: the requirement's, unless an allowed scheduler
    queues its Pods (KAI's own label where the tenant's queues are listed, else none)."""
    scheduler, _ = scheduler_name(view, submission)
    if scheduler not in requirement.scheduler_names:
        return requirement.label
    if scheduler == KAI_SCHEDULER and requirement.queues is not None:
        return KAI_QUEUE_LABEL
    return None


def _first_asked(
    submission: Submission, requirement: QueueRequirement, label: str
) -> PodView | None:
    """The first of the object's GPU templates asked for the same label."""
    return next(
        (v for v in submission.gpu_templates if _asked(v, submission, requirement) == label),
        None,
    )


def _what_to_write(view: PodView, requirement: QueueRequirement, labels_path: str) -> str:
    """The fixes the requirement accepts: the label with an allowed queue, or a scheduler."""
    queue = (
        f"one of {', '.join(sorted(requirement.queues))}"
        if requirement.queues is not None
        else "<queue>"
    )
    fixes = [f"{labels_path}: {{{requirement.label}: {queue}}}"]
    for name in sorted(requirement.scheduler_names):
        also = ""
        if name == KAI_SCHEDULER and requirement.queues is not None:
            also = f" with the label {KAI_QUEUE_LABEL}: {queue}"
        fixes.append(f"{view.field_path('schedulerName')}: {name}{also}")
    return ", or ".join(fixes)


def _no_queue(
    view: PodView, tenant: Tenant, requirement: QueueRequirement, labels_path: str, advisory: bool
) -> Violation:
    through = " or ".join(
        [
            f"the queue label {requirement.label}",
            *(f"the scheduler {name}" for name in sorted(requirement.scheduler_names)),
        ]
    )
    setting = tenant.setting("requirements")
    return Violation(
        rule=RULE,
        path=f"{labels_path}[{requirement.label}]",
        value=None,
        message=f"the GPU workload goes through no queue: {setting} requires "
        f"namespace {quote(view.namespace)}'s GPU workloads to go through {through}",
        hint=f"write {_what_to_write(view, requirement, labels_path)}; {tenant.ask} "
        "which queue to use",
        error_type="Required value",
        subject="queue",
        field=requirement.label,
        advisory=advisory,
    )


def _not_allowed(
    view: PodView,
    tenant: Tenant,
    requirement: QueueRequirement,
    label: str,
    queue: object,
    labels_path: str,
    advisory: bool,
) -> Violation:
    allowed = ", ".join(sorted(requirement.queues or ()))
    default = " (KAI's queue for Pods that name none)" if queue == KAI_DEFAULT_QUEUE else ""
    setting = tenant.setting("requirements")
    return Violation(
        rule=RULE,
        path=f"{labels_path}[{label}]",
        value=str(queue),
        message=f"namespace {quote(view.namespace)} may not use queue {quote(queue)}{default}: "
        f"{setting} allows {allowed}",
        hint=f"name one of those in {label}, or {tenant.ask} for access to {quote(queue)}",
        error_type="Unsupported value",
        subject="queue",
        field=label,
        advisory=advisory,
    )


def _daemonset(view: PodView, tenant: Tenant, advisory: bool) -> Violation:
    """A DaemonSet's Pods run on every node it selects, and no queue holds them."""
    setting = tenant.setting("requirements")
    return Violation(
        rule=RULE,
        path=view.field_path("containers"),
        value=None,
        message=f"a DaemonSet that requests GPUs puts a Pod on every node it selects, and no "
        f"queue holds them: {setting} requires namespace {quote(view.namespace)}'s "
        "GPU workloads to go through a queue",
        hint="run it as a queued Job or Deployment, or have the platform team run it from a "
        f"namespace of theirs ({tenant.ask})",
        error_type="Forbidden",
        subject="queue",
        field="daemonset",
        advisory=advisory,
    )


def _named_node(view: PodView, tenant: Tenant, advisory: bool) -> Violation:
    """A Pod that names its node skips every scheduler and queue."""
    setting = tenant.setting("requirements")
    return Violation(
        rule=RULE,
        path=view.field_path("nodeName"),
        value=view.spec.get("nodeName"),
        message=f"a GPU Pod that names its node skips the scheduler and the queue that "
        f"{setting} requires",
        hint="remove nodeName, and let the queue and its scheduler place the Pod",
        error_type="Forbidden",
        subject="queue",
        field="nodeName",
        advisory=advisory,
    )


def _not_taken(view: PodView, tenant: Tenant, field: str, advisory: bool) -> Violation:
    """The queue label is there, and Kueue did not take the object: its webhook suspends (or
    gates) what it queues before any validating webhook sees it."""
    what = (
        "gated (kueue.x-k8s.io/admission)"
        if field.endswith("schedulingGates")
        else (f"suspended ({field}: true)")
    )
    setting = tenant.setting("requirements")
    return Violation(
        rule=RULE,
        path=field,
        value=None,
        message=f"the GPU workload carries Kueue's queue label, yet Kueue did not take it: "
        f"Kueue's webhook leaves what it queues {what} until it admits it, and this one is "
        f"not, so it would run outside the queue that {setting} requires (Kueue's "
        "integration for this kind is off, the namespace is outside its "
        "managedJobsNamespaceSelector, its webhook did not run, or an owner reference made "
        "Kueue leave it to a parent)",
        hint=f"remove any ownerReferences you wrote and create it again, or {tenant.ask} to "
        "have Kueue manage this kind in this namespace",
        error_type="Forbidden",
        subject="queue",
        field="kueue-admission",
        advisory=advisory,
    )
