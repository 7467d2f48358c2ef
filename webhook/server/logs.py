"""Structured JSON logs: one object per line, one line per admission decision.

Log collectors parse a JSON line without a per-project grammar, and a field that carries a
value written by a user (a Pod name, a policy error message) cannot break the line or forge
another one. Decision lines carry request metadata only, never the object under review: Pod
specs hold environment variables, and those hold secrets often enough.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

import orjson
from gevent import monkey
from gunicorn import glogging

DECISION_LOGGER = "webhook.decisions"


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: time, level, logger, message and ``fields``.

    Fields travel as one ``extra={"fields": {...}}`` mapping rather than as separate extras
    because a LogRecord refuses extras named like its own attributes, ``name`` among them.
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _utc_timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _json_line(entry)


@functools.lru_cache(maxsize=4)
def _utc_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


# ".000Z" to ".999Z": the end of every timestamp, written once; one more ".999Z" for the
# fraction of a second that rounds up to 1000 ms.
_MILLISECONDS = (*(f".{ms:03d}Z" for ms in range(1000)), ".999Z")


def _utc_timestamp(created: float) -> str:
    # The formatted second is cached: a busy server writes many lines within each one.
    second = int(created)
    return _utc_second(second) + _MILLISECONDS[int((created - second) * 1000)]


# Logger names are part of the log format that operators filter on: they stay as they were
# when the server was one module each, whatever the modules are called now.
APP_LOGGER = "webhook.app"
SERVER_LOGGER = "webhook.server"
STORE_LOGGER = "webhook.policy_store"


class _JsonStreamHandler(logging.StreamHandler[Any]):
    """The handler :func:`configure_logging` installs, told apart from anyone else's. It
    knows the file descriptor of its stream, when the stream has one, for decision lines."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.fd = _file_descriptor(stream)

    def setStream(self, stream: TextIO) -> TextIO | None:  # noqa: N802 (logging's name)
        previous = super().setStream(stream)
        self.fd = _file_descriptor(self.stream)
        return previous


def _file_descriptor(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return None


# Decision lines are written under a lock of the operating system, not the handler's: in a
# gevent worker that lock is a greenlet lock, which costs a sixth of a typical decision, and
# no greenlet can run during a write anyway. The lock matters only to real threads.
_DECISION_LINE_LOCK = monkey.get_original("_thread", "allocate_lock")()
_select = monkey.get_original("select", "select")
# How long one wait for a full non-blocking log pipe lasts before the write is tried again.
DECISION_LINE_WAIT = 1.0
# The longest uid, name, namespace, operation or kind logged (Kubernetes names: 253).
IDENTIFIER_CHARS = 256


def configure_logging(level: int | str = logging.INFO, stream: TextIO | None = None) -> None:
    """Send the ``webhook`` loggers to ``stream`` (stderr) as JSON lines.

    Idempotent: the handler it installed before is replaced, so a worker that configures
    logging after fork does not print every line twice.
    """
    logger = logging.getLogger("webhook")
    for handler in list(logger.handlers):
        if isinstance(handler, _JsonStreamHandler):
            logger.removeHandler(handler)
    handler = _JsonStreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    # The root logger may have its own handler (pytest's, a user's basicConfig).
    logger.propagate = False


class GunicornJsonLogger(glogging.Logger):
    """gunicorn's logger with the same JSON lines, so the server's output is one format."""

    def _set_handler(
        self,
        log: logging.Logger,
        output: str | None,
        fmt: logging.Formatter,
        stream: TextIO | None = None,
    ) -> None:
        super()._set_handler(log, output, JsonFormatter(), stream)


def log_decision(
    logger: logging.Logger,
    *,
    endpoint: str,
    request: Mapping[str, Any],
    allowed: bool,
    violations: Iterable[tuple[str, str]],
    mutation: str,
    duration_ms: float,
) -> None:
    """Write the one line for an admission decision.

    ``request`` is the AdmissionReview's ``request``: only its identifying fields are read.
    ``violations`` are (rule id, mode) pairs, logged as two lists in the same order.
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    kind = request.get("kind")
    pairs = list(violations)
    # Built in the order JsonFormatter writes: time, level, logger and message first, in one
    # literal (a line per request: every step counts).
    entry: dict[str, Any] = {
        "time": _utc_timestamp(time.time()),
        "level": "info",
        "logger": logger.name,
        "message": "admission decision",
        "uid": _identifier(request.get("uid")),
        "kind": _identifier(kind.get("kind")) if isinstance(kind, dict) else None,
        "namespace": _identifier(request.get("namespace")),
        "name": _identifier(request.get("name")),
        "operation": _identifier(request.get("operation")),
        "endpoint": endpoint,
        "verdict": "allowed" if allowed else "denied",
        "rules": [rule for rule, _ in pairs] if pairs else [],
        "modes": [mode for _, mode in pairs] if pairs else [],
        "mutation": mutation,
        "duration_ms": round(duration_ms, 3),  # to the microsecond
        "dry_run": request.get("dryRun") is True,
    }
    handler = _json_handler(logger)
    if handler is None:
        # Not configured by configure_logging (tests, embedding): through logging.
        _through_logging(logger, entry)
        return
    # One line per decision, built here: a LogRecord, the caller lookup and the formatter cost
    # as much as the decision itself. The line is the one JsonFormatter would write.
    fd = handler.fd
    if fd is None:  # a stream without a file (tests): through it, under the handler's lock
        lock = handler.lock
        assert lock is not None  # logging.Handler makes one in __init__
        with lock:
            handler.stream.write(_json_line(entry) + handler.terminator)
            handler.stream.flush()
        return
    line = _json_line_bytes(entry)
    with _DECISION_LINE_LOCK:
        # The stream is flushed after every record it writes: nothing of it is pending. Mostly
        # one write takes the whole line; _write_line finishes what it did not.
        try:
            written = os.write(fd, line)
        except OSError:
            written = 0
        complete = written == len(line) or _write_line(fd, line, written)
    if not complete:
        # A descriptor that refused the whole line (closed, or a full pipe another process
        # set non-blocking): through logging, which reports its own errors and goes on.
        _through_logging(logger, entry)


def _identifier(value: object) -> str | None:
    """A request's identifying field as logged: a string, clipped (the API server's are short,
    a direct client's may be anything, and a line under PIPE_BUF reaches a pipe whole), or
    None for what is not a string."""
    if not isinstance(value, str):
        return None
    return value if len(value) <= IDENTIFIER_CHARS else value[:IDENTIFIER_CHARS] + "..."


def _write_line(fd: int, line: bytes, written: int = 0) -> bool:
    """Write all of ``line`` to ``fd``, past the ``written`` bytes of it already written;
    False when not a byte of it could be written. A line once begun is finished, never left
    half-written for the next one to join: a descriptor another process set non-blocking is
    waited for, as a blocking one would be (under the operating system's select, so that no
    greenlet runs meanwhile)."""
    view = memoryview(line)[written:]
    started = written > 0
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            _select([], [fd], [], DECISION_LINE_WAIT)
            continue
        except OSError:
            if started:  # the rest cannot be written (the reader is gone): end the line
                with contextlib.suppress(OSError):
                    os.write(fd, b"\n")
            return started
        started = True
        view = view[written:]
    return True


def _through_logging(logger: logging.Logger, entry: dict[str, Any]) -> None:
    """The decision line as a LogRecord; logging adds the first four fields itself."""
    fields = dict(entry)
    for key in ("time", "level", "logger", "message"):
        del fields[key]
    logger.info("admission decision", extra={"fields": fields})


def _json_line(entry: dict[str, Any]) -> str:
    """One JSON log line, compact, non-ASCII as UTF-8. orjson writes it in a tenth of the
    time; a value it cannot write (an integer beyond 64 bits) falls back to the standard
    library, so no line is lost."""
    try:
        return orjson.dumps(entry, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(entry, default=str, separators=(",", ":"), ensure_ascii=False)


def _json_line_bytes(entry: dict[str, Any]) -> bytes:
    """:func:`_json_line` and its newline, encoded, as written to a file descriptor. For a
    decision line, whose keys are all strings (telling orjson otherwise costs a third more)."""
    try:
        return orjson.dumps(entry, default=str, option=orjson.OPT_APPEND_NEWLINE)
    except (TypeError, orjson.JSONEncodeError):
        return (_json_line(entry) + "\n").encode("utf-8", "backslashreplace")


def _json_handler(logger: logging.Logger) -> _JsonStreamHandler | None:
    """The handler configure_logging installed, when this logger's lines all go to it alone."""
    node: logging.Logger | None = logger
    while node is not None:
        if node.handlers:
            handlers = node.handlers
            if len(handlers) == 1 and isinstance(handlers[0], _JsonStreamHandler):
                return handlers[0]
            return None
        if not node.propagate:
            return None
        node = node.parent
    return None
