"""``python -m webhook.cli.node_feed FIELDS``: the node inventory's process, which the server's
worker starts with ``--inventory`` (``webhook.server.inventory``); not a command for people.

It lists and watches the Nodes (and Namespaces, DeviceClasses and ResourceClaimTemplates) and
writes what is kept of them on standard output
(``webhook.server.node_feed``), at a lower priority than the worker's, and ends when its
standard input does: the worker closed it, or died.
"""

from __future__ import annotations

import os
import sys
import threading

from webhook.server.node_feed import follow, parse_fields

# Background work: on a busy core, the worker's reviews come first. Measured with the 5,000
# Nodes listed again and again (bench_inventory): at nice 10, /validate's p99 rose 1.12x to
# 1.44x over three runs; at nice 19, 1.21x and 1.33x. A starved inventory grows old, and
# decisions then go on without it.
NICENESS = 19


def main() -> None:
    fields = parse_fields(sys.argv[1])
    os.nice(NICENESS)
    threading.Thread(target=_exit_at_end_of_input, daemon=True).start()
    try:
        follow(fields, sys.stdout.buffer)
    except (BrokenPipeError, ValueError):  # the worker closed its end: nobody to tell
        pass
    os._exit(0)  # the watch's threads are not waited for


def _exit_at_end_of_input() -> None:
    """The worker keeps this process's standard input open while it wants it."""
    sys.stdin.buffer.read()
    os._exit(0)


if __name__ == "__main__":
    main()
