"""The ``gpu-admission`` command line: one parser, sub-commands registered by their modules.

Every error is reported on stderr as ``gpu-admission: error: MESSAGE``, one line per error
(a policy with three errors gives three lines, each ``FILE:LINE: FIELD.PATH: MESSAGE``).
Usage errors are argparse's own, ``gpu-admission COMMAND: error: MESSAGE``, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Sequence
from typing import Any

from webhook.cli import (
    audit,
    certs,
    cluster,
    explain,
    inspect,
    policy,
    quota,
    review,
    serve,
    webhooks,
)
from webhook.cli.common import (
    KUBECTL_PLUGIN_PROG,
    PROG,
    ExamplesFormatter,
    add_command,
    error,
)
from webhook.policy.load import PolicyError

EXAMPLES = """\
examples:
  gpu-admission review -f pod.yaml                       # would the webhook admit it?
  gpu-admission audit -f manifests/ -R -o sarif > audit.sarif
  gpu-admission audit --cluster -A                       # what a policy would block, live
  gpu-admission explain pod trainer-0 -n ml              # why is this GPU Pod Pending?
  gpu-admission inspect -o markdown > ticket.md          # the daily GPU inspection
  gpu-admission policy validate my-policy.yaml --manifests manifests/webhooks
  gpu-admission policy test policies/tests
  gpu-admission certs generate --out certs --host 127.0.0.1
  gpu-admission serve --policy policies/default.yaml --cert certs/tls.crt --key certs/tls.key
  gpu-admission version

`gpu-admission COMMAND --help` describes each command, with examples.
--debug (before or after COMMAND) shows the traceback of an error.
"""
# 128 + SIGPIPE, what a shell reports for a process killed by the signal, as `head` leaves
# most tools. Not 0: under `set -o pipefail` a report cut short must not pass for a whole one.
EXIT_BROKEN_PIPE = 141


class _Parser(argparse.ArgumentParser):
    """A parser whose sub-command parsers accept ``--debug`` too, so that it works before and
    after the sub-command (``gpu-admission review -f x --debug``). Sub-parsers are made with
    the class of their parent, so every level gets it, whichever module registers it."""

    def __init__(self, *args: Any, debug_default: Any = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # SUPPRESS on sub-commands: their default would otherwise overwrite a --debug given
        # before the sub-command, since argparse applies a sub-parser's defaults last.
        self.add_argument(
            "--debug", action="store_true", default=debug_default, help="show tracebacks on errors"
        )


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The whole command line: this is the one module that knows every command. ``prog`` is
    the command as its usage and help name it."""
    parser = _Parser(
        prog=prog,
        description="Admission webhook and policy tools that keep GPU Pods safe and schedulable.",
        epilog=EXAMPLES,
        formatter_class=ExamplesFormatter,
        debug_default=False,
    )
    parser.add_argument("--version", action="version", version=f"gpu-admission {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve.add_subcommands(commands)
    certs.add_subcommands(commands)
    review.add_subcommands(commands)
    audit.add_subcommands(commands)
    policy.add_subcommands(commands)
    cluster.add_subcommands(commands)
    explain.add_subcommands(commands)
    inspect.add_subcommands(commands)
    quota.add_subcommands(commands)
    webhooks.add_subcommands(commands)
    version_command = add_command(
        commands,
        "version",
        summary="print the version",
        description="Print the version of gpu-admission: the one its wheel, image and chart "
        "carry (pyproject.toml's project.version).",
        epilog="examples:\n  gpu-admission version\n  gpu-admission --version\n",
    )
    version_command.set_defaults(func=_print_version)
    return parser


def version() -> str:
    """The installed distribution's version: pyproject.toml's, the one source the image (built
    from the wheel) and the chart (packaged with it by the release workflow) take it from."""
    return importlib.metadata.version("gpu-admission")


def _print_version(args: argparse.Namespace) -> int:
    print(f"gpu-admission {version()}")
    return 0


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run one command; its exit status (0 ok, 1 a verdict or a finding, 2 an error)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit where it can't be handled
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return 130
    except PolicyError as exc:
        if args.debug:
            raise
        for line in exc.errors or [str(exc)]:
            error(line)
        return 2
    except Exception as exc:  # one clear line unless --debug
        if args.debug:
            raise
        error(str(exc))
        return 2


def kubectl_plugin_main() -> int:
    """The entry point kubectl runs for ``kubectl gpu-admission ...`` (the executable
    ``kubectl-gpu_admission``): the same commands, with usage and help naming them as typed."""
    return main(prog=KUBECTL_PLUGIN_PROG)


def _silence_stdout() -> None:
    """Point stdout at /dev/null: the interpreter flushes it at exit, and a second
    BrokenPipeError there would print a traceback after all."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no file (replaced, or closed): nothing to flush
        pass
