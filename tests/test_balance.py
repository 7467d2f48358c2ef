"""Sharing connections out between workers (webhook.server.balance), in one process: two
balancing servers on one listening socket stand for two workers. gevent's hub runs in the
test's thread; nothing here is monkey-patched."""

from __future__ import annotations

import errno
import socket
import ssl
import struct
import time

import gevent
import gevent.event
import gevent.socket
import pytest
from gevent.pool import Pool

from tests.serving import make_certificates
from webhook.server.balance import (
    TAKE_ALL_SECONDS,
    YIELD_SECONDS,
    YIELD_STEP_SECONDS,
    BalancedServer,
    ConnectionShares,
)


class Worker:
    """A balancing server on a shared listener, recording when it handled each connection;
    ``keep_open``: it holds them (counted) as keep-alive connections, instead of closing."""

    def __init__(
        self,
        listener: gevent.socket.socket,
        shares: ConnectionShares,
        slot: int | None,
        *,
        keep_open: bool = False,
        **server_options: object,
    ) -> None:
        self.handled: list[float] = []
        self.held: list[gevent.socket.socket] = []
        self.slot = slot
        self.shares = shares
        self.keep_open = keep_open
        self.done = gevent.event.Event()
        self.handlers: list[gevent.Greenlet] = []
        self.rooms_made = 0
        self.server = BalancedServer(
            listener,
            shares=shares,
            slot=slot,
            handle=self._handle,
            make_room=self._make_room,
            **server_options,
        )
        self.reads = 0
        counted_read = self.server.do_read

        def do_read() -> object:
            self.reads += 1
            return counted_read()

        self.server.do_read = do_read
        shares.join(slot)

    def _make_room(self) -> bool:
        """Ends the oldest handler still running, as the worker's waiting room does."""
        self.rooms_made += 1
        running = [handler for handler in self.handlers if not handler.dead]
        if running:
            running[0].kill(block=False)
        return bool(running)

    def _handle(self, client: gevent.socket.socket, _addr: object) -> None:
        self.handlers.append(gevent.getcurrent())
        self.handled.append(time.monotonic())
        if self.keep_open:
            # A keep-alive connection: its handler runs until the client goes.
            self.held.append(client)
            self.done.wait()


@pytest.fixture
def listener():
    sock = gevent.socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield sock
    sock.close()


def connect(listener: gevent.socket.socket) -> float:
    """Open (and leave to the server to close) one connection; when it was opened."""
    client = gevent.socket.create_connection(listener.getsockname(), timeout=5)
    opened = time.monotonic()
    gevent.spawn_later(2, client.close)
    return opened


def wait_handled(workers: list[Worker], count: int) -> None:
    with gevent.Timeout(5):
        while sum(len(w.handled) for w in workers) < count:
            gevent.sleep(0.001)


def test_a_busier_worker_leaves_a_new_connection_to_a_less_busy_one(listener) -> None:
    shares = ConnectionShares(4)
    busy = Worker(listener, shares, shares.claim(set()))
    idle = Worker(listener, shares, shares.claim({busy.slot}))
    for _ in range(3):
        shares.opened(busy.slot)  # three long-lived connections
    # The busy worker's server starts first, so gevent would run its watcher first.
    busy.server.start()
    idle.server.start()
    try:
        for _ in range(5):
            connect(listener)
            wait_handled([busy, idle], len(busy.handled) + len(idle.handled) + 1)
        assert (len(busy.handled), len(idle.handled)) == (0, 5)
    finally:
        busy.server.close()
        idle.server.close()


def test_connections_opened_at_once_are_split_evenly(listener) -> None:
    shares = ConnectionShares(4)
    first = Worker(listener, shares, shares.claim(set()), keep_open=True)
    second = Worker(listener, shares, shares.claim({first.slot}), keep_open=True)
    first.server.start()
    second.server.start()
    clients = []
    try:
        clients = [gevent.socket.create_connection(listener.getsockname()) for _ in range(8)]
        wait_handled([first, second], 8)
        assert sorted([len(first.held), len(second.held)]) == [4, 4]
        assert sorted([shares.count(first.slot), shares.count(second.slot)]) == [4, 4]
    finally:
        first.server.close()
        second.server.close()
        first.done.set()
        second.done.set()
        for client in clients:
            client.close()


def test_a_worker_that_never_accepts_delays_connections_by_one_yield_time(listener) -> None:
    shares = ConnectionShares(4)
    serving = Worker(listener, shares, shares.claim(set()))
    stuck_slot = shares.claim({serving.slot})
    shares.join(stuck_slot)  # accepting, as far as the counts say, but hung
    shares.opened(serving.slot)
    serving.server.start()
    try:
        opened = connect(listener)
        wait_handled([serving], 1)
        waited = serving.handled[0] - opened
        assert YIELD_SECONDS * 0.9 <= waited < YIELD_SECONDS + 1.0
        # The pause is a timer, not a busy loop: a look every step, no more.
        assert serving.reads <= YIELD_SECONDS / YIELD_STEP_SECONDS * 1.5 + 2
        # Left waiting a whole window, the worker takes what comes without yielding for a
        # while: a queue of connections is not delayed a window each.
        opened = time.monotonic()
        for _ in range(10):
            connect(listener)
        wait_handled([serving], 11)
        assert serving.handled[-1] - opened < YIELD_SECONDS * 0.9
        # Then it yields again.
        gevent.sleep(TAKE_ALL_SECONDS)
        opened = connect(listener)
        wait_handled([serving], 12)
        assert serving.handled[-1] - opened >= YIELD_SECONDS * 0.9
        # A slot released (its worker stopped accepting or exited) is not yielded to.
        shares.release(stuck_slot)
        gevent.sleep(TAKE_ALL_SECONDS)
        opened = connect(listener)
        wait_handled([serving], 13)
        assert serving.handled[-1] - opened < YIELD_SECONDS * 0.9
    finally:
        serving.server.close()


def test_a_booting_worker_is_left_no_connection(listener) -> None:
    shares = ConnectionShares(4)
    serving = Worker(listener, shares, shares.claim(set()))
    shares.claim({serving.slot})  # forked, not accepting yet: never joins here
    shares.opened(serving.slot)
    serving.server.start()
    try:
        opened = connect(listener)
        wait_handled([serving], 1)
        assert serving.handled[0] - opened < YIELD_SECONDS * 0.9
    finally:
        serving.server.close()


def test_a_connection_reset_before_its_tls_handshake_is_not_left_counted(
    listener, tmp_path, capfd
) -> None:
    """gevent wraps a TLS connection before the handler runs; a reset then ends the
    connection without the handler: its count goes all the same, and no traceback is
    printed (gevent's own wrapper let the error escape its greenlet)."""
    pki = make_certificates(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.tls_cert, pki.tls_key)
    shares = ConnectionShares(2)
    serving = Worker(listener, shares, shares.claim(set()), ssl_context=context)
    serving.server.start()
    try:
        for _ in range(20):
            client = gevent.socket.create_connection(listener.getsockname(), timeout=5)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # a reset, sent at once
        gevent.sleep(0.2)
        with gevent.Timeout(5):
            while shares.count(serving.slot):
                gevent.sleep(0.01)
        assert shares.count(serving.slot) == 0
        assert "Traceback" not in capfd.readouterr().err
    finally:
        serving.server.close()


def test_slots_are_claimed_once_and_counts_never_go_below_zero() -> None:
    shares = ConnectionShares(2)
    first = shares.claim(set())
    second = shares.claim({first})
    assert {first, second} == {0, 1}
    assert shares.claim({first, second}) is None
    # Claimed, not joined: no count, nothing yielded to it.
    shares.opened(first)
    assert shares.count(first) == -1
    shares.join(first)
    shares.join(second)
    shares.closed(first)
    assert shares.count(first) == 0
    shares.opened(first)
    assert shares.should_yield(first) and not shares.should_yield(second)
    # A worker without a slot neither counts nor yields.
    shares.opened(None)
    shares.closed(None)
    shares.join(None)
    assert not shares.should_yield(None)
    shares.release(second)
    assert not shares.should_yield(first)
    # A released slot stays out of the counts until its next worker joins it.
    shares.opened(second)
    assert shares.count(second) == -1
    assert shares.claim({first}) == second and shares.count(second) == -1


def test_a_tls_setup_failure_that_is_not_the_clients_is_logged_as_an_error(
    listener, caplog
) -> None:
    shares = ConnectionShares(2)

    def broken_context() -> ssl.SSLContext:
        raise OSError(errno.EBADF, "bad file descriptor")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.wrap_socket = lambda *args, **kwargs: broken_context()  # type: ignore[method-assign]
    serving = Worker(listener, shares, shares.claim(set()), ssl_context=context)
    serving.server.start()
    try:
        with caplog.at_level("DEBUG"):
            connect(listener)
            with gevent.Timeout(5):
                while not any(r.levelname == "ERROR" for r in caplog.records):
                    gevent.sleep(0.01)
        assert not serving.handled
        assert shares.count(serving.slot) == 0
    finally:
        serving.server.close()


def test_a_full_worker_makes_room_and_accepts_the_waiting_connection(listener) -> None:
    shares = ConnectionShares(4)
    worker = Worker(listener, shares, shares.claim(set()), keep_open=True, connections=Pool(2))
    worker.server.start()
    clients = []
    try:
        clients = [gevent.socket.create_connection(listener.getsockname()) for _ in range(2)]
        wait_handled([worker], 2)
        assert worker.rooms_made == 0
        clients.append(gevent.socket.create_connection(listener.getsockname()))
        wait_handled([worker], 3)  # accepted once the oldest was ended to make room
        assert worker.rooms_made == 1
        assert worker.handlers[0].dead and not worker.handlers[1].dead
        assert worker.server.connections.free_count() == 0
    finally:
        worker.done.set()
        for client in clients:
            client.close()
        worker.server.close()


def test_a_full_worker_makes_no_room_while_another_holds_fewer(listener) -> None:
    shares = ConnectionShares(4)
    full = Worker(listener, shares, shares.claim(set()), keep_open=True, connections=Pool(1))
    other = Worker(listener, shares, shares.claim({full.slot}), keep_open=True)
    full.server.start()
    clients = []
    try:
        clients = [gevent.socket.create_connection(listener.getsockname())]
        wait_handled([full], 1)
        other.server.start()  # holds none: the next connection is its own
        clients.append(gevent.socket.create_connection(listener.getsockname()))
        wait_handled([full, other], 2)
        assert (len(full.handled), len(other.handled)) == (1, 1)
        assert full.rooms_made == 0 and not full.handlers[0].dead
    finally:
        full.done.set()
        other.done.set()
        for client in clients:
            client.close()
        full.server.close()
        other.server.close()
