"""What the commands share: one-line errors on stderr, how a command is registered, the
``--policy``, ``-f``/``-R`` and cluster options, and reading the manifests ``-f`` names."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from webhook.audit.documents import (
    Document,
    DocumentError,
    SubdirectoriesNotRead,
    manifest_files,
    parse,
    read_text,
)
from webhook.policy.exceptions import PolicyException
from webhook.policy.load import default_policy_path, load_policy
from webhook.policy.model import Policy

PROG = "gpu-admission"
KUBECTL_PLUGIN_PROG = "kubectl gpu-admission"
# The command where a command line starts in an example: at the start of a line (after
# environment variables' assignments), after a pipe or a backtick; not in `--namespace
# gpu-admission` nor in `kubectl gpu-admission`.
_EXAMPLE_COMMAND = re.compile(
    r"(^[ \t]*(?:[A-Z_][A-Z0-9_]*=\S*[ \t]+)*|\|[ \t]*|`)" + re.escape(PROG) + r"(?=[ `])",
    re.MULTILINE,
)


class ExamplesFormatter(argparse.RawDescriptionHelpFormatter):
    """Prints the description and the examples as written, with their command lines named
    as the user typed the command: ``kubectl gpu-admission ...`` when kubectl runs it as a
    plugin (the prog of every parser starts with it then)."""

    def __init__(self, prog: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(prog, *args, **kwargs)
        self.plugin = prog == KUBECTL_PLUGIN_PROG or prog.startswith(KUBECTL_PLUGIN_PROG + " ")

    def add_text(self, text: str | None) -> None:
        if text and self.plugin:
            text = _EXAMPLE_COMMAND.sub(rf"\g<1>{KUBECTL_PLUGIN_PROG}", text)
        super().add_text(text)


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
        formatter_class=ExamplesFormatter,
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


def add_filename_arguments(
    parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup,
    recursion: argparse.ArgumentParser,
    *,
    required: bool = False,
) -> None:
    """``-f`` as kubectl takes it (files, directories and ``-``, several after one ``-f`` or
    ``-f`` repeated), and ``-R`` (added to ``recursion``: outside a group ``-f`` may be in)."""
    parser.add_argument(
        "-f",
        "--filename",
        dest="files",
        required=required,
        action="extend",
        nargs="+",
        metavar="PATH",
        help="manifest files, directories (their own YAML and JSON files; with -R their "
        "subdirectories' too) or - for standard input; several after one -f, or -f repeated",
    )
    recursion.add_argument(
        "-R",
        "--recursive",
        action="store_true",
        help="read the directories given with -f recursively",
    )


def input_files(args: argparse.Namespace) -> list[str] | None:
    """The files ``-f`` and ``-R`` name; None (the error said why) when a directory given
    without ``-R`` has manifest files in subdirectories, which the run would leave out."""
    try:
        return manifest_files(args.files, recursive=args.recursive)
    except SubdirectoriesNotRead as exc:
        error(subdirectories_not_read(exc))
        return None


def read_documents(args: argparse.Namespace) -> tuple[list[Document], int] | None:
    """The documents of the files ``-f`` and ``-R`` name (as review and explain read them),
    and how many files could not be read, or not past a broken document: each is reported
    and the documents before it are kept. None (the error said why) when a directory's
    subdirectories would be left unread."""
    files = input_files(args)
    if files is None:
        return None
    documents: list[Document] = []
    unreadable = 0
    stdin = sys.stdin.read() if "-" in files else None
    for source in files:
        try:
            documents.extend(parse(read_text(source, stdin), source))
        except DocumentError as exc:
            error(str(exc))
            unreadable += 1
            documents.extend(exc.readable)
    return documents, unreadable


def subdirectories_not_read(exc: SubdirectoriesNotRead) -> str:
    """What a run that would leave manifest files in subdirectories unread says: add ``-R``."""
    return (
        f"{len(exc.left_out)} manifest file(s) in subdirectories were not read (such as "
        f"{exc.left_out[0]}): add -R to read them (or name the files)"
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


def add_cluster_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, condition: str = ""
) -> None:
    """``--kubeconfig`` and ``--context``: which cluster a command reads
    (``webhook.cluster.connection.connect``). ``condition`` says when the command reads one at
    all (audit's "with --cluster"), first in both helps."""
    said = f"{condition}: " if condition else ""
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help=f"{said}the kubeconfig file (default: $KUBECONFIG, then in-cluster, then "
        "~/.kube/config)",
    )
    parser.add_argument(
        "--context", help=f"{said}the kubeconfig context (default: its current one)"
    )
