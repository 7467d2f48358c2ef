"""``gpu-admission policy init --from-cluster``: a starting policy for the cluster it reads
(``webhook.operations.policy_init``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from webhook.cli.common import add_cluster_arguments, add_command, error
from webhook.cluster.connection import connect
from webhook.cluster.listing import AUDITOR_ROLE
from webhook.core.wording import count, number
from webhook.operations.policy_init import NoGpuNodes, draft_policy
from webhook.operations.policy_init_reading import read_cluster

_EPILOG = f"""\
examples:
  gpu-admission policy init --from-cluster -o policy.yaml
  gpu-admission policy init --from-cluster --context prod > prod-policy.yaml
  gpu-admission policy init --from-cluster -o policy.yaml --force   # overwrite policy.yaml

What it drafts, on the default policy (its settings and comments kept):
  pools             one per kind of GPU node: product (nvidia.com/gpu.product; without GPU
                    feature discovery GKE's cloud.google.com/gke-accelerator or EKS'
                    k8s.amazonaws.com/accelerator), taints, sharing (nvidia.com/gpu.sharing-
                    strategy, nvidia.com/gpu.replicas, the MIG strategy; GKE's sharing and
                    partition labels)
  gpuNodeTaints     the taints every GPU node carries
  tenants ["*"]     a poolPreference (whole GPUs first) where pools share a resource differently
  migCatalogue      the MIG-capable products found
  devicePluginDaemonSets  the DaemonSets running the device plugin: image
                    nvcr.io/nvidia/k8s-device-plugin, the GPU Operator's
                    nvidia-device-plugin-daemonset, GKE's kube-system/nvidia-gpu-device-plugin*
  companionResources  vendor resources that are no GPU (a NIC's)
  tenants           commented out: the namespaces of DaemonSets that tolerate every taint, as an
                    exemption to consider, and a tenant to start from
Comments that start with Found: say what was seen, Guessed: what was inferred. The draft is
loaded as the webhook loads it, linted as `policy validate` lints it (each warning printed on
stderr and written at the top of the draft), and compared with the nodes as `cluster check`
compares them, before it is written: what would still disagree is printed on stderr.
Needs list on nodes and daemonsets ({AUDITOR_ROLE} has them).

exit status: 0 drafted, 1 the cluster has no GPU node, 2 could not run (unreachable cluster,
refused list, FILE exists without --force).
"""


def add_to(sub: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(
        sub,
        "init",
        summary="draft a starting policy from the cluster's GPU nodes",
        description="Read the cluster's Nodes and DaemonSets and write the default policy with "
        "a pool for each kind of GPU node found, the MIG products found, and the node agents' "
        "namespaces proposed as exemptions (commented out).",
        epilog=_EPILOG,
    )
    parser.add_argument(
        "--from-cluster",
        action="store_true",
        required=True,
        help="draft from the cluster the kubeconfig names (the only source so far)",
    )
    parser.add_argument(
        "-o", "--output", metavar="FILE", help="write the policy here (default: stdout)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    add_cluster_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    destination = Path(args.output) if args.output else None
    if destination is not None and destination.exists() and not args.force:
        error(f"{destination}: exists; pass --force to overwrite it")
        return 2
    with connect(args.kubeconfig, args.context) as cluster:
        sample = read_cluster(cluster)
        source = cluster.host
    try:
        draft = draft_policy(sample.nodes, sample.daemonsets, source=source)
    except NoGpuNodes as exc:
        error(str(exc))
        return 1
    if destination is None:
        sys.stdout.write(draft.text)
    else:
        try:
            destination.write_text(draft.text, "utf-8")
        except OSError as exc:
            error(f"{destination}: cannot write: {(exc.strerror or str(exc)).lower()}")
            return 2
    where = str(destination) if destination is not None else "the policy"
    print(
        f"gpu-admission: {'wrote ' if destination else ''}{where}: {count(draft.pools, 'pool')} "
        f"for {number(draft.gpu_nodes, 'GPU node')} of the {number(draft.nodes, 'node')} "
        f"read; check each comment marked Found: or Guessed:",
        file=sys.stderr,
    )
    for warned in draft.warnings:
        print(f"gpu-admission: policy validate will warn: {warned}", file=sys.stderr)
    for line in draft.unpooled:
        print(f"gpu-admission: in no pool: {line}", file=sys.stderr)
    for found in draft.drift:
        print(
            f"gpu-admission: cluster check will report {found.kind}: {found.message}",
            file=sys.stderr,
        )
    return 0
