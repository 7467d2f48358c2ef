"""Print the conformance table as the engine sees it today, for review before it is committed.

Not a test: ``python -m tests.conformance.generate_table > /tmp/table.yaml`` and compare with
``tests/conformance/expectations.yaml``; every change to the table is a decision to review.
"""

from __future__ import annotations

import sys

import yaml

from tests.conformance.corpus import POLICIES, judge, load_table


def main() -> int:
    table = load_table()
    for name, row in table["files"].items():
        for policy in POLICIES:
            row[policy] = judge(name, row["namespace"], policy)
    yaml.safe_dump(table, sys.stdout, sort_keys=False, width=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
