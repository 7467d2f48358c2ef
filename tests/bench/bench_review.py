"""How fast is a decision, and what does serving it cost? Run by ``make bench``.

(a) ``webhook.review()`` under the packaged default policy, in microseconds per call (best
    of several timeit repeats), for /validate and /mutate: the typical GPU Pod of the test
    fixtures, and the same Pod with 1,000 containers.
(b) The served webhook (``gpu-admission serve``) against the bare stack (``bare_app``: a
    Flask route that reads the body, decodes it with orjson and answers "allowed" with its
    uid) under the same gunicorn worker and TLS. Client processes on 127.0.0.1 each keep one
    connection alive and post the fixture review in a loop for a bounded time; the three
    servers take turns, five rounds. Reported: the median round's requests per second, p50
    and p99 over all rounds, and the webhook's ratios to the bare stack.
(c) The largest review the API server sends: an UPDATE of a 3 MiB Pod (two 3 MiB objects),
    over the wire.
(d) Memory (RSS) of each worker after all of the above.
(e) Stalled clients (``bench_stalled``).

The clients are Python too and share the machine's cores with the servers, so (b) is a
comparison under the same load, not a capacity figure for a cluster.
"""

from __future__ import annotations

import argparse
import http.client
import json
import ssl
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import webhook
from tests.bench.bench_stalled import bench_stalled, percentile, report
from tests.serving import Server, client_context, fixture_bytes, make_certificates, post_json

FIXTURE = "admission-review-gpu-pod.json"
ROUNDS = 5


def with_containers(review: dict, containers: int) -> dict:
    """The review with ``containers`` more containers like its Pod's first."""
    review = json.loads(json.dumps(review))
    spec = review["request"]["object"]["spec"]
    spec["containers"] += [dict(spec["containers"][0], name=f"c{i}") for i in range(containers)]
    return review


def bench_review(number: int, repeat: int) -> dict[str, float]:
    """Microseconds per call, best of ``repeat`` runs of ``number`` calls (fewer for the big
    Pod). Each call decides a freshly parsed review, as a request does; the parse is timed
    alone and subtracted."""
    policy = webhook.load_policy(webhook.default_policy_path())
    typical = fixture_bytes(FIXTURE)
    big = json.dumps(with_containers(json.loads(typical), 999)).encode()
    results = {}
    for label, body, calls in (("typical", typical, number), ("1,000 containers", big, 5)):

        def best(statement: Callable[[], object], calls: int = calls) -> float:
            return min(timeit.repeat(statement, number=calls, repeat=repeat)) / calls * 1e6

        parse = best(lambda body=body: json.loads(body))
        for endpoint, mutate in (("validate", False), ("mutate", True)):
            webhook.review(json.loads(body), policy, mutate=mutate)  # warm caches first
            total = best(
                lambda body=body, mutate=mutate: webhook.review(
                    json.loads(body), policy, mutate=mutate
                )
            )
            results[f"{label} {endpoint}"] = total - parse
    return results


def _client(port: int, ca: str, path: str, body: bytes, seconds: float) -> tuple[list, int]:
    """One keep-alive connection posting ``body`` until ``seconds`` pass: (latencies, errors)."""
    context: ssl.SSLContext = client_context(Path(ca))
    headers = {"Content-Type": "application/json"}
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    latencies = []
    errors = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        began = time.perf_counter()
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                latencies.append(time.perf_counter() - began)
            else:
                errors += 1
        except (OSError, http.client.HTTPException):
            errors += 1
            conn.close()
    conn.close()
    return latencies, errors


def load(
    pool: ProcessPoolExecutor,
    port: int,
    ca: Path,
    path: str,
    body: bytes,
    clients: int,
    seconds: float,
) -> dict:
    """Requests per second and latencies from ``clients`` processes for ``seconds``."""
    started = time.monotonic()
    futures = [pool.submit(_client, port, str(ca), path, body, seconds) for _ in range(clients)]
    results = [future.result(timeout=seconds + 60) for future in futures]
    elapsed = time.monotonic() - started
    latencies = [t for r in results for t in r[0]]
    return {
        "rps": len(latencies) / elapsed,
        "latencies": latencies,
        "errors": sum(r[1] for r in results),
    }


def worker_rss_mib(server: Server) -> list[float]:
    """Resident memory of each worker process of ``server``."""
    assert server.process is not None
    pid = server.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    sizes = []
    for child in children:
        for line in Path(f"/proc/{child}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                sizes.append(int(line.split()[1]) / 1024)
    return sizes


def largest_review(server: Server) -> tuple[int, float, int]:
    """An UPDATE of a 3 MiB Pod whose new version adds a privileged container to each of its
    containers' worth of findings: (bytes, seconds, status)."""
    typical = json.loads(fixture_bytes(FIXTURE))
    container = json.dumps(typical["request"]["object"]["spec"]["containers"][0])
    count = 3 * 1024 * 1024 // len(container)
    review = with_containers(typical, count)
    admission_request = review["request"]
    admission_request["operation"] = "UPDATE"
    admission_request["oldObject"] = json.loads(json.dumps(admission_request["object"]))
    for each in admission_request["object"]["spec"]["containers"]:
        each["securityContext"] = {"privileged": True}
    body = json.dumps(review).encode()
    conn = server.connection(timeout=60)
    try:
        began = time.perf_counter()
        reply = post_json(conn, "/validate", body)
        return len(body), time.perf_counter() - began, reply.status
    finally:
        conn.close()


def bench_served(args: argparse.Namespace) -> None:
    body = fixture_bytes(FIXTURE)
    with tempfile.TemporaryDirectory(prefix="gpu-admission-bench-") as tmp:
        directory = Path(tmp)
        pki = make_certificates(directory / "pki")
        common = {
            "policy": webhook.default_policy_path(),
            "cert": pki.tls_cert,
            "key": pki.tls_key,
            "ca": pki.ca_cert,
            "workers": args.workers,
            "drain_seconds": 0,
        }
        bare = Server(log_path=directory / "bare.log", module="tests.bench.bare_app", **common)
        served = Server(log_path=directory / "webhook.log", **common)
        targets = {
            "bare": (bare, "/"),
            "validate": (served, "/validate"),
            "mutate": (served, "/mutate"),
        }
        rounds: dict[str, list[dict]] = {name: [] for name in targets}
        bare.start(all_workers=False)
        served.start()
        try:
            with ProcessPoolExecutor(max_workers=args.clients) as pool:
                for _ in range(ROUNDS):
                    for name, (server, path) in targets.items():
                        rounds[name].append(
                            load(
                                pool,
                                server.port,
                                pki.ca_cert,
                                path,
                                body,
                                args.clients,
                                args.seconds,
                            )
                        )
            size, seconds, status = largest_review(served)
            rss = worker_rss_mib(served)
            stalled = None
            if args.stalled:
                stalled = bench_stalled(served, args.stalled, 50.0, 2000)
        finally:
            bare.stop()
            served.stop()

    print(
        f"\nserved over TLS: gevent worker, {args.workers} workers, {args.clients} keep-alive "
        f"clients x {args.seconds:g} s, {ROUNDS} alternating rounds, {len(body)} B review"
    )
    summary = {}
    for name, results in rounds.items():
        latencies = [t for r in results for t in r["latencies"]]
        summary[name] = {
            "rps": statistics.median(r["rps"] for r in results),
            "p50": percentile(latencies, 0.50),
            "p99": percentile(latencies, 0.99),
            "errors": sum(r["errors"] for r in results),
        }
        s = summary[name]
        print(
            f"  {name:<9} {s['rps']:8.0f} req/s   p50 {s['p50'] * 1000:6.2f} ms   "
            f"p99 {s['p99'] * 1000:6.2f} ms   ({s['errors']} errors)"
        )
    for name in ("validate", "mutate"):
        print(
            f"  {name}/bare: throughput {summary[name]['rps'] / summary['bare']['rps']:.2f}, "
            f"p99 {summary[name]['p99'] / summary['bare']['p99']:.2f}x"
        )
    print(
        f"largest review: UPDATE of {size / 2**20:.1f} MiB answered {status} "
        f"in {seconds * 1000:.0f} ms"
    )
    print("memory per worker: " + ", ".join(f"{mib:.0f} MiB" for mib in rss))
    if stalled is not None:
        report(stalled, args.stalled)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_review", description=__doc__.split("\n")[0])
    parser.add_argument("--number", type=int, default=2000, help="review() calls per repeat")
    parser.add_argument("--repeat", type=int, default=5, help="timeit repeats")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--seconds", type=float, default=4.0, help="load per server per round")
    parser.add_argument(
        "--stalled", type=int, default=1000, help="stalled connections of each kind (0: skip)"
    )
    args = parser.parse_args(argv)

    per_call = bench_review(args.number, args.repeat)
    print(f"review() under the default policy (best of {args.repeat} repeats)")
    for name, micros in per_call.items():
        unit = f"{micros:9.1f} us" if micros < 10_000 else f"{micros / 1000:9.2f} ms"
        print(f"  {name:<28} {unit}")
    bench_served(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
