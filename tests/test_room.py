"""A worker at its cap closes the connection that has waited on its client longest, and only
one that is still waiting (webhook.server.room): unit tests with real greenlets, then the real
server at a small cap."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import gevent
import pytest

from tests.serving import (
    TEST_POLICY,
    Server,
    fixture_bytes,
    make_certificates,
    post_json,
    request,
    wait_until,
)
from webhook.server.room import Evicted, WaitingRoom

GPU_POD = fixture_bytes("admission-review-gpu-pod.json")


def _connection(room: WaitingRoom, outcomes: dict[str, str], name: str) -> gevent.Greenlet:
    """A connection that waits on its client (a long sleep) inside the room."""

    def converse() -> None:
        me = gevent.getcurrent()
        room.enter(me)
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
    waiting.enter(connections["a"])  # a was answered and waits for its next request
    assert waiting.make_room() is True
    gevent.sleep(0)
    assert outcomes == {"b": "evicted"}


def test_a_connection_that_stops_waiting_before_it_is_told_is_spared(room) -> None:
    waiting, outcomes, connections = room
    assert waiting.make_room() is True  # a is chosen...
    waiting.leave(connections["a"])  # ...and its request arrives before the loop's turn
    gevent.sleep(0)
    assert outcomes == {} and not connections["a"].dead
    # The next room is made from the others; a, not waiting now, is never chosen.
    assert waiting.make_room() is True
    gevent.sleep(0)
    assert outcomes == {"b": "evicted"}


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


# --------------------------------------------------------------------------- real server

CAP = 12
# Far longer than the test: without room being made, the newcomer would wait this long.
LONG_DEADLINE = 60.0
PROMPT_SECONDS = 2.0


@pytest.fixture
def small_server(tmp_path) -> Iterator[Server]:
    pki = make_certificates(tmp_path / "pki")
    policy = tmp_path / "policy.yaml"
    policy.write_text(TEST_POLICY)
    env = {
        "GPU_ADMISSION_MAX_CONNECTIONS": str(CAP),
        "GPU_ADMISSION_HANDSHAKE_TIMEOUT": str(LONG_DEADLINE),
        "GPU_ADMISSION_HEADERS_TIMEOUT": str(LONG_DEADLINE),
        "GPU_ADMISSION_IDLE_TIMEOUT": str(LONG_DEADLINE),
    }
    with Server(
        policy=policy,
        cert=pki.tls_cert,
        key=pki.tls_key,
        ca=pki.ca_cert,
        log_path=tmp_path / "server.log",
        workers=1,
        env=env,
    ) as running:
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
    records = small_server.log_records()
    assert any(
        r.get("message") == "closed the connection that waited longest, to make room for a new one"
        and r.get("max_connections") == CAP
        for r in records
    )
    assert not [r for r in records if r.get("level") == "error"]


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
