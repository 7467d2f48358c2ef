"""``gpu-admission webhooks``: what the Helm chart's hook Jobs run in the cluster, so that no
step of an install, upgrade or uninstall leaves the fail-closed webhook without a Ready server
it trusts (``webhook.certs.activation``; they use the Pod's service account), and the webhook
rules a policy's custom workload kinds need (``rules``)."""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from webhook.certs.activation import activate_webhooks, bootstrap_secret, deactivate_webhooks
from webhook.cli.common import (
    add_cluster_arguments,
    add_command,
    add_command_group,
    add_policy_argument,
    policy_from,
)
from webhook.cluster.connection import connect
from webhook.policy.workloads import (
    CLAIMS_WEBHOOK,
    NOT_CONTROLLED,
    SPEC_CHANGED,
    WORKLOADS_MUTATING_WEBHOOK,
    WORKLOADS_WEBHOOK,
    custom_resource_rules,
)

_EPILOG = """\
examples (as the chart's hook Jobs run them, in the release's namespace):
  gpu-admission webhooks bootstrap --namespace gpu-admission            # pre-install/upgrade
  gpu-admission webhooks activate --namespace gpu-admission             # post-install/upgrade
  gpu-admission webhooks deactivate                                     # pre-delete
  gpu-admission webhooks rules --policy my-policy.yaml   # rules for the custom workload kinds
  gpu-admission webhooks rules --mutating --policy my-policy.yaml   # and for their GPU defaults
"""


def add_subcommands(commands: argparse._SubParsersAction[Any]) -> None:
    group = add_command_group(
        commands,
        "webhooks",
        summary="the Helm chart's install steps: bootstrap the Secret, (de)activate webhooks",
        description="What the Helm chart's hook Jobs run in the cluster: the self-signed TLS "
        "Secret made once and never re-keyed; the webhooks activated (caBundle, failure "
        "policy) once the server answers /readyz with that certificate; the validating "
        "webhook made to fail open before an uninstall removes the server.",
        epilog=_EPILOG,
    )
    bootstrap = add_command(
        group,
        "bootstrap",
        summary="create the TLS Secret once; renew its certificate with the same CA",
        description="Create the kubernetes.io/tls Secret with a new CA (kept in the Secret "
        "NAME-ca, which no Pod mounts) unless it exists; renew the serving certificate with "
        "the same CA when it has less than 30 days left. Never re-keys the CA.",
        epilog=_EPILOG,
    )
    _cluster_options(bootstrap)
    bootstrap.add_argument("--service", default="gpu-admission", help="Service (%(default)s)")
    bootstrap.set_defaults(func=run_bootstrap)

    activate = add_command(
        group,
        "activate",
        summary="once the server is ready, set the webhooks' caBundle and failure policy",
        description="Wait until https://SERVICE.NAMESPACE.svc/readyz answers 200 with a "
        "certificate of the CA in the TLS Secret, then set that CA as the caBundle of both "
        "webhook configurations and the validating webhook's failure policy (its "
        f"{CLAIMS_WEBHOOK} entry stays Ignore: a denial there would leave a Pod pending).",
        epilog=_EPILOG,
    )
    _cluster_options(activate)
    activate.add_argument("--service", default="gpu-admission", help="Service (%(default)s)")
    activate.add_argument(
        "--readyz-url", metavar="URL", help="default: https://SERVICE.NAMESPACE.svc/readyz"
    )
    activate.add_argument("--validating", default="gpu-admission", metavar="NAME")
    activate.add_argument("--mutating", default="gpu-admission", metavar="NAME")
    activate.add_argument("--failure-policy", choices=("Fail", "Ignore"), default="Fail")
    activate.add_argument(
        "--custom-resources-failure-policy",
        choices=("Fail", "Ignore"),
        default="Ignore",
        help=f"of the {WORKLOADS_WEBHOOK} webhook (%(default)s)",
    )
    activate.add_argument("--timeout", type=float, default=300.0, help="seconds (%(default)s)")
    activate.set_defaults(func=run_activate)

    deactivate = add_command(
        group,
        "deactivate",
        summary="make the validating webhook fail open (before an uninstall)",
        description="Set failurePolicy Ignore on every webhook of the validating "
        "configuration, so that removing the server blocks nothing.",
        epilog=_EPILOG,
    )
    add_cluster_arguments(deactivate)
    deactivate.add_argument("--validating", default="gpu-admission", metavar="NAME")
    deactivate.set_defaults(func=run_deactivate)

    rules = add_command(
        group,
        "rules",
        summary="print the webhook rules and match conditions for a policy's custom kinds",
        description=f"Print, as YAML, the rules and match conditions of the {WORKLOADS_WEBHOOK} "
        "webhook for every custom workload kind the policy judges (the catalogue and its "
        "spec.workloads): paste them into the ValidatingWebhookConfiguration. With "
        f"--mutating, those of the {WORKLOADS_MUTATING_WEBHOOK} webhook (the GPU defaults of "
        "workload templates) for the custom kinds with a pod template: paste them into the "
        "MutatingWebhookConfiguration. DRA's ResourceClaimTemplates and ResourceClaims are no "
        "policy's to add: their rules are fixed (manifests/webhooks), the claims in the "
        f"{CLAIMS_WEBHOOK} entry.",
        epilog=_EPILOG,
    )
    add_policy_argument(rules)
    rules.add_argument(
        "--mutating",
        action="store_true",
        help=f"the rules of the {WORKLOADS_MUTATING_WEBHOOK} webhook instead",
    )
    rules.set_defaults(func=run_rules)


def _cluster_options(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser)
    parser.add_argument("--namespace", default="gpu-admission", help="(%(default)s)")
    parser.add_argument("--secret", default="gpu-admission-tls", help="(%(default)s)")


def run_bootstrap(args: argparse.Namespace) -> int:
    with connect(args.kubeconfig, args.context) as cluster:
        state = bootstrap_secret(
            cluster.api_client,
            namespace=args.namespace,
            secret_name=args.secret,
            service=args.service,
        )
    print(f"Secret {args.namespace}/{args.secret}: {state}")
    return 0


def run_activate(args: argparse.Namespace) -> int:
    url = args.readyz_url or f"https://{args.service}.{args.namespace}.svc/readyz"
    with connect(args.kubeconfig, args.context) as cluster:
        for line in activate_webhooks(
            cluster.api_client,
            namespace=args.namespace,
            secret_name=args.secret,
            readyz_url=url,
            validating=args.validating,
            mutating=args.mutating,
            failure_policy=args.failure_policy,
            custom_resources_failure_policy=args.custom_resources_failure_policy,
            timeout=args.timeout,
        ):
            print(line)
    return 0


def run_rules(args: argparse.Namespace) -> int:
    policy = policy_from(args)
    entry = (
        {
            "name": WORKLOADS_MUTATING_WEBHOOK,
            "matchConditions": [{"name": "not-controlled", "expression": NOT_CONTROLLED}],
            "rules": custom_resource_rules(policy.workloads.values(), mutating=True),
        }
        if args.mutating
        else {
            "name": WORKLOADS_WEBHOOK,
            "matchConditions": [{"name": "spec-changed", "expression": SPEC_CHANGED}],
            "rules": custom_resource_rules(policy.workloads.values()),
        }
    )
    print(yaml.safe_dump(entry, sort_keys=False, width=1 << 16), end="")
    return 0


def run_deactivate(args: argparse.Namespace) -> int:
    with connect(args.kubeconfig, args.context) as cluster:
        print(deactivate_webhooks(cluster.api_client, validating=args.validating))
    return 0
