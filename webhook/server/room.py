"""Room for a new connection when a worker holds all it may: a connection that waits on its
client is closed.

Each worker holds at most ``max_connections`` connections. Without this, a client that
opens connections faster than their deadlines close them keeps the worker full, and every
new connection, the API server's included, waits in the kernel's accept queue until
deadlines free a slot: seconds, and two minutes for connections that went idle after one
request. Here, when the worker is full and a connection waits to be accepted, the worker
closes a connection that waits on its client (nginx closes idle and not-yet-used
connections the same way when it runs out), chosen in this order:

1. the connection that has waited longest among those never answered (its TLS handshake,
   its first request's head or body), if it has waited ``FRESH_GRACE_SECONDS`` or more: a
   prompt client, the API server on a new connection, takes milliseconds;
2. otherwise the connection that has waited longest among those answered before: idle
   between keep-alive requests, or sending a later request, or not reading its answer;
3. otherwise the connection that has waited longest of all.

A connection's wait starts when it is accepted, when it is answered, when a new request on
it starts, when a read of its body starts, and when writing its answer blocks because the
client does not read. A connection that runs a decision, or whose answer is being written
without blocking, is not waiting and is never closed. So a flood of stalled connections
closes its own members first and leaves the API server's pooled connections alone; only a
flood of more than the cap's worth of new connections within ``FRESH_GRACE_SECONDS`` reaches
idle pooled ones (the API server opens new ones).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from gevent import Greenlet, GreenletExit

FRESH_GRACE_SECONDS = 0.5


class Evicted(GreenletExit):
    """Thrown into a waiting connection's greenlet to close it and make room. A GreenletExit
    (not an Exception): the app, Flask and gunicorn let it through untouched."""


class WaitingRoom:
    """A worker's connections that wait on their client, in two lines (never answered, and
    answered before), longest wait first."""

    def __init__(self) -> None:
        # Insertion order is the order the waits began, the value when: the first one of each
        # line has waited longest.
        self._fresh: OrderedDict[Greenlet, float] = OrderedDict()
        self._answered: OrderedDict[Greenlet, float] = OrderedDict()
        # Chosen to be closed, not yet told: one that stops waiting first is spared.
        self._chosen: set[Greenlet] = set()
        # Told (Evicted thrown where it waited), until its handler ends: gunicorn's gevent
        # worker ends a request quietly on a GreenletExit, so the handler asks after it.
        self._told: set[Greenlet] = set()
        # Called when a chosen connection was spared: the server looks again for room soon.
        self.on_spared: Callable[[], None] | None = None
        # Connections closed to make room, for the worker's periodic log line.
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._fresh) + len(self._answered)

    def enter(self, connection: Greenlet, answered: bool) -> None:
        """``connection`` starts waiting on its client (again: its wait starts afresh)."""
        line = self._answered if answered else self._fresh
        line[connection] = time.monotonic()
        line.move_to_end(connection)

    def leave(self, connection: Greenlet) -> None:
        """``connection`` got what it waited for."""
        if self._fresh.pop(connection, None) is None:
            self._answered.pop(connection, None)
        if self._chosen:
            self._chosen.discard(connection)

    def told(self, connection: Greenlet) -> bool:
        """Whether ``connection`` was told to close (however its request ended since)."""
        return connection in self._told

    def ended(self, connection: Greenlet) -> None:
        """``connection``'s handler ends: it is forgotten."""
        self.leave(connection)
        self._told.discard(connection)

    def make_room(self) -> bool:
        """Close a waiting connection (see the module's docstring); False when none waits.

        Called from the event loop (the listener's watcher): the connection is told on the
        loop's next turn, with :class:`Evicted` raised where it waits, and only if it is
        still waiting then; if it is not, another is chosen."""
        while True:
            line = self._line()
            if line is None:
                return False
            connection, _ = line.popitem(last=False)
            if connection.dead:
                continue
            self._chosen.add(connection)
            connection.parent.loop.run_callback(self._close, connection)
            return True

    def _line(self) -> OrderedDict[Greenlet, float] | None:
        if self._fresh:
            if time.monotonic() - next(iter(self._fresh.values())) >= FRESH_GRACE_SECONDS:
                return self._fresh
            if not self._answered:
                return self._fresh
        return self._answered or None

    def _close(self, connection: Greenlet) -> None:
        if connection.dead:
            self._chosen.discard(connection)
            return  # ended on its own: its slot is free
        if connection in self._chosen:
            self._chosen.discard(connection)
            self.evicted += 1
            self._told.add(connection)
            connection.throw(Evicted())
        elif self.on_spared is not None:
            # It stopped waiting before it could be told: the room the newcomer needs is
            # made from another, or looked for again soon if none waits now (gevent accepts
            # again only once the pool frees a slot).
            self.on_spared()


class WatchedWrites:
    """A client socket as an answer is written to it: while a send blocks (the client does
    not read), the connection waits on its client and may be closed to make room. Everything
    else is the socket's own."""

    def __init__(self, sock: Any, waiting: WaitingRoom, connection: Greenlet) -> None:
        self._sock = sock
        self._waiting = waiting
        self._connection = connection
        # Whether the connection was answered before this answer (its line in the room).
        self.answered = False

    def sendall(self, data: bytes) -> None:
        # A send that does not block never gives the loop a turn, so only one that blocks
        # can be closed; its wait starts here.
        self._waiting.enter(self._connection, self.answered)
        try:
            self._sock.sendall(data)
        finally:
            self._waiting.leave(self._connection)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)
