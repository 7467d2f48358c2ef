"""Print the conformance table as the engine sees it today, for review before it is committed.

Not a test: ``python -m tests.conformance.generate_table > /tmp/table.yaml`` and compare with
``tests/conformance/expectations.yaml`` (``... generate_table governance`` for
``tests/conformance/governance.yaml``, ``... generate_table dra`` for ``dra.yaml``); every change
to the table is a decision to review.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import yaml

from tests.conformance.corpus import (
    CORPUS,
    DRA,
    DRA_TABLE,
    GOVERNANCE,
    GOVERNANCE_POLICIES,
    GOVERNANCE_TABLE,
    POLICIES,
    TABLE,
    judge,
    load_table,
)


def render(table: dict, header: str, policies: Iterable[str] = POLICIES) -> str:
    """The table in the committed file's layout: one line per field, outcomes in flow style."""
    lines = [header.rstrip("\n"), "files:"]
    for name, row in table["files"].items():
        lines.append(f"  {name}:")
        for key in ("namespace", "why"):
            text = yaml.safe_dump({key: row[key]}, width=10_000, allow_unicode=True)
            lines.append("    " + text.rstrip("\n"))
        for policy in policies:
            outcome = yaml.safe_dump(row[policy], default_flow_style=True, width=10_000)
            lines.append(f"    {policy}: {outcome.rstrip()}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    which = argv[0] if argv else ""
    path, corpus = {"governance": (GOVERNANCE_TABLE, GOVERNANCE), "dra": (DRA_TABLE, DRA)}.get(
        which, (TABLE, CORPUS)
    )
    policies = GOVERNANCE_POLICIES if which == "governance" else POLICIES
    table = load_table(path)
    for name, row in table["files"].items():
        for policy in policies:
            row[policy] = judge(name, row["namespace"], policy, corpus)
    header = path.read_text("utf-8").split("\nfiles:\n", 1)[0]
    sys.stdout.write(render(table, header, policies))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
