"""What the commands share: one-line errors on stderr, how a command is registered, and the
``--policy`` option."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from webhook.policy.exceptions import PolicyException
from webhook.policy.load import default_policy_path, load_policy
from webhook.policy.model import Policy


def error(message: str) -> None:
    """Report one error as one line: a message that spans lines is joined with "; "."""
    text = "; ".join(line.strip() for line in message.splitlines() if line.strip())
    print(f"gpu-admission: error: {text}", file=sys.stderr)


def add_command(
    commands: argparse._SubParsersAction[Any],
    name: str,
    *,
    summary: str,
    description: str,
    epilog: str,
) -> argparse.ArgumentParser:
    """A (sub-)command with its one-line ``summary`` for the list of commands, a
    ``description`` and an ``epilog`` of examples printed as written."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=summary,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def add_command_group(
    commands: argparse._SubParsersAction[Any],
    name: str,
    *,
    summary: str,
    description: str,
    epilog: str,
) -> argparse._SubParsersAction[Any]:
    """A command that only groups sub-commands (``certs generate``): what to add them to."""
    group = add_command(commands, name, summary=summary, description=description, epilog=epilog)
    return group.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND", required=True)


def add_policy_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy", metavar="FILE", help="the policy file (default: the packaged default policy)"
    )


def policy_from(args: argparse.Namespace) -> Policy:
    """The policy ``--policy`` names, else the packaged default."""
    return load_policy(args.policy or default_policy_path())


def expired_message(exception: PolicyException) -> str:
    """What validate and the audit say of an exception past its expiry."""
    return (
        f"exception {exception.name!r} expired ({exception.expires_text}): it applies no more, "
        f"so what it lifted ({', '.join(sorted(exception.rules))}) denies again; renew it "
        f"with its owner {exception.owner}, or delete it"
    )


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """``--kubeconfig`` and ``--context``: which cluster a command reads
    (``webhook.cluster.connection.connect``)."""
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="default: $KUBECONFIG, then in-cluster, then ~/.kube/config",
    )
    parser.add_argument("--context", help="the kubeconfig context (default: its current one)")
