"""``gpu-admission policy workloads``: the workload kinds a policy judges (the built-in kinds,
the catalogue, the policy's own) and where in each it finds the Pods, or with ``--rbac`` the
rules a ClusterRole needs to read them all (``audit --cluster``)."""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from webhook.cli.common import add_command, add_policy_argument, policy_from
from webhook.policy.model import WorkloadKind
from webhook.policy.workloads import CLUSTER_CHECK_RULES, read_rules

_EPILOG = """\
examples:
  gpu-admission policy workloads                            # the default policy's kinds
  gpu-admission policy workloads --policy my-policy.yaml --rbac
"""


def add_to(sub: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(
        sub,
        "workloads",
        summary="list the workload kinds a policy judges, and where their Pods are",
        description="List every kind the policy judges: the Kubernetes kinds, the built-in "
        "catalogue of GPU workload kinds (less spec.catalogue.disabled) and spec.workloads, "
        "with the paths of their Pod definitions. With --rbac, print the ClusterRole rules "
        "that read them all (and the Nodes, Namespaces and ResourceQuotas, for cluster check).",
        epilog=_EPILOG,
    )
    add_policy_argument(parser)
    parser.add_argument("--rbac", action="store_true", help="print RBAC rules as YAML instead")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    policy = policy_from(args)
    if args.rbac:
        rules = [*read_rules(policy.workloads.values()), *CLUSTER_CHECK_RULES]
        print(yaml.safe_dump(rules, sort_keys=False), end="")
        return 0
    for workload in policy.workloads.values():
        print(f"{_name(workload)}  ({_origin(workload)}, {workload.scope})")
        for target in workload.targets:
            print(f"  {target.shape}: {target.path.text or '(the object itself)'}")
    return 0


def _name(workload: WorkloadKind) -> str:
    return f"{workload.kind}.{workload.group}" if workload.group else workload.kind


def _origin(workload: WorkloadKind) -> str:
    if workload.built_in:
        return "Kubernetes"
    return "catalogue" if workload.catalogued else "spec.workloads"
