"""Checks that run on their own: a daemon thread of a worker calls one every few seconds, so that
a worker that gets no request still moves to a new policy or certificate."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


def every(
    seconds: float, check: Callable[[], object], *, name: str, log: logging.Logger, failure: str
) -> threading.Thread:
    """Call ``check`` every ``seconds`` in a daemon thread, until exit. An exception is logged
    as ``failure`` and the thread goes on: a dead watcher would fail silently."""

    def run() -> None:
        while True:
            time.sleep(seconds)
            try:
                check()
            except Exception:
                log.exception(failure)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
