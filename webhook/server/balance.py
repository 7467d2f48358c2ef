"""Sharing connections out evenly between a server's workers.

The workers of a gunicorn server accept from one listening socket. A connection that
arrives wakes every worker waiting on it and goes to the first that calls ``accept``, and a
worker already running (handshaking the connection it took a moment ago) is usually first:
measured with 8 connections opened at once against 2 workers, the split was 4/4, 7/1 or
8/0 from one run to the next. The API server keeps a pool of long-lived keep-alive
connections, so a lopsided split lasts: one worker's core serves them all, at up to half
the server's capacity, with twice the queueing, while the other idles.

Each worker therefore counts its open connections in anonymous shared memory mapped before
fork (one slot per worker, assigned by the arbiter, counted from when the worker starts
accepting; a connection counts from its accept until gevent closes it, whatever ended it).
A worker that holds more than the least loaded accepting worker leaves a waiting connection
to the others: it stops accepting, looks again every :data:`YIELD_STEP_SECONDS`, and takes
the connection itself if it is still waiting after :data:`YIELD_SECONDS` (a less loaded
worker may be busy with a burst of handshakes for a few milliseconds). A connection left
waiting that long means the others are not accepting (hung, or stopping): the worker then
takes whatever arrives, without yielding, for :data:`TAKE_ALL_SECONDS`, so that a queue of
connections is not delayed a window each.
"""

from __future__ import annotations

import errno
import logging
import mmap
import ssl
import time
from collections.abc import Callable
from typing import Any

from gevent import monkey
from gevent.pool import Pool
from gevent.server import StreamServer

from webhook.server.logs import SERVER_LOGGER

log = logging.getLogger(SERVER_LOGGER)

# Longer than a worker takes to handshake a burst of a few connections; short next to the
# handshake's own deadline.
YIELD_SECONDS = 0.05
YIELD_STEP_SECONDS = 0.002
TAKE_ALL_SECONDS = 1.0
# A full worker with no connection waiting on its client (all being decided or answered)
# looks again this often: decisions take milliseconds.
ROOM_RETRY_SECONDS = 0.02
_FREE = -1
# A look at the listener that does not wait: the blocking original, not gevent's.
_select = monkey.get_original("select", "select")


class ConnectionShares:
    """Open connections per worker slot (``-1``: no worker is accepting in the slot).

    The arbiter claims slots for workers it forks and releases those of workers that exited;
    a worker joins its slot when it starts accepting, writes only its own slot's count, and
    reads the others' (an aligned 4-byte value is read and written whole)."""

    def __init__(self, slots: int) -> None:
        self._memory = mmap.mmap(-1, 4 * slots, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        self._counts = memoryview(self._memory).cast("i")
        for slot in range(slots):
            self._counts[slot] = _FREE

    def claim(self, taken: set[int]) -> int | None:
        """A slot for a worker about to be forked (in the arbiter), none of ``taken``; None
        when every slot is taken (that worker then accepts without yielding). Nobody leaves
        it a connection until the worker joins it: a worker boots for a second or more."""
        for slot in range(len(self._counts)):
            if slot not in taken:
                self._counts[slot] = _FREE
                return slot
        return None

    def join(self, slot: int | None) -> None:
        """The worker of ``slot`` starts accepting, with no connection yet."""
        if slot is not None:
            self._counts[slot] = 0

    def release(self, slot: int | None) -> None:
        """The slot of a worker that exited or stopped accepting."""
        if slot is not None:
            self._counts[slot] = _FREE

    def opened(self, slot: int | None) -> None:
        if slot is not None and self._counts[slot] >= 0:
            self._counts[slot] += 1

    def closed(self, slot: int | None) -> None:
        if slot is not None and self._counts[slot] > 0:
            self._counts[slot] -= 1

    def count(self, slot: int) -> int:
        return self._counts[slot]

    def should_yield(self, slot: int | None) -> bool:
        """Whether the worker of ``slot`` holds more connections than another live worker."""
        if slot is None:
            return False
        mine = self._counts[slot]
        return any(_FREE < count < mine for count in self._counts)


class BalancedServer(StreamServer):
    """gevent's stream server, accepting one connection at a time and yielding new ones to
    less loaded workers (see the module's docstring)."""

    max_accept = 1

    def __init__(
        self,
        listener: Any,
        *,
        shares: ConnectionShares,
        slot: int | None,
        connections: Pool | None = None,
        make_room: Callable[[], bool] | None = None,
        **kwargs: Any,
    ) -> None:
        # The connections' pool is ours, not gevent's (gevent is given a plain spawn): this
        # server says when it is full (full) and accepts again when a connection ends.
        self.connections = connections
        self._waiting_for_a_slot = False
        spawn = "default" if connections is None else self._start_connection
        super().__init__(listener, spawn=spawn, **kwargs)
        self._shares = shares
        self._slot = slot
        self._make_room = make_room
        # Repeating, and stopped when it fires: a one-shot libev timer started again after it
        # fired fires at once, which would make the pause a busy loop.
        self._resume = self.loop.timer(YIELD_STEP_SECONDS, YIELD_STEP_SECONDS)
        self._room_retry = self.loop.timer(ROOM_RETRY_SECONDS, ROOM_RETRY_SECONDS)
        # Until when the connection waiting now is left to the others; None: none is.
        self._yield_until: float | None = None
        self._take_all_until = 0.0

    def _start_connection(self, handler: Callable[..., Any], *args: Any) -> Any:
        assert self.connections is not None
        connection = self.connections.spawn(handler, *args)
        connection.rawlink(self._connection_ended)
        return connection

    def _connection_ended(self, _connection: Any) -> None:
        if self._waiting_for_a_slot:
            # After every link of the ended greenlet ran: its slot in the pool is free then.
            self.loop.run_callback(self._accept_in_the_freed_slot)

    def _accept_in_the_freed_slot(self) -> None:
        if self._waiting_for_a_slot and self.started:
            self._waiting_for_a_slot = False
            self.start_accepting()

    def _leaves_it(self) -> bool:
        """Whether the connection waiting now is left to a less loaded worker for the moment
        (then looked at again in ``YIELD_STEP_SECONDS``)."""
        now = time.monotonic()
        if now >= self._take_all_until and self._shares.should_yield(self._slot):
            if self._yield_until is None:
                self._yield_until = now + YIELD_SECONDS
            if now < self._yield_until:
                self._resume.start(self._accept_again)
                return True
            self._take_all_until = now + TAKE_ALL_SECONDS
        self._yield_until = None
        return False

    def do_read(self) -> Any:
        if self._leaves_it():
            self.stop_accepting()
            return None
        accepted = super().do_read()
        if accepted:
            self._shares.opened(self._slot)
        return accepted

    def full(self) -> bool:
        """Whether the pool is full (gevent asks before each accept, and stops accepting while
        it is). When it is, and the waiting connection is not left to a less loaded worker (as
        :meth:`do_read` leaves it), a connection that waits on its client is closed and the
        waiting one is accepted in its place once its slot is free (:mod:`webhook.server.room`);
        when none waits on its client (all are being decided or answered), the worker looks
        again in ``ROOM_RETRY_SECONDS``."""
        if self.connections is None or not self.connections.full():
            return False
        if self._make_room is not None and not self._leaves_it() and not self._make_room():
            self.look_again()
        self._waiting_for_a_slot = True
        return True

    def look_again(self) -> None:
        """Look for room again in ``ROOM_RETRY_SECONDS`` (none could be made just now)."""
        if self.started:
            self._room_retry.start(self._accept_again)

    def do_close(self, *args: Any) -> None:
        # gevent calls this once for every accepted connection, when its handler returns or
        # raises, and when the handler could not even be started (a connection reset before
        # the TLS wrapper was made): the count cannot drift.
        try:
            super().do_close(*args)
        finally:
            self._shares.closed(self._slot)

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

    def _accept_again(self) -> None:
        self._resume.stop()
        self._room_retry.stop()
        if not self.started:
            return
        if not _select([self.socket], [], [], 0)[0]:
            self._yield_until = None  # another worker took it: the next one starts afresh
        self.start_accepting()

    def close(self) -> None:
        self._resume.stop()
        self._room_retry.stop()
        super().close()

    def serving(self) -> bool:
        """Whether a connection accepted by this server is still open."""
        return (
            self.connections is not None and self.connections.free_count() < self.connections.size
        )

    def stop(self, timeout: float | None = None) -> None:
        """Close, then give the connections ``timeout`` to end and kill the rest (what gevent
        does for a pool it was given)."""
        super().stop(timeout)
        if self.connections is not None:
            self.connections.join(timeout=timeout)
            self.connections.kill(block=True, timeout=1)
