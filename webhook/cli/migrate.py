"""``gpu-admission policy migrate``: rewrite a policy whose per-namespace settings are in the
fields before the ``tenants`` block took them (``pools[].namespaces``, ``binderNamespaces``,
``exemptions``, ``namespaceOverrides``) into ``tenants`` entries that decide exactly the same
(``webhook.policy.migrate``), comments and key order kept."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from webhook.cli.common import add_command, error
from webhook.core.wording import count
from webhook.policy.files import unreadable_file
from webhook.policy.load import PolicyError
from webhook.policy.migrate import migrate_policy

_EPILOG = """\
examples:
  gpu-admission policy migrate policy.yaml > migrated.yaml
  gpu-admission policy migrate policy.yaml --in-place && git diff policy.yaml
  gpu-admission policy migrate policy.yaml -o migrated.yaml

What moves (each old entry becomes a tenants entry with the same namespaces, merged into an
entry whose namespaces list is exactly equal, else appended):
  pools[].namespaces     -> tenants[].reservedPools
  binderNamespaces       -> tenants[].binder: true
  exemptions[]           -> tenants[].exemptions[] (an exemption now states its reason)
  namespaceOverrides[]   -> tenants[].rules (in their order: the first match still wins)
What moved is printed on stderr, one line each; a policy with nothing to move is left as it is.
Migrating a migrated policy changes nothing.

exit status: 0 migrated (or nothing to migrate), 1 a policy that does not load (its errors are
printed as policy validate prints them), 2 unreadable or misused.
"""


def add_to(sub: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(
        sub,
        "migrate",
        summary="move per-namespace settings into the tenants block",
        description="Rewrite a policy's pools[].namespaces, binderNamespaces, exemptions and "
        "namespaceOverrides into tenants entries (reservedPools, binder, exemptions, rules) "
        "that decide exactly the same, keeping everything else as written. The old fields "
        "work for one more release, with a warning.",
        epilog=_EPILOG,
    )
    parser.add_argument("policy", metavar="FILE", help="the policy file")
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "-o", "--output", metavar="OUT", help="write the migrated policy here (default: stdout)"
    )
    target.add_argument("--in-place", action="store_true", help="rewrite FILE itself")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    source = Path(args.policy)
    try:
        text = source.read_text("utf-8")
    except OSError as exc:
        error(unreadable_file(source, exc))
        return 2
    except UnicodeDecodeError:
        error(f"{source}: not UTF-8 text")
        return 2
    try:
        migration = migrate_policy(text, str(source))
    except PolicyError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        print(f"{source}: invalid, {count(exc.errors, 'error')}", file=sys.stderr)
        return 1
    for move in migration.moves:
        print(f"gpu-admission: {move}", file=sys.stderr)
    if not migration.moves:
        print(f"gpu-admission: {source}: nothing to migrate", file=sys.stderr)
    destination = source if args.in_place else Path(args.output) if args.output else None
    if destination is None:
        sys.stdout.write(migration.text)
        return 0
    if destination == source and not migration.moves:
        return 0
    try:
        destination.write_text(migration.text, "utf-8")
    except OSError as exc:
        error(f"{destination}: cannot write: {(exc.strerror or str(exc)).lower()}")
        return 2
    return 0
