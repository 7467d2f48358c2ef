"""The parts of a connection the worker reads and answers: each phase under a deadline, the
request head read in linear time and capped, the body under its own deadline and memory
budget, and gunicorn's refusals written as JSON.

A worker serves every connection from one thread (a greenlet each), so whatever a client
sends must cost the worker time in proportion to the bytes and never hold the thread: reads
give the event loop a turn every few calls, however fast a client sends (a client sending
one-byte TLS records would otherwise keep the loop busy and every deadline from firing).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import gevent
import orjson
from gevent.event import Event
from gunicorn import util
from gunicorn.http.errors import LimitRequestHeaders, NoMoreData

from webhook.server.room import WaitingRoom

T = TypeVar("T")

# The request line and headers together. The API server sends a few hundred bytes; a bearer
# token in its kubeconfig for webhooks adds a few kilobytes at most.
HEAD_BYTES_LIMIT = 16 * 1024
# Reads between two turns of the event loop. A turn is a short sleep, not sleep(0): gevent
# runs callbacks before it polls sockets, so sleep(0) alone can leave other connections
# unpolled for milliseconds.
READS_PER_TURN = 32
_TURN_SECONDS = 1e-6
# Before serving a request, the loop gets a turn if it had none for this long: a run of
# requests decided back to back (each up to a few tens of milliseconds) must not keep the
# deadlines' timers and gunicorn's heartbeat from running.
TURN_DUE_SECONDS = 0.005
# A request body is read (and charged to the worker's budget) this much at a time.
BODY_PIECE_BYTES = 8192
_last_turn = [0.0]


class PhaseExpired(Exception):
    """A connection spent longer in one phase than its deadline allows."""

    def __init__(self, phase: str, seconds: float) -> None:
        super().__init__(f"no complete {phase} within {seconds:g} s")
        self.phase = phase
        self.seconds = seconds


@contextmanager
def deadline(phase: str, seconds: float) -> Iterator[None]:
    """Raise :class:`PhaseExpired` in the block once ``seconds`` have passed."""
    with gevent.Timeout(seconds, PhaseExpired(phase, seconds)):
        yield


def give_turn() -> None:
    """Let the event loop poll and serve the other connections."""
    gevent.sleep(_TURN_SECONDS)
    _last_turn[0] = time.monotonic()


def give_turn_if_due() -> None:
    """A turn for the event loop if it had none for ``TURN_DUE_SECONDS``."""
    if time.monotonic() - _last_turn[0] >= TURN_DUE_SECONDS:
        give_turn()


class PacedSocket:
    """A connection as gunicorn's parser reads it: every ``READS_PER_TURN`` reads the event
    loop gets a turn, and with it any expired deadline fires.

    It hands the parser one request at a time and nothing more: the head found by
    :meth:`read_head`, then the body announced (:meth:`deliver`). What the client sent beyond
    (the next, pipelined request) stays here, where :meth:`pending` sees it; the parser's own
    buffer never holds it.
    """

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._reads = 0
        self._buffer = bytearray()  # read from the client, not yet handed to the parser
        self._deliverable = 0  # bytes of the current request the parser may still read

    def recv(self, size: int) -> bytes:
        size = min(size, self._deliverable)
        if size <= 0:
            return b""
        if self._buffer:
            data = bytes(self._buffer[:size])
            del self._buffer[:size]
        else:
            data = self._read(size)
        self._deliverable -= len(data)
        return data

    def _read(self, size: int) -> bytes:
        self._reads += 1
        if self._reads % READS_PER_TURN == 0:
            give_turn()
        data: bytes = self._sock.recv(size)
        return data

    def pending(self) -> bool:
        """Whether the client sent bytes the parser has not been given (a pipelined request)."""
        return bool(self._buffer)

    def deliver(self, body_bytes: int) -> None:
        """Let the parser read the current request's body, ``body_bytes`` long."""
        self._deliverable += body_bytes

    def read_head(self) -> bool:
        """Read until the end of the request head (the blank line after the headers) and let
        the parser read the head, and no more. False when the client closed the connection
        before a byte of it.

        gunicorn's parser copies and searches its whole buffer after every read, which is
        quadratic in the number of reads; here each read's bytes are searched once.
        Raises :class:`LimitRequestHeaders` past ``HEAD_BYTES_LIMIT`` and ``NoMoreData`` when
        the client closes the connection mid-head.
        """
        head = self._buffer
        searched = 0
        while True:
            # The end of a head; a bare-LF one is handed to the parser too, which refuses it.
            end, blank_line = head.find(b"\r\n\r\n", max(searched - 3, 0)), 4
            if end < 0:
                end, blank_line = head.find(b"\n\n", max(searched - 1, 0)), 2
            if 0 <= end <= HEAD_BYTES_LIMIT:
                self._deliverable = end + blank_line
                return True
            if len(head) > HEAD_BYTES_LIMIT:
                raise LimitRequestHeaders(
                    f"request line and headers exceed {HEAD_BYTES_LIMIT} bytes"
                )
            searched = len(head)
            chunk = self._read(8192)
            if not chunk:
                if head:
                    raise NoMoreData(bytes(head))
                return False
            head += chunk

    def gettimeout(self) -> float | None:
        timeout: float | None = self._sock.gettimeout()
        return timeout

    def settimeout(self, seconds: float | None) -> None:
        self._sock.settimeout(seconds)


def body_size(req: Any) -> int | None:
    """The size a request announces for its body; None for a chunked body, whose size is
    known only once read. gunicorn's parser has checked the headers already (one length at
    most, digits only); a request with neither header has no body."""
    for name, value in req.headers:
        if name == "CONTENT-LENGTH":
            return int(value)
        if name == "TRANSFER-ENCODING":
            return None
    return 0


class DeadlineBody:
    """A request body (``wsgi.input``) that must be read before a deadline (``time.monotonic``),
    charged to a ``budget`` of bytes as it arrives (the bytes a client announces cost nothing
    until it sends them). While a read waits, the connection is in the worker's ``waiting``
    room (:mod:`webhook.server.room`).

    Past the deadline, or when the budget has no room for the next piece before it, reading
    raises :class:`TimeoutError`, which the app answers with 408, and the request is marked so
    that the connection closes after that answer. ``charged`` is what the caller releases.
    """

    def __init__(
        self,
        req: Any,
        deadline_at: float,
        seconds: float,
        budget: ByteBudget | None = None,
        waiting: WaitingRoom | None = None,
        answered: bool = False,
    ) -> None:
        self._req = req
        self._body = req.body
        self._seconds = seconds
        self._deadline = deadline_at
        self._budget = budget
        self._waiting = waiting
        self._answered = answered
        self.charged = 0

    def _within(self, read: Callable[[], T]) -> T:
        remaining = self._deadline - time.monotonic()
        expired = TimeoutError(f"the request body did not arrive within {self._seconds:g} s")
        # While it reads, the connection waits on its client: it may be closed to make room.
        connection = gevent.getcurrent()
        if self._waiting is not None:
            self._waiting.enter(connection, self._answered)
        try:
            if remaining <= 0:
                raise expired
            with gevent.Timeout(remaining, expired):
                return read()
        except TimeoutError:
            self._req.must_close = True
            raise
        finally:
            if self._waiting is not None:
                self._waiting.leave(connection)

    def _charge(self, data: bytes) -> bytes:
        if self._budget is not None and data:
            # Waiting for room in the budget is the worker's wait, not the client's.
            connection = gevent.getcurrent()
            if self._waiting is not None:
                self._waiting.leave(connection)
            acquired = self._budget.acquire(len(data), self._deadline)
            if self._waiting is not None:
                self._waiting.enter(connection, self._answered)
            if not acquired:
                raise TimeoutError(
                    f"the request body got no room within {self._seconds:g} s: the worker "
                    "holds as many request bodies as it may"
                )
            self.charged += len(data)
        return data

    def _read_pieces(self, size: int | None) -> bytes:
        pieces = []
        wanted = -1 if size is None or size < 0 else size
        while wanted != 0:
            piece = self._body.read(
                BODY_PIECE_BYTES if wanted < 0 else min(wanted, BODY_PIECE_BYTES)
            )
            if not piece:
                break
            pieces.append(self._charge(piece))
            if wanted > 0:
                wanted -= len(piece)
        return b"".join(pieces)

    def read(self, size: int | None = None) -> bytes:
        return self._within(lambda: self._read_pieces(size))

    def readline(self, size: int | None = None) -> bytes:
        return self._within(lambda: self._charge(self._body.readline(size)))

    def readlines(self, size: int | None = None) -> list[bytes]:
        return self._within(lambda: [self._charge(line) for line in self._body.readlines(size)])

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line


class ByteBudget:
    """Bytes of request bodies a worker holds at once: a body waits for room until its
    deadline. A body larger than the whole budget waits for all of it."""

    def __init__(self, total: int) -> None:
        self._total = total
        self._free = total
        self._released = Event()

    def acquire(self, size: int, deadline_at: float) -> bool:
        """Take ``size`` bytes (at most the total), waiting until ``deadline_at`` at most."""
        size = min(size, self._total)
        while self._free < size:
            remaining = deadline_at - time.monotonic()
            if remaining <= 0:
                return False
            self._released.clear()
            self._released.wait(remaining)
        self._free -= size
        return True

    def release(self, size: int) -> None:
        self._free += min(size, self._total)
        self._released.set()


def write_json_error(sock: Any, status: int, reason: str, message: str) -> None:
    """An error answer with a JSON body, which closes the connection: every refusal of this
    server is ``application/json``, the ones gunicorn's HTTP parser makes too
    (request-smuggling shapes, oversized headers, bad request lines)."""
    body = orjson.dumps({"error": f"{status} {reason}: {message}"})
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)
