"""What the node inventory keeps of the cluster's Dynamic Resource Allocation objects
(``resource.k8s.io/v1``), for the DRA checks: every DeviceClass and every
ResourceClaimTemplate, each pruned to what the checks read. ResourceClaims and
ResourceSlices are not watched. Records are shared by the snapshots that hold them, and the
JSON in them is as sent, not copied: never to be changed.

Kept of a DeviceClass (:class:`DeviceClassRecord`): its name, its ``extendedResourceName``
(a request for that extended resource is served through DRA), the drivers its selectors
pin with the simple CEL form ``device.driver == "..."`` (``pinned_drivers``), and its
``config`` entries for NVIDIA's GPU driver (a class-level ``GpuConfig`` sets the sharing of
every claim of the class). Kept of a ResourceClaimTemplate (``claim_template_record``): the
``requests`` and ``config`` of its claim's devices, as the API server sent them (JSON).

A template's record is what its author wrote of those two lists: 70 to 700 bytes of JSON for
the templates of the DRA corpus (NVIDIA's quickstarts' with four MIG requests, or two sharing
configurations, are the largest). What a list costs: ``webhook.server.dra_feed``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from webhook.policy.nvidia_dra import GPU_DRIVER

# What is kept of a claim template's spec.spec.devices: the constraints are not read.
TEMPLATE_KEYS = ("requests", "config")

TemplateKey = tuple[str, str]  # (namespace, name)
NO_RECORDS: Mapping[Any, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class DeviceClassRecord:
    """What is kept of one DeviceClass (see the module's docstring). ``config`` entries are
    ``{"opaque": {"driver": "gpu.nvidia.com", "parameters": ...}}`` as sent: not to be
    changed."""

    name: str
    extended_resource_name: str | None
    drivers: tuple[str, ...]
    config: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True, slots=True)
class DraObjects:
    """The DeviceClasses and ResourceClaimTemplates as the inventory knew them at one moment:
    never changed, replaced as a whole. ``knows_*``: that kind was listed (an empty list
    counts, and so does an API server that does not serve ``resource.k8s.io/v1``: no such
    object can exist) and is current; while it is not, lookups find nothing, as without an
    inventory."""

    device_classes: Mapping[str, DeviceClassRecord]
    claim_templates: Mapping[TemplateKey, Mapping[str, Any]]
    knows_device_classes: bool
    knows_claim_templates: bool

    def device_class(self, name: str) -> DeviceClassRecord | None:
        return self.device_classes.get(name) if self.knows_device_classes else None

    def claim_template(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        if not self.knows_claim_templates:
            return None
        return self.claim_templates.get((namespace, name))


NO_DRA_OBJECTS = DraObjects(NO_RECORDS, NO_RECORDS, False, False)


class DraLookups:
    """What decisions read of the DRA objects a snapshot holds (``NodeSnapshot.dra``)."""

    __slots__ = ()
    dra: DraObjects

    def device_class(self, name: str) -> DeviceClassRecord | None:
        """The named DeviceClass; None for one that does not exist, or when none are known."""
        return self.dra.device_class(name)

    @property
    def knows_device_classes(self) -> bool:
        """Whether the DeviceClasses are known (listed, or ``resource.k8s.io/v1`` not served)."""
        return self.dra.knows_device_classes

    def claim_template(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """A ResourceClaimTemplate's ``{"requests": [...], "config": [...]}``
        (``claim_template_record``); None for one that does not exist (yet), or when none
        are known."""
        return self.dra.claim_template(namespace, name)

    @property
    def knows_claim_templates(self) -> bool:
        """Whether the ResourceClaimTemplates are known, as ``knows_device_classes``."""
        return self.dra.knows_claim_templates


def device_class_record(obj: Mapping[str, Any]) -> DeviceClassRecord:
    """What is kept of a DeviceClass object as the API server sent it (malformed parts are
    left out)."""
    spec = _mapping(obj.get("spec"))
    extended = spec.get("extendedResourceName")
    drivers: list[str] = []
    for selector in _list(spec.get("selectors")):
        expression = _mapping(_mapping(selector).get("cel")).get("expression")
        if isinstance(expression, str):
            drivers += [d for d in pinned_drivers(expression) if d not in drivers]
    config = []
    for entry in _list(spec.get("config")):
        opaque = _mapping(_mapping(entry).get("opaque"))
        if opaque.get("driver") == GPU_DRIVER:
            kept = {key: opaque[key] for key in ("driver", "parameters") if key in opaque}
            config.append(MappingProxyType({"opaque": MappingProxyType(kept)}))
    return DeviceClassRecord(
        str(_mapping(obj.get("metadata")).get("name") or ""),
        extended if isinstance(extended, str) else None,
        tuple(drivers),
        tuple(config),
    )


def claim_template_record(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """What is kept of a ResourceClaimTemplate object: ``{"requests": [...], "config":
    [...]}`` of its ``spec.spec.devices`` as sent, each key only where it is a list."""
    devices = _mapping(_mapping(_mapping(obj.get("spec")).get("spec")).get("devices"))
    return MappingProxyType(
        {key: devices[key] for key in TEMPLATE_KEYS if isinstance(devices.get(key), list)}
    )


# CEL's tokens that matter for finding the top-level conjuncts: string literals (raw, bytes
# and triple-quoted forms included, so that nothing inside one is read as an operator),
# comments, brackets, and the operators && and || and the conditional's ? (not the ? of an
# optional field, ``.?name`` or ``[?key]``).
_CEL_TOKEN = re.compile(
    r"""(?P<string>[rRbB]{0,2}(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"
                               |'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
      |(?P<comment>//[^\n]*)|(?P<open>[(\[{])|(?P<close>[)\]}])
      |(?P<op>&&|\|\||(?<![.\[])\?)""",
    re.VERBOSE,
)
_RAW_STRING = re.compile(r"[bB]?[rR]|[rR][bB]")
# ``device.driver == "X"``, either quote, either operand order: a plain string, no escapes.
_DRIVER_EQUALS = re.compile(
    r"""\s*(?:device\.driver\s*==\s*(?P<quote>["'])(?P<driver>[^"'\\\n]*)(?P=quote)
          |(?P<quote2>["'])(?P<driver2>[^"'\\\n]*)(?P=quote2)\s*==\s*device\.driver)\s*""",
    re.VERBOSE,
)


def pinned_drivers(expression: str) -> tuple[str, ...]:
    """The drivers a CEL selector pins with ``device.driver == "X"``, alone or as a
    conjunct of a top-level ``&&``; anything else (an ``||`` or a conditional at the top,
    a comparison inside parentheses or negated, an escape in the string) pins none."""
    conjuncts: list[str] = []
    code: list[str] = []  # the current conjunct, its comments left out
    at = depth = 0
    for token in _CEL_TOKEN.finditer(expression):
        code.append(expression[at : token.start()])
        at = token.end()
        string = token["string"]
        if token["comment"] is not None:
            code.append(" ")
            continue
        if string is not None:
            if _RAW_STRING.match(string) and "\\" in string:
                return ()  # a raw string's backslash is not an escape: not read
        elif token["open"]:
            depth += 1
        elif token["close"]:
            depth -= 1
        elif depth == 0 and token["op"] == "&&":
            conjuncts.append("".join(code))
            code = []
            continue
        elif depth == 0:
            return ()  # || or ?: at the top, the driver is not pinned
        code.append(token[0])
    code.append(expression[at:])
    conjuncts.append("".join(code))
    drivers: list[str] = []
    for conjunct in conjuncts:
        match = _DRIVER_EQUALS.fullmatch(conjunct)
        if match is not None:
            driver = match["driver"] if match["driver"] is not None else match["driver2"]
            if driver not in drivers:
                drivers.append(driver)
    return tuple(drivers)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else NO_RECORDS


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
