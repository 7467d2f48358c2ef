"""What the node inventory costs (``serve --inventory``), against the fake API server with
thousands of realistic Nodes: the worker's memory without the inventory, with it and no
Nodes, and with every Node; how long the first list takes; and /validate's throughput and p99
while the inventory lists every Node again and again, beside the same load while it only
watches. Run with ``python -m tests.bench.bench_inventory [--nodes 5000]``."""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import webhook
from tests.bench.bench_review import FIXTURE, load, worker_rss_mib
from tests.kubeapi import FakeKubeAPI
from tests.serving import Server, fixture_bytes, make_certificates, metric_value, wait_until


def realistic_node(index: int) -> dict[str, Any]:
    """A GPU Node as a managed cluster writes it: about 10 KB of labels, images, conditions."""
    name = f"gpu-node-{index:05d}"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": f"us-east-1{'abc'[index % 3]}",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/mig.capable": "true",
        "feature.node.kubernetes.io/pci-0302_10de.present": "true",
        **{f"feature.node.kubernetes.io/cpu-cpuid.{flag}": "true" for flag in range(25)},
    }
    images = [
        {"names": [f"registry.example.com/team/image-{i}@sha256:{'ab' * 32}"], "sizeBytes": 10**9}
        for i in range(30)
    ]
    conditions = [
        {
            "type": kind,
            "status": "False" if kind != "Ready" else "True",
            "lastHeartbeatTime": "2026-12-05T10:00:00Z",
            "lastTransitionTime": "2026-12-01T10:00:00Z",
            "reason": f"Kubelet{kind}",
            "message": f"kubelet reports {kind}",
        }
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
    ]
    resources = {
        "cpu": "192",
        "memory": "2097152Ki",
        "ephemeral-storage": "3750000000Ki",
        "pods": "110",
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "32",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"a": "b" * 200}},
        "spec": {
            "providerID": f"aws:///us-east-1a/i-{index:017x}",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "images": images,
            "addresses": [{"type": "InternalIP", "address": f"10.0.{index // 256}.{index % 256}"}],
            "nodeInfo": {"kubeletVersion": "v1.34.2", "containerRuntimeVersion": "containerd://2"},
        },
    }


def feed_rss_mib(server: Server) -> tuple[float, float]:
    """Resident memory of the inventory process (``webhook.cli.node_feed``) of ``server``,
    and how much of it is its own (not shared with other processes: the interpreter's and
    libraries' files)."""
    for worker in server.child_pids():
        for task in Path(f"/proc/{worker}/task").iterdir():
            for child in (task / "children").read_text().split():
                if b"webhook.cli.node_feed" in Path(f"/proc/{child}/cmdline").read_bytes():
                    status = Path(f"/proc/{child}/status").read_text()
                    line = next(x for x in status.splitlines() if x.startswith("VmRSS:"))
                    rss = int(line.split()[1]) / 1024
                    rollup = Path(f"/proc/{child}/smaps_rollup").read_text().splitlines()
                    private = (
                        sum(int(x.split()[1]) for x in rollup if x.startswith("Private_")) / 1024
                    )
                    return rss, private
    raise AssertionError("no inventory process")


def settled(server: Server, nodes: int) -> None:
    """Until the last relist is over: every Node known, and no list started for a second."""

    def restarts() -> float:
        return metric_value(server.metrics(), "gpu_admission_inventory_watch_restarts_total")

    def quiet() -> bool:
        before = restarts()
        time.sleep(1.0)
        known = metric_value(server.metrics(), "gpu_admission_inventory_nodes")
        return restarts() == before and known == nodes

    wait_until(quiet, timeout=60, what="the inventory settled")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_inventory", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=6.0, help="per load round")
    parser.add_argument("--rounds", type=int, default=3, help="idle and relisting rounds each")
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args(argv)

    with (
        tempfile.TemporaryDirectory(prefix="gpu-admission-inventory-") as tmp,
        FakeKubeAPI() as api,
    ):
        directory = Path(tmp)
        pki = make_certificates(directory / "pki")
        kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
        api.bookmark_seconds = 60.0
        common: dict[str, Any] = {
            "policy": webhook.default_policy_path(),
            "cert": pki.tls_cert,
            "key": pki.tls_key,
            "ca": pki.ca_cert,
            "drain_seconds": 0,
            "env": {"KUBECONFIG": str(kubeconfig)},
        }
        body = fixture_bytes(FIXTURE)

        with Server(log_path=directory / "plain.log", **common) as plain:
            without = max(worker_rss_mib(plain))
        with Server(log_path=directory / "empty.log", extra_args=["--inventory"], **common) as s:
            wait_until(lambda: "node inventory listed" in s.log(), timeout=30, what="empty list")
            empty = max(worker_rss_mib(s))
            feed_empty = feed_rss_mib(s)
        node_json = len(str(realistic_node(0)))
        api.add_all(realistic_node(i) for i in range(args.nodes))
        server = Server(log_path=directory / "inventory.log", extra_args=["--inventory"], **common)
        started = time.monotonic()
        with server:
            wait_until(
                lambda: (
                    metric_value(server.metrics(), "gpu_admission_inventory_nodes") == args.nodes
                ),
                timeout=120,
                interval=0.2,
                what=f"{args.nodes} nodes listed",
            )
            listed_in = time.monotonic() - started
            full = max(worker_rss_mib(server))
            feed_full = feed_rss_mib(server)

            relisting = threading.Event()

            def relist_again_and_again() -> None:
                # The next watch is refused 410 Expired (its resourceVersion compacted away),
                # as often as the inventory has listed every Node again.
                while relisting.is_set():
                    api.fail("/api/v1/nodes", 410, reason="Expired", times=1)
                    api.close_watches()
                    time.sleep(0.5)

            figures: dict[str, list[dict[str, float]]] = {"watching": [], "relisting": []}
            with ProcessPoolExecutor(max_workers=args.clients) as pool:
                load(pool, server.port, pki.ca_cert, "/validate", body, args.clients, 2)
                # The fake API server runs in this process and stands in for kube-apiserver,
                # which runs on other machines: serving a relist of 5,000 Nodes again and
                # again (80 MB of JSON a second) it takes a core of the two, so it runs below
                # the server and its clients (forked above, at the usual priority).
                os.nice(19)
                for _ in range(args.rounds):
                    figures["watching"].append(
                        load(pool, server.port, pki.ca_cert, "/validate", body, args.clients,
                             args.seconds)
                    )  # fmt: skip
                    before = metric_value(
                        server.metrics(), "gpu_admission_inventory_watch_restarts_total"
                    )
                    relisting.set()
                    relister = threading.Thread(target=relist_again_and_again)
                    relister.start()
                    figures["relisting"].append(
                        load(pool, server.port, pki.ca_cert, "/validate", body, args.clients,
                             args.seconds)
                    )  # fmt: skip
                    relisting.clear()
                    relister.join()
                    settled(server, args.nodes)
                    relists = (
                        metric_value(
                            server.metrics(), "gpu_admission_inventory_watch_restarts_total"
                        )
                        - before
                    )
                    figures["relisting"][-1]["relists"] = relists

    print(f"node inventory of {args.nodes} Nodes (about {node_json // 1000} KB each as sent)")
    print(
        f"  worker RSS: {without:.0f} MiB without --inventory, {empty:.0f} MiB with it and no "
        f"Nodes, {full:.0f} MiB with {args.nodes}: the Nodes cost {full - empty:.1f} MiB"
    )
    print(
        f"  inventory process RSS: {feed_empty[0]:.0f} MiB with no Nodes ({feed_empty[1]:.0f} "
        f"its own), {feed_full[0]:.0f} MiB with {args.nodes} ({feed_full[1]:.0f} its own): the "
        f"Nodes cost {feed_full[0] - feed_empty[0]:.1f} MiB; the Nodes in all "
        f"{full - empty + feed_full[0] - feed_empty[0]:.1f} MiB, the inventory in all "
        f"{full - without + feed_full[0]:.1f} MiB"
    )
    print(
        f"  first list of {args.nodes} Nodes (100 a page, 50 ms apart) done "
        f"{listed_in:.1f} s after start"
    )
    for name, rounds in figures.items():
        rps = sorted(r["rps"] for r in rounds)[len(rounds) // 2]
        p99 = sorted(r["p99"] for r in rounds)[len(rounds) // 2]
        each = " ".join(f"{r['p99'] * 1000:.1f}" for r in rounds)
        extra = ""
        if name == "relisting":
            extra = f", {sum(r['relists'] for r in rounds):.0f} relists during the rounds"
        print(
            f"  /validate while {name:<10} {rps:6.0f} req/s  p99 {p99 * 1000:5.1f} ms"
            f"  (rounds: {each} ms{extra})"
        )
    watching = sorted(r["p99"] for r in figures["watching"])[args.rounds // 2]
    relisting_p99 = sorted(r["p99"] for r in figures["relisting"])[args.rounds // 2]
    print(f"  p99 while relisting / while watching: {relisting_p99 / watching:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
