"""A builder process killed inside a rebuild's swap transaction (for ``test_index_names``).

Usage: python -m tests.projections._swap_kill_child SOURCE_URL TARGET_URL
Catches up, then rebuilds; once the swap's statements have run (tables renamed, indexes given their
names back) but before the commit, prints ``swapping`` and waits to be killed.
"""

from __future__ import annotations

import sys
import time

import fencepost
from fencepost.projections import ProjectionBuilder, RunsByStatus


def main() -> None:
    store = fencepost.open(sys.argv[1])
    builder = ProjectionBuilder(store, sys.argv[2], RunsByStatus(), batch_size=3, lock_timeout=60)
    builder.catch_up()
    tables = builder._tables
    original = tables.swap

    def swap_then_hang(conn, backend, share):
        original(conn, backend, share)
        print("swapping", flush=True)
        time.sleep(600)

    tables.swap = swap_then_hang
    builder.rebuild()


if __name__ == "__main__":
    main()
