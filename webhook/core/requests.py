"""What a Pod asks of each resource as the scheduler counts it, one rule for the checks (over
a ``PodView``, ``webhook.core.pods.effective_requests``) and for ``explain`` and ``inspect``
(over a Pod spec as the API server sends it, :func:`spec_requests`).

The scheduler counts the larger of the app containers' sum with the sidecars' (init
containers with ``restartPolicy: Always``, running beside them) and each other init
container's ask with the sidecars started before it; ephemeral containers ask for nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from webhook.policy.quantity import Quantity, parse_quantity


class ContainerAsk(NamedTuple):
    """One container's asks: the list it is in, whether it is a sidecar, and per resource
    its quantity (None where the API server would not accept it)."""

    list_name: str
    sidecar: bool
    quantities: Mapping[str, Quantity | None]


def scheduled_requests(asks: Iterable[ContainerAsk]) -> dict[str, Quantity]:
    """The Pod's request of each resource its containers ask above zero (see the module's
    docstring), in the order the containers ask: the first name is where a finding on the
    whole Pod points."""
    init_peak: dict[str, Quantity] = {}
    sidecars: dict[str, Quantity] = {}
    apps: dict[str, Quantity] = {}
    for ask in asks:
        for name, quantity in ask.quantities.items():
            if quantity is None or quantity <= 0:
                continue
            if ask.list_name == "containers":
                apps[name] = apps.get(name, 0) + quantity
            elif ask.list_name == "initContainers":
                if ask.sidecar:
                    sidecars[name] = sidecars.get(name, 0) + quantity
                else:
                    running = quantity + sidecars.get(name, 0)
                    init_peak[name] = max(init_peak.get(name, 0), running)
    return {
        name: max(init_peak.get(name, 0), apps.get(name, 0) + sidecars.get(name, 0))
        for name in dict.fromkeys([*init_peak, *sidecars, *apps])
    }


def spec_requests(spec: Mapping[str, Any], wanted: Callable[[str], bool]) -> dict[str, Quantity]:
    """What a Pod spec (as the API server sends it) requests of the ``wanted`` resources; a
    container's limit stands for its request where it sets no request."""
    return scheduled_requests(
        ContainerAsk(list_name, container.get("restartPolicy") == "Always", asked)
        for list_name in ("initContainers", "containers")
        for container in _list(spec.get(list_name))
        if isinstance(container, Mapping)
        and (asked := _asked(_mapping(container.get("resources")), wanted))
    )


def _asked(
    resources: Mapping[str, Any], wanted: Callable[[str], bool]
) -> dict[str, Quantity | None]:
    asked = {**_mapping(resources.get("limits")), **_mapping(resources.get("requests"))}
    return {str(name): parse_quantity(value) for name, value in asked.items() if wanted(str(name))}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
