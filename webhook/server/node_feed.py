"""The node inventory's process: it lists and watches the cluster's Nodes (and Namespaces,
DeviceClasses and ResourceClaimTemplates), and sends the worker what is kept of each, as it
changes.

A list of 5,000 Nodes is about 50 MB of JSON to read, decode and keep: half a second of CPU.
In the worker, that half second would be taken from the reviews it serves (their p99 went from
3.6 to about 9 ms during a relist); here it runs beside them, at the lowest priority (nice 19),
and the worker receives only what changed: a few hundred bytes per Node on the first list,
nothing for a relist that finds every Node as it was. The worker starts this process (one per
replica), owns it and stops it: see ``webhook.server.inventory``.

The process is ``python -m webhook.cli.node_feed FIELDS``, where FIELDS is the JSON of what is
kept (``fields_argument``); it calls :func:`follow`. The cluster is found as
``webhook.cluster.connection.connect`` finds it (in a Pod, its ServiceAccount). It writes one
JSON message per line on standard output:

- ``{"put": [RECORD, ...]}``: Nodes added or changed (``node_record``), at most
  ``RECORDS_PER_LINE`` a line;
- ``{"gone": [NAME, ...]}``: Nodes deleted;
- ``{"namespaces": [[NAME, {LABEL: VALUE}], ...]}`` and ``{"namespacesGone": [NAME, ...]}``:
  with namespace label keys in FIELDS only, Namespaces added or relabelled (the kept labels)
  and deleted;
- ``{"deviceClasses": [RECORD, ...]}`` (``device_class_json``) and ``{"deviceClassesGone":
  [NAME, ...]}``: DeviceClasses added or changed, and deleted;
- ``{"claimTemplates": [[NAMESPACE, NAME, {"requests": [...], "config": [...]}], ...]}`` and
  ``{"claimTemplatesGone": [[NAMESPACE, NAME], ...]}``: ResourceClaimTemplates added or
  changed (null for one that cannot be sent: ``webhook.server.dra_feed``), and deleted;
- ``{"state": {"listed": bool, "heard_ago": seconds | null, "restarts": int,
  "last_error": str | null, "device_classes_known": bool, "claim_templates_known": bool,
  "dra_error": str | null}}``: after a change to any of them, and once a second while the API
  server is heard from. Every object of a list is sent before the state that says it is
  listed (or known).

The DRA objects (``resource.k8s.io/v1``, ``webhook.core.dra_inventory``) are watched beside
the Nodes, and never hold them up: ``listed``, ``heard_ago`` and ``last_error`` are the
Nodes' (and Namespaces'). A DRA kind is known once listed, or once the API server answers 404
(it does not serve ``resource.k8s.io/v1``: before Kubernetes 1.34, or switched off; no such
object can exist, and it is listed again every ``UNSERVED_RELIST_SECONDS``), and stops being
known while its watch has not heard from the API server for ``STALE_SECONDS``. A refused
(403) or failing list leaves it unknown, with the failure in ``dra_error`` and its retries in
``restarts``: decisions then read no DRA object, as without an inventory, and the Nodes serve
on. A missing DRA cache only costs warnings; a missing Node or Namespace cache could cost
wrong decisions, which is why those stop the inventory.

It exits when its standard input ends (the worker stopped it, or died) or its standard output
is closed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import IO, Any, Generic, TypeVar

from webhook.cluster.connection import ClusterError, connect
from webhook.cluster.watching import NO_ITEMS, CacheState, Key, WatchCache, WatchOptions
from webhook.core.dra_inventory import DeviceClassRecord, device_class_record
from webhook.core.inventory import (
    EMPTY,
    NodeFields,
    NodeInfo,
    SharedParts,
    Taint,
    namespace_record,
    node_info,
)
from webhook.server.dra_feed import (
    DRA_OPTIONS,
    claim_template_json,
    device_class_json,
    dra_known,
    template_json,
)

# Nodes per list page: a page is decoded whole before it is kept, and the memory it took stays
# with the process as its high-water mark. Measured on 5,000 Nodes of about 8 KB: 500 a page
# cost the process 33 MiB, 100 a page 10 MiB; 50 pages per list of 5,000 Nodes. A pause
# between pages spreads a list's CPU (half a second for 5,000 Nodes) over a few seconds, so
# that a core it shares with the worker is not taken while it lasts. Measured with 5,000
# Nodes listed again and again (bench_inventory, 3 runs each): /validate's p99 rose 1.21x
# to 1.59x without a pause, 1.07x to 1.46x with 20 ms, 1.04x to 1.18x with 50 ms, the first
# list then done in 5.3 s instead of 2.5 s.
OPTIONS = WatchOptions(page_size=100, page_pause_seconds=0.05)
RECORDS_PER_LINE = 100
# How often the process looks at its cache for news to send: changes reach decisions within
# about this (plus the worker's turn), far within the 2 s the inventory promises.
POLL_SECONDS = 0.1
HEARD_EVERY_SECONDS = 1.0
CONNECT_RETRY_SECONDS = 30.0


def fields_argument(fields: NodeFields) -> str:
    """The FIELDS argument for :class:`NodeFields`."""
    return json.dumps(
        {
            "labelKeys": sorted(fields.gpu_label_keys),
            "vendorDomains": list(fields.vendor_domains),
            "namespaceLabelKeys": sorted(fields.namespace_label_keys),
        }
    )


def node_record(node: NodeInfo) -> list[Any]:
    """What is kept of a Node, as JSON values."""
    return [
        node.name,
        dict(node.labels),
        node.gpu_labelled,
        [[taint.key, taint.value, taint.effect] for taint in node.taints],
        dict(node.capacity),
        dict(node.allocatable),
    ]


def node_from_record(record: Any, shared: SharedParts) -> NodeInfo | None:
    """The NodeInfo a record stands for (None for one not of that shape), its parts shared
    with other Nodes' through ``shared``."""
    try:
        name, labels, gpu_labelled, taints, capacity, allocatable = record
        return NodeInfo(
            str(name),
            _strings(labels, shared),
            bool(gpu_labelled),
            shared.taints(tuple(Taint(str(k), str(v), str(e)) for k, v, e in taints)),
            _strings(capacity, shared),
            _strings(allocatable, shared),
        )
    except (TypeError, ValueError):
        return None


def _strings(value: Any, shared: SharedParts) -> Mapping[str, str]:
    if not isinstance(value, dict):
        raise TypeError("not an object")
    return shared.mapping({str(k): str(v) for k, v in value.items()}) if value else EMPTY


def parse_fields(argument: str) -> NodeFields:
    """The :class:`NodeFields` of a FIELDS argument (``fields_argument``)."""
    given = json.loads(argument)
    return NodeFields(
        frozenset(given["labelKeys"]),
        tuple(given["vendorDomains"]),
        frozenset(given.get("namespaceLabelKeys", ())),
    )


def follow(fields: NodeFields, out: IO[bytes]) -> None:
    """List and watch the Nodes (and, with namespace label keys, the Namespaces) and the DRA
    objects, and write what changes to ``out``, until writing fails (``BrokenPipeError``: the
    worker closed its end)."""
    from kubernetes import client as k8s

    while True:
        try:
            cluster = connect()
            break
        except ClusterError as exc:
            _send(out, {"state": _state(False, None, 0, f"no cluster configuration: {exc}")})
        time.sleep(CONNECT_RETRY_SECONDS)
    api = k8s.CoreV1Api(cluster.api_client)
    resources = k8s.ResourceV1Api(cluster.api_client)
    nodes = WatchCache(
        cluster,
        api.list_node,
        partial(node_info, kept=fields, shared=SharedParts()),
        options=OPTIONS,
    )
    namespaces = None
    if fields.namespace_label_keys:
        keys = fields.namespace_label_keys
        namespaces = WatchCache(
            cluster, api.list_namespace, lambda obj: namespace_record(obj, keys)[1], options=OPTIONS
        )
    classes = WatchCache(
        cluster, resources.list_device_class, device_class_record, options=DRA_OPTIONS
    )
    templates = WatchCache(
        cluster,
        resources.list_resource_claim_template_for_all_namespaces,
        claim_template_json,
        options=DRA_OPTIONS,
    )
    for cache in (nodes, namespaces, classes, templates):
        if cache is not None:
            threading.Thread(target=cache.run, args=(threading.Event(),), daemon=True).start()
    _follow(
        _Sender(nodes, "put", "gone", lambda _, node: node_record(node)),
        _Sender(namespaces, "namespaces", "namespacesGone", lambda k, labels: [k[1], dict(labels)])
        if namespaces is not None
        else None,
        _Sender(classes, "deviceClasses", "deviceClassesGone", lambda _, c: device_class_json(c)),
        _Sender(
            templates,
            "claimTemplates",
            "claimTemplatesGone",
            lambda k, devices: [k[0], k[1], template_json(devices)],
            gone_as=list,
        ),
        out,
    )


T = TypeVar("T")


class _Sender(Generic[T]):
    """One cache, and what of it was sent: each object added or changed as the JSON value
    ``record`` makes (messages ``put``, at most ``RECORDS_PER_LINE`` a line), each deleted as
    ``gone_as`` its key (``gone``: its name, or [namespace, name])."""

    def __init__(
        self,
        cache: WatchCache[T],
        put: str,
        gone: str,
        record: Callable[[Key, T], Any],
        gone_as: Callable[[Key], Any] = lambda key: key[1],
    ) -> None:
        self.cache = cache
        self._put, self._gone, self._record, self._gone_as = put, gone, record, gone_as
        self._sent: Mapping[Key, T] = NO_ITEMS

    def send(self, out: IO[bytes]) -> CacheState[T]:
        """Send what changed since the last call; the cache's state it was sent from."""
        state = self.cache.state
        before, now = self._sent, state.items
        if now is before:
            return state
        changed = [
            self._record(key, item)
            for key, item in now.items()
            # The cache keeps the object it had for one whose kept fields did not change. A
            # new one kept as None (a template too deep to send) is not sent: the worker has
            # nothing of it; one that becomes None is, as null.
            if (old := before.get(key)) is not item and old != item
        ]
        for start in range(0, len(changed), RECORDS_PER_LINE):
            _send(out, {self._put: changed[start : start + RECORDS_PER_LINE]})
        gone = [self._gone_as(key) for key in before if key not in now]
        if gone:
            _send(out, {self._gone: gone})
        self._sent = now
        return state


def _follow(
    nodes: _Sender[NodeInfo],
    namespaces: _Sender[Mapping[str, str]] | None,
    classes: _Sender[DeviceClassRecord],
    templates: _Sender[bytes | None],
    out: IO[bytes],
) -> None:
    """Send what changes in the caches, until the process ends. With Namespaces watched, the
    state is both caches': listed once both have listed, heard from when the one heard from
    longer ago was, their restarts added up, the Nodes' error first. So a Namespace watch
    that is refused or fails makes the inventory stale, as a Node watch would: decisions go
    on without it, and the stale-inventory alert fires, instead of tenants selected by label
    silently losing their entitlements. The DRA caches add their restarts, and say whether
    each kind is known and the first of their errors (the module's docstring)."""
    last: tuple[Any, ...] | None = None
    heard_sent = 0.0
    while True:
        state = nodes.send(out)
        listed, heard, restarts, error = (
            state.listed,
            state.heard_at,
            state.restarts,
            state.last_error,
        )
        if namespaces is not None:
            known = namespaces.send(out)
            listed = listed and known.listed
            heard = None if heard is None or known.heard_at is None else min(heard, known.heard_at)
            restarts += known.restarts
            if error is None and known.last_error is not None:
                error = f"watching Namespaces: {known.last_error}"
        now = time.monotonic()
        dra: list[tuple[CacheState[Any], str]] = [
            (classes.send(out), "DeviceClasses"),
            (templates.send(out), "ResourceClaimTemplates"),
        ]
        restarts += sum(kind.restarts for kind, _ in dra)
        kinds_known = [dra_known(kind, now) for kind, _ in dra]
        dra_error = next(
            (f"watching {what}: {kind.last_error}" for kind, what in dra if kind.last_error), None
        )
        summary = (listed, restarts, error, *kinds_known, dra_error)
        if summary != last or (heard is not None and heard > heard_sent + HEARD_EVERY_SECONDS):
            ago = now - heard if heard is not None else None
            message = _state(listed, ago, restarts, error)
            message.update(
                device_classes_known=kinds_known[0],
                claim_templates_known=kinds_known[1],
                dra_error=dra_error,
            )
            _send(out, {"state": message})
            last, heard_sent = summary, heard if heard is not None else 0.0
        time.sleep(POLL_SECONDS)


def _state(
    listed: bool, heard_ago: float | None, restarts: int, error: str | None
) -> dict[str, Any]:
    return {"listed": listed, "heard_ago": heard_ago, "restarts": restarts, "last_error": error}


def _send(out: IO[bytes], message: dict[str, Any]) -> None:
    out.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    out.flush()
