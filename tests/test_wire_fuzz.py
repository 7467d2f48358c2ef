"""Whatever a client writes on an intact TLS session, the answer is JSON and never ours to
blame: a named corpus of malformed requests, and a seeded fuzzer with a fixed number of
iterations, each sent over its own TLS connection to the real server.

Every request gets an answer; a 4xx answer is ``application/json``; none is 5xx; nothing is
logged as an error.
"""

from __future__ import annotations

import json
import random
import socket
import ssl
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.serving import Server, client_context, fixture_bytes, tls_server

GPU_POD = fixture_bytes("admission-review-gpu-pod.json")
SEED = 20261202
ITERATIONS = 400
DEADLINE = "1"  # seconds, for every phase: an incomplete request is answered 408 soon


def valid_request(body: bytes = GPU_POD) -> bytes:
    return (
        b"POST /validate HTTP/1.1\r\nHost: gpu-admission.gpu-admission.svc:443\r\n"
        b"Content-Type: application/json\r\nAccept: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body


MALFORMED = {
    "request-line-garbage": b"GARBAGE\r\n\r\n",
    "http-0.9": b"GET /validate\r\n\r\n",
    "http2-preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "lowercase-method": b"post /validate HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad-version": b"POST /validate HTTP/9.9\r\nHost: x\r\n\r\n",
    "absolute-form": b"POST https://evil.example/validate HTTP/1.1\r\nHost: x\r\n"
    b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    "request-line-too-long": b"POST /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "header-too-long": b"POST /validate HTTP/1.1\r\nHost: x\r\nX-Big: "
    + b"a" * 10_000
    + b"\r\n\r\n",
    "too-many-headers": b"POST /validate HTTP/1.1\r\n"
    + b"".join(b"X-%d: 1\r\n" % i for i in range(200))
    + b"\r\n",
    "length-and-chunked": b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "two-lengths": b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Content-Length: 3\r\n\r\n{}",
    "negative-length": b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    "list-length": b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\n{}",
    "unknown-coding": b"POST /validate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
    "chunked-twice": b"POST /validate HTTP/1.1\r\nHost: x\r\n"
    b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
    "obs-fold": b"POST /validate HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n",
    "space-before-colon": b"POST /validate HTTP/1.1\r\nHost : x\r\n\r\n",
    "nul-in-header": b"POST /validate HTTP/1.1\r\nHost: x\x00y\r\n\r\n",
    "bare-lf": b"POST /validate HTTP/1.1\nHost: x\n\n",
    "bad-chunk-size": b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "huge-chunk-extension": b"POST /validate HTTP/1.1\r\nHost: x\r\n"
    b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2;"
    + b"e" * 20_000
    + b"\r\n{}\r\n0\r\n\r\n",
    "short-body": valid_request()[:-100],
    "headers-never-end": b"POST /validate HTTP/1.1\r\nHost: x\r\n",
    "oversized-length": b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
    b"\r\nContent-Length: 99999999999\r\n\r\n",
    "not-json": b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 5\r\n\r\nhello",
    "wrong-type": b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    "get-validate": b"GET /validate HTTP/1.1\r\nHost: x\r\n\r\n",
    "unknown-path": b"POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    "expect-continue": b"POST /validate HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
    b"Content-Type: application/json\r\nContent-Length: 5\r\n\r\nhello",
    "expect-unknown": b"POST /validate HTTP/1.1\r\nHost: x\r\nExpect: 42-teapot\r\n\r\n",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("fuzz")
    env = {f"GPU_ADMISSION_{phase}_TIMEOUT": DEADLINE for phase in ("HANDSHAKE", "HEADERS", "BODY")}
    with tls_server(directory, env) as running:
        yield running


def first_answer(server: Server, data: bytes) -> tuple[int, dict[str, str], bytes] | None:
    """Send ``data`` on a fresh TLS connection; the first HTTP answer, or None if the server
    closed the connection without one."""
    assert server.ca is not None
    context: ssl.SSLContext = client_context(server.ca)
    received = b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            try:
                tls.sendall(data)
            except OSError:
                pass  # the server answered and closed before reading everything
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                head, sep, rest = received.partition(b"\r\n\r\n")
                if sep:
                    lines = head.decode("latin-1").split("\r\n")
                    headers = {
                        k.strip().lower(): v.strip()
                        for k, _, v in (line.partition(":") for line in lines[1:])
                    }
                    status = int(lines[0].split(" ")[1])
                    if 100 <= status < 200:  # interim (100 Continue): the answer follows
                        received = rest
                        continue
                    length = int(headers.get("content-length", "0"))
                    if len(rest) >= length:
                        return status, headers, rest[:length]
                try:
                    chunk = tls.recv(65536)
                except (ssl.SSLError, OSError):
                    chunk = b""
                if not chunk:
                    break
                received += chunk
    assert not received, f"a partial answer: {received[:300]!r}"
    return None


def check_answer(server: Server, data: bytes) -> int:
    answer = first_answer(server, data)
    assert answer is not None, f"no answer to {data[:200]!r}"
    status, headers, body = answer
    assert status < 500, (status, body[:300], data[:200])
    if status >= 400:
        assert headers.get("content-type") == "application/json", (status, headers, data[:200])
        assert "error" in json.loads(body)
    return status


@pytest.mark.parametrize("name", MALFORMED)
def test_each_malformed_request_is_a_json_refusal(server: Server, name: str) -> None:
    status = check_answer(server, MALFORMED[name])
    assert 400 <= status < 500, status


def mutate(rng: random.Random, request: bytes) -> bytes:
    """One to four random edits of a valid request: bytes flipped, inserted, deleted or
    duplicated, header lines added, lengths and codings changed."""
    data = bytearray(request)
    for _ in range(rng.randint(1, 4)):
        edit = rng.randrange(8)
        at = rng.randrange(len(data) + 1)
        if edit == 0 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif edit == 1:
            data[at:at] = rng.choice([b"\r\n", b"\n", b" ", b":", b"\x00", b"\r\n\r\n", b";"])
        elif edit == 2:
            del data[at : at + rng.randint(1, 64)]
        elif edit == 3:
            end = at + rng.randint(1, 200)
            data[at:at] = data[at:end]
        elif edit == 4:
            header = rng.choice(
                [
                    b"Transfer-Encoding: chunked\r\n",
                    b"Content-Length: %d\r\n" % rng.randint(-5, 10**9),
                    b"Expect: 100-continue\r\n",
                    b"Connection: close\r\n",
                    b"X-" + bytes(rng.randrange(33, 127) for _ in range(8)) + b": 1\r\n",
                    b"Content-Type: application/json; charset=latin-1\r\n",
                ]
            )
            line_end = data.find(b"\r\n") + 2
            data[line_end:line_end] = header
        elif edit == 5:
            data = bytearray(data.replace(b"POST", rng.choice([b"GET", b"PUT", b"P0ST", b""]), 1))
        elif edit == 6:
            data = bytearray(
                data.replace(b"/validate", rng.choice([b"/mutate", b"/", b"/%00", b"*"]), 1)
            )
        else:
            data = data[: rng.randrange(len(data) + 1)]
    return bytes(data)


def test_seeded_fuzz_of_requests_gets_json_answers_and_no_server_error(server: Server) -> None:
    rng = random.Random(SEED)
    requests = [mutate(rng, valid_request()) for _ in range(ITERATIONS)]
    # Nothing sent is no request to answer. Many requests wait for a deadline (a body shorter
    # than its length): sent side by side, which the server must take in its stride anyway.
    requests = [data for data in requests if data.strip()]
    with ThreadPoolExecutor(max_workers=16) as pool:
        answered = list(pool.map(lambda data: check_answer(server, data), requests))
    statuses = Counter(answered)
    assert sum(statuses.values()) == len(requests) > ITERATIONS * 0.9
    # The fuzzer reaches both sides: requests still decided, and refusals.
    assert statuses[200] > 0 and sum(n for s, n in statuses.items() if s >= 400) > 0, statuses
    errors = [r for r in server.log_records() if r.get("level") == "error"]
    assert not errors, errors[:3]
