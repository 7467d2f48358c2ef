"""Room for a new connection when the worker holds all it may: a connection that waits on its
client is closed (:class:`WaitingRoom`), by the server that accepts (:class:`RoomMakingServer`).

The worker holds at most ``max_connections`` connections. Without this, a client that
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

import errno
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from gevent import Greenlet, GreenletExit
from gevent.pool import Pool
from gevent.server import StreamServer

from webhook.server.logs import SERVER_LOGGER

log = logging.getLogger(SERVER_LOGGER)

FRESH_GRACE_SECONDS = 0.5
# A full worker with no connection waiting on its client (all being decided or answered)
# looks again this often: decisions take milliseconds.
ROOM_RETRY_SECONDS = 0.02


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


class RoomMakingServer(StreamServer):
    """gevent's stream server with a cap on its connections: when it holds ``connections``'
    size, a connection waiting to be accepted gets the room of one that waits on its client
    (see the module's docstring).

    The connections' pool is the server's own, not gevent's (gevent is given a plain spawn):
    the server says when it is full (:meth:`full`, which gevent asks before each accept) and
    accepts again once a connection has ended."""

    # gevent asks full() before each accept of a batch, and full() makes room: asked again
    # after the last waiting connection was taken, it would close one more for nobody. One
    # accept each time the listener is readable asks it only while a connection waits.
    max_accept = 1

    def __init__(
        self, listener: Any, *, connections: Pool, waiting: WaitingRoom, **kwargs: Any
    ) -> None:
        self.connections = connections
        self._waiting = waiting
        self._waiting_for_a_slot = False
        super().__init__(listener, spawn=self._start_connection, **kwargs)
        # Repeating, and stopped when it fires: a one-shot libev timer started again after it
        # fired fires at once, which would make the pause a busy loop.
        self._room_retry = self.loop.timer(ROOM_RETRY_SECONDS, ROOM_RETRY_SECONDS)
        waiting.on_spared = self.look_again

    def _start_connection(self, handler: Callable[..., Any], *args: Any) -> Any:
        connection = self.connections.spawn(handler, *args)
        connection.rawlink(self._connection_ended)
        return connection

    def _connection_ended(self, _connection: Any) -> None:
        if self._waiting_for_a_slot:
            # After every link of the ended greenlet ran: its slot in the pool is free then.
            self.loop.run_callback(self._accept_again)

    def full(self) -> bool:
        """Whether the pool is full; if so, a connection that waits on its client is closed
        and the one waiting to be accepted takes its slot once it is free; when none waits on
        its client (all are being decided or answered), the server looks again in
        ``ROOM_RETRY_SECONDS``."""
        if not self.connections.full():
            return False
        if not self._waiting.make_room():
            self.look_again()
        self._waiting_for_a_slot = True
        return True

    def look_again(self) -> None:
        """Look for room again in ``ROOM_RETRY_SECONDS`` (none could be made just now)."""
        if self.started:
            self._room_retry.start(self._accept_again)

    def _accept_again(self) -> None:
        self._room_retry.stop()
        if self.started:
            self._waiting_for_a_slot = False
            self.start_accepting()

    def wrap_socket_and_handle(self, client_socket: Any, address: Any) -> Any:
        # gevent's own lets an error of the TLS wrapper (a client that reset the connection
        # before its handshake) escape the greenlet, which prints a traceback of thirty lines
        # to stderr: any client could fill the log with them, a connection each.
        try:
            tls_socket = self.wrap_socket(client_socket, **self.ssl_args)
        except OSError as exc:
            if isinstance(exc, (ConnectionError, ssl.SSLError)) or exc.errno == errno.ENOTCONN:
                log.debug("connection ended before its TLS handshake: %s", exc)
            else:  # not the client's doing (a bad descriptor, a certificate that fails)
                log.exception("could not set up TLS on a new connection")
            return None
        try:
            return self.handle(tls_socket, address)
        finally:
            tls_socket.close()

    def close(self) -> None:
        self._room_retry.stop()
        super().close()

    def serving(self) -> bool:
        """Whether a connection accepted by this server is still open."""
        return bool(self.connections.free_count() < self.connections.size)

    def stop(self, timeout: float | None = None) -> None:
        """Close, then give the connections ``timeout`` to end and kill the rest (what gevent
        does for a pool it was given)."""
        super().stop(timeout)
        self.connections.join(timeout=timeout)
        self.connections.kill(block=True, timeout=1)
