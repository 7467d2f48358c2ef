"""One finding of ``gpu-admission cluster check``: the record every comparison of the policy
with the cluster returns (``webhook.audit.drift`` and the modules it gathers,
``webhook.audit.quota_drift``, ``webhook.audit.class_drift``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class Drift:
    """One disagreement between the policy and the cluster."""

    # One of DRIFT_KINDS (webhook.audit.drift), QUOTA_DRIFT_KINDS or CLASS_DRIFT_KINDS.
    kind: str
    subject: str  # the pool, taint or resource it is about ("" when none)
    nodes: tuple[str, ...]  # the nodes concerned, sorted (none when none can be named)
    message: str  # one sentence that says what disagrees and what to change
    namespaces: tuple[str, ...] = ()  # the namespaces concerned, sorted (quota drift)
    # "info": what holds, though not as the policy means it (no exit status of its own).
    level: Literal["drift", "info"] = "drift"
