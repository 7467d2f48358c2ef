"""``gpu-admission certs``: generate the webhook's certificates and install them, into a cluster
or into manifests (``webhook.certs``)."""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path
from typing import Any

from webhook.certs.gitops import ca_bundle_into_stream, install_into_manifests
from webhook.certs.install import install
from webhook.certs.pki import (
    CA_BUNDLE,
    CA_CERT,
    KEY_TYPES,
    TLS_CERT,
    generate,
    read_certificates,
    write_ca_bundle,
)
from webhook.cli.common import add_cluster_arguments, add_command, add_command_group
from webhook.cluster.connection import connect

_CERTS_EPILOG = """\
examples:
  gpu-admission certs generate --out certs              # a new CA and serving certificate
  gpu-admission certs install --cert-dir certs          # the Secret and both caBundles
  gpu-admission certs install --cert-dir certs --manifests deploy/   # GitOps

`gpu-admission certs SUBCOMMAND --help` shows renewal, CA rotation and the options.
Production clusters should rather use the cert-manager overlay.
"""

_GENERATE_EPILOG = """\
examples:
  # local development (what `make run` does): also valid for 127.0.0.1 and localhost
  gpu-admission certs generate --out certs --host 127.0.0.1 --host localhost

  # a cluster: the Service gpu-admission in namespace gpu-admission
  gpu-admission certs generate --service gpu-admission --namespace gpu-admission --out certs
  gpu-admission certs install --cert-dir certs

  # renew the serving certificate with the same CA: the caBundle stays the same
  gpu-admission certs generate --out certs --ca-cert certs/ca.crt --ca-key certs/ca.key --force

  # rotate the CA: new CA, caBundle trusting new + old CA (written to certs/ca-bundle.crt)
  cp certs/ca.crt old-ca.crt
  gpu-admission certs generate --out certs --force --bundle-old-ca old-ca.crt

An existing out/tls.crt is kept unless --force is given (the command is idempotent).
stdout is the base64 caBundle, ready for a webhook's clientConfig.caBundle.
"""

_INSTALL_EPILOG = """\
examples:
  # Secret gpu-admission/gpu-admission-tls and the caBundle of both configurations
  gpu-admission certs install --cert-dir certs

  # another cluster and names; an empty name skips that configuration
  gpu-admission certs install --kubeconfig ~/.kube/prod --context prod \\
      --namespace gpu-system --secret webhook-tls --validating gpu-admission --mutating ''

  # GitOps: write the caBundle into the manifests instead of the cluster (no key is written)
  gpu-admission certs install --cert-dir certs --manifests deploy/

  # a first install (docs/installing.md): the Secret alone, then, once the server is Ready,
  # the webhook configurations created with their caBundle
  gpu-admission certs install --cert-dir certs --validating '' --mutating ''
  kubectl kustomize manifests/webhooks \
      | gpu-admission certs install --cert-dir certs --manifests - | kubectl apply -f -

The caBundle is certs/ca-bundle.crt when present (a CA rotation), else certs/ca.crt.
Needs get/patch on validating- and mutatingwebhookconfigurations, and create/get/patch on
secrets in the namespace.
"""


def add_subcommands(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``certs generate`` and ``certs install`` on the top-level sub-parsers."""
    commands = add_command_group(
        subparsers,
        "certs",
        summary="generate and install the webhook's TLS certificates",
        description="Generate the webhook's serving certificate and CA, and install them.",
        epilog=_CERTS_EPILOG,
    )

    gen = add_command(
        commands,
        "generate",
        summary="create a CA and a serving certificate for the webhook Service",
        description=(
            "Create a CA (or reuse one) and a serving certificate for the webhook Service,\n"
            "written as ca.crt, tls.crt, tls.key (and ca.key for a new CA) in --out."
        ),
        epilog=_GENERATE_EPILOG,
    )
    gen.add_argument("--service", default="gpu-admission", help="Service name (%(default)s)")
    gen.add_argument("--namespace", default="gpu-admission", help="namespace (%(default)s)")
    gen.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    gen.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="HOST",
        help="extra DNS name or IP address for the certificate (repeatable)",
    )
    gen.add_argument("--ca-cert", metavar="PATH", help="existing CA certificate to sign with")
    gen.add_argument("--ca-key", metavar="PATH", help="key of --ca-cert")
    gen.add_argument(
        "--days",
        type=int,
        default=365,
        help="validity of the serving certificate in days (%(default)s)",
    )
    gen.add_argument(
        "--ca-days", type=int, default=3650, help="validity of a new CA in days (%(default)s)"
    )
    gen.add_argument(
        "--key-type",
        choices=KEY_TYPES,
        default="ecdsa",
        help="ecdsa (P-256) or rsa (3072 bits) (%(default)s)",
    )
    gen.add_argument(
        "--bundle-old-ca",
        action="append",
        default=[],
        metavar="PATH",
        help="also write ca-bundle.crt = new CA + this old CA (repeatable)",
    )
    gen.add_argument("--force", action="store_true", help="overwrite an existing tls.crt")
    gen.set_defaults(func=run_generate)

    inst = add_command(
        commands,
        "install",
        summary="put the certificates into the cluster (Secret + caBundle) or into manifests",
        description=(
            "Create or update the kubernetes.io/tls Secret and patch the caBundle of every\n"
            "webhook in the Validating- and MutatingWebhookConfiguration; with --manifests,\n"
            "write the caBundle into YAML files instead."
        ),
        epilog=_INSTALL_EPILOG,
    )
    add_cluster_arguments(inst)
    inst.add_argument(
        "--namespace", default="gpu-admission", help="namespace of the Secret (%(default)s)"
    )
    inst.add_argument("--secret", default="gpu-admission-tls", help="Secret name (%(default)s)")
    inst.add_argument(
        "--cert-dir",
        default="certs",
        metavar="DIR",
        help="directory written by `certs generate` (%(default)s)",
    )
    inst.add_argument(
        "--validating",
        default="gpu-admission",
        metavar="NAME",
        help="ValidatingWebhookConfiguration name, '' to skip (%(default)s)",
    )
    inst.add_argument(
        "--mutating",
        default="gpu-admission",
        metavar="NAME",
        help="MutatingWebhookConfiguration name, '' to skip (%(default)s)",
    )
    inst.add_argument(
        "--ca-bundle",
        metavar="PATH",
        help="caBundle file (default: ca-bundle.crt if present, else ca.crt)",
    )
    inst.add_argument(
        "--manifests",
        metavar="DIR",
        help="GitOps: set caBundle in YAML files under DIR instead of the API; "
        "- to read manifests on standard input and write them with the caBundle to "
        "standard output (for kubectl apply -f -)",
    )
    inst.set_defaults(func=run_install)


def run_generate(args: argparse.Namespace) -> int:
    """Write the certificates (kept when there, unless --force); print the caBundle."""
    out = Path(args.out)
    # Read before generate() writes tls.crt and tls.key: a wrong file must fail the command
    # with the certificates in out as they were, not half-rotated.
    for path in args.bundle_old_ca:
        read_certificates(Path(path))
    if (out / TLS_CERT).exists() and not args.force:
        print(f"{out / TLS_CERT} exists; keeping it (pass --force to regenerate)", file=sys.stderr)
        existing = out / CA_BUNDLE if (out / CA_BUNDLE).exists() else out / CA_CERT
        if existing.exists():
            print(base64.b64encode(existing.read_bytes()).decode("ascii"))
        return 0
    result = generate(
        out,
        service=args.service,
        namespace=args.namespace,
        hosts=args.host,
        ca_cert_path=args.ca_cert,
        ca_key_path=args.ca_key,
        validity_days=args.days,
        ca_validity_days=args.ca_days,
        key_type=args.key_type,
    )
    ca_note = "new CA" if result.ca_created else f"CA {args.ca_cert} (caBundle unchanged)"
    print(
        f"wrote {result.tls_cert} and {result.tls_key} signed by {ca_note}; "
        f"valid until {result.not_after:%Y-%m-%d %H:%M} UTC for {', '.join(result.sans)}",
        file=sys.stderr,
    )
    bundle_b64 = result.ca_bundle_b64
    if args.bundle_old_ca:
        bundle_path = out / CA_BUNDLE
        bundle_b64 = write_ca_bundle(bundle_path, [result.ca_cert, *args.bundle_old_ca])
        print(
            f"wrote {bundle_path}: new CA + {len(args.bundle_old_ca)} old CA file(s)",
            file=sys.stderr,
        )
    print(bundle_b64)
    return 0


def run_install(args: argparse.Namespace) -> int:
    """Install the certificates into the cluster, or their caBundle into manifests."""
    if args.manifests == "-":
        sys.stdout.write(
            ca_bundle_into_stream(sys.stdin.read(), args.cert_dir, ca_bundle_path=args.ca_bundle)
        )
        return 0
    if args.manifests:
        changed = install_into_manifests(
            args.manifests, args.cert_dir, ca_bundle_path=args.ca_bundle
        )
        for path in changed:
            print(f"caBundle set in {path}")
        if not changed:
            print(f"no webhook configuration under {args.manifests} needed a change")
        return 0
    with connect(args.kubeconfig, args.context) as cluster:
        result = install(
            cluster.api_client,
            namespace=args.namespace,
            secret_name=args.secret,
            cert_dir=args.cert_dir,
            validating_webhook_name=args.validating,
            mutating_webhook_name=args.mutating,
            ca_bundle_path=args.ca_bundle,
        )
    for line in result.webhook_configurations:
        print(line)
    print(f"Secret {args.namespace}/{args.secret}: {result.secret}")
    return 0
