"""Sharing connections out evenly between a server's workers.

The workers of a gunicorn server accept from one listening socket. A connection that
arrives wakes every worker waiting on it and goes to the first that calls ``accept``, and a
worker already running (handshaking the connection it took a moment ago) is usually first:
measured with 8 connections opened at once against 2 workers, the split was 4/4, 7/1 or
8/0 from one run to the next. The API server keeps a pool of long-lived keep-alive
connections, so a lopsided split lasts: one worker's core serves them all, at up to half
the server's capacity, with twice the queueing, while the other idles.

Each worker therefore counts its open connections in anonymous shared memory mapped before
fork (one slot per worker, assigned by the arbiter). A worker that holds more than the
least loaded live worker leaves a waiting connection to the others: it stops accepting,
looks again every :data:`YIELD_STEP_SECONDS`, and takes the connection itself if it is still
waiting after :data:`YIELD_SECONDS` (a less loaded worker may be busy with a burst of
handshakes for a few milliseconds), so a worker that is stuck delays a new connection by
that much and no more.
"""

from __future__ import annotations

import mmap
import time
from typing import Any

from gevent import monkey
from gevent.server import StreamServer

# Longer than a worker takes to handshake a burst of a few connections; short next to the
# handshake's own deadline.
YIELD_SECONDS = 0.05
YIELD_STEP_SECONDS = 0.002
_FREE = -1
# A look at the listener that does not wait: the blocking original, not gevent's.
_select = monkey.get_original("select", "select")


class ConnectionShares:
    """Open connections per worker slot (``-1``: no accepting worker holds the slot).

    The arbiter claims and releases slots; a worker writes only its own slot's count, and
    reads the others' (an aligned 4-byte value is read and written whole)."""

    def __init__(self, slots: int) -> None:
        self._memory = mmap.mmap(-1, 4 * slots, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        self._counts = memoryview(self._memory).cast("i")
        for slot in range(slots):
            self._counts[slot] = _FREE

    def claim(self, taken: set[int]) -> int | None:
        """A slot for a worker about to be forked (in the arbiter), none of ``taken``; None
        when every slot is taken (that worker then accepts without yielding)."""
        for slot in range(len(self._counts)):
            if slot not in taken:
                self._counts[slot] = 0
                return slot
        return None

    def release(self, slot: int | None) -> None:
        """The slot of a worker that exited or stopped accepting."""
        if slot is not None:
            self._counts[slot] = _FREE

    def opened(self, slot: int | None) -> None:
        if slot is not None:
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

    def __init__(self, listener: Any, *, shares: ConnectionShares, slot: int | None, **kwargs):
        super().__init__(listener, **kwargs)
        self._shares = shares
        self._slot = slot
        self._resume = self.loop.timer(YIELD_STEP_SECONDS)
        # Until when the connection waiting now is left to the others; None: none is.
        self._yield_until: float | None = None

    def do_read(self) -> Any:
        if self._shares.should_yield(self._slot):
            now = time.monotonic()
            if self._yield_until is None:
                self._yield_until = now + YIELD_SECONDS
            if now < self._yield_until:
                self.stop_accepting()
                self._resume.start(self._accept_again)
                return None
        self._yield_until = None
        accepted = super().do_read()
        if accepted:
            self._shares.opened(self._slot)
        return accepted

    def _accept_again(self) -> None:
        if not self.started:
            return
        if not _select([self.socket], [], [], 0)[0]:
            self._yield_until = None  # another worker took it: the next one starts afresh
        self.start_accepting()

    def close(self) -> None:
        self._resume.stop()
        super().close()
