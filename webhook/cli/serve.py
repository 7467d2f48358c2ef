"""``gpu-admission serve``: run the admission webhook server (``webhook.server``)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from webhook.cli.common import add_command
from webhook.server.gunicorn import serve
from webhook.server.settings import (
    DEFAULT_BIND,
    DEFAULT_DRAIN_SECONDS,
    MUTATION_MODES,
    resolve_settings,
)

_SERVE_EPILOG = f"""\
examples:
  # local development: certificates for 127.0.0.1 first (see `gpu-admission certs --help`)
  gpu-admission certs generate --out certs --host 127.0.0.1
  gpu-admission serve --cert certs/tls.crt --key certs/tls.key --bind 127.0.0.1:8443

  # a stricter policy, and mutations only recorded in audit annotations, not applied
  gpu-admission serve --policy policies/examples/strict.yaml --mutation record \\
      --cert /tls/tls.crt --key /tls/tls.key

  # configured by the environment instead (each option names its variable)
  GPU_ADMISSION_CERT=/tls/tls.crt GPU_ADMISSION_KEY=/tls/tls.key gpu-admission serve

An option wins over its environment variable. The policy and the certificate are reloaded
when their files change; SIGTERM reports not-ready, keeps serving for --drain-seconds
(default {DEFAULT_DRAIN_SECONDS:g}), then stops.
"""


def add_subcommands(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``serve``."""
    parser = add_command(
        subparsers,
        "serve",
        summary="run the admission webhook server",
        description="Serve /validate, /mutate, /healthz, /readyz and /metrics over HTTPS.",
        epilog=_SERVE_EPILOG,
    )
    parser.add_argument(
        "--policy",
        metavar="PATH",
        help="policy file, reloaded when it changes "
        "(env GPU_ADMISSION_POLICY; default: the packaged default policy)",
    )
    parser.add_argument(
        "--cert", metavar="PATH", help="TLS certificate chain, PEM (env GPU_ADMISSION_CERT)"
    )
    parser.add_argument(
        "--key", metavar="PATH", help="TLS private key, PEM (env GPU_ADMISSION_KEY)"
    )
    parser.add_argument(
        "--bind",
        metavar="HOST:PORT",
        help=f"address to listen on (env GPU_ADMISSION_BIND; default {DEFAULT_BIND})",
    )
    parser.add_argument(
        "--workers",
        metavar="N",
        help="ignored, with a warning: one worker per Pod, scaled by replicas "
        "(env GPU_ADMISSION_WORKERS)",
    )
    parser.add_argument(
        "--drain-seconds",
        metavar="SECONDS",
        help="after SIGTERM, report not-ready but keep serving this long before stopping "
        f"(env GPU_ADMISSION_DRAIN_SECONDS; default {DEFAULT_DRAIN_SECONDS:g})",
    )
    parser.add_argument(
        "--mutation",
        choices=MUTATION_MODES,
        help="apply patches on /mutate, or only record them in audit annotations "
        "(env GPU_ADMISSION_MUTATION; default apply)",
    )
    parser.add_argument(
        "--inventory",
        action="store_true",
        default=None,
        help="keep an inventory of the cluster's Nodes, which decisions read (nodeName, "
        "advertised names, node sizes; docs/operating.md, The node inventory) and metrics "
        "expose (needs list and watch on nodes; env GPU_ADMISSION_INVENTORY=true; default off)",
    )
    # Deliberately no environment variable: turning TLS off must be visible in the command.
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="serve plain HTTP without TLS, for local experiments only",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the server until it is stopped; errors in the settings stop it before start-up."""
    serve(resolve_settings(vars(args), os.environ))
    return 0
