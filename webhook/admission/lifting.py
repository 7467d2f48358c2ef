"""What lifts a rule for one template: an exemption (by namespace, optionally narrowed to
service accounts and rules: ``spec.tenants[].exemptions``, formerly ``spec.exemptions``) or an
exception (one workload, named rules, an owner and an expiry: ``spec.exceptions``). The engine
(``webhook.admission.engine``) asks these before it runs a template's checks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from webhook.core.inventory import pools_of
from webhook.core.pods import PodView
from webhook.core.pools import closed_pools_tolerated, named_node_pools, reachable_closed_pools
from webhook.policy.exceptions import PolicyException
from webhook.policy.model import RULE_IDS, Exemption, Policy

EVERY_RULE = frozenset(RULE_IDS)
NO_RULES: frozenset[str] = frozenset()


class Excepting(NamedTuple):
    """What the policy's exceptions are matched with: the name of the object under review
    and the time of the decision (seconds since the epoch)."""

    object_name: str
    now: float


def _may_reach_closed_pool(view: PodView, policy: Policy) -> bool:
    """Whether the template can land in a pool closed to its namespace: by its tolerations
    and node selection, or by naming a node (unless the inventory places that node in pools
    its namespace may use, or on a CPU node)."""
    if reachable_closed_pools(view, policy) or closed_pools_tolerated(view, policy):
        return True
    if not view.spec.get("nodeName") or policy.is_binder(view.namespace):
        return False
    placed = named_node_pools(view, policy)
    return placed is None or not all(
        policy.may_use(pool, view.namespace) for pool in pools_of(placed[0], policy)
    )


def excepted_rules(
    policy: Policy, view: PodView, excepting: Excepting
) -> dict[str, PolicyException]:
    """The rules a current exception lifts for this template, each with the first such."""
    labels = view.metadata.get("labels")
    labels = labels if isinstance(labels, dict) else {}
    lifted: dict[str, PolicyException] = {}
    for exception in policy.exceptions:
        if excepting.now < exception.expires and exception.matches(
            view.namespace, excepting.object_name, labels
        ):
            for rule in exception.rules:
                lifted.setdefault(rule, exception)
    if lifted and policy.has_reserved_pools and _may_reach_closed_pool(view, policy):
        # A Pod that can land in a pool closed to its namespace (a wildcard toleration, which
        # pool-access only warns about for node agents, or a named node) is lifted nothing:
        # an exception must not carry what it lifts onto another tenant's nodes.
        return {}
    return lifted


def may_be_exempt(policy: Policy, namespace: str) -> bool:
    """Whether some exemption may cover a template in ``namespace``: one set lookup when no
    exemption names namespaces by pattern. False is the webhook's path for every request of
    a namespace no exemption names: nothing more is looked up."""
    return namespace in policy.exempted_names or policy.exempts_by_glob


def covering_exemptions(policy: Policy, view: PodView) -> tuple[Exemption, ...]:
    """The exemptions that cover this template (each for its ``rules``, or every rule), in
    the policy's order, for reports that say why an object was not judged; the engine asks
    :func:`exempt_rules`, the rules they lift together."""
    return tuple(_covering(policy, view)) if may_be_exempt(policy, view.namespace) else ()


def exempt_rules(policy: Policy, view: PodView) -> frozenset[str]:
    """The rules this template is exempt from, looked up once per template: :data:`EVERY_RULE`
    itself when an exemption covering it names no rules (the engine skips the template on
    that identity)."""
    if not may_be_exempt(policy, view.namespace):
        return NO_RULES  # the webhook's path for a namespace no exemption names
    return lifted_rules(_covering(policy, view))


def lifted_rules(exemptions: Iterable[Exemption]) -> frozenset[str]:
    """The rules these exemptions lift together: :data:`EVERY_RULE` itself when one names
    no rules."""
    lifted = NO_RULES
    for exemption in exemptions:
        if exemption.rules is None:
            return EVERY_RULE
        lifted = lifted | exemption.rules
    return lifted


def _covering(policy: Policy, view: PodView) -> list[Exemption]:
    # A loop, not a comprehension or a generator: on Python 3.11 their frame costs more than
    # the lookup itself, and the webhook runs this for every Pod of a node agent.
    covering = []
    for exemption in policy.exemptions:
        if exemption.applies(view.namespace, view.service_account):
            covering.append(exemption)
    return covering
