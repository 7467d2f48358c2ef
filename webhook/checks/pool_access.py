"""The Pod's GPU pool is unambiguous and open to its namespace.

Restricted: a Pod whose resources mean different sharing modes in the pools it could land in,
with nothing (pool annotation, nodeSelector, node affinity) to say which; a Pod whose pools
are closed to its namespace; a pool annotation naming no pool. Allowed: a Pod with exactly one
possible mode, in a pool its namespace may use. This is the same decision the mutating webhook
takes when it injects the pool's tolerations and affinity (``webhook.pools``).
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.model import Policy
from webhook.pods import PodView
from webhook.pools import select_pool
from webhook.violations import Violation

RULE = "pool-access"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    return (v for v in select_pool(view, policy).violations if v.rule == RULE)
