"""Long decisions in a forked copy of the worker, so the event loop goes on serving.

A thread would not do: decoding a 3 MiB body is one call that holds the GIL for tens of
milliseconds, and a thread deciding in Python takes the GIL back at every switch, so the
event loop's other connections would wait. The fork costs about a millisecond and copies
nothing: the child has the body and the policy in force already.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
from collections.abc import Callable
from typing import Any, TypeVar

import gevent
from gevent.lock import BoundedSemaphore
from gevent.os import make_nonblocking, nb_read

T = TypeVar("T")

# One at a time per worker: the workers are as many as the cores, so a second child would
# only share a core with the first, and each child holds its decoded review (about 44 MiB
# for the largest UPDATE).
LONG_DECISIONS_AT_ONCE = 1
# The API server has given up long before (its timeout is at most 30 s).
LONG_DECISION_SECONDS = 30.0
_slots: list[BoundedSemaphore] = []


class ChildDecisionLost(Exception):
    """The forked process of a long decision died or ran out of time: the app answers 503,
    so the API server applies the webhook's failure policy, and logs a warning, not an error
    of the decision."""


def run_in_child(work: Callable[[], T]) -> T:
    """Run ``work`` in a forked copy of this worker and return its (pickled) result or raise
    its (pickled) exception; this greenlet waits, the others run.

    At most ``LONG_DECISIONS_AT_ONCE`` run at a time per worker; a child that outlives
    ``LONG_DECISION_SECONDS`` is killed, and :class:`ChildDecisionLost` raised.
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
