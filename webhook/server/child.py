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
import resource
import signal
from collections.abc import Callable
from typing import Any, TypeVar, cast

import gevent
from gevent import monkey
from gevent.lock import BoundedSemaphore
from gevent.os import fork_and_watch, make_nonblocking, nb_read, waitpid

T = TypeVar("T")

# One at a time per worker: a worker has one core (the manifests' limit), so a second child
# would only share it with the first, and each child holds its decoded review (about 44 MiB
# for the largest UPDATE).
LONG_DECISIONS_AT_ONCE = 1
# The API server waits 5 s for this webhook (its manifests' timeoutSeconds; 30 s at most):
# a decision still running after twice that has no one to answer. A review waits at most as
# long for the child slot.
LONG_DECISION_SECONDS = 10.0
# What a child may allocate beyond what it inherits: the largest review the API server sends
# (an UPDATE of two 3 MiB objects) takes about 45 MiB; a body built to take more (millions of
# empty containers) gets a MemoryError, answered 413, instead of the Pod's memory.
CHILD_MEMORY_BYTES = 160 * 1024 * 1024
# How long gevent's child watcher is given to report a child that ended before the kernel is
# asked directly: gevent starts watching only once the fork returned, and a child that ended
# before that (its SIGCHLD ignored, gunicorn's default) must not hold the decision slot.
REAP_SECONDS = 5.0
_slots: list[BoundedSemaphore] = []
# The child runs no gevent code (it decides, writes its answer and exits): the plain fork,
# without re-initialising gevent's hub in it. gevent watches the child all the same.
_plain_fork = monkey.get_original("os", "fork")


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
    slots = _long_decision_slots()
    if not slots.acquire(timeout=LONG_DECISION_SECONDS):
        raise ChildDecisionLost(
            f"no turn to decide a long review within {LONG_DECISION_SECONDS:g} s"
        )
    try:
        read_end, write_end = os.pipe()
        # Forked the way gevent supports: its child watcher collects the exit, and waitpid
        # below waits on that watcher (a plain waitpid would race it for the status).
        pid = fork_and_watch(fork=_plain_fork)
        if pid == 0:  # the child: decide, write, exit without running any of the worker
            try:
                # It lives for one decision: collecting its garbage is wasted time (a third
                # of the decision for a 6 MiB review), the exit frees it all.
                gc.disable()
                _cap_memory(CHILD_MEMORY_BYTES)
                os.close(read_end)
                _write_all(write_end, _pickled_result(work))
            finally:
                os._exit(0)
        os.close(write_end)
        data = None
        try:
            data = _read_all(read_end, LONG_DECISION_SECONDS)
        finally:
            os.close(read_end)
            ended = _reap(pid, kill=data is None)
    finally:
        slots.release()
    if not data:  # None: out of time; empty: it ended without writing
        # A child past its memory cap may crash rather than raise MemoryError (native code
        # aborts on a failed allocation): the cap kept the worker's memory, not the answer.
        raise ChildDecisionLost(
            f"the process deciding a long review ended without an answer ({ended})"
        )
    status, value = pickle.loads(data)
    if status == "raised":
        raise value
    return cast(T, value)


def _cap_memory(extra: int) -> None:
    """Limit this process's data segment (heap and anonymous mappings) to what it has plus
    ``extra`` bytes: past it, allocations fail with MemoryError."""
    with open("/proc/self/status", encoding="ascii") as status:
        data_kib = next(int(line.split()[1]) for line in status if line.startswith("VmData:"))
    limit = data_kib * 1024 + extra
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


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


def _read_all(fd: int, seconds: float) -> bytes | None:
    """Everything the child writes until it closes the pipe; None when that takes longer
    than ``seconds``."""
    make_nonblocking(fd)
    chunks = []
    with gevent.Timeout(seconds, False):
        while chunk := nb_read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    return None


def _reap(pid: int, *, kill: bool) -> str:
    """Collect the child, killed first when it ran out of time and still runs; how it ended.
    Other greenlets run while it is waited for: it closed its end of the pipe, or was killed,
    so the wait is short; past ``REAP_SECONDS`` the kernel is asked directly."""
    status: int | None = None
    if kill:
        ended, early = waitpid(pid, os.WNOHANG)  # a finished child's status is taken here
        if ended:
            status, kill = early, False
        else:
            os.kill(pid, signal.SIGKILL)
    if status is None:
        with gevent.Timeout(REAP_SECONDS, False):
            status = waitpid(pid, 0)[1]
    if status is None:
        try:
            status = os.waitpid(pid, 0)[1]
        except ChildProcessError:
            status = None
    if kill:
        return f"killed after {LONG_DECISION_SECONDS:g} s"
    if status is None:
        return "collected by gevent, its status unknown"
    if os.WIFSIGNALED(status):
        return f"ended by signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
