"""A worker at its cap closes the connection that has waited on its client longest, and only
one that is still waiting (webhook.server.room): unit tests with real greenlets, then the real
server at a small cap."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator

import gevent
import gevent.socket
import pytest

from tests.serving import (
    Server,
    client_context,
    fixture_bytes,
    metric_value,
    post_json,
    request,
    tls_server,
    wait_until,
)
from webhook.server import room as room_module
from webhook.server.room import Evicted, WaitingRoom, WatchedWrites

GPU_POD = fixture_bytes("admission-review-gpu-pod.json")


def _connection(
    room: WaitingRoom, outcomes: dict[str, str], name: str, answered: bool = True
) -> gevent.Greenlet:
    """A connection that waits on its client (a long sleep) inside the room, in the line of
    connections ``answered`` before or of those never answered."""

    def converse() -> None:
        me = gevent.getcurrent()
        room.enter(me, answered)
        try:
            gevent.sleep(30)
            outcomes[name] = "served"
        except Evicted:
            outcomes[name] = "evicted"
        finally:
            room.leave(me)

    return gevent.spawn(converse)


@pytest.fixture
def room() -> Iterator[tuple[WaitingRoom, dict[str, str], dict[str, gevent.Greenlet]]]:
    waiting, outcomes = WaitingRoom(), {}
    connections = {name: _connection(waiting, outcomes, name) for name in "abc"}
    gevent.sleep(0)  # each starts and enters, in order
    yield waiting, outcomes, connections
    gevent.killall(list(connections.values()))


def test_the_connection_that_waited_longest_is_closed_first(room) -> None:
    waiting, outcomes, connections = room
    assert len(waiting) == 3
    assert waiting.make_room() is True
    gevent.sleep(0)  # the loop's turn: it is told
    assert outcomes == {"a": "evicted"}
    assert connections["a"].dead and not connections["b"].dead
    assert len(waiting) == 2
    assert waiting.make_room() is True
    gevent.sleep(0)
    assert outcomes == {"a": "evicted", "b": "evicted"}


def test_a_wait_that_starts_again_goes_to_the_back(room) -> None:
    waiting, outcomes, connections = room
    waiting.enter(connections["a"], answered=True)  # answered again: waits for its next request
    assert waiting.make_room() is True
    gevent.sleep(0)
    assert outcomes == {"b": "evicted"}


def test_a_connection_that_stops_waiting_before_it_is_told_is_spared(room) -> None:
    waiting, outcomes, connections = room
    looked_again: list[bool] = []
    waiting.on_spared = lambda: looked_again.append(True)
    assert waiting.make_room() is True  # a is chosen...
    waiting.leave(connections["a"])  # ...and its request arrives before the loop's turn
    gevent.sleep(0)
    # a is spared, and the server is asked to look for room again.
    assert not connections["a"].dead and outcomes == {}
    assert looked_again == [True] and waiting.evicted == 0
    assert waiting.make_room() is True
    gevent.sleep(0)
    assert outcomes == {"b": "evicted"} and waiting.evicted == 1


def test_connections_never_answered_go_first_once_past_their_grace(monkeypatch) -> None:
    monkeypatch.setattr(room_module, "FRESH_GRACE_SECONDS", 0.05)
    waiting, outcomes = WaitingRoom(), {}
    pooled = _connection(waiting, outcomes, "pooled", answered=True)
    gevent.sleep(0)
    fresh = _connection(waiting, outcomes, "fresh", answered=False)
    gevent.sleep(0)
    try:
        # Newer than its grace (a prompt client handshakes in milliseconds): the connection
        # answered before goes, though it has waited less long.
        assert waiting.make_room() is True
        gevent.sleep(0)
        assert outcomes == {"pooled": "evicted"}
        pooled = _connection(waiting, outcomes, "pooled again", answered=True)
        gevent.sleep(0.06)
        # Past its grace, the one never answered goes first.
        assert waiting.make_room() is True
        gevent.sleep(0)
        assert outcomes == {"pooled": "evicted", "fresh": "evicted"}
        # With none answered before, the youngest of the never-answered is not spared.
        young = _connection(waiting, outcomes, "young", answered=False)
        gevent.sleep(0)
        assert waiting.make_room() is True  # pooled again goes first...
        assert waiting.make_room() is True  # ...then the young one
        gevent.sleep(0)
        assert outcomes["young"] == "evicted" and outcomes["pooled again"] == "evicted"
    finally:
        gevent.killall([pooled, fresh, young])


def test_no_room_is_made_from_connections_that_are_not_waiting() -> None:
    waiting, outcomes = WaitingRoom(), {}
    assert waiting.make_room() is False
    busy = gevent.spawn(gevent.sleep, 30)  # deciding or answering: never in the room
    ended = _connection(waiting, outcomes, "ended")
    gevent.sleep(0)
    ended.kill()  # its handler ended (it left the room on the way out)
    assert len(waiting) == 0
    assert waiting.make_room() is False
    assert not busy.dead
    busy.kill()


def test_a_send_that_blocks_waits_on_the_client_and_one_that_does_not_never_does() -> None:
    waiting = WaitingRoom()
    ours, theirs = gevent.socket.socketpair()  # theirs never reads
    outcome: list[str] = []

    def answer() -> None:
        writes = WatchedWrites(ours, waiting, gevent.getcurrent())
        try:
            writes.sendall(b"x" * 100)  # fits the buffers: no wait
            assert len(waiting) == 0
            writes.sendall(b"x" * 50_000_000)  # blocks: the client does not read
            outcome.append("sent")
        except Evicted:
            outcome.append("evicted")

    try:
        sender = gevent.spawn(answer)
        gevent.sleep(0.05)
        assert len(waiting) == 1
        assert waiting.make_room() is True
        sender.join(timeout=5)
        assert outcome == ["evicted"] and waiting.told(sender)
        waiting.ended(sender)
        assert not waiting.told(sender)
        assert len(waiting) == 0
    finally:
        ours.close()
        theirs.close()


# --------------------------------------------------------------------------- real server

CAP = 12
# Far longer than the test: without room being made, the newcomer would wait this long.
LONG_DEADLINE = 60.0
PROMPT_SECONDS = 2.0


@pytest.fixture
def small_server(tmp_path) -> Iterator[Server]:
    env = {
        "GPU_ADMISSION_MAX_CONNECTIONS": str(CAP),
        "GPU_ADMISSION_HANDSHAKE_TIMEOUT": str(LONG_DEADLINE),
        "GPU_ADMISSION_HEADERS_TIMEOUT": str(LONG_DEADLINE),
        "GPU_ADMISSION_IDLE_TIMEOUT": str(LONG_DEADLINE),
        "GPU_ADMISSION_BODY_TIMEOUT": str(LONG_DEADLINE),
    }
    with tls_server(tmp_path, env) as running:
        yield running


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _open_count(server: Server) -> int:
    return sum(server.connections_per_worker().values())


def _timed_fresh_review(server: Server, kept: list | None = None) -> float:
    """The time a review takes on a new connection; the connection is closed, or appended to
    ``kept``."""
    started = time.monotonic()
    conn = server.connection(timeout=30)
    try:
        reply = post_json(conn, "/validate", GPU_POD)
        assert reply.status == 200, reply
        return time.monotonic() - started
    finally:
        if kept is None:
            conn.close()
        else:
            kept.append(conn)


def test_a_full_worker_closes_its_longest_waiting_idle_tcp_connection(small_server) -> None:
    """The cap is full of connections that sent nothing (handshake deadline: a minute); a new
    connection is answered at once, and the first of them is the one closed."""
    stalled = [socket.create_connection(("127.0.0.1", small_server.port)) for _ in range(CAP)]
    try:
        wait_until(lambda: _open_count(small_server) >= CAP, timeout=10, what="all accepted")
        assert _timed_fresh_review(small_server) < PROMPT_SECONDS
        assert _closed_by_server(stalled[0])
        # The others still wait: one newcomer made room for itself, and for no more.
        stalled[-1].settimeout(0.2)
        with pytest.raises(TimeoutError):
            stalled[-1].recv(1)
    finally:
        for sock in stalled:
            sock.close()
    # Counted in one line a second, whatever the rate (a flood chooses it).
    summary = wait_until(
        lambda: [
            r
            for r in small_server.log_records()
            if r.get("message")
            == "closed connections that waited on their clients, to make room for new ones"
        ],
        timeout=5,
        what="the worker's line on the connections it closed",
    )
    assert summary[0]["connections"] == 1 and summary[0]["max_connections"] == CAP
    assert not [r for r in small_server.log_records() if r.get("level") == "error"]
    # And counted where an alert can see it, with the line.
    wait_until(
        lambda: metric_value(small_server.metrics(), "gpu_admission_connections_closed_total") == 1,
        timeout=5,
        what="the metric of connections closed to make room",
    )


def test_idle_keep_alive_connections_cannot_hold_a_full_worker(small_server) -> None:
    """Connections that were answered once and then sit idle (the idle deadline: a minute)
    fill the cap; a new connection is answered at once, and the one idle longest is closed,
    while one that keeps being used stays open."""
    idle = []
    for _ in range(CAP - 1):
        conn = small_server.connection(timeout=30)
        assert request(conn, "GET", "/healthz").status == 200
        idle.append(conn)
    in_use = small_server.connection(timeout=30)
    newcomers: list = []  # kept open: the worker stays full
    try:
        assert post_json(in_use, "/validate", GPU_POD).status == 200
        for _ in range(3):
            assert _timed_fresh_review(small_server, newcomers) < PROMPT_SECONDS
            # Used between newcomers: its wait is always among the most recent.
            assert post_json(in_use, "/validate", GPU_POD).status == 200
        assert all(_closed_by_server(conn.sock) for conn in idle[:3])
        idle[3].sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            idle[3].sock.recv(1)
    finally:
        for conn in [*idle, in_use, *newcomers]:
            conn.close()


def _tls(server: Server, receive_buffer: int | None = None) -> ssl.SSLSocket:
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    raw.settimeout(30)
    raw.connect(("127.0.0.1", server.port))
    assert server.ca is not None
    return client_context(server.ca).wrap_socket(raw, server_hostname="127.0.0.1")


def _answer_status(sock: ssl.SSLSocket) -> bytes:
    """The status line of the next answer on ``sock``, read whole (head and body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError(f"closed before an answer: {data[:40]!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError("closed inside an answer's body")
        body += chunk
    return head.split(b"\r\n", 1)[0]


REVIEW_REQUEST = (
    b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n" % len(GPU_POD) + GPU_POD
)


def test_a_pooled_connection_sending_its_next_request_outlasts_stalled_ones(
    small_server,
) -> None:
    """The API server's pooled connection, answered before, starts its next request while the
    worker is full of connections that sent nothing: a newcomer closes one of those, never
    the request in progress."""
    pooled = _tls(small_server)
    stalled: list[socket.socket] = []
    try:
        pooled.sendall(REVIEW_REQUEST)
        assert _answer_status(pooled) == b"HTTP/1.1 200 OK"
        stalled = [
            socket.create_connection(("127.0.0.1", small_server.port)) for _ in range(CAP - 1)
        ]
        time.sleep(room_module.FRESH_GRACE_SECONDS + 0.2)
        pooled.sendall(REVIEW_REQUEST[:30])  # its next request begins
        time.sleep(0.2)
        assert _timed_fresh_review(small_server) < PROMPT_SECONDS
        pooled.sendall(REVIEW_REQUEST[30:])
        assert _answer_status(pooled) == b"HTTP/1.1 200 OK"
        assert _closed_by_server(stalled[0])
    finally:
        pooled.close()
        for sock in stalled:
            sock.close()


def test_clients_that_do_not_read_their_answers_cannot_hold_a_full_worker(small_server) -> None:
    """Connections that pipeline requests and never read (their answers block in the send)
    fill the cap; a newcomer is answered at once: a blocked send waits on the client."""
    readers = []
    try:
        for _ in range(CAP):
            reader = _tls(small_server, receive_buffer=1)
            reader.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
            readers.append(reader)
        time.sleep(1.0)  # their answers fill the buffers; the sends block
        assert _timed_fresh_review(small_server) < PROMPT_SECONDS
    finally:
        for reader in readers:
            reader.close()
    assert not [r for r in small_server.log_records() if r.get("level") == "error"]


def test_clients_that_stall_inside_their_bodies_cannot_hold_a_full_worker(small_server) -> None:
    """Connections that send a head and half a body, then nothing, fill the cap; a newcomer
    is answered at once and the first of them is closed, not left open without an answer."""
    stalled = []
    newcomers: list = []  # kept open: the worker stays full
    try:
        for _ in range(CAP):
            sock = _tls(small_server)
            sock.sendall(REVIEW_REQUEST[: len(REVIEW_REQUEST) - len(GPU_POD) // 2])
            stalled.append(sock)
        time.sleep(room_module.FRESH_GRACE_SECONDS + 0.2)
        for _ in range(3):
            assert _timed_fresh_review(small_server, newcomers) < PROMPT_SECONDS
        for sock in stalled[:3]:
            sock.settimeout(5)
            assert sock.recv(1) == b""  # closed, without an answer
    finally:
        for sock in stalled + newcomers:
            sock.close()
    assert not [r for r in small_server.log_records() if r.get("level") == "error"]
