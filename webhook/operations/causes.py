"""One cause of a GPU Pod's trouble, and the order causes are told in: the guide's.

The guide's order for a Pending Pod: what holds it before any node is considered (scheduling
gates), the GPU resource name (one no node advertises), node allocatable against current
allocations (not enough free GPUs), nodes out of use (NotReady, cordoned, being removed), then
the rest of the scheduler's typical message (taints, node affinity and selectors), the devices
its claims ask for, admission policies, a custom scheduler, and whatever else the scheduler
said. A Pod ``spec.nodeName`` binds without the scheduler: what its node's kubelet rejected
(``OutOf<resource>``), or more GPUs than its node has free, comes first. (A quota is checked
when a Pod is created and never holds one that exists: ``explain`` tells one that refuses the
next Pods as a note.) For a running Pod that cannot see its GPU: no GPU limit or claim, the
runtime class, a privileged container, variables that override the devices it was given.
"""

from __future__ import annotations

from dataclasses import dataclass

# Every kind of cause, in the order an explanation lists them.
CAUSE_ORDER = (
    "kubelet-rejected",
    "scheduling-gated",
    "unadvertised-resource",
    "insufficient-gpus",
    "unavailable-nodes",
    "untolerated-taint",
    "node-affinity",
    "unallocatable-claim",
    "policy-denies",
    "custom-scheduler",
    "scheduler-reason",
    "no-gpu-requested",
    "runtime-class",
    "privileged-container",
    "visible-devices-override",
)


@dataclass(frozen=True, slots=True)
class Cause:
    """``kind``: one of ``CAUSE_ORDER`` (stable, for scripts and tests); ``summary``: what is
    wrong, one line; ``fix``: what to write or do instead, and whom to ask; ``details``: the
    nodes, quotas or findings behind it, one line each."""

    kind: str
    summary: str
    fix: str
    details: tuple[str, ...] = ()

    def as_record(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "summary": self.summary,
            "fix": self.fix,
            "details": list(self.details),
        }


def ordered(causes: list[Cause]) -> tuple[Cause, ...]:
    """The causes in ``CAUSE_ORDER`` (those of one kind as found)."""
    return tuple(sorted(causes, key=lambda cause: CAUSE_ORDER.index(cause.kind)))
