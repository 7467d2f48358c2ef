"""What the node inventory's process (``webhook.server.node_feed``) sends the worker of the DRA
objects (``webhook.core.dra_inventory``), and how the worker reads it back.

A DeviceClass travels as ``[NAME, EXTENDED_RESOURCE_NAME | null, [DRIVER, ...], [CONFIG,
...]]``, a ResourceClaimTemplate as ``[NAMESPACE, NAME, {"requests": [...], "config": [...]}]``.
What a template's author wrote is free-form JSON (opaque parameters), and every line must be
JSON the worker reads (orjson: at most 1,024 levels deep, no NaN or Infinity): integers past
64 bits travel as the floats the worker would read them as, non-finite numbers as null, and
a template nested deeper than orjson writes (254 levels; the DRA drivers' parameters are a
few) travels as ``[NAMESPACE, NAME, null]``: the worker keeps nothing of it, as of a
template not cached (a config entry of a class that deep is left out). A template that
could stop the process, and the Nodes with it, cannot be written.

What it costs, for 5,000 templates of the shape of NVIDIA's quickstarts (650 bytes each as the
fake API server sends them, 280 of them kept), on this project's 2-core machine, Python's
allocations by tracemalloc (``python -m tests.bench.bench_dra_feed``): a list takes 0.08 to
0.18 s of CPU in the process (50 pages of 100, spread over 2.5 s by the pauses between them);
the process keeps 2.5 MiB (each template's kept JSON and its key; high-water 3.9 MiB, 10.1 in
pages of 500); the worker reads 1.4 MB of lines and keeps 10.3 MiB when every template differs
(2 KB each as Python objects, which decisions read without decoding anything), 1.0 MiB when
they differ in their names only (one chart's template in many namespaces: one copy of what is
kept, ``SharedTemplates``). A DeviceClass costs less; a cluster has a few per driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import orjson

from webhook.cluster.watching import CacheState, Key, WatchOptions
from webhook.core.dra_inventory import TEMPLATE_KEYS, DeviceClassRecord, claim_template_record

# A cluster that does not serve resource.k8s.io/v1 is asked again this often (one 404 a kind),
# in case it comes to (an API server upgraded under a running webhook).
UNSERVED_RELIST_SECONDS = 300.0
# Pages of 100, 50 ms apart, as the Nodes' (``node_feed.OPTIONS``): a page of 500 templates
# took the process 6 MiB more at its high-water mark for no less CPU (the module's docstring).
DRA_OPTIONS = WatchOptions(
    page_size=100, page_pause_seconds=0.05, unserved_relist_seconds=UNSERVED_RELIST_SECONDS
)
# The API server sends a bookmark about once a minute, so a current watch is heard from
# sooner: decisions stop reading a snapshot it has not confirmed for this long
# (``webhook.server.inventory``), and a DRA kind whose watch it has not is not known.
STALE_SECONDS = 120.0


def dra_known(state: CacheState[Any], now: float) -> bool:
    """Whether a DRA kind is known: listed (or not served), and heard from lately."""
    heard = state.heard_at
    return state.listed and (
        not state.served or (heard is not None and now - heard <= STALE_SECONDS)
    )


def device_class_json(record: DeviceClassRecord) -> list[Any]:
    """What is kept of a DeviceClass, as JSON values the worker reads."""
    config = []
    for entry in record.config:
        opaque = _sendable(dict(entry["opaque"]))
        if opaque is not None:
            config.append({"opaque": orjson.loads(opaque)})
    return [record.name, record.extended_resource_name, list(record.drivers), config]


def device_class_from_json(record: Any) -> DeviceClassRecord | None:
    """The DeviceClassRecord a record stands for (None for one not of that shape)."""
    try:
        name, extended, drivers, config = record
        if not isinstance(drivers, list) or not isinstance(config, list):
            raise TypeError("not a list")
        return DeviceClassRecord(
            str(name),
            str(extended) if extended is not None else None,
            tuple(str(driver) for driver in drivers),
            tuple(
                MappingProxyType({"opaque": MappingProxyType(dict(entry["opaque"]))})
                for entry in config
            ),
        )
    except (TypeError, ValueError, KeyError):
        return None


def claim_template_json(obj: dict[str, Any]) -> bytes | None:
    """What the process keeps of a ResourceClaimTemplate: its ``claim_template_record`` as
    JSON (a fifth of the memory of its Python objects), None for one too deep to send."""
    kept = _sendable(dict(claim_template_record(obj)))
    # orjson's bytes keep the buffer they were written in (4 KB for a template of 300 bytes):
    # a copy is their size.
    return bytes(memoryview(kept)) if kept is not None else None


def template_json(kept: bytes | None) -> Any:
    """A template's kept JSON, as the JSON value of its record."""
    return orjson.loads(kept) if kept is not None else None


def claim_template_from_json(
    record: Any, shared: SharedTemplates
) -> tuple[Key, Mapping[str, Any] | None] | None:
    """The (namespace, name) and kept value a ResourceClaimTemplate's record stands for, one
    copy of a value other templates have; the value None for a template too deep to send;
    None for a record not of that shape."""
    if not isinstance(record, list) or len(record) != 3:
        return None
    namespace, name, devices = record
    key = (str(namespace), str(name))
    if devices is None:
        return key, None
    if not isinstance(devices, dict):
        return None
    kept = {k: devices[k] for k in TEMPLATE_KEYS if isinstance(devices.get(k), list)}
    return key, shared.share(kept)


class SharedTemplates:
    """One copy of each distinct kept template: the templates one chart or controller writes
    in many namespaces, or for many workloads, differ in their names, which are not kept.
    Remembered by the hash of their JSON (a template whose hash another has, with other
    content, is its own copy), at most ``limit`` of them: past that it starts over, so
    templates created again and again cannot make it grow (nor keep more than about 2 MiB
    of templates deleted since)."""

    def __init__(self, limit: int = 1024) -> None:
        self._templates: dict[int, Mapping[str, Any]] = {}
        self._limit = limit

    def share(self, kept: dict[str, Any]) -> Mapping[str, Any]:
        try:
            key = hash(orjson.dumps(kept, option=orjson.OPT_SORT_KEYS))
        except orjson.JSONEncodeError:  # not JSON (never from the API server): not shared
            return MappingProxyType(kept)
        shared = self._templates.get(key)
        if shared is not None and shared == kept:
            return shared
        if len(self._templates) >= self._limit:
            self._templates.clear()
        shared = self._templates[key] = MappingProxyType(kept)
        return shared


def _sendable(value: Any) -> bytes | None:
    """``value`` as JSON the worker reads (the module's docstring); None when it is nested
    deeper than orjson writes."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        pass
    try:  # an integer past 64 bits, or too deep
        return orjson.dumps(_big_ints_as_floats(value), option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, RecursionError):
        return None


def _big_ints_as_floats(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _big_ints_as_floats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_big_ints_as_floats(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1 << 63:
        try:
            return float(value)
        except OverflowError:  # past the largest float: what orjson reads as infinite
            return None
    return value
