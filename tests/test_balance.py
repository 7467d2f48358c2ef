"""Sharing connections out between workers (webhook.server.balance), in one process: two
balancing servers on one listening socket stand for two workers. gevent's hub runs in the
test's thread; nothing here is monkey-patched."""

from __future__ import annotations

import time

import gevent
import gevent.socket
import pytest

from webhook.server.balance import YIELD_SECONDS, BalancedServer, ConnectionShares


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
    ) -> None:
        self.handled: list[float] = []
        self.held: list[gevent.socket.socket] = []
        self.slot = slot
        self.shares = shares
        self.keep_open = keep_open
        self.server = BalancedServer(listener, shares=shares, slot=slot, handle=self._handle)

    def _handle(self, client: gevent.socket.socket, _addr: object) -> None:
        self.handled.append(time.monotonic())
        if self.keep_open:
            self.held.append(client)
            return
        client.close()
        self.shares.closed(self.slot)


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
        for client in clients + first.held + second.held:
            client.close()


def test_a_worker_that_never_accepts_delays_a_connection_by_the_yield_time_only(
    listener,
) -> None:
    shares = ConnectionShares(4)
    serving = Worker(listener, shares, shares.claim(set()))
    stuck_slot = shares.claim({serving.slot})  # a live worker that accepts nothing
    shares.opened(serving.slot)
    serving.server.start()
    try:
        opened = connect(listener)
        wait_handled([serving], 1)
        waited = serving.handled[0] - opened
        assert YIELD_SECONDS * 0.9 <= waited < YIELD_SECONDS + 1.0
        # The next connection starts a yield of its own, not one already used up.
        opened = connect(listener)
        wait_handled([serving], 2)
        assert serving.handled[1] - opened >= YIELD_SECONDS * 0.9
        # A slot released (its worker stopped accepting or exited) is not yielded to.
        shares.release(stuck_slot)
        opened = connect(listener)
        wait_handled([serving], 3)
        assert serving.handled[2] - opened < YIELD_SECONDS * 0.9
    finally:
        serving.server.close()


def test_slots_are_claimed_once_and_counts_never_go_below_zero() -> None:
    shares = ConnectionShares(2)
    first = shares.claim(set())
    second = shares.claim({first})
    assert {first, second} == {0, 1}
    assert shares.claim({first, second}) is None
    shares.closed(first)
    assert shares.count(first) == 0
    shares.opened(first)
    assert shares.should_yield(first) and not shares.should_yield(second)
    # A worker without a slot neither counts nor yields.
    shares.opened(None)
    shares.closed(None)
    assert not shares.should_yield(None)
    shares.release(second)
    assert not shares.should_yield(first)
    assert shares.claim({first}) == second and shares.count(second) == 0
