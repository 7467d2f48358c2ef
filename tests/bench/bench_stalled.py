"""Stalled clients against the served webhook: part of ``make bench``.

A separate process (``tests.stalling --replenish``) keeps ``count`` connections of each
kind stalled (one the server closes is replaced). Once all are established, a keep-alive
client posts a GPU Pod review at a fixed rate and a second client opens a fresh connection
for each of its probes; both record latencies. Then a second holder opens ``count`` of each
kind again and records how long each lived: the server must close it within its phase
deadline plus a second.
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


def bench_stalled(server: Server, count: int, rate: float, requests: int) -> dict:
    """Figures for ``count`` stalled connections of every kind held at once.

    Under pressure first: every connection the server closes is replaced while the probes
    run. Then lifetimes, one kind at a time and without replacement: the holder does nothing
    but watch, so it sees each close as it happens (replacing thousands of TLS connections
    a second is more than one holder process can do, and its clock then drifts from the
    server's)."""
    deadlines = Deadlines()
    phase_deadline = {
        "handshake": deadlines.handshake,
        "headers": deadlines.headers,
        "first request": deadlines.headers,
        "body": deadlines.body(2000),  # the holder's half-sent body announces 2,000 bytes
        "idle": deadlines.idle,
    }
    holder = _holder(server, count, requests / rate + 60, replenish=True)
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
        "kept_p50": percentile(kept, 0.50),
        "kept_p99": percentile(kept, 0.99),
        "kept_n": len(kept),
        "fresh_p50": percentile(fresh, 0.50),
        "fresh_p99": percentile(fresh, 0.99),
        "fresh_n": len(fresh),
        "lifetimes": lifetimes,
    }


def report(figures: dict, count: int) -> None:
    print(f"stalled clients: {count} of each of {len(KINDS)} kinds held at once, replaced")
    print("as the server closes them, while the probes run:")
    print(
        f"  keep-alive /validate   p50 {figures['kept_p50'] * 1000:7.1f} ms"
        f"  p99 {figures['kept_p99'] * 1000:7.1f} ms  ({figures['kept_n']} requests)"
    )
    print(
        f"  fresh connection       p50 {figures['fresh_p50'] * 1000:7.1f} ms"
        f"  p99 {figures['fresh_p99'] * 1000:7.1f} ms  ({figures['fresh_n']} probes)"
    )
    print(f"lifetimes of {count} connections of one kind at a time, not replaced:")
    for kind, life in figures["lifetimes"].items():
        print(
            f"  {kind:<24} closed {life['closed']:5d} (open {life['open']}), longest"
            f" {life['max']:7.2f} s (deadline {life['deadline']:.2f} s),"
            f" later than deadline + 1 s: {life['late']}"
        )
