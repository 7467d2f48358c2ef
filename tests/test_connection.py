"""The worker's connection parts on their own: the head reader, the paced socket, the body
budget. gevent's hub runs in the test's thread; nothing here is monkey-patched."""

from __future__ import annotations

import time

import gevent
import pytest
from gunicorn.http.errors import LimitRequestHeaders, NoMoreData
from gunicorn.http.unreader import SocketUnreader

from webhook.server import connection
from webhook.server.connection import (
    HEAD_BYTES_LIMIT,
    READS_PER_TURN,
    ByteBudget,
    PacedSocket,
    PhaseExpired,
    deadline,
)


class PiecesSocket:
    """A socket that hands out the given pieces, one per recv, then end of stream (or, with
    ``endless``, the last piece forever)."""

    def __init__(self, pieces: list[bytes], endless: bool = False) -> None:
        self.pieces = list(pieces)
        self.endless = endless
        self.reads = 0

    def recv(self, size: int) -> bytes:
        self.reads += 1
        if self.endless and len(self.pieces) == 1:
            return self.pieces[0]
        return self.pieces.pop(0) if self.pieces else b""


def reader_over(pieces: list[bytes], endless: bool = False) -> tuple[SocketUnreader, PacedSocket]:
    source = PiecesSocket(pieces, endless)
    paced = PacedSocket(source)
    return SocketUnreader(paced), paced


REQUEST = b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


def test_a_head_in_one_byte_pieces_is_read_whole_and_handed_to_the_parser() -> None:
    unreader, paced = reader_over([bytes([b]) for b in REQUEST])
    assert paced.read_head()
    # It stopped at the blank line: the body's bytes are still to come from the socket.
    assert unreader.read() == REQUEST[: REQUEST.index(b"\r\n\r\n") + 4]
    paced.deliver(2)
    assert unreader.read() == b"{"


def test_pipelined_bytes_stay_out_of_the_parser_until_their_turn() -> None:
    unreader, paced = reader_over([REQUEST + REQUEST])
    head = REQUEST[: REQUEST.index(b"\r\n\r\n") + 4]
    assert paced.read_head()
    assert unreader.read() == head  # the first request's head, nothing past it
    paced.deliver(2)
    assert unreader.read() == b"{}"
    assert paced.pending()  # the second request waits here
    assert paced.read_head()  # from what was read already: nothing lost
    assert unreader.read() == head
    assert paced._sock.reads == 1


def test_a_head_over_the_limit_is_refused_before_more_is_read() -> None:
    filler = b"X-Filler: " + b"a" * 1000 + b"\r\n"
    _, paced = reader_over([b"GET / HTTP/1.1\r\n"] + [filler] * 100)
    with pytest.raises(LimitRequestHeaders, match=str(HEAD_BYTES_LIMIT)):
        paced.read_head()
    assert paced._sock.reads <= HEAD_BYTES_LIMIT // len(filler) + 3


def test_a_head_ending_exactly_at_the_limit_is_accepted() -> None:
    start = b"GET / HTTP/1.1\r\nX-Filler: "
    head = start + b"a" * (HEAD_BYTES_LIMIT - len(start) - 4) + b"\r\n\r\n"
    assert len(head) == HEAD_BYTES_LIMIT
    _, paced = reader_over([head])
    assert paced.read_head()


def test_a_bare_lf_head_is_handed_to_the_parser_which_refuses_it() -> None:
    unreader, paced = reader_over([b"GET / HTTP/1.1\nHost: x\n\n"])
    assert paced.read_head()
    assert unreader.read() == b"GET / HTTP/1.1\nHost: x\n\n"


def test_a_connection_closed_before_a_byte_is_no_request_and_mid_head_is_no_more_data() -> None:
    _, paced = reader_over([])
    assert paced.read_head() is False
    _, paced = reader_over([b"GET / HTTP/1.1\r\nHo"])
    with pytest.raises(NoMoreData):
        paced.read_head()


def test_the_paced_socket_gives_the_event_loop_a_turn_every_few_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    turns = []
    monkeypatch.setattr(connection, "give_turn", lambda: turns.append(1))
    paced = PacedSocket(PiecesSocket([b"x"], endless=True))
    paced.deliver(READS_PER_TURN * 5)  # a body that long
    for _ in range(READS_PER_TURN * 5):
        paced.recv(1)
    assert len(turns) == 5


def test_a_deadline_fires_however_fast_a_client_sends() -> None:
    # A socket that always has a byte ready never blocks: without the paced turns, the
    # deadline's timer would never get to run.
    paced = PacedSocket(PiecesSocket([b"x"], endless=True))
    paced.deliver(10**12)  # an endless body
    started = time.monotonic()
    with pytest.raises(PhaseExpired), deadline("request body", 0.05):
        while True:
            paced.recv(1)
    assert time.monotonic() - started < 1.0


def test_the_byte_budget_makes_bodies_wait_for_room_until_their_deadline() -> None:
    budget = ByteBudget(100)
    assert budget.acquire(60, time.monotonic() + 1)
    assert budget.acquire(40, time.monotonic() + 1)
    started = time.monotonic()
    assert budget.acquire(10, time.monotonic() + 0.05) is False  # full: waits, then gives up
    assert 0.04 <= time.monotonic() - started < 1.0

    waiter = gevent.spawn(budget.acquire, 50, time.monotonic() + 5)
    gevent.sleep(0.01)
    assert not waiter.ready()
    budget.release(60)  # room for the waiter
    assert waiter.get(timeout=1) is True
    # A body larger than the whole budget waits for all of it, and gets it.
    budget.release(40)
    budget.release(50)
    assert budget.acquire(10**9, time.monotonic() + 1)
