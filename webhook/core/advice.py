"""Messages that fit the Pod: the security reason said in terms of how this Pod reaches GPU
nodes, and a fix for its audience. A Pod that asks for a GPU is told how to ask for one
properly; a Pod that asks for none (a node agent, a debug Pod) is told how to stay off GPU
nodes or, when it must run there, that its namespace needs an exemption."""

from __future__ import annotations

from webhook.core.pods import PodView
from webhook.core.scope import asks_for_gpu, reach
from webhook.policy.model import Policy

EXEMPTION_HINT = "or, for a node agent, exempt its namespace (spec.tenants[].exemptions)"


def why(view: PodView, policy: Policy, danger: str) -> str:
    """``danger``, and how the Pod reaches a GPU node when it asks for no GPU."""
    found = reach(view, policy)
    if not found.reason or asks_for_gpu(view, policy):
        return danger
    return f"{danger}, and the Pod can reach GPU nodes ({found.reason})"


def fix(view: PodView, policy: Policy, remedy: str, *, gpu: str = "") -> str:
    """``remedy`` with the advice for this Pod's audience."""
    if asks_for_gpu(view, policy):
        return f"{remedy}; {gpu}" if gpu else remedy
    return f"{remedy}, {EXEMPTION_HINT}"
