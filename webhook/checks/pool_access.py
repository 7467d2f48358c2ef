"""The Pod's GPU pool is unambiguous and open to its namespace.

Restricted: a Pod whose resources mean different sharing modes in the pools it could land in,
with nothing (pool annotation, nodeSelector, node affinity) to say which; a Pod whose pools
are closed to its namespace; a pool annotation naming no pool. Allowed: a Pod with exactly one
possible mode, in a pool its namespace may use. This is the same decision the mutating webhook
takes when it injects the pool's tolerations and affinity (``webhook.core.pools``).
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core.findings import Violation
from webhook.core.pods import PodView
from webhook.core.pools import select_pool
from webhook.policy.model import Policy

RULE = "pool-access"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    return (v for v in select_pool(view, policy).violations if v.rule == RULE)
