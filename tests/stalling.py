"""Clients that stall: many connections held open against a server, each stuck in one phase.

Run as a separate process (``python -m tests.stalling``) so that the connections it holds do
not share a process, a GIL or a file-descriptor table with the client that measures the
server meanwhile. It opens ``--count`` connections of each ``--kind``, prints one JSON line
``{"established": {...}}`` when all are open, keeps them stalled (slowloris ones get a byte
every second), and when each is closed by the server records how long after its stall began.
With ``--replenish`` each connection the server closes is replaced by a new one, so that
``--count`` of each kind stay open. On SIGTERM, or after ``--hold`` seconds, it prints
``{"closed": {kind: [seconds or null]}}`` (null: still open) and exits. Every wait is
bounded; only 127.0.0.1 is dialled.
"""

from __future__ import annotations

import argparse
import json
import resource
import selectors
import signal
import socket
import ssl
import sys
import time
from dataclasses import dataclass, field

KINDS = ("idle-tcp", "partial-client-hello", "silent-after-handshake", "slowloris", "half-body")

# The phase each kind stalls in; its deadline is the server's setting of that name (a first
# request has the headers' deadline).
PHASES = {
    "idle-tcp": "handshake",
    "partial-client-hello": "handshake",
    "silent-after-handshake": "first request",
    "slowloris": "headers",
    "half-body": "body",
}

# The first byte of a TLS record carrying a handshake message: a ClientHello begun, never ended.
CLIENT_HELLO_START = b"\x16"
HALF_BODY_HEAD = (
    b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2000\r\n\r\n" + b" " * 1000
)
SLOWLORIS_START = b"POST /validate HTTP/1.1\r\n"
SLOWLORIS_LINE = b"X-Trickle: 1\r\n"


@dataclass
class Stalled:
    kind: str
    sock: socket.socket
    stalled_at: float
    closed_after: float | None = None
    trickled: int = field(default=0)


def raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def open_one(kind: str, port: int, context: ssl.SSLContext) -> Stalled:
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    if kind == "idle-tcp":
        sock: socket.socket = raw
    elif kind == "partial-client-hello":
        raw.sendall(CLIENT_HELLO_START)
        sock = raw
    else:
        sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
        if kind == "slowloris":
            sock.sendall(SLOWLORIS_START)
        elif kind == "half-body":
            sock.sendall(HALF_BODY_HEAD)
    stalled = Stalled(kind, sock, time.monotonic())
    sock.setblocking(False)
    return stalled


def _closed(conn: Stalled) -> bool:
    """Read what the server sent; True once it has closed the connection."""
    try:
        while True:
            data = conn.sock.recv(65536)
            if not data:
                return True
    except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
        return False
    except OSError:
        return True


def hold(
    kinds: list[str], count: int, port: int, ca: str, seconds: float, replenish: bool = False
) -> dict:
    raise_fd_limit(count * len(kinds) + 256)
    context = ssl.create_default_context(cafile=ca)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    selector = selectors.DefaultSelector()
    conns: list[Stalled] = []
    # The kinds that need a handshake first: the others are opened in no time, and would
    # otherwise reach their deadline before the last handshake is done.
    for kind in sorted(kinds, key=lambda k: PHASES[k] == "handshake"):
        for _ in range(count):
            conn = open_one(kind, port, context)
            conns.append(conn)
            selector.register(conn.sock, selectors.EVENT_READ, conn)
    print(json.dumps({"established": {k: count for k in kinds}}), flush=True)
    end = time.monotonic() + seconds
    next_trickle = time.monotonic() + 1.0
    open_count = len(conns)
    while not stopping and open_count and time.monotonic() < end:
        for key, _ in selector.select(timeout=0.2):
            conn = key.data
            if _closed(conn):
                conn.closed_after = time.monotonic() - conn.stalled_at
                selector.unregister(conn.sock)
                conn.sock.close()
                open_count -= 1
                if replenish:  # the attacker opens another: the pressure stays
                    fresh = open_one(conn.kind, port, context)
                    conns.append(fresh)
                    selector.register(fresh.sock, selectors.EVENT_READ, fresh)
                    open_count += 1
        if time.monotonic() >= next_trickle:
            next_trickle += 1.0
            for conn in conns:
                if conn.kind == "slowloris" and conn.closed_after is None:
                    try:
                        conn.sock.send(SLOWLORIS_LINE[conn.trickled % len(SLOWLORIS_LINE) :][:1])
                        conn.trickled += 1
                    except (ssl.SSLWantWriteError, BlockingIOError, OSError):
                        pass
    closed: dict[str, list[float | None]] = {kind: [] for kind in kinds}
    for conn in conns:
        closed[conn.kind].append(None if conn.closed_after is None else round(conn.closed_after, 3))
        if conn.closed_after is None:
            conn.sock.close()
    return {"closed": closed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--kind", action="append", choices=KINDS, required=True)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--hold", type=float, default=180.0)
    parser.add_argument(
        "--replenish", action="store_true", help="open a new one for each one the server closes"
    )
    args = parser.parse_args(argv)
    result = hold(args.kind, args.count, args.port, args.ca, args.hold, args.replenish)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
