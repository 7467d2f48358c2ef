"""Clients that attack the server's time rather than stall: run as a separate process
(``python -m tests.abusive KIND --port P --ca CA --seconds S``) so that its CPU is not the
test's. For ``S`` seconds it attacks, on one connection after another; then it prints one
JSON line: a list with, for each connection, ``{"status": <HTTP status or null>,
"closed_after": <seconds from the first byte to the server's close, or null when still
open at the end>, "sent": n}``.

Kinds:

``tiny-records-head``
    A request head sent one byte per TLS record, as fast as this process can, that never ends:
    gunicorn's parser copied and searched its whole buffer on every record, so a few such
    clients kept a worker busy past its heartbeat.
``tiny-records-body``
    A complete head announcing a 1 MiB body, then the body one byte per TLS record.
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import sys
import time

HEAD_START = b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: "
BODY_HEAD = (
    b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1048576\r\n\r\n"
)
KINDS = ("tiny-records-head", "tiny-records-body")


def attacks(kind: str, port: int, ca: str, seconds: float) -> list[dict[str, object]]:
    """One attack after another until ``seconds`` have passed."""
    ends = time.monotonic() + seconds
    results = []
    while (left := ends - time.monotonic()) > 0:
        results.append(attack(kind, port, ca, left))
    return results


def attack(kind: str, port: int, ca: str, seconds: float) -> dict[str, object]:
    context = ssl.create_default_context(cafile=ca)
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
    sock.sendall(HEAD_START if kind == "tiny-records-head" else BODY_HEAD)
    started = time.monotonic()
    sent = 0
    sock.settimeout(0.5)
    try:
        while time.monotonic() - started < seconds:
            sock.send(b"a" if kind == "tiny-records-head" else b" ")  # one TLS record each
            sent += 1
    except (OSError, ssl.SSLError):
        pass  # the server closed the connection (or stopped reading): see what it said
    closed_after = time.monotonic() - started
    sock.settimeout(5)
    status = None
    try:
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        if reply.startswith(b"HTTP/1.1 "):
            status = int(reply[9:12])
    except (OSError, ssl.SSLError):
        pass
    finally:
        sock.close()
    timed_out = closed_after >= seconds
    return {"status": status, "closed_after": None if timed_out else closed_after, "sent": sent}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.abusive")
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    print(json.dumps(attacks(args.kind, args.port, args.ca, args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
