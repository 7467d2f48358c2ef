"""A watch cache: what its readers need of every object of one resource type, kept current by
a paged list and then a watch from the list's resourceVersion.

It keeps current as client-go's reflector does:

- it lists ``WatchOptions.page_size`` objects at a time, all pages from one snapshot, whose
  resourceVersion is where the watch starts; each page is kept (``keep``) as it arrives, and
  other threads (other greenlets, in a gevent server) get a turn between pages, so neither
  memory nor the time a list holds the interpreter grows with the cluster;
- it watches with bookmarks (the API server sends its latest resourceVersion now and then,
  so a watch started again resumes from a recent one), a server-side timeout per watch
  (``WatchOptions.watch_seconds``) and a read timeout a little longer on the client's side.
  A watch that ends (its timeout, an API server that restarts, a connection dropped) is
  started again from the last resourceVersion seen;
- 410 Gone (that resourceVersion was compacted away) lists again, at once;
- with ``WatchOptions.unserved_relist_seconds``, a 404 (the API server does not serve the
  resource type: an API group or version not installed, or switched off) means there are no
  objects of it: the cache is listed and empty (``CacheState.served`` False), and lists
  again after that long, in case the type comes to be served; not counted as a restart;
- any other failure waits, doubling from ``backoff_first`` to ``backoff_max``, then watches
  again from the last resourceVersion (or lists, if no list succeeded yet).

Readers get :class:`CacheState`, an immutable snapshot published after every change; they
never wait on the API server. What is kept of an object is what ``keep`` returns (a few
fields, not the client's model objects), so a cache of 5,000 Nodes costs what their kept
fields cost. The cache runs in the thread that calls :meth:`WatchCache.run`, until the event
it is given is set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from threading import Event
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from webhook.cluster.connection import Cluster, ClusterError, one_line
from webhook.cluster.listing import PAGE_SIZE, Lister, status_message

T = TypeVar("T")
# An object's key: its namespace ("" for a cluster-scoped one) and its name.
Key = tuple[str, str]
NO_ITEMS: Mapping[Key, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """The size of a list's pages, how long a watch lasts, how long a read may wait, and the
    backoff after a failure."""

    page_size: int = PAGE_SIZE
    # The API server ends a watch after this (its timeoutSeconds); it is started again from
    # the last resourceVersion. kube-apiserver's own default is 30 to 60 minutes.
    watch_seconds: int = 300
    # A watch that sends nothing for this long (no event, no bookmark: the API server sends
    # one about once a minute) has lost its connection.
    read_idle_seconds: float = 120.0
    backoff_first: float = 0.5
    backoff_max: float = 30.0
    # A watch that ends sooner than this without an event is a failure (backed off), not a
    # timeout: a proxy that closes watches at once would otherwise be called in a loop.
    watch_floor_seconds: float = 1.0
    # Events handled before other threads (greenlets) get a turn.
    events_per_turn: int = 50
    # A pause between the pages of a list, so that a list of thousands of objects spreads
    # its reading and decoding over time instead of taking a core while it lasts.
    page_pause_seconds: float = 0.0
    # With a number, a 404 on the list or the watch is a resource type not served (none of
    # its objects exist), listed again after this long; None: a failure like any other.
    unserved_relist_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class CacheState(Generic[T]):
    """What the cache knows, as of one moment: never changed, replaced as a whole."""

    items: Mapping[Key, T]
    resource_version: str  # where the next watch starts; "" before the first list
    listed: bool  # a list succeeded once: ``items`` are the cluster's, not just empty
    # When the API server was last heard from (``clock()``): a list, an event, a bookmark or
    # a watch that ended on time. None before the first list.
    heard_at: float | None
    restarts: int  # lists after the first, and watches started again after a failure
    last_error: str | None  # the last failure, until the next list or event
    # False once the API server answered 404 (``WatchOptions.unserved_relist_seconds``):
    # ``items`` are then empty and ``listed`` True, until a list succeeds.
    served: bool = True


class WatchCache(Generic[T]):
    """One resource type, listed then watched (see the module's docstring).

    ``list_function`` is the kubernetes client's list method of the resource (for example
    ``CoreV1Api(api_client).list_node``, or a ``functools.partial`` of
    ``CustomObjectsApi.list_cluster_custom_object`` with its group, version and plural).
    ``keep`` turns an object, as the API server sent it, into what readers need; it must not
    raise."""

    def __init__(
        self,
        cluster: Cluster,
        list_function: Callable[..., Any],
        keep: Callable[[dict[str, Any]], T],
        *,
        options: WatchOptions | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cluster = cluster
        self._lister = Lister(cluster, None)
        self._list_function = list_function
        self._keep = keep
        self._options = options or WatchOptions()
        self._clock = clock
        self._items: dict[Key, T] = {}
        self._state: CacheState[T] = CacheState(NO_ITEMS, "", False, None, 0, None)

    @property
    def state(self) -> CacheState[T]:
        """The latest snapshot; safe to read from any thread."""
        return self._state

    def run(self, stop: Event) -> None:
        """List, then watch, until ``stop`` is set; failures are retried, never raised (the
        last one is in ``state.last_error``)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        backoff = self._options.backoff_first
        while not stop.is_set():
            try:
                if not self._state.listed or not self._state.resource_version:
                    if not self._list(stop):
                        return
                if stop.is_set():
                    return
                if self._watch(stop):
                    backoff = self._options.backoff_first
                    continue
                error = "the watch ended at once, with no event"
            except ApiException as exc:
                if exc.status == 410:
                    # Compacted away: only a new list knows what changed meanwhile.
                    self._publish(
                        resource_version="",
                        restarts=self._state.restarts + 1,
                        last_error=f"watch expired (HTTP 410): {status_message(exc)}",
                    )
                    continue
                relist = self._options.unserved_relist_seconds
                if exc.status == 404 and relist is not None:
                    self._unserved()
                    stop.wait(relist)
                    continue
                error = f"HTTP {exc.status}: {status_message(exc)}"
            except ClusterError as exc:
                error = str(exc)
            except (HTTPError, OSError, ValueError) as exc:  # dropped, timed out, garbled
                error = f"{type(exc).__name__}: {one_line(str(exc))}"
            except Exception as exc:  # anything else: retried too, never a dead cache
                error = f"unexpected {type(exc).__name__}: {one_line(str(exc))}"
            self._publish(heard=False, restarts=self._state.restarts + 1, last_error=error)
            stop.wait(backoff)
            backoff = min(backoff * 2, self._options.backoff_max)

    def _list(self, stop: Event) -> bool:
        """List every object; False when ``stop`` was set meanwhile (nothing published)."""
        items: dict[Key, T] = {}
        version = ""
        for page in self._lister.pages(self._list_function, self._options.page_size):
            for obj in page.get("items") or ():
                if isinstance(obj, dict):
                    items[_key(obj)] = self._keep(obj)
            version = str((page.get("metadata") or {}).get("resourceVersion") or "")
            if stop.is_set():
                return False
            # A turn for other threads (greenlets) between pages, or a pause.
            time.sleep(self._options.page_pause_seconds)
        # What was kept of each object is often what was kept before (a relist after 410 Gone):
        # then readers keep their snapshot, and what they worked out from it.
        changed = items != self._items or not self._state.listed
        if changed:
            self._items = items
        self._publish(
            resource_version=version,
            listed=True,
            served=True,
            last_error=None,
            items_changed=changed,
        )
        return True

    def _unserved(self) -> None:
        """The API server does not serve the resource type: no object of it exists."""
        changed = bool(self._items) or not self._state.listed
        self._items = {}
        self._publish(
            resource_version="", listed=True, served=False, last_error=None, items_changed=changed
        )

    def _watch(self, stop: Event) -> bool:
        """One watch, from the last resourceVersion, until it ends or ``stop`` is set; False
        when it ended at once without an event (see ``watch_floor_seconds``)."""
        from kubernetes.watch import Watch

        options = self._options
        # return_type "object": events keep their objects as the dicts the API server sent
        # (no model round trip), and the client still follows their resourceVersions.
        watch = Watch(return_type="object")
        events = watch.stream(
            self._list_function,
            resource_version=self._state.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=options.watch_seconds,
            # (connect, read): the read timeout bounds each wait for the next bytes.
            _request_timeout=(self._cluster.timeout, options.read_idle_seconds),
        )
        started = self._clock()
        handled = 0
        for event in events:
            if isinstance(event, Mapping):  # the client yields None for a blank line
                self._apply(event)
            handled += 1
            if stop.is_set():
                watch.stop()
                return True
            if handled % options.events_per_turn == 0:
                time.sleep(0)  # a burst of events gives other threads (greenlets) turns
        self._publish()  # ended on time: the API server was heard from
        return handled > 0 or self._clock() - started >= options.watch_floor_seconds

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("raw_object")
        if not isinstance(obj, dict):
            return
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        key = _key(obj)
        changed = False
        if kind in ("ADDED", "MODIFIED"):
            # Most updates change nothing that is kept (a Node's status and heartbeats): the
            # snapshot stays the same object.
            kept = self._keep(obj)
            changed = key not in self._items or self._items[key] != kept
            if changed:
                self._items[key] = kept
        elif kind == "DELETED":
            changed = self._items.pop(key, None) is not None
        elif kind != "BOOKMARK":
            return
        self._publish(
            resource_version=version or self._state.resource_version,
            last_error=None,
            items_changed=changed,
        )

    def _publish(self, *, heard: bool = True, items_changed: bool = False, **changes: Any) -> None:
        if items_changed:
            changes["items"] = MappingProxyType(dict(self._items))
        if heard:
            changes["heard_at"] = self._clock()
        self._state = replace(self._state, **changes)


def _key(obj: Mapping[str, Any]) -> Key:
    metadata = obj.get("metadata") or {}
    return (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
