"""GPU quantities are whole, non-negative numbers set in limits.

Restricted: a quantity under a GPU vendor domain that is not a quantity at all, is negative,
is fractional (``0.5``, ``500m``, ``1100m``), appears in requests without limits, or differs
between requests and limits. Allowed: whole numbers however written (``1``, ``"1"``, ``1000m``,
``2e0``). The API server rejects these too, after mutating webhooks ran, so the mutate path
denies exactly these violations with this rule's message.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core.findings import Violation
from webhook.core.pods import PodView
from webhook.policy.model import Policy
from webhook.policy.quantity import Quantity, parse_quantity

RULE = "gpu-quantity"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    for container in view.gpu_containers:
        resources = container.spec[container.resources_field]  # holds the container's GPUs
        limits = resources.get("limits") if isinstance(resources.get("limits"), dict) else {}
        requests = resources.get("requests") if isinstance(resources.get("requests"), dict) else {}
        for name, (_, chosen) in container.gpu.items():
            # The view parsed the value the scheduler reads (the limit when there is one).
            parsed: dict[str, Quantity | None] = {chosen: container.gpu_quantity[name]}
            for where, values in (("limits", limits), ("requests", requests)):
                if name in values:
                    if where not in parsed:
                        parsed[where] = parse_quantity(values[name])
                    bad = _bad_quantity(parsed[where], name)
                    if bad:
                        yield Violation(
                            rule=RULE,
                            path=f"{container.path}.{container.resources_field}.{where}[{name}]",
                            value=values[name],
                            message=bad[0],
                            hint=bad[1],
                            subject=container.name,
                            field=f"{container.list_name}.{container.resources_field}.{where}[{name}]",
                        )
            if name in requests and name not in limits:
                yield Violation(
                    rule=RULE,
                    path=f"{container.path}.{container.resources_field}.limits[{name}]",
                    value=None,
                    message=f"{name} must be set in limits: the API server and the device "
                    "plugin count GPUs from limits",
                    hint=f"add {container.resources_field}.limits[{name}]: {_show(requests[name])}",
                    error_type="Required value",
                    subject=container.name,
                    field=f"{container.list_name}.{container.resources_field}.limits[{name}]",
                )
            elif name in requests and name in limits:
                request, limit = parsed["requests"], parsed["limits"]
                if request is not None and limit is not None and request != limit:
                    yield Violation(
                        rule=RULE,
                        path=f"{container.path}.{container.resources_field}.requests[{name}]",
                        value=requests[name],
                        message=f"must equal the limit ({_show(limits[name])}): GPUs cannot "
                        "be overcommitted",
                        hint=f"set requests[{name}] to {_show(limits[name])}, or drop the request",
                        subject=container.name,
                        field=f"{container.list_name}.{container.resources_field}.requests[{name}]",
                    )


def _bad_quantity(quantity: Quantity | None, name: str) -> tuple[str, str] | None:
    if quantity is None:
        return (
            "must be a Kubernetes quantity",
            f'write a whole number of devices, e.g. {name}: "1"',
        )
    if quantity < 0:
        return ("must be greater than or equal to 0", "write a whole number of devices")
    if quantity.denominator != 1:
        return (
            f"must be a whole number: {name} counts whole devices",
            _fraction_hint(quantity, name),
        )
    return None


def _fraction_hint(quantity: Quantity, name: str) -> str:
    whole = max(1, -(-quantity.numerator // quantity.denominator))
    if quantity < 1:
        return (
            f"request {whole}; for a fraction of a GPU use a time-sliced replica "
            "(nvidia.com/gpu.shared) or a MIG profile (nvidia.com/mig-1g.10gb)"
        )
    return f"request {quantity.numerator // quantity.denominator} or {whole}"


def _show(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)
