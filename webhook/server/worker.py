"""The gunicorn worker: one greenlet per connection, each phase of a connection under its own
deadline, long decisions on a thread of their own.

Why this design
    The validating webhook fails closed: while the server does not answer, no Pod is created
    in any namespace it covers. A thread-per-connection worker (gunicorn's ``gthread``) does
    the TLS handshake and reads each request on a pool thread with a blocking socket, so a
    few dozen clients that connect and send nothing hold every thread, and the API server's
    requests queue behind them. Here a connection is a greenlet (gunicorn's gevent worker):
    a stalled client holds a file descriptor and a few kilobytes, never what a decision
    needs, and each phase it can stall in has a deadline after which the connection is
    closed: the TLS handshake, the request line and headers, the body (a floor plus time
    proportional to its announced size), and the idle wait between keep-alive requests
    (longer than the API server's own 90 s idle timeout, so the API server is the one that
    closes an idle connection). A greenlet per connection is cheap because decisions are
    microseconds of CPU; a review big enough to take longer (``LONG_BODY_BYTES``) is decoded
    and decided in a forked copy of the worker (:func:`run_in_child`), so the other
    connections go on being answered while it runs. Memory is bounded the same way: a worker
    reads at most ``LARGE_BODIES_AT_ONCE`` such bodies at a time (a client sending many 7 MiB
    bodies slowly would otherwise have them all buffered), the others wait for a turn within
    their body deadline and are answered 503 past it; small reviews never wait.

What it overrides of gunicorn's ``GeventWorker``
    ``init_process`` (JSON error pages) and ``handle`` (one connection, phase by phase). A
    test fails when an upgrade of gunicorn moves what these rely on.
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import pickle
import signal
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import gevent
import orjson
from gevent.lock import BoundedSemaphore
from gevent.os import make_nonblocking, nb_read
from gevent.socket import wait_read
from gunicorn import http, util
from gunicorn.workers.ggevent import GeventWorker

from webhook.server.logs import SERVER_LOGGER
from webhook.server.settings import LONG_BODY_BYTES, Deadlines

log = logging.getLogger(SERVER_LOGGER)

T = TypeVar("T")


HEADERS_PHASE = "request line and headers"
LARGE_BODIES_AT_ONCE = 4


class PhaseExpired(Exception):
    """A connection spent longer in one phase than its deadline allows."""

    def __init__(self, phase: str, seconds: float) -> None:
        super().__init__(f"no complete {phase} within {seconds:g} s")
        self.phase = phase
        self.seconds = seconds


@contextmanager
def _deadline(phase: str, seconds: float) -> Iterator[None]:
    with gevent.Timeout(seconds, PhaseExpired(phase, seconds)):
        yield


def _body_size(req: Any) -> int | None:
    """The size a request announces for its body; None when it is known only once read (a
    chunked body, or a POST without a length, read until the connection closes). gunicorn's
    parser has checked the headers already: one length at most, digits only."""
    for name, value in req.headers:
        if name == "CONTENT-LENGTH":
            return int(value)
        if name == "TRANSFER-ENCODING":
            return None
    return 0 if req.method in ("GET", "HEAD") else None


class DeadlineBody:
    """A request body (``wsgi.input``) that must be read before a deadline.

    Past it, reading raises :class:`TimeoutError`, which the app answers with 408, and the
    request is marked so that the connection closes after that answer.
    """

    def __init__(self, req: Any, seconds: float) -> None:
        self._req = req
        self._body = req.body
        self._seconds = seconds
        self._deadline = time.monotonic() + seconds

    def _within(self, read: Callable[[], T]) -> T:
        remaining = self._deadline - time.monotonic()
        expired = TimeoutError(f"the request body did not arrive within {self._seconds:g} s")
        try:
            if remaining <= 0:
                raise expired
            with gevent.Timeout(remaining, expired):
                return read()
        except TimeoutError:
            self._req.must_close = True
            raise

    def read(self, size: int | None = None) -> bytes:
        return self._within(lambda: self._body.read(size))

    def readline(self, size: int | None = None) -> bytes:
        return self._within(lambda: self._body.readline(size))

    def readlines(self, size: int | None = None) -> list[bytes]:
        return self._within(lambda: self._body.readlines(size))

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line


def write_json_error(sock: Any, status: int, reason: str, message: str) -> None:
    """gunicorn's ``util.write_error`` with a JSON body: every refusal of this server is
    ``application/json``, the ones gunicorn's HTTP parser makes too (request-smuggling shapes,
    oversized headers, bad request lines). gunicorn answers a transfer coding it does not know
    with 501; that is the client's doing, and a 5xx would count against this server, so it
    is a 400 here."""
    if status == 501:
        status, reason = 400, "Bad Request"
    body = orjson.dumps({"error": f"{status} {reason}: {message}"})
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


def run_in_child(work: Callable[[], T]) -> T:
    """Run ``work`` in a forked copy of this worker and return its (pickled) result or raise
    its (pickled) exception; this greenlet waits, the others run.

    A thread would not do: decoding a 3 MiB body is one call that holds the GIL for tens of
    milliseconds, and a thread deciding in Python takes the GIL back at every switch, so the
    event loop's other connections would wait. The fork costs about a millisecond and copies
    nothing: the child has the body and the policy in force already. At most
    ``LONG_DECISIONS_AT_ONCE`` run at a time per worker; a child that outlives
    ``LONG_DECISION_SECONDS`` (the API server has given up by then) is killed.
    """
    with _long_decision_slots():
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: decide, write, exit without running any of the worker
            try:
                # It lives for one decision: collecting its garbage is wasted time (a third
                # of the decision for a 6 MiB review), the exit frees it all.
                gc.disable()
                os.close(read_end)
                _write_all(write_end, _pickled_result(work))
            finally:
                os._exit(0)
        os.close(write_end)
        try:
            data = _read_all(read_end, LONG_DECISION_SECONDS)
        finally:
            os.close(read_end)
            _reap(pid)
    if not data:
        raise ChildDecisionLost("the process deciding a long review ended without an answer")
    status, value = pickle.loads(data)
    if status == "raised":
        raise value
    return value


class ChildDecisionLost(Exception):
    """The forked process of a long decision died or ran out of time."""


LONG_DECISIONS_AT_ONCE = 2
LONG_DECISION_SECONDS = 30.0
_slots: list[BoundedSemaphore] = []


def _long_decision_slots() -> BoundedSemaphore:
    # Made on first use, in the worker process, after gevent's hub exists there.
    if not _slots:
        _slots.append(BoundedSemaphore(LONG_DECISIONS_AT_ONCE))
    return _slots[0]


def _pickled_result(work: Callable[[], Any]) -> bytes:
    try:
        return pickle.dumps(("returned", work()))
    except Exception as exc:
        try:
            return pickle.dumps(("raised", exc))
        except Exception:
            return pickle.dumps(("raised", ChildDecisionLost(type(exc).__name__)))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_all(fd: int, seconds: float) -> bytes:
    make_nonblocking(fd)
    chunks = []
    with gevent.Timeout(seconds, False):
        while chunk := nb_read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    return b""


def _reap(pid: int) -> None:
    """Collect the child; one still running (out of time) is killed first."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # collected already (gevent's child watcher)


class AdmissionWorker(GeventWorker):
    """gunicorn's gevent worker with per-phase deadlines (see the module's docstring)."""

    def init_process(self) -> None:
        # gunicorn's Worker.handle_error writes the HTTP errors its parser detects through
        # util.write_error, as HTML; in this worker process they are written as JSON.
        util.write_error = write_json_error
        self._large_bodies = BoundedSemaphore(LARGE_BODIES_AT_ONCE)
        super().init_process()

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        """Serve one connection: handshake, then requests until the client or a deadline
        ends it. Replaces gunicorn's loop, which has one keep-alive timeout for everything
        and none for the handshake or the body."""
        deadlines: Deadlines = self.app.deadlines
        req = None
        try:
            if isinstance(client, ssl.SSLSocket):
                with _deadline("TLS handshake", deadlines.handshake):
                    client.do_handshake()
            parser = http.get_parser(self.cfg, client, addr)
            listener_name = listener.getsockname()
            while self._wait_for_request(client, parser, deadlines.idle):
                req = None
                with _deadline(HEADERS_PHASE, deadlines.headers):
                    req = next(parser)
                size = _body_size(req)
                body_seconds = deadlines.body(size)
                large = size is None or size >= LONG_BODY_BYTES
                if large and not self._large_bodies.acquire(timeout=body_seconds):
                    write_json_error(
                        client, 503, "Service Unavailable", "too many large requests at once"
                    )
                    return
                # What the app reads has the body's deadline; the parser, which discards an
                # unread rest before the next request, reads the body itself, under the
                # headers' deadline.
                body = req.body
                req.body = DeadlineBody(req, body_seconds)
                try:
                    self.handle_request(listener_name, req, client, addr)
                finally:
                    req.body = body
                    if large:
                        self._large_bodies.release()
                # Whatever the app left of the body is discarded now, under the headers'
                # deadline; a body that failed (a malformed chunk) leaves the next request's
                # start unknown, and the connection closes.
                if not parser.finish_body(deadline=time.monotonic() + deadlines.headers):
                    return
        except StopIteration:
            pass
        except PhaseExpired as expired:
            log.info(
                "closed a connection that stalled",
                extra={"fields": {"phase": expired.phase, "deadline_seconds": expired.seconds}},
            )
            if expired.phase == HEADERS_PHASE:  # a request had begun: it gets an answer
                try:
                    write_json_error(client, 408, "Request Timeout", str(expired))
                except OSError:
                    pass  # a client that does not read does not get it
        except http.errors.NoMoreData:
            pass  # the client closed the connection between or inside requests
        except ssl.SSLError as exc:
            if exc.args[0] != ssl.SSL_ERROR_EOF and req is not None:
                self.handle_error(req, client, addr, exc)
            else:
                log.debug("TLS connection ended: %s", exc)
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, None):
                log.exception("socket error while serving a connection")
        except Exception as exc:  # the parser's refusals: answered as JSON by handle_error
            self.handle_error(req, client, addr, exc)
        finally:
            util.close(client)

    def _wait_for_request(self, client: Any, parser: Any, idle: float) -> bool:
        """Wait until the next request starts, at most ``idle`` seconds; False when the
        connection should close instead (idle too long, or the worker is stopping)."""
        if parser.unreader.buf.tell() or (isinstance(client, ssl.SSLSocket) and client.pending()):
            return True  # pipelined bytes are here already
        deadline = time.monotonic() + idle
        # Checked every second: a stopping worker closes its idle connections at once
        # instead of waiting for them through its whole graceful timeout.
        while self.alive:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.debug("closing a connection idle for %g s", idle)
                return False
            try:
                wait_read(client.fileno(), min(remaining, 1.0), TimeoutError)
                return True
            except TimeoutError:
                continue
        return False
