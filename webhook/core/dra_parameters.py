"""Judging one opaque parameters object of NVIDIA's DRA driver, as its kubelet plugin will.

The driver checks these parameters only in NodePrepareResources, after scheduling (its own
webhook ships disabled): strict decoding, ``Normalize``, ``Validate``, then, per device, the
config's kind against the device's type and the sharing getters. This module does the same
from :mod:`webhook.policy.nvidia_dra` and lists every problem (the driver stops at the first).

Refused: a missing or other apiVersion; a missing kind, one that is no configuration, or one
for another device type; a kind or field that is a near miss of a known one (case, or one
letter added, dropped, changed, or two swapped); a wrong JSON type; an enum value off the
driver's list; a thread percentage outside 0..100; a malformed quantity, a pinned memory limit
under 1Mi, a negative device index; an empty domainID; ``sharing`` without a strategy (there
is no default); a strategy whose gate is off; ``timeSlicingConfig`` under MPS and
``mpsConfig`` under TimeSlicing (the sharing getters), ``timeSlicingConfig`` on a MIG device
(no such field), one without an interval under TimeSlicing (Validate dereferences it unchecked:
the kubelet plugin panics).
Warned (``refused`` false): other unknown kinds and fields, which a newer driver may add (the
pinned one refuses them too); what the driver ignores: ``mpsConfig`` on a MIG device under
TimeSlicing, an ``allocationMode`` other than All or Single. Where the driver is silent
nothing is refused: an ``interval`` under MPS is only refused with its ``timeSlicingConfig``;
a device index past the devices allocated and MPS with consumable shares depend on the node.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from webhook.core.findings import shown
from webhook.policy.dra import near_miss
from webhook.policy.nvidia_dra import (
    ACTIVE_THREAD_PERCENTAGE,
    CHANNEL_ALLOCATION_MODES,
    CONFIG_KINDS,
    DEVICE_CLASSES,
    FEATURE_GATES,
    FIELDS,
    IOMMU_BACKEND_POLICIES,
    MIN_PINNED_MEMORY_BYTES,
    MPS,
    OTHER_KINDS,
    PARAMETERS_API_VERSION,
    SHARING_STRATEGIES,
    STRATEGY_GATES,
    TIME_SLICE_INTERVALS,
    TIME_SLICING,
)
from webhook.policy.quantity import parse_quantity


@dataclass(frozen=True, slots=True)
class ParameterProblem:
    """One problem of a parameters object: where, the value (or the key), what is wrong in
    the driver's terms, what to write instead; ``refused`` false for a warning only."""

    path: str
    value: object
    message: str
    hint: str
    refused: bool


# strconv.Atoi's grammar: what the plugin reads as a device index rather than a UUID.
_INDEX = re.compile(r"[+-]?[0-9]+\Z")
# Where a field of one object type belongs to a sibling that has it: refused with a reason.
_FORBIDDEN = {
    ("MigDeviceSharing", "timeSlicingConfig"): (
        "a MigDeviceConfig's sharing has no timeSlicingConfig: time-slice settings cannot be "
        "set on MIG devices",
        "remove timeSlicingConfig (strategy TimeSlicing alone is allowed)",
    )
}


class _Judge:
    """The problems found so far, and the cluster's gates."""

    def __init__(self, gates: Mapping[str, bool]) -> None:
        self.problems: list[ParameterProblem] = []
        self.gates = gates

    def refuse(self, path: str, value: object, message: str, hint: str) -> None:
        self.problems.append(ParameterProblem(path, value, message, hint, True))

    def warn(self, path: str, value: object, message: str, hint: str) -> None:
        self.problems.append(ParameterProblem(path, value, message, hint, False))

    def enabled(self, gate: str) -> bool:
        return self.gates.get(gate, FEATURE_GATES.get(gate, False))

    def fields(
        self, obj: Mapping[str, object], path: str, object_type: str, warn: bool = True
    ) -> None:
        """Each key of ``obj`` that its type does not have: a near miss refused, another one
        warned (with ``warn``)."""
        known = FIELDS[object_type]
        forbidden = [f for t, f in _FORBIDDEN if t == object_type]
        for key in obj:
            if key in known:
                continue
            meant = near_miss(key, [*known, *forbidden])
            reason = _FORBIDDEN.get((object_type, meant or key))
            if reason is not None:
                self.refuse(f"{path}.{key}", key, *reason)
            elif meant is not None:
                self.refuse(
                    f"{path}.{key}", key, f'unknown field "{shown(key)}"', f"did you mean {meant}?"
                )
            elif warn:
                self.warn(
                    f"{path}.{key}",
                    key,
                    f'unknown field "{shown(key)}" (the driver\'s {object_type} has '
                    f"{', '.join(known)}): this driver's strict decoding refuses it; a newer "
                    "driver may know it",
                    "remove it unless your driver's version documents it",
                )

    def mapping(self, obj: object, path: str, name: str) -> Mapping[str, object] | None:
        """``obj`` if it is a JSON object; None for null or absent; a wrong type refused."""
        if obj is None or isinstance(obj, dict):
            return obj
        self.refuse(path, obj, f"{name} must be an object", f"write {name} as a mapping")
        return None

    def string(self, obj: Mapping[str, object], path: str, name: str) -> str | None:
        """The string field ``name`` (Go reads null as empty); a wrong type refused."""
        value = obj.get(name)
        if value is None or isinstance(value, str):
            return value
        self.refuse(f"{path}.{name}", value, f"{name} must be a string", "quote the value")
        return None

    def boolean(self, obj: Mapping[str, object], path: str, name: str) -> None:
        value = obj.get(name)
        if value is not None and not isinstance(value, bool):
            self.refuse(f"{path}.{name}", value, "must be true or false", "write true or false")

    def enum(
        self, value: str, path: str, allowed: Collection[str], message: str, refused: bool = True
    ) -> None:
        """``value`` against a list of values the driver compares exactly."""
        if value in allowed:
            return
        meant = near_miss(value, allowed)
        hint = f"did you mean {meant}?" if meant else f"write one of {', '.join(allowed)}"
        (self.refuse if refused else self.warn)(path, value, message, hint)


def check_parameters(
    parameters: object,
    path: str,
    *,
    gates: Mapping[str, bool],
    device_types: frozenset[str] | None = None,
) -> list[ParameterProblem]:
    """Every problem of ``parameters`` (the JSON under ``opaque.parameters`` of a config for
    an NVIDIA driver) at ``path``. ``gates``: the cluster's feature gates (a gate left out has
    the driver's default). ``device_types``: the types of the devices the config applies to
    (the requests it names), when known: a kind for another type is refused, as
    NodePrepareResources refuses it. A config that names no request is applied by the driver
    to the devices of its kind's type and skipped for the others: pass None for it."""
    judge = _Judge(gates)
    if not isinstance(parameters, dict):
        judge.refuse(
            path,
            parameters,
            "the parameters must be an object with apiVersion and kind",
            f"write apiVersion: {PARAMETERS_API_VERSION} and the kind for the device class: "
            + _kinds_for(device_types),
        )
        return judge.problems
    _api_version(judge, parameters, path)
    kind = _kind(judge, parameters, path, device_types)
    if kind is None:  # no fields to judge but TypeMeta's
        judge.fields(parameters, path, "TypeMeta", warn=False)
        return judge.problems
    judge.fields(parameters, path, kind)
    if kind in ("GpuConfig", "MigDeviceConfig"):
        sharing = judge.mapping(parameters.get("sharing"), f"{path}.sharing", "sharing")
        if sharing is not None:
            sharing_type = "GpuSharing" if kind == "GpuConfig" else "MigDeviceSharing"
            _sharing(judge, sharing, f"{path}.sharing", sharing_type)
    elif kind == "VfioDeviceConfig":
        _iommu(judge, parameters, path)
    else:
        _compute_domain(judge, parameters, path, kind)
    return judge.problems


def sharing_strategy(parameters: object) -> str | None:
    """The sharing strategy a ``GpuConfig`` or ``MigDeviceConfig`` sets, ``TimeSlicing`` or
    ``MPS``, read without judging the rest (its apiVersion, other fields, gates); None for
    no sharing, another kind, or a strategy the driver does not know (:func:`check_parameters`
    refuses those). On a MIG device the driver applies nothing for TimeSlicing."""
    if not isinstance(parameters, dict):
        return None
    if parameters.get("kind") not in ("GpuConfig", "MigDeviceConfig"):
        return None
    sharing = parameters.get("sharing")
    strategy = sharing.get("strategy") if isinstance(sharing, dict) else None
    return strategy if strategy in SHARING_STRATEGIES else None


def _kinds_for(device_types: frozenset[str] | None) -> str:
    """The kinds for ``device_types`` (all when unknown), each with its device classes."""
    return ", ".join(
        f"{kind} ({c.name})"
        for c in DEVICE_CLASSES.values()
        for kind in c.config_kinds
        if device_types is None or c.device_type in device_types
    )


def _api_version(judge: _Judge, parameters: Mapping[str, object], path: str) -> None:
    api_version = parameters.get("apiVersion")
    if api_version != PARAMETERS_API_VERSION:
        missing = api_version is None or api_version == ""
        judge.refuse(
            f"{path}.apiVersion",
            None if missing else api_version,
            "apiVersion is missing: the driver cannot decode the parameters"
            if missing
            else f"the driver decodes {PARAMETERS_API_VERSION} only",
            f"write apiVersion: {PARAMETERS_API_VERSION}",
        )


def _kind(
    judge: _Judge,
    parameters: Mapping[str, object],
    path: str,
    device_types: frozenset[str] | None,
) -> str | None:
    """The configuration kind to judge the fields by (the one a near miss meant), if any."""
    kind = parameters.get("kind")
    where = f"{path}.kind"
    fix = "write the kind for the device class: " + _kinds_for(device_types)
    if kind is None or kind == "":
        judge.refuse(where, None, "kind is missing: the driver cannot decode the parameters", fix)
        return None
    if not isinstance(kind, str):
        judge.refuse(where, kind, "kind must be a string", fix)
        return None
    if kind in OTHER_KINDS:
        message = f"{kind} is a kind of the driver's API but no device configuration"
        judge.refuse(where, kind, message, fix)
        return None
    if kind not in CONFIG_KINDS:
        meant = near_miss(kind, CONFIG_KINDS)
        if meant is None:
            message = (
                f"the driver knows no kind {shown(kind)} (this driver's decoding refuses it; a "
                "newer driver may know it)"
            )
            judge.warn(where, kind, message, fix)
            return None
        message = f'no kind "{shown(kind)}" is registered for version "{PARAMETERS_API_VERSION}"'
        judge.refuse(where, kind, message, f"did you mean {meant}?")
        kind = meant
    device_type = CONFIG_KINDS[kind]
    if device_types is not None and not device_types <= {device_type}:
        others = ", ".join(sorted(device_types - {device_type}))
        message = (
            f"the driver cannot apply {kind} to a {others} device: it applies to "
            f"{device_type} devices only"
        )
        judge.refuse(where, kind, message, fix)
    return kind


def _sharing(judge: _Judge, sharing: Mapping[str, object], path: str, sharing_type: str) -> None:
    judge.fields(sharing, path, sharing_type)
    raw = sharing.get("strategy")
    strategy = judge.string(sharing, path, "strategy")
    where = f"{path}.strategy"
    if raw is not None and strategy is None:
        pass  # refused as a wrong type; the rest is judged as for any strategy
    elif not strategy:
        judge.refuse(
            where,
            raw,
            "sharing has no strategy, and the driver has none by default (unknown GPU sharing "
            "strategy)",
            f"write strategy: {' or '.join(SHARING_STRATEGIES)}, or leave out sharing for "
            "exclusive use",
        )
    elif strategy not in SHARING_STRATEGIES:
        supported = ", ".join(SHARING_STRATEGIES)
        judge.enum(
            strategy,
            where,
            SHARING_STRATEGIES,
            f"unknown GPU sharing strategy: {shown(strategy)}, supported GPU sharing strategies: "
            + supported,
        )
        strategy = near_miss(strategy, SHARING_STRATEGIES)
    elif not judge.enabled(gate := STRATEGY_GATES[strategy]):
        judge.refuse(
            where,
            strategy,
            f'"{strategy}" is selected as the GPU sharing strategy, but the "{gate}" feature '
            "gate is not enabled",
            f"leave out sharing for exclusive use, or enable the driver's {gate} gate "
            "(and set it in the policy's dra.nvidiaDriver.featureGates)",
        )
    time_slicing = sharing.get("timeSlicingConfig") if sharing_type == "GpuSharing" else None
    mps = sharing.get("mpsConfig")
    if strategy == MPS and time_slicing is not None:
        judge.refuse(
            f"{path}.timeSlicingConfig",
            time_slicing,
            f"cannot use TimeSlicingConfig with the {MPS!r} strategy",
            f"remove timeSlicingConfig, or use strategy {TIME_SLICING}",
        )
    elif time_slicing is not None:
        _time_slicing(judge, time_slicing, f"{path}.timeSlicingConfig", strategy)
    if strategy == TIME_SLICING and mps is not None:
        gpu = sharing_type == "GpuSharing"
        (judge.refuse if gpu else judge.warn)(
            f"{path}.mpsConfig",
            mps,
            f"cannot use MpsConfig with the {TIME_SLICING!r} strategy"
            if gpu
            else f"the driver ignores mpsConfig on a MIG device under {TIME_SLICING}",
            f"remove mpsConfig, or use strategy {MPS}",
        )
    elif mps is not None:
        _mps(judge, mps, f"{path}.mpsConfig")


def _time_slicing(judge: _Judge, config: object, path: str, strategy: str | None) -> None:
    time_slicing = judge.mapping(config, path, "timeSlicingConfig")
    if time_slicing is None:
        return
    judge.fields(time_slicing, path, "TimeSlicingConfig")
    interval = judge.string(time_slicing, path, "interval")
    if interval is not None:
        judge.enum(
            interval,
            f"{path}.interval",
            TIME_SLICE_INTERVALS,
            f"unknown time-slice interval: {shown(interval)}, supported time-slice intervals: "
            + ", ".join(TIME_SLICE_INTERVALS),
        )
    elif time_slicing.get("interval") is None and strategy == TIME_SLICING:
        judge.refuse(
            f"{path}.interval",
            None,
            "a timeSlicingConfig without an interval crashes the driver's validation (it "
            "dereferences the interval unchecked, and its kubelet plugin panics)",
            f"write interval: {', '.join(TIME_SLICE_INTERVALS)}, or leave out "
            "timeSlicingConfig (interval Default)",
        )


def _mps(judge: _Judge, config: object, path: str) -> None:
    mps = judge.mapping(config, path, "mpsConfig")
    if mps is None:
        return
    judge.fields(mps, path, "MpsConfig")
    _percentage(judge, mps.get("defaultActiveThreadPercentage"), path)
    limit = mps.get("defaultPinnedDeviceMemoryLimit")
    if limit is not None:
        _pinned_limit(judge, limit, f"{path}.defaultPinnedDeviceMemoryLimit", "default value")
    per_device = judge.mapping(
        mps.get("defaultPerDevicePinnedMemoryLimit"),
        f"{path}.defaultPerDevicePinnedMemoryLimit",
        "defaultPerDevicePinnedMemoryLimit",
    )
    for key, value in (per_device or {}).items():
        where = f"{path}.defaultPerDevicePinnedMemoryLimit[{key}]"
        if _INDEX.match(key) and int(key) < 0:
            judge.refuse(
                where,
                key,
                f"invalid device index: {int(key)}",
                "key the limit by device index (0 for the first device allocated) or UUID",
            )
        _pinned_limit(judge, value, where, "value")
    judge.boolean(mps, path, "multiUser")


def _percentage(judge: _Judge, percentage: object, path: str) -> None:
    where = f"{path}.defaultActiveThreadPercentage"
    low, high = ACTIVE_THREAD_PERCENTAGE
    fix = f"write a percentage from {low} to {high}"
    if percentage is None:
        return
    if not isinstance(percentage, int) or isinstance(percentage, bool):
        judge.refuse(where, percentage, "must be a whole number", fix)
    elif percentage < low:
        judge.refuse(where, percentage, "active thread percentage must not be negative", fix)
    elif percentage > high:
        judge.refuse(
            where, percentage, f"active thread percentage must not be greater than {high}", fix
        )


def _pinned_limit(judge: _Judge, value: object, path: str, what: str) -> None:
    """A pinned memory limit: a quantity of at least 1Mi (null in a map reads as zero)."""
    quantity = parse_quantity(value)
    if quantity is None:
        judge.refuse(
            path,
            value,
            "must be a quantity (a number with an optional suffix such as Mi or Gi)",
            "write a size such as 10Gi",
        )
    elif math.ceil(quantity) < MIN_PINNED_MEMORY_BYTES:
        judge.refuse(
            path,
            value,
            f"{what} set too low: the driver passes the limit in whole MiB, and this is 0",
            "write at least 1Mi (a size such as 10Gi)",
        )


def _iommu(judge: _Judge, parameters: Mapping[str, object], path: str) -> None:
    iommu = judge.mapping(parameters.get("iommu"), f"{path}.iommu", "iommu")
    if iommu is None:
        return  # Normalize writes LegacyOnly without the API device
    judge.fields(iommu, f"{path}.iommu", "IOMMUConfig")
    policy = judge.string(iommu, f"{path}.iommu", "backendPolicy")
    if policy:  # empty is normalized to LegacyOnly
        judge.enum(
            policy,
            f"{path}.iommu.backendPolicy",
            IOMMU_BACKEND_POLICIES,
            f"unknown IOMMU backend policy: {shown(policy)}, supported IOMMU backend policies: "
            + ", ".join(IOMMU_BACKEND_POLICIES),
        )
    judge.boolean(iommu, f"{path}.iommu", "enableAPIDevice")


def _compute_domain(judge: _Judge, parameters: Mapping[str, object], path: str, kind: str) -> None:
    raw = parameters.get("domainID")
    if raw is None or judge.string(parameters, path, "domainID") == "":
        judge.refuse(
            f"{path}.domainID",
            raw,
            "domainID cannot be empty",
            "write the ComputeDomain's UID (the ComputeDomain controller writes it in the "
            "claim templates it creates)",
        )
    if kind != "ComputeDomainChannelConfig":
        return
    mode = judge.string(parameters, path, "allocationMode")
    if mode:
        judge.enum(
            mode,
            f"{path}.allocationMode",
            CHANNEL_ALLOCATION_MODES,
            f"allocation mode {shown(mode)} is neither All nor Single: the driver injects one "
            "channel",
            refused=False,
        )
