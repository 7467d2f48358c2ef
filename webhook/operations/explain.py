"""``explain``: why a GPU Pod is Pending, or runs and cannot see its GPU, with the fix for
each cause in the guide's order (``webhook.operations.causes``).

A pure function of the Pod, what was read of the cluster (``webhook.operations.cluster_facts``;
None for a Pod from a file, judged offline) and the compiled policy. For a Pod not yet on a
node: the scheduler's last ``FailedScheduling`` reasons and the ``PodScheduled`` condition, the
policy's verdict as ``review`` gives it, the pools it can reach with their nodes' allocatable
and allocated GPUs, and every cause found (``webhook.operations.pending``). For a Pod on a
node: what in it keeps its containers from their GPU (``webhook.operations.visibility``).
Offline, only the verdict and what the Pod spec itself shows: causes in the cluster need the
live form.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.admission.objects import decide_object
from webhook.cluster.ownership import controller_of
from webhook.core.pods import PodView, build_view
from webhook.operations.bound import bound_short, kubelet_rejection
from webhook.operations.causes import Cause, ordered
from webhook.operations.cluster_facts import ClusterFacts
from webhook.operations.pending import PoolCapacity, pending_causes
from webhook.operations.scheduler_message import (
    SchedulerMessage,
    SchedulerReason,
    parse_scheduler_message,
)
from webhook.operations.visibility import visibility_causes
from webhook.policy.model import Policy

NOTHING_BLOCKS = "nothing blocks it"
PACKAGED_DEFAULT = "the packaged default (pass --policy with the deployed one)"
LIVE_FORM = (
    "offline: the policy's verdict and what the Pod spec shows; causes in the cluster (free "
    "GPUs, taints, node labels, quotas, claims) need the live form: "
    "gpu-admission explain pod NAME -n NAMESPACE"
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The policy's verdict on the Pod, as ``review`` gives it: each finding as
    ``rule: path: message``."""

    allowed: bool
    denied: tuple[str, ...]
    warned: tuple[str, ...]
    denied_rules: frozenset[str] = frozenset()  # the rule ids of ``denied``


@dataclass(frozen=True, slots=True)
class Explanation:
    """What ``explain`` found about one Pod. ``state``: ``unscheduled`` (Pending, on no node),
    ``scheduled`` (on a node), ``finished`` (Succeeded or Failed), ``offline`` (from a file).
    ``causes`` are in the guide's order: ``causes[0]`` is the first to address."""

    pod: str  # namespace/name
    state: str
    phase: str
    node: str
    scheduled_condition: str  # "False Unschedulable: ...", "" when the Pod has none
    scheduler_message: str  # the latest FailedScheduling message, "" for none
    scheduler_reasons: tuple[SchedulerReason, ...]
    verdict: Verdict
    pools: tuple[PoolCapacity, ...]
    causes: tuple[Cause, ...]
    notes: tuple[str, ...]

    @property
    def blocked(self) -> bool:
        return bool(self.causes)

    @property
    def headline(self) -> str:
        if not self.causes:
            return NOTHING_BLOCKS
        first = self.causes[0].summary
        more = len(self.causes) - 1
        return first + (f" (and {more} more cause{'s' if more > 1 else ''})" if more else "")

    def as_record(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "state": self.state,
            "phase": self.phase or None,
            "node": self.node or None,
            "podScheduled": self.scheduled_condition or None,
            "scheduler": {
                "message": self.scheduler_message or None,
                "reasons": [
                    {"count": r.count, "reason": r.text, "kind": r.kind}
                    for r in self.scheduler_reasons
                ],
            },
            "verdict": {
                "allowed": self.verdict.allowed,
                "denied": list(self.verdict.denied),
                "warned": list(self.verdict.warned),
            },
            "pools": [p.as_record() for p in self.pools],
            "blocked": self.blocked,
            "headline": self.headline,
            "causes": [c.as_record() for c in self.causes],
            "notes": list(self.notes),
        }


def explain_pod(pod: Mapping[str, Any], facts: ClusterFacts | None, policy: Policy) -> Explanation:
    """Why the Pod pends or cannot see its GPU (see the module's docstring); ``facts`` None:
    offline, from a file."""
    obj = dict(pod)
    metadata = _mapping(obj.get("metadata"))
    namespace = str(metadata.get("namespace") or "default")
    name = str(metadata.get("name") or metadata.get("generateName") or "")
    spec = _mapping(obj.get("spec"))
    status = _mapping(obj.get("status"))
    phase = str(status.get("phase") or "")
    node_name = str(spec.get("nodeName") or "")
    view = build_view("Pod", "", obj, namespace, policy)
    verdict = _verdict(obj, policy, namespace)
    causes: list[Cause] = []
    notes: list[str] = []
    pools: tuple[PoolCapacity, ...] = ()
    message = ""
    parsed: SchedulerMessage | None = None
    if view is None:
        state = "offline" if facts is None else "unscheduled"
        notes.append("the object has no Pod spec: nothing to explain")
    elif facts is None:
        state = "offline"
        causes += _gates(view)
        # What the policy denies is told once, in its cause (added below).
        visible, more = visibility_causes(view, policy, None, verdict.denied_rules)
        causes += visible
        notes += [n for n in more if n not in notes]
        notes.append(LIVE_FORM)
    elif phase in ("Succeeded", "Failed"):
        state = "finished"
        rejected = kubelet_rejection(view, status, node_name, facts, policy)
        if rejected is not None:
            causes.append(rejected)
        else:
            notes.append(f"it has finished ({phase}): nothing keeps it from a node or a GPU now")
    elif node_name:
        state = "scheduled"
        node = next((n for n in facts.nodes if n.name == node_name), None)
        if phase == "Pending":
            causes += bound_short(view, node_name, node, policy)
        visible, more = visibility_causes(view, policy, node, frozenset())
        causes += visible
        notes += more
        if phase == "Pending":
            notes.insert(
                0,
                f"bound to node {node_name}, its containers not started yet: "
                f"`kubectl describe pod {name} -n {namespace}` shows why (image pulls, volumes)",
            )
    else:
        state = "unscheduled"
        events = facts.events.get((namespace, name), ())
        message = events[0].message if events else _unschedulable_message(status)
        parsed = parse_scheduler_message(message) if message else None
        causes += _gates(view)
        found = pending_causes(obj, view, facts, policy, parsed)
        causes += found.causes
        notes += found.notes
        pools = found.pools
        if not message and not _gates(view):
            notes.append("the scheduler has written no FailedScheduling event about it")
        notes += facts.notes
    if view is not None and not verdict.allowed and state != "scheduled":
        causes.append(_denied(verdict, facts is None))
    return Explanation(
        f"{namespace}/{name}",
        state,
        phase,
        node_name,
        _scheduled_condition(status),
        message,
        parsed.reasons if parsed is not None else (),
        verdict,
        pools,
        ordered(causes),
        tuple(notes),
    )


def policy_named(path: str | None) -> str:
    """Which policy judged, as the reports say it: the file ``--policy`` named, else the
    packaged default, whose pools and tenant contacts are not the cluster's."""
    return path or PACKAGED_DEFAULT


def _verdict(obj: dict[str, Any], policy: Policy, namespace: str) -> Verdict:
    outcome = decide_object(
        obj, policy, namespace, made_by_controller=controller_of(obj) is not None
    )
    return Verdict(
        outcome.allowed,
        tuple(f"{f.rule}: {f.path}: {f.message}" for f in outcome.denied),
        tuple(f"{f.rule}: {f.path}: {f.message}" for f in outcome.warned),
        frozenset(f.rule for f in outcome.denied),
    )


def _denied(verdict: Verdict, offline: bool) -> Cause:
    rules = sorted(verdict.denied_rules)
    when = (
        "the webhook would deny it at `kubectl apply`"
        if offline
        else "the webhook would deny it now: its controller's next Pod is refused (it was "
        "admitted under another policy, or before the webhook ran)"
    )
    return Cause(
        "policy-denies",
        f"the policy denies it ({', '.join(rules)}): {when}",
        "fix each finding as its message says; `gpu-admission review -f pod.yaml` checks "
        "the result before it is applied",
        verdict.denied,
    )


def _gates(view: PodView) -> list[Cause]:
    gates = [
        str(g.get("name"))
        for g in _list(view.spec.get("schedulingGates"))
        if isinstance(g, Mapping)
    ]
    if not gates:
        return []
    return [
        Cause(
            "scheduling-gated",
            f"scheduling gates hold it before any node is considered: {', '.join(gates)}",
            "the controller that added each gate removes it when the Pod may run (a queue "
            "such as Kueue admits its workload): look at that controller and its queue",
        )
    ]


def _scheduled_condition(status: Mapping[str, Any]) -> str:
    for condition in _list(status.get("conditions")):
        if isinstance(condition, Mapping) and condition.get("type") == "PodScheduled":
            reason = condition.get("reason") or ""
            text = f"{condition.get('status')} {reason}".strip()
            message = " ".join(str(condition.get("message") or "").split())
            return f"{text}: {message}" if message else text
    return ""


def _unschedulable_message(status: Mapping[str, Any]) -> str:
    """The scheduler's message in the PodScheduled condition (it writes the event's there too):
    what is left once the event has expired (an hour, by default)."""
    for condition in _list(status.get("conditions")):
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "PodScheduled"
            and condition.get("reason") == "Unschedulable"
        ):
            return " ".join(str(condition.get("message") or "").split())
    return ""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
