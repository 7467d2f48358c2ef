"""What the node inventory's DRA watch costs: one list of thousands of ResourceClaimTemplates
(the gpu-test5 shape of NVIDIA's quickstarts) in the inventory's process, and what the worker
keeps of them, for templates that all differ and for templates that differ in their names only
(one chart's, in many namespaces). The fake API server runs in a process of its own, so that
neither its CPU nor its memory is counted. Run with ``python -m tests.bench.bench_dra_feed
[--templates 5000]``; the figures are in ``webhook.server.dra_feed``'s docstring."""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from tests.kubeapi import FakeKubeAPI
from tests.test_dra_inventory import claim_template, gpu_class

ROUNDS = 5


def serve(count: int, kubeconfig: Path, distinct: bool) -> None:
    """The fake API server with ``count`` templates in 50 namespaces, until killed."""
    api = FakeKubeAPI().start()
    api.add(gpu_class())
    for index in range(count):
        strategy = "MPS" if index % 2 else "TimeSlicing"
        template = claim_template(f"team-{index % 50}", f"job-{index:05d}", strategy)
        if distinct:  # a request name of its own: nothing to share
            devices = template["spec"]["spec"]["devices"]
            devices["requests"][0]["name"] = devices["config"][0]["requests"][0] = f"gpu-{index}"
        api.add(template)
    api.write_kubeconfig(kubeconfig)
    print("ready", flush=True)
    time.sleep(3600)


def measure(count: int, distinct: bool, page_size: int) -> str:
    from kubernetes import client as k8s

    from webhook.cluster.connection import connect
    from webhook.cluster.watching import WatchCache
    from webhook.server.dra_feed import (
        DRA_OPTIONS,
        SharedTemplates,
        claim_template_from_json,
        claim_template_json,
        template_json,
    )

    with tempfile.TemporaryDirectory(prefix="bench-dra-feed-") as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        command = [sys.executable, "-m", "tests.bench.bench_dra_feed", "--serve", str(count)]
        command += [str(kubeconfig), "distinct" if distinct else "same"]
        server = subprocess.Popen(command, stdout=subprocess.PIPE)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
            os.environ["KUBECONFIG"] = str(kubeconfig)
            cluster = connect()
            resources = k8s.ResourceV1Api(cluster.api_client)
            # The pauses between pages take no CPU: left out, the list is timed alone.
            options = replace(DRA_OPTIONS, page_size=page_size, page_pause_seconds=0.0)
            listing = resources.list_resource_claim_template_for_all_namespaces

            def list_once() -> WatchCache[bytes | None]:
                cache = WatchCache(cluster, listing, claim_template_json, options=options)
                cache._list(threading.Event())
                return cache

            sent = json.loads(listing(limit=1, _preload_content=False).data)["items"][0]
            list_once()  # the client's imports, connection and TLS, once
            seconds = []
            for _ in range(ROUNDS):
                started = time.thread_time()  # this thread's CPU: the list, not the server's
                list_once()
                seconds.append(time.thread_time() - started)
            gc.collect()
            tracemalloc.start()
            cache = list_once()
            gc.collect()
            kept, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            items = list(cache.state.items.items())
            assert len(items) == count
            lines = [
                orjson.dumps({"claimTemplates": [[k[0], k[1], template_json(v)] for k, v in part]})
                for part in (items[i : i + 100] for i in range(0, count, 100))
            ]
            gc.collect()
            tracemalloc.start()
            shared, worker = SharedTemplates(), {}
            for line in lines:
                for record in orjson.loads(line)["claimTemplates"]:
                    read: Any = claim_template_from_json(record, shared)
                    worker[read[0]] = read[1]
            gc.collect()
            worker_kept = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
        finally:
            server.kill()
            server.wait()
    mib = 2**20
    return (
        f"{count} templates ({'all different' if distinct else 'differing in names only'}), "
        f"{len(json.dumps(sent))} B each as sent, pages of {page_size}: a list took "
        f"{min(seconds):.2f} to {max(seconds):.2f} s of CPU over {ROUNDS} runs; the process "
        f"keeps {kept / mib:.1f} MiB (high-water {peak / mib:.1f}); the worker "
        f"{worker_kept / mib:.1f} MiB; {sum(map(len, lines)) / 1e6:.1f} MB of lines"
    )


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "distinct")
        return
    parser = argparse.ArgumentParser(prog="bench_dra_feed", description=__doc__.split("\n")[0])
    parser.add_argument("--templates", type=int, default=5000)
    args = parser.parse_args()
    from webhook.server.dra_feed import DRA_OPTIONS

    for distinct in (True, False):
        print(measure(args.templates, distinct, DRA_OPTIONS.page_size))
    print(measure(args.templates, True, 500))


if __name__ == "__main__":
    main()
