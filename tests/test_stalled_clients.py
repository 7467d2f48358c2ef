"""Clients that stall cost the server a file descriptor, not its answers.

A separate process holds 300 connections of each kind (``tests/stalling.py``) against the real
server; meanwhile a keep-alive client and fresh connections are answered promptly, and each
stalled connection is closed within its phase's deadline plus a second.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.serving import (
    REPO,
    Server,
    fixture_bytes,
    post_json,
    tls_server,
)
from tests.stalling import KINDS, PHASES

GPU_POD = fixture_bytes("admission-review-gpu-pod.json")
PER_KIND = 300
# Long enough that every connection is open before the first deadline passes, even on a busy
# CI machine; the deadlines themselves are what is tested.
DEADLINES = {"handshake": 8.0, "headers": 8.0, "body": 8.0, "idle": 10.0}
DEADLINES["first request"] = DEADLINES["headers"]
# Far above a normal answer here (milliseconds), far below what a thread-per-connection
# server showed with 100 stalled clients (9 s).
PROMPT_SECONDS = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {
        "GPU_ADMISSION_HANDSHAKE_TIMEOUT": str(DEADLINES["handshake"]),
        "GPU_ADMISSION_HEADERS_TIMEOUT": str(DEADLINES["headers"]),
        "GPU_ADMISSION_BODY_TIMEOUT": str(DEADLINES["body"]),
        "GPU_ADMISSION_IDLE_TIMEOUT": str(DEADLINES["idle"]),
        # Room for all of them: closing one to make room is tested in test_room.py; here
        # each must last until its own deadline.
        "GPU_ADMISSION_MAX_CONNECTIONS": str(2 * PER_KIND * len(KINDS)),
    }
    with tls_server(tmp_path_factory.mktemp("stalled"), env) as running:
        yield running


def timed_review(conn) -> float:
    started = time.monotonic()
    reply = post_json(conn, "/validate", GPU_POD)
    assert reply.status == 200 and reply.json()["response"]["allowed"] is True
    return time.monotonic() - started


def test_stalled_connections_do_not_stop_reviews_and_are_closed_at_their_deadline(
    server: Server,
) -> None:
    kept_alive = server.connection(timeout=10)
    timed_review(kept_alive)
    assert server.ca is not None
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.stalling", "--port", str(server.port)]
        + ["--ca", str(server.ca), "--count", str(PER_KIND), "--hold", "40"]
        + [arg for kind in KINDS for arg in ("--kind", kind)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        established = json.loads(holder.stdout.readline())
        assert established == {"established": {kind: PER_KIND for kind in KINDS}}

        # All 1,500 are open: the server still answers, on a kept connection and fresh ones.
        kept = [timed_review(kept_alive) for _ in range(20)]
        fresh = []
        for _ in range(10):
            conn = server.connection(timeout=10)
            try:
                fresh.append(timed_review(conn))
            finally:
                conn.close()
        health = server.get("/healthz")
        assert health.status == 200
        assert max(kept) < PROMPT_SECONDS, kept
        assert max(fresh) < PROMPT_SECONDS, fresh

        closed = json.loads(holder.communicate(timeout=60)[0])["closed"]
    finally:
        kept_alive.close()
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)

    for kind in KINDS:
        deadline = DEADLINES[PHASES[kind]]
        times = closed[kind]
        assert None not in times, f"{kind}: {times.count(None)} never closed"
        assert max(times) <= deadline + 1.0, (kind, max(times), deadline)
        # Not before its deadline either: the deadline is the phase's, not a shorter one.
        assert min(times) >= deadline - 0.5, (kind, min(times), deadline)

    # Each stall is logged at info with its phase; none is an error.
    records = server.log_records()
    assert not [r for r in records if r.get("level") == "error"]
    stalled_phases = {
        r["phase"] for r in records if r.get("message") == "closed a connection that stalled"
    }
    assert stalled_phases == {"TLS handshake", "first request", "request line and headers"}
    assert any(r.get("message") == "client too slow sending the body" for r in records)
