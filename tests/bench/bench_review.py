"""How fast is a decision, and what does serving it cost? Run by ``make bench``.

(a) ``webhook.review()`` of a typical GPU Pod under the packaged default policy, in
    microseconds per call: the best of several timeit repeats, for /validate and /mutate,
    and the ``json.loads`` of the request body for comparison.
(b) Requests per second of the served webhook (``gpu-admission serve``, POST /validate)
    and of a bare Flask app (a fixed JSON answer) under the same gunicorn settings and TLS,
    from client processes on 127.0.0.1 that each keep one connection alive and post the same
    AdmissionReview in a loop for a bounded time. The ratio is the share of the bare
    server's throughput that the webhook keeps.

The client is Python too and shares the machine's cores with the server, so (b) is a
comparison under the same load, not a capacity figure for a cluster.
"""

from __future__ import annotations

import argparse
import http.client
import json
import ssl
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import webhook
from tests.serving import (
    Server,
    client_context,
    fixture_bytes,
    make_certificates,
)

FIXTURE = "admission-review-gpu-pod.json"


def bench_review(number: int, repeat: int) -> dict[str, float]:
    """Microseconds per call, best of ``repeat`` runs of ``number`` calls.

    Each call decides a freshly parsed review, as a request does (the same dict over and
    over runs faster than any request would); the parse is timed alone and subtracted.
    """
    policy = webhook.load_policy(webhook.default_policy_path())
    body = fixture_bytes(FIXTURE)

    def best(statement: Callable[[], object]) -> float:
        return min(timeit.repeat(statement, number=number, repeat=repeat)) / number * 1e6

    parse = best(lambda: json.loads(body))
    results = {"json.loads": parse}
    for endpoint, mutate in (("validate", False), ("mutate", True)):
        webhook.review(json.loads(body), policy, mutate=mutate)  # warm caches first
        total = best(lambda mutate=mutate: webhook.review(json.loads(body), policy, mutate=mutate))
        results[f"review {endpoint}"] = total - parse
    return results


def _client(port: int, ca: str, path: str, body: bytes, seconds: float) -> tuple[int, int]:
    """One keep-alive connection posting ``body`` until ``seconds`` pass: (ok, errors)."""
    context: ssl.SSLContext = client_context(Path(ca))
    headers = {"Content-Type": "application/json"}
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    ok = errors = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                ok += 1
            else:
                errors += 1
        except (OSError, http.client.HTTPException):
            errors += 1
            conn.close()
    conn.close()
    return ok, errors


def load(port: int, ca: Path, path: str, body: bytes, clients: int, seconds: float) -> dict:
    """Requests per second from ``clients`` processes for ``seconds``."""
    with ProcessPoolExecutor(max_workers=clients) as pool:
        started = time.monotonic()
        futures = [pool.submit(_client, port, str(ca), path, body, seconds) for _ in range(clients)]
        results = [future.result(timeout=seconds + 60) for future in futures]
        elapsed = time.monotonic() - started
    ok = sum(r[0] for r in results)
    return {"rps": ok / elapsed, "ok": ok, "errors": sum(r[1] for r in results)}


def bench_served(workers: int, clients: int, seconds: float) -> dict[str, dict]:
    body = fixture_bytes(FIXTURE)
    with tempfile.TemporaryDirectory(prefix="gpu-admission-bench-") as tmp:
        directory = Path(tmp)
        pki = make_certificates(directory / "pki")
        common = {
            "policy": webhook.default_policy_path(),
            "cert": pki.tls_cert,
            "key": pki.tls_key,
            "ca": pki.ca_cert,
            "workers": workers,
            "drain_seconds": 0,
        }
        results = {}
        bare = Server(log_path=directory / "bare.log", module="tests.bench.bare_app", **common)
        bare.start(all_workers=False)
        try:
            results["bare"] = load(bare.port, pki.ca_cert, "/", body, clients, seconds)
        finally:
            bare.stop()
        served = Server(log_path=directory / "webhook.log", **common).start()
        try:
            results["webhook"] = load(served.port, pki.ca_cert, "/validate", body, clients, seconds)
        finally:
            served.stop()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_review", description=__doc__.split("\n")[0])
    parser.add_argument("--number", type=int, default=2000, help="review() calls per repeat")
    parser.add_argument("--repeat", type=int, default=7, help="timeit repeats")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--seconds", type=float, default=5.0, help="load per server")
    args = parser.parse_args(argv)

    per_call = bench_review(args.number, args.repeat)
    print(f"review() of {FIXTURE} under the default policy")
    print(f"  (best of {args.repeat} x {args.number} calls)")
    for name, micros in per_call.items():
        print(f"  {name:<16} {micros:8.1f} us/call")

    served = bench_served(args.workers, args.clients, args.seconds)
    print(
        f"served over TLS: gthread, {args.workers} workers, "
        f"{args.clients} keep-alive clients x {args.seconds:g} s"
    )
    for name, label in (("bare", "bare Flask POST /"), ("webhook", "webhook POST /validate")):
        result = served[name]
        print(f"  {label:<24} {result['rps']:8.0f} req/s  ({result['errors']} errors)")
    print(f"  ratio webhook/bare      {served['webhook']['rps'] / served['bare']['rps']:8.2f}")
    return 1 if any(result["errors"] for result in served.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
