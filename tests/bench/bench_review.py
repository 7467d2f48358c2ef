"""How fast is a decision, and what does serving it cost? Run by ``make bench``.

(a) ``webhook.review()`` under the packaged default policy, in microseconds per call (best
    of several repeats; each call timed alone, on a review parsed just before it), for
    /validate and /mutate: the typical GPU Pod of the test fixtures, a 13 KB Pod as a Job
    controller makes it, and the fixture with 1,000 containers.
(b) The served webhook (``gpu-admission serve``) against two baselines: the reference, a
    bare Flask route (reads the body, decodes it with orjson, answers "allowed" with its
    uid) on vanilla gunicorn (one gthread worker, 8 threads, same TLS); and the bare stack, the
    same route under the webhook's own gunicorn worker and TLS (``bare_app``). The load is
    wrk (Debian's ``wrk``) with 8 keep-alive connections when it is installed; otherwise
    client processes on 127.0.0.1, each keeping one connection alive and posting in a loop
    (Python clients take a larger share of the cores, which narrows the gap). Bounded in
    time; the four targets take turns, five rounds; once with the typical fixture, once
    with the 13 KB Pod. Reported: the median round's requests per second, p50 and p99, the
    webhook's ratios of those medians to each baseline's, and the throughput ratio of each
    round to the baseline's round run just before it.
(c) The largest review the API server sends: an UPDATE of a 3 MiB Pod (two 3 MiB objects),
    over the wire.
(d) Memory (RSS) of the worker after all of the above.
(e) Stalled clients (``bench_stalled``).

The clients are Python too and share the machine's cores with the servers, so (b) is a
comparison under the same load, not a capacity figure for a cluster.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import orjson

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


def realistic_review(review: dict) -> dict:
    """The review as the API server sends it for a Pod a Job controller made, about 14 KB:
    the fixture's Pod with the generated name, owner, labels, managed fields, environment,
    mounts, projected token volume and default tolerations such a Pod carries."""
    review = json.loads(json.dumps(review))
    request = review["request"]
    request["options"] = {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
    pod = request["object"]
    uid = "0c7a4d3e-58f2-4b8e-9a61-2f3b9c7d1e55"
    pod["metadata"].update(
        generateName="train-resnet-",
        labels={
            "app": "trainer",
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": "train-resnet",
            "controller-uid": uid,
            "job-name": "train-resnet",
            "team": "vision",
        },
        annotations={"kubectl.kubernetes.io/default-container": "train"},
        ownerReferences=[
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "train-resnet",
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        managedFields=[
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "apiVersion": "v1",
                "time": "2026-12-01T10:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {
                        f"f:{k}": {} for k in ("generateName", "labels", "ownerReferences")
                    },
                    "f:spec": {
                        f'k:{{"name":"c{i}"}}': {"f:env": {}, "f:image": {}, "f:resources": {}}
                        for i in range(70)
                    },
                },
            }
        ],
    )
    spec = pod["spec"]
    main = spec["containers"][0]
    main["env"] = [{"name": f"TRAINING_SETTING_{i}", "value": f"value-{i:04d}"} for i in range(80)]
    main["env"] += [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    main["volumeMounts"] = [
        {"name": "data", "mountPath": "/data", "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {
            "name": "kube-api-access-x7k2p",
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            "readOnly": True,
        },
    ]
    main.update(
        terminationMessagePath="/dev/termination-log",
        terminationMessagePolicy="File",
        imagePullPolicy="IfNotPresent",
    )
    spec["initContainers"] = [
        {
            "name": "fetch-data",
            "image": "busybox:1.36",
            "command": ["sh", "-c", "cp -r /src/. /data/"],
            "volumeMounts": main["volumeMounts"][:1],
            "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}},
        }
    ]
    spec["volumes"] = [
        {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
        {
            "name": "kube-api-access-x7k2p",
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                    {
                        "downwardAPI": {
                            "items": [
                                {
                                    "path": "namespace",
                                    "fieldRef": {
                                        "apiVersion": "v1",
                                        "fieldPath": "metadata.namespace",
                                    },
                                }
                            ]
                        }
                    },
                ],
            },
        },
    ]
    spec.update(
        dnsPolicy="ClusterFirst",
        enableServiceLinks=True,
        preemptionPolicy="PreemptLowerPriority",
        priority=0,
        schedulerName="default-scheduler",
        securityContext={},
        terminationGracePeriodSeconds=30,
        tolerations=[
            {
                "key": f"node.kubernetes.io/{taint}",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
            for taint in ("not-ready", "unreachable")
        ],
    )
    return review


def bench_review(number: int, repeat: int) -> dict[str, float]:
    """Microseconds per call, best of ``repeat`` runs of ``number`` calls (fewer for the big
    Pod). Each call decides a review parsed (by orjson, as the server parses) just before it,
    as a request does; only the call is timed, so no parse time is subtracted."""
    policy = webhook.load_policy(webhook.default_policy_path())
    typical = fixture_bytes(FIXTURE)
    big = json.dumps(with_containers(json.loads(typical), 999)).encode()
    realistic = json.dumps(realistic_review(json.loads(typical))).encode()
    results = {}
    for label, body, calls in (
        ("typical", typical, number),
        (f"{len(realistic) // 1000} KB controller Pod", realistic, number // 2),
        ("1,000 containers", big, 5),
    ):
        for endpoint, mutate in (("validate", False), ("mutate", True)):
            webhook.review(orjson.loads(body), policy, mutate=mutate)  # warm caches first
            runs = [_time_review(body, policy, mutate, calls) for _ in range(repeat)]
            results[f"{label} {endpoint}"] = min(runs) / calls * 1e6
    return results


def _time_review(body: bytes, policy: webhook.Policy, mutate: bool, calls: int) -> float:
    """Seconds ``calls`` reviews of ``body`` take, each of a review freshly parsed."""
    clock = time.perf_counter
    review = webhook.review
    total = 0.0
    for _ in range(calls):
        parsed = orjson.loads(body)
        started = clock()
        review(parsed, policy, mutate=mutate)
        total += clock() - started
    return total


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
    """Requests per second, p50 and p99 from ``clients`` processes for ``seconds``."""
    started = time.monotonic()
    futures = [pool.submit(_client, port, str(ca), path, body, seconds) for _ in range(clients)]
    results = [future.result(timeout=seconds + 60) for future in futures]
    elapsed = time.monotonic() - started
    latencies = [t for r in results for t in r[0]]
    return {
        "rps": len(latencies) / elapsed,
        "p50": percentile(latencies, 0.50),
        "p99": percentile(latencies, 0.99),
        "errors": sum(r[1] for r in results),
    }


_WRK_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local file = io.open("{body}", "rb")
wrk.body = file:read("*a")
file:close()
"""
_WRK_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def load_wrk(port: int, path: str, body_file: Path, connections: int, seconds: float) -> dict:
    """Requests per second and the p50/p99 latencies of one wrk run (one thread)."""
    script = body_file.with_suffix(".lua")
    script.write_text(_WRK_SCRIPT.format(body=body_file))
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s"]
    command += [str(script), f"https://127.0.0.1:{port}{path}"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout

    def latency(percent: int) -> float:
        value, unit = re.search(rf"^\s+{percent}%\s+([\d.]+)(us|ms|s)$", out, re.M).groups()
        return float(value) * _WRK_UNITS[unit]

    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50": latency(50),
        "p99": latency(99),
        "errors": (int(non_2xx.group(1)) if non_2xx else 0)
        + (sum(int(n) for n in re.findall(r"\d+", socket_errors.group(1))) if socket_errors else 0),
    }


def worker_rss_mib(server: Server) -> list[float]:
    """Resident memory of the worker process of ``server``."""
    sizes = []
    for child in server.child_pids():
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
    typical = fixture_bytes(FIXTURE)
    bodies = {
        "the typical fixture": typical,
        "a controller-made Pod": json.dumps(realistic_review(json.loads(typical))).encode(),
    }
    with tempfile.TemporaryDirectory(prefix="gpu-admission-bench-") as tmp:
        directory = Path(tmp)
        pki = make_certificates(directory / "pki")
        common = {
            "policy": webhook.default_policy_path(),
            "cert": pki.tls_cert,
            "key": pki.tls_key,
            "ca": pki.ca_cert,
            "drain_seconds": 0,
            "cpus": args.server_cpus,
        }
        reference = Server(
            log_path=directory / "reference.log",
            vanilla_gunicorn_app="tests.bench.bare_app:reference_app",
            **common,
        )
        bare = Server(log_path=directory / "bare.log", module="tests.bench.bare_app", **common)
        served = Server(log_path=directory / "webhook.log", **common)
        targets = {
            "reference": (reference, "/"),
            "bare": (bare, "/"),
            "validate": (served, "/validate"),
            "mutate": (served, "/mutate"),
        }
        rounds: dict[str, dict[str, list[dict]]] = {
            label: {name: [] for name in targets} for label in bodies
        }
        use_wrk = args.load == "wrk" or (args.load == "auto" and shutil.which("wrk"))
        reference.start()
        bare.start()
        served.start()
        try:
            with ProcessPoolExecutor(max_workers=args.clients) as pool:
                for label, body in bodies.items():
                    body_file = directory / f"body-{len(body)}.json"
                    body_file.write_bytes(body)
                    for _ in range(ROUNDS):
                        for name, (server, path) in targets.items():
                            if use_wrk:
                                result = load_wrk(
                                    server.port, path, body_file, args.connections, args.seconds
                                )
                            else:
                                result = load(
                                    pool,
                                    server.port,
                                    pki.ca_cert,
                                    path,
                                    body,
                                    args.clients,
                                    args.seconds,
                                )
                            rounds[label][name].append(result)
            size, seconds, status = largest_review(served)
            rss = worker_rss_mib(served)
            stalled = None
            if args.stalled:
                stalled = bench_stalled(served, args.stalled, 50.0, 2000)
        finally:
            reference.stop()
            bare.stop()
            served.stop()

    clients = (
        f"wrk, {args.connections} keep-alive connections"
        if use_wrk
        else f"{args.clients} keep-alive Python clients (no wrk installed)"
    )
    for label, body in bodies.items():
        print(
            f"\nserved over TLS, {label} ({len(body)} B): one gevent worker"
            + (f" on CPUs {args.server_cpus}" if args.server_cpus else "")
            + f", {clients} x {args.seconds:g} s, {ROUNDS} alternating rounds"
        )
        _print_comparison(rounds[label])
    print(
        f"largest review: UPDATE of {size / 2**20:.1f} MiB answered {status} "
        f"in {seconds * 1000:.0f} ms"
    )
    print("memory per worker: " + ", ".join(f"{mib:.0f} MiB" for mib in rss))
    if stalled is not None:
        report(stalled, args.stalled)


def _print_comparison(rounds: dict[str, list[dict]]) -> None:
    """Each target's median round, and the webhook's ratios of medians to the bare stack.
    The ratios of rounds run back to back are printed too: on a shared machine one round in
    five can run at half speed, and they show which."""
    summary = {}
    for name, results in rounds.items():
        summary[name] = {
            "rps": statistics.median(r["rps"] for r in results),
            "errors": sum(r["errors"] for r in results),
            "p50": statistics.median(r["p50"] for r in results),
            "p99": statistics.median(r["p99"] for r in results),
        }
        s = summary[name]
        print(
            f"  {name:<9} {s['rps']:8.0f} req/s   p50 {s['p50'] * 1000:6.2f} ms   "
            f"p99 {s['p99'] * 1000:6.2f} ms   ({s['errors']} errors; rounds: "
            + " ".join(f"{r['rps']:.0f}" for r in results)
            + " req/s, p99 "
            + " ".join(f"{r['p99'] * 1000:.1f}" for r in results)
            + " ms)"
        )
    for base in ("reference", "bare"):
        for name in ("validate", "mutate"):
            pairs = list(zip(rounds[name], rounds[base], strict=True))
            print(
                f"  {name}/{base}: throughput "
                f"{summary[name]['rps'] / summary[base]['rps']:.2f}, "
                f"p99 {summary[name]['p99'] / summary[base]['p99']:.2f}x   (round by round: "
                + " ".join(f"{served['rps'] / other['rps']:.2f}" for served, other in pairs)
                + ")"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_review", description=__doc__.split("\n")[0])
    parser.add_argument("--number", type=int, default=2000, help="review() calls per repeat")
    parser.add_argument("--repeat", type=int, default=5, help="repeats (the best is reported)")
    parser.add_argument(
        "--server-cpus",
        metavar="LIST",
        help="pin the servers to these CPUs (taskset -c), e.g. 0 for a one-CPU limit",
    )
    parser.add_argument(
        "--load",
        choices=("auto", "wrk", "python"),
        default="auto",
        help="load generator: wrk when installed (auto), or Python client processes",
    )
    parser.add_argument("--connections", type=int, default=8, help="wrk's connections")
    parser.add_argument("--clients", type=int, default=4, help="Python client processes")
    parser.add_argument("--seconds", type=float, default=6.0, help="load per server per round")
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
