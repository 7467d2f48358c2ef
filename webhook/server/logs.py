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
from gunicorn.glogging import Logger as GunicornLogger

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


class JsonLineHandler(logging.StreamHandler[TextIO]):
    """Writes each record as one JSON line (:class:`JsonFormatter`), whole.

    To a stream with a file descriptor (stderr, a file) the line is written as bytes with one
    ``write`` when it fits, and finished when it does not: a line once begun is never left
    half-written for the next one to join, even on a pipe another process set non-blocking
    (the write then waits, as a blocking one would). A stream without a descriptor (tests)
    is written to as a stream.

    Its lock is the operating system's, even in a gevent worker (whose threading locks are
    greenlet locks, dearer per line): no greenlet can run while a line is written anyway.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.setFormatter(JsonFormatter())

    def createLock(self) -> None:  # noqa: N802 (logging's name)
        self.lock = monkey.get_original("_thread", "RLock")()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
            fd = _file_descriptor(self.stream)
            if fd is None:
                self.stream.write(line)
                self.stream.flush()
                return
            data = line.encode("utf-8", "backslashreplace")
            self.stream.flush()  # what anyone wrote through the stream goes first
            if not _write_line(fd, data):
                raise OSError(f"the log's file descriptor {fd} took none of the line")
        except RecursionError:  # as logging.StreamHandler: not swallowed
            raise
        except Exception:
            self.handleError(record)


def _file_descriptor(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return None


_select = monkey.get_original("select", "select")
# How long one wait for a full non-blocking log pipe lasts before the write is tried again,
# and how long a line may wait in all: a reader that stalls longer loses the line (ended
# with a newline when begun) rather than stopping the server.
LINE_WAIT_SECONDS = 1.0
LINE_DEADLINE_SECONDS = 5.0
# The longest uid, name, namespace, operation or kind logged (Kubernetes names: 253).
IDENTIFIER_CHARS = 256


def configure_logging(level: int | str = logging.INFO, stream: TextIO | None = None) -> None:
    """Send the ``webhook`` loggers to ``stream`` (stderr) as JSON lines.

    Idempotent: the handler it installed before is replaced, so a worker that configures
    logging after fork does not print every line twice.
    """
    logger = logging.getLogger("webhook")
    for handler in list(logger.handlers):
        if isinstance(handler, JsonLineHandler):
            logger.removeHandler(handler)
    logger.addHandler(JsonLineHandler(stream or sys.stderr))
    logger.setLevel(level)
    # The root logger may have its own handler (pytest's, a user's basicConfig).
    logger.propagate = False


class NoAccessLogger(GunicornLogger):
    """gunicorn's logger (``logger_class``) without its access log: one line per decision
    comes from the app. gunicorn counts a ``logconfig_dict`` as asking for an access log, and
    would build each request's access-log fields and record for a logger that writes nothing
    (measured: about 7% of a served request's CPU)."""

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        return None


def gunicorn_logconfig() -> dict[str, Any]:
    """gunicorn's ``logconfig_dict`` setting: its own loggers and the root logger write JSON
    lines to stderr like the webhook's (with ``errorlog`` None, gunicorn adds no handler of its
    own); no access log (one line per decision comes from the app)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {},
        "handlers": {
            "json": {"()": JsonLineHandler, "stream": "ext://sys.stderr"},
        },
        "root": {"level": "WARNING", "handlers": ["json"]},
        "loggers": {
            "gunicorn.error": {"level": "INFO", "handlers": ["json"], "propagate": False},
            "gunicorn.access": {"level": "INFO", "handlers": [], "propagate": False},
        },
    }


def log_decision(
    logger: logging.Logger,
    *,
    endpoint: str,
    request: Mapping[str, Any],
    allowed: bool,
    violations: Iterable[tuple[str, str]],
    mutation: str,
    duration_ms: float,
    exceptions: Iterable[str] = (),
) -> None:
    """Write the one line for an admission decision.

    ``request`` is the AdmissionReview's ``request``: only its identifying fields are read.
    ``violations`` are (rule id, mode) pairs, logged as two lists in the same order.
    ``exceptions``: the policy exceptions that made denials warnings, as decisions name them
    (the field is there only when one did).
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    kind = request.get("kind")
    pairs = list(violations)
    fields = {
        "uid": _identifier(request.get("uid")),
        "kind": _identifier(kind.get("kind")) if isinstance(kind, dict) else None,
        "namespace": _identifier(request.get("namespace")),
        "name": _identifier(request.get("name")),
        "operation": _identifier(request.get("operation")),
        "endpoint": endpoint,
        "verdict": "allowed" if allowed else "denied",
        "rules": [rule for rule, _ in pairs],
        "modes": [mode for _, mode in pairs],
        "mutation": mutation,
        "duration_ms": round(duration_ms, 3),  # to the microsecond
        "dry_run": request.get("dryRun") is True,
    }
    excepted = list(exceptions)
    if excepted:
        fields["exceptions"] = excepted
    logger.info("admission decision", extra={"fields": fields})


def _identifier(value: object) -> str | None:
    """A request's identifying field as logged: a string, clipped (the API server's are short,
    a direct client's may be anything, and a line under PIPE_BUF reaches a pipe whole), or
    None for what is not a string."""
    if not isinstance(value, str):
        return None
    return value if len(value) <= IDENTIFIER_CHARS else value[:IDENTIFIER_CHARS] + "..."


def _write_line(fd: int, line: bytes) -> bool:
    """Write all of ``line`` to ``fd``; False when not a byte of it could be written. A line
    once begun is finished, never left half-written for the next one to join: a descriptor
    another process set non-blocking is waited for, as a blocking one would be (under the
    operating system's select, so that no greenlet runs meanwhile), for at most
    ``LINE_DEADLINE_SECONDS``."""
    view = memoryview(line)
    started = False
    give_up_at = time.monotonic() + LINE_DEADLINE_SECONDS
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            remaining = give_up_at - time.monotonic()
            if remaining <= 0:
                if started:  # end the line, so the next one starts on its own
                    with contextlib.suppress(OSError):
                        os.write(fd, b"\n")
                return True  # lost, not an error to report through the same stalled pipe
            _select([], [fd], [], min(LINE_WAIT_SECONDS, remaining))
            continue
        except OSError:
            if started:  # the rest cannot be written (the reader is gone): end the line
                with contextlib.suppress(OSError):
                    os.write(fd, b"\n")
            return started
        started = True
        view = view[written:]
    return True


def _json_line(entry: dict[str, Any]) -> str:
    """One JSON log line, compact, non-ASCII as UTF-8. orjson writes it in a tenth of the
    time; a value it cannot write (an integer beyond 64 bits) falls back to the standard
    library, so no line is lost."""
    try:
        return orjson.dumps(entry, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(entry, default=str, separators=(",", ":"), ensure_ascii=False)
