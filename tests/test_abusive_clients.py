"""Clients that attack the worker's time and memory rather than stall: a head or body in
one-byte TLS records, an endless head, a client that never reads its answers, a client that
pipelines hundreds of requests. Each is closed at its limit while reviews on other
connections go on being answered promptly, and no worker is killed."""

from __future__ import annotations

import json
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.abusive import KINDS
from tests.serving import (
    REPO,
    Server,
    client_context,
    fixture_bytes,
    post_json,
    tls_server,
    wait_until,
)
from webhook.server.connection import HEAD_BYTES_LIMIT

GPU_POD = fixture_bytes("admission-review-gpu-pod.json")
HEADERS_SECONDS = 3.0
BODY_FLOOR_SECONDS = 2.0
WRITE_SECONDS = 2.0
# Far above a normal answer (milliseconds); far below gunicorn's worker timeout (30 s), past
# which a worker kept busy by one client was killed.
PROMPT_SECONDS = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {
        "GPU_ADMISSION_HEADERS_TIMEOUT": str(HEADERS_SECONDS),
        "GPU_ADMISSION_BODY_TIMEOUT": str(BODY_FLOOR_SECONDS),
        "GPU_ADMISSION_WRITE_TIMEOUT": str(WRITE_SECONDS),
    }
    # One worker: every attack and every probe on the same event loop.
    with tls_server(tmp_path_factory.mktemp("abusive"), env) as running:
        yield running


def timed_review(server: Server) -> float:
    conn = server.connection(timeout=30)
    try:
        started = time.monotonic()
        reply = post_json(conn, "/validate", GPU_POD)
        assert reply.status == 200 and reply.json()["response"]["allowed"] is True
        return time.monotonic() - started
    finally:
        conn.close()


def no_worker_lost(server: Server, pids_before: set[str]) -> None:
    assert server.worker_pids() == pids_before
    text = server.log()
    assert "WORKER TIMEOUT" not in text and "was sent SIGKILL" not in text


@pytest.mark.parametrize("kind", KINDS)
def test_one_byte_tls_records_cannot_keep_the_worker_to_themselves(
    server: Server, kind: str
) -> None:
    pids = server.worker_pids()
    assert server.ca is not None
    seconds = 12.0
    attackers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.abusive", kind, "--port", str(server.port)]
            + ["--ca", str(server.ca), "--seconds", str(seconds)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        time.sleep(0.5)  # both are sending
        probes = []
        while any(a.poll() is None for a in attackers) and len(probes) < 2000:
            probes.append(timed_review(server))
        results = [json.loads(a.communicate(timeout=seconds + 30)[0]) for a in attackers]
    finally:
        for attacker in attackers:
            if attacker.poll() is None:
                attacker.kill()
                attacker.wait(timeout=10)
    assert probes and max(probes) < PROMPT_SECONDS, probes
    # Every connection but each attacker's last (cut short by the end of the attack) was
    # closed by the server.
    finished = [result for connections in results for result in connections[:-1]]
    assert finished, results
    for result in finished:
        assert result["closed_after"] is not None, result
        if kind == "tiny-records-head":
            # Refused at the head limit (431) or, for a slower sender, at its deadline (408).
            assert result["status"] in (431, 408), result
            assert result["closed_after"] < HEADERS_SECONDS + 1.0, result
        else:
            # 1 MiB at 1 MiB/s past the floor; one byte per record never gets there.
            assert result["status"] == 408, result
            assert result["closed_after"] < BODY_FLOOR_SECONDS + 1.0 + 1.0, result
    no_worker_lost(server, pids)


def test_connections_reset_before_their_handshake_leave_nothing_behind(server: Server) -> None:
    """A reset before the TLS wrapper is made used to print a 30-line traceback from gevent
    (any client could fill the log) and to stay counted as an open connection forever."""
    before = len(server.log().splitlines())
    for payload in (b"", b"\x16\x03\x01"):  # nothing, or the start of a ClientHello
        for _ in range(20):
            client = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            if payload:
                client.sendall(payload)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
    assert timed_review(server) < PROMPT_SECONDS
    wait_until(
        lambda: sum(server.connections_per_worker().values()) == 0,
        timeout=5,
        what="every reset connection gone",
    )
    added = server.log().splitlines()[before:]
    assert all(line.startswith("{") for line in added), added[:40]
    assert not any('"level":"error"' in line for line in added)


def test_an_endless_head_is_refused_with_431_at_its_limit(server: Server) -> None:
    assert server.ca is not None
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        with client_context(server.ca).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            try:
                for _ in range(100):  # far past the limit, in header lines of 1 KiB
                    tls.sendall(b"X-Filler: " + b"a" * 1000 + b"\r\n")
            except OSError:
                pass  # the server answered and closed the connection
            answer = b""
            try:
                while chunk := tls.recv(65536):
                    answer += chunk
            except OSError:
                pass
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431"), answer[:300]
    assert b"application/json" in head
    assert str(HEAD_BYTES_LIMIT) in json.loads(body)["error"]


def test_a_client_that_never_reads_is_closed_at_the_write_deadline(server: Server) -> None:
    pids = server.worker_pids()
    assert server.ca is not None
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # A receive window of a few kilobytes: the answers pile up on the server's side.
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(("127.0.0.1", server.port))
    tls = client_context(server.ca).wrap_socket(raw, server_hostname="127.0.0.1")
    try:
        # 2,000 pipelined requests for the metrics page (kilobytes each), never read.
        requests = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 2000
        tls.settimeout(1.0)
        try:
            tls.sendall(requests)
        except (TimeoutError, OSError):
            pass  # the server stopped reading: it is blocked writing to us
        sent_at = time.monotonic()

        def closed_for_not_reading() -> bool:
            return any(
                r.get("message") == "closed a connection that stalled"
                and r.get("phase") == "response"
                for r in server.log_records()
            )

        wait_until(closed_for_not_reading, timeout=WRITE_SECONDS + 5, what="write deadline")
        # Measured from the end of our sending, an upper bound of the write's start.
        assert time.monotonic() - sent_at < WRITE_SECONDS + 3.0
        # Meanwhile, and after, others are answered.
        assert timed_review(server) < PROMPT_SECONDS
    finally:
        tls.close()
    no_worker_lost(server, pids)


def test_a_client_pipelining_hundreds_of_requests_does_not_hold_the_others(
    server: Server,
) -> None:
    assert server.ca is not None
    pipelined = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 3000
    answers: list[bytes] = []

    def pipeline() -> None:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as raw:
            with client_context(server.ca).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(pipelined + b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
                received = b""
                while chunk := tls.recv(1 << 20):
                    received += chunk
                answers.append(received)

    runner = threading.Thread(target=pipeline)
    runner.start()
    probes = []
    while runner.is_alive() and len(probes) < 100:
        probes.append(timed_review(server))
    runner.join(timeout=60)
    assert answers and answers[0].count(b"HTTP/1.1 200") == 3001
    assert max(probes) < PROMPT_SECONDS, probes


def tls_connection(server: Server) -> ssl.SSLSocket:
    assert server.ca is not None
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return client_context(server.ca).wrap_socket(raw, server_hostname="127.0.0.1")


def test_bodies_announced_but_not_sent_take_no_room(server: Server) -> None:
    # 600 bodies of one byte under the large-body size, announced and never sent: more than
    # the small-body budget holds (32 MiB) if what is announced counted.
    head = (
        b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 65535\r\n\r\n"
    )
    held = []
    try:
        for _ in range(600):
            conn = tls_connection(server)
            conn.sendall(head)
            held.append(conn)
        assert timed_review(server) < PROMPT_SECONDS
    finally:
        for conn in held:
            conn.close()


def test_an_unread_body_is_drained_within_the_headers_deadline_in_all(server: Server) -> None:
    # A GET announcing a body it sends a byte at a time: the drain after the answer gives up
    # at the headers' deadline, however often a byte arrives.
    with tls_connection(server) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        started = time.monotonic()
        conn.settimeout(0.5)
        answer = b""
        closed = False
        while time.monotonic() - started < HEADERS_SECONDS + 5:
            try:
                conn.sendall(b"x")
                chunk = conn.recv(65536)
                if not chunk:
                    closed = True
                    break
                answer += chunk
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
        assert answer.startswith(b"HTTP/1.1 200")
        assert closed and time.monotonic() - started < HEADERS_SECONDS + 1.5


def worker_rss_mib(server: Server) -> list[float]:
    sizes = []
    for pid in server.worker_pids():
        status = Path(f"/proc/{pid}/status").read_text()
        [rss] = [line for line in status.splitlines() if line.startswith("VmRSS:")]
        sizes.append(int(rss.split()[1]) / 1024)
    return sizes


def test_a_review_built_to_exhaust_memory_costs_the_worker_nothing(server: Server) -> None:
    pids = server.worker_pids()
    review = json.loads(GPU_POD)
    review["request"]["object"]["spec"]["containers"] += [{}] * 2_000_000  # 6 MiB of {}
    body = json.dumps(review, separators=(",", ":")).encode()
    conn = server.connection(timeout=60)
    try:
        started = time.monotonic()
        reply = post_json(conn, "/validate", body)
        took = time.monotonic() - started
    finally:
        conn.close()
    # The child deciding it hit its memory cap: the review is not decided, the worker is fine.
    assert reply.status in (413, 503), reply
    assert took < 15
    assert max(worker_rss_mib(server)) < 200
    assert timed_review(server) < PROMPT_SECONDS
    no_worker_lost(server, pids)


def test_reviews_of_many_small_objects_do_not_hold_the_event_loop(server: Server) -> None:
    """Small bodies whose decision is slow (thousands of empty containers, on an UPDATE that
    judges both objects) sent together: they are decided off the event loop, one at a time,
    and other reviews go on being answered."""
    pids = server.worker_pids()
    review = json.loads(GPU_POD)
    spec = review["request"]["object"]["spec"]
    spec["containers"] = [{"name": "a", "env": [{"name": "NVIDIA_VISIBLE_DEVICES"}] * 200}]
    spec["containers"] += [{}] * 8000
    review["request"]["operation"] = "UPDATE"
    review["request"]["oldObject"] = review["request"]["object"]
    body = json.dumps(review, separators=(",", ":")).encode()
    assert len(body) < 64 * 1024
    conns = [tls_connection(server) for _ in range(20)]
    request = (
        b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    try:
        for conn in conns:
            conn.sendall(request)
        probes = [timed_review(server) for _ in range(10)]
        for conn in conns:
            conn.settimeout(60)
            assert conn.recv(64).startswith((b"HTTP/1.1 200", b"HTTP/1.1 503"))
    finally:
        for conn in conns:
            conn.close()
    assert max(probes) < PROMPT_SECONDS, probes
    no_worker_lost(server, pids)
