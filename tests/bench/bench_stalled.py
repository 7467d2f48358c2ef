"""Stalled clients against the served webhook: part of ``make bench``.

A separate process (``tests.stalling --replenish``) keeps ``count`` connections of one kind
stalled (one the server closes is replaced). Once all are established, a keep-alive client
posts a GPU Pod review at a fixed rate and a second client opens a fresh connection for each
of its probes; both record latencies. The same for each kind in turn, then for all kinds at
once. Then a holder opens ``count`` of each kind again, one kind at a time, and records how
long each lived: the server must close it within its phase deadline plus a second.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from tests.serving import REPO, Server, fixture_bytes, post_json
from tests.stalling import KINDS, PHASES
from webhook.server.settings import Deadlines

GPU_POD = fixture_bytes("admission-review-gpu-pod.json")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def _paced(server: Server, rate: float, count: int, fresh: bool, out: list[float]) -> None:
    """``count`` reviews at ``rate`` per second, on one kept connection or a fresh one each."""
    conn = None if fresh else server.connection(timeout=30)
    start = time.monotonic()
    for n in range(count):
        time.sleep(max(0.0, start + n / rate - time.monotonic()))
        probe = server.connection(timeout=30) if fresh else conn
        assert probe is not None
        began = time.monotonic()
        try:
            reply = post_json(probe, "/validate", GPU_POD)
            out.append(time.monotonic() - began if reply.status == 200 else float("inf"))
        except OSError:
            out.append(float("inf"))
            if not fresh:
                probe.close()
                conn = probe = server.connection(timeout=30)
        finally:
            if fresh:
                probe.close()
    if conn is not None:
        conn.close()


def _holder(
    server: Server, count: int, seconds: float, replenish: bool, kinds: tuple[str, ...] = KINDS
) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.stalling", "--port", str(server.port)]
        + ["--ca", str(server.ca), "--count", str(count), "--hold", str(seconds)]
        + (["--replenish"] if replenish else [])
        + [arg for kind in kinds for arg in ("--kind", kind)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    json.loads(holder.stdout.readline())  # all established
    return holder


def _under_pressure(
    server: Server, count: int, rate: float, requests: int, kinds: tuple[str, ...]
) -> dict:
    """Latencies of a keep-alive client (``requests`` at ``rate``) and of fresh connections
    (a tenth as many, at a tenth of the rate) while ``count`` connections of each of
    ``kinds`` are held and replaced as the server closes them."""
    holder = _holder(server, count, requests / rate + 60, replenish=True, kinds=kinds)
    try:
        kept: list[float] = []
        fresh: list[float] = []
        fresh_probes = threading.Thread(
            target=_paced, args=(server, rate / 10, requests // 10, True, fresh)
        )
        fresh_probes.start()
        _paced(server, rate, requests, False, kept)
        fresh_probes.join()
        holder.terminate()
        holder.communicate(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)
    return {
        "kept_p50": percentile(kept, 0.50),
        "kept_p99": percentile(kept, 0.99),
        "kept_n": len(kept),
        "fresh_p50": percentile(fresh, 0.50),
        "fresh_p99": percentile(fresh, 0.99),
        "fresh_max": max(fresh),
        "fresh_n": len(fresh),
    }


def bench_stalled(server: Server, count: int, rate: float, requests: int) -> dict:
    """Figures for ``count`` stalled connections of each kind.

    Under pressure first, one kind at a time (what the issue's acceptance measures): every
    connection the server closes is replaced while the probes run. Then all kinds at once,
    more than the server's connection cap when ``count`` is 1,000: the worker makes room by
    closing the connections that waited longest (``webhook.server.room``), and the fresh
    probes wait behind the holder's own connections in the kernel's accept queue. Then
    lifetimes, one kind at a time and without replacement: the holder does nothing but
    watch, so it sees each close as it happens (replacing thousands of TLS connections a
    second is more than one holder process can do, and its clock then drifts from the
    server's)."""
    deadlines = Deadlines()
    phase_deadline = {
        "handshake": deadlines.handshake,
        "headers": deadlines.headers,
        "first request": deadlines.headers,
        "body": deadlines.body(2000),  # the holder's half-sent body announces 2,000 bytes
        "idle": deadlines.idle,
    }
    pressure = {}
    for kind in KINDS:
        pressure[kind] = _under_pressure(server, count, rate, requests, (kind,))
        time.sleep(2)  # the holder's connections, closed by it, are gone from the server
    overload = _under_pressure(server, count, rate, requests // 2, KINDS)
    closed: dict[str, list[float | None]] = {}
    for kind in KINDS:  # one kind at a time, as a client's clock sees each phase begin
        time.sleep(deadlines.handshake + 2)  # what the previous holder left is closed
        seconds = phase_deadline[PHASES[kind]] + 15
        holder = _holder(server, count, seconds, replenish=False, kinds=(kind,))
        try:
            closed.update(json.loads(holder.communicate(timeout=seconds + 60)[0])["closed"])
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait(timeout=10)
    lifetimes = {}
    for kind in KINDS:
        times = [t for t in closed[kind] if t is not None]
        deadline = phase_deadline[PHASES[kind]]
        lifetimes[kind] = {
            "closed": len(times),
            "open": closed[kind].count(None),
            "deadline": deadline,
            "max": max(times, default=float("nan")),
            "late": sum(t > deadline + 1.0 for t in times),
        }
    return {
        "pressure": pressure,
        "overload": overload,
        "cap": deadlines.max_connections,
        "lifetimes": lifetimes,
    }


def _latencies(name: str, figures: dict) -> None:
    print(
        f"  {name:<24} keep-alive p50 {figures['kept_p50'] * 1000:6.1f} ms"
        f" p99 {figures['kept_p99'] * 1000:6.1f} ms ({figures['kept_n']});"
        f" fresh p50 {figures['fresh_p50'] * 1000:6.1f} ms"
        f" p99 {figures['fresh_p99'] * 1000:7.1f} ms max {figures['fresh_max'] * 1000:7.1f} ms"
        f" ({figures['fresh_n']})"
    )


def report(figures: dict, count: int) -> None:
    print(
        f"stalled clients: {count} of one kind held at a time, replaced as the server closes"
        " them, while a keep-alive client posts /validate at 50/s and fresh connections at 5/s"
        " (requests in brackets):"
    )
    for kind, latencies in figures["pressure"].items():
        _latencies(kind, latencies)
    print(
        f"all {len(KINDS)} kinds at once: {count * len(KINDS)} held, over the server's cap of"
        f" {figures['cap']} connections (a fresh connection waits behind the holder's in the"
        " kernel's accept queue while the worker makes room):"
    )
    _latencies("all kinds", figures["overload"])
    print(f"lifetimes of {count} connections of one kind at a time, not replaced:")
    for kind, life in figures["lifetimes"].items():
        print(
            f"  {kind:<24} closed {life['closed']:5d} (open {life['open']}), longest"
            f" {life['max']:7.2f} s (deadline {life['deadline']:.2f} s),"
            f" later than deadline + 1 s: {life['late']}"
        )
