"""The admission decision: an AdmissionReview and a compiled policy in, a response out.

``decide`` is a pure function: no I/O, no globals, no Flask. The web layer, the CLI and the
tests all call it, and nothing outside it adds to the verdict.

Two paths. The validate path judges the final object (after every mutating webhook and the
API server's own validation) and is the only source of denials for most rules, of warnings
and of audit records. The mutate path plans, on CREATE, what a Pod gets (``mutation``: its
pool's tolerations and affinity, its tenant's products where the pool-access rule would deny
it unconfined, ``NVIDIA_VISIBLE_DEVICES=void``, the GPU defaults of a Pod) and what a
workload's templates get (``gpu_defaults``: classes, a Job's deadline), and denies only what
the API server would reject anyway before any validating webhook runs (the quantity rule), so
that the user sees the policy's message instead. Who sent the object (``request.userInfo``
among the policy's ``controllers``) is read once and shared by the object's views
(``webhook.core.queues.Submission``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from webhook.admission import gpu_defaults, mutation, response, updates
from webhook.admission.lifting import EVERY_RULE, Excepting, excepted_rules, exempt_rules
from webhook.admission.request import RequestError, parse_request, workload_kind
from webhook.admission.wire import AdmissionReviewResponse
from webhook.checks.registry import CHECKS
from webhook.core.findings import Finding, exceptions_of
from webhook.core.inventory import NodeSnapshot
from webhook.core.pods import PodView, attach_nodes
from webhook.core.pools import (
    select_pool,
)
from webhook.core.queues import Submission
from webhook.core.scope import reach, requests_gpu
from webhook.core.targets import walk_views
from webhook.policy.dra import CLAIM_MAKERS
from webhook.policy.model import (
    CLAIM_RULES,
    SECURITY_RULES,
    Mode,
    Policy,
    Scope,
    WorkloadKind,
)

# One more than the denial message lists: past that, judging a review stops (see decide()).
STOP_AFTER_DENIALS = response.MAX_DENIAL_ERRORS + 1

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
JUDGED_SUBRESOURCES = ("", "ephemeralcontainers")

# Each rule's check function, for the judging loop.
_RUNS = {check.rule: check.run for check in CHECKS}


class TooMuchWork(Exception):
    """The object holds more templates, or more to judge in them, than the caller's
    :class:`WorkLimits` allow: found while the templates are read, before they are judged,
    so that the caller can judge the object where that may take long."""


@dataclass(frozen=True, slots=True)
class WorkLimits:
    """How much an object may hold for the caller to judge it here. Each template is judged
    on everything it is made of, and templates share parts (an Argo Workflow's volumes are
    every template's, a TrainJob's trainer is paired with each override), so the work grows
    with templates and with what each one holds, not with the bytes of the review.
    ``judged_items``: list items, map entries and 64-byte pieces of strings (keys included)
    of all the templates of an object of more than one, counted again for each template that
    holds them."""

    templates: int
    judged_items: int


class Decision(NamedTuple):
    """The response to send, and what it rests on: the findings (with their modes) and the
    patch, applied or only recorded, for metrics and logs. A tuple: one is made per request,
    and a frozen dataclass costs four times as much to make."""

    response: AdmissionReviewResponse
    findings: tuple[Finding, ...] = ()
    patch: tuple[dict[str, Any], ...] = ()
    patch_applied: bool = False
    patch_recorded: bool = False

    @property
    def allowed(self) -> bool:
        return self.response["response"]["allowed"]


def review(
    admission_review: dict[str, Any], policy: Policy, *, mutate: bool
) -> AdmissionReviewResponse:
    """The full AdmissionReview response for a request (``admission.k8s.io/v1``)."""
    return decide(admission_review, policy, mutate=mutate).response


def decide(
    admission_review: Any,
    policy: Policy,
    *,
    mutate: bool,
    encode_json: response.JsonEncoder = response.compact_json,
    limits: WorkLimits | None = None,
    nodes: NodeSnapshot | None = None,
    now: float | None = None,
    made_by_controller: bool = False,
) -> Decision:
    """The decision on a request: its response, and the findings and patch behind it.
    ``encode_json`` writes the patch into the response (see ``response.JsonEncoder``).
    With ``limits``, an object (or old object) past them raises :class:`TooMuchWork`.
    ``nodes``: the node inventory's snapshot (``webhook.core.inventory``), where the cluster
    is watched; it can add warnings and tell where ``nodeName`` puts a Pod. ``now``: the time
    the policy's exceptions are judged at (seconds since the epoch; the clock's when not
    given, and read only where the policy has exceptions). Whether a controller sent the
    object is read from ``request.userInfo`` (the policy's ``controllers``), never from the
    object; ``made_by_controller``: the caller knows it (an audit that found the object's
    controller among what it listed)."""
    request = parse_request(admission_review)
    uid = request["uid"]
    operation = request.get("operation")
    if operation not in ("CREATE", "UPDATE") or request.get("subResource", "") not in (
        JUDGED_SUBRESOURCES
    ):
        return Decision(response.build(uid))
    obj = request.get("object")
    if not isinstance(obj, dict):
        raise RequestError(f"request.object must be an object for {operation}")
    workload = workload_kind(request, obj, policy)
    if workload is None:
        return Decision(response.build(uid))
    user = request.get("userInfo")
    if (
        workload.kind == "ResourceClaim"
        and workload.claims
        and isinstance(user, dict)
        and user.get("username") in CLAIM_MAKERS
    ):
        return Decision(response.build(uid))
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    namespace = request.get("namespace") or metadata.get("namespace") or "default"
    namespace = namespace if isinstance(namespace, str) else "default"
    by_controller = made_by_controller or (
        isinstance(user, dict)
        and policy.controllers.include(user.get("username"), user.get("groups"))
    )
    views = _views(obj, workload, namespace, policy, limits, nodes)
    # A file, or what an audit read, has no userInfo: the API server sets it on every request.
    live = isinstance(user, dict) and not made_by_controller
    submitted = Submission(workload.group, workload.kind, obj, by_controller, live=live)
    _submitted(views, submitted)
    if mutate:
        return _mutate(uid, request, obj, workload, views, policy, encode_json)

    # A review with thousands of violations (the API server passes objects of up to 3 MiB)
    # is judged only until its denial message is full: the verdict is certain by then.
    excepting = None
    # An exception covers the workload, not whoever may debug it later (kubectl debug adds
    # ephemeral containers with another permission).
    if policy.exceptions and request.get("subResource", "") != updates.EPHEMERAL:
        name = request.get("name") or metadata.get("name")
        excepting = Excepting(
            name if isinstance(name, str) else "", time.time() if now is None else now
        )
    judging = _judge(views, policy, excepting=excepting)
    findings, complete = _take(judging, STOP_AFTER_DENIALS)
    old = request.get("oldObject")
    if (
        operation == "UPDATE"
        and isinstance(old, dict)
        and any(f.mode == "Enforce" for f in findings)
    ):
        # Only a denial can be forgiven, and the old object is judged only when one might
        # be, and only by the rules of the denials, each rule once.
        old_views: list[PodView] | None = None

        def old_findings(rules: frozenset[str]) -> list[Finding]:
            nonlocal old_views
            if old_views is None:
                old_views = _views(old, workload, namespace, policy, limits, nodes)
                _submitted(old_views, dataclasses.replace(submitted, obj=old, gpu_templates=()))
            return run_checks(old_views, policy, rules)

        forgive = updates.forgiver(old_findings, request, obj, old, workload)
        batch = findings = forgive(findings)
        while not complete and not any(f.mode == "Enforce" for f in batch):
            # Every denial so far was forgiven: judging goes on, for the next ones decide.
            batch, complete = _take(judging, STOP_AFTER_DENIALS)
            batch = forgive(batch)
            findings += batch
    if findings and workload.kind == "Pod" and MIRROR_ANNOTATION in _annotations(obj):
        # The kubelet never runs a Pod it receives with this annotation (it runs static Pods
        # from its own files and only mirrors them here): denying the mirror changes nothing.
        findings = [dataclasses.replace(f, mode="Audit") for f in findings]
    if not findings:
        return Decision(response.build(uid))
    return Decision(
        response.build(
            uid,
            denials=[f for f in findings if f.mode == "Enforce"],
            warnings=[f for f in findings if f.mode == "Warn"],
            audits=[f for f in findings if f.mode == "Audit"],
            stopped=not complete,
            exceptions=exceptions_of(findings),
        ),
        findings=tuple(findings),
    )


def _views(
    obj: Mapping[str, Any],
    workload: WorkloadKind,
    namespace: str,
    policy: Policy,
    limits: WorkLimits | None,
    nodes: NodeSnapshot | None,
) -> list[PodView]:
    if nodes is not None and nodes.covers(policy):
        views = _views(obj, workload, namespace, policy, limits, None)
        for view in views:
            attach_nodes(view, nodes, policy)
        return views
    if limits is None:
        return list(walk_views(obj, workload, namespace, policy))
    views = []
    judged = 0
    for view in walk_views(obj, workload, namespace, policy):
        views.append(view)
        if len(views) > limits.templates:
            raise TooMuchWork(f"more than {limits.templates} templates")
        # A lone template holds nothing twice: what it holds is bounded by the review's size.
        if len(views) == 2:
            judged = _content(views[0], limits.judged_items)
        if len(views) >= 2:
            judged += _content(view, limits.judged_items - judged)
            if judged > limits.judged_items:
                raise TooMuchWork(f"more than {limits.judged_items} items to judge")
    return views


def _submitted(views: list[PodView], submission: Submission) -> None:
    """Have every view read what it shares with the others: the object, who sent it, and
    which of its templates request a GPU."""
    gpu_templates = tuple(v for v in views if any(map(requests_gpu, v.containers)))
    if gpu_templates:
        submission = dataclasses.replace(submission, gpu_templates=gpu_templates)
    for view in views:
        view.submission = submission


def _content(view: PodView, budget: int) -> int:
    """What a template is made of, counted as ``WorkLimits.judged_items`` says, up to just
    past ``budget``."""
    pending: list[Any] = [view.spec, view.metadata, view.unjudged, view.host_paths]
    # A container held outside the spec (a TrainJob's trainer) is judged with each template.
    pending += [c.spec for c in view.containers if c.list_name not in view.spec]
    count = 0
    while pending and count <= budget:
        value = pending.pop()
        if isinstance(value, str):
            count += len(value) >> 6
        elif isinstance(value, dict):
            count += len(value)
            pending += value
            pending += value.values()
        elif isinstance(value, (list, tuple)):
            count += len(value)
            pending += value
    return count


def run_checks(
    views: Iterable[PodView], policy: Policy, rules: Iterable[str] | None = None
) -> list[Finding]:
    """Every finding of the policy's checks (or of ``rules``) on these pod templates, with
    its mode."""
    return list(_judge(views, policy, rules))


def _take(judging: Iterator[Finding], denials: int) -> tuple[list[Finding], bool]:
    """The next findings of ``judging`` up to the ``denials``-th enforced one, and whether
    judging ended: past it, the verdict is certain and the message full."""
    findings: list[Finding] = []
    for finding in judging:
        findings.append(finding)
        if finding.mode == "Enforce":
            denials -= 1
            if not denials:
                return findings, False
    return findings, True


def _judge(
    views: Iterable[PodView],
    policy: Policy,
    rules: Iterable[str] | None = None,
    excepting: Excepting | None = None,
) -> Iterator[Finding]:
    """The findings, template by template and check by check, as they are found: whoever
    reads them stops judging by not reading on. With ``excepting``, a denial a current
    exception lifts is a warning that names it."""
    only = None if rules is None else frozenset(rules)
    # A template's reach is the scope of the security rules alone: not worked out without one.
    security = only is None or not only.isdisjoint(SECURITY_RULES)
    for view in views:
        exempt = exempt_rules(policy, view)
        if exempt is EVERY_RULE:
            continue
        excepted = (
            excepted_rules(policy, view, excepting)
            if excepting is not None and view.namespace in policy.excepted_namespaces
            else None
        )
        ruleset = policy.rule_modes(view.namespace) if policy.namespace_overrides else policy.rules
        needs_reach = security and ruleset.needs_reach
        reach_scope = reach(view, policy).scope if needs_reach else None
        relevance: Scope = "gpuPods" if view.gpu_relevant else "otherPods"
        # A Pod GPU-relevant only through the GPUs it claims is judged by the GPU rules for
        # the first time in this release: warned while newChecks is Warn.
        claimed = view.relevant_by_claims and policy.new_checks_advisory
        for rule, mode, scope in ruleset.steps[relevance, reach_scope]:
            if (
                (exempt and rule in exempt)
                or (only is not None and rule not in only)
                or (view.claim_object and rule not in CLAIM_RULES)
            ):
                continue
            exception = excepted.get(rule) if excepted else None
            for violation in _RUNS[rule](view, policy):
                advisory = violation.advisory or (claimed and rule not in SECURITY_RULES)
                effective: Mode = "Warn" if advisory and mode == "Enforce" else mode
                if exception is not None and effective == "Enforce":
                    yield Finding(violation, "Warn", view.identity, scope, exception.describe())
                else:
                    yield Finding(violation, effective, view.identity, scope)


def _mutate(
    uid: str,
    request: Mapping[str, Any],
    obj: dict[str, Any],
    workload: WorkloadKind,
    views: list[PodView],
    policy: Policy,
    encode_json: response.JsonEncoder,
) -> Decision:
    if request["operation"] == "CREATE":
        # On UPDATE the validate path judges quantities against oldObject: what the object
        # already had must not block a controller's label or finalizer update.
        found = list(_judge(views, policy, ("gpu-quantity",)))
        denials = [f for f in found if f.mode == "Enforce"] if found else None
        if denials:
            return Decision(response.build(uid, denials=denials), findings=tuple(denials))
    if not policy.mutation_enabled or not views:
        return Decision(response.build(uid))
    if workload.kind != "Pod":
        # A workload is given the policy's GPU defaults when it is created: a Job's template
        # is immutable, and one added to a Deployment's on an update would restart its Pods.
        if (
            not policy.gpu_defaults.for_workloads
            or request["operation"] != "CREATE"
            or request.get("subResource")
        ):
            return Decision(response.build(uid))
        return _patched(
            uid, gpu_defaults.plan_workload(obj, workload, views, policy), policy, encode_json
        )
    if MIRROR_ANNOTATION in _annotations(obj):
        return Decision(response.build(uid))
    view = views[0]
    inject_void = (
        policy.inject_void
        and reach(view, policy).reachable
        and "device-visibility" not in exempt_rules(policy, view)
    )
    if request["operation"] == "UPDATE" and request.get("subResource") == updates.EPHEMERAL:
        # kubectl debug: the ephemeral containers it adds get what the Pod's others got.
        old = request.get("oldObject")
        if not inject_void or not isinstance(old, dict):
            return Decision(response.build(uid))
        operations = mutation.void_added_ephemeral(obj, view, old)
    elif request["operation"] != "CREATE" or request.get("subResource"):
        return Decision(response.build(uid))
    else:
        # Planned whatever the selection's findings: the validate path decides whether they
        # deny, and a Pod admitted despite them is still confined to its pools.
        selection = select_pool(view, policy)
        operations = mutation.plan(
            obj,
            view,
            selection,
            policy,
            inject_void=inject_void,
            confine_products=_confines_products(policy, view),
        )
    return _patched(uid, operations, policy, encode_json)


def _patched(
    uid: str,
    operations: tuple[dict[str, Any], ...],
    policy: Policy,
    encode_json: response.JsonEncoder,
) -> Decision:
    """The response that applies the operations, or only records them (mode Record)."""
    if not operations:
        return Decision(response.build(uid))
    if policy.mutation_mode == "Record":
        return Decision(
            response.build(uid, would_patch=operations), patch=operations, patch_recorded=True
        )
    applied = response.build(uid, patch=operations, encode_json=encode_json)
    return Decision(applied, patch=operations, patch_applied=True)


def _confines_products(policy: Policy, view: PodView) -> bool:
    """Whether the mutation confines the Pod to its tenant's products: only where the
    pool-access rule would deny it unconfined (a check new in this release warns, and then
    changes nothing, before it denies: a product misspelt in the policy would otherwise
    leave the tenant's Pods pending)."""
    return (
        not policy.new_checks_advisory
        and policy.rule_modes(view.namespace)["pool-access"].gpu_pods == "Enforce"
        and "pool-access" not in exempt_rules(policy, view)
    )


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return annotations if isinstance(annotations, dict) else {}
