"""Reading a ResourceClaimSpec: the devices it asks for, the opaque configuration it gives them,
and the sharing mode each device is used in.

The spec's shape moved between API versions: in ``resource.k8s.io/v1`` (and v1beta2) a
request asks through ``exactly`` or a ``firstAvailable`` list of subrequests; in v1beta1 and
v1alpha3 the request itself holds ``deviceClassName`` and the rest (or ``firstAvailable``).
Both are read, so that a manifest of any served version is judged as its v1 form would be.
The classic DRA of v1alpha2 (``resourceClassName``, ``parametersRef``), removed in Kubernetes
1.31, is recognised and asks for nothing: no API server serves it any more.

A config entry applies to the requests it lists (``request`` or ``request/subrequest``), or
to every request when it lists none (``resource.k8s.io/v1`` DeviceClaimConfiguration).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.dra_parameters import sharing_strategy
from webhook.policy.dra import KnownClass
from webhook.policy.nvidia_dra import CONFIG_KINDS, GPU_DRIVER

# The sharing mode of a configured device: (its class's mode, the config's strategy) -> mode.
_SHARED = {
    ("Exclusive", "TimeSlicing"): "TimeSlicing",
    ("Exclusive", "MPS"): "MPS",
    ("MIG", "TimeSlicing"): "MIGTimeSlicing",
    ("MIG", "MPS"): "MIG with MPS",
}
# A request for part of a device's capacity (consumable capacity, KEP-5075): its device is
# shared with the other claims that take a part of it.
CAPACITY_SHARE = "a share of a GPU's capacity"


@dataclass(frozen=True, slots=True)
class DeviceAsk:
    """One way a claim asks for devices: a request's ``exactly`` (in v1beta1 the request
    itself), or one subrequest of its ``firstAvailable`` list."""

    request: str  # the request's name
    subrequest: str  # the subrequest's name; "" for none
    path: str  # where the ask's fields are written
    device_class: Any  # ``deviceClassName`` as written
    selectors: tuple[tuple[str, str], ...]  # (path of the CEL expression, expression)
    admin_access: bool
    capacity: bool  # asks for part of a device's capacity

    @property
    def class_path(self) -> str:
        return f"{self.path}.deviceClassName"

    @property
    def reference(self) -> str:
        """How a container or a config names it: ``request`` or ``request/subrequest``."""
        return f"{self.request}/{self.subrequest}" if self.subrequest else self.request


@dataclass(frozen=True, slots=True)
class OpaqueConfig:
    """A ``config[].opaque`` entry: the driver's own parameters for some requests."""

    path: str  # of the ``opaque`` object
    requests: tuple[str, ...]  # the requests it applies to; empty: every one
    driver: Any
    parameters: Any


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    """What a ResourceClaimSpec asks for, at ``path`` in its object."""

    path: str
    asks: tuple[DeviceAsk, ...]
    configs: tuple[OpaqueConfig, ...]


def read_claim_spec(spec: Any, path: str) -> ClaimSpec:
    """The claim spec at ``path`` (any object: what is not the expected shape asks for
    nothing; the API server refuses it, and an embedded copy is judged by its structure)."""
    devices = spec.get("devices") if isinstance(spec, dict) else None
    devices_path = f"{path}.devices" if path else "devices"
    # (The classic shape, resourceClassName and parametersRef, has no devices: it asks for
    # nothing. The inventory's records are read-only mappings.)
    if isinstance(devices, list):
        # NIM's claimCreationSpec: a list of devices, each a request in the v1beta1 shape
        # (deviceClassName beside it), from which its operator makes a template.
        return ClaimSpec(
            path,
            tuple(
                _ask(_name(device, index), "", device, f"{devices_path}[{index}]")
                for index, device in _items(devices)
                if isinstance(device, dict)
            ),
            (),
        )
    if not isinstance(devices, Mapping):
        return ClaimSpec(path, (), ())
    asks: list[DeviceAsk] = []
    for index, request in _items(devices.get("requests")):
        if isinstance(request, dict):
            asks += _asks(_name(request, index), request, f"{devices_path}.requests[{index}]")
    configs = [
        OpaqueConfig(
            f"{devices_path}.config[{index}].opaque",
            tuple(r for r in _strings(entry.get("requests"))),
            entry["opaque"].get("driver"),
            entry["opaque"].get("parameters"),
        )
        for index, entry in _items(devices.get("config"))
        if isinstance(entry, dict) and isinstance(entry.get("opaque"), dict)
    ]
    return ClaimSpec(path, tuple(asks), tuple(configs))


def _asks(name: str, request: Mapping[str, Any], where: str) -> Iterator[DeviceAsk]:
    exactly = request.get("exactly")
    if isinstance(exactly, dict):
        yield _ask(name, "", exactly, f"{where}.exactly")
    elif "deviceClassName" in request:  # v1beta1, v1alpha3
        yield _ask(name, "", request, where)
    for index, sub in _items(request.get("firstAvailable")):
        if isinstance(sub, dict):
            yield _ask(name, _name(sub, index), sub, f"{where}.firstAvailable[{index}]")


def _ask(request: str, subrequest: str, fields: Mapping[str, Any], where: str) -> DeviceAsk:
    selectors = []
    for index, selector in _items(fields.get("selectors")):
        cel = selector.get("cel") if isinstance(selector, dict) else None
        expression = cel.get("expression") if isinstance(cel, dict) else None
        if isinstance(expression, str):
            selectors.append((f"{where}.selectors[{index}].cel.expression", expression))
    capacity = fields.get("capacity")
    return DeviceAsk(
        request,
        subrequest,
        where,
        fields.get("deviceClassName"),
        tuple(selectors),
        fields.get("adminAccess") is True,
        isinstance(capacity, dict) and bool(capacity.get("requests")),
    )


def sharing_of(
    ask: DeviceAsk,
    known: KnownClass,
    spec: ClaimSpec,
    class_configs: tuple[Mapping[str, Any], ...] = (),
) -> tuple[str, str]:
    """The sharing mode of the devices ``ask`` gets from a GPU class, and where it is set (the
    config, else the class name). As NVIDIA's driver picks it (device_state.go at the commit
    ``webhook.policy.nvidia_dra`` cites): of the DeviceClass's configs (the node inventory's,
    ``class_configs``) and then the claim's, the last one of its driver that applies to the
    device's request, whole, strategy or none: a claim's config applies when it names no
    request, or names exactly the request the device was allocated for (``request/sub`` for a
    ``firstAvailable`` alternative)."""
    base = known.sharing or "Exclusive"
    if ask.capacity:
        return CAPACITY_SHARE, f"{ask.path}.capacity"
    chosen: tuple[Any, str] | None = None
    for entry in class_configs:
        opaque = entry.get("opaque")
        if (
            isinstance(opaque, Mapping)
            and opaque.get("driver") == GPU_DRIVER
            and _for_type(opaque.get("parameters"), known)
        ):
            chosen = (opaque.get("parameters"), f"DeviceClass {known.name}'s config")
    for config in spec.configs:
        if config.driver == GPU_DRIVER and config_applies(config, ask, known):
            chosen = (config.parameters, f"{config.path}.parameters.sharing.strategy")
    if chosen is None:
        return base, ask.class_path
    strategy = sharing_strategy(chosen[0])
    if strategy is None:
        return base, ask.class_path
    return _SHARED.get((base, strategy), base), chosen[1]


def config_applies(config: OpaqueConfig, ask: DeviceAsk, known: KnownClass | None) -> bool:
    """Whether NVIDIA's driver applies ``config`` to the devices of ``ask`` (device_state.go
    at the commit ``webhook.policy.nvidia_dra`` cites): one that names requests, where it
    names exactly the ask's (``request/sub`` for a ``firstAvailable`` alternative: the parent
    alone names none of its alternatives); one that names none, where its kind is for the
    type of the ask's devices (``known``: their class, None when unknown)."""
    if config.requests:
        return ask.reference in config.requests
    return known is None or _for_type(config.parameters, known)


def _for_type(parameters: Any, known: KnownClass) -> bool:
    """Whether a config that names no request applies to the class's devices: its kind is
    for their type (a GpuConfig for GPUs, a MigDeviceConfig for MIG devices); a kind the
    driver does not know, or a class of unknown type, is taken to apply."""
    kind = parameters.get("kind") if isinstance(parameters, Mapping) else None
    wanted = CONFIG_KINDS.get(kind) if isinstance(kind, str) else None
    return wanted is None or known.device_type is None or wanted == known.device_type


def _name(item: Mapping[str, Any], index: int) -> str:
    name = item.get("name")
    return name if isinstance(name, str) else f"#{index}"


def _items(value: Any) -> Iterator[tuple[int, Any]]:
    return enumerate(value) if isinstance(value, list) else iter(())


def _strings(value: Any) -> Iterator[str]:
    for item in value if isinstance(value, list) else ():
        if isinstance(item, str):
            yield item
