"""Room for a new connection when a worker holds all it may: the connection that has waited
on its client longest is closed.

Each worker holds at most ``max_connections`` connections. Without this, a client that
opens connections faster than their deadlines close them keeps the worker full, and every
new connection, the API server's included, waits in the kernel's accept queue until
deadlines free a slot: seconds, the webhook's whole timeout. Here, when the worker is full
and a connection waits to be accepted, the worker closes the connection that has waited on
its client longest, whatever it waits for: its TLS handshake, its first request, the rest
of a request's head or body, or its next request on an idle keep-alive connection (nginx
closes idle and not-yet-used connections the same way when it runs out). A connection
running a decision or writing its answer is never closed. A client that answers promptly
has waited milliseconds, so a flood of stalled connections closes its own members first:
to have a prompt client's connection closed, an attacker would have to open more than the
cap's worth of connections within that client's few milliseconds of waiting.

A connection counts as waiting from when its wait began: its accept, the end of its last
answer, or the start of a read of its body.
"""

from __future__ import annotations

from collections import OrderedDict

from gevent import Greenlet, GreenletExit


class Evicted(GreenletExit):
    """Thrown into a waiting connection's greenlet to close it and make room. A GreenletExit
    (not an Exception): the app, Flask and gunicorn let it through untouched."""


class WaitingRoom:
    """A worker's connections that wait on their client, longest wait first."""

    def __init__(self) -> None:
        # Insertion order is the order the waits began: the first one has waited longest.
        self._waiting: OrderedDict[Greenlet, None] = OrderedDict()
        # Chosen to be closed, not yet told: one that stops waiting first is spared.
        self._chosen: set[Greenlet] = set()

    def __len__(self) -> int:
        return len(self._waiting)

    def enter(self, connection: Greenlet) -> None:
        """``connection`` starts waiting on its client (again: its wait starts afresh)."""
        self._waiting[connection] = None
        self._waiting.move_to_end(connection)

    def leave(self, connection: Greenlet) -> None:
        """``connection`` got what it waited for (or ended)."""
        self._waiting.pop(connection, None)
        if self._chosen:
            self._chosen.discard(connection)

    def make_room(self) -> bool:
        """Close the connection that has waited longest; False when none is waiting.

        Called from the event loop (the listener's watcher): the connection is told on the
        loop's next turn, with :class:`Evicted` raised where it waits, and only if it is
        still waiting then."""
        while self._waiting:
            connection, _ = self._waiting.popitem(last=False)
            if connection.dead:
                continue
            self._chosen.add(connection)
            connection.parent.loop.run_callback(self._close, connection)
            return True
        return False

    def _close(self, connection: Greenlet) -> None:
        if connection in self._chosen:
            self._chosen.discard(connection)
            if not connection.dead:
                connection.throw(Evicted())
