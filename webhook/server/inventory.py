"""The opt-in node inventory of a replica: what the worker knows of the cluster's Nodes.

Off unless ``--inventory`` (``GPU_ADMISSION_INVENTORY=true``) is given, and then the
webhook's ServiceAccount needs list and watch on nodes (the chart's ``inventory.enabled``,
the kustomize overlay ``manifests/overlays/inventory``). The worker process owns it: one list
and one watch of Nodes per replica (``webhook.cluster.watching``), run in a thread of the
worker (a greenlet: the worker is a gevent process), never on the request path. A list comes
in pages of ``PAGE_SIZE`` Nodes, each decoded in about a millisecond and kept as it arrives
(``webhook.core.inventory``: a few hundred bytes of each Node), with a turn for the
connections between pages, so a relist of 5,000 Nodes does not hold reviews up.

What is kept of a Node depends on the policy (its pools' label keys, its vendor domains): a
policy that changes them makes the inventory list the Nodes again. Readers get an immutable
snapshot and never wait on the API server; without a list yet, or while the API server is
unreachable, the snapshot is the last one (none before the first list), and readiness never
depends on it. Metrics: ``gpu_admission_inventory_nodes``,
``gpu_admission_inventory_age_seconds`` (since the API server was last heard from, or since
start before the first list) and ``gpu_admission_inventory_watch_restarts_total``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from webhook.cluster.connection import Cluster, ClusterError
from webhook.cluster.watching import CacheState, Key, WatchCache, WatchOptions
from webhook.core.inventory import NodeInfo, NodeSnapshot, SharedParts, node_info
from webhook.policy.model import Policy

INVENTORY_LOGGER = "webhook.inventory"
log = logging.getLogger(INVENTORY_LOGGER)

# Nodes per list page: a page of 50 Nodes decodes in about a millisecond, the longest a list
# holds the worker's event loop at a time.
PAGE_SIZE = 50
OPTIONS = WatchOptions(page_size=PAGE_SIZE)
# How often the inventory looks at the policy (for what it keeps) and at its cache's state
# (for the log), and how long it waits before trying a configuration that did not load again.
LOOK_SECONDS = 1.0
CONNECT_RETRY_SECONDS = 30.0


class NodeInventory:
    """The Nodes as the worker knows them (see the module's docstring)."""

    def __init__(
        self,
        connect: Callable[[], Cluster],
        policy: Callable[[], Policy | None],
        *,
        options: WatchOptions = OPTIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect = connect
        self._policy = policy
        self._options = options
        self._clock = clock
        self._started_at = clock()
        # The cache readers see, with the restarts of the caches it replaced and the pool label
        # keys it keeps: one attribute, replaced whole, so a reader never sees one without the
        # others.
        self._serving: tuple[WatchCache[NodeInfo] | None, int, frozenset[str]] = (
            None,
            0,
            frozenset(),
        )
        # The decisions' snapshot of the serving cache's items, made once per change.
        self._snapshot: tuple[Mapping[Key, NodeInfo], NodeSnapshot] | None = None

    def start(self) -> threading.Thread:
        """Run the inventory in a daemon thread, until the process exits."""
        thread = threading.Thread(target=self._run, name="node-inventory", daemon=True)
        thread.start()
        return thread

    @property
    def state(self) -> CacheState[NodeInfo] | None:
        """The latest snapshot, or None before the inventory has a cache."""
        cache = self._serving[0]
        return cache.state if cache is not None else None

    def snapshot(self) -> NodeSnapshot | None:
        """What decisions read: the Nodes known now, or None before the first list."""
        cache, _, label_keys = self._serving
        state = cache.state if cache is not None else None
        if state is None or not state.listed:
            return None
        made = self._snapshot
        if made is not None and made[0] is state.items:
            return made[1]
        snapshot = NodeSnapshot({name: node for (_, name), node in state.items.items()}, label_keys)
        self._snapshot = (state.items, snapshot)
        return snapshot

    def nodes(self) -> Mapping[Key, NodeInfo]:
        """The Nodes known now (empty before the first list)."""
        state = self.state
        return state.items if state is not None else {}

    def figures(self) -> tuple[int, float, int]:
        """Nodes known, seconds since the API server was last heard from (since start before
        that), and how many times a list or watch was started again."""
        cache, restarts_before, _ = self._serving
        state = cache.state if cache is not None else None
        heard = state.heard_at if state is not None else None
        age = self._clock() - (heard if heard is not None else self._started_at)
        restarts = restarts_before + (state.restarts if state is not None else 0)
        return (len(state.items) if state is not None else 0), age, restarts

    def _run(self) -> None:
        cluster = self._connected()
        kept_for: tuple[Any, ...] | None = None
        # A cache started for a new policy, serving once it has listed (until then readers
        # keep the Nodes they had), and what stops each.
        pending: tuple[WatchCache[NodeInfo], threading.Event, frozenset[str]] | None = None
        serving_stop = threading.Event()
        reported: tuple[bool, str | None] = (False, None)
        while True:
            policy = self._policy()
            if policy is not None and _what_is_kept(policy) != kept_for:
                if pending is not None:
                    pending[1].set()  # a newer policy: what that list would keep is stale
                if kept_for is not None:
                    log.info("the policy changed what is kept of a Node: listing Nodes again")
                kept_for = _what_is_kept(policy)
                pending = (
                    self._started_cache(cluster, policy),
                    threading.Event(),
                    policy.gpu_label_keys,
                )
                threading.Thread(
                    target=pending[0].run, args=(pending[1],), name="node-watch", daemon=True
                ).start()
            serving, restarts_before, _ = self._serving
            if pending is not None and (serving is None or pending[0].state.listed):
                if serving is not None:
                    serving_stop.set()
                    restarts_before += serving.state.restarts + 1
                self._serving = (pending[0], restarts_before, pending[2])
                serving_stop, pending = pending[1], None
            reported = self._report(reported)
            time.sleep(LOOK_SECONDS)

    def _started_cache(self, cluster: Cluster, policy: Policy) -> WatchCache[NodeInfo]:
        return WatchCache(
            cluster,
            _list_nodes(cluster),
            partial(node_info, policy=policy, shared=SharedParts()),
            options=self._options,
            clock=self._clock,
        )

    def _connected(self) -> Cluster:
        while True:
            try:
                return self._connect()
            except ClusterError as exc:
                log.error(
                    "node inventory: no cluster configuration",
                    extra={"fields": {"error": str(exc), "retry_seconds": CONNECT_RETRY_SECONDS}},
                )
            time.sleep(CONNECT_RETRY_SECONDS)

    def _report(self, reported: tuple[bool, str | None]) -> tuple[bool, str | None]:
        """Log the first list, and each failure as it starts and ends (not every retry)."""
        state = self.state
        if state is None:
            return reported
        listed, error = reported
        if state.listed and not listed:
            log.info("node inventory listed", extra={"fields": {"nodes": len(state.items)}})
        if state.last_error != error:
            if state.last_error is not None:
                log.warning(
                    "node inventory cannot reach the API server; decisions go on without news",
                    extra={"fields": {"error": state.last_error}},
                )
            else:
                log.info("node inventory is current again", extra={"fields": {}})
        return state.listed, state.last_error


def _what_is_kept(policy: Policy) -> tuple[Any, ...]:
    return (policy.gpu_label_keys, policy.vendor_domains)


def _list_nodes(cluster: Cluster) -> Callable[..., Any]:
    from kubernetes import client as k8s

    return k8s.CoreV1Api(cluster.api_client).list_node
