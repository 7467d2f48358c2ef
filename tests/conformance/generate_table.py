"""Print the conformance table as the engine sees it today, for review before it is committed.

Not a test: ``python -m tests.conformance.generate_table > /tmp/table.yaml`` and compare with
``tests/conformance/expectations.yaml``; every change to the table is a decision to review.
"""

from __future__ import annotations

import sys

import yaml

from tests.conformance.corpus import POLICIES, TABLE, judge, load_table


def render(table: dict, header: str) -> str:
    """The table in the committed file's layout: one line per field, outcomes in flow style."""
    lines = [header.rstrip("\n"), "files:"]
    for name, row in table["files"].items():
        lines.append(f"  {name}:")
        for key in ("namespace", "why"):
            text = yaml.safe_dump({key: row[key]}, width=10_000, allow_unicode=True)
            lines.append("    " + text.rstrip("\n"))
        for policy in POLICIES:
            outcome = yaml.safe_dump(row[policy], default_flow_style=True, width=10_000)
            lines.append(f"    {policy}: {outcome.rstrip()}")
    return "\n".join(lines) + "\n"


def main() -> int:
    table = load_table()
    for name, row in table["files"].items():
        for policy in POLICIES:
            row[policy] = judge(name, row["namespace"], policy)
    header = TABLE.read_text("utf-8").split("\nfiles:\n", 1)[0]
    sys.stdout.write(render(table, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
