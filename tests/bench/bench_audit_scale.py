"""What ``audit --cluster`` costs at scale: the peak RSS and wall time of the command, run as a
child process against the fake API server (in this process, so its memory is not counted)
serving N realistic Pods, owned by ReplicaSets owned by Deployments, in 500-object pages.

Run with ``python -m tests.bench.bench_audit_scale [--pods 150000]``; ``--policyreport`` also
runs the background audit's command (``-o policyreport --apply``); ``--source DIR`` runs the
command of another copy of the package (``git archive`` of an older commit, for a before and
after). Not part of ``make test``: it takes minutes and gigabytes (the fake server's copy).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.kubeapi import FakeKubeAPI
from tests.support.cluster import owner_reference, serve_report_kinds, serve_workload_kinds

REPO = Path(__file__).resolve().parents[2]
NAMESPACES = 100
SEED_CHUNK = 5000  # objects added between compactions: the fake server's events stay small


def _uid(kind: str, index: int) -> str:
    return f"{kind[:8].lower():0<8}-{index:04x}-4000-8000-{index:012x}"


def container(index: int, gpus: int) -> dict[str, Any]:
    """A serving container as a chart writes it: env, probes, mounts, resources."""
    resources: dict[str, Any] = {
        "requests": {"cpu": "4", "memory": "16Gi"},
        "limits": {"cpu": "8", "memory": "32Gi"},
    }
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    return {
        "name": "server",
        "image": f"registry.example.com/ml/model-server:v1.{index % 40}.3",
        "imagePullPolicy": "IfNotPresent",
        "args": ["--port=8080", "--model=/models/current", "--workers=4"],
        "env": [
            {"name": "MODEL_NAME", "value": f"model-{index % 500}"},
            {"name": "LOG_LEVEL", "value": "info"},
            {"name": "OMP_NUM_THREADS", "value": "4"},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}},
        ],
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "resources": resources,
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"},
            "periodSeconds": 10,
            "timeoutSeconds": 1,
            "successThreshold": 1,
            "failureThreshold": 3,
        },
        "volumeMounts": [
            {"name": "models", "mountPath": "/models", "readOnly": True},
            {"name": "cache", "mountPath": "/cache"},
            {
                "name": "kube-api-access",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            },
        ],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def pod_spec(index: int, gpus: int) -> dict[str, Any]:
    return {
        "containers": [container(index, gpus)],
        "volumes": [
            {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
            {"name": "cache", "emptyDir": {"sizeLimit": "10Gi"}},
            {
                "name": "kube-api-access",
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
                    ],
                },
            },
        ],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "model-server",
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
        "schedulerName": "default-scheduler",
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
    }


def workloads(pods: int, per_replica_set: int, gpu_every: int) -> Iterator[dict[str, Any]]:
    """Deployments, each with one ReplicaSet of ``per_replica_set`` Pods. Every ``gpu_every``-th
    Deployment asks for a GPU (mutated: the GPU taint's toleration); one GPU Deployment in ten
    also runs privileged (a finding of its own, and a report); one Pod in fifty sets a
    container-toolkit variable its template does not (judged alone)."""
    for d in range((pods + per_replica_set - 1) // per_replica_set):
        namespace = f"team-{d % NAMESPACES:03d}"
        gpus = 1 + d % 4 if d % gpu_every == 0 else 0
        spec = pod_spec(d, gpus)
        if gpus and d % (10 * gpu_every) == 0:
            spec["containers"][0]["securityContext"] = {"privileged": True}
        labels = {"app.kubernetes.io/name": f"model-{d}", "app.kubernetes.io/part-of": "serving"}
        template = {"metadata": {"labels": labels}, "spec": spec}
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": f"model-{d}",
                "namespace": namespace,
                "uid": _uid("Deployment", d),
                "labels": labels,
                "annotations": {"deployment.kubernetes.io/revision": "3"},
            },
            "spec": {
                "replicas": per_replica_set,
                "selector": {"matchLabels": labels},
                "template": template,
                "strategy": {"type": "RollingUpdate"},
            },
            "status": {"replicas": per_replica_set, "readyReplicas": per_replica_set},
        }
        yield deployment
        replica_set = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"model-{d}-7c9f8d6b5",
                "namespace": namespace,
                "uid": _uid("ReplicaSet", d),
                "labels": {**labels, "pod-template-hash": "7c9f8d6b5"},
                "ownerReferences": [owner_reference(deployment)],
            },
            "spec": {
                "replicas": per_replica_set,
                "selector": {"matchLabels": labels},
                "template": template,
            },
            "status": {"replicas": per_replica_set},
        }
        yield replica_set
        for p in range(min(per_replica_set, pods - d * per_replica_set)):
            index = d * per_replica_set + p
            made = copy.deepcopy(spec)  # what the ReplicaSet made of its template
            made["nodeName"] = f"node-{index % 5000:05d}"
            if index % 50 == 25:
                made["containers"][0]["env"].append(
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
                )
            yield {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"model-{d}-7c9f8d6b5-{index:06x}",
                    "generateName": f"model-{d}-7c9f8d6b5-",
                    "namespace": namespace,
                    "uid": _uid("Pod", index),
                    "labels": {**labels, "pod-template-hash": "7c9f8d6b5"},
                    "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-01T10:00:00Z"},
                    "ownerReferences": [owner_reference(replica_set)],
                },
                "spec": made,
                "status": {
                    "phase": "Running",
                    "hostIP": f"10.1.{index // 65536 % 256}.{index // 256 % 256}",
                    "podIP": f"10.2.{index // 256 % 256}.{index % 256}",
                    "startTime": "2026-12-01T10:00:00Z",
                    "qosClass": "Burstable",
                    "conditions": [
                        {
                            "type": kind,
                            "status": "True",
                            "lastTransitionTime": "2026-12-01T10:00:05Z",
                        }
                        for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
                    ],
                    "containerStatuses": [
                        {
                            "name": "server",
                            "ready": True,
                            "restartCount": 0,
                            "image": f"registry.example.com/ml/model-server:v1.{d % 40}.3",
                            "imageID": f"registry.example.com/ml/model-server@sha256:{'ab' * 32}",
                            "containerID": f"containerd://{index:064x}",
                            "started": True,
                            "state": {"running": {"startedAt": "2026-12-01T10:00:04Z"}},
                        }
                    ],
                },
            }


def seed(api: FakeKubeAPI, pods: int, per_replica_set: int, gpu_every: int) -> int:
    """Add every object; returns the size of one Pod as sent (JSON)."""
    chunk: list[dict[str, Any]] = []
    pod_bytes = 0
    for obj in workloads(pods, per_replica_set, gpu_every):
        if not pod_bytes and obj["kind"] == "Pod":
            pod_bytes = len(json.dumps(obj))
        chunk.append(obj)
        if len(chunk) == SEED_CHUNK:
            api.add_all(chunk)
            api.compact()  # the seed's events are no watch's: drop their copies
            chunk = []
    api.add_all(chunk)
    api.compact()
    return pod_bytes


# The command, run so that it writes its own peak RSS (VmHWM) when it exits. The peak of a
# child as getrusage or wait4 report it is no use here: Linux keeps the largest RSS of the
# process image that exec replaced, and that is this process's, the fake server's GiBs.
MEASURED = """
import atexit, os, runpy

def peak():
    status = open("/proc/self/status").read()
    with open(os.environ["BENCH_PEAK_FILE"], "w") as out:
        out.write(status.split("VmHWM:")[1].split()[0])

atexit.register(peak)
runpy.run_module("webhook.cli", run_name="__main__", alter_sys=True)
"""


def run_audit(source: Path, kubeconfig: Path, output: str, directory: Path) -> dict[str, Any]:
    """One audit as a child process: its exit status, wall time, peak RSS and output."""
    args = ["audit", "--cluster", "-A", "--kubeconfig", str(kubeconfig), "-o", output]
    if output == "policyreport":
        args.append("--apply")
    out_path, err_path, peak_path = (directory / f"{output}.{x}" for x in ("out", "err", "peak"))
    env = {**os.environ, "PYTHONPATH": str(source), "BENCH_PEAK_FILE": str(peak_path)}
    started = time.monotonic()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        child = subprocess.run(
            [sys.executable, "-c", MEASURED, *args], cwd=source, env=env, stdout=out, stderr=err
        )
    wall = time.monotonic() - started
    return {
        "code": child.returncode,
        "seconds": wall,
        "peak_mib": int(peak_path.read_text()) / 1024,  # VmHWM is in kB
        "out": out_path,
        "err": err_path.read_text(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_audit_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--per-replicaset", type=int, default=10)
    parser.add_argument("--gpu-every", type=int, default=4, help="one Deployment in N has GPUs")
    parser.add_argument("--source", type=Path, default=REPO, help="the package copy to run")
    parser.add_argument("--policyreport", action="store_true", help="also -o policyreport --apply")
    args = parser.parse_args(argv)

    with (
        tempfile.TemporaryDirectory(prefix="gpu-admission-audit-scale-") as tmp,
        FakeKubeAPI() as api,
    ):
        directory = Path(tmp)
        serve_workload_kinds(api)
        serve_report_kinds(api)
        started = time.monotonic()
        pod_bytes = seed(api, args.pods, args.per_replicaset, args.gpu_every)
        seeded = time.monotonic() - started
        kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
        deployments = (args.pods + args.per_replicaset - 1) // args.per_replicaset
        print(
            f"audit --cluster of {args.pods} Pods ({pod_bytes} bytes of JSON each) in "
            f"{deployments} Deployments with a ReplicaSet each, 500 a page; source {args.source}"
            f" (seeded in {seeded:.0f} s)"
        )
        outputs = ["json", "policyreport"] if args.policyreport else ["json"]
        for output in outputs:
            result = run_audit(args.source, kubeconfig, output, directory)
            counts = ""
            if output == "json" and result["code"] in (0, 1):
                records = json.loads(result["out"].read_text())
                judged = [r for r in records if "verdict" in r]
                owned = sum(len(r.get("owned", ())) for r in judged)
                denied = sum(1 for r in judged if r["verdict"] == "denied")
                mutated = sum(1 for r in judged if r.get("mutations"))
                counts = (
                    f"; {len(judged)} judged ({denied} denied, {mutated} mutated), "
                    f"{owned} listed under them, {len(records) - len(judged)} problems"
                )
            elif output == "policyreport":
                counts = "; " + result["out"].read_text().strip()
            print(
                f"  -o {output}: exit {result['code']}, {result['seconds']:.1f} s, "
                f"peak RSS {result['peak_mib']:.0f} MiB{counts}"
            )
            if result["code"] not in (0, 1):
                print("    " + result["err"].strip().replace("\n", "\n    ")[-2000:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
