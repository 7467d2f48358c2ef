"""The gunicorn worker: one greenlet per connection, each phase of a connection under its own
deadline, long decisions in a forked process.

Why this design
    The validating webhook fails closed: while the server does not answer, no Pod is created
    in any namespace it covers. A thread-per-connection worker (gunicorn's ``gthread``) does
    the TLS handshake and reads each request on a pool thread with a blocking socket, so a
    few dozen clients that connect and send nothing hold every thread, and the API server's
    requests queue behind them. Here a connection is a greenlet (gunicorn's gevent worker):
    a stalled client holds a file descriptor and a few kilobytes, never what a decision
    needs, and each phase it can stall in has a deadline after which the connection is
    closed: the TLS handshake, the first request's start, the request line and headers, the
    body (a floor plus time proportional to its announced size), writing the response, and
    the idle wait between keep-alive requests (longer than the API server's own 90 s idle
    timeout, so the API server is the one that closes an idle connection). A greenlet per
    connection is cheap because decisions are microseconds of CPU; a review big enough to
    take longer (``LONG_BODY_BYTES``) is decoded and decided in a forked copy of the worker
    (:mod:`webhook.server.child`), so the other connections go on being answered while it
    runs. Reads give the event loop a turn every few calls and the head is read in linear
    time (:mod:`webhook.server.connection`), so no client can keep the loop busy.

    Memory is bounded per worker: connections by ``max_connections`` (when a worker holds
    that many, a connection that waits on its client is closed to let a new one in:
    :mod:`webhook.server.room`); a head is at most ``HEAD_BYTES_LIMIT``; at most
    ``LARGE_BODIES_AT_ONCE`` bodies of ``LONG_BODY_BYTES`` or more are read at a time (others
    wait for a turn within their deadline, then get 503), and smaller bodies share
    ``SMALL_BODY_BUDGET`` bytes, charged as they arrive (one that gets no room before its
    deadline gets 408); a long decision's child has a capped memory. Chunked bodies, whose
    size is unknown until read, are refused with 411: the API server always sends a
    Content-Length.

What it overrides of gunicorn's ``GeventWorker``
    ``init_process`` (the body budgets), ``handle`` (one connection, phase by phase, every
    refusal as JSON), ``run`` (the accept loop, with a server that makes room:
    :mod:`webhook.server.room`) and ``handle_exit`` (SIGTERM: the drain, then no new
    connection; see :mod:`webhook.server.gunicorn`).
"""

from __future__ import annotations

import errno
import logging
import ssl
import time
from functools import partial
from typing import Any

import gevent
from gevent.event import Event
from gevent.lock import BoundedSemaphore
from gevent.pool import Pool
from gevent.select import select
from gevent.socket import wait_read
from gunicorn import http, util
from gunicorn.http.errors import (
    ConfigurationProblem,
    ExpectationFailed,
    ForbiddenProxyRequest,
    InvalidResponseHeader,
    InvalidResponseHeaderName,
    LimitRequestHeaders,
    LimitRequestLine,
    ParseException,
)
from gunicorn.sock import ssl_context
from gunicorn.workers.ggevent import GeventWorker

from webhook.server.connection import (
    ByteBudget,
    DeadlineBody,
    PacedSocket,
    PhaseExpired,
    body_size,
    deadline,
    give_turn,
    give_turn_if_due,
    write_json_error,
)
from webhook.server.logs import SERVER_LOGGER
from webhook.server.room import Evicted, RoomMakingServer, WaitingRoom, WatchedWrites
from webhook.server.settings import (
    GRACEFUL_TIMEOUT,
    LONG_BODY_BYTES,
    MAX_BODY_BYTES,
    Deadlines,
)

log = logging.getLogger(SERVER_LOGGER)

HEADERS_PHASE = "request line and headers"
FIRST_REQUEST_PHASE = "first request"
LARGE_BODIES_AT_ONCE = 3
SMALL_BODY_BUDGET = 32 * 1024 * 1024
# A connection accepted just before the worker was told to stop has this long to send its
# first request, which is then answered (with Connection: close) rather than dropped.
STOPPING_FIRST_REQUEST_SECONDS = 1.0
# The refusals of gunicorn's HTTP parser that are not a plain 400 (the statuses gunicorn
# itself gives them). Its refusal of a transfer coding it does not know is a 501 there: that
# is the client's doing, and a 5xx would count against this server, so it is a 400 here.
PARSER_REFUSALS: dict[type[Exception], tuple[int, str]] = {
    LimitRequestLine: (414, "URI Too Long"),
    LimitRequestHeaders: (431, "Request Header Fields Too Large"),
    ExpectationFailed: (417, "Expectation Failed"),
    ForbiddenProxyRequest: (403, "Forbidden"),
}


class AdmissionWorker(GeventWorker):
    """gunicorn's gevent worker with per-phase deadlines (see the module's docstring)."""

    # gunicorn's: False once the worker is told to stop (here also once the drain is over).
    alive: bool

    def init_process(self) -> None:
        self._large_bodies = BoundedSemaphore(LARGE_BODIES_AT_ONCE)
        self._small_bodies = ByteBudget(SMALL_BODY_BUDGET)
        self._waiting = WaitingRoom()
        # When the drain that SIGTERM began ends (time.monotonic()); None before SIGTERM.
        self._drain_ends: float | None = None
        self._signalled = Event()
        # Requests being served (read, decided or answered): when the drain begins, those
        # that began before it are answered with Connection: close too.
        self._in_flight: set[Any] = set()
        super().init_process()

    def handle_exit(self, sig: Any, frame: Any) -> None:
        """SIGTERM: answer not ready and close every connection after its answer for the
        drain; then :meth:`run` stops accepting. A second SIGTERM changes nothing."""
        if self._drain_ends is None:
            self._drain_ends = time.monotonic() + self.app.drain_seconds
            self.app.draining = True
            self._signalled.set()

    def run(self) -> None:
        """Accept and serve until the drain ends, then let open connections finish within
        the graceful timeout. gunicorn's loop, with servers that make room for a new
        connection when the worker is full (:mod:`webhook.server.room`)."""
        ssl_args = {"ssl_context": ssl_context(self.cfg)} if self.cfg.is_ssl else {}
        servers = []
        # The address each listener is bound to, for the requests' environ: read now, since a
        # connection accepted just before the stop is served after its listener is closed.
        self._listener_names = {id(listener): listener.getsockname() for listener in self.sockets}
        # One listener in practice (--bind takes one address); the cap is the worker's.
        for listener in self.sockets:
            listener.setblocking(1)
            server = RoomMakingServer(
                listener,
                handle=partial(self.handle, listener),
                connections=Pool(self.worker_connections),
                waiting=self._waiting,
                **ssl_args,
            )
            servers.append(server)
        for server in servers:
            server.start()
        log.info("accepting connections", extra={"fields": {"pid": self.pid}})
        reported = 0
        draining = False
        while self.alive and not self._drain_over():
            self.notify()
            self._signalled.wait(1.0 if self._drain_ends is None else self._drain_left(1.0))
            self._signalled.clear()
            if self._drain_ends is not None and not draining:
                draining = True
                for req in self._in_flight:
                    req.must_close = True
                log.info(
                    "SIGTERM received: not ready, draining",
                    extra={"fields": {"drain_seconds": self.app.drain_seconds}},
                )
            # One line a second at most, however fast a flood makes room be made.
            reported = self._report_room_made(reported)
        if draining:
            log.info("drain over: stopping gracefully")
        self.alive = False
        for server in servers:
            server.close()
        # What the last second made room for, now that no more can be made.
        self._report_room_made(reported)
        stop_at = time.monotonic() + GRACEFUL_TIMEOUT
        while (left := stop_at - time.monotonic()) > 0:
            if not any(server.serving() for server in servers):
                return
            self.notify()
            gevent.sleep(min(left, 1.0))
        log.warning("graceful timeout: closing the connections still open")
        for server in servers:
            server.stop(timeout=1)

    def _drain_left(self, at_most: float) -> float:
        assert self._drain_ends is not None
        return max(min(self._drain_ends - time.monotonic(), at_most), 0.0)

    def _drain_over(self) -> bool:
        return self._drain_ends is not None and self._drain_left(1.0) == 0.0

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        """Serve one connection: handshake, then requests until the client or a deadline
        ends it. Replaces gunicorn's loop, which has one keep-alive timeout for everything
        and none for the handshake, the body or the response."""
        # Waiting on the client from here until a request's head is read, and again from
        # the end of each answer: while it waits, it may be closed to make room for a new
        # connection (webhook.server.room), with Evicted, wherever it waits.
        connection, waiting = gevent.getcurrent(), self._waiting
        waiting.enter(connection, answered=False)
        try:
            self._converse(listener, client, addr, connection)
        except Evicted:
            log.debug("closed a connection waiting on its client, to make room for a new one")
        finally:
            waiting.ended(connection)
            util.close(client)

    def _report_room_made(self, reported: int) -> int:
        """Log and count the connections closed to make room since ``reported`` of them were;
        returns how many are reported now."""
        closed = self._waiting.evicted - reported
        if closed:
            log.info(
                "closed connections that waited on their clients, to make room for new ones",
                extra={
                    "fields": {"connections": closed, "max_connections": self.worker_connections}
                },
            )
            metrics = self.app.metrics
            if metrics is not None:
                metrics.connections_closed.inc(closed)
        return self._waiting.evicted

    def _converse(self, listener: Any, client: Any, addr: Any, connection: Any) -> None:
        deadlines: Deadlines = self.app.deadlines
        waiting = self._waiting
        req = None
        try:
            if isinstance(client, ssl.SSLSocket):
                with deadline("TLS handshake", deadlines.handshake):
                    client.do_handshake()
            # Every blocking send (and recv) of the connection gives up after this; gevent
            # counts it over a whole sendall.
            client.settimeout(deadlines.write)
            paced = PacedSocket(client)
            parser = http.get_parser(self.cfg, paced, addr)
            listener_name = self._listener_names[id(listener)]
            phase, wait = FIRST_REQUEST_PHASE, deadlines.headers
            writes = WatchedWrites(client, waiting, connection)
            while self._wait_for_request(client, paced, phase, wait, writes.answered):
                phase, wait = "idle", deadlines.idle
                req = None
                with deadline(HEADERS_PHASE, deadlines.headers):
                    if not paced.read_head():
                        return
                    req = next(parser)
                # The parser may read the body the request announces, and nothing past it.
                paced.deliver(body_size(req) or 0)
                waiting.leave(connection)
                if not self._serve(listener_name, req, writes, addr, deadlines):
                    return
                writes.answered = True
                waiting.enter(connection, answered=True)
                # Whatever the app left of the body is discarded now, under the headers'
                # deadline (over the whole drain: gunicorn's bounds each read); a body that
                # failed leaves the next request's start unknown.
                drained = False
                with gevent.Timeout(deadlines.headers, False):
                    drained = parser.finish_body(deadline=time.monotonic() + deadlines.headers)
                if not drained:
                    return
        except StopIteration:
            pass
        except PhaseExpired as expired:
            log.info(
                "closed a connection that stalled",
                extra={"fields": {"phase": expired.phase, "deadline_seconds": expired.seconds}},
            )
            if expired.phase == HEADERS_PHASE:  # a request had begun: it gets an answer
                self._refuse(client, 408, "Request Timeout", str(expired))
        except http.errors.NoMoreData:
            pass  # the client closed the connection between or inside requests
        except ssl.SSLError as exc:
            log.debug("TLS connection ended: %s", exc)
        except TimeoutError:
            # A send past the write deadline (gevent raises socket.timeout, a TimeoutError).
            log.info(
                "closed a connection that stalled",
                extra={"fields": {"phase": "response", "deadline_seconds": deadlines.write}},
            )
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, None):
                log.exception("socket error while serving a connection")
        except Exception as exc:  # the parser's refusals, and errors of this server
            self._answer_error(client, addr, exc)

    def _serve(
        self, listener_name: Any, req: Any, client: WatchedWrites, addr: Any, deadlines: Deadlines
    ) -> bool:
        """Serve one parsed request, its body within its deadline and the worker's body
        budgets; False when the connection must close."""
        connection = gevent.getcurrent()
        size = body_size(req)
        if size is None:
            self._refuse(
                client, 411, "Length Required", "a body needs a Content-Length (chunked: refused)"
            )
            return False
        seconds = deadlines.body(size)
        body_deadline = time.monotonic() + seconds
        # A body over the limit is refused unread: it takes no room. A large one takes a turn
        # before it is read; smaller ones are charged to the budget as their bytes arrive.
        large = LONG_BODY_BYTES <= size <= MAX_BODY_BYTES
        if large:
            # Its client has sent nothing of the body yet: it may be closed to make room.
            self._waiting.enter(connection, client.answered)
            try:
                turn = self._large_bodies.acquire(timeout=max(body_deadline - time.monotonic(), 0))
            finally:
                self._waiting.leave(connection)
            if not turn:
                self._refuse(client, 503, "Service Unavailable", "too many large request bodies")
                return False
        # What the app reads has the body's deadline (counted from the end of the headers,
        # the wait for room included); the parser, which discards an unread rest before the
        # next request, reads the body itself.
        if self.app.draining or not self.alive:
            # gunicorn's request attribute for "Connection: close" (set by its parser for a
            # client that asks for it): the answer says so and the connection ends after it,
            # so the client sends its next request elsewhere. Read when the answer's headers
            # are written: a request in flight when the drain begins gets it then (run).
            req.must_close = True
        self._in_flight.add(req)
        body = req.body
        charged = DeadlineBody(
            req,
            body_deadline,
            seconds,
            budget=None if large else self._small_bodies,
            waiting=self._waiting,
            answered=client.answered,
        )
        req.body = charged
        try:
            give_turn_if_due()
            self.handle_request(listener_name, req, client, addr)
            if self._waiting.told(connection):
                # Closed while it waited on its client (for its body, or for its answer to be
                # read); gunicorn's gevent worker ended the request quietly.
                raise Evicted()
        finally:
            self._in_flight.discard(req)
            req.body = body
            if large:
                self._large_bodies.release()
            self._small_bodies.release(charged.charged)
        return True

    def _answer_error(self, client: Any, addr: Any, exc: Exception) -> None:
        """A request the parser refused gets its 4xx; any other error is this server's, a
        logged 500. As JSON, like every refusal here."""
        if isinstance(exc, ParseException) and not isinstance(
            exc, (InvalidResponseHeader, InvalidResponseHeaderName, ConfigurationProblem)
        ):
            status, reason = next(
                (PARSER_REFUSALS[kind] for kind in type(exc).__mro__ if kind in PARSER_REFUSALS),
                (400, "Bad Request"),
            )
            peer = addr[0] if isinstance(addr, tuple) and addr else None
            log.info(
                "refused a malformed request",
                extra={"fields": {"status": status, "error": str(exc)[:200], "peer": peer}},
            )
            self._refuse(client, status, reason, str(exc))
        else:
            log.exception("error while serving a request")
            self._refuse(client, 500, "Internal Server Error", "")

    @staticmethod
    def _refuse(client: Any, status: int, reason: str, message: str) -> None:
        try:
            write_json_error(client, status, reason, message)
        except OSError:
            pass  # a client that does not read does not get it

    def _wait_for_request(
        self, client: Any, paced: PacedSocket, phase: str, seconds: float, answered: bool
    ) -> bool:
        """Wait until the next request starts, at most ``seconds``; False when the
        connection should close instead (idle too long, or the worker is stopping).
        :class:`PhaseExpired` when a new connection sends no first request in time. The
        connection is in the waiting room throughout; once the request starts, its wait
        starts afresh (a request's head is waited for from its start)."""
        connection = gevent.getcurrent()
        if paced.pending() or (isinstance(client, ssl.SSLSocket) and client.pending()):
            # Pipelined bytes are here already: serve them after the other connections had a
            # turn, or a client pipelining hundreds of requests would keep the loop to itself.
            # Waiting for its turn is not waiting on the client: it is not closed meanwhile.
            self._waiting.leave(connection)
            give_turn()
            self._waiting.enter(connection, answered)
            return True
        if not self.alive:
            return self._request_written_before_the_stop(client, phase)
        deadline_at = time.monotonic() + seconds
        # Checked every second: a stopping worker closes its idle connections at once
        # instead of waiting for them through its whole graceful timeout.
        while self.alive:
            remaining = deadline_at - time.monotonic()
            if remaining <= 0:
                if phase == FIRST_REQUEST_PHASE:
                    raise PhaseExpired(phase, seconds)
                log.debug("closing a connection idle for %g s", seconds)
                return False
            try:
                wait_read(client.fileno(), min(remaining, 1.0), TimeoutError)
            except TimeoutError:
                continue
            self._waiting.enter(connection, answered)
            return True
        return self._request_written_before_the_stop(client, phase)

    @staticmethod
    def _request_written_before_the_stop(client: Any, phase: str) -> bool:
        """Whether a stopping worker serves one more request on this connection: one already
        written is, and a connection accepted just before the stop may still send its first
        (its answer closes the connection); an idle keep-alive connection is closed."""
        grace = STOPPING_FIRST_REQUEST_SECONDS if phase == FIRST_REQUEST_PHASE else 0.0
        readable, _, _ = select([client.fileno()], [], [], grace)
        return bool(readable)
