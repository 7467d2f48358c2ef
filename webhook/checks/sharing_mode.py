"""One sharing mode per Pod, on a pool that offers it.

Restricted: a Pod whose GPU resources belong to more than one sharing mode (full cards,
time-slicing replicas, MPS, MIG instances, time-sliced MIG instances), even where one pool
offers several: a Pod gets one kind of GPU. A Pod whose nodeSelector, required node affinity
or pool annotation admits only pools that do not offer its resources (it would pend forever).
A request above 1 of a time-sliced or MPS replica where the pool (or the resource's
declaration) sets ``failRequestsGreaterThanOne``: replicas share one GPU, so two of them are
not twice the GPU. Allowed: one mode, reachable.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core.findings import Violation
from webhook.core.pods import PodView
from webhook.core.pools import resource_spec, select_pool
from webhook.policy import mig
from webhook.policy.model import Policy

RULE = "sharing-mode"


def _mig_sharing(name: str) -> str | None:
    """The sharing mode a MIG resource name means, for one the policy does not declare."""
    short = name.partition("/")[2]
    if short.startswith(mig.MIG_PREFIX) and mig.is_well_formed(short[len(mig.MIG_PREFIX) :]):
        return "MIGTimeSlicing" if short.endswith(".shared") else "MIG"
    return None


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    selection = select_pool(view, policy)
    if selection.violations:  # mostly none: no generator made for them
        yield from (v for v in selection.violations if v.rule == RULE)
    first: tuple[str, str, str] | None = None  # (mode, resource, container path)
    reported: set[str] = set()
    for container in view.containers:
        for name, quantity in container.gpu_quantity.items():
            if quantity is None or quantity <= 0:
                continue
            spec = resource_spec(view, policy, name)
            mode = spec.sharing if spec is not None else _mig_sharing(name)
            if mode is None:
                continue
            if spec is not None and spec.fail_requests_greater_than_one and quantity > 1:
                yield Violation(
                    rule=RULE,
                    path=container.resource_path(name),
                    value=container.gpu[name][0],
                    message=f"{name} is a {mode} replica of a shared GPU: requests above 1 "
                    "are refused (failRequestsGreaterThanOne), since replicas share one GPU's "
                    "memory and compute",
                    hint=f"request 1 {name}; for more capacity use a pool of exclusive full GPUs",
                    subject=container.name,
                    field=f"{container.list_name}.resources[{name}]",
                )
            if first is None:
                first = (mode, name, container.path)
            elif mode != first[0] and name not in reported:
                reported.add(name)
                yield Violation(
                    rule=RULE,
                    path=container.resource_path(name),
                    value=name,
                    message=f"mixes GPU sharing modes in one Pod: {name} is {mode}, while "
                    f"{first[1]} ({first[2]}) is {first[0]}",
                    hint="request one kind of GPU per Pod; split the work into several Pods",
                    subject=container.name,
                    field=f"{container.list_name}.resources[{name}]",
                )
