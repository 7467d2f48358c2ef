"""``gpu-admission quota``: the ResourceQuotas a policy's entitlements imply
(``webhook.audit.quotas``), as YAML or JSON to apply or commit."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from webhook.audit.quotas import entitled_namespaces, implied_quotas
from webhook.cli import output
from webhook.cli.common import add_command, add_policy_argument, policy_from

_EPILOG = """\
examples:
  gpu-admission quota --policy policy.yaml | kubectl apply -f -
  gpu-admission quota --policy policy.yaml -n inference-chat -n inference-eval
  gpu-admission quota --policy policy.yaml -o json

Without -n: every namespace that a tenants entry stating entitlements names exactly (a glob
names none: give its namespaces with -n). A namespace whose entitlements imply no quota (no
maxGPUs, and every declared resource allowed) gets none.
"""


def add_subcommands(commands: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(
        commands,
        "quota",
        summary="write the ResourceQuotas the policy's entitlements imply",
        description="Print a ResourceQuota per namespace of a tenant with entitlements: "
        "requests.<resource> at the tenant's maxGPUs, and 0 for each GPU resource the policy "
        "declares that the tenant may not use.",
        epilog=_EPILOG,
    )
    add_policy_argument(parser)
    parser.add_argument(
        "-n",
        "--namespace",
        dest="namespaces",
        action="append",
        metavar="NAMESPACE",
        help="a namespace to write the quota of (repeatable)",
    )
    parser.add_argument(
        "-l",
        "--labels",
        action="append",
        metavar="KEY=VALUE",
        help="a label of the namespaces (repeatable), for the tenants entries that select "
        "namespaces by label (namespaceSelector), as the webhook reads them: kubectl get "
        "namespace NS --show-labels",
    )
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    policy = policy_from(args)
    labels = None
    if args.labels:
        pairs = [label.partition("=") for label in args.labels]
        bad = [key for key, sep, _ in pairs if not sep or not key]
        if bad:
            print(
                f"gpu-admission: error: --labels takes KEY=VALUE, not {bad[0]!r}", file=sys.stderr
            )
            return 2
        labels = {key: value for key, _, value in pairs}
    elif any(t.selector is not None and t.entitlements is not None for t in policy.tenants):
        print(
            "gpu-admission: note: some tenants entries select namespaces by label: without "
            "--labels, namespaces are judged by name only, as the webhook judges a namespace "
            "it does not know",
            file=sys.stderr,
        )
    quotas = implied_quotas(policy, args.namespaces or entitled_namespaces(policy), labels)
    if not quotas:
        print("gpu-admission: note: no entitlement implies a quota here", file=sys.stderr)
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": quotas}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for quota in quotas:
            sys.stdout.write("---\n" + output.to_yaml(quota))
    return 0
