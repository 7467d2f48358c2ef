"""The ``gpu-admission`` command line: one parser, sub-commands registered by their modules."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from webhook import certs, cli_audit, cli_policy, cli_review, server

    parser = argparse.ArgumentParser(
        prog="gpu-admission",
        description="Admission webhook and policy tools that keep GPU Pods safe and schedulable.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    server.add_subcommands(commands)
    certs.add_subcommands(commands)
    cli_review.add_subcommands(commands)
    cli_audit.add_subcommands(commands)
    cli_policy.add_subcommands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one clear line unless --debug
        if args.debug:
            raise
        print(f"gpu-admission: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
